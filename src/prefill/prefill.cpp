// Sparse prefill: estimator + block-sparse causal attention, timed per stage.
#include "ariadne/prefill.hpp"

#include <chrono>

#include "estimate/internal.hpp"

namespace ariadne {

namespace {
double ms_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}
}  // namespace

PrefillResult prefill(const AttentionParams& params, const PrefillConfig& config) {
  const Pattern& layout = params.pattern;
  ARIADNE_CHECK(layout.is_causal() && layout.chunk == 0 && !layout.blocks.defined(),
                "prefill: params.pattern is ", describe(layout),
                ", expected causal (optionally varlen); the mask comes from the estimator");
  ARIADNE_CHECK(params.sink_mode == SinkMode::none, "prefill: sink_mode is ",
                sink_mode_name(params.sink_mode), ", expected none (the estimators model plain softmax)");
  validate(params);
  if (!config.dense) validate(config.estimate, params.heads_q());

  const auto t0 = std::chrono::steady_clock::now();
  PrefillResult res;
  PrefillStats& st = res.stats;
  AttentionParams p = params;
  if (!config.dense) {
    res.estimate = estimate(params.q, params.k, layout, config.estimate, config.estimate_backend);
    const EstimateStats& es = res.estimate.stats;
    st.ms_sampling = es.ms_sampling;
    st.ms_scoring = es.ms_scoring;
    st.ms_selection = es.ms_selection;
    st.density = es.density;
    st.density_per_head = es.density_per_head;
    // The CUDA estimator leaves its mask in device memory, where the CUDA attention reads it.
    p.pattern = layout.with_blocks(res.estimate.device.defined() ? res.estimate.device.view()
                                                                 : res.estimate.mask.view());
    p.blocks_nnz = es.kept_blocks;  // a schedule hint for the CUDA attention (AttentionParams)
  } else {
    st.density_per_head.assign(size_t(params.heads_q()), 1.0);
  }
  const auto t1 = std::chrono::steady_clock::now();
  st.ms_estimate = ms_between(t0, t1);  // the CUDA estimator synchronizes before it returns
#if defined(ARIADNE_WITH_CUDA)
  if (params.q.device == Device::cuda) {
    // Kernels return before they finish: time the attention with CUDA events on its stream.
    st.ms_attention = est::cuda_timed_ms(params.stream, [&] { attention(p, config.attention_backend); });
    st.ms_total = st.ms_estimate + st.ms_attention;
    return res;
  }
#endif
  attention(p, config.attention_backend);
  const auto t2 = std::chrono::steady_clock::now();
  st.ms_attention = ms_between(t1, t2);
  st.ms_total = ms_between(t0, t2);
  return res;
}

}  // namespace ariadne
