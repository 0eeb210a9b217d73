// The demo's parts. `ariadne demo --out DIR` runs every registered part in order of its rank and
// writes DIR/report.md and DIR/report.json. Each issue adds its part as a file demo_<part>.cpp:
//   static ariadne::cli::DemoPart part{20, "attention", "Attention per pattern", run_part};
#pragma once

#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ariadne::cli {

struct DemoContext {
  std::string out_dir;      // existing folder for pictures and data files
  bool quick = false;       // --quick: smaller sizes (CI smoke run)
  std::ostringstream md;    // the part's markdown section body
  nlohmann::json json;      // the part's JSON record
};

using DemoFn = std::function<void(DemoContext&)>;

struct DemoPart {
  DemoPart(int rank, const char* key, const char* title, DemoFn run);
};

struct DemoPartInfo {
  int rank;
  std::string key, title;
  DemoFn run;
};
std::vector<DemoPartInfo>& demo_parts();

}  // namespace ariadne::cli
