// Internal: the reference's row helpers (src/attention/reference/), shared by its forward and
// backward: one head's rows of a [tokens, heads, dim] view converted to double, and their dot
// product in double.
#pragma once

#include <cstdint>
#include <vector>

#include "ariadne/tensor.hpp"

namespace ariadne::reference {

inline std::vector<double> load_head(const TensorView& t, int64_t row0, int64_t rows, int64_t head) {
  const int64_t d = t.shape[2];
  std::vector<double> out(size_t(rows * d));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < d; ++c) out[size_t(r * d + c)] = t.get_f64({row0 + r, head, c});
  return out;
}

inline double dot(const double* a, const double* b, int64_t d) {
  double s = 0;
  for (int64_t i = 0; i < d; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace ariadne::reference
