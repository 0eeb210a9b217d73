// Vision encoder: RoPE against the formula, window-order cu through the encoder's layer plan,
// parity with HF transformers (tests/data/vit, made by scripts/make_vit_reference.py), schedules
// that must agree with full attention, multi-image batches, weight loading.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>

#include <gtest/gtest.h>

#include "ariadne/safetensors.hpp"
#include "ariadne/vit.hpp"
#include "common.hpp"

namespace ariadne {
namespace {

std::string source_dir() {
  if (const char* s = std::getenv("ARIADNE_SOURCE_DIR")) return s;
  return std::filesystem::path(__FILE__).parent_path().parent_path().parent_path().string();
}
std::string data(const std::string& name) { return source_dir() + "/tests/data/vit/" + name; }
std::string temp_path(const std::string& name) {
  static const testing::TempDir dir("ariadne-vit");  // removed when the test binary exits
  return dir / name;
}

struct Rel {
  double l2 = 0, max_abs = 0, ref_max = 0;
};
Rel rel_error(const std::vector<float>& a, const std::vector<float>& ref) {
  Rel r;
  double num = 0, den = 0;
  EXPECT_EQ(a.size(), ref.size());
  for (size_t i = 0; i < std::min(a.size(), ref.size()); ++i) {
    const double d = double(a[i]) - double(ref[i]);
    num += d * d;
    den += double(ref[i]) * ref[i];
    r.max_abs = std::max(r.max_abs, std::fabs(d));
    r.ref_max = std::max(r.ref_max, std::fabs(double(ref[i])));
    if (!std::isfinite(a[i])) r.l2 = INFINITY;
  }
  if (r.l2 == 0) r.l2 = std::sqrt(num / std::max(den, 1e-300));
  return r;
}

std::vector<float> random_pixels(int64_t tokens, int dim, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> v(size_t(tokens * dim));
  for (auto& x : v) x = float(double(rng() >> 11) * 0x1.0p-53 * 4.0 - 2.0);
  return v;
}

EncodeOptions reference_attention() {
  EncodeOptions o;
  o.attention = Backend::reference;
  return o;
}

TEST(Vit, RopeTablesMatchTheFormula) {
  const std::vector<Grid> grids{{4, 6}, {2, 2}};
  const int hd = 16, q = hd / 4;
  const double theta = 10000;
  std::vector<float> cos, sin;
  vit_rope_tables(grids, 2, hd, theta, cos, sin);
  // Token positions from the order module's coordinates of the native (block_row) order.
  const TokenOrder native = make_order(OrderKind::block_row, grids, 2);
  ASSERT_EQ(cos.size(), size_t(native.tokens() * hd));
  for (int64_t t = 0; t < native.tokens(); ++t)
    for (int a = 0; a < 2; ++a)
      for (int k = 0; k < q; ++k) {
        const double ang = native.coords[size_t(2 * t + a)] * std::pow(theta, -double(k) / q);
        for (int dup = 0; dup < 2; ++dup) {
          const size_t i = size_t(t * hd + dup * hd / 2 + a * q + k);
          ASSERT_NEAR(cos[i], std::cos(ang), 2e-6) << "token " << t << " axis " << a << " k " << k;
          ASSERT_NEAR(sin[i], std::sin(ang), 2e-6) << "token " << t << " axis " << a << " k " << k;
        }
      }
  // Rotation: pairs (i, i + d/2) rotate by the angle of i, checked in double.
  std::vector<float> x = random_pixels(native.tokens(), 2 * hd, 5), x0 = x;
  apply_rope(x.data(), native.tokens(), 2 * hd, 2, hd, cos.data(), sin.data());
  for (int64_t t = 0; t < native.tokens(); ++t)
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < hd / 2; ++i) {
        const size_t o = size_t(t * 2 * hd + h * hd);
        const double c = cos[size_t(t * hd + i)], s = sin[size_t(t * hd + i)];
        const double a = x0[o + size_t(i)], b = x0[o + size_t(i + hd / 2)];
        ASSERT_NEAR(x[o + size_t(i)], a * c - b * s, 1e-6);
        ASSERT_NEAR(x[o + size_t(i + hd / 2)], b * c + a * s, 1e-6);
      }
}

TEST(Vit, WindowOrderCuThroughTheEncoderPlan) {
  const VitConfig c = VitConfig::qwen25_vl();
  EXPECT_EQ(c.window_units(), 4);
  const Schedule s = vit_schedule("chunk", c);
  ASSERT_EQ(s.layers.size(), 32u);
  const auto plan = vit_layer_plan(c, {{14, 16}}, s);
  for (int l = 0; l < 32; ++l) {
    const bool full = l % 8 == 7;
    EXPECT_EQ(plan[size_t(l)].kind, full ? LayerKind::full : LayerKind::chunk) << "layer " << l;
    EXPECT_EQ(plan[size_t(l)].order, OrderKind::qwen_window) << "layer " << l;
    EXPECT_EQ(plan[size_t(l)].cu, full ? std::vector<int32_t>({0, 224}) : std::vector<int32_t>({0, 64, 128, 176, 224}))
        << "layer " << l;
  }
  // Two images: windows restart at the second image, full layers split by image.
  const auto two = vit_layer_plan(c, {{14, 16}, {4, 4}}, s);
  EXPECT_EQ(two[0].cu, std::vector<int32_t>({0, 64, 128, 176, 224, 240}));
  EXPECT_EQ(two[7].cu, std::vector<int32_t>({0, 224, 240}));
  // Ariadne: row layers on block_row, column layers on block_col, window 64, sinks on local layers.
  const auto ar = vit_layer_plan(c, {{14, 16}}, vit_schedule("ariadne", c));
  EXPECT_EQ(ar[0].order, OrderKind::block_row);
  EXPECT_EQ(ar[4].order, OrderKind::block_col);
  EXPECT_EQ(ar[0].window, 64);
  EXPECT_TRUE(ar[0].sink);
  EXPECT_FALSE(ar[7].sink);
}

TEST(Vit, SchedulesAdaptToTheModelDepth) {
  const VitConfig c = VitConfig::small();
  EXPECT_EQ(vit_schedule("chunk", c).letters(), "WFWF");
  EXPECT_EQ(vit_schedule("swa1d+sink", c).letters(), "R+FR+F");
  EXPECT_EQ(vit_schedule("full", c).letters(), "FFFF");
  EXPECT_EQ(vit_schedule("RRCF", c).letters(), "RRCF");
  EXPECT_THROW(vit_schedule("ariadne", c), Error);  // 32 layers for a 4-layer model
  EXPECT_THROW(vit_schedule("RRF", c), Error);
}

TEST(Vit, SmartResizeMatchesHf) {
  // Expected values printed by transformers' smart_resize (factor 28, 3136, 12845056).
  const std::vector<std::array<int, 4>> cases = {{61, 90, 56, 84},     {50, 57, 56, 56},     {10, 10, 56, 56},
                                                 {448, 448, 448, 448}, {1000, 3000, 1008, 2996}, {5000, 5000, 3556, 3556},
                                                 {27, 29, 56, 84},     {42, 42, 56, 56},     {70, 42, 56, 56},
                                                 {4000, 20, 4004, 28}};
  for (const auto& [h, w, eh, ew] : cases) {
    const auto [rh, rw] = smart_resize(h, w, 28, 3136, 12845056);
    EXPECT_EQ(rh, eh) << h << "x" << w;
    EXPECT_EQ(rw, ew) << h << "x" << w;
  }
  EXPECT_THROW(smart_resize(5000, 20, 28, 3136, 12845056), Error);  // aspect ratio 250
  EXPECT_THROW(smart_resize(0, 20, 28, 3136, 12845056), Error);
}

TEST(Vit, HfParity) {
  const SafetensorsFile ref(data("reference.safetensors"));
  const std::vector<float> hf_pixels = ref.read_f32("pixel_values");
  const std::vector<float> thw = ref.read_f32("grid_thw");
  const std::vector<float> hf_out = ref.read_f32("output");
  std::vector<Grid> grids;
  for (size_t i = 0; i + 2 < thw.size(); i += 3) {
    ASSERT_EQ(thw[i], 1.f);
    grids.push_back({int(thw[i + 1]), int(thw[i + 2])});
  }
  ASSERT_EQ(grids.size(), 2u);

  // Sizes come from the file (the small preset only supplies heads, window and full layers).
  const VitWeights w = load_vit_weights({data("weights.safetensors")}, VitConfig::small());
  EXPECT_EQ(w.prefix, "model.visual.");
  EXPECT_FALSE(w.random);
  EXPECT_EQ(w.config.depth, 4);
  EXPECT_EQ(w.config.hidden, 32);
  EXPECT_EQ(w.config.intermediate, 64);
  EXPECT_EQ(w.config.out_hidden, 32);

  // Preprocessing: our PIL-exact bicubic and normalization against HF's pixel_values.
  const PixelBatch ours = preprocess({read_image(data("image_0.png")), read_image(data("image_1.png"))}, w.config);
  ASSERT_EQ(ours.grids, grids);
  ASSERT_EQ(ours.values.size(), hf_pixels.size());
  double worst = 0;
  for (size_t i = 0; i < hf_pixels.size(); ++i) worst = std::max(worst, double(std::fabs(ours.values[i] - hf_pixels[i])));
  EXPECT_EQ(worst, 0.0) << "preprocessing differs from HF's pixel_values by up to " << worst;

  // The encoder on HF's pixel_values, Qwen's own schedule (chunk).
  const Schedule chunk = vit_schedule("chunk", w.config);
  const EncodeResult r = encode(w, hf_pixels, grids, chunk, reference_attention());
  ASSERT_EQ(r.units, 10);
  const Rel e = rel_error(r.out, hf_out);
  std::printf("HF parity (chunk, CPU fp32): relative L2 %.3g, max |diff| %.3g of max |ref| %.3g\n", e.l2, e.max_abs,
              e.ref_max);
  EXPECT_LE(e.l2, 1e-5) << "max abs " << e.max_abs << " of max " << e.ref_max;
  EXPECT_LE(e.max_abs, 1e-5 * e.ref_max * 10);
  // HF with every layer full / every layer windowed: our `full` and `WWWW` schedules.
  const EncodeResult all_full = encode(w, hf_pixels, grids, vit_schedule("full", w.config), reference_attention());
  EXPECT_LE(rel_error(all_full.out, ref.read_f32("output_all_full")).l2, 1e-5);
  EXPECT_LE(rel_error(encode(w, hf_pixels, grids, vit_schedule("WWWW", w.config), reference_attention()).out,
                      ref.read_f32("output_all_window"))
                .l2,
            1e-5);
  // A different schedule must not match (the comparison can fail).
  EXPECT_GT(rel_error(all_full.out, hf_out).l2, 1e-4);
  // The default attention backend (the fast CPU kernels where they support the layer, else the
  // reference: EncodeResult says which ran) meets the same bound.
  const EncodeResult fast = encode(w, hf_pixels, grids, chunk);
  EXPECT_LE(rel_error(fast.out, hf_out).l2, 1e-5) << "attention on " << fast.attention_backend;
  // From our own preprocessing, end to end.
  EXPECT_LE(rel_error(encode(w, ours.values, grids, chunk, reference_attention()).out, hf_out).l2, 1e-5);
}

TEST(Vit, SchedulesEqualFullWhenWindowsCoverEverything) {
  // 4×4 patches = 2×2 merge units = one 56-px window of the small config; SWA ±64 covers 16 tokens.
  const VitConfig c = VitConfig::small();
  const VitWeights w = random_vit_weights(c, 11, -INFINITY);  // a −∞ sink is no sink
  const std::vector<Grid> grids{{4, 4}};
  const auto px = random_pixels(16, c.patch_dim(), 3);
  const auto full = encode(w, px, grids, vit_schedule("full", c), reference_attention()).out;
  for (const char* s : {"chunk", "swa1d", "swa2d", "swa1d+sink", "RCQW", "R+C+C+F"}) {
    const EncodeResult r = encode(w, px, grids, vit_schedule(s, c), reference_attention());
    EXPECT_LE(rel_error(r.out, full).l2, 1e-5) << s;
  }
  EXPECT_EQ(encode(w, px, grids, vit_schedule("RCQW", c), reference_attention()).order_changes, 3);  // C, Q, and the merged output back from Q
  // A narrow window is not full attention: the check above can fail.
  EXPECT_GT(rel_error(encode(w, px, grids, vit_schedule("RCQW", c, 1), reference_attention()).out, full).l2, 1e-4);
  // And a finite sink changes the output.
  const VitWeights ws = random_vit_weights(c, 11, 0.5f);
  EXPECT_GT(rel_error(encode(ws, px, grids, vit_schedule("R+C+C+F", c), reference_attention()).out, full).l2, 1e-4);
}

TEST(Vit, MultiImageBatchEqualsSeparateRuns) {
  const VitConfig c = VitConfig::small();
  const VitWeights w = random_vit_weights(c, 12, 0.25f);
  const std::vector<Grid> grids{{4, 6}, {6, 4}, {2, 2}};
  int64_t total = 0;
  for (const Grid& g : grids) total += g.tokens();
  const auto px = random_pixels(total, c.patch_dim(), 4);
  for (const char* s : {"chunk", "R+C+Q+W", "FR+FC+"}) {
    const Schedule sch = vit_schedule(s, c, 3);
    const EncodeResult batch = encode(w, px, grids, sch, reference_attention());
    std::vector<float> separate;
    int64_t t0 = 0;
    for (const Grid& g : grids) {
      const std::vector<float> one(px.begin() + t0 * c.patch_dim(), px.begin() + (t0 + g.tokens()) * c.patch_dim());
      const EncodeResult r = encode(w, one, {g}, sch, reference_attention());
      separate.insert(separate.end(), r.out.begin(), r.out.end());
      t0 += g.tokens();
    }
    EXPECT_LE(rel_error(batch.out, separate).l2, 1e-6) << s;
  }
}

TEST(Vit, WeightsLoadFromEitherPrefixWithSinks) {
  const VitConfig c = VitConfig::small();
  VitWeights w = random_vit_weights(c, 13);
  for (size_t l = 0; l < w.layers.size(); ++l)
    for (size_t h = 0; h < w.layers[l].sinks.size(); ++h) w.layers[l].sinks[h] = float(l) - float(h) * 0.5f;
  save_vit_weights(temp_path("a.safetensors"), w, DType::f32, "visual.", true);
  save_vit_weights(temp_path("b.safetensors"), w, DType::bf16, "model.visual.", false);
  VitConfig other = VitConfig::qwen25_vl();  // metadata must override heads / window / full layers
  const VitWeights a = load_vit_weights({temp_path("a.safetensors")}, other, 7.f);
  EXPECT_EQ(a.prefix, "visual.");
  EXPECT_EQ(a.config.heads, 2);
  EXPECT_EQ(a.config.window_px, 56);
  EXPECT_EQ(a.config.full_layers, c.full_layers);
  EXPECT_EQ(a.patch_embed, w.patch_embed);
  EXPECT_EQ(a.layers[3].down_w, w.layers[3].down_w);
  EXPECT_TRUE(a.layers[2].sinks_from_file);
  EXPECT_EQ(a.layers[2].sinks, w.layers[2].sinks);
  // The headers alone give the same architecture (the CLI checks --schedule against it before loading).
  const VitConfig peek = read_vit_config({temp_path("a.safetensors")}, other);
  EXPECT_EQ(peek.describe(), a.config.describe());
  EXPECT_EQ(peek.depth, 4);
  const VitWeights b = load_vit_weights({temp_path("b.safetensors")}, other, 7.f);
  EXPECT_EQ(b.prefix, "model.visual.");
  EXPECT_FALSE(b.layers[0].sinks_from_file);
  EXPECT_EQ(b.layers[0].sinks, std::vector<float>(2, 7.f));
  EXPECT_EQ(b.layers[1].qkv_b[5], bf16_to_float(float_to_bf16(w.layers[1].qkv_b[5])));

  // A tensor of the wrong shape is named with its file.
  std::vector<SafetensorsTensor> ts;
  save_vit_weights(temp_path("c.safetensors"), w, DType::f32);
  const SafetensorsFile good(temp_path("c.safetensors"));
  for (const auto& n : good.names()) {
    const auto& e = good.entry(n);
    std::vector<int64_t> shape = e.shape;
    if (n == "visual.blocks.1.mlp.up_proj.bias") shape[0] -= 1;
    ts.push_back({n, DType::f32, shape, good.bytes(n)});
  }
  write_safetensors(temp_path("d.safetensors"), ts, good.metadata());
  try {
    load_vit_weights({temp_path("d.safetensors")}, c);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("d.safetensors: tensor 'visual.blocks.1.mlp.up_proj.bias' has shape [63]"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(load_vit_weights({data("reference.safetensors")}, c), Error);  // no tower in it
  EXPECT_THROW(read_vit_config({data("reference.safetensors")}, c), Error);
}

TEST(Vit, BadInputsAreRefused) {
  const VitConfig c = VitConfig::small();
  const VitWeights w = random_vit_weights(c, 1);
  const auto px = random_pixels(16, c.patch_dim(), 1);
  EXPECT_THROW(encode(w, px, {{4, 4}}, parse_schedule("RRF")), Error);  // 3 layers for 4
  EXPECT_THROW(encode(w, px, {{4, 6}}, vit_schedule("full", c)), Error);  // pixel count
  EXPECT_THROW(encode(w, px, {{3, 4}}, vit_schedule("full", c)), Error);  // odd side
  EncodeOptions cuda;
  cuda.attention = Backend::cuda;
  EXPECT_THROW(encode(w, px, {{4, 4}}, vit_schedule("full", c), cuda), Error);
  VitConfig odd = c;
  odd.heads = 3;
  EXPECT_THROW(odd.validate(), Error);
}

}  // namespace
}  // namespace ariadne
