// `ariadne shs`: the SHS-Index and its companion diagnostics on images with segmentation masks,
// from the encoder (any schedule; random weights when no --weights, labelled as such) or from
// q/k dumps of another model.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>

#include "ariadne/error.hpp"
#include "ariadne/file.hpp"
#include "cli.hpp"
#include "shs_run.hpp"

namespace {

using ariadne::cli::Args;
namespace fs = std::filesystem;

int run_shs_command(const Args& a) {
  ariadne::cli::ShsJob job;
  const std::vector<std::string> images = a.strs("image");
  job.masks_dir = a.str("masks");
  job.coco_file = a.str("coco");
  job.purity = a.real("purity");
  job.rule.foreground = a.i32s("fg-id");
  job.rule.background = a.i32s("bg-id");
  job.rule.ignore = a.i32s("ignore-id");
  job.out_dir = a.str("out");
  job.video = a.flag("video");
  job.cell = a.i32("cell");
  if (a.given("heatmap-layers")) job.max_heatmap_layers = a.i32("heatmap-layers");
  job.diag_backend = ariadne::parse_backend(a.str("diag-backend"));
  const int64_t window = a.i64("window");
  const std::string schedule = a.str("schedule");
  const int64_t limit = a.given("limit") ? a.i64("limit") : 0;
  ariadne::cli::require_cuda_if_asked(a, "diag-backend");
  ariadne::cli::require_cuda_if_asked(a, "backend");
  if (job.masks_dir.empty() == job.coco_file.empty())
    a.fail(job.masks_dir.empty() ? "masks" : "coco", "give exactly one mask source: --masks DIR or --coco FILE");

  job.qk_dir = a.str("qk");
  job.encode.sink_mode = job.sink_mode = ariadne::parse_sink_mode(a.str("sink"));
  // Encoder source: the configuration and the weights to build once every input is checked.
  ariadne::VitConfig config;
  std::vector<std::string> weight_files;
  ariadne::VitConfig preset;
  if (job.qk_dir.empty()) {
    for (const char* o : {"grid", "order", "merge"})
      if (a.given(o)) a.fail(o, "applies to --qk dumps only");
    weight_files = a.strs("weights");
    preset = ariadne::VitConfig::named(a.str("config"));
    const int64_t depth = a.given("layers") ? a.i64("layers") : 0;
    if (schedule.empty()) a.fail("schedule", "is required with the encoder source (no --qk)");
    if (depth > 0 && !weight_files.empty()) a.fail("layers", "applies to random weights only");
    job.encode.attention = ariadne::parse_backend(a.str("backend"));
    job.preprocess.min_pixels = a.i64("min-pixels");
    job.preprocess.max_pixels = a.i64("max-pixels");
    if (job.preprocess.min_pixels > job.preprocess.max_pixels) a.fail("min-pixels", "exceeds --max-pixels");
    config = preset;
    if (depth > 0) {  // random weights only: a shallower tower for quick looks
      if (depth > config.depth)
        a.fail("layers", "exceeds the configuration's " + std::to_string(config.depth) + " layers");
      config.depth = int(depth);
      config.full_layers.erase(std::remove_if(config.full_layers.begin(), config.full_layers.end(),
                                              [&](int l) { return l >= depth; }),
                               config.full_layers.end());
    }
    // The schedule is checked before the weights are built or loaded, against the checkpoint's own
    // sizes when one is given (read from its headers: a trained tower need not have the preset's depth).
    ariadne::VitConfig checked = config;
    if (!weight_files.empty()) {
      try {
        checked = ariadne::read_vit_config(weight_files, preset);
      } catch (const ariadne::Error& e) {
        a.fail("weights", e.what());
      }
    }
    try {
      ariadne::vit_schedule(schedule, checked, window);
    } catch (const ariadne::Error& e) {
      a.fail("schedule", e.what());
    }
  } else {
    for (const char* o : {"weights", "config", "seed", "sink-init", "layers", "backend", "min-pixels", "max-pixels",
                          "video"})
      if (a.given(o)) a.fail(o, "applies to the encoder source only (not with --qk)");
    if (!a.given("grid")) a.fail("grid", "is required with --qk (the dumps' patch grid)");
    if (!a.given("order")) a.fail("order", "is required with --qk (the dumps' token order)");
    const auto [h, w] = a.grid("grid");
    job.grid = ariadne::Grid{h, w};
    job.order = ariadne::parse_order(a.str("order"));
    job.merge = a.given("merge") ? a.i32("merge") : job.order == ariadne::OrderKind::raster ? 1 : 2;
    job.window_units = a.i32("qwen-window");
    if (!schedule.empty()) {
      try {
        job.schedule = ariadne::resolve_schedule(schedule, window);
      } catch (const ariadne::Error& e) {
        a.fail("schedule", e.what());
      }
    }
  }
  const bool json = a.json();

  // --image: a folder (every .jpg/.jpeg/.png in name order) or a comma-separated list of files.
  ariadne::with_path_errors(images[0], "list the images", [&] {
    if (images.size() == 1 && fs::is_directory(images[0])) {
      for (const auto& e : fs::directory_iterator(images[0])) {
        std::string ext = e.path().extension().string();
        std::transform(ext.begin(), ext.end(), ext.begin(), ::tolower);
        if (e.is_regular_file() && (ext == ".jpg" || ext == ".jpeg" || ext == ".png"))
          job.images.push_back(e.path().string());
      }
      std::sort(job.images.begin(), job.images.end());
      if (job.images.empty()) a.fail("image", images[0] + ": no .jpg, .jpeg or .png file");
    } else {
      for (const std::string& f : images)
        if (fs::is_directory(f)) a.fail("image", f + " is a folder: give one folder, or a list of files");
      job.images = images;
    }
  });
  if (limit > 0 && int64_t(job.images.size()) > limit) job.images.resize(size_t(limit));
  if (job.video && job.images.size() < 2) a.fail("video", "a clip needs at least two frames (--image)");

  // Every image, mask and dump folder is checked before the weights are built and before any
  // output is written.
  const ariadne::cli::ShsInputs inputs = ariadne::cli::check_shs_inputs(job);
  if (a.given("threads")) ariadne::set_cpu_threads(a.i32("threads"));
  ariadne::VitWeights weights;
  if (job.qk_dir.empty()) {
    const float sink_init = float(a.real("sink-init"));
    weights = weight_files.empty() ? ariadne::random_vit_weights(config, uint64_t(a.i64("seed")), sink_init)
                                   : ariadne::load_vit_weights(weight_files, preset, sink_init);
    job.weights = &weights;
    job.schedule = ariadne::vit_schedule(schedule, weights.config, window);
  }
  const ariadne::cli::ShsRunResult r = ariadne::cli::run_shs(job, inputs, &std::cerr);
  if (json) {
    ariadne::cli::print_json(r.json);
    return 0;
  }
  const ariadne::ShsSummary& s = r.summary;
  const bool random = r.json["source"]["random_weights"].get<bool>();
  std::printf("SHS-Index %.4f over %d image(s), %d layers x %d heads%s\n", s.shs_index, s.images_scored, s.layers,
              s.heads, random ? "  [RANDOM WEIGHTS: not a trained model]" : "");
  std::printf("FG-dominant heads %.1f%%, attention distance %.2f patches (%.1f px), entropy %.3f nats\n",
              100 * s.fg_dominant_share, s.distance_patches, s.distance_patches * s.patch, s.entropy);
  if (s.has_sink)
    std::printf("sink takes %.2f%% of FG and %.2f%% of BG received attention; %.1f%% of heads take more from BG\n",
                100 * s.sink_fg, 100 * s.sink_bg, 100 * s.sink_bg_heavier_share);
  std::printf("per layer:");
  for (int l = 0; l < s.layers; ++l) std::printf(" %.3f", s.per_layer[size_t(l)]);
  std::printf("\n");
  for (const std::string& sk : s.images_skipped) std::printf("skipped %s: no FG or no BG patch\n", sk.c_str());
  if (!job.out_dir.empty()) std::printf("wrote %s/summary.json and %zu files\n", job.out_dir.c_str(), r.files.size());
  return 0;
}

using namespace ariadne::cli;
constexpr int64_t kIdMin = std::numeric_limits<int32_t>::min(), kIdMax = std::numeric_limits<int32_t>::max();
const Command reg{
    "shs", "SHS-Index and companion diagnostics on images with masks",
    {path_list("image", PathKind::in_any, "a folder of .jpg/.jpeg/.png images, or image files a.jpg,b.png").needed(),
     path("masks", PathKind::in_dir, "label maps <stem>.png or <stem>.npy"),
     path("coco", PathKind::in_file, "COCO annotations (images matched by file-name stem)"),
     real("purity", 1.0, Range::closed(0.5, 1.0), "share of a patch's pixels that must carry its label"),
     integer_list("fg-id", "", kIdMin, kIdMax, "foreground class ids (default: every id not background or void)"),
     integer_list("bg-id", "0", kIdMin, kIdMax, "background class ids"),
     integer_list("ignore-id", "255," + std::to_string(ariadne::kCrowdLabel), kIdMin, kIdMax, "void class ids"),
     boolean("video", false, "the images are the frames of one clip in name order: encoded as video, each "
             "temporal patch scored against its frames' masks"),
     path("out", PathKind::out_dir, "folder for summary.json, received.npy and heatmaps"),
     integer("cell", 8, 1, 64, "heatmap pixels per patch"),
     integer("heatmap-layers", 0, 1, 1 << 20, "heatmaps for at most this many layers (default: all)").without_default(),
     choice("diag-backend", "auto", {"auto", "reference", "cpu", "cuda"}, "backend of the diagnostic passes"),
     integer("window", 64, 1, 1 << 20, "window radius of window layers, in tokens"),
     text("schedule", "", "schedule: preset or short syntax (required with the encoder)"),
     threads_option(),
     integer("limit", 0, 1, int64_t(1) << 31, "score at most this many images (default: all)").without_default(),
     path("qk", PathKind::in_dir, "q/k dumps <stem>/{q,k}_<layer>.npy instead of the encoder"),
     path_list("weights", PathKind::in_file, "encoder: safetensors shards (absent: seeded random weights)"),
     choice("config", "qwen2.5-vl", {"qwen2.5-vl", "small"}, "encoder configuration"),
     integer("seed", 0, 0, int64_t(1) << 62, "encoder: seed of random weights"),
     real("sink-init", 0.0, Range::any(), "encoder: sink logit of sink layers without one in the checkpoint"),
     integer("layers", 0, 1, 1024, "encoder with random weights: the first N layers only").without_default(),
     choice("backend", "cpu", {"reference", "cpu", "cuda"}, "encoder backend"),
     choice("sink", "denominator", {"denominator", "key0"}, "attention sink form"),
     integer("min-pixels", ariadne::PreprocessOptions{}.min_pixels, 1, int64_t(1) << 30, "encoder: smallest resized area"),
     integer("max-pixels", ariadne::PreprocessOptions{}.max_pixels, 1, int64_t(1) << 30, "encoder: largest resized area"),
     grid("grid", "", 1 << 16, "--qk: the dumps' patch grid"),
     choice("order", "", {"raster", "qwen_window", "block_row", "block_col"}, "--qk: the dumps' token order"),
     integer("merge", 2, 1, 64, "--qk: merge-unit side (default 1 for raster, else 2)").without_default(),
     integer("qwen-window", 4, 1, 4096, "--qk: qwen_window order's window side in merge units")},
    run_shs_command};

}  // namespace
