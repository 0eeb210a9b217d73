// SHS-Index: AUROC against a brute-force pair count, labels on hand-made masks, the per-layer
// diagnostics against a brute-force attention matrix, and planted heads (FG, BG, uniform).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "ariadne/device.hpp"
#include "ariadne/error.hpp"
#include "ariadne/schedule.hpp"
#include "ariadne/shs.hpp"
#include "ariadne/vit.hpp"

namespace {

using namespace ariadne;

double brute_auroc(const std::vector<double>& pos, const std::vector<double>& neg) {
  double wins = 0;
  for (double p : pos)
    for (double n : neg) wins += p > n ? 1.0 : (p == n ? 0.5 : 0.0);
  return wins / double(pos.size() * neg.size());
}

TEST(Auroc, EqualsPairCountOnRandomDataWithTies) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t np = 1 + rng() % 40, nn = 1 + rng() % 40;
    const int levels = 1 + int(rng() % 6);  // few distinct values: many ties
    std::vector<double> pos(np), neg(nn);
    for (double& v : pos) v = double(rng() % levels) + (trial % 3 == 0 ? 0.5 : 0.0);
    for (double& v : neg) v = double(rng() % levels);
    EXPECT_NEAR(auroc(pos, neg), brute_auroc(pos, neg), 1e-12) << "trial " << trial;
  }
}

TEST(Auroc, EdgesAndErrors) {
  EXPECT_DOUBLE_EQ(auroc({2, 3}, {0, 1}), 1.0);
  EXPECT_DOUBLE_EQ(auroc({0, 1}, {2, 3}), 0.0);
  EXPECT_DOUBLE_EQ(auroc({1, 1}, {1, 1, 1}), 0.5);
  EXPECT_THROW(auroc({}, {1}), Error);
  EXPECT_THROW(auroc({1}, {}), Error);
  EXPECT_THROW(auroc({NAN}, {1}), Error);
}

TEST(Labels, NearestResize) {
  LabelMap m{2, 2, {1, 2, 3, 4}};
  EXPECT_EQ(resize_nearest(m, 4, 4).ids, (std::vector<int32_t>{1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4}));
  LabelMap big{4, 4, {}};
  for (int i = 0; i < 16; ++i) big.ids.push_back(i);
  EXPECT_EQ(resize_nearest(big, 2, 2).ids, (std::vector<int32_t>{5, 7, 13, 15}));  // centres (1,1), (1,3) ...
  EXPECT_EQ(resize_nearest(big, 4, 4).ids, big.ids);
  EXPECT_THROW(resize_nearest(big, 0, 3), Error);
}

// A 4×6 mask of 2×2 patches (grid 2×3), one case per patch:
//   (0,0) all FG   (0,1) half FG     (0,2) all BG
//   (1,0) ¾ FG     (1,1) ¾ BG + void (1,2) all void
LabelMap hand_mask() {
  const int F = 5, B = 0, V = 255;
  return LabelMap{4, 6, {F, F, F, B, B, B,  //
                         F, F, F, B, B, B,  //
                         F, F, B, B, V, V,  //
                         F, B, V, B, V, V}};
}

TEST(Labels, PurityRule) {
  const Grid g{2, 3};
  const PatchFractions f = patch_fractions(hand_mask(), g, 2, ForegroundRule{});
  EXPECT_EQ(f.fg, (std::vector<float>{1, 0.5f, 0, 0.75f, 0, 0}));
  EXPECT_EQ(f.bg, (std::vector<float>{0, 0.5f, 1, 0.25f, 0.75f, 0}));
  const int8_t F = kPatchForeground, B = kPatchBackground, X = kPatchExcluded;
  EXPECT_EQ(label_patches(f, 1.0), (std::vector<int8_t>{F, X, B, X, X, X}));
  EXPECT_EQ(label_patches(f, 0.75), (std::vector<int8_t>{F, X, B, F, B, X}));
  EXPECT_EQ(label_patches(f, 0.5), (std::vector<int8_t>{F, X, B, F, B, X}));
  EXPECT_THROW(label_patches(f, 0.4), Error);
  // The same mask at twice the resolution gives the same fractions (nearest resize back down
  // picks one of each 2×2 block, which all hold the same id).
  LabelMap m2 = resize_nearest(hand_mask(), 8, 12);
  EXPECT_EQ(patch_fractions(m2, g, 2, ForegroundRule{}).fg, f.fg);
  // An explicit foreground list: only id 5 is FG, so id 0 and 7 are BG.
  ForegroundRule only5;
  only5.foreground = {5};
  EXPECT_EQ(only5.classify(5), 1);
  EXPECT_EQ(only5.classify(7), 0);
  EXPECT_EQ(only5.classify(255), -1);
  EXPECT_EQ(ForegroundRule{}.classify(7), 1);
  EXPECT_EQ(ForegroundRule{}.classify(kCrowdLabel), -1);
}

TEST(Labels, ToSpatialUndoesTheOrder) {
  for (OrderKind kind : {OrderKind::block_row, OrderKind::block_col, OrderKind::qwen_window}) {
    const TokenOrder o = make_order(kind, {Grid{6, 10}}, 2, 2);
    std::vector<float> seq(size_t(o.tokens()));
    for (size_t i = 0; i < seq.size(); ++i) seq[i] = float(o.perm[i]);  // the spatial index of each position
    const std::vector<float> sp = to_spatial(seq.data(), o);
    for (size_t i = 0; i < sp.size(); ++i) EXPECT_EQ(sp[i], float(i));
  }
}

// ---- attention on planted and random heads ----

// q/k in sequence order for an order `o`, [tokens, heads, dim] f32.
struct QK {
  Buffer q, k, sink;
};

// Brute-force attention statistics for one head, from the full matrix (double), for a window
// pattern of half-width `w` in sequence positions (w < 0: full) and an optional denominator sink.
struct Brute {
  std::vector<double> received;  // spatial
  double distance = 0, entropy = 0;
};
Brute brute(const QK& x, const TokenOrder& o, int h, int64_t w, double sink) {
  const int64_t n = o.tokens(), d = x.q.shape()[2];
  const double scale = 1.0 / std::sqrt(double(d));
  Brute b;
  b.received.assign(size_t(n), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    std::vector<double> s(size_t(n), -INFINITY);
    double m = -INFINITY;
    for (int64_t j = 0; j < n; ++j) {
      if (w >= 0 && std::llabs(i - j) > w) continue;
      double dot = 0;
      for (int64_t c = 0; c < d; ++c) dot += double(x.q.view().get({i, h, c})) * x.k.view().get({j, h, c});
      s[size_t(j)] = scale * dot;
      m = std::max(m, s[size_t(j)]);
    }
    double z = 0;
    for (double v : s) z += std::exp(v - m);
    const double zs = z + std::exp(sink - m);
    for (int64_t j = 0; j < n; ++j) {
      if (s[size_t(j)] == -INFINITY) continue;
      const double ahat = std::exp(s[size_t(j)] - m) / z;
      b.received[size_t(o.perm[size_t(j)])] += std::exp(s[size_t(j)] - m) / zs;
      b.entropy -= ahat * std::log(ahat) / double(n);
      const double dr = o.coords[size_t(2 * i)] - o.coords[size_t(2 * j)];
      const double dc = o.coords[size_t(2 * i + 1)] - o.coords[size_t(2 * j + 1)];
      b.distance += ahat * std::sqrt(dr * dr + dc * dc) / double(n);
    }
  }
  return b;
}

TEST(Diagnose, MatchesBruteForceWithAndWithoutSink) {
  const TokenOrder o = make_order(OrderKind::block_row, {Grid{6, 8}}, 2, 4);
  const int64_t n = o.tokens();
  const int heads = 3, dim = 8;
  QK x{Buffer(DType::f32, {n, heads, dim}), Buffer(DType::f32, {n, heads, dim}), Buffer(DType::f32, {heads})};
  x.q.fill_random(1, -1.5f, 1.5f);
  x.k.fill_random(2, -1.5f, 1.5f);
  const float sinks[heads] = {-1.f, 0.5f, 2.f};
  for (int h = 0; h < heads; ++h) x.sink.as<float>()[h] = sinks[h];
  for (const int64_t w : {int64_t(-1), int64_t(5)}) {
    LayerInput in;
    in.q = x.q.view();
    in.k = x.k.view();
    in.order = &o;
    in.pattern = w < 0 ? Pattern::full() : Pattern::window(w, w);
    in.sink_mode = SinkMode::denominator;
    in.sink = x.sink.view();
    const LayerDiag d = diagnose_layer(in, Backend::reference);
    ASSERT_EQ(d.received_no_sink.size(), size_t(heads * n));
    for (int h = 0; h < heads; ++h) {
      const Brute with = brute(x, o, h, w, sinks[h]), without = brute(x, o, h, w, -INFINITY);
      for (int64_t j = 0; j < n; ++j) {
        EXPECT_NEAR(d.received[size_t(h * n + j)], with.received[size_t(j)], 1e-5 * (1 + with.received[size_t(j)]));
        EXPECT_NEAR(d.received_no_sink[size_t(h * n + j)], without.received[size_t(j)],
                    1e-5 * (1 + without.received[size_t(j)]));
      }
      EXPECT_NEAR(d.distance[size_t(h)], with.distance, 1e-5);
      EXPECT_NEAR(d.entropy[size_t(h)], with.entropy, 1e-5);
    }
  }
}

// FG: a centred block of the grid. Heads: 0 attends to FG keys, 1 to BG keys, 2 uniformly.
struct Planted {
  TokenOrder order;
  std::vector<int8_t> labels;
  QK x;
};
Planted planted(Grid g, OrderKind kind, uint64_t seed, float noise) {
  Planted p{make_order(kind, {g}, 2, 4), {}, {}};
  LabelMap m{g.h * 14, g.w * 14, {}};
  for (int y = 0; y < m.height; ++y)
    for (int x = 0; x < m.width; ++x)
      m.ids.push_back(y >= m.height / 4 && y < 3 * m.height / 4 && x >= m.width / 4 && x < 3 * m.width / 4 ? 1 : 0);
  p.labels = label_patches(patch_fractions(m, g, 14, ForegroundRule{}), 0.5);
  const int64_t n = g.tokens();
  const int heads = 3, dim = 16;
  p.x = QK{Buffer(DType::f32, {n, heads, dim}), Buffer(DType::f32, {n, heads, dim}), Buffer(DType::f32, {heads})};
  p.x.q.fill_random(seed, -noise, noise);
  p.x.k.fill_random(seed + 1, -noise, noise);
  for (int64_t i = 0; i < n; ++i) {
    const bool fg = p.labels[size_t(p.order.perm[size_t(i)])] == kPatchForeground;
    // One shared direction e0: every query looks along it; keys of the planted class stick out.
    for (int h = 0; h < 2; ++h) p.x.q.view().set({i, h, 0}, 4.f);
    p.x.k.view().set({i, 0, 0}, fg ? 3.f : 0.f);
    p.x.k.view().set({i, 1, 0}, fg ? 0.f : 3.f);
  }
  return p;
}

TEST(Shs, PlantedHeadsGiveOneOneAndAHalf) {
  const Grid g{8, 10};
  ShsAccumulator acc(1, 3);
  for (uint64_t seed : {1u, 2u, 3u}) {
    for (OrderKind kind : {OrderKind::block_row, OrderKind::qwen_window}) {
      Planted p = planted(g, kind, seed, 0.f);  // noise 0: head 2 has q = 0, exactly uniform rows
      LayerInput in;
      in.q = p.x.q.view();
      in.k = p.x.k.view();
      in.order = &p.order;
      in.pattern = Pattern::full();
      const ImageScores& s = acc.add("planted", g, p.labels, {diagnose_layer(in)});
      ASSERT_TRUE(s.scored);
      EXPECT_GT(s.heads[0].auroc, 0.99);
      EXPECT_EQ(s.heads[0].sign(), 1);
      EXPECT_LT(s.heads[1].auroc, 0.01);
      EXPECT_EQ(s.heads[1].sign(), -1);
      EXPECT_GT(s.heads[1].folded, 0.99);
      EXPECT_NEAR(s.heads[2].auroc, 0.5, 1e-12);  // every key receives exactly 1: all ties
      EXPECT_EQ(s.heads[2].sign(), 0);
    }
  }
  const ShsSummary sum = acc.summary();
  EXPECT_EQ(sum.images_scored, 6);
  EXPECT_NEAR(sum.per_head[0], 1.0, 0.01);
  EXPECT_NEAR(sum.per_head[1], 1.0, 0.01);
  EXPECT_NEAR(sum.per_head[2], 0.5, 1e-12);
  EXPECT_NEAR(sum.shs_index, 2.5 / 3, 0.01);
  EXPECT_NEAR(sum.fg_dominant_share, 1.0 / 3, 1e-12);
  EXPECT_FALSE(sum.has_sink);
  const nlohmann::json j = shs_summary_json(sum);
  EXPECT_NEAR(j["shs_index"].get<double>(), sum.shs_index, 1e-12);
  EXPECT_EQ(j["per_head"].size(), 1u);
  EXPECT_EQ(j["per_head"][0].size(), 3u);
  EXPECT_FALSE(j.contains("sink_allocation"));
}

TEST(Shs, NoisyUniformHeadStaysNearAHalfAndSinkTakesMoreFromBackground) {
  // Window attention with a sink, random q/k noise on top of the planted directions. The uniform
  // head's folded AUROC is then a random variable near ½ (slightly above: folding biases it up).
  const Grid g{12, 12};
  ShsAccumulator acc(1, 3);
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    Planted p = planted(g, OrderKind::block_row, 10 * seed, 0.3f);
    Buffer sink(DType::f32, {3});
    sink.fill(1.f);
    LayerInput in;
    in.q = p.x.q.view();
    in.k = p.x.k.view();
    in.order = &p.order;
    in.pattern = Pattern::window(24, 24);
    in.sink_mode = SinkMode::denominator;
    in.sink = sink.view();
    acc.add("noisy", g, p.labels, {diagnose_layer(in)});
  }
  const ShsSummary s = acc.summary();
  EXPECT_GT(s.per_head[0], 0.95);
  EXPECT_GT(s.per_head[1], 0.95);
  EXPECT_LT(s.per_head[2], 0.65);
  ASSERT_TRUE(s.has_sink);
  // Head 0's FG queries and keys share large logits (large LSE, small sink share), so the sink
  // takes relatively more from BG tokens there.
  for (const ImageScores& im : acc.images()) EXPECT_GT(im.heads[0].sink_bg, im.heads[0].sink_fg);
  EXPECT_GT(s.sink_bg_heavier_share, 0.3);
  const nlohmann::json j = shs_summary_json(s);
  ASSERT_TRUE(j.contains("sink_allocation"));
  EXPECT_NEAR(j["sink_allocation"]["bg_share"].get<double>(), s.sink_bg, 1e-12);
}

TEST(Shs, ImageWithoutForegroundIsSkippedAndReported) {
  const Grid g{4, 4};
  const TokenOrder o = make_order(OrderKind::block_row, {g}, 2, 4);
  Buffer q(DType::f32, {16, 2, 8}), k(DType::f32, {16, 2, 8});
  q.fill_random(1);
  k.fill_random(2);
  LayerInput in;
  in.q = q.view();
  in.k = k.view();
  in.order = &o;
  in.pattern = Pattern::full();
  ShsAccumulator acc(1, 2);
  const ImageScores& s = acc.add("empty", g, std::vector<int8_t>(16, kPatchBackground), {diagnose_layer(in)});
  EXPECT_FALSE(s.scored);
  const ShsSummary sum = acc.summary();
  EXPECT_EQ(sum.images_scored, 0);
  EXPECT_EQ(sum.images_skipped, std::vector<std::string>{"empty"});
  EXPECT_GT(sum.distance_patches, 0.0);  // companion measures still count every image
  // Shape mismatches are errors, not silent truncation.
  EXPECT_THROW(acc.add("bad", Grid{4, 5}, std::vector<int8_t>(20, 0), {diagnose_layer(in)}), Error);
  EXPECT_THROW(acc.add("bad", g, std::vector<int8_t>(16, 0), {}), Error);
}

// The encoder's observer hook sees every layer once, in the layer's order, with q/k after RoPE,
// and observing changes nothing in the encoder's output.
TEST(Shs, EncoderHookFeedsTheDiagnostics) {
  const VitConfig c = VitConfig::small();
  const VitWeights w = random_vit_weights(c, 3, 0.5f);
  const Schedule sched = vit_schedule("R+C+FW", c, 3);
  const std::vector<Grid> grids = {Grid{4, 6}};
  std::vector<float> pixels(size_t(grids[0].tokens() * c.patch_dim()));
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (float& v : pixels) v = u(rng);
  const EncodeResult plain = encode(w, pixels, grids, sched);
  EncodeOptions opt;
  std::vector<LayerDiag> diags;
  std::vector<OrderKind> seen;
  std::vector<LayerDiag> direct;  // the encoder's own views and pattern, without observed_layer's copies
  opt.on_attention = [&](int layer, const AttentionParams& p, const TokenOrder& order) {
    EXPECT_EQ(layer, int(diags.size()));
    seen.push_back(order.kind);
    const ObservedLayer o = observed_layer(p, order, sched.layers[size_t(layer)]);
    diags.push_back(diagnose_layer(o.input));
    LayerInput in;
    in.q = p.q;
    in.k = p.k;
    in.order = &order;
    in.pattern = p.pattern;
    in.sink_mode = p.sink_mode;
    in.sink = p.sink;
    direct.push_back(diagnose_layer(in));
  };
  const EncodeResult observed = encode(w, pixels, grids, sched, opt);
  EXPECT_EQ(observed.out, plain.out);
  ASSERT_EQ(diags.size(), 4u);
  for (size_t l = 0; l < diags.size(); ++l) {
    EXPECT_EQ(diags[l].received, direct[l].received) << "layer " << l;
    EXPECT_EQ(diags[l].received_no_sink, direct[l].received_no_sink) << "layer " << l;
  }
  EXPECT_EQ(seen, (std::vector<OrderKind>{OrderKind::block_row, OrderKind::block_col, OrderKind::block_col,
                                          OrderKind::qwen_window}));
  for (size_t l = 0; l < diags.size(); ++l) {
    double total = 0, total0 = 0;
    for (float r : diags[l].received) total += r;
    for (float r : diags[l].received_no_sink) total0 += r;
    const bool sink = sched.layers[l].sink;
    EXPECT_EQ(diags[l].received_no_sink.empty(), !sink);
    // Rows sum to 1 without a sink, so the columns sum to heads × tokens; a sink takes some.
    const double full = double(c.heads * grids[0].tokens());
    if (sink) {
      EXPECT_NEAR(total0, full, 1e-3);
      EXPECT_LT(total, full - 1e-3);
    } else {
      EXPECT_NEAR(total, full, 1e-3);
    }
  }
}

// A layer over several images (a batch, a clip's temporal patches) is diagnosed per image:
// diagnose_images on the batch's observed layer equals diagnose_layer on each image encoded alone.
TEST(Shs, DiagnoseImagesCutsABatchPerImage) {
  const VitConfig c = VitConfig::small();
  const VitWeights w = random_vit_weights(c, 5, 0.5f);
  const Schedule sched = vit_schedule("R+C+QF", c, 3);
  const std::vector<Grid> grids = {Grid{4, 6}, Grid{6, 4}};
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<std::vector<float>> pixels(grids.size());
  std::vector<float> all;
  for (size_t i = 0; i < grids.size(); ++i) {
    pixels[i].resize(size_t(grids[i].tokens() * c.patch_dim()));
    for (float& v : pixels[i]) v = u(rng);
    all.insert(all.end(), pixels[i].begin(), pixels[i].end());
  }
  std::vector<std::vector<LayerDiag>> batch(grids.size());
  EncodeOptions opt;
  opt.on_attention = [&](int layer, const AttentionParams& p, const TokenOrder& order) {
    ASSERT_EQ(order.images(), 2);
    const ObservedLayer o = observed_layer(p, order, sched.layers[size_t(layer)]);
    std::vector<LayerDiag> per = diagnose_images(o.input, sched.layers[size_t(layer)]);
    ASSERT_EQ(per.size(), grids.size());
    for (size_t i = 0; i < per.size(); ++i) batch[i].push_back(per[i]);
  };
  encode(w, all, grids, sched, opt);
  for (size_t i = 0; i < grids.size(); ++i) {
    std::vector<LayerDiag> alone;
    EncodeOptions one;
    one.on_attention = [&](int layer, const AttentionParams& p, const TokenOrder& order) {
      const ObservedLayer o = observed_layer(p, order, sched.layers[size_t(layer)]);
      alone.push_back(diagnose_layer(o.input));
    };
    encode(w, pixels[i], {grids[i]}, sched, one);
    ASSERT_EQ(alone.size(), batch[i].size());
    for (size_t l = 0; l < alone.size(); ++l) {
      ASSERT_EQ(alone[l].received.size(), batch[i][l].received.size());
      for (size_t j = 0; j < alone[l].received.size(); ++j)
        EXPECT_NEAR(batch[i][l].received[j], alone[l].received[j], 1e-4 * (1 + std::fabs(alone[l].received[j])))
            << "image " << i << " layer " << l << " token " << j;
      EXPECT_EQ(batch[i][l].received_no_sink.size(), alone[l].received_no_sink.size());
    }
  }
}

// host_rows copies row-strided views (q of a packed qkv) and gathers rows through an order, as
// observed_layer does for a CUDA encoder's fused order; bad strides and rows are errors.
TEST(Shs, HostRowsGathersStridedRows) {
  const int64_t n = 5, heads = 2, d = 3, row = 3 * heads * d;  // packed [n, 3, heads, d]
  std::vector<float> qkv(size_t(n * row));
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = float(i);
  TensorView k = make_view(qkv.data() + heads * d, DType::f32, {n, heads, d});
  k.stride[0] = row;
  const std::vector<int32_t> order = {3, 0, 4, 1, 2};
  const Buffer plain = host_rows(k), gathered = host_rows(k, order.data());
  ASSERT_EQ(plain.shape(), (std::vector<int64_t>{n, heads, d}));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < heads * d; ++j) {
      EXPECT_EQ(plain.as<float>()[i * heads * d + j], qkv[size_t(i * row + heads * d + j)]);
      EXPECT_EQ(gathered.as<float>()[i * heads * d + j], qkv[size_t(order[size_t(i)] * row + heads * d + j)]);
    }
  const std::vector<int32_t> outside = {0, 1, 2, 3, 5};
  EXPECT_THROW(host_rows(k, outside.data()), Error);
  TensorView split = k;
  split.stride[1] = d + 1;  // heads not packed
  EXPECT_THROW(host_rows(split), Error);
}

TEST(Heatmap, LayoutAndColourOrder) {
  Image bg{6, 4, 3, std::vector<uint8_t>(6 * 4 * 3, 128)};
  const Grid g{2, 3};
  std::vector<float> r = {0, 1, 2, 3, 4, 5, 5, 4, 3, 2, 1, 0, 1, 1, 1, 1, 1, 1};  // 3 heads
  const Image h = heatmap_grid(bg, r.data(), 3, g, 4, 2);
  EXPECT_EQ(h.width, 2 * 12 + 3 * 2);
  EXPECT_EQ(h.height, 2 * 8 + 3 * 2);
  auto lum = [&](int y, int x) { return h.at(y, x, 0) + h.at(y, x, 1) + h.at(y, x, 2); };
  // Head 0: patch 5 (bottom right) brightest, patch 0 darkest; head 1 the reverse.
  EXPECT_GT(lum(2 + 6, 2 + 10), lum(2 + 1, 2 + 1));
  EXPECT_LT(lum(2 + 6, 2 + 12 + 2 + 10), lum(2 + 1, 2 + 12 + 2 + 1));
  const Image l = label_picture(bg, {kPatchForeground, kPatchBackground, kPatchExcluded, 0, 0, 0}, g, 4);
  EXPECT_EQ(l.width, 12);
  EXPECT_GT(l.at(1, 1, 0), l.at(1, 1, 2));  // FG tinted orange
  EXPECT_LT(l.at(1, 5, 0), l.at(1, 5, 2));  // BG tinted blue
  EXPECT_EQ(l.at(1, 9, 0), l.at(1, 9, 2));  // excluded: gray
}

}  // namespace
