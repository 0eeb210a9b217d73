// ariadne/attention_backward.hpp — gradients of attention (attention.hpp) for every pattern.
//
// With p_ij = exp(s_ij − lse_i) the forward's probabilities (recomputed from the saved LSE, never
// stored), the backward of out_i = Σ_j p_ij v_j is, per row i of a query head:
//   D_i   = Σ_d dout_i · out_i
//   dP_ij = dout_i · v_j,          dS_ij = p_ij (dP_ij − D_i)
//   dq_i  = scale Σ_j dS_ij k_j,   dk_j  = scale Σ_i dS_ij q_i,   dv_j = Σ_i p_ij dout_i
// over the pattern's visible pairs. GQA sums dk and dv over the query heads of each KV head.
// Sinks (one logit per query head, in the units of the scaled scores):
//   denominator: dsink_h = −Σ_i exp(sink_h − lse_i) · D_i      (over every row of head h)
//   key0_bias:   dsink_h =  Σ_i dS_i,0                          (local key 0 of each sequence)
// A row with no visible key contributes nothing (zero dq, nothing to dk, dv, dsink). A token order
// (AttentionParams::order) applies to the gradients as to the outputs: dq, dk, dv, dout are in the
// stored rows. docs/numerics.md states the tolerance each backend meets.
#pragma once

#include <memory>
#include <string>

#include "ariadne/attention.hpp"

namespace ariadne {

// The gradient tensors of one backward call. The forward's AttentionParams come beside them with
// out and lse holding the forward's results (inputs here); the diagnostics (entropy, distance,
// received) must be left undefined.
struct AttentionGrads {
  TensorView dout;   // [total_q, heads_q, head_dim]: dL/d out; dtype of q or f32; head_dim contiguous
  TensorView dq;     // [total_q, heads_q, head_dim]: written; dtype of q or f32
  TensorView dk;     // [total_k, heads_kv, head_dim]: written; dtype of q or f32
  TensorView dv;     // [total_k, heads_kv, head_dim]: written; dtype of q or f32
  TensorView dsink;  // [heads_q] f32: written when given (needs sink_mode != none)
};

struct BackwardOptions {
  Backend backend = Backend::automatic;  // automatic: cuda for device tensors, cpu for host tensors
  // Bitwise-reproducible results run to run. The reference and CPU backends always are (for a given
  // thread count); on CUDA it orders the fp32 accumulation of dq across key tiles.
  bool deterministic = false;
  // The CUDA main kernel (tests and benchmarks): automatic routes by the call (docs/design/backward.md);
  // tile (every call) or wgmma (compute capability 9.0, head dims 64, 80 and 128, blocks that are
  // multiples of 128) force one, and a forced kernel the call cannot take is an error naming why.
  // band and bandwg are forward kernels only.
  CudaKernel cuda_kernel = CudaKernel::automatic;
};

// Checks p as validate() does (minus the outputs it writes) plus: lse given, no diagnostics, every
// gradient's shape, dtype, device and strides, dsink only with a sink. Throws ariadne::Error naming
// the tensor and the field.
void validate_backward(const AttentionParams& p, const AttentionGrads& g);

namespace detail {
struct BackwardPlanState;
}

// A backward plan, made once per (shapes, strides, dtypes, pattern structure, device) like the
// forward's: it validates, picks the kernel and owns the device workspace (the fp32 dq accumulator,
// the D = rowsum(dout · out) vector, the transposed block list of a block-sparse mask). Copies share
// that workspace, so runs of one plan must be ordered on one stream.
class AttentionBackwardPlan {
 public:
  AttentionBackwardPlan() = default;
  bool valid() const { return state_ != nullptr; }
  Backend backend() const;
  bool deterministic() const;
  CudaKernel cuda_kernel() const;  // the CUDA main kernel (tile or wgmma); automatic on the host backends
  std::string describe() const;
  const detail::BackwardPlanState& state() const;

 private:
  friend AttentionBackwardPlan plan_attention_backward(const AttentionParams&, const AttentionGrads&,
                                                       const BackwardOptions&);
  std::shared_ptr<const detail::BackwardPlanState> state_;
};

AttentionBackwardPlan plan_attention_backward(const AttentionParams& p, const AttentionGrads& g,
                                              const BackwardOptions& options = {});

// Runs a backward plan on (p, g), whose shapes, strides, dtypes and pattern structure must be those
// it was planned for (pointers may differ); throws naming the mismatch. On CUDA it allocates nothing,
// only enqueues work on p.stream, and is safe inside CUDA graph capture.
void run(const AttentionBackwardPlan& plan, const AttentionParams& p, const AttentionGrads& g);

// plan_attention_backward(p, g, options) then run, with the plan taken from a per-process cache of
// the 8 plans used last when one fits: the same shapes, strides, dtypes, pattern structure,
// options, stream and CUDA device (pointers may differ). A CUDA plan owns its device workspace (the
// fp32 dq accumulator, D, the sink partials); made per call, it would be allocated and freed per
// call, and cudaFree waits for the whole device, so a training step could not run ahead of the
// GPU. With the cache, repeated calls of one shape only enqueue work. Calls that share a plan hold
// it while they enqueue, so those of two host threads on one stream stay in order on its workspace;
// calls on different streams get different plans. The PyTorch op and the Python functions use it.
void attention_backward(const AttentionParams& p, const AttentionGrads& g, const BackwardOptions& options);
// The same with BackwardOptions{backend}.
void attention_backward(const AttentionParams& p, const AttentionGrads& g, Backend backend = Backend::automatic);
// How many plans the cache holds; and dropping them all (their device memory is freed once no
// call is using them).
size_t backward_plan_cache_size();
void clear_backward_plan_cache();

// Whether `backend` can run this backward; when not, `why` (if given) says what is missing.
bool backend_supports_backward(Backend backend, const AttentionParams& p, const AttentionGrads& g,
                               std::string* why = nullptr);

}  // namespace ariadne
