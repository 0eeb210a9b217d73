// The AMX kernel table: the AVX-512 table with its two bf16 products on the tile unit (TDPBF16PS).
//
// The packed operands already have AMX's B layout: a key tile of K is [dp][32] pairs of bf16 (32-bit
// words, the low half the even head-dim entry), i.e. B rows of 16 pairs per 64 bytes; V is [16][dv]
// pairs of keys. So S = Q·Kᵀ takes Q rows as A tiles (16 rows × 32 bf16) against two B tiles (keys
// 0–15 and 16–31) per 32 head-dim entries, and O += P·V takes P rounded to bf16 (16 rows × 32 keys)
// against a B tile per 16 output columns. Rows are taken 16 at a time; a group of fewer rows goes
// through 16-row local buffers, so no tile reads or writes past the caller's rows.
// The tile configuration is loaded once per thread's run of products when the driver brackets it
// (begin_bf16 / end_bf16, Bf16Session): one configuration serves both products. A product called
// outside such a run loads it and releases the tiles itself, since the thread may have run other AMX
// code since its last product.
// Linux grants the tile state to a process on request (arch_prctl); amx_usable() asks once.
#include "attention/cpu/attention_kernels.hpp"

#if defined(__x86_64__) && defined(__AMX_TILE__) && defined(__AMX_BF16__)

#include "attention/cpu/simd_avx512.hpp"  // first: it silences GCC's false uninitialized reports

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cpuid.h>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace ariadne::cpu {

namespace {

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

// Tiles: 0, 1 the two C halves (or C); 2 A; 3, 4 the two B halves (or B); for a last head-dim
// chunk of rem_pairs < 16 pairs, 5 its A and 6 its B (one half at a time); every other tile full
// (16 rows × 64 bytes), which dense_bf16 uses for resident Q tiles and alternate P tiles.
void configure(int rem_pairs) {
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = 16;
    c.colsb[t] = 64;
  }
  if (rem_pairs > 0) {
    c.colsb[5] = uint16_t(4 * rem_pairs);
    c.rows[6] = uint8_t(rem_pairs);
  }
  // GCC 12 models _tile_loadconfig as reading only the first bytes of its operand and drops the
  // stores of rows and colsb as dead; the asm's memory operand is the whole 64-byte object.
  asm volatile("ldtilecfg %0" : : "m"(c));
}

// The last head-dim chunk of a session's configuration (dp % 16), or -1 outside a session.
thread_local int t_session_rem = -1;

// Loads the configuration for `rem` unless this thread's session already holds one that serves it
// (P·V uses tiles 0–4 only, which every configuration has); returns whether it loaded one,
// and then the caller calls restore() at its end.
bool acquire(int rem) {
  if (t_session_rem == rem || (rem == 0 && t_session_rem >= 0)) return false;
  configure(rem);
  return true;
}

// The same for a kernel that needs the configuration of exactly `rem` (dense_bf16's tiles 5–7).
bool acquire_exact(int rem) {
  if (t_session_rem == rem) return false;
  configure(rem);
  return true;
}

// Puts the thread's session configuration back, or releases the tiles outside a session.
void restore() {
  if (t_session_rem >= 0) configure(t_session_rem);
  else _tile_release();
}

void begin_bf16(int dp) {
  configure(dp % 16);
  t_session_rem = dp % 16;
}

void end_bf16() {
  _tile_release();
  t_session_rem = -1;
}

// S (16 rows × 32 keys, row stride lds floats) = Q·Kᵀ for one key tile.
void qk_group(const uint16_t* q, int64_t ldq, const uint16_t* k, int dp, float* s, int lds) {
  _tile_zero(0);
  _tile_zero(1);
  const int full = dp / 16, rem = dp % 16;
  for (int c = 0; c < full; ++c) {
    _tile_loadd(2, q + c * 32, ldq * 2);
    _tile_loadd(3, k + c * 16 * 64, 128);
    _tile_loadd(4, k + c * 16 * 64 + 32, 128);
    _tile_dpbf16ps(0, 2, 3);
    _tile_dpbf16ps(1, 2, 4);
  }
  if (rem > 0) {
    _tile_loadd(5, q + full * 32, ldq * 2);
    _tile_loadd(6, k + full * 16 * 64, 128);
    _tile_dpbf16ps(0, 5, 6);
    _tile_loadd(6, k + full * 16 * 64 + 32, 128);
    _tile_dpbf16ps(1, 5, 6);
  }
  _tile_stored(0, s, lds * 4);
  _tile_stored(1, s + 16, lds * 4);
}

void qk_bf16(const uint16_t* q, int64_t ldq, const uint16_t* k, int dp, int rows, float* s) {
  if (dp > 256) {  // beyond the local buffer of a short row group
    tile_kernels_avx512bf16()->qk_bf16(q, ldq, k, dp, rows, s);
    return;
  }
  const bool own = acquire(dp % 16);
  for (int r = 0; r < rows; r += 16) {
    const int n = rows - r < 16 ? rows - r : 16;
    if (n == 16) {
      qk_group(q + r * ldq, ldq, k, dp, s + r * kKeyTile, kKeyTile);
      continue;
    }
    alignas(64) uint16_t qa[16 * 512];  // head dims up to 512 (dp <= 256)
    alignas(64) float sa[16 * kKeyTile];
    std::memset(qa, 0, sizeof(qa));
    for (int i = 0; i < n; ++i) std::memcpy(qa + i * 2 * dp, q + (r + i) * ldq, size_t(dp) * 4);
    qk_group(qa, 2 * dp, k, dp, sa, kKeyTile);
    std::memcpy(s + r * kKeyTile, sa, size_t(n) * kKeyTile * 4);
  }
  if (own) restore();
}

// O = A·O + Σ_j β_j·P_j·V_j (TileKernels::pv_bf16_batch), each P rounded to bf16 (round to nearest
// even, as the AVX-512 table does) after its β scaling: O is loaded into the accumulators once per
// call and column pair, not once per key tile, and rescaled once. Column pairs run as two
// accumulator chains (C tiles 0 and 1, B tiles 3 and 4).
void pv_bf16_batch(const float* const* p, const uint16_t* const* v, const float* const* alpha, int count, int dv,
                   int rows, float* o) {
  if (dv % 16 != 0 || count > kPvBatch) {  // the tile unit takes whole 16-column blocks: tile by tile
    for (int j = 0; j < count; ++j) tile_kernels_avx512bf16()->pv_bf16(p[j], v[j], dv, rows, alpha[j], o);
    return;
  }
  const bool own = acquire(0);
  const int64_t ld = int64_t(dv) * 4;
  for (int r = 0; r < rows; r += 16) {
    const int n = rows - r < 16 ? rows - r : 16;
    alignas(64) uint32_t pa[kPvBatch][16 * 16];
    float scale[16];  // A of each row
    if (n < 16)
      for (int j = 0; j < count; ++j) std::memset(pa[j], 0, sizeof(pa[j]));
    for (int i = 0; i < n; ++i) {
      float beta = 1.f;
      for (int j = count - 1; j >= 0; --j) {
        const float* row = p[j] + (r + i) * kKeyTile;
        const __m512 b = _mm512_set1_ps(beta);
        _mm512_store_si512(pa[j] + i * 16,
                           (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(_mm512_loadu_ps(row + 16), b),
                                                        _mm512_mul_ps(_mm512_loadu_ps(row), b)));
        beta *= alpha[j][r + i];
      }
      scale[i] = beta;
    }
    // A is exactly 1 on most rows of full attention once their maximum has settled, and 1·x is x
    // (NaN and inf included): those rows skip the pass over O.
    for (int i = 0; i < n; ++i) {
      if (scale[i] == 1.f) continue;
      const __m512 a = _mm512_set1_ps(scale[i]);
      float* row = o + int64_t(r + i) * dv;
      for (int c = 0; c < dv; c += 16) _mm512_storeu_ps(row + c, _mm512_mul_ps(a, _mm512_loadu_ps(row + c)));
    }
    alignas(64) float ca[2][16 * 16];
    float* o16 = o + int64_t(r) * dv;
    for (int c = 0; c < dv; c += 32) {
      const bool pair = c + 16 < dv;
      if (n == 16) {
        _tile_loadd(0, o16 + c, ld);
        if (pair) _tile_loadd(1, o16 + c + 16, ld);
      } else {  // a short group goes through 16-row local tiles
        for (int h = 0; h < (pair ? 2 : 1); ++h) {
          std::memset(ca[h], 0, sizeof(ca[h]));
          for (int i = 0; i < n; ++i) std::memcpy(ca[h] + i * 16, o + int64_t(r + i) * dv + c + 16 * h, 64);
        }
        _tile_loadd(0, ca[0], 64);
        if (pair) _tile_loadd(1, ca[1], 64);
      }
      for (int j = 0; j < count; ++j) {
        _tile_loadd(2, pa[j], 64);
        _tile_loadd(3, v[j] + c * 2, ld);
        _tile_dpbf16ps(0, 2, 3);
        if (pair) {
          _tile_loadd(4, v[j] + (c + 16) * 2, ld);
          _tile_dpbf16ps(1, 2, 4);
        }
      }
      if (n == 16) {
        _tile_stored(0, o16 + c, ld);
        if (pair) _tile_stored(1, o16 + c + 16, ld);
      } else {
        _tile_stored(0, ca[0], 64);
        if (pair) _tile_stored(1, ca[1], 64);
        for (int h = 0; h < (pair ? 2 : 1); ++h)
          for (int i = 0; i < n; ++i) std::memcpy(o + int64_t(r + i) * dv + c + 16 * h, ca[h] + i * 16, 64);
      }
    }
  }
  if (own) restore();
}

void pv_bf16(const float* p, const uint16_t* v, int dv, int rows, const float* alpha, float* o) {
  pv_bf16_batch(&p, &v, &alpha, 1, dv, rows, o);
}

// ---- TileKernels::dense_bf16 ----
// Tiles in the session's configuration (configure): 0, 1 C; 2 and 7 (rem > 0) or 2, 5, 6, 7
// (rem = 0) hold a group's Q for all its key tiles; 3, 4 B; with rem > 0, 5 the last Q chunk and 6
// its B halves one after the other. P·V takes its A tiles in 2 and 7 / 5, alternately, so the load
// of the next P need not wait for the product reading the last one.

bool dense_takes(int dp, int dv) { return dv % 16 == 0 && dp >= 16 && (dp % 16 == 0 ? dp <= 64 : dp < 48); }

// The query rows of one group into the Q tiles.
void load_q_tiles(const uint16_t* q, int64_t ldq, int dp) {
  const int full = dp / 16;
  _tile_loadd(2, q, ldq * 2);
  if (dp % 16 != 0) {
    if (full > 1) _tile_loadd(7, q + 32, ldq * 2);
    _tile_loadd(5, q + full * 32, ldq * 2);
    return;
  }
  if (full > 1) _tile_loadd(5, q + 32, ldq * 2);
  if (full > 2) _tile_loadd(6, q + 64, ldq * 2);
  if (full > 3) _tile_loadd(7, q + 96, ldq * 2);
}

// S (16 × 32, row stride lds floats) = Q·Kᵀ for key tile k, Q in its tiles (load_q_tiles).
void qk_resident(const uint16_t* k, int dp, float* s, int lds) {
  const int full = dp / 16;
  _tile_zero(0);
  _tile_zero(1);
  _tile_loadd(3, k, 128);
  _tile_loadd(4, k + 32, 128);
  _tile_dpbf16ps(0, 2, 3);
  _tile_dpbf16ps(1, 2, 4);
  if (dp % 16 != 0) {
    if (full > 1) {
      _tile_loadd(3, k + 1024, 128);
      _tile_loadd(4, k + 1024 + 32, 128);
      _tile_dpbf16ps(0, 7, 3);
      _tile_dpbf16ps(1, 7, 4);
    }
    _tile_loadd(6, k + full * 1024, 128);
    _tile_dpbf16ps(0, 5, 6);
    _tile_loadd(6, k + full * 1024 + 32, 128);
    _tile_dpbf16ps(1, 5, 6);
  } else {
    if (full > 1) {
      _tile_loadd(3, k + 1024, 128);
      _tile_loadd(4, k + 1024 + 32, 128);
      _tile_dpbf16ps(0, 5, 3);
      _tile_dpbf16ps(1, 5, 4);
    }
    if (full > 2) {
      _tile_loadd(3, k + 2048, 128);
      _tile_loadd(4, k + 2048 + 32, 128);
      _tile_dpbf16ps(0, 6, 3);
      _tile_dpbf16ps(1, 6, 4);
    }
    if (full > 3) {
      _tile_loadd(3, k + 3072, 128);
      _tile_loadd(4, k + 3072 + 32, 128);
      _tile_dpbf16ps(0, 7, 3);
      _tile_dpbf16ps(1, 7, 4);
    }
  }
  _tile_stored(0, s, lds * 4);
  _tile_stored(1, s + 16, lds * 4);
}

// o (16 rows × dv) += Σ_j P_j·V_j, P_j the A tiles pa[j].
void pv_resident(const uint32_t (*pa)[256], const uint16_t* const* v, int count, int dv, float* o, bool rem) {
  const int64_t ld = int64_t(dv) * 4;
  for (int c = 0; c < dv; c += 32) {
    const bool pair = c + 16 < dv;
    _tile_loadd(0, o + c, ld);
    if (pair) _tile_loadd(1, o + c + 16, ld);
    for (int j = 0; j < count; ++j) {
      const bool alt = j % 2 != 0;
      if (!alt) _tile_loadd(2, pa[j], 64);
      else if (rem) _tile_loadd(7, pa[j], 64);
      else _tile_loadd(5, pa[j], 64);
      _tile_loadd(3, v[j] + c * 2, ld);
      if (!alt) _tile_dpbf16ps(0, 2, 3);
      else if (rem) _tile_dpbf16ps(0, 7, 3);
      else _tile_dpbf16ps(0, 5, 3);
      if (!pair) continue;
      _tile_loadd(4, v[j] + (c + 16) * 2, ld);
      if (!alt) _tile_dpbf16ps(1, 2, 4);
      else if (rem) _tile_dpbf16ps(1, 7, 4);
      else _tile_dpbf16ps(1, 5, 4);
    }
    _tile_stored(0, o + c, ld);
    if (pair) _tile_stored(1, o + c + 16, ld);
  }
}

// oa and ob (16 rows × dv each, two groups) += Σ_j P_j·V_j with 2 × 2 tiles: each V load and each P
// load feeds two products (pv_resident's loads per product: 1.5, here 1); a last 16-column chunk
// runs 2 × 1. Tiles: C 0, 1 (group a) and 4, 5 (group b), A 2 and 7, B 3 and 6; every tile 16 rows
// × 64 bytes (the configuration without a remainder chunk).
void pv_pair(const uint32_t (*pa)[256], const uint32_t (*pb)[256], const uint16_t* const* v, int count, int dv,
             float* oa, float* ob) {
  const int64_t ld = int64_t(dv) * 4;
  int c = 0;
  for (; c + 32 <= dv; c += 32) {
    _tile_loadd(0, oa + c, ld);
    _tile_loadd(1, oa + c + 16, ld);
    _tile_loadd(4, ob + c, ld);
    _tile_loadd(5, ob + c + 16, ld);
    for (int j = 0; j < count; ++j) {
      _tile_loadd(3, v[j] + c * 2, ld);
      _tile_loadd(2, pa[j], 64);
      _tile_dpbf16ps(0, 2, 3);
      _tile_loadd(6, v[j] + (c + 16) * 2, ld);
      _tile_dpbf16ps(1, 2, 6);
      _tile_loadd(7, pb[j], 64);
      _tile_dpbf16ps(4, 7, 3);
      _tile_dpbf16ps(5, 7, 6);
    }
    _tile_stored(0, oa + c, ld);
    _tile_stored(1, oa + c + 16, ld);
    _tile_stored(4, ob + c, ld);
    _tile_stored(5, ob + c + 16, ld);
  }
  if (c < dv) {
    _tile_loadd(0, oa + c, ld);
    _tile_loadd(4, ob + c, ld);
    for (int j = 0; j < count; ++j) {
      _tile_loadd(3, v[j] + c * 2, ld);
      _tile_loadd(2, pa[j], 64);
      _tile_dpbf16ps(0, 2, 3);
      _tile_loadd(7, pb[j], 64);
      _tile_dpbf16ps(4, 7, 3);
    }
    _tile_stored(0, oa + c, ld);
    _tile_stored(4, ob + c, ld);
  }
}

// One group's softmax step over S (16 × 32·count): the new row maxima, α and the shifts (pass 1),
// then p per key tile (pass 2, softmax_tile) and the sums (finish).
struct GroupStep {
  alignas(64) float shift[16];
  alignas(64) float alpha[16];
  __m512 a, mn;
  __m512 sum[16];
};

// Pass 1: the row maxima; false when a row is already poisoned (the group then stays as it was).
// A NaN or infinite dot is found by softmax_end instead. With bits (band_bf16), tile j's maxima take
// row i's keys bits[j][i] where masked[j], all 32 keys elsewhere; a row that sees no key keeps its
// maximum and gets α = 1 (while m is −inf, 2^(m − m) would be NaN).
bool softmax_begin(const float* s, int lds, int count, float scale2, const float* m, GroupStep& st,
                   const uint32_t (*bits)[16] = nullptr, const bool* masked = nullptr) {
  const __m512 mo = _mm512_loadu_ps(m);
  if (_mm512_cmp_ps_mask(mo, mo, _CMP_UNORD_Q) != 0) return false;
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 red[16];
  for (int i = 0; i < 16; ++i) {
    const float* row = s + i * lds;
    __m512 x;
    if (bits == nullptr) {
      x = _mm512_load_ps(row);
      for (int c = 1; c < 2 * count; ++c) x = _mm512_maskz_max_ps(0xFFFF, x, _mm512_load_ps(row + 16 * c));
    } else {
      x = ninf;
      for (int j = 0; j < count; ++j) {
        const uint32_t w = masked[j] ? bits[j][i] : ~0u;
        x = _mm512_mask_max_ps(x, __mmask16(w), x, _mm512_load_ps(row + j * kKeyTile));
        x = _mm512_mask_max_ps(x, __mmask16(w >> 16), x, _mm512_load_ps(row + j * kKeyTile + 16));
      }
    }
    red[i] = x;
  }
  // scale2 > 0, so max t = scale2·max s; exp2v(0) is exactly 1 (rows whose maximum did not move
  // keep O as it is) and a first step (m = −inf) gives α = 0.
  st.mn = _mm512_max_ps(
      _mm512_mul_ps(reduce_rows16(red, [](__m512 x, __m512 y) { return _mm512_maskz_max_ps(0xFFFF, x, y); }),
                    _mm512_set1_ps(scale2)),
      mo);
  st.a = exp2v(_mm512_sub_ps(mo, st.mn));
  if (bits != nullptr)
    st.a = _mm512_mask_mov_ps(st.a, _mm512_cmp_ps_mask(st.mn, ninf, _CMP_EQ_OQ), _mm512_set1_ps(1.f));
  _mm512_store_ps(st.shift, st.mn);
  _mm512_store_ps(st.alpha, st.a);
  for (int i = 0; i < 16; ++i) st.sum[i] = _mm512_setzero_ps();
  return true;
}

// 2^x for x <= 0 with the relative error of exp2v_bf16 (degree 3), for the dense step: x below
// −125 is raised to −125, so the result is at least 2^−125.5, a normal number (no subnormal assist),
// which next to a row maximum of 1 changes no fp32 sum; NaN stays NaN (max returns its second
// operand when one is NaN), and so does −inf − −inf, which is how softmax_end finds bad rows.
inline __m512 exp2_dense(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-125.f), x);
  const __m512 f = _mm512_reduce_ps(x, _MM_FROUND_TO_NEAREST_INT);  // x − round(x), one instruction
  __m512 p = _mm512_set1_ps(0.0551716685295105f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.2426111251115799f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6932609677314758f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.9999280571937561f));
  return _mm512_scalef_ps(p, _mm512_sub_ps(x, f));
}

// Pass 2 on key tile j: p = 2^(s·scale2 − m) (one fused multiply-subtract), summed per row, rounded
// to bf16 into the A tile pa (16 rows × 32 keys). With bits (band_bf16), row i keeps p only on the
// keys of bits[i] and 0 elsewhere, whatever the masked dots are.
void softmax_tile(const float* s, int lds, float scale2, GroupStep& st, uint32_t* pa, const uint32_t* bits = nullptr) {
  const __m512 sc = _mm512_set1_ps(scale2);
  for (int i = 0; i < 16; ++i) {
    const __m512 c = _mm512_set1_ps(st.shift[i]);
    const float* row = s + i * lds;
    __m512 p0 = exp2_dense(_mm512_fmsub_ps(_mm512_load_ps(row), sc, c));
    __m512 p1 = exp2_dense(_mm512_fmsub_ps(_mm512_load_ps(row + 16), sc, c));
    if (bits != nullptr) {
      p0 = _mm512_maskz_mov_ps(__mmask16(bits[i]), p0);
      p1 = _mm512_maskz_mov_ps(__mmask16(bits[i] >> 16), p1);
    }
    st.sum[i] = _mm512_add_ps(st.sum[i], _mm512_add_ps(p0, p1));
    _mm512_store_si512(pa + i * 16, (__m512i)_mm512_cvtne2ps_pbh(p1, p0));
  }
}

// l = α·l + Σ p, m = the new maxima, O rows rescaled by α where it is not 1. False, changing
// nothing, when a row sum is NaN: a NaN dot, or an infinite one (+inf makes the maximum +inf and
// every t − m NaN; a row of −inf gives −inf − −inf).
bool softmax_end(GroupStep& st, float* m, float* l, float* o, int dv) {
  const __m512 sums = reduce_rows16(st.sum, [](__m512 x, __m512 y) { return _mm512_add_ps(x, y); });
  if (_mm512_cmp_ps_mask(sums, sums, _CMP_UNORD_Q) != 0) return false;
  _mm512_storeu_ps(l, _mm512_fmadd_ps(_mm512_loadu_ps(l), st.a, sums));
  _mm512_storeu_ps(m, st.mn);
  for (int i = 0; i < 16; ++i) {
    if (st.alpha[i] == 1.f) continue;
    const __m512 ai = _mm512_set1_ps(st.alpha[i]);
    float* row = o + int64_t(i) * dv;
    for (int c = 0; c < dv; c += 16) _mm512_storeu_ps(row + c, _mm512_mul_ps(ai, _mm512_loadu_ps(row + c)));
  }
  return true;
}

// ---- TileKernels::band_bf16 ----

// The lanes of keys [lo, hi) of a 32-key tile.
inline uint32_t key_bits(int32_t lo, int32_t hi) {
  if (hi <= lo) return 0u;
  const uint32_t below_hi = hi >= 32 ? ~0u : (1u << hi) - 1u;
  const uint32_t below_lo = lo <= 0 ? 0u : (1u << lo) - 1u;  // lo < hi <= 32
  return below_hi & ~below_lo;
}

// dense_bf16's step for one group of a band: Q in its tiles, S of the tiles, pass 1 with the row
// bounds (the maxima of the keys each row sees), pass 2 with p = 0 off them, P·V with O through the
// tiles once. The per-tile path it replaces ran Q·Kᵀ (Q loaded again), a softmax with its own row
// maxima and reductions, and clipped rows on every tile.
bool band_bf16(const uint16_t* q, int64_t ldq, const uint16_t* const* k, const uint16_t* const* v,
               const int32_t* const* lo, const int32_t* const* hi, int count, int dp, int dv, float scale2, float* m,
               float* l, float* o) {
  if (!dense_takes(dp, dv) || count < 1 || count > kPvBatch || !(scale2 > 0.f) || !std::isfinite(scale2))
    return false;
  constexpr int lds = kPvBatch * kKeyTile;
  alignas(64) float s[16 * lds];
  alignas(64) uint32_t pa[kPvBatch][256];
  uint32_t bits[kPvBatch][16];
  bool masked[kPvBatch];
  for (int j = 0; j < count; ++j) {
    masked[j] = lo[j] != nullptr;
    if (masked[j])
      for (int i = 0; i < 16; ++i) bits[j][i] = key_bits(lo[j][i], hi[j][i]);
  }
  GroupStep st;
  const bool own = acquire_exact(dp % 16);
  load_q_tiles(q, ldq, dp);
  for (int j = 0; j < count; ++j) qk_resident(k[j], dp, s + j * kKeyTile, lds);
  bool ok = softmax_begin(s, lds, count, scale2, m, st, bits, masked);
  if (ok) {
    for (int j = 0; j < count; ++j)
      softmax_tile(s + j * kKeyTile, lds, scale2, st, pa[j], masked[j] ? bits[j] : nullptr);
    ok = softmax_end(st, m, l, o, dv);
  }
  if (ok) pv_resident(pa, v, count, dv, o, dp % 16 != 0);
  if (own) restore();
  return ok;
}

// Group by group: Q into its tiles once, S of all the key tiles into one buffer, the softmax step
// on the vector units, then P·V. Interleaving the next group's Q·Kᵀ with this group's softmax (a
// software pipeline across the tile unit and the vector units, S double-buffered) measured no
// faster (docs/cpu-backend.md), so the groups run one after the other, except that a group's P·V
// waits for the next group's P and the two run together (pv_pair); with a remainder chunk (d 80)
// the tiles are configured all full for it and back for the next Q·Kᵀ.
unsigned dense_bf16(const uint16_t* q, int64_t ldq, const uint16_t* const* k, const uint16_t* const* v, int count,
                    int dp, int dv, float scale2, int rows, float* m, float* l, float* o) {
  const int groups = rows / 16;
  const unsigned tail = rows % 16 != 0 ? 1u << groups : 0u;
  if (groups == 0 || !dense_takes(dp, dv) || count < 1 || count > kPvBatch || !(scale2 > 0.f) ||
      !std::isfinite(scale2))
    return ((1u << groups) - 1) | tail;
  constexpr int lds = kPvBatch * kKeyTile;
  alignas(64) float s[16 * lds];
  alignas(64) uint32_t pa[2][kPvBatch][256];
  GroupStep st;
  const bool own = acquire_exact(dp % 16);
  const bool rem = dp % 16 != 0;
  unsigned undone = tail;
  int waiting = -1;  // a group whose P (in pa[0]) waits for the next group's
  for (int g = 0; g < groups; ++g) {
    float* og = o + int64_t(g) * 16 * dv;
    uint32_t(*pg)[256] = pa[waiting >= 0 ? 1 : 0];
    load_q_tiles(q + int64_t(g) * 16 * ldq, ldq, dp);
    for (int j = 0; j < count; ++j) qk_resident(k[j], dp, s + j * kKeyTile, lds);
    bool ok = softmax_begin(s, lds, count, scale2, m + g * 16, st);
    if (ok) {
      for (int j = 0; j < count; ++j) softmax_tile(s + j * kKeyTile, lds, scale2, st, pg[j]);
      ok = softmax_end(st, m + g * 16, l + g * 16, og, dv);
    }
    if (!ok) undone |= 1u << g;
    if (waiting >= 0) {
      float* ow = o + int64_t(waiting) * 16 * dv;
      if (ok) {
        if (rem) configure(0);
        pv_pair(pa[0], pa[1], v, count, dv, ow, og);
        if (rem) configure(dp % 16);
      } else {
        pv_resident(pa[0], v, count, dv, ow, rem);
      }
      waiting = -1;
    } else if (ok) {
      if (g + 1 < groups) waiting = g;
      else pv_resident(pg, v, count, dv, og, rem);
    }
  }
  if (own) restore();
  return undone;
}
}  // namespace

const TileKernels* tile_kernels_amx() {
  static const TileKernels table = [] {
    TileKernels t = *tile_kernels_avx512bf16();
    t.name = "amx";
    t.qk_bf16 = qk_bf16;
    t.pv_bf16 = pv_bf16;
    t.pv_bf16_batch = pv_bf16_batch;
    t.dense_bf16 = dense_bf16;
    t.dense_bf16_takes = dense_takes;
    t.band_bf16 = band_bf16;
    t.begin_bf16 = begin_bf16;
    t.end_bf16 = end_bf16;
    return t;
  }();
  return tile_kernels_avx512bf16() != nullptr ? &table : nullptr;
}

bool amx_usable() {
  static const bool ok = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool tile = (d >> 24) & 1u, bf16 = (d >> 22) & 1u;
    if (!tile || !bf16) return false;
    // ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA: the kernel grants the tile state to the process.
    constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
  }();
  return ok;
}

}  // namespace ariadne::cpu

#else

namespace ariadne::cpu {
const TileKernels* tile_kernels_amx() { return nullptr; }
bool amx_usable() { return false; }
}  // namespace ariadne::cpu

#endif
