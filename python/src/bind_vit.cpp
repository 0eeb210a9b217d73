// Python bindings: the Qwen2.5-VL-compatible vision encoder (vit.hpp) and the image reader it
// uses (image.hpp): configuration, preprocessing, weights, schedules and the forward pass.
//
// The encoder's C++ API takes its pixel rows as a std::vector<float>, so encode() copies the given
// array once into one (pixels are small next to the activations the encoder makes). Outputs are
// handed over without a copy: the result's arrays are read-only numpy views of vectors the result
// object owns.
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "ariadne/error.hpp"
#include "ariadne/image.hpp"
#include "ariadne/vit.hpp"
#include "bindings.hpp"
#include "convert.hpp"

namespace ariadne::py {

namespace {

using namespace nb::literals;
// An 8-bit image [height, width, channels], interleaved, row-major (numpy's natural layout).
using ImageIn = nb::ndarray<const uint8_t, nb::ndim<3>, nb::c_contig, nb::device::cpu>;
// Pixel rows [tokens, patch_dim], float32, on the host.
using PixelsIn = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

Image image_of(const ImageIn& a, const char* name) {
  ARIADNE_CHECK(a.shape(0) > 0 && a.shape(1) > 0 && a.shape(2) > 0, name, ": image shape [", a.shape(0), ", ",
                a.shape(1), ", ", a.shape(2), "] has an empty side, expected [height, width, channels]");
  Image im;
  im.height = int(a.shape(0));
  im.width = int(a.shape(1));
  im.channels = int(a.shape(2));
  im.pixels.assign(a.data(), a.data() + a.size());
  return im;
}

nb::ndarray<nb::numpy, uint8_t> image_array(Image&& im) {
  return take_numpy(std::move(im.pixels), {size_t(im.height), size_t(im.width), size_t(im.channels)});
}

nb::dict times_dict(const EncodeTimes& t) {
  nb::dict d;
  d["patch_embed"] = t.patch_embed;
  d["rope"] = t.rope;
  d["norm"] = t.norm;
  d["qkv"] = t.qkv;
  d["attention"] = t.attention;
  d["proj"] = t.proj;
  d["mlp"] = t.mlp;
  d["permute"] = t.permute;
  d["merger"] = t.merger;
  d["total"] = t.total;
  return d;
}

const VitLayerWeights& layer_of(const VitWeights& w, int layer) {
  ARIADNE_CHECK(layer >= 0 && size_t(layer) < w.layers.size(), "VitWeights: layer ", layer, " is outside 0..",
                int(w.layers.size()) - 1);
  return w.layers[size_t(layer)];
}

}  // namespace

void bind_vit(nb::module_& m) {
  // ---- images ----
  m.def(
      "read_image",
      [](const std::string& path) {
        Image im;
        {
          nb::gil_scoped_release unlocked;
          im = read_image(path);
        }
        return image_array(std::move(im));
      },
      "path"_a, "A PNG or JPEG file decoded to RGB: uint8 [height, width, 3].");
  m.def(
      "decode_image",
      [](const nb::bytes& data, const std::string& name) {
        return image_array(decode_image(static_cast<const uint8_t*>(data.data()), data.size(), name));
      },
      "data"_a, "name"_a = "<bytes>", "PNG or JPEG bytes decoded to RGB: uint8 [height, width, 3].");
  m.def(
      "resize_bicubic",
      [](const ImageIn& image, int width, int height) {
        const Image src = image_of(image, "image");
        Image dst;
        {
          nb::gil_scoped_release unlocked;
          dst = resize_bicubic(src, width, height);
        }
        return image_array(std::move(dst));
      },
      "image"_a, "width"_a, "height"_a,
      "PIL-exact bicubic resize (Image.resize(BICUBIC)) of a uint8 [height, width, channels] image.");
  m.def("smart_resize", &smart_resize, "height"_a, "width"_a, "factor"_a = 28, "min_pixels"_a = 3136,
        "max_pixels"_a = 12845056,
        "(height, width) after HF's smart_resize: multiples of factor, pixel count in [min_pixels, max_pixels].");

  // ---- configuration ----
  nb::class_<VitConfig>(m, "VitConfig",
                        "Architecture of the vision encoder (vit.hpp). Sizes in a loaded checkpoint come from its\n"
                        "tensors; heads, window, full layers and theta from its 'vision_config' metadata.")
      .def(nb::init<>(), "The Qwen2.5-VL 3B tower.")
      .def_rw("depth", &VitConfig::depth)
      .def_rw("hidden", &VitConfig::hidden)
      .def_rw("heads", &VitConfig::heads)
      .def_rw("intermediate", &VitConfig::intermediate)
      .def_rw("out_hidden", &VitConfig::out_hidden)
      .def_rw("in_channels", &VitConfig::in_channels)
      .def_rw("patch", &VitConfig::patch, "Pixels per patch side.")
      .def_rw("temporal", &VitConfig::temporal, "Frames per temporal patch (a still image is repeated).")
      .def_rw("merge", &VitConfig::merge, "Merge-unit side in patches.")
      .def_rw("window_px", &VitConfig::window_px, "Qwen chunk window side in pixels.")
      .def_rw("full_layers", &VitConfig::full_layers, "Layers with full attention in Qwen's own layout.")
      .def_rw("rope_theta", &VitConfig::rope_theta)
      .def_rw("eps", &VitConfig::eps, "RMSNorm epsilon.")
      .def_prop_ro("head_dim", &VitConfig::head_dim)
      .def_prop_ro("patch_dim", &VitConfig::patch_dim, "Values per pixel row: in_channels * temporal * patch^2.")
      .def_prop_ro("window_units", &VitConfig::window_units, "Qwen window side in merge units.")
      .def_prop_ro("factor", &VitConfig::factor, "patch * merge: image sides are multiples of it.")
      .def("validate", &VitConfig::validate, "Raises ariadne.Error naming the first bad field.")
      .def("describe", &VitConfig::describe)
      .def_static("named", [](const std::string& name) { return VitConfig::named(name); }, "name"_a,
                  "'qwen2.5-vl' (3B), 'qwen2.5-vl-7b' or 'small' (the CI parity size).")
      .def("__repr__", [](const VitConfig& c) { return "VitConfig(" + c.describe() + ")"; });

  // ---- preprocessing ----
  nb::class_<PixelBatch>(m, "PixelBatch", "Pixel rows of a batch of images, as Qwen2.5-VL's image processor makes them.")
      .def_prop_ro("values",
                   [](const PixelBatch& b) {
                     return view_numpy(b.values, nb::find(&b), {size_t(b.tokens()), size_t(b.patch_dim)});
                   },
                   "float32 [tokens, patch_dim] (read-only): rows in block_row order, image after image; columns\n"
                   "ordered (channel, t, py, px).")
      .def_prop_ro("grids", [](const PixelBatch& b) { return to_pairs(b.grids); }, "[(h, w)] patch grid per image.")
      .def_ro("patch_dim", &PixelBatch::patch_dim)
      .def_prop_ro("tokens", &PixelBatch::tokens)
      .def("__len__", &PixelBatch::tokens)
      .def("__repr__", [](const PixelBatch& b) {
        return "PixelBatch(images=" + std::to_string(b.grids.size()) + ", tokens=" + std::to_string(b.tokens()) +
               ", patch_dim=" + std::to_string(b.patch_dim) + ")";
      });
  // preprocess() and preprocess_video() take the same arguments: RGB arrays and the options.
  const auto preprocessor = [&m](const char* name, const char* what, auto fn, const char* doc) {
    m.def(
        name,
        [fn, what](const std::vector<ImageIn>& images, const VitConfig& config, int64_t min_pixels, int64_t max_pixels,
                   const std::array<float, 3>& mean, const std::array<float, 3>& std) {
          std::vector<Image> ims;
          for (size_t i = 0; i < images.size(); ++i) ims.push_back(image_of(images[i], what));
          PreprocessOptions opt;
          opt.min_pixels = min_pixels;
          opt.max_pixels = max_pixels;
          opt.mean = mean;
          opt.std = std;
          nb::gil_scoped_release unlocked;
          return fn(ims, config, opt);
        },
        nb::arg(what), "config"_a, "min_pixels"_a = PreprocessOptions{}.min_pixels,
        "max_pixels"_a = PreprocessOptions{}.max_pixels, "mean"_a = PreprocessOptions{}.mean,
        "std"_a = PreprocessOptions{}.std, doc);
  };
  preprocessor("preprocess_images", "images",
               [](const std::vector<Image>& i, const VitConfig& c, const PreprocessOptions& o) {
                 return preprocess(i, c, o);
               },
               "smart_resize -> PIL-exact bicubic -> /255 -> (x - mean) / std -> patch rows, for RGB uint8 images\n"
               "[height, width, 3]. Bit-compatible with HF's PIL-backend Qwen2VLImageProcessor.");
  preprocessor("preprocess_video", "frames",
               [](const std::vector<Image>& f, const VitConfig& c, const PreprocessOptions& o) {
                 return preprocess_video(f, c, o);
               },
               "One clip's frames (RGB uint8 [height, width, 3], all one size, in time order) as video pixel rows:\n"
               "the size resized as an image's, the frame count padded to the temporal patch by repeating the\n"
               "last frame, one grid per temporal patch (HF's Qwen2VL video processor rules).");

  // ---- weights ----
  nb::class_<VitWeights>(m, "VitWeights", "Encoder weights (fp32 in memory; bf16/f16 checkpoints are widened).")
      .def_prop_ro("config", [](const VitWeights& w) { return w.config; }, "The architecture (a copy).")
      .def_ro("random", &VitWeights::random, "True when made by random_vit_weights, not read from a checkpoint.")
      .def_ro("seed", &VitWeights::seed)
      .def_ro("source", &VitWeights::source, "File names, or 'random(seed)'.")
      .def_ro("prefix", &VitWeights::prefix, "'visual.' or 'model.visual.'.")
      .def_ro("sink_init", &VitWeights::sink_init, "Value given to sinks absent from the file.")
      .def_prop_ro("depth", [](const VitWeights& w) { return w.layers.size(); })
      .def(
          "sinks",
          [](const VitWeights& w, int layer) {
            const VitLayerWeights& l = layer_of(w, layer);
            return view_numpy(l.sinks, nb::find(&w));
          },
          "layer"_a, "float32 [heads] (read-only): the sink logits of a layer.")
      .def(
          "sinks_from_file", [](const VitWeights& w, int layer) { return layer_of(w, layer).sinks_from_file; },
          "layer"_a, "Whether the layer's sinks were read from the checkpoint.")
      .def("__repr__", [](const VitWeights& w) {
        return "VitWeights(" + std::string(w.random ? "RANDOM " : "") + w.source + "; " + w.config.describe() + ")";
      });
  m.def(
      "load_vit_weights",
      [](const std::vector<std::string>& files, const VitConfig& defaults, float sink_init) {
        nb::gil_scoped_release unlocked;
        return load_vit_weights(files, defaults, sink_init);
      },
      "files"_a, "defaults"_a, "sink_init"_a = 0.f,
      "The tower from safetensors files (a sharded checkpoint: several). The prefix is detected; sizes come\n"
      "from the tensors, heads / window / full layers / theta from 'vision_config' metadata or `defaults`.\n"
      "Sinks absent from the files get sink_init. Errors name the file and the tensor.");
  m.def("random_vit_weights", &random_vit_weights, "config"_a, "seed"_a = 0, "sink_init"_a = 0.f,
        "Seeded random weights (PyTorch Linear's uniform initialization), reported as random everywhere.");
  m.def(
      "save_vit_weights",
      [](const std::string& path, const VitWeights& w, const std::string& dtype, const std::string& prefix,
         bool with_sinks) { save_vit_weights(path, w, parse_dtype(dtype), prefix, with_sinks); },
      "path"_a, "weights"_a, "dtype"_a = "f32", "prefix"_a = "visual.", "with_sinks"_a = false,
      "Writes the weights in the checkpoint layout ('vision_config' metadata included) as f32, bf16 or f16.");

  // ---- schedules and the forward pass ----
  m.def(
      "vit_schedule",
      [](const std::string& text, const VitConfig& config, int64_t window) { return vit_schedule(text, config, window); },
      "text"_a, "config"_a, "window"_a = 64,
      "The schedule for an encoder of config.depth layers: `text` as is when its length matches, else the\n"
      "uniform presets adapted to the model (local layers except config.full_layers, which are full).");

  nb::class_<LayerPlan>(m, "LayerPlan", "The attention one encoder layer runs (vit_layer_plan).")
      .def_prop_ro("order", [](const LayerPlan& l) { return std::string(order_name(l.order)); })
      .def_prop_ro("kind", [](const LayerPlan& l) { return std::string(layer_kind_name(l.kind)); })
      .def_ro("window", &LayerPlan::window)
      .def_ro("sink", &LayerPlan::sink)
      .def_prop_ro("cu_seqlens", [](const LayerPlan& l) { return view_numpy(l.cu, nb::find(&l)); },
                   "int32 [sequences + 1]: images (full / window layers) or Qwen windows (chunk layers).");
  m.def(
      "vit_layer_plan",
      [](const VitConfig& config, const std::vector<GridPair>& grids, const Schedule& schedule) {
        return vit_layer_plan(config, to_grids(grids), schedule);
      },
      "config"_a, "grids"_a, "schedule"_a, "Per layer of `schedule` on the images `grids`: order, kind, window, sink, cu.");

  nb::class_<EncodeResult>(m, "EncodeResult", "The encoder's output (arrays are read-only views owned by the result).")
      .def_prop_ro("out",
                   [](const EncodeResult& r) {
                     return view_numpy(r.out, nb::find(&r), {size_t(r.units), size_t(r.out_hidden)});
                   },
                   "float32 [units, out_hidden]: merged tokens in native (block_row) order, units = tokens / merge^2.")
      .def_prop_ro("hidden",
                   [](const EncodeResult& r) -> std::optional<nb::ndarray<nb::numpy, const float>> {
                     if (r.hidden.empty()) return std::nullopt;
                     const size_t width = r.hidden.size() / size_t(r.tokens);
                     return view_numpy(r.hidden, nb::find(&r), {size_t(r.tokens), width});
                   },
                   "float32 [tokens, hidden]: the last block's output in native order (keep_hidden=True), else None.")
      .def_ro("tokens", &EncodeResult::tokens)
      .def_ro("units", &EncodeResult::units)
      .def_ro("out_hidden", &EncodeResult::out_hidden)
      .def_ro("order_changes", &EncodeResult::order_changes, "Token re-permutations done.")
      .def_ro("attention_backend", &EncodeResult::attention_backend,
              "What ran the attention: 'cpu', 'reference', 'cpu+reference', ... as the library reports it.")
      .def_prop_ro("times", [](const EncodeResult& r) { return times_dict(r.times); },
                   "Milliseconds per stage, summed over layers: patch_embed, rope, norm, qkv, attention, proj, mlp,\n"
                   "permute, merger, total.")
      .def("__repr__", [](const EncodeResult& r) {
        return "EncodeResult(units=" + std::to_string(r.units) + ", out_hidden=" + std::to_string(r.out_hidden) +
               ", attention on " + r.attention_backend + ")";
      });
  m.def(
      "encode",
      [](const VitWeights& weights, const PixelsIn& pixels, const std::vector<GridPair>& grids,
         const Schedule& schedule, const std::string& backend, const std::string& sink_mode, bool keep_hidden) {
        const int64_t patch_dim = weights.config.patch_dim();
        ARIADNE_CHECK(int64_t(pixels.shape(1)) == patch_dim, "pixels: shape [", pixels.shape(0), ", ", pixels.shape(1),
                      "], expected [tokens, patch_dim = ", patch_dim, "]");
        EncodeOptions opt;
        // The library decides what each backend can run; this layer only names it.
        opt.attention = parse_backend(backend);
        opt.sink_mode = parse_sink_mode(sink_mode);
        std::vector<float> rows(pixels.data(), pixels.data() + pixels.size());
        const std::vector<Grid> g = to_grids(grids);
        nb::gil_scoped_release unlocked;
        return encode(weights, rows, g, schedule, opt, keep_hidden);
      },
      "weights"_a, "pixels"_a, "grids"_a, "schedule"_a, "backend"_a = "cpu", "sink_mode"_a = "denominator",
      "keep_hidden"_a = false,
      "The encoder on pixel rows float32 [tokens, patch_dim] (block_row order, image after image, matching\n"
      "grids [(h, w)]) with `schedule` (vit_schedule). backend: the encoder's backend, as `ariadne encode\n"
      "--backend` takes it ('cpu', 'reference', 'cuda'); sink_mode for sink layers: 'denominator' or 'key0'.");
}

}  // namespace ariadne::py
