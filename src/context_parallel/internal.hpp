// Shared by the host and device parts of context parallelism (include/ariadne/context_parallel.hpp).
#pragma once

#include <cstdint>

#include "ariadne/context_parallel.hpp"

namespace ariadne::cp_detail {

// An f32 [n, heads, d] row array: row (i, h) starts at ptr + i·s0 + h·s1, d contiguous values.
struct Row3 {
  float* ptr = nullptr;
  int64_t s0 = 0, s1 = 0, d = 0;
};

// The device kernels (src/context_parallel/cuda/merge.cu), enqueued on `stream`. lse arrays are
// [heads, n] with the given row stride (ls) and contiguous columns.
void fill_partial_cuda(const Row3& out, float* lse, int64_t n, int64_t heads, void* stream);
void merge_partial_cuda(const Row3& acc, float* acc_lse, int64_t acc_ls, const Row3& part, const float* part_lse,
                        int64_t part_ls, int64_t n, int64_t heads, void* stream);
void finish_partials_cuda(const Row3& acc, const float* acc_lse, int64_t acc_ls, const TensorView& out,
                          const TensorView& lse, const float* sink, int64_t sink_s, bool denom, int64_t n,
                          int64_t heads, void* stream);
// dst[r·dst_ld + c] = src[r·src_ld + c] for r < rows, c < cols (device memory).
void copy_lse_columns_cuda(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t cols, int64_t rows,
                           void* stream);

}  // namespace ariadne::cp_detail
