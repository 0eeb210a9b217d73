// Internal: the Llama forward pass on the GPU (src/llm/cuda/llama_cuda.cu), driven layer by layer by
// LlamaModel (src/llm/llama.cpp), which runs the attention of each layer itself through
// ariadne::prefill / attention on the device tensors handed out here, so the CPU and GPU paths
// share one attention step (methods, probes, comparisons). Plain C++ (no CUDA headers).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "ariadne/attention.hpp"
#include "ariadne/decode.hpp"
#include "ariadne/llm.hpp"

namespace ariadne {

#if defined(ARIADNE_WITH_CUDA)
// One layer's host weights (f32, row-major [out, in] for matrices), as LlamaModel holds them.
struct LlamaHostLayer {
  const std::vector<float>*attn_norm, *wq, *wk, *wv, *wo, *ffn_norm, *wg, *wu, *wd;
};

// Device state: weights rounded to bf16 and uploaded once; an fp32 residual stream [rows, dim];
// bf16 activations into every GEMM (cuBLASLt) and the attention; a bf16 KV cache per layer
// [positions, kv_heads, head_dim] and a paged one (set_paged). Every kernel of a block runs on the
// legacy default stream, the stream the CUDA estimators use, so estimate and attention need no
// extra synchronization; decode_step's graph runs on a blocking stream of its own, which the
// legacy stream orders with that work.
class LlamaCuda {
 public:
  LlamaCuda(const LlamaConfig& config, const std::vector<float>& out_norm, const std::vector<float>& out_weight,
            const std::vector<LlamaHostLayer>& layers, const std::vector<float>& inv_freq);
  ~LlamaCuda();
  LlamaCuda(const LlamaCuda&) = delete;
  LlamaCuda& operator=(const LlamaCuda&) = delete;

  // Starts a block of n rows at positions pos0 … pos0+n−1 with embeddings h [n, dim] (host f32):
  // uploads them and makes room in the KV cache (rows before pos0 are kept).
  void begin(const float* h, int64_t n, int64_t pos0);
  // Layer l up to the attention: RMSNorm, q/k/v projections, RoPE, k/v written into the cache.
  // Returns the attention's params: q [n, heads, head_dim], k and v [pos0+n, kv_heads, head_dim]
  // (the cache), out [n, heads, head_dim], all bf16 device tensors; causal pattern, varlen with
  // device cu_seqlens (n queries against pos0+n keys) when pos0 > 0; legacy default stream.
  AttentionParams attention_inputs(int l);
  // The paged device cache that decode reads (decode_step, attend_paged): per layer a bf16
  // CudaKVCache of one sequence to which every block's keys and values are appended after RoPE
  // (attention_inputs). page_size 0 turns it off. A block at position 0 starts the caches again;
  // a later block continues them.
  void set_paged(int page_size, int summary_stride);
  // Layer l's attention for a one-row block from the paged cache: the pages `select` keeps (a
  // selection made on the device), written where finish_layer reads the attention. With `count`,
  // returns (pages kept, pages visible) over the KV heads (a host copy of the selection's counts);
  // else (0, 0).
  std::pair<int64_t, int64_t> attend_paged(int l, const PageSelectConfig& select, bool count);
  // Output projection into the residual, then the SwiGLU MLP.
  void finish_layer(int l);

  // One decode step as one CUDA graph replay: the embedding h [dim] (host f32) of the token at the
  // position after the cached rows goes in, every layer runs (norm, projections, RoPE at the
  // position the device cache holds, the append to both caches, then the page selection of
  // `select`, or every page when null, and decode attention over the paged cache, the output
  // projection and the MLP), and the last row's logits [vocab] come out, all on the device with
  // no host work between the kernels. The graph is captured again when what it was captured with
  // changes: a buffer that moved (a pool or a table that grew, a longer prefill), the selection's
  // settings, or the page count (the split of the decode kernel follows the context). `step` seeds
  // the rr rotation at a capture (the replays then advance it on the device, one per step). With
  // `pages` and `select`, the selection's (kept, visible) pages over layers and KV heads (a host
  // copy per layer). Needs the paged cache (set_paged).
  std::vector<float> decode_step(const float* h, const PageSelectConfig* select, int64_t step,
                                 std::pair<int64_t, int64_t>* pages = nullptr);
  // Graph captures so far (tests, reports).
  int64_t captures() const;
  // Logits [vocab] of the block's last row (waits for the GPU).
  std::vector<float> logits();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// f32 host copy of `count` bf16 values in device memory (waits for the legacy default stream).
std::vector<float> cuda_bf16_to_host(const void* device_ptr, int64_t count);
#endif

}  // namespace ariadne
