// The estimator entry point: validation, geometry, selection and the CSR mask.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "estimate/internal.hpp"

namespace ariadne {

const char* estimator_name(Estimator e) {
  switch (e) {
    case Estimator::rr: return "rr";
    case Estimator::xattn: return "xattn";
    case Estimator::oracle: return "oracle";
    case Estimator::flexprefill: return "flexprefill";
  }
  return "?";
}

Estimator parse_estimator(const std::string& s) {
  if (s == "rr") return Estimator::rr;
  if (s == "xattn") return Estimator::xattn;
  if (s == "oracle") return Estimator::oracle;
  if (s == "flexprefill") return Estimator::flexprefill;
  detail::fail("estimator: unknown method '", s, "', expected rr, xattn, oracle or flexprefill");
}

const char* rr_offset_name(RROffset o) { return o == RROffset::paper ? "paper" : "released"; }

RROffset parse_rr_offset(const std::string& s) {
  if (s == "paper") return RROffset::paper;
  if (s == "released") return RROffset::released;
  detail::fail("estimator: unknown RR sampling offset '", s, "', expected paper or released");
}

const char* rr_schedule_name(RRSchedule s) {
  switch (s) {
    case RRSchedule::head: return "head";
    case RRSchedule::none: return "none";
    case RRSchedule::layer: return "layer";
    case RRSchedule::hybrid: return "hybrid";
  }
  return "?";
}

RRSchedule parse_rr_schedule(const std::string& s) {
  for (const RRSchedule r : {RRSchedule::head, RRSchedule::none, RRSchedule::layer, RRSchedule::hybrid})
    if (s == rr_schedule_name(r)) return r;
  detail::fail("estimator: unknown RR schedule '", s, "', expected head, none, layer or hybrid");
}

int rr_rotation(RRSchedule schedule, int head, int32_t layer) {
  switch (schedule) {
    case RRSchedule::head: return head;
    case RRSchedule::none: return 0;
    case RRSchedule::layer: return layer;
    case RRSchedule::hybrid: return head + layer;  // both >= 0 and below 2^31 / 2: no overflow
  }
  return head;
}

namespace {
constexpr std::pair<CudaScoring, const char*> kScoringNames[] = {
    {CudaScoring::automatic, "automatic"},     {CudaScoring::wgmma_approximate, "wgmma_approximate"},
    {CudaScoring::wgmma_exact, "wgmma_exact"}, {CudaScoring::mma_grouped, "mma_grouped"},
    {CudaScoring::mma_rr, "mma_rr"},           {CudaScoring::mma_generic, "mma_generic"},
    {CudaScoring::f32, "f32"},
};
}  // namespace

const char* cuda_scoring_name(CudaScoring s) {
  for (const auto& [k, name] : kScoringNames)
    if (k == s) return name;
  return "?";
}

CudaScoring parse_cuda_scoring(const std::string& s) {
  for (const auto& [k, name] : kScoringNames)
    if (s == name) return k;
  detail::fail("estimator: unknown CUDA scoring kernel '", s,
               "', expected automatic, wgmma_approximate, wgmma_exact, mma_grouped, mma_rr, mma_generic or f32");
}

Protections Protections::published(Estimator e) {
  switch (e) {
    case Estimator::rr: return Protections{true, true, true};
    case Estimator::xattn: return Protections{false, true, true};
    case Estimator::oracle: return Protections{};
    case Estimator::flexprefill: return Protections{};  // its rule keeps column 0 and the diagonal
  }
  return Protections{};
}

void validate(const EstimateConfig& c, int heads_q) {
  ARIADNE_CHECK(c.block > 0, "estimate config: block is ", c.block, ", expected > 0");
  ARIADNE_CHECK(c.stride > 0, "estimate config: stride is ", c.stride, ", expected > 0");
  ARIADNE_CHECK(c.block % c.stride == 0, "estimate config: stride ", c.stride,
                " does not divide block ", c.block, " (query strides must not straddle blocks)");
  ARIADNE_CHECK(c.tau > 0 && c.tau <= 1, "estimate config: tau is ", c.tau, ", expected in (0, 1]");
  ARIADNE_CHECK(c.tau_per_head.empty() || int64_t(c.tau_per_head.size()) == heads_q,
                "estimate config: tau_per_head has ", c.tau_per_head.size(),
                " entries, expected 0 or heads_q = ", heads_q);
  for (size_t h = 0; h < c.tau_per_head.size(); ++h)
    ARIADNE_CHECK(c.tau_per_head[h] > 0 && c.tau_per_head[h] <= 1, "estimate config: tau_per_head[",
                  h, "] is ", c.tau_per_head[h], ", expected in (0, 1]");
  ARIADNE_CHECK(std::isfinite(c.scale) && c.scale >= 0, "estimate config: scale is ", c.scale,
                ", expected a finite value >= 0 (0 selects 1/sqrt(head_dim))");
  ARIADNE_CHECK(c.layer >= 0 && c.layer < (1 << 30), "estimate config: layer is ", c.layer,
                ", expected in [0, 2^30)");
  ARIADNE_CHECK(std::isfinite(c.flex_js_tau) && c.flex_js_tau >= 0, "estimate config: flex_js_tau is ",
                c.flex_js_tau, ", expected a finite value >= 0");
  ARIADNE_CHECK(c.flex_min_budget >= 0 && c.flex_min_budget < (int64_t(1) << 40), "estimate config: flex_min_budget is ",
                c.flex_min_budget, ", expected in [0, 2^40) tokens");
  ARIADNE_CHECK(c.flex_max_budget >= 0 && c.flex_max_budget < (int64_t(1) << 40), "estimate config: flex_max_budget is ",
                c.flex_max_budget, ", expected in [0, 2^40) tokens (0: none)");
}

namespace est {

Geometry make_geometry(const TensorView& q, const TensorView& k, const Pattern& layout,
                       int64_t block, int64_t stride, Device device) {
  for (const auto& [t, name] : {std::pair{&q, "q"}, std::pair{&k, "k"}}) {
    ARIADNE_CHECK(t->defined(), "estimate: ", name, " is not set");
    require_rank(*t, name, 3);
    require_dtype(*t, name, {DType::f32, DType::bf16, DType::f16});
    require_device(*t, name, device);
    require_inner_contiguous(*t, name);
  }
  Geometry g;
  g.total_q = q.shape[0];
  g.total_k = k.shape[0];
  g.heads_q = int(q.shape[1]);
  g.heads_kv = int(k.shape[1]);
  g.dim = int(q.shape[2]);
  ARIADNE_CHECK(g.heads_q > 0 && g.heads_kv > 0 && g.dim > 0, "estimate: q ", q.describe(), " and k ",
                k.describe(), " need heads and head_dim > 0");
  require_dim(k, "k", 2, g.dim, "head_dim (must equal q's)");
  ARIADNE_CHECK(g.heads_q % g.heads_kv == 0, "k: dim 1 (heads_kv) is ", g.heads_kv,
                ", expected a divisor of q's heads_q = ", g.heads_q);
  g.group = g.heads_q / g.heads_kv;
  g.block = block;
  g.stride = stride;

  ARIADNE_CHECK(layout.is_causal() && layout.chunk == 0 && !layout.blocks.defined(),
                "estimate: layout pattern is ", describe(layout),
                ", expected causal (optionally varlen): the estimators build causal block masks");
  ARIADNE_CHECK(layout.num_seqs >= 1, "estimate: layout num_seqs is ", layout.num_seqs, ", expected >= 1");
  ARIADNE_CHECK(layout.cu_seqlens_q != nullptr || layout.num_seqs == 1,
                "estimate: layout has num_seqs = ", layout.num_seqs, " but no cu_seqlens_q");
  if (layout.cu_seqlens_q) {
    const int32_t* cq = layout.cu_seqlens_q;
    const int32_t* ck = layout.cu_seqlens_k ? layout.cu_seqlens_k : cq;
    ARIADNE_CHECK(cq[0] == 0 && ck[0] == 0, "estimate: cu_seqlens must start at 0");
    ARIADNE_CHECK(cq[layout.num_seqs] == g.total_q, "estimate: cu_seqlens_q ends at ", cq[layout.num_seqs],
                  ", expected total_q = ", g.total_q);
    ARIADNE_CHECK(ck[layout.num_seqs] == g.total_k, "estimate: cu_seqlens_k ends at ", ck[layout.num_seqs],
                  ", expected total_k = ", g.total_k);
    for (int32_t s = 0; s < layout.num_seqs; ++s)
      ARIADNE_CHECK(cq[s + 1] >= cq[s] && ck[s + 1] >= ck[s], "estimate: cu_seqlens decrease at sequence ", s);
  }
  int64_t block_base = 0;
  for (int32_t s = 0; s < layout.num_seqs; ++s) {
    const SeqExtent x = layout.seq(s, g.total_q, g.total_k);
    ARIADNE_CHECK(x.lq <= x.lk, "estimate: sequence ", s, " has ", x.lq, " queries and ", x.lk,
                  " keys, expected lq <= lk (queries are the last lq positions)");
    Seq e;
    e.q0 = x.q0;
    e.k0 = x.k0;
    e.lq = x.lq;
    e.lk = x.lk;
    e.off = x.lk - x.lq;
    e.nqb = (e.lq + block - 1) / block;
    e.nqs = (e.lq + stride - 1) / stride;
    e.nks = (e.lk + stride - 1) / stride;
    e.row_base = block_base * g.heads_q;
    e.qs_base = g.total_qs;
    e.ks_base = g.total_ks;
    block_base += e.nqb;
    g.total_qs += e.nqs;
    g.total_ks += e.nks;
    g.seqs.push_back(e);
  }
  g.rows = block_base * g.heads_q;
  return g;
}

Geometry::Row Geometry::row(int64_t r) const {
  // The last sequence whose first row is <= r (empty sequences share the next one's row_base and
  // come before it, so the search lands on the sequence that owns r).
  const auto it = std::upper_bound(seqs.begin(), seqs.end(), r,
                                   [](int64_t x, const Seq& e) { return x < e.row_base; });
  ARIADNE_CHECK(it != seqs.begin() && r < rows, "estimate: row ", r, " out of range (internal)");
  const Seq& e = *(it - 1);
  const int64_t local = r - e.row_base;
  return Row{int32_t(it - 1 - seqs.begin()), int32_t(local / e.nqb), local % e.nqb};
}

std::vector<Geometry::Row> Geometry::rows_of_head(int h) const {
  std::vector<Row> out;
  for (size_t s = 0; s < seqs.size(); ++s)
    for (int64_t m = 0; m < seqs[s].nqb; ++m) out.push_back(Row{int32_t(s), h, m});
  return out;
}

void load_row(const TensorView& t, int64_t token, int64_t head, float mul, float* dst) {
  const int64_t d = t.shape[2];
  const int64_t off = token * t.stride[0] + head * t.stride[1];
  switch (t.dtype) {
    case DType::f32: {
      const float* p = static_cast<const float*>(t.data) + off;
      for (int64_t i = 0; i < d; ++i) dst[i] = p[i] * mul;
      break;
    }
    case DType::bf16: {
      const uint16_t* p = static_cast<const uint16_t*>(t.data) + off;
      for (int64_t i = 0; i < d; ++i) dst[i] = bf16_to_float(p[i]) * mul;
      break;
    }
    case DType::f16: {
      const uint16_t* p = static_cast<const uint16_t*>(t.data) + off;
      for (int64_t i = 0; i < d; ++i) dst[i] = f16_to_float(p[i]) * mul;
      break;
    }
    case DType::f64: {  // refused by make_geometry; kept total
      const double* p = static_cast<const double*>(t.data) + off;
      for (int64_t i = 0; i < d; ++i) dst[i] = float(p[i]) * mul;
      break;
    }
  }
}

namespace {
bool have_avx2() {
#if defined(__x86_64__)
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
#else
  return false;
#endif
}
}  // namespace

void dot_rows_generic(const float* a, int64_t rows, const float* b, int64_t cols, int64_t len,
                      float* c, int64_t ldc) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) {
      float s = 0;
      for (int64_t t = 0; t < len; ++t) s += a[r * len + t] * b[j * len + t];
      c[r * ldc + j] = s;
    }
}

void dot_rows(const float* a, int64_t rows, const float* b, int64_t cols, int64_t len, float* c,
              int64_t ldc) {
#if defined(__x86_64__)
  if (have_avx2()) return dot_rows_avx2(a, rows, b, cols, len, c, ldc);
#endif
  dot_rows_generic(a, rows, b, cols, len, c, ldc);
}

double exp_sum_generic(float* x, int64_t n, float mx) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    s += x[i];
  }
  return s;
}


double exp_sum(float* x, int64_t n, float mx) {
#if defined(__x86_64__)
  if (have_avx2()) return exp_sum_avx2(x, n, mx);
#endif
  return exp_sum_generic(x, n, mx);
}

void row_score_ptr(const Geometry& g, int64_t* out) {
  out[0] = 0;
  for (const Seq& e : g.seqs)
    for (int h = 0; h < g.heads_q; ++h)
      for (int64_t m = 0; m < e.nqb; ++m) out[e.row_base + h * e.nqb + m + 1] = g.diag(e, m) + 1;
  std::partial_sum(out, out + g.rows + 1, out);
}

void init_row_geometry(const Geometry& g, EstimateResult& r, const int64_t* score_ptr) {
  r.heads = g.heads_q;
  r.score_ptr.resize(size_t(g.rows) + 1);
  if (score_ptr != nullptr)
    std::copy(score_ptr, score_ptr + g.rows + 1, r.score_ptr.begin());
  else
    row_score_ptr(g, r.score_ptr.data());
  r.row_queries.resize(size_t(g.rows));
  for (const Seq& e : g.seqs)
    for (int h = 0; h < g.heads_q; ++h)
      for (int64_t m = 0; m < e.nqb; ++m)
        r.row_queries[size_t(e.row_base + h * e.nqb + m)] = int32_t(g.queries_in(e, m));
}

void init_rows(const Geometry& g, EstimateResult& r) {
  init_row_geometry(g, r);
  r.scores.assign(size_t(r.score_ptr.back()), 0.f);
}

}  // namespace est

DeviceEstimate DeviceEstimate::from_mask(const BlockMask& mask) {
  DeviceEstimate d;
  d.block = mask.block;
  d.heads = mask.heads;
  d.seq_block_base = DeviceBuffer::from_ints(mask.seq_block_base);
  d.row_ptr = DeviceBuffer::from_ints(mask.row_ptr);
  // One int of room when the mask keeps nothing, so the pointer is valid.
  d.col_idx = DeviceBuffer::from_ints(mask.col_idx.empty() ? std::vector<int32_t>{0} : mask.col_idx);
  return d;
}

BlockSparseView mask_view_on(Device device, const BlockMask& mask, DeviceEstimate& device_copy) {
  if (device == Device::cpu) return mask.view();
  device_copy = DeviceEstimate::from_mask(mask);
  return device_copy.view();
}

BlockSparseView DeviceEstimate::view() const {
  BlockSparseView v;
  v.block = block;
  v.heads = heads;
  v.seq_block_base = static_cast<const int32_t*>(seq_block_base.data());
  v.row_ptr = static_cast<const int32_t*>(row_ptr.data());
  v.col_idx = static_cast<const int32_t*>(col_idx.data());
  return v;
}

std::vector<int32_t> select_blocks(const float* scores, int64_t n, double tau,
                                   const std::vector<int32_t>& forced, bool forced_first) {
  std::vector<char> keep(size_t(n), 0);
  for (int32_t f : forced) {
    ARIADNE_CHECK(f >= 0 && f < n, "select_blocks: forced block ", f, " outside 0..", n - 1);
    keep[size_t(f)] = 1;
  }
  if (tau >= 1) {
    // Rounding can make the cumulative sum reach the total before the last (tiny) block; τ = 1
    // means "every visible block" by definition.
    std::fill(keep.begin(), keep.end(), 1);
  } else {
    double total = 0;
    for (int64_t i = 0; i < n; ++i) total += scores[i];
    const double need = tau * total;
    std::vector<int32_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int32_t x, int32_t y) {
      return scores[x] > scores[y] || (scores[x] == scores[y] && x < y);
    });
    // XAttention counts the forced blocks' mass first; RRAttention OR-s them in afterwards.
    double cum = 0;
    if (forced_first)
      for (int64_t i = 0; i < n; ++i)
        if (keep[size_t(i)]) cum += scores[i];
    for (int32_t i : order) {
      if (forced_first && keep[size_t(i)]) continue;
      if (!(cum < need)) break;
      keep[size_t(i)] = 1;
      cum += scores[i];
    }
  }
  std::vector<int32_t> out;
  for (int64_t i = 0; i < n; ++i)
    if (keep[size_t(i)]) out.push_back(int32_t(i));
  return out;
}

BlockMask select_mask(const EstimateResult& scored, const EstimateConfig& config, EstimateStats* stats) {
  const BlockMask& geo = scored.mask;
  const int heads = scored.heads;
  validate(config, heads);
  ARIADNE_CHECK(geo.block == config.block, "select_mask: the scores' blocks are ", geo.block,
                " tokens, config.block is ", config.block);
  ARIADNE_CHECK(geo.heads == heads && heads > 0, "select_mask: mask heads ", geo.heads,
                ", expected the result's heads = ", heads);
  ARIADNE_CHECK(!geo.seq_block_base.empty() && geo.seq_block_base.front() == 0,
                "select_mask: the result has no row geometry (mask.seq_block_base)");
  const int64_t rows = int64_t(geo.seq_block_base.back()) * heads;
  ARIADNE_CHECK(rows == scored.rows() && int64_t(scored.score_ptr.size()) == rows + 1,
                "select_mask: ", scored.rows(), " score rows, expected ", rows,
                " (seq_block_base × heads)");
  ARIADNE_CHECK(int64_t(scored.scores.size()) == scored.score_ptr.back(), "select_mask: the result holds ",
                scored.scores.size(), " host scores, expected ", scored.score_ptr.back(),
                " (a CUDA estimate needs host_copy = true)");

  // Per row: its query head and whether it is its sequence's last query block.
  std::vector<int32_t> row_head(size_t(rows), 0);
  std::vector<char> row_last(size_t(rows), 0);
  for (size_t s = 0; s + 1 < geo.seq_block_base.size(); ++s) {
    const int64_t base = int64_t(geo.seq_block_base[s]) * heads;
    const int64_t nqb = geo.seq_block_base[s + 1] - geo.seq_block_base[s];
    for (int h = 0; h < heads; ++h)
      for (int64_t m = 0; m < nqb; ++m) {
        row_head[size_t(base + h * nqb + m)] = h;
        row_last[size_t(base + h * nqb + m)] = m == nqb - 1;
      }
  }

  ARIADNE_CHECK(config.method != Estimator::flexprefill,
                "select_mask: flexprefill selects by its own rule, not a threshold on its scores (run estimate() "
                "again at each γ)");
  // One row at a time, in parallel; the CSR is then assembled in row order.
  const Protections prot = config.protections();
  const bool forced_first = config.method == Estimator::xattn;
  std::vector<std::vector<int32_t>> lists(static_cast<size_t>(rows));
#pragma omp parallel for schedule(dynamic, 16) num_threads(cpu_threads())
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t nvis = scored.visible(row);
    std::vector<int32_t> forced;
    if (prot.sink) forced.push_back(0);
    if (prot.diagonal && nvis - 1 != 0) forced.push_back(int32_t(nvis - 1));
    const bool whole = prot.last_row && row_last[size_t(row)];
    lists[size_t(row)] = select_blocks(scored.scores.data() + scored.score_ptr[size_t(row)], nvis,
                                       whole ? 1.0 : config.tau_of(row_head[size_t(row)]), forced, forced_first);
  }
  return est::assemble_mask(scored, lists, row_head, stats);
}

namespace est {

BlockMask assemble_mask(const EstimateResult& scored, const std::vector<std::vector<int32_t>>& lists,
                        const std::vector<int32_t>& row_head, EstimateStats* stats) {
  const BlockMask& geo = scored.mask;
  const int heads = scored.heads;
  const int64_t rows = int64_t(lists.size());
  BlockMask mask;
  mask.block = geo.block;
  mask.heads = heads;
  mask.seq_block_base = geo.seq_block_base;
  mask.row_ptr.assign(size_t(rows) + 1, 0);
  for (int64_t row = 0; row < rows; ++row)
    mask.row_ptr[size_t(row) + 1] = mask.row_ptr[size_t(row)] + int32_t(lists[size_t(row)].size());
  mask.col_idx.reserve(size_t(mask.row_ptr.back()));
  for (const auto& l : lists) mask.col_idx.insert(mask.col_idx.end(), l.begin(), l.end());

  if (stats) {
    // Density per head: kept over causally visible blocks.
    std::vector<int64_t> kept(size_t(heads), 0), vis(size_t(heads), 0);
    for (int64_t row = 0; row < rows; ++row) {
      kept[size_t(row_head[size_t(row)])] += int64_t(lists[size_t(row)].size());
      vis[size_t(row_head[size_t(row)])] += scored.visible(row);
    }
    stats->kept_blocks = 0;
    stats->visible_blocks = 0;
    stats->density_per_head.assign(size_t(heads), 0.0);
    for (int h = 0; h < heads; ++h) {
      stats->kept_blocks += kept[size_t(h)];
      stats->visible_blocks += vis[size_t(h)];
      stats->density_per_head[size_t(h)] = vis[size_t(h)] ? double(kept[size_t(h)]) / double(vis[size_t(h)]) : 0.0;
    }
    stats->density = stats->visible_blocks ? double(stats->kept_blocks) / double(stats->visible_blocks) : 0.0;
  }
  return mask;
}

}  // namespace est

namespace {
// automatic follows q's device; the explicit backends stay as asked.
Backend resolve(Backend backend, const TensorView& q) {
  if (backend != Backend::automatic) return backend;
  return q.device == Device::cuda ? Backend::cuda : Backend::cpu;
}
}  // namespace

bool estimate_supports(Backend backend, const TensorView& q, std::string* why) {
  auto say = [&](const std::string& w) {
    if (why) *why = w;
    return false;
  };
  if (resolve(backend, q) == Backend::cuda) {
#if defined(ARIADNE_WITH_CUDA)
    const std::string no = est::estimate_cuda_refusal(q, nullptr);
    return no.empty() ? true : say(no);
#else
    return say("this build has no CUDA backend (configure with nvcc present)");
#endif
  }
  if (q.device != Device::cpu) return say("the CPU estimators need host tensors");
  return true;
}

EstimateResult estimate(const TensorView& q, const TensorView& k, const Pattern& layout,
                        const EstimateConfig& config, Backend backend) {
  const auto t0 = std::chrono::steady_clock::now();
  std::string why;
  ARIADNE_CHECK(estimate_supports(backend, q, &why), "estimate: backend ", backend_name(backend),
                " cannot run: ", why);
  ARIADNE_CHECK(q.defined() && q.rank == 3, "estimate: q must be [total_q, heads_q, head_dim], got ",
                q.describe());
  validate(config, int(q.shape[1]));
#if defined(ARIADNE_WITH_CUDA)
  if (resolve(backend, q) == Backend::cuda) {
    const std::string no = est::estimate_cuda_refusal(q, &config);
    ARIADNE_CHECK(no.empty(), "estimate: backend cuda cannot run: ", no);
    return est::estimate_cuda(q, k, layout, config);
  }
#endif
  const est::Geometry g = est::make_geometry(q, k, layout, config.block, config.stride);
  const float scale = config.scale > 0 ? config.scale : float(1.0 / std::sqrt(double(g.dim)));

  EstimateResult r;
  est::init_rows(g, r);
  double ms_sampling = 0;
  const auto t_score = std::chrono::steady_clock::now();
  std::vector<std::vector<int32_t>> flex_lists;  // flexprefill: its own selection, per row
  if (config.method == Estimator::flexprefill) r.stats.mac = est::score_flexprefill(g, q, k, config, scale, r, flex_lists);
  else if (config.method == Estimator::oracle) r.stats.mac = est::score_oracle(g, q, k, scale, r, ms_sampling);
  else r.stats.mac = est::score_strided(g, q, k, config, scale, r, ms_sampling);
  r.stats.ms_sampling = ms_sampling;
  r.stats.ms_scoring = est::ms_since(t_score) - ms_sampling;

  // Selection: the mask's row geometry, then select_mask on the scores.
  const auto t_sel = std::chrono::steady_clock::now();
  r.mask.block = config.block;
  r.mask.heads = g.heads_q;
  r.mask.seq_block_base.assign(1, 0);
  for (const est::Seq& e : g.seqs)
    r.mask.seq_block_base.push_back(r.mask.seq_block_base.back() + int32_t(e.nqb));
  if (config.method == Estimator::flexprefill) {
    std::vector<int32_t> row_head(size_t(g.rows));
    for (int64_t row = 0; row < g.rows; ++row) row_head[size_t(row)] = g.row(row).h;
    const Protections prot = config.protections();
    for (int64_t row = 0; row < g.rows; ++row) {  // protections asked for, OR-ed in
      std::vector<int32_t>& l = flex_lists[size_t(row)];
      const est::Geometry::Row rw = g.row(row);
      const est::Seq& e = g.seqs[size_t(rw.s)];
      const int64_t nvis = r.visible(row);
      if (prot.sink) l.push_back(0);
      if (prot.diagonal) l.push_back(int32_t(nvis - 1));
      if (prot.last_row && rw.m == e.nqb - 1)
        for (int64_t c = 0; c < nvis; ++c) l.push_back(int32_t(c));
      std::sort(l.begin(), l.end());
      l.erase(std::unique(l.begin(), l.end()), l.end());
    }
    r.mask = est::assemble_mask(r, flex_lists, row_head, &r.stats);
  } else {
    r.mask = select_mask(r, config, &r.stats);
  }
  EstimateStats& st = r.stats;
  st.ms_selection = est::ms_since(t_sel);
  st.ms_total = est::ms_since(t0);
  return r;
}

}  // namespace ariadne

namespace ariadne {

Buffer rr_key_sums(const TensorView& k, int32_t stride) {
  ARIADNE_CHECK(k.defined(), "rr_key_sums: k is not set");
  require_rank(k, "k", 3);
  require_dtype(k, "k", {DType::f32, DType::bf16, DType::f16});
  require_device(k, "k", Device::cpu);
  require_inner_contiguous(k, "k");
  ARIADNE_CHECK(stride > 0, "rr_key_sums: stride is ", stride, ", expected > 0");
  const int64_t n = k.shape[0], hkv = k.shape[1], d = k.shape[2], ns = (n + stride - 1) / stride;
  Buffer sums(DType::f32, {ns, hkv, d});
  sums.fill(0.f);
  std::vector<float> tmp(static_cast<size_t>(d));
  for (int64_t j = 0; j < ns; ++j)
    for (int64_t kh = 0; kh < hkv; ++kh)
      est::sum_key_stride(k, j * stride, std::min<int64_t>(stride, n - j * stride), kh, tmp.data(),
                          sums.as<float>() + (j * hkv + kh) * d);
  return sums;
}

EstimateResult estimate_rr_from_key_sums(const TensorView& q, const TensorView& key_sums, int64_t q_pos,
                                         int64_t seq_len, const EstimateConfig& config) {
  const auto t0 = std::chrono::steady_clock::now();
  ARIADNE_CHECK(q.defined() && key_sums.defined(), "estimate_rr_from_key_sums: q and key_sums must be set");
  require_rank(q, "q", 3);
  require_dtype(q, "q", {DType::f32, DType::bf16, DType::f16});
  require_device(q, "q", Device::cpu);
  require_inner_contiguous(q, "q");
  require_rank(key_sums, "key_sums", 3);
  require_dtype(key_sums, "key_sums", {DType::f32});
  require_device(key_sums, "key_sums", Device::cpu);
  require_inner_contiguous(key_sums, "key_sums");
  validate(config, int(q.shape[1]));
  ARIADNE_CHECK(config.method == Estimator::rr, "estimate_rr_from_key_sums: method is ",
                estimator_name(config.method),
                ", expected rr (the only estimator that reads keys only as stride sums)");
  est::Geometry g;
  g.heads_q = int(q.shape[1]);
  g.heads_kv = int(key_sums.shape[1]);
  g.dim = int(q.shape[2]);
  require_dim(key_sums, "key_sums", 2, g.dim, "head_dim (must equal q's)");
  ARIADNE_CHECK(g.heads_kv > 0 && g.heads_q % g.heads_kv == 0, "key_sums: dim 1 (heads_kv) is ", g.heads_kv,
                ", expected a divisor of q's heads_q = ", g.heads_q);
  const int64_t n_q = q.shape[0], B = config.block, S = config.stride;
  ARIADNE_CHECK(q_pos >= 0 && q_pos % B == 0, "estimate_rr_from_key_sums: q_pos is ", q_pos,
                ", expected a multiple of the block ", B, " (>= 0)");
  ARIADNE_CHECK(n_q >= 1 && q_pos + n_q <= seq_len, "estimate_rr_from_key_sums: queries [", q_pos, ", ", q_pos + n_q,
                ") do not lie in a sequence of ", seq_len, " tokens");
  g.group = g.heads_q / g.heads_kv;
  g.block = B;
  g.stride = S;
  est::Seq e;
  e.lq = n_q;
  e.lk = q_pos + n_q;
  e.off = q_pos;
  e.nqb = (n_q + B - 1) / B;
  e.nqs = (n_q + S - 1) / S;
  e.nks = (e.lk + S - 1) / S;
  ARIADNE_CHECK(key_sums.shape[0] >= e.nks, "key_sums: dim 0 (key strides) is ", key_sums.shape[0],
                ", expected >= ", e.nks, " (the strides of the keys up to the last query)");
  g.total_q = n_q;
  g.total_k = e.lk;
  g.seqs = {e};
  g.rows = e.nqb * g.heads_q;
  g.total_qs = e.nqs;
  g.total_ks = e.nks;

  const float scale = config.scale > 0 ? config.scale : float(1.0 / std::sqrt(double(g.dim)));
  EstimateResult r;
  est::init_rows(g, r);
  double ms_sampling = 0;
  const auto t_score = std::chrono::steady_clock::now();
  r.stats.mac = est::score_strided(g, q, TensorView{}, config, scale, r, ms_sampling, &key_sums);
  r.stats.ms_sampling = ms_sampling;
  r.stats.ms_scoring = est::ms_since(t_score) - ms_sampling;

  const auto t_sel = std::chrono::steady_clock::now();
  r.mask.block = config.block;
  r.mask.heads = g.heads_q;
  r.mask.seq_block_base = {0, int32_t(e.nqb)};
  EstimateConfig c = config;
  Protections prot = config.protections();
  prot.last_row = prot.last_row && q_pos + n_q == seq_len;  // only the sequence's own last block
  c.protect = prot;
  r.mask = select_mask(r, c, &r.stats);
  r.stats.ms_selection = est::ms_since(t_sel);
  r.stats.ms_total = est::ms_since(t0);
  return r;
}

}  // namespace ariadne
