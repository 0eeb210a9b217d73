// ariadne demo — the main job on built-in data: every registered part (demo.hpp) writes a section
// of DIR/report.md and a record of DIR/report.json.
#include <algorithm>
#include <chrono>
#include <iostream>

#include "ariadne/attention.hpp"
#include "ariadne/device.hpp"
#include "ariadne/file.hpp"
#include "cli.hpp"
#include "demo.hpp"

namespace ariadne::cli {

std::vector<DemoPartInfo>& demo_parts() {
  static std::vector<DemoPartInfo> parts;
  return parts;
}

DemoPart::DemoPart(int rank, const char* key, const char* title, DemoFn run) {
  demo_parts().push_back(DemoPartInfo{rank, key, title, std::move(run)});
}

namespace {

// Atomic (file.hpp): a failed write (a full disk) neither leaves a truncated report nor destroys an
// earlier one; the error names the file (also as the JSON error's "file").
void write_text_file(const std::string& path, const std::string& text) {
  try {
    write_file_atomic(path, text.data(), text.size());
  } catch (const Error& e) {
    throw UsageError(e.what(), "", path);
  }
}

std::string part_keys() {
  std::string s;
  for (const auto& p : demo_parts()) s += (s.empty() ? "" : ", ") + p.key;
  return s;
}

int run_demo(const Args& a) {
  const std::string out = a.str("out");
  const bool quick = a.flag("quick");
  const std::vector<std::string> only = a.strs("part");
  auto parts = demo_parts();
  std::sort(parts.begin(), parts.end(), [](const auto& x, const auto& y) { return x.rank < y.rank; });

  std::ostringstream md;
  nlohmann::json report = {{"parts", nlohmann::json::object()}};
  md << "# ariadne demo report\n\n"
     << "Built-in data only; every number below was computed by this run. CPU threads: " << cpu_threads()
     << "; CUDA device: " << (cuda_available() ? "yes" : "none") << (quick ? "; quick mode" : "") << ".\n\n";
  int failures = 0;
  for (const auto& part : parts) {
    if (!only.empty() && std::find(only.begin(), only.end(), part.key) == only.end()) continue;
    std::cerr << "demo: " << part.title << " ..." << std::endl;
    DemoContext ctx;
    ctx.out_dir = out;
    ctx.quick = quick;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      part.run(ctx);
    } catch (const std::exception& e) {
      ++failures;
      ctx.md << "\n**This part failed:** " << e.what() << "\n";
      ctx.json["error"] = e.what();
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ctx.json["seconds"] = s;
    md << "## " << part.title << "\n\n" << ctx.md.str() << "\n";
    report["parts"][part.key] = ctx.json;
  }
  write_text_file(out + "/report.md", md.str());
  write_text_file(out + "/report.json", report.dump(2) + "\n");
  if (a.json()) print_json(report);
  else std::cout << md.str();
  return failures == 0 ? 0 : 1;
}

const Command reg{
    "demo", "the main job on built-in data: writes DIR/report.md and report.json",
    {path("out", PathKind::out_dir, "report folder (created)").defaulting("demo-out"),
     boolean("quick", false, "smaller sizes (CI smoke run)"),
     text_list("part", "", "run only these parts (cost, attention, encoder, shs, prefill, llm; default all)")
         .checked([](const std::string& key) {
           for (const auto& p : demo_parts())
             if (p.key == key) return;
           detail::fail("unknown part '", key, "', expected one of ", part_keys());
         })},
    run_demo};

}  // namespace
}  // namespace ariadne::cli
