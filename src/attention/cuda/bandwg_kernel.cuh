// Internal: the wgmma band kernel itself: the copy-engine producer, the three consumers (S, masks,
// softmax, P·V) and the epilogues (attention_bandwg.cuh).
#pragma once

#include "attention/cuda/bandwg_producer.cuh"

namespace ariadne::cuda {

// The exponentials, masks and maxima of 16-key column pairs that none of a warp's 16 rows sees are
// skipped (their probabilities are exactly 0), and full tiles (and a tensor's last, partial tile)
// leave through a shared-memory staging tile and two TMA stores instead of 20 scattered stores per
// thread.
// BC: a block_col order whose tiles the copy engine loads and stores through 5-D maps
// (BandWgMaps::units_h); a separate instantiation, so that the storage order's code is the same
// as without it.
// CH: a chunked call's kernel, whose tiles with a one-chunk hull (a 64-row
// tile of 64-aligned chunks of 64: Qwen's windows) take a one-chunk pass instead of the 3-chunk
// pass with two masked chunks; a separate instantiation, so the window kernels' code is unchanged.
template <int D, class E, bool BC = false, bool CH = false>
__global__ void __launch_bounds__(BandWgShape<D>::threads, 1)
    attention_bandwg_kernel(const FwdParams p, const int run, const __grid_constant__ BandWgMaps maps) {
  static_assert(D == 80, "the tile layout splits the head dim as 64 + 16");
  // The tile layout: columns 0-63 of the 64 rows in 128-byte rows with the 128-byte swizzle (8 KB,
  // as the copy engine writes it and wgmma reads it), then columns 64-79 in 32-byte rows with the
  // 32-byte swizzle (2 KB). Each copy is then two boxes of 128- and 32-byte rows, instead of ten of
  // 16-byte rows in the no-swizzle layout (whose small rows held the copy engine to ~2 TB/s).
  constexpr uint32_t kLoBytes = 64 * 128;
  using S = BandWgShape<D>;
  constexpr int BM = S::BM, CK = S::CK, NSLOT = S::NSLOT, QSLOT = S::QSLOT, NCONS = S::NCONS;
  using T = typename E::type;

  extern __shared__ __align__(1024) unsigned char bandwg_smem[];  // the copy engine's boxes: 128-byte aligned
  T* Qs = reinterpret_cast<T*>(bandwg_smem);  // QSLOT tiles
  T* Ks = Qs + QSLOT * S::tile_elems;       // NSLOT chunks
  T* Vs = Ks + NSLOT * S::tile_elems;       // NSLOT chunks
  const uint32_t bars = smem_addr(bandwg_smem + S::bar_offset);
  auto full = [&](int s) { return bars + 8 * s; };
  auto empty = [&](int s) { return bars + 8 * (NSLOT + s); };
  auto q_full = [&](int s) { return bars + 8 * (2 * NSLOT + s); };
  auto q_empty = [&](int s) { return bars + 8 * (2 * NSLOT + QSLOT + s); };

  const Pattern& pat = p.pattern;
  const int tid = threadIdx.x;
  const int h = blockIdx.y, kvh = h / p.group;

  const bool varlen = pat.cu_seqlens_q != nullptr;
  const int64_t n_virtual = varlen ? pat.num_seqs + p.total_q / BM + 1 : (p.total_q + BM - 1) / BM;
  const int64_t first = int64_t(blockIdx.x) * run;
  const int64_t last = first + run < n_virtual ? first + run : n_virtual;
  BandWgDesc* descs = reinterpret_cast<BandWgDesc*>(bandwg_smem + S::desc_offset);
  int32_t* rows = reinterpret_cast<int32_t*>(bandwg_smem + S::rows_offset);  // ordered calls

  // With a token order the producer warpgroup gathers rows with cp.async (see the ordered
  // producer below), and every one of its 128 threads arrives on the full barriers; unless the
  // order is a block_col walk the copy engine can follow (BandWgMaps::units_h).
  const bool ordered = p.order != nullptr;
  const bool gather = ordered && !BC;
  if (tid == 0) {
    // The producer's arrival with the expected bytes (TMA), or one cp.async arrival per producer
    // thread (gather); q_full also takes thread 0's plain arrival after the tile's descriptor.
    const uint32_t fills = gather ? 128u : 1u;
    for (int i = 0; i < NSLOT; ++i) {
      wg::mbar_init(full(i), fills);
      wg::mbar_init(empty(i), 128 * NCONS);  // one arrival per consumer thread
    }
    for (int i = 0; i < QSLOT; ++i) {
      wg::mbar_init(q_full(i), gather ? fills + 64 : fills);
      wg::mbar_init(q_empty(i), 128);  // the tile's own consumer
    }
    wg::fence_proxy_async();  // the initialized barriers before the copy engine's first use
  }
  __syncthreads();

  if (tid < 128) {
    // ================= producer warpgroup =================
    wg::setmaxnreg_dec<S::kProducerRegs>();
    if (gather) {
      bandwg_gather_producer<D, E>(p, first, last, descs, rows, Qs, Ks, Vs, bars);
      return;
    }
    if (tid != 0) return;  // one thread issues every copy: the copy engine does the rest
    // 64 rows from packed row `row0` of one head into the tile layout (see kLoBytes): two boxes.
    // Rows past the tensor's end are zero-filled; rows past a sequence's end hold that tensor's next
    // rows, which no allowed (query, key) pair reads (masked scores are exactly 0 after the softmax).
    // Ordered (block_col, BandWgMaps::units_h): `row0` is logical; its tile is the 16 merge units
    // from unit row (row0 / 4) % units_h of unit column (row0 / 4) / units_h, rows in order.
    // The caller arms `bar` with the bytes of every tile that completes on it (one arrival).
    auto load = [&](T* dst, const CUtensorMap& lo, const CUtensorMap& hi, int head, int row0, uint32_t bar) {
      const uint32_t d = smem_addr(dst);
      if constexpr (BC) {
        const bandwg::BlockColBox box = bandwg::block_col_box(row0, maps.units_h);
        wg::tma_load_5d(d, &lo, 0, head, 0, box.uc, box.ur, bar);
        wg::tma_load_5d(d + kLoBytes, &hi, 64, head, 0, box.uc, box.ur, bar);
        return;
      }
      wg::tma_load_3d(d, &lo, 0, head, row0, bar);
      wg::tma_load_3d(d + kLoBytes, &hi, 64, head, row0, bar);
    };
    BandWgWalk<BM, CK> walk(pat, first, last, p.total_q, p.total_k);
    int i = 0;
    BandWgTile b = walk.next();
    for (; b.valid; ++i) {
      const BandWgTile nb = walk.next();  // one ahead: its first ring number bounds b's releases
      const int qs = i % QSLOT;
      if (i >= QSLOT) wg::mbar_wait(q_empty(qs), uint32_t((i / QSLOT) - 1) & 1);
      // Written before the arrival on q_full(qs), which releases it to the consumer.
      descs[qs] = BandWgDesc{int(b.e.q0), b.q_lo, b.q_hi, int(b.e.lk - b.e.lq), int(b.e.lk), b.c_lo, b.nc, b.n_lo,
                             nb.valid ? nb.n_lo : -1, 1};
      wg::mbar_arrive_expect_tx(q_full(qs), S::tile_elems * 2);
      load(Qs + qs * S::tile_elems, maps.q_lo, maps.q_hi, h, int(b.e.q0) + b.q_lo, q_full(qs));
      for (int x = b.ld_lo; x < b.ld_hi; ++x) {
        const int n = b.n_lo + (x - b.c_lo), st = n % NSLOT;  // walk.ring(x) may have moved on
        if (n >= NSLOT) wg::mbar_wait(empty(st), uint32_t((n / NSLOT) - 1) & 1);
        // K and V of the chunk complete on one barrier (one arrival, both tiles' bytes).
        wg::mbar_arrive_expect_tx(full(st), 2 * S::tile_elems * 2);
        load(Ks + st * S::tile_elems, maps.k_lo, maps.k_hi, kvh, int(b.e.k0) + x * CK, full(st));
        load(Vs + st * S::tile_elems, maps.v_lo, maps.v_hi, kvh, int(b.e.k0) + x * CK, full(st));
      }
      b = nb;
    }
    // One end marker per consumer, in the next NCONS Q slots.
    for (int j = i; j < i + NCONS; ++j) {
      const int qs = j % QSLOT;
      if (j >= QSLOT) wg::mbar_wait(q_empty(qs), uint32_t((j / QSLOT) - 1) & 1);
      descs[qs].valid = 0;
      wg::mbar_arrive(q_full(qs));
    }
    return;
  }

  // ================= consumer warpgroups =================
  wg::setmaxnreg_inc<S::kConsumerRegs>();
  // This consumer takes the walk's tiles i with i % NCONS == cw. The shuffle makes cw warp-uniform in
  // the compiler's eyes, so the loops it steers are no divergent path for the wgmma instructions.
  const int cw = __shfl_sync(0xffffffffu, tid / 128, 0) - 1;
  const int lane = tid % 32, warp = (tid % 128) / 32;
  const int g = lane / 4, tq = lane % 4;  // accumulator row group and column pair
  const float sink_log2 = p.sink_kind != kSinkNone ? p.sink[h] * 1.4426950408889634f : 0.f;
  const float sink_raw = sink_log2 / p.scale_log2;  // the key0 bias in unscaled score units
  const bool key0 = p.sink_kind == kSinkKey0;

  constexpr uint32_t kTileBytes = S::tile_elems * 2;
  const uint32_t qs_addr = smem_addr(Qs), ks_addr = smem_addr(Ks), vs_addr = smem_addr(Vs);

  int waited = 0;    // chunks [0, waited) have been waited on
  int released = 0;  // chunks [0, released) have been released by this consumer
  // Waits on the full barriers of chunks [waited, n) in ring order (see the ring protocol).
  auto wait_chunks = [&](int n) {
    for (; waited < n; ++waited) {
      const int st = waited % NSLOT;
      const uint32_t par = uint32_t(waited / NSLOT) & 1;
      wg::mbar_wait(full(st), par);
    }
  };

  BandRule rule(pat, SeqExtent{});  // the window; each tile sets its sequence's offset and length
  for (int i = cw;; i += NCONS) {
    // ---- tile i of the walk: rows 16·warp + g + 8r of the tile ----
    const int qs = i % QSLOT;
    wg::mbar_wait(q_full(qs), uint32_t(i / QSLOT) & 1);
    const BandWgDesc cur = descs[qs];  // read before q_empty releases the slot
    if (!cur.valid) {
      // The CTA's shared memory must outlive the copy engine's last store from it; with rows
      // copied per lane, every lane 0 of a quad may hold bulk groups.
      if (tid % 128 == 0 || (maps.out_rows != 0 && tq == 0)) bandwg::bulk_wait_all();
      break;
    }
    {
      // Every chunk below this tile's first is dead for this consumer (its later tiles start at or
      // above it): release those now, not only after the tile (see the ring protocol), and before
      // waiting for this tile's chunks, whose loads may wait for these releases.
      wait_chunks(cur.n_lo);
      for (; released < cur.n_lo; ++released) wg::mbar_arrive(empty(released % NSLOT));
    }
    wait_chunks(cur.n_lo + cur.nc);
    // Gathered tiles were written by cp.async (the generic proxy); wgmma reads through the
    // async proxy (as the wgmma kernel's cp.async tiles, attention_wgmma.cuh).
    if (gather) wg::fence_proxy_async();
    rule.off = cur.off;
    rule.lk = cur.lk;
    int row_lo[2], row_hi[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      // Rows past the tile's end take its last row's bounds: computed, never stored.
      const int iq = cur.q_lo + 16 * warp + g + 8 * r;
      rule.bounds(iq < cur.q_hi ? iq : cur.q_hi - 1, row_lo[r], row_hi[r]);
    }
    // Keys [w_lo, w_hi) hold all this warp's rows see: lo of its first row (lane 0, r 0), hi of its
    // last (lane 28, r 1). The shuffles also make them warp-uniform for the compiler.
    int w_lo = 0, w_hi = 0;
    {
      w_lo = __shfl_sync(0xffffffffu, row_lo[0], 0);
      w_hi = __shfl_sync(0xffffffffu, row_hi[1], 28);
    }
    // Chunks inside [lo of the last row, hi of the first row) need no element mask.
    int full_lo, full_hi, unused;
    rule.bounds(cur.q_hi - 1, full_lo, unused);
    rule.bounds(cur.q_lo, unused, full_hi);
    const uint32_t q_base = qs_addr + qs * kTileBytes;
    const int nc = cur.nc, kb0 = cur.c_lo * CK, n_lo = cur.n_lo;

    float acc_lo[32], acc_hi[8];  // O columns 0-63 and 64-79 (V's two layout regions)
    auto acc = [&](int n8, int k) -> float& { return n8 < 8 ? acc_lo[4 * n8 + k] : acc_hi[4 * (n8 - 8) + k]; };
    float m_row[2], l_row[2];
    // S, masks, softmax and O = P·V over NCH chunks of the hull from chunk C0 on, each wgmma
    // unconditional (a wgmma under a run-time condition is serialized by ptxas). Chunks past nc
    // (NCH = 3 or 4 > nc) recompute chunk 0 and are masked to probability 0. A pass with C0 > 0
    // (the second pass over a 4-chunk hull) continues the first as an online softmax: the
    // row maxima grow, the first pass's sums and O are rescaled. LAST: the pass that ends the
    // tile's reads of Q.
    auto compute = [&](auto nch_tag, auto c0_tag, auto last_tag) {
      constexpr int NCH = decltype(nch_tag)::value, C0 = decltype(c0_tag)::value;
      constexpr bool LAST = decltype(last_tag)::value != 0;
      uint32_t slot[NCH];
#pragma unroll
      for (int c = 0; c < NCH; ++c) slot[c] = uint32_t((n_lo + (C0 + c < nc ? C0 + c : 0)) % NSLOT) * kTileBytes;
      float sc[NCH][32];
      uint32_t pa[NCH][4][4];  // P packed to 16 bits: the A fragments of P·V, per 16-key k-step
      float alpha[2] = {1.f, 1.f};  // C0 > 0: the factor of the earlier pass's O and sums, per row
      // S of chunk c = Q·Kᵀ (64 x 64, D/16 k-steps).
      // (Each region's descriptor is built once per chunk, the k-steps added: wg::desc_at.)
      auto issue_s = [&](int c) {
        const wg::DescWords q_lo = wg::desc_words<128>(q_base, 16, 1024), k_lo = wg::desc_words<128>(ks_addr + slot[c], 16, 1024);
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks)
          if (ks < 4)  // k-step ks: bytes [32·ks, 32·ks + 32) of each 128-byte row
            wg::Mma<E, 64>::ss(sc[c], wg::desc_at(q_lo, ks * 32), wg::desc_at(k_lo, ks * 32), ks > 0);
          else
            wg::Mma<E, 64>::ss(sc[c], wg::desc_swizzled<32>(q_base + kLoBytes, 16, 256),
                               wg::desc_swizzled<32>(ks_addr + slot[c] + kLoBytes, 16, 256), 1);
      };
      // O += P·V of chunk c: P from registers, V read transposed.
      auto issue_pv = [&](int c) {
        const wg::DescWords v_lo = wg::desc_words<128>(vs_addr + slot[c], kLoBytes, 1024),
                            v_hi = wg::desc_words<32>(vs_addr + slot[c] + kLoBytes, kLoBytes, 256);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {  // keys 16·kk.. : two 8-row groups of each region
          wg::Mma<E, 64>::rs(acc_lo, pa[c][kk], wg::desc_at(v_lo, kk * 2048));
          wg::Mma<E, 16>::rs(acc_hi, pa[c][kk], wg::desc_at(v_hi, kk * 512));
        }
      };
      // Before the first P·V: O zeroed, or (a later pass) the earlier pass's O rescaled.
      auto init_acc = [&]() {
        if constexpr (C0 == 0) {
#pragma unroll
          for (int x = 0; x < 32; ++x) acc_lo[x] = 0.f;
#pragma unroll
          for (int x = 0; x < 8; ++x) acc_hi[x] = 0.f;
        } else {
#pragma unroll
          for (int n8 = 0; n8 < D / 8; ++n8)
#pragma unroll
            for (int k = 0; k < 4; ++k) acc(n8, k) *= alpha[k / 2];
        }
      };

      // 16-key pairs of 8-column blocks (one k-step of P·V) that no row of this warp sees are
      // skipped: no mask, no max, no exponential, P = 0 exactly (what the masked exponentials
      // gave). [w_lo, w_hi) holds every key the warp's rows see (the bounds grow with the row: no
      // chunk here), and chunks past nc hold none. Live pairs get their masks, maxima and sums in key
      // order, so the results are those of computing every pair.
      const int live_hi = w_hi - kb0 < nc * CK ? w_hi - kb0 : nc * CK, live_lo = w_lo - kb0 - 16;
      // The block_col kernel (BC) runs every pair through the masks instead: no
      // per-pair branch. A pair no row of the warp sees lies in an edge chunk (or past nc), whose
      // per-element masks set it to -inf: P exactly 0, exact zeros in the sums, the same results.
      auto live = [&](int c, int kk) {
        if constexpr (BC) return true;
        const int at = (C0 + c) * CK + 16 * kk;
        return at < live_hi && at > live_lo;
      };
      float mx2[2][2] = {{-INFINITY, -INFINITY}, {-INFINITY, -INFINITY}};
      float sum2[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
      float base[2];
      // Masks and maxima of chunk c's live pairs.
      auto mask_max = [&](int c) {
        const int kb = kb0 + (C0 + c) * CK;
        const bool edge = kb < full_lo || kb + CK > full_hi || (key0 && kb == 0);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          if (!live(c, kk)) continue;
          if (edge) {  // per element: col - lo < hi - lo
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              const int rel = row_lo[r] - kb - 2 * tq;
              const unsigned width = row_hi[r] > row_lo[r] ? unsigned(row_hi[r] - row_lo[r]) : 0u;
#pragma unroll
              for (int n8 = 2 * kk; n8 < 2 * kk + 2; ++n8)
#pragma unroll
                for (int x = 0; x < 2; ++x)
                  if (unsigned(n8 * 8 + x - rel) >= width) sc[c][4 * n8 + 2 * r + x] = -INFINITY;
            }
            if (kk == 0 && key0 && kb == 0 && tq == 0) {  // column 0: n8 0, x 0 of lane tq 0
#pragma unroll
              for (int r = 0; r < 2; ++r)  // only where allowed: a NaN bias must not reach a masked key
                if (row_lo[r] == 0 && row_hi[r] > 0) sc[c][2 * r] += sink_raw;
            }
          }
#pragma unroll
          for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int n8 = 2 * kk; n8 < 2 * kk + 2; ++n8)
              mx2[r][n8 & 1] = fmax_nan(mx2[r][n8 & 1], fmax_nan(sc[c][4 * n8 + 2 * r], sc[c][4 * n8 + 2 * r + 1]));
        }
      };
      // The rows' maxima over the quad (and, C0 > 0, over the earlier pass).
      auto row_max = [&]() {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float mx = quad_max(fmax_nan(mx2[r][0], mx2[r][1]));
          mx *= p.scale_log2;
          if constexpr (C0 > 0) {
            mx = fmax_nan(m_row[r], mx);
            alpha[r] = ex2(m_row[r] - (mx == -INFINITY ? 0.f : mx));  // 1 if the max stays, 0 from −inf
          }
          base[r] = mx == -INFINITY ? 0.f : mx;  // no allowed key: exp2(−inf − 0) = 0, not NaN
          m_row[r] = mx;
        }
      };
      // Exponentials, sums and packed P of chunk c.
      auto exp_pack = [&](int c) {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          if (!live(c, kk)) {
#pragma unroll
            for (int j = 0; j < 4; ++j) pa[c][kk][j] = 0u;  // E::pack(0, 0)
            continue;
          }
#pragma unroll
          for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int n8 = 2 * kk; n8 < 2 * kk + 2; ++n8) {
#pragma unroll
              for (int x = 0; x < 2; ++x) {
                float& v = sc[c][4 * n8 + 2 * r + x];
                v = ex2(fmaf(v, p.scale_log2, -base[r]));
              }
              sum2[r][n8 & 1] += sc[c][4 * n8 + 2 * r] + sc[c][4 * n8 + 2 * r + 1];
            }
#pragma unroll
          for (int j = 0; j < 4; ++j) pa[c][kk][j] = E::pack(sc[c][8 * kk + 2 * j], sc[c][8 * kk + 2 * j + 1]);
        }
      };
      auto row_sum = [&]() {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          if constexpr (C0 > 0)
            l_row[r] = l_row[r] * alpha[r] + (sum2[r][0] + sum2[r][1]);
          else
            l_row[r] = sum2[r][0] + sum2[r][1];
        }
      };

      {
        // Each chunk's S in its own commit group; its masks and maxima run while the
        // later chunks' S are in flight. Then P·V of all chunks but the last is issued once their
        // P is packed and runs under the last chunk's exponentials. (Issuing each chunk's P·V
        // right after its own exponentials would keep O, that P and the other chunks' S live at
        // once: ptxas serializes the wgmma for want of registers at 152, C7512.) Only registers of
        // completed groups are touched (the pins), and each P is fenced before its wgmma.
#pragma unroll
        for (int c = 0; c < NCH; ++c) wg::pin(sc[c]);
        wg::fence();
#pragma unroll
        for (int c = 0; c < NCH; ++c) {
          issue_s(c);
          wg::commit();
        }
#pragma unroll
        for (int c = 0; c < NCH; ++c) {
          static_assert(NCH <= 3, "wait depths 0-2");
          if (c == NCH - 1)
            wg::wait<0>();
          else if (c == NCH - 2)
            wg::wait<1>();
          else
            wg::wait<2>();
          wg::pin(sc[c]);
          mask_max(c);
        }
        if constexpr (LAST) wg::mbar_arrive(q_empty(qs));  // this thread's reads of the Q buffer are complete
        row_max();
#pragma unroll
        for (int c = 0; c < NCH - 1; ++c) exp_pack(c);
        init_acc();
        wg::pin(acc_lo);
        wg::pin(acc_hi);
        wg::fence();
#pragma unroll
        for (int c = 0; c < NCH - 1; ++c) issue_pv(c);
        exp_pack(NCH - 1);
        row_sum();
        wg::fence();  // the last chunk's P registers, written above, before the wgmma reads them
        issue_pv(NCH - 1);
      }
      wg::commit();
      wg::pin(acc_lo);
      wg::pin(acc_hi);
      wg::wait<0>();
      wg::pin(acc_lo);
      wg::pin(acc_hi);
    };
    if (nc == 0) {  // no row of the tile sees a key: nothing to multiply (the ring holds none)
#pragma unroll
      for (int x = 0; x < 32; ++x) acc_lo[x] = 0.f;
#pragma unroll
      for (int x = 0; x < 8; ++x) acc_hi[x] = 0.f;
      m_row[0] = m_row[1] = -INFINITY;
      l_row[0] = l_row[1] = 0.f;
      wg::mbar_arrive(q_empty(qs));
    } else if (CH && nc == 1) {
      if constexpr (CH) compute(IntTag<1>{}, IntTag<0>{}, IntTag<1>{});  // one 64-key chunk
    } else if (!CH && nc <= 3) {  // (the chunk kernel takes 2-4 chunks in the two passes below)
      compute(IntTag<3>{}, IntTag<0>{}, IntTag<1>{});  // a 64-row tile of an aligned ±64 window: 192 keys
    } else {
      // S of 4 chunks (128 registers) does not fit 152 next to the rest: two passes of 2.
      compute(IntTag<2>{}, IntTag<0>{}, IntTag<0>{});
      compute(IntTag<2>{}, IntTag<2>{}, IntTag<1>{});
    }
    // The next tile's first ring number bounds the chunks no later tile uses: release them.
    if (cur.next_n_lo >= 0) {
      wait_chunks(cur.next_n_lo);
      for (; released < cur.next_n_lo; ++released) wg::mbar_arrive(empty(released % NSLOT));
    }

    // Row r's final max m and sum l (summed over the quad), for both epilogues. A denominator sink
    // is one more key with no value, Z = exp(sink) + Σ exp(s): folded into m, l and the row's O.
    auto finish_row = [&](int r, float& m, float& l) {
      l = quad_sum(l_row[r]);
      m = m_row[r];
      fold_sink_row<D / 8>(p.sink_kind, sink_log2, m, l, [&](int n8, int x) -> float& { return acc(n8, 2 * r + x); });
    };

    // A tile whose 64 rows are all its sequence's, or whose rows past the end are past the
    // tensor's end too (the map's bounds clip them: they belong to nobody), leaves through this
    // consumer's staging tile (the tile layout of Q) and two TMA stores. Other tiles (a varlen
    // sequence's partial last tile, f32 out, or no map) store per thread.
    bool tma_tile = false;
    // A gathered order scatters rows (per thread or by row copies); block_col tiles are boxes of
    // their 5-D map, stored like the storage order's.
    tma_tile = maps.out_tma != 0 && !gather && (cur.q_hi - cur.q_lo == BM || int64_t(cur.q0) + cur.q_hi == p.total_q);
    if (tma_tile) {
      // ---- epilogue: normalize, sink, LSE; O through shared memory and the copy engine ----
      const uint32_t stage = smem_addr(bandwg_smem + S::stage_offset) + uint32_t(cw) * kTileBytes;
      // The previous TMA store from this staging tile must have finished reading it.
      if (tid % 128 == 0) bandwg::bulk_wait_read_all();
      wg::named_bar_sync(1 + cw, 128);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float m, l;
        finish_row(r, m, l);
        const int row = 16 * warp + g + 8 * r, iq = cur.q_lo + row;
        const float inv = row_has_mass(l) ? 1.f / l : 0.f;  // no key and no sink: out = 0
        // Rows past the tile's end are written to the staging tile too; the store clips them.
        // Swizzles as the copy engine applies them: 16-byte piece j of a 128-byte row at j ^ (row
        // mod 8); of a 32-byte row at j ^ (bit 2 of the row). Each warp's 32 stores hit 32 banks.
#pragma unroll
        for (int n8 = 0; n8 < D / 8; ++n8) {
          const uint32_t val = E::pack(acc(n8, 2 * r) * inv, acc(n8, 2 * r + 1) * inv);
          const uint32_t at = n8 < 8 ? uint32_t(row * 128 + ((n8 ^ (row & 7)) << 4) + 4 * tq)
                                     : uint32_t(kLoBytes + row * 32 + (((n8 - 8) ^ ((row >> 2) & 1)) << 4) + 4 * tq);
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(stage + at), "r"(val) : "memory");
        }
        if (p.lse != nullptr && tq == 0 && iq < cur.q_hi) {
          const int64_t lrow = int64_t(cur.q0) + iq;
          p.lse[int64_t(h) * p.total_q + (BC ? bandwg::block_col_row(lrow, maps.units_h, maps.units_w) : lrow)] = row_lse(m, l);
        }
      }
      wg::fence_proxy_async();  // this thread's writes, before the copy engine (async proxy) reads them
      wg::named_bar_sync(1 + cw, 128);
      if (tid % 128 == 0) {
        const int row0 = cur.q0 + cur.q_lo;
        if constexpr (BC) {  // a block_col tile: one 5-D box
          const bandwg::BlockColBox box = bandwg::block_col_box(row0, maps.units_h);
          bandwg::tma_store_5d(&maps.o_lo, stage, 0, h, 0, box.uc, box.ur);
          bandwg::tma_store_5d(&maps.o_hi, stage + kLoBytes, 64, h, 0, box.uc, box.ur);
        } else {
          bandwg::tma_store_3d(&maps.o_lo, stage, 0, h, row0);
          bandwg::tma_store_3d(&maps.o_hi, stage + kLoBytes, 64, h, row0);
        }
        bandwg::bulk_commit();
      }
    } else if (maps.out_rows != 0) {
      // ---- epilogue (a token order): rows staged plainly, one bulk copy per row ----
      // Row 16·warp + g + 8r of the staging tile (160 bytes a row, unswizzled: the copy reads it
      // whole) is written by the 4 lanes of quad g of this warp and copied by its lane 0; no other
      // warp touches these rows, so the warp's own barrier orders everything.
      const uint32_t stage = smem_addr(bandwg_smem + S::stage_offset) + uint32_t(cw) * kTileBytes;
      if (tq == 0) bandwg::bulk_wait_read_all();  // this lane's copies of the previous tile have read
      __syncwarp();
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float m, l;
        finish_row(r, m, l);
        const int row = 16 * warp + g + 8 * r;
        const float inv = row_has_mass(l) ? 1.f / l : 0.f;  // no key and no sink: out = 0
#pragma unroll
        for (int n8 = 0; n8 < D / 8; ++n8) {
          const uint32_t val = E::pack(acc(n8, 2 * r) * inv, acc(n8, 2 * r + 1) * inv);
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(stage + uint32_t(row * D * 2 + n8 * 16 + 4 * tq)), "r"(val)
                       : "memory");
        }
        if (p.lse != nullptr && tq == 0 && cur.q_lo + row < cur.q_hi)
          p.lse[int64_t(h) * p.total_q + rows[(i % (2 * QSLOT)) * 64 + row]] = row_lse(m, l);
      }
      wg::fence_proxy_async();  // this thread's writes, before the copy engine (async proxy) reads them
      __syncwarp();
      if (tq == 0) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = 16 * warp + g + 8 * r;
          if (cur.q_lo + row < cur.q_hi)
            bandwg::bulk_store(static_cast<T*>(p.out) + int64_t(rows[(i % (2 * QSLOT)) * 64 + row]) * p.o_tok +
                                   int64_t(h) * p.o_head,
                               stage + uint32_t(row * D * 2), uint32_t(D * 2));
        }
        bandwg::bulk_commit();
      }
    } else {
      // ---- epilogue: normalize, sink, LSE; straight to global memory ----
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float m, l;
        finish_row(r, m, l);
        const int iq = cur.q_lo + 16 * warp + g + 8 * r;
        if (iq >= cur.q_hi) continue;
        const float inv = row_has_mass(l) ? 1.f / l : 0.f;  // no key and no sink: out = 0
        // Logical row q0 + iq is stored at packed row order[q0 + iq] (out and LSE).
        const int64_t srow = gather ? int64_t(rows[(i % (2 * QSLOT)) * 64 + iq - cur.q_lo])
                             : BC   ? bandwg::block_col_row(int64_t(cur.q0) + iq, maps.units_h, maps.units_w)
                                    : int64_t(cur.q0) + iq;
        const int64_t orow = srow * p.o_tok + h * p.o_head;
#pragma unroll
        for (int n8 = 0; n8 < D / 8; ++n8) {
          const float o0 = acc(n8, 2 * r) * inv, o1 = acc(n8, 2 * r + 1) * inv;
          const int col = n8 * 8 + 2 * tq;
          if (p.out_f32)
            *reinterpret_cast<float2*>(static_cast<float*>(p.out) + orow + col) = make_float2(o0, o1);
          else
            *reinterpret_cast<uint32_t*>(static_cast<T*>(p.out) + orow + col) = E::pack(o0, o1);
        }
        if (p.lse != nullptr && tq == 0)
          p.lse[int64_t(h) * p.total_q + srow] = row_lse(m, l);
      }
    }
  }
}

}  // namespace ariadne::cuda
