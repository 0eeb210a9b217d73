// `ariadne shs`: the SHS-Index and its companion diagnostics on images with segmentation masks,
// from the encoder (any schedule; random weights when no --weights, labelled as such) or from
// q/k dumps of another model.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "ariadne/error.hpp"
#include "cli.hpp"
#include "shs_run.hpp"

namespace {

using ariadne::cli::Args;
namespace fs = std::filesystem;

std::vector<int32_t> int_list(const Args& a, const std::string& name, const std::vector<int32_t>& fallback) {
  if (!a.has(name)) return fallback;
  std::vector<int32_t> out;
  for (const std::string& s : a.list(name, "")) {
    char* end = nullptr;
    const long v = std::strtol(s.c_str(), &end, 10);
    ARIADNE_CHECK(!s.empty() && *end == '\0', "--", name, " expects comma-separated integer ids, got '", s, "'");
    out.push_back(int32_t(v));
  }
  return out;
}

int run_shs_command(const Args& a) {
  ariadne::cli::ShsJob job;
  const std::string images = a.required("images");
  job.masks_dir = a.str("masks", "");
  job.coco_file = a.str("coco", "");
  job.purity = a.real("purity", 1.0);
  ARIADNE_CHECK(job.purity >= 0.5 && job.purity <= 1.0, "--purity ", job.purity, " must lie in [0.5, 1]");
  job.rule.foreground = int_list(a, "fg-ids", {});
  job.rule.background = int_list(a, "bg-ids", {0});
  job.rule.ignore = int_list(a, "ignore-ids", {255, ariadne::kCrowdLabel});
  job.out_dir = a.str("out", "");
  job.cell = int(a.integer("cell", 8));
  job.max_heatmap_layers = int(a.integer("heatmap-layers", 1 << 30));
  job.diag_backend = ariadne::parse_backend(a.str("diag-backend", "auto"));
  const int64_t window = a.integer("window", 64);
  const std::string schedule = a.str("schedule", "");
  const int64_t threads = a.integer("threads", 0);
  const int64_t limit = a.integer("limit", 0);

  ariadne::VitWeights weights;
  job.qk_dir = a.str("qk", "");
  if (job.qk_dir.empty()) {
    const std::vector<std::string> files = a.list("weights", "");
    const ariadne::VitConfig preset = ariadne::VitConfig::named(a.str("config", "qwen2.5-vl"));
    const uint64_t seed = uint64_t(a.integer("seed", 0));
    const float sink_init = float(a.real("sink-init", 0.0));
    const int64_t depth = a.integer("depth", 0);
    ARIADNE_CHECK(!schedule.empty(), "ariadne shs: --schedule NAME is required with the encoder source");
    job.encode.attention = ariadne::parse_backend(a.str("backend", "cpu"));
    job.encode.sink_mode = ariadne::parse_sink_mode(a.str("sink-mode", "denominator"));
    job.preprocess.min_pixels = a.integer("min-pixels", job.preprocess.min_pixels);
    job.preprocess.max_pixels = a.integer("max-pixels", job.preprocess.max_pixels);
    if (files.empty()) {
      ariadne::VitConfig c = preset;
      if (depth > 0) {  // random weights only: a shallower tower for quick looks
        c.depth = int(depth);
        c.full_layers.erase(std::remove_if(c.full_layers.begin(), c.full_layers.end(), [&](int l) { return l >= depth; }),
                            c.full_layers.end());
      }
      weights = ariadne::random_vit_weights(c, seed, sink_init);
    } else {
      ARIADNE_CHECK(depth == 0, "ariadne shs: --depth applies to random weights only");
      weights = ariadne::load_vit_weights(files, preset, sink_init);
    }
    job.weights = &weights;
    job.schedule = ariadne::vit_schedule(schedule, weights.config, window);
  } else {
    const auto [h, w] = ariadne::cli::parse_grid("grid", a.required("grid"));
    job.grid = ariadne::Grid{h, w};
    job.order = ariadne::parse_order(a.required("order"));
    job.merge = int(a.integer("merge", job.order == ariadne::OrderKind::raster ? 1 : 2));
    job.window_units = int(a.integer("qwen-window", 4));
    job.sink_mode = ariadne::parse_sink_mode(a.str("sink-mode", "denominator"));
    if (!schedule.empty()) job.schedule = ariadne::resolve_schedule(schedule, window);
  }
  const bool json = a.json();
  a.reject_unused();
  if (threads > 0) ariadne::set_cpu_threads(int(threads));

  // --images: a folder (every .jpg/.jpeg/.png in name order) or a comma-separated list of files.
  if (fs::is_directory(images)) {
    for (const auto& e : fs::directory_iterator(images)) {
      std::string ext = e.path().extension().string();
      std::transform(ext.begin(), ext.end(), ext.begin(), ::tolower);
      if (e.is_regular_file() && (ext == ".jpg" || ext == ".jpeg" || ext == ".png")) job.images.push_back(e.path().string());
    }
    std::sort(job.images.begin(), job.images.end());
    ARIADNE_CHECK(!job.images.empty(), "--images ", images, ": no .jpg, .jpeg or .png file");
  } else {
    job.images = a.list("images", "");
  }
  if (limit > 0 && int64_t(job.images.size()) > limit) job.images.resize(size_t(limit));

  const ariadne::cli::ShsRunResult r = ariadne::cli::run_shs(job, &std::cerr);
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

const ariadne::cli::Command reg{"shs", "SHS-Index and companion diagnostics on images with masks", run_shs_command};

}  // namespace
