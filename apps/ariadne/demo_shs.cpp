// Demo part: the SHS-Index on the PASCAL VOC photos of Debian's labelme-examples package (COCO
// polygons as masks), attention from the encoder with seeded RANDOM weights — the numbers show the
// pipeline working, not a property of a trained model, and the report says so. Then the study's
// committed trained checkpoint (data/study, docs/study.md) on held-out procedural images with exact
// masks, beside the same architecture with random weights.
#include <cstdlib>
#include <filesystem>
#include <algorithm>
#include <iomanip>

#include "demo.hpp"
#include "shs_run.hpp"

namespace ariadne::cli {
namespace {

namespace fs = std::filesystem;

const char* kSamples = "/usr/share/doc/labelme-examples/examples/instance_segmentation/data_dataset_coco";

// The settings every SHS run of this part shares: the encoder on the CPU backend (which falls back
// to the reference where the fast kernels lack a feature), ±64 windows, 6-pixel heatmap cells.
ShsJob demo_job(const VitWeights& weights, const std::string& letters, const fs::path& out_dir, int heatmap_layers) {
  ShsJob job;
  job.weights = &weights;
  job.schedule = vit_schedule(letters, weights.config, 64);
  job.encode.attention = Backend::cpu;
  job.out_dir = out_dir.string();
  job.cell = 6;
  job.max_heatmap_layers = heatmap_layers;
  return job;
}

void run_shs_part(DemoContext& ctx) {
  const fs::path root = kSamples;
  ARIADNE_CHECK(fs::exists(root / "annotations.json"), root.string(),
                "/annotations.json is missing: install labelme-examples (scripts/setup)");
  // Quick: a 2-layer tower; full: one Ariadne block (4 row SWA+sink, 3 column SWA+sink, 1 full).
  // Images are limited to ~50K pixels (a 12×18 patch grid) so the CPU run stays in seconds.
  const int depth = ctx.quick ? 2 : 8;
  const std::string letters = ctx.quick ? "R+F" : "R+R+R+R+C+C+C+F";
  VitConfig config = VitConfig::qwen25_vl();
  config.depth = depth;
  config.full_layers = {depth - 1};
  const VitWeights weights = random_vit_weights(config, 1, 0.f);

  ShsJob job = demo_job(weights, letters, fs::path(ctx.out_dir) / "shs", ctx.quick ? 1 : 2);
  for (const char* stem : {"2011_000003", "2011_000006", "2011_000025"})
    job.images.push_back((root / "JPEGImages" / (std::string(stem) + ".jpg")).string());
  job.coco_file = (root / "annotations.json").string();
  job.preprocess.max_pixels = 50176;
  const ShsRunResult r = run_shs(job, nullptr);
  const ShsSummary& s = r.summary;

  auto& md = ctx.md;
  md << "**Random weights** (seed 1, PyTorch-style initialization): the encoder is Qwen2.5-VL's architecture "
        "(hidden 1280, 16 heads, head dim 80) cut to "
     << depth << " layers, schedule `" << job.schedule.letters()
     << "`, with untrained weights. The numbers below demonstrate the measurement pipeline (masks → patch labels → "
        "received attention → AUROC); they say nothing about a trained model. Run `ariadne shs --weights FILE` on a "
        "real checkpoint, or `--qk DIR` on q/k dumps of any model, for meaningful values.\n\n"
     << "Masks: the COCO polygons of labelme-examples' three VOC photos, rasterized by pixel centre; foreground = any "
        "object; purity 1 (boundary patches excluded). Input size by Qwen's smart resize with max_pixels 50176.\n\n"
     << std::fixed << std::setprecision(4) << "| measure | value |\n| --- | --- |\n"
     << "| SHS-Index (mean folded AUROC over " << s.images_scored << " images × " << s.layers << " layers × " << s.heads
     << " heads) | " << s.shs_index << " |\n"
     << "| FG-dominant heads | " << std::setprecision(1) << 100 * s.fg_dominant_share << "% |\n"
     << "| mean attention distance | " << std::setprecision(2) << s.distance_patches << " patches ("
     << s.distance_patches * s.patch << " px) |\n"
     << "| mean row entropy | " << std::setprecision(3) << s.entropy << " nats |\n";
  if (s.has_sink)
    md << "| sink share of received attention, FG / BG | " << std::setprecision(2) << 100 * s.sink_fg << "% / "
       << 100 * s.sink_bg << "% |\n"
       << "| heads whose sink takes more from BG | " << std::setprecision(1) << 100 * s.sink_bg_heavier_share << "% |\n";
  md << "\nPer layer SHS:";
  for (double v : s.per_layer) md << " " << std::setprecision(3) << v;
  md << "\n\n| image | grid | FG / BG / excluded patches | SHS |\n| --- | --- | --- | --- |\n";
  for (const auto& im : r.json["images"])
    md << "| " << fs::path(im["image"].get<std::string>()).filename().string() << " | " << im["grid"][0] << "x"
       << im["grid"][1] << " | " << im["fg_patches"] << " / " << im["bg_patches"] << " / " << im["excluded"] << " | "
       << (im.contains("shs") ? im["shs"].get<double>() : 0.0) << " |\n";
  md << "\nPictures (per image: `labels.png` FG orange / BG blue / excluded gray; `layerNN.png` one tile per head, "
        "received attention min–max per head, dark → bright):\n\n";
  for (const std::string& f : r.files)
    if (f.find(".png") != std::string::npos) md << "- [shs/" << f << "](shs/" << f << ")\n";
  md << "\nData: `shs/summary.json` (every table above and per-head values), `shs/<image>/received.npy` "
        "[layers, heads, patches] in raster order.\n";
  ctx.json = r.json;
}

// The folder of the committed data: ARIADNE_DATA_DIR from the environment, else the source tree's.
fs::path data_dir() {
  if (const char* env = std::getenv("ARIADNE_DATA_DIR"); env != nullptr && *env != 0) return env;
  return ARIADNE_DATA_DIR;
}

// The study checkpoint's SHS against random weights of its architecture, on the committed held-out
// images. Skipped with a note when the data folder lacks it (a binary run away from its sources).
void run_trained_section(DemoContext& ctx) {
  const fs::path dir = data_dir() / "study";
  const fs::path ckpt = dir / "full-224.safetensors";
  auto& md = ctx.md;
  md << "\n### A trained checkpoint\n\n";
  if (!fs::exists(ckpt)) {
    md << "Skipped: " << ckpt.string() << " is missing (set ARIADNE_DATA_DIR to the source tree's data/).\n";
    return;
  }
  std::vector<std::string> images;
  for (const auto& f : fs::directory_iterator(dir / "heldout" / "images"))
    if (f.path().extension() == ".png") images.push_back(f.path().string());
  std::sort(images.begin(), images.end());
  if (ctx.quick && images.size() > 2) images.resize(2);
  const VitWeights trained = load_vit_weights({ckpt.string()}, VitConfig::qwen25_vl());
  const VitWeights random = random_vit_weights(trained.config, 1, 0.f);
  const std::string letters(size_t(trained.config.depth), 'F');
  // sums[set][model]: set 0 the held-out procedural images (exact masks), set 1 the VOC photos (COCO
  // polygons), which the model never saw: the out-of-distribution probe of its heads. Model 0 is the
  // trained checkpoint, 1 random weights of its architecture.
  const fs::path voc = kSamples;
  const bool has_voc = fs::exists(voc / "annotations.json");
  ShsSummary sums[2][2];
  nlohmann::json runs;
  for (int set = 0; set < (has_voc ? 2 : 1); ++set)
    for (int i = 0; i < 2; ++i) {
      const std::string name = std::string(set == 0 ? "shs_trained" : "shs_trained_voc") + (i == 0 ? "" : "_random");
      ShsJob job = demo_job(i == 0 ? trained : random, letters, fs::path(ctx.out_dir) / name, i == 0 ? 2 : 0);
      if (set == 0) {
        job.images = images;
        job.masks_dir = (dir / "heldout" / "masks").string();
      } else {
        for (const char* stem : {"2011_000003", "2011_000006", "2011_000025"})
          job.images.push_back((voc / "JPEGImages" / (std::string(stem) + ".jpg")).string());
        job.coco_file = (voc / "annotations.json").string();
        job.preprocess.max_pixels = 50176;  // the checkpoint's training size, 224²
      }
      const ShsRunResult r = run_shs(job, nullptr);
      sums[set][i] = r.summary;
      runs[std::string(set == 0 ? "" : "voc_") + (i == 0 ? "trained" : "random_same_architecture")] = r.json;
    }
  const VitConfig& c = trained.config;
  md << "`" << ckpt.filename().string() << "` (data/study/README.md says how it was trained): a tower of depth "
     << c.depth << ", hidden " << c.hidden << ", " << c.heads << " heads × " << c.head_dim()
     << ", schedule `" << letters << "`, trained on the study's procedural images "
     << "(docs/study.md). Its SHS-Index on " << images.size()
     << " held-out images of the same generator, whose masks are exact, beside the same architecture with "
        "random weights (seed 1)";
  if (has_voc) md << "; and on the three VOC photos above, which it never saw (an out-of-distribution probe)";
  md << ":\n\n| measure | trained | random weights |" << (has_voc ? " VOC: trained | VOC: random |" : "")
     << "\n| --- | --- | --- |" << (has_voc ? " --- | --- |" : "") << "\n" << std::fixed;
  auto row = [&](const char* label, int precision, double scale, auto field) {
    md << "| " << label << " |" << std::setprecision(precision);
    for (int set = 0; set < (has_voc ? 2 : 1); ++set)
      for (int i = 0; i < 2; ++i) md << " " << scale * field(sums[set][i]) << " |";
    md << "\n";
  };
  row("SHS-Index", 4, 1.0, [](const ShsSummary& x) { return x.shs_index; });
  row("FG-dominant heads (%)", 1, 100.0, [](const ShsSummary& x) { return x.fg_dominant_share; });
  row("mean attention distance (patches)", 2, 1.0, [](const ShsSummary& x) { return x.distance_patches; });
  row("mean row entropy (nats)", 3, 1.0, [](const ShsSummary& x) { return x.entropy; });
  md << "\nPer layer SHS, trained:" << std::setprecision(3);
  for (double v : sums[0][0].per_layer) md << " " << v;
  md << "; random:";
  for (double v : sums[0][1].per_layer) md << " " << v;
  md << "\n\nPictures of the trained heads: `shs_trained/<image>/layerNN.png`"
     << (has_voc ? " and on the photos `shs_trained_voc/<image>/layerNN.png`" : "") << " (as above).\n";
  ctx.json["trained"] = runs;
}

void run_shs_parts(DemoContext& ctx) {
  run_shs_part(ctx);
  run_trained_section(ctx);
}

const DemoPart part{40, "shs", "SHS-Index on the VOC samples and of a trained checkpoint", run_shs_parts};

}  // namespace
}  // namespace ariadne::cli
