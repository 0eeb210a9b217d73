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

// Tiles: 0, 1 the two C halves (or C); 2 A; 3, 4 the two B halves (or B); 5–7 the same for a
// last head-dim chunk of fewer than 16 pairs.
void configure(int rem_pairs) {
  TileConfig c;
  for (int t = 0; t < 5; ++t) {
    c.rows[t] = 16;
    c.colsb[t] = 64;
  }
  if (rem_pairs > 0) {
    c.rows[5] = 16;
    c.colsb[5] = uint16_t(4 * rem_pairs);
    c.rows[6] = c.rows[7] = uint8_t(rem_pairs);
    c.colsb[6] = c.colsb[7] = 64;
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
    _tile_loadd(7, k + full * 16 * 64 + 32, 128);
    _tile_dpbf16ps(0, 5, 6);
    _tile_dpbf16ps(1, 5, 7);
  }
  _tile_stored(0, s, lds * 4);
  _tile_stored(1, s + 16, lds * 4);
}

void qk_bf16(const uint16_t* q, int64_t ldq, const uint16_t* k, int dp, int rows, float* s) {
  if (dp > 256) {  // beyond the local buffer of a short row group
    tile_kernels_avx512()->qk_bf16(q, ldq, k, dp, rows, s);
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
    for (int j = 0; j < count; ++j) tile_kernels_avx512()->pv_bf16(p[j], v[j], dv, rows, alpha[j], o);
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

// TileKernels::dense_bf16: one online-softmax step over the 32·count keys of `count` whole key tiles
// for 16 rows. S of all the tiles lands in one [16][256] buffer, so the row maxima, the rescale
// factors and the row sums are taken once per step, not once per 32 keys, and P is rounded to bf16
// as the softmax writes it, straight into the A tiles of P·V (no β scaling: the step has one maximum
// per row). t = s·scale2 as in the softmax kernels; scale2 > 0 makes max t = scale2·max s.
bool dense_bf16(const uint16_t* q, int64_t ldq, const uint16_t* const* k, const uint16_t* const* v, int count, int dp,
                int dv, float scale2, float* m, float* l, float* o) {
  if (dv % 16 != 0 || count < 1 || count > kPvBatch || dp > 256 || !(scale2 > 0.f) || !std::isfinite(scale2))
    return false;
  const __m512 mo = _mm512_loadu_ps(m);
  if (_mm512_cmp_ps_mask(mo, mo, _CMP_UNORD_Q) != 0) return false;  // a poisoned row
  constexpr int lds = kPvBatch * kKeyTile;
  alignas(64) float s[16][lds];
  const bool own = acquire(dp % 16);
  for (int j = 0; j < count; ++j) qk_group(q, ldq, k[j], dp, s[0] + j * kKeyTile, lds);
  // Row maxima of the raw dots. A NaN or infinite dot (QNaN, +inf, −inf, SNaN classes) sends the
  // group back to the per-tile kernels, which poison or mask its row.
  const int vecs = 2 * count;
  __m512 red[16];
  __mmask16 bad = 0;
  for (int i = 0; i < 16; ++i) {
    __m512 x = _mm512_load_ps(s[i]);
    bad |= _mm512_fpclass_ps_mask(x, 0x99);
    for (int c = 1; c < vecs; ++c) {
      const __m512 y = _mm512_load_ps(s[i] + 16 * c);
      bad |= _mm512_fpclass_ps_mask(y, 0x99);
      x = _mm512_maskz_max_ps(0xFFFF, x, y);
    }
    red[i] = x;
  }
  if (bad != 0) {
    if (own) restore();
    return false;
  }
  const __m512 sc = _mm512_set1_ps(scale2);
  const __m512 mn = _mm512_max_ps(
      _mm512_mul_ps(reduce_rows16(red, [](__m512 x, __m512 y) { return _mm512_maskz_max_ps(0xFFFF, x, y); }), sc),
      mo);
  // exp2v(0) is exactly 1, so rows whose maximum did not move keep O as it is; a first step
  // (m = −inf) gives α = 0.
  const __m512 a = exp2v(_mm512_sub_ps(mo, mn));
  alignas(64) float shift[16], alpha[16];
  _mm512_store_ps(shift, mn);
  _mm512_store_ps(alpha, a);
  alignas(64) uint32_t pa[kPvBatch][16 * 16];  // P of each tile as an A tile: 16 rows × 32 bf16
  for (int i = 0; i < 16; ++i) {
    const __m512 c = _mm512_set1_ps(shift[i]);
    __m512 sum = _mm512_setzero_ps();
    for (int j = 0; j < count; ++j) {
      const float* row = s[i] + j * kKeyTile;
      const __m512 p0 = exp2v_bf16(_mm512_sub_ps(_mm512_mul_ps(_mm512_load_ps(row), sc), c));
      const __m512 p1 = exp2v_bf16(_mm512_sub_ps(_mm512_mul_ps(_mm512_load_ps(row + 16), sc), c));
      sum = _mm512_add_ps(sum, _mm512_add_ps(p0, p1));
      _mm512_store_si512(pa[j] + i * 16, (__m512i)_mm512_cvtne2ps_pbh(p1, p0));
    }
    red[i] = sum;
  }
  const __m512 sums = reduce_rows16(red, [](__m512 x, __m512 y) { return _mm512_add_ps(x, y); });
  _mm512_storeu_ps(l, _mm512_fmadd_ps(_mm512_loadu_ps(l), a, sums));
  _mm512_storeu_ps(m, mn);
  for (int i = 0; i < 16; ++i) {
    if (alpha[i] == 1.f) continue;
    const __m512 ai = _mm512_set1_ps(alpha[i]);
    float* row = o + int64_t(i) * dv;
    for (int c = 0; c < dv; c += 16) _mm512_storeu_ps(row + c, _mm512_mul_ps(ai, _mm512_loadu_ps(row + c)));
  }
  const int64_t ld = int64_t(dv) * 4;
  for (int c = 0; c < dv; c += 32) {
    const bool pair = c + 16 < dv;
    _tile_loadd(0, o + c, ld);
    if (pair) _tile_loadd(1, o + c + 16, ld);
    for (int j = 0; j < count; ++j) {
      _tile_loadd(2, pa[j], 64);
      _tile_loadd(3, v[j] + c * 2, ld);
      _tile_dpbf16ps(0, 2, 3);
      if (pair) {
        _tile_loadd(4, v[j] + (c + 16) * 2, ld);
        _tile_dpbf16ps(1, 2, 4);
      }
    }
    _tile_stored(0, o + c, ld);
    if (pair) _tile_stored(1, o + c + 16, ld);
  }
  if (own) restore();
  return true;
}

}  // namespace

const TileKernels* tile_kernels_amx() {
  static const TileKernels table = [] {
    TileKernels t = *tile_kernels_avx512();
    t.name = "amx";
    t.qk_bf16 = qk_bf16;
    t.pv_bf16 = pv_bf16;
    t.pv_bf16_batch = pv_bf16_batch;
    t.dense_bf16 = dense_bf16;
    t.begin_bf16 = begin_bf16;
    t.end_bf16 = end_bf16;
    return t;
  }();
  return tile_kernels_avx512() != nullptr ? &table : nullptr;
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
