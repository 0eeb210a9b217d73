// Dense-layer pieces on the GPU (src/nn/cuda/nn_cuda.cuh): cuBLASLt GEMMs and small element-wise
// kernels. The kernels are memory-bound: one pass over their data, grid-stride loops.
#include "nn/cuda/nn_cuda.cuh"

#include <algorithm>
#include <string>

#include "ariadne/error.hpp"

namespace ariadne::cuda_nn {

void check(cudaError_t e, const char* what) {
  ARIADNE_CHECK(e == cudaSuccess, "cuda nn: ", what, ": ", cudaGetErrorString(e));
}

namespace {

void check_lt(cublasStatus_t s, const char* what) {
  ARIADNE_CHECK(s == CUBLAS_STATUS_SUCCESS, "cuda nn: cuBLASLt ", what, " failed (status ", int(s), ")");
}

// 32 MiB: what cuBLAS recommends for Hopper; lets the heuristic pick split-K and stream-K kernels.
constexpr size_t kWorkspaceBytes = size_t(32) << 20;

// Blocks for a grid-stride loop over `count` items: enough to fill the GPU, no more.
unsigned blocks_for(int64_t count, int threads) {
  return unsigned(std::clamp<int64_t>((count + threads - 1) / threads, 1, 132 * 32));
}

__device__ __forceinline__ float f32(bf16 v) { return __bfloat162float(v); }
__device__ __forceinline__ bf16 b16(float v) { return __float2bfloat16_rn(v); }

__device__ __forceinline__ float f32(float v) { return v; }

// One warp per row: the sum of squares in fp32 over lanes, then the normalized row.
template <typename T>
__global__ void rmsnorm_kernel(const T* x, int64_t n, int64_t d, const bf16* w, float eps, bf16* y) {
  const int lane = int(threadIdx.x) & 31;
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= n) return;
  const T* xr = x + row * d;
  bf16* yr = y + row * d;
  float ss = 0.f;
  for (int64_t i = lane; i < d; i += 32) {
    const float v = f32(xr[i]);
    ss += v * v;
  }
  for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  const float inv = rsqrtf(ss / float(d) + eps);
  // HF rounds the normalized row to the input dtype before the weight multiplies it.
  for (int64_t i = lane; i < d; i += 32) yr[i] = b16(f32(w[i]) * f32(b16(f32(xr[i]) * inv)));
}

// One thread per (token, rotation lane i < head_dim/2): one sincos, then the pair (x[i], x[i + half])
// of every q and k head of the token. Consecutive threads take consecutive lanes of a token, so the
// loads of a warp are contiguous within each head.
__global__ void rope_kernel(bf16* qkv, int64_t n, int64_t row_stride, int64_t k_offset, int heads, int head_dim,
                            const int2* pos, const float* inv_freq) {
  const int half = head_dim / 2, q4 = head_dim / 4;
  const int64_t total = n * half;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = t / half;
    const int i = int(t - r * half);
    const int2 p = pos[r];
    const float ang = float(i < q4 ? p.x : p.y) * inv_freq[i < q4 ? i : i - q4];
    float s, c;
    sincosf(ang, &s, &c);
    bf16* row = qkv + r * row_stride;
    for (int which = 0; which < 2; ++which)  // q, then k
      for (int h = 0; h < heads; ++h) {
        bf16* v = row + which * k_offset + h * head_dim;
        const float x1 = f32(v[i]), x2 = f32(v[i + half]);
        v[i] = b16(x1 * c - x2 * s);
        v[i + half] = b16(x2 * c + x1 * s);
      }
  }
}

// Interleaved RoPE of one pair (x0, x1) by the angle whose cosine and sine are c and s.
__device__ __forceinline__ void rotate_pair(bf16* x, float c, float s) {
  const float x0 = f32(x[0]), x1 = f32(x[1]);
  x[0] = b16(x0 * c - x1 * s);
  x[1] = b16(x0 * s + x1 * c);
}

// One thread per (row, pair): one sincos, then that pair of every head of the row.
__global__ void rope_pairs_kernel(bf16* x, int64_t n, int64_t row_stride, int heads, int head_dim, int pairs,
                                  const float* inv_freq, int64_t pos0) {
  const int64_t total = n * pairs;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = t / pairs;
    const int i = int(t - r * pairs);
    float s, c;
    sincosf(float(pos0 + r) * inv_freq[i], &s, &c);
    bf16* row = x + r * row_stride + 2 * i;
    for (int h = 0; h < heads; ++h) rotate_pair(row + h * head_dim, c, s);
  }
}

// Rows over blocks, columns over threads: no 64-bit division per element.
__global__ void swiglu_kernel(const bf16* gu, int64_t n, int64_t inter, bf16* out, int64_t out_stride) {
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const bf16* g = gu + r * 2 * inter;
    bf16* o = out + r * out_stride;
    for (int64_t i = threadIdx.x; i < out_stride; i += blockDim.x) {
      if (i < inter) {
        const float gv = f32(g[i]);
        const float act = f32(b16(gv / (1.f + expf(-gv))));  // HF rounds silu(gate) to bf16 first
        o[i] = b16(act * f32(g[inter + i]));
      } else {
        o[i] = b16(0.f);
      }
    }
  }
}

__global__ void gelu_kernel(bf16* x, int64_t count) {
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < count; t += int64_t(gridDim.x) * blockDim.x) {
    const float v = f32(x[t]);
    x[t] = b16(0.5f * v * (1.f + erff(v * 0.70710678118654752f)));
  }
}

__global__ void add_kernel(bf16* y, const bf16* x, int64_t count) {
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < count; t += int64_t(gridDim.x) * blockDim.x)
    y[t] = b16(f32(y[t]) + f32(x[t]));
}

// 16-byte copies when a row is a whole number of them (hidden sizes are), else 2-byte ones.
template <typename V>
__global__ void gather_kernel(const V* src, V* dst, const int32_t* index, int64_t rows, int64_t cols) {
  const int64_t total = rows * cols;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = t / cols, c = t - r * cols;
    dst[t] = src[int64_t(index[r]) * cols + c];
  }
}

// One decode row [q heads | k heads | v heads]: thread t < pairs rotates pair t of every q and k
// head and stores the rotated k pair at row *at of kcache; every thread also copies its share of
// v to row *at of vcache. The k store follows the rotation in the same thread (no race).
__global__ void rope_store_row_kernel(bf16* qkv, int heads, int kv_heads, int head_dim, int pairs,
                                      const float* inv_freq, const int32_t* at, bf16* kcache, bf16* vcache) {
  const int64_t pos = *at, kv = int64_t(kv_heads) * head_dim;
  bf16* k = qkv + int64_t(heads) * head_dim;
  const bf16* v = k + kv;
  for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < pairs; t += gridDim.x * blockDim.x) {
    float s, c;
    sincosf(float(pos) * inv_freq[t], &s, &c);
    for (int h = 0; h < heads + kv_heads; ++h) {
      bf16* x = qkv + int64_t(h) * head_dim + 2 * t;
      rotate_pair(x, c, s);
      if (h >= heads) {
        bf16* dst = kcache + pos * kv + int64_t(h - heads) * head_dim + 2 * t;
        dst[0] = x[0];
        dst[1] = x[1];
      }
    }
  }
  // The k values past the rotated dims (rope_dims < head_dim) are stored as they are.
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < kv; i += int64_t(gridDim.x) * blockDim.x) {
    vcache[pos * kv + i] = v[i];
    if (i % head_dim >= 2 * pairs) kcache[pos * kv + i] = k[i];
  }
}

__global__ void to_bf16_kernel(const float* src, bf16* dst, int64_t count) {
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < count; t += int64_t(gridDim.x) * blockDim.x)
    dst[t] = b16(src[t]);
}

__global__ void to_f32_kernel(const bf16* src, float* dst, int64_t count) {
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < count; t += int64_t(gridDim.x) * blockDim.x)
    dst[t] = f32(src[t]);
}

constexpr int kThreads = 256;

}  // namespace

// ---------------------------------------------------------------- GEMM
Gemm::Gemm() {
  check_lt(cublasLtCreate(&handle_), "create");
  workspace_bytes_ = kWorkspaceBytes;
  check(cudaMalloc(&workspace_, workspace_bytes_), "GEMM workspace");
}

Gemm::~Gemm() {
  for (auto& [key, p] : plans_) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.op);
  }
  cudaFree(workspace_);
  cublasLtDestroy(handle_);
}

// Row-major y = x·Wᵀ is column-major yᵀ[out, n] = W[out, in] (column-major [in, out], transposed)
// times xᵀ (column-major [in, n]); the bias epilogue adds b[out] down each column of yᵀ.
Gemm::Plan& Gemm::plan(int64_t n, int64_t in, int64_t out, bool bias, bool f32_out) {
  const Key key{n, in, out, bias, f32_out};
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  Plan p;
  check_lt(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul descriptor");
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  check_lt(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "transa");
  check_lt(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "transb");
  const cublasLtEpilogue_t epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  check_lt(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi), "epilogue");
  check_lt(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, uint64_t(in), uint64_t(out), in), "layout W");
  check_lt(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, uint64_t(in), uint64_t(n), in), "layout x");
  check_lt(cublasLtMatrixLayoutCreate(&p.c, f32_out ? CUDA_R_32F : CUDA_R_16BF, uint64_t(out), uint64_t(n), out),
           "layout y");
  if (bias) {  // the bias has y's type
    const cudaDataType_t bt = f32_out ? CUDA_R_32F : CUDA_R_16BF;
    check_lt(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt), "bias type");
  }
  cublasLtMatmulPreference_t pref = nullptr;
  check_lt(cublasLtMatmulPreferenceCreate(&pref), "preference");
  const uint64_t ws = workspace_bytes_;
  check_lt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
           "workspace preference");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(handle_, p.op, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  ARIADNE_CHECK(s == CUBLAS_STATUS_SUCCESS && found > 0, "cuda nn: cuBLASLt has no bf16 algorithm for y[", n, ", ",
                out, "] = x[", n, ", ", in, "] · W[", out, ", ", in, "]ᵀ", bias ? " + b" : "",
                f32_out ? " (fp32 y)" : "", " (status ", int(s), ")");
  p.algo = result.algo;
  return plans_.emplace(key, p).first->second;
}

void Gemm::linear(const bf16* x, int64_t n, int64_t in, const bf16* W, const bf16* b, int64_t out, bf16* y,
                  bool accumulate, cudaStream_t stream) {
  run(x, n, in, W, b, out, y, accumulate, false, stream);
}

void Gemm::linear(const bf16* x, int64_t n, int64_t in, const bf16* W, const float* b, int64_t out, float* y,
                  bool accumulate, cudaStream_t stream) {
  run(x, n, in, W, b, out, y, accumulate, true, stream);
}

void Gemm::run(const bf16* x, int64_t n, int64_t in, const bf16* W, const void* b, int64_t out, void* y,
               bool accumulate, bool f32_out, cudaStream_t stream) {
  if (n == 0 || out == 0) return;
  Plan& p = plan(n, in, out, b != nullptr, f32_out);
  if (b != nullptr)
    check_lt(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b, sizeof b), "bias pointer");
  const float alpha = 1.f, beta = accumulate ? 1.f : 0.f;
  check_lt(cublasLtMatmul(handle_, p.op, &alpha, W, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.algo, workspace_,
                          workspace_bytes_, stream),
           "matmul");
}

// ---------------------------------------------------------------- element-wise
namespace {
template <typename T>
void rmsnorm_launch(const T* x, int64_t n, int64_t d, const bf16* w, float eps, bf16* y, cudaStream_t stream) {
  if (n == 0) return;
  constexpr int rows_per_block = kThreads / 32;
  rmsnorm_kernel<<<unsigned((n + rows_per_block - 1) / rows_per_block), kThreads, 0, stream>>>(x, n, d, w, eps, y);
  check(cudaGetLastError(), "rmsnorm launch");
}
}  // namespace

void rmsnorm(const bf16* x, int64_t n, int64_t d, const bf16* w, float eps, bf16* y, cudaStream_t stream) {
  rmsnorm_launch(x, n, d, w, eps, y, stream);
}

void rmsnorm(const float* x, int64_t n, int64_t d, const bf16* w, float eps, bf16* y, cudaStream_t stream) {
  rmsnorm_launch(x, n, d, w, eps, y, stream);
}

void rope_2d(bf16* qkv, int64_t n, int64_t row_stride, int64_t k_offset, int heads, int head_dim, const int2* pos,
             const float* inv_freq, cudaStream_t stream) {
  const int64_t total = n * (head_dim / 2);
  if (total == 0) return;
  rope_kernel<<<blocks_for(total, kThreads), kThreads, 0, stream>>>(qkv, n, row_stride, k_offset, heads, head_dim, pos,
                                                                    inv_freq);
  check(cudaGetLastError(), "rope launch");
}

void rope_pairs(bf16* x, int64_t n, int64_t row_stride, int heads, int head_dim, int pairs, const float* inv_freq,
                int64_t pos0, cudaStream_t stream) {
  const int64_t total = n * pairs;
  if (total == 0) return;
  rope_pairs_kernel<<<blocks_for(total, kThreads), kThreads, 0, stream>>>(x, n, row_stride, heads, head_dim, pairs,
                                                                          inv_freq, pos0);
  check(cudaGetLastError(), "rope launch");
}

void rope_store_row(bf16* qkv, int heads, int kv_heads, int head_dim, int pairs, const float* inv_freq,
                    const int32_t* at, bf16* kcache, bf16* vcache, cudaStream_t stream) {
  const int64_t work = std::max<int64_t>(pairs, int64_t(kv_heads) * head_dim);
  rope_store_row_kernel<<<blocks_for(work, kThreads), kThreads, 0, stream>>>(qkv, heads, kv_heads, head_dim, pairs,
                                                                             inv_freq, at, kcache, vcache);
  check(cudaGetLastError(), "rope_store_row launch");
}

void swiglu(const bf16* gu, int64_t n, int64_t inter, bf16* out, int64_t out_stride, cudaStream_t stream) {
  if (n * out_stride == 0) return;
  swiglu_kernel<<<unsigned(std::min<int64_t>(n, 132 * 64)), kThreads, 0, stream>>>(gu, n, inter, out, out_stride);
  check(cudaGetLastError(), "swiglu launch");
}

void gelu(bf16* x, int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  gelu_kernel<<<blocks_for(count, kThreads), kThreads, 0, stream>>>(x, count);
  check(cudaGetLastError(), "gelu launch");
}

void add(bf16* y, const bf16* x, int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  add_kernel<<<blocks_for(count, kThreads), kThreads, 0, stream>>>(y, x, count);
  check(cudaGetLastError(), "add launch");
}

void gather_rows(const bf16* src, bf16* dst, const int32_t* index, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows * cols == 0) return;
  const bool wide = cols % 8 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(dst) % 16 == 0;
  if (wide) {
    const int64_t c = cols / 8;
    gather_kernel<<<blocks_for(rows * c, kThreads), kThreads, 0, stream>>>(
        reinterpret_cast<const uint4*>(src), reinterpret_cast<uint4*>(dst), index, rows, c);
  } else {
    gather_kernel<<<blocks_for(rows * cols, kThreads), kThreads, 0, stream>>>(src, dst, index, rows, cols);
  }
  check(cudaGetLastError(), "gather launch");
}

void gather_rows(const float* src, float* dst, const int32_t* index, int64_t rows, int64_t cols, cudaStream_t stream) {
  // A bit copy: an fp32 row is 2·cols bf16-sized values.
  gather_rows(reinterpret_cast<const bf16*>(src), reinterpret_cast<bf16*>(dst), index, rows, 2 * cols, stream);
}

void gather_pos(const int2* src, int2* dst, const int32_t* index, int64_t rows, cudaStream_t stream) {
  if (rows == 0) return;
  gather_kernel<<<blocks_for(rows, kThreads), kThreads, 0, stream>>>(src, dst, index, rows, int64_t(1));
  check(cudaGetLastError(), "gather launch");
}

void to_bf16(const float* src, bf16* dst, int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  to_bf16_kernel<<<blocks_for(count, kThreads), kThreads, 0, stream>>>(src, dst, count);
  check(cudaGetLastError(), "to_bf16 launch");
}

void to_f32(const bf16* src, float* dst, int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  to_f32_kernel<<<blocks_for(count, kThreads), kThreads, 0, stream>>>(src, dst, count);
  check(cudaGetLastError(), "to_f32 launch");
}

}  // namespace ariadne::cuda_nn
