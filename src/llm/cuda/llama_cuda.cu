// The Llama forward pass on the GPU (src/llm/cuda/llama_cuda.hpp): bf16 weights uploaded once, an fp32
// residual stream that the output and down projections add into in their GEMM epilogue, bf16
// activations into the GEMMs (cuBLASLt, src/nn/cuda/nn_cuda.cuh) and into the attention, which
// LlamaModel runs between attention_inputs() and finish_layer().
#include "llm/cuda/llama_cuda.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "ariadne/error.hpp"
#include "nn/cuda/nn_cuda.cuh"

namespace ariadne {

using cuda_nn::bf16;
using cuda_nn::check;

namespace {

// A device array that grows (never shrinks) to the largest count asked of it.
template <typename T>
struct Grow {
  T* ptr = nullptr;
  int64_t count = 0;
  T* at_least(int64_t n) {
    if (n > count) {
      cudaFree(ptr);
      ptr = nullptr;
      check(cudaMalloc(&ptr, size_t(std::max<int64_t>(n, 1)) * sizeof(T)), "llama activation buffer");
      count = n;
    }
    return ptr;
  }
  ~Grow() { cudaFree(ptr); }
};

TensorView device_view(bf16* p, int64_t rows, int heads, int dim) {
  return make_view(p, DType::bf16, {rows, int64_t(heads), int64_t(dim)}, Device::cuda);
}

}  // namespace

struct LlamaCuda::Impl {
  struct Layer {
    // wq, wk, wv: one array [Q + 2·KV, dim], wk and wv pointing into it.
    bf16 *attn_norm = nullptr, *wq = nullptr, *wk = nullptr, *wv = nullptr, *wo = nullptr;
    bf16 *ffn_norm = nullptr, *gate_up = nullptr, *wd = nullptr;  // gate_up: [2·ffn, dim], gate rows first
  };
  LlamaConfig c;
  cuda_nn::Gemm gemm;
  std::vector<void*> owned;
  std::vector<Layer> layers;
  bf16 *out_norm = nullptr, *out_w = nullptr;
  float* inv_freq = nullptr;
  Grow<float> h, logits;
  Grow<bf16> x, q, att, gu, act;
  Grow<int32_t> cu;  // {0, n, 0, pos0 + n}: cu_seqlens_q, cu_seqlens_k of a block after the prompt
  std::vector<bf16*> kcache, vcache;
  // The paged cache of sparse decode (set_paged): one sequence (id 0) per layer.
  KVCacheConfig paged_cfg{};
  std::vector<CudaKVCache> paged;
  std::vector<CudaPageSelection> selections;
  Grow<int32_t> seq_ids;  // {0}, the sequence id in device memory
  int64_t capacity = 0, n = 0, pos0 = 0;

  // decode_step: its stream (a blocking stream, so ordered with the prefill's legacy-stream work),
  // the executable graph and the key of what it was captured with; pinned host rows for the
  // graph's copies in (the embedding) and out (the logits); the step's q, k and v row; the decode
  // kernel's split partials.
  cudaStream_t stream = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::vector<int64_t> exec_key;
  int64_t captures = 0, next_step = 0;  // next_step: the rotation step the next replay takes
  float *h_host = nullptr, *logits_host = nullptr;
  Grow<bf16> qkv;
  Grow<float> workspace;

  // Every layer's paged cache emptied, holding sequence 0 with no token.
  void restart_paged() {
    PagedKVCache empty(paged_cfg);
    empty.add_sequence();
    for (CudaKVCache& pc : paged) pc.sync(empty);
    exec_key.clear();
  }

  // Output projection into the residual, then the SwiGLU MLP, for the block's n rows.
  void output_and_mlp(int l, cudaStream_t st) {
    const Layer& L = layers[size_t(l)];
    const int64_t D = c.dim, Q = int64_t(c.heads) * c.head_dim, F = c.ffn;
    gemm.linear(att.ptr, n, Q, L.wo, static_cast<const float*>(nullptr), D, h.ptr, true, st);  // h += att·Woᵀ
    cuda_nn::rmsnorm(h.ptr, n, D, L.ffn_norm, c.eps, x.ptr, st);
    gemm.linear(x.ptr, n, D, L.gate_up, static_cast<const bf16*>(nullptr), 2 * F, gu.ptr, false, st);
    cuda_nn::swiglu(gu.ptr, n, F, act.ptr, F, st);
    gemm.linear(act.ptr, n, F, L.wd, static_cast<const float*>(nullptr), D, h.ptr, true, st);  // h += down
  }

  // What a captured step depends on beyond its kernels: every buffer it reads or writes, the caches'
  // widths and pool sizes, the selection's settings and the page count of the context it decodes.
  std::vector<int64_t> step_key(const PageSelectConfig* select, size_t workspace_bytes) const {
    std::vector<int64_t> k;
    const auto ptrs = [&](const auto*... p) { (k.push_back(int64_t(reinterpret_cast<intptr_t>(p))), ...); };
    ptrs(h.ptr, x.ptr, att.ptr, gu.ptr, act.ptr, logits.ptr, qkv.ptr, workspace.ptr, seq_ids.ptr);
    k.push_back(int64_t(workspace_bytes));
    for (size_t l = 0; l < paged.size(); ++l) {
      const CudaKVCache& pc = paged[l];
      ptrs(kcache[l], vcache[l], pc.k_pool(), pc.v_pool(), pc.key_sum(), pc.key_min(), pc.key_max(), pc.block_table(),
           pc.lengths());
      k.push_back(pc.max_pages());
    }
    const int P = paged_cfg.page_size;
    k.push_back((paged[0].length(0) + P) / P);  // pages once the step's token is appended
    k.push_back(select != nullptr);
    if (select != nullptr) {
      k.insert(k.end(), {int64_t(select->scorer), int64_t(select->sink_pages), int64_t(select->recent_pages),
                         int64_t(select->rotate)});
      int64_t tau_bits = 0;
      static_assert(sizeof tau_bits == sizeof select->tau);
      std::memcpy(&tau_bits, &select->tau, sizeof tau_bits);
      k.push_back(tau_bits);
    }
    return k;
  }

  // The last row's logits into the `logits` buffer.
  void last_logits(cudaStream_t st) {
    cuda_nn::rmsnorm(h.ptr + (n - 1) * c.dim, 1, c.dim, out_norm, c.eps, x.ptr, st);
    gemm.linear(x.ptr, 1, c.dim, out_w, static_cast<const float*>(nullptr), c.vocab, logits.at_least(c.vocab), false,
                st);
  }

  ~Impl() {
    if (exec) cudaGraphExecDestroy(exec);
    if (stream) cudaStreamDestroy(stream);
    cudaFreeHost(h_host);
    cudaFreeHost(logits_host);
    for (bf16* p : kcache) cudaFree(p);
    for (bf16* p : vcache) cudaFree(p);
    for (void* p : owned) cudaFree(p);
  }

  template <typename T>
  T* upload(const T* host, size_t count) {
    void* d = nullptr;
    check(cudaMalloc(&d, std::max<size_t>(count, 1) * sizeof(T)), "llama weight allocation");
    owned.push_back(d);
    check(cudaMemcpy(d, host, count * sizeof(T), cudaMemcpyHostToDevice), "llama weight upload");
    return static_cast<T*>(d);
  }
  // The arrays one after another (stacked weight matrices), rounded to bf16.
  bf16* upload_bf16(std::initializer_list<const std::vector<float>*> parts) {
    std::vector<uint16_t> v;
    for (const std::vector<float>* a : parts)
      for (const float x : *a) v.push_back(float_to_bf16(x));
    return reinterpret_cast<bf16*>(upload(v.data(), v.size()));
  }

  // Room for `rows` positions in every layer's cache, keeping the first `keep` rows.
  void reserve(int64_t rows, int64_t keep) {
    if (rows <= capacity) return;
    const int64_t cap = std::max(rows + 64, capacity * 2);  // decode steps append one row each
    const size_t row_bytes = size_t(c.kv_heads) * size_t(c.head_dim) * sizeof(bf16);
    for (std::vector<bf16*>* cache : {&kcache, &vcache})
      for (bf16*& p : *cache) {
        bf16* np = nullptr;
        check(cudaMalloc(&np, size_t(cap) * row_bytes), "llama KV cache");
        if (keep > 0) check(cudaMemcpy(np, p, size_t(keep) * row_bytes, cudaMemcpyDeviceToDevice), "KV cache copy");
        cudaFree(p);
        p = np;
      }
    capacity = cap;
  }
};

LlamaCuda::LlamaCuda(const LlamaConfig& config, const std::vector<float>& out_norm,
                     const std::vector<float>& out_weight, const std::vector<LlamaHostLayer>& layers,
                     const std::vector<float>& inv_freq)
    : impl_(std::make_unique<Impl>()) {
  Impl& d = *impl_;
  d.c = config;
  for (const LlamaHostLayer& L : layers) {
    Impl::Layer dl;
    dl.attn_norm = d.upload_bf16({L.attn_norm});
    dl.wq = d.upload_bf16({L.wq, L.wk, L.wv});  // stacked: one GEMM gives a decode step's q, k and v
    dl.wk = dl.wq + L.wq->size();
    dl.wv = dl.wk + L.wk->size();
    dl.wo = d.upload_bf16({L.wo});
    dl.ffn_norm = d.upload_bf16({L.ffn_norm});
    dl.gate_up = d.upload_bf16({L.wg, L.wu});
    dl.wd = d.upload_bf16({L.wd});
    d.layers.push_back(dl);
  }
  d.out_norm = d.upload_bf16({&out_norm});
  d.out_w = d.upload_bf16({&out_weight});
  d.inv_freq = d.upload(inv_freq.data(), inv_freq.size());
  d.kcache.assign(layers.size(), nullptr);
  d.vcache.assign(layers.size(), nullptr);
}

LlamaCuda::~LlamaCuda() = default;

void LlamaCuda::begin(const float* h, int64_t n, int64_t pos0) {
  Impl& d = *impl_;
  ARIADNE_CHECK(n > 0 && pos0 >= 0 && pos0 + n < (int64_t(1) << 31), "llm (cuda): block of ", n,
                " rows at position ", pos0, " is out of range");
  ARIADNE_CHECK(pos0 <= d.pos0 + d.n, "llm (cuda): block at position ", pos0, " skips cached rows (", d.pos0 + d.n,
                " cached)");
  d.reserve(pos0 + n, pos0);
  d.n = n;
  d.pos0 = pos0;
  const int64_t D = d.c.dim, Q = int64_t(d.c.heads) * d.c.head_dim;
  check(cudaMemcpy(d.h.at_least(n * D), h, size_t(n * D) * sizeof(float), cudaMemcpyHostToDevice), "embedding upload");
  d.x.at_least(n * D);
  d.q.at_least(n * Q);
  d.att.at_least(n * Q);
  d.gu.at_least(n * 2 * d.c.ffn);
  d.act.at_least(n * d.c.ffn);
  const int32_t cu[4] = {0, int32_t(n), 0, int32_t(pos0 + n)};
  check(cudaMemcpy(d.cu.at_least(4), cu, sizeof cu, cudaMemcpyHostToDevice), "cu_seqlens upload");
  if (!d.paged.empty()) {
    if (pos0 == 0) d.restart_paged();
    ARIADNE_CHECK(d.paged[0].length(0) == pos0, "llm (cuda): a block at position ", pos0,
                  " does not continue the paged cache of ", d.paged[0].length(0), " tokens");
  }
}

void LlamaCuda::set_paged(int page_size, int summary_stride) {
  Impl& d = *impl_;
  d.paged.clear();
  d.selections.clear();
  if (page_size <= 0) return;
  d.paged_cfg = KVCacheConfig{page_size, d.c.kv_heads, d.c.head_dim, DType::bf16, summary_stride};
  d.paged.resize(size_t(d.c.layers));
  d.restart_paged();
  d.selections.resize(size_t(d.c.layers));
  const int32_t zero = 0;
  check(cudaMemcpy(d.seq_ids.at_least(1), &zero, sizeof zero, cudaMemcpyHostToDevice), "sequence id upload");
}

std::pair<int64_t, int64_t> LlamaCuda::attend_paged(int l, const PageSelectConfig& select, bool count) {
  Impl& d = *impl_;
  const LlamaConfig& c = d.c;
  ARIADNE_CHECK(!d.paged.empty() && d.n == 1, "llm (cuda): paged attention needs the paged cache (set_paged) and ",
                "a one-row block, got ", d.n, " rows");
  const int64_t Q = int64_t(c.heads) * c.head_dim;
  static const int32_t kSeq[1] = {0};
  DecodeParams dp;
  dp.q = device_view(d.q.ptr, 1, c.heads, c.head_dim);
  dp.out = device_view(d.att.at_least(Q), 1, c.heads, c.head_dim);  // bf16, rounded by the decode kernels
  dp.device_cache = &d.paged[size_t(l)];
  dp.seqs = kSeq;
  dp.device_seqs = d.seq_ids.ptr;
  CudaPageSelection& sel = d.selections[size_t(l)];
  select_pages(dp, select, sel);
  dp.device_selection = &sel;
  std::pair<int64_t, int64_t> pages{0, 0};
  if (count) {
    const PageSelection h = sel.to_host();
    pages = {h.kept(), h.visible_total()};
  }
  decode_attention(dp, Backend::cuda);
  return pages;
}

AttentionParams LlamaCuda::attention_inputs(int l) {
  Impl& d = *impl_;
  const LlamaConfig& c = d.c;
  const Impl::Layer& L = d.layers[size_t(l)];
  const int64_t n = d.n, D = c.dim, Q = int64_t(c.heads) * c.head_dim, KV = int64_t(c.kv_heads) * c.head_dim;
  const cudaStream_t st = nullptr;
  bf16* k = d.kcache[size_t(l)] + d.pos0 * KV;
  bf16* v = d.vcache[size_t(l)] + d.pos0 * KV;
  cuda_nn::rmsnorm(d.h.ptr, n, D, L.attn_norm, c.eps, d.x.ptr, st);
  d.gemm.linear(d.x.ptr, n, D, L.wq, static_cast<const bf16*>(nullptr), Q, d.q.ptr, false, st);
  d.gemm.linear(d.x.ptr, n, D, L.wk, static_cast<const bf16*>(nullptr), KV, k, false, st);
  d.gemm.linear(d.x.ptr, n, D, L.wv, static_cast<const bf16*>(nullptr), KV, v, false, st);
  const int pairs = c.rope_dims / 2;
  cuda_nn::rope_pairs(d.q.ptr, n, Q, c.heads, c.head_dim, pairs, d.inv_freq, d.pos0, st);
  cuda_nn::rope_pairs(k, n, KV, c.kv_heads, c.head_dim, pairs, d.inv_freq, d.pos0, st);
  if (!d.paged.empty())
    d.paged[size_t(l)].append_rows(0, device_view(k, n, c.kv_heads, c.head_dim),
                                   device_view(v, n, c.kv_heads, c.head_dim), st);

  const int64_t total = d.pos0 + n;
  AttentionParams p;
  p.q = device_view(d.q.ptr, n, c.heads, c.head_dim);
  p.k = device_view(d.kcache[size_t(l)], total, c.kv_heads, c.head_dim);
  p.v = device_view(d.vcache[size_t(l)], total, c.kv_heads, c.head_dim);
  p.out = device_view(d.att.ptr, n, c.heads, c.head_dim);
  p.pattern = d.pos0 == 0 ? Pattern::causal() : Pattern::causal().with_varlen(1, d.cu.ptr, d.cu.ptr + 2);
  p.stream = nullptr;
  return p;
}

void LlamaCuda::finish_layer(int l) { impl_->output_and_mlp(l, nullptr); }

std::vector<float> LlamaCuda::logits() {
  Impl& d = *impl_;
  const LlamaConfig& c = d.c;
  d.last_logits(nullptr);
  std::vector<float> out(size_t(c.vocab));
  check(cudaMemcpy(out.data(), d.logits.ptr, out.size() * sizeof(float), cudaMemcpyDeviceToHost), "logits download");
  return out;
}

std::vector<float> LlamaCuda::decode_step(const float* h, const PageSelectConfig* select, int64_t step,
                                          std::pair<int64_t, int64_t>* pages) {
  Impl& d = *impl_;
  const LlamaConfig& c = d.c;
  ARIADNE_CHECK(!d.paged.empty(), "llm (cuda): a graph decode step needs the paged cache (set_paged)");
  const int64_t pos = d.paged[0].length(0);
  ARIADNE_CHECK(pos > 0 && pos == d.pos0 + d.n, "llm (cuda): a decode step continues the cached rows; the paged ",
                "cache holds ", pos, " tokens, the model ", d.pos0 + d.n);
  ARIADNE_CHECK(pos + 1 < (int64_t(1) << 31), "llm (cuda): position ", pos, " is out of range");
  const int64_t D = c.dim, Q = int64_t(c.heads) * c.head_dim, KV = int64_t(c.kv_heads) * c.head_dim, F = c.ffn;
  const int group = c.heads / c.kv_heads;
  static const int32_t kSeq[1] = {0};

  // Room for the step before anything is captured: nothing below allocates while the stream captures.
  d.reserve(pos + 1, pos);
  if (pos % d.paged_cfg.page_size == 0)
    for (CudaKVCache& pc : d.paged) pc.reserve(kSeq, 1);
  d.n = 1;
  d.pos0 = pos;
  d.h.at_least(D);
  d.x.at_least(D);
  d.att.at_least(Q);
  d.gu.at_least(2 * F);
  d.act.at_least(F);
  d.logits.at_least(c.vocab);
  d.qkv.at_least(Q + 2 * KV);
  if (d.stream == nullptr) check(cudaStreamCreate(&d.stream), "decode step stream");
  if (d.h_host == nullptr) {
    check(cudaMallocHost(&d.h_host, size_t(D) * sizeof(float)), "pinned embedding row");
    check(cudaMallocHost(&d.logits_host, size_t(c.vocab) * sizeof(float)), "pinned logits");
  }
  const cudaStream_t st = d.stream;
  const auto params = [&](int l) {
    DecodeParams dp;
    dp.q = device_view(d.qkv.ptr, 1, c.heads, c.head_dim);
    dp.out = device_view(d.att.ptr, 1, c.heads, c.head_dim);  // bf16, rounded by the decode kernels
    dp.device_cache = &d.paged[size_t(l)];
    dp.seqs = kSeq;
    dp.device_seqs = d.seq_ids.ptr;
    dp.stream = st;
    return dp;
  };
  const size_t ws = decode_workspace_bytes(params(0), 1);  // every layer's cache has the same lengths
  d.workspace.at_least(int64_t(ws / sizeof(float)) + 1);
  if (select != nullptr)
    for (size_t l = 0; l < d.paged.size(); ++l) d.selections[l].reserve(c.kv_heads, d.paged[l].max_pages(), group);

  std::vector<int64_t> key = d.step_key(select, ws);
  const bool capture = key != d.exec_key;
  // The rotation counter the replays advance: set at a capture, or when the steps did not come one
  // after another.
  if (select != nullptr && (capture || step != d.next_step))
    for (CudaPageSelection& sel : d.selections) sel.reset_step(step);
  d.next_step = step + 1;
  if (capture) {
    const auto record = [&] {
      check(cudaMemcpyAsync(d.h.ptr, d.h_host, size_t(D) * sizeof(float), cudaMemcpyHostToDevice, st), "embedding");
      const int pairs = c.rope_dims / 2;
      for (int l = 0; l < c.layers; ++l) {
        const Impl::Layer& L = d.layers[size_t(l)];
        CudaKVCache& pc = d.paged[size_t(l)];
        const int32_t* at = pc.lengths();  // sequence 0's length: the new row's position
        // One GEMM for q, k and v ([Q | KV | KV] in qkv); one launch for RoPE and the contiguous rows.
        cuda_nn::rmsnorm(d.h.ptr, 1, D, L.attn_norm, c.eps, d.x.ptr, st);
        d.gemm.linear(d.x.ptr, 1, D, L.wq, static_cast<const bf16*>(nullptr), Q + 2 * KV, d.qkv.ptr, false, st);
        cuda_nn::rope_store_row(d.qkv.ptr, c.heads, c.kv_heads, c.head_dim, pairs, d.inv_freq, at,
                                d.kcache[size_t(l)], d.vcache[size_t(l)], st);
        bf16 *q = d.qkv.ptr, *k = q + Q, *v = k + KV;
        pc.append(device_view(k, 1, c.kv_heads, c.head_dim), device_view(v, 1, c.kv_heads, c.head_dim), kSeq,
                  d.seq_ids.ptr, st);
        DecodeParams dp = params(l);
        dp.workspace = d.workspace.ptr;
        dp.workspace_bytes = size_t(d.workspace.count) * sizeof(float);
        if (select != nullptr) {
          PageSelectConfig sc = *select;
          sc.step = 0;
          sc.advance_step = true;
          select_pages(dp, sc, d.selections[size_t(l)]);
          dp.device_selection = &d.selections[size_t(l)];
        }
        decode_attention(dp, Backend::cuda);
        d.output_and_mlp(l, st);
      }
      d.last_logits(st);
      check(cudaMemcpyAsync(d.logits_host, d.logits.ptr, size_t(c.vocab) * sizeof(float), cudaMemcpyDeviceToHost, st),
            "logits");
    };
    d.exec_key.clear();
    if (d.exec != nullptr) check(cudaGraphExecDestroy(d.exec), "graph");
    d.exec = nullptr;
    // A failed capture ran nothing: the device lengths are as before, the host mirrors (which the
    // captured appends advanced) read them back.
    const auto unwind = [&] {
      for (CudaKVCache& pc : d.paged) pc.refresh_lengths();
    };
    cudaGraph_t g = nullptr;
    check(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), "decode step capture");
    try {
      record();
    } catch (...) {
      cudaStreamEndCapture(st, &g);
      if (g != nullptr) cudaGraphDestroy(g);
      unwind();
      throw;
    }
    check(cudaStreamEndCapture(st, &g), "decode step capture");
    const cudaError_t e = cudaGraphInstantiate(&d.exec, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) {
      d.exec = nullptr;
      unwind();
      check(e, "decode step graph");
    }
    d.exec_key = std::move(key);
    ++d.captures;
  } else {
    for (CudaKVCache& pc : d.paged) pc.appended(kSeq);  // the capture advanced them; a replay does not
  }
  std::copy_n(h, D, d.h_host);
  check(cudaGraphLaunch(d.exec, st), "decode step launch");
  check(cudaStreamSynchronize(st), "decode step");
  if (pages != nullptr && select != nullptr) {
    *pages = {0, 0};
    for (const CudaPageSelection& sel : d.selections) {
      const PageSelection s = sel.to_host();
      pages->first += s.kept();
      pages->second += s.visible_total();
    }
  }
  return std::vector<float>(d.logits_host, d.logits_host + c.vocab);
}

int64_t LlamaCuda::captures() const { return impl_->captures; }

std::vector<float> cuda_bf16_to_host(const void* device_ptr, int64_t count) {
  std::vector<uint16_t> raw(static_cast<size_t>(count));
  check(cudaMemcpy(raw.data(), device_ptr, raw.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost), "bf16 download");
  std::vector<float> out(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) out[i] = bf16_to_float(raw[i]);
  return out;
}

}  // namespace ariadne
