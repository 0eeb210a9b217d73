// `ariadne flops`: whole-encoder attention FLOPs of schedules at several image sides (flops.hpp).
#include <cstdio>
#include <iostream>
#include <string>

#include "core/parse.hpp"
#include "ariadne/error.hpp"
#include "ariadne/flops.hpp"
#include "ariadne/schedule.hpp"
#include "cli.hpp"

namespace {

using ariadne::cli::Args;

int run_flops(const Args& args) {
  const std::vector<std::string> sides = args.list("sides", "448,896,1792");
  const std::vector<std::string> names = args.list("schedules", "full,chunk,ariadne");
  const int64_t window = args.integer("window", 64);
  ariadne::EncoderShape shape;
  shape.heads = int(args.integer("heads", shape.heads));
  shape.head_dim = int(args.integer("head-dim", shape.head_dim));
  const auto [tq, tk] = ariadne::cli::parse_grid("tile", args.str("tile", "128x128"));
  const ariadne::TileShape tile{tq, tk};
  const bool json = args.json();
  args.reject_unused();
  ARIADNE_CHECK(!sides.empty(), "ariadne flops: --sides lists no side");
  ARIADNE_CHECK(!names.empty(), "ariadne flops: --schedules lists no schedule");

  std::vector<ariadne::Schedule> schedules;
  for (const std::string& n : names) schedules.push_back(ariadne::resolve_schedule(n, window));
  // Every row is also compared with full attention (same shape, same side).
  const ariadne::Schedule full = ariadne::preset_schedule("full", window);

  nlohmann::json rows = nlohmann::json::array();
  for (const std::string& side_text : sides) {
    const auto parsed = ariadne::parse_int(side_text);
    ARIADNE_CHECK(parsed && *parsed > 0 && *parsed <= 1 << 20, "ariadne flops: --sides expects positive integers (pixels), got '",
                  side_text, "'");
    const int side = int(*parsed);
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

ariadne::cli::Command reg{"flops", "attention FLOPs of schedules at image sides (exact, from the pattern)",
                          run_flops};

}  // namespace
