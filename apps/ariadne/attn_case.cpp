// One attention problem on seeded random inputs (see attn_case.hpp).
#include "attn_case.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "ariadne/attention_backward.hpp"
#include "ariadne/device.hpp"
#include "ariadne/flops.hpp"
#include "cli.hpp"

namespace ariadne::cli {
namespace {

double now_ms() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double, std::milli>(clock::now().time_since_epoch()).count();
}

// max |a - ref| / max |ref| and ‖a - ref‖₂ / ‖ref‖₂ over every element (a non-finite a counts
// as an infinite difference).
struct Errors {
  double max_rel = 0, rel_l2 = 0;
};
Errors errors_of(const TensorView& a, const TensorView& ref) {
  double num = 0, den = 0, max_abs = 0, ref_max = 0;
  const int64_t n0 = ref.shape[0], n1 = ref.rank > 1 ? ref.shape[1] : 1, n2 = ref.rank > 2 ? ref.shape[2] : 1;
  for (int64_t t = 0; t < n0; ++t)
    for (int64_t h = 0; h < n1; ++h)
      for (int64_t c = 0; c < n2; ++c) {
        const double o = ref.rank == 1 ? a.get({t}) : a.get({t, h, c}), e = ref.rank == 1 ? ref.get({t}) : ref.get({t, h, c});
        num += (o - e) * (o - e);
        den += e * e;
        max_abs = std::max(max_abs, std::isfinite(o) ? std::abs(o - e) : INFINITY);
        ref_max = std::max(ref_max, std::abs(e));
      }
  return {max_abs / std::max(ref_max, 1e-30), std::sqrt(num / std::max(den, 1e-300))};
}

}  // namespace

void check_attn_memory(const AttnCase& c) {
  const double rows = double(c.tokens) * double(c.batch);
  const double elems = rows * double(c.dim) * (2.0 * double(c.heads) + 2.0 * double(c.kv_heads));
  double bytes = elems * double(dtype_size(c.dtype)) + rows * double(c.heads) * 4.0 +
                 (c.check != "no" ? rows * double(c.heads) * double(c.dim) * 4.0 : 0.0);
  // The backward: dout, dq, dk, dv in the input dtype and, checked, the reference's f32 gradients.
  if (c.backward) bytes += elems * double(dtype_size(c.dtype)) + (c.check != "no" ? elems * 4.0 : 0.0);
  check_memory("attn", "--tokens", bytes);
}

nlohmann::json run_attn_case(const AttnCase& c) {
  const int64_t tokens = c.tokens, batch = c.batch, heads = c.heads, kv_heads = c.kv_heads, dim = c.dim;
  const std::string& pattern_text = c.pattern;
  const PatternSpec spec = parse_pattern_spec(pattern_text);
  const SinkMode sink_mode = c.sink_mode;
  const Backend backend = c.backend;
  const DType dtype = c.dtype;
  const int64_t reps = c.reps;
  const uint64_t seed = c.seed;
  const std::string& check = c.check;
  ARIADNE_CHECK(tokens > 0 && batch > 0, "attn: tokens and batch must be positive");
  ARIADNE_CHECK(heads > 0 && kv_heads > 0 && dim > 0, "attn: heads, kv-heads and dim must be positive");
  ARIADNE_CHECK(reps > 0, "attn: reps must be positive");
  ARIADNE_CHECK(check == "auto" || check == "yes" || check == "no", "attn: check expects auto, yes or no");
  const int64_t total = tokens * batch;
  ARIADNE_CHECK(total < (int64_t(1) << 31), "attn: tokens x batch = ", total, " exceeds 2^31 packed rows");

  // Host inputs (seeded, never zeros) and the pattern's host arrays.
  Buffer q(dtype, {total, heads, dim}), k(dtype, {total, kv_heads, dim}), v(dtype, {total, kv_heads, dim});
  q.fill_random(uint64_t(seed) * 3 + 1);
  k.fill_random(uint64_t(seed) * 3 + 2);
  v.fill_random(uint64_t(seed) * 3 + 3);
  Buffer sink(DType::f32, {heads});
  sink.fill(float(c.sink_value));
  std::vector<int32_t> cu;
  for (int64_t b = 0; b <= batch; ++b) cu.push_back(int32_t(b * tokens));
  Pattern pattern = spec.dense;
  if (batch > 1) pattern = pattern.with_varlen(int32_t(batch), cu.data());
  BlockMask mask;
  if (spec.block_density > 0) {
    mask = BlockMask::random(pattern, spec.block, int32_t(heads), total, total, spec.block_density,
                             uint64_t(seed) + 7, /*keep_diagonal=*/true);
    pattern = pattern.with_blocks(mask.view());
  }
  const int64_t pairs = count_pairs(pattern, total, total, int(heads));

  AttentionParams host;
  host.q = q.view();
  host.k = k.view();
  host.v = v.view();
  host.pattern = pattern;
  host.sink_mode = sink_mode;
  if (sink_mode != SinkMode::none) host.sink = sink.view();
  Buffer out(dtype, {total, heads, dim}), lse(DType::f32, {heads, total});
  host.out = out.view();
  host.lse = lse.view();

  // The device copy, when asked for: same inputs, pattern arrays uploaded.
  AttentionParams run = host;
  DeviceBuffer dq, dk, dv, dsink, dout, dlse, dcu, dbase, drow, dcol;
  if (backend == Backend::cuda) {
    ARIADNE_CHECK(cuda_available(), "--backend cuda: no CUDA device is available here");
    dq = DeviceBuffer::from_host(q);
    dk = DeviceBuffer::from_host(k);
    dv = DeviceBuffer::from_host(v);
    dsink = DeviceBuffer::from_host(sink);
    dout = DeviceBuffer(dtype, {total, heads, dim});
    dlse = DeviceBuffer(DType::f32, {heads, total});
    run.q = dq.view();
    run.k = dk.view();
    run.v = dv.view();
    run.out = dout.view();
    run.lse = dlse.view();
    if (sink_mode != SinkMode::none) run.sink = dsink.view();
    if (pattern.cu_seqlens_q) {
      dcu = DeviceBuffer::from_ints(cu);
      run.pattern.cu_seqlens_q = static_cast<const int32_t*>(dcu.data());
    }
    if (pattern.blocks.defined()) {
      dbase = DeviceBuffer::from_ints(mask.seq_block_base);
      drow = DeviceBuffer::from_ints(mask.row_ptr);
      dcol = DeviceBuffer::from_ints(mask.col_idx);
      run.pattern.blocks.seq_block_base = static_cast<const int32_t*>(dbase.data());
      run.pattern.blocks.row_ptr = static_cast<const int32_t*>(drow.data());
      run.pattern.blocks.col_idx = static_cast<const int32_t*>(dcol.data());
    }
  }

  // Warm-up, then the median of `reps` timed calls.
  attention(run, backend);
  if (backend == Backend::cuda) cuda_synchronize();
  std::vector<double> times;
  for (int64_t r = 0; r < reps; ++r) {
    const double t0 = now_ms();
    attention(run, backend);
    if (backend == Backend::cuda) cuda_synchronize();
    times.push_back(now_ms() - t0);
  }
  std::sort(times.begin(), times.end());
  const double ms = times[times.size() / 2];
  if (backend == Backend::cuda) {
    out = dout.to_host();
    lse = dlse.to_host();
  }

  // Error against the exact reference: automatic when the reference costs at most ~2 GFLOP.
  const bool do_check = check == "yes" || (check == "auto" && (backend != Backend::reference) &&
                                           double(pairs) * double(dim) <= 2.5e8);
  nlohmann::json j = {{"backend", backend_name(backend)}, {"tokens", tokens}, {"batch", batch},
                      {"heads", heads}, {"kv_heads", kv_heads}, {"dim", dim}, {"pattern", pattern_text},
                      {"sink", sink_mode_name(sink_mode)}, {"dtype", dtype_name(dtype)}, {"ms", ms},
                      {"pairs", pairs}, {"gflops", 4.0 * double(pairs) * double(dim) / (ms * 1e6)},
                      {"checked", do_check}, {"max_rel_err", nullptr}, {"rel_l2", nullptr}};
  if (do_check) {
    Buffer ref(DType::f32, {total, heads, dim});
    AttentionParams r = host;
    r.out = ref.view();
    r.lse = TensorView{};
    attention(r, Backend::reference);
    const Errors e = errors_of(out.view(), ref.view());
    j["max_rel_err"] = e.max_rel;
    j["rel_l2"] = e.rel_l2;
  }
  if (!c.backward) return j;

  // ---- the backward on the forward's out and lse, dout seeded ----
  Buffer hdout(dtype, {total, heads, dim});
  hdout.fill_random(uint64_t(seed) * 3 + 4);
  AttentionGrads g;
  Buffer gq(dtype, {total, heads, dim}), gk(dtype, {total, kv_heads, dim}), gv(dtype, {total, kv_heads, dim}),
      gs(DType::f32, {heads});
  DeviceBuffer ddout, ddq, ddk, ddv, ddsink;
  if (backend == Backend::cuda) {
    ddout = DeviceBuffer::from_host(hdout);
    ddq = DeviceBuffer(dtype, {total, heads, dim});
    ddk = DeviceBuffer(dtype, {total, kv_heads, dim});
    ddv = DeviceBuffer(dtype, {total, kv_heads, dim});
    ddsink = DeviceBuffer(DType::f32, {heads});
    g.dout = ddout.view();
    g.dq = ddq.view();
    g.dk = ddk.view();
    g.dv = ddv.view();
    if (sink_mode != SinkMode::none) g.dsink = ddsink.view();
  } else {
    g.dout = hdout.view();
    g.dq = gq.view();
    g.dk = gk.view();
    g.dv = gv.view();
    if (sink_mode != SinkMode::none) g.dsink = gs.view();
  }
  BackwardOptions bo;
  bo.backend = backend;
  bo.deterministic = c.deterministic;
  const AttentionBackwardPlan plan = plan_attention_backward(run, g, bo);
  ariadne::run(plan, run, g);  // warm-up
  if (backend == Backend::cuda) cuda_synchronize();
  std::vector<double> bt;
  for (int64_t rep = 0; rep < reps; ++rep) {
    const double t0 = now_ms();
    ariadne::run(plan, run, g);
    if (backend == Backend::cuda) cuda_synchronize();
    bt.push_back(now_ms() - t0);
  }
  std::sort(bt.begin(), bt.end());
  const double bms = bt[bt.size() / 2];
  if (backend == Backend::cuda) {
    gq = ddq.to_host();
    gk = ddk.to_host();
    gv = ddv.to_host();
    if (sink_mode != SinkMode::none) gs = ddsink.to_host();
  }
  nlohmann::json b = {{"ms", bms}, {"gflops", 2.5 * 4.0 * double(pairs) * double(dim) / (bms * 1e6)},
                      {"deterministic", plan.deterministic()}, {"plan", plan.describe()}, {"checked", do_check}};
  if (do_check) {
    // The reference backward on the host copies of out and lse.
    Buffer rq(DType::f32, {total, heads, dim}), rk(DType::f32, {total, kv_heads, dim}),
        rv(DType::f32, {total, kv_heads, dim}), rs(DType::f32, {heads});
    AttentionParams r = host;
    AttentionGrads rg;
    rg.dout = hdout.view();
    rg.dq = rq.view();
    rg.dk = rk.view();
    rg.dv = rv.view();
    if (sink_mode != SinkMode::none) rg.dsink = rs.view();
    attention_backward(r, rg, Backend::reference);
    const std::pair<const char*, std::pair<const Buffer*, const Buffer*>> grads[] = {
        {"dq", {&gq, &rq}}, {"dk", {&gk, &rk}}, {"dv", {&gv, &rv}}, {"dsink", {&gs, &rs}}};
    for (const auto& [name, bufs] : grads) {
      if (std::string(name) == "dsink" && sink_mode == SinkMode::none) continue;
      const Errors e = errors_of(bufs.first->view(), bufs.second->view());
      b[name] = {{"max_rel_err", e.max_rel}, {"rel_l2", e.rel_l2}};
    }
  }
  j["backward"] = b;
  return j;
}

}  // namespace ariadne::cli
