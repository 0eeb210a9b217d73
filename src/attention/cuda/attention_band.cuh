// Internal: the band-walking kernel for narrow local patterns (sliding windows, small chunks).
//
// Why a second kernel: the tile kernel (attention_fwd.cuh) gives each 64-row query tile its own
// CTA, which loads its 3 K/V tiles and exits: on a ±64 window at N 4096 every K/V row crosses
// L2 -> SM three times, and each short CTA drains its pipeline (latency-bound at 17% occupancy). Here one CTA of 4 warps walks a run of consecutive 64-row
// query tiles of one query head (across sequence ends in a packed batch) and keeps the keys
// consecutive tiles share in a shared-memory ring, so each key is loaded about once per run, and
// the next tile's Q and new keys are copied (cp.async) while the current tile computes.
//
// Layout of the work:
//   - keys live in the ring in 16-key chunks; chunk x of the current sequence sits in slot
//     (x + off) mod NC. A run that leaves a sequence (varlen) or jumps past the resident keys
//     starts a new offset, placing the new chunks right after the current tile's, so the current
//     tile's slots are never overwritten while it computes.
//   - each warp owns 16 query rows and computes only the 16-key chunks its own rows can see (a ±64
//     window: 9-10 chunks, useful fraction 129/144-160 instead of 129/192 for 64x64 tiles). Its
//     whole score row (at most MAXC chunks) stays in registers, so the softmax is one pass: no
//     running max, no rescaling of the output accumulators.
// Eligible patterns (band_refuses in attention_cuda.cu): no block mask, and a bound on the keys 16
// consecutive rows can see of at most 145 (window left + right <= 129, or chunk <= 65); everything
// else, and diagnostics (entropy, distance), stays on the tile kernel. Head dims 64, 80, 96; sinks
// (both forms), GQA, varlen with lq != lk (bottom-right aligned), f32/16-bit out, LSE and the
// fused token order are handled here as in the tile kernel.
//
// The default route for sliding windows at head dims 64 and 96 (the wgmma band kernel takes head
// dim 80 where it applies), where a hot path (a warp that sees exactly 9 chunks, masks on the first and last only: every 16-aligned
// window of left + right = 128, ViT's ±64 among them) is straight-line code of ~730 instructions per
// warp-tile; it measured 1.01-1.34x the tile kernel on ViT windows (1.26-1.46x in column order).
// Chunked patterns reach it only when forced (AttentionOverrides::cuda_kernel = band: 0.69-0.79x
// the tile kernel, whose 64x64 tiles fit 64-key chunks exactly). Still latency-bound at 8 warps per SM (112 KB of shared memory).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "attention/cuda/attention_fwd.cuh"

namespace ariadne::cuda {

template <int D>
struct BandShape {
  static constexpr int NW = 4, threads = 32 * NW;
  static constexpr int BM = 16 * NW;  // query rows per tile
  static constexpr int CK = 16;       // keys per chunk
  static constexpr int NC = 16;       // ring slots (chunks): a 64-row tile of a ±64 window needs <= 13
  static constexpr int MAXC = 10;     // chunks one warp's 16 rows may need
  static constexpr int kHot = 9;      // chunks of the hot path: a 16-aligned ±64 window's warp
  static constexpr int RS = D + 8;    // padded row pitch (conflict-free ldmatrix, as in FwdShape)
  static constexpr int C = D / 8;     // 16-byte pieces per row
  static constexpr size_t smem_bytes = size_t(2 * BM + 2 * NC * CK) * RS * 2;
  // The most keys 16 consecutive query rows may see (band_refuses): an interval of W keys meets
  // at most floor((W + 30) / 16) 16-aligned chunks, which must not exceed MAXC.
  static constexpr int kMaxRowSpan = MAXC * CK + 15 - 30;
};

template <int N>
struct IntTag {
  static constexpr int value = N;
};
template <bool B>
struct BoolTag {
  static constexpr bool value = B;
};

// The dense rule of one sequence in int32 (band_refuses keeps lengths below 2^30; a window or
// chunk wider than that acts as unbounded): Pattern::key_range of one row without 64-bit work.
struct BandRule {
  int off, lk, left, right, chunk;
  __device__ BandRule(const Pattern& pat, const SeqExtent& e) {
    constexpr int64_t kBig = (int64_t(1) << 30) - 1;
    off = int(e.lk - e.lq);
    lk = int(e.lk);
    left = pat.window_left == kUnbounded || pat.window_left > kBig ? int(kBig) : int(pat.window_left);
    right = pat.window_right == kUnbounded || pat.window_right > kBig ? int(kBig) : int(pat.window_right);
    chunk = pat.chunk > kBig ? int(kBig) : int(pat.chunk);
  }
  // Keys [lo, hi) of local query row iq; hi <= lo when it sees none.
  __device__ void bounds(int iq, int& lo, int& hi) const {
    const int pos = iq + off;
    lo = pos - left > 0 ? pos - left : 0;
    hi = pos + right + 1 < lk ? pos + right + 1 : lk;
    if (chunk > 0) {
      const int start = (pos >= 0 ? pos / chunk : (pos + 1) / chunk - 1) * chunk;  // floor
      lo = lo > start ? lo : start;
      hi = hi < start + chunk ? hi : start + chunk;
    }
  }
};

// One query tile of the walk, with the ring offset its chunks were placed at.
struct BandTile {
  SeqExtent e;
  int s = 0;
  int q_lo = 0, q_hi = 0;  // local query rows
  int c_lo = 0, c_hi = 0;  // local key chunks [c_lo, c_hi) the tile's rows can see
  int off = 0;             // chunk x lives in ring slot (x + off) mod NC
  bool valid = false;
};

template <int D, class E>
__global__ void __launch_bounds__(128, 2) attention_band_kernel(const FwdParams p, const int run) {
  using S = BandShape<D>;
  constexpr int BM = S::BM, CK = S::CK, NC = S::NC, MAXC = S::MAXC, RS = S::RS, C = S::C, kHot = S::kHot;
  constexpr int kThreads = S::threads;
  constexpr int DT = D / 8;
  using T = typename E::type;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* Qs = reinterpret_cast<T*>(smem_raw);  // 2 buffers of BM rows
  T* Ks = Qs + 2 * BM * RS;                // NC chunks of CK rows
  T* Vs = Ks + NC * CK * RS;

  const Pattern& pat = p.pattern;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, tq = lane % 4;
  const int h = blockIdx.y, kvh = h / p.group;
  const T* qg = static_cast<const T*>(p.q) + h * p.q_head;
  const T* kg = static_cast<const T*>(p.k) + kvh * p.k_head;
  const T* vg = static_cast<const T*>(p.v) + kvh * p.v_head;
  auto stored = [&](int64_t i) -> int64_t { return p.order != nullptr ? p.order[i] : i; };

  // ---- the walk: virtual tiles [t, t_end) (the tile kernel's varlen cover, see launch_band) ----
  const bool varlen = pat.cu_seqlens_q != nullptr;
  const int64_t n_virtual = varlen ? pat.num_seqs + p.total_q / BM + 1 : (p.total_q + BM - 1) / BM;
  int64_t t = int64_t(blockIdx.x) * run;
  const int64_t t_end = t + run < n_virtual ? t + run : n_virtual;
  int s_hint = 0;
  if (varlen) s_hint = virtual_tile_seq<BM>(pat, t);  // first sequence of the run; later tiles only move forward
  // The next virtual tile that holds query rows (virtual tiles past a sequence's end are empty).
  auto next_tile = [&]() {
    BandTile b;
    while (t < t_end) {
      const int64_t v = t++;
      int64_t tile = v;
      if (varlen) {
        while (s_hint + 1 < pat.num_seqs && s_hint + 1 + pat.cu_seqlens_q[s_hint + 1] / BM <= v) ++s_hint;
        tile = v - (s_hint + pat.cu_seqlens_q[s_hint] / BM);
      }
      b.e = pat.seq(s_hint, p.total_q, p.total_k);
      if (tile * BM >= b.e.lq) continue;
      b.s = s_hint;
      b.q_lo = int(tile * BM);
      b.q_hi = b.q_lo + BM < b.e.lq ? b.q_lo + BM : int(b.e.lq);
      const KeyRange r = pat.key_range(b.e, b.q_lo, b.q_hi);
      b.c_lo = int(r.lo) / CK;
      b.c_hi = r.empty() ? b.c_lo : int(r.hi + CK - 1) / CK;
      b.valid = true;
      return b;
    }
    return b;
  };

  // Copy mapping: each thread owns one 16-byte piece of a row and every kRowsPerPass-th row, so
  // the per-row work is one index (and, with a token order, one order[] load) and two pointers.
  // Unrolled by 4 so that a token order's index loads are in flight together, not one by one.
  constexpr int kRowsPerPass = kThreads / C;
  const int piece = tid % C, prow = tid / C;  // threads with prow >= kRowsPerPass idle
  const uint32_t ks_addr = smem_addr(Ks), vs_addr = smem_addr(Vs);
  // Copies chunks [x0, x1) of tile b's sequence (K and V) into their ring slots; rows past the
  // sequence's keys are zero-filled (never stale data that 0 * NaN would spread).
  auto load_chunks = [&](const BandTile& b, int x0, int x1) {
    if (prow >= kRowsPerPass) return;
    const int rows = (x1 - x0) * CK;
    const int ring0 = (x0 + b.off) * CK;  // ring row of key x0 * CK before the wrap (NC * CK rows)
    const int lk = int(b.e.lk);
    if (p.order == nullptr) {
      // Plain layout: consecutive keys are a constant stride apart, so the addresses only advance.
      const int64_t first = b.e.k0 + int64_t(x0) * CK + prow;
      const T* kp = kg + first * p.k_tok + piece * 8;
      const T* vp = vg + first * p.v_tok + piece * 8;
      const int64_t kstep = int64_t(kRowsPerPass) * p.k_tok, vstep = int64_t(kRowsPerPass) * p.v_tok;
      int key = x0 * CK + prow;
#pragma unroll 4
      for (int r = prow; r < rows; r += kRowsPerPass, key += kRowsPerPass, kp += kstep, vp += vstep) {
        const uint32_t so = uint32_t((((ring0 + r) & (NC * CK - 1)) * RS + piece * 8) * 2);
        const bool ok = key < lk;
        cp_async16(ks_addr + so, ok ? kp : kg, ok);
        cp_async16(vs_addr + so, ok ? vp : vg, ok);
      }
      return;
    }
#pragma unroll 4
    for (int r = prow; r < rows; r += kRowsPerPass) {
      const int key = x0 * CK + r;
      const uint32_t so = uint32_t((((ring0 + r) & (NC * CK - 1)) * RS + piece * 8) * 2);
      const bool ok = key < lk;
      const int64_t row = ok ? p.order[b.e.k0 + key] : 0;
      cp_async16(ks_addr + so, kg + (ok ? row * p.k_tok + piece * 8 : 0), ok);
      cp_async16(vs_addr + so, vg + (ok ? row * p.v_tok + piece * 8 : 0), ok);
    }
  };
  auto load_q = [&](const BandTile& b, T* dst) {
    if (prow >= kRowsPerPass) return;
    const uint32_t d0 = smem_addr(dst + prow * RS + piece * 8);
    constexpr uint32_t dstep = kRowsPerPass * RS * 2;
    if (p.order == nullptr) {
      const int64_t step = int64_t(kRowsPerPass) * p.q_tok;
      const T* qp = qg + (b.e.q0 + b.q_lo + prow) * p.q_tok + piece * 8;
#pragma unroll 4
      for (int r = prow, i = 0; r < BM; r += kRowsPerPass, ++i, qp += step) {
        const bool ok = b.q_lo + r < b.q_hi;
        cp_async16(d0 + i * dstep, ok ? qp : qg, ok);
      }
      return;
    }
#pragma unroll 4
    for (int r = prow, i = 0; r < BM; r += kRowsPerPass, ++i) {
      const bool ok = b.q_lo + r < b.q_hi;
      const int64_t row = ok ? p.order[b.e.q0 + b.q_lo + r] : 0;
      cp_async16(d0 + i * dstep, qg + (ok ? row * p.q_tok + piece * 8 : 0), ok);
    }
  };

  BandTile cur = next_tile();
  if (!cur.valid) return;
  // Resident chunks of the ring: [res_lo, have_hi) of sequence cur.s, res_lo >= have_hi - NC.
  int res_lo = cur.c_lo, have_hi = cur.c_hi;
  load_q(cur, Qs);
  load_chunks(cur, cur.c_lo, cur.c_hi);
  cp_async_commit();

  const float sink_log2 = p.sink_kind != kSinkNone ? p.sink[h] * 1.4426950408889634f : 0.f;
  const float sink_raw = sink_log2 / p.scale_log2;  // the key0 bias in unscaled score units
  int qb = 0;

  while (cur.valid) {
    BandTile nxt = next_tile();
    cp_async_wait<0>();
    __syncthreads();  // cur's Q and chunks landed; every warp is done with the previous tile
    if (have_hi < cur.c_hi) {
      // The prefetch could not place all of cur's chunks while the previous tile held its slots.
      load_chunks(cur, have_hi, cur.c_hi);
      cp_async_commit();
      have_hi = cur.c_hi;
      cp_async_wait<0>();
      __syncthreads();
    }

    // ---- prefetch: the next tile's Q, and the chunks it adds that fit beside cur's ----
    if (nxt.valid) {
      load_q(nxt, Qs + (qb ^ 1) * BM * RS);
      int limit;
      if (nxt.s == cur.s && nxt.c_lo >= res_lo && nxt.c_lo <= have_hi) {
        nxt.off = cur.off;  // continues the resident keys: only the chunks past have_hi are new
        limit = cur.c_lo + NC;
      } else {
        // A new sequence or a jump: restart the ring right after cur's slots.
        nxt.off = cur.c_hi + cur.off - nxt.c_lo;
        limit = nxt.c_lo + NC - (cur.c_hi - cur.c_lo);
        res_lo = have_hi = nxt.c_lo;
      }
      const int hi = nxt.c_hi < limit ? nxt.c_hi : limit;
      if (hi > have_hi) {
        load_chunks(nxt, have_hi, hi);
        have_hi = hi;
        if (res_lo < have_hi - NC) res_lo = have_hi - NC;
      }
    }
    cp_async_commit();

    // ---- this warp's 16 rows ----
    T* Qb = Qs + qb * BM * RS;
    const int r0 = cur.q_lo + warp * 16;
    if (r0 < cur.q_hi) {
      const BandRule rule(pat, cur.e);
      // Row bounds in int32 from the tile's rule (one Pattern::key_range per row would be int64
      // work, ~5 per warp-tile). Rows past the tile's end take its last row's bounds: they are
      // computed but never stored, and keep the warp's key hull that of its real rows.
      const int r_last = (r0 + 16 < cur.q_hi ? r0 + 16 : cur.q_hi) - 1;
      int row_lo[2], row_hi[2];  // half-open; row_hi < row_lo: an empty row
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int iq = r0 + g + 8 * r;
        rule.bounds(iq < r_last ? iq : r_last, row_lo[r], row_hi[r]);
      }
      // Bounds are monotone in the row: the warp's hull is [lo(r0), hi(r_last)) (lanes 0 and 28
      // hold rows r0 and r_last), and chunks inside [lo(r_last), hi(r0)) need no element mask.
      const int w_lo = __shfl_sync(0xffffffffu, row_lo[0], 0);
      const int hi_first = __shfl_sync(0xffffffffu, row_hi[0], 0);
      const int lo_last = __shfl_sync(0xffffffffu, row_lo[1], 28);
      const int hi_last = __shfl_sync(0xffffffffu, row_hi[1], 28);
      const int wc_lo = w_lo / CK;
      const int nc = hi_last > w_lo ? (hi_last + CK - 1) / CK - wc_lo : 0;
      const int full_lo = lo_last, full_hi = hi_first > w_lo ? hi_first : w_lo;
      const int slot0 = wc_lo + cur.off;
      const int kb0 = wc_lo * CK;

      // The lane parts of the ldmatrix addresses (K read as B of S, V transposed as B of P·V).
      const uint32_t k_lane = smem_addr(Ks + ((lane & 7) + ((lane >> 4) << 3)) * RS + ((lane >> 3) & 1) * 8);
      const uint32_t v_lane = smem_addr(Vs + ((lane & 7) + ((lane >> 3) & 1) * 8) * RS + (lane >> 4) * 8);
      uint32_t qf[D / 16][4];  // Q's fragments stay in registers for the whole tile
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks)
        ldmatrix_x4(qf[ks], smem_addr(Qb + (warp * 16 + (lane % 16)) * RS + ks * 16 + (lane / 16) * 8));
      const bool key0 = p.sink_kind == kSinkKey0;
      float acc[DT][4];
      float m_row[2], l_row[2];

      // S = Q·Kᵀ over NCH chunks, one-pass softmax, O = P·V. GUARD = false is the hot path: the
      // warp sees exactly NCH chunks and only the first and last need an element mask, so every
      // loop is straight-line code; GUARD = true takes any nc <= MAXC and decides per chunk.
      auto compute = [&](auto nch_tag, auto guard_tag) {
        constexpr int NCH = decltype(nch_tag)::value;
        constexpr bool GUARD = decltype(guard_tag)::value;
        auto live = [&](int c) { return !GUARD || c < nc; };
        float sc[NCH][2][4];
#pragma unroll
        for (int c = 0; c < NCH; ++c) {
#pragma unroll
          for (int j = 0; j < 2; ++j) sc[c][j][0] = sc[c][j][1] = sc[c][j][2] = sc[c][j][3] = 0.f;
          if (live(c)) {
            const uint32_t off = uint32_t(((slot0 + c) & (NC - 1)) * CK * RS * 2);
            uint32_t b[D / 16][4];  // the chunk's fragments first: the products then wait on one load
#pragma unroll
            for (int ks = 0; ks < D / 16; ++ks) ldmatrix_x4(b[ks], k_lane + off + ks * 32);
#pragma unroll
            for (int ks = 0; ks < D / 16; ++ks) {
              E::mma(sc[c][0], qf[ks], b[ks][0], b[ks][1]);
              E::mma(sc[c][1], qf[ks], b[ks][2], b[ks][3]);
            }
          }
        }
        // Element masks. A column's test is one unsigned compare: col - lo < hi - lo.
#pragma unroll
        for (int c = 0; c < NCH; ++c) {
          const int kb = kb0 + c * CK;
          const bool edge = GUARD ? (c < nc && (kb < full_lo || kb + CK > full_hi || (key0 && kb == 0)))
                                  : (c == 0 || c == NCH - 1);
          if (edge) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              const int rel = row_lo[r] - kb - 2 * tq;  // column (j * 8 + x) is allowed iff
              const unsigned width = row_hi[r] > row_lo[r] ? unsigned(row_hi[r] - row_lo[r]) : 0u;
#pragma unroll
              for (int j = 0; j < 2; ++j)
#pragma unroll
                for (int x = 0; x < 2; ++x)
                  if (unsigned(j * 8 + x - rel) >= width) sc[c][j][2 * r + x] = -INFINITY;
            }
            if (key0 && kb == 0 && tq == 0) {  // column 0 sits in lane tq 0, j 0, x 0
#pragma unroll
              for (int r = 0; r < 2; ++r)  // only where allowed: a NaN bias must not reach a masked key
                if (row_lo[r] == 0 && row_hi[r] > 0) sc[c][0][2 * r] += sink_raw;
            }
          }
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float mx2[2] = {-INFINITY, -INFINITY};
#pragma unroll
          for (int c = 0; c < NCH; ++c) {
            if (live(c))
              mx2[c & 1] = fmax_nan(mx2[c & 1], fmax_nan(fmax_nan(sc[c][0][2 * r], sc[c][0][2 * r + 1]),
                                                         fmax_nan(sc[c][1][2 * r], sc[c][1][2 * r + 1])));
          }
          float mx = quad_max(fmax_nan(mx2[0], mx2[1]));
          mx *= p.scale_log2;
          // A row with no allowed key keeps max −inf; subtracting 0 keeps exp2(−inf) = 0, not NaN.
          const float base = mx == -INFINITY ? 0.f : mx;
          float sum2[2] = {0.f, 0.f};
#pragma unroll
          for (int c = 0; c < NCH; ++c) {
            if (live(c)) {
#pragma unroll
              for (int j = 0; j < 2; ++j)
#pragma unroll
                for (int x = 0; x < 2; ++x) sc[c][j][2 * r + x] = ex2(fmaf(sc[c][j][2 * r + x], p.scale_log2, -base));
              sum2[c & 1] += (sc[c][0][2 * r] + sc[c][0][2 * r + 1]) + (sc[c][1][2 * r] + sc[c][1][2 * r + 1]);
            }
          }
          m_row[r] = mx;
          l_row[r] = sum2[0] + sum2[1];
        }
        // O = P·V; P goes from the score registers straight into A fragments.
#pragma unroll
        for (int j = 0; j < DT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
#pragma unroll
        for (int c = 0; c < NCH; ++c) {
          if (live(c)) {
            const uint32_t off = uint32_t(((slot0 + c) & (NC - 1)) * CK * RS * 2);
            uint32_t a[4];
            a[0] = E::pack(sc[c][0][0], sc[c][0][1]);
            a[1] = E::pack(sc[c][0][2], sc[c][0][3]);
            a[2] = E::pack(sc[c][1][0], sc[c][1][1]);
            a[3] = E::pack(sc[c][1][2], sc[c][1][3]);
            uint32_t b[D / 16][4];
#pragma unroll
            for (int d2 = 0; d2 < D / 16; ++d2) ldmatrix_x4_trans(b[d2], v_lane + off + d2 * 32);
#pragma unroll
            for (int d2 = 0; d2 < D / 16; ++d2) {
              E::mma(acc[2 * d2], a, b[d2][0], b[d2][1]);
              E::mma(acc[2 * d2 + 1], a, b[d2][2], b[d2][3]);
            }
          }
        }
      };
      // The hot path: a 16-row warp of a window (L, R) meets floor((L + R + 15 + 15) / 16) + 1
      // chunks at most, ceil((L + R + 16) / 16) when its first row's left bound is 16-aligned
      // (e.g. ±64: 9, chunks 1-7 full). Warps at sequence edges, unaligned windows and chunked
      // patterns take the guarded path.
      if (nc == kHot && kb0 + CK >= full_lo && kb0 + (kHot - 1) * CK <= full_hi)
        compute(IntTag<kHot>{}, BoolTag<false>{});
      else
        compute(IntTag<MAXC>{}, BoolTag<true>{});
      // ---- epilogue: normalize, sink, LSE; 16-bit rows staged in this warp's own Q rows ----
      T* stage = Qb + warp * 16 * RS;
      // The stage overwrites Q rows that other lanes of this warp read with ldmatrix; the hot path
      // has no other warp-level synchronization point between the two.
      __syncwarp();
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float l = quad_sum(l_row[r]);
        float m = m_row[r];
        const int iq = r0 + g + 8 * r;
        fold_sink_row<DT>(p.sink_kind, sink_log2, m, l, [&](int j, int x) -> float& { return acc[j][2 * r + x]; });
        const float inv = row_has_mass(l) ? 1.f / l : 0.f;
#pragma unroll
        for (int j = 0; j < DT; ++j) {
          const float o0 = acc[j][2 * r] * inv, o1 = acc[j][2 * r + 1] * inv;
          if (p.out_f32) {
            if (iq < cur.q_hi) {
              float* og = static_cast<float*>(p.out) + stored(cur.e.q0 + iq) * p.o_tok + h * p.o_head + j * 8 + 2 * tq;
              *reinterpret_cast<float2*>(og) = make_float2(o0, o1);
            }
          } else {
            *reinterpret_cast<uint32_t*>(stage + (g + 8 * r) * RS + j * 8 + 2 * tq) = E::pack(o0, o1);
          }
        }
        if (p.lse != nullptr && tq == 0 && iq < cur.q_hi)
          p.lse[int64_t(h) * p.total_q + stored(cur.e.q0 + iq)] = row_lse(m, l);
      }
      if (!p.out_f32) {
        __syncwarp();  // the staged rows were written by other lanes of this warp
        T* og = static_cast<T*>(p.out) + h * p.o_head;
        for (int i = lane; i < 16 * C; i += 32) {
          const int row = i / C, c = i % C;
          if (r0 + row < cur.q_hi)
            *reinterpret_cast<uint4*>(og + stored(cur.e.q0 + r0 + row) * p.o_tok + c * 8) =
                *reinterpret_cast<const uint4*>(stage + row * RS + c * 8);
        }
      }
    }
    cur = nxt;
    qb ^= 1;
  }
  cp_async_wait<0>();  // nothing may stay in flight when the CTA exits
}

// The run cut of the band kernels: virtual tiles of `bm` rows (the tile kernel's varlen cover:
// sequence s owns [s + cu_q[s]/bm, s + 1 + cu_q[s+1]/bm)) in runs of `run` tiles; `run` <= 0 picks
// the longest runs (fewest re-loaded keys at run starts) that still give each of `slots` resident
// CTA slots work in one wave. Returns the number of runs (the grid's x) and sets `run`.
inline int64_t band_runs(const FwdParams& p, int bm, int slots, int& run) {
  const int64_t n_virtual = p.pattern.cu_seqlens_q != nullptr ? p.pattern.num_seqs + p.total_q / bm + 1
                                                              : (p.total_q + bm - 1) / bm;
  if (run <= 0) {
    const int64_t per_head = slots / p.heads_q > 0 ? slots / p.heads_q : 1;  // CTAs per head in one wave
    run = int((n_virtual + per_head - 1) / per_head);
  }
  return (n_virtual + run - 1) / run;
}

// Grid (runs of virtual tiles, band_runs; heads_q). `run` <= 0: band_runs picks the length.
template <int D, class E>
cudaError_t launch_band(const FwdParams& p, int run, cudaStream_t stream) {
  using S = BandShape<D>;
  const auto kernel = attention_band_kernel<D, E>;
  static const cudaError_t configured = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(S::smem_bytes));
  if (configured != cudaSuccess) return configured;
  static const int slots = resident_cta_slots(kernel, S::threads, S::smem_bytes);
  if (slots <= 0) return cudaErrorInvalidConfiguration;
  const int64_t runs = band_runs(p, S::BM, slots, run);
  kernel<<<dim3(unsigned(runs), unsigned(p.heads_q)), S::threads, S::smem_bytes, stream>>>(p, run);
  return cudaGetLastError();
}

#define ARIADNE_BAND_KERNELS(X, D) X(launch_band<D, Bf16>) X(launch_band<D, F16>)
#define ARIADNE_BAND_INSTANTIATE_ONE(...) template cudaError_t __VA_ARGS__(const FwdParams&, int, cudaStream_t);
#define ARIADNE_BAND_DECLARE_ONE(...) extern template cudaError_t __VA_ARGS__(const FwdParams&, int, cudaStream_t);
#define ARIADNE_INSTANTIATE_BAND(D) ARIADNE_BAND_KERNELS(ARIADNE_BAND_INSTANTIATE_ONE, D)
ARIADNE_BAND_KERNELS(ARIADNE_BAND_DECLARE_ONE, 64)
ARIADNE_BAND_KERNELS(ARIADNE_BAND_DECLARE_ONE, 80)
ARIADNE_BAND_KERNELS(ARIADNE_BAND_DECLARE_ONE, 96)

}  // namespace ariadne::cuda
