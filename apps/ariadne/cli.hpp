// The CLI's small framework: declared options, JSON output, and a registry of subcommands.
//
// Each subcommand lives in its own file (cmd_<name>.cpp), declares its options once in a table and
// registers itself:
//   const Command reg{"flops", "attention FLOPs of schedules", {
//       integer("window", 64, 1, 1 << 20, "window radius in tokens"),
//       real_list("tau", "0.95", Range::open_closed(0, 1), "τ values"), ...}, run_flops};
// From that table alone come the parsing and validation of every value before the handler runs
// (cli_options.hpp), `ariadne CMD --help`, and the errors for unknown options or missing values.
// Every command accepts `--json` and then prints exactly one JSON document on stdout: its result,
// or, when it fails, {"error": "...", "option": "--name"} (or "file": PATH) with a non-zero exit
// code.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_options.hpp"

namespace ariadne::cli {

using Handler = std::function<int(const Args&)>;

struct Command {
  Command(const char* name, const char* help, OptionTable options, Handler run);
};

struct CommandInfo {
  std::string help;
  OptionTable options;  // with --json appended
  Handler run;
};
std::map<std::string, CommandInfo>& registry();

// `ariadne CMD --help`: usage, the one-line help and the option table.
void print_help(const std::string& name, const CommandInfo& info);

// Prints a JSON document (2-space indent) on stdout.
void print_json(const nlohmann::json& j);

// Prints a τ sweep's JSON points (tau, density, mass_recall, block_precision, block_recall,
// block_f1, oracle_density) one per line after a header, each line indented by `indent`.
void print_tau_sweep(const nlohmann::json& points, const std::string& indent);

// Throws a UsageError naming `option` when `bytes` exceed 80% of the machine's physical memory
// (refused up front instead of being killed midway).
void check_memory(const std::string& command, const std::string& option, double bytes);

// Throws a UsageError naming --`option` when its value is "cuda" and no CUDA device is usable here
// (before any work, rather than after inputs are built).
void require_cuda_if_asked(const Args& a, const std::string& option);

// Inside a catch block: rethrows the exception in flight with `written` (the output files this run
// has already written) named in its message, so that a command failing midway says what it left
// behind; the exception is rethrown unchanged when nothing was written. A UsageError keeps its
// option and file; a filesystem error or bad_alloc becomes an Error naming its path.
[[noreturn]] void rethrow_naming_outputs(const std::vector<std::string>& written);

}  // namespace ariadne::cli
