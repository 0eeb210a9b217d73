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

#include <cstdint>
#include <memory>
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
// What Backend::automatic runs for tensors like q: cuda for device tensors, reference for host f64
// (the only backend that takes it), cpu for the other host tensors.
Backend automatic_backend(const TensorView& q);

struct AttentionParams {
  // q, k, v: f32, bf16 or f16; or f64 on the host for the reference backend (exact checks such as a
  // float64 gradcheck), whose sink may then be f64 too.
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

// ---- plan, then run ----
// A plan is computed once per (shapes, strides, dtypes, pattern structure, device): it validates the
// call, answers support, picks the kernel (one routing function per backend) and prepares the device
// state (the wgmma kernel's tensor maps, the received pass's LSE scratch). run(plan, p) then launches
// on p's tensors: it allocates nothing, reads no environment, queries no device, never synchronizes,
// and is safe inside CUDA graph capture. attention(p) is plan_attention(p) + run.

enum class Toggle : uint8_t { automatic, off, on };
const char* toggle_name(Toggle t);

// The CUDA backend's kernel families: the mma.sync tile kernel (every pattern), the sm_90a wgmma
// kernel (dense and block-sparse rows without a left window bound), the per-warp band kernel
// (narrow windows and chunks at head dim 64/80/96) and the sm_90a wgmma band kernel (those at
// head dim 80).
enum class CudaKernel : uint8_t { automatic, tile, wgmma, band, bandwg };
const char* cuda_kernel_name(CudaKernel k);

// The wgmma kernel's CTA launch order: tile-major (each head's query tiles heaviest first, head
// after head) or heads-fastest (tile t of every head before tile t - 1 of any).
enum class LaunchOrder : uint8_t { automatic, tile_major, heads_fastest };

// Explicit route choices for tests and benchmarks (never read from the environment). automatic
// everywhere is the library's own choice; a forced choice the call cannot take makes plan_attention
// throw, naming the field and the reason (never a silent fallback).
struct AttentionOverrides {
  CudaKernel cuda_kernel = CudaKernel::automatic;  // needs Backend::cuda (or automatic on device tensors)
  // wgmma kernel knobs (only with cuda_kernel wgmma, forced or chosen):
  Toggle tma = Toggle::automatic;       // copy q, k, v with TMA (off: the cp.async producer)
  Toggle out_tma = Toggle::automatic;   // store O through shared memory and TMA (head dim 80/128, 16-bit out)
  Toggle pingpong = Toggle::automatic;  // consumers take turns at the softmax
  LaunchOrder launch_order = LaunchOrder::automatic;
  // tile kernel: 128-row query tiles (on) or 64-row tiles (off); automatic by shape.
  Toggle tile_128_rows = Toggle::automatic;
  // band kernels (band, bandwg): query tiles per CTA run; 0: the launcher picks (one wave).
  int band_run = 0;
  // bandwg with a block_col order (AttentionOptions::block_col): copy the ordered tiles with 5-D
  // tensor maps (on, the default where it applies) or gather rows with cp.async (off).
  Toggle ordered_tiles = Toggle::automatic;
  // bandwg on chunked patterns: the kernel with the one-chunk pass (on, default) or the window kernel (off).
  Toggle chunk_pass = Toggle::automatic;
};

// What a fused token order (AttentionParams::order) is, when the caller knows: order_conversion(
// block_row, block_col) of one image of h x w patches, merge 2 (Qwen's storage order and the ariadne
// schedule's column layers). The wgmma band kernel then copies the ordered tiles with the copy
// engine (5-D tensor maps over the merge-unit grid) instead of gathering rows, where one sequence
// holds the h·w tokens and h / 2 is a multiple of 16; elsewhere the hint is ignored (unless
// AttentionOverrides::ordered_tiles = on, which makes it an error). The hint is trusted (the order
// array must be that conversion: it still addresses out and lse). {0, 0}: unknown.
struct BlockColGrid {
  int h = 0, w = 0;
};

struct AttentionOptions {
  Backend backend = Backend::automatic;  // automatic: cuda for device tensors, cpu for host tensors
  AttentionOverrides overrides;
  BlockColGrid block_col;
};

namespace detail {
struct PlanState;
}

// The outcome of plan_attention: the backend, the kernel and its configuration, and the prepared
// device state (owned; released with the last copy of the plan). Copies share that state; runs of
// one plan that use the LSE scratch (received without lse) must be ordered on one stream.
class AttentionPlan {
 public:
  AttentionPlan() = default;
  bool valid() const { return state_ != nullptr; }
  Backend backend() const;
  CudaKernel cuda_kernel() const;  // automatic on the host backends
  int query_tile_rows() const;     // CUDA: 64 or 128 (16 on the band kernel: rows per warp); 0 on host backends
  int key_tile_rows() const;       // CUDA: 64 (128 on wgmma, 16 on band); 0 on host backends
  bool uses_tma() const;           // wgmma: q, k, v copied with TMA
  bool stores_by_tma() const;      // wgmma: O stored through TMA (consumers whose rows stay in their sequence)
  bool pingpong() const;           // wgmma: consumer ping-pong
  bool ordered_tiles() const;      // bandwg: block_col order copied by 5-D tensor maps
  std::string describe() const;    // one line: backend, kernel, tiles, knobs
  const detail::PlanState& state() const;

 private:
  friend AttentionPlan plan_attention(const AttentionParams&, const AttentionOptions&);
  std::shared_ptr<const detail::PlanState> state_;
};

// Validates p, checks that the backend supports it and that every forced override applies, and
// prepares the launch. Throws ariadne::Error naming the field when any of those fails. For device
// tensors it may query the device, encode tensor maps and allocate (the LSE scratch).
AttentionPlan plan_attention(const AttentionParams& p, const AttentionOptions& options = {});

// Runs a plan on p, whose shapes, strides, dtypes, devices, requested outputs, sink mode and pattern
// structure (window, chunk, sequence count, varlen or not, block mask and its block, token order or
// not) must be those it was planned for (pointers may differ); throws ariadne::Error naming the
// mismatch. Allocates nothing and, on the CUDA backend, only enqueues work on p.stream.
void run(const AttentionPlan& plan, const AttentionParams& p);

// Runs attention on the chosen backend: plan_attention(p, {backend}) then run. automatic: cuda for
// device tensors, cpu for host tensors. Throws ariadne::Error when the backend is not built or
// does not support the case.
void attention(const AttentionParams& p, Backend backend = Backend::automatic);

// Whether `backend` can run `p`; when not, `why` (if given) says which feature is missing.
bool backend_supports(Backend backend, const AttentionParams& p, std::string* why = nullptr);

// The CPU backend's worker count (defaults to the machine's hardware threads; ARIADNE_THREADS
// overrides). Results are deterministic for a given count.
int cpu_threads();
void set_cpu_threads(int n);

}  // namespace ariadne
