// One decode task on the CPU: a GQA group's queries against a run of pages of one sequence,
// giving per query head the running max m, the sum l = Σ exp(s − m) and the unnormalized output
// acc = Σ exp(s − m) v. The body (decode_kernel_body.hpp) is compiled once per ISA file
// (decode_generic.cpp, decode_avx2.cpp, decode_avx512.cpp) with that file's target flags, so the
// loops over the head dim vectorize for it; decode_cpu.cpp picks the table the attention kernels use.
#pragma once

#include <cstdint>

#include "ariadne/tensor.hpp"

namespace ariadne::decode_detail {

struct DecodeTask {
  const float* q = nullptr;  // [G][d] f32, the group's queries
  const unsigned char* k = nullptr;  // the pools [pages, P, kv_heads, d] in dtype
  const unsigned char* v = nullptr;
  DType dtype = DType::f32;
  const int32_t* table = nullptr;  // the sequence's page table
  const int32_t* pages = nullptr;  // logical pages to read, ascending
  int64_t npages = 0;
  int64_t first = 0, length = 0;   // the visible tokens [first, length)
  int P = 0, kv_heads = 0, g = 0, d = 0, G = 0;
  float scale = 0;
  const float* key0_bias = nullptr;  // [G] or null: added to the logit of token 0 (SinkMode::key0_bias)
  // Out, per head hg: m[hg], l[hg], acc[hg·d …]. Scratch: kf, vf [P][d], s [G][P] floats.
  float* m = nullptr;
  float* l = nullptr;
  float* acc = nullptr;
  float* kf = nullptr;
  float* vf = nullptr;
  float* s = nullptr;
};

using DecodeTaskFn = void (*)(const DecodeTask&);

DecodeTaskFn decode_task_generic();
DecodeTaskFn decode_task_avx2();    // null when not compiled for x86
DecodeTaskFn decode_task_avx512();  // null when not compiled for x86

// The page scorers' inner loops (select_pages), in double over sixteen interleaved partial sums
// (lane l takes the terms i ≡ l mod 16, then a fixed pairwise reduction): the order is the same
// on every table, so the scores differ between tables only by fused against separate multiply-adds.
struct ScoreKernels {
  double (*dot)(const double* q, const float* k, int d) = nullptr;  // Σ q_i·k_i
  // Quest's bound Σ max(q_i·mn_i, q_i·mx_i)
  double (*bound)(const double* q, const float* mn, const float* mx, int d) = nullptr;
};
ScoreKernels score_kernels_generic();
ScoreKernels score_kernels_avx2();    // empty when not compiled for x86
ScoreKernels score_kernels_avx512();  // empty when not compiled for x86
// The table that matches the attention kernels' table (ARIADNE_CPU_ISA, force_tile_kernels).
ScoreKernels active_score_kernels();

}  // namespace ariadne::decode_detail
