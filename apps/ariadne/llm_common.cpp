// The task loop shared by `ariadne llm` and `ariadne llm-probe` (llm_common.hpp).
#include "llm_common.hpp"

#include <algorithm>
#include <array>
#include <iomanip>
#include <iostream>
#include <limits>
#include <map>
#include <sstream>

#include "workloads/llm_tasks.hpp"
#include "protect.hpp"

namespace ariadne::cli {

using nlohmann::json;

json breakdown_json(const MaskBreakdown& b) {
  return json{{"visible", b.visible}, {"kept", b.kept}, {"truth", b.truth}, {"tp", b.true_positive},
              {"fp_last_row", b.fp_last_row}, {"fp_sink", b.fp_sink}, {"fp_diagonal", b.fp_diagonal},
              {"fp_other", b.fp_other}, {"fn_last_row", b.fn_last_row}, {"fn_sink", b.fn_sink},
              {"fn_diagonal", b.fn_diagonal}, {"fn_other", b.fn_other}, {"rows_with_previous", b.rows_with_previous},
              {"previous_dropped", b.previous_dropped}, {"previous_dropped_by_oracle", b.previous_dropped_by_oracle}};
}

namespace {

// Sums over layers (and heads) of mask metrics, for means over task instances.
struct LayerSums {
  // One τ sweep point's figures (LayerTrace::tau_sweep), summed per layer over instances.
  enum SweepField { kDensity, kMassRecall, kPrecision, kRecall, kF1, kOracleDensity, kSweepFields };
  int n = 0;
  std::vector<double> density, recall, f1, err, oracle_err, block_precision, block_recall;
  bool oracle_err_measured = false;  // probes run with --probe-outputs (LayerTrace::oracle_out_rel_err)
  std::vector<std::vector<double>> recall_head, f1_head;
  std::vector<std::vector<MaskBreakdown>> breakdown;  // [layer][head], summed over instances
  std::vector<double> sweep_tau;                       // the τ list of the sweep (empty: none)
  std::vector<std::vector<std::array<double, kSweepFields>>> sweep;  // [τ][layer]
  void add(const std::vector<const LayerTrace*>& layers) {
    const size_t L = layers.size();
    density.resize(L), recall.resize(L), f1.resize(L), err.resize(L), oracle_err.resize(L);
    recall_head.resize(L), f1_head.resize(L);
    block_precision.resize(L), block_recall.resize(L);
    breakdown.resize(L);
    for (size_t l = 0; l < L; ++l) {
      const LayerTrace& t = *layers[l];
      breakdown[l].resize(t.breakdown_per_head.size());
      for (size_t h = 0; h < t.breakdown_per_head.size(); ++h) breakdown[l][h] += t.breakdown_per_head[h];
      density[l] += t.density, recall[l] += t.mass_recall, f1[l] += t.f1, err[l] += t.out_rel_err;
      oracle_err[l] += t.oracle_out_rel_err;
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
    if (oracle_err_measured) j["oracle_out_rel_err"] = mean(oracle_err) / n;
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
      if (oracle_err_measured) e["oracle_out_rel_err"] = oracle_err[l] / n;
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

// Decode steps' figures, summed over the steps of runs.
struct DecodeSums {
  int64_t steps = 0, visible = 0, kept = 0;
  double ms_select = 0, ms_attention = 0, ms_step = 0, recall = 0, err = 0, min_recall = 1;
  static DecodeSums of(const std::vector<DecodeStepTrace>& st) {
    DecodeSums d;
    for (const DecodeStepTrace& t : st) {
      ++d.steps, d.visible += t.pages_visible, d.kept += t.pages_kept;
      d.ms_select += t.ms_select, d.ms_attention += t.ms_attention, d.ms_step += t.ms_step;
      d.recall += t.mass_recall, d.err += t.out_rel_err, d.min_recall = std::min(d.min_recall, t.min_mass_recall);
    }
    return d;
  }
  DecodeSums& operator+=(const DecodeSums& o) {
    steps += o.steps, visible += o.visible, kept += o.kept, ms_select += o.ms_select, ms_attention += o.ms_attention;
    ms_step += o.ms_step;
    recall += o.recall, err += o.err, min_recall = std::min(min_recall, o.min_recall);
    return *this;
  }
  double density() const { return visible ? double(kept) / double(visible) : 1.0; }
  double mean_recall() const { return steps ? recall / double(steps) : 1.0; }
  double mean_err() const { return steps ? err / double(steps) : 0.0; }
};
struct Agg {
  int runs = 0, correct = 0;
  double density = 0, ms = 0;
  DecodeSums decode;
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

struct Instance {
  RetrievalTask task;
  int64_t length = 0;  // as asked (--tokens)
  std::vector<int32_t> ids;
};

}  // namespace

std::string MethodSpec::label() const {
  if (name == "dense" && decode == "dense") return "dense";
  if (name == "dense") {
    std::ostringstream os;
    os << "dense + decode " << decode << " tau=" << decode_tau;
    return os.str();
  }
  std::ostringstream os;
  os << name;
  if (name == "rr") os << " " << rr_offset_name(offset);
  if (name == "rr" && schedule != RRSchedule::head) os << " " << rr_schedule_name(schedule) << "-RR";
  os << " tau=" << tau << " S=" << stride;
  if (protect != "published") os << " protect=" << protect;
  if (decode != "dense") os << " + decode " << decode << " tau=" << decode_tau;
  return os.str();
}

EstimateConfig estimate_config(const MethodSpec& m, int32_t block) {
  EstimateConfig ec;
  ec.method = parse_estimator(m.name);
  ec.tau = m.tau;
  ec.stride = m.stride;
  ec.block = block;
  ec.offset = m.offset;
  ec.schedule = m.schedule;
  ec.protect = parse_protect(m.protect, true);
  return ec;
}

std::vector<std::pair<RROffset, RRSchedule>> rr_variants(const Args& a, const std::string& method) {
  if (method != "rr") return {{RROffset::paper, RRSchedule::head}};
  std::vector<std::pair<RROffset, RRSchedule>> v;
  for (const std::string& o : a.strs("offset"))
    for (const std::string& s : a.strs("rr-schedule")) v.emplace_back(parse_rr_offset(o), parse_rr_schedule(s));
  return v;
}

OptionTable llm_task_options() {
  return {
      path("gguf", PathKind::in_file, "the GGUF model (default: as llm_model_path() finds it, llm.hpp)"),
      choice("backend", "auto", {"auto", "reference", "cpu", "cuda"},
             "cuda: the whole model on the GPU (bf16); cpu/reference: the CPU model with that attention"),
      threads_option(),
      integer("new", 8, 0, 4096, "tokens generated"),
      integer("batch", 1, 1, 256,
              "prompts generated together: each prefilled alone, their decode steps batched (the serving loop)"),
      integer("block", 128, 16, 4096, "block size B of the sparse prefill"),
      choice_list("task", "passkey", {"passkey", "niah"}, "retrieval tasks"),
      integer_list("tokens", "4096", 1, 1 << 20, "prompt lengths (at most the model's context)"),
      real_list("depth", "0.1,0.5,0.9", Range::closed(0, 1), "needle positions, as a fraction of the prompt"),
      integer("seeds", 1, 1, 1 << 16, "instances per task, length and depth (seeds --seed, --seed + 1, ...)"),
      integer("seed", 1, 0, std::numeric_limits<int32_t>::max() / 2, "first task seed"),
      choice_list("method", "rr", {"dense", "rr", "xattn", "oracle", "flexprefill"},
                  "prefill methods (dense always runs first); flexprefill with γ = --tau and its released budgets"),
      real_list("tau", "0.95", Range::open_closed(0, 1), "attention-mass thresholds"),
      integer_list("stride", "8", 1, 4096, "sampling strides S (must divide --block)"),
      choice_list("offset", "paper", {"paper", "released"}, "RR's sampling offsets (each a method of its own)"),
      choice_list("rr-schedule", "head", {"head", "none", "layer", "hybrid"},
                  "RR's schedules, which index rotates the sampled position: head (published), none, layer or "
                  "head + layer (each a method of its own; CPU estimators for all but head)"),
      text_list("protect", "published",
                "protections of the sparse runs: published, none, or sink/diagonal/last_row (and previous, an "
                "experiment) joined by '+'")
          .checked([](const std::string& s) { parse_protect(s, true); }),
      choice_list("decode", "dense", {"dense", "oracle", "rr", "quest"},
                  "decode steps: dense, or sparse decode over the pages selected by the oracle (exact page mass), "
                  "RR's key-stride sums or Quest's min/max bound (each with every prefill method; oracle on the cpu "
                  "backend only)"),
      real_list("decode-tau", "0.9", Range::open_closed(0, 1), "page-mass thresholds of sparse decode"),
      integer("page-size", 64, 1, 4096, "tokens per KV cache page (a multiple of --summary-stride)"),
      integer("summary-stride", 8, 1, 4096, "rows per key-stride sum of a page (rr decode's stride)"),
      integer("sink-pages", 1, 0, 1 << 20, "sparse decode: first pages always kept"),
      integer("recent-pages", 1, 0, 1 << 20, "sparse decode: last pages always kept (the newest holds the query)"),
      boolean("decode-rotate", true,
              "rr decode: one query head of the group scores each key stride, rotated (no: every head scores all)"),
      boolean("decode-compare", false,
              "per decode step and layer: the oracle's mass of the kept pages and the output error against dense"),
      boolean("decode-graph", true,
              "cuda backend: each decode step is one CUDA graph replay (no: kernel by kernel, with per-layer "
              "attention times)"),
  };
}

DecodeOptions decode_options(const Args& a, const MethodSpec& m) {
  DecodeOptions d;
  d.page_size = a.i32("page-size");
  d.summary_stride = a.i32("summary-stride");
  d.sparse = m.decode != "dense";
  if (d.sparse) d.select.scorer = parse_page_scorer(m.decode);
  d.select.tau = m.decode_tau;
  d.select.sink_pages = a.i32("sink-pages");
  d.select.recent_pages = a.i32("recent-pages");
  d.select.rotate = a.flag("decode-rotate");
  d.compare = a.flag("decode-compare") && d.sparse;
  d.graph = a.flag("decode-graph");
  return d;
}

std::vector<MethodSpec> run_methods(const Args& a) {
  std::vector<MethodSpec> methods;
  const int32_t block = a.i32("block");
  for (const int s : a.i32s("stride"))
    if (block % s != 0) a.fail("stride", std::to_string(s) + " does not divide --block " + std::to_string(block));
  for (const std::string& m : a.strs("method")) {
    if (m == "dense") {
      methods.push_back({"dense", 1, 0});
      continue;
    }
    for (const auto& [o, sc] : rr_variants(a, m))
      for (const double t : a.reals("tau"))
        for (const int s : a.i32s("stride")) {
          for (const std::string& pr : a.strs("protect")) methods.push_back({m, t, s, o, pr, sc});
          if (m == "oracle") break;  // the oracle samples nothing: one stride is enough
        }
  }
  // The anchor runs first so each instance has its dense answer.
  if (methods.empty() || methods.front().name != "dense") methods.insert(methods.begin(), MethodSpec{"dense", 1, 0});
  if (a.i32("page-size") % a.i32("summary-stride") != 0)
    a.fail("page-size", std::to_string(a.i32("page-size")) + " is not a multiple of --summary-stride " +
                            std::to_string(a.i32("summary-stride")));
  const std::vector<std::string> decodes = a.strs("decode");
  const bool sparse_decode =
      std::any_of(decodes.begin(), decodes.end(), [](const std::string& d) { return d != "dense"; });
  // On the GPU the pages are selected on the device (rr, quest); the oracle's exact page scores and
  // the per-step comparison against dense decode run on the CPU path.
  if (a.str("backend") == "cuda" &&
      std::any_of(decodes.begin(), decodes.end(), [](const std::string& d) { return d == "oracle"; }))
    a.fail("decode", "oracle runs on the CPU path only; on --backend cuda take rr or quest");
  if (sparse_decode && a.str("backend") == "cuda" && a.flag("decode-compare"))
    a.fail("decode-compare", "the comparison against dense decode runs on the CPU path only (--backend cpu)");
  // Every prefill method with every decode: dense decode, then each sparse decode at each τ.
  std::vector<MethodSpec> runs;
  for (const MethodSpec& m : methods)
    for (const std::string& d : decodes) {
      if (d == "dense") {
        runs.push_back(m);
        continue;
      }
      for (const double t : a.reals("decode-tau")) {
        MethodSpec r = m;
        r.decode = d;
        r.decode_tau = t;
        runs.push_back(r);
      }
    }
  // The anchor (dense prefill, dense decode) first even when --decode leaves dense out.
  if (runs.empty() || runs.front().label() != "dense") runs.insert(runs.begin(), MethodSpec{"dense", 1, 0});
  return runs;
}

LoadedModel load_model(const Args& a) {
  LoadedModel m;
  m.path = a.str("gguf");
  if (m.path.empty()) m.path = llm_model_path();
  if (m.path.empty())
    throw UsageError("llm: no --gguf given and no model found (" + llm_model_hint() + ")", "--gguf");
  require_cuda_if_asked(a, "backend");
  if (a.given("threads")) set_cpu_threads(a.i32("threads"));
  m.file = std::make_unique<GgufFile>(GgufFile::open(m.path));
  m.tok = BpeTokenizer::from_gguf(*m.file);
  m.model = std::make_unique<LlamaModel>(LlamaModel::from_gguf(*m.file));
  m.backend = a.str("backend") == "auto" ? Backend::automatic : parse_backend(a.str("backend"));
  if (m.backend == Backend::cuda) m.model->set_backend(Backend::cuda);
  const LlamaConfig& c = m.model->config();
  m.json = {{"file", m.path}, {"layers", c.layers}, {"dim", c.dim}, {"heads", c.heads},
            {"kv_heads", c.kv_heads}, {"head_dim", c.head_dim}, {"vocab", c.vocab},
            {"context", c.context}, {"rope_base", c.rope_base}, {"tied", c.tied},
            {"backend", backend_name(m.model->backend())}};
  return m;
}

int run_task_loop(const Args& args, LoadedModel& lm, const TaskLoop& loop) {
  const BpeTokenizer& tok = lm.tok;
  LlamaModel& model = *lm.model;
  const Backend backend = lm.backend;
  const int n_new = args.i32("new");
  const int32_t block = args.i32("block");
  const int64_t context = model.config().context;
  // Every instance is built (and checked) before the first run.
  std::vector<Instance> instances;
  for (const std::string& kind : args.strs("task"))
    for (const int64_t len : args.i64s("tokens")) {
      if (context > 0 && len + n_new > context)
        args.fail("tokens", std::to_string(len) + " + --new " + std::to_string(n_new) + " exceeds the model's context of " +
                                std::to_string(context) + " tokens");
      for (int64_t s = 0; s < args.i64("seeds"); ++s)
        for (const double dep : args.reals("depth")) {
          Instance in;
          try {
            in.task = make_retrieval_task(kind, tok, len, dep, uint64_t(args.i64("seed") + s));
          } catch (const Error& e) {
            args.fail("tokens", e.what());
          }
          in.length = len;
          in.ids = tok.encode(in.task.prompt, false);
          instances.push_back(std::move(in));
        }
    }
  std::vector<EstimateConfig> probes;
  for (const MethodSpec& m : loop.probe_specs) probes.push_back(estimate_config(m, block));

  json runs = json::array();
  std::map<std::string, Agg> agg;  // key: task/tokens/method label
  bool dumped = false;
  // Method by method, the instances in batches of --batch prompts through the serving loop
  // (generate_batch: each prompt prefilled alone, the decode steps of the batch run together).
  const size_t batch = size_t(args.i32("batch"));
  for (const MethodSpec& m : loop.methods) {
    if (!loop.accuracy && m.label() != "dense") continue;
    model.set_decode(decode_options(args, m));
    for (size_t first = 0; first < instances.size(); first += batch) {
      const size_t last = std::min(instances.size(), first + batch);
      PrefillOptions po;
      po.method.dense = m.name == "dense";
      po.method.attention_backend = backend;
      po.compare = loop.compare;
      if (!po.method.dense) {
        po.method.estimate = estimate_config(m, block);
        po.keep_previous = keeps_previous(m.protect);
      }
      if (po.method.dense) {
        po.probes = probes;
        po.probe_outputs = loop.probe_outputs;
        po.probe_tau_sweep = loop.probe_tau_sweep;
      }
      if (po.method.dense && !loop.dump_dir.empty() && !dumped) {
        // The dump is of the first dense prefill only: that instance runs in a batch of its own.
        po.dump_dir = loop.dump_dir;
        dumped = true;
      }
      std::vector<std::vector<int32_t>> prompts;
      const size_t end = po.dump_dir.empty() ? last : first + 1;
      for (size_t i = first; i < end; ++i) prompts.push_back(instances[i].ids);
      std::vector<LlamaModel::BatchResult> results = model.generate_batch(prompts, n_new, po, tok.eos());
      if (end < last) {  // the rest of the batch without the dump
        po.dump_dir.clear();
        prompts.clear();
        for (size_t i = end; i < last; ++i) prompts.push_back(instances[i].ids);
        for (LlamaModel::BatchResult& r : model.generate_batch(prompts, n_new, po, tok.eos()))
          results.push_back(std::move(r));
      }
      for (size_t i = first; i < last; ++i) {
        const Instance& in = instances[i];
        const RetrievalTask& task = in.task;
        const std::string& kind = task.kind;
        const std::string len = std::to_string(in.length);
        LlamaModel::BatchResult& res = results[i - first];
        const PrefillTrace& tr = res.prefill;
        const std::vector<DecodeStepTrace>& steps = res.steps;
        const std::vector<int32_t>& gen = res.tokens;
        const DecodeSums ds = DecodeSums::of(steps);
        const std::string text = tok.decode(gen);
        const bool ok = retrieval_correct(text, task.answer);
        json run = {{"task", kind}, {"tokens", task.tokens}, {"depth", task.depth}, {"seed", task.seed},
                    {"method", m.name}, {"tau", m.tau}, {"stride", m.stride},
                    {"offset", m.name == "rr" ? rr_offset_name(m.offset) : ""},
                    {"rr_schedule", m.name == "rr" ? rr_schedule_name(m.schedule) : ""}, {"protect", m.protect},
                    {"answer", task.answer},
                    {"generated", text}, {"correct", ok}, {"density", tr.density},
                    {"ms_prefill", tr.ms_total}, {"ms_attention", tr.ms_attention},
                    {"ms_estimate", tr.ms_estimate}, {"ms_estimate_kernels", tr.ms_estimate_kernels},
                    {"decode", m.decode}, {"decode_tau", m.decode_tau}, {"decode_steps", steps.size()},
                    {"decode_density", ds.density()}, {"ms_decode_select", ds.ms_select},
                    {"ms_decode_attention", ds.ms_attention}, {"ms_decode_steps", ds.ms_step}};
        if (m.decode != "dense" && args.flag("decode-compare"))
          run["decode_compare"] = {{"mass_recall", ds.mean_recall()}, {"min_mass_recall", ds.min_recall},
                                   {"out_rel_err", ds.mean_err()}};
        Agg& a = agg[kind + "/" + len + "/" + m.label()];
        a.decode += ds;
        a.runs++;
        a.correct += ok;
        a.density += tr.density;
        a.ms += tr.ms_total;
        std::vector<const LayerTrace*> own;
        for (const LayerTrace& t : tr.layers) own.push_back(&t);
        if (loop.compare) {
          a.own.add(own);
          run["mass_recall"] = LayerSums::mean([&] {
            std::vector<double> v;
            for (const LayerTrace& t : tr.layers) v.push_back(t.mass_recall);
            return v;
          }());
          if (loop.per_layer) {
            json lj = json::array();
            for (const LayerTrace& t : tr.layers) lj.push_back(layer_json(t));
            run["layers"] = lj;
          }
        }
        if (!po.probes.empty()) {
          for (size_t i = 0; i < loop.probe_specs.size(); ++i) {
            std::vector<const LayerTrace*> pl;
            for (const LayerTrace& t : tr.layers) pl.push_back(&t.probes[i]);
            LayerSums& ps = agg[kind + "/" + len + "/" + loop.probe_specs[i].label()].probe;
            ps.oracle_err_measured = loop.probe_outputs;
            ps.add(pl);
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
      s["decode_density"] = a.decode.density();
      if (key.find("+ decode") != std::string::npos && args.flag("decode-compare")) {
        s["decode_mass_recall"] = a.decode.mean_recall();
        s["decode_min_mass_recall"] = a.decode.min_recall;
        s["decode_out_rel_err"] = a.decode.mean_err();
      }
      // Attention (selection + decode attention; 0 for graph steps, whose kernels are not timed apart)
      // and the whole step, logits included.
      s["ms_decode_step"] =
          a.decode.steps ? (a.decode.ms_select + a.decode.ms_attention) / double(a.decode.steps) : 0.0;
      s["ms_decode_whole_step"] = a.decode.steps ? a.decode.ms_step / double(a.decode.steps) : 0.0;
    }
    if (a.own.n > 0) s["own"] = a.own.to_json(loop.per_layer);
    if (a.probe.n > 0) s["probe"] = a.probe.to_json(loop.per_layer);
    summary.push_back(s);
  }
  if (args.json()) {
    print_json({{"model", lm.json}, {"block", block}, {"offsets", args.strs("offset")},
                     {"new_tokens", n_new}, {"summary", summary}, {"runs", runs}});
  } else {
    std::cout << "| case | runs | accuracy | vs dense | density | s/prefill | decode density | decode recall "
                 "| probe density | mass recall | block F1 | out err | oracle out err |\n"
                 "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
    for (const json& s : summary) {
      const json pr = s.value("probe", json::object());
      std::cout << "| " << s["case"].get<std::string>() << " | " << s["runs"] << " | " << s.value("accuracy", 0.0)
                << " | " << s.value("accuracy_vs_dense", 0.0) << " | " << s.value("density", 0.0) << " | "
                << s.value("s_prefill", 0.0) << " | " << s.value("decode_density", 1.0) << " | "
                << s.value("decode_mass_recall", 1.0) << " | " << pr.value("density", 0.0) << " | "
                << pr.value("mass_recall", 0.0) << " | " << pr.value("f1", 0.0) << " | " << pr.value("out_rel_err", 0.0)
                << " | " << pr.value("oracle_out_rel_err", 0.0) << " |\n";
    }
    for (const json& s : summary) {
      const json pr = s.value("probe", json::object());
      if (!pr.contains("tau_sweep")) continue;
      std::cout << "\n" << s["case"].get<std::string>() << "\n";
      print_tau_sweep(pr["tau_sweep"], "");
    }
  }
  return 0;
}

}  // namespace ariadne::cli
