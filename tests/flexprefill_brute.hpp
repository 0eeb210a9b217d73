// FlexPrefill written plainly in double from the rule stated in src/estimate/cpu/flexprefill.cpp,
// for the CPU and CUDA estimator tests: the mask rows, and per (sequence, query head) the head's
// decisions and how close each came to going the other way (the margin), so that a backend whose
// sums run in another order or precision is compared exactly wherever the rule is not on a knife's
// edge.
#pragma once

#include <cstdint>
#include <vector>

#include "ariadne/estimate.hpp"
#include "common.hpp"

namespace ariadne::testing {

struct FlexHead {
  int seq = 0, head = 0;
  bool probed = false, aware = false;
  double js = 0;
  int64_t n_v = 0, n_s = 0;  // budgets in blocks after the head's kind
  // The smallest distance of a decision from its threshold: |sqrt JSD − τ_js|, the γ budgets'
  // running sums against γ (where a one-token change moves the block budget), the gaps between
  // the last kept and the first dropped vertical / slash block, and the query-aware selection's
  // running sum against γ·rows and its last kept / first dropped entries. +inf for a short input.
  double margin = 0;
  double margin_js = 0, margin_cover = 0, margin_top = 0, margin_aware = 0;  // its parts
};

struct FlexBrute {
  std::vector<std::vector<int32_t>> rows;  // sorted key blocks of every mask row, in row order
  std::vector<FlexHead> heads;             // (sequence, head) in sequence-major order
  int aware_heads = 0;
};

FlexBrute brute_flex(const Inputs& in, const Case& cs, const EstimateConfig& c);

// Row r of a mask as its sorted key-block list.
std::vector<int32_t> mask_row(const BlockMask& mk, size_t r);

// Plants two heads into f32 inputs of one 640-token sequence (heads_q = heads_kv = 2, d >= 2, small
// random values elsewhere): head 0's strongest key by far is key 200 for every query (a vertical
// line); head 1 has q_t·k_j = A cos(ω(j − t + 100)) in dims 0-1 with one period longer than the
// sequence, so each query's mass sits within ~10 tokens of distance 100 (a slash).
void plant_vertical_and_slash(Inputs& in);

}  // namespace ariadne::testing
