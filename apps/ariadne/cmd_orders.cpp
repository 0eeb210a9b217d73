// `ariadne orders`: the sequence position of every patch in a token order (order.hpp), like the
// talk's 4x8 figure.
#include <algorithm>
#include <cstdio>
#include <string>

#include "ariadne/error.hpp"
#include "ariadne/order.hpp"
#include "cli.hpp"

namespace {

using ariadne::cli::Args;

int run_orders(const Args& args) {
  // Several images may be packed: --grid 4x8,2x4.
  std::vector<ariadne::Grid> grids;
  for (const auto& [h, w] : args.grids("grid")) grids.push_back(ariadne::Grid{h, w});
  const ariadne::OrderKind kind = ariadne::parse_order(args.str("order"));
  const int merge = args.i32("merge");
  const int window = args.i32("qwen-window");
  const bool json = args.json();
  int64_t total = 0;
  for (const ariadne::Grid& g : grids) total += int64_t(g.h) * g.w;
  if (total > (int64_t(1) << 26)) args.fail("grid", "more than 2^26 patches in all");
  const ariadne::TokenOrder o = ariadne::make_order(kind, grids, merge, window);

  if (json) {
    nlohmann::json g = nlohmann::json::array();
    for (const ariadne::Grid& x : grids) g.push_back({x.h, x.w});
    const bool win = kind == ariadne::OrderKind::qwen_window;
    ariadne::cli::print_json({{"name", ariadne::order_name(kind)},
                              {"grids", g},
                              {"merge", merge},
                              {"window", win ? nlohmann::json(window) : nlohmann::json()},
                              {"order", o.inverse},
                              {"perm", o.perm},
                              {"cu_seqlens", win ? o.cu_windows : o.cu_seqlens},
                              {"cu_images", o.cu_seqlens}});
    return 0;
  }
  const int width = int(std::to_string(std::max<int64_t>(o.tokens() - 1, 0)).size());
  std::printf("order %s (merge %d%s): sequence position of each patch\n", ariadne::order_name(kind), merge,
              kind == ariadne::OrderKind::qwen_window ? (", window " + std::to_string(window)).c_str() : "");
  for (size_t i = 0; i < grids.size(); ++i) {
    const ariadne::Grid& g = grids[i];
    std::printf("\nimage %zu (%dx%d):\n", i, g.h, g.w);
    // '|' and '-' mark merge-unit boundaries (the talk's thick borders).
    const std::string rule(size_t(g.w * (width + 1) + (g.w / merge - 1) * 2 + 1), '-');
    for (int r = 0; r < g.h; ++r) {
      if (r > 0 && r % merge == 0) std::printf("%s\n", rule.c_str());
      std::string line = " ";
      for (int c = 0; c < g.w; ++c) {
        if (c > 0 && c % merge == 0) line += " |";
        char buf[24];
        std::snprintf(buf, sizeof buf, " %*d", width,
                      o.inverse[size_t(o.cu_seqlens[i] + int64_t(r) * g.w + c)]);
        line += buf;
      }
      std::printf("%s\n", line.c_str());
    }
  }
  if (kind == ariadne::OrderKind::qwen_window) {
    std::printf("\ncu_window_seqlens:");
    for (int32_t c : o.cu_windows) std::printf(" %d", c);
    std::printf("\n");
  }
  return 0;
}

using namespace ariadne::cli;
const Command reg{"orders", "sequence position of every patch in a token order",
                  {grid_list("grid", "", 1 << 16, "patch grids of the packed images (e.g. 4x8,2x4)").needed(),
                   choice("order", "", {"raster", "qwen_window", "block_row", "block_col"}, "token order").needed(),
                   integer("merge", 2, 1, 64, "merge-unit side in patches"),
                   integer("qwen-window", 4, 1, 4096, "qwen_window order: window side in merge units")},
                  run_orders};

}  // namespace
