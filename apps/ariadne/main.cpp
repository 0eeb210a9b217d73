// ariadne — command-line entry: dispatches to the registered subcommands (cmd_*.cpp).
#include <cstdio>
#include <iostream>

#include "core/parse.hpp"
#include "ariadne/error.hpp"
#include "cli.hpp"

namespace ariadne::cli {

Args::Args(std::string command, std::vector<std::string> argv) : command_(std::move(command)) {
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    ARIADNE_CHECK(a.rfind("--", 0) == 0 && a.size() > 2, "ariadne ", command_,
                  ": unexpected argument '", a, "' (options are --name value)");
    std::string key = a.substr(2), value;
    if (auto eq = key.find('='); eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    } else if (i + 1 < argv.size() && argv[i + 1].rfind("--", 0) != 0) {
      value = argv[++i];
    }
    opts_[key] = value;
  }
  used_["json"] = true;  // every command accepts --json
}

bool Args::has(const std::string& name) const {
  used_[name] = true;
  return opts_.count(name) > 0;
}

std::string Args::str(const std::string& name, const std::string& fallback) const {
  used_[name] = true;
  auto it = opts_.find(name);
  return it == opts_.end() ? fallback : it->second;
}

std::string Args::required(const std::string& name) const {
  used_[name] = true;
  auto it = opts_.find(name);
  ARIADNE_CHECK(it != opts_.end() && !it->second.empty(), "ariadne ", command_, ": --", name,
                " is required");
  return it->second;
}

int64_t Args::integer(const std::string& name, int64_t fallback) const {
  const std::string s = str(name, "");
  if (s.empty()) return fallback;
  const auto v = parse_int(s);
  ARIADNE_CHECK(v.has_value(), "ariadne ", command_, ": --", name, " expects an integer, got '", s, "'");
  return *v;
}

double Args::real(const std::string& name, double fallback) const {
  const std::string s = str(name, "");
  if (s.empty()) return fallback;
  const auto v = parse_real(s);
  ARIADNE_CHECK(v.has_value(), "ariadne ", command_, ": --", name, " expects a number, got '", s, "'");
  return *v;
}

std::vector<std::string> Args::list(const std::string& name, const std::string& fallback) const {
  std::string s = str(name, fallback);
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    if (comma > start) out.push_back(s.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

std::vector<double> Args::tau_list(const std::string& name) const {
  std::vector<double> out;
  if (!has(name)) return out;
  for (const std::string& t : list(name, "")) {
    const auto v = parse_real(t);
    ARIADNE_CHECK(v.has_value() && *v > 0 && *v <= 1, "ariadne ", command_, ": --", name,
                  " expects numbers in (0, 1], got '", t, "'");
    out.push_back(*v);
  }
  ARIADNE_CHECK(!out.empty(), "ariadne ", command_, ": --", name,
                " expects a comma-separated list of numbers in (0, 1]");
  return out;
}

void Args::reject_unused() const {
  for (const auto& [k, v] : opts_)
    ARIADNE_CHECK(used_.count(k), "ariadne ", command_, ": unknown option --", k);
}

std::map<std::string, CommandInfo>& registry() {
  static std::map<std::string, CommandInfo> r;
  return r;
}

Command::Command(const char* name, const char* help, Handler run) {
  registry()[name] = CommandInfo{help, std::move(run)};
}

void print_json(const nlohmann::json& j) { std::cout << j.dump(2) << std::endl; }

void print_tau_sweep(const nlohmann::json& points, const std::string& indent) {
  std::cout << indent << "tau sweep (tau: density, mass recall, block precision / recall / F1, oracle density)\n";
  for (const nlohmann::json& p : points)
    std::cout << indent << "  " << p["tau"].get<double>() << ": " << p["density"].get<double>() << ", "
              << p["mass_recall"].get<double>() << ", " << p["block_precision"].get<double>() << " / "
              << p["block_recall"].get<double>() << " / " << p["block_f1"].get<double>() << ", "
              << p["oracle_density"].get<double>() << "\n";
}

std::pair<int, int> parse_grid(const std::string& option, const std::string& text) {
  int h = 0, w = 0;
  char x = 0, extra = 0;
  const int n = std::sscanf(text.c_str(), "%d%c%d%c", &h, &x, &w, &extra);
  ARIADNE_CHECK(n == 3 && (x == 'x' || x == 'X') && h > 0 && w > 0, "--", option,
                " expects HxW with positive sides (e.g. 10x14), got '", text, "'");
  return {h, w};
}

}  // namespace ariadne::cli

static void usage() {
  std::cerr << "usage: ariadne <command> [--option value ...] [--json]\n\ncommands:\n";
  for (const auto& [name, info] : ariadne::cli::registry())
    std::cerr << "  " << name << std::string(name.size() < 12 ? 12 - name.size() : 1, ' ') << info.help << "\n";
}

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "help") {
    usage();
    return argc < 2 ? 2 : 0;
  }
  const std::string name = argv[1];
  auto& reg = ariadne::cli::registry();
  auto it = reg.find(name);
  if (it == reg.end()) {
    std::cerr << "ariadne: unknown command '" << name << "'\n";
    usage();
    return 2;
  }
  try {
    ariadne::cli::Args args(name, std::vector<std::string>(argv + 2, argv + argc));
    return it->second.run(args);
  } catch (const ariadne::Error& e) {
    std::cerr << "ariadne " << name << ": error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "ariadne " << name << ": internal error: " << e.what() << "\n";
    return 3;
  }
}
