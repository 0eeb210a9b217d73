// The declared options of cli_options.hpp: parsing and validation.
#include "cli_options.hpp"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <stdexcept>
#include <system_error>

#include "ariadne/file.hpp"

namespace ariadne::cli {
namespace {

namespace fs = std::filesystem;

std::string fmt_num(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  std::ostringstream os;
  if (v == std::floor(v) && std::abs(v) < 9.2e18) {
    const auto i = static_cast<long long>(v);
    // Large powers of two read better as such (2^31, not 2147483648).
    if (i >= (1LL << 20) && (i & (i - 1)) == 0) {
      int e = 0;
      while ((1LL << e) < i) ++e;
      os << "2^" << e;
      return os.str();
    }
    os << i;
  } else {
    os << v;
  }
  return os.str();
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  if (s.empty()) return out;
  size_t start = 0;
  while (true) {
    const size_t comma = s.find(',', start);
    out.push_back(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

const char* kBoolWords = "yes, no, true, false, 1 or 0";

std::optional<bool> parse_bool(const std::string& s) {
  if (s == "yes" || s == "true" || s == "1") return true;
  if (s == "no" || s == "false" || s == "0") return false;
  return std::nullopt;
}

std::pair<int, int> parse_grid_value(const std::string& option, const std::string& text, const Range& r) {
  const size_t x = text.find_first_of("xX");
  const std::string what = "option " + option + ": expected HxW with sides in " + r.text(true) + " (e.g. 10x14), got '" +
                           text + "'";
  if (x == std::string::npos) throw UsageError(what, option);
  int64_t h = 0, w = 0;
  const std::string a = text.substr(0, x), b = text.substr(x + 1);
  auto whole = [](const std::string& s, int64_t& v) {
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    return !s.empty() && ec == std::errc() && end == s.data() + s.size();
  };
  if (!whole(a, h) || !whole(b, w) || !r.contains(double(h)) || !r.contains(double(w))) throw UsageError(what, option);
  return {int(h), int(w)};
}

// Runs a check of file.hpp; its Error (which names the path) becomes the option's UsageError.
template <class F>
void as_option_error(const std::string& option, const std::string& path, F&& f) {
  try {
    f();
  } catch (const Error& e) {
    throw UsageError("option " + option + ": " + e.what(), option, path);
  }
}

// Checks one path value up front: inputs exist and are regular files (never a FIFO: reading one
// blocks) or folders; output folders are created now and must be writable; output files need a
// writable folder and must not be folders.
void check_path(const std::string& option, PathKind kind, const std::string& p) {
  std::error_code ec;
  auto bad = [&](const std::string& why) { throw UsageError("option " + option + ": " + p + ": " + why, option, p); };
  if (p.empty()) bad("empty path");
  const fs::file_status st = fs::status(p, ec);
  // Not found is an answer; anything else (a symlink loop, a name too long, no permission on a
  // folder above) is reported as the system says it.
  if (ec && ec != std::errc::no_such_file_or_directory && ec != std::errc::not_a_directory) bad(ec.message());
  const bool exists = !ec && fs::exists(st);
  switch (kind) {
    case PathKind::none:
      return;
    case PathKind::in_file:
      if (!exists) bad("no such file");
      if (fs::is_directory(st)) bad("is a folder, expected a file");
      if (!fs::is_regular_file(st)) bad("not a regular file (a FIFO, device or socket is refused)");
      if (::access(p.c_str(), R_OK) != 0) bad("not readable");
      return;
    case PathKind::in_dir:
      if (!exists) bad("no such folder");
      if (!fs::is_directory(st)) bad("not a folder");
      return;
    case PathKind::in_any:
      if (!exists) bad("no such file or folder");
      if (!fs::is_directory(st) && !fs::is_regular_file(st))
        bad("not a regular file or folder (a FIFO, device or socket is refused)");
      return;
    case PathKind::out_dir:
      if (exists && !fs::is_directory(st)) bad("exists and is not a folder");
      as_option_error(option, p, [&] { prepare_output_dir(p, true); });
      return;
    case PathKind::out_file:
    case PathKind::out_prefix: {
      if (kind == PathKind::out_file && exists && fs::is_directory(st)) bad("is a folder, expected a file");
      fs::path parent = fs::path(p).parent_path();
      if (parent.empty()) parent = ".";
      const fs::file_status ps = fs::status(parent, ec);
      if (ec || !fs::is_directory(ps)) bad("its folder " + parent.string() + " does not exist");
      // The writers' own checks (file.hpp): a file can be created in the folder, and an existing
      // output is a regular file.
      as_option_error(option, p, [&] {
        if (kind == PathKind::out_file) check_output_file(p);
        else prepare_output_dir(parent.string(), false);
      });
      return;
    }
  }
}

// Checks one item of an option's value; throws UsageError naming the option.
void check_item(const Option& o, const std::string& item) {
  const std::string opt = "--" + o.name;
  switch (o.type) {
    case Type::integer: {
      const Range& r = o.range;
      parse_integer_value(opt, item, int64_t(r.lo), int64_t(r.hi));
      break;
    }
    case Type::real:
      parse_real_value(opt, item, o.range);
      break;
    case Type::boolean:
      if (!parse_bool(item))
        throw UsageError("option " + opt + ": expected " + kBoolWords + ", got '" + item + "'", opt);
      break;
    case Type::choice:
      if (std::find(o.choices.begin(), o.choices.end(), item) == o.choices.end()) {
        std::string all;
        for (const auto& c : o.choices) all += (all.empty() ? "" : ", ") + c;
        throw UsageError("option " + opt + ": expected one of " + all + ", got '" + item + "'", opt);
      }
      break;
    case Type::grid:
      parse_grid_value(opt, item, o.range);
      break;
    case Type::path:
      check_path(opt, o.path, item);
      break;
    case Type::text:
      break;
  }
  if (o.check) {
    try {
      o.check(item);
    } catch (const UsageError&) {
      throw;
    } catch (const Error& e) {
      throw UsageError("option " + opt + ": " + e.what(), opt);
    }
  }
}

Option make(std::string name, Type t, std::string def, std::string help) {
  Option o;
  o.name = std::move(name);
  o.type = t;
  o.def = std::move(def);
  o.help = std::move(help);
  return o;
}

std::string num_text(int64_t v) { return std::to_string(v); }
std::string num_text(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

bool Range::contains(double v) const {
  if (std::isnan(v)) return false;
  if (lo_open ? !(v > lo) : !(v >= lo)) return false;
  if (hi_open ? !(v < hi) : !(v <= hi)) return false;
  return true;
}

std::string Range::text(bool) const {
  const bool lo_inf = std::isinf(lo), hi_inf = std::isinf(hi);
  if (lo_inf && hi_inf) return "any finite value";
  if (hi_inf) return std::string(lo_open ? "> " : ">= ") + fmt_num(lo);
  if (lo_inf) return std::string(hi_open ? "< " : "<= ") + fmt_num(hi);
  return std::string(lo_open ? "(" : "[") + fmt_num(lo) + ", " + fmt_num(hi) + (hi_open ? ")" : "]");
}

std::string Option::type_text() const {
  std::string t;
  switch (type) {
    case Type::integer: t = "INT"; break;
    case Type::real: t = "REAL"; break;
    case Type::text: t = "TEXT"; break;
    case Type::boolean: t = "yes|no"; break;
    case Type::grid: t = "HxW"; break;
    case Type::path:
      t = path == PathKind::in_dir || path == PathKind::out_dir ? "DIR"
          : path == PathKind::in_any                            ? "PATH"
          : path == PathKind::out_prefix                        ? "PREFIX"
                                                                : "FILE";
      break;
    case Type::choice:
      for (const auto& c : choices) t += (t.empty() ? "" : "|") + c;
      break;
  }
  return list ? t + "[,...]" : t;
}

int64_t parse_integer_value(const std::string& option, const std::string& text, int64_t lo, int64_t hi) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  const bool whole = !text.empty() && ec == std::errc() && end == text.data() + text.size();
  if (!whole || v < lo || v > hi)
    throw UsageError("option " + option + ": expected an integer in " + Range::closed(double(lo), double(hi)).text(true) +
                         ", got '" + text + "'",
                     option);
  return v;
}

double parse_real_value(const std::string& option, const std::string& text, const Range& r) {
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  const bool whole = !text.empty() && ec == std::errc() && end == text.data() + text.size();
  if (!whole || !std::isfinite(v) || !r.contains(v))
    throw UsageError("option " + option + ": expected a number in " + r.text(false) + ", got '" + text + "'", option);
  return v;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

Option integer(std::string name, int64_t def, int64_t lo, int64_t hi, std::string help) {
  Option o = make(std::move(name), Type::integer, num_text(def), std::move(help));
  o.range = Range::closed(double(lo), double(hi));
  return o;
}
Option integer_list(std::string name, std::string def, int64_t lo, int64_t hi, std::string help) {
  Option o = make(std::move(name), Type::integer, std::move(def), std::move(help));
  o.range = Range::closed(double(lo), double(hi));
  return o.as_list();
}
Option real(std::string name, double def, Range r, std::string help) {
  Option o = make(std::move(name), Type::real, num_text(def), std::move(help));
  o.range = r;
  return o;
}
Option real_list(std::string name, std::string def, Range r, std::string help) {
  Option o = make(std::move(name), Type::real, std::move(def), std::move(help));
  o.range = r;
  return o.as_list();
}
Option text(std::string name, std::string def, std::string help) {
  return make(std::move(name), Type::text, std::move(def), std::move(help));
}
Option text_list(std::string name, std::string def, std::string help) {
  return make(std::move(name), Type::text, std::move(def), std::move(help)).as_list();
}
Option boolean(std::string name, bool def, std::string help) {
  return make(std::move(name), Type::boolean, def ? "yes" : "no", std::move(help));
}
Option choice(std::string name, std::string def, std::vector<std::string> choices, std::string help) {
  Option o = make(std::move(name), Type::choice, std::move(def), std::move(help));
  o.choices = std::move(choices);
  return o;
}
Option choice_list(std::string name, std::string def, std::vector<std::string> choices, std::string help) {
  return choice(std::move(name), std::move(def), std::move(choices), std::move(help)).as_list();
}
Option path(std::string name, PathKind kind, std::string help) {
  Option o = make(std::move(name), Type::path, "", std::move(help));
  o.path = kind;
  return o;
}
Option path_list(std::string name, PathKind kind, std::string help) {
  return path(std::move(name), kind, std::move(help)).as_list();
}
Option grid(std::string name, std::string def, int64_t max_side, std::string help) {
  Option o = make(std::move(name), Type::grid, std::move(def), std::move(help));
  o.range = Range::closed(1, double(max_side));
  return o;
}
Option grid_list(std::string name, std::string def, int64_t max_side, std::string help) {
  return grid(std::move(name), std::move(def), max_side, std::move(help)).as_list();
}
Option threads_option() {
  return integer("threads", 0, 1, kMaxThreads, "CPU threads (default: ARIADNE_THREADS or the hardware count)")
      .without_default();
}

Args::Args(std::string command, const OptionTable& table, const std::vector<std::string>& argv)
    : command_(std::move(command)) {
  for (const Option& o : table) {
    if (table_.count(o.name)) throw std::logic_error("option --" + o.name + " declared twice for " + command_);
    table_[o.name] = o;
  }
  // Pass 1: tokens to (name, raw value).
  std::map<std::string, std::string> raw;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a.rfind("--", 0) != 0 || a.size() <= 2)
      throw UsageError("unexpected argument '" + a + "' (options are --name value)", "");
    std::string key = a.substr(2), val;
    bool has_val = false;
    if (const auto eq = key.find('='); eq != std::string::npos) {
      val = key.substr(eq + 1);
      key = key.substr(0, eq);
      has_val = true;
    }
    const auto it = table_.find(key);
    if (it == table_.end()) {
      std::string best;
      size_t best_d = 3;  // suggest only names within two edits (or sharing a prefix)
      for (const auto& [n, o] : table_) {
        size_t d = edit_distance(key, n);
        if (n.rfind(key, 0) == 0 || key.rfind(n, 0) == 0) d = std::min<size_t>(d, 1);
        if (d < best_d) best_d = d, best = n;
      }
      throw UsageError("unknown option --" + key + " for '" + command_ + "'" +
                           (best.empty() ? "" : "; did you mean --" + best + "?") + " (ariadne " + command_ +
                           " --help lists them)",
                       "--" + key);
    }
    const Option& o = it->second;
    if (!has_val) {
      const bool next_is_value = i + 1 < argv.size() && argv[i + 1].rfind("--", 0) != 0;
      if (o.type == Type::boolean) {
        // A bare boolean is yes; a following word is its value only when it is a boolean word.
        if (next_is_value && parse_bool(argv[i + 1])) val = argv[++i];
        else if (next_is_value)
          throw UsageError("option --" + key + ": expected " + kBoolWords + ", got '" + argv[i + 1] + "'", "--" + key);
        else val = "yes";
      } else if (o.bare && !next_is_value) {
        val = *o.bare;
      } else {
        if (!next_is_value)
          throw UsageError("option --" + key + " needs a value (" + o.type_text() + ")", "--" + key);
        val = argv[++i];
      }
    }
    if (raw.count(key)) throw UsageError("option --" + key + " given twice", "--" + key);
    raw[key] = val;
  }
  // Pass 2: every option's value (given or default) parsed and checked now, before any work; output
  // paths last, so that no folder is created for a command whose other options are wrong.
  std::vector<const Option*> order;
  for (const auto& [name, o] : table_)
    if (o.type != Type::path || o.path == PathKind::in_file || o.path == PathKind::in_dir || o.path == PathKind::in_any)
      order.push_back(&o);
  for (const auto& [name, o] : table_)
    if (o.type == Type::path && !(o.path == PathKind::in_file || o.path == PathKind::in_dir || o.path == PathKind::in_any))
      order.push_back(&o);
  for (const Option* op : order) {
    const Option& o = *op;
    const std::string& name = o.name;
    Value v;
    const auto it = raw.find(name);
    v.given = it != raw.end();
    const std::string text = v.given ? it->second : o.def;
    if (!v.given && o.required)
      throw UsageError("option --" + name + " is required (" + o.help + ")", "--" + name);
    if (v.given && text.empty() && !o.list)
      throw UsageError("option --" + name + " needs a value (" + o.type_text() + ")", "--" + name);
    v.items = o.list ? split_commas(text) : (text.empty() ? std::vector<std::string>{} : std::vector<std::string>{text});
    if (v.given && o.list) {
      if (v.items.empty()) throw UsageError("option --" + name + " needs a value (" + o.type_text() + ")", "--" + name);
      for (const auto& s : v.items)
        if (s.empty()) throw UsageError("option --" + name + ": empty item in '" + text + "'", "--" + name);
    }
    for (const std::string& s : v.items) check_item(o, s);
    values_[name] = std::move(v);
  }
}

const Option& Args::decl(const std::string& name, std::initializer_list<Type> types, bool list) const {
  const auto it = table_.find(name);
  if (it == table_.end()) throw std::logic_error("ariadne " + command_ + " reads undeclared option --" + name);
  if (std::find(types.begin(), types.end(), it->second.type) == types.end() || it->second.list != list)
    throw std::logic_error("ariadne " + command_ + " reads --" + name + " with the wrong type");
  return it->second;
}

bool Args::given(const std::string& name) const {
  if (!table_.count(name)) throw std::logic_error("ariadne " + command_ + " reads undeclared option --" + name);
  return value(name).given;
}

int64_t Args::i64(const std::string& name) const {
  const Option& o = decl(name, {Type::integer}, false);
  const Value& v = value(name);
  if (v.items.empty()) throw std::logic_error("--" + name + " has no value and no default");
  return parse_integer_value("--" + name, v.items[0], int64_t(o.range.lo), int64_t(o.range.hi));
}

int Args::i32(const std::string& name) const {
  const int64_t v = i64(name);
  if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())
    throw std::logic_error("--" + name + ": declared range exceeds int");
  return int(v);
}

double Args::real(const std::string& name) const {
  const Option& o = decl(name, {Type::real}, false);
  const Value& v = value(name);
  if (v.items.empty()) throw std::logic_error("--" + name + " has no value and no default");
  return parse_real_value("--" + name, v.items[0], o.range);
}

const std::string& Args::str(const std::string& name) const {
  decl(name, {Type::text, Type::choice, Type::path}, false);
  static const std::string empty;
  const Value& v = value(name);
  return v.items.empty() ? empty : v.items[0];
}

bool Args::flag(const std::string& name) const {
  decl(name, {Type::boolean}, false);
  const Value& v = value(name);
  return !v.items.empty() && *parse_bool(v.items[0]);
}

std::pair<int, int> Args::grid(const std::string& name) const {
  const Option& o = decl(name, {Type::grid}, false);
  const Value& v = value(name);
  if (v.items.empty()) throw std::logic_error("--" + name + " has no value and no default");
  return parse_grid_value("--" + name, v.items[0], o.range);
}

std::vector<int64_t> Args::i64s(const std::string& name) const {
  const Option& o = decl(name, {Type::integer}, true);
  std::vector<int64_t> out;
  for (const auto& s : value(name).items)
    out.push_back(parse_integer_value("--" + name, s, int64_t(o.range.lo), int64_t(o.range.hi)));
  return out;
}

std::vector<int> Args::i32s(const std::string& name) const {
  const Option& o = decl(name, {Type::integer}, true);
  if (o.range.lo < std::numeric_limits<int>::min() || o.range.hi > std::numeric_limits<int>::max())
    throw std::logic_error("--" + name + ": declared range exceeds int");
  std::vector<int> out;
  for (int64_t v : i64s(name)) out.push_back(int(v));
  return out;
}

std::vector<double> Args::reals(const std::string& name) const {
  const Option& o = decl(name, {Type::real}, true);
  std::vector<double> out;
  for (const auto& s : value(name).items) out.push_back(parse_real_value("--" + name, s, o.range));
  return out;
}

std::vector<std::string> Args::strs(const std::string& name) const {
  decl(name, {Type::text, Type::choice, Type::path}, true);
  return value(name).items;
}

std::vector<std::pair<int, int>> Args::grids(const std::string& name) const {
  const Option& o = decl(name, {Type::grid}, true);
  std::vector<std::pair<int, int>> out;
  for (const auto& s : value(name).items) out.push_back(parse_grid_value("--" + name, s, o.range));
  return out;
}

void Args::fail(const std::string& name, const std::string& message) const {
  throw UsageError("option --" + name + ": " + message, "--" + name);
}

}  // namespace ariadne::cli
