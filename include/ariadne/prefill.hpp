// ariadne/prefill.hpp — block-sparse causal prefill: estimate a mask, then run attention on it.
//
//   mask = estimate(q, k, layout, config)                    (estimate.hpp; skipped when dense)
//   out, lse = attention(q, k, v, layout.with_blocks(mask))  (attention.hpp, causal, GQA, varlen)
//
// The tensors are those of AttentionParams: q [total_q, heads_q, head_dim], k and v
// [total_k, heads_kv, head_dim] (head_dim contiguous), out [total_q, heads_q, head_dim],
// lse optional [heads_q, total_q] f32. params.pattern must be causal, optionally varlen (lq <= lk
// per sequence; queries are the last lq positions); sink modes are not used by prefill.
#pragma once

#include <vector>

#include "ariadne/attention.hpp"
#include "ariadne/estimate.hpp"

namespace ariadne {

struct PrefillConfig {
  bool dense = false;       // true: plain causal attention, no estimate (the anchor)
  EstimateConfig estimate;  // method, block, stride, τ, offsets, protections
  Backend estimate_backend = Backend::automatic;
  Backend attention_backend = Backend::automatic;
};

struct PrefillStats {
  // Milliseconds per stage: the estimator's three (zero when dense), the attention, the total.
  double ms_sampling = 0, ms_scoring = 0, ms_selection = 0, ms_estimate = 0;
  double ms_attention = 0, ms_total = 0;
  double density = 1;                    // kept / causally visible blocks (1 when dense)
  std::vector<double> density_per_head;  // [heads_q]
};

struct PrefillResult {
  EstimateResult estimate;  // mask and scores (empty when dense)
  PrefillStats stats;
};

// Writes params.out (and params.lse when set). Throws ariadne::Error on bad shapes or a
// non-causal pattern, naming the tensor/field.
PrefillResult prefill(const AttentionParams& params, const PrefillConfig& config);

}  // namespace ariadne
