// The attention case table and its runner, in the manner of ggml's test-backend-ops: a case is data
// with a printable name, one table holds every case, and one runner checks any backend against the
// double reference on it. The CPU suite (tests/cpu/test_cases.cpp) and the CUDA suite
// (tests/cuda/test_cases_cuda.cpp) run the same table; a backend that declines a case
// (backend_supports) skips it with its reason. Benchmarks can read the table through cases(filter).
//
// What the runner checks on every case (docs/numerics.md):
//   - fresh inputs from the case's seed; every output poisoned with NaN before the run;
//   - out against the reference under the tolerance rule (every element written, rel. L2, max abs);
//   - LSE entry by entry: NaN, +inf and −inf exactly where the reference has them, else within tol;
//   - rows the reference leaves exactly zero are exactly zero;
//   - rows with no allowed key by the pattern's own rule: out 0, LSE −inf (the sink with a
//     denominator sink), on the reference and on the backend; a case marked must_mask must have some;
//   - with diagnostics: entropy, distance and received attention against the reference;
//   - when the backend asks for it, a second run into fresh outputs is bit-identical to the first.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common.hpp"

namespace ariadne::testing {

// How the pattern's logical rows map to stored rows (AttentionParams::order).
enum class TokenOrder : uint8_t {
  none,          // logical row i is stored row i
  column_major,  // a rows × grid_cols grid stored row-major, walked column by column (Ariadne)
  shuffled,      // a random permutation (seeded by the case)
};

struct AttnCase {
  std::vector<int64_t> tokens_q;  // query tokens per sequence (a packed batch when > 1 entry)
  std::vector<int64_t> tokens_k;  // key tokens per sequence; empty: the same as tokens_q
  int heads_q = 4, heads_kv = 4, dim = 64;
  // full | causal | window:L,R | chunk:C | blocks:D@B, joined by '+': "causal+blocks:0.5@64",
  // "chunk:48+window:10,inf". L and R are integers or inf; blocks:D@B adds a random block mask
  // keeping a share D of the visible blocks of B tokens (rows may end up fully masked).
  std::string pattern = "full";
  SinkMode sink_mode = SinkMode::none;
  float sink = 0;                 // NaN: random per head in [-3, 3]
  DType dtype = DType::bf16;      // of q, k, v
  bool f32_out = false;           // out in f32 instead of q's dtype
  TokenOrder order = TokenOrder::none;
  int grid_cols = 0;              // column_major: the grid's width (rows = tokens / grid_cols)
  int64_t token_pad = 0;          // > 0: q, k, v are strided views into rows this much wider
  float input_scale = 1;          // q and k uniform in [-input_scale, input_scale] (35: logits ~1e4)
  float logit_shift = 0;          // ≠ 0: every logit of a row moved by this (channel 0, scale 1/4)
  bool diagnostics = false;       // also entropy, distance and received attention
  bool lse = true;                // false: no LSE output (backends then keep their own)
  bool must_mask = false;         // the case must contain fully masked rows
  uint64_t seed = 1;
};

// "n1000_h4x1_d80_window:64,64_sink:denominator+2_bf16_s7": every field that is not at its
// default, in a fixed order. Unique within the table.
// A case with the given shape, pattern and dtype (every other field at its default).
AttnCase make_case(std::vector<int64_t> q, std::vector<int64_t> k, int hq, int hkv, int dim, std::string pattern,
                   DType dt, uint64_t seed = 1);
std::string name_of(const AttnCase& c);
// The same name with only [A-Za-z0-9_] (GoogleTest's rule for parameterized test names).
std::string test_name_of(const AttnCase& c);
// For INSTANTIATE_TEST_SUITE_P(..., ::testing::ValuesIn(cases()), test_name).
std::string test_name(const ::testing::TestParamInfo<AttnCase>& info);
// gtest prints a parameter with this instead of its bytes.
void PrintTo(const AttnCase& c, std::ostream* os);

// The pattern of a spec (without its block mask) and the mask's density and block size.
PatternSpec parse_case_pattern(const std::string& spec);

// The table. filter: space-separated terms that must all occur in a case's name ("" keeps all),
// e.g. cases("window:64,64 bf16").
std::vector<AttnCase> cases(const std::string& filter = "");

// ---- the runner ----

// Every output of one run (host). Unused ones stay empty.
struct CaseOutputs {
  Buffer out, lse, entropy, distance, received;
};

// A case made concrete: stored inputs, coordinates, the order and the reference's outputs.
struct PreparedCase {
  AttnCase c;
  std::string name;
  Inputs in;                    // stored inputs and pattern arrays; in.params has no outputs
  Buffer coords_q, coords_k;    // grid cells for the distance diagnostic (diagnostics only)
  std::vector<int32_t> order;   // [total_q] (order != none)
  CaseOutputs ref;              // the reference, f32
  double tol = 0;               // the rule's tolerance for the case's dtype and logit bound
  uint64_t seed = 0;            // the seed the inputs were drawn with
};
// salt ≠ 0 draws other inputs for the same case (a per-process seed).
PreparedCase prepare(const AttnCase& c, uint64_t salt = 0);
// NaN-filled outputs for a run: out in the case's out dtype, LSE unless the case has none, the
// diagnostics when it has them.
CaseOutputs poisoned_outputs(const PreparedCase& pc);
// Host params of the case writing into `o`: q, k, v, pattern, sink, order, outputs, coordinates.
AttentionParams host_params(const PreparedCase& pc, const CaseOutputs& o);

struct CaseBackend {
  std::string name;
  // Runs the case into `o` (host buffers from poisoned_outputs); returns false, with the reason in
  // *why, when the backend declines the case.
  std::function<bool(const PreparedCase& pc, CaseOutputs& o, std::string* why)> run;
  // Diagnostics from fp32 probabilities: held to 10× the f32 rule (else to the case's tol).
  bool fp32_diagnostics = false;
  // Run twice and require the second run to be bit-identical to the first.
  bool repeat = false;
};

// Runs and checks one case (the list at the top) with gtest assertions. Returns false when the
// backend declined it (the caller skips); got, when given, receives the first run's outputs.
bool run_case(const PreparedCase& pc, const CaseBackend& backend, std::string* why, CaseOutputs* got = nullptr);
// The checks alone, on outputs obtained elsewhere.
void check_outputs(const PreparedCase& pc, const CaseOutputs& got, bool fp32_diagnostics);

}  // namespace ariadne::testing
