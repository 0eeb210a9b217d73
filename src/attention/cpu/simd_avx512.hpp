// Internal: AVX-512 helpers shared by the code compiled with AVX-512 (attention_avx512.cpp,
// attention_amx.cpp, decode_avx512.cpp): exp2 for the softmax and the 16-row transposed reduction.
// Include it only from a file built with the AVX-512 flags (CMakeLists.txt: *_avx512.cpp, *_amx.cpp). The helpers
// live in an unnamed namespace: each of those files keeps its own copy, compiled for its own flags,
// so the linker never picks one file's instructions for another.
#pragma once

#if defined(__x86_64__)
// GCC 12's _mm512_undefined_ps() initializes a register with itself, which -Wmaybe-uninitialized
// reports inside max/min/scalef intrinsics once inlined, and -Wuninitialized inside the shuffles of
// transpose16 once transpose32 inlines it with constant sizes: false positives in the compiler's
// header. The pragmas hold for the rest of the including file, which is all AVX-512 code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

namespace ariadne::cpu {
namespace {

// 2^f for f ∈ [−½, ½]: the degree-6 minimax polynomial for relative error (coefficients fitted in
// double, rounded to fp32). Evaluated in fp32 its error is 7.9e-8 at most, level with the degree-7
// Taylor polynomial's 7.1e-8 there (both are fp32 rounding, the truncation is below it), for one
// FMA fewer; c0 = 1, so 2^0 is exactly 1.
inline __m512 exp2_poly6(__m512 f) {
  __m512 p = _mm512_set1_ps(1.5346250438597053e-04f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3399935560300946e-03f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618487209081650e-03f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550328642129898e-02f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022646248340607e-01f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931471824645996e-01f));
  return _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
}

// 2^x for x <= 0 (any x works up to 128). x < −125 (a masked logit's −inf included) gives exactly
// 0 through the zero-masked scalef: letting scalef underflow instead takes a microcode assist per
// vector (the subnormal or flushed result, with FTZ off), which made the softmax of a ±64 window, a
// fifth of whose logits are masked, several times slower. Below 2^−125 next to a row maximum of 1
// nothing is lost that fp32 sums keep.
inline __m512 exp2v(__m512 x) {
  const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-125.f), _CMP_GE_OQ);  // false for NaN
  x = _mm512_maskz_max_ps(0xFFFF, x, _mm512_set1_ps(-125.f));
  x = _mm512_maskz_min_ps(0xFFFF, x, _mm512_set1_ps(128.f));
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm512_maskz_scalef_ps(live, exp2_poly6(_mm512_sub_ps(x, n)), n);
}

// exp2v for the softmax's p, whose argument t − m never exceeds 0 by more than the rounding of
// one fused multiply-subtract: the upper clamp is dropped.
inline __m512 exp2v_p(__m512 x) {
  const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-125.f), _CMP_GE_OQ);
  x = _mm512_maskz_max_ps(0xFFFF, x, _mm512_set1_ps(-125.f));
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm512_maskz_scalef_ps(live, exp2_poly6(_mm512_sub_ps(x, n)), n);
}

// 2^x for x <= 0 with relative error ≤ 7.5e-5: a degree-3 minimax polynomial of 2^f on
// f ∈ [−½, ½] (fitted for relative error, coefficients rounded to fp32), for p that is rounded to
// bf16 right after (RowMask::bf16_p): bf16's rounding is 2^-9 = 2e-3, 26 times larger. Three FMAs
// and the upper clamp fewer than exp2v (x = t − m never exceeds 0); x < −125 gives exactly 0 as there.
inline __m512 exp2v_bf16(__m512 x) {
  const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-125.f), _CMP_GE_OQ);
  x = _mm512_maskz_max_ps(0xFFFF, x, _mm512_set1_ps(-125.f));
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(0.0551716685295105f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.2426111251115799f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6932609677314758f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.9999280571937561f));
  return _mm512_maskz_scalef_ps(live, p, n);
}

// Lane i of the result = op over the 16 lanes of v[i]: the reductions of 16 rows at once, as a
// transpose in four levels of shuffles (45 operations for 16 rows, against a dependent chain of
// about 8 per row for a horizontal reduction, which bounded the softmax of the AMX table).
template <class Op>
inline __m512 reduce_rows16(const __m512* v, Op op) {
  __m512 w[8], x[4], y[2];
  for (int k = 0; k < 8; ++k)
    w[k] = op(_mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
              _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  for (int k = 0; k < 4; ++k)
    x[k] = op(_mm512_shuffle_f32x4(w[2 * k], w[2 * k + 1], _MM_SHUFFLE(2, 0, 2, 0)),
              _mm512_shuffle_f32x4(w[2 * k], w[2 * k + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  for (int k = 0; k < 2; ++k)
    y[k] = op(_mm512_shuffle_ps(x[2 * k], x[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
              _mm512_shuffle_ps(x[2 * k], x[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 z = op(_mm512_shuffle_ps(y[0], y[1], _MM_SHUFFLE(2, 0, 2, 0)),
                      _mm512_shuffle_ps(y[0], y[1], _MM_SHUFFLE(3, 1, 3, 1)));
  // The four levels leave row 4a + b in lane 4b + a.
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), z);
}

}  // namespace
}  // namespace ariadne::cpu

#endif
