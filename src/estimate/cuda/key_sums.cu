// RR sampling, part 1: the key-stride sums K̄ (one pass over k), as f32 for the f32 kernel or as
// three exact bf16 terms for the tensor-core kernels.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "estimate/cuda/estimate.cuh"
#include "estimate/cuda/score_common.cuh"

namespace ariadne::cuda {
namespace {

// The sequence owning packed key-stride row x: the last one whose ks_base <= x (empty sequences
// share their successor's ks_base and come before it).
__device__ int seq_of_key_stride(const EstSeq* seqs, int n, int64_t x) {
  int lo = 0, hi = n;  // answer in [lo, hi)
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (seqs[mid].ks_base <= x) lo = mid; else hi = mid;
  }
  return lo;
}

// RR sampling, part 1: K̄_j = Σ_{t<S} k_{jS+t} per KV head, f32, summed in t order as the CPU does
// (so the sums are bit-identical to the CPU estimator's). Written as f32 (f32 scoring) or as its
// three bf16 terms, zero-padded to dpad (tensor-core scoring). Grid (total_ks, heads_kv).
__global__ void key_stride_sums_kernel(ScoreParams p) {
  const int64_t x = blockIdx.x;
  const int kvh = blockIdx.y;
  const EstSeq e = p.seqs[seq_of_key_stride(p.seqs, p.num_seqs, x)];
  const int64_t j = x - e.ks_base;
  const int width = p.mma ? p.dpad : p.d;
  for (int u = threadIdx.x; u < width; u += blockDim.x) {
    float acc = 0.f;
    if (u < p.d)
      for (int t = 0; t < p.stride && j * p.stride + t < e.lk; ++t)
        acc += load_elem(p.k, (e.k0 + j * p.stride + t) * p.k_tok + kvh * p.k_head + u, p.dtype);
    if (p.mma) {
      __nv_bfloat16 parts[3];
      split_bf16(acc, parts);
      __nv_bfloat16* dst = static_cast<__nv_bfloat16*>(p.ksplit) + (int64_t(kvh) * p.total_ks + x) * 3 * p.dpad;
#pragma unroll
      for (int i = 0; i < 3; ++i) dst[i * p.dpad + u] = parts[i];
    } else {
      p.ksum[(int64_t(kvh) * p.total_ks + x) * p.d + u] = acc;
    }
  }
}

// The same sums for 16-bit keys whose rows are 16-byte vectors (head_dim % 8 == 0, aligned base
// and strides; launch_key_stride_sums checks): one thread per (key stride, KV head, 8 elements),
// KV heads fastest, so a warp reads whole token rows. A thread loads up to 8 of its stride's key
// vectors before adding any (the scalar kernel above waits on each 2-byte load in turn: ~0.28 ms
// at 128K tokens, 27% of DRAM bandwidth, 77% of its stalls on that wait), then adds them in t
// order from 0, exactly as the scalar kernel and the CPU do, so the sums are the same bits.
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }

template <class T>
__global__ void key_stride_sums_vec_kernel(ScoreParams p, int64_t items) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= items) return;
  const int chunks = (p.mma ? p.dpad : p.d) / 8;  // output vectors per (stride, head); d % 8 == 0
  const int c = int(idx % chunks);
  const int64_t pair = idx / chunks;
  const int kvh = int(pair % p.heads_kv);
  const int64_t x = pair / p.heads_kv;
  const EstSeq e = p.seqs[seq_of_key_stride(p.seqs, p.num_seqs, x)];
  const int64_t j = x - e.ks_base;
  float acc[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] = 0.f;
  if (c * 8 < p.d) {
    // Keys of this stride inside the sequence: t < n (the scalar kernel's loop bound).
    const int64_t left = e.lk - j * p.stride;
    const int n = int(left < p.stride ? left : p.stride);
    const T* src = static_cast<const T*>(p.k) + (e.k0 + j * p.stride) * p.k_tok + kvh * p.k_head + c * 8;
    for (int t0 = 0; t0 < n; t0 += 8) {
      uint4 v[8];
#pragma unroll
      for (int u = 0; u < 8; ++u)
        v[u] = t0 + u < n ? __ldg(reinterpret_cast<const uint4*>(src + (t0 + u) * p.k_tok)) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        if (t0 + u >= n) break;
        const T* h = reinterpret_cast<const T*>(&v[u]);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] += to_f32(h[i]);
      }
    }
  }
  if (p.mma) {
    __align__(16) __nv_bfloat16 parts[3][8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      __nv_bfloat16 t[3];
      split_bf16(acc[i], t);
      parts[0][i] = t[0];
      parts[1][i] = t[1];
      parts[2][i] = t[2];
    }
    __nv_bfloat16* dst = static_cast<__nv_bfloat16*>(p.ksplit) + (int64_t(kvh) * p.total_ks + x) * 3 * p.dpad + c * 8;
#pragma unroll
    for (int i = 0; i < 3; ++i) *reinterpret_cast<uint4*>(dst + i * p.dpad) = *reinterpret_cast<const uint4*>(parts[i]);
  } else {
    float* dst = p.ksum + (int64_t(kvh) * p.total_ks + x) * p.d + c * 8;
    reinterpret_cast<float4*>(dst)[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    reinterpret_cast<float4*>(dst)[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
  }
}

}  // namespace

cudaError_t launch_key_stride_sums(const ScoreParams& p, cudaStream_t stream) {
  if (p.total_ks == 0) return cudaSuccess;
  // 16-bit keys in 16-byte vectors: the vector kernel (same sums); anything else the scalar one.
  const bool vec = (p.dtype == 1 || p.dtype == 2) && p.d % 8 == 0 && reinterpret_cast<uintptr_t>(p.k) % 16 == 0 &&
                   p.k_tok % 8 == 0 && p.k_head % 8 == 0;
  if (vec) {
    const int64_t items = p.total_ks * p.heads_kv * ((p.mma ? p.dpad : p.d) / 8);
    constexpr int threads = 256;
    const unsigned blocks = unsigned((items + threads - 1) / threads);
    if (p.dtype == 1)
      key_stride_sums_vec_kernel<__nv_bfloat16><<<blocks, threads, 0, stream>>>(p, items);
    else
      key_stride_sums_vec_kernel<__half><<<blocks, threads, 0, stream>>>(p, items);
    return cudaGetLastError();
  }
  const int threads = p.d < 128 ? ((p.d + 31) / 32) * 32 : 128;
  key_stride_sums_kernel<<<dim3(unsigned(p.total_ks), unsigned(p.heads_kv)), threads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace ariadne::cuda
