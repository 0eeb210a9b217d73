// The decode task's body (decode_kernel.hpp), included by each ISA file only. Everything here is
// in an unnamed namespace: each ISA file keeps its own copy compiled for its flags, and the linker
// never merges an AVX-512 copy into the generic table.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "decode/cpu/decode_kernel.hpp"

namespace ariadne::decode_detail {
namespace {

// Σ_i a[i]·b[i]. The vector paths keep two accumulators and reduce once per dot with a log-depth
// tree: a plain loop reduced by the compiler ends in a chain of 16 dependent scalar adds per dot,
// which dominated the task.
inline float dot(const float* a, const float* b, int n) {
#if defined(__AVX512F__)
  if (n % 16 == 0) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    int i = 0;
    for (; i + 32 <= n; i += 32) {
      s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
      s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
    }
    if (i < n) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    const __m512 s = _mm512_add_ps(s0, s1);
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(s), _mm512_extractf32x8_ps(s, 1));
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
  }
#elif defined(__AVX2__)
  if (n % 8 == 0) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
      s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
      s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    if (i < n) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    const __m256 s = _mm256_add_ps(s0, s1);
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
  }
#endif
  float s = 0.f;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

template <class T>
inline float to_f32(T x) {
  if constexpr (sizeof(T) == 4) return x;
  else return bf16_to_float(x);
}

// Rows [r0, r1) of one page: convert each key row to f32, score it against every head, then fold
// the page into the running softmax and accumulate V (converted row by row, read once per group).
template <DType kDtype>
inline void decode_task_body(const DecodeTask& t) {
  using Elem = std::conditional_t<kDtype == DType::f32, float, uint16_t>;
  const int d = t.d, G = t.G, P = t.P;
  const Elem* kpool = reinterpret_cast<const Elem*>(t.k);
  const Elem* vpool = reinterpret_cast<const Elem*>(t.v);
  for (int hg = 0; hg < G; ++hg) {
    t.m[hg] = -std::numeric_limits<float>::infinity();
    t.l[hg] = 0.f;
    std::fill_n(t.acc + int64_t(hg) * d, d, 0.f);
  }
  for (int64_t pi = 0; pi < t.npages; ++pi) {
    const int64_t page = t.pages[pi];
    const int64_t r0 = std::max<int64_t>(t.first - page * P, 0), r1 = std::min<int64_t>(t.length - page * P, P);
    if (r1 <= r0) continue;
    const int rows = int(r1 - r0);
    // The page's rows of KV head g are contiguous ([pages, kv_heads, page_size, head_dim]).
    const int64_t base = ((int64_t(t.table[page]) * t.kv_heads + t.g) * P + r0) * d;
    // The page's K and V rows of head g, converted to f32 once for the whole group.
    const auto widen = [&](const Elem* src, float* dst) {
      if constexpr (kDtype == DType::f16) {
        for (int64_t i = 0; i < int64_t(rows) * d; ++i) dst[i] = f16_to_float(src[i]);
      } else {
#pragma omp simd
        for (int64_t i = 0; i < int64_t(rows) * d; ++i) dst[i] = to_f32(src[i]);
      }
    };
    widen(kpool + base, t.kf);
    widen(vpool + base, t.vf);
    for (int hg = 0; hg < G; ++hg) {
      const float* qh = t.q + int64_t(hg) * d;
      float* sh = t.s + int64_t(hg) * P;
      float mx = t.m[hg];
      bool nan = false;
      for (int r = 0; r < rows; ++r) {
        float x = dot(qh, t.kf + int64_t(r) * d, d) * t.scale;
        if (t.key0_bias && page * P + r0 + r == 0) x += t.key0_bias[hg];
        sh[r] = x;
        nan |= std::isnan(x);
        mx = std::max(mx, x);
      }
      // A NaN or +inf logit poisons the row (docs/numerics.md): m and l become NaN for good.
      if (nan || mx == std::numeric_limits<float>::infinity() || std::isnan(t.m[hg])) {
        t.m[hg] = t.l[hg] = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      const float alpha = t.m[hg] == -std::numeric_limits<float>::infinity() ? 0.f : std::exp(t.m[hg] - mx);
      float sum = 0.f;
      for (int r = 0; r < rows; ++r) sum += (sh[r] = std::exp(sh[r] - mx));
      t.l[hg] = t.l[hg] * alpha + sum;
      t.m[hg] = mx;
      float* a = t.acc + int64_t(hg) * d;
#pragma omp simd
      for (int i = 0; i < d; ++i) a[i] *= alpha;
    }
    // acc += Σ_r p_r v_r, four rows per pass over the accumulator (a quarter of its loads and stores).
    for (int hg = 0; hg < G; ++hg) {
      if (std::isnan(t.m[hg])) continue;
      const float* p = t.s + int64_t(hg) * P;
      float* a = t.acc + int64_t(hg) * d;
      int r = 0;
      for (; r + 4 <= rows; r += 4) {
        const float* v0 = t.vf + int64_t(r) * d;
        const float w0 = p[r], w1 = p[r + 1], w2 = p[r + 2], w3 = p[r + 3];
#pragma omp simd
        for (int i = 0; i < d; ++i) a[i] += w0 * v0[i] + w1 * v0[d + i] + w2 * v0[2 * d + i] + w3 * v0[3 * d + i];
      }
      for (; r < rows; ++r) {
        const float* v0 = t.vf + int64_t(r) * d;
        const float w0 = p[r];
#pragma omp simd
        for (int i = 0; i < d; ++i) a[i] += w0 * v0[i];
      }
    }
  }
}

// Written as plain loops over sixteen independent lanes, which each ISA file's flags vectorize into
// four (AVX2, AVX-512 at 256-bit width) or eight (SSE2) accumulators: enough chains to hide the
// multiply-add latency, where one chain per vector left the dot at ~4 cycles per 8 terms.
constexpr int kScoreLanes = 16;

inline double reduce_lanes(const double* acc) {
  double half[kScoreLanes / 2];
  for (int l = 0; l < kScoreLanes / 2; ++l) half[l] = acc[l] + acc[l + kScoreLanes / 2];
  return ((half[0] + half[4]) + (half[2] + half[6])) + ((half[1] + half[5]) + (half[3] + half[7]));
}

double score_dot(const double* q, const float* k, int d) {
  double acc[kScoreLanes] = {};
  int i = 0;
  for (; i + kScoreLanes <= d; i += kScoreLanes)
    for (int l = 0; l < kScoreLanes; ++l) acc[l] += q[i + l] * double(k[i + l]);
  for (; i < d; ++i) acc[i % kScoreLanes] += q[i] * double(k[i]);
  return reduce_lanes(acc);
}

double score_bound(const double* q, const float* mn, const float* mx, int d) {
  double acc[kScoreLanes] = {};
  int i = 0;
  for (; i + kScoreLanes <= d; i += kScoreLanes)
    for (int l = 0; l < kScoreLanes; ++l)
      acc[l] += std::max(q[i + l] * double(mn[i + l]), q[i + l] * double(mx[i + l]));
  for (; i < d; ++i) acc[i % kScoreLanes] += std::max(q[i] * double(mn[i]), q[i] * double(mx[i]));
  return reduce_lanes(acc);
}

inline ScoreKernels score_kernels_here() { return {&score_dot, &score_bound}; }

inline void decode_task_dispatch(const DecodeTask& t) {
  switch (t.dtype) {
    case DType::f32: decode_task_body<DType::f32>(t); break;
    case DType::bf16: decode_task_body<DType::bf16>(t); break;
    default: decode_task_body<DType::f16>(t); break;
  }
}

}  // namespace
}  // namespace ariadne::decode_detail
