// Per-layer diagnostics through the attention engine, the SHS accumulator and its JSON form.
#include <cmath>
#include <limits>

#include "ariadne/device.hpp"
#include "ariadne/error.hpp"
#include "ariadne/shs.hpp"

namespace ariadne {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double mean_of(const std::vector<double>& v) {
  if (v.empty()) return kNaN;
  double s = 0;
  for (double x : v) s += x;
  return s / double(v.size());
}

// The first NaN or infinite element of a host q or k, named: the attention of a NaN input is NaN
// (or, through a fully poisoned row, zero everywhere), and an AUROC over all-equal values is a
// clean-looking ½. Diagnostics refuse such input instead.
void require_finite(const TensorView& t, const char* name) {
  if (t.device != Device::cpu) return;
  for (int64_t a = 0; a < t.shape[0]; ++a)
    for (int64_t b = 0; b < t.shape[1]; ++b)
      for (int64_t c = 0; c < t.shape[2]; ++c) {
        const float v = t.get({a, b, c});
        ARIADNE_CHECK(std::isfinite(v), name, ": element (token ", a, ", head ", b, ", dim ", c, ") is ", v,
                      ": the diagnostics need finite q and k (", t.describe(), ")");
      }
}

nlohmann::json num(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

nlohmann::json nums(const std::vector<double>& v) {
  nlohmann::json a = nlohmann::json::array();
  for (double x : v) a.push_back(num(x));
  return a;
}

}  // namespace

std::vector<LayerDiag> diagnose_images(const LayerInput& in, const LayerSpec& spec, Backend backend) {
  ARIADNE_CHECK(in.order != nullptr && in.order->images() >= 1, "diagnose_images: needs a token order");
  const TokenOrder& order = *in.order;
  require_rank(in.q, "q", 3);
  require_rank(in.k, "k", 3);
  ARIADNE_CHECK(in.q.shape[0] == order.tokens() && in.k.shape[0] == order.tokens(), "diagnose_images: q has ",
                in.q.shape[0], " and k ", in.k.shape[0], " rows, the order ", order.tokens(), " tokens");
  std::vector<LayerDiag> out;
  for (int i = 0; i < order.images(); ++i) {
    const int32_t lo = order.cu_seqlens[size_t(i)], hi = order.cu_seqlens[size_t(i) + 1];
    const TokenOrder one = make_order(order.kind, {order.grids[size_t(i)]}, order.merge, order.window);
    // The image's rows of the packed order are its own order shifted to its first token.
    for (int32_t j = 0; j < hi - lo; ++j)
      ARIADNE_CHECK(order.perm[size_t(lo + j)] - lo == one.perm[size_t(j)], "diagnose_images: image ", i,
                    " of the order is not laid out as its own order (position ", j, ")");
    LayerInput part = in;
    part.q.data = static_cast<char*>(in.q.data) + int64_t(lo) * in.q.stride[0] * dtype_size(in.q.dtype);
    part.k.data = static_cast<char*>(in.k.data) + int64_t(lo) * in.k.stride[0] * dtype_size(in.k.dtype);
    part.q.shape[0] = part.k.shape[0] = hi - lo;
    part.order = &one;
    part.pattern = layer_pattern(spec, one);
    out.push_back(diagnose_layer(part, backend));
  }
  return out;
}

ObservedLayer observed_layer(const AttentionParams& p, const TokenOrder& order, const LayerSpec& spec) {
  ObservedLayer o;
  o.q = host_rows(p.q, p.order);
  o.k = host_rows(p.k, p.order);
  if (p.sink.defined()) o.sink = host_rows(p.sink);
  o.input.q = o.q.view();
  o.input.k = o.k.view();
  o.input.order = &order;
  o.input.pattern = layer_pattern(spec, order);
  o.input.sink_mode = p.sink_mode;
  if (p.sink.defined()) o.input.sink = o.sink.view();
  o.input.scale = p.scale;
  return o;
}

LayerDiag diagnose_layer(const LayerInput& in, Backend backend) {
  ARIADNE_CHECK(in.order != nullptr && in.order->images() == 1,
                "diagnose_layer: needs the token order of exactly one image");
  const TokenOrder& order = *in.order;
  require_rank(in.q, "q", 3);
  require_rank(in.k, "k", 3);
  const int64_t n = order.tokens();
  ARIADNE_CHECK(in.q.shape[0] == n && in.k.shape[0] == n, "diagnose_layer: q has ", in.q.shape[0], " and k ",
                in.k.shape[0], " tokens, but the ", order.grids[0].h, "x", order.grids[0].w, " grid has ", n);
  const int hq = int(in.q.shape[1]);
  const int64_t dim = in.q.shape[2];
  require_finite(in.q, "q");
  require_finite(in.k, "k");

  Buffer out(DType::f32, {n, hq, dim}), received(DType::f32, {hq, n}), entropy(DType::f32, {hq, n}),
      distance(DType::f32, {hq, n});
  AttentionParams p;
  p.q = in.q;
  p.k = in.k;
  p.v = in.k;  // the values do not change any statistic; k has the right shape
  p.out = out.view();
  p.pattern = in.pattern;
  p.sink_mode = in.sink_mode;
  p.sink = in.sink;
  p.scale = in.scale;
  p.received = received.view();
  p.entropy = entropy.view();
  p.distance = distance.view();
  p.coords_q = p.coords_k = make_view(const_cast<float*>(order.coords.data()), DType::f32, {n, 2});
  validate(p);
  Backend b = backend;
  if (b == Backend::automatic) b = backend_supports(Backend::cpu, p) ? Backend::cpu : Backend::reference;
  attention(p, b);

  LayerDiag d;
  d.heads = hq;
  d.tokens = n;
  d.received.resize(size_t(hq * n));
  d.distance.assign(size_t(hq), 0.0);
  d.entropy.assign(size_t(hq), 0.0);
  for (int h = 0; h < hq; ++h) {
    const std::vector<float> r = to_spatial(received.as<float>() + h * n, order);
    std::copy(r.begin(), r.end(), d.received.begin() + h * n);
    double sd = 0, se = 0;
    for (int64_t i = 0; i < n; ++i) {
      sd += distance.as<float>()[h * n + i];
      se += entropy.as<float>()[h * n + i];
    }
    d.distance[size_t(h)] = sd / double(n);
    d.entropy[size_t(h)] = se / double(n);
  }

  if (in.sink_mode != SinkMode::none) {
    // Same logits, no sink: what each key would receive if the sink took nothing.
    AttentionParams p0 = p;
    p0.sink_mode = SinkMode::none;
    p0.sink = TensorView{};
    p0.entropy = p0.distance = p0.coords_q = p0.coords_k = TensorView{};
    attention(p0, b);
    d.received_no_sink.resize(size_t(hq * n));
    for (int h = 0; h < hq; ++h) {
      const std::vector<float> r = to_spatial(received.as<float>() + h * n, order);
      std::copy(r.begin(), r.end(), d.received_no_sink.begin() + h * n);
    }
  }
  return d;
}

ShsAccumulator::ShsAccumulator(int layers, int heads, int patch)
    : layers_(layers), heads_(heads), patch_(patch), sink_layer_(size_t(layers), false) {
  ARIADNE_CHECK(layers > 0 && heads > 0 && patch > 0, "ShsAccumulator: layers ", layers, ", heads ", heads,
                ", patch ", patch, " must be positive");
}

const ImageScores& ShsAccumulator::add(const std::string& name, Grid grid, const std::vector<int8_t>& labels,
                                       const std::vector<LayerDiag>& diags) {
  const int64_t n = grid.tokens();
  ARIADNE_CHECK(int64_t(labels.size()) == n, name, ": ", labels.size(), " patch labels for a ", grid.h, "x", grid.w,
                " grid");
  ARIADNE_CHECK(int(diags.size()) == layers_, name, ": ", diags.size(), " layers of attention, expected ", layers_);
  ImageScores im;
  im.name = name;
  im.grid = grid;
  for (int8_t l : labels) {
    im.fg += l == kPatchForeground;
    im.bg += l == kPatchBackground;
    im.excluded += l == kPatchExcluded;
  }
  im.scored = im.fg > 0 && im.bg > 0;
  im.heads.resize(size_t(layers_ * heads_));
  std::vector<double> fg, bg;
  for (int l = 0; l < layers_; ++l) {
    const LayerDiag& d = diags[size_t(l)];
    ARIADNE_CHECK(d.heads == heads_ && d.tokens == n, name, ": layer ", l, " has ", d.heads, " heads and ", d.tokens,
                  " tokens, expected ", heads_, " and ", n);
    const bool sink = !d.received_no_sink.empty();
    if (sink) sink_layer_[size_t(l)] = true;
    for (int h = 0; h < heads_; ++h) {
      HeadScore& s = im.heads[size_t(l * heads_ + h)];
      s.distance = d.distance[size_t(h)];
      s.entropy = d.entropy[size_t(h)];
      if (!im.scored) continue;
      const float* r = d.received.data() + h * n;
      fg.clear();
      bg.clear();
      double r0_fg = 0, r0_bg = 0, r_fg = 0, r_bg = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (labels[size_t(i)] == kPatchExcluded) continue;
        const bool is_fg = labels[size_t(i)] == kPatchForeground;
        (is_fg ? fg : bg).push_back(r[i]);
        if (sink) {
          (is_fg ? r_fg : r_bg) += r[i];
          (is_fg ? r0_fg : r0_bg) += d.received_no_sink[size_t(h * n + i)];
        }
      }
      // NaN received attention (NaN weights, a NaN sink) gives NaN scores, not an error deep in auroc.
      bool finite = true;
      for (double x : fg) finite = finite && std::isfinite(x);
      for (double x : bg) finite = finite && std::isfinite(x);
      s.auroc = finite ? auroc(fg, bg) : kNaN;
      s.folded = finite ? std::max(s.auroc, 1.0 - s.auroc) : kNaN;
      if (sink) {
        s.sink_fg = r0_fg > 0 ? (r0_fg - r_fg) / r0_fg : kNaN;
        s.sink_bg = r0_bg > 0 ? (r0_bg - r_bg) / r0_bg : kNaN;
      }
    }
  }
  images_.push_back(std::move(im));
  return images_.back();
}

ShsSummary ShsAccumulator::summary() const {
  ShsSummary s;
  s.layers = layers_;
  s.heads = heads_;
  s.patch = patch_;
  const size_t lh = size_t(layers_ * heads_);
  std::vector<std::vector<double>> folded(lh), raw(lh);
  std::vector<double> all, dominant;
  const size_t nl = size_t(layers_);
  std::vector<std::vector<double>> layer_dist(nl), layer_ent(nl), layer_fold(nl), layer_dom(nl), layer_sfg(nl),
      layer_sbg(nl);
  std::vector<double> dist, ent, sfg, sbg, heavier;
  for (const ImageScores& im : images_) {
    if (im.scored) ++s.images_scored;
    else s.images_skipped.push_back(im.name);
    for (int l = 0; l < layers_; ++l)
      for (int h = 0; h < heads_; ++h) {
        const size_t i = size_t(l * heads_ + h);
        const HeadScore& hs = im.heads[i];
        dist.push_back(hs.distance);
        ent.push_back(hs.entropy);
        layer_dist[size_t(l)].push_back(hs.distance);
        layer_ent[size_t(l)].push_back(hs.entropy);
        if (!im.scored) continue;
        folded[i].push_back(hs.folded);
        raw[i].push_back(hs.auroc);
        all.push_back(hs.folded);
        layer_fold[size_t(l)].push_back(hs.folded);
        const double dom = std::isnan(hs.auroc) ? kNaN : hs.auroc > 0.5 ? 1.0 : 0.0;
        dominant.push_back(dom);
        layer_dom[size_t(l)].push_back(dom);
        if (sink_layer_[size_t(l)] && std::isfinite(hs.sink_fg) && std::isfinite(hs.sink_bg)) {
          sfg.push_back(hs.sink_fg);
          sbg.push_back(hs.sink_bg);
          heavier.push_back(hs.sink_bg > hs.sink_fg ? 1.0 : 0.0);
          layer_sfg[size_t(l)].push_back(hs.sink_fg);
          layer_sbg[size_t(l)].push_back(hs.sink_bg);
        }
      }
  }
  s.shs_index = mean_of(all);
  s.fg_dominant_share = mean_of(dominant);
  for (size_t i = 0; i < lh; ++i) {
    s.per_head.push_back(mean_of(folded[i]));
    s.per_head_auroc.push_back(mean_of(raw[i]));
  }
  for (int l = 0; l < layers_; ++l) {
    s.per_layer.push_back(mean_of(layer_fold[size_t(l)]));
    s.fg_dominant_per_layer.push_back(mean_of(layer_dom[size_t(l)]));
    s.distance_per_layer.push_back(mean_of(layer_dist[size_t(l)]));
    s.entropy_per_layer.push_back(mean_of(layer_ent[size_t(l)]));
    s.sink_fg_per_layer.push_back(mean_of(layer_sfg[size_t(l)]));
    s.sink_bg_per_layer.push_back(mean_of(layer_sbg[size_t(l)]));
  }
  s.distance_patches = mean_of(dist);
  s.entropy = mean_of(ent);
  s.has_sink = !sfg.empty();
  if (s.has_sink) {
    s.sink_fg = mean_of(sfg);
    s.sink_bg = mean_of(sbg);
    s.sink_bg_heavier_share = mean_of(heavier);
  }
  return s;
}

nlohmann::json shs_summary_json(const ShsSummary& s) {
  nlohmann::json per_head = nlohmann::json::array(), per_head_auroc = nlohmann::json::array();
  for (int l = 0; l < s.layers; ++l) {
    const auto b = s.per_head.begin() + l * s.heads, ba = s.per_head_auroc.begin() + l * s.heads;
    per_head.push_back(nums(std::vector<double>(b, b + s.heads)));
    per_head_auroc.push_back(nums(std::vector<double>(ba, ba + s.heads)));
  }
  nlohmann::json j = {
      {"shs_index", num(s.shs_index)},
      {"layers", s.layers},
      {"heads", s.heads},
      {"images_scored", s.images_scored},
      {"images_skipped", s.images_skipped},
      {"per_layer", nums(s.per_layer)},
      {"per_head", per_head},
      {"per_head_auroc", per_head_auroc},
      {"fg_dominant_share", num(s.fg_dominant_share)},
      {"fg_dominant_per_layer", nums(s.fg_dominant_per_layer)},
      {"attention_distance",
       {{"patches", num(s.distance_patches)},
        {"pixels", num(s.distance_patches * s.patch)},
        {"per_layer_patches", nums(s.distance_per_layer)}}},
      {"entropy", {{"mean", num(s.entropy)}, {"per_layer", nums(s.entropy_per_layer)}}},
  };
  if (s.has_sink)
    j["sink_allocation"] = {{"fg_share", num(s.sink_fg)},
                            {"bg_share", num(s.sink_bg)},
                            {"bg_heavier_head_share", num(s.sink_bg_heavier_share)},
                            {"per_layer_fg_share", nums(s.sink_fg_per_layer)},
                            {"per_layer_bg_share", nums(s.sink_bg_per_layer)}};
  return j;
}

}  // namespace ariadne
