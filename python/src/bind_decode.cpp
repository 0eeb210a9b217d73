// Python bindings: decode-phase attention over a paged KV cache (decode.hpp): the host cache, dense
// and selected decode, and the page selection of sparse decode with its scorers.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "ariadne/decode.hpp"
#include "ariadne/error.hpp"
#include "bindings.hpp"
#include "convert.hpp"

// Decode's outputs are float32 whatever the query's dtype: out [batch, heads_q, head_dim].
#define ARIADNE_SIG_DECODE_OUT "Annotated[NDArray[numpy.float32], dict(shape=(None, None, None))]"

namespace ariadne::py {

namespace {

using namespace nb::literals;

// The cache as Python holds it. The decode calls read it with the GIL released, so another Python
// thread could append meanwhile, and an append may reallocate the pools under the running call.
// `readers` counts the calls in flight (changed only with the GIL held); the methods that change
// the cache refuse to run while it is non-zero instead of waiting, which could deadlock a caller.
struct PyKVCache : PagedKVCache {
  using PagedKVCache::PagedKVCache;
  int readers = 0;
};

// Held by a call for as long as it reads the cache, GIL release included: taken and dropped with
// the GIL held (it is constructed before the release and destroyed after the re-acquisition).
class ReadGuard {
 public:
  explicit ReadGuard(PyKVCache& c) : c_(c) { ++c_.readers; }
  ~ReadGuard() { --c_.readers; }
  ReadGuard(const ReadGuard&) = delete;
  ReadGuard& operator=(const ReadGuard&) = delete;

 private:
  PyKVCache& c_;
};

void check_idle(const PyKVCache& c, const char* method) {
  ARIADNE_CHECK(c.readers == 0, "PagedKVCache.", method, ": the cache is being read by a call running in another ",
                "thread (decode_attention, select_pages, page_masses, kept_page_mass); call it once that call ",
                "has returned");
}

KVCacheConfig make_cache_config(int kv_heads, int head_dim, int page_size, const std::string& dtype,
                                int summary_stride) {
  KVCacheConfig c;
  c.kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.page_size = page_size;
  c.dtype = parse_dtype(dtype);
  c.summary_stride = summary_stride;
  return c;
}

// The summaries are copied: an append may grow the pool and move them, so a view could dangle.
using SummaryOf = const float* (PagedKVCache::*)(int64_t) const;
nb::ndarray<nb::numpy, float> summary_copy(const PyKVCache& c, int64_t pool_page, SummaryOf get,
                                           std::vector<size_t> shape, const char* method) {
  ARIADNE_CHECK(pool_page >= 0 && pool_page < c.capacity_pages(), "PagedKVCache.", method, ": pool_page is ",
                pool_page, ", expected 0 … capacity_pages − 1 = ", c.capacity_pages() - 1);
  size_t n = 1;
  for (size_t s : shape) n *= s;
  const float* src = (c.*get)(pool_page);
  return to_numpy(std::vector<float>(src, src + n), std::move(shape));
}

// A selection built from Python arrays is checked for what decode_attention's own validation takes
// for granted (row_ptr from 0 to pages.size(), never decreasing): that validation reads the rows
// through row_ptr before it can compare them with the cache.
PageSelection make_selection(int kv_heads, std::vector<int32_t> row_ptr, std::vector<int32_t> pages) {
  ARIADNE_CHECK(kv_heads > 0, "PageSelection: kv_heads is ", kv_heads, ", expected > 0");
  ARIADNE_CHECK(!row_ptr.empty() && row_ptr.front() == 0, "PageSelection: row_ptr must start at 0 (rows + 1 entries)");
  for (size_t r = 0; r + 1 < row_ptr.size(); ++r)
    ARIADNE_CHECK(row_ptr[r] <= row_ptr[r + 1], "PageSelection: row_ptr decreases at row ", r, " (", row_ptr[r],
                  " > ", row_ptr[r + 1], ")");
  ARIADNE_CHECK(int64_t(row_ptr.back()) == int64_t(pages.size()), "PageSelection: row_ptr ends at ", row_ptr.back(),
                ", pages has ", pages.size(), " entries");
  ARIADNE_CHECK((row_ptr.size() - 1) % size_t(kv_heads) == 0, "PageSelection: ", row_ptr.size() - 1,
                " rows is not a multiple of kv_heads = ", kv_heads, " (rows are (batch entry, KV head))");
  PageSelection s;
  s.kv_heads = kv_heads;
  s.row_ptr = std::move(row_ptr);
  s.pages = std::move(pages);
  return s;
}

// The parameters of one call; owns the sequence ids the params' span points to.
struct Call {
  DecodeParams p;
  std::vector<int32_t> seqs;
};

void build(Call& c, const AnyIn& q, const PyKVCache& cache, std::vector<int32_t> seqs, int64_t window,
           const std::optional<AnyIn>& sink, const std::string& sink_mode, float scale, bool bf16_bits) {
  DecodeParams& p = c.p;
  p.q = as_view(q, "q", bf16_bits);
  p.cache = &cache;
  c.seqs = std::move(seqs);
  p.seqs = std::span<const int32_t>(c.seqs);
  p.window = window;
  p.scale = scale;
  p.sink_mode = parse_sink_mode(sink_mode);
  if (sink) p.sink = as_view(*sink, "sink");
  ARIADNE_CHECK(p.sink_mode == SinkMode::none || sink.has_value(), "sink: sink_mode is '", sink_mode,
                "' but no sink was given");
  ARIADNE_CHECK(p.sink_mode != SinkMode::none || !sink.has_value(),
                "sink: given, but sink_mode is 'none' (use 'denominator' or 'key0')");
}

PageScorer scorer_of(const std::string& s) {
  ARIADNE_CHECK(s == "oracle" || s == "rr" || s == "quest", "scorer: '", s, "' is not one of rr, quest, oracle");
  return parse_page_scorer(s);
}

constexpr const char* kCacheDoc = R"doc(Paged KV cache in host memory (ariadne/decode.hpp).

K and V pools [capacity_pages, kv_heads, page_size, head_dim] in `dtype` ('f32', 'bf16' or 'f16'),
a page table and a length per sequence, and per pool page and KV head the key summaries the page
scorers read (float32): key-stride sums over `summary_stride` rows and per-dimension min / max.
Methods that change the cache refuse to run while a decode call of another thread reads it.)doc";

constexpr const char* kDecodeDoc = R"doc(Decode attention into caller-provided outputs (decode_attention() wraps it).

q: [batch, heads_q, head_dim] host float32, bfloat16 or float16, head_dim contiguous; row b is the
   newest token of cache sequence seqs[b], whose k and v are already appended.
out: float32 [batch, heads_q, head_dim], head_dim contiguous, written in place.
lse: None or float32 [batch, heads_q], contiguous, written in place (natural log, includes the sink).
window: the query sees its `window` previous tokens and itself; < 0: every token.
sink: None or float32 [heads_q]; sink_mode 'none', 'denominator' or 'key0'.
scale: 0 selects 1/sqrt(head_dim). selection: None (dense) or a PageSelection for this batch.
backend: 'auto' (= 'cpu'), 'cpu' or 'reference'. The GIL is released while it runs.)doc";

}  // namespace

void bind_decode(nb::module_& m) {
  nb::class_<PyKVCache>(m, "PagedKVCache", kCacheDoc)
      .def(
          "__init__",
          [](PyKVCache* self, int kv_heads, int head_dim, int page_size, const std::string& dtype,
             int summary_stride) {
            new (self) PyKVCache(make_cache_config(kv_heads, head_dim, page_size, dtype, summary_stride));
          },
          "kv_heads"_a, "head_dim"_a, "page_size"_a = 64, "dtype"_a = "f32", "summary_stride"_a = 8,
          "An empty cache; page_size tokens per page, summary_stride (divides page_size) rows per key-stride sum.")
      .def(
          "add_sequence",
          [](PyKVCache& c) {
            check_idle(c, "add_sequence");
            return c.add_sequence();
          },
          "A new empty sequence; returns its id (ids of released sequences are reused).")
      .def(
          "release",
          [](PyKVCache& c, int seq) {
            check_idle(c, "release");
            c.release(seq);
          },
          "seq"_a, "Returns the sequence's pages to the pool; the id becomes free.")
      .def(
          "clear",
          [](PyKVCache& c, int seq) {
            check_idle(c, "clear");
            c.clear(seq);
          },
          "seq"_a, "Drops every token of the sequence (its pages go back to the pool); the id stays valid.")
      .def(
          "append",
          [](PyKVCache& c, int seq, const AnyIn& k, const AnyIn& v, bool bf16_bits) {
            check_idle(c, "append");
            c.append(seq, as_view(k, "k", bf16_bits), as_view(v, "v", bf16_bits));
          },
          nb::sig("def append(self, seq: int, k: " ARIADNE_SIG_QKV ", v: " ARIADNE_SIG_QKV
                  ", bf16_bits: bool = False) -> None"),
          "seq"_a, "k"_a.noconvert(), "v"_a.noconvert(), "bf16_bits"_a = false,
          "Appends n tokens: k, v [n, kv_heads, head_dim] host float32, bfloat16 or float16 (head_dim contiguous,\n"
          "any token stride), stored in the cache's dtype; the touched pages' key summaries are updated from the\n"
          "stored values. bf16_bits: read uint16 arrays as bfloat16 bits (ml_dtypes numpy arrays).")
      .def("length", [](const PyKVCache& c, int seq) { return c.length(seq); }, "seq"_a,
           "Cached tokens of the sequence.")
      .def("pages", [](const PyKVCache& c, int seq) { return c.pages(seq); }, "seq"_a,
           "Logical pages of the sequence: ceil(length / page_size).")
      .def("live", [](const PyKVCache& c, int seq) { return c.live(seq); }, "seq"_a,
           "Whether `seq` is a sequence id in use.")
      .def(
          "page_table", [](const PyKVCache& c, int seq) { return to_numpy(c.page_table(seq)); }, "seq"_a,
          "int32 [pages]: the pool page of each logical page of the sequence (a copy).")
      .def(
          "key_sum",
          [](const PyKVCache& c, int64_t pool_page) {
            const KVCacheConfig& k = c.config();
            return summary_copy(c, pool_page, &PagedKVCache::key_sum,
                                {size_t(k.kv_heads), size_t(c.strides_per_page()), size_t(k.head_dim)}, "key_sum");
          },
          "pool_page"_a,
          "float32 [kv_heads, strides_per_page, head_dim]: the sums of each key stride of a pool page (a copy).\n"
          "Strides past the page's filled rows hold nothing meaningful.")
      .def(
          "key_min",
          [](const PyKVCache& c, int64_t pool_page) {
            const KVCacheConfig& k = c.config();
            return summary_copy(c, pool_page, &PagedKVCache::key_min, {size_t(k.kv_heads), size_t(k.head_dim)},
                                "key_min");
          },
          "pool_page"_a, "float32 [kv_heads, head_dim]: per-dimension minimum of a pool page's keys (a copy).")
      .def(
          "key_max",
          [](const PyKVCache& c, int64_t pool_page) {
            const KVCacheConfig& k = c.config();
            return summary_copy(c, pool_page, &PagedKVCache::key_max, {size_t(k.kv_heads), size_t(k.head_dim)},
                                "key_max");
          },
          "pool_page"_a, "float32 [kv_heads, head_dim]: per-dimension maximum of a pool page's keys (a copy).")
      .def_prop_ro("kv_heads", [](const PyKVCache& c) { return c.config().kv_heads; })
      .def_prop_ro("head_dim", [](const PyKVCache& c) { return c.config().head_dim; })
      .def_prop_ro("page_size", [](const PyKVCache& c) { return c.config().page_size; })
      .def_prop_ro("summary_stride", [](const PyKVCache& c) { return c.config().summary_stride; })
      .def_prop_ro(
          "dtype", [](const PyKVCache& c) { return std::string(dtype_name(c.config().dtype)); },
          "Storage dtype of K and V: 'f32', 'bf16' or 'f16'.")
      .def_prop_ro("strides_per_page", [](const PyKVCache& c) { return c.strides_per_page(); })
      .def_prop_ro(
          "capacity_pages", [](const PyKVCache& c) { return c.capacity_pages(); },
          "Pages of the pools (used and free).")
      .def_prop_ro(
          "sequence_slots", [](const PyKVCache& c) { return c.sequence_slots(); },
          "Every sequence id handed out is below it.")
      .def_prop_ro(
          "page_bytes", [](const PyKVCache& c) { return c.page_bytes(); },
          "Bytes of K and V one full page holds (both pools).")
      .def("__repr__", [](const PyKVCache& c) {
        const KVCacheConfig& k = c.config();
        return "PagedKVCache(kv_heads=" + std::to_string(k.kv_heads) + ", head_dim=" + std::to_string(k.head_dim) +
               ", page_size=" + std::to_string(k.page_size) + ", dtype='" + dtype_name(k.dtype) +
               "', summary_stride=" + std::to_string(k.summary_stride) + ")";
      });

  nb::class_<PageSelection>(m, "PageSelection",
                            "Pages kept per (batch entry b, KV head g): row r = b * kv_heads + g lists logical\n"
                            "pages of sequence seqs[b], ascending, in pages[row_ptr[r]:row_ptr[r + 1]]. Holds no\n"
                            "reference to the cache: decode_attention checks it against the cache and batch it\n"
                            "is given.")
      .def(
          "__init__",
          [](PageSelection* self, int kv_heads, std::vector<int32_t> row_ptr, std::vector<int32_t> pages) {
            new (self) PageSelection(make_selection(kv_heads, std::move(row_ptr), std::move(pages)));
          },
          "kv_heads"_a, "row_ptr"_a, "pages"_a,
          "A selection given as CSR rows (visible and kept_mass stay empty, ms_select 0).")
      .def_ro("kv_heads", &PageSelection::kv_heads)
      .def_prop_ro("row_ptr", [](const PageSelection& s) { return view_numpy(s.row_ptr, nb::find(&s)); },
                   "int32 [rows + 1] (read-only view).")
      .def_prop_ro("pages", [](const PageSelection& s) { return view_numpy(s.pages, nb::find(&s)); },
                   "int32 [kept]: logical page indices, row after row (read-only view).")
      .def_prop_ro("visible", [](const PageSelection& s) { return view_numpy(s.visible, nb::find(&s)); },
                   "int32 [rows]: pages holding a token the window lets the query see (read-only view).")
      .def_prop_ro("kept_mass", [](const PageSelection& s) { return view_numpy(s.kept_mass, nb::find(&s)); },
                   "float32 [rows]: the scorer's normalized score mass of the kept pages (read-only view).")
      .def_prop_ro("rows", &PageSelection::rows)
      .def_prop_ro("kept", &PageSelection::kept, "Pages kept over every row.")
      .def_prop_ro("visible_total", &PageSelection::visible_total)
      .def_prop_ro("density", &PageSelection::density, "Kept / visible pages over every row.")
      .def_ro("ms_select", &PageSelection::ms_select, "Host wall time of select_pages (ms).")
      .def("__repr__", [](const PageSelection& s) {
        return "PageSelection(kv_heads=" + std::to_string(s.kv_heads) + ", rows=" + std::to_string(s.rows()) +
               ", kept=" + std::to_string(s.kept()) + ", visible=" + std::to_string(s.visible_total()) + ")";
      });

  m.def(
      "decode_into",
      [](const AnyIn& q, PyKVCache& cache, std::vector<int32_t> seqs, const AnyOut& out,
         const std::optional<AnyOut>& lse, int64_t window, const std::optional<AnyIn>& sink,
         const std::string& sink_mode, float scale,
         const PageSelection* selection, const std::string& backend, bool bf16_bits) {
        Call c;
        build(c, q, cache, std::move(seqs), window, sink, sink_mode, scale, bf16_bits);
        c.p.out = as_view(out, "out");
        if (lse) c.p.lse = as_view(*lse, "lse");
        c.p.selection = selection;
        const Backend b = parse_backend(backend);
        ReadGuard reading(cache);
        nb::gil_scoped_release unlocked;
        decode_attention(c.p, b);
      },
      nb::sig("def decode_into("
        "q: " ARIADNE_SIG_QKV ", "
        "cache: PagedKVCache, "
        "seqs: Sequence[int], "
        "out: " ARIADNE_SIG_DECODE_OUT ", "
        "lse: " ARIADNE_SIG_F32_OUT2 " | None = None, "
        "window: int = -1, "
        "sink: " ARIADNE_SIG_F32_IN1 " | None = None, "
        "sink_mode: str = 'none', "
        "scale: float = 0.0, "
        "selection: PageSelection | None = None, "
        "backend: str = 'auto', "
        "bf16_bits: bool = False"
        ") -> None"),
      "q"_a.noconvert(), "cache"_a, "seqs"_a, "out"_a.noconvert(), "lse"_a.noconvert() = nb::none(),
      "window"_a = -1, "sink"_a = nb::none(), "sink_mode"_a = "none", "scale"_a = 0.f, "selection"_a = nb::none(),
      "backend"_a = "auto", "bf16_bits"_a = false, kDecodeDoc);

  m.def(
      "select_pages",
      [](const AnyIn& q, PyKVCache& cache, std::vector<int32_t> seqs, const std::string& scorer, double tau,
         int sink_pages, int recent_pages, bool rotate, int64_t step, int64_t window, const std::optional<AnyIn>& sink,
         const std::string& sink_mode, float scale, bool bf16_bits) {
        Call c;
        build(c, q, cache, std::move(seqs), window, sink, sink_mode, scale, bf16_bits);
        PageSelectConfig config;
        config.scorer = scorer_of(scorer);
        config.tau = tau;
        config.sink_pages = sink_pages;
        config.recent_pages = recent_pages;
        config.rotate = rotate;
        config.step = step;
        ReadGuard reading(cache);
        nb::gil_scoped_release unlocked;
        return select_pages(c.p, config);
      },
      nb::sig("def select_pages("
        "q: " ARIADNE_SIG_QKV ", "
        "cache: PagedKVCache, "
        "seqs: Sequence[int], "
        "scorer: str = 'rr', "
        "tau: float = 0.9, "
        "sink_pages: int = 1, "
        "recent_pages: int = 1, "
        "rotate: bool = True, "
        "step: int = 0, "
        "window: int = -1, "
        "sink: " ARIADNE_SIG_F32_IN1 " | None = None, "
        "sink_mode: str = 'none', "
        "scale: float = 0.0, "
        "bf16_bits: bool = False"
        ") -> PageSelection"),
      "q"_a.noconvert(), "cache"_a, "seqs"_a, "scorer"_a = "rr", "tau"_a = 0.9, "sink_pages"_a = 1,
      "recent_pages"_a = 1, "rotate"_a = true, "step"_a = 0, "window"_a = -1, "sink"_a = nb::none(),
      "sink_mode"_a = "none", "scale"_a = 0.f, "bf16_bits"_a = false,
      "The pages sparse decode reads for this step's queries, per (sequence, KV head): scorer 'rr' (key-stride\n"
      "sums), 'quest' (min/max bound) or 'oracle' (exact mass); the smallest set reaching tau of the group's mean\n"
      "normalized score, plus the first sink_pages and the last recent_pages visible pages. rotate / step: rr's\n"
      "head rotation over key strides. Other arguments as for decode_into (the sink matters to the oracle's key0).");

  m.def(
      "page_masses",
      [](const AnyIn& q, PyKVCache& cache, std::vector<int32_t> seqs, int64_t window, const std::optional<AnyIn>& sink,
         const std::string& sink_mode, float scale, bool bf16_bits) {
        Call c;
        build(c, q, cache, std::move(seqs), window, sink, sink_mode, scale, bf16_bits);
        std::vector<std::vector<double>> masses;
        {
          ReadGuard reading(cache);
          nb::gil_scoped_release unlocked;
          masses = page_masses(c.p);
        }
        std::vector<nb::ndarray<nb::numpy, double>> rows;
        rows.reserve(masses.size());
        for (std::vector<double>& r : masses) {
          const size_t n = r.size();
          rows.push_back(take_numpy(std::move(r), {n}));
        }
        return rows;
      },
      nb::sig("def page_masses("
        "q: " ARIADNE_SIG_QKV ", "
        "cache: PagedKVCache, "
        "seqs: Sequence[int], "
        "window: int = -1, "
        "sink: " ARIADNE_SIG_F32_IN1 " | None = None, "
        "sink_mode: str = 'none', "
        "scale: float = 0.0, "
        "bf16_bits: bool = False"
        ") -> list[NDArray[numpy.float64]]"),
      "q"_a.noconvert(), "cache"_a, "seqs"_a, "window"_a = -1, "sink"_a = nb::none(), "sink_mode"_a = "none",
      "scale"_a = 0.f, "bf16_bits"_a = false,
      "Per row (b, g), the exact attention mass of each visible page (float64 [visible pages]), normalized per\n"
      "query head and averaged over the GQA group: the oracle's score.");

  m.def(
      "kept_page_mass",
      [](const AnyIn& q, PyKVCache& cache, std::vector<int32_t> seqs, const PageSelection& selection, int64_t window,
         const std::optional<AnyIn>& sink, const std::string& sink_mode, float scale, bool bf16_bits) {
        Call c;
        build(c, q, cache, std::move(seqs), window, sink, sink_mode, scale, bf16_bits);
        std::vector<double> kept;
        {
          ReadGuard reading(cache);
          nb::gil_scoped_release unlocked;
          // page_masses validates the call (ids, shapes) before kept_page_mass, which does not.
          const std::vector<std::vector<double>> masses = page_masses(c.p);
          kept = kept_page_mass(c.p, selection, masses);
        }
        const size_t n = kept.size();
        return take_numpy(std::move(kept), {n});
      },
      nb::sig("def kept_page_mass("
        "q: " ARIADNE_SIG_QKV ", "
        "cache: PagedKVCache, "
        "seqs: Sequence[int], "
        "selection: PageSelection, "
        "window: int = -1, "
        "sink: " ARIADNE_SIG_F32_IN1 " | None = None, "
        "sink_mode: str = 'none', "
        "scale: float = 0.0, "
        "bf16_bits: bool = False"
        ") -> NDArray[numpy.float64]"),
      "q"_a.noconvert(), "cache"_a, "seqs"_a, "selection"_a, "window"_a = -1, "sink"_a = nb::none(),
      "sink_mode"_a = "none", "scale"_a = 0.f, "bf16_bits"_a = false,
      "float64 [rows]: per row, the share of the exact attention mass (page_masses) that the selection's pages\n"
      "hold; 1 for a selection that keeps every visible page (the selection's recall).");
}

}  // namespace ariadne::py
