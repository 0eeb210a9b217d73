// The ring's per-row kernels on the device: the empty partial (out 0, lse −inf), the LSE merge of a
// piece's partial into the accumulator, and the final output with a denominator sink added once.
// One warp per (query, head) row, lanes over head_dim; the row's two LSE values are read by every
// lane (broadcast loads) and written by lane 0. They are bandwidth-bound passes over f32 rows.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "context_parallel/internal.hpp"

namespace ariadne::cp_detail {

namespace {

constexpr int kWarps = 8;

void check(cudaError_t e, const char* what) {
  ARIADNE_CHECK(e == cudaSuccess, "context parallel: ", what, " failed: ", cudaGetErrorString(e));
}

int blocks_for(int64_t rows) { return int((rows + kWarps - 1) / kWarps); }

__global__ void fill_kernel(Row3 out, float* lse, int64_t n, int64_t heads) {
  const int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= n * heads) return;
  const int64_t i = row / heads, h = row % heads;
  float* o = out.ptr + i * out.s0 + h * out.s1;
  for (int64_t u = threadIdx.x % 32; u < out.d; u += 32) o[u] = 0.f;
  if (threadIdx.x % 32 == 0) lse[h * n + i] = -INFINITY;
}

__global__ void merge_kernel(Row3 acc, float* acc_lse, int64_t acc_ls, Row3 part, const float* part_lse,
                             int64_t part_ls, int64_t n, int64_t heads) {
  const int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= n * heads) return;
  const int64_t i = row / heads, h = row % heads;
  const float b = part_lse[h * part_ls + i];
  if (b == -INFINITY) return;  // nothing to add
  const float a = acc_lse[h * acc_ls + i];
  const float m = fmaxf(a, b);
  const float l = m + logf(expf(a - m) + expf(b - m));
  const float wa = expf(a - l), wb = expf(b - l);  // a = −inf: wa = 0
  float* o = acc.ptr + i * acc.s0 + h * acc.s1;
  const float* x = part.ptr + i * part.s0 + h * part.s1;
  for (int64_t u = threadIdx.x % 32; u < acc.d; u += 32) o[u] = wa * o[u] + wb * x[u];
  __syncwarp();
  if (threadIdx.x % 32 == 0) acc_lse[h * acc_ls + i] = l;
}

template <class T>
__device__ void store(T* p, float x);
template <>
__device__ void store<float>(float* p, float x) { *p = x; }
template <>
__device__ void store<__nv_bfloat16>(__nv_bfloat16* p, float x) { *p = __float2bfloat16_rn(x); }
template <>
__device__ void store<__half>(__half* p, float x) { *p = __float2half_rn(x); }

template <class T>
__global__ void finish_kernel(Row3 acc, const float* acc_lse, int64_t acc_ls, T* out, int64_t os0, int64_t os1,
                              float* lse, int64_t lse_s0, int64_t lse_s1, const float* sink, int64_t sink_s, bool denom,
                              int64_t n, int64_t heads) {
  const int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= n * heads) return;
  const int64_t i = row / heads, h = row % heads;
  const float l = acc_lse[h * acc_ls + i];
  float l_out = l, w = 1.f;
  if (denom) {
    const float s = sink[h * sink_s];
    if (s == INFINITY) {
      l_out = INFINITY;
      w = 0.f;
    } else if (s != -INFINITY) {
      const float m = fmaxf(l, s);
      l_out = m + logf(expf(l - m) + expf(s - m));
      w = l == -INFINITY ? 0.f : expf(l - l_out);
    }
  }
  const float* o = acc.ptr + i * acc.s0 + h * acc.s1;
  T* dst = out + i * os0 + h * os1;
  for (int64_t u = threadIdx.x % 32; u < acc.d; u += 32) store(dst + u, w * o[u]);
  if (lse && threadIdx.x % 32 == 0) lse[h * lse_s0 + i * lse_s1] = l_out;
}

}  // namespace

void fill_partial_cuda(const Row3& out, float* lse, int64_t n, int64_t heads, void* stream) {
  if (n * heads == 0) return;
  fill_kernel<<<blocks_for(n * heads), kWarps * 32, 0, cudaStream_t(stream)>>>(out, lse, n, heads);
  check(cudaGetLastError(), "fill kernel launch");
}

void merge_partial_cuda(const Row3& acc, float* acc_lse, int64_t acc_ls, const Row3& part, const float* part_lse,
                        int64_t part_ls, int64_t n, int64_t heads, void* stream) {
  if (n * heads == 0) return;
  merge_kernel<<<blocks_for(n * heads), kWarps * 32, 0, cudaStream_t(stream)>>>(acc, acc_lse, acc_ls, part, part_lse,
                                                                                  part_ls, n, heads);
  check(cudaGetLastError(), "merge kernel launch");
}

void finish_partials_cuda(const Row3& acc, const float* acc_lse, int64_t acc_ls, const TensorView& out,
                          const TensorView& lse, const float* sink, int64_t sink_s, bool denom, int64_t n,
                          int64_t heads, void* stream) {
  if (n * heads == 0) return;
  float* l = lse.defined() ? static_cast<float*>(lse.data) : nullptr;
  const int64_t ls0 = lse.defined() ? lse.stride[0] : 0, ls1 = lse.defined() ? lse.stride[1] : 0;
  const dim3 grid(blocks_for(n * heads)), block(kWarps * 32);
  const cudaStream_t s = cudaStream_t(stream);
  switch (out.dtype) {
    case DType::f32:
      finish_kernel<<<grid, block, 0, s>>>(acc, acc_lse, acc_ls, static_cast<float*>(out.data), out.stride[0],
                                           out.stride[1], l, ls0, ls1, sink, sink_s, denom, n, heads);
      break;
    case DType::bf16:
      finish_kernel<<<grid, block, 0, s>>>(acc, acc_lse, acc_ls, static_cast<__nv_bfloat16*>(out.data), out.stride[0],
                                           out.stride[1], l, ls0, ls1, sink, sink_s, denom, n, heads);
      break;
    default:
      finish_kernel<<<grid, block, 0, s>>>(acc, acc_lse, acc_ls, static_cast<__half*>(out.data), out.stride[0],
                                           out.stride[1], l, ls0, ls1, sink, sink_s, denom, n, heads);
      break;
  }
  check(cudaGetLastError(), "finish kernel launch");
}

void copy_lse_columns_cuda(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t cols, int64_t rows,
                           void* stream) {
  if (cols * rows == 0) return;
  check(cudaMemcpy2DAsync(dst, size_t(dst_ld) * sizeof(float), src, size_t(src_ld) * sizeof(float),
                          size_t(cols) * sizeof(float), size_t(rows), cudaMemcpyDeviceToDevice, cudaStream_t(stream)),
        "cudaMemcpy2DAsync of the LSE");
}

}  // namespace ariadne::cp_detail
