// cuda_memory_floor (bench_kernels.hpp): the compulsory traffic of an attention call and nothing else,
// for the benchmarks' floor column (bench/README.md, "Memory floor"). One thread a 16-byte word,
// 512 threads a block: of the launch shapes compared on the H200 (grid-stride loops of 1-16 blocks
// per SM with 1-4 words in flight a thread, and this one), the fastest or within 1% of it on every
// ViT cell, single calls and graph replays alike (docs/design/bandwg.md, "the memory floor").
#include <cuda_runtime.h>

#include <cstdint>

#include "ariadne/error.hpp"
#include "kernels/bench_kernels.hpp"

namespace ariadne {
namespace {

// Word i: out[i] = q[i] ^ k[i] ^ v[i] for i < nq (k and v read where i < nkv). Past nq (k and v
// longer than q) the words still have to be read: they meet a store that no value reaches (all 128
// bits equal to the word's own index, impossible for two independent random inputs, and harmless if
// it happened: the store writes out[0]), so the compiler keeps the loads.
__global__ void __launch_bounds__(512) memory_floor_kernel(const uint4* __restrict__ q, const uint4* __restrict__ k,
                                                           const uint4* __restrict__ v, uint4* __restrict__ out,
                                                           int64_t nq, int64_t nkv) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  uint4 a = make_uint4(0, 0, 0, 0);
  if (i < nq) a = __ldcs(q + i);
  if (i < nkv) {
    const uint4 b = __ldcs(k + i), c = __ldcs(v + i);
    a = make_uint4(a.x ^ b.x ^ c.x, a.y ^ b.y ^ c.y, a.z ^ b.z ^ c.z, a.w ^ b.w ^ c.w);
  }
  if (i < nq) {
    __stcs(out + i, a);
  } else if (a.x == uint32_t(i) && a.y == uint32_t(i) && a.z == uint32_t(i) && a.w == uint32_t(i)) {
    out[0] = a;
  }
}

}  // namespace

void cuda_memory_floor(const void* q, const void* k, const void* v, void* out, int64_t q_bytes, int64_t kv_bytes,
                       void* stream) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  ARIADNE_CHECK(q != nullptr && aligned(q), "cuda_memory_floor: q must be a 16-byte aligned device pointer");
  ARIADNE_CHECK(k != nullptr && aligned(k), "cuda_memory_floor: k must be a 16-byte aligned device pointer");
  ARIADNE_CHECK(v != nullptr && aligned(v), "cuda_memory_floor: v must be a 16-byte aligned device pointer");
  ARIADNE_CHECK(out != nullptr && aligned(out), "cuda_memory_floor: out must be a 16-byte aligned device pointer");
  ARIADNE_CHECK(q_bytes > 0 && q_bytes % 16 == 0, "cuda_memory_floor: q_bytes ", q_bytes,
                ", expected a positive multiple of 16");
  ARIADNE_CHECK(kv_bytes > 0 && kv_bytes % 16 == 0, "cuda_memory_floor: kv_bytes ", kv_bytes,
                ", expected a positive multiple of 16");
  const int64_t nq = q_bytes / 16, nkv = kv_bytes / 16, words = nq > nkv ? nq : nkv;
  constexpr int threads = 512;
  const int64_t blocks = (words + threads - 1) / threads;
  ARIADNE_CHECK(blocks <= int64_t(INT32_MAX), "cuda_memory_floor: ", words, " words exceed one launch's grid");
  memory_floor_kernel<<<unsigned(blocks), threads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint4*>(q), static_cast<const uint4*>(k), static_cast<const uint4*>(v),
      static_cast<uint4*>(out), nq, nkv);
  const cudaError_t e = cudaGetLastError();
  ARIADNE_CHECK(e == cudaSuccess, "cuda_memory_floor: launch failed: ", cudaGetErrorString(e));
}

}  // namespace ariadne
