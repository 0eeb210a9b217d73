// AVX2 + FMA tile primitives (compiled with -mavx2 -mfma; called only when the CPU has them). No
// bf16 dot product here: bf16 and f16 inputs are widened to fp32 when the driver packs K and V.
#include "attention/cpu/attention_kernels.hpp"
#include "attention/cpu/simd_avx2.hpp"

#if defined(__x86_64__)
#include <immintrin.h>

#include <cmath>
#include <limits>

namespace ariadne::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kLanes = 8;
constexpr int kVecPerTile = kKeyTile / kLanes;  // 4 vectors cover a key tile

// The keys of vector v (keys 8v … 8v + 7) that row r may see: lo <= j < hi and the key's bit set.
inline __m256 lane_ok(const RowMask& mk, int r, int v) {
  const __m256i j = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(v * kLanes));
  const __m256i bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i km = _mm256_set1_epi32(int((mk.keymask >> (v * kLanes)) & 0xffu));
  const __m256i lo = _mm256_set1_epi32(mk.lo[r]), hi = _mm256_set1_epi32(mk.hi[r]);
  return _mm256_castsi256_ps(_mm256_andnot_si256(
      _mm256_or_si256(_mm256_cmpgt_epi32(lo, j), _mm256_cmpgt_epi32(_mm256_add_epi32(j, _mm256_set1_epi32(1)), hi)),
      _mm256_cmpeq_epi32(_mm256_and_si256(km, bits), bits)));
}

// Scaled, biased, masked logits of row r (4 vectors of 8 keys).
inline void logits(const float* s, const RowMask& mk, int r, __m256 t[kVecPerTile]) {
  const __m256 sc = _mm256_set1_ps(mk.scale2), ninf = _mm256_set1_ps(kNegInf);
  for (int v = 0; v < kVecPerTile; ++v) {
    __m256 x = _mm256_mul_ps(_mm256_loadu_ps(s + r * kKeyTile + v * kLanes), sc);
    if (v == 0 && mk.apply_bias)
      x = _mm256_add_ps(x, _mm256_setr_ps(mk.bias2, 0, 0, 0, 0, 0, 0, 0));
    t[v] = mk.dense ? x : _mm256_blendv_ps(ninf, x, lane_ok(mk, r, v));
  }
}

template <int R>
void qk_rows(const float* q, int64_t ldq, const float* k, int d, float* s) {
  __m256 acc[R][kVecPerTile];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < kVecPerTile; ++v) acc[r][v] = _mm256_setzero_ps();
#pragma GCC unroll 1
  for (int c = 0; c < d; ++c) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 b = _mm256_broadcast_ss(q + r * ldq + c);
#pragma GCC unroll 4
      for (int v = 0; v < kVecPerTile; ++v)
        acc[r][v] = _mm256_fmadd_ps(b, _mm256_loadu_ps(k + c * kKeyTile + v * kLanes), acc[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < kVecPerTile; ++v) _mm256_storeu_ps(s + r * kKeyTile + v * kLanes, acc[r][v]);
}

void qk_f32(const float* q, int64_t ldq, const float* k, int d, int rows, float* s) {
  // 3 rows: 12 accumulators of the 16 registers.
  for_row_tiles<3>(rows, [&](int r, auto n) { qk_rows<decltype(n)::value>(q + r * ldq, ldq, k, d, s + r * kKeyTile); });
}

// Rows [r_lo, r_hi) one at a time, with horizontal reductions.
void softmax_rows(float* s, const RowMask& mk, int r_lo, int r_hi, float* m, float* l, float* alpha, float* t_out) {
  for (int r = r_lo; r < r_hi; ++r) {
    __m256 t[kVecPerTile];
    logits(s, mk, r, t);
    if (t_out)
      for (int v = 0; v < kVecPerTile; ++v) _mm256_storeu_ps(t_out + r * kKeyTile + v * kLanes, t[v]);
    // NaN or +inf: not <= FLT_MAX (unordered compare); masked lanes hold -inf and pass.
    const __m256 big = _mm256_set1_ps(std::numeric_limits<float>::max());
    int bad = 0;
    for (int v = 0; v < kVecPerTile; ++v) bad |= _mm256_movemask_ps(_mm256_cmp_ps(t[v], big, _CMP_NLE_UQ));
    float* p = s + r * kKeyTile;
    if (poison_row(bad != 0, r, p, m, l, alpha)) continue;
    const float mx = hmax(_mm256_max_ps(_mm256_max_ps(t[0], t[1]), _mm256_max_ps(t[2], t[3])));
    const float m_new = std::fmax(m[r], mx);
    if (m_new == kNegInf) {  // no key seen yet: keep the empty state
      alpha[r] = 1.f;
      for (int v = 0; v < kVecPerTile; ++v) _mm256_storeu_ps(p + v * kLanes, _mm256_setzero_ps());
      continue;
    }
    alpha[r] = m_new == m[r] ? 1.f : std::exp2(m[r] - m_new);  // the max rarely moves after a few tiles
    const __m256 mn = _mm256_set1_ps(m_new);
    __m256 sum = _mm256_setzero_ps();
    for (int v = 0; v < kVecPerTile; ++v) {
      const __m256 pv = exp2v(_mm256_sub_ps(t[v], mn));
      _mm256_storeu_ps(p + v * kLanes, pv);
      sum = _mm256_add_ps(sum, pv);
    }
    l[r] = l[r] * alpha[r] + hsum(sum);
    m[r] = m_new;
  }
}

// Rows [r0, r0 + 8) as softmax_rows computes them, without the key-0 bias and t_out, for
// scale2 > 0: the row maxima are taken on the raw dots (max t = scale2 · max s, fp32 rounding
// being monotonic), the 8 rows' maxima and sums by one transpose each, and each p is 2^ of one
// fused s·scale2 − m. Returns false, having changed nothing but masked dots to −inf, when a row
// meets a NaN or +inf dot or logit or is already poisoned: softmax_rows then does those rows.
bool softmax8_raw(float* s, const RowMask& mk, int r0, float* m, float* l, float* alpha) {
  __m256 v[8];
  const __m256 big = _mm256_set1_ps(std::numeric_limits<float>::max());
  const __m256 ninf = _mm256_set1_ps(kNegInf);
  __m256 bad = _mm256_setzero_ps();
  for (int i = 0; i < 8; ++i) {
    float* row = s + (r0 + i) * kKeyTile;
    __m256 x[kVecPerTile];
    for (int u = 0; u < kVecPerTile; ++u) {
      x[u] = _mm256_loadu_ps(row + u * kLanes);
      if (!mk.dense) {  // masked keys become −inf in S itself, which the second pass reads again
        x[u] = _mm256_blendv_ps(ninf, x[u], lane_ok(mk, r0 + i, u));
        _mm256_storeu_ps(row + u * kLanes, x[u]);
      }
      bad = _mm256_or_ps(bad, _mm256_cmp_ps(x[u], big, _CMP_NLE_UQ));  // NaN or +inf
    }
    v[i] = _mm256_max_ps(_mm256_max_ps(x[0], x[1]), _mm256_max_ps(x[2], x[3]));
  }
  const __m256 mo = _mm256_loadu_ps(m + r0);
  if (_mm256_movemask_ps(_mm256_or_ps(bad, _mm256_cmp_ps(mo, mo, _CMP_UNORD_Q))) != 0) return false;
  const __m256 sc = _mm256_set1_ps(mk.scale2);
  const __m256 mt = _mm256_mul_ps(reduce_rows8(v, [](__m256 a, __m256 b) { return _mm256_max_ps(a, b); }), sc);
  if (_mm256_movemask_ps(_mm256_cmp_ps(mt, big, _CMP_NLE_UQ)) != 0) return false;
  const __m256 mn = _mm256_max_ps(mt, mo);
  const __m256 one = _mm256_set1_ps(1.f);
  const __m256 empty = _mm256_cmp_ps(mn, ninf, _CMP_EQ_OQ);  // no key seen yet
  __m256 a = exp2v(_mm256_sub_ps(mo, mn));
  a = _mm256_blendv_ps(a, one, _mm256_or_ps(empty, _mm256_cmp_ps(mn, mo, _CMP_EQ_OQ)));
  _mm256_storeu_ps(alpha + r0, a);
  // An empty row subtracts 0 from dots that are all −inf: its p is exactly 0, as in softmax_rows.
  alignas(32) float shift[8];
  _mm256_store_ps(shift, _mm256_blendv_ps(_mm256_sub_ps(_mm256_setzero_ps(), mn), _mm256_setzero_ps(), empty));
  for (int i = 0; i < 8; ++i) {
    float* row = s + (r0 + i) * kKeyTile;
    const __m256 c = _mm256_set1_ps(shift[i]);
    __m256 sum = _mm256_setzero_ps();
    for (int u = 0; u < kVecPerTile; ++u) {
      const __m256 p = exp2v_p(_mm256_fmadd_ps(_mm256_loadu_ps(row + u * kLanes), sc, c));
      _mm256_storeu_ps(row + u * kLanes, p);
      sum = _mm256_add_ps(sum, p);
    }
    v[i] = sum;
  }
  const __m256 sums = reduce_rows8(v, [](__m256 x, __m256 y) { return _mm256_add_ps(x, y); });
  _mm256_storeu_ps(l + r0, _mm256_fmadd_ps(_mm256_loadu_ps(l + r0), a, sums));
  _mm256_storeu_ps(m + r0, mn);
  return true;
}

void softmax(float* s, const RowMask& mk, int rows, float* m, float* l, float* alpha, float* t_out) {
  int r = 0;
  if (t_out == nullptr && !mk.apply_bias && mk.scale2 > 0.f)
    for (; r + 8 <= rows; r += 8)
      if (!softmax8_raw(s, mk, r, m, l, alpha)) softmax_rows(s, mk, r, r + 8, m, l, alpha, t_out);
  softmax_rows(s, mk, r, rows, m, l, alpha, t_out);
}

void colsum(const float* s, const RowMask& mk, int rows, const float* off, float* cs) {
  __m256 acc[kVecPerTile];
  for (int v = 0; v < kVecPerTile; ++v) acc[v] = _mm256_setzero_ps();
  for (int r = 0; r < rows; ++r) {
    if (mk.lo[r] >= mk.hi[r]) continue;
    __m256 t[kVecPerTile];
    logits(s, mk, r, t);
    const __m256 o = _mm256_set1_ps(off[r]);
    for (int v = 0; v < kVecPerTile; ++v) acc[v] = _mm256_add_ps(acc[v], exp2v(_mm256_sub_ps(t[v], o)));
  }
  for (int v = 0; v < kVecPerTile; ++v)
    _mm256_storeu_ps(cs + v * kLanes, _mm256_add_ps(_mm256_loadu_ps(cs + v * kLanes), acc[v]));
}

// O = alpha·O + P·V for R rows × C column vectors.
template <int R, int C>
void pv_block(const float* p, const float* v, int64_t ldv, int dv, const float* alpha, float* o, int col) {
  __m256 acc[R][C];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const __m256 a = _mm256_set1_ps(alpha[r]);
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c)
      acc[r][c] = _mm256_mul_ps(a, _mm256_loadu_ps(o + int64_t(r) * dv + col + kLanes * c));
  }
#pragma GCC unroll 1
  for (int j = 0; j < kKeyTile; ++j) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 b = _mm256_broadcast_ss(p + r * kKeyTile + j);
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c)
        acc[r][c] = _mm256_fmadd_ps(b, _mm256_loadu_ps(v + j * ldv + col + kLanes * c), acc[r][c]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(o + int64_t(r) * dv + col + kLanes * c, acc[r][c]);
}

template <int R>
void pv_rows(const float* p, const float* v, int64_t ldv, int dv, const float* alpha, float* o) {
  int col = 0;
  for (; col + 4 * kLanes <= dv; col += 4 * kLanes) pv_block<R, 4>(p, v, ldv, dv, alpha, o, col);
  // dv is a multiple of 16: what is left is 0 or 2 vectors
  if (col < dv) pv_block<R, 2>(p, v, ldv, dv, alpha, o, col);
}

void pv_f32(const float* p, const float* v, int64_t ldv, int dv, int rows, const float* alpha, float* o) {
  for_row_tiles<3>(rows, [&](int r, auto n) {
    pv_rows<decltype(n)::value>(p + r * kKeyTile, v, ldv, dv, alpha + r, o + int64_t(r) * dv);
  });
}

void probs(const float* s, const RowMask& mk, int rows, const float* off, float* p) {
  for (int r = 0; r < rows; ++r) {
    __m256 t[kVecPerTile];
    logits(s, mk, r, t);  // the whole row is read before p (which may be s) is written
    const __m256 o = _mm256_set1_ps(off[r]);
    for (int v = 0; v < kVecPerTile; ++v)
      _mm256_storeu_ps(p + r * kKeyTile + v * kLanes, exp2v(_mm256_sub_ps(t[v], o)));
  }
}

const TileKernels kAvx2{"avx2", qk_f32, nullptr, softmax, pv_f32, nullptr, nullptr, nullptr, nullptr, nullptr,
                        colsum, nullptr, nullptr, nullptr, nullptr, probs, nullptr, nullptr, nullptr, nullptr, nullptr};

}  // namespace

const TileKernels* tile_kernels_avx2() { return &kAvx2; }

}  // namespace ariadne::cpu

#else

namespace ariadne::cpu {
const TileKernels* tile_kernels_avx2() { return nullptr; }
}  // namespace ariadne::cpu

#endif
