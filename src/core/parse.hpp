// ariadne/parse.hpp — whole-string number parsing for options, pattern specs and mix strings.
//
// Each returns nullopt unless the entire text is one number (no leading or trailing characters),
// so callers can report the text and what was expected in their own error message.
#pragma once

#include <charconv>
#include <cstdint>
#include <optional>
#include <string_view>

namespace ariadne {

inline std::optional<int64_t> parse_int(std::string_view text) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

inline std::optional<double> parse_real(std::string_view text) {
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

}  // namespace ariadne
