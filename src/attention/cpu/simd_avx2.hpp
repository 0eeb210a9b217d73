// Internal: AVX2 + FMA helpers shared by the code compiled with the AVX2 flags (attention_avx2.cpp,
// decode_avx2.cpp): exp2 for the softmax, the 8-row transposed reduction, horizontal max and sum.
// Include it only from a file built with the AVX2 flags (CMakeLists.txt: *_avx2.cpp). The helpers
// live in an unnamed namespace: each including file keeps its own copy, compiled for its own flags.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

namespace ariadne::cpu {
namespace {

// 2^x for x <= 0 (any x up to 127 works): the degree-6 minimax polynomial of 2^f on f ∈ [−½, ½]
// that the AVX-512 table uses (fp32 error 7.9e-8; c0 = 1, so 2^0 is exactly 1), the power of two
// built in the exponent bits; x < −126 (masked logits included) gives exactly 0. kClampHigh clamps x
// at 127: the softmax's p (exp2v_p) skips it, its argument t − m never exceeding 0 by more than the
// rounding of one fused multiply-subtract.
template <bool kClampHigh>
inline __m256 exp2v_t(__m256 x) {
  const __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(-126.f), _CMP_LT_OQ);
  x = _mm256_max_ps(x, _mm256_set1_ps(-126.f));
  if constexpr (kClampHigh) x = _mm256_min_ps(x, _mm256_set1_ps(127.f));
  const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(x, n);
  __m256 p = _mm256_set1_ps(1.5346250438597053e-04f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3399935560300946e-03f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618487209081650e-03f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550328642129898e-02f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4022646248340607e-01f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931471824645996e-01f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}
inline __m256 exp2v(__m256 x) { return exp2v_t<true>(x); }
inline __m256 exp2v_p(__m256 x) { return exp2v_t<false>(x); }

// Lane i of the result = op over the 8 lanes of v[i]: 8 rows' reductions at once, by a transpose
// in three levels (the lanes come out as rows 0 2 4 6 1 3 5 7 and one permute orders them),
// against a dependent chain of about 6 per row for a horizontal reduction.
template <class Op>
inline __m256 reduce_rows8(const __m256* v, Op op) {
  __m256 w[4], x[2];
  for (int k = 0; k < 4; ++k)
    w[k] = op(_mm256_permute2f128_ps(v[2 * k], v[2 * k + 1], 0x20),
              _mm256_permute2f128_ps(v[2 * k], v[2 * k + 1], 0x31));
  for (int k = 0; k < 2; ++k)
    x[k] = op(_mm256_shuffle_ps(w[2 * k], w[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
              _mm256_shuffle_ps(w[2 * k], w[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 y = op(_mm256_shuffle_ps(x[0], x[1], _MM_SHUFFLE(2, 0, 2, 0)),
                      _mm256_shuffle_ps(x[0], x[1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm256_permutevar8x32_ps(y, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

inline float hmax(__m256 v) {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  x = _mm_max_ss(x, _mm_shuffle_ps(x, x, 1));
  return _mm_cvtss_f32(x);
}
inline float hsum(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
  return _mm_cvtss_f32(x);
}

}  // namespace
}  // namespace ariadne::cpu

#endif
