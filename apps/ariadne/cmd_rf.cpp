// `ariadne rf`: receptive-field spread from one token through a schedule (receptive_field.hpp).
#include <cstdio>
#include <string>

#include "ariadne/error.hpp"
#include "ariadne/receptive_field.hpp"
#include "ariadne/schedule.hpp"
#include "cli.hpp"

namespace {

using ariadne::cli::Args;

// One character per patch: the layer that first reached it (1-9, then a-z), '*' the start, '.' never.
char cell(int reached) {
  if (reached < 0) return '.';
  if (reached == 0) return '*';
  if (reached <= 9) return char('0' + reached);
  if (reached <= 35) return char('a' + reached - 10);
  return '#';
}

int run_rf(const Args& args) {
  const auto [h, w] = args.grid("grid");
  const int64_t window = args.i64("window");
  const std::string spec = args.str("schedule");
  const int merge = args.i32("merge");
  const int qwen_window = args.i32("qwen-window");
  int row = h / 2, col = w / 2;  // default start: the centre patch
  if (args.given("start")) {
    const std::vector<int> rc = args.i32s("start");
    if (rc.size() != 2) args.fail("start", "expected ROW,COL (e.g. 5,7)");
    row = rc[0];
    col = rc[1];
    if (row >= h || col >= w)
      args.fail("start", "(" + std::to_string(row) + ", " + std::to_string(col) + ") lies outside the " +
                             std::to_string(h) + "x" + std::to_string(w) + " grid");
  }
  const bool json = args.json();
  ariadne::Schedule sched;
  try {
    sched = ariadne::resolve_schedule(spec, window);
  } catch (const ariadne::Error& e) {
    args.fail("schedule", e.what());
  }
  const ariadne::ReceptiveField rf = ariadne::receptive_field(sched, {h, w}, row, col, merge, qwen_window);

  if (json) {
    nlohmann::json reached = nlohmann::json::array();
    for (int r = 0; r < h; ++r)
      reached.push_back(std::vector<int>(rf.reached.begin() + int64_t(r) * w, rf.reached.begin() + int64_t(r + 1) * w));
    ariadne::cli::print_json({{"grid", {h, w}},
                              {"start", {row, col}},
                              {"schedule", sched.name},
                              {"letters", sched.letters()},
                              {"window", window},
                              {"merge", merge},
                              {"coverage", rf.coverage},
                              {"reached", reached}});
    return 0;
  }
  std::printf("receptive field of patch (%d, %d) in a %dx%d grid, schedule %s, window %lld, merge %d\n\n", row,
              col, h, w, sched.letters().c_str(), static_cast<long long>(window), merge);
  for (size_t i = 0; i < rf.coverage.size(); ++i)
    std::printf("  after layer %2zu (%c): %5.1f%%\n", i + 1, sched.layers[i].letter, 100.0 * rf.coverage[i]);
  std::printf("\nlayer at which each patch is first reached (* start, . never):\n");
  for (int r = 0; r < h; ++r) {
    std::string line = "  ";
    for (int c = 0; c < w; ++c) line += cell(rf.reached[size_t(r * w + c)]);
    std::printf("%s\n", line.c_str());
  }
  return 0;
}

using namespace ariadne::cli;
const Command reg{"rf", "receptive-field coverage of a schedule from one start token",
                  {grid("grid", "10x14", 4096, "patch grid"),
                   integer("window", 4, 1, 1 << 20, "window radius of window layers, in tokens"),
                   text("schedule", "RRRRCCC", "schedule: preset or short syntax"),
                   integer("merge", 1, 1, 64, "merge-unit side in patches"),
                   integer("qwen-window", 4, 1, 4096, "qwen_window order: window side in merge units"),
                   integer_list("start", "", 0, 4096, "start patch ROW,COL (default: the centre)")},
                  run_rf};

}  // namespace
