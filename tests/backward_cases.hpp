// The backward on the case table (cases.hpp): one runner that checks any backend's gradients
// against the reference backward on a prepared case, shared by the CPU and CUDA suites.
//
// What it checks (docs/numerics.md, "Gradients"):
//   - dout drawn fresh from the case's seed; every gradient poisoned with NaN before the run;
//   - dq, dk, dv and dsink against the reference backward (double, recomputed forward), every
//     element written, with errors measured against the magnitude sums behind each element
//     (docs/numerics.md, "Gradients"): dq_ic = scale Σ_j dS_ij k_jc is held to tol · scale Σ_j
//     |dS|_ij |k_jc|, where |dS|_ij = p_ij (|dP_ij| + Σ_c |dout_ic out_ic|) bounds dS and the error
//     that the saved out's rounding puts into D; likewise dk, dv (Σ_i p_ij |dout_ic|) and dsink.
//     ‖got − ref‖₂ ≤ tol · ‖M‖₂ and every |got − ref| ≤ 10 · tol · (M + 10⁻³ max M). Sums that
//     cancel (a row with one dominant key: dP ≈ D; logits shifted by ±1e4 with a common key
//     component) are held to the rounding their terms carry, not to their small result;
//   - rows of dq whose query sees no key (by the pattern's rule) are exactly zero, as are the dk, dv
//     rows of keys no query sees;
//   - when the backend asks for it, a second run into fresh gradients is bit-identical to the first.
#pragma once

#include <functional>
#include <string>

#include "ariadne/attention_backward.hpp"
#include "cases.hpp"

namespace ariadne::testing {

// The forward results the backward reads, the upstream gradient and the reference gradients (f32;
// dsink empty without a sink). out is in the case's out dtype, as a backend would keep it.
struct BackwardCase {
  Buffer out, lse, dout;
  Buffer dq, dk, dv, dsink;      // the reference backward
  Buffer mdq, mdk, mdv, mdsink;  // the magnitude sums behind each gradient element (f32, same shapes)
  double tol = 0;                // the gradient tolerance for this case
};
BackwardCase prepare_backward(const PreparedCase& pc);

// Gradients of one run (host). grad_dtype: dq, dk, dv in q's dtype (false: f32).
struct BackwardOutputs {
  Buffer dq, dk, dv, dsink;
};
BackwardOutputs poisoned_grads(const PreparedCase& pc, bool f32_grads);

// Host params of the case for a backward: inputs, pattern, sink, order, out and lse of `bc`.
AttentionParams backward_params(const PreparedCase& pc, const BackwardCase& bc);
AttentionGrads grads_of(const BackwardCase& bc, const BackwardOutputs& o);

struct BackwardBackend {
  std::string name;
  bool f32_grads = false;  // ask for f32 gradients instead of q's dtype
  bool repeat = false;     // run twice, the second run bit-identical to the first
  // Runs the backward into `o` (host buffers from poisoned_grads); false with *why when declined.
  std::function<bool(const PreparedCase&, const BackwardCase&, BackwardOutputs&, std::string*)> run;
};

// Runs and checks one case. Returns false when the backend declined it.
bool run_backward_case(const PreparedCase& pc, const BackwardCase& bc, const BackwardBackend& backend,
                       std::string* why);
void check_grads(const PreparedCase& pc, const BackwardCase& bc, const BackwardOutputs& got);

// The cases the backward suites run: the table without diagnostics-only variants and, to bound the
// reference's time, at most `max_tokens` query tokens.
std::vector<AttnCase> backward_cases(int64_t max_tokens = 1100);

}  // namespace ariadne::testing
