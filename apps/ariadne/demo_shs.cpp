// Demo part: the SHS-Index on the PASCAL VOC photos of Debian's labelme-examples package (COCO
// polygons as masks), attention from the encoder with seeded RANDOM weights — the numbers show the
// pipeline working, not a property of a trained model, and the report says so.
#include <filesystem>
#include <iomanip>

#include "demo.hpp"
#include "shs_run.hpp"

namespace ariadne::cli {
namespace {

namespace fs = std::filesystem;

const char* kSamples = "/usr/share/doc/labelme-examples/examples/instance_segmentation/data_dataset_coco";

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

  ShsJob job;
  for (const char* stem : {"2011_000003", "2011_000006", "2011_000025"})
    job.images.push_back((root / "JPEGImages" / (std::string(stem) + ".jpg")).string());
  job.coco_file = (root / "annotations.json").string();
  job.weights = &weights;
  job.schedule = vit_schedule(letters, weights.config, 64);
  job.preprocess.max_pixels = 50176;
  job.encode.attention = Backend::cpu;  // falls back to the reference where the fast kernels lack a feature
  job.out_dir = (fs::path(ctx.out_dir) / "shs").string();
  job.cell = 6;
  job.max_heatmap_layers = ctx.quick ? 1 : 2;
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

const DemoPart part{40, "shs", "SHS-Index on the VOC samples", run_shs_part};

}  // namespace
}  // namespace ariadne::cli
