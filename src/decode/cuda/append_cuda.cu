// Appends into the device cache. A decode step's (CudaKVCache::append): one CTA per (batch entry,
// KV head), a thread per head-dim element. The new key row and value row go into the reserved page;
// the page's min / max fold the stored key in (from ±inf at a page's first row) and the stride sum
// holding the row is summed again from the stride's first row in row order, in f32: the operations
// and the order of PagedKVCache::summarize, so the summaries equal the host twin's bit for bit.
// A second kernel then moves the lengths, after every CTA has read them. A block of one sequence's
// rows (CudaKVCache::append_rows, a prefill's keys and values): the rows copied, then each touched
// page summarized again from its first row (that launch also sets the length).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "ariadne/error.hpp"
#include "decode/internal.hpp"

namespace ariadne::decode_detail {
namespace {

__device__ __forceinline__ float as_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float as_float(__half x) { return __half2float(x); }

template <class T>
__global__ void append_kernel(const AppendArgs a) {
  const int b = blockIdx.x, h = blockIdx.y;
  const int seq = a.seqs[b];
  const int t = a.lengths[seq];
  const int page = a.table[int64_t(seq) * a.max_pages + t / a.page_size];
  const int row = t % a.page_size, d = a.head_dim;
  const int strides = a.page_size / a.summary_stride, j = row / a.summary_stride;
  T* kp = static_cast<T*>(a.k_pool) + (int64_t(page) * a.kv_heads + h) * a.page_size * d;
  T* vp = static_cast<T*>(a.v_pool) + (int64_t(page) * a.kv_heads + h) * a.page_size * d;
  float* mn = a.min + (int64_t(page) * a.kv_heads + h) * d;
  float* mx = a.max + (int64_t(page) * a.kv_heads + h) * d;
  float* sum = a.sum + ((int64_t(page) * a.kv_heads + h) * strides + j) * d;
  for (int u = threadIdx.x; u < d; u += blockDim.x) {
    const T kx = static_cast<const T*>(a.k)[b * a.k_s0 + h * a.k_sh + u];
    kp[int64_t(row) * d + u] = kx;
    vp[int64_t(row) * d + u] = static_cast<const T*>(a.v)[b * a.v_s0 + h * a.v_sh + u];
    const float x = as_float(kx);
    const float lo = row == 0 ? INFINITY : mn[u], hi = row == 0 ? -INFINITY : mx[u];
    mn[u] = x < lo ? x : lo;  // std::min(lo, x), NaN and signed zeros included
    mx[u] = hi < x ? x : hi;  // std::max(hi, x)
    float s = 0.f;
    for (int r = j * a.summary_stride; r < row; ++r) s += as_float(kp[int64_t(r) * d + u]);
    sum[u] = s + x;
  }
}

// A bulk append: one CTA per (row of the block, KV head) copies the row into its page.
template <class T>
__global__ void append_rows_kernel(const AppendRowsArgs a) {
  const int i = blockIdx.x, h = blockIdx.y, d = a.head_dim;
  const int64_t t = a.t0 + i;
  const int page = a.table_row[t / a.page_size], row = int(t % a.page_size);
  const int64_t at = ((int64_t(page) * a.kv_heads + h) * a.page_size + row) * d;
  for (int u = threadIdx.x; u < d; u += blockDim.x) {
    static_cast<T*>(a.k_pool)[at + u] = static_cast<const T*>(a.k)[i * a.k_s0 + h * a.k_sh + u];
    static_cast<T*>(a.v_pool)[at + u] = static_cast<const T*>(a.v)[i * a.v_s0 + h * a.v_sh + u];
  }
}

// Then one CTA per (page the block touched, KV head) summarizes the page's rows from the pool, in
// row order from the page's first row: min / max folded from ±inf and each stride's sum from 0, the
// operations and the order of PagedKVCache::summarize (and of append_kernel's incremental form), so
// the summaries equal the host twin's bit for bit however the rows arrived. Its first thread also
// sets the sequence's length: no kernel of the append reads it, and the stream orders it after them.
template <class T>
__global__ void summarize_rows_kernel(const AppendRowsArgs a) {
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *a.length = int32_t(a.t0 + a.n);
  const int64_t p = a.t0 / a.page_size + blockIdx.x;
  const int h = blockIdx.y, d = a.head_dim, S = a.summary_stride, strides = a.page_size / S;
  const int rows = int(min(int64_t(a.page_size), a.t0 + a.n - p * a.page_size));
  const int page = a.table_row[p];
  const T* kp = static_cast<const T*>(a.k_pool) + (int64_t(page) * a.kv_heads + h) * a.page_size * d;
  float* mn = a.min + (int64_t(page) * a.kv_heads + h) * d;
  float* mx = a.max + (int64_t(page) * a.kv_heads + h) * d;
  float* sum = a.sum + (int64_t(page) * a.kv_heads + h) * strides * d;
  for (int u = threadIdx.x; u < d; u += blockDim.x) {
    float lo = INFINITY, hi = -INFINITY;
    for (int j = 0; j * S < rows; ++j) {
      float s = 0.f;
      for (int r = j * S; r < min(rows, (j + 1) * S); ++r) {
        const float x = as_float(kp[int64_t(r) * d + u]);
        lo = x < lo ? x : lo;  // std::min(lo, x), NaN and signed zeros included
        hi = hi < x ? x : hi;  // std::max(hi, x)
        s += x;
      }
      sum[int64_t(j) * d + u] = s;
    }
    mn[u] = lo;
    mx[u] = hi;
  }
}

__global__ void advance_kernel(const AppendArgs a) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b < a.batch) a.lengths[a.seqs[b]] += 1;
}

void check(cudaError_t e, const char* what) {
  ARIADNE_CHECK(e == cudaSuccess, "kv cache append (cuda): ", what, ": ", cudaGetErrorString(e));
}

}  // namespace

void append_cuda(const AppendArgs& a) {
  if (a.batch == 0) return;
  const dim3 grid(unsigned(a.batch), unsigned(a.kv_heads));
  const int threads = a.head_dim >= 128 ? 128 : 64;
  const auto st = static_cast<cudaStream_t>(a.stream);
  if (a.dtype == DType::bf16)
    append_kernel<__nv_bfloat16><<<grid, threads, 0, st>>>(a);
  else
    append_kernel<__half><<<grid, threads, 0, st>>>(a);
  check(cudaGetLastError(), "append kernel launch");
  advance_kernel<<<(a.batch + 127) / 128, 128, 0, st>>>(a);
  check(cudaGetLastError(), "length kernel launch");
}

void append_rows_cuda(const AppendRowsArgs& a) {
  if (a.n == 0) return;
  const auto st = static_cast<cudaStream_t>(a.stream);
  const int threads = a.head_dim >= 128 ? 128 : 64;
  const int64_t pages = (a.t0 + a.n - 1) / a.page_size - a.t0 / a.page_size + 1;
  const dim3 rows(unsigned(a.n), unsigned(a.kv_heads)), summaries(unsigned(pages), unsigned(a.kv_heads));
  if (a.dtype == DType::bf16) {
    append_rows_kernel<__nv_bfloat16><<<rows, threads, 0, st>>>(a);
    summarize_rows_kernel<__nv_bfloat16><<<summaries, threads, 0, st>>>(a);
  } else {
    append_rows_kernel<__half><<<rows, threads, 0, st>>>(a);
    summarize_rows_kernel<__half><<<summaries, threads, 0, st>>>(a);
  }
  check(cudaGetLastError(), "bulk append kernel launch");
}

}  // namespace ariadne::decode_detail
