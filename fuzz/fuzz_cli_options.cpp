// libFuzzer target: the CLI's declared-option parser (apps/ariadne/cli_options.hpp, the code the
// CLI runs), on a table with every option type, list form, bare value and checked text.
//
// Input: the command line's words separated by NUL bytes. Beyond "no crash": a parse either
// throws UsageError or yields values that every accessor of their declared type reads back
// without throwing, inside the declared range or choices. The table has no output path (parsing
// creates output folders, and tries a file in the folder of an output file) and no required
// option (it would end almost every run at once).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "ariadne/error.hpp"
#include "cli_options.hpp"

namespace {

using namespace ariadne::cli;

const OptionTable& table() {
  static const OptionTable t = {
      integer("tokens", 1024, 1, int64_t(1) << 40, "an integer"),
      integer("heads", 8, -4, 1 << 20, "an integer with a negative bound"),
      integer_list("ids", "0,255", std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max(), "ids"),
      real("tau", 0.9, Range::open_closed(0, 1), "an open-closed interval"),
      real("scale", 1.0, Range::any(), "any finite value"),
      real_list("depth", "0.1,0.5", Range::closed(0, 1), "a list of reals"),
      text("name", "", "free text"),
      text_list("protect", "published", "checked text").checked([](const std::string& s) {
        if (s.find('!') != std::string::npos) ariadne::detail::fail("'", s, "' has a '!'");
      }),
      boolean("json", false, "a boolean"),
      boolean("stage-times", true, "a boolean that defaults to yes"),
      choice("backend", "cpu", {"reference", "cpu", "cuda"}, "a choice"),
      choice_list("method", "rr", {"dense", "rr", "xattn", "oracle"}, "a list of choices"),
      grid("grid", "10x14", 1 << 16, "HxW"),
      grid_list("grids", "", 4096, "a list of HxW"),
      integer("heatmap-layers", 0, 1, 1 << 20, "no default").without_default(),
      text("mode", "", "bare means 'all'").bare_means("all"),
      path("weights", PathKind::in_file, "an input file"),
      path_list("image", PathKind::in_any, "input files or folders"),
      threads_option(),
  };
  return t;
}

void check(bool ok, const std::string& what) {
  if (!ok) throw std::logic_error("fuzz_cli_options: " + what);
}

void check_range(const Option& o, double v) {
  check(std::isfinite(v) && o.range.contains(v), "--" + o.name + " read " + std::to_string(v) + " outside " +
                                                     o.range.text(o.type == Type::integer));
}

// Reads every option back through the accessor its type declares; any throw is a finding.
void read_back(const Args& a) {
  for (const Option& o : table()) {
    const std::string& n = o.name;
    (void)a.given(n);
    switch (o.type) {
      case Type::integer:
        if (o.list) {
          for (const int64_t v : a.i64s(n)) check_range(o, double(v));
        } else if (a.given(n) || !o.def.empty()) {
          check_range(o, double(a.i64(n)));
        }
        break;
      case Type::real:
        if (o.list) {
          for (const double v : a.reals(n)) check_range(o, v);
        } else {
          check_range(o, a.real(n));
        }
        break;
      case Type::boolean:
        (void)a.flag(n);
        break;
      case Type::choice: {
        const std::vector<std::string> vs = o.list ? a.strs(n) : std::vector<std::string>{a.str(n)};
        for (const std::string& v : vs)
          check(std::find(o.choices.begin(), o.choices.end(), v) != o.choices.end(), "--" + n + " read '" + v + "'");
        break;
      }
      case Type::grid: {
        const auto sides = o.list ? a.grids(n) : std::vector<std::pair<int, int>>{a.grid(n)};
        for (const auto& [h, w] : sides) {
          check_range(o, h);
          check_range(o, w);
        }
        break;
      }
      case Type::text:
      case Type::path:
        if (o.list) {
          for (const std::string& v : a.strs(n)) check(!v.empty(), "--" + n + " read an empty item");
        } else {
          (void)a.str(n);
        }
        break;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> argv;
  std::string word;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      argv.push_back(word);
      word.clear();
      if (argv.size() == 256) return 0;  // longer command lines add nothing but time
    } else {
      word.push_back(char(data[i]));
    }
  }
  if (size > 0) argv.push_back(word);
  try {
    const Args a("fuzz", table(), argv);
    read_back(a);
  } catch (const UsageError&) {
  }
  return 0;
}
