// The Llama forward pass on the GPU (src/llm/cuda/llama_cuda.hpp): bf16 weights uploaded once, an fp32
// residual stream that the output and down projections add into in their GEMM epilogue, bf16
// activations into the GEMMs (cuBLASLt, src/nn/cuda/nn_cuda.cuh) and into the attention, which
// LlamaModel runs between attention_inputs() and finish_layer().
#include "llm/cuda/llama_cuda.hpp"

#include <cuda_runtime.h>

#include <algorithm>

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
  Grow<float> att_f32;
  int64_t capacity = 0, n = 0, pos0 = 0;

  // Every layer's paged cache emptied, holding sequence 0 with no token.
  void restart_paged() {
    PagedKVCache empty(paged_cfg);
    empty.add_sequence();
    for (CudaKVCache& pc : paged) pc.sync(empty);
  }

  ~Impl() {
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
  bf16* upload_bf16(const std::vector<float>& a, const std::vector<float>* b = nullptr) {
    std::vector<uint16_t> v(a.size() + (b ? b->size() : 0));
    for (size_t i = 0; i < a.size(); ++i) v[i] = float_to_bf16(a[i]);
    if (b != nullptr)
      for (size_t i = 0; i < b->size(); ++i) v[a.size() + i] = float_to_bf16((*b)[i]);
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
    dl.attn_norm = d.upload_bf16(*L.attn_norm);
    dl.wq = d.upload_bf16(*L.wq);
    dl.wk = d.upload_bf16(*L.wk);
    dl.wv = d.upload_bf16(*L.wv);
    dl.wo = d.upload_bf16(*L.wo);
    dl.ffn_norm = d.upload_bf16(*L.ffn_norm);
    dl.gate_up = d.upload_bf16(*L.wg, L.wu);
    dl.wd = d.upload_bf16(*L.wd);
    d.layers.push_back(dl);
  }
  d.out_norm = d.upload_bf16(out_norm);
  d.out_w = d.upload_bf16(out_weight);
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

bool LlamaCuda::paged() const { return !impl_->paged.empty(); }

std::pair<int64_t, int64_t> LlamaCuda::attend_paged(int l, const PageSelectConfig& select, bool count) {
  Impl& d = *impl_;
  const LlamaConfig& c = d.c;
  ARIADNE_CHECK(!d.paged.empty() && d.n == 1, "llm (cuda): paged attention needs the paged cache (set_paged) and ",
                "a one-row block, got ", d.n, " rows");
  const int64_t Q = int64_t(c.heads) * c.head_dim;
  static const int32_t kSeq[1] = {0};
  DecodeParams dp;
  dp.q = device_view(d.q.ptr, 1, c.heads, c.head_dim);
  dp.out = make_view(d.att_f32.at_least(Q), DType::f32, {1, int64_t(c.heads), int64_t(c.head_dim)}, Device::cuda);
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
  cuda_nn::to_bf16(d.att_f32.ptr, d.att.ptr, Q, nullptr);
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

void LlamaCuda::finish_layer(int l) {
  Impl& d = *impl_;
  const LlamaConfig& c = d.c;
  const Impl::Layer& L = d.layers[size_t(l)];
  const int64_t n = d.n, D = c.dim, Q = int64_t(c.heads) * c.head_dim, F = c.ffn;
  const cudaStream_t st = nullptr;
  d.gemm.linear(d.att.ptr, n, Q, L.wo, static_cast<const float*>(nullptr), D, d.h.ptr, true, st);  // h += att·Woᵀ
  cuda_nn::rmsnorm(d.h.ptr, n, D, L.ffn_norm, c.eps, d.x.ptr, st);
  d.gemm.linear(d.x.ptr, n, D, L.gate_up, static_cast<const bf16*>(nullptr), 2 * F, d.gu.ptr, false, st);
  cuda_nn::swiglu(d.gu.ptr, n, F, d.act.ptr, F, st);
  d.gemm.linear(d.act.ptr, n, F, L.wd, static_cast<const float*>(nullptr), D, d.h.ptr, true, st);  // h += down
}

std::vector<float> LlamaCuda::logits() {
  Impl& d = *impl_;
  const LlamaConfig& c = d.c;
  cuda_nn::rmsnorm(d.h.ptr + (d.n - 1) * c.dim, 1, c.dim, d.out_norm, c.eps, d.x.ptr, nullptr);
  d.gemm.linear(d.x.ptr, 1, c.dim, d.out_w, static_cast<const float*>(nullptr), c.vocab, d.logits.at_least(c.vocab),
                false, nullptr);
  std::vector<float> out(size_t(c.vocab));
  check(cudaMemcpy(out.data(), d.logits.ptr, out.size() * sizeof(float), cudaMemcpyDeviceToHost), "logits download");
  return out;
}

std::vector<float> cuda_bf16_to_host(const void* device_ptr, int64_t count) {
  std::vector<uint16_t> raw(static_cast<size_t>(count));
  check(cudaMemcpy(raw.data(), device_ptr, raw.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost), "bf16 download");
  std::vector<float> out(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) out[i] = bf16_to_float(raw[i]);
  return out;
}

}  // namespace ariadne
