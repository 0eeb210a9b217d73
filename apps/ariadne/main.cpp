// ariadne — command-line entry: dispatches to the registered subcommands (cmd_*.cpp), answers
// --help from their option tables, and turns every failure into one message (stderr) or, with
// --json, one JSON error object on stdout.
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <new>
#include <string>
#include <vector>

#include "cli.hpp"

namespace {

using ariadne::cli::registry;

void usage(std::ostream& os) {
  os << "usage: ariadne <command> [--option value ...] [--json]\n"
     << "       ariadne <command> --help     (the command's options)\n\ncommands:\n";
  size_t width = 0;  // names aligned two spaces past the longest
  for (const auto& entry : registry()) width = std::max(width, entry.first.size());
  for (const auto& [name, info] : registry())
    os << "  " << name << std::string(width + 2 - name.size(), ' ') << info.help << "\n";
}

// --json as the option table reads it (bare, --json=V or --json V with V a boolean word), found
// before parsing so that a parse error can be reported as JSON too.
bool wants_json(const std::vector<std::string>& args) {
  bool on = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto word = [](const std::string& v) -> int {
      if (v == "yes" || v == "true" || v == "1") return 1;
      if (v == "no" || v == "false" || v == "0") return 0;
      return -1;
    };
    if (a == "--json") {
      const bool next_is_value = i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0;
      on = next_is_value ? word(args[i + 1]) == 1 : true;  // "--json maybe" is a parse error on stderr
    } else if (a.rfind("--json=", 0) == 0) {
      on = word(a.substr(7)) == 1;
    }
  }
  return on;
}

int report(const std::string& command, bool json, const std::string& message, const std::string& option,
           const std::string& file, int code) {
  if (json) {
    nlohmann::json j = {{"error", message}, {"command", command}};
    if (!option.empty()) j["option"] = option;
    if (!file.empty()) j["file"] = file;
    std::cout << j.dump(2) << std::endl;
  } else {
    std::cerr << "ariadne " << command << ": error: " << message << "\n";
  }
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(std::cerr);
    return 2;
  }
  const std::string name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    if (argc >= 3) {
      if (!registry().count(argv[2])) {
        std::cerr << "ariadne: unknown command '" << argv[2] << "' (ariadne --help lists them)\n";
        return 2;
      }
      ariadne::cli::print_help(argv[2], registry().at(argv[2]));
      return 0;
    }
    usage(std::cout);
    return 0;
  }
  const std::vector<std::string> args(argv + 2, argv + argc);
  const bool json = wants_json(args);
  const auto it = registry().find(name);
  if (it == registry().end()) {
    std::string best;
    size_t best_d = 3;
    for (const auto& [n, info] : registry())
      if (const size_t d = ariadne::cli::edit_distance(name, n); d < best_d) best_d = d, best = n;
    const std::string msg = "unknown command '" + name + "'" + (best.empty() ? "" : "; did you mean '" + best + "'?") +
                            " (ariadne --help lists them)";
    if (json) return report(name, true, msg, "", "", 2);
    std::cerr << "ariadne: " << msg << "\n";
    usage(std::cerr);
    return 2;
  }
  for (const std::string& a : args)
    if (a == "--help" || a == "-h") {
      ariadne::cli::print_help(name, it->second);
      return 0;
    }
  try {
    const ariadne::cli::Args parsed(name, it->second.options, args);
    return it->second.run(parsed);
  } catch (const ariadne::cli::UsageError& e) {
    return report(name, json, e.what(), e.option(), e.file(), 1);
  } catch (const ariadne::Error& e) {
    return report(name, json, e.what(), "", "", 1);
  } catch (const std::filesystem::filesystem_error& e) {
    const std::string p = e.path1().string();
    return report(name, json, (p.empty() ? "" : p + ": ") + e.code().message(), "", p, 1);
  } catch (const std::bad_alloc&) {
    return report(name, json, "out of memory: the request is too large for this machine", "", "", 1);
  } catch (const std::exception& e) {
    return report(name, json, std::string("internal error: ") + e.what(), "", "", 3);
  }
}
