// Internal: the wgmma band kernel's gathering producer, for calls with a token order
// (attention_bandwg.cuh).
#pragma once

#include "attention/cuda/bandwg_walk.cuh"

namespace ariadne::cuda {

// The producer warpgroup of a call with a token order (FwdParams::order: logical row i lives
// at packed row order[i] of q, k, v, out and lse). The copy engine copies boxes of consecutive
// rows, not gathered ones, so all 128 producer threads fill the same rings with cp.async: thread t
// copies row t / 2 of each 64-row tile, 16-byte pieces 2j + t % 2 (j < 5), so that a thread pair
// reads one 32-byte sector per copy and a warp's 32 pieces fill 4 shared-memory wavefronts. Each
// piece goes where the TMA box would have put it (the swizzled tile layout above); the copies
// complete through cp.async.mbarrier.arrive.noinc on the tile's full barrier (count 128; q_full
// 192: each thread of an even tid also writes its row's packed row to `rows` (the epilogue's
// scatter reads it there) and arrives plainly, which releases it; thread 0 writes the descriptor
// first). Entry i mod 2·QSLOT of tile i is rewritten for tile i + 2·QSLOT only after the wait on
// q_empty for tile i + QSLOT, which that tile's consumer, tile i's own (QSLOT is a multiple of
// NCONS), signals after tile i's epilogue.
// Every thread walks the same tiles and waits on the same empty barriers before refilling a slot,
// so no thread's arrival can land in a barrier phase the consumers have not finished. Rows past a
// sequence's keys (queries) are zero-filled. One order[] load per thread and tile (K and V of a
// chunk share it), issued before the wait on the slot.
template <int D, class E>
__device__ __forceinline__ void bandwg_gather_producer(const FwdParams& p, int64_t first, int64_t last,
                                                       BandWgDesc* descs, int32_t* rows, typename E::type* Qs,
                                                       typename E::type* Ks, typename E::type* Vs,
                                                       uint32_t bars) {
  using S = BandWgShape<D>;
  using T = typename E::type;
  constexpr int BM = S::BM, CK = S::CK, NSLOT = S::NSLOT, QSLOT = S::QSLOT, NCONS = S::NCONS;
  static_assert(S::C == 10, "two threads per row, 5 pieces each");
  constexpr uint32_t kLoBytes = 64 * 128;
  auto full = [&](int s) { return bars + 8 * s; };
  auto empty = [&](int s) { return bars + 8 * (NSLOT + s); };
  auto q_full = [&](int s) { return bars + 8 * (2 * NSLOT + s); };
  auto q_empty = [&](int s) { return bars + 8 * (2 * NSLOT + QSLOT + s); };
  const int tid = threadIdx.x;  // 0..127
  const int row = tid >> 1, half = tid & 1;
  const int h = blockIdx.y, kvh = h / p.group;
  const T* qg = static_cast<const T*>(p.q) + int64_t(h) * p.q_head + 8 * half;
  const T* kg = static_cast<const T*>(p.k) + int64_t(kvh) * p.k_head + 8 * half;
  const T* vg = static_cast<const T*>(p.v) + int64_t(kvh) * p.v_head + 8 * half;
  // Piece 2j + half of the row: 128-byte swizzle (j < 4: piece c of a 128-byte row at c ^ (row mod
  // 8)), then the 32-byte swizzle (piece c - 8 of a 32-byte row at (c - 8) ^ bit 2 of the row), as
  // the epilogue's staging writes.
  auto at = [&](int j) {
    return j < 4 ? uint32_t(row * 128 + (((2 * j + half) ^ (row & 7)) << 4))
                 : uint32_t(kLoBytes + row * 32 + ((half ^ ((row >> 2) & 1)) << 4));
  };
  // The packed row of this thread's row of a tile whose row 0 is logical row row0 (valid rows
  // belong to the sequence; -1: zero-fill).
  auto packed = [&](int64_t row0, int valid) { return row < valid ? __ldg(p.order + row0 + row) : -1; };
  auto copy = [&](T* dst, const T* head, int64_t stride, int src) {
    const uint32_t d = smem_addr(dst);
    const bool ok = src >= 0;
    const T* g = head + (ok ? int64_t(src) * stride : 0);
#pragma unroll
    for (int j = 0; j < 5; ++j) cp_async16(d + at(j), g + 16 * j, ok);
  };
  BandWgWalk<BM, CK> walk(p.pattern, first, last, p.total_q, p.total_k);
  int i = 0;
  BandWgTile b = walk.next();
  for (; b.valid; ++i) {
    const BandWgTile nb = walk.next();  // one ahead: its first ring number bounds b's releases
    const int qs = i % QSLOT;
    const int qsrc = packed(b.e.q0 + b.q_lo, b.q_hi - b.q_lo);  // before the wait
    if (i >= QSLOT) wg::mbar_wait(q_empty(qs), uint32_t((i / QSLOT) - 1) & 1);
    copy(Qs + qs * S::tile_elems, qg, p.q_tok, qsrc);
    wg::mbar_arrive_cp_async(q_full(qs));
    if (half == 0) {
      if (tid == 0)
        descs[qs] = BandWgDesc{int(b.e.q0), b.q_lo, b.q_hi, int(b.e.lk - b.e.lq), int(b.e.lk), b.c_lo, b.nc, b.n_lo,
                               nb.valid ? nb.n_lo : -1, 1};
      rows[(i % (2 * QSLOT)) * 64 + row] = qsrc;
      wg::mbar_arrive(q_full(qs));  // releases the row (and thread 0's descriptor)
    }
    for (int x = b.ld_lo; x < b.ld_hi; ++x) {
      const int n = b.n_lo + (x - b.c_lo), st = n % NSLOT;
      const int src = packed(b.e.k0 + int64_t(x) * CK, int(b.e.lk) - x * CK);  // before the wait
      if (n >= NSLOT) wg::mbar_wait(empty(st), uint32_t((n / NSLOT) - 1) & 1);
      copy(Ks + st * S::tile_elems, kg, p.k_tok, src);
      copy(Vs + st * S::tile_elems, vg, p.v_tok, src);
      wg::mbar_arrive_cp_async(full(st));  // K and V of the chunk on one barrier
    }
    b = nb;
  }
  // One end marker per consumer, in the next NCONS Q slots: every thread arrives (plainly), even
  // ones twice, thread 0 after writing the marker.
  for (int j = i; j < i + NCONS; ++j) {
    const int qs = j % QSLOT;
    if (j >= QSLOT) wg::mbar_wait(q_empty(qs), uint32_t((j / QSLOT) - 1) & 1);
    if (half == 0) {
      if (tid == 0) descs[qs].valid = 0;
      wg::mbar_arrive(q_full(qs));
    }
    wg::mbar_arrive(q_full(qs));
  }
  wg::cp_async_wait_all();  // no thread leaves with copies in flight
}

}  // namespace ariadne::cuda
