// Decode entry points (include/ariadne/decode.hpp): validation, backend dispatch, and the page
// selection of sparse decode with its three scorers.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>

#include "ariadne/decode.hpp"
#include "ariadne/error.hpp"
#include "ariadne/estimate.hpp"
#include "decode/cpu/decode_kernel.hpp"
#include "decode/internal.hpp"

namespace ariadne {

namespace decode_detail {

Visible visible_of(int64_t length, int64_t window, int page_size) {
  Visible v;
  v.length = length;
  if (length <= 0) return v;
  v.first = window < 0 ? 0 : std::max<int64_t>(0, length - 1 - window);
  v.page_lo = v.first / page_size;
  v.page_hi = (length - 1) / page_size;
  return v;
}

}  // namespace decode_detail

using decode_detail::Visible;
using decode_detail::visible_of;

const char* page_scorer_name(PageScorer s) {
  switch (s) {
    case PageScorer::oracle: return "oracle";
    case PageScorer::rr: return "rr";
    default: return "quest";
  }
}

PageScorer parse_page_scorer(const std::string& s) {
  if (s == "oracle") return PageScorer::oracle;
  if (s == "rr") return PageScorer::rr;
  if (s == "quest") return PageScorer::quest;
  detail::fail("page scorer '", s, "' is not one of oracle, rr, quest");
}

int64_t PageSelection::visible_total() const {
  int64_t t = 0;
  for (int32_t v : visible) t += v;
  return t;
}

double PageSelection::density() const {
  const int64_t v = visible_total();
  return v ? double(kept()) / double(v) : 1.0;
}

namespace {

// validate() with out optional: the selection and the page masses write no output. host: the caller
// reads q and the cache on the host (the selection, the page masses, the host backends).
void check_params(const DecodeParams& p, bool need_out, bool host) {
  const bool dev = !host && p.device_cache != nullptr;
  ARIADNE_CHECK(dev || p.cache != nullptr, host && p.device_cache ? "decode: this call reads the host cache "
                "(DecodeParams::cache), and only a device cache was given" : "decode: no cache given (DecodeParams::cache)");
  const KVCacheConfig& c = dev ? p.device_cache->config() : p.cache->config();
  const Device mem = dev ? Device::cuda : Device::cpu;
  const char* where = dev ? "device" : "host";
  const auto live = [&](int seq) { return dev ? p.device_cache->live(seq) : p.cache->live(seq); };
  const auto length = [&](int seq) { return dev ? p.device_cache->length(seq) : p.cache->length(seq); };
  const TensorView& q = p.q;
  ARIADNE_CHECK(q.defined() && q.rank == 3, "decode: q must be [batch, heads_q, head_dim], got ",
                q.defined() ? q.describe() : std::string("undefined"));
  ARIADNE_CHECK(q.device == mem, "decode: q is in ", q.device == Device::cpu ? "host" : "device", " memory, the ",
                where, " cache decodes ", where, " queries");
  if (dev)
    ARIADNE_CHECK(q.dtype == c.dtype && q.dtype != DType::f32, "decode: q has dtype ", dtype_name(q.dtype),
                  ", the device kernels need bf16 or f16 queries of the cache's dtype (", dtype_name(c.dtype), ")");
  else
    ARIADNE_CHECK(q.dtype == DType::f32 || q.dtype == DType::bf16 || q.dtype == DType::f16, "decode: q has dtype ",
                  dtype_name(q.dtype), ", expected f32, bf16 or f16");
  const int64_t B = q.shape[0];
  const int64_t Hq = q.shape[1], d = q.shape[2];
  ARIADNE_CHECK(q.stride[2] == 1, "decode: q needs a contiguous head dim, got ", q.describe());
  ARIADNE_CHECK(d == c.head_dim, "decode: q's head dim is ", d, ", the cache's is ", c.head_dim);
  ARIADNE_CHECK(Hq > 0 && Hq % c.kv_heads == 0, "decode: q has ", Hq, " heads, expected a positive multiple of the ",
                "cache's ", c.kv_heads, " KV heads (GQA)");
  ARIADNE_CHECK(int64_t(p.seqs.size()) == B, "decode: seqs has ", p.seqs.size(), " entries, q's batch is ", B);
  for (size_t b = 0; b < p.seqs.size(); ++b)
    ARIADNE_CHECK(live(p.seqs[b]), "decode: seqs[", b, "] = ", p.seqs[b],
                  " is not a live sequence of the cache");
  const TensorView& o = p.out;
  if (need_out || o.defined())
    ARIADNE_CHECK(o.defined() && o.rank == 3 && o.shape[0] == B && o.shape[1] == Hq && o.shape[2] == d &&
                    (o.dtype == DType::f32 || o.dtype == DType::bf16 || o.dtype == DType::f16) && o.device == mem &&
                    o.stride[2] == 1,
                "decode: out must be ", where, " f32, bf16 or f16 [", B, ", ", Hq, ", ", d,
                "] with a contiguous head dim, got ",
                o.defined() ? o.describe() : std::string("undefined"));
  if (p.lse.defined())
    ARIADNE_CHECK(p.lse.rank == 2 && p.lse.shape[0] == B && p.lse.shape[1] == Hq && p.lse.dtype == DType::f32 &&
                      p.lse.device == mem && p.lse.contiguous(),
                  "decode: lse must be ", where, " f32 [", B, ", ", Hq, "] contiguous, got ", p.lse.describe());
  if (p.sink_mode != SinkMode::none)
    ARIADNE_CHECK(p.sink.defined() && p.sink.rank == 1 && p.sink.shape[0] == Hq && p.sink.dtype == DType::f32 &&
                      p.sink.device == mem && p.sink.stride[0] == 1,
                  "decode: sink_mode ", sink_mode_name(p.sink_mode), " needs sink as contiguous ", where, " f32 [", Hq, "], got ",
                  p.sink.defined() ? p.sink.describe() : std::string("undefined"));
  ARIADNE_CHECK(std::isfinite(p.scale) && p.scale >= 0, "decode: scale is ", p.scale,
                ", expected 0 (1/sqrt(head_dim)) or a positive value");
  if (const CudaPageSelection* s = p.device_selection) {
    ARIADNE_CHECK(dev, "decode: device_selection is read by the device kernels: it needs a device cache ",
                  "(DecodeParams::device_cache)");
    ARIADNE_CHECK(p.selection == nullptr, "decode: selection and device_selection are both set, expected one");
    ARIADNE_CHECK(s->kv_heads() == c.kv_heads && s->rows() == B * c.kv_heads, "decode: device_selection has ",
                  s->rows(), " rows for ", s->kv_heads(), " KV heads, expected ", B * c.kv_heads, " (batch × the ",
                  "cache's ", c.kv_heads, " KV heads): select_pages writes it for this call's batch");
  }
  if (const PageSelection* s = p.selection) {
    const int64_t rows = B * c.kv_heads;
    ARIADNE_CHECK(s->kv_heads == c.kv_heads && s->rows() == rows && s->row_ptr.front() == 0 &&
                      s->row_ptr.back() == int32_t(s->pages.size()),
                  "decode: the selection has ", s->rows(), " rows for ", s->kv_heads, " KV heads, expected ", rows,
                  " (batch × the cache's ", c.kv_heads, " KV heads) with row_ptr from 0 to pages.size()");
    // Every row's bounds before any row's pages: with row_ptr ending at pages.size() and never
    // decreasing, each row's range lies inside pages.
    for (int64_t r = 0; r < rows; ++r)
      ARIADNE_CHECK(s->row_ptr[size_t(r)] <= s->row_ptr[size_t(r) + 1], "decode: selection row_ptr decreases at row ",
                    r);
    for (int64_t r = 0; r < rows; ++r) {
      const Visible vis = visible_of(length(p.seqs[size_t(r / c.kv_heads)]), p.window, c.page_size);
      int64_t last = -1;
      for (int32_t i = s->row_ptr[size_t(r)]; i < s->row_ptr[size_t(r) + 1]; ++i) {
        const int32_t pg = s->pages[size_t(i)];
        ARIADNE_CHECK(pg >= vis.page_lo && pg <= vis.page_hi && pg > last, "decode: selection row ", r, " lists page ",
                      pg, ", expected ascending visible pages ", vis.page_lo, " … ", vis.page_hi);
        last = pg;
      }
    }
  }
}

}  // namespace

void validate(const DecodeParams& p) { check_params(p, true, false); }

size_t decode_workspace_bytes(const DecodeParams& p, int64_t extra_tokens) {
  validate(p);
  ARIADNE_CHECK(extra_tokens >= 0 && extra_tokens < (int64_t(1) << 30), "decode_workspace_bytes: extra_tokens is ",
                extra_tokens, ", expected 0 … 2^30");
  return p.device_cache ? decode_detail::decode_cuda_workspace(p, extra_tokens) : 0;
}

void decode_attention(const DecodeParams& p, Backend backend) {
  validate(p);
  if (p.device_cache) {
    ARIADNE_CHECK(backend == Backend::automatic || backend == Backend::cuda, "decode: backend '",
                  backend_name(backend), "' cannot read a device cache, expected cuda or auto");
    decode_detail::decode_cuda(p);
    return;
  }
  switch (backend) {
    case Backend::reference: decode_detail::decode_reference(p); return;
    case Backend::automatic:
    case Backend::cpu: decode_detail::decode_cpu(p); return;
    default:
      detail::fail("decode: backend '", backend_name(backend), "' has no decode kernel for a host cache, expected ",
                   "reference, cpu or auto");
  }
}

namespace {

float q_at(const TensorView& q, int64_t b, int64_t h, int i) {
  return decode_detail::load(static_cast<const unsigned char*>(q.data), q.dtype, b * q.stride[0] + h * q.stride[1] + i);
}

// The scorers' per-page weights of one row (b, g): weights[h][page − page_lo] for the group's query
// heads; a head that scored nothing has an empty vector.
using HeadWeights = std::vector<std::vector<double>>;

// Exact: the attention mass of every visible token, per head normalized over the keys (the sink's
// share is left out: it is not a page).
HeadWeights oracle_weights(const DecodeParams& p, int64_t b, int g, const Visible& vis) {
  const PagedKVCache& cache = *p.cache;
  const KVCacheConfig& c = cache.config();
  const int d = c.head_dim, G = int(p.q.shape[1]) / c.kv_heads, P = c.page_size;
  const float scale = p.scale > 0 ? p.scale : 1.f / std::sqrt(float(d));
  const std::vector<int32_t>& table = cache.page_table(p.seqs[size_t(b)]);
  const unsigned char* kp = static_cast<const unsigned char*>(cache.k_pool().data);
  HeadWeights w(size_t(G), std::vector<double>(size_t(vis.pages()), 0.0));
  std::vector<double> s(size_t(vis.length - vis.first));
  for (int hg = 0; hg < G; ++hg) {
    const int64_t h = int64_t(g) * G + hg;
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t t = vis.first; t < vis.length; ++t) {
      const int64_t base = ((int64_t(table[size_t(t / P)]) * c.kv_heads + g) * P + t % P) * d;
      double dot = 0;
      for (int i = 0; i < d; ++i) dot += double(q_at(p.q, b, h, i)) * double(decode_detail::load(kp, c.dtype, base + i));
      double x = double(scale) * dot;
      if (t == 0 && p.sink_mode == SinkMode::key0_bias) x += double(p.sink.get({h}));
      s[size_t(t - vis.first)] = x;
      mx = std::max(mx, x);
    }
    double z = 0;
    for (double& x : s) z += (x = std::exp(x - mx));
    for (int64_t t = vis.first; t < vis.length; ++t) w[size_t(hg)][size_t(t / P - vis.page_lo)] += s[size_t(t - vis.first)] / z;
  }
  return w;
}

// From the summaries: rr scores each key stride by its mean key, quest each page by the min/max bound.
// Every scored term is a log-weight log n + scale·q·k̄ in a flat slot array: slot (page, stride,
// head) for rr (one head per stride under rotation, the whole group without), (page, head) for
// quest. Each head's terms are exponentiated against that head's max and summed per page. The dot
// products run on the active ISA table's score kernels (decode_kernel.hpp).
HeadWeights summary_weights(const DecodeParams& p, int64_t b, int g, const Visible& vis, const PageSelectConfig& cfg) {
  const PagedKVCache& cache = *p.cache;
  const KVCacheConfig& c = cache.config();
  const int d = c.head_dim, G = int(p.q.shape[1]) / c.kv_heads, P = c.page_size, S = c.summary_stride;
  const bool quest = cfg.scorer == PageScorer::quest;
  const int J = quest ? 1 : cache.strides_per_page();
  const int heads_per_term = quest || !cfg.rotate ? G : 1;
  const float scale = p.scale > 0 ? p.scale : 1.f / std::sqrt(float(d));
  const std::vector<int32_t>& table = cache.page_table(p.seqs[size_t(b)]);
  const int64_t npages = vis.pages();
  constexpr double kNone = -std::numeric_limits<double>::infinity();
  const decode_detail::ScoreKernels kern = decode_detail::active_score_kernels();
  thread_local std::vector<double> qh;
  thread_local std::vector<double> lw;
  qh.resize(size_t(G) * size_t(d));
  lw.assign(size_t(npages) * size_t(J) * size_t(heads_per_term), kNone);
  for (int hg = 0; hg < G; ++hg)
    for (int i = 0; i < d; ++i) qh[size_t(hg * d + i)] = q_at(p.q, b, int64_t(g) * G + hg, i);
  // Under rotation, stride j of page `page` goes to head (page + step + j) mod G: the first
  // stride's head, stepped per stride without a division.
  const auto first_head = [&](int64_t page) { return int((page + cfg.step) % G); };
  const auto next_head = [G](int h) { return h + 1 == G ? 0 : h + 1; };
  const double log_s = std::log(double(S));
  std::vector<double> mx(size_t(G), kNone);
  for (int64_t pi = 0; pi < npages; ++pi) {
    const int64_t page = vis.page_lo + pi, pool = table[size_t(page)];
    const int64_t rows = std::min<int64_t>(P, vis.length - page * P);
    double* out = lw.data() + pi * J * heads_per_term;
    if (quest) {
      const float* mn = cache.key_min(pool) + int64_t(g) * d;
      const float* kx = cache.key_max(pool) + int64_t(g) * d;
      const double log_rows = std::log(double(rows));
      for (int hg = 0; hg < G; ++hg) {
        out[hg] = log_rows + double(scale) * kern.bound(qh.data() + hg * d, mn, kx, d);
        mx[size_t(hg)] = std::max(mx[size_t(hg)], out[hg]);
      }
      continue;
    }
    const float* sums = cache.key_sum(pool);
    int rotated = first_head(page);
    for (int64_t j = 0; j < J && j * S < rows; ++j, rotated = next_head(rotated)) {
      const int64_t n = std::min<int64_t>(S, rows - j * S);
      const double log_n = n == S ? log_s : std::log(double(n));
      const float* ks = sums + (int64_t(g) * J + j) * d;
      for (int slot = 0; slot < heads_per_term; ++slot) {
        const int hg = heads_per_term == G ? slot : rotated;
        const double x = log_n + double(scale) * kern.dot(qh.data() + hg * d, ks, d) / double(n);
        out[j * heads_per_term + slot] = x;
        mx[size_t(hg)] = std::max(mx[size_t(hg)], x);
      }
    }
  }
  HeadWeights w(static_cast<size_t>(G));
  for (int64_t pi = 0; pi < npages; ++pi) {
    int rotated = first_head(vis.page_lo + pi);
    for (int64_t j = 0; j < J; ++j, rotated = next_head(rotated))
      for (int slot = 0; slot < heads_per_term; ++slot) {
        const double x = lw[size_t((pi * J + j) * heads_per_term + slot)];
        if (x == kNone) continue;
        const int hg = heads_per_term == G ? slot : rotated;
        std::vector<double>& row = w[size_t(hg)];
        if (row.empty()) row.assign(size_t(npages), 0.0);
        row[size_t(pi)] += std::exp(x - mx[size_t(hg)]);
      }
  }
  for (std::vector<double>& row : w) {
    double z = 0;
    for (double x : row) z += x;
    if (z > 0)
      for (double& x : row) x /= z;
  }
  return w;
}

// Mean over the heads that scored something; zeros when none did.
std::vector<double> group_mean(const HeadWeights& w, int64_t npages) {
  std::vector<double> m(size_t(npages), 0.0);
  int heads = 0;
  for (const std::vector<double>& row : w) {
    if (row.empty()) continue;
    ++heads;
    for (int64_t i = 0; i < npages; ++i) m[size_t(i)] += row[size_t(i)];
  }
  if (heads > 0)
    for (double& x : m) x /= heads;
  return m;
}

}  // namespace

std::vector<std::vector<double>> page_masses(const DecodeParams& p) {
  DecodeParams v = p;
  v.selection = nullptr;
  v.device_selection = nullptr;
  check_params(v, false, true);
  const KVCacheConfig& c = p.cache->config();
  std::vector<std::vector<double>> out;
  for (int64_t b = 0; b < p.q.shape[0]; ++b) {
    const Visible vis = visible_of(p.cache->length(p.seqs[size_t(b)]), p.window, c.page_size);
    for (int g = 0; g < c.kv_heads; ++g) out.push_back(group_mean(oracle_weights(v, b, g, vis), vis.pages()));
  }
  return out;
}

std::vector<double> kept_page_mass(const DecodeParams& p, const PageSelection& sel,
                                   const std::vector<std::vector<double>>& masses) {
  const KVCacheConfig& c = p.cache->config();
  const int64_t rows = p.q.shape[0] * c.kv_heads;
  ARIADNE_CHECK(sel.rows() == rows && int64_t(masses.size()) == rows, "kept_page_mass: the selection has ",
                sel.rows(), " rows and the masses ", masses.size(), ", expected ", rows, " (batch x kv_heads)");
  std::vector<double> kept(size_t(rows), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = r / c.kv_heads;
    const Visible vis = visible_of(p.cache->length(p.seqs[size_t(b)]), p.window, c.page_size);
    const std::vector<double>& m = masses[size_t(r)];
    for (int32_t i = sel.row_ptr[size_t(r)]; i < sel.row_ptr[size_t(r) + 1]; ++i) {
      const int64_t at = sel.pages[size_t(i)] - vis.page_lo;
      ARIADNE_CHECK(at >= 0 && at < int64_t(m.size()), "kept_page_mass: row ", r, " keeps page ",
                    sel.pages[size_t(i)], ", outside its visible pages [", vis.page_lo, ", ",
                    vis.page_lo + int64_t(m.size()), ")");
      kept[size_t(r)] += m[size_t(at)];
    }
  }
  return kept;
}

namespace {
// The config, then the decode parameters without their selections (a selection reads none).
void check_select(const DecodeParams& p, const PageSelectConfig& cfg, bool host) {
  ARIADNE_CHECK(cfg.tau > 0 && cfg.tau <= 1, "select_pages: tau is ", cfg.tau, ", expected (0, 1]");
  ARIADNE_CHECK(cfg.sink_pages >= 0 && cfg.recent_pages >= 0, "select_pages: sink_pages ", cfg.sink_pages,
                " and recent_pages ", cfg.recent_pages, " must be ≥ 0");
  ARIADNE_CHECK(cfg.step >= 0, "select_pages: step is ", cfg.step, ", expected ≥ 0");
  DecodeParams v = p;
  v.selection = nullptr;
  v.device_selection = nullptr;
  check_params(v, false, host);
}
}  // namespace

void select_pages(const DecodeParams& p, const PageSelectConfig& cfg, CudaPageSelection& out) {
  ARIADNE_CHECK(p.device_cache != nullptr, "select_pages: the device selection reads a device cache ",
                "(DecodeParams::device_cache); for a host cache call select_pages(p, config)");
  ARIADNE_CHECK(cfg.scorer != PageScorer::oracle, "select_pages: the oracle reads every key of the host cache; ",
                "the device selection scores with rr or quest");
  check_select(p, cfg, false);
  const KVCacheConfig& c = p.device_cache->config();
  const int64_t rows = p.q.shape[0] * c.kv_heads;
  out.reserve(rows, p.device_cache->max_pages(), int(p.q.shape[1]) / c.kv_heads);
  decode_detail::select_cuda(p, cfg, *out.dev_);
  out.rows_ = rows;
  out.kv_heads_ = c.kv_heads;
}

PageSelection select_pages(const DecodeParams& p, const PageSelectConfig& cfg) {
  const auto t0 = std::chrono::steady_clock::now();
  ARIADNE_CHECK(!cfg.advance_step, "select_pages: advance_step moves the device counter of a CudaPageSelection; ",
                "a host selection takes the step itself (PageSelectConfig::step)");
  check_select(p, cfg, true);
  const KVCacheConfig& c = p.cache->config();
  const int64_t B = p.q.shape[0];
  PageSelection sel;
  sel.kv_heads = c.kv_heads;
  sel.row_ptr.push_back(0);
  std::vector<std::vector<int32_t>> rows(size_t(B * c.kv_heads));
  std::vector<float> masses(rows.size(), 0.f);
  std::vector<int32_t> visible(rows.size(), 0);
#pragma omp parallel for schedule(dynamic, 1) num_threads(cpu_threads()) if (B * c.kv_heads > 1)
  for (int64_t r = 0; r < B * c.kv_heads; ++r) {
    const int64_t b = r / c.kv_heads;
    const int g = int(r % c.kv_heads);
    const Visible vis = visible_of(p.cache->length(p.seqs[size_t(b)]), p.window, c.page_size);
    const int64_t n = vis.pages();
    visible[size_t(r)] = int32_t(std::max<int64_t>(n, 0));
    if (n <= 0) continue;
    const std::vector<double> score = group_mean(
        cfg.scorer == PageScorer::oracle ? oracle_weights(p, b, g, vis) : summary_weights(p, b, g, vis, cfg), n);
    std::vector<float> f(score.begin(), score.end());
    std::vector<int32_t> forced;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t page = vis.page_lo + i;
      if (page < cfg.sink_pages || i >= n - cfg.recent_pages) forced.push_back(int32_t(i));
    }
    std::vector<int32_t> keep = select_blocks(f.data(), n, cfg.tau, forced, false);
    double mass = 0;
    for (int32_t& i : keep) {
      mass += score[size_t(i)];
      i += int32_t(vis.page_lo);
    }
    masses[size_t(r)] = float(mass);
    rows[size_t(r)] = std::move(keep);
  }
  for (const std::vector<int32_t>& row : rows) {
    sel.pages.insert(sel.pages.end(), row.begin(), row.end());
    sel.row_ptr.push_back(int32_t(sel.pages.size()));
  }
  sel.visible = std::move(visible);
  sel.kept_mass = std::move(masses);
  sel.ms_select = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return sel;
}

}  // namespace ariadne
