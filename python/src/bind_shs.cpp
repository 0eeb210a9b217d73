// Python bindings: the SHS-Index and its companion diagnostics (shs.hpp, mask.hpp).
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "ariadne/mask.hpp"
#include "ariadne/shs.hpp"
#include "bindings.hpp"
#include "convert.hpp"

namespace ariadne::py {

namespace {

using namespace nb::literals;
using F32In = nb::ndarray<const float, nb::c_contig, nb::device::cpu>;
using F64In1 = nb::ndarray<const double, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

std::vector<float> floats(const F32In& a) { return std::vector<float>(a.data(), a.data() + a.size()); }

// A LayerDiag from arrays (per-token values in spatial raster order), for statistics gathered
// outside ariadne (another attention implementation's received attention).
LayerDiag make_diag(const F32In& received, std::optional<F32In> received_no_sink, const F64In1& distance,
                    const F64In1& entropy) {
  ARIADNE_CHECK(received.ndim() == 2, "LayerDiag: received must be [heads, tokens], got rank ", received.ndim());
  LayerDiag d;
  d.heads = int(received.shape(0));
  d.tokens = int64_t(received.shape(1));
  d.received = floats(received);
  if (received_no_sink) {
    ARIADNE_CHECK(received_no_sink->size() == received.size(), "LayerDiag: received_no_sink has ",
                  received_no_sink->size(), " values, expected heads x tokens = ", received.size());
    d.received_no_sink = floats(*received_no_sink);
  }
  ARIADNE_CHECK(int(distance.shape(0)) == d.heads && int(entropy.shape(0)) == d.heads, "LayerDiag: distance has ",
                distance.shape(0), " and entropy ", entropy.shape(0), " values, expected one per head (", d.heads, ")");
  d.distance.assign(distance.data(), distance.data() + d.heads);
  d.entropy.assign(entropy.data(), entropy.data() + d.heads);
  return d;
}

ForegroundRule make_rule(std::optional<std::vector<int32_t>> fg, std::optional<std::vector<int32_t>> bg,
                         std::optional<std::vector<int32_t>> ignore) {
  ForegroundRule r;
  if (fg) r.foreground = std::move(*fg);
  if (bg) r.background = std::move(*bg);
  if (ignore) r.ignore = std::move(*ignore);
  return r;
}

}  // namespace

void bind_shs(nb::module_& m) {
  m.def(
      "read_label_map",
      [](const std::string& path) {
        LabelMap l = read_label_map(path);
        return to_numpy(l.ids, {size_t(l.height), size_t(l.width)});
      },
      "path"_a, "A segmentation mask file (PNG palette/gray or .npy) as int32 [height, width] ids.");

  m.def(
      "patch_fractions",
      [](const nb::ndarray<const int32_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>& ids, GridPair grid, int patch,
         std::optional<std::vector<int32_t>> fg, std::optional<std::vector<int32_t>> bg,
         std::optional<std::vector<int32_t>> ignore) {
        LabelMap l;
        l.height = int(ids.shape(0));
        l.width = int(ids.shape(1));
        l.ids.assign(ids.data(), ids.data() + ids.size());
        const PatchFractions f = patch_fractions(l, Grid{grid.first, grid.second}, patch, make_rule(fg, bg, ignore));
        const std::vector<size_t> shape{size_t(grid.first), size_t(grid.second)};
        return std::make_pair(to_numpy(f.fg, shape), to_numpy(f.bg, shape));
      },
      "ids"_a, "grid"_a, "patch"_a = 14, "foreground"_a = nb::none(), "background"_a = nb::none(),
      "ignore"_a = nb::none(),
      "(fg, bg) float32 [h, w]: foreground / background pixel shares of each patch after a nearest resize of\n"
      "the int32 [H, W] label map to the encoder's input (grid x patch). Rule: ids in `ignore` (default\n"
      "255 and crowd) are void; with `foreground` given only those ids are FG, else ids in `background`\n"
      "(default [0]) are BG and the rest FG.");

  m.def(
      "label_patches",
      [](const F32In& fg, const F32In& bg, double purity) {
        ARIADNE_CHECK(fg.ndim() == 2 && bg.ndim() == 2 && fg.shape(0) == bg.shape(0) && fg.shape(1) == bg.shape(1),
                      "label_patches: fg and bg must be [h, w] arrays of one shape");
        PatchFractions f;
        f.grid = Grid{int(fg.shape(0)), int(fg.shape(1))};
        f.fg = floats(fg);
        f.bg = floats(bg);
        return to_numpy(label_patches(f, purity), {fg.shape(0), fg.shape(1)});
      },
      "fg"_a, "bg"_a, "purity"_a = 1.0,
      "int8 [h, w]: 1 foreground, 0 background, -1 excluded (a patch is FG when fg >= purity and fg > 1/2,\n"
      "BG likewise; purity in [0.5, 1], 1 = only pure patches).");

  m.def("auroc", &auroc, "pos"_a, "neg"_a, "Mann-Whitney AUROC: P(pos > neg) + P(pos = neg) / 2.");

  nb::class_<LayerDiag>(m, "LayerDiag", "One layer of one image as the SHS diagnostics see it (spatial raster order).")
      .def("__init__",
           [](LayerDiag* self, const F32In& received, std::optional<F32In> received_no_sink, const F64In1& distance,
              const F64In1& entropy) {
             new (self) LayerDiag(make_diag(received, std::move(received_no_sink), distance, entropy));
           },
           "received"_a, "received_no_sink"_a = nb::none(), nb::kw_only(), "distance"_a, "entropy"_a,
           "From arrays: received float32 [heads, tokens] (column sums of the attention matrix), optionally\n"
           "the same without the sink; distance, entropy float64 [heads] (means over queries).")
      .def_ro("heads", &LayerDiag::heads)
      .def_ro("tokens", &LayerDiag::tokens)
      .def_prop_ro("received",
                   [](const LayerDiag& d) {
                     return view_numpy(d.received, nb::find(&d), {size_t(d.heads), size_t(d.tokens)});
                   },
                   "float32 [heads, tokens]: received attention per patch, spatial raster order.")
      .def_prop_ro("received_no_sink",
                   [](const LayerDiag& d) {
                     const size_t rows = d.received_no_sink.empty() ? 0 : size_t(d.heads);
                     return view_numpy(d.received_no_sink, nb::find(&d), {rows, size_t(d.tokens)});
                   },
                   "float32 [heads, tokens] without the sink; [0, tokens] on layers without one.")
      .def_prop_ro("distance", [](const LayerDiag& d) { return view_numpy(d.distance, nb::find(&d)); },
                   "float64 [heads]: mean attention distance in patches.")
      .def_prop_ro("entropy", [](const LayerDiag& d) { return view_numpy(d.entropy, nb::find(&d)); },
                   "float64 [heads]: mean row entropy (nats).");

  m.def(
      "diagnose_layer",
      [](const AnyIn& q, const AnyIn& k, const TokenOrder& order, const Pattern& pattern,
         std::optional<std::vector<int32_t>> cu_seqlens, const std::optional<nb::ndarray<const float, nb::ndim<1>,
                                                                                   nb::c_contig>>& sink,
         const std::string& sink_mode, float scale, const std::string& backend, bool bf16_bits) {
        LayerInput in;
        in.q = as_view(q, "q", bf16_bits);
        in.k = as_view(k, "k", bf16_bits);
        in.order = &order;
        in.pattern = pattern;
        in.pattern.blocks = BlockSparseView{};
        in.pattern.num_seqs = 1;
        in.pattern.cu_seqlens_q = in.pattern.cu_seqlens_k = nullptr;
        std::vector<int32_t> cu;
        if (cu_seqlens) {
          cu = std::move(*cu_seqlens);
          ARIADNE_CHECK(cu.size() >= 2, "cu_seqlens: has ", cu.size(), " entries, expected sequences + 1 >= 2");
          in.pattern = in.pattern.with_varlen(int32_t(cu.size() - 1), cu.data());
        }
        in.sink_mode = parse_sink_mode(sink_mode);
        if (sink) in.sink = as_view(*sink, "sink");
        ARIADNE_CHECK(in.sink_mode == SinkMode::none || sink.has_value(), "sink: sink_mode is '", sink_mode,
                      "' but no sink was given");
        in.scale = scale;
        const Backend b = parse_backend(backend);
        nb::gil_scoped_release unlocked;
        return diagnose_layer(in, b);
      },
      nb::sig("def diagnose_layer("
        "q: " ARIADNE_SIG_QKV ", "
        "k: " ARIADNE_SIG_QKV ", "
        "order: TokenOrder, "
        "pattern: Pattern, "
        "cu_seqlens: Sequence[int] | None = None, "
        "sink: " ARIADNE_SIG_F32_IN1 " | None = None, "
        "sink_mode: str = 'none', "
        "scale: float = 0.0, "
        "backend: str = 'auto', "
        "bf16_bits: bool = False"
        ") -> LayerDiag"),
      "q"_a.noconvert(), "k"_a.noconvert(), "order"_a, "pattern"_a, "cu_seqlens"_a = nb::none(), "sink"_a = nb::none(),
      "sink_mode"_a = "none", "scale"_a = 0.f, "backend"_a = "auto", "bf16_bits"_a = false,
      "Received attention, distance and entropy of one layer of one image: q, k [tokens, heads, dim] host\n"
      "arrays after RoPE in `order`'s sequence order; pattern (and cu_seqlens) as layer_pattern gives them.\n"
      "A layer with a sink runs twice (with and without it).");

  nb::class_<HeadScore>(m, "HeadScore", "One head of one layer of one image.")
      .def_ro("auroc", &HeadScore::auroc)
      .def_ro("folded", &HeadScore::folded, "max(auroc, 1 - auroc).")
      .def_ro("sink_fg", &HeadScore::sink_fg)
      .def_ro("sink_bg", &HeadScore::sink_bg)
      .def_ro("distance", &HeadScore::distance)
      .def_ro("entropy", &HeadScore::entropy);
  nb::class_<ImageScores>(m, "ImageScores", "Per-head scores of one image.")
      .def_ro("name", &ImageScores::name)
      .def_prop_ro("grid", [](const ImageScores& s) { return GridPair(s.grid.h, s.grid.w); })
      .def_ro("fg", &ImageScores::fg)
      .def_ro("bg", &ImageScores::bg)
      .def_ro("excluded", &ImageScores::excluded)
      .def_ro("scored", &ImageScores::scored, "False when the image has no FG or no BG patch.")
      .def_ro("heads", &ImageScores::heads, "[layers * heads] HeadScore, layer-major.");

  nb::class_<ShsAccumulator>(m, "ShsAccumulator", "The SHS-Index over images, layers and heads.")
      .def(nb::init<int, int, int>(), "layers"_a, "heads"_a, "patch"_a = 14)
      .def(
          "add",
          [](ShsAccumulator& acc, const std::string& name, GridPair grid,
             const nb::ndarray<const int8_t, nb::c_contig, nb::device::cpu>& labels,
             const std::vector<LayerDiag>& diags) {
            std::vector<int8_t> l(labels.data(), labels.data() + labels.size());
            return acc.add(name, Grid{grid.first, grid.second}, l, diags);
          },
          "name"_a, "grid"_a, "labels"_a, "diags"_a, nb::rv_policy::copy,
          "Adds one image: labels int8 [h, w] (label_patches), diags one LayerDiag per layer.")
      .def_prop_ro("images", &ShsAccumulator::images, nb::rv_policy::copy)
      .def(
          "summary",
          [](const ShsAccumulator& acc) {
            return nb::module_::import_("json").attr("loads")(shs_summary_json(acc.summary()).dump());
          },
          "The summary as a dict: shs_index, per_layer, per_head [layers][heads], fg_dominant_share,\n"
          "attention_distance, entropy, sink_allocation (when a layer has a sink), images_scored, ...");
}

}  // namespace ariadne::py
