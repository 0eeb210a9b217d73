// ariadne/attention.hpp — the attention entry point shared by every backend.
//
//   out_i = Σ_{j ∈ N(i)} a_ij v_j,   a_ij = exp(s_ij) / Z_i,   s_ij = scale · q_i·k_j
//   Z_i   = Σ_{j ∈ N(i)} exp(s_ij)                     (sink_mode none)
//   Z_i   = exp(sink_h) + Σ_{j ∈ N(i)} exp(s_ij)        (sink_mode denominator: GPT-OSS / FA4 / cuDNN)
//   s_i0 += sink_h  for local key 0 of each sequence    (sink_mode key0_bias: MiMo-V2.5 reference)
//   lse_i = log Z_i  (natural log; includes the sink in denominator mode)
//
// N(i) comes from the Pattern (pattern.hpp). The sink logit is in the units of the scaled scores
// (never multiplied by `scale`). GQA: query head h reads KV head h / (heads_q / heads_kv).
// A row with no allowed key and no sink gets out = 0 and lse = −inf; with a denominator sink it
// gets out = 0 and lse = sink_h. docs/numerics.md states the tolerances each backend meets.
#pragma once

#include <string>

#include "ariadne/pattern.hpp"
#include "ariadne/tensor.hpp"

namespace ariadne {

enum class SinkMode : uint8_t { none, denominator, key0_bias };
enum class Backend : uint8_t { automatic, reference, cpu, cuda };

const char* sink_mode_name(SinkMode m);
SinkMode parse_sink_mode(const std::string& s);  // "none" | "denominator" | "key0"
const char* backend_name(Backend b);
Backend parse_backend(const std::string& s);     // "auto" | "reference" | "cpu" | "cuda"

struct AttentionParams {
  TensorView q;    // [total_q, heads_q, head_dim]; head_dim contiguous, other strides free
  TensorView k;    // [total_k, heads_kv, head_dim]
  TensorView v;    // [total_k, heads_kv, head_dim]
  TensorView out;  // [total_q, heads_q, head_dim]; written; dtype of q unless f32 requested
  TensorView lse;  // optional: [heads_q, total_q] f32, contiguous

  Pattern pattern;  // pointers on the device of q/k/v
  SinkMode sink_mode = SinkMode::none;
  TensorView sink;  // [heads_q] f32 when sink_mode != none (device of q)
  float scale = 0.f;  // 0 selects 1/sqrt(head_dim)

  // ---- optional diagnostics (reference and CPU backends; CUDA where it says so) ----
  // entropy / distance use the row's distribution over keys renormalized to sum 1 (the sink's mass
  // is left out), so that a sink does not shrink them; `received` uses the true a_ij (with the sink
  // the columns lose the mass the sink takes). Rows with no key give 0.
  TensorView entropy;   // [heads_q, total_q] f32: −Σ_j â_ij ln â_ij, â = a / Σ_j a_ij (nats)
  TensorView distance;  // [heads_q, total_q] f32: Σ_j â_ij ‖c_i − c_j‖₂, needs coords
  TensorView received;  // [heads_q, total_k] f32: Σ_i a_ij over all queries i that see j
  TensorView coords_q;  // [total_q, 2] f32: (row, col) of each query token in its image grid
  TensorView coords_k;  // [total_k, 2] f32

  // ---- optional token order ----
  // A permutation of the packed rows (needs total_q == total_k): logical row i of the pattern — the
  // i-th token of the order the pattern is written for — is stored at packed row order[i] of q, k, v,
  // out, lse and every diagnostic (coords included). So a window over the column-major walk of an
  // image runs on tensors kept row-major. The CUDA backend folds the order into its loads and stores
  // (no gather of q, k, v, no scatter of out); the reference and CPU backends gather into scratch
  // copies and scatter back. int32 [total_q] in the memory of q's device. Host orders are checked to
  // be permutations; device orders are trusted, like the pattern's device arrays.
  const int32_t* order = nullptr;

  void* stream = nullptr;  // cudaStream_t for the CUDA backend; ignored elsewhere

  // Optional: the number of blocks pattern.blocks lists (row_ptr[rows]) when the caller knows it on
  // the host, −1 when not. A schedule hint only, never used to index: the CUDA backend reads
  // device masks without copying them back, and with it can tell short block-sparse rows (which
  // it runs with another consumer schedule) from long ones. prefill() sets it from the estimate.
  int64_t blocks_nnz = -1;

  float resolved_scale() const;  // scale, or 1/sqrt(head_dim) when 0
  int heads_q() const { return int(q.shape[1]); }
  int heads_kv() const { return int(k.shape[1]); }
  int head_dim() const { return int(q.shape[2]); }
};

// Checks shapes, dtypes, devices, strides, GQA ratio, sink and diagnostics against each other and,
// for host tensors, the pattern's arrays (validate_pattern). Throws ariadne::Error naming the tensor
// and the field.
void validate(const AttentionParams& p);

// Checks that a host array `order` [total] is a permutation of 0..total-1 (AttentionParams::order);
// throws ariadne::Error naming the first bad entry. validate() runs it for host tensors; callers with
// device tensors and a host copy of the order run it before uploading.
void validate_order(const int32_t* order, int64_t total);

// Runs attention on the chosen backend. automatic: cuda for device tensors, cpu for host tensors.
// Throws ariadne::Error when the backend is not built or does not support the case.
void attention(const AttentionParams& p, Backend backend = Backend::automatic);

// Whether `backend` can run `p`; when not, `why` (if given) says which feature is missing.
bool backend_supports(Backend backend, const AttentionParams& p, std::string* why = nullptr);

// The CPU backend's worker count (defaults to the machine's hardware threads; ARIADNE_THREADS
// overrides). Results are deterministic for a given count.
int cpu_threads();
void set_cpu_threads(int n);

}  // namespace ariadne
