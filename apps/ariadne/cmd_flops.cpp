// `ariadne flops`: whole-encoder attention FLOPs of schedules at several image sides (flops.hpp).
#include <cstdio>
#include <iostream>
#include <string>

#include "ariadne/error.hpp"
#include "ariadne/flops.hpp"
#include "ariadne/schedule.hpp"
#include "cli.hpp"

namespace {

using ariadne::cli::Args;

int run_flops(const Args& args) {
  const std::vector<int> sides = args.i32s("side");
  const std::vector<std::string> names = args.strs("schedule");
  const int64_t window = args.i64("window");
  ariadne::EncoderShape shape;
  shape.heads = args.i32("heads");
  shape.head_dim = args.i32("head-dim");
  const auto [tq, tk] = args.grid("tile");
  const ariadne::TileShape tile{tq, tk};
  const bool json = args.json();

  std::vector<ariadne::Schedule> schedules;
  for (const std::string& n : names) {
    try {
      schedules.push_back(ariadne::resolve_schedule(n, window));
    } catch (const ariadne::Error& e) {
      args.fail("schedule", e.what());
    }
  }
  // Every row is also compared with full attention (same shape, same side).
  const ariadne::Schedule full = ariadne::preset_schedule("full", window);

  nlohmann::json rows = nlohmann::json::array();
  // The FLOP counts are int64: refuse shapes whose full-attention count would not fit (the library
  // does not check its products).
  for (const int side : sides) {
    const double n = double(side / shape.patch) * double(side / shape.patch);
    for (const ariadne::Schedule& s : schedules)
      if (16.0 * n * n * shape.heads * shape.head_dim * double(s.layers.size()) > 0x1p62)
        args.fail("side", std::to_string(side) + " px with " + std::to_string(shape.heads) + " heads x " +
                              std::to_string(shape.head_dim) + " dims: the paper-convention FLOP count exceeds 2^62");
  }
  for (const int side : sides) {
    const std::vector<ariadne::Grid> images{ariadne::image_grid(side, shape)};
    const ariadne::ScheduleCost ref = ariadne::schedule_cost(full, images, shape, tile);
    for (const ariadne::Schedule& s : schedules) {
      const ariadne::ScheduleCost c = ariadne::schedule_cost(s, images, shape, tile);
      rows.push_back({{"schedule", c.schedule},
                      {"side", side},
                      {"tokens", c.tokens},
                      {"layers", c.layers},
                      {"heads", shape.heads},
                      {"head_dim", shape.head_dim},
                      {"pairs", c.pairs},
                      {"flops", c.flops},
                      {"flops_paper", c.flops_paper},
                      {"vs_full", double(ref.flops) / double(c.flops)},
                      {"tile", {tile.q, tile.k}},
                      {"tiles_full", c.tiles.full},
                      {"tiles_partial", c.tiles.partial},
                      {"tile_flops", c.tile_flops},
                      {"useful_fraction", c.useful_fraction}});
    }
  }
  if (json) {
    ariadne::cli::print_json(rows);
    return 0;
  }
  std::printf("Attention FLOPs of the whole encoder (%d heads x %d dims, window %lld, tiles %lldx%lld).\n",
              shape.heads, shape.head_dim, static_cast<long long>(window), static_cast<long long>(tile.q),
              static_cast<long long>(tile.k));
  std::printf("flops = one plain forward (4*d per allowed pair); paper = 4 x flops (the paper's convention).\n\n");
  std::printf("%-22s %6s %7s %6s %10s %10s %8s %11s %7s\n", "schedule", "side", "tokens", "layers", "flops",
              "paper", "vs full", "tile flops", "useful");
  for (const auto& r : rows)
    std::printf("%-22s %6d %7lld %6d %9.3fT %9.2fT %7.2fx %10.3fT %6.1f%%\n",
                r["schedule"].get<std::string>().c_str(), r["side"].get<int>(),
                static_cast<long long>(r["tokens"].get<int64_t>()), r["layers"].get<int>(),
                r["flops"].get<double>() * 1e-12, r["flops_paper"].get<double>() * 1e-12,
                r["vs_full"].get<double>(), r["tile_flops"].get<double>() * 1e-12,
                100.0 * r["useful_fraction"].get<double>());
  return 0;
}

using namespace ariadne::cli;
const Command reg{"flops", "attention FLOPs of schedules at image sides (exact, from the pattern)",
                  {integer_list("side", "448,896,1792", 1, 1 << 16, "image sides in pixels (square images)"),
                   text_list("schedule", "full,chunk,ariadne", "schedules: presets or short syntax"),
                   integer("window", 64, 1, 1 << 20, "window radius of window layers, in tokens"),
                   integer("heads", 16, 1, 4096, "attention heads of the encoder"),
                   integer("head-dim", 80, 1, 4096, "head dimension of the encoder"),
                   grid("tile", "128x128", 4096, "kernel tile, query rows x key columns")},
                  run_flops};

}  // namespace
