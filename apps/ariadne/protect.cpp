#include "protect.hpp"

#include <vector>

#include "ariadne/error.hpp"

namespace ariadne::cli {
namespace {

std::vector<std::string> split_plus(const std::string& s) {
  std::vector<std::string> out;
  size_t a = 0;
  while (a <= s.size()) {
    const size_t b = std::min(s.find('+', a), s.size());
    out.push_back(s.substr(a, b - a));
    a = b + 1;
  }
  return out;
}

}  // namespace

std::optional<Protections> parse_protect(const std::string& s, bool allow_previous) {
  Protections p;
  bool published = false, explicit_set = false;
  for (const std::string& w : split_plus(s)) {
    if (w == "published") published = true;
    else if (w == "none") continue;
    else if (w == "previous" && allow_previous) continue;
    else if (w == "sink") p.sink = explicit_set = true;
    else if (w == "diagonal") p.diagonal = explicit_set = true;
    else if (w == "last_row") p.last_row = explicit_set = true;
    else
      detail::fail("protections '", s, "' have '", w, "', expected published, none, or sink/diagonal/last_row",
                   allow_previous ? " (and previous)" : "", " joined by '+'");
  }
  ARIADNE_CHECK(!(published && explicit_set), "protections '", s, "' mix published with explicit ones");
  if (published) return std::nullopt;
  return p;
}

bool keeps_previous(const std::string& s) {
  for (const std::string& w : split_plus(s))
    if (w == "previous") return true;
  return false;
}

std::string protections_text(const Protections& p) {
  std::string s;
  for (auto [on, name] : {std::pair{p.sink, "sink"}, {p.diagonal, "diagonal"}, {p.last_row, "last_row"}})
    if (on) {
      if (!s.empty()) s.push_back('+');
      s.append(name);
    }
  return s.empty() ? "none" : s;
}

}  // namespace ariadne::cli
