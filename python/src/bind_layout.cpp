// Python bindings: token orders, layer schedules, the FLOP model and the receptive field.
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

#include "ariadne/flops.hpp"
#include "ariadne/order.hpp"
#include "ariadne/receptive_field.hpp"
#include "ariadne/schedule.hpp"
#include "bindings.hpp"
#include "convert.hpp"

namespace ariadne::py {

namespace {

using namespace nb::literals;

// A host pattern with its sequence arrays and block mask, for the cost model. Owns the arrays
// the Pattern points to.
struct HostPattern {
  std::vector<int32_t> cu_q, cu_k;
  Pattern p;
  HostPattern(const Pattern& dense, std::optional<std::vector<int32_t>> q, std::optional<std::vector<int32_t>> k,
              const BlockMask* blocks) {
    p = dense;
    p.num_seqs = 1;
    p.cu_seqlens_q = p.cu_seqlens_k = nullptr;
    p.blocks = BlockSparseView{};
    ARIADNE_CHECK(!k || q, "cu_seqlens_k: given without cu_seqlens_q");
    if (q) {
      cu_q = std::move(*q);
      ARIADNE_CHECK(cu_q.size() >= 2, "cu_seqlens_q: has ", cu_q.size(), " entries, expected sequences + 1 >= 2");
      if (k) {
        cu_k = std::move(*k);
        ARIADNE_CHECK(cu_k.size() == cu_q.size(), "cu_seqlens_k: has ", cu_k.size(), " entries, expected ",
                      cu_q.size());
      }
      p = p.with_varlen(int32_t(cu_q.size() - 1), cu_q.data(), cu_k.empty() ? nullptr : cu_k.data());
    }
    if (blocks) {
      ARIADNE_CHECK(!blocks->row_ptr.empty() && int64_t(blocks->col_idx.size()) == blocks->nnz(),
                    "blocks: row_ptr / col_idx sizes disagree");
      ARIADNE_CHECK(!q || blocks->seq_block_base.size() == cu_q.size(), "blocks: seq_block_base has ",
                    blocks->seq_block_base.size(), " entries, expected ", cu_q.size());
      p = p.with_blocks(blocks->view());
    }
  }
};

}  // namespace

void bind_layout(nb::module_& m) {
  // ---- token orders ----
  nb::class_<TokenOrder>(m, "TokenOrder",
                         "A serialization of packed image grids (order.hpp). Arrays are read-only numpy views.")
      .def_prop_ro("kind", [](const TokenOrder& o) { return std::string(order_name(o.kind)); },
                   "'raster', 'qwen_window', 'block_row' or 'block_col'.")
      .def_ro("merge", &TokenOrder::merge, "Merge-unit side in patches.")
      .def_ro("window", &TokenOrder::window, "qwen_window: window side in merge units.")
      .def_prop_ro("grids", [](const TokenOrder& o) { return to_pairs(o.grids); }, "[(h, w)] patch grid per image.")
      .def_prop_ro("perm", [](const TokenOrder& o) { return view_numpy(o.perm, nb::find(&o)); },
                   "int32 [total]: sequence position -> spatial index (cu_seqlens[i] + r * w + c).")
      .def_prop_ro("inverse", [](const TokenOrder& o) { return view_numpy(o.inverse, nb::find(&o)); },
                   "int32 [total]: spatial index -> sequence position.")
      .def_prop_ro("cu_seqlens", [](const TokenOrder& o) { return view_numpy(o.cu_seqlens, nb::find(&o)); },
                   "int32 [images + 1]: image boundaries (the same in every order).")
      .def_prop_ro("cu_windows", [](const TokenOrder& o) { return view_numpy(o.cu_windows, nb::find(&o)); },
                   "int32 [windows + 1]: Qwen window boundaries (qwen_window only; else empty).")
      .def_prop_ro("coords",
                   [](const TokenOrder& o) { return view_numpy(o.coords, nb::find(&o), {o.perm.size(), 2}); },
                   "float32 [total, 2]: (row, col) of each sequence position's patch.")
      .def_prop_ro("tokens", &TokenOrder::tokens)
      .def_prop_ro("images", &TokenOrder::images)
      .def("__len__", &TokenOrder::tokens)
      .def("__repr__", [](const TokenOrder& o) {
        return std::string("TokenOrder(") + order_name(o.kind) + ", images=" + std::to_string(o.images()) +
               ", tokens=" + std::to_string(o.tokens()) + ")";
      });

  m.def(
      "make_order",
      [](const std::string& kind, const std::vector<GridPair>& grids, int merge, int window) {
        return make_order(parse_order(kind), to_grids(grids), merge, window);
      },
      "kind"_a, "grids"_a, "merge"_a = 2, "window"_a = 4,
      "The token order `kind` of the packed images [(h, w), ...] (patch grids; sides multiples of merge).");
  m.def(
      "order_conversion",
      [](const TokenOrder& from, const TokenOrder& to) { return to_numpy(order_conversion(from, to)); }, "from_"_a,
      "to"_a, "int32 [total] gather index: x_to[i] = x_from[index[i]].");
  m.def(
      "permute_tokens",
      [](const AnyIn& src, const AnyOut& dst, const TokenOrder& from, const TokenOrder& to) {
        const TensorView s = as_view(src, "src"), d = as_view(dst, "dst");
        require_device(s, "src", Device::cpu);
        require_device(d, "dst", Device::cpu);
        nb::gil_scoped_release unlocked;
        permute_tokens(s, d, from, to);
      },
      nb::sig("def permute_tokens("
        "src: " ARIADNE_SIG_TOKENS_IN ", "
        "dst: " ARIADNE_SIG_TOKENS_OUT ", "
        "from_: TokenOrder, "
        "to: TokenOrder"
        ") -> None"),
      "src"_a.noconvert(), "dst"_a.noconvert(), "from_"_a, "to"_a,
      "Host arrays [total, ...] (float32/bfloat16/float16, strides free): dst = src reordered from `from_` to `to`.");

  // ---- schedules ----
  nb::class_<LayerSpec>(m, "LayerSpec", "One encoder layer: its token order, pattern kind, window and sink.")
      .def_prop_ro("order", [](const LayerSpec& l) { return std::string(order_name(l.order)); })
      .def_prop_ro("kind", [](const LayerSpec& l) { return std::string(layer_kind_name(l.kind)); },
                   "'full', 'window' or 'chunk'.")
      .def_ro("window", &LayerSpec::window, "Window layers: a query at p sees p - window ... p + window.")
      .def_ro("sink", &LayerSpec::sink, "Whether the layer has a per-head sink.")
      .def_prop_ro("letter", [](const LayerSpec& l) { return std::string(1, l.letter); })
      .def("__repr__", [](const LayerSpec& l) {
        return std::string("LayerSpec(") + l.letter + (l.sink ? "+" : "") + ", " + layer_kind_name(l.kind) + " on " +
               order_name(l.order) + (l.kind == LayerKind::window ? ", window=" + std::to_string(l.window) : "") +
               ")";
      });
  nb::class_<Schedule>(m, "Schedule", "Per-layer attention specs of a vision encoder (schedule.hpp).")
      .def_ro("name", &Schedule::name)
      .def_ro("layers", &Schedule::layers, "[LayerSpec] per layer (a copy).")
      .def("order_changes", &Schedule::order_changes, "Layers whose order differs from the previous layer's.")
      .def("letters", &Schedule::letters, "The schedule in the short syntax, one letter per layer.")
      .def("__len__", [](const Schedule& s) { return s.layers.size(); })
      .def("__repr__", [](const Schedule& s) { return "Schedule(" + s.name + ": " + s.letters() + ")"; });
  m.def(
      "schedule",
      [](const std::string& text, int64_t window) { return resolve_schedule(text, window); }, "text"_a,
      "window"_a = 64,
      "A preset ('ariadne', 'chunk', 'swa1d+sink', ...) or the short syntax ('4x(RRRRCCCF)'); window = SWA\n"
      "half-width of the window layers.");
  m.def("schedule_presets", &schedule_presets, "The preset names.");
  m.def(
      "layer_pattern",
      [](const LayerSpec& layer, const TokenOrder& order) {
        Pattern p = layer_pattern(layer, order);
        std::vector<int32_t> cu(p.cu_seqlens_q, p.cu_seqlens_q + p.num_seqs + 1);
        p.num_seqs = 1;
        p.cu_seqlens_q = p.cu_seqlens_k = nullptr;
        return std::make_pair(p, to_numpy(cu));
      },
      "layer"_a, "order"_a,
      "(pattern, cu_seqlens int32 [sequences + 1]) of a layer on tokens in `order`: images for full and window\n"
      "layers, Qwen windows for chunk layers. Pass both to attention().");

  // ---- cost model ----
  nb::class_<TileCount>(m, "TileCount", "Tiles a kernel visits (flops.hpp).")
      .def_ro("full", &TileCount::full, "Visited tiles without an element mask.")
      .def_ro("partial", &TileCount::partial, "Visited tiles that need the element mask.")
      .def_prop_ro("visited", &TileCount::visited)
      .def("__repr__", [](const TileCount& t) {
        return "TileCount(full=" + std::to_string(t.full) + ", partial=" + std::to_string(t.partial) + ")";
      });
  m.def(
      "count_pairs",
      [](const Pattern& pattern, int64_t total_q, int64_t total_k, int heads, std::optional<std::vector<int32_t>> cu_q,
         std::optional<std::vector<int32_t>> cu_k, const BlockMask* blocks) {
        HostPattern hp(pattern, std::move(cu_q), std::move(cu_k), blocks);
        return count_pairs(hp.p, total_q, total_k, heads);
      },
      "pattern"_a, "total_q"_a, "total_k"_a, "heads"_a = 1, "cu_seqlens_q"_a = nb::none(),
      "cu_seqlens_k"_a = nb::none(), "blocks"_a = nb::none(),
      "Allowed (query, key) pairs over packed runs of total_q queries and total_k keys, summed over heads.");
  m.def(
      "count_tiles",
      [](const Pattern& pattern, int64_t total_q, int64_t total_k, int heads, std::pair<int64_t, int64_t> tile,
         std::optional<std::vector<int32_t>> cu_q, std::optional<std::vector<int32_t>> cu_k, const BlockMask* blocks) {
        HostPattern hp(pattern, std::move(cu_q), std::move(cu_k), blocks);
        return count_tiles(hp.p, total_q, total_k, heads, TileShape{tile.first, tile.second});
      },
      "pattern"_a, "total_q"_a, "total_k"_a, "heads"_a = 1, "tile"_a = std::make_pair(int64_t(128), int64_t(128)),
      "cu_seqlens_q"_a = nb::none(), "cu_seqlens_k"_a = nb::none(), "blocks"_a = nb::none(),
      "Tiles of (tile_q, tile_k) tokens a kernel visits, summed over heads.");

  nb::class_<ScheduleCost>(m, "ScheduleCost", "Whole-encoder attention cost of a schedule (flops.hpp).")
      .def_ro("schedule", &ScheduleCost::schedule)
      .def_ro("tokens", &ScheduleCost::tokens)
      .def_ro("layers", &ScheduleCost::layers)
      .def_ro("pairs", &ScheduleCost::pairs, "Allowed pairs, summed over layers and heads.")
      .def_ro("flops", &ScheduleCost::flops, "One plain forward: 4 * head_dim * pairs.")
      .def_ro("flops_paper", &ScheduleCost::flops_paper, "The paper's convention: 4 x flops.")
      .def_prop_ro("tile", [](const ScheduleCost& c) { return std::make_pair(c.tile.q, c.tile.k); })
      .def_ro("tiles", &ScheduleCost::tiles)
      .def_ro("tile_flops", &ScheduleCost::tile_flops, "Visited tiles * tile_q * tile_k * 4 * head_dim.")
      .def_ro("useful_fraction", &ScheduleCost::useful_fraction, "flops / tile_flops.")
      .def_prop_ro("layer_pairs", [](const ScheduleCost& c) { return view_numpy(c.layer_pairs, nb::find(&c)); },
                   "int64 [layers]: allowed pairs per layer, summed over heads.")
      .def("__repr__", [](const ScheduleCost& c) {
        return "ScheduleCost(" + c.schedule + ", tokens=" + std::to_string(c.tokens) +
               ", flops=" + std::to_string(c.flops) + ")";
      });
  m.def(
      "schedule_cost",
      [](const Schedule& s, const std::vector<GridPair>& images, int heads, int head_dim, int patch, int merge,
         int qwen_window, std::pair<int64_t, int64_t> tile) {
        const EncoderShape shape{heads, head_dim, patch, merge, qwen_window};
        return schedule_cost(s, to_grids(images), shape, TileShape{tile.first, tile.second});
      },
      "schedule"_a, "images"_a, "heads"_a = 16, "head_dim"_a = 80, "patch"_a = 14, "merge"_a = 2,
      "qwen_window"_a = 4, "tile"_a = std::make_pair(int64_t(128), int64_t(128)),
      "Attention cost of every layer of `schedule` on the packed images [(h, w), ...] (Qwen2.5-VL defaults).");
  m.def(
      "image_grid",
      [](int side, int patch, int merge) {
        EncoderShape shape;
        shape.patch = patch;
        shape.merge = merge;
        const Grid g = image_grid(side, shape);
        return GridPair(g.h, g.w);
      },
      "side"_a, "patch"_a = 14, "merge"_a = 2, "(h, w) patch grid of a side x side pixel image.");

  // ---- receptive field ----
  nb::class_<ReceptiveField>(m, "ReceptiveField", "Token-level spread through a schedule (receptive_field.hpp).")
      .def_prop_ro("grid", [](const ReceptiveField& r) { return GridPair(r.grid.h, r.grid.w); })
      .def_ro("start_row", &ReceptiveField::start_row)
      .def_ro("start_col", &ReceptiveField::start_col)
      .def_prop_ro("coverage", [](const ReceptiveField& r) { return view_numpy(r.coverage, nb::find(&r)); },
                   "float64 [layers]: covered share of the grid after each layer.")
      .def_prop_ro("reached",
                   [](const ReceptiveField& r) {
                     return view_numpy(r.reached, nb::find(&r), {size_t(r.grid.h), size_t(r.grid.w)});
                   },
                   "int32 [h, w]: layer (1-based) after which each patch is first covered; 0 = start, -1 = never.");
  m.def(
      "receptive_field",
      [](const Schedule& s, GridPair grid, int start_row, int start_col, int merge, int qwen_window) {
        return receptive_field(s, Grid{grid.first, grid.second}, start_row, start_col, merge, qwen_window);
      },
      "schedule"_a, "grid"_a, "start_row"_a, "start_col"_a, "merge"_a = 1, "qwen_window"_a = 4,
      "Spreads from patch (start_row, start_col) of grid (h, w) through every layer of `schedule`.");
}

}  // namespace ariadne::py
