// The encoder's forward pass on the GPU (include/ariadne/vit.hpp): bf16 weights uploaded once,
// bf16 activations into every GEMM and the attention, an fp32 residual stream (the GEMM epilogues
// of proj and down add into it: HF's bf16 tower rounds it 64 times, which is most of its error
// against fp32; docs/encoder.md has the measurement), GEMMs through cuBLASLt (src/nn/cuda/nn_cuda.cuh),
// attention through the CUDA attention kernels with each layer's order, pattern and sink.
//
// Token orders. With EncodeOptions::cuda_fused_order (the default) the hidden states stay in the
// native order for the whole encoder: a window or chunk layer hands its order to the attention
// kernel as a fused row index (AttentionParams::order), and a full layer needs none (attention
// over a whole image does not depend on the order of its rows). Without it, the hidden states and
// their patch positions are gathered where the order changes, as on the CPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ariadne/error.hpp"
#include "attention/backends.hpp"
#include "nn/cuda/nn_cuda.cuh"
#include "vit/cuda/vit_cuda.hpp"

namespace ariadne {

using cuda_nn::bf16;
using cuda_nn::check;

struct VitDeviceWeights {
  struct Layer {
    bf16 *norm1 = nullptr, *norm2 = nullptr, *qkv_w = nullptr, *qkv_b = nullptr, *proj_w = nullptr;
    bf16 *gate_up_w = nullptr, *gate_up_b = nullptr;  // [2·intermediate, hidden]: gate rows, then up rows
    bf16* down_w = nullptr;  // [hidden, inter_padded]: zero columns past intermediate
    // Biases of the GEMMs that add into the fp32 residual stream: fp32 copies of the bf16 values.
    float *proj_b = nullptr, *down_b = nullptr;
    float* sinks = nullptr;  // [heads] f32
  };
  bf16* patch_embed = nullptr;
  std::vector<Layer> layers;
  bf16 *merger_norm = nullptr, *merger_w1 = nullptr, *merger_b1 = nullptr, *merger_w2 = nullptr,
       *merger_b2 = nullptr;
  float* inv_freq = nullptr;  // [head_dim / 4] RoPE frequencies, fp32 as HF computes them
  int64_t inter_padded = 0;   // intermediate rounded up to 64: 16-byte aligned rows for the down GEMM

  cudaStream_t stream = nullptr;
  std::unique_ptr<cuda_nn::Gemm> gemm;
  std::vector<cudaEvent_t> events;  // stage marks, reused by every encode
  std::mutex mutex;                 // one encode at a time on these buffers

  VitDeviceWeights() = default;
  VitDeviceWeights(const VitDeviceWeights&) = delete;
  VitDeviceWeights& operator=(const VitDeviceWeights&) = delete;
  ~VitDeviceWeights() {
    gemm.reset();
    for (cudaEvent_t e : events) cudaEventDestroy(e);
    for (auto& [name, buf] : scratch_) cudaFree(buf.first);
    for (void* p : owned_) cudaFree(p);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  template <typename T>
  T* upload(const std::vector<T>& host) {
    if (host.empty()) return nullptr;
    void* d = nullptr;
    check(cudaMalloc(&d, host.size() * sizeof(T)), "weight allocation");
    owned_.push_back(d);
    check(cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "weight upload");
    return static_cast<T*>(d);
  }
  bf16* upload_bf16(const std::vector<float>& host) {
    std::vector<uint16_t> b(host.size());
    for (size_t i = 0; i < host.size(); ++i) b[i] = float_to_bf16(host[i]);
    return reinterpret_cast<bf16*>(upload(b));
  }
  // fp32 copy of the bf16-rounded values: the weights are bf16 everywhere, whatever their storage.
  float* upload_bf16_values(const std::vector<float>& host) {
    std::vector<float> b(host.size());
    for (size_t i = 0; i < host.size(); ++i) b[i] = bf16_to_float(float_to_bf16(host[i]));
    return upload(b);
  }

  // A named scratch buffer of at least `bytes`, kept between encodes (grows, never shrinks).
  template <typename T>
  T* scratch(const std::string& name, int64_t count) {
    const size_t bytes = std::max<size_t>(size_t(count) * sizeof(T), 16);
    auto& [ptr, size] = scratch_[name];
    if (size < bytes) {
      check(cudaStreamSynchronize(stream), "scratch resize");
      cudaFree(ptr);
      ptr = nullptr;
      check(cudaMalloc(&ptr, bytes), ("scratch buffer " + name).c_str());
      size = bytes;
    }
    return static_cast<T*>(ptr);
  }

 private:
  std::vector<void*> owned_;
  std::map<std::string, std::pair<void*, size_t>> scratch_;
};

namespace {

VitDeviceWeights& device_weights(const VitWeights& w) {
  if (w.device) return *w.device;
  const VitConfig& c = w.config;
  auto d = std::make_shared<VitDeviceWeights>();
  check(cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking), "stream");
  d->gemm = std::make_unique<cuda_nn::Gemm>();
  d->patch_embed = d->upload_bf16(w.patch_embed);
  d->inter_padded = (c.intermediate + 63) / 64 * 64;
  for (const VitLayerWeights& L : w.layers) {
    VitDeviceWeights::Layer dl;
    dl.norm1 = d->upload_bf16(L.norm1);
    dl.norm2 = d->upload_bf16(L.norm2);
    dl.qkv_w = d->upload_bf16(L.qkv_w);
    dl.qkv_b = d->upload_bf16(L.qkv_b);
    dl.proj_w = d->upload_bf16(L.proj_w);
    dl.proj_b = d->upload_bf16_values(L.proj_b);
    std::vector<float> gu(L.gate_w);
    gu.insert(gu.end(), L.up_w.begin(), L.up_w.end());
    dl.gate_up_w = d->upload_bf16(gu);
    if (!L.gate_b.empty() || !L.up_b.empty()) {  // one missing half is zeros
      std::vector<float> b(size_t(2 * c.intermediate), 0.f);
      std::copy(L.gate_b.begin(), L.gate_b.end(), b.begin());
      std::copy(L.up_b.begin(), L.up_b.end(), b.begin() + c.intermediate);
      dl.gate_up_b = d->upload_bf16(b);
    }
    std::vector<float> down(size_t(c.hidden * d->inter_padded), 0.f);
    for (int64_t r = 0; r < c.hidden; ++r)
      std::copy_n(L.down_w.begin() + r * c.intermediate, c.intermediate, down.begin() + r * d->inter_padded);
    dl.down_w = d->upload_bf16(down);
    dl.down_b = d->upload_bf16_values(L.down_b);
    dl.sinks = d->upload(L.sinks);
    d->layers.push_back(dl);
  }
  d->merger_norm = d->upload_bf16(w.merger_norm);
  d->merger_w1 = d->upload_bf16(w.merger_w1);
  d->merger_b1 = d->upload_bf16(w.merger_b1);
  d->merger_w2 = d->upload_bf16(w.merger_w2);
  d->merger_b2 = d->upload_bf16(w.merger_b2);
  // HF: inv_freq = 1 / θ^(arange(0, d/2, 2) / (d/2)) in fp32, as vit_rope_tables.
  const int q4 = c.head_dim() / 4, half = c.head_dim() / 2;
  std::vector<float> inv(static_cast<size_t>(q4));
  for (int k = 0; k < q4; ++k) inv[size_t(k)] = 1.0f / std::pow(float(c.rope_theta), float(2 * k) / float(half));
  d->inv_freq = d->upload(inv);
  w.device = std::move(d);
  return *w.device;
}

// Stage marks: an event at each stage boundary, read back once at the end of the encode, so that
// timing adds no synchronization between stages.
class StageClock {
 public:
  StageClock(VitDeviceWeights& d, bool stages) : d_(d), stages_(stages) {}
  // Marks the end of the interval that `bin` is charged with (null: charged to nothing). Without
  // stage times only the `always` marks are recorded.
  void mark(double* bin, bool always = false) {
    if (!stages_ && !always) return;
    if (marks_.size() == d_.events.size()) {
      cudaEvent_t e;
      check(cudaEventCreate(&e), "event");
      d_.events.push_back(e);
    }
    check(cudaEventRecord(d_.events[marks_.size()], d_.stream), "event record");
    marks_.push_back(bin);
  }
  size_t last() const { return marks_.size() - 1; }
  // Waits for the stream and adds every interval to its bin; returns the time from mark `from` to
  // mark `to`.
  double finish(size_t from, size_t to) {
    check(cudaStreamSynchronize(d_.stream), "encode");
    for (size_t i = 1; i < marks_.size(); ++i) {
      float ms = 0;
      check(cudaEventElapsedTime(&ms, d_.events[i - 1], d_.events[i]), "event time");
      if (marks_[i] != nullptr) *marks_[i] += ms;
    }
    float span = 0;
    check(cudaEventElapsedTime(&span, d_.events[from], d_.events[to]), "event time");
    return double(span);
  }

 private:
  VitDeviceWeights& d_;
  bool stages_;
  std::vector<double*> marks_;
};

template <typename T>
T* upload_small(VitDeviceWeights& d, const std::string& name, const std::vector<T>& host) {
  T* p = d.scratch<T>(name, int64_t(host.size()));
  check(cudaMemcpyAsync(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, d.stream), name.c_str());
  return p;
}

TensorView device_heads(bf16* base, int64_t rows, int64_t heads, int64_t dim, int64_t row_stride) {
  TensorView t;
  t.data = base;
  t.dtype = DType::bf16;
  t.device = Device::cuda;
  t.rank = 3;
  t.shape = {rows, heads, dim, 0};
  t.stride = {row_stride, dim, 1, 0};
  return t;
}

}  // namespace

EncodeResult encode_cuda(const VitWeights& weights, const std::vector<float>& pixels, const std::vector<Grid>& grids,
                         const Schedule& schedule, const EncodeOptions& options, bool keep_hidden) {
  const VitConfig& c = weights.config;
  int64_t N = 0;
  for (const Grid& g : grids) N += g.tokens();
  const int64_t D = c.patch_dim(), H = c.hidden, I = c.intermediate, U = c.unit_dim(), O = c.out_hidden;
  const int hd = c.head_dim(), heads = c.heads, unit = c.merge * c.merge;
  ARIADNE_CHECK(N < (int64_t(1) << 31), "vit encode (cuda): ", N, " tokens exceed the int32 row index");

  VitDeviceWeights& d = device_weights(weights);
  std::lock_guard<std::mutex> lock(d.mutex);
  const cudaStream_t st = d.stream;

  EncodeResult res;
  res.tokens = N;
  res.units = N / unit;
  res.out_hidden = int(O);
  EncodeTimes& tm = res.times;

  // Orders, their device index (layer position → native row) and pattern arrays, built once.
  std::map<OrderKind, TokenOrder> orders;
  auto order_of = [&](OrderKind k) -> const TokenOrder& {
    auto it = orders.find(k);
    if (it == orders.end()) it = orders.emplace(k, make_order(k, grids, c.merge, c.window_units())).first;
    return it->second;
  };
  const TokenOrder& native = order_of(OrderKind::block_row);
  std::map<std::pair<OrderKind, OrderKind>, int32_t*> conversions;
  auto conversion = [&](OrderKind from, OrderKind to) {
    auto it = conversions.find({from, to});
    if (it != conversions.end()) return it->second;
    const std::string name = std::string("conv_") + order_name(from) + "_" + order_name(to);
    int32_t* p = upload_small(d, name, order_conversion(order_of(from), order_of(to)));
    return conversions[{from, to}] = p;
  };
  int32_t* cu_images = upload_small(d, "cu_images", native.cu_seqlens);
  std::map<OrderKind, int32_t*> cu_windows;
  for (const LayerSpec& l : schedule.layers)
    if (l.kind == LayerKind::chunk && !cu_windows.count(l.order))
      cu_windows[l.order] =
          upload_small(d, std::string("cu_windows_") + order_name(l.order), order_of(l.order).cu_windows);
  std::vector<int2> pos_host(static_cast<size_t>(N));
  for (int64_t t = 0; t < N; ++t)
    pos_host[size_t(t)] = int2{int(native.coords[size_t(2 * t)]), int(native.coords[size_t(2 * t + 1)])};
  int2* pos = upload_small(d, "pos", pos_host);

  // Attention on the host when the CUDA kernels do not take this head dim (tiny test configs):
  // then the tokens are gathered into each layer's order, the layout the host pattern describes.
  AttentionParams probe;
  probe.q = probe.k = probe.v = device_heads(nullptr, 1, heads, hd, 3 * H);
  probe.out = device_heads(nullptr, 1, heads, hd, H);
  const bool host_attention = !attention_cuda_supports(probe, nullptr);
  const bool fused = options.cuda_fused_order && !host_attention;
  res.attention_backend = host_attention ? "cuda+host" : "cuda";
  // Every row index the layers need, uploaded before the timed part: an upload from pageable memory
  // waits for the stream, which would stall the pipeline in the middle of the encoder.
  OrderKind walk = OrderKind::block_row;
  for (const LayerSpec& l : schedule.layers) {
    if (fused && l.kind != LayerKind::full && l.order != OrderKind::block_row)
      conversion(OrderKind::block_row, l.order);
    if (!fused && l.order != walk) conversion(walk, l.order);
    walk = l.order;
  }
  if (!fused && walk != OrderKind::block_row) conversion(walk, OrderKind::block_row);

  // The residual stream is fp32 (GEMM epilogues add into it); what the GEMMs read is bf16.
  const int64_t Ip = d.inter_padded;
  float* x = d.scratch<float>("x", N * H);
  bf16* h = d.scratch<bf16>("h", N * H);
  bf16* qkv = d.scratch<bf16>("qkv", N * 3 * H);
  bf16* att = d.scratch<bf16>("att", N * H);
  bf16* gu = d.scratch<bf16>("gate_up", N * 2 * I);
  bf16* act = d.scratch<bf16>("act", N * Ip);
  float* tmp = fused ? nullptr : d.scratch<float>("tmp", N * H);
  int2* pos_tmp = fused ? nullptr : d.scratch<int2>("pos_tmp", N);
  float* pix32 = d.scratch<float>("pixels_f32", N * D);
  bf16* pix = d.scratch<bf16>("pixels", N * D);
  bf16* y1 = d.scratch<bf16>("merger_y1", res.units * U);
  bf16* y2 = d.scratch<bf16>("merger_y2", res.units * O);
  float* out32 = d.scratch<float>("out_f32", res.units * O);
  check(cudaStreamSynchronize(st), "setup");

  StageClock clock(d, options.cuda_stage_times);
  clock.mark(nullptr, true);
  check(cudaMemcpyAsync(pix32, pixels.data(), size_t(N * D) * sizeof(float), cudaMemcpyHostToDevice, st),
        "pixel upload");
  clock.mark(&tm.upload, true);
  const size_t compute_start = clock.last();
  cuda_nn::Gemm& gemm = *d.gemm;
  cuda_nn::to_bf16(pix32, pix, N * D, st);
  gemm.linear(pix, N, D, d.patch_embed, static_cast<const float*>(nullptr), H, x, false, st);
  clock.mark(&tm.patch_embed);

  OrderKind cur = OrderKind::block_row;
  auto move_tokens = [&](OrderKind to) {
    const int32_t* index = conversion(cur, to);
    cuda_nn::gather_rows(x, tmp, index, N, H, st);
    std::swap(x, tmp);
    cuda_nn::gather_pos(pos, pos_tmp, index, N, st);
    std::swap(pos, pos_tmp);
    cur = to;
    ++res.order_changes;
    clock.mark(&tm.permute);
  };

  std::vector<uint16_t> host_qkv, host_att;
  for (int l = 0; l < c.depth; ++l) {
    const LayerSpec& spec = schedule.layers[size_t(l)];
    const VitDeviceWeights::Layer& L = d.layers[size_t(l)];
    if (!fused && spec.order != cur) move_tokens(spec.order);
    cuda_nn::rmsnorm(x, N, H, L.norm1, c.eps, h, st);
    clock.mark(&tm.norm);
    gemm.linear(h, N, H, L.qkv_w, L.qkv_b, 3 * H, qkv, false, st);
    clock.mark(&tm.qkv);
    cuda_nn::rope_2d(qkv, N, 3 * H, H, heads, hd, pos, d.inv_freq, st);
    clock.mark(&tm.rope);

    // The layer's pattern in its own order: image bounds, or Qwen windows for a chunk layer.
    const OrderKind lorder = fused ? spec.order : cur;
    AttentionParams p;
    p.q = device_heads(qkv, N, heads, hd, 3 * H);
    p.k = device_heads(qkv + H, N, heads, hd, 3 * H);
    p.v = device_heads(qkv + 2 * H, N, heads, hd, 3 * H);
    p.out = device_heads(att, N, heads, hd, H);
    p.pattern = layer_pattern(spec, order_of(lorder));
    p.pattern.cu_seqlens_q = spec.kind == LayerKind::chunk ? cu_windows.at(lorder) : cu_images;
    p.pattern.cu_seqlens_k = nullptr;
    if (spec.sink) {
      ARIADNE_CHECK(L.sinks != nullptr, "vit encode (cuda): layer ", l, " has a sink but no sink logits");
      p.sink_mode = options.sink_mode;
      p.sink = make_view(L.sinks, DType::f32, {int64_t(heads)}, Device::cuda);
    }
    p.stream = st;
    if (host_attention) {
      // Host attention on the bf16 values of this layer (the pattern's own host arrays).
      host_qkv.resize(size_t(N * 3 * H));
      host_att.resize(size_t(N * H));
      check(cudaMemcpyAsync(host_qkv.data(), qkv, host_qkv.size() * 2, cudaMemcpyDeviceToHost, st), "qkv download");
      check(cudaStreamSynchronize(st), "qkv download");
      AttentionParams hp = p;
      for (TensorView* t : {&hp.q, &hp.k, &hp.v, &hp.out}) t->device = Device::cpu;
      hp.q.data = host_qkv.data();
      hp.k.data = host_qkv.data() + H;
      hp.v.data = host_qkv.data() + 2 * H;
      hp.out.data = host_att.data();
      hp.pattern = layer_pattern(spec, order_of(lorder));
      if (spec.sink)
        hp.sink = make_view(const_cast<float*>(weights.layers[size_t(l)].sinks.data()), DType::f32, {int64_t(heads)});
      hp.stream = nullptr;
      attention(hp, backend_supports(Backend::cpu, hp) ? Backend::cpu : Backend::reference);
      check(cudaMemcpyAsync(att, host_att.data(), host_att.size() * 2, cudaMemcpyHostToDevice, st), "attention upload");
    } else {
      // Full layers need no order: attention over a whole image is the same in any row order.
      const bool ordered = fused && spec.kind != LayerKind::full && spec.order != OrderKind::block_row;
      p.order = ordered ? conversion(OrderKind::block_row, spec.order) : nullptr;
      const TokenOrder& col = order_of(spec.order);
      AttentionOptions options;
      options.backend = Backend::cuda;
      // A block_col order of one image: the window kernel may copy its tiles with the copy engine
      // (AttentionOptions::block_col).
      if (ordered && spec.order == OrderKind::block_col && col.images() == 1 && col.merge == 2)
        options.block_col = BlockColGrid{col.grids[0].h, col.grids[0].w};
      run(plan_attention(p, options), p);
    }
    clock.mark(&tm.attention);
    if (options.on_attention) {
      check(cudaStreamSynchronize(st), "attention observer");
      // The order the observer is given is the rows' own, gathered through p.order when one is set:
      // a fused full layer runs on the native block_row rows without one, whatever its spec's order.
      const OrderKind rows = fused && !p.order ? OrderKind::block_row : lorder;
      options.on_attention(l, p, order_of(rows));
    }
    gemm.linear(att, N, H, L.proj_w, L.proj_b, H, x, true, st);  // x += proj(att) + b
    clock.mark(&tm.proj);
    cuda_nn::rmsnorm(x, N, H, L.norm2, c.eps, h, st);
    clock.mark(&tm.norm);
    gemm.linear(h, N, H, L.gate_up_w, L.gate_up_b, 2 * I, gu, false, st);
    cuda_nn::swiglu(gu, N, I, act, Ip, st);
    gemm.linear(act, N, Ip, L.down_w, L.down_b, H, x, true, st);  // x += down(...) + b
    clock.mark(&tm.mlp);
  }

  // The merger needs whole merge units in a row: the native order.
  if (cur != OrderKind::block_row) move_tokens(OrderKind::block_row);
  cuda_nn::rmsnorm(x, N, H, d.merger_norm, c.eps, h, st);
  gemm.linear(h, res.units, U, d.merger_w1, d.merger_b1, U, y1, false, st);  // h viewed as [units, merge²·hidden]
  cuda_nn::gelu(y1, res.units * U, st);
  gemm.linear(y1, res.units, U, d.merger_w2, d.merger_b2, O, y2, false, st);
  clock.mark(options.cuda_stage_times ? &tm.merger : nullptr, true);
  const size_t compute_end = clock.last();

  res.out.resize(size_t(res.units * O));
  cuda_nn::to_f32(y2, out32, res.units * O, st);
  check(cudaMemcpyAsync(res.out.data(), out32, res.out.size() * sizeof(float), cudaMemcpyDeviceToHost, st),
        "output download");
  clock.mark(&tm.download, true);
  if (keep_hidden) {
    res.hidden.resize(size_t(N * H));
    check(cudaMemcpyAsync(res.hidden.data(), x, res.hidden.size() * sizeof(float), cudaMemcpyDeviceToHost, st),
          "hidden download");
    clock.mark(&tm.download, true);
  }
  // total: the GPU's time from the patch embed's start to the merger's end (the stages tile it).
  tm.total = clock.finish(compute_start, compute_end);
  return res;
}

}  // namespace ariadne
