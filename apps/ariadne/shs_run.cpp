// The SHS run shared by `ariadne shs` and the demo (shs_run.hpp).
#include "shs_run.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <ostream>

#include "ariadne/error.hpp"
#include "ariadne/file.hpp"
#include "ariadne/image.hpp"
#include "ariadne/mask.hpp"
#include "ariadne/npy.hpp"
#include "cli.hpp"

namespace ariadne::cli {

namespace fs = std::filesystem;

namespace {

std::string find_mask(const std::string& dir, const std::string& stem) {
  for (const char* ext : {".png", ".npy"}) {
    const fs::path p = fs::path(dir) / (stem + ext);
    if (fs::exists(p)) return p.string();
  }
  detail::fail("--masks ", dir, ": no mask for image '", stem, "' (expected ", stem, ".png or ", stem, ".npy)");
}

// A [heads, tokens, dim] dump as a [tokens, heads, dim] view (no copy: strides swap the axes).
TensorView dump_view(const NpyArray& a, const std::string& file, int64_t tokens) {
  ARIADNE_CHECK(a.shape.size() == 3, file, ": shape has ", a.shape.size(), " dimensions, expected [heads, tokens, dim]");
  ARIADNE_CHECK(a.shape[1] == tokens, file, ": shape[1] (tokens) is ", a.shape[1], ", but --grid has ", tokens,
                " patches");
  ARIADNE_CHECK(a.kind == 'f' && (a.itemsize == 4 || a.itemsize == 2), file, ": dtype ", a.descr,
                ", expected float32 ('<f4') or float16 ('<f2')");
  TensorView v;
  v.data = const_cast<uint8_t*>(a.data.data());
  v.dtype = a.itemsize == 4 ? DType::f32 : DType::f16;
  v.rank = 3;
  v.shape = {tokens, a.shape[0], a.shape[2], 0};
  v.stride = {a.shape[2], tokens * a.shape[2], 1, 0};
  return v;
}

// Up to k layer indices spread evenly over [0, n) (first and last included).
std::vector<int> spread(int n, int k) {
  std::vector<int> out;
  if (k >= n) {
    for (int i = 0; i < n; ++i) out.push_back(i);
    return out;
  }
  for (int i = 0; i < k; ++i) {
    const int l = k == 1 ? n - 1 : int(std::lround(double(i) * (n - 1) / (k - 1)));
    if (out.empty() || out.back() != l) out.push_back(l);
  }
  return out;
}

// A mask must cover its image pixel for pixel.
void check_size(const std::string& path, const Image& img, int64_t mask_w, int64_t mask_h) {
  ARIADNE_CHECK(mask_h == img.height && mask_w == img.width, path, ": image is ", img.width, "x", img.height,
                " but its mask is ", mask_w, "x", mask_h, " (width x height)");
}

// Images and masks are decoded here and again in the run: a second decode costs far less than
// encoding, and keeping every image would cost memory.
std::vector<ShsImageInput> check_images(const ShsJob& job, const CocoDataset& coco) {
  std::vector<ShsImageInput> out;
  std::map<std::string, std::string> by_stem;
  for (const std::string& path : job.images) {
    ShsImageInput in;
    in.path = path;
    in.stem = fs::path(path).stem().string();
    if (const auto [it, fresh] = by_stem.emplace(in.stem, path); !fresh)
      detail::fail("shs: images ", it->second, " and ", path, " have the same stem '", in.stem,
                   "' (masks, dumps and outputs are found by stem)");
    const Image img = read_image(path);
    if (!job.masks_dir.empty()) {
      in.mask_file = find_mask(job.masks_dir, in.stem);
      const LabelMap mask = read_label_map(in.mask_file);
      check_size(path, img, mask.width, mask.height);
    } else {
      const CocoImage* entry = coco.find_image(path);
      ARIADNE_CHECK(entry != nullptr, job.coco_file, ": no entry in 'images' for ", path,
                    " (by file name, base name or stem '", in.stem, "')");
      in.coco_entry = entry - coco.images.data();
      check_size(path, img, entry->width, entry->height);
    }
    if (!job.qk_dir.empty()) {
      fs::path dir = fs::path(job.qk_dir) / in.stem;
      if (!with_path_errors(dir.string(), "read", [&] { return fs::is_directory(dir); })) {
        ARIADNE_CHECK(job.images.size() == 1, "--qk ", job.qk_dir, ": no folder '", in.stem,
                      "' (with several images each needs qk_dir/<stem>/q_<layer>.npy ...)");
        dir = job.qk_dir;
      }
      for (const char* f : {"q_0.npy", "k_0.npy"})
        ARIADNE_CHECK(with_path_errors(dir.string(), "read", [&] { return fs::exists(dir / f); }), dir.string(),
                      ": no ", f, " (expected q_<layer>.npy and k_<layer>.npy from layer 0)");
      in.qk_dir = dir.string();
    }
    out.push_back(std::move(in));
  }
  return out;
}

void finish_summary(const ShsJob& job, const nlohmann::json& images, ShsRunResult& res) {
  const bool from_encoder = job.weights != nullptr;
  res.json = shs_summary_json(res.summary);
  res.json["purity"] = job.purity;
  res.json["images"] = images;
  res.json["masks"] = job.masks_dir.empty() ? nlohmann::json{{"coco", job.coco_file}}
                                            : nlohmann::json{{"dir", job.masks_dir}};
  // Stated at the top level too, so that no reader of the JSON can miss untrained weights.
  res.json["random_weights"] = from_encoder && job.weights->random;
  if (from_encoder) {
    const VitWeights& w = *job.weights;
    res.json["source"] = {{"kind", "encoder"},
                          {"weights", w.source},
                          {"random_weights", w.random},
                          {"seed", w.random ? nlohmann::json(w.seed) : nlohmann::json()},
                          {"config", w.config.describe()}};
    res.json["schedule"] = {{"name", job.schedule.name}, {"letters", job.schedule.letters()}};
  } else {
    res.json["source"] = {{"kind", "qk"}, {"dir", job.qk_dir}, {"order", order_name(job.order)}, {"random_weights", false}};
    res.json["schedule"] = job.schedule.layers.empty()
                               ? nlohmann::json{{"name", "full (no --schedule)"}}
                               : nlohmann::json{{"name", job.schedule.name}, {"letters", job.schedule.letters()}};
  }
  if (!job.out_dir.empty()) {
    res.json["files"] = res.files;
    const std::string text = res.json.dump(2) + "\n";
    write_file_atomic((fs::path(job.out_dir) / "summary.json").string(), text.data(), text.size());
  }
}

// Scores one image (or one temporal patch of a clip): its patch labels and per-layer diagnostics
// join the accumulator, and with an output folder its received attention, labels and heatmaps
// (over `img`) are written under <stem>/.
struct ImageScorer {
  const ShsJob& job;
  int patch;
  std::ostream* log;
  ShsRunResult& res;
  std::unique_ptr<ShsAccumulator> acc;
  nlohmann::json images = nlohmann::json::array();

  void operator()(const std::string& stem, const std::string& path, const Image& img, Grid grid,
                  const std::vector<int8_t>& labels, const std::vector<LayerDiag>& diags) {
    const int layers = int(diags.size()), heads = diags[0].heads;
    if (!acc) acc = std::make_unique<ShsAccumulator>(layers, heads, patch);
    const ImageScores& sc = acc->add(stem, grid, labels, diags);

    nlohmann::json rec = {{"image", path},         {"grid", {grid.h, grid.w}},   {"fg_patches", sc.fg},
                          {"bg_patches", sc.bg},   {"excluded", sc.excluded},    {"scored", sc.scored}};
    if (sc.scored) {
      double sum = 0;
      for (const HeadScore& h : sc.heads) sum += h.folded;
      rec["shs"] = sum / double(sc.heads.size());
    }
    if (!job.out_dir.empty()) {
      const fs::path d = fs::path(job.out_dir) / stem;
      prepare_output_dir(d.string());
      std::vector<float> all;
      for (const LayerDiag& ld : diags) all.insert(all.end(), ld.received.begin(), ld.received.end());
      write_npy((d / "received.npy").string(), all.data(), {layers, heads, grid.tokens()});
      res.files.push_back(stem + "/received.npy");
      // With sinks: the same logits without the sink term (layers without a sink repeat `received`).
      if (std::any_of(diags.begin(), diags.end(), [](const LayerDiag& ld) { return !ld.received_no_sink.empty(); })) {
        all.clear();
        for (const LayerDiag& ld : diags) {
          const std::vector<float>& r = ld.received_no_sink.empty() ? ld.received : ld.received_no_sink;
          all.insert(all.end(), r.begin(), r.end());
        }
        write_npy((d / "received_no_sink.npy").string(), all.data(), {layers, heads, grid.tokens()});
        res.files.push_back(stem + "/received_no_sink.npy");
      }
      // Labels get twice the heatmap cell: one picture, not a grid of 16, so it can be larger.
      write_png((d / "labels.png").string(), label_picture(img, labels, grid, 2 * job.cell));
      res.files.push_back(stem + "/labels.png");
      for (int l : spread(layers, job.max_heatmap_layers)) {
        char name[32];
        std::snprintf(name, sizeof name, "layer%02d.png", l);
        const int cols = int(std::ceil(std::sqrt(double(heads))));
        write_png((d / name).string(),
                  heatmap_grid(img, diags[size_t(l)].received.data(), heads, grid, job.cell, cols));
        res.files.push_back(stem + "/" + name);
      }
      rec["dir"] = stem;
    }
    images.push_back(rec);
    if (log)
      *log << "shs: " << stem << ": grid " << grid.h << "x" << grid.w << ", " << sc.fg << " FG / " << sc.bg << " BG / "
           << sc.excluded << " excluded patches" << (sc.scored ? "" : " (not scored: needs FG and BG)") << "\n";
  }
};

void run_images(const ShsJob& job, const ShsInputs& inputs, int patch, std::ostream* log, ShsRunResult& res) {
  const bool from_encoder = job.weights != nullptr;
  ImageScorer score{job, patch, log, res, nullptr, {}};
  for (const ShsImageInput& input : inputs.images) {
    const std::string& path = input.path;
    const std::string& stem = input.stem;
    const Image img = read_image(path);
    const LabelMap mask = input.coco_entry >= 0 ? coco_label_map(inputs.coco, inputs.coco.images[size_t(input.coco_entry)])
                                                : read_label_map(input.mask_file);
    check_size(path, img, mask.width, mask.height);

    std::vector<LayerDiag> diags;
    Grid grid;
    if (from_encoder) {
      const PixelBatch px = preprocess({img}, job.weights->config, job.preprocess);
      grid = px.grids[0];
      EncodeOptions opt = job.encode;
      opt.on_attention = [&](int layer, const AttentionParams& p, const TokenOrder& order) {
        // Host copies in the layer's order: a CUDA encoder hands over device views.
        const ObservedLayer o = observed_layer(p, order, job.schedule.layers.at(size_t(layer)));
        diags.push_back(diagnose_layer(o.input, job.diag_backend));
      };
      encode(*job.weights, px.values, px.grids, job.schedule, opt);
    } else {
      grid = job.grid;
      const TokenOrder order = make_order(job.order, {grid}, job.merge, job.window_units);
      const fs::path dir = input.qk_dir;
      for (int l = 0;; ++l) {
        const fs::path qf = dir / ("q_" + std::to_string(l) + ".npy"), kf = dir / ("k_" + std::to_string(l) + ".npy"),
                       sf = dir / ("sink_" + std::to_string(l) + ".npy");
        if (!fs::exists(qf)) break;
        ARIADNE_CHECK(fs::exists(kf), qf.string(), " has no matching ", kf.string());
        const NpyArray q = read_npy(qf.string()), k = read_npy(kf.string());
        LayerInput in;
        in.q = dump_view(q, qf.string(), grid.tokens());
        in.k = dump_view(k, kf.string(), grid.tokens());
        in.order = &order;
        if (!job.schedule.layers.empty()) {
          ARIADNE_CHECK(l < int(job.schedule.layers.size()), dir.string(), ": dump of layer ", l, " but schedule '",
                        job.schedule.name, "' has ", job.schedule.layers.size(), " layers");
          const LayerSpec& spec = job.schedule.layers[size_t(l)];
          ARIADNE_CHECK(spec.kind == LayerKind::full || spec.order == job.order, "schedule layer ", l, " (",
                        spec.letter, ") runs in order ", order_name(spec.order), ", but the dumps are in --order ",
                        order_name(job.order));
          in.pattern = layer_pattern(spec, order);
        } else {
          in.pattern = Pattern::full();
        }
        NpyArray sink;
        std::vector<float> sink_values;
        if (fs::exists(sf)) {
          sink = read_npy(sf.string());
          ARIADNE_CHECK(sink.shape.size() == 1 && sink.shape[0] == q.shape[0], sf.string(), ": shape must be [heads] = [",
                        q.shape[0], "]");
          sink_values = sink.to_float();
          in.sink_mode = job.sink_mode;
          in.sink = make_view(sink_values.data(), DType::f32, {q.shape[0]});
        }
        diags.push_back(diagnose_layer(in, job.diag_backend));
      }
      ARIADNE_CHECK(!diags.empty(), dir.string(), ": no q_0.npy (expected q_<layer>.npy and k_<layer>.npy from layer 0)");
      ARIADNE_CHECK(job.schedule.layers.empty() || diags.size() == job.schedule.layers.size(), dir.string(), ": ",
                    diags.size(), " layers of dumps, schedule '", job.schedule.name, "' has ",
                    job.schedule.layers.size());
    }

    score(stem, path, img, grid, label_patches(patch_fractions(mask, grid, patch, job.rule), job.purity), diags);
  }
  res.summary = score.acc->summary();
  finish_summary(job, score.images, res);
}

// One clip: the images are its frames in time order. The encoder sees it as video (temporal
// patches of `temporal` frames, block-diagonal over time), so each temporal patch is scored as an
// image of its own; its patch labels come from the mean FG / BG shares over its frames (a patch
// that moves between the two frames is mixed, and the purity rule excludes it), and its heatmaps
// are drawn over its first frame.
void run_video(const ShsJob& job, const ShsInputs& inputs, int patch, std::ostream* log, ShsRunResult& res) {
  const VitConfig& cfg = job.weights->config;
  std::vector<Image> frames;
  std::vector<LabelMap> masks;
  for (const ShsImageInput& input : inputs.images) {
    frames.push_back(read_image(input.path));
    masks.push_back(input.coco_entry >= 0 ? coco_label_map(inputs.coco, inputs.coco.images[size_t(input.coco_entry)])
                                          : read_label_map(input.mask_file));
    check_size(input.path, frames.back(), masks.back().width, masks.back().height);
  }
  const PixelBatch px = preprocess_video(frames, cfg, job.preprocess);
  const int parts = int(px.grids.size());
  std::vector<std::vector<LayerDiag>> diags(static_cast<size_t>(parts));
  EncodeOptions opt = job.encode;
  opt.on_attention = [&](int layer, const AttentionParams& p, const TokenOrder& order) {
    const LayerSpec& spec = job.schedule.layers.at(size_t(layer));
    const ObservedLayer o = observed_layer(p, order, spec);
    std::vector<LayerDiag> per = diagnose_images(o.input, spec, job.diag_backend);
    for (int i = 0; i < parts; ++i) diags[size_t(i)].push_back(std::move(per[size_t(i)]));
  };
  encode(*job.weights, px.values, px.grids, job.schedule, opt);
  ImageScorer score{job, patch, log, res, nullptr, {}};
  const int T = cfg.temporal, n = int(frames.size());
  for (int i = 0; i < parts; ++i) {
    const Grid grid = px.grids[size_t(i)];
    PatchFractions f;
    std::string stem;
    int count = 0;
    for (int t = i * T; t < std::min((i + 1) * T, n); ++t, ++count) {
      const PatchFractions ft = patch_fractions(masks[size_t(t)], grid, patch, job.rule);
      if (count == 0) {
        f = ft;
      } else {
        for (size_t k = 0; k < f.fg.size(); ++k) f.fg[k] += ft.fg[k], f.bg[k] += ft.bg[k];
      }
      stem += (count ? "+" : "") + inputs.images[size_t(t)].stem;
    }
    for (size_t k = 0; k < f.fg.size(); ++k) f.fg[k] /= float(count), f.bg[k] /= float(count);
    score(stem, inputs.images[size_t(i * T)].path, frames[size_t(i * T)], grid, label_patches(f, job.purity),
          diags[size_t(i)]);
  }
  res.summary = score.acc->summary();
  finish_summary(job, score.images, res);
}

}  // namespace

ShsInputs check_shs_inputs(const ShsJob& job) {
  ARIADNE_CHECK(!job.images.empty(), "shs: no image given");
  ARIADNE_CHECK(job.masks_dir.empty() != job.coco_file.empty(), "shs: give exactly one of --masks DIR and --coco FILE");
  ShsInputs in;
  if (!job.coco_file.empty()) in.coco = read_coco(job.coco_file);
  in.images = check_images(job, in.coco);
  return in;
}

ShsRunResult run_shs(const ShsJob& job, const ShsInputs& inputs, std::ostream* log) {
  const bool from_encoder = job.weights != nullptr;
  ARIADNE_CHECK(from_encoder != !job.qk_dir.empty(),
                "shs: give exactly one attention source: the encoder (--weights / --schedule) or --qk DIR");
  ARIADNE_CHECK(inputs.images.size() == job.images.size(), "shs: the checked inputs are not this job's");
  const int patch = from_encoder ? job.weights->config.patch : 14;
  if (!job.out_dir.empty()) prepare_output_dir(job.out_dir);
  ShsRunResult res;
  ARIADNE_CHECK(!job.video || from_encoder, "shs: a video clip needs the encoder source, not --qk dumps");
  try {
    if (job.video)
      run_video(job, inputs, patch, log, res);
    else
      run_images(job, inputs, patch, log, res);
  } catch (...) {
    std::vector<std::string> written;
    for (const std::string& f : res.files) written.push_back((fs::path(job.out_dir) / f).string());
    rethrow_naming_outputs(written);
  }
  return res;
}

ShsRunResult run_shs(const ShsJob& job, std::ostream* log) { return run_shs(job, check_shs_inputs(job), log); }

}  // namespace ariadne::cli
