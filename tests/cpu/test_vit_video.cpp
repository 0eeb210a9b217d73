// Video in the vision encoder: preprocess_video's frame padding and pairing, a clip through the
// encoder as grid_t temporal patches (block-diagonal over time on every schedule), the labelme
// street-scene frames, and parity with HF transformers on a multi-frame clip (tests/data/vit/video_*,
// made by scripts/make_vit_reference.py).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>

#include <gtest/gtest.h>

#include "ariadne/safetensors.hpp"
#include "ariadne/vit.hpp"

namespace ariadne {
namespace {

namespace fs = std::filesystem;

const fs::path kLabelmeVideo = "/usr/share/doc/labelme-examples/examples/video_annotation/data_annotated";

std::string source_dir() {
  if (const char* s = std::getenv("ARIADNE_SOURCE_DIR")) return s;
  return fs::path(__FILE__).parent_path().parent_path().parent_path().string();
}
std::string data(const std::string& name) { return source_dir() + "/tests/data/vit/" + name; }

double rel_l2(const float* a, const float* ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = double(a[i]) - double(ref[i]);
    num += d * d;
    den += double(ref[i]) * ref[i];
    if (!std::isfinite(a[i])) return INFINITY;
  }
  return std::sqrt(num / std::max(den, 1e-300));
}
double rel_l2(const std::vector<float>& a, const std::vector<float>& ref) {
  EXPECT_EQ(a.size(), ref.size());
  return rel_l2(a.data(), ref.data(), std::min(a.size(), ref.size()));
}
double max_abs_diff(const float* a, const float* b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return m;
}

// A seeded noise frame: every pixel differs between frames, so a mixed-up frame cannot hide.
Image noise_frame(int width, int height, uint64_t seed) {
  Image im;
  im.width = width;
  im.height = height;
  im.channels = 3;
  im.pixels.resize(size_t(width) * size_t(height) * 3);
  std::mt19937_64 rng(seed);
  for (auto& p : im.pixels) p = uint8_t(rng() & 0xffu);
  return im;
}

// The column of (channel c, frame t, patch pixel 0) in a patch row (columns (channel, t, py, px)).
size_t column(const VitConfig& c, int ch, int t) { return size_t((ch * c.temporal + t) * c.patch * c.patch); }

EncodeOptions reference_attention() {
  EncodeOptions o;
  o.attention = Backend::reference;
  return o;
}

TEST(VitVideo, PreprocessPadsTheClipAndPairsItsFrames) {
  const VitConfig c = VitConfig::small();
  // Three 56×84 frames (already multiples of 28: no resize) pad to four: the last frame repeats.
  const std::vector<Image> frames{noise_frame(84, 56, 1), noise_frame(84, 56, 2), noise_frame(84, 56, 3)};
  const PixelBatch v = preprocess_video(frames, c);
  ASSERT_EQ(v.grid_t, std::vector<int>{2});
  ASSERT_EQ(v.grids, (std::vector<Grid>{{4, 6}, {4, 6}}));
  ASSERT_EQ(v.tokens(), 48);
  // Frame k of the clip is frame k % T of temporal patch k / T. A still image of frame f carries f
  // in both t columns, so its t = 0 half is the reference for every frame.
  std::vector<PixelBatch> still;
  for (const Image& f : frames) still.push_back(preprocess({f}, c));
  const size_t plane = size_t(c.patch * c.patch), row = size_t(c.patch_dim());
  const int expect[2][2] = {{0, 1}, {2, 2}};  // frame index of (temporal patch, t)
  for (int tp = 0; tp < 2; ++tp)
    for (int64_t r = 0; r < 24; ++r)
      for (int ch = 0; ch < 3; ++ch)
        for (int t = 0; t < 2; ++t) {
          const float* got = &v.values[size_t(tp * 24 + r) * row + column(c, ch, t)];
          const float* want = &still[size_t(expect[tp][t])].values[size_t(r) * row + column(c, ch, 0)];
          ASSERT_EQ(max_abs_diff(got, want, plane), 0.0) << "temporal patch " << tp << " row " << r << " t " << t;
        }
  // Two equal frames are a still image, bit for bit.
  EXPECT_EQ(preprocess_video({frames[0], frames[0]}, c).values, still[0].values);
  EXPECT_EQ(preprocess({frames[0]}, c).grid_t, std::vector<int>{1});
  // A single frame is one temporal patch (padded by itself).
  EXPECT_EQ(preprocess_video({frames[1]}, c).values, still[1].values);
  // Frames of different sizes do not form a clip; the message names the frame.
  try {
    preprocess_video({frames[0], noise_frame(56, 56, 4)}, c);
    ADD_FAILURE() << "a 56x56 frame after 84x56 ones was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("frame 1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(preprocess_video({}, c), Error);
  // Resizing follows the image rule: a 90×61 clip becomes 84×56 (grid 4×6), as the image does.
  const PixelBatch r = preprocess_video({noise_frame(90, 61, 5), noise_frame(90, 61, 6)}, c);
  EXPECT_EQ(r.grids, preprocess({noise_frame(90, 61, 5)}, c).grids);
}

// The five labelme street-scene frames (1000×563), shrunk to 112×56 (grid 4×8, 32 tokens per
// temporal patch), pad to six frames: three temporal patches.
std::vector<Image> labelme_frames() {
  std::vector<Image> frames;
  for (int i = 100; i <= 104; ++i)
    frames.push_back(read_image((kLabelmeVideo / ("00000" + std::to_string(i) + ".jpg")).string()));
  return frames;
}

TEST(VitVideo, LabelmeClipIsBlockDiagonalOverTime) {
  if (!fs::exists(kLabelmeVideo)) GTEST_SKIP() << kLabelmeVideo << " is absent (package labelme-examples)";
  const VitConfig c = VitConfig::small();
  const VitWeights w = random_vit_weights(c, 7, 0.5f);
  PreprocessOptions pre;
  pre.max_pixels = 28 * 28 * 12;
  std::vector<Image> frames = labelme_frames();
  ASSERT_EQ(frames.size(), 5u);
  ASSERT_EQ(frames[0].width, 1000);
  ASSERT_EQ(frames[0].height, 563);
  const PixelBatch clip = preprocess_video(frames, c, pre);
  ASSERT_EQ(clip.grid_t, std::vector<int>{3});
  ASSERT_EQ(clip.grids, (std::vector<Grid>(3, Grid{4, 8})));
  const int64_t per_tp = 32 / 4 * int64_t(c.out_hidden);  // output values of one temporal patch

  // Frames 0 and 1 (temporal patch 0) replaced by their negatives; and frames 0 and 1 swapped.
  std::vector<Image> changed = frames, swapped = frames;
  for (int f = 0; f < 2; ++f)
    for (auto& p : changed[size_t(f)].pixels) p = uint8_t(255 - p);
  std::swap(swapped[0], swapped[1]);
  const PixelBatch clip_changed = preprocess_video(changed, c, pre);
  const PixelBatch clip_swapped = preprocess_video(swapped, c, pre);

  // Window 64 tokens per side spans two temporal patches of 32: a window that crossed time, or a
  // full layer over the whole clip, would carry the change into the later patches.
  for (const char* name : {"chunk", "full", "R+C+R+F", "R+C+C+C+", "swa1d+sink"}) {
    SCOPED_TRACE(name);
    const Schedule s = vit_schedule(name, c, 64);
    for (const Backend b : {Backend::reference, Backend::cpu}) {
      EncodeOptions o;
      o.attention = b;
      const EncodeResult r = encode(w, clip.values, clip.grids, s, o);
      ASSERT_EQ(r.tokens, 96);
      ASSERT_EQ(r.units, 24);
      const EncodeResult rc = encode(w, clip_changed.values, clip_changed.grids, s, o);
      // Temporal patch 0 changes; patches 1 and 2 do not (same token count: the same GEMM splits).
      EXPECT_GT(rel_l2(rc.out.data(), r.out.data(), size_t(per_tp)), 1e-2);
      EXPECT_LE(max_abs_diff(rc.out.data() + per_tp, r.out.data() + per_tp, size_t(2 * per_tp)), 1e-6)
          << "a change of temporal patch 0 reached a later temporal patch";
      // The Conv3d patch embedding mixes the frames of a pair in order: swapping them changes the
      // output of their temporal patch only.
      const EncodeResult rs = encode(w, clip_swapped.values, clip_swapped.grids, s, o);
      EXPECT_GT(rel_l2(rs.out.data(), r.out.data(), size_t(per_tp)), 1e-3);
      EXPECT_LE(max_abs_diff(rs.out.data() + per_tp, r.out.data() + per_tp, size_t(2 * per_tp)), 1e-6);
    }
    // Each temporal patch encoded alone (a two-frame clip) gives the clip's rows for it.
    const EncodeResult r = encode(w, clip.values, clip.grids, s, reference_attention());
    for (int tp = 0; tp < 3; ++tp) {
      // Frame 5 is the padding: frame 4 repeated.
      std::vector<Image> pair{frames[size_t(2 * tp)], frames[std::min<size_t>(size_t(2 * tp + 1), 4)]};
      const PixelBatch one = preprocess_video(pair, c, pre);
      const EncodeResult ro = encode(w, one.values, one.grids, s, reference_attention());
      EXPECT_LE(rel_l2(ro.out.data(), r.out.data() + tp * per_tp, size_t(per_tp)), 1e-6) << "temporal patch " << tp;
    }
  }
  // The check can fail: the same rows read as one 12×8 image (time stacked into patch rows) let the
  // full layers carry temporal patch 0's change into the rows of the later ones.
  {
    const Schedule full = vit_schedule("full", c);
    const std::vector<Grid> stacked{{12, 8}};
    const EncodeResult r = encode(w, clip.values, stacked, full, reference_attention());
    const EncodeResult rc = encode(w, clip_changed.values, stacked, full, reference_attention());
    EXPECT_GT(max_abs_diff(rc.out.data() + per_tp, r.out.data() + per_tp, size_t(2 * per_tp)), 1e-3);
  }
  // The layer plan splits every layer per temporal patch: full layers by 32 tokens, chunk layers
  // by the Qwen windows of each patch (window 56 px = 2×2 merge units = 16 tokens: two per patch).
  const auto plan = vit_layer_plan(c, clip.grids, vit_schedule("chunk", c));
  for (const LayerPlan& lp : plan) {
    if (lp.kind == LayerKind::full) {
      EXPECT_EQ(lp.cu, (std::vector<int32_t>{0, 32, 64, 96}));
    } else if (lp.kind == LayerKind::chunk) {
      EXPECT_EQ(lp.cu, (std::vector<int32_t>{0, 16, 32, 48, 64, 80, 96}));
    }
  }
}

// HF transformers on a three-frame clip (padded to four: grid_thw [2, 4, 6]) with the image
// reference's small tower.
TEST(VitVideo, HfParity) {
  const std::string ref_file = data("video_reference.safetensors");
  const SafetensorsFile ref(ref_file);
  const std::vector<float> hf_pixels = ref.read_f32("pixel_values");
  const std::vector<float> thw = ref.read_f32("grid_thw");
  ASSERT_EQ(thw.size(), 3u);
  const int T = int(thw[0]);
  ASSERT_EQ(T, 2);
  const std::vector<Grid> grids(size_t(T), Grid{int(thw[1]), int(thw[2])});
  const VitWeights w = load_vit_weights({data("weights.safetensors")}, VitConfig::small());

  std::vector<Image> frames;
  for (int f = 0; f < 3; ++f) frames.push_back(read_image(data("video_frame_" + std::to_string(f) + ".png")));
  const PixelBatch ours = preprocess_video(frames, w.config);
  ASSERT_EQ(ours.grid_t, std::vector<int>{T});
  ASSERT_EQ(ours.grids, grids);
  ASSERT_EQ(ours.values.size(), hf_pixels.size());
  // HF's video processor rescales and normalizes in one fused float step ((x − 255·mean) / (255·std)),
  // we as its image processor does: the two roundings differ by a few ulps.
  const double pix_diff = max_abs_diff(ours.values.data(), hf_pixels.data(), hf_pixels.size());
  std::printf("HF video pixel_values: max |ours - HF| %.3g\n", pix_diff);
  EXPECT_LE(pix_diff, 1e-6) << "preprocessing differs from HF's video pixel_values";

  const std::vector<std::pair<const char*, const char*>> cases{
      {"chunk", "output"}, {"full", "output_all_full"}, {"WWWW", "output_all_window"}};
  for (const auto& [schedule, key] : cases) {
    const std::vector<float> hf_out = ref.read_f32(key);
    const Schedule s = vit_schedule(schedule, w.config);
    const EncodeResult r = encode(w, hf_pixels, grids, s, reference_attention());
    ASSERT_EQ(r.units, int64_t(T) * 6);
    const double e = rel_l2(r.out, hf_out);
    std::printf("HF video parity (%s, CPU fp32): relative L2 %.3g\n", schedule, e);
    EXPECT_LE(e, 1e-5) << schedule;
    EXPECT_LE(rel_l2(encode(w, hf_pixels, grids, s).out, hf_out), 1e-5) << schedule << " on the cpu backend";
    EXPECT_LE(rel_l2(encode(w, ours.values, grids, s, reference_attention()).out, hf_out), 1e-5) << schedule;
  }
  // The comparison can fail: the clip's temporal patches in the wrong order do not match.
  const size_t half = hf_pixels.size() / 2;
  std::vector<float> flipped(hf_pixels.begin() + std::ptrdiff_t(half), hf_pixels.end());
  flipped.insert(flipped.end(), hf_pixels.begin(), hf_pixels.begin() + std::ptrdiff_t(half));
  EXPECT_GT(rel_l2(encode(w, flipped, grids, vit_schedule("chunk", w.config), reference_attention()).out,
                   ref.read_f32("output")),
            1e-2);
}

}  // namespace
}  // namespace ariadne
