// The CLI's small framework: options, JSON output, and a registry of subcommands.
//
// Each subcommand lives in its own file (cmd_<name>.cpp) and registers itself:
//   static ariadne::cli::Command reg{"flops", "attention FLOPs of schedules", run_flops};
// Options are `--name value` or `--name=value`; a bare `--name` is a flag. Every command accepts
// `--json` and then prints exactly one JSON document on stdout.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ariadne::cli {

class Args {
 public:
  Args(std::string command, std::vector<std::string> argv);  // argv: after the subcommand name
  const std::string& command() const { return command_; }
  bool has(const std::string& name) const;
  bool flag(const std::string& name) const { return has(name); }
  std::string str(const std::string& name, const std::string& fallback) const;
  std::string required(const std::string& name) const;  // throws ariadne::Error when absent
  int64_t integer(const std::string& name, int64_t fallback) const;
  double real(const std::string& name, double fallback) const;
  std::vector<std::string> list(const std::string& name, const std::string& fallback) const;  // comma separated
  // A τ list (--tau-sweep, --probe-tau-sweep): empty when the option is absent; when present, a
  // non-empty comma-separated list of numbers in (0, 1], else throws ariadne::Error naming it.
  std::vector<double> tau_list(const std::string& name) const;
  bool json() const { return has("json"); }
  // Throws ariadne::Error naming the first option that no call above asked for (typos).
  void reject_unused() const;

 private:
  std::string command_;
  std::map<std::string, std::string> opts_;
  mutable std::map<std::string, bool> used_;
};

using Handler = std::function<int(const Args&)>;

struct Command {
  Command(const char* name, const char* help, Handler run);
};

struct CommandInfo {
  std::string help;
  Handler run;
};
std::map<std::string, CommandInfo>& registry();

// Prints a JSON document (2-space indent) on stdout.
void print_json(const nlohmann::json& j);

// Prints a τ sweep's JSON points (tau, density, mass_recall, block_precision, block_recall,
// block_f1, oracle_density) one per line after a header, each line indented by `indent`.
void print_tau_sweep(const nlohmann::json& points, const std::string& indent);

// Parses "HxW" ("10x14") into {h, w}; throws naming the option.
std::pair<int, int> parse_grid(const std::string& option, const std::string& text);

}  // namespace ariadne::cli
