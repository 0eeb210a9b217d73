// Internal: dense-layer pieces on the GPU, shared by the vision encoder (src/vit/cuda/vit_cuda.cu) and
// the Llama GPU path (src/llm/cuda/llama_cuda.cu). Row-major bf16 device arrays; every reduction and every
// element-wise formula is evaluated in fp32 and rounded to bf16 once where the tensor is stored.
// All calls are asynchronous on the given stream; errors of a launch throw ariadne::Error.
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>

namespace ariadne::cuda_nn {

using bf16 = __nv_bfloat16;

// Throws ariadne::Error naming `what` when a CUDA runtime call failed.
void check(cudaError_t e, const char* what);

// y[n, out] = x[n, in] · W[out, in]ᵀ (+ b[out]) (+ y when accumulate), bf16 x and W, fp32
// accumulation, through cuBLASLt; y (and b) bf16 or fp32. The bias is added in the GEMM's epilogue
// and the residual as beta = 1 with C = D = y, so `x += proj(a) + b` is one call (with an fp32 y:
// an fp32 residual stream). Rows of x, W and y should start on 16-byte boundaries (`in` and `out`
// multiples of 8): cuBLASLt's fast kernels need it (a K of 3420 ran the MLP at half speed).
// Matmul descriptors and the heuristic's algorithm are cached per shape (the encoder calls the same
// handful of shapes every layer). Not thread-safe: one Gemm per stream.
class Gemm {
 public:
  Gemm();
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  void linear(const bf16* x, int64_t n, int64_t in, const bf16* W, const bf16* b, int64_t out, bf16* y,
              bool accumulate, cudaStream_t stream);
  void linear(const bf16* x, int64_t n, int64_t in, const bf16* W, const float* b, int64_t out, float* y,
              bool accumulate, cudaStream_t stream);

 private:
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  using Key = std::tuple<int64_t, int64_t, int64_t, bool, bool>;  // n, in, out, bias, fp32 y
  Plan& plan(int64_t n, int64_t in, int64_t out, bool bias, bool f32_out);
  void run(const bf16* x, int64_t n, int64_t in, const bf16* W, const void* b, int64_t out, void* y, bool accumulate,
           bool f32_out, cudaStream_t stream);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<Key, Plan> plans_;
};

// RMSNorm as HF's Qwen2RMSNorm / LlamaRMSNorm: y = bf16(w · bf16(x · rsqrt(mean(x²) + eps))), the
// mean in fp32. x: [n, d] bf16 or fp32 (a residual stream kept in fp32); y: [n, d] bf16 (may alias
// a bf16 x); w: [d].
void rmsnorm(const bf16* x, int64_t n, int64_t d, const bf16* w, float eps, bf16* y, cudaStream_t stream);
void rmsnorm(const float* x, int64_t n, int64_t d, const bf16* w, float eps, bf16* y, cudaStream_t stream);

// 2D rotary embedding in place on q and k of packed qkv rows (Qwen2.5-VL's vision RoPE):
// rows [n] of `row_stride` values, q of head h at row + h·head_dim, k at row + k_offset + h·head_dim.
// Token r has patch position pos[r] = (row, col); with q4 = head_dim/4 frequencies inv_freq[q4]
// (fp32), lane i < head_dim/2 rotates (x[i], x[i + head_dim/2]) by angle pos[i / q4] · inv_freq[i % q4]
// in fp32 (x·cos + rotate_half(x)·sin), stored as bf16.
void rope_2d(bf16* qkv, int64_t n, int64_t row_stride, int64_t k_offset, int heads, int head_dim, const int2* pos,
             const float* inv_freq, cudaStream_t stream);

// 1D rotary embedding in place, llama.cpp's layout (Llama GGUF files): rows [n] of `row_stride`
// values holding `heads` heads of head_dim values; row r sits at position pos0 + r and, for
// i < pairs (rope dims / 2), rotates the adjacent pair (x[2i], x[2i+1]) of every head by angle
// (pos0 + r) · inv_freq[i] (fp32: the position rounded to fp32 first, as HF), stored as bf16.
void rope_pairs(bf16* x, int64_t n, int64_t row_stride, int heads, int head_dim, int pairs, const float* inv_freq,
                int64_t pos0, cudaStream_t stream);

// SwiGLU on the output of one GEMM with [gate | up] weights: gu [n, 2·inter] (gate in columns
// [0, inter), up in [inter, 2·inter)) → out [n, out_stride], columns [0, inter) = bf16(bf16(silu(gate))
// · up) as HF's act_fn(gate_proj(x)) * up_proj(x) on bf16 tensors, columns [inter, out_stride) = 0
// (padding that keeps the next GEMM's rows 16-byte aligned; its weight has zero columns there).
void swiglu(const bf16* gu, int64_t n, int64_t inter, bf16* out, int64_t out_stride, cudaStream_t stream);

// Exact (erf) GELU in place on `count` values.
void gelu(bf16* x, int64_t count, cudaStream_t stream);

// y[i] += x[i] for `count` values (fp32 sum, rounded once).
void add(bf16* y, const bf16* x, int64_t count, cudaStream_t stream);

// Row gather: dst[i, :] = src[index[i], :] for i < rows, `cols` values a row (dst ≠ src).
void gather_rows(const bf16* src, bf16* dst, const int32_t* index, int64_t rows, int64_t cols, cudaStream_t stream);
void gather_rows(const float* src, float* dst, const int32_t* index, int64_t rows, int64_t cols, cudaStream_t stream);
// The same for one int2 a row (patch positions travelling with their tokens).
void gather_pos(const int2* src, int2* dst, const int32_t* index, int64_t rows, cudaStream_t stream);

// A decode step's row qkv = [q: heads · head_dim | k: kv_heads · head_dim | v: the same]: RoPE on
// the q and k heads at position *at (the pairs and frequencies of rope_pairs), then the rotated k
// and the v stored at row *at of kcache and vcache ([positions, kv_heads · head_dim]), in one
// launch; *at is read on the device, so a CUDA graph that captured the call works at the position
// it finds at each replay.
void rope_store_row(bf16* qkv, int heads, int kv_heads, int head_dim, int pairs, const float* inv_freq,
                    const int32_t* at, bf16* kcache, bf16* vcache, cudaStream_t stream);

// Conversions of `count` values.
void to_bf16(const float* src, bf16* dst, int64_t count, cudaStream_t stream);
void to_f32(const bf16* src, float* dst, int64_t count, cudaStream_t stream);

}  // namespace ariadne::cuda_nn
