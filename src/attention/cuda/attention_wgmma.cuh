// Internal: the Hopper (sm_90a) forward kernel for dense rows: wgmma tensor-core products fed by a
// producer warpgroup through an mbarrier pipeline (FlashAttention-3's structure, our own code).
//
// A CTA of 3 warpgroups owns one (sequence, query head, 128-row query tile):
//   - warpgroup 0, the producer, copies Q once and then K and V tiles of BN = 128 keys into a
//     ring of STAGES shared buffers: one thread issues TMA box copies (cp.async.bulk.tensor, tensor
//     maps built on the host) that complete on an mbarrier with expected transaction bytes; tiles
//     with rows past the sequence's end, and calls without tensor maps (AttentionOverrides::tma
//     off, or maps the driver refused), are copied by all 128 threads with cp.async (zero-filled past the end),
//     completing through cp.async.mbarrier.arrive.noinc. K and V complete on separate barriers so
//     S can start while V lands;
//   - warpgroups 1 and 2, the consumers, own 64 query rows each: S = Q·Kᵀ by wgmma m64n128k16
//     with both operands in shared memory, the online softmax in registers, P packed to 16 bits in
//     registers as the A operand of O += P·V (wgmma m64nDk16, V read transposed from shared
//     memory). Inside a consumer, S of tile j and P·V of tile j - 1 are in flight together
//     (FlashAttention-3's intra-warpgroup pipelining); a stage is released on its "empty" mbarrier
//     once P·V of its tile has completed.
// With ping-pong (d 64 and 80 by default, d 128 on short rows: attention_cuda.cu's
// wgmma_default_pingpong) the two consumers take turns issuing their products (named barriers 1
// and 2), so one consumer's softmax runs under the other's tensor-core work. At d 128 and 80 a
// consumer whose rows lie in its sequence stores O through its half of the Q buffer and TMA
// (WgMaps::out_tma).
// setmaxnreg moves registers from the producer (40) to the consumers (232): a consumer holds the
// S and O accumulators (64 + D/2 floats) and P (32 words).
//
// Measured on the H200: with cp.async copies this kernel runs 1.24-1.48x the mma.sync kernel on
// full and causal rows, limited by the K/V copies (a variant without them ran 1.26-1.70x faster),
// which is why the copies are TMA's.
//
// Shared tiles use wgmma's swizzled layouts, the ones TMA writes: a 128-row tile is D·2/W regions
// of 128 rows x W bytes (W = 128 for D = 64 and 128, one TMA box of 64 columns per region; W = 32
// for D = 80, five boxes of 16 columns, so 80 runs natively: five k-steps of 16 and a legal n of
// 80). The same tile serves as a K-major operand (Q, K: k = head dim) and as an MN-major one (V:
// n = head dim, the W-byte atoms along n one region apart).
//
// Semantics are those of attention_fwd.cuh (Pattern::key_range per row, sinks, GQA, varlen,
// f32 out, LSE, block-sparse CSR rows). Block-sparse rows need a block that is a multiple of the
// 128-row tiles (RRAttention's and XAttention's default 128 is), so a query tile lies in one
// query block and a key tile in one key block; the producer walks the row's listed key blocks
// (intersected with key_range) instead of the dense tile range, and the consumers' element masks
// (the causal diagonal) are unchanged. What it does not do (blocks of 64 or 192, windows with a
// left bound, chunks, token orders, diagnostics, head dim 96) the dispatcher keeps on the
// mma.sync kernel.
#pragma once

#include <cuda.h>  // CUtensorMap (a type only: the driver's encoder is reached at run time)
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <utility>

#include "attention/cuda/attention_fwd.cuh"
#include "device/cuda/wgmma.cuh"

namespace ariadne::cuda {

template <int D>
struct WgShape {
  static constexpr int BM = 128, BN = 128;
  // Stages of the K/V ring: as many as fit next to Q in 227 KB (d 128: 3 x 64 KB).
  static constexpr int STAGES = D <= 80 ? 4 : 3;
  static constexpr int threads = 384;
  static constexpr int C = D / 8;                   // 16-byte chunks per row
  static constexpr int W = D % 64 == 0 ? 128 : 32;  // swizzle span in bytes (one TMA box row)
  static constexpr int R = 2 * D / W;               // regions (TMA boxes) per tile
  static constexpr int q_elems = BM * D, kv_elems = BN * D;
  // Q, then STAGES x (K, V), then the mbarriers (8 bytes each): q_full, k_full[S], v_full[S], empty[S].
  // Every tile starts 1024-byte aligned (the swizzle atom): 1024 bytes of slack align the base.
  static constexpr size_t bar_offset = size_t(q_elems + 2 * STAGES * kv_elems) * 2;
  static constexpr size_t smem_bytes = 1024 + bar_offset + 8 * (1 + 3 * STAGES);
  static_assert(BM == BN, "one tile geometry (128 rows) for Q, K and V");
  static_assert((BN * W) % 1024 == 0, "regions keep the 1024-byte alignment");
};

// Tensor maps of q, k, v for the TMA copies: dims (head dim, tokens, heads), box (W/2, 128, 1),
// swizzle W; `enabled` = 0: none (the producer copies with cp.async). Built by the plan
// (attention_cuda.cu); passed as a __grid_constant__ parameter so the maps stay in parameter space.
// pingpong != 0: the consumers take turns issuing their products (AttentionOverrides::pingpong).
enum : int { kOrderTileMajor = 0, kOrderHeadsFastest = 1, kOrderAuto = 2 };
struct WgMaps {
  CUtensorMap q, k, v;
  int enabled;
  int pingpong;
  // The launch order (CTAs launch x first), kOrder*: tile-major, grid (query tiles, heads_q): each
  // head's tiles heaviest first, head after head; heads-fastest, grid (heads_q, query tiles): tile
  // t of every head before tile t - 1 of any, a longest-first order over the whole grid; auto:
  // launch_wgmma picks (kHeadsFastestWaves).
  int order;
  // d 128 and 80 (the OT kernels): the output's map (as q's, box of 64 rows: one
  // consumer's half of a query tile) and whether it was built (16-bit out the copy engine can
  // address); a consumer whose 64 rows all lie in its sequence then stores O through its half of
  // the Q buffer and the copy engine instead of D/4 scattered 4-byte stores a thread.
  // AttentionOverrides::out_tma = off turns it off.
  CUtensorMap o;
  int out_tma;
};

// The key tiles one CTA visits, in increasing key order, with the tile at step `it` computable by
// producer and consumers alike (both run the same count, so the stage ring stays in step).
//   dense rows: the BN-tiles first, first + 1, ... meeting Pattern::key_range;
//   block-sparse rows (block a multiple of BN): the CSR row's listed key blocks that meet key_range,
//     each cut into block / BN tiles; `cols` starts at the first such block and `first` tiles of it
//     lie before key_range. The last block's tiles past key_range are not counted in n. Tiles
//     inside the range but partly outside a row's keys (the causal diagonal) are masked per element.
template <int BN>
struct WgKeyTiles {
  const int32_t* cols = nullptr;  // null: dense
  int first = 0, n = 0;
  int per = 1, block = BN;
  __device__ __forceinline__ int k_lo(int it) const {
    if (cols == nullptr) return (first + it) * BN;
    const int i = first + it;
    if (per == 1) return cols[i] * BN;  // block 128, the common case: no integer division
    return cols[i / per] * block + (i % per) * BN;
  }
};

// First index in the sorted list cols[0, n) whose value is >= v.
__device__ __forceinline__ int lower_bound_i32(const int32_t* cols, int n, int v) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (cols[mid] < v) lo = mid + 1; else hi = mid;
  }
  return lo;
}

// Element offset of the 16-byte chunk ch (0 .. D/8 - 1) of row r in a ROWS-row tile swizzled with
// span W: region ch / (W/16), row r of it, the chunk XOR-ed with the row's place in its 8-row atom
// (CU_TENSOR_MAP_SWIZZLE_<W>B: address bits 4.. XOR bits 7..).
template <int W, int ROWS = 128>
__device__ __forceinline__ int swz_off(int r, int ch) {
  constexpr int cpr = W / 16;  // chunks per region row
  const int c = ch % cpr;
  return (ch / cpr) * ROWS * (W / 2) + r * (W / 2) + ((c ^ ((r * W >> 7) & (cpr - 1))) * 8);
}

// OT: the epilogue of a consumer whose 64 rows lie in its sequence may store O through its half
// of the Q buffer and the copy engine (when maps.out_tma). Always compiled in at d 128; at d 80 a
// kernel of its own that launch_wgmma takes when the output's map was built (the other
// instantiation, for f32 out and out_tma off, keeps the main loop's code: adding the branch to
// one kernel changed its whole schedule).
template <int D, class E, bool OT>
__global__ void __launch_bounds__(384, 1) attention_wgmma_kernel(const FwdParams p, const __grid_constant__ WgMaps maps) {
  using S = WgShape<D>;
  constexpr int BM = S::BM, BN = S::BN, STAGES = S::STAGES, C = S::C, W = S::W, R = S::R;
  constexpr int NS = BN / 2;  // score accumulators per thread (m64n128)
  constexpr int NO = D / 2;   // output accumulators per thread (m64nD)
  using T = typename E::type;

  extern __shared__ __align__(16) unsigned char smem_dyn[];
  unsigned char* smem_raw = smem_dyn + ((1024 - (smem_addr(smem_dyn) & 1023)) & 1023);
  T* Qs = reinterpret_cast<T*>(smem_raw);
  T* Ks = Qs + S::q_elems;                // STAGES buffers of kv_elems
  T* Vs = Ks + STAGES * S::kv_elems;      // STAGES buffers of kv_elems
  const uint32_t bars = smem_addr(smem_raw + S::bar_offset);
  const uint32_t q_full = bars;
  auto k_full = [&](int s) { return bars + 8 * (1 + s); };
  auto v_full = [&](int s) { return bars + 8 * (1 + STAGES + s); };
  auto empty = [&](int s) { return bars + 8 * (1 + 2 * STAGES + s); };

  const Pattern& pat = p.pattern;
  const int tid = threadIdx.x;
  // ---- which (head, sequence, query tile) this CTA owns (WgMaps::order), heaviest first ----
  int h;
  CtaTile ct;
  if (maps.order == kOrderHeadsFastest) {
    h = blockIdx.x;
    ct = cta_tile<BM>(pat, blockIdx.y, gridDim.y);
  } else {
    h = blockIdx.y;
    ct = cta_tile<BM>(pat, blockIdx.x, gridDim.x);
  }
  const int kvh = h / p.group;
  const auto [s, tile] = ct;
  const SeqExtent e = pat.seq(s, p.total_q, p.total_k);
  const int64_t q_lo = tile * BM;
  if (q_lo >= e.lq) return;  // uniform over the CTA, before any barrier exists
  const int64_t q_hi = q_lo + BM < e.lq ? q_lo + BM : e.lq;

  // The key tiles: BN-tiles covering Pattern::key_range of the query tile, and for block-sparse
  // rows only those of listed blocks. A query tile lies inside one query block (the dispatcher
  // sends only blocks that are multiples of BM here). Every thread computes the same walk.
  const KeyRange range = pat.key_range(e, q_lo, q_hi);
  WgKeyTiles<BN> tiles;
  if (!range.empty()) {
    const int t_lo = int(range.lo) / BN, t_hi = (int(range.hi) + BN - 1) / BN;
    if (pat.blocks.defined()) {
      const int B = pat.blocks.block, per = B / BN;
      const int64_t row = pat.block_row(s, e, h, q_lo / B);
      const int32_t* cols = pat.blocks.col_idx + pat.blocks.row_ptr[row];
      const int cnt = pat.blocks.row_ptr[row + 1] - pat.blocks.row_ptr[row];
      // Listed blocks [a, b) meet the range: sorted, so two binary searches bound them. At
      // head dim 128 (the LLM shapes) the row's first and last entry are tested first: the
      // estimators list only visible blocks, so the whole row usually lies inside, and two loads
      // replace ~2·log2(cnt) dependent ones at the start of every CTA (~18 at 128K). Not at the
      // other head dims: the same lines changed the d 80 kernel's whole schedule.
      const auto [a, b] = [&]() -> std::pair<int, int> {
        if constexpr (D == 128) {
          const int lo_blk = int(range.lo) / B, hi_blk = (int(range.hi) + B - 1) / B;
          const bool inside = cnt == 0 || (cols[0] >= lo_blk && cols[cnt - 1] < hi_blk);
          return {inside ? 0 : lower_bound_i32(cols, cnt, lo_blk), inside ? cnt : lower_bound_i32(cols, cnt, hi_blk)};
        } else {
          return {lower_bound_i32(cols, cnt, int(range.lo) / B), lower_bound_i32(cols, cnt, (int(range.hi) + B - 1) / B)};
        }
      }();
      if (a < b) {
        const int front = t_lo - cols[a] * per, back = cols[b - 1] * per + per - t_hi;
        tiles.cols = cols + a;
        tiles.per = per;
        tiles.block = B;
        tiles.first = front > 0 ? front : 0;
        tiles.n = (b - a) * per - tiles.first - (back > 0 ? back : 0);
      }
    } else {
      tiles.first = t_lo;
      tiles.n = t_hi - t_lo;
    }
  }

  if (tid == 0) {
    // Full barriers: one arrival per producer thread (cp.async completion, or thread 0's
    // arrive.expect_tx and the others' plain arrivals) plus, for TMA tiles, the transaction bytes.
    wg::mbar_init(q_full, 128);
    for (int i = 0; i < STAGES; ++i) {
      wg::mbar_init(k_full(i), 128);
      wg::mbar_init(v_full(i), 128);
      wg::mbar_init(empty(i), 256);   // one arrival per consumer thread
    }
  }
  __syncthreads();

  if (tid < 128) {
    // ================= producer warpgroup =================
    wg::setmaxnreg_dec<40>();
    // One 128-row tile (rows first_row.. of one head) into dst, completing on `bar`. A full tile
    // with tensor maps: thread 0 expects its bytes and issues R TMA boxes, the others arrive. A
    // tile with rows past the sequence's end (or no maps): cp.async by all threads, those rows
    // zero-filled. TMA would fill them with the next sequence's rows (or zeros past the tensor):
    // masked scores either way, but a non-finite V there would turn P = 0 into NaN.
    auto load = [&](T* dst, const CUtensorMap* map, const T* head, int64_t stride, int64_t first_row, int head_idx,
                    int64_t valid, uint32_t bar) {
      if (maps.enabled && valid >= 128) {
        if (tid == 0) {
          wg::mbar_arrive_expect_tx(bar, uint32_t(128 * D * sizeof(T)));
#pragma unroll
          for (int j = 0; j < R; ++j)
            wg::tma_load_3d(smem_addr(dst + j * 128 * (W / 2)), map, j * (W / 2), int(first_row), head_idx, bar);
        } else {
          wg::mbar_arrive(bar);
        }
        return;
      }
      const T* src = head + first_row * stride;
      // Consecutive threads take consecutive chunks of a row: coalesced global reads.
#pragma unroll 4
      for (int i = tid; i < 128 * C; i += 128) {
        const int r = i / C, ch = i % C;
        const bool ok = r < valid;
        cp_async16(smem_addr(dst + swz_off<W>(r, ch)), src + (ok ? r * int(stride) + ch * 8 : 0), ok);
      }
      wg::mbar_arrive_cp_async(bar);
    };
    const T* qg = static_cast<const T*>(p.q) + h * p.q_head;
    const T* kg = static_cast<const T*>(p.k) + kvh * p.k_head;
    const T* vg = static_cast<const T*>(p.v) + kvh * p.v_head;
    load(Qs, &maps.q, qg, p.q_tok, e.q0 + q_lo, h, q_hi - q_lo, q_full);
    for (int it = 0; it < tiles.n; ++it) {
      const int st = it % STAGES;
      const int k_lo = tiles.k_lo(it);  // read before the wait: a CSR entry, off the critical path
      // The stage's previous tile (it - STAGES) must be released by both consumers.
      if (it >= STAGES) wg::mbar_wait(empty(st), ((it / STAGES) - 1) & 1);
      load(Ks + st * S::kv_elems, &maps.k, kg, p.k_tok, e.k0 + k_lo, kvh, e.lk - k_lo, k_full(st));
      load(Vs + st * S::kv_elems, &maps.v, vg, p.v_tok, e.k0 + k_lo, kvh, e.lk - k_lo, v_full(st));
    }
    wg::cp_async_wait_all();
    return;
  }

  // ================= consumer warpgroups =================
  wg::setmaxnreg_inc<232>();
  const int cw = tid / 128 - 1;           // consumer warpgroup: query rows 64·cw .. 64·cw + 63
  const int lane = tid % 32, warp = (tid % 128) / 32;
  const int g = lane / 4, tq = lane % 4;  // accumulator row group and column pair
  const int row0 = 64 * cw + 16 * warp;   // this warp's first row in the tile; rows g, g + 8

  int row_lo[2], row_hi[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t iq = q_lo + row0 + g + 8 * r;
    const KeyRange kr = pat.key_range(e, iq, iq + 1);
    row_lo[r] = int(kr.lo);
    row_hi[r] = int(kr.hi);
  }
  // Tiles inside [full_lo, full_hi) need no element mask (see attention_fwd_kernel).
  const int full_lo = int(pat.key_range(e, q_hi - 1, q_hi).lo);
  const int full_hi = int(pat.key_range(e, q_lo, q_lo + 1).hi);
  const float sink_log2 = p.sink_kind != kSinkNone ? p.sink[h] * 1.4426950408889634f : 0.f;
  const float sink_raw = sink_log2 / p.scale_log2;

  float acc[NO];
#pragma unroll
  for (int i = 0; i < NO; ++i) acc[i] = 0.f;
  float m_row[2] = {-INFINITY, -INFINITY}, l_row[2] = {0.f, 0.f};

  // Descriptor steps (bytes): 8 rows of W bytes (kAtom8), one region of 128 rows (kRegion).
  constexpr uint32_t kAtom8 = 8 * W, kRegion = 128 * W;
  const uint32_t q_base = smem_addr(Qs) + uint32_t(cw) * 64 * W;
  wg::mbar_wait(q_full, 0);

  float sc[NS];              // scores, then probabilities, of the current key tile
  uint32_t pa[BN / 16][4];   // P packed to 16 bits: the A fragments of O += P·V
  float alpha[2];            // per-row rescale of O from the last softmax

  // S = Q·Kᵀ of key tile `it` (64 rows x 128 keys, D/16 k-steps): issued and committed, not waited.
  auto issue_s = [&](int it) {
    const int st = it % STAGES;
    wg::mbar_wait(k_full(st), uint32_t(it / STAGES) & 1);
    wg::fence_proxy_async();  // cp.async tiles arrived through the generic proxy; wgmma reads async
    const uint32_t k_base = smem_addr(Ks + st * S::kv_elems);
    wg::pin(sc);
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      // k-step ks: 32 bytes of each row, in region ks·32 / W at byte ks·32 % W of the row.
      const uint32_t off = (ks * 32 / W) * kRegion + (ks * 32) % W;
      wg::Mma<E, BN>::ss(sc, wg::desc_swizzled<W>(q_base + off, 16, kAtom8),
                         wg::desc_swizzled<W>(k_base + off, 16, kAtom8), ks > 0);
    }
    wg::commit();
    wg::pin(sc);
  };
  // O += P·V of key tile `it`, P from registers (accumulator layout = A fragment layout), V read
  // transposed (MN-major): issued and committed, not waited.
  auto issue_pv = [&](int it) {
    const int st = it % STAGES;
    wg::mbar_wait(v_full(st), uint32_t(it / STAGES) & 1);
    wg::fence_proxy_async();
    const uint32_t v_base = smem_addr(Vs + st * S::kv_elems);
    wg::pin(acc);
    wg::fence();
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk)
      wg::Mma<E, D>::rs(acc, pa[kk], wg::desc_swizzled<W>(v_base + kk * 16 * W, kRegion, kAtom8));
    wg::commit();
    wg::pin(acc);
  };
  // Mask (boundary tiles only) and online softmax of sc in place, for the tile at key k_cur;
  // scores in base 2, the scale folded into the FFMA. Leaves O's rescale factors in alpha.
  auto softmax = [&](int k_cur) {
    const bool key0 = p.sink_kind == kSinkKey0 && k_cur == 0;
    if (key0 || k_cur < full_lo || k_cur + BN > full_hi) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int lo = row_lo[r] - k_cur, hi = row_hi[r] - k_cur;
#pragma unroll
        for (int n8 = 0; n8 < BN / 8; ++n8)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int col = n8 * 8 + 2 * tq + c;
            float& x = sc[4 * n8 + 2 * r + c];
            if (col < lo || col >= hi) x = -INFINITY;
            else if (key0 && col == 0) x += sink_raw;
          }
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int n8 = 0; n8 < BN / 8; ++n8) mx = fmax_nan(mx, fmax_nan(sc[4 * n8 + 2 * r], sc[4 * n8 + 2 * r + 1]));
      mx = quad_max(mx);
      mx = fmax_nan(m_row[r], mx * p.scale_log2);
      const float base = mx == -INFINITY ? 0.f : mx;  // a row with no key yet: exp2(-inf) = 0, no NaN
      alpha[r] = ex2(m_row[r] - base);
      m_row[r] = mx;
      float sum = 0.f;
#pragma unroll
      for (int n8 = 0; n8 < BN / 8; ++n8)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          float& x = sc[4 * n8 + 2 * r + c];
          x = ex2(fmaf(x, p.scale_log2, -base));
          sum += x;
        }
      l_row[r] = l_row[r] * alpha[r] + sum;
    }
  };
  auto rescale_and_pack = [&]() {
#pragma unroll
    for (int n8 = 0; n8 < D / 8; ++n8)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        acc[4 * n8 + 2 * r] *= alpha[r];
        acc[4 * n8 + 2 * r + 1] *= alpha[r];
      }
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      pa[kk][0] = E::pack(sc[8 * kk + 0], sc[8 * kk + 1]);
      pa[kk][1] = E::pack(sc[8 * kk + 2], sc[8 * kk + 3]);
      pa[kk][2] = E::pack(sc[8 * kk + 4], sc[8 * kk + 5]);
      pa[kk][3] = E::pack(sc[8 * kk + 6], sc[8 * kk + 7]);
    }
  };

  const int n = tiles.n;
  // Ping-pong between the two consumers (maps.pingpong): each takes turns issuing its products,
  // through named barriers 1 (consumer 0's turn) and 2 (consumer 1's), so the tensor cores run
  // one consumer's products while the other computes its softmax. Both consumers pass the same
  // n + 1 issue points; consumer 1 opens with consumer 0's turn and does not pass its last.
  const bool pp = maps.pingpong != 0 && n > 0;
  auto my_turn = [&]() {
    if (pp) wg::named_bar_sync(1 + cw, 256);
  };
  auto pass_turn = [&](bool last) {
    if (pp && !(last && cw == 1)) wg::named_bar_arrive(2 - cw, 256);
  };
  if (pp && cw == 1) wg::named_bar_arrive(1, 256);
  // Software pipelining inside the warpgroup (FlashAttention-3's): S(it) and P·V(it - 1) are in
  // flight together, and the softmax of tile it runs while P·V(it - 1) finishes.
  if (n > 0) {
    my_turn();
    issue_s(0);
    pass_turn(false);
    wg::wait<0>();
    wg::pin(sc);
    softmax(tiles.k_lo(0));
    rescale_and_pack();
    for (int it = 1; it < n; ++it) {
      const int k_cur = tiles.k_lo(it);  // issued before the wait, so its latency hides under S
      my_turn();
      issue_s(it);
      issue_pv(it - 1);
      pass_turn(false);
      wg::wait<1>();  // groups complete in order: S(it) is done, P·V(it - 1) may still run
      wg::pin(sc);
      softmax(k_cur);
      wg::wait<0>();
      wg::pin(acc);
      wg::mbar_arrive(empty((it - 1) % STAGES));  // this thread's reads of that stage are complete
      rescale_and_pack();
    }
    my_turn();
    issue_pv(n - 1);
    pass_turn(true);
    wg::wait<0>();
    wg::pin(acc);
    wg::mbar_arrive(empty((n - 1) % STAGES));
  }

  // Row r's (of g, g + 8) final max m and sum l across the quad, the sink folded in (Z = exp(sink)
  // + Σ exp(s): one more key with no value, so O's row is rescaled), and its LSE; both epilogues.
  auto finish_row = [&](int r, float& m, float& l) {
    l = quad_sum(l_row[r]);
    m = m_row[r];
    fold_sink_row<D / 8>(p.sink_kind, sink_log2, m, l, [&](int n8, int x) -> float& { return acc[4 * n8 + 2 * r + x]; });
  };

  if constexpr (OT) {
    // ---- epilogue (rows inside the sequence): O through the Q buffer and the copy engine ----
    // This consumer's S products, the only readers of its 64 Q rows, completed before its last
    // softmax, so those rows are free; the other consumer reads only its own.
    const int64_t my_lo = q_lo + 64 * cw;
    if (maps.out_tma != 0 && !p.out_f32 && my_lo + 64 <= e.lq) {
      const uint32_t stage = smem_addr(Qs) + uint32_t(cw) * 64 * W;  // rows 64·cw.. of each region
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float m, l;
        finish_row(r, m, l);
        const float inv = row_has_mass(l) ? 1.f / l : 0.f;  // no key and no sink: out = 0
        const int row = 16 * warp + g + 8 * r;              // of this consumer's 64
        // The swizzle TMA applies (the layout of swz_off): 16-byte piece j of a region's row at
        // j ^ (address bits 7.. of the row), i.e. j ^ (row mod 8) under the 128-byte swizzle (d 128:
        // columns 0-63 and 64-127 in regions 0 and 1), j ^ bit 2 of the row under the 32-byte one
        // (d 80: five regions of 16 columns).
        constexpr int kPieces = W / 16;
#pragma unroll
        for (int n8 = 0; n8 < D / 8; ++n8) {
          const uint32_t val = E::pack(acc[4 * n8 + 2 * r] * inv, acc[4 * n8 + 2 * r + 1] * inv);
          const int piece = (n8 % kPieces) ^ ((row * W >> 7) & (kPieces - 1));
          const uint32_t at = uint32_t((n8 / kPieces) * 128 * W + row * W + (piece << 4) + 4 * tq);
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(stage + at), "r"(val) : "memory");
        }
        if (p.lse != nullptr && tq == 0) p.lse[int64_t(h) * p.total_q + e.q0 + my_lo + row] = row_lse(m, l);
      }
      wg::fence_proxy_async();  // this thread's writes, before the copy engine reads them
      wg::named_bar_sync(3 + cw, 128);
      if (tid % 128 == 0) {
#pragma unroll
        for (int j = 0; j < R; ++j) wg::tma_store_3d(&maps.o, stage + uint32_t(j * 128 * W), j * (W / 2), int(e.q0 + my_lo), h);
        wg::bulk_commit();
        wg::bulk_wait_read_all();  // the shared memory must outlive the copy's reads
      }
      return;
    }
  }

  // ---- epilogue: normalize, sink, LSE; straight to global memory ----
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t iq = q_lo + row0 + g + 8 * r;
    float m, l;
    finish_row(r, m, l);
    if (iq >= e.lq) continue;
    const float inv = row_has_mass(l) ? 1.f / l : 0.f;  // no key and no sink: out = 0
    const int64_t orow = (e.q0 + iq) * p.o_tok + h * p.o_head;
#pragma unroll
    for (int n8 = 0; n8 < D / 8; ++n8) {
      const float o0 = acc[4 * n8 + 2 * r] * inv, o1 = acc[4 * n8 + 2 * r + 1] * inv;
      const int col = n8 * 8 + 2 * tq;
      if (p.out_f32)
        *reinterpret_cast<float2*>(static_cast<float*>(p.out) + orow + col) = make_float2(o0, o1);
      else
        *reinterpret_cast<uint32_t*>(static_cast<T*>(p.out) + orow + col) = E::pack(o0, o1);
    }
    if (p.lse != nullptr && tq == 0) p.lse[int64_t(h) * p.total_q + e.q0 + iq] = row_lse(m, l);
  }
}

// kOrderAuto (WgMaps::order) launches heads fastest for rows whose work grows along the
// sequence (causal, or any bounded right side without a left bound; dense or block-sparse) when
// the grid is at most this many waves. Measured on the H200: Llama 32/8 heads, d 128, causal 8K (15.5 waves) 1.009 -> 0.901 ms heads fastest, the
// longest-first order evening the last waves; SmolLM2's 8K prefill (9/3 heads, d 64, 4.4 waves)
// dense 6.66 -> 5.84 ms, RR's block-sparse 4.86 -> 3.38 ms over 30 layers; at 32K (62 waves) and
// 128K the tile-major order's L2 reuse (the CTAs in flight stream one KV head's keys together)
// wins: causal 14.54 vs 14.85, 229.8 vs 241.6; block-sparse 10-18% faster tile-major.
constexpr int kHeadsFastestWaves = 32;

// Grid: (query tiles, heads_q), the varlen cover of attention_fwd_kernel, or its transpose
// (WgMaps::order). Returns the launch error.
template <int D, class E>
cudaError_t launch_wgmma(const FwdParams& p, const WgMaps& maps, cudaStream_t stream) {
  using S = WgShape<D>;
  // With the output's map (d 80 and 128; wgmma_maps builds none at d 64) the OT instantiation; at
  // d 128 both names are the one kernel, at d 64 the other.
  constexpr auto plain = attention_wgmma_kernel<D, E, D == 128>, with_out = attention_wgmma_kernel<D, E, D != 64>;
  const auto kernel = maps.out_tma != 0 ? with_out : plain;
  static const cudaError_t configured = allow_dynamic_smem({plain, with_out}, S::smem_bytes);
  if (configured != cudaSuccess) return configured;
  const int64_t tiles = p.pattern.cu_seqlens_q != nullptr ? p.pattern.num_seqs + p.total_q / S::BM + 1
                                                          : (p.total_q + S::BM - 1) / S::BM;
  WgMaps m = maps;
  if (m.order == kOrderAuto) {
    static const int slots = resident_cta_slots(kernel, S::threads, S::smem_bytes);
    const Pattern& pat = p.pattern;
    const bool growing = pat.window_left == kUnbounded && pat.window_right != kUnbounded;
    const bool few_waves = slots > 0 && tiles * p.heads_q <= int64_t(kHeadsFastestWaves) * slots;
    m.order = growing && few_waves ? kOrderHeadsFastest : kOrderTileMajor;
  }
  if (m.order == kOrderHeadsFastest && tiles > 65535) m.order = kOrderTileMajor;  // gridDim.y's limit
  const dim3 grid = m.order == kOrderHeadsFastest ? dim3(unsigned(p.heads_q), unsigned(tiles))
                                                  : dim3(unsigned(tiles), unsigned(p.heads_q));
  kernel<<<grid, S::threads, S::smem_bytes, stream>>>(p, m);
  return cudaGetLastError();
}

#define ARIADNE_WGMMA_KERNELS(X, D) X(launch_wgmma<D, Bf16>) X(launch_wgmma<D, F16>)
#define ARIADNE_WGMMA_INSTANTIATE_ONE(...) \
  template cudaError_t __VA_ARGS__(const FwdParams&, const WgMaps&, cudaStream_t);
#define ARIADNE_WGMMA_DECLARE_ONE(...) \
  extern template cudaError_t __VA_ARGS__(const FwdParams&, const WgMaps&, cudaStream_t);
#define ARIADNE_INSTANTIATE_WGMMA(D) ARIADNE_WGMMA_KERNELS(ARIADNE_WGMMA_INSTANTIATE_ONE, D)
ARIADNE_WGMMA_KERNELS(ARIADNE_WGMMA_DECLARE_ONE, 64)
ARIADNE_WGMMA_KERNELS(ARIADNE_WGMMA_DECLARE_ONE, 80)
ARIADNE_WGMMA_KERNELS(ARIADNE_WGMMA_DECLARE_ONE, 128)

}  // namespace ariadne::cuda
