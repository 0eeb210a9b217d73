// The registry of subcommands, their --help, and the CLI's output helpers (cli.hpp).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <new>
#include <sstream>

#include "ariadne/device.hpp"
#include "cli.hpp"

namespace ariadne::cli {

void require_cuda_if_asked(const Args& a, const std::string& option) {
  if (a.str(option) == "cuda" && !cuda_available())
    a.fail(option, "cuda: no CUDA device is available here (or this build has no CUDA backend)");
}

void check_memory(const std::string& command, const std::string& option, double bytes) {
  const double phys = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  if (phys > 0 && bytes > 0.8 * phys) {
    std::ostringstream os;
    os << "this run needs about " << std::fixed << std::setprecision(1) << bytes / 1e9
       << " GB of buffers, more than 80% of this machine's " << phys / 1e9 << " GB; lower " << option;
    throw UsageError(os.str(), option);
  }
}

void rethrow_naming_outputs(const std::vector<std::string>& written) {
  if (written.empty()) throw;
  std::string note = "; this run had already written " + std::to_string(written.size()) + " file(s): ";
  constexpr size_t kListed = 8;
  for (size_t i = 0; i < written.size() && i < kListed; ++i) note += (i ? ", " : "") + written[i];
  if (written.size() > kListed) note += ", ... (" + std::to_string(written.size() - kListed) + " more)";
  try {
    throw;
  } catch (const UsageError& e) {
    throw UsageError(e.what() + note, e.option(), e.file());
  } catch (const Error& e) {
    throw Error(e.what() + note);
  } catch (const std::filesystem::filesystem_error& e) {
    const std::string p = e.path1().string();
    throw Error((p.empty() ? "" : p + ": ") + e.code().message() + note);
  } catch (const std::bad_alloc&) {
    throw Error("out of memory: the request is too large for this machine" + note);
  }
}

std::map<std::string, CommandInfo>& registry() {
  static std::map<std::string, CommandInfo> r;
  return r;
}

Command::Command(const char* name, const char* help, OptionTable options, Handler run) {
  options.push_back(boolean("json", false, "print one JSON document on stdout (errors too)"));
  registry()[name] = CommandInfo{help, std::move(options), std::move(run)};
}

void print_help(const std::string& name, const CommandInfo& info) {
  std::cout << "usage: ariadne " << name << " [--option value ...]\n\n" << info.help << "\n\noptions:\n";
  std::vector<std::pair<std::string, std::string>> rows;
  size_t width = 0;
  for (const Option& o : info.options) {
    std::string left = "--" + o.name + " " + o.type_text();
    std::string right = o.help;
    std::string notes;
    if (o.required) notes = "required";
    else if (!o.def.empty()) notes = "default " + o.def;
    if ((o.type == Type::integer || o.type == Type::real) &&
        !(std::isinf(o.range.lo) && std::isinf(o.range.hi)))
      notes += (notes.empty() ? "" : "; ") + std::string("in ") + o.range.text(o.type == Type::integer);
    if (o.type == Type::grid) notes += (notes.empty() ? "" : "; ") + std::string("sides in ") + o.range.text(true);
    if (!notes.empty()) {
      // "... (default: X)" in the help line and a range: one parenthesis, "(default: X; in [a, b])".
      if (!right.empty() && right.back() == ')' && right.find('(') != std::string::npos)
        right.insert(right.size() - 1, "; " + notes);
      else
        right += " (" + notes + ")";
    }
    width = std::max(width, left.size());
    rows.emplace_back(std::move(left), std::move(right));
  }
  width = std::min<size_t>(width, 34);
  for (const auto& [l, r] : rows) {
    std::cout << "  " << l;
    if (l.size() < width) std::cout << std::string(width - l.size(), ' ');
    else std::cout << "\n  " << std::string(width, ' ');
    std::cout << "  " << r << "\n";
  }
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

}  // namespace ariadne::cli
