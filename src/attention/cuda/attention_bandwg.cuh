// Internal: the Hopper (sm_90a) band kernel for sliding windows: wgmma products over a shared-memory
// ring of 64-key chunks, fed by a producer warpgroup (the band walk of attention_band.cuh on the
// warp-specialized structure of attention_wgmma.cuh).
//
// Why: the per-warp band kernel (attention_band.cuh) computes only the 16-key chunks each 16-row
// warp sees (useful fraction 0.90 on a ±64 window) but issues ~180 mma.sync per warp-tile and stays
// instruction-issue bound at 8 warps per SM (bench/cuda-notes.md, v9-v10). Here a consumer
// warpgroup takes a whole 64-row query tile and its key hull (±64 aligned: 192 keys, useful
// fraction 0.67) with ~30 asynchronous wgmma instructions, and two consumers take alternate tiles
// so that one's softmax runs under the other's products.
//
// A CTA of 3 warpgroups (one per SM: ~200 KB of shared memory) walks a run of consecutive 64-row
// query tiles of one query head (the varlen cover of the tile kernel, crossing sequence ends):
//   - warpgroup 0, the producer: one thread walks the tiles, writes each tile's descriptor
//     (BandWgDesc) next to its Q buffer, and has the copy engine (TMA tensor copies completing on
//     mbarriers) bring the tile's Q into a ring of QSLOT buffers and the 64-key chunks of K and V
//     the tile adds into a ring of NSLOT chunks, K and V of a chunk on one barrier (v26: the
//     consumers waited for both before computing anyway, and every wait is a shared-memory
//     synchronization op that costs ~50-100 cycles: bench/cuda-notes.md, v25);
//   - warpgroups 1 and 2 take the walk's tiles alternately: S = Q·Kᵀ by wgmma m64n64k16 per chunk
//     (both from shared memory), masks and a one-pass softmax in registers (the whole key hull is
//     in one S, so no running max), P packed to 16 bits as the register A operand of O = P·V
//     (wgmma m64n64k16 + m64n16k16 over V's two layout regions), then the epilogue straight to
//     global memory.
// Variant 3 (v14, ARIADNE_BANDWG_V=3) has three consumer warpgroups (4 warpgroups, 512 threads)
// taking tiles i % 3, so that more warps per scheduler hide the softmax's latency: registers 40
// (producer) / 152 (consumers), Q buffers 3 (one per consumer) to make room for the third staging
// tile, and a 4-chunk hull computed in two passes of 2 chunks (online rescale) to fit 152. Inside
// a consumer, each chunk's S is its own wgmma group (its masks and maxima run while the later
// chunks' S compute) and P·V of the first chunks runs under the last chunk's exponentials.
// Tile layout in shared memory (Q, K and V alike): columns 0-63 of the 64 rows as 128-byte rows
// under the 128-byte swizzle, then columns 64-79 as 32-byte rows under the 32-byte swizzle; each
// region is one copy-engine box and a canonical wgmma operand (K-major for Q and K, MN-major for V).
// Ring protocol. Chunks get ring numbers in walk order (chunk n in slot n mod NSLOT); a tile that
// continues its sequence reuses the resident chunks and appends the new ones, a tile of a new
// sequence (or one whose keys jump) appends fresh numbers. Ring numbers where a tile's chunks
// start never decrease along the walk, so once a consumer has finished a tile, every chunk
// numbered below the next tile's first is dead for it: it releases those (each of its 128 threads
// arrives once per chunk on the chunk's "empty" barrier, count 128 per consumer), having
// waited on their "full" barriers first, so that no barrier is ever two phases ahead of a waiter.
// The producer refills a slot after every consumer released its previous chunk. With NSLOT >= 2 x
// MAXC the walk cannot deadlock: the chunks of two consecutive tiles always fit. (Say the producer
// waits to load a chunk of tile T; every tile before T is loaded. Two consumers: the owner of T-1
// finishes it and releases below T's first chunk, the owner of T-2 below T-1's first, so all is
// released below T-1's first, and T-1 and T need <= 2 x MAXC slots. Three consumers (variant 3):
// the owner of T, whose last tile was T-3, would hold from T-2's first on, three tiles' chunks;
// so variant 3 also releases at a tile's start every chunk below that tile's first, which the
// owner of T can do (Q and the descriptor of T precede its chunks in the producer's order, and
// Q(T) waits only for S of T-QSLOT), bringing the bound back to T-1's first: NSLOT 8 holds.)
// After the last tile the producer publishes one end marker (valid = 0) per consumer.
//
// Eligible (bandwg_eligible in attention_cuda.cu): sliding windows with left + right <= 129 (a
// 64-row tile's hull of <= 193 keys meets at most MAXC = 4 chunks) or (v42) chunks of <= 65 keys
// (BandRule clips each row to its chunk: hull <= 62 + 2 x 65 keys; a 64-aligned chunk of 64 is one
// ring chunk a tile, the other two chunks of the 3-chunk pass masked), no block mask, no
// diagnostics (a token order is taken unless ARIADNE_BANDWG_ORDER=0; v13: the producer warpgroup
// then gathers the rows with cp.async, bandwg_gather_producer, and O leaves per thread), head dim 80,
// compute capability 9.0, rows and keys below 2^30, q/k/v strides increasing from head dim to heads
// to rows. Sinks (both forms), GQA, varlen with lq != lk (bottom-right aligned), f32 / 16-bit out
// and LSE are handled as in the other kernels. Rows past a sequence's end are copied from the
// tensor's next rows (zeros past the tensor's end) and get probability exactly 0.
//
// Status (bench/cuda-notes.md, v11): 1.10-1.22x the per-warp band kernel on ViT windows (the
// default route for them); consumer-bound: ~2 warps per scheduler, the softmax, masks and epilogue
// are latency-bound integer and float work that the two consumers do not fully hide. v13: ordered
// calls (bandwg_gather_producer; the default since session 4: 0.0279 ms for the column order at
// N 4096 against the band kernel's 0.0330). Issuing the next tile's S before the current tile's
// epilogue was measured 14% slower at N 4096 and 16384 (v13 "PIPE") and removed. v14 (variant 3):
// 0.0211 ms at N 4096 (variant 2: 0.0235), 0.0632 at N 16384 (0.0768), 0.120 at batch 8 (0.151);
// the default since session 4 (cuda_bandwg_variant).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "attention/cuda/attention_band.cuh"
#include "attention/cuda/attention_fwd.cuh"
#include "attention/cuda/attention_wgmma.cuh"
#include "device/cuda/tensor_map.hpp"
#include "device/cuda/wgmma.cuh"

namespace ariadne::cuda {

// NCONS consumer warpgroups: 2 (variants 1 and 2), 3 (variant 3, v14: one more consumer to hide
// the softmax latency; its shared memory and registers are cut to fit, see below).
template <int D, int NCONS = 2>
struct BandWgShape {
  static constexpr int BM = 64;      // query rows per tile (one consumer warpgroup)
  static constexpr int CK = 64;      // keys per ring chunk
  static constexpr int NSLOT = 8;    // K/V ring chunks (>= 2 x MAXC, see the ring protocol)
  // Q tile buffers: two per consumer with 2 consumers; one per consumer with 3 (the third
  // consumer's staging tile takes the room of the fourth buffer).
  static constexpr int QSLOT = NCONS == 3 ? 3 : 4;
  static constexpr int MAXC = 4;     // chunks a tile's hull of <= 64 + 129 keys may meet
  static constexpr int kMaxSpan = 129;  // window left + right the kernel accepts
  static constexpr int kMaxChunk = 65;  // v42: chunk sizes it accepts (hull <= 62 + 2 x 65 keys: 4 chunks)
  static constexpr int threads = 128 * (1 + NCONS);
  // setmaxnreg per warpgroup: 128 x (producer + NCONS x consumer) registers <= 65536, the SM's file.
  // With 3 consumers the producer gets 40 (the gather producer's code uses 34) and the consumers
  // 152, which the 3-chunk path fits and the 4-chunk path fits as two passes of 2 chunks (v14).
  static constexpr int kProducerRegs = NCONS == 3 ? 40 : 56;
  static constexpr int kConsumerRegs = NCONS == 3 ? 152 : 224;
  static_assert(128 * (kProducerRegs + NCONS * kConsumerRegs) <= 65536, "register file");
  static constexpr int C = D / 8;    // 16-byte pieces (core-matrix columns) per row
  static constexpr int tile_elems = 64 * D;
  // QSLOT Q tiles, NSLOT K chunks, NSLOT V chunks, then the mbarriers (8 bytes each):
  // full[NSLOT] (K and V of a chunk, v26), empty[NSLOT], q_full[QSLOT], q_empty[QSLOT].
  static constexpr size_t bar_offset = size_t(QSLOT + 2 * NSLOT) * tile_elems * 2;
  static constexpr size_t desc_offset = bar_offset + 8 * (2 * NSLOT + 2 * QSLOT);
  // + one BandWgDesc per Q buffer, then (v21) the packed rows of the last 2 x QSLOT tiles of an
  // ordered call: tile i's in entry i mod 2·QSLOT, for its consumer's epilogue.
  static constexpr size_t rows_offset = desc_offset + 64 * QSLOT;
  static constexpr size_t smem_bytes = rows_offset + 4 * 64 * 2 * QSLOT;
  // Variants 2 and 3 (ARIADNE_BANDWG_V) add one output staging tile per consumer (the epilogue's
  // TMA store reads it), 1024-byte aligned for the 128-byte swizzle: ~221 KB in all with 2
  // consumers and 4 Q buffers, ~221 KB with 3 and 3, under the 227 KB limit.
  static constexpr size_t stage_offset = (smem_bytes + 1023) / 1024 * 1024;
  static constexpr size_t smem_bytes_v2 = stage_offset + NCONS * size_t(tile_elems) * 2;
  static_assert(smem_bytes_v2 <= 227 * 1024, "shared memory per block");
};

// One query tile of the walk and the ring numbers of its chunks. Every thread of the CTA walks the
// same tiles (BandWgWalk::next is deterministic), so producer and consumers agree on the numbers.
struct BandWgTile {
  SeqExtent e;
  int q_lo = 0, q_hi = 0;    // local query rows
  int c_lo = 0, nc = 0;      // the hull's key chunks [c_lo, c_lo + nc) of the sequence
  int n_lo = 0;              // ring number of chunk c_lo (when nc == 0: the next free number)
  int ld_lo = 0, ld_hi = 0;  // chunks [ld_lo, ld_hi) this tile appends to the ring
  int k_lo = 0, k_hi = 0;    // the hull in keys: [lo of the first row, hi of the last row)
  bool valid = false;
};

// What a consumer needs of a tile, written by the producer next to the tile's Q buffer (so the walk
// runs once per CTA, in one thread, not in every consumer thread). valid == 0 ends the consumer's loop.
struct BandWgDesc {
  int q0, q_lo, q_hi;  // first packed query row of the sequence; local query rows of the tile
  int off, lk;         // the sequence's key offset lk - lq and key count (BandRule)
  int c_lo, nc, n_lo;  // the hull's chunks and the ring number of the first
  int next_n_lo;       // the next tile's first ring number (-1: no next tile)
  int valid;
};

template <int BM, int CK>
struct BandWgWalk {
  const Pattern* pat;
  int64_t t, t_end, total_q, total_k;
  bool varlen;
  int s_hint = 0;
  int cur_s = -1;      // sequence of the resident chunks
  int have_hi = 0;     // resident chunks end here (sequence chunk index)
  int prev_c_lo = 0;
  int shift = 0;       // ring number = chunk index + shift
  int n_next = 0;      // next free ring number

  __device__ BandWgWalk(const Pattern& p, int64_t first, int64_t end, int64_t tq, int64_t tk)
      : pat(&p), t(first), t_end(end), total_q(tq), total_k(tk), varlen(p.cu_seqlens_q != nullptr) {
    // The run's first sequence; later tiles only move forward from it.
    if (varlen) s_hint = virtual_tile_seq<BM>(p, first);
  }

  // The next virtual tile that holds query rows (virtual tiles past a sequence's end are empty).
  __device__ BandWgTile next() {
    BandWgTile b;
    while (t < t_end) {
      const int64_t v = t++;
      int64_t tile = v;
      if (varlen) {
        while (s_hint + 1 < pat->num_seqs && s_hint + 1 + pat->cu_seqlens_q[s_hint + 1] / BM <= v) ++s_hint;
        tile = v - (s_hint + pat->cu_seqlens_q[s_hint] / BM);
      }
      b.e = pat->seq(s_hint, total_q, total_k);
      if (tile * BM >= b.e.lq) continue;
      b.q_lo = int(tile * BM);
      b.q_hi = b.q_lo + BM < b.e.lq ? b.q_lo + BM : int(b.e.lq);
      const BandRule rule(*pat, b.e);
      int lo_last, hi_first;
      rule.bounds(b.q_lo, b.k_lo, hi_first);
      rule.bounds(b.q_hi - 1, lo_last, b.k_hi);
      b.valid = true;
      if (b.k_hi <= b.k_lo) {  // no row of the tile sees a key
        b.n_lo = n_next;
        return b;
      }
      const int c_lo = b.k_lo / CK, c_hi = (b.k_hi + CK - 1) / CK;
      if (s_hint == cur_s && c_lo >= prev_c_lo && c_lo <= have_hi) {
        b.ld_lo = have_hi;  // continues the resident chunks: only those past have_hi are new
        b.ld_hi = c_hi > have_hi ? c_hi : have_hi;
      } else {
        cur_s = s_hint;  // a new sequence or a jump: fresh ring numbers
        shift = n_next - c_lo;
        b.ld_lo = c_lo;
        b.ld_hi = c_hi;
      }
      have_hi = b.ld_hi;
      n_next = have_hi + shift;
      prev_c_lo = c_lo;
      b.c_lo = c_lo;
      b.nc = c_hi - c_lo;
      b.n_lo = c_lo + shift;
      return b;
    }
    return b;
  }
};

// The copy engine's tensor maps (encode_tile_map): per tensor, columns 0-63 (128-byte swizzle) and
// 64-79 (32-byte swizzle) of 64 rows of one head.
// Variant 2 adds the output's two maps (same boxes and swizzles) and out_tma: whether they were
// built (16-bit out whose rows the copy engine can address; otherwise every tile stores per thread).
// v21: out_rows: a call with a token order and 16-bit out whose rows start on 16 bytes: each tile's
// O rows leave through the consumer's staging tile, one bulk copy per row to its packed row.
// units_h > 0 (v16, v24): the q/k/v/o maps are 5-D over the merge-unit grid of a block_col order
// (encode_block_col_map): logical row r of the order is unit r / 4 (unit row (r / 4) % units_h,
// unit column (r / 4) / units_h) and row r % 4 inside it, and a 64-row tile is 16 units of one
// unit column, one box; the producer then loads ordered tiles with the copy engine and (v24) the
// epilogue stores them with it, as for the storage order.
struct BandWgMaps {
  CUtensorMap q_lo, q_hi, k_lo, k_hi, v_lo, v_hi, o_lo, o_hi;
  int out_tma, out_rows;
  int units_h, units_w;
};

// Timeline instrumentation (a diagnostic build only: cmake -DARIADNE_BANDWG_TIMELINE=ON;
// scripts/bandwg-timeline). Per CTA 128 words: [0] %globaltimer at entry (ns), [1] clock64 at
// entry, [2] the SM; then per consumer cw, its k-th tile (k < 5) and stamp s, word
// 3 + 40·cw + 8·k + s: clock64 (s 0) before the wait for the tile's Q, (1) after it, (2) after the
// waits for and releases of the chunks below the tile's first (variant 3), (3) after the wait for
// the tile's own chunks, (4) before its epilogue; in the copy engine's epilogue (5) after the wait
// for the staging tile and the first barrier, (6) after the writes to it (0 where the epilogue is
// another; word 7 unused). A tile's epilogue ends at the next tile's stamp 0 (the end marker's
// included). The words live in each translation unit's own copy (static):
// bandwg_timeline_read in attention_bandwg_d80.cu reads the one its kernels write.
#if defined(ARIADNE_BANDWG_TIMELINE)
constexpr int kTimelineCtas = 4096, kTimelineWords = 128, kTimelineStamps = 8;
static __device__ unsigned long long g_bandwg_timeline[kTimelineCtas * kTimelineWords];
__device__ __forceinline__ unsigned long long* timeline_cta() {
  const unsigned cta = blockIdx.y * gridDim.x + blockIdx.x;
  return cta < unsigned(kTimelineCtas) ? g_bandwg_timeline + cta * kTimelineWords : nullptr;
}
#define ARIADNE_BANDWG_STAMP(k, s)                                                               \
  do {                                                                                           \
    unsigned long long* tl_ = timeline_cta();                                                    \
    if (tl_ != nullptr && tid % 128 == 0 && (k) < 5)                                             \
      tl_[3 + 5 * kTimelineStamps * cw + kTimelineStamps * (k) + (s)] = clock64();               \
  } while (0)
#else
#define ARIADNE_BANDWG_STAMP(k, s) \
  do {                             \
  } while (0)
#endif

namespace bandwg {
// The copy engine's tensor store of one box from shared memory (bulk-group completion), and the
// waits on this thread's committed stores (wgmma.cuh): .read = the copy engine has finished
// reading shared memory (the buffer may be rewritten); the plain form = the writes are done.
using wg::bulk_commit;
using wg::bulk_wait_read_all;
using wg::tma_store_3d;
// One contiguous copy of `bytes` (a multiple of 16, both addresses 16-byte aligned) from shared to
// global memory, in this thread's bulk group.
__device__ __forceinline__ void bulk_store(void* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(src), "r"(bytes)
               : "memory");
}
// The same from a 5-D map (v24: a block_col order's tile, BandWgMaps::units_h).
__device__ __forceinline__ void tma_store_5d(const void* map, uint32_t src, int c0, int c1, int c2, int c3, int c4) {
  asm volatile("cp.async.bulk.tensor.5d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4, %5}], [%6];\n" ::"l"(map),
               "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(src)
               : "memory");
}
// The 5-D box (unit column, unit row) of the block_col tile whose first logical row is row0: the
// producer's loads and the epilogue's stores address it alike.
struct BlockColBox {
  int uc, ur;
};
__device__ __forceinline__ BlockColBox block_col_box(int row0, int units_h) {
  const int unit = row0 >> 2;
  return {unit / units_h, unit % units_h};
}
// The packed row of logical row r of a block_col order over units_h x units_w merge units stored
// in block_row order (BandWgMaps::units_h): unit r / 4 is unit row (r / 4) % units_h of unit column
// (r / 4) / units_h, stored at unit ur · units_w + uc, four rows each.
__device__ __forceinline__ int64_t block_col_row(int64_t r, int units_h, int units_w) {
  const int64_t unit = r >> 2, ur = unit % units_h, uc = unit / units_h;
  return 4 * (ur * units_w + uc) + (r & 3);
}
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
}  // namespace bandwg


// v13: the producer warpgroup of a call with a token order (FwdParams::order: logical row i lives
// at packed row order[i] of q, k, v, out and lse). The copy engine copies boxes of consecutive
// rows, not gathered ones, so all 128 producer threads fill the same rings with cp.async: thread t
// copies row t / 2 of each 64-row tile, 16-byte pieces 2j + t % 2 (j < 5), so that a thread pair
// reads one 32-byte sector per copy and a warp's 32 pieces fill 4 shared-memory wavefronts. Each
// piece goes where the TMA box would have put it (the swizzled tile layout above); the copies
// complete through cp.async.mbarrier.arrive.noinc on the tile's full barrier (count 128; q_full
// 192: each thread of an even tid also writes its row's packed row to `rows` (v21: the epilogue's
// scatter reads it there) and arrives plainly, which releases it; thread 0 writes the descriptor
// first). Entry i mod 2·QSLOT of tile i is rewritten for tile i + 2·QSLOT only after the wait on
// q_empty for tile i + QSLOT, which that tile's consumer, tile i's own (QSLOT is a multiple of
// NCONS), signals after tile i's epilogue.
// Every thread walks the same tiles and waits on the same empty barriers before refilling a slot,
// so no thread's arrival can land in a barrier phase the consumers have not finished. Rows past a
// sequence's keys (queries) are zero-filled. One order[] load per thread and tile (K and V of a
// chunk share it), issued before the wait on the slot.
template <int D, class E, int NCONS>
__device__ __forceinline__ void bandwg_gather_producer(const FwdParams& p, int64_t first, int64_t last,
                                                       BandWgDesc* descs, int32_t* rows, typename E::type* Qs,
                                                       typename E::type* Ks, typename E::type* Vs,
                                                       uint32_t bars) {
  using S = BandWgShape<D, NCONS>;
  using T = typename E::type;
  constexpr int BM = S::BM, CK = S::CK, NSLOT = S::NSLOT, QSLOT = S::QSLOT;
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
      wg::mbar_arrive_cp_async(full(st));  // v26: K and V of the chunk on one barrier
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

// V2 (bench/cuda-notes.md, v11e): the exponentials, masks and maxima of 16-key column pairs that
// none of a warp's 16 rows sees are skipped (their probabilities are exactly 0, as before), and
// full tiles (and a tensor's last, partial tile) leave through a shared-memory staging tile and
// two TMA stores instead of 20 scattered stores per thread. Same arithmetic, same results.
// V = 1 (v11), 2 (v11e) or 3 (v14: variant 2 with three consumer warpgroups; a 4-chunk tile's S
// in two passes of 2 chunks with a rescale, so that it fits the consumers' 152 registers; S and
// P·V latencies overlapped inside the consumer, OVL).
// BC (v24, variant 3 only): a block_col order whose tiles the copy engine loads and stores through
// 5-D maps (BandWgMaps::units_h); a separate instantiation, so that the storage order's code is
// the same as without it.
// CH (v43, variant 3 only): a chunked call's kernel, whose tiles with a one-chunk hull (a 64-row
// tile of 64-aligned chunks of 64: Qwen's windows) take a one-chunk pass instead of the 3-chunk
// pass with two masked chunks; a separate instantiation, so the window kernels' code is unchanged.
template <int D, class E, int V, bool BC = false, bool CH = false>
__global__ void __launch_bounds__(BandWgShape<D, V == 3 ? 3 : 2>::threads, 1)
    attention_bandwg_kernel(const FwdParams p, const int run, const __grid_constant__ BandWgMaps maps) {
  static_assert(D == 80, "the tile layout splits the head dim as 64 + 16");
  constexpr bool V2 = V >= 2;
  constexpr int NCONS = V == 3 ? 3 : 2;
  constexpr bool OVL = V == 3;  // S and P·V latencies overlapped inside the consumer (v14; compute below)
  // The tile layout: columns 0-63 of the 64 rows in 128-byte rows with the 128-byte swizzle (8 KB,
  // as the copy engine writes it and wgmma reads it), then columns 64-79 in 32-byte rows with the
  // 32-byte swizzle (2 KB). Each copy is then two boxes of 128- and 32-byte rows, instead of ten of
  // 16-byte rows in the no-swizzle layout (whose small rows held the copy engine to ~2 TB/s).
  constexpr uint32_t kLoBytes = 64 * 128;
  using S = BandWgShape<D, NCONS>;
  constexpr int BM = S::BM, CK = S::CK, NSLOT = S::NSLOT, QSLOT = S::QSLOT, MAXC = S::MAXC;
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
#if defined(ARIADNE_BANDWG_TIMELINE)
  if (tid == 0 && timeline_cta() != nullptr) {
    unsigned long long t, smid;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    asm volatile("{ .reg .u32 r; mov.u32 r, %%smid; cvt.u64.u32 %0, r; }" : "=l"(smid));
    timeline_cta()[0] = t;
    timeline_cta()[1] = clock64();
    timeline_cta()[2] = smid;
  }
#endif

  const bool varlen = pat.cu_seqlens_q != nullptr;
  const int64_t n_virtual = varlen ? pat.num_seqs + p.total_q / BM + 1 : (p.total_q + BM - 1) / BM;
  const int64_t first = int64_t(blockIdx.x) * run;
  const int64_t last = first + run < n_virtual ? first + run : n_virtual;
  BandWgDesc* descs = reinterpret_cast<BandWgDesc*>(bandwg_smem + S::desc_offset);
  int32_t* rows = reinterpret_cast<int32_t*>(bandwg_smem + S::rows_offset);  // v21, ordered calls

  // v13: with a token order the producer warpgroup gathers rows with cp.async (see the ordered
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
      bandwg_gather_producer<D, E, NCONS>(p, first, last, descs, rows, Qs, Ks, Vs, bars);
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
        // v26: K and V of the chunk complete on one barrier (one arrival, both tiles' bytes).
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
    ARIADNE_BANDWG_STAMP(i / NCONS, 0);
    wg::mbar_wait(q_full(qs), uint32_t(i / QSLOT) & 1);
    ARIADNE_BANDWG_STAMP(i / NCONS, 1);
    const BandWgDesc cur = descs[qs];  // read before q_empty releases the slot
    if (!cur.valid) {
      // V2: the CTA's shared memory must outlive the copy engine's last store from it.
      // v21: with rows copied per lane, every lane 0 of a quad may hold bulk groups.
      if (V2 && (tid % 128 == 0 || (maps.out_rows != 0 && tq == 0))) bandwg::bulk_wait_all();
      break;
    }
    if constexpr (NCONS == 3) {
      // v14: every chunk below this tile's first is dead for this consumer (its later tiles start
      // at or above it): release those now, not only after the tile (see the ring protocol), and
      // before waiting for this tile's chunks, whose loads may wait for these releases.
      wait_chunks(cur.n_lo);
      for (; released < cur.n_lo; ++released) wg::mbar_arrive(empty(released % NSLOT));
    }
    ARIADNE_BANDWG_STAMP(i / NCONS, 2);
    wait_chunks(cur.n_lo + cur.nc);
    ARIADNE_BANDWG_STAMP(i / NCONS, 3);
    // v13: gathered tiles were written by cp.async (the generic proxy); wgmma reads through the
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
    // V2: keys [w_lo, w_hi) hold all this warp's rows see: lo of its first row (lane 0, r 0), hi of
    // its last (lane 28, r 1). The shuffles also make them warp-uniform for the compiler.
    int w_lo = 0, w_hi = 0;
    if constexpr (V2) {
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
    // (variant 3's second pass over a 4-chunk hull) continues the first as an online softmax: the
    // row maxima grow, the first pass's sums and O are rescaled. LAST: the pass that ends the
    // tile's reads of Q.
    auto compute = [&](auto nch_tag, auto c0_tag, auto last_tag) {
      constexpr int NCH = decltype(nch_tag)::value, C0 = decltype(c0_tag)::value;
      constexpr bool LAST = decltype(last_tag)::value != 0;
      static_assert(C0 == 0 || V2, "v11 computes the hull in one pass");
      uint32_t slot[NCH];
#pragma unroll
      for (int c = 0; c < NCH; ++c) slot[c] = uint32_t((n_lo + (C0 + c < nc ? C0 + c : 0)) % NSLOT) * kTileBytes;
      float sc[NCH][32];
      uint32_t pa[NCH][4][4];  // P packed to 16 bits: the A fragments of P·V, per 16-key k-step
      float alpha[2] = {1.f, 1.f};  // C0 > 0: the factor of the earlier pass's O and sums, per row
      // S of chunk c = Q·Kᵀ (64 x 64, D/16 k-steps).
      // (v46: each region's descriptor built once per chunk, the k-steps added: wg::desc_at.)
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

      // V2: 16-key pairs of 8-column blocks (one k-step of P·V) that no row of this warp sees are
      // skipped: no mask, no max, no exponential, P = 0 exactly (what the masked exponentials
      // gave). [w_lo, w_hi) holds every key the warp's rows see (the bounds grow with the row: no
      // chunk here), and chunks past nc hold none. Live pairs get the masks, maxima and sums of
      // the v11 path in the same order, so the results are the same.
      const int live_hi = w_hi - kb0 < nc * CK ? w_hi - kb0 : nc * CK, live_lo = w_lo - kb0 - 16;
      // v40 (session 13): the block_col kernel (BC) runs every pair through the masks instead: no
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
      // V2: masks and maxima of chunk c's live pairs.
      auto mask_max = [&](int c) {
        const int kb = kb0 + (C0 + c) * CK;
        const bool edge = kb < full_lo || kb + CK > full_hi || (key0 && kb == 0);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          if (!live(c, kk)) continue;
          if (edge) {  // per element, as in v11: col - lo < hi - lo
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
      // V2: the rows' maxima over the quad (and, C0 > 0, over the earlier pass).
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
      // V2: exponentials, sums and packed P of chunk c.
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

      if constexpr (OVL) {
        // Variant 3: each chunk's S in its own commit group; its masks and maxima run while the
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
      } else {
        // S of all chunks in one commit group.
#pragma unroll
        for (int c = 0; c < NCH; ++c) wg::pin(sc[c]);
        wg::fence();
#pragma unroll
        for (int c = 0; c < NCH; ++c) issue_s(c);
        wg::commit();
#pragma unroll
        for (int c = 0; c < NCH; ++c) wg::pin(sc[c]);
        wg::wait<0>();
#pragma unroll
        for (int c = 0; c < NCH; ++c) wg::pin(sc[c]);
        if constexpr (LAST) wg::mbar_arrive(q_empty(qs));  // this thread's reads of the Q buffer are complete

        if constexpr (V2) {
#pragma unroll
          for (int c = 0; c < NCH; ++c) mask_max(c);
          row_max();
#pragma unroll
          for (int c = 0; c < NCH; ++c) exp_pack(c);
          row_sum();
        } else {  // v11
          // Masks: chunks past nc entirely; edge chunks (and key 0's chunk under a key-0 sink) per
          // element, a column's test one unsigned compare: col - lo < hi - lo.
#pragma unroll
          for (int c = 0; c < NCH; ++c) {
            const int kb = kb0 + c * CK;
            if (c >= nc) {
#pragma unroll
              for (int x = 0; x < 32; ++x) sc[c][x] = -INFINITY;
            } else if (kb < full_lo || kb + CK > full_hi || (key0 && kb == 0)) {
#pragma unroll
              for (int r = 0; r < 2; ++r) {
                const int rel = row_lo[r] - kb - 2 * tq;
                const unsigned width = row_hi[r] > row_lo[r] ? unsigned(row_hi[r] - row_lo[r]) : 0u;
#pragma unroll
                for (int n8 = 0; n8 < 8; ++n8)
#pragma unroll
                  for (int x = 0; x < 2; ++x)
                    if (unsigned(n8 * 8 + x - rel) >= width) sc[c][4 * n8 + 2 * r + x] = -INFINITY;
              }
              if (key0 && kb == 0 && tq == 0) {  // column 0: n8 0, x 0 of lane tq 0
#pragma unroll
                for (int r = 0; r < 2; ++r)  // only where allowed: a NaN bias must not reach a masked key
                  if (row_lo[r] == 0 && row_hi[r] > 0) sc[c][2 * r] += sink_raw;
              }
            }
          }
          // One-pass softmax: the hull is the whole row.
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            float mxh[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int c = 0; c < NCH; ++c)
#pragma unroll
              for (int n8 = 0; n8 < 8; ++n8)
                mxh[n8 & 1] = fmax_nan(mxh[n8 & 1], fmax_nan(sc[c][4 * n8 + 2 * r], sc[c][4 * n8 + 2 * r + 1]));
            float mx = quad_max(fmax_nan(mxh[0], mxh[1]));
            mx *= p.scale_log2;
            // A row with no allowed key keeps max −inf; subtracting 0 keeps exp2(−inf) = 0, not NaN.
            const float b = mx == -INFINITY ? 0.f : mx;
            float sumh[2] = {0.f, 0.f};
#pragma unroll
            for (int c = 0; c < NCH; ++c)
#pragma unroll
              for (int n8 = 0; n8 < 8; ++n8) {
#pragma unroll
                for (int x = 0; x < 2; ++x) {
                  float& v = sc[c][4 * n8 + 2 * r + x];
                  v = ex2(fmaf(v, p.scale_log2, -b));
                }
                sumh[n8 & 1] += sc[c][4 * n8 + 2 * r] + sc[c][4 * n8 + 2 * r + 1];
              }
            m_row[r] = mx;
            l_row[r] = sumh[0] + sumh[1];
          }

          // P packed (accumulator layout = A fragment layout).
#pragma unroll
          for (int c = 0; c < NCH; ++c)
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
#pragma unroll
              for (int j = 0; j < 4; ++j) pa[c][kk][j] = E::pack(sc[c][8 * kk + 2 * j], sc[c][8 * kk + 2 * j + 1]);
        }

        // O = P·V (accumulated onto the rescaled earlier pass).
        init_acc();
        wg::pin(acc_lo);
        wg::pin(acc_hi);
        wg::fence();
#pragma unroll
        for (int c = 0; c < NCH; ++c) issue_pv(c);
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
      if constexpr (CH) compute(IntTag<1>{}, IntTag<0>{}, IntTag<1>{});  // v43: one 64-key chunk
    } else if (!CH && nc <= 3) {  // (v43: the chunk kernel takes 2-4 chunks in the two passes below)
      compute(IntTag<3>{}, IntTag<0>{}, IntTag<1>{});  // a 64-row tile of an aligned ±64 window: 192 keys
    } else if constexpr (NCONS == 3) {
      // v14: S of 4 chunks (128 registers) does not fit 152 next to the rest: two passes of 2.
      compute(IntTag<2>{}, IntTag<0>{}, IntTag<0>{});
      compute(IntTag<2>{}, IntTag<2>{}, IntTag<1>{});
    } else {
      compute(IntTag<MAXC>{}, IntTag<0>{}, IntTag<1>{});
    }
    // The next tile's first ring number bounds the chunks no later tile uses: release them.
    if (cur.next_n_lo >= 0) {
      wait_chunks(cur.next_n_lo);
      for (; released < cur.next_n_lo; ++released) wg::mbar_arrive(empty(released % NSLOT));
    }

    ARIADNE_BANDWG_STAMP(i / NCONS, 4);
    // Row r's final max m and sum l (summed over the quad), for both epilogues. A denominator sink
    // is one more key with no value, Z = exp(sink) + Σ exp(s): folded into m, l and the row's O.
    auto finish_row = [&](int r, float& m, float& l) {
      l = quad_sum(l_row[r]);
      m = m_row[r];
      fold_sink_row<D / 8>(p.sink_kind, sink_log2, m, l, [&](int n8, int x) -> float& { return acc(n8, 2 * r + x); });
    };

    // V2: a tile whose 64 rows are all its sequence's, or whose rows past the end are past the
    // tensor's end too (the map's bounds clip them: they belong to nobody), leaves through this
    // consumer's staging tile (the tile layout of Q) and two TMA stores. Other tiles (a varlen
    // sequence's partial last tile, f32 out, or no map) store per thread as in v11.
    bool tma_tile = false;
    if constexpr (V2)
      // v13: a gathered order scatters rows (per thread or v21's row copies); v24: block_col tiles
      // are boxes of their 5-D map, stored like the storage order's.
      tma_tile = maps.out_tma != 0 && !gather &&
                 (cur.q_hi - cur.q_lo == BM || int64_t(cur.q0) + cur.q_hi == p.total_q);
    if (tma_tile) {
      // ---- epilogue (V2): normalize, sink, LSE; O through shared memory and the copy engine ----
      const uint32_t stage = smem_addr(bandwg_smem + S::stage_offset) + uint32_t(cw) * kTileBytes;
      // The previous TMA store from this staging tile must have finished reading it.
      if (tid % 128 == 0) bandwg::bulk_wait_read_all();
      wg::named_bar_sync(1 + cw, 128);
      ARIADNE_BANDWG_STAMP(i / NCONS, 5);
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
      ARIADNE_BANDWG_STAMP(i / NCONS, 6);
      wg::fence_proxy_async();  // this thread's writes, before the copy engine (async proxy) reads them
      wg::named_bar_sync(1 + cw, 128);
      if (tid % 128 == 0) {
        const int row0 = cur.q0 + cur.q_lo;
        if constexpr (BC) {  // v24: a block_col tile: one 5-D box
          const bandwg::BlockColBox box = bandwg::block_col_box(row0, maps.units_h);
          bandwg::tma_store_5d(&maps.o_lo, stage, 0, h, 0, box.uc, box.ur);
          bandwg::tma_store_5d(&maps.o_hi, stage + kLoBytes, 64, h, 0, box.uc, box.ur);
        } else {
          bandwg::tma_store_3d(&maps.o_lo, stage, 0, h, row0);
          bandwg::tma_store_3d(&maps.o_hi, stage + kLoBytes, 64, h, row0);
        }
        bandwg::bulk_commit();
      }
    } else if (V2 && maps.out_rows != 0) {
      // ---- epilogue (v21, a token order): rows staged plainly, one bulk copy per row ----
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
        // v13: logical row q0 + iq is stored at packed row order[q0 + iq] (out and LSE).
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

// A tensor map over rows x heads x head dim (strides in elements, head dim contiguous) whose
// box is box_cols columns x 1 head x 64 rows (64 with the 128-byte swizzle, 16 with the 32-byte one:
// the two regions of a tile, as the producer copies them), encoded by the driver's
// cuTensorMapEncodeTiled (tensor_map.hpp). bandwg_eligible (attention_cuda.cu) admits only
// layouts it accepts: 16-byte aligned rows, strides increasing from head dim to heads to rows.
inline cudaError_t encode_tile_map(CUtensorMap* map, const void* base, bool bf16, int d, int heads, int64_t rows,
                                   int64_t head_stride, int64_t tok_stride, int box_cols, CUtensorMapSwizzle swizzle) {
  const EncodeTiled encode = encode_tiled();
  if (encode == nullptr) return cudaErrorNotSupported;
  const cuuint64_t dims[3] = {cuuint64_t(d), cuuint64_t(heads), cuuint64_t(rows)};
  const cuuint64_t strides[2] = {cuuint64_t(head_stride) * 2, cuuint64_t(tok_stride) * 2};  // bytes
  const cuuint32_t box[3] = {cuuint32_t(box_cols), 1, 64}, unit[3] = {1, 1, 1};
  const CUresult r = encode(map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3,
                            const_cast<void*>(base), dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// The 5-D map of a block_col order's tiles (BandWgMaps::units_h): dims (head dim, heads, 4 rows of
// a merge unit, units_w unit columns, units_h unit rows) over the block_row storage, where unit
// (ur, uc) holds packed rows 4 (ur · units_w + uc) .. + 3; box (box_cols, 1, 4, 1, 16): one 64-row
// tile of the order, its rows in order (unit row, then row in the unit), the same shared-memory
// layout as encode_tile_map's box.
inline cudaError_t encode_block_col_map(CUtensorMap* map, const void* base, bool bf16, int d, int heads,
                                        int units_h, int units_w, int64_t head_stride, int64_t tok_stride,
                                        int box_cols, CUtensorMapSwizzle swizzle) {
  const EncodeTiled encode = encode_tiled();
  if (encode == nullptr) return cudaErrorNotSupported;
  const cuuint64_t dims[5] = {cuuint64_t(d), cuuint64_t(heads), 4, cuuint64_t(units_w), cuuint64_t(units_h)};
  const cuuint64_t strides[4] = {cuuint64_t(head_stride) * 2, cuuint64_t(tok_stride) * 2,
                                 cuuint64_t(tok_stride) * 2 * 4, cuuint64_t(tok_stride) * 2 * 4 * units_w};
  const cuuint32_t box[5] = {cuuint32_t(box_cols), 1, 4, 1, 16}, unit[5] = {1, 1, 1, 1, 1};
  const CUresult r = encode(map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 5,
                            const_cast<void*>(base), dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// Virtual tiles (the tile kernel's varlen cover) cut into runs; grid (runs, heads_q), one CTA per
// SM (~200 KB of shared memory). `run` <= 0 picks the length: the longest runs that still give
// every SM work in one wave. V: the variant (ARIADNE_BANDWG_V, attention_cuda.cu): 1 (v11), 2
// (v11e), 3 (v14: three consumer warpgroups).
template <int D, class E, int V>
cudaError_t launch_bandwg(const FwdParams& p, int run, bool chunk_pass_on, cudaStream_t stream) {
  constexpr bool V2 = V >= 2;
  using S = BandWgShape<D, V == 3 ? 3 : 2>;
  // A block_col order the copy engine can follow (FwdParams::order_units_h; the dispatcher checks
  // the shape; variant 3 only): the BC kernel and 5-D maps; other orders gather.
  const bool block_col = V == 3 && p.order != nullptr && p.order_units_h > 0;
  // A chunked call (not block_col) takes the kernel with the one-chunk pass unless the plan turned
  // it off (AttentionOverrides::chunk_pass).
  const bool chunk_pass = V == 3 && !block_col && p.pattern.chunk > 0 && chunk_pass_on;
  // The storage-order kernel and (variant 3) the block_col and chunk kernels (below variant 3
  // those two are the storage-order kernel again).
  constexpr auto storage = attention_bandwg_kernel<D, E, V>, bc = attention_bandwg_kernel<D, E, V, V == 3>,
                 ch = attention_bandwg_kernel<D, E, V, false, V == 3>;
  const auto kernel = block_col ? bc : chunk_pass ? ch : storage;
  constexpr size_t smem = V2 ? S::smem_bytes_v2 : S::smem_bytes;
  static const cudaError_t configured = allow_dynamic_smem({storage, bc, ch}, smem);
  if (configured != cudaSuccess) return configured;
  static const int slots = resident_cta_slots(storage, S::threads, smem);
  if (slots <= 0) return cudaErrorInvalidConfiguration;
  const int64_t runs = band_runs(p, S::BM, slots, run);
  const bool bf16 = std::is_same_v<E, Bf16>;
  const int heads_kv = p.heads_q / p.group;
  BandWgMaps maps{};
  struct Src {
    CUtensorMap *lo, *hi;
    const void* base;
    int heads;
    int64_t rows, head_stride, tok_stride;
  };
  // A tensor's two maps (columns 0-63 with the 128-byte swizzle, 64-79 with the 32-byte one):
  // tiles of rows, or the 5-D merge-unit boxes of a block_col order.
  const auto encode_pair = [&](const Src& t) {
    const auto encode = [&](CUtensorMap* m, int cols, CUtensorMapSwizzle sw) {
      return block_col ? encode_block_col_map(m, t.base, bf16, D, t.heads, p.order_units_h, p.order_units_w,
                                              t.head_stride, t.tok_stride, cols, sw)
                       : encode_tile_map(m, t.base, bf16, D, t.heads, t.rows, t.head_stride, t.tok_stride, cols, sw);
    };
    cudaError_t err = encode(t.lo, 64, CU_TENSOR_MAP_SWIZZLE_128B);
    if (err == cudaSuccess) err = encode(t.hi, 16, CU_TENSOR_MAP_SWIZZLE_32B);
    return err;
  };
  maps.units_h = block_col ? p.order_units_h : 0;
  maps.units_w = block_col ? p.order_units_w : 0;
  if (p.order == nullptr || block_col) {
    for (const Src& t : {Src{&maps.q_lo, &maps.q_hi, p.q, p.heads_q, p.total_q, p.q_head, p.q_tok},
                         Src{&maps.k_lo, &maps.k_hi, p.k, heads_kv, p.total_k, p.k_head, p.k_tok},
                         Src{&maps.v_lo, &maps.v_hi, p.v, heads_kv, p.total_k, p.v_head, p.v_tok}}) {
      const cudaError_t err = encode_pair(t);
      if (err != cudaSuccess) return err;
    }
  }
  if constexpr (V2) {
    // The output's maps, for 16-bit out whose layout the copy engine can address (16-byte aligned
    // base and strides, strides increasing from head dim to heads to rows, as for q/k/v); else (or
    // if the encoder refuses) every tile stores per thread. Rows = total_q: the store clips the rest.
    const int64_t o_head = p.o_head, o_tok = p.o_tok;
    // v24: a block_col order's output gets the 5-D maps of its q/k/v (one box per tile).
    if ((p.order == nullptr || block_col) && !p.out_f32 && reinterpret_cast<uintptr_t>(p.out) % 16 == 0 &&
        o_head % 8 == 0 && o_tok % 8 == 0 && o_head >= D && o_tok >= o_head * p.heads_q) {
      maps.out_tma = encode_pair(Src{&maps.o_lo, &maps.o_hi, p.out, p.heads_q, p.total_q, o_head, o_tok}) == cudaSuccess;
    }
    // v21: gathered orders copy O row by row (bulk copies need 16-byte aligned rows and base).
    maps.out_rows = p.order != nullptr && !block_col && !p.out_f32 && reinterpret_cast<uintptr_t>(p.out) % 16 == 0 &&
                    o_head % 8 == 0 && o_tok % 8 == 0;
  }
  kernel<<<dim3(unsigned(runs), unsigned(p.heads_q)), S::threads, smem, stream>>>(p, run, maps);
  return cudaGetLastError();
}

#define ARIADNE_BANDWG_KERNELS(X, D)                                                                 \
  X(launch_bandwg<D, Bf16, 1>) X(launch_bandwg<D, F16, 1>) X(launch_bandwg<D, Bf16, 2>)              \
  X(launch_bandwg<D, F16, 2>) X(launch_bandwg<D, Bf16, 3>) X(launch_bandwg<D, F16, 3>)
#define ARIADNE_BANDWG_INSTANTIATE_ONE(...) \
  template cudaError_t __VA_ARGS__(const FwdParams&, int, bool, cudaStream_t);
#define ARIADNE_BANDWG_DECLARE_ONE(...) \
  extern template cudaError_t __VA_ARGS__(const FwdParams&, int, bool, cudaStream_t);
#define ARIADNE_INSTANTIATE_BANDWG(D) ARIADNE_BANDWG_KERNELS(ARIADNE_BANDWG_INSTANTIATE_ONE, D)
ARIADNE_BANDWG_KERNELS(ARIADNE_BANDWG_DECLARE_ONE, 80)

}  // namespace ariadne::cuda
