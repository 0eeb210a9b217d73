// ariadne/error.hpp — the one error type of the library.
//
// Every check that can fail on user input throws ariadne::Error with a message that names the
// tensor or file, the field, and what was expected ("q: dim 2 (head_dim) is 81, expected one of
// 64, 80, 96, 128"). Errors are exceptions rather than status codes because every client (the CLI,
// the Python bindings, the encoder) turns them into a message for a person at one place; the
// Python bindings map them to ValueError with the same text.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
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

}  // namespace ariadne
