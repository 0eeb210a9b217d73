// One attention problem on seeded random inputs, timed and checked against the reference. Shared by
// `ariadne attn` and the demo.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "ariadne/attention.hpp"

namespace ariadne::cli {

struct AttnCase {
  int64_t tokens = 1024, batch = 1, heads = 16, kv_heads = 16, dim = 80;
  std::string pattern = "full";  // parse_pattern_spec syntax
  SinkMode sink_mode = SinkMode::none;
  double sink_value = 0.5;
  DType dtype = DType::f32;
  Backend backend = Backend::cpu;
  int64_t reps = 5;
  uint64_t seed = 1;
  std::string check = "auto";  // auto: check when the reference costs at most ~1 GFLOP
  bool backward = false;       // also time the backward (attention_backward) and check its gradients
  bool deterministic = false;  // the backward's deterministic mode (CUDA)
};

// Throws a UsageError naming --tokens when the case's buffers (inputs, output and, when checked,
// the reference) would exceed the machine's physical memory.
void check_attn_memory(const AttnCase& c);

// Runs the case; returns {backend, tokens, ..., ms, pairs, gflops, checked, max_rel_err, rel_l2},
// with "backward": {ms, gflops (at 2.5x the forward's FLOPs), deterministic, checked, and per
// gradient dq/dk/dv/dsink its max_rel_err and rel_l2} when the case asks for the backward.
nlohmann::json run_attn_case(const AttnCase& c);

}  // namespace ariadne::cli
