// The encoder's forward pass on the CPU: GEMMs through OpenBLAS, attention through
// ariadne::attention() with each layer's order, pattern and sink from the schedule.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <numbers>

#include "ariadne/error.hpp"
#include "ariadne/vit.hpp"
#include "vit/cuda/vit_cuda.hpp"
#include "nn/cpu/dense.hpp"

namespace ariadne {

namespace {

using Clock = std::chrono::steady_clock;

// Element-wise loops below this many values run on one thread: on small inputs the fork/join of a
// parallel region costs more than the loop, much more on a busy machine.
constexpr int64_t kParallelMin = int64_t(1) << 16;

// Adds the elapsed milliseconds of its scope to `acc`.
class Timer {
 public:
  explicit Timer(double& acc) : acc_(acc), t0_(Clock::now()) {}
  ~Timer() { acc_ += std::chrono::duration<double, std::milli>(Clock::now() - t0_).count(); }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

 private:
  double& acc_;
  Clock::time_point t0_;
};

using nn::linear;
using nn::rmsnorm;

TensorView strided(float* base, int64_t rows, int64_t heads, int64_t dim, int64_t row_stride) {
  TensorView t;
  t.data = base;
  t.dtype = DType::f32;
  t.rank = 3;
  t.shape = {rows, heads, dim, 0};
  t.stride = {row_stride, dim, 1, 0};
  return t;
}

// Whether the merge units of `from` are contiguous and in the same inner order as native: then the
// merger can run in `from` and only its (smaller) output needs a gather. conv: native ← from index.
bool units_contiguous(const std::vector<int32_t>& conv, int unit) {
  for (size_t u = 0; u < conv.size(); u += size_t(unit)) {
    if (conv[u] % unit != 0) return false;
    for (int j = 1; j < unit; ++j)
      if (conv[u + size_t(j)] != conv[u] + j) return false;
  }
  return true;
}

}  // namespace

void vit_rope_tables(const std::vector<Grid>& grids, int merge, int head_dim, double theta, std::vector<float>& cos,
                     std::vector<float>& sin) {
  ARIADNE_CHECK(head_dim % 4 == 0 && head_dim > 0, "vit rope: head_dim ", head_dim, " must be a positive multiple of 4");
  const int q = head_dim / 4, half = head_dim / 2;
  // HF: inv_freq = 1 / θ^(arange(0, d/2, 2) / (d/2)) evaluated in fp32.
  std::vector<float> inv(static_cast<size_t>(q));
  for (int k = 0; k < q; ++k) inv[size_t(k)] = 1.0f / std::pow(float(theta), float(2 * k) / float(half));
  int64_t total = 0;
  for (const Grid& g : grids) total += g.tokens();
  cos.assign(size_t(total) * size_t(head_dim), 0.f);
  sin.assign(size_t(total) * size_t(head_dim), 0.f);
  int64_t t = 0;
  for (const Grid& g : grids) {
    ARIADNE_CHECK(g.h > 0 && g.w > 0 && g.h % merge == 0 && g.w % merge == 0, "vit rope: grid ", g.h, "x", g.w,
                  " must have positive sides divisible by merge ", merge);
    for (int uy = 0; uy < g.h / merge; ++uy)
      for (int ux = 0; ux < g.w / merge; ++ux)
        for (int my = 0; my < merge; ++my)
          for (int mx = 0; mx < merge; ++mx, ++t) {
            const float pos[2] = {float(uy * merge + my), float(ux * merge + mx)};
            float* c = &cos[size_t(t) * size_t(head_dim)];
            float* s = &sin[size_t(t) * size_t(head_dim)];
            for (int a = 0; a < 2; ++a)
              for (int k = 0; k < q; ++k) {
                const float ang = pos[a] * inv[size_t(k)];  // fp32 product, as HF
                const float cv = float(std::cos(double(ang))), sv = float(std::sin(double(ang)));
                c[a * q + k] = c[half + a * q + k] = cv;
                s[a * q + k] = s[half + a * q + k] = sv;
              }
          }
  }
}

void apply_rope(float* x, int64_t rows, int64_t row_stride, int heads, int head_dim, const float* cos,
                const float* sin) {
  const int half = head_dim / 2;
#pragma omp parallel for schedule(static) if (rows * heads * head_dim >= kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const float* c = cos + r * head_dim;
    const float* s = sin + r * head_dim;
    for (int h = 0; h < heads; ++h) {
      float* v = x + r * row_stride + int64_t(h) * head_dim;
      for (int i = 0; i < half; ++i) {
        const float x1 = v[i], x2 = v[i + half];
        v[i] = x1 * c[i] - x2 * s[i];
        v[i + half] = x2 * c[i + half] + x1 * s[i + half];
      }
    }
  }
}

std::vector<LayerPlan> vit_layer_plan(const VitConfig& config, const std::vector<Grid>& grids, const Schedule& schedule) {
  std::map<OrderKind, TokenOrder> orders;
  std::vector<LayerPlan> plan;
  for (const LayerSpec& l : schedule.layers) {
    auto it = orders.find(l.order);
    if (it == orders.end()) it = orders.emplace(l.order, make_order(l.order, grids, config.merge, config.window_units())).first;
    const Pattern p = layer_pattern(l, it->second);
    LayerPlan lp{l.order, l.kind, l.window, l.sink, {}};
    lp.cu.assign(p.cu_seqlens_q, p.cu_seqlens_q + p.num_seqs + 1);
    plan.push_back(std::move(lp));
  }
  return plan;
}

EncodeResult encode(const VitWeights& weights, const std::vector<float>& pixels, const std::vector<Grid>& grids,
                    const Schedule& schedule, const EncodeOptions& options, bool keep_hidden) {
  const VitConfig& c = weights.config;
  c.validate();
#if !defined(ARIADNE_WITH_CUDA)
  ARIADNE_CHECK(options.attention != Backend::cuda, "vit encode: this build has no CUDA backend (configure with "
                                                    "ARIADNE_CUDA=ON); use --backend cpu or reference");
#endif
  ARIADNE_CHECK(int(schedule.layers.size()) == c.depth, "vit encode: schedule '", schedule.name, "' has ",
                schedule.layers.size(), " layers, the encoder ", c.depth, " (use vit_schedule)");
  ARIADNE_CHECK(int(weights.layers.size()) == c.depth, "vit encode: weights have ", weights.layers.size(),
                " layers, config says ", c.depth);
  ARIADNE_CHECK(!grids.empty(), "vit encode: no image in the batch");
  int64_t N = 0;
  for (const Grid& g : grids) {
    ARIADNE_CHECK(g.h > 0 && g.w > 0 && g.h % c.merge == 0 && g.w % c.merge == 0, "vit encode: grid ", g.h, "x", g.w,
                  " must have positive sides divisible by merge ", c.merge);
    N += g.tokens();
  }
  const int64_t D = c.patch_dim(), H = c.hidden, I = c.intermediate, U = c.unit_dim(), O = c.out_hidden;
  const int hd = c.head_dim(), unit = c.merge * c.merge;
  ARIADNE_CHECK(int64_t(pixels.size()) == N * D, "vit encode: pixels hold ", pixels.size(), " values, expected tokens ",
                N, " × patch_dim ", D, " = ", N * D);
#if defined(ARIADNE_WITH_CUDA)
  if (options.attention == Backend::cuda) return encode_cuda(weights, pixels, grids, schedule, options, keep_hidden);
#endif

  EncodeResult res;
  res.tokens = N;
  res.units = N / unit;
  res.out_hidden = int(O);
  EncodeTimes& tm = res.times;
  const auto t_start = Clock::now();

  std::vector<float> x(size_t(N * H)), h(size_t(N * H)), qkv(size_t(N * 3 * H)), att(size_t(N * H)),
      g(size_t(N * I)), up(size_t(N * I)), tmp;
  {
    Timer t(tm.patch_embed);
    linear(pixels.data(), N, D, weights.patch_embed, {}, H, x.data(), false);
  }
  std::vector<float> cos, sin, cos2, sin2;
  {
    Timer t(tm.rope);
    vit_rope_tables(grids, c.merge, hd, c.rope_theta, cos, sin);
  }

  // Orders are built once per kind the schedule uses; tokens start in the native order.
  std::map<OrderKind, TokenOrder> orders;
  auto order_of = [&](OrderKind k) -> const TokenOrder& {
    auto it = orders.find(k);
    if (it == orders.end()) it = orders.emplace(k, make_order(k, grids, c.merge, c.window_units())).first;
    return it->second;
  };
  OrderKind cur = OrderKind::block_row;
  auto move_tokens = [&](OrderKind to) {
    Timer t(tm.permute);
    const TokenOrder& from = order_of(cur);
    const TokenOrder& dst = order_of(to);
    tmp.resize(x.size());
    permute_tokens(make_view(x.data(), DType::f32, {N, H}), make_view(tmp.data(), DType::f32, {N, H}), from, dst);
    x.swap(tmp);
    cos2.resize(cos.size());
    sin2.resize(sin.size());
    permute_rope(make_view(cos.data(), DType::f32, {N, hd}), make_view(sin.data(), DType::f32, {N, hd}),
                 make_view(cos2.data(), DType::f32, {N, hd}), make_view(sin2.data(), DType::f32, {N, hd}), from, dst);
    cos.swap(cos2);
    sin.swap(sin2);
    cur = to;
    ++res.order_changes;
  };

  bool used_cpu = false, used_ref = false;
  for (int l = 0; l < c.depth; ++l) {
    const LayerSpec& spec = schedule.layers[size_t(l)];
    const VitLayerWeights& L = weights.layers[size_t(l)];
    if (spec.order != cur) move_tokens(spec.order);
    {
      Timer t(tm.norm);
      rmsnorm(x.data(), N, H, L.norm1, c.eps, h.data());
    }
    {
      Timer t(tm.qkv);
      linear(h.data(), N, H, L.qkv_w, L.qkv_b, 3 * H, qkv.data(), false);
    }
    {
      Timer t(tm.rope);
      apply_rope(qkv.data(), N, 3 * H, c.heads, hd, cos.data(), sin.data());      // q
      apply_rope(qkv.data() + H, N, 3 * H, c.heads, hd, cos.data(), sin.data());  // k
    }
    AttentionParams p;
    {
      Timer t(tm.attention);
      p.q = strided(qkv.data(), N, c.heads, hd, 3 * H);
      p.k = strided(qkv.data() + H, N, c.heads, hd, 3 * H);
      p.v = strided(qkv.data() + 2 * H, N, c.heads, hd, 3 * H);
      p.out = make_view(att.data(), DType::f32, {N, int64_t(c.heads), int64_t(hd)});
      p.pattern = layer_pattern(spec, order_of(cur));
      if (spec.sink) {
        p.sink_mode = options.sink_mode;
        p.sink = make_view(const_cast<float*>(L.sinks.data()), DType::f32, {int64_t(c.heads)});
      }
      Backend b = options.attention;
      if (b == Backend::cpu && !backend_supports(Backend::cpu, p)) b = Backend::reference;
      (b == Backend::reference ? used_ref : used_cpu) = true;
      attention(p, b);
    }
    if (options.on_attention) options.on_attention(l, p, order_of(cur));
    {
      Timer t(tm.proj);
      linear(att.data(), N, H, L.proj_w, L.proj_b, H, x.data(), true);
    }
    {
      Timer t(tm.norm);
      rmsnorm(x.data(), N, H, L.norm2, c.eps, h.data());
    }
    {
      Timer t(tm.mlp);
      linear(h.data(), N, H, L.gate_w, L.gate_b, I, g.data(), false);
      linear(h.data(), N, H, L.up_w, L.up_b, I, up.data(), false);
#pragma omp parallel for schedule(static) if (N * I >= kParallelMin)
      for (int64_t i = 0; i < N * I; ++i) {
        const float v = g[size_t(i)];
        g[size_t(i)] = v / (1.0f + std::exp(-v)) * up[size_t(i)];  // SiLU(gate) · up
      }
      linear(g.data(), N, I, L.down_w, L.down_b, H, x.data(), true);
    }
  }
  res.attention_backend = used_cpu && used_ref ? "cpu+reference" : used_ref ? "reference" : "cpu";

  // Merger, in the current order when its units are whole; the output rows then move once.
  const TokenOrder& native = order_of(OrderKind::block_row);
  std::vector<int32_t> conv = order_conversion(order_of(cur), native);
  if (!units_contiguous(conv, unit)) {
    move_tokens(OrderKind::block_row);
    conv = order_conversion(native, native);
  }
  {
    Timer t(tm.merger);
    rmsnorm(x.data(), N, H, weights.merger_norm, c.eps, h.data());
    std::vector<float> y1(size_t(res.units * U)), y2(size_t(res.units * O));
    linear(h.data(), res.units, U, weights.merger_w1, weights.merger_b1, U, y1.data(), false);
#pragma omp parallel for schedule(static) if (res.units * U >= kParallelMin)
    for (int64_t i = 0; i < res.units * U; ++i) {
      const float v = y1[size_t(i)];
      y1[size_t(i)] = float(0.5 * double(v) * (1.0 + std::erf(double(v) / std::numbers::sqrt2)));  // exact GELU
    }
    linear(y1.data(), res.units, U, weights.merger_w2, weights.merger_b2, O, y2.data(), false);
    if (cur == OrderKind::block_row) {
      res.out = std::move(y2);
    } else {
      res.out.resize(y2.size());
      for (int64_t u = 0; u < res.units; ++u)
        std::copy_n(&y2[size_t(conv[size_t(u * unit)] / unit * O)], O, &res.out[size_t(u * O)]);
      ++res.order_changes;
    }
  }
  if (keep_hidden) {
    res.hidden.resize(x.size());
    permute_tokens(make_view(x.data(), DType::f32, {N, H}), make_view(res.hidden.data(), DType::f32, {N, H}),
                   order_of(cur), native);
  }
  tm.total = std::chrono::duration<double, std::milli>(Clock::now() - t_start).count();
  return res;
}

}  // namespace ariadne
