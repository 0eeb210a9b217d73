// ariadne/error.hpp — the one error type of the library.
//
// Every check that can fail on user input throws ariadne::Error with a message that names the
// tensor or file, the field, and what was expected ("q: dim 2 (head_dim) is 81, expected one of
// 64, 80, 96, 128"). Errors are exceptions rather than status codes because every client (the CLI,
// the Python bindings, the encoder) turns them into a message for a person at one place; the
// Python bindings map them to ValueError with the same text.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace ariadne {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
template <class... Args>
[[noreturn]] void fail(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  throw Error(os.str());
}
}  // namespace detail

// ARIADNE_CHECK(cond, "q: ", "dim 2 is ", d, ", expected ...") — throws ariadne::Error.
#define ARIADNE_CHECK(cond, ...)                 \
  do {                                           \
    if (!(cond)) ::ariadne::detail::fail(__VA_ARGS__); \
  } while (0)

// ---- checked size arithmetic ----
// Element counts, byte sizes and FLOP counts come from user input (CLI options, file headers):
// every product or sum of them goes through these, which throw ariadne::Error naming the quantity
// instead of wrapping. `what` is streamed into the message only on failure, e.g.
//   checked_mul(tokens, heads, "q: element count (tokens · heads)")
// → "q: element count (tokens · heads): 4 · 4611686018427387904 overflows 64-bit integers".
template <class... What>
[[nodiscard]] int64_t checked_mul(int64_t a, int64_t b, What&&... what) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r))
    detail::fail(std::forward<What>(what)..., ": ", a, " · ", b, " overflows 64-bit integers");
  return r;
}
template <class... What>
[[nodiscard]] int64_t checked_add(int64_t a, int64_t b, What&&... what) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r))
    detail::fail(std::forward<What>(what)..., ": ", a, " + ", b, " overflows 64-bit integers");
  return r;
}
template <class... What>
[[nodiscard]] uint64_t checked_mul_u64(uint64_t a, uint64_t b, What&&... what) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r))
    detail::fail(std::forward<What>(what)..., ": ", a, " · ", b, " overflows 64-bit integers");
  return r;
}
template <class... What>
[[nodiscard]] uint64_t checked_add_u64(uint64_t a, uint64_t b, What&&... what) {
  uint64_t r;
  if (__builtin_add_overflow(a, b, &r))
    detail::fail(std::forward<What>(what)..., ": ", a, " + ", b, " overflows 64-bit integers");
  return r;
}
// Product of non-negative dimensions; throws naming `what` for a negative one or an overflow. The
// product of the non-zero dimensions must fit too, so that no partial product (a stride, a row
// count) of an empty tensor can overflow either.
template <class Dims, class... What>
[[nodiscard]] int64_t checked_numel(const Dims& dims, What&&... what) {
  int64_t n = 1;
  bool empty = false;
  size_t i = 0;
  for (const auto d : dims) {
    if constexpr (std::is_signed_v<std::decay_t<decltype(d)>>) {
      if (d < 0) detail::fail(what..., ": dimension ", i, " is ", d, ", expected >= 0");
    }
    if (uint64_t(d) > uint64_t(INT64_MAX) || __builtin_mul_overflow(n, d == 0 ? int64_t(1) : int64_t(d), &n))
      detail::fail(what..., ": element count overflows 64-bit integers at dimension ", i, " (", d, ")");
    empty = empty || d == 0;
    ++i;
  }
  return empty ? 0 : n;
}

}  // namespace ariadne
