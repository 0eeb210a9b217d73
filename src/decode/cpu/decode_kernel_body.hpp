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
#if defined(__AVX512F__)
#include "attention/cpu/simd_avx512.hpp"
#elif defined(__AVX2__)
#include "attention/cpu/simd_avx2.hpp"
#endif

namespace ariadne::decode_detail {
namespace {

#if defined(__AVX512F__) || defined(__AVX2__)
// The vector width of the file's table, as the few operations the page step needs: 16 lanes in an
// AVX-512 file, 8 in an AVX2 file. The page step below is written once over it.
struct Lanes {
#if defined(__AVX512F__)
  using V = __m512;
  static constexpr int W = 16;
  static constexpr int kPvVectors = 4;  // 4 heads × 4 accumulators of 32 registers
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  // 16 stored values widened to f32: bf16 by a shift into the high half, f16 by the F16C conversion.
  static V load_bf16(const uint16_t* p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
  }
  static V load_f16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
  static void store(float* p, V x) { _mm512_storeu_ps(p, x); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  // Lanes [0, n) from p, the others `fill`; and the store of lanes [0, n).
  static __mmask16 live(int n) { return __mmask16(n >= 16 ? 0xFFFF : (1u << n) - 1); }
  static V load_n(const float* p, int n, float fill) { return _mm512_mask_loadu_ps(_mm512_set1_ps(fill), live(n), p); }
  static void store_n(float* p, V x, int n) { _mm512_mask_storeu_ps(p, live(n), x); }
  static bool any_nan(V x) { return _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q) != 0; }
  static float hmax(V x) { return _mm512_reduce_max_ps(x); }
  static float hsum(V x) {
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(x), _mm512_extractf32x8_ps(x, 1));
    __m128 y = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    y = _mm_add_ps(y, _mm_movehl_ps(y, y));
    return _mm_cvtss_f32(_mm_add_ss(y, _mm_movehdup_ps(y)));
  }
  static V exp2(V x) { return cpu::exp2v(x); }
  // Lane i: the sum of v[i]'s lanes (W rows reduced at once).
  static V row_sums(const V* v) { return cpu::reduce_rows16(v, [](V a, V b) { return _mm512_add_ps(a, b); }); }
#else
  using V = __m256;
  static constexpr int W = 8;
  static constexpr int kPvVectors = 2;  // 4 heads × 2 accumulators of 16 registers
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V load_bf16(const uint16_t* p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
  }
  static V load_f16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
  static void store(float* p, V x) { _mm256_storeu_ps(p, x); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V max(V a, V b) { return _mm256_max_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static __m256i live(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static V load_n(const float* p, int n, float fill) {
    const __m256i m = live(n);
    return _mm256_blendv_ps(_mm256_set1_ps(fill), _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
  }
  static void store_n(float* p, V x, int n) { _mm256_maskstore_ps(p, live(n), x); }
  static bool any_nan(V x) { return _mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)) != 0; }
  static float hmax(V x) { return cpu::hmax(x); }
  static float hsum(V x) { return cpu::hsum(x); }
  static V exp2(V x) { return cpu::exp2v(x); }
  static V row_sums(const V* v) { return cpu::reduce_rows8(v, [](V a, V b) { return _mm256_add_ps(a, b); }); }
#endif
};
using Vec = Lanes::V;
constexpr int kW = Lanes::W;

// kW values of a pool row in its stored dtype, as f32 (exact for every dtype).
template <DType kDtype>
inline Vec load_as_f32(const void* p) {
  if constexpr (kDtype == DType::f32) return Lanes::load(static_cast<const float*>(p));
  else if constexpr (kDtype == DType::bf16) return Lanes::load_bf16(static_cast<const uint16_t*>(p));
  else return Lanes::load_f16(static_cast<const uint16_t*>(p));
}

// The kW lane sums of a·b (n % kW == 0), from two accumulators.
inline Vec dot_lanes(const float* a, const float* b, int n) {
  Vec s0 = Lanes::zero(), s1 = Lanes::zero();
  int i = 0;
  for (; i + 2 * kW <= n; i += 2 * kW) {
    s0 = Lanes::fma(Lanes::load(a + i), Lanes::load(b + i), s0);
    s1 = Lanes::fma(Lanes::load(a + i + kW), Lanes::load(b + i + kW), s1);
  }
  if (i < n) s0 = Lanes::fma(Lanes::load(a + i), Lanes::load(b + i), s0);
  return Lanes::add(s0, s1);
}
#endif

// Σ_i a[i]·b[i], for the per-row path only: head dims off the file's vector width, or the generic
// table (the vector path scores kW rows at once with dot_lanes and Lanes::row_sums).
inline float dot(const float* a, const float* b, int n) {
  float s = 0.f;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

#if defined(__AVX512F__) || defined(__AVX2__)
// The vector page step for head dims that are multiples of the width: kW rows' dot products
// reduced at once (Lanes::row_sums) instead of a horizontal reduction per dot, the exponentials kW
// at a time, and P·V with the accumulators of up to 4 heads × kPvVectors vectors in registers, so
// that a V row is loaded once per kPvVectors · kW columns for the whole group.

// sh[r] = q·k_r · scale for rows [0, rows) of kf ([rows][d], d % kW == 0).
inline void scores_v(const float* q, const float* kf, int rows, int d, float scale, float* sh) {
  for (int r = 0; r < rows; r += kW) {
    const int n = std::min(kW, rows - r);
    Vec acc[kW];
    for (int i = 0; i < kW; ++i) acc[i] = i < n ? dot_lanes(q, kf + int64_t(r + i) * d, d) : Lanes::zero();
    Lanes::store_n(sh + r, Lanes::mul(Lanes::row_sums(acc), Lanes::set1(scale)), n);
  }
}

// acc[h][c0 ..] += Σ_r p[h][r] · v_r[c0 ..] for NH heads and NV vectors of columns from c0; the V
// rows are read as stored (kDtype, [rows][d]) and widened in registers, once per pass of 4 heads.
template <DType kDtype, int NH, int NV, class Elem>
inline void pv_block(const float* p, int64_t ldp, const Elem* vf, int rows, int d, int c0, float* acc) {
  Vec a[NH][NV];
  for (int h = 0; h < NH; ++h)
    for (int j = 0; j < NV; ++j) a[h][j] = Lanes::load(acc + int64_t(h) * d + c0 + kW * j);
  for (int r = 0; r < rows; ++r) {
    Vec v[NV];
    for (int j = 0; j < NV; ++j) v[j] = load_as_f32<kDtype>(vf + int64_t(r) * d + c0 + kW * j);
    for (int h = 0; h < NH; ++h) {
      const Vec w = Lanes::set1(p[h * ldp + r]);
      for (int j = 0; j < NV; ++j) a[h][j] = Lanes::fma(w, v[j], a[h][j]);
    }
  }
  for (int h = 0; h < NH; ++h)
    for (int j = 0; j < NV; ++j) Lanes::store(acc + int64_t(h) * d + c0 + kW * j, a[h][j]);
}

template <DType kDtype, int NH, class Elem>
inline void pv_heads(const float* p, int64_t ldp, const Elem* vf, int rows, int d, float* acc) {
  constexpr int NV = Lanes::kPvVectors;
  int c0 = 0;
  for (; c0 + NV * kW <= d; c0 += NV * kW) pv_block<kDtype, NH, NV>(p, ldp, vf, rows, d, c0, acc);
  switch ((d - c0) / kW) {
    case 3: if constexpr (NV > 3) pv_block<kDtype, NH, 3>(p, ldp, vf, rows, d, c0, acc); break;
    case 2: if constexpr (NV > 2) pv_block<kDtype, NH, 2>(p, ldp, vf, rows, d, c0, acc); break;
    case 1: pv_block<kDtype, NH, 1>(p, ldp, vf, rows, d, c0, acc); break;
    default: break;
  }
}

// acc[h] += Σ_r p[h][r] v_r for the G heads (p rows ldp apart, acc rows d apart), 4 heads a pass.
template <DType kDtype, class Elem>
inline void pv_v(const float* p, int64_t ldp, const Elem* vf, int rows, int d, int G, float* acc) {
  for (int h0 = 0; h0 < G; h0 += 4) {
    const float* ph = p + h0 * ldp;
    float* ah = acc + int64_t(h0) * d;
    switch (std::min(4, G - h0)) {
      case 4: pv_heads<kDtype, 4>(ph, ldp, vf, rows, d, ah); break;
      case 3: pv_heads<kDtype, 3>(ph, ldp, vf, rows, d, ah); break;
      case 2: pv_heads<kDtype, 2>(ph, ldp, vf, rows, d, ah); break;
      default: pv_heads<kDtype, 1>(ph, ldp, vf, rows, d, ah); break;
    }
  }
}

// The max of mx and sh[0, rows); `nan`: whether any of sh is NaN. Lanes past the rows read −inf,
// which neither moves the max nor counts as NaN.
inline float max_v(const float* sh, int rows, float mx, bool& nan) {
  Vec m = Lanes::set1(mx);
  bool bad = false;
  for (int r = 0; r < rows; r += kW) {
    const Vec x = Lanes::load_n(sh + r, rows - r, -std::numeric_limits<float>::infinity());
    bad |= Lanes::any_nan(x);
    m = Lanes::max(m, x);
  }
  nan = bad;
  return Lanes::hmax(m);
}
// sh[r] = exp(sh[r] − m) for r < rows (m finite, at least their max); returns their sum. Lanes
// past the rows read −inf, whose exponential is exactly 0.
inline float exp_v(float* sh, int rows, float m) {
  const Vec log2e = Lanes::set1(1.4426950408889634f), mv = Lanes::set1(m);
  Vec sum = Lanes::zero();
  for (int r = 0; r < rows; r += kW) {
    const Vec x = Lanes::load_n(sh + r, rows - r, -std::numeric_limits<float>::infinity());
    const Vec p = Lanes::exp2(Lanes::mul(Lanes::sub(x, mv), log2e));
    Lanes::store_n(sh + r, p, rows - r);
    sum = Lanes::add(sum, p);
  }
  return Lanes::hsum(sum);
}
#endif

template <class T>
inline float to_f32(T x) {
  if constexpr (sizeof(T) == 4) return x;
  else return bf16_to_float(x);
}

// Rows [r0, r1) of one page: convert the key rows to f32, score them against every head, then fold
// the page into the running softmax and accumulate V (on the vector path widened in registers as
// P·V reads it, since each V row is read once per 4 heads; elsewhere converted to f32 scratch).
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
    widen(kpool + base, t.kf);  // K: widened once, read by every head of the group
#if defined(__AVX512F__) || defined(__AVX2__)
    if (d % kW == 0) {
      constexpr float kInf = std::numeric_limits<float>::infinity();
      for (int hg = 0; hg < G; ++hg) {
        float* sh = t.s + int64_t(hg) * P;
        scores_v(t.q + int64_t(hg) * d, t.kf, rows, d, t.scale, sh);
        if (t.key0_bias && page * P + r0 == 0) sh[0] += t.key0_bias[hg];
        bool nan = false;
        const float mx = max_v(sh, rows, t.m[hg], nan);
        // A NaN or +inf logit poisons the row (docs/numerics.md): m and l become NaN for good, and
        // the row's weights are zero in the group's P·V below.
        if (nan || mx == kInf || std::isnan(t.m[hg])) {
          t.m[hg] = t.l[hg] = std::numeric_limits<float>::quiet_NaN();
          std::fill_n(sh, rows, 0.f);
          continue;
        }
        const float alpha = t.m[hg] == -kInf ? 0.f : std::exp(t.m[hg] - mx);
        t.l[hg] = t.l[hg] * alpha + exp_v(sh, rows, mx);
        t.m[hg] = mx;
        float* a = t.acc + int64_t(hg) * d;
#pragma omp simd
        for (int i = 0; i < d; ++i) a[i] *= alpha;
      }
      pv_v<kDtype>(t.s, P, vpool + base, rows, d, G, t.acc);  // V as stored: read once per 4 heads
      continue;
    }
#endif
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
