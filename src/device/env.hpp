// Whether environment variable `name` is set to `value`. The estimators' CUDA code reads its
// comparison switches with it; the attention engine reads no environment (plans take overrides).
#pragma once

#include <cstdlib>
#include <string_view>

namespace ariadne {

inline bool env_is(const char* name, std::string_view value) {
  const char* env = std::getenv(name);
  return env != nullptr && value == env;
}

}  // namespace ariadne
