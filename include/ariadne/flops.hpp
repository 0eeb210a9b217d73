// ariadne/flops.hpp — the attention cost model, counted exactly from the Pattern.
//
// Element level: a head spends 4·d FLOPs per allowed (query, key) pair (2·d for the q·k dot
// product, 2·d for accumulating a·v). Softmax, scaling and masking are not counted (they are O(1)
// per pair, not O(d), and no figure we reproduce includes them).
//
// Tile level: a kernel computes whole Mq×Nk tiles. It visits every tile that Pattern::classify does
// not call `none` (tiles start at each sequence's first token and are clipped to it, as in
// FlashAttention's varlen path) and does Mq·Nk·4·d FLOPs per visited tile, even where the tile
// sticks out of the sequence or holds masked pairs. useful fraction = element FLOPs / tile FLOPs.
//
// Convention of the paper's figures. The Ariadne paper reports whole-encoder attention FLOPs of
// 0.69T / 11.0T / 175.9T for full attention at 448² / 896² / 1792² (1,024 / 4,096 / 16,384 tokens,
// 32 layers, 16 heads × 80 = hidden 1280) and 1.68T for Ariadne at 896². Those are exactly 4× the
// plain forward count 4·N²·1280·32 (and 4× ours for Ariadne). Our reading, an inference from the
// numbers that the paper does not state: they count a training step, forward plus backward with
// activation recomputation, the backward of attention costing about twice the forward, so
// 1 (forward) + 1 (recomputed forward) + 2 (backward) = 4 forwards. We report both: `flops` (one
// plain forward) and `flops_paper` = 4 × flops.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ariadne/order.hpp"
#include "ariadne/pattern.hpp"
#include "ariadne/schedule.hpp"

namespace ariadne {

// Convention factor between the paper's figures and a plain forward count (see above).
constexpr int64_t kPaperFlopFactor = 4;

// Allowed (query, key) pairs of `p` over packed runs of total_q queries and total_k keys, summed
// over `heads` query heads. Dense patterns: per-query counts in O(1) (Pattern::keys_per_query)
// times heads. Block-sparse patterns (p.blocks defined, p.blocks.heads == heads): per head, the
// listed key blocks intersected with the dense rule. The pattern's arrays must be host memory.
int64_t count_pairs(const Pattern& p, int64_t total_q, int64_t total_k, int heads = 1);

// Mq × Nk tiles of a kernel.
struct TileShape {
  int64_t q = 128, k = 128;
};

struct TileCount {
  int64_t full = 0;     // visited tiles computed without an element mask
  int64_t partial = 0;  // visited tiles that need the element mask
  int64_t visited() const { return full + partial; }
};

// Tiles a kernel visits, summed over heads. Dense patterns: Pattern::classify per (query tile, key
// tile) of each sequence, times heads. Block-sparse patterns: the tile must equal the block
// (tile.q == tile.k == p.blocks.block); a listed block is visited unless the dense rule leaves it
// empty, and it is `full` when the dense rule allows every pair of its in-sequence part.
TileCount count_tiles(const Pattern& p, int64_t total_q, int64_t total_k, int heads, TileShape tile);

// Encoder geometry for whole-encoder figures (defaults: Qwen2.5-VL vision tower, SPEC A.1/C.1).
struct EncoderShape {
  int heads = 16;
  int head_dim = 80;
  int patch = 14;       // pixels per patch side
  int merge = 2;        // merge-unit side in patches
  int qwen_window = 4;  // qwen_window order: window side in merge units
};

// The patch grid of an image of side × side pixels (side must be a multiple of patch · merge).
Grid image_grid(int side, const EncoderShape& shape = {});

struct ScheduleCost {
  std::string schedule;
  int64_t tokens = 0;         // Σ h·w over the images
  int layers = 0;
  int64_t pairs = 0;          // allowed pairs, summed over layers and heads
  int64_t flops = 0;          // plain forward: 4 · head_dim · pairs
  int64_t flops_paper = 0;    // kPaperFlopFactor × flops (the paper's convention)
  TileShape tile;
  TileCount tiles;            // summed over layers and heads
  int64_t tile_flops = 0;     // visited tiles · Mq · Nk · 4 · head_dim: the work a kernel does
  double useful_fraction = 0; // flops / tile_flops
  std::vector<int64_t> layer_pairs;  // [layers] allowed pairs per layer (summed over heads)
};

// Attention cost of every layer of `schedule` on the packed `images` (each layer in its own order).
ScheduleCost schedule_cost(const Schedule& schedule, const std::vector<Grid>& images,
                           const EncoderShape& shape = {}, TileShape tile = {});

}  // namespace ariadne
