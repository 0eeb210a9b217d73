// Cost model (flops.hpp): pair and tile counts against brute force over elements and tiles, and
// the paper's whole-encoder figures.
#include <cmath>
#include <random>

#include <gtest/gtest.h>

#include "ariadne/error.hpp"
#include "ariadne/flops.hpp"

namespace ariadne {
namespace {

// A pattern with its own cu_seqlens and optional CSR arrays (built by hand, no estimator).
struct Owned {
  Pattern p;
  std::vector<int32_t> cu, base, row_ptr, col;
  int64_t total = 0;
  int heads = 1;
};

Owned random_case(std::mt19937& rng, bool blocks, int32_t block) {
  Owned o;
  o.heads = 1 + int(rng() % 3);
  const int seqs = 1 + int(rng() % 3);
  o.cu.push_back(0);
  for (int s = 0; s < seqs; ++s) o.cu.push_back(o.cu.back() + 1 + int32_t(rng() % 70));
  o.total = o.cu.back();
  switch (rng() % 5) {
    case 0: o.p = Pattern::full(); break;
    case 1: o.p = Pattern::causal(); break;
    case 2: o.p = Pattern::window(int64_t(rng() % 20), int64_t(rng() % 20)); break;
    case 3: o.p = Pattern::chunked(1 + int64_t(rng() % 30)); break;
    default: o.p = Pattern::window(int64_t(rng() % 9), kUnbounded); break;
  }
  o.p = o.p.with_varlen(seqs, o.cu.data());
  if (blocks) {
    o.base.push_back(0);
    for (int s = 0; s < seqs; ++s) o.base.push_back(o.base.back() + (o.cu[size_t(s) + 1] - o.cu[size_t(s)] + block - 1) / block);
    o.row_ptr.push_back(0);
    o.col.reserve(1);  // a mask with no listed block still has a (non-null) col_idx array
    for (int s = 0; s < seqs; ++s) {
      const int32_t len = o.cu[size_t(s) + 1] - o.cu[size_t(s)], nb = (len + block - 1) / block;
      for (int h = 0; h < o.heads; ++h)
        for (int32_t qb = 0; qb < nb; ++qb) {
          for (int32_t kb = 0; kb < nb; ++kb)
            if (rng() % 2) o.col.push_back(kb);
          o.row_ptr.push_back(int32_t(o.col.size()));
        }
    }
    BlockSparseView v;
    v.block = block;
    v.heads = o.heads;
    v.seq_block_base = o.base.data();
    v.row_ptr = o.row_ptr.data();
    v.col_idx = o.col.data();
    o.p = o.p.with_blocks(v);
  }
  return o;
}

int64_t brute_pairs(const Owned& o) {
  int64_t n = 0;
  for (int32_t s = 0; s < o.p.num_seqs; ++s) {
    const SeqExtent e = o.p.seq(s, o.total, o.total);
    for (int h = 0; h < o.heads; ++h)
      for (int64_t q = 0; q < e.lq; ++q)
        for (int64_t k = 0; k < e.lk; ++k) n += o.p.allowed(s, e, h, q, k);
  }
  return n;
}

// Tiles by brute force: visited when some pair in the clipped tile is allowed (for block masks:
// the block is listed and some pair is allowed), full when every pair is.
TileCount brute_tiles(const Owned& o, TileShape t) {
  TileCount c;
  for (int32_t s = 0; s < o.p.num_seqs; ++s) {
    const SeqExtent e = o.p.seq(s, o.total, o.total);
    for (int h = 0; h < o.heads; ++h)
      for (int64_t q0 = 0; q0 < e.lq; q0 += t.q)
        for (int64_t k0 = 0; k0 < e.lk; k0 += t.k) {
          int64_t allowed = 0, pairs = 0;
          for (int64_t q = q0; q < std::min(e.lq, q0 + t.q); ++q)
            for (int64_t k = k0; k < std::min(e.lk, k0 + t.k); ++k, ++pairs) allowed += o.p.allowed_dense(e, q, k);
          if (o.p.blocks.defined() && !o.p.block_listed(o.p.block_row(s, e, h, q0 / t.q), k0 / t.k)) continue;
          if (allowed > 0) (allowed == pairs ? c.full : c.partial) += 1;
        }
  }
  return c;
}

TEST(Flops, PairsMatchBruteForce) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    const bool blocks = trial % 2 == 1;
    const Owned o = random_case(rng, blocks, 1 + int32_t(rng() % 16));
    ASSERT_EQ(count_pairs(o.p, o.total, o.total, o.heads), brute_pairs(o)) << describe(o.p) << " trial " << trial;
  }
}

TEST(Flops, TilesMatchBruteForce) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    const bool blocks = trial % 2 == 1;
    const int32_t block = 1 + int32_t(rng() % 16);
    const Owned o = random_case(rng, blocks, block);
    const TileShape t = blocks ? TileShape{block, block} : TileShape{1 + int64_t(rng() % 16), 1 + int64_t(rng() % 16)};
    const TileCount got = count_tiles(o.p, o.total, o.total, o.heads, t);
    const TileCount want = brute_tiles(o, t);
    EXPECT_EQ(got.full, want.full) << describe(o.p) << " tile " << t.q << "x" << t.k << " trial " << trial;
    EXPECT_EQ(got.partial, want.partial) << describe(o.p) << " tile " << t.q << "x" << t.k << " trial " << trial;
  }
}

TEST(Flops, TileShapeMustMatchBlocks) {
  std::mt19937 rng(1);
  const Owned o = random_case(rng, true, 8);
  EXPECT_THROW(count_tiles(o.p, o.total, o.total, o.heads, {16, 16}), Error);
  EXPECT_THROW(count_pairs(o.p, o.total, o.total, o.heads + 1), Error);
  EXPECT_THROW(count_tiles(Pattern::full(), 8, 8, 1, {0, 4}), Error);
}

int64_t n2(int side) {
  const int64_t n = int64_t(side / 14) * (side / 14);
  return n * n;
}

TEST(Flops, PaperFiguresForFullAttention) {
  // Exactly 4 × the plain forward count 4·N²·1280·32, rounding to 0.69T / 11.0T / 175.9T.
  const Schedule full = preset_schedule("full");
  const double expect_t[] = {0.69, 11.0, 175.9};
  const int digits[] = {2, 1, 1};
  const int sides[] = {448, 896, 1792};
  for (int i = 0; i < 3; ++i) {
    const ScheduleCost c = schedule_cost(full, {image_grid(sides[i])});
    EXPECT_EQ(c.tokens, (sides[i] / 14) * (sides[i] / 14));
    EXPECT_EQ(c.flops, 4 * n2(sides[i]) * 1280 * 32);
    EXPECT_EQ(c.flops_paper, 4 * c.flops);
    const double scale = std::pow(10.0, digits[i]);
    EXPECT_DOUBLE_EQ(std::round(double(c.flops_paper) * 1e-12 * scale) / scale, expect_t[i]) << sides[i];
    EXPECT_DOUBLE_EQ(c.useful_fraction, 1.0);  // N is a multiple of the 128 tile
  }
}

TEST(Flops, PaperFigureForAriadne) {
  const ScheduleCost full = schedule_cost(preset_schedule("full"), {image_grid(896)});
  const ScheduleCost ar = schedule_cost(preset_schedule("ariadne"), {image_grid(896)});
  // 4 full layers + 28 SWA layers of ±64 on 4096 tokens: 129 keys per query, minus the
  // truncated ends, 2·(64+63+...+1) = 4160 pairs per layer and head.
  const int64_t n = 4096, swa = n * 129 - 2 * 2080;
  EXPECT_EQ(ar.pairs, 16 * (4 * n * n + 28 * swa));
  EXPECT_EQ(ar.flops, ar.pairs * 4 * 80);
  EXPECT_DOUBLE_EQ(std::round(double(ar.flops_paper) * 1e-10) / 100, 1.68);
  const double ratio = double(full.flops) / double(ar.flops);
  EXPECT_GE(ratio, 6.5);  // the paper's 6.5× (11.0 / 1.68 = 6.55 from rounded figures)
  EXPECT_LT(ratio, 6.6);
  // Every SWA layer has the same count; the full layers are the 4 largest.
  EXPECT_EQ(ar.layer_pairs[7], 16 * n * n);
  EXPECT_EQ(ar.layer_pairs[0], 16 * swa);
  EXPECT_EQ(ar.layer_pairs[4], 16 * swa);
}

TEST(Flops, ChunkAndTileWork) {
  // Qwen windows of 64 tokens at 896²: 64 windows; with 128×128 tiles a window fills a quarter.
  const ScheduleCost c = schedule_cost(preset_schedule("chunk"), {image_grid(896)});
  const int64_t n = 4096;
  EXPECT_EQ(c.pairs, 16 * (4 * n * n + 28 * 64 * 64 * 64));
  EXPECT_EQ(c.tiles.visited(), 16 * (4 * 32 * 32 + 28 * 64));
  EXPECT_EQ(c.tile_flops, c.tiles.visited() * 128 * 128 * 4 * 80);
  const ScheduleCost c64 = schedule_cost(preset_schedule("chunk"), {image_grid(896)}, {}, {64, 64});
  EXPECT_DOUBLE_EQ(c64.useful_fraction, 1.0);  // 64-token windows are whole 64×64 tiles
  EXPECT_EQ(c64.pairs, c.pairs);
  // Windows of a 14×16-patch-ish image are ragged; counting still follows cu_windows.
  EncoderShape shape;
  const ScheduleCost r = schedule_cost(parse_schedule("W", 64), {Grid{14, 16}}, shape);
  EXPECT_EQ(r.pairs, 16 * (64 * 64 * 2 + 48 * 48 * 2));
}

TEST(Flops, MultiImageNeverCrosses) {
  // Full attention on two packed images counts each image's N² only.
  const ScheduleCost c = schedule_cost(parse_schedule("F", 64), {Grid{4, 6}, Grid{2, 8}});
  EXPECT_EQ(c.pairs, 16 * (24 * 24 + 16 * 16));
}

TEST(Flops, BadSides) {
  EXPECT_THROW(image_grid(450), Error);
  EXPECT_THROW(image_grid(0), Error);
  EXPECT_EQ(image_grid(448), (Grid{32, 32}));
}

}  // namespace
}  // namespace ariadne
