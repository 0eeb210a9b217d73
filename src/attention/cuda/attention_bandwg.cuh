// Internal: the Hopper (sm_90a) band kernel for sliding windows and short chunks: wgmma products
// over a shared-memory ring of 64-key chunks, fed by a producer warpgroup (the band walk of
// attention_band.cuh on the warp-specialized structure of attention_wgmma.cuh). The kernel is
// split by concern: bandwg_shape.cuh (shapes, shared-memory layout, tile descriptors, maps, copy
// helpers), bandwg_walk.cuh (the tile walk), bandwg_producer.cuh (the gathering producer of token
// orders), bandwg_kernel.cuh (producer, consumers and epilogues), bandwg_launch.cuh (maps and launch).
//
// Why: the per-warp band kernel (attention_band.cuh) computes only the 16-key chunks each 16-row
// warp sees (useful fraction 0.90 on a ±64 window) but issues ~180 mma.sync per warp-tile and stays
// instruction-issue bound at 8 warps per SM. Here a consumer warpgroup takes a whole 64-row query
// tile and its key hull (±64 aligned: 192 keys, useful fraction 0.67) with ~30 asynchronous wgmma
// instructions, and three consumers take tiles in turn so that one's softmax runs under the
// others' products.
//
// A CTA of 4 warpgroups (512 threads, one CTA per SM: ~221 KB of shared memory) walks a run of
// consecutive 64-row query tiles of one query head (the varlen cover of the tile kernel, crossing
// sequence ends):
//   - warpgroup 0, the producer (40 registers): one thread walks the tiles, writes each tile's
//     descriptor (BandWgDesc) next to its Q buffer, and has the copy engine (TMA tensor copies
//     completing on mbarriers) bring the tile's Q into a ring of QSLOT = 3 buffers and the 64-key
//     chunks of K and V the tile adds into a ring of NSLOT chunks, K and V of a chunk on one
//     barrier (every wait is a shared-memory synchronization op of ~50-100 cycles);
//   - warpgroups 1-3, the consumers (152 registers), take tiles i % 3: S = Q·Kᵀ by wgmma
//     m64n64k16 per chunk (both from shared memory), masks and a one-pass softmax in registers
//     (the whole key hull is in one S, so no running max; a 4-chunk hull in two passes of 2
//     chunks with an online rescale, to fit 152 registers), P packed to 16 bits as the register A
//     operand of O = P·V (wgmma m64n64k16 + m64n16k16 over V's two layout regions), then the
//     epilogue. Each chunk's S is its own wgmma group (its masks and maxima run while the later
//     chunks' S compute) and P·V of the first chunks runs under the last chunk's exponentials.
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
// waits to load a chunk of tile T; every tile before T is loaded. The owner of T, whose last tile
// was T-3, would hold from T-2's first on, three tiles' chunks; so a consumer also releases at a
// tile's start every chunk below that tile's first, which the owner of T can do (Q and the
// descriptor of T precede its chunks in the producer's order, and Q(T) waits only for S of
// T-QSLOT), bringing the bound back to T-1's first: NSLOT 8 holds.)
// After the last tile the producer publishes one end marker (valid = 0) per consumer.
//
// Eligible (bandwg_refuses in attention_cuda.cu): sliding windows with left + right <= 129 (a
// 64-row tile's hull of <= 193 keys meets at most MAXC = 4 chunks) or chunks of <= 65 keys
// (BandRule clips each row to its chunk: hull <= 62 + 2 x 65 keys; a 64-aligned chunk of 64 is one
// ring chunk a tile), no block mask, no diagnostics, head dim 80, compute capability 9.0, rows and
// keys below 2^30, q/k/v strides increasing from head dim to heads to rows. A token order is
// taken too: the producer warpgroup then gathers the rows with cp.async (bandwg_gather_producer)
// and O leaves by rows, or, for Qwen's block_col order of one image, the copy engine loads and
// stores 5-D boxes. Sinks (both forms), GQA, varlen with lq != lk (bottom-right aligned), f32 /
// 16-bit out and LSE are handled as in the other kernels. Rows past a sequence's end are copied
// from the tensor's next rows (zeros past the tensor's end) and get probability exactly 0.
// Issuing the next tile's S before the current tile's epilogue measured slower and is not done.
#pragma once

#include "attention/cuda/bandwg_launch.cuh"
