// AVX-512 tile primitives, two tables (compiled with -mavx512f/bw/vl/dq/bf16; each called only
// where the CPU has what it uses). fp32 products use FMA with register blocking.
//   avx512       F, BW, VL, DQ: bf16 inputs take the fp32 products (converted when packed, as f16
//                inputs do), so the table runs on every AVX-512 server, Skylake-SP on; none of its
//                functions holds an AVX512-BF16 instruction (docs/cpu-backend.md says how that is
//                checked).
//   avx512bf16   the same plus bf16 products on vdpbf16ps (two multiply-adds per fp32 lane, exact
//                bf16 products and fp32 sums). Where the core issues vdpbf16ps at about twice the
//                FMA's flop rate (measured on AMD Zen 5) bf16 tiles run ~1.7× the fp32 ones; the
//                Intel core measured issues it at half the FMA's rate, and the fp32 products win
//                there (docs/cpu-backend.md).
#include "attention/cpu/attention_kernels.hpp"

#if defined(__x86_64__)
#include "attention/cpu/simd_avx512.hpp"  // first: it silences GCC's false uninitialized reports

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace ariadne::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// p = 2^x of the softmax: exp2v_p, or exp2v_bf16 where p is rounded to bf16 next.
template <bool kBf16P>
inline __m512 exp2p(__m512 x) {
  if constexpr (kBf16P) return exp2v_bf16(x);
  else return exp2v_p(x);
}

// The maximum of x's lanes, in every lane.
inline __m512 all_max(__m512 x) {
  x = _mm512_max_ps(x, _mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(1, 0, 3, 2)));
  x = _mm512_max_ps(x, _mm512_shuffle_f32x4(x, x, _MM_SHUFFLE(2, 3, 0, 1)));
  x = _mm512_max_ps(x, _mm512_permute_ps(x, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm512_max_ps(x, _mm512_permute_ps(x, _MM_SHUFFLE(2, 3, 0, 1)));
}

// Lanes of key halves [0,16) and [16,32) that row r may see.
struct LaneMasks {
  __mmask16 k0, k1;
};
inline LaneMasks lane_masks(const RowMask& mk, int r) {
  const __m512i iota0 = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i iota1 = _mm512_add_epi32(iota0, _mm512_set1_epi32(16));
  const __m512i lo = _mm512_set1_epi32(mk.lo[r]), hi = _mm512_set1_epi32(mk.hi[r]);
  LaneMasks m;
  m.k0 = _mm512_mask_cmplt_epi32_mask(_mm512_cmpge_epi32_mask(iota0, lo), iota0, hi) &
         __mmask16(mk.keymask & 0xffffu);
  m.k1 = _mm512_mask_cmplt_epi32_mask(_mm512_cmpge_epi32_mask(iota1, lo), iota1, hi) &
         __mmask16(mk.keymask >> 16);
  return m;
}

// Scaled, biased, masked logits of row r.
inline void logits(const float* s, const RowMask& mk, int r, __m512& t0, __m512& t1) {
  const __m512 sc = _mm512_set1_ps(mk.scale2);
  t0 = _mm512_mul_ps(_mm512_loadu_ps(s + r * kKeyTile), sc);
  t1 = _mm512_mul_ps(_mm512_loadu_ps(s + r * kKeyTile + 16), sc);
  if (mk.dense) {
    if (mk.apply_bias) t0 = _mm512_mask_add_ps(t0, __mmask16(1), t0, _mm512_set1_ps(mk.bias2));
    return;
  }
  const LaneMasks lm = lane_masks(mk, r);
  const __m512 ninf = _mm512_set1_ps(kNegInf);
  if (mk.apply_bias) t0 = _mm512_mask_add_ps(t0, __mmask16(1), t0, _mm512_set1_ps(mk.bias2));
  t0 = _mm512_mask_blend_ps(lm.k0, ninf, t0);
  t1 = _mm512_mask_blend_ps(lm.k1, ninf, t1);
}

// ---- S = Q·Kᵀ, fp32: R rows × 32 keys in 2R accumulators ----
template <int R>
void qk_f32_rows(const float* q, int64_t ldq, const float* k, int d, float* s) {
  __m512 acc[R][2];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  // Rolled outer loops keep the R×C accumulator blocks in registers; a full unroll lets GCC
  // hoist the broadcasts, spill them and interchange the loops into latency-bound chains.
#pragma GCC unroll 1
  for (int c = 0; c < d; ++c) {
    const __m512 k0 = _mm512_loadu_ps(k + c * kKeyTile), k1 = _mm512_loadu_ps(k + c * kKeyTile + 16);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 b = _mm512_set1_ps(q[r * ldq + c]);
      acc[r][0] = _mm512_fmadd_ps(b, k0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(b, k1, acc[r][1]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(s + r * kKeyTile, acc[r][0]);
    _mm512_storeu_ps(s + r * kKeyTile + 16, acc[r][1]);
  }
}

void qk_f32(const float* q, int64_t ldq, const float* k, int d, int rows, float* s) {
  // 8 rows: 16 accumulators + 2 key vectors, K loads amortized over 8 rows.
  for_row_tiles<8>(rows, [&](int r, auto n) {
    qk_f32_rows<decltype(n)::value>(q + r * ldq, ldq, k, d, s + r * kKeyTile);
  });
}

// ---- S = Q·Kᵀ, bf16 pairs through vdpbf16ps ----
inline __m512 dot2(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}
inline uint32_t load_pair(const uint16_t* p) {
  uint32_t u;
  std::memcpy(&u, p, 4);
  return u;
}

template <int R>
void qk_bf16_rows(const uint16_t* q, int64_t ldq, const uint16_t* k, int dp, float* s) {
  __m512 acc[R][2];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
#pragma GCC unroll 1
  for (int c = 0; c < dp; ++c) {
    const __m512i k0 = _mm512_loadu_si512(k + c * 2 * kKeyTile);
    const __m512i k1 = _mm512_loadu_si512(k + c * 2 * kKeyTile + kKeyTile);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512i b = _mm512_set1_epi32(int(load_pair(q + r * ldq + 2 * c)));
      acc[r][0] = dot2(acc[r][0], k0, b);
      acc[r][1] = dot2(acc[r][1], k1, b);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(s + r * kKeyTile, acc[r][0]);
    _mm512_storeu_ps(s + r * kKeyTile + 16, acc[r][1]);
  }
}

void qk_bf16(const uint16_t* q, int64_t ldq, const uint16_t* k, int dp, int rows, float* s) {
  for_row_tiles<8>(rows, [&](int r, auto n) {
    qk_bf16_rows<decltype(n)::value>(q + r * ldq, ldq, k, dp, s + r * kKeyTile);
  });
}

// ---- online softmax over one key tile ----
// Rows [r_lo, r_hi) one at a time, with horizontal reductions.
template <bool kBf16P>
void softmax_rows(float* s, const RowMask& mk, int r_lo, int r_hi, float* m, float* l, float* alpha, float* t_out) {
  for (int r = r_lo; r < r_hi; ++r) {
    __m512 t0, t1;
    logits(s, mk, r, t0, t1);
    if (t_out) {
      _mm512_storeu_ps(t_out + r * kKeyTile, t0);
      _mm512_storeu_ps(t_out + r * kKeyTile + 16, t1);
    }
    // NaN or +inf: not <= FLT_MAX (unordered compare); masked lanes hold -inf and pass.
    const __m512 big = _mm512_set1_ps(std::numeric_limits<float>::max());
    const bool bad = (_mm512_cmp_ps_mask(t0, big, _CMP_NLE_UQ) | _mm512_cmp_ps_mask(t1, big, _CMP_NLE_UQ)) != 0;
    float* p = s + r * kKeyTile;
    if (poison_row(bad, r, p, m, l, alpha)) continue;
    const __m512 mo = _mm512_set1_ps(m[r]);
    const __m512 mn = _mm512_max_ps(all_max(_mm512_max_ps(t0, t1)), mo);  // in every lane
    const float m_new = _mm512_cvtss_f32(mn);
    if (m_new == kNegInf) {  // no key seen yet: keep the empty state
      alpha[r] = 1.f;
      _mm512_storeu_ps(p, _mm512_setzero_ps());
      _mm512_storeu_ps(p + 16, _mm512_setzero_ps());
      continue;
    }
    // In a narrow band the max moves on most tiles, in no predictable pattern: there alpha is
    // always computed (exp2v(0) is exactly 1, exp2v(−inf) exactly 0), which measured 6 % faster
    // than a mispredicted branch; elsewhere the max rarely moves after a few tiles and the branch
    // skips the work (always computing it cost full attention 2-5 %).
    alpha[r] = !mk.moving_max && m_new == m[r] ? 1.f : _mm512_cvtss_f32(exp2v(_mm512_sub_ps(mo, mn)));
    const __m512 p0 = exp2p<kBf16P>(_mm512_sub_ps(t0, mn)), p1 = exp2p<kBf16P>(_mm512_sub_ps(t1, mn));
    _mm512_storeu_ps(p, p0);
    _mm512_storeu_ps(p + 16, p1);
    l[r] = l[r] * alpha[r] + _mm512_reduce_add_ps(_mm512_add_ps(p0, p1));
    m[r] = m_new;
  }
}

// Rows [r0, r0 + 16) as softmax_rows computes them, with the row maxima, the rescale factors and
// the row sums taken for the 16 rows together. Returns false, having changed nothing but t_out,
// when a row meets a NaN or +inf logit or is already poisoned: softmax_rows then does those rows.
template <bool kBf16P>
bool softmax16(float* s, const RowMask& mk, int r0, float* m, float* l, float* alpha, float* t_out) {
  alignas(64) float t[16][kKeyTile];
  __m512 v[16];
  const __m512 big = _mm512_set1_ps(std::numeric_limits<float>::max());
  __mmask16 bad = 0;
  for (int i = 0; i < 16; ++i) {
    __m512 t0, t1;
    logits(s, mk, r0 + i, t0, t1);
    bad |= _mm512_cmp_ps_mask(t0, big, _CMP_NLE_UQ) | _mm512_cmp_ps_mask(t1, big, _CMP_NLE_UQ);
    _mm512_store_ps(t[i], t0);
    _mm512_store_ps(t[i] + 16, t1);
    // The maskz form: GCC 12 reports the plain form's undefined pass-through operand as used
    // uninitialized here (-Wuninitialized).
    v[i] = _mm512_maskz_max_ps(0xFFFF, t0, t1);
  }
  const __m512 mo = _mm512_loadu_ps(m + r0);
  if (bad != 0 || _mm512_cmp_ps_mask(mo, mo, _CMP_UNORD_Q) != 0) return false;
  if (t_out != nullptr) std::memcpy(t_out + r0 * kKeyTile, t, sizeof(t));
  const __m512 mn = _mm512_max_ps(reduce_rows16(v, [](__m512 x, __m512 y) { return _mm512_max_ps(x, y); }), mo);
  const __m512 one = _mm512_set1_ps(1.f);
  const __mmask16 empty = _mm512_cmp_ps_mask(mn, _mm512_set1_ps(kNegInf), _CMP_EQ_OQ);  // no key seen yet
  __m512 a = exp2v(_mm512_sub_ps(mo, mn));
  if (!mk.moving_max) a = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(mn, mo, _CMP_EQ_OQ), a, one);
  a = _mm512_mask_blend_ps(empty, a, one);
  _mm512_storeu_ps(alpha + r0, a);
  // An empty row subtracts 0 from logits that are all −inf: its p is exactly 0, as in softmax_rows.
  alignas(64) float shift[16];
  _mm512_store_ps(shift, _mm512_mask_blend_ps(empty, mn, _mm512_setzero_ps()));
  for (int i = 0; i < 16; ++i) {
    const __m512 c = _mm512_set1_ps(shift[i]);
    const __m512 p0 = exp2p<kBf16P>(_mm512_sub_ps(_mm512_load_ps(t[i]), c));
    const __m512 p1 = exp2p<kBf16P>(_mm512_sub_ps(_mm512_load_ps(t[i] + 16), c));
    _mm512_storeu_ps(s + (r0 + i) * kKeyTile, p0);
    _mm512_storeu_ps(s + (r0 + i) * kKeyTile + 16, p1);
    v[i] = _mm512_add_ps(p0, p1);
  }
  const __m512 sums = reduce_rows16(v, [](__m512 x, __m512 y) { return _mm512_add_ps(x, y); });
  _mm512_storeu_ps(l + r0, _mm512_fmadd_ps(_mm512_loadu_ps(l + r0), a, sums));
  _mm512_storeu_ps(m + r0, mn);
  return true;
}

// softmax16 without the key-0 bias and t_out, for scale2 > 0: the row maxima are taken on the raw
// dots (max t = scale2 · max s, fp32 rounding being monotonic) and each p is exp2 of one fused
// s·scale2 − m, so the logits are neither formed nor stored. A dot whose logit overflows to +inf
// returns false as a NaN or +inf dot does.
template <bool kBf16P>
bool softmax16_raw(float* s, const RowMask& mk, int r0, float* m, float* l, float* alpha) {
  __m512 v[16];
  const __m512 big = _mm512_set1_ps(std::numeric_limits<float>::max());
  const __m512 ninf = _mm512_set1_ps(kNegInf);
  __mmask16 bad = 0;
  for (int i = 0; i < 16; ++i) {
    float* row = s + (r0 + i) * kKeyTile;
    __m512 s0 = _mm512_loadu_ps(row), s1 = _mm512_loadu_ps(row + 16);
    if (!mk.dense) {  // masked keys become −inf in S itself, which pass 2 reads again
      const LaneMasks lm = lane_masks(mk, r0 + i);
      s0 = _mm512_mask_blend_ps(lm.k0, ninf, s0);
      s1 = _mm512_mask_blend_ps(lm.k1, ninf, s1);
      _mm512_storeu_ps(row, s0);
      _mm512_storeu_ps(row + 16, s1);
    }
    bad |= _mm512_cmp_ps_mask(s0, big, _CMP_NLE_UQ) | _mm512_cmp_ps_mask(s1, big, _CMP_NLE_UQ);
    v[i] = _mm512_maskz_max_ps(0xFFFF, s0, s1);
  }
  const __m512 mo = _mm512_loadu_ps(m + r0);
  if (bad != 0 || _mm512_cmp_ps_mask(mo, mo, _CMP_UNORD_Q) != 0) return false;
  const __m512 sc = _mm512_set1_ps(mk.scale2);
  const __m512 mt = _mm512_mul_ps(reduce_rows16(v, [](__m512 x, __m512 y) { return _mm512_max_ps(x, y); }), sc);
  if (_mm512_cmp_ps_mask(mt, big, _CMP_NLE_UQ) != 0) return false;
  const __m512 mn = _mm512_max_ps(mt, mo);
  const __m512 one = _mm512_set1_ps(1.f);
  const __mmask16 empty = _mm512_cmp_ps_mask(mn, ninf, _CMP_EQ_OQ);  // no key seen yet
  __m512 a = exp2v(_mm512_sub_ps(mo, mn));
  if (!mk.moving_max) a = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(mn, mo, _CMP_EQ_OQ), a, one);
  a = _mm512_mask_blend_ps(empty, a, one);
  _mm512_storeu_ps(alpha + r0, a);
  // An empty row subtracts 0 from dots that are all −inf: its p is exactly 0, as in softmax_rows.
  alignas(64) float shift[16];
  _mm512_store_ps(shift, _mm512_mask_blend_ps(empty, _mm512_sub_ps(_mm512_setzero_ps(), mn), _mm512_setzero_ps()));
  for (int i = 0; i < 16; ++i) {
    float* row = s + (r0 + i) * kKeyTile;
    const __m512 c = _mm512_set1_ps(shift[i]);
    const __m512 p0 = exp2p<kBf16P>(_mm512_fmadd_ps(_mm512_loadu_ps(row), sc, c));
    const __m512 p1 = exp2p<kBf16P>(_mm512_fmadd_ps(_mm512_loadu_ps(row + 16), sc, c));
    _mm512_storeu_ps(row, p0);
    _mm512_storeu_ps(row + 16, p1);
    v[i] = _mm512_add_ps(p0, p1);
  }
  const __m512 sums = reduce_rows16(v, [](__m512 x, __m512 y) { return _mm512_add_ps(x, y); });
  _mm512_storeu_ps(l + r0, _mm512_fmadd_ps(_mm512_loadu_ps(l + r0), a, sums));
  _mm512_storeu_ps(m + r0, mn);
  return true;
}

template <bool kBf16P>
void softmax_t(float* s, const RowMask& mk, int rows, float* m, float* l, float* alpha, float* t_out) {
  const bool raw = t_out == nullptr && !mk.apply_bias && mk.scale2 > 0.f;
  int r = 0;
  for (; r + 16 <= rows; r += 16) {
    const bool done =
        raw ? softmax16_raw<kBf16P>(s, mk, r, m, l, alpha) : softmax16<kBf16P>(s, mk, r, m, l, alpha, t_out);
    if (!done) softmax_rows<kBf16P>(s, mk, r, r + 16, m, l, alpha, t_out);
  }
  softmax_rows<kBf16P>(s, mk, r, rows, m, l, alpha, t_out);
}

void softmax(float* s, const RowMask& mk, int rows, float* m, float* l, float* alpha, float* t_out) {
  if (mk.bf16_p) softmax_t<true>(s, mk, rows, m, l, alpha, t_out);
  else softmax_t<false>(s, mk, rows, m, l, alpha, t_out);
}

void colsum(const float* s, const RowMask& mk, int rows, const float* off, float* cs) {
  __m512 c0 = _mm512_setzero_ps(), c1 = _mm512_setzero_ps();
  for (int r = 0; r < rows; ++r) {
    if (mk.lo[r] >= mk.hi[r]) continue;
    __m512 t0, t1;
    logits(s, mk, r, t0, t1);
    const __m512 o = _mm512_set1_ps(off[r]);
    c0 = _mm512_add_ps(c0, exp2v(_mm512_sub_ps(t0, o)));
    c1 = _mm512_add_ps(c1, exp2v(_mm512_sub_ps(t1, o)));
  }
  _mm512_storeu_ps(cs, _mm512_add_ps(_mm512_loadu_ps(cs), c0));
  _mm512_storeu_ps(cs + 16, _mm512_add_ps(_mm512_loadu_ps(cs + 16), c1));
}

// ---- O = alpha·O + P·V, fp32: R rows × C column vectors per block ----
template <int R, int C>
void pv_f32_block(const float* p, const float* v, int64_t ldv, int dv, const float* alpha, float* o, int col) {
  __m512 acc[R][C];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    const __m512 a = _mm512_set1_ps(alpha[r]);
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c)
      acc[r][c] = _mm512_mul_ps(a, _mm512_loadu_ps(o + int64_t(r) * dv + col + 16 * c));
  }
#pragma GCC unroll 1
  for (int j = 0; j < kKeyTile; ++j) {
    __m512 vv[C];
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) vv[c] = _mm512_loadu_ps(v + j * ldv + col + 16 * c);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 b = _mm512_set1_ps(p[r * kKeyTile + j]);
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(b, vv[c], acc[r][c]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(o + int64_t(r) * dv + col + 16 * c, acc[r][c]);
}

// Column groups of at most 5 vectors (d = 80 is one group of 5, d = 128 two of 4), so that
// R·C accumulators plus C value vectors fit the 32 registers.
inline int next_group(int nv) { return (nv % 4 == 1 && nv >= 5) ? 5 : (nv < 4 ? nv : 4); }

template <int R, class Block>
void for_groups(int dv, Block&& block) {
  int col = 0;
  for (int nv = dv / 16; nv > 0;) {
    const int g = next_group(nv);
    block(col, g);
    col += 16 * g;
    nv -= g;
  }
}

// Each column group runs over all the rows, R = 5 rows at 5 vectors, 6 at 4 or fewer (R·C + C + 1
// of the 32 registers): one load of V serves R broadcasts, which measured 6-13 % faster than 4
// rows at d = 80 (in cache). Every element's sum runs in the same order as with any blocking.
void pv_f32(const float* p, const float* v, int64_t ldv, int dv, int rows, const float* alpha, float* o) {
  for_groups<0>(dv, [&](int col, int g) {
    with_count<5>(g, [&](auto c) {
      constexpr int C = decltype(c)::value, R = C == 5 ? 5 : 6;
      for_row_tiles<R>(rows, [&](int r, auto n) {
        pv_f32_block<decltype(n)::value, C>(p + r * kKeyTile, v, ldv, dv, alpha + r, o + int64_t(r) * dv, col);
      });
    });
  });
}

// ---- O = alpha·O + P·V with P rounded to bf16 (pairs of consecutive keys) ----
template <int R, int C>
void pv_bf16_block(const uint32_t* pp, const uint16_t* v, int dv, const float* alpha, float* o,
                   int col) {
  __m512 acc[R][C];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    const __m512 a = _mm512_set1_ps(alpha[r]);
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c)
      acc[r][c] = _mm512_mul_ps(a, _mm512_loadu_ps(o + int64_t(r) * dv + col + 16 * c));
  }
#pragma GCC unroll 1
  for (int jp = 0; jp < kKeyTile / 2; ++jp) {
    __m512i vv[C];
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c)
      vv[c] = _mm512_loadu_si512(v + (int64_t(jp) * dv + col + 16 * c) * 2);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512i b = _mm512_set1_epi32(int(pp[r * (kKeyTile / 2) + jp]));
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) acc[r][c] = dot2(acc[r][c], vv[c], b);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(o + int64_t(r) * dv + col + 16 * c, acc[r][c]);
}

template <int R>
void pv_bf16_rows(const float* p, const uint16_t* v, int dv, const float* alpha, float* o) {
  alignas(64) uint32_t pp[R * kKeyTile / 2];
  for (int r = 0; r < R; ++r) {
    // cvtne2ps: the second operand fills the low half, so the pairs come out in key order.
    const __m512bh h = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(p + r * kKeyTile + 16),
                                           _mm512_loadu_ps(p + r * kKeyTile));
    _mm512_store_si512(pp + r * (kKeyTile / 2), (__m512i)h);
  }
  for_groups<R>(dv, [&](int col, int g) {
    with_count<5>(g, [&](auto c) { pv_bf16_block<R, decltype(c)::value>(pp, v, dv, alpha, o, col); });
  });
}

void pv_bf16(const float* p, const uint16_t* v, int dv, int rows, const float* alpha, float* o) {
  for_row_tiles<4>(rows, [&](int r, auto n) {
    pv_bf16_rows<decltype(n)::value>(p + r * kKeyTile, v, dv, alpha + r, o + int64_t(r) * dv);
  });
}

// ---- packing: K by 16×16 in-register transposes of 32-bit words, V by widening loads ----
// Rows are read contiguously (prefetch-friendly; gathers touching 16 rows at once measured slower).

// r[i] = row i of a 16×16 block of 32-bit words; afterwards r[c] = column c.
inline void transpose16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // u[4g + m], 128-bit lane L: column 4L + m of rows 4g .. 4g + 3
  for (int g = 0; g < 4; ++g) {
    u[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int m = 0; m < 4; ++m) {
    const __m512i v = _mm512_shuffle_i32x4(u[m], u[4 + m], 0x44), v2 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0xEE);
    const __m512i x = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0x44);
    const __m512i x2 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0xEE);
    r[m] = _mm512_shuffle_i32x4(v, x, 0x88);
    r[4 + m] = _mm512_shuffle_i32x4(v, x, 0xDD);
    r[8 + m] = _mm512_shuffle_i32x4(v2, x2, 0x88);
    r[12 + m] = _mm512_shuffle_i32x4(v2, x2, 0xDD);
  }
}

// out[w·32 + j] = 32-bit word w of row j (row j at base + j·stride bytes, j < n; 0 for j >= n), w < nw.
void transpose_words(const char* base, int64_t stride, int n, int nw, void* out) {
  char* o = static_cast<char*>(out);
  for (int j0 = 0; j0 < kKeyTile; j0 += 16)
    for (int w0 = 0; w0 < nw; w0 += 16) {
      const int wn = std::min(16, nw - w0);
      const __mmask16 wm = wn == 16 ? __mmask16(0xffff) : __mmask16((1u << wn) - 1);
      __m512i r[16];
      for (int i = 0; i < 16; ++i)
        r[i] = j0 + i < n ? _mm512_maskz_loadu_epi32(wm, base + (j0 + i) * stride + 4 * w0) : _mm512_setzero_si512();
      transpose16(r);
      for (int i = 0; i < wn; ++i) _mm512_storeu_si512(o + 4 * ((w0 + i) * kKeyTile + j0), r[i]);
    }
}

void pack_k_f32(const float* base, int64_t stride, int n, int d, float* k) {
  transpose_words(reinterpret_cast<const char*>(base), stride * 4, n, d, k);
}

void pack_k_bf16(const uint16_t* base, int64_t stride, int n, int d, uint32_t* k) {
  transpose_words(reinterpret_cast<const char*>(base), stride * 2, n, d / 2, k);
  if (d & 1)  // the last pair has no partner entry: read 16 bits only
    for (int j = 0; j < kKeyTile; ++j) k[(d / 2) * kKeyTile + j] = j < n ? base[j * stride + d - 1] : 0u;
}

void pack_v_bf16(const uint16_t* base, int64_t stride, int n, int d, int dv, uint32_t* v) {
  for (int jp = 0; jp < kKeyTile / 2; ++jp) {
    const uint16_t* r0 = 2 * jp < n ? base + 2 * jp * stride : nullptr;
    const uint16_t* r1 = 2 * jp + 1 < n ? base + (2 * jp + 1) * stride : nullptr;
    for (int c = 0; c < dv; c += 16) {
      const __mmask16 m = c + 16 <= d ? __mmask16(0xffff) : c < d ? __mmask16((1u << (d - c)) - 1) : __mmask16(0);
      const __m256i a = r0 ? _mm256_maskz_loadu_epi16(m, r0 + c) : _mm256_setzero_si256();
      const __m256i b = r1 ? _mm256_maskz_loadu_epi16(m, r1 + c) : _mm256_setzero_si256();
      const __m512i w = _mm512_or_si512(_mm512_cvtepu16_epi32(a), _mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
      _mm512_storeu_si512(v + int64_t(jp) * dv + c, w);
    }
  }
}

// The whole 64-byte lines of the row take streaming stores, as the fp32 rows do (store_row: the
// output is written once and is usually larger than the caches, so no line is read for ownership);
// a line the row shares with its neighbour (bf16 d 80: 160-byte rows) takes ordinary stores. The
// worker loops end with an sfence.
void store_bf16(const float* src, float mul, int n, uint16_t* dst) {
  const __m512 m = _mm512_set1_ps(mul);
  const auto plain = [&](int c0, int c1) {
    for (int c = c0; c < c1; c += 16) {
      const __mmask16 k = c + 16 <= c1 ? __mmask16(0xffff) : __mmask16((1u << (c1 - c)) - 1);
      const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, src + c), m);
      _mm256_mask_storeu_epi16(dst + c, k, (__m256i)_mm512_cvtneps_pbh(x));
    }
  };
  const uintptr_t a = reinterpret_cast<uintptr_t>(dst);
  int c = std::min(n, int((64 - a % 64) % 64 / 2));  // entries before the first whole line
  plain(0, c);
  for (; c + 32 <= n; c += 32)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + c),
                        (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(_mm512_loadu_ps(src + c + 16), m),
                                                     _mm512_mul_ps(_mm512_loadu_ps(src + c), m)));
  plain(c, n);
}

void probs(const float* s, const RowMask& mk, int rows, const float* off, float* p) {
  for (int r = 0; r < rows; ++r) {
    __m512 t0, t1;
    logits(s, mk, r, t0, t1);  // the whole row is read before p (which may be s) is written
    const __m512 o = _mm512_set1_ps(off[r]);
    _mm512_storeu_ps(p + r * kKeyTile, exp2v(_mm512_sub_ps(t0, o)));
    _mm512_storeu_ps(p + r * kKeyTile + 16, exp2v(_mm512_sub_ps(t1, o)));
  }
}

// ---- backward ----
void grad_s(const float* p, const float* dp, const float* D, int rows, float* ds) {
  for (int r = 0; r < rows; ++r) {
    const __m512 d = _mm512_set1_ps(D[r]);
    for (int h = 0; h < kKeyTile; h += 16) {
      const __m512 pv = _mm512_loadu_ps(p + r * kKeyTile + h);
      const __m512 x = _mm512_sub_ps(_mm512_loadu_ps(dp + r * kKeyTile + h), d);
      // p == 0 gives 0, a NaN p stays NaN (NEQ_UQ is true for it), as the driver's loop does.
      const __mmask16 live = _mm512_cmp_ps_mask(pv, _mm512_setzero_ps(), _CMP_NEQ_UQ);
      _mm512_storeu_ps(ds + r * kKeyTile + h, _mm512_maskz_mul_ps(live, pv, x));
    }
  }
}

void transpose32(const float* src, int n, float* dst) {
  transpose_words(reinterpret_cast<const char*>(src), kKeyTile * 4, n, kKeyTile, dst);
}

// Σ_j a_j·b_j over 32 values (b null: Σ_j a_j) in double: products exact, four 8-lane partials
// added pairwise, then the lanes.
inline double dot32(const float* a, const float* b) {
  __m512d part[4];
  for (int q = 0; q < 4; ++q) {
    part[q] = _mm512_cvtps_pd(_mm256_loadu_ps(a + 8 * q));
    if (b != nullptr) part[q] = _mm512_mul_pd(part[q], _mm512_cvtps_pd(_mm256_loadu_ps(b + 8 * q)));
  }
  return _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(part[0], part[1]), _mm512_add_pd(part[2], part[3])));
}

void row_sums(const float* p, const float* dp, int rows, double* z, double* pd) {
  for (int r = 0; r < rows; ++r) {
    z[r] += dot32(p + r * kKeyTile, nullptr);
    pd[r] += dot32(p + r * kKeyTile, dp + r * kKeyTile);
  }
}

const TileKernels kAvx512Bf16{"avx512bf16", qk_f32,      qk_bf16,     softmax,     pv_f32,     pv_bf16, nullptr,
                              nullptr,      nullptr,     nullptr,     colsum,      pack_k_f32,  pack_k_bf16,
                              pack_v_bf16,  store_bf16,  probs,       grad_s,      transpose32, row_sums,
                              nullptr,      nullptr};

}  // namespace

// The avx512bf16 table without the entries that hold AVX512-BF16 instructions: bf16 inputs take the
// fp32 products and the driver's packing and rounding loops. Built at first use, as the AMX table is.
const TileKernels* tile_kernels_avx512() {
  static const TileKernels table = [] {
    TileKernels t = kAvx512Bf16;
    t.name = "avx512";
    t.qk_bf16 = nullptr;
    t.pv_bf16 = nullptr;
    t.pack_k_bf16 = nullptr;
    t.pack_v_bf16 = nullptr;
    t.store_bf16 = nullptr;
    return t;
  }();
  return &table;
}

const TileKernels* tile_kernels_avx512bf16() { return &kAvx512Bf16; }

}  // namespace ariadne::cpu

#else

namespace ariadne::cpu {
const TileKernels* tile_kernels_avx512() { return nullptr; }
const TileKernels* tile_kernels_avx512bf16() { return nullptr; }
}  // namespace ariadne::cpu

#endif
