// Internal entry points of the CUDA backend beyond backends.hpp. Plain C++ (no CUDA headers), so
// benchmarks and tests compiled by the host compiler can call them.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "ariadne/attention.hpp"

namespace ariadne {

// Whether environment variable `name` is set to `value`. The backend's routing and A/B switches
// (ARIADNE_BAND, ARIADNE_TMA, ...) read it per call, so one process can compare both settings.
inline bool env_is(const char* name, std::string_view value) {
  const char* env = std::getenv(name);
  return env != nullptr && value == env;
}

// The tile shape the backend picks for a call, for cost models and benchmarks that report the
// useful-work fraction of the tiles next to the time.
int cuda_query_tile_rows(const AttentionParams& p);  // 64 or 128 (16 on the band kernel: rows per warp)
int cuda_key_tile_rows(const AttentionParams& p);    // 64 (128 on the wgmma kernel, 16 on the band kernel,
                                                     // 64 on the wgmma band kernel)

// Whether attention_cuda runs this call on the Hopper wgmma kernel (src/attention/cuda/attention_wgmma.cuh):
// ARIADNE_WGMMA=0 is not set, the GPU is compute capability 9.0, and the call is one it handles (dense
// rows: no left window bound, no chunk, no block mask, no entropy/distance; head dim 64, 80, 128).
bool cuda_uses_wgmma(const AttentionParams& p);

// Whether that kernel copies q, k, v with TMA (bench/cuda-notes.md v12): it runs on wgmma, the
// driver built the three tensor maps, and ARIADNE_TMA=0 is not set in the environment. Otherwise
// its producer copies with cp.async (as it always does for tiles with rows past a sequence's end).
bool cuda_wgmma_uses_tma(const AttentionParams& p);

// Whether that kernel runs with its consumers taking turns (ping-pong): always at head dim 64 and
// 80; at 128 when its query tiles visit at most 40 key tiles on average as far as the host knows
// (one sequence of dense rows, or block-sparse rows with AttentionParams::blocks_nnz); forced by
// ARIADNE_WG_PINGPONG=1 / 0. False when the call does not run on the wgmma kernel.
bool cuda_wgmma_pingpong(const AttentionParams& p);

// Whether that kernel stores O through shared memory and the copy engine (head dim 128 or 80,
// 16-bit out whose tensor map the driver built, TMA on, ARIADNE_WG_OUT_TMA=0 not set); a consumer
// whose 64 rows leave its sequence still stores per thread.
bool cuda_wgmma_stores_by_tma(const AttentionParams& p);

// Whether attention_cuda runs this call on the band-walking kernel (src/attention/cuda/attention_band.cuh):
// no block mask, no entropy/distance, head dim 64/80/96, and a narrow local pattern (window left +
// right <= 129, or chunk <= 65); by default only sliding windows (bench/cuda-notes.md v9),
// ARIADNE_BAND=1 adds chunks, ARIADNE_BAND=0 turns it off. Token orders are handled there too.
// False for the calls the wgmma band kernel takes (cuda_uses_bandwg).
bool cuda_uses_band(const AttentionParams& p);

// Whether attention_cuda runs this call on the wgmma band kernel (src/attention/cuda/attention_bandwg.cuh):
// a call the band kernel could take that is a sliding window (no chunk) at head dim 80 on compute
// capability 9.0, with or without a token order (AttentionParams::order; ARIADNE_BANDWG_ORDER=0 in
// the environment, read per call, keeps ordered calls off it: bench/cuda-notes.md, v13) and q/k/v strides
// increasing from head dim to heads to rows, unless ARIADNE_BANDWG=0. Such a call is then not
// cuda_uses_band.
bool cuda_uses_bandwg(const AttentionParams& p);

// Which variant of the wgmma band kernel such a call runs: 1 (v11) under ARIADNE_BANDWG_V=1 (read
// per call), 2 (v11e: two consumers) under ARIADNE_BANDWG_V=2, else 3 (bench/cuda-notes.md, v14:
// three consumer warpgroups; the default).
int cuda_bandwg_variant();

// attention_cuda with a fused token order: `order` [total] int32 (device memory) is a permutation
// of the packed rows, total_q == total_k; logical row i of the pattern is stored at packed row
// order[i] of q, k, v, out and lse. So a pattern in one token order (say a window over the column-
// major traversal of an image) runs on tensors kept in another (row-major), with no gather of
// q, k, v and no scatter of out. The public route is AttentionParams::order; this entry overrides it.
void attention_cuda_ordered(const AttentionParams& p, const int32_t* order);

// What a fused `order` is, when the caller knows: order_conversion(block_row, block_col) of one
// image of h x w patches, merge 2 (Qwen's storage order and MiMo's / Ariadne's column order; the
// ariadne schedule's column layers). The wgmma band kernel then copies the ordered tiles with the
// copy engine (5-D tensor maps over the merge-unit grid) instead of gathering rows, where one
// sequence holds the h·w tokens and h / 2 is a multiple of 16; elsewhere the hint is ignored. The
// hint is trusted (the order array must be that conversion: it still addresses the output and
// LSE). {0, 0}: unknown.
struct BlockColGrid {
  int h = 0, w = 0;
};
void attention_cuda_ordered(const AttentionParams& p, const int32_t* order, BlockColGrid block_col);
// Whether such a call takes the copy-engine path for its order (when it runs on the wgmma band
// kernel: cuda_uses_bandwg); ARIADNE_BANDWG_TMA_ORDER=0 (read per call) keeps the gather.
bool cuda_block_col_tiles(const AttentionParams& p, const int32_t* order, BlockColGrid block_col);

}  // namespace ariadne
