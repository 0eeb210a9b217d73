// The CLI's declared options (cli_options.cpp, a library of its own: the CLI and the option
// fuzzer, fuzz/fuzz_cli_options.cpp, share it). A command declares its options once in a table:
//   {integer("window", 64, 1, 1 << 20, "window radius in tokens"),
//    real_list("tau", "0.95", Range::open_closed(0, 1), "τ values"), ...}
// and Args parses a command line against it: `--name value` or `--name=value`; a boolean may stand
// bare (`--json` is `--json yes`). Every value, given or default, is validated before the handler
// runs: whole strings, ranges, choices, input files that exist and are regular, output folders
// that can be created (created then, after every other option passed). Unknown options, missing
// values and options given twice are a UsageError naming the option.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ariadne/error.hpp"

namespace ariadne::cli {

// An error a user caused, with the option or the file it concerns (for the JSON error object).
class UsageError : public Error {
 public:
  UsageError(const std::string& what, std::string option, std::string file = {})
      : Error(what), option_(std::move(option)), file_(std::move(file)) {}
  const std::string& option() const { return option_; }  // "--tau", or empty
  const std::string& file() const { return file_; }      // a path, or empty

 private:
  std::string option_, file_;
};

enum class Type { integer, real, text, boolean, choice, path, grid };
enum class PathKind { none, in_file, in_dir, in_any, out_file, out_dir, out_prefix };

// A closed or open interval of numbers; for integers only closed bounds are used.
struct Range {
  double lo = -std::numeric_limits<double>::infinity(), hi = std::numeric_limits<double>::infinity();
  bool lo_open = false, hi_open = false;
  static Range closed(double lo, double hi) { return {lo, hi, false, false}; }
  static Range open_closed(double lo, double hi) { return {lo, hi, true, false}; }
  static Range at_least(double lo) { return {lo, std::numeric_limits<double>::infinity(), false, false}; }
  static Range above(double lo) { return {lo, std::numeric_limits<double>::infinity(), true, false}; }
  static Range any() { return {}; }
  bool contains(double v) const;
  std::string text(bool integer) const;  // "(0, 1]", "[1, 1024]", "≥ 0"
};

struct Option {
  std::string name;  // without the dashes
  Type type = Type::text;
  bool list = false;            // comma-separated values of `type`
  bool required = false;        // must be given (no default)
  std::string def;              // the default as it would be typed; "" = none (empty list)
  std::string help;             // one line
  Range range;                  // integer, real, and grid sides
  std::vector<std::string> choices;  // choice
  PathKind path = PathKind::none;
  // Extra check of a text value (a pattern, a schedule, a mix): throws ariadne::Error on a bad value;
  // the message is reported as the option's.
  std::function<void(const std::string&)> check;

  Option& as_list() { list = true; return *this; }
  Option& needed() { required = true; return *this; }
  std::optional<std::string> bare;  // the value of a bare `--name` (booleans: yes)
  Option& bare_means(std::string v) { bare = std::move(v); return *this; }
  Option& defaulting(std::string d) { def = std::move(d); return *this; }
  Option& without_default() { def.clear(); return *this; }  // the handler derives it (help says how)
  Option& checked(std::function<void(const std::string&)> f) { check = std::move(f); return *this; }
  std::string type_text() const;  // INT, REAL, TEXT, yes|no, a|b|c, FILE, HxW (with ",..." for lists)
};

// Builders: one line per option in a command's table.
Option integer(std::string name, int64_t def, int64_t lo, int64_t hi, std::string help);
Option integer_list(std::string name, std::string def, int64_t lo, int64_t hi, std::string help);
Option real(std::string name, double def, Range r, std::string help);
Option real_list(std::string name, std::string def, Range r, std::string help);
Option text(std::string name, std::string def, std::string help);
Option text_list(std::string name, std::string def, std::string help);
Option boolean(std::string name, bool def, std::string help);  // bare `--name` means yes
Option choice(std::string name, std::string def, std::vector<std::string> choices, std::string help);
Option choice_list(std::string name, std::string def, std::vector<std::string> choices, std::string help);
Option path(std::string name, PathKind kind, std::string help);
Option path_list(std::string name, PathKind kind, std::string help);
Option grid(std::string name, std::string def, int64_t max_side, std::string help);  // HxW
Option grid_list(std::string name, std::string def, int64_t max_side, std::string help);
// The shared bound of --threads: 1..kMaxThreads (a request beyond it is refused, not capped).
inline constexpr int64_t kMaxThreads = 1024;
Option threads_option();

using OptionTable = std::vector<Option>;

// The parsed and validated options of one command; read by name and type (a name or type the
// table does not declare is a programming error: std::logic_error, "internal error").
class Args {
 public:
  Args(std::string command, const OptionTable& table, const std::vector<std::string>& argv);
  const std::string& command() const { return command_; }
  bool given(const std::string& name) const;  // on the command line (not only by default)
  int64_t i64(const std::string& name) const;
  int i32(const std::string& name) const;
  double real(const std::string& name) const;
  const std::string& str(const std::string& name) const;  // text, choice, path
  bool flag(const std::string& name) const;                // boolean
  std::pair<int, int> grid(const std::string& name) const;
  std::vector<int64_t> i64s(const std::string& name) const;
  std::vector<int> i32s(const std::string& name) const;
  std::vector<double> reals(const std::string& name) const;
  std::vector<std::string> strs(const std::string& name) const;  // text, choice, path lists
  std::vector<std::pair<int, int>> grids(const std::string& name) const;
  bool json() const { return flag("json"); }
  // A UsageError naming --name (for cross-option checks in the handlers, before any work).
  [[noreturn]] void fail(const std::string& name, const std::string& message) const;

 private:
  struct Value {
    bool given = false;
    std::vector<std::string> items;  // one item unless a list
  };
  const Option& decl(const std::string& name, std::initializer_list<Type> types, bool list) const;
  const Value& value(const std::string& name) const { return values_.at(name); }
  std::string command_;
  std::map<std::string, Option> table_;
  std::map<std::string, Value> values_;
};

// Checks a value as the table would (for values built by a handler): throws UsageError naming it.
int64_t parse_integer_value(const std::string& option, const std::string& text, int64_t lo, int64_t hi);
double parse_real_value(const std::string& option, const std::string& text, const Range& r);

// Edit distance (for "did you mean --tokens?").
size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace ariadne::cli
