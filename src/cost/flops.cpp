// The attention cost model (flops.hpp): exact pair counts and tile counts read from the Pattern.
#include "ariadne/flops.hpp"

#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <tuple>

#include "ariadne/error.hpp"

namespace ariadne {

namespace {

// Keys of [k_lo, k_hi) that local query iq may see under the dense rule (window, chunk, length).
int64_t dense_keys_in(const Pattern& p, const SeqExtent& e, int64_t iq, int64_t k_lo, int64_t k_hi) {
  const KeyRange r = p.key_range(e, iq, iq + 1);
  return std::max<int64_t>(0, std::min(r.hi, k_hi) - std::max(r.lo, k_lo));
}

}  // namespace

int64_t count_pairs(const Pattern& p, int64_t total_q, int64_t total_k, int heads) {
  ARIADNE_CHECK(heads >= 1, "count_pairs: heads is ", heads, ", expected >= 1");
  validate_pattern(p, total_q, total_k, heads);
  int64_t pairs = 0;
  if (!p.blocks.defined()) {
    for (int32_t s = 0; s < p.num_seqs; ++s) {
      const SeqExtent e = p.seq(s, total_q, total_k);
      for (int64_t iq = 0; iq < e.lq; ++iq)
        pairs = checked_add(pairs, p.keys_per_query(e, iq), "count_pairs: allowed pairs");
    }
    return checked_mul(pairs, heads, "count_pairs: allowed pairs · heads");
  }
  // validate_pattern checked that the mask has rows for exactly `heads` query heads.
  const int64_t B = p.blocks.block;
  for_each_listed_block(p, total_q, total_k, [&](int32_t, const SeqExtent& e, int32_t, int64_t qb, int64_t kb) {
    const int64_t k_lo = kb * B, k_hi = std::min(e.lk, k_lo + B);
    for (int64_t iq = qb * B; iq < std::min(e.lq, qb * B + B); ++iq)
      pairs = checked_add(pairs, dense_keys_in(p, e, iq, k_lo, k_hi), "count_pairs: allowed pairs");
  });
  return pairs;
}

TileCount count_tiles(const Pattern& p, int64_t total_q, int64_t total_k, int heads, TileShape tile) {
  ARIADNE_CHECK(heads >= 1, "count_tiles: heads is ", heads, ", expected >= 1");
  ARIADNE_CHECK(tile.q >= 1 && tile.k >= 1, "count_tiles: tile ", tile.q, "x", tile.k,
                " must have positive sides");
  validate_pattern(p, total_q, total_k, heads);
  TileCount c;
  auto add = [&c](TileKind k) {
    if (k == TileKind::full) ++c.full;
    else if (k == TileKind::partial) ++c.partial;
  };
  if (!p.blocks.defined()) {
    for (int32_t s = 0; s < p.num_seqs; ++s) {
      const SeqExtent e = p.seq(s, total_q, total_k);
      for (int64_t q_lo = 0; q_lo < e.lq; q_lo += tile.q) {
        const int64_t q_hi = std::min(e.lq, q_lo + tile.q);
        const KeyRange r = p.key_range(e, q_lo, q_hi);
        if (r.empty()) continue;
        // key_range bounds the tiles a kernel loops over; classify drops those left empty.
        for (int64_t kt = r.lo / tile.k; kt * tile.k < r.hi; ++kt) {
          const int64_t k_lo = kt * tile.k;
          add(p.classify(e, q_lo, q_hi, k_lo, std::min(e.lk, k_lo + tile.k)));
        }
      }
    }
    c.full = checked_mul(c.full, heads, "count_tiles: full tiles · heads");
    c.partial = checked_mul(c.partial, heads, "count_tiles: partial tiles · heads");
    return c;
  }
  const int64_t B = p.blocks.block;
  ARIADNE_CHECK(tile.q == B && tile.k == B, "count_tiles: a block-sparse pattern is visited block by ",
                "block: tile ", tile.q, "x", tile.k, " must equal the block size ", B);
  for_each_listed_block(p, total_q, total_k, [&](int32_t, const SeqExtent& e, int32_t, int64_t qb, int64_t kb) {
    const int64_t q_lo = qb * B, k_lo = kb * B;
    add(p.classify(e, q_lo, std::min(e.lq, q_lo + B), k_lo, std::min(e.lk, k_lo + B)));
  });
  return c;
}

Grid image_grid(int side, const EncoderShape& shape) {
  ARIADNE_CHECK(shape.patch >= 1 && shape.merge >= 1, "image grid: patch ", shape.patch, " and merge ",
                shape.merge, " must be >= 1");
  const int unit = shape.patch * shape.merge;
  ARIADNE_CHECK(side > 0 && side % unit == 0, "image side ", side, " px: expected a positive multiple of ",
                unit, " (patch ", shape.patch, " × merge ", shape.merge, ")");
  return Grid{side / shape.patch, side / shape.patch};
}

ScheduleCost schedule_cost(const Schedule& schedule, const std::vector<Grid>& images,
                           const EncoderShape& shape, TileShape tile) {
  ARIADNE_CHECK(!schedule.layers.empty(), "schedule '", schedule.name, "' has no layers");
  ARIADNE_CHECK(shape.heads >= 1 && shape.head_dim >= 1, "encoder shape: heads ", shape.heads,
                " and head_dim ", shape.head_dim, " must be >= 1");
  ScheduleCost c;
  c.schedule = schedule.name;
  c.layers = int(schedule.layers.size());
  c.tile = tile;
  std::array<std::unique_ptr<TokenOrder>, 4> orders;
  // Layers repeat (32 layers, a handful of distinct ones): count each distinct layer once.
  std::map<std::tuple<int, int, int64_t>, std::pair<int64_t, TileCount>> seen;
  for (const LayerSpec& l : schedule.layers) {
    auto& o = orders[size_t(l.order)];
    if (!o) o = std::make_unique<TokenOrder>(make_order(l.order, images, shape.merge, shape.qwen_window));
    c.tokens = o->tokens();
    const auto key = std::make_tuple(int(l.order), int(l.kind), l.window);
    auto it = seen.find(key);
    if (it == seen.end()) {
      const Pattern pat = layer_pattern(l, *o);
      const int64_t n = o->tokens();
      const int64_t pairs = count_pairs(pat, n, n, shape.heads);
      // Refuse before the tile count (minutes on millions of tokens) when one layer's FLOPs already
      // overflow; the totals are checked again below.
      (void)checked_mul(pairs, checked_mul(4 * kPaperFlopFactor, shape.head_dim, "FLOPs per pair"), "schedule '",
                        schedule.name, "' on ", n, " tokens: paper-convention FLOPs of one layer");
      it = seen.emplace(key, std::make_pair(pairs, count_tiles(pat, n, n, shape.heads, tile))).first;
    }
    c.layer_pairs.push_back(it->second.first);
    c.pairs = checked_add(c.pairs, it->second.first, "schedule '", schedule.name, "': allowed pairs");
    c.tiles.full = checked_add(c.tiles.full, it->second.second.full, "schedule '", schedule.name, "': tiles");
    c.tiles.partial = checked_add(c.tiles.partial, it->second.second.partial, "schedule '", schedule.name, "': tiles");
  }
  // Large images overflow int64 FLOP counts (28000² px is 4·10^6 tokens, 10^19 paper FLOPs): refuse
  // rather than print a wrapped, negative figure.
  const int64_t per_pair = checked_mul(4, shape.head_dim, "FLOPs per pair (4 · head_dim)");
  const std::string what = "schedule '" + schedule.name + "' on " + std::to_string(c.tokens) + " tokens";
  c.flops = checked_mul(c.pairs, per_pair, what, ": FLOPs (pairs · 4 · head_dim)");
  c.flops_paper = checked_mul(kPaperFlopFactor, c.flops, what, ": paper-convention FLOPs (4 · FLOPs)");
  const int64_t tile_pairs = checked_mul(tile.q, tile.k, what, ": pairs per tile");
  c.tile_flops = checked_mul(checked_mul(checked_add(c.tiles.full, c.tiles.partial, what, ": tiles"), tile_pairs,
                                         what, ": tile pairs"),
                             per_pair, what, ": tile FLOPs");
  c.useful_fraction = c.tile_flops > 0 ? double(c.flops) / double(c.tile_flops) : 0.0;
  return c;
}

}  // namespace ariadne
