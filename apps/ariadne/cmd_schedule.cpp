// `ariadne schedule`: the per-layer table of a preset or a short-syntax schedule (schedule.hpp).
#include <cstdio>
#include <string>

#include "ariadne/error.hpp"
#include "ariadne/schedule.hpp"
#include "cli.hpp"

namespace {

using ariadne::cli::Args;

int run_schedule(const Args& args) {
  const bool has_preset = args.given("preset"), has_spec = args.given("spec");
  if (has_preset == has_spec)
    args.fail(has_preset ? "spec" : "preset",
              "give exactly one of --preset NAME or --spec STRING (e.g. --spec '4x(RRRRCCCF)' --window 64)");
  const int64_t window = args.i64("window");
  const bool json = args.json();
  ariadne::Schedule s;
  try {
    s = has_preset ? ariadne::preset_schedule(args.str("preset"), window)
                   : ariadne::parse_schedule(args.str("spec"), window);
  } catch (const ariadne::Error& e) {
    args.fail(has_preset ? "preset" : "spec", e.what());
  }

  nlohmann::json layers = nlohmann::json::array();
  for (size_t i = 0; i < s.layers.size(); ++i) {
    const ariadne::LayerSpec& l = s.layers[i];
    layers.push_back({{"layer", i},
                      {"letter", std::string(1, l.letter)},
                      {"order", ariadne::order_name(l.order)},
                      {"kind", ariadne::layer_kind_name(l.kind)},
                      {"window", l.kind == ariadne::LayerKind::window ? nlohmann::json(l.window) : nlohmann::json()},
                      {"sink", l.sink},
                      {"reorder", i > 0 && l.order != s.layers[i - 1].order}});
  }
  if (json) {
    ariadne::cli::print_json(layers);
    return 0;
  }
  std::printf("schedule %s: %zu layers, %d order changes\n  %s\n\n", s.name.c_str(), s.layers.size(),
              s.order_changes(), s.letters().c_str());
  std::printf("%5s  %-6s  %-12s  %-7s  %6s  %-4s  %s\n", "layer", "letter", "order", "kind", "window", "sink",
              "reorder");
  for (const auto& l : layers)
    std::printf("%5d  %-6s  %-12s  %-7s  %6s  %-4s  %s\n", l["layer"].get<int>(),
                l["letter"].get<std::string>().c_str(), l["order"].get<std::string>().c_str(),
                l["kind"].get<std::string>().c_str(),
                l["window"].is_null() ? "-" : std::to_string(l["window"].get<int64_t>()).c_str(),
                l["sink"].get<bool>() ? "yes" : "no", l["reorder"].get<bool>() ? "gather" : "");
  return 0;
}

using namespace ariadne::cli;
const Command reg{"schedule", "per-layer table of a schedule preset or short-syntax spec",
                  {text("preset", "", "a preset: full, chunk, ariadne, ..."),
                   text("spec", "", "short syntax, e.g. '4x(RRRRCCCF)'"),
                   integer("window", 64, 1, 1 << 20, "window radius of window layers, in tokens")},
                  run_schedule};

}  // namespace
