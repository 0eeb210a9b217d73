// ariadne llm-probe — the analysis programs around `ariadne llm`: the same task runs plus, on each
// dense run's real q/k, every estimator configuration scored against the oracle (probes), per-layer
// comparisons of the sparse runs, τ sweeps of the probes' scores, q/k/v dumps; and with --qk DIR the
// estimators on dumped heads, without the model.
//
//   ariadne llm-probe --gguf FILE --task passkey --tokens 256 --depth 0.5 --method rr --probe-tau-sweep 0.5,0.9,1
//   ariadne llm-probe --gguf FILE --task passkey --tokens 8192 --depth 0.5 --method dense --dump DIR
//   ariadne llm-probe --qk DIR --method rr,xattn --offset paper,released --tau 0.95 --stride 8,16 --repeat 3
//
// Probes: every estimator (and RR offset) of --method, at each --probe-tau x --probe-stride x
// --probe-protect (by default the runs' τ and S with each method's published protections), measured
// on the dense run of every instance: density, mass recall, block F1 per layer and head, where the
// mask differs from the oracle's; --probe-outputs adds their attention output error vs dense;
// --probe-tau-sweep T0,... selects each probe's scores (one scoring pass) anew at every τ: the
// summary's probe entries gain `tau_sweep`. --accuracy no skips the sparse generation runs.
// --dump DIR writes q_LL.npy [heads, tokens, head_dim] and k_LL.npy, v_LL.npy [kv_heads, tokens,
// head_dim] of the first dense run (f32, q/k after RoPE), which --qk reads back; with --picture OUT
// it draws each configuration's mask over the oracle's block masses per layer and head.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>

#include "ariadne/image.hpp"
#include "ariadne/mask_picture.hpp"
#include "ariadne/npy.hpp"
#include "ariadne/prefill.hpp"
#include "llm_common.hpp"
#include "protect.hpp"

namespace ariadne::cli {
namespace {

using nlohmann::json;

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
int run_qk(const Args& args) {
  namespace fs = std::filesystem;
  for (const char* o : {"gguf", "backend", "new", "task", "tokens", "depth", "seeds", "seed", "protect", "compare",
                        "per-layer", "probe-tau", "probe-stride", "probe-outputs", "probe-tau-sweep", "accuracy", "dump"})
    if (args.given(o)) args.fail(o, "does not apply to --qk (the estimators on dumped heads, no model)");
  const std::string dir = args.str("qk");
  const std::string picture_dir = args.str("picture");
  const int32_t block = args.i32("block");
  const int repeat = args.i32("repeat");
  for (const int s : args.i32s("stride"))
    if (block % s != 0) args.fail("stride", std::to_string(s) + " does not divide --block " + std::to_string(block));
  std::vector<MethodSpec> specs;
  const std::vector<std::string> methods =
      args.given("method") ? args.strs("method") : std::vector<std::string>{"rr", "xattn"};
  for (const std::string& m : methods) {
    if (m == "dense") args.fail("method", "--qk measures estimators: rr, xattn or oracle");
    for (const auto& [o, sc] : rr_variants(args, m))
      for (const double t : args.reals("tau"))
        for (const int st : args.i32s("stride"))
          for (const std::string& pr : args.strs("probe-protect")) specs.push_back({m, t, st, o, pr, sc});
  }
  std::vector<int> layer_ids;
  if (args.given("layer")) {
    layer_ids = args.i32s("layer");
  } else {
    for (int l = 0; l < 1000; ++l) {
      char name[32];
      std::snprintf(name, sizeof name, "/q_%02d.npy", l);
      if (fs::exists(dir + name)) layer_ids.push_back(l);
    }
  }
  if (layer_ids.empty()) args.fail("qk", dir + ": no q_LL.npy file");
  // Every layer's q and k are there before the first layer is measured.
  for (const int l : layer_ids)
    for (const char* kind : {"q", "k"}) {
      char name[32];
      std::snprintf(name, sizeof name, "/%s_%02d.npy", kind, l);
      if (!fs::is_regular_file(dir + name)) args.fail("layer", dir + name + " is missing or not a regular file");
    }
  if (args.given("threads")) set_cpu_threads(args.i32("threads"));

  json layers = json::array();
  std::map<std::string, std::vector<double>> sums;  // label -> ms, density, recall, f1, err, ms_attn, oracle err
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
      EstimateConfig ec = estimate_config(m, block);
      ec.layer = l;  // RR's layer and hybrid schedules rotate with it
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
      if (!picture_dir.empty()) {
        // The mask over the oracle's masses for each asked head (mask_picture.hpp); the name
        // carries the layer, the head and the configuration.
        std::string tag = m.label();
        for (char& ch : tag)
          if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '.' && ch != '-') ch = '_';
        for (const int h : args.i32s("picture-heads")) {
          if (h >= H) args.fail("picture-heads", "head " + std::to_string(h) + " of a layer with " + std::to_string(H) + " heads");
          char name[48];
          std::snprintf(name, sizeof name, "/L%02d_h%02d_", l, h);
          write_png(picture_dir + name + tag + ".png", mask_picture(est.mask, oracle, 0, h, args.i32("picture-cell")));
        }
      }
      MaskBreakdown all;
      for (const MaskBreakdown& b : mask_breakdown(est.mask, oracle)) all += b;
      json cj = {{"config", m.label()}, {"ms_estimate", ms}, {"density", est.stats.density},
                 {"mass_recall", mm.mass_recall}, {"precision", mm.precision}, {"recall", mm.recall}, {"f1", mm.f1},
                 {"breakdown", breakdown_json(all)}};
      // Without v nothing is measured: NaN (null in JSON), not an error of 0 in the summary's means.
      double err = std::nan(""), ms_attn = std::nan(""), oracle_err = std::nan("");
      if (with_v) {
        PrefillConfig pc;
        pc.estimate = ec;
        for (int i = 0; i < repeat; ++i) {
          const double t = ariadne::prefill(p, pc).stats.ms_attention;
          ms_attn = i == 0 ? t : std::min(ms_attn, t);
        }
        err = relative_l2_error(out.data(), dense_out.data(), out.size());  // NaN (JSON null) when undefined
        cj["ms_attention"] = ms_attn;
        cj["out_rel_err"] = err;
        // The oracle's mask at this mask's per-row counts: the error at equal density.
        const BlockMask like = oracle_mask_like(est.mask, oracle);
        std::vector<float> like_out(q.size());
        AttentionParams lp = p;
        lp.out = make_view(like_out.data(), DType::f32, {n, H, d});
        lp.lse = TensorView{};
        lp.pattern = p.pattern.with_blocks(like.view());
        attention(lp, Backend::cpu);
        oracle_err = relative_l2_error(like_out.data(), dense_out.data(), like_out.size());
        cj["oracle_out_rel_err"] = oracle_err;
      }
      std::vector<double>& sm = sums[m.label()];
      sm.resize(7, 0.0);
      const double vals[7] = {ms, est.stats.density, mm.mass_recall, mm.f1, err, ms_attn, oracle_err};
      for (size_t i = 0; i < 7; ++i) sm[i] += vals[i];
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
                         {"ms_attention", sm[5] / nl}, {"oracle_out_rel_err", sm[6] / nl}});
    print_json({{"qk", dir}, {"block", block}, {"repeat", repeat}, {"summary", summary}, {"layers", layers}});
  } else {
    std::cout << "| config (mean over " << layer_ids.size() << " layers) | ms estimate | density | mass recall | block F1 "
              << "| out err | ms attention | oracle out err |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n";
    for (const auto& [label, sm] : sums)
      std::cout << "| " << label << " | " << sm[0] / nl << " | " << sm[1] / nl << " | " << sm[2] / nl << " | "
                << sm[3] / nl << " | " << sm[4] / nl << " | " << sm[5] / nl << " | " << sm[6] / nl << " |\n";
  }
  return 0;
}

int run_llm_probe(const Args& a) {
  if (a.given("qk")) return run_qk(a);
  for (const char* o : {"layer", "repeat", "picture", "picture-heads", "picture-cell"})
    if (a.given(o)) a.fail(o, "applies to --qk only");
  TaskLoop loop;
  loop.methods = run_methods(a);
  loop.accuracy = a.flag("accuracy");
  loop.compare = a.flag("compare");
  loop.per_layer = a.flag("per-layer");
  loop.probe_outputs = a.flag("probe-outputs");
  loop.probe_tau_sweep = a.reals("probe-tau-sweep");
  loop.dump_dir = a.str("dump");
  const std::vector<double> taus = a.given("probe-tau") ? a.reals("probe-tau") : a.reals("tau");
  const std::vector<int> strides = a.given("probe-stride") ? a.i32s("probe-stride") : a.i32s("stride");
  for (const int s : strides)
    if (a.i32("block") % s != 0) a.fail("probe-stride", std::to_string(s) + " does not divide --block");
  for (const std::string& m : a.strs("method")) {
    if (m == "dense" || m == "oracle") continue;  // the oracle is its own ground truth
    for (const auto& [o, sc] : rr_variants(a, m))
      for (const double t : taus)
        for (const int s : strides)
          for (const std::string& pr : a.strs("probe-protect")) loop.probe_specs.push_back({m, t, s, o, pr, sc});
  }
  if (!loop.probe_tau_sweep.empty() && loop.probe_specs.empty())
    a.fail("probe-tau-sweep", "needs probes: --method must name an estimator (rr, xattn)");
  for (const MethodSpec& m : loop.probe_specs)
    if (m.name == "flexprefill" && !loop.probe_tau_sweep.empty())
      a.fail("probe-tau-sweep", "flexprefill selects by its own rule, not by a threshold on scores: probe it per --probe-tau (γ)");
  LoadedModel m = load_model(a);
  return run_task_loop(a, m, loop);
}

OptionTable llm_probe_options() {
  OptionTable t = llm_task_options();
  for (Option& o : t)
    if (o.name == "method") o.help = "prefill methods, dense always first; with --qk estimators only, by default rr,xattn";
  const OptionTable more = {
      boolean("compare", false, "per layer of each sparse run: oracle metrics and output error vs dense (~3x work)"),
      boolean("per-layer", false, "per-layer and per-head rows in the JSON"),
      real_list("probe-tau", "", Range::open_closed(0, 1), "the probes' τ values (default: --tau)"),
      integer_list("probe-stride", "", 1, 4096, "the probes' strides (default: --stride)"),
      text_list("probe-protect", "published", "the probes' protections: published, none, or sink/diagonal/last_row "
                                              "joined by '+'")
          .checked([](const std::string& s) { parse_protect(s, false); }),
      boolean("probe-outputs", false, "also the probes' attention output error vs dense, per layer"),
      real_list("probe-tau-sweep", "", Range::open_closed(0, 1), "each probe's scores selected anew at every τ"),
      boolean("accuracy", true, "run the sparse methods' generations (no: the dense runs and their probes only)"),
      path("dump", PathKind::out_dir, "write q/k/v .npy of the first dense run into this folder"),
      path("qk", PathKind::in_dir, "the estimators on the dumped heads of this folder, no model"),
      integer_list("layer", "", 0, 999, "--qk: the layers to read (default: every q_LL.npy)"),
      integer("repeat", 1, 1, 1000, "--qk: timed repetitions (the best is reported)"),
      path("picture", PathKind::out_dir,
           "--qk: folder for one PNG per layer, head (--picture-heads) and configuration: the mask over the oracle's "
           "block masses (green kept, red missed, blue extra)"),
      integer_list("picture-heads", "0", 0, 1023, "--qk: the query heads of --picture"),
      integer("picture-cell", 4, 1, 64, "--qk: pixels per block of --picture"),
  };
  t.insert(t.end(), more.begin(), more.end());
  return t;
}

const Command reg{"llm-probe",
                  "probes, comparisons and τ sweeps of the estimators on SmolLM2's real heads (or on q/k dumps)",
                  llm_probe_options(), run_llm_probe};

}  // namespace
}  // namespace ariadne::cli
