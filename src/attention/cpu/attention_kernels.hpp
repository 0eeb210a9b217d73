// Internal: the tile primitives of the fast CPU attention, one table per instruction set.
//
// The driver (runner.hpp and its files) owns tiling, masks, the online-softmax bookkeeping, threads
// and diagnostics; the table below holds only the few loops whose speed matters, so each ISA file
// (attention_avx512.cpp, attention_avx2.cpp, attention_generic.cpp) is small and the choice between
// them is one pointer picked at run time from the CPU's features.
//
// Shapes (all row-major, every pointer already offset to the first row the call touches):
//   key tile      kKeyTile = 32 keys, aligned to the start of its sequence (tile t holds local keys
//                 [32t, 32t + 32)); keys past the end are zero-filled.
//   K, fp32       [d][32]            (transposed so one vector load covers 16 or 8 keys)
//   K, bf16       [dp][32][2]        (dp = ceil(d / 2); pairs of head-dim entries per key, the
//                                     operand layout of vdpbf16ps)
//   V, fp32       [32][ldv]          (columns [0, dv) read, dv = d rounded up to 16; a packed copy
//                                     zero-fills past d, or the input rows themselves when
//                                     d is a multiple of 16 and all 32 keys exist)
//   V, bf16       [16][dv][2]        (pairs of consecutive keys per column)
//   Q, fp32       [rows][ldq]        (ldq >= d)
//   Q, bf16       [rows][ldq] uint16 (ldq >= 2·dp, zero-filled past d)
//   S / P         [rows][32] fp32
//   O             [rows][dv] fp32 accumulator (unnormalized)
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>

namespace ariadne::cpu {

constexpr int kKeyTile = 32;
constexpr int kPvBatch = 8;  // key tiles per TileKernels::pv_bf16_batch call at most

// Per-row visibility inside one key tile plus the softmax constants.
struct RowMask {
  const int32_t* lo = nullptr;  // [rows] first allowed key of the tile (0..32)
  const int32_t* hi = nullptr;  // [rows] one past the last allowed key (lo >= hi: none)
  uint32_t keymask = ~0u;       // bit j: key j of the tile may be seen at all (block-sparse)
  float scale2 = 1.f;           // softmax scale · log2(e): the kernels work in base 2
  float bias2 = 0.f;            // added to key 0 of the tile when apply_bias (key0_bias sink, base 2)
  bool apply_bias = false;
  bool dense = false;           // every row sees all 32 keys: the kernels may skip the masks
  bool moving_max = false;      // narrow band: row maxima move on most tiles (a branch hint only)
  // p is rounded to bf16 before P·V and nothing else reads it (no diagnostics): the softmax may
  // compute p with an exp2 of relative error ≤ 1e-4, far below bf16's 2^-9 (docs/cpu-backend.md).
  // l sums those same p values. α keeps the exact exp2 (2^0 must be exactly 1).
  bool bf16_p = false;
};

// Shared by the softmax kernels: a row that met a NaN or +inf logit (`bad`, or m already NaN)
// gets m = l = alpha = NaN (alpha turns the accumulator NaN) and zero p; returns whether it did.
inline bool poison_row(bool bad, int r, float* p, float* m, float* l, float* alpha) {
  if (!bad && m[r] == m[r]) return false;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  m[r] = l[r] = alpha[r] = nan;
  for (int j = 0; j < kKeyTile; ++j) p[j] = 0.f;
  return true;
}

// Calls body(std::integral_constant<int, n>{}) for a run-time n in [1, N] (nothing for n outside):
// a row or column count becomes a template argument without a switch per kernel.
template <int N, class Body>
inline void with_count(int n, Body&& body) {
  if constexpr (N >= 1) {
    if (n == N) body(std::integral_constant<int, N>{});
    else with_count<N - 1>(n, body);
  }
}

// Rows [0, rows) in tiles of R, then one tile of the rest: body(first_row, integral_constant<rows>).
template <int R, class Body>
inline void for_row_tiles(int rows, Body&& body) {
  int r = 0;
  for (; r + R <= rows; r += R) body(r, std::integral_constant<int, R>{});
  with_count<R - 1>(rows - r, [&](auto n) { body(r, n); });
}

struct TileKernels {
  const char* name;
  // s[r][j] = q_r · k_j for r < rows (raw dot products, no scale).
  void (*qk_f32)(const float* q, int64_t ldq, const float* k, int d, int rows, float* s);
  // Same with bf16 operands and fp32 accumulation; null when the ISA has no bf16 dot product.
  void (*qk_bf16)(const uint16_t* q, int64_t ldq, const uint16_t* k, int dp, int rows, float* s);
  // Online-softmax step over one key tile. In: s = raw dots. Out: s = p = 2^(t − m_new) (0 where
  // masked), m/l updated, alpha[r] = 2^(m_old − m_new) (1 for a row that still has no key).
  // t = s·scale2 (+ bias); when t_out is given it receives t (−inf where masked). A NaN or +inf
  // logit poisons its row for good (poison_row): m, l, alpha become NaN, so O and the LSE come out
  // NaN (docs/numerics.md, non-finite inputs).
  void (*softmax)(float* s, const RowMask& mask, int rows, float* m, float* l, float* alpha,
                  float* t_out);
  // o[r] = alpha[r]·o[r] + Σ_j p[r][j]·v[j], columns [0, dv); row j of V at v + j·ldv.
  void (*pv_f32)(const float* p, const float* v, int64_t ldv, int dv, int rows, const float* alpha, float* o);
  // Same with P rounded to bf16 and bf16 V; null when the ISA has no bf16 dot product.
  void (*pv_bf16)(const float* p, const uint16_t* v, int dv, int rows, const float* alpha, float* o);
  // pv_bf16 over `count` (<= kPvBatch) consecutive key tiles, tile j with P p[j], V v[j] and the
  // rescale factors alpha[j] its softmax step gave: o[r] = A[r]·o[r] + Σ_j β_j[r]·p_j[r]·v_j with
  // β_j = Π_{i>j} alpha[i] (taken from the last tile down, P scaled in fp32 before the bf16
  // rounding) and A = β_{-1}, the product of all. Lets a table keep O in its accumulators across
  // several key tiles; null: the driver calls pv_bf16 per tile.
  void (*pv_bf16_batch)(const float* const* p, const uint16_t* const* v, const float* const* alpha, int count,
                        int dv, int rows, float* o);
  // One online-softmax step of `rows` query rows over `count` (<= kPvBatch) consecutive key tiles
  // that every row sees whole, without the key-0 bias, in 16-row groups: S = Q·Kᵀ of all of them
  // (q: the rows, ldq as for qk_bf16; k[j], v[j]: tile j in the bf16 layouts), m/l updated once over
  // their 32·count keys with p by the bf16 exp2 (RowMask::bf16_p), and o[r] = α[r]·o[r] + Σ_j
  // P_j[r]·V_j, P rounded to bf16 as it is computed. Returns the groups it left unchanged (bit g:
  // rows [16g, 16g + 16)): one with a NaN or infinite dot or an already poisoned row (m NaN), and a
  // last group of fewer than 16 rows; the driver runs those through qk_bf16, softmax and pv_bf16.
  // Null, or dense_bf16_takes(dp, dv) false: the driver batches through pv_bf16_batch.
  unsigned (*dense_bf16)(const uint16_t* q, int64_t ldq, const uint16_t* const* k, const uint16_t* const* v,
                         int count, int dp, int dv, float scale2, int rows, float* m, float* l, float* o);
  bool (*dense_bf16_takes)(int dp, int dv);
  // One 16-row group of a narrow pattern in stream mode over `count` (<= kPvBatch) consecutive key
  // tiles in one online-softmax step (dense_bf16's arithmetic): row r of tile j sees its keys
  // [lo[j][r], hi[j][r]) (lo[j], hi[j] null: all 32; empty bounds: none), m/l updated once over
  // them, masked keys with p = 0, a row that sees no key keeps its m, l and O. Returns false and
  // changes nothing where a row is poisoned or a dot it sees is NaN or infinite; the driver then runs
  // the tiles through qk_bf16, softmax and pv_bf16_batch. Null, or dense_bf16_takes false: the same.
  bool (*band_bf16)(const uint16_t* q, int64_t ldq, const uint16_t* const* k, const uint16_t* const* v,
                    const int32_t* const* lo, const int32_t* const* hi, int count, int dp, int dv, float scale2,
                    float* m, float* l, float* o);
  // Received attention: colsum[j] += Σ_r 2^(t_rj − off[r]) over allowed (r, j); s = raw dots.
  void (*colsum)(const float* s, const RowMask& mask, int rows, const float* off, float* colsum);

  // ---- packing (optional: null means the driver's portable loops) ----
  // Input rows: key j of the tile starts at base + j·stride (elements); n <= 32 keys exist, the
  // rest of the tile is zero-filled.
  // K fp32 → [d][32].
  void (*pack_k_f32)(const float* base, int64_t stride, int n, int d, float* k);
  // K bf16 → [dp][32] pairs (32-bit words, low half = even head-dim entry).
  void (*pack_k_bf16)(const uint16_t* base, int64_t stride, int n, int d, uint32_t* k);
  // V bf16 → [16][dv] pairs of keys (low half = even key), zero past d.
  void (*pack_v_bf16)(const uint16_t* base, int64_t stride, int n, int d, int dv, uint32_t* v);
  // dst[c] = bf16(src[c]·mul), round to nearest even, c < n.
  void (*store_bf16)(const float* src, float mul, int n, uint16_t* dst);

  // ---- backward ----
  // The probabilities from a saved LSE: p[r][j] = 2^(t_rj − off[r]) over allowed (r, j), 0 where
  // masked; s = raw dots, t as in softmax. off[r] must not be NaN or −inf (−inf − −inf is NaN):
  // a row without keys passes 0 with lo >= hi, and the driver handles NaN rows. p may be s.
  void (*probs)(const float* s, const RowMask& mask, int rows, const float* off, float* p);
  // ds[r][j] = p[r][j]·(dp[r][j] − D[r]), exactly 0 where p is 0 (masked keys stay 0 whatever
  // dP − D is), for r < rows; ds may be dp. Null: the driver's loop (the same arithmetic).
  void (*grad_s)(const float* p, const float* dp, const float* D, int rows, float* ds);
  // dst[j][i] = src[i][j] for i < n (rows of 32), 0 for i in [n, 32): the 32 × 32 Pᵀ and dSᵀ
  // blocks of the key pass. Null: the driver's loop.
  void (*transpose32)(const float* src, int n, float* dst);
  // The query pass's per-row sums, in double, each in a fixed order: z[r] += Σ_j p[r][j] and
  // pd[r] += Σ_j p[r][j]·dp[r][j] (products exact in double). Null: the driver's loops.
  void (*row_sums)(const float* p, const float* dp, int rows, double* z, double* pd);

  // ---- per-thread state (optional: null where a table keeps none) ----
  // begin_bf16(dp) before one thread's run of bf16 products with dp head-dim pairs, end_bf16() after
  // it (Bf16Session below); nothing else may use the tile unit on that thread in between. The AMX
  // table loads its tile configuration there once instead of at every product, where it costs
  // about as much as a window's product.
  void (*begin_bf16)(int dp);
  void (*end_bf16)();
};

// Brackets a thread's bf16 products (TileKernels::begin_bf16 / end_bf16); inactive when `on` is false.
class Bf16Session {
 public:
  Bf16Session(const TileKernels& k, bool on, int dp) : end_(on && k.begin_bf16 != nullptr ? k.end_bf16 : nullptr) {
    if (end_ != nullptr) k.begin_bf16(dp);
  }
  ~Bf16Session() {
    if (end_ != nullptr) end_();
  }
  Bf16Session(const Bf16Session&) = delete;
  Bf16Session& operator=(const Bf16Session&) = delete;

 private:
  void (*end_)();
};

const TileKernels* tile_kernels_generic();
const TileKernels* tile_kernels_avx2();    // null when not compiled for x86
const TileKernels* tile_kernels_avx512();      // null when not compiled for x86; bf16 on fp32 products
const TileKernels* tile_kernels_avx512bf16();  // the same with bf16 products on vdpbf16ps
// The avx512bf16 table with its bf16 products on AMX tiles (attention_amx.cpp); null when not
// compiled for it. amx_usable: the CPU has AMX-TILE and AMX-BF16 and the OS granted the tile state.
const TileKernels* tile_kernels_amx();
bool amx_usable();

// The table attention_cpu uses (runtime.cpp): the best one the CPU supports, or the one named by
// the environment variable ARIADNE_CPU_ISA ("generic", "avx2", "avx512", "avx512bf16", "amx"; an
// unsupported name throws), read once at the first call.
const TileKernels& active_tile_kernels();
// Tests and benchmarks: force a table by name (one of those, or "" = the
// configured one again: ARIADNE_CPU_ISA's, else the best). Throws ariadne::Error when this CPU
// cannot run it.
void force_tile_kernels(const char* name);
// Whether this CPU (and the build) can run the named table.
bool tile_kernels_available(const char* name);

}  // namespace ariadne::cpu
