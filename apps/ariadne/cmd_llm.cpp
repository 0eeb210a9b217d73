// ariadne llm — runs a Llama-architecture GGUF model (SmolLM2-135M) with block-sparse prefill and
// scores retrieval tasks; or prints the top logits / a greedy continuation of a prompt.
//
//   ariadne llm --gguf FILE --task passkey --tokens 4096 --method rr --json
//   ariadne llm --gguf FILE --task passkey,niah --tokens 1024,2048 --method dense,rr,xattn
//               --tau 0.9,0.95 --stride 8,16 --seeds 4 --depths 0.1,0.5,0.9 --compare --json
//   ariadne llm --gguf FILE --prompt "The capital of France is" --new 8
//   ariadne llm --gguf FILE --task passkey --tokens 8192 --depths 0.5 --method dense --dump DIR
//   ariadne llm --qk DIR --method rr,xattn --offset paper,released --tau 0.95 --stride 8,16 --repeat 3
//               (the estimators on the dumped real heads of every layer, no model: estimate time,
//               density, mass recall, block F1, and with v_LL.npy attention time and output error;
//               --layer L,... picks layers)
//
// Options: --block B (128), --offset paper,released (RR's sampling offsets: each is a method of
// its own), --new N (tokens generated, 8), --compare (per layer of each sparse run: oracle metrics
// and output error vs dense; ~3x the attention work), --probe (the dense run of each instance also
// scores every sparse configuration's mask against the oracle on its real q/k: density, mass
// recall, block F1 per layer and head, and where the mask differs from the oracle's), --probe-tau,
// --probe-stride (the probes' τ and S lists; default --tau and --stride), --probe-protect (lists of
// protections the probes run under: published, none, or sink/diagonal/last_row joined by '+'),
// --run-protect (the same lists for the generation runs, where "+previous" also keeps key block
// diag(m) − 1 in every row: an experiment), --probe-outputs (and their attention output error vs
// dense, per layer), --probe-tau-sweep T0,T1,... (each probe's scores and its oracle's masses also
// selected anew at every τ of the list, each in (0, 1]: one scoring pass per probe, no other; the
// summary's probe entries gain `tau_sweep`, the curve of density, mass recall and block
// precision/recall/F1 pooled over layers and instances like the probe's own figures), --accuracy 0 (skip the
// sparse generation runs: mask metrics only), --layers (per-layer and per-head rows in the JSON),
// --dump DIR (q/k .npy of the first task's dense run: q_LL.npy [heads, tokens, head_dim] and
// k_LL.npy, v_LL.npy [kv_heads, tokens, head_dim] per layer LL, f32, q/k after RoPE; --qk reads them),
// --backend cpu|reference|cuda (cuda: the whole model on the GPU, bf16 weights and activations,
// the CUDA attention and estimators; cpu/reference: the CPU model with that attention backend),
// --threads N. Without --gguf the model is looked up as llm_model_path()
// says (llm.hpp).
// Every run of a task instance under dense is the anchor of its accuracy ratio.
#include <algorithm>
#include <array>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>

#include "ariadne/gguf.hpp"
#include "ariadne/llm.hpp"
#include "workloads/llm_tasks.hpp"
#include "ariadne/npy.hpp"
#include "ariadne/tokenizer.hpp"
#include "cli.hpp"

namespace {

using namespace ariadne;
using nlohmann::json;

struct MethodSpec {
  std::string name;  // "dense" or an estimator
  double tau = 1;
  int stride = 0;
  RROffset offset = RROffset::paper;  // rr only
  std::string protect = "published";  // a --probe-protect entry
  std::string label() const {
    if (name == "dense") return "dense";
    std::ostringstream os;
    os << name;
    if (name == "rr") os << " " << rr_offset_name(offset);
    os << " tau=" << tau << " S=" << stride;
    if (protect != "published") os << " protect=" << protect;
    return os.str();
  }
};

std::vector<std::string> split_plus(const std::string& s) {
  std::vector<std::string> out;
  size_t a = 0;
  while (a <= s.size()) {
    const size_t b = std::min(s.find('+', a), s.size());
    out.push_back(s.substr(a, b - a));
    a = b + 1;
  }
  return out;
}

// "published" (each method's own), "none", or protections joined by '+': sink, diagonal,
// last_row; "previous" may be added to any of them (generation runs only: PrefillOptions::keep_previous).
std::optional<Protections> parse_protect(const std::string& s) {
  Protections p;
  bool published = false, explicit_set = false;
  for (const std::string& w : split_plus(s)) {
    if (w == "published") published = true;
    else if (w == "none" || w == "previous") continue;
    else if (w == "sink") p.sink = explicit_set = true;
    else if (w == "diagonal") p.diagonal = explicit_set = true;
    else if (w == "last_row") p.last_row = explicit_set = true;
    else ARIADNE_CHECK(false, "llm: protections '", s, "' have '", w,
                       "', expected published, none, or sink/diagonal/last_row (and previous) joined by '+'");
  }
  ARIADNE_CHECK(!(published && explicit_set), "llm: protections '", s, "' mix published with explicit ones");
  if (published) return std::nullopt;
  return p;
}

bool keeps_previous(const std::string& s) {
  for (const std::string& w : split_plus(s))
    if (w == "previous") return true;
  return false;
}

EstimateConfig estimate_config(const MethodSpec& m, int32_t block) {
  EstimateConfig ec;
  ec.method = parse_estimator(m.name);
  ec.tau = m.tau;
  ec.stride = m.stride;
  ec.block = block;
  ec.offset = m.offset;
  ec.protect = parse_protect(m.protect);
  return ec;
}

json breakdown_json(const MaskBreakdown& b) {
  return json{{"visible", b.visible}, {"kept", b.kept}, {"truth", b.truth}, {"tp", b.true_positive},
              {"fp_last_row", b.fp_last_row}, {"fp_sink", b.fp_sink}, {"fp_diagonal", b.fp_diagonal},
              {"fp_other", b.fp_other}, {"fn_last_row", b.fn_last_row}, {"fn_sink", b.fn_sink},
              {"fn_diagonal", b.fn_diagonal}, {"fn_other", b.fn_other}, {"rows_with_previous", b.rows_with_previous},
              {"previous_dropped", b.previous_dropped}, {"previous_dropped_by_oracle", b.previous_dropped_by_oracle}};
}

// Sums over layers (and heads) of mask metrics, for means over task instances.
struct LayerSums {
  // One τ sweep point's figures (LayerTrace::tau_sweep), summed per layer over instances.
  enum SweepField { kDensity, kMassRecall, kPrecision, kRecall, kF1, kOracleDensity, kSweepFields };
  int n = 0;
  std::vector<double> density, recall, f1, err, block_precision, block_recall;
  std::vector<std::vector<double>> recall_head, f1_head;
  std::vector<std::vector<MaskBreakdown>> breakdown;  // [layer][head], summed over instances
  std::vector<double> sweep_tau;                       // the τ list of the sweep (empty: none)
  std::vector<std::vector<std::array<double, kSweepFields>>> sweep;  // [τ][layer]
  void add(const std::vector<const LayerTrace*>& layers) {
    const size_t L = layers.size();
    density.resize(L), recall.resize(L), f1.resize(L), err.resize(L), recall_head.resize(L), f1_head.resize(L);
    block_precision.resize(L), block_recall.resize(L);
    breakdown.resize(L);
    for (size_t l = 0; l < L; ++l) {
      const LayerTrace& t = *layers[l];
      breakdown[l].resize(t.breakdown_per_head.size());
      for (size_t h = 0; h < t.breakdown_per_head.size(); ++h) breakdown[l][h] += t.breakdown_per_head[h];
      density[l] += t.density, recall[l] += t.mass_recall, f1[l] += t.f1, err[l] += t.out_rel_err;
      block_precision[l] += t.precision, block_recall[l] += t.recall;
      if (!t.tau_sweep.empty()) {
        if (sweep_tau.empty()) {
          for (const TauSweepPoint& p : t.tau_sweep) sweep_tau.push_back(p.tau);
          sweep.assign(sweep_tau.size(), std::vector<std::array<double, kSweepFields>>(L));
        }
        ARIADNE_CHECK(t.tau_sweep.size() == sweep_tau.size() && sweep[0].size() == L,
                      "llm: τ sweeps of different lengths pooled in one case");
        for (size_t i = 0; i < sweep_tau.size(); ++i) {
          const TauSweepPoint& p = t.tau_sweep[i];
          std::array<double, kSweepFields>& a = sweep[i][l];
          a[kDensity] += p.metrics.density, a[kMassRecall] += p.metrics.mass_recall;
          a[kPrecision] += p.metrics.precision, a[kRecall] += p.metrics.recall, a[kF1] += p.metrics.f1;
          a[kOracleDensity] += p.oracle_density;
        }
      }
      recall_head[l].resize(t.mass_recall_per_head.size());
      f1_head[l].resize(t.f1_per_head.size());
      for (size_t h = 0; h < t.mass_recall_per_head.size(); ++h) recall_head[l][h] += t.mass_recall_per_head[h];
      for (size_t h = 0; h < t.f1_per_head.size(); ++h) f1_head[l][h] += t.f1_per_head[h];
    }
    ++n;
  }
  static double mean(const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? 0 : s / double(v.size());
  }
  json to_json(bool heads) const {
    auto scaled = [&](std::vector<double> v) {
      for (double& x : v) x /= n;
      return v;
    };
    json j = {{"instances", n}, {"density", mean(density) / n}, {"mass_recall", mean(recall) / n},
              {"f1", mean(f1) / n}, {"precision", mean(block_precision) / n}, {"recall", mean(block_recall) / n},
              {"out_rel_err", mean(err) / n}};
    if (!sweep_tau.empty()) {
      // Each figure as the probe's own above: the mean over layers of its sum over instances / n.
      json sw = json::array();
      for (size_t i = 0; i < sweep_tau.size(); ++i) {
        std::array<std::vector<double>, kSweepFields> col;
        for (const auto& a : sweep[i])
          for (size_t f = 0; f < kSweepFields; ++f) col[f].push_back(a[f]);
        sw.push_back({{"tau", sweep_tau[i]}, {"density", mean(col[kDensity]) / n},
                      {"mass_recall", mean(col[kMassRecall]) / n}, {"block_precision", mean(col[kPrecision]) / n},
                      {"block_recall", mean(col[kRecall]) / n}, {"block_f1", mean(col[kF1]) / n},
                      {"oracle_density", mean(col[kOracleDensity]) / n}});
      }
      j["tau_sweep"] = sw;
    }
    json pl = json::array();
    MaskBreakdown all;
    for (size_t l = 0; l < density.size(); ++l) {
      json e = {{"layer", l}, {"density", density[l] / n}, {"mass_recall", recall[l] / n}, {"f1", f1[l] / n},
                {"out_rel_err", err[l] / n}};
      MaskBreakdown layer;
      for (const MaskBreakdown& b : breakdown[l]) layer += b;
      all += layer;
      if (heads) {
        e["mass_recall_per_head"] = scaled(recall_head[l]);
        e["f1_per_head"] = scaled(f1_head[l]);
        e["breakdown"] = breakdown_json(layer);
        json bh = json::array();
        for (const MaskBreakdown& b : breakdown[l]) bh.push_back(breakdown_json(b));
        e["breakdown_per_head"] = bh;
      }
      pl.push_back(e);
    }
    j["per_layer"] = pl;
    j["breakdown"] = breakdown_json(all);  // block counts summed over layers, heads and instances
    return j;
  }
};

struct Agg {
  int runs = 0, correct = 0;
  double density = 0, ms = 0;
  LayerSums own;    // --compare: metrics on the method's own run
  LayerSums probe;  // --probe: metrics on the dense run's q/k
};

json layer_json(const LayerTrace& t) {
  return json{{"density", t.density}, {"mass_recall", t.mass_recall}, {"precision", t.precision},
              {"recall", t.recall}, {"f1", t.f1}, {"out_rel_err", t.out_rel_err},
              {"mass_recall_per_head", t.mass_recall_per_head}, {"f1_per_head", t.f1_per_head},
              {"ms_estimate", t.ms_estimate}, {"ms_estimate_kernels", t.ms_estimate_kernels},
              {"ms_attention", t.ms_attention}};
}

// Head-major [heads, tokens, dim] (the dump layout) to packed [tokens, heads, dim].
std::vector<float> packed(const NpyArray& a, const std::string& what) {
  ARIADNE_CHECK(a.shape.size() == 3, a.name, ": ", what, " must be [heads, tokens, head_dim], got ", a.shape.size(),
                " dims");
  const int64_t H = a.shape[0], n = a.shape[1], d = a.shape[2];
  const std::vector<float> src = a.to_float();
  std::vector<float> out(src.size());
  for (int64_t h = 0; h < H; ++h)
    for (int64_t t = 0; t < n; ++t) std::copy_n(src.data() + (h * n + t) * d, d, out.data() + (t * H + h) * d);
  return out;
}

// --qk DIR: the estimators on dumped real heads, without the model. Per layer found in DIR
// (q_LL.npy, k_LL.npy, and v_LL.npy for the attention side): each configuration's estimate time
// (best of --repeat) and mask quality against the oracle; with v, the block-sparse attention time
// and output error against dense attention on the same q/k/v.
int run_qk(const cli::Args& args) {
  namespace fs = std::filesystem;
  const std::string dir = args.str("qk", "");
  if (args.has("threads")) set_cpu_threads(int(args.integer("threads", 2)));
  const int32_t block = int32_t(args.integer("block", 128));
  const int repeat = int(std::max<int64_t>(1, args.integer("repeat", 1)));
  std::vector<MethodSpec> specs;
  for (const std::string& m : args.list("method", "rr,xattn")) {
    parse_estimator(m);
    for (const std::string& o : args.list("offset", "paper")) {
      for (const std::string& t : args.list("tau", "0.95"))
        for (const std::string& st : args.list("stride", "8"))
          for (const std::string& pr : args.list("probe-protect", "published")) {
            parse_protect(pr);
            specs.push_back({m, std::stod(t), std::stoi(st), parse_rr_offset(o), pr});
          }
      if (m != "rr") break;
    }
  }
  std::vector<int> layer_ids;
  if (args.has("layer")) {
    for (const std::string& l : args.list("layer", "0")) layer_ids.push_back(std::stoi(l));
  } else {
    for (int l = 0; l < 1000; ++l) {
      char name[32];
      std::snprintf(name, sizeof name, "/q_%02d.npy", l);
      if (fs::exists(dir + name)) layer_ids.push_back(l);
    }
  }
  ARIADNE_CHECK(!layer_ids.empty(), "llm --qk: no q_LL.npy in '", dir, "'");
  args.reject_unused();

  json layers = json::array();
  std::map<std::string, std::vector<double>> sums;  // label -> ms, density, recall, f1, err, ms_attn
  for (const int l : layer_ids) {
    char sfx[16];
    std::snprintf(sfx, sizeof sfx, "%02d.npy", l);
    const NpyArray qa = read_npy(dir + "/q_" + sfx), ka = read_npy(dir + "/k_" + sfx);
    ARIADNE_CHECK(ka.shape.size() == 3 && qa.shape.size() == 3 && ka.shape[2] == qa.shape[2] &&
                      ka.shape[1] >= qa.shape[1] && ka.shape[0] > 0 && qa.shape[0] % ka.shape[0] == 0,
                  dir, "/k_", sfx, ": expected [kv_heads, tokens >= the q tokens, head_dim] with kv_heads dividing "
                  "the q heads and the head_dim of q_", sfx);
    const int64_t H = qa.shape[0], n = qa.shape[1], d = qa.shape[2], Hk = ka.shape[0], nk = ka.shape[1];
    std::vector<float> q = packed(qa, "q"), k = packed(ka, "k"), v;
    const bool with_v = fs::exists(dir + "/v_" + sfx);
    if (with_v) {
      const NpyArray va = read_npy(dir + "/v_" + sfx);
      ARIADNE_CHECK(va.shape == ka.shape, va.name, ": v must have k's shape");
      v = packed(va, "v");
    }
    const int32_t cu_q[2] = {0, int32_t(n)}, cu_k[2] = {0, int32_t(nk)};
    AttentionParams p;
    p.q = make_view(q.data(), DType::f32, {n, H, d});
    p.k = make_view(k.data(), DType::f32, {nk, Hk, d});
    p.pattern = n == nk ? Pattern::causal() : Pattern::causal().with_varlen(1, cu_q, cu_k);
    std::vector<float> dense_out, out;
    double ms_dense = 0;
    if (with_v) {
      p.v = make_view(v.data(), DType::f32, {nk, Hk, d});
      dense_out.resize(q.size());
      out.resize(q.size());
      p.out = make_view(dense_out.data(), DType::f32, {n, H, d});
      PrefillConfig dc;
      dc.dense = true;
      for (int i = 0; i < repeat; ++i) {
        const double ms = ariadne::prefill(p, dc).stats.ms_attention;
        ms_dense = i == 0 ? ms : std::min(ms_dense, ms);
      }
      p.out = make_view(out.data(), DType::f32, {n, H, d});
    }
    json lj = {{"layer", l}, {"tokens", n}, {"heads", H}, {"kv_heads", Hk}, {"ms_dense_attention", ms_dense}};
    json cfgs = json::array();
    std::map<double, EstimateResult> oracles;
    for (const MethodSpec& m : specs) {
      const EstimateConfig ec = estimate_config(m, block);
      if (!oracles.count(ec.tau)) {
        EstimateConfig oc = ec;
        oc.method = Estimator::oracle;
        oc.protect.reset();
        oracles.emplace(ec.tau, estimate(p.q, p.k, p.pattern, oc, Backend::cpu));
      }
      const EstimateResult& oracle = oracles.at(ec.tau);
      EstimateResult est;
      double ms = 0;
      for (int i = 0; i < repeat; ++i) {
        est = estimate(p.q, p.k, p.pattern, ec, Backend::cpu);
        ms = i == 0 ? est.stats.ms_total : std::min(ms, est.stats.ms_total);
      }
      const MaskMetrics mm = compare_to_oracle(est.mask, oracle);
      MaskBreakdown all;
      for (const MaskBreakdown& b : mask_breakdown(est.mask, oracle)) all += b;
      json cj = {{"config", m.label()}, {"ms_estimate", ms}, {"density", est.stats.density},
                 {"mass_recall", mm.mass_recall}, {"precision", mm.precision}, {"recall", mm.recall}, {"f1", mm.f1},
                 {"breakdown", breakdown_json(all)}};
      double err = 0, ms_attn = 0;
      if (with_v) {
        PrefillConfig pc;
        pc.estimate = ec;
        for (int i = 0; i < repeat; ++i) {
          const double t = ariadne::prefill(p, pc).stats.ms_attention;
          ms_attn = i == 0 ? t : std::min(ms_attn, t);
        }
        double num = 0, den = 0;
        for (size_t i = 0; i < out.size(); ++i) {
          num += (double(out[i]) - dense_out[i]) * (double(out[i]) - dense_out[i]);
          den += double(dense_out[i]) * dense_out[i];
        }
        err = den > 0 ? std::sqrt(num / den) : 0;
        cj["ms_attention"] = ms_attn;
        cj["out_rel_err"] = err;
      }
      std::vector<double>& sm = sums[m.label()];
      sm.resize(6, 0.0);
      const double vals[6] = {ms, est.stats.density, mm.mass_recall, mm.f1, err, ms_attn};
      for (size_t i = 0; i < 6; ++i) sm[i] += vals[i];
      cfgs.push_back(cj);
    }
    lj["configs"] = cfgs;
    layers.push_back(lj);
  }
  const double nl = double(layer_ids.size());
  if (args.json()) {
    json summary = json::array();
    for (const auto& [label, sm] : sums)
      summary.push_back({{"config", label}, {"ms_estimate", sm[0] / nl}, {"density", sm[1] / nl},
                         {"mass_recall", sm[2] / nl}, {"f1", sm[3] / nl}, {"out_rel_err", sm[4] / nl},
                         {"ms_attention", sm[5] / nl}});
    cli::print_json({{"qk", dir}, {"block", block}, {"repeat", repeat}, {"summary", summary}, {"layers", layers}});
  } else {
    std::cout << "| config (mean over " << layer_ids.size() << " layers) | ms estimate | density | mass recall | block F1 "
              << "| out err | ms attention |\n| --- | --- | --- | --- | --- | --- | --- |\n";
    for (const auto& [label, sm] : sums)
      std::cout << "| " << label << " | " << sm[0] / nl << " | " << sm[1] / nl << " | " << sm[2] / nl << " | "
                << sm[3] / nl << " | " << sm[4] / nl << " | " << sm[5] / nl << " |\n";
  }
  return 0;
}

int run_llm(const cli::Args& args) {
  if (args.has("qk")) return run_qk(args);
  std::string path = args.str("gguf", "");
  if (path.empty()) path = llm_model_path();
  ARIADNE_CHECK(!path.empty(), "llm: no --gguf given and no model found (", llm_model_hint(), ")");
  if (args.has("threads")) set_cpu_threads(int(args.integer("threads", 2)));
  const GgufFile file = GgufFile::open(path);
  const BpeTokenizer tok = BpeTokenizer::from_gguf(file);
  LlamaModel model = LlamaModel::from_gguf(file);
  const LlamaConfig& c = model.config();
  const int n_new = int(args.integer("new", 8));
  const int32_t block = int32_t(args.integer("block", 128));
  const Backend backend = args.has("backend") ? parse_backend(args.str("backend", "auto")) : Backend::automatic;
  if (backend == Backend::cuda) model.set_backend(Backend::cuda);
  const json model_json = {{"file", path}, {"layers", c.layers}, {"dim", c.dim}, {"heads", c.heads},
                           {"kv_heads", c.kv_heads}, {"head_dim", c.head_dim}, {"vocab", c.vocab},
                           {"context", c.context}, {"rope_base", c.rope_base}, {"tied", c.tied},
                           {"backend", backend_name(model.backend())}};

  if (args.has("prompt")) {
    const std::vector<int32_t> ids = tok.encode(args.str("prompt", ""));
    PrefillOptions po;
    po.method.dense = true;
    po.method.attention_backend = backend;
    const std::vector<int32_t> gen = model.generate(ids, n_new, po, nullptr, tok.eos());
    args.reject_unused();
    if (args.json()) {
      cli::print_json({{"model", model_json}, {"prompt_ids", ids}, {"generated_ids", gen},
                       {"generated", tok.decode(gen)}});
    } else {
      std::cout << tok.decode(gen) << "\n";
    }
    return 0;
  }

  std::vector<MethodSpec> methods;
  const auto taus = args.list("tau", "0.95");
  const auto strides = args.list("stride", "8");
  std::vector<RROffset> offsets;
  for (const std::string& o : args.list("offset", "paper")) offsets.push_back(parse_rr_offset(o));
  std::vector<std::string> estimators;
  for (const std::string& m : args.list("method", "rr")) {
    if (m == "dense") {
      methods.push_back({"dense", 1, 0});
      continue;
    }
    parse_estimator(m);  // validates the name
    estimators.push_back(m);
    for (const RROffset o : offsets) {
      for (const std::string& t : taus)
        for (const std::string& s : strides) {
          for (const std::string& pr : args.list("run-protect", "published")) {
            parse_protect(pr);  // validates
            methods.push_back({m, std::stod(t), std::stoi(s), o, pr});
          }
          if (m == "oracle") break;  // the oracle samples nothing: one stride is enough
        }
      if (m != "rr") break;  // the offset is RR's alone
    }
  }
  // The anchor runs first so each instance has its dense answer.
  if (methods.front().name != "dense") methods.insert(methods.begin(), MethodSpec{"dense", 1, 0});
  const auto tasks = args.list("task", "passkey");
  const auto lengths = args.list("tokens", "4096");
  const auto depths = args.list("depths", "0.1,0.5,0.9");
  const int seeds = int(args.integer("seeds", 1));
  const int seed0 = int(args.integer("seed", 1));
  const bool compare = args.flag("compare");
  const bool probe = args.flag("probe");
  const bool probe_outputs = args.flag("probe-outputs");
  const bool accuracy = args.integer("accuracy", 1) != 0;
  // Probe configurations: every estimator (and RR offset) of the runs, at the probe τ, S and
  // protections (by default the runs' τ and S with each method's published protections).
  std::vector<MethodSpec> probe_specs;
  for (const std::string& m : estimators) {
    if (m == "oracle") continue;  // its own ground truth
    for (const RROffset o : offsets) {
      for (const std::string& t : args.list("probe-tau", args.str("tau", "0.95")))
        for (const std::string& s : args.list("probe-stride", args.str("stride", "8")))
          for (const std::string& pr : args.list("probe-protect", "published")) {
            parse_protect(pr);  // validates
            probe_specs.push_back({m, std::stod(t), std::stoi(s), o, pr});
          }
      if (m != "rr") break;
    }
  }
  std::vector<EstimateConfig> probes;
  for (const MethodSpec& m : probe_specs) probes.push_back(estimate_config(m, block));
  // --probe-tau-sweep: every probe's scores and its oracle's masses selected anew at each τ.
  const std::vector<double> probe_sweep = args.tau_list("probe-tau-sweep");
  if (!probe_sweep.empty()) {
    ARIADNE_CHECK(probe, "llm: --probe-tau-sweep re-selects the probes' masks; it needs --probe");
    ARIADNE_CHECK(!probes.empty(), "llm: --probe-tau-sweep needs probes: --method must name an estimator (rr, xattn)");
  }
  const bool layers = args.flag("layers");
  const std::string dump = args.str("dump", "");
  args.reject_unused();

  json runs = json::array();
  std::map<std::string, Agg> agg;  // key: task/tokens/method label
  bool dumped = false;
  for (const std::string& kind : tasks)
    for (const std::string& len : lengths)
      for (int s = 0; s < seeds; ++s)
        for (const std::string& dep : depths) {
          const RetrievalTask task = make_retrieval_task(kind, tok, std::stoll(len), std::stod(dep), uint64_t(seed0 + s));
          const std::vector<int32_t> ids = tok.encode(task.prompt, false);
          for (const MethodSpec& m : methods) {
            if (!accuracy && m.name != "dense") continue;
            PrefillOptions po;
            po.method.dense = m.name == "dense";
            po.method.attention_backend = backend;
            po.compare = compare;
            if (!po.method.dense) {
              po.method.estimate = estimate_config(m, block);
              po.keep_previous = keeps_previous(m.protect);
            }
            if (po.method.dense && probe) {
              po.probes = probes;
              po.probe_outputs = probe_outputs;
              po.probe_tau_sweep = probe_sweep;
            }
            if (po.method.dense && !dump.empty() && !dumped) {
              po.dump_dir = dump;
              dumped = true;
            }
            PrefillTrace tr;
            const std::vector<int32_t> gen = model.generate(ids, n_new, po, &tr, tok.eos());
            const std::string text = tok.decode(gen);
            const bool ok = retrieval_correct(text, task.answer);
            json run = {{"task", kind}, {"tokens", task.tokens}, {"depth", task.depth}, {"seed", task.seed},
                        {"method", m.name}, {"tau", m.tau}, {"stride", m.stride},
                        {"offset", m.name == "rr" ? rr_offset_name(m.offset) : ""}, {"protect", m.protect},
                        {"answer", task.answer},
                        {"generated", text}, {"correct", ok}, {"density", tr.density},
                        {"ms_prefill", tr.ms_total}, {"ms_attention", tr.ms_attention},
                        {"ms_estimate", tr.ms_estimate}, {"ms_estimate_kernels", tr.ms_estimate_kernels}};
            Agg& a = agg[kind + "/" + len + "/" + m.label()];
            a.runs++;
            a.correct += ok;
            a.density += tr.density;
            a.ms += tr.ms_total;
            std::vector<const LayerTrace*> own;
            for (const LayerTrace& t : tr.layers) own.push_back(&t);
            if (compare) {
              a.own.add(own);
              run["mass_recall"] = LayerSums::mean([&] {
                std::vector<double> v;
                for (const LayerTrace& t : tr.layers) v.push_back(t.mass_recall);
                return v;
              }());
              if (layers) {
                json lj = json::array();
                for (const LayerTrace& t : tr.layers) lj.push_back(layer_json(t));
                run["layers"] = lj;
              }
            }
            if (!po.probes.empty()) {
              for (size_t i = 0; i < probe_specs.size(); ++i) {
                std::vector<const LayerTrace*> pl;
                for (const LayerTrace& t : tr.layers) pl.push_back(&t.probes[i]);
                agg[kind + "/" + len + "/" + probe_specs[i].label()].probe.add(pl);
              }
            }
            // Progress on stderr in every mode: long sweeps can be read (and salvaged) while they run.
            std::cerr << kind << " " << task.tokens << " tok depth " << task.depth << " seed " << task.seed << " "
                        << m.label() << ": '" << text << "' " << (ok ? "ok" : "WRONG") << " density "
                        << std::setprecision(3) << tr.density << " " << std::setprecision(5) << tr.ms_total / 1000
                        << " s\n";
            runs.push_back(std::move(run));
          }
        }

  json summary = json::array();
  for (const auto& [key, a] : agg) {
    const std::string dense_key = key.substr(0, key.rfind('/')) + "/dense";
    const Agg& d = agg.at(dense_key);
    json s = {{"case", key}, {"runs", a.runs}};
    if (a.runs > 0) {
      s["accuracy"] = double(a.correct) / a.runs;
      s["dense_accuracy"] = double(d.correct) / d.runs;
      s["accuracy_vs_dense"] = d.correct ? double(a.correct) / d.correct : 0.0;
      s["density"] = a.density / a.runs;
      s["s_prefill"] = a.ms / a.runs / 1000;
    }
    if (a.own.n > 0) s["own"] = a.own.to_json(layers);
    if (a.probe.n > 0) s["probe"] = a.probe.to_json(layers);
    summary.push_back(s);
  }
  if (args.json()) {
    cli::print_json({{"model", model_json}, {"block", block}, {"offsets", args.list("offset", "paper")},
                     {"new_tokens", n_new}, {"summary", summary}, {"runs", runs}});
  } else {
    std::cout << "| case | runs | accuracy | vs dense | density | s/prefill | probe density | mass recall | block F1 "
                 "| out err |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
    for (const json& s : summary) {
      const json pr = s.value("probe", json::object());
      std::cout << "| " << s["case"].get<std::string>() << " | " << s["runs"] << " | " << s.value("accuracy", 0.0)
                << " | " << s.value("accuracy_vs_dense", 0.0) << " | " << s.value("density", 0.0) << " | "
                << s.value("s_prefill", 0.0) << " | " << pr.value("density", 0.0) << " | "
                << pr.value("mass_recall", 0.0) << " | " << pr.value("f1", 0.0) << " | " << pr.value("out_rel_err", 0.0)
                << " |\n";
    }
    for (const json& s : summary) {
      const json pr = s.value("probe", json::object());
      if (!pr.contains("tau_sweep")) continue;
      std::cout << "\n" << s["case"].get<std::string>() << "\n";
      cli::print_tau_sweep(pr["tau_sweep"], "");
    }
  }
  return 0;
}

const cli::Command reg{"llm", "run a Llama GGUF model (SmolLM2) with block-sparse prefill on retrieval tasks", run_llm};

}  // namespace
