// AVX2+FMA kernel of est::dot_rows (compiled with -mavx2 -mfma; chosen at run time).
//
// The estimators' scoring is a skinny GEMM: a handful of query rows (B/S per query block) against
// every visible key row. A 4×2 register tile (8 accumulators) keeps one load of A and B per FMA
// pair; the query rows stay in L1 while the key rows stream from L2/L3.
#include <immintrin.h>

#include <cmath>

#include "estimate/internal.hpp"

namespace ariadne::est {

namespace {
inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
  return _mm_cvtss_f32(lo);
}

// One output element with the same summation order as the tiles (8 lanes, then the tail).
inline float dot1(const float* x, const float* y, int64_t len) {
  const int64_t len8 = len & ~int64_t(7);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t t = 0; t < len8; t += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + t), _mm256_loadu_ps(y + t), acc);
  float s = hsum(acc);
  for (int64_t t = len8; t < len; ++t) s += x[t] * y[t];
  return s;
}
}  // namespace

void dot_rows_avx2(const float* a, int64_t rows, const float* b, int64_t cols, int64_t len,
                   float* c, int64_t ldc) {
  const int64_t len8 = len & ~int64_t(7);
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    const float* a0 = a + r * len;
    const float* a1 = a0 + len;
    const float* a2 = a1 + len;
    const float* a3 = a2 + len;
    int64_t j = 0;
    for (; j + 2 <= cols; j += 2) {
      const float* b0 = b + j * len;
      const float* b1 = b0 + len;
      __m256 s00 = _mm256_setzero_ps(), s01 = s00, s10 = s00, s11 = s00, s20 = s00, s21 = s00,
             s30 = s00, s31 = s00;
      for (int64_t t = 0; t < len8; t += 8) {
        const __m256 x0 = _mm256_loadu_ps(b0 + t), x1 = _mm256_loadu_ps(b1 + t);
        __m256 y = _mm256_loadu_ps(a0 + t);
        s00 = _mm256_fmadd_ps(y, x0, s00);
        s01 = _mm256_fmadd_ps(y, x1, s01);
        y = _mm256_loadu_ps(a1 + t);
        s10 = _mm256_fmadd_ps(y, x0, s10);
        s11 = _mm256_fmadd_ps(y, x1, s11);
        y = _mm256_loadu_ps(a2 + t);
        s20 = _mm256_fmadd_ps(y, x0, s20);
        s21 = _mm256_fmadd_ps(y, x1, s21);
        y = _mm256_loadu_ps(a3 + t);
        s30 = _mm256_fmadd_ps(y, x0, s30);
        s31 = _mm256_fmadd_ps(y, x1, s31);
      }
      float v[8] = {hsum(s00), hsum(s01), hsum(s10), hsum(s11), hsum(s20), hsum(s21), hsum(s30), hsum(s31)};
      for (int64_t t = len8; t < len; ++t) {
        v[0] += a0[t] * b0[t];
        v[1] += a0[t] * b1[t];
        v[2] += a1[t] * b0[t];
        v[3] += a1[t] * b1[t];
        v[4] += a2[t] * b0[t];
        v[5] += a2[t] * b1[t];
        v[6] += a3[t] * b0[t];
        v[7] += a3[t] * b1[t];
      }
      for (int i = 0; i < 4; ++i) {
        c[(r + i) * ldc + j] = v[2 * i];
        c[(r + i) * ldc + j + 1] = v[2 * i + 1];
      }
    }
    for (; j < cols; ++j)
      for (int i = 0; i < 4; ++i) c[(r + i) * ldc + j] = dot1(a + (r + i) * len, b + j * len, len);
  }
  for (; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) c[r * ldc + j] = dot1(a + r * len, b + j * len, len);
}

// x[i] ← exp(x[i] − mx) for i < n, returning Σ x[i] in double. Cephes-style expf: range
// reduction by ln 2 in two parts, degree-6 polynomial, exponent by integer shift; relative error
// about 2e-7 over the range that occurs here (x − mx <= 0). Inputs below −87 give ~1e-38, not 0.
double exp_sum_avx2(float* x, int64_t n, float mx) {
  const __m256 vmx = _mm256_set1_ps(mx), lo = _mm256_set1_ps(-87.3f), log2e = _mm256_set1_ps(1.44269504088896341f);
  const __m256 c1 = _mm256_set1_ps(0.693359375f), c2 = _mm256_set1_ps(-2.12194440e-4f);
  const __m256 one = _mm256_set1_ps(1.f), half = _mm256_set1_ps(0.5f);
  __m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_max_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmx), lo);
    __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(v, log2e, half));
    v = _mm256_fnmadd_ps(fx, c1, v);
    v = _mm256_fnmadd_ps(fx, c2, v);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, v, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, v, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, v, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, v, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, v, half);
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(v, v), _mm256_add_ps(v, one));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    const __m256 r = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    _mm256_storeu_ps(x + i, r);
    acc0 = _mm256_add_pd(acc0, _mm256_cvtps_pd(_mm256_castps256_ps128(r)));
    acc1 = _mm256_add_pd(acc1, _mm256_cvtps_pd(_mm256_extractf128_ps(r, 1)));
  }
  double lanes[4];
  _mm256_storeu_pd(lanes, _mm256_add_pd(acc0, acc1));
  double s = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    s += x[i];
  }
  return s;
}

}  // namespace ariadne::est
