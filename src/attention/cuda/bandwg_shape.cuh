// Internal: the wgmma band kernel's shapes and shared-memory layout, the tile descriptors producer
// and consumers share, its tensor maps and copy-engine helpers (attention_bandwg.cuh says how the
// kernel works).
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

// Three consumer warpgroups, so that more warps per scheduler hide the softmax latency; shared
// memory and registers are cut to fit (below).
template <int D>
struct BandWgShape {
  static constexpr int NCONS = 3;    // consumer warpgroups
  static constexpr int BM = 64;      // query rows per tile (one consumer warpgroup)
  static constexpr int CK = 64;      // keys per ring chunk
  static constexpr int NSLOT = 8;    // K/V ring chunks (>= 2 x MAXC, see the ring protocol)
  // Q tile buffers: one per consumer (the staging tiles take the room of more).
  static constexpr int QSLOT = 3;
  static constexpr int MAXC = 4;     // chunks a tile's hull of <= 64 + 129 keys may meet
  static constexpr int kMaxSpan = 129;  // window left + right the kernel accepts
  static constexpr int kMaxChunk = 65;  // chunk sizes it accepts (hull <= 62 + 2 x 65 keys: 4 chunks)
  static constexpr int threads = 128 * (1 + NCONS);
  // setmaxnreg per warpgroup: 128 x (producer + NCONS x consumer) registers <= 65536, the SM's file.
  // The producer gets 40 (the gather producer's code uses 34) and the consumers 152, which the
  // 3-chunk path fits and the 4-chunk path fits as two passes of 2 chunks.
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 152;
  static_assert(128 * (kProducerRegs + NCONS * kConsumerRegs) <= 65536, "register file");
  static constexpr int C = D / 8;    // 16-byte pieces (core-matrix columns) per row
  static constexpr int tile_elems = 64 * D;
  // QSLOT Q tiles, NSLOT K chunks, NSLOT V chunks, then the mbarriers (8 bytes each):
  // full[NSLOT] (K and V of a chunk), empty[NSLOT], q_full[QSLOT], q_empty[QSLOT].
  static constexpr size_t bar_offset = size_t(QSLOT + 2 * NSLOT) * tile_elems * 2;
  static constexpr size_t desc_offset = bar_offset + 8 * (2 * NSLOT + 2 * QSLOT);
  // + one BandWgDesc per Q buffer, then the packed rows of the last 2 x QSLOT tiles of an ordered
  // call: tile i's in entry i mod 2·QSLOT, for its consumer's epilogue.
  static constexpr size_t rows_offset = desc_offset + 64 * QSLOT;
  static constexpr size_t rows_end = rows_offset + 4 * 64 * 2 * QSLOT;
  // Then one output staging tile per consumer (the epilogue's TMA store reads it), 1024-byte
  // aligned for the 128-byte swizzle: ~221 KB in all, under the 227 KB limit.
  static constexpr size_t stage_offset = (rows_end + 1023) / 1024 * 1024;
  static constexpr size_t smem_bytes = stage_offset + NCONS * size_t(tile_elems) * 2;
  static_assert(smem_bytes <= 227 * 1024, "shared memory per block");
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

// The copy engine's tensor maps (encode_tile_map): per tensor, columns 0-63 (128-byte swizzle) and
// 64-79 (32-byte swizzle) of 64 rows of one head, the output's two maps (same boxes and swizzles)
// and out_tma: whether they were built (16-bit out whose rows the copy engine can address;
// otherwise every tile stores per thread).
// out_rows: a call with a token order and 16-bit out whose rows start on 16 bytes: each tile's
// O rows leave through the consumer's staging tile, one bulk copy per row to its packed row.
// units_h > 0: the q/k/v/o maps are 5-D over the merge-unit grid of a block_col order
// (encode_block_col_map): logical row r of the order is unit r / 4 (unit row (r / 4) % units_h,
// unit column (r / 4) / units_h) and row r % 4 inside it, and a 64-row tile is 16 units of one
// unit column, one box; the producer then loads ordered tiles with the copy engine and the
// epilogue stores them with it, as for the storage order.
struct BandWgMaps {
  CUtensorMap q_lo, q_hi, k_lo, k_hi, v_lo, v_hi, o_lo, o_hi;
  int out_tma, out_rows;
  int units_h, units_w;
};

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
// The same from a 5-D map (a block_col order's tile, BandWgMaps::units_h).
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

}  // namespace ariadne::cuda
