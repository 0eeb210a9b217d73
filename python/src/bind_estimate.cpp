// Python bindings: block-sparse estimators (RRAttention, XAttention, oracle), their metrics, and
// the estimate-then-attend prefill (estimate.hpp, prefill.hpp).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "ariadne/estimate.hpp"
#include "ariadne/prefill.hpp"
#include "bindings.hpp"
#include "convert.hpp"

namespace ariadne::py {

namespace {

using namespace nb::literals;
using F32Out2 = nb::ndarray<float, nb::ndim<2>, nb::c_contig>;

// The causal layout of the packed sequences; owns the host offsets the Pattern points to.
struct Layout {
  std::vector<int32_t> cu_q, cu_k;
  Pattern p = Pattern::causal();
  Layout(std::optional<std::vector<int32_t>> q, std::optional<std::vector<int32_t>> k) {
    ARIADNE_CHECK(!k || q, "cu_seqlens_k: given without cu_seqlens_q");
    if (!q) return;
    cu_q = std::move(*q);
    ARIADNE_CHECK(cu_q.size() >= 2, "cu_seqlens_q: has ", cu_q.size(), " entries, expected sequences + 1 >= 2");
    if (k) {
      cu_k = std::move(*k);
      ARIADNE_CHECK(cu_k.size() == cu_q.size(), "cu_seqlens_k: has ", cu_k.size(), " entries, expected ",
                    cu_q.size());
    }
    p = p.with_varlen(int32_t(cu_q.size() - 1), cu_q.data(), cu_k.empty() ? nullptr : cu_k.data());
  }
};

EstimateConfig make_config(const std::string& method, int32_t block, int32_t stride, double tau,
                           std::vector<double> tau_per_head, const std::string& offset,
                           const std::optional<std::vector<std::string>>& protect, float scale) {
  EstimateConfig c;
  c.method = parse_estimator(method);
  c.block = block;
  c.stride = stride;
  c.tau = tau;
  c.tau_per_head = std::move(tau_per_head);
  c.offset = parse_rr_offset(offset);
  c.protect = protections_of(protect);
  c.scale = scale;
  return c;
}

constexpr const char* kEstimateDoc = R"doc(Block-sparse mask of a causal prefill (estimate.hpp).

q: [total_q, heads_q, head_dim]; k: [total_k, heads_kv, head_dim]; float32/bfloat16/float16 host
arrays, head_dim contiguous. cu_seqlens_q / cu_seqlens_k: packed sequences (lq <= lk each).
method 'rr' (RRAttention), 'xattn' (XAttention) or 'oracle' (exact block masses); block B, stride S
(S divides B); tau: share of each row's score mass to keep (tau_per_head: one per query head);
offset 'paper' or 'released' (rr's sampling formula); protect: None (as each method was released)
or names among 'last_row', 'sink', 'diagonal'. The GIL is released while it runs.)doc";

}  // namespace

std::optional<Protections> protections_of(const std::optional<std::vector<std::string>>& names) {
  if (!names) return std::nullopt;
  Protections p;
  for (const std::string& n : *names) {
    if (n == "last_row") p.last_row = true;
    else if (n == "sink") p.sink = true;
    else if (n == "diagonal") p.diagonal = true;
    else detail::fail("protect: '", n, "' is not one of last_row, sink, diagonal");
  }
  return p;
}

void bind_estimate(nb::module_& m) {
  nb::class_<EstimateStats>(m, "EstimateStats", "Stage times (ms), kept / visible blocks and scoring cost.")
      .def_ro("ms_sampling", &EstimateStats::ms_sampling)
      .def_ro("ms_scoring", &EstimateStats::ms_scoring)
      .def_ro("ms_selection", &EstimateStats::ms_selection)
      .def_ro("ms_total", &EstimateStats::ms_total)
      .def_ro("kept_blocks", &EstimateStats::kept_blocks)
      .def_ro("visible_blocks", &EstimateStats::visible_blocks)
      .def_ro("density", &EstimateStats::density, "kept / causally visible blocks.")
      .def_ro("density_per_head", &EstimateStats::density_per_head, "[heads_q] kept / visible per query head.")
      .def_ro("mac", &EstimateStats::mac, "Multiply-adds spent on scoring.");

  nb::class_<EstimateResult>(m, "EstimateResult", "An estimator's mask and the block scores behind it.")
      .def_ro("mask", &EstimateResult::mask, "BlockMask: rows (sequence, query head, query block).")
      .def_ro("heads", &EstimateResult::heads)
      .def_ro("stats", &EstimateResult::stats)
      .def_prop_ro("rows", &EstimateResult::rows)
      .def_prop_ro("score_ptr", [](const EstimateResult& r) { return view_numpy(r.score_ptr, nb::find(&r)); },
                   "int64 [rows + 1]: row r's scores are scores[score_ptr[r]:score_ptr[r + 1]].")
      .def_prop_ro("scores", [](const EstimateResult& r) { return view_numpy(r.scores, nb::find(&r)); },
                   "float32: normalized scores of the visible key blocks 0 ... diag of each row.")
      .def_prop_ro("row_queries", [](const EstimateResult& r) { return view_numpy(r.row_queries, nb::find(&r)); },
                   "int32 [rows]: queries in each row's query block.");

  m.def(
      "estimate",
      [](const AnyIn& q, const AnyIn& k, const std::string& method, int32_t block, int32_t stride, double tau,
         std::vector<double> tau_per_head, const std::string& offset,
         const std::optional<std::vector<std::string>>& protect, float scale,
         std::optional<std::vector<int32_t>> cu_q, std::optional<std::vector<int32_t>> cu_k,
         const std::string& backend, bool bf16_bits) {
        const TensorView qv = as_view(q, "q", bf16_bits), kv = as_view(k, "k", bf16_bits);
        const EstimateConfig config = make_config(method, block, stride, tau, std::move(tau_per_head), offset,
                                                  protect, scale);
        const Layout layout(std::move(cu_q), std::move(cu_k));
        const Backend b = parse_backend(backend);
        nb::gil_scoped_release unlocked;
        return estimate(qv, kv, layout.p, config, b);
      },
      nb::sig("def estimate("
        "q: " ARIADNE_SIG_QKV ", "
        "k: " ARIADNE_SIG_QKV ", "
        "method: str = 'rr', "
        "block: int = 128, "
        "stride: int = 8, "
        "tau: float = 0.95, "
        "tau_per_head: Sequence[float] = [], "
        "offset: str = 'paper', "
        "protect: Sequence[str] | None = None, "
        "scale: float = 0.0, "
        "cu_seqlens_q: Sequence[int] | None = None, "
        "cu_seqlens_k: Sequence[int] | None = None, "
        "backend: str = 'auto', "
        "bf16_bits: bool = False"
        ") -> EstimateResult"),
      "q"_a.noconvert(), "k"_a.noconvert(), "method"_a = "rr", "block"_a = 128, "stride"_a = 8, "tau"_a = 0.95,
      "tau_per_head"_a = std::vector<double>{}, "offset"_a = "paper", "protect"_a = nb::none(), "scale"_a = 0.f,
      "cu_seqlens_q"_a = nb::none(), "cu_seqlens_k"_a = nb::none(), "backend"_a = "auto", "bf16_bits"_a = false,
      kEstimateDoc);

  m.def(
      "rr_sample_position",
      [](const std::string& offset, int32_t stride, int64_t i, int head, int64_t lq) {
        return rr_sample_position(parse_rr_offset(offset), stride, i, head, lq);
      },
      "offset"_a, "stride"_a, "i"_a, "head"_a, "lq"_a,
      "RR's sampled query of query stride i for head h: iS + (S - 1 - h mod S) ('paper') or iS + (h mod S)\n"
      "('released'), clamped to lq - 1.");

  nb::class_<MaskMetrics>(m, "MaskMetrics", "A mask against the oracle's: attention mass kept and block F1.")
      .def_ro("mass_recall", &MaskMetrics::mass_recall, "True attention mass on kept blocks / total mass.")
      .def_ro("precision", &MaskMetrics::precision)
      .def_ro("recall", &MaskMetrics::recall)
      .def_ro("f1", &MaskMetrics::f1)
      .def_ro("density", &MaskMetrics::density)
      .def_ro("kept", &MaskMetrics::kept)
      .def_ro("oracle_kept", &MaskMetrics::oracle_kept)
      .def_ro("true_positive", &MaskMetrics::true_positive)
      .def_ro("visible", &MaskMetrics::visible)
      .def_ro("mass_recall_per_head", &MaskMetrics::mass_recall_per_head);
  m.def("compare_to_oracle", &compare_to_oracle, "mask"_a, "oracle"_a,
        "Metrics of `mask` (same geometry as the oracle's) against an oracle EstimateResult.");

  nb::class_<PrefillStats>(m, "PrefillStats", "Stage times (ms) and the density of a prefill.")
      .def_ro("ms_sampling", &PrefillStats::ms_sampling)
      .def_ro("ms_scoring", &PrefillStats::ms_scoring)
      .def_ro("ms_selection", &PrefillStats::ms_selection)
      .def_ro("ms_estimate", &PrefillStats::ms_estimate)
      .def_ro("ms_attention", &PrefillStats::ms_attention)
      .def_ro("ms_total", &PrefillStats::ms_total)
      .def_ro("density", &PrefillStats::density)
      .def_ro("density_per_head", &PrefillStats::density_per_head);
  nb::class_<PrefillResult>(m, "PrefillResult", "The estimate a prefill used (empty when dense) and its stats.")
      .def_ro("estimate", &PrefillResult::estimate)
      .def_ro("stats", &PrefillResult::stats);

  m.def(
      "prefill_into",
      [](const AnyIn& q, const AnyIn& k, const AnyIn& v, const AnyOut& out, const std::optional<F32Out2>& lse,
         bool dense, const std::string& method, int32_t block, int32_t stride, double tau, const std::string& offset,
         const std::optional<std::vector<std::string>>& protect, float scale, std::optional<std::vector<int32_t>> cu_q,
         std::optional<std::vector<int32_t>> cu_k, const std::string& estimate_backend,
         const std::string& attention_backend, bool bf16_bits) {
        AttentionParams p;
        p.q = as_view(q, "q", bf16_bits);
        p.k = as_view(k, "k", bf16_bits);
        p.v = as_view(v, "v", bf16_bits);
        p.out = as_view(out, "out", bf16_bits);
        if (lse) p.lse = as_view(*lse, "lse");
        p.scale = scale;
        const Layout layout(std::move(cu_q), std::move(cu_k));
        p.pattern = layout.p;
        PrefillConfig config;
        config.dense = dense;
        config.estimate = make_config(method, block, stride, tau, {}, offset, protect, scale);
        config.estimate_backend = parse_backend(estimate_backend);
        config.attention_backend = parse_backend(attention_backend);
        nb::gil_scoped_release unlocked;
        return prefill(p, config);
      },
      nb::sig("def prefill_into("
        "q: " ARIADNE_SIG_QKV ", "
        "k: " ARIADNE_SIG_QKV ", "
        "v: " ARIADNE_SIG_QKV ", "
        "out: " ARIADNE_SIG_OUT ", "
        "lse: " ARIADNE_SIG_F32_OUT2 " | None = None, "
        "dense: bool = False, "
        "method: str = 'rr', "
        "block: int = 128, "
        "stride: int = 8, "
        "tau: float = 0.95, "
        "offset: str = 'paper', "
        "protect: Sequence[str] | None = None, "
        "scale: float = 0.0, "
        "cu_seqlens_q: Sequence[int] | None = None, "
        "cu_seqlens_k: Sequence[int] | None = None, "
        "estimate_backend: str = 'auto', "
        "attention_backend: str = 'auto', "
        "bf16_bits: bool = False"
        ") -> PrefillResult"),
      "q"_a.noconvert(), "k"_a.noconvert(), "v"_a.noconvert(), "out"_a.noconvert(), "lse"_a.noconvert() = nb::none(),
      "dense"_a = false, "method"_a = "rr", "block"_a = 128, "stride"_a = 8, "tau"_a = 0.95, "offset"_a = "paper",
      "protect"_a = nb::none(), "scale"_a = 0.f, "cu_seqlens_q"_a = nb::none(), "cu_seqlens_k"_a = nb::none(),
      "estimate_backend"_a = "auto", "attention_backend"_a = "auto", "bf16_bits"_a = false,
      "Causal prefill: estimate a mask (unless dense), then attention on it, into out [total_q, heads_q,\n"
      "head_dim] (and lse float32 [heads_q, total_q]). Arguments as for estimate() and attention_into().");
}

}  // namespace ariadne::py
