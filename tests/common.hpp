// Shared test helpers: the input generator (a Case: shapes, pattern, sink, dtype, seed → fresh
// random inputs), the reference run, and the tolerance rule of docs/numerics.md. Used by tests/cpu
// (CI) and tests/cuda (device only); the attention case table (cases.hpp) is built on them.
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ariadne/attention.hpp"
#include "ariadne/error.hpp"
#include "ariadne/tensor.hpp"

namespace ariadne::testing {

// One attention problem, printable. Varlen when seq_q has more than one entry.
struct Case {
  std::string name;
  std::vector<int64_t> seq_q;  // query length per sequence
  std::vector<int64_t> seq_k;  // key length per sequence (empty: same as seq_q)
  int heads_q = 4, heads_kv = 4, dim = 64;
  Pattern pattern;             // dense part; blocks filled by make_inputs when block_density > 0
  double block_density = 0;    // > 0: random block-sparse mask keeping this share of visible blocks
  int block = 64;
  SinkMode sink_mode = SinkMode::none;
  float sink_value = 0;        // NaN: random per head in [-3, 3]
  DType dtype = DType::f32;
  float input_scale = 1;       // inputs uniform in [-input_scale, input_scale]
  uint64_t seed = 1;
  int64_t token_pad = 0;       // > 0: q/k/v are strided views into wider rows (token stride grows)
};

// Host inputs and the host-side pattern arrays of a Case; owns everything the views point to.
struct Inputs {
  Buffer q, k, v, sink;
  std::vector<int32_t> cu_q, cu_k;
  BlockMask mask;
  AttentionParams params;  // q/k/v/sink/pattern filled; out/lse left for the caller
  int64_t total_q = 0, total_k = 0;
};
Inputs make_inputs(const Case& c);

// Reference result (out as f32 [total_q, heads_q, dim], lse f32 [heads_q, total_q]).
struct Result {
  Buffer out, lse;
};
Result run_reference(const Inputs& in);

// Tolerance of docs/numerics.md for `dtype` and the largest |scaled logit| of a case.
double tolerance(DType dtype, double max_abs_logit);
double max_abs_logit(const Inputs& in);  // upper bound: scale · max|q| · max|k| · dim

// ‖out − ref‖₂ / ‖ref‖₂ and max |out − ref| over every element (NaN anywhere fails).
struct Diff {
  double rel_l2 = 0, max_abs = 0, ref_max = 0;
  int64_t nonfinite = 0;
};
Diff compare(const TensorView& out, const TensorView& ref);
// The rule: rel_l2 <= tol and max_abs <= 10·tol·max(|ref|, 1e-3) and no non-finite value.
::testing::AssertionResult close_enough(const char* what, const Diff& d, double tol);
// LSE: finite entries within tol·max(1,|ref|) absolute, −inf exactly where the reference has −inf.
::testing::AssertionResult lse_close(const TensorView& lse, const TensorView& ref, double tol);

// Sorted cut points 0 = c_0 < … < c_m = len of up to n runs, the inner ones random multiples of
// `align` (drawn from rng).
std::vector<int64_t> random_cuts(std::mt19937_64& rng, int64_t len, int64_t align, int n);

// The message of the ariadne::Error that f() throws, or "(no error)" when it returns: tests check
// that an error names the file, tensor or field. Any other exception propagates (a test failure).
inline constexpr const char* kNoError = "(no error)";
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return kNoError;
}

// A fresh folder under the system's temporary directory (mkdtemp: unique, so parallel test
// processes never share a file), removed with everything in it when the object goes. Files that
// every test of a binary uses live in a function-local static one, removed at exit.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "ariadne-test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return dir_; }
  std::string operator/(const std::string& name) const { return (dir_ / name).string(); }

 private:
  std::filesystem::path dir_;
};

}  // namespace ariadne::testing

// Expects `part` inside the string `msg` (an error message), printing the message when not.
#define EXPECT_MSG(msg, part) EXPECT_NE((msg).find(part), std::string::npos) << (msg)
