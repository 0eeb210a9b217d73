// Internal: thin wrappers over the sm_80+ warp-level instructions the forward kernel is built from
// (cp.async, ldmatrix, mma.sync m16n8k16, ex2). Each wrapper is one PTX instruction, so the kernel
// reads like the data flow and the SASS stays predictable.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>

namespace ariadne::cuda {

// max that propagates NaN (PTX max.NaN, sm_80+). The row maxima of the online softmax use it so a
// NaN logit poisons its row (docs/numerics.md: non-finite inputs propagate) instead of vanishing
// in fmaxf and leaving a row that looks fully masked.
__device__ __forceinline__ float fmax_nan(float a, float b) {
  float d;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}

// Reductions over a quad, the 4 lanes that hold one row of an mma accumulator fragment: the row's
// sum and (NaN-propagating) max, known to all 4 lanes.
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  return v;
}
__device__ __forceinline__ float quad_max(float v) {
  v = fmax_nan(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmax_nan(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte asynchronous global->shared copy; when `pred` is false the 16 bytes are zero-filled
// (src-size 0), so rows past a sequence end hold zeros, never stale NaNs that 0·NaN would spread.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool pred) {
  const int n = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
// 4-byte asynchronous copy (row statistics), zero-filled when `pred` is false.
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool pred) {
  const int n = pred ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// Two transposed 8x8 matrices, their row addresses from lanes 0-15 (the others' are ignored).
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}

// mma.sync m16n8k16 with f32 accumulators for the PTX input type T: the same asm for both element types.
#define ARIADNE_MMA_M16N8K16(T)                                                                               \
  static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,              \
                                             uint32_t b1) {                                                   \
    asm volatile(                                                                                             \
        "mma.sync.aligned.m16n8k16.row.col.f32." T "." T ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "                \
        "{%8,%9}, {%0,%1,%2,%3};\n"                                                                           \
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                                      \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));                                      \
  }

// Element traits: the 16-bit input type, its mma opcode and its float-pair packing.
struct Bf16 {
  using type = __nv_bfloat16;
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ float2 unpack(uint32_t bits) {  // pack's inverse (exact)
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bits));
  }
  ARIADNE_MMA_M16N8K16("bf16")
};
struct F16 {
  using type = __half;
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ float2 unpack(uint32_t bits) {
    return __half22float2(*reinterpret_cast<const __half2*>(&bits));
  }
  ARIADNE_MMA_M16N8K16("f16")
};
#undef ARIADNE_MMA_M16N8K16

// 2^x with the hardware approximation (rel. error ~2^-22, far below bf16/fp16 rounding);
// ex2(-inf) = +0, which the online softmax relies on for masked scores.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Folds a denominator sink (log2 units) into a finished row's running max m and sum l, as one more
// key with no value, and returns the factor the row's accumulators must be scaled by. The edges
// follow docs/numerics.md: a −inf sink is the plain softmax; a +inf sink takes all the mass
// (l = 1 at m = +inf: out 0, lse +inf); a NaN in m (a NaN logit) stays NaN. Comparisons before
// the subtractions keep inf − inf from turning those cases into NaN.
__device__ __forceinline__ float fold_sink(float& m, float& l, float sink_log2) {
  if (sink_log2 == -INFINITY) return 1.f;
  const float mf = fmaxf(m, sink_log2);  // fmaxf(NaN, s) = s: the NaN survives in `rescale`
  const float rescale = m == mf ? 1.f : ex2(m - mf);
  l = l * rescale + (sink_log2 == mf ? 1.f : ex2(sink_log2 - mf));
  m = mf;
  return rescale;
}

// Whether a finished row has softmax mass: l == 0 means no key and no sink (out 0, lse −inf); a
// NaN l (a NaN logit) counts as mass so that the NaN reaches out and lse.
__device__ __forceinline__ bool row_has_mass(float l) { return !(l <= 0.f); }

}  // namespace ariadne::cuda
