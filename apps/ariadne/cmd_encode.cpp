// `ariadne encode`: images, or one video clip, through the Qwen2.5-VL-compatible encoder with a
// chosen attention schedule; tokens, grids, output shape, time per stage and a checksum of the output.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>

#include "ariadne/error.hpp"
#include "ariadne/file.hpp"
#include "ariadne/safetensors.hpp"
#include "ariadne/vit.hpp"
#include "cli.hpp"

namespace {

using ariadne::cli::Args;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// FNV-1a over the output's float bits: equal only for bit-identical outputs (same backend, same
// threads); sum and mean |x| are there to compare across backends.
std::string fnv1a(const std::vector<float>& v) {
  uint64_t h = 1469598103934665603ull;
  for (float f : v) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    for (int i = 0; i < 4; ++i) {
      h ^= (u >> (8 * i)) & 0xffu;
      h *= 1099511628211ull;
    }
  }
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// --video: one folder (its .jpg/.jpeg/.png files in name order: frame numbers must sort) or a list
// of frame files in time order.
std::vector<std::string> video_frames(const Args& args) {
  namespace fs = std::filesystem;
  const std::vector<std::string> given = args.strs("video");
  std::vector<std::string> frames;
  ariadne::with_path_errors(given[0], "list the frames", [&] {
    if (given.size() == 1 && fs::is_directory(given[0])) {
      for (const auto& e : fs::directory_iterator(given[0])) {
        std::string ext = e.path().extension().string();
        std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char ch) { return char(std::tolower(ch)); });
        if (e.is_regular_file() && (ext == ".jpg" || ext == ".jpeg" || ext == ".png"))
          frames.push_back(e.path().string());
      }
      std::sort(frames.begin(), frames.end());
      if (frames.empty()) args.fail("video", given[0] + ": no .jpg, .jpeg or .png frame in the folder");
    } else {
      for (const std::string& f : given)
        if (fs::is_directory(f)) args.fail("video", f + " is a folder: give one folder, or a list of frame files");
      frames = given;
    }
  });
  return frames;
}

int run_encode(const Args& args) {
  // Either images (a batch of stills) or one clip (--video); a clip's frames are `files` too.
  if (args.given("image") == args.given("video")) args.fail("image", "give either --image or --video (one of them)");
  const bool video = args.given("video");
  const std::vector<std::string> files = video ? video_frames(args) : args.strs("image");
  const std::vector<std::string> weight_files = args.strs("weights");
  // Several schedules and orders (comma lists) run one after another on the same loaded weights and
  // pixels; the JSON is then {"runs": [one object per run]} and --save-output is a prefix.
  const std::vector<std::string> schedule_names = args.strs("schedule");
  const std::string backend_name = args.str("backend");
  const ariadne::Backend backend = ariadne::parse_backend(backend_name);
  const ariadne::VitConfig preset = ariadne::VitConfig::named(args.str("config"));
  const uint64_t seed = uint64_t(args.i64("seed"));
  const int64_t window = args.i64("window");
  const double sink_init = args.real("sink-init");
  ariadne::EncodeOptions base_opt;
  base_opt.attention = backend;
  base_opt.sink_mode = ariadne::parse_sink_mode(args.str("sink"));
  ariadne::PreprocessOptions pre;
  pre.min_pixels = args.i64("min-pixels");
  pre.max_pixels = args.i64("max-pixels");
  if (pre.min_pixels > pre.max_pixels) args.fail("min-pixels", "exceeds --max-pixels");
  const int64_t repeat = args.i64("repeat");
  const std::vector<std::string> cuda_orders = args.strs("cuda-order");
  const std::string save = args.str("save-output");
  const std::string save_pixels = args.str("save-pixels");
  // CUDA: --stage-times no records no event between stages (the total alone, without their overhead).
  base_opt.cuda_stage_times = args.flag("stage-times");
  const bool json = args.json();
  const bool several = schedule_names.size() * cuda_orders.size() > 1;
  // Every schedule is checked against the configuration now, before weights are loaded or any
  // image is decoded (a bad second schedule must not cost the first run, nor leave its outputs),
  // and so is every output file it will write.
  auto output_file = [&](const std::string& schedule_name, const std::string& cuda_order) {
    return several ? save + schedule_name + "_" + cuda_order + ".safetensors" : save;
  };
  // A checkpoint's own sizes (read from its headers) decide, so that a trained tower of another
  // depth than the preset's takes schedules of its own length.
  ariadne::VitConfig checked = preset;
  if (!weight_files.empty()) {
    try {
      checked = ariadne::read_vit_config(weight_files, preset);
    } catch (const ariadne::Error& e) {
      args.fail("weights", e.what());
    }
  }
  for (const std::string& name : schedule_names) {
    std::string resolved;
    try {
      resolved = ariadne::vit_schedule(name, checked, window).name;
    } catch (const ariadne::Error& e) {
      args.fail("schedule", e.what());
    }
    if (!save.empty())
      for (const std::string& order : cuda_orders) {
        try {
          ariadne::check_output_file(output_file(resolved, order));
        } catch (const ariadne::Error& e) {
          args.fail("save-output", e.what());
        }
      }
  }
  if (!save_pixels.empty()) {
    try {
      ariadne::check_output_file(save_pixels);
    } catch (const ariadne::Error& e) {
      args.fail("save-pixels", e.what());
    }
  }
  ariadne::cli::require_cuda_if_asked(args, "backend");
  if (args.given("threads")) ariadne::set_cpu_threads(args.i32("threads"));

  // Images are decoded before the weights are loaded: a bad image fails in milliseconds.
  auto t0 = Clock::now();
  std::vector<ariadne::Image> images;
  for (const auto& f : files) images.push_back(ariadne::read_image(f));
  for (size_t i = 1; video && i < images.size(); ++i)  // one clip has one frame size
    if (images[i].width != images[0].width || images[i].height != images[0].height)
      args.fail("video", files[i] + " is " + std::to_string(images[i].width) + "x" + std::to_string(images[i].height) +
                             ", expected the size of the first frame " + files[0] + " (" +
                             std::to_string(images[0].width) + "x" + std::to_string(images[0].height) + ")");
  const double t_decode = ms_since(t0);

  t0 = Clock::now();
  const ariadne::VitWeights w = weight_files.empty()
                                    ? ariadne::random_vit_weights(preset, seed, float(sink_init))
                                    : ariadne::load_vit_weights(weight_files, preset, float(sink_init));
  const double t_weights = ms_since(t0);
  t0 = Clock::now();
  const ariadne::PixelBatch px =
      video ? ariadne::preprocess_video(images, w.config, pre) : ariadne::preprocess(images, w.config, pre);
  const double t_pre = ms_since(t0);
  std::vector<std::string> written;  // named by the error of a run that fails after them
  if (!save_pixels.empty()) {  // the encoder's input rows and grids (HF's pixel_values / image_grid_thw layout)
    std::vector<float> thw;  // f32: the writer's dtypes are the float ones; one row per input
    for (size_t i = 0, first = 0; i < px.grid_t.size(); first += size_t(px.grid_t[i]), ++i)
      thw.insert(thw.end(), {float(px.grid_t[i]), float(px.grids[first].h), float(px.grids[first].w)});
    ariadne::write_safetensors(
        save_pixels,
        {{"pixel_values", ariadne::DType::f32, {px.tokens(), px.patch_dim}, px.values.data()},
         {"grid_thw", ariadne::DType::f32, {int64_t(px.grid_t.size()), 3}, thw.data()}},
        {});
    written.push_back(save_pixels);
  }
  auto run_one = [&](const std::string& schedule_name, const std::string& cuda_order) -> nlohmann::json {
    const ariadne::Schedule schedule = ariadne::vit_schedule(schedule_name, w.config, window);
    ariadne::EncodeOptions opt = base_opt;
    opt.cuda_fused_order = cuda_order == "fused";
    // With --repeat, the run with the smallest total is reported (the first one warms caches).
    ariadne::EncodeResult r = ariadne::encode(w, px.values, px.grids, schedule, opt);
    std::vector<double> totals{r.times.total};
    for (int64_t i = 1; i < repeat; ++i) {
      ariadne::EncodeResult again = ariadne::encode(w, px.values, px.grids, schedule, opt);
      totals.push_back(again.times.total);
      if (again.times.total < r.times.total) r = std::move(again);
    }
    if (!save.empty()) {  // [units, out_hidden] f32 in native order, for comparisons outside
      ariadne::write_safetensors(output_file(schedule.name, cuda_order),
                                 {{"output", ariadne::DType::f32, {r.units, r.out_hidden}, r.out.data()}},
                                 {{"schedule", schedule.name}, {"weights", w.source}});
      written.push_back(output_file(schedule.name, cuda_order));
    }

    double sum = 0, abs_sum = 0;
    for (float v : r.out) {
      sum += v;
      abs_sum += std::fabs(v);
    }
    int sinks_from_file = 0, sink_layers = 0;
    for (size_t l = 0; l < schedule.layers.size(); ++l) {
      sink_layers += schedule.layers[l].sink;
      sinks_from_file += schedule.layers[l].sink && w.layers[l].sinks_from_file;
    }
    const std::string sinks =
        sink_layers == 0                ? "unused"
        : sinks_from_file == sink_layers ? "from file"
                                         : "initialized to " + std::to_string(w.sink_init) + " on " +
                                               std::to_string(sink_layers - sinks_from_file) + " layers";
    const auto& t = r.times;
    if (json) {
      nlohmann::json imgs = nlohmann::json::array();
      nlohmann::json clip;
      if (video) {
        const ariadne::Grid& g = px.grids[0];
        clip = {{"frames", files},
                {"frames_padded", px.grid_t[0] * w.config.temporal},
                {"size", {images[0].height, images[0].width}},
                {"resized", {g.h * w.config.patch, g.w * w.config.patch}},
                {"grid_thw", {px.grid_t[0], g.h, g.w}}};
      } else {
        for (size_t i = 0; i < images.size(); ++i)
          imgs.push_back({{"file", files[i]},
                          {"size", {images[i].height, images[i].width}},
                          {"resized", {px.grids[i].h * w.config.patch, px.grids[i].w * w.config.patch}},
                          {"grid", {px.grids[i].h, px.grids[i].w}}});
      }
      const auto& c = w.config;
      return nlohmann::json(
          {{video ? "video" : "images", video ? clip : imgs},
           {"tokens", r.tokens},
           {"units", r.units},
           {"output_shape", {r.units, r.out_hidden}},
           {"schedule", schedule.name},
           {"layers", schedule.letters()},
           {"order_changes", r.order_changes},
           {"backend", backend_name},
           {"cuda_order", cuda_order},  // as asked; only the CUDA backend reads it
           {"attention_backend", r.attention_backend},
           {"weights", {{"random", w.random},
                        {"source", w.source},
                        {"seed", w.random ? nlohmann::json(w.seed) : nlohmann::json()},
                        {"prefix", w.prefix},
                        {"sinks", sinks}}},
           {"config", {{"depth", c.depth}, {"hidden", c.hidden}, {"heads", c.heads}, {"intermediate", c.intermediate},
                       {"out_hidden", c.out_hidden}, {"patch", c.patch}, {"merge", c.merge},
                       {"window_px", c.window_px}, {"full_layers", c.full_layers}}},
           {"times_ms", {{"load_weights", t_weights}, {"decode", t_decode}, {"preprocess", t_pre},
                         {"patch_embed", t.patch_embed}, {"rope", t.rope}, {"norm", t.norm}, {"qkv", t.qkv},
                         {"attention", t.attention}, {"proj", t.proj}, {"mlp", t.mlp}, {"permute", t.permute},
                         {"merger", t.merger}, {"encode_total", t.total},
                         {"upload", t.upload}, {"download", t.download}}},
           {"encode_totals_ms", totals},
           {"checksum", {{"sum", sum}, {"mean_abs", r.out.empty() ? 0.0 : abs_sum / double(r.out.size())},
                         {"fnv1a", fnv1a(r.out)}}}});
    }
    std::printf("%sweights: %s%s\n", several ? "\n" : "", w.random ? "RANDOM " : "", w.source.c_str());
    std::printf("config: %s\n", w.config.describe().c_str());
    if (video)
      std::printf("video: %zu frames (%d after padding to the temporal patch %d) of %dx%d -> %dx%d px, "
                  "grid_thw %dx%dx%d\n",
                  files.size(), px.grid_t[0] * w.config.temporal, w.config.temporal, images[0].width,
                  images[0].height, px.grids[0].w * w.config.patch, px.grids[0].h * w.config.patch, px.grid_t[0],
                  px.grids[0].h, px.grids[0].w);
    for (size_t i = 0; i < images.size() && !video; ++i)
      std::printf("image %s: %dx%d -> %dx%d px, grid %dx%d\n", files[i].c_str(), images[i].width, images[i].height,
                  px.grids[i].w * w.config.patch, px.grids[i].h * w.config.patch, px.grids[i].h, px.grids[i].w);
    std::printf("schedule %s (%s): %d order changes, attention on %s, sinks %s\n", schedule.name.c_str(),
                schedule.letters().c_str(), r.order_changes, r.attention_backend.c_str(), sinks.c_str());
    std::printf("tokens %lld, output [%lld, %d]\n", static_cast<long long>(r.tokens), static_cast<long long>(r.units),
                r.out_hidden);
    std::printf("time (ms): decode %.1f, preprocess %.1f, patch_embed %.1f, rope %.1f, norm %.1f, qkv %.1f, "
                "attention %.1f, proj %.1f, mlp %.1f, permute %.1f, merger %.1f; encode total %.1f\n",
                t_decode, t_pre, t.patch_embed, t.rope, t.norm, t.qkv, t.attention, t.proj, t.mlp, t.permute, t.merger,
                t.total);
    std::printf("checksum: sum %.6g, mean |x| %.6g, fnv1a %s\n", sum,
                r.out.empty() ? 0.0 : abs_sum / double(r.out.size()), fnv1a(r.out).c_str());
    return nlohmann::json();
  };
  nlohmann::json runs = nlohmann::json::array();
  try {
    for (const auto& name : schedule_names)
      for (const auto& order : cuda_orders) runs.push_back(run_one(name, order));
  } catch (...) {
    ariadne::cli::rethrow_naming_outputs(written);
  }
  if (json) ariadne::cli::print_json(several ? nlohmann::json{{"runs", runs}} : runs[0]);
  return 0;
}

using namespace ariadne::cli;
const Command reg{
    "encode", "images or a video clip through the vision encoder with an attention schedule",
    {path_list("image", PathKind::in_file, "PNG or JPEG images (several: a.png,b.jpg); or --video"),
     path_list("video", PathKind::in_any,
               "one clip: a folder of .jpg/.jpeg/.png frames (name order) or frame files in time order"),
     path_list("weights", PathKind::in_file, "safetensors checkpoint shards (absent: seeded random weights)"),
     text_list("schedule", "", "attention schedules: presets or short syntax (several run in turn)").needed(),
     choice("backend", "cpu", {"reference", "cpu", "cuda"}, "attention and model backend"),
     choice("config", "qwen2.5-vl", {"qwen2.5-vl", "small"}, "encoder configuration"),
     integer("seed", 0, 0, int64_t(1) << 62, "seed of random weights"),
     integer("window", 64, 1, 1 << 20, "window radius of window layers, in tokens"),
     real("sink-init", 0.0, Range::any(), "sink logit of sink layers without one in the checkpoint"),
     choice("sink", "denominator", {"denominator", "key0"}, "attention sink form of sink layers"),
     integer("min-pixels", ariadne::PreprocessOptions{}.min_pixels, 1, int64_t(1) << 30, "smallest resized image area"),
     integer("max-pixels", ariadne::PreprocessOptions{}.max_pixels, 1, int64_t(1) << 30, "largest resized image area"),
     threads_option(),
     integer("repeat", 1, 1, 10000, "encodes per run (the fastest is reported)"),
     choice_list("cuda-order", "fused", {"fused", "gather"}, "CUDA token order: fused in the kernel, or gathers"),
     path("save-output", PathKind::out_prefix, "write the output [units, out_hidden] f32 (several runs: a prefix)"),
     path("save-pixels", PathKind::out_file, "write the encoder's input rows and grids (safetensors)"),
     boolean("stage-times", true, "CUDA: time each stage (no: the total alone)")},
    run_encode};

}  // namespace
