// ariadne prefill — block-sparse causal prefill on synthetic (or random) q/k/v, with quality
// metrics against the exact oracle and dense attention.
//
//   ariadne prefill --tokens 8192 --heads 8 --kv-heads 2 --dim 128 --method rr --tau 0.95
//                   --stride 8 --block 128 --synthetic sink:2,local:2,stripe:2,needle:2 --json
//
// Other options: --offset paper|released (RR sampling), --protect none|last,sink,diag (default:
// as each method was released), --tau-heads T0,T1,... (one τ per query head), --backend
// cpu|reference|cuda (cuda: q/k/v go to the GPU as bf16 and the estimator, the oracle and the
// attention all run there), --theta (RoPE base), --seed, --threads, --metrics 0 (skip the oracle
// and dense runs), --estimate-only (no attention: estimator time and mask quality only),
// --tau-sweep T0,T1,... (after the run, the estimator's and the oracle's scores selected anew at each
// τ of the list, no second scoring pass: density, mass recall and block precision/recall/F1 per τ,
// the JSON's `tau_sweep` array; needs the oracle, so not with --metrics 0).
// Without --synthetic, q/k/v are i.i.d. uniform in [-1, 1].
#include <chrono>
#include <cmath>
#include <iostream>
#include <sstream>

#include "ariadne/device.hpp"
#include "core/parse.hpp"
#include "ariadne/prefill.hpp"
#include "workloads/synthetic.hpp"
#include "cli.hpp"

namespace {

using namespace ariadne;
using nlohmann::json;

Protections parse_protections(const std::string& s) {
  Protections p;
  if (s == "none") return p;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item == "last") p.last_row = true;
    else if (item == "sink") p.sink = true;
    else if (item == "diag") p.diagonal = true;
    else detail::fail("--protect: unknown protection '", item, "', expected none or a list of last, sink, diag");
  }
  return p;
}

std::string protections_text(const Protections& p) {
  std::string s;
  for (auto [on, name] : {std::pair{p.last_row, "last"}, {p.sink, "sink"}, {p.diagonal, "diag"}})
    if (on) {
      if (!s.empty()) s.push_back(',');
      s.append(name);
    }
  return s.empty() ? "none" : s;
}

// ‖a − b‖₂ / ‖b‖₂ over [tokens, heads, dim] outputs: overall (head = −1) or for one head.
// A bf16 device copy of an f32 host buffer (the CUDA attention reads bf16 or f16).
DeviceBuffer to_device_bf16(const Buffer& f) {
  Buffer b(DType::bf16, f.shape());
  const float* src = f.as<float>();
  uint16_t* dst = b.as<uint16_t>();
  for (int64_t i = 0; i < f.numel(); ++i) dst[i] = float_to_bf16(src[i]);
  return DeviceBuffer::from_host(b);
}

double rel_l2(const Buffer& a, const Buffer& b, int head = -1) {
  const float* x = a.as<float>();
  const float* y = b.as<float>();
  const int64_t heads = a.shape()[1], dim = a.shape()[2];
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (head >= 0 && (i / dim) % heads != head) continue;
    num += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
    den += double(y[i]) * y[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

int run_prefill(const cli::Args& args) {
  const int64_t tokens = args.integer("tokens", 8192);
  SyntheticConfig sc;
  sc.tokens = tokens;
  sc.heads_q = int(args.integer("heads", 32));
  sc.heads_kv = int(args.integer("kv-heads", 8));
  sc.dim = int(args.integer("dim", 128));
  sc.rope_theta = args.real("theta", 10000);
  sc.seed = uint64_t(args.integer("seed", 1));
  const bool synthetic = args.has("synthetic");
  if (synthetic) sc.mix = args.str("synthetic", sc.mix);
  if (sc.mix.empty()) sc.mix = SyntheticConfig{}.mix;

  const std::string method = args.str("method", "rr");
  PrefillConfig pc;
  pc.dense = method == "dense";
  EstimateConfig& ec = pc.estimate;
  if (!pc.dense) ec.method = parse_estimator(method);
  ec.block = int32_t(args.integer("block", 128));
  ec.stride = int32_t(args.integer("stride", 8));
  ec.tau = args.real("tau", 0.95);
  ec.offset = parse_rr_offset(args.str("offset", "paper"));
  for (const std::string& t : args.list("tau-heads", "")) {  // optional per-head τ table
    const auto v = parse_real(t);
    ARIADNE_CHECK(v.has_value(), "prefill: --tau-heads expects numbers, got '", t, "'");
    ec.tau_per_head.push_back(*v);
  }
  if (args.has("protect")) ec.protect = parse_protections(args.required("protect"));
  const std::vector<double> sweep = args.tau_list("tau-sweep");  // τ values for select_mask on the same scores
  const bool has_sweep = !sweep.empty();
  pc.attention_backend = parse_backend(args.str("backend", "cpu"));
  const bool metrics = args.integer("metrics", 1) != 0;
  if (args.has("threads")) set_cpu_threads(int(args.integer("threads", 0)));
  const bool estimate_only = args.flag("estimate-only");
  const bool json_out = args.json();
  args.reject_unused();
  ARIADNE_CHECK(!(estimate_only && pc.dense), "prefill: --estimate-only needs an estimator method, not dense");
  if (has_sweep) {
    ARIADNE_CHECK(!pc.dense, "prefill: --tau-sweep needs an estimator method, not dense");
    ARIADNE_CHECK(metrics, "prefill: --tau-sweep needs the oracle, not --metrics 0");
    ARIADNE_CHECK(ec.tau_per_head.empty(), "prefill: --tau-sweep sets one τ for every head; drop --tau-heads");
  }
  validate(ec, sc.heads_q);

  // Inputs: the synthetic mix, or i.i.d. uniform q/k/v in [-1, 1] (no structure) without --synthetic.
  Synthetic data;
  if (synthetic) {
    data = make_synthetic(sc);
  } else {
    ARIADNE_CHECK(tokens >= 1 && sc.heads_q >= 1 && sc.heads_kv >= 1 && sc.dim >= 1,
                  "prefill: --tokens, --heads, --kv-heads and --dim must be >= 1");
    data.q = Buffer(DType::f32, {tokens, sc.heads_q, sc.dim});
    data.k = Buffer(DType::f32, {tokens, sc.heads_kv, sc.dim});
    data.v = Buffer(DType::f32, {tokens, sc.heads_kv, sc.dim});
    data.q.fill_random(sc.seed * 3 + 0);
    data.k.fill_random(sc.seed * 3 + 1);
    data.v.fill_random(sc.seed * 3 + 2);
  }
  Buffer out(DType::f32, {tokens, sc.heads_q, sc.dim}), lse(DType::f32, {sc.heads_q, tokens});
  AttentionParams ap;
  ap.q = data.q.view();
  ap.k = data.k.view();
  ap.v = data.v.view();
  ap.out = out.view();
  ap.lse = lse.view();
  ap.pattern = Pattern::causal();
  // --backend cuda: device copies; `out` is read back after each run that writes it.
  const bool on_gpu = pc.attention_backend == Backend::cuda;
  DeviceBuffer dq, dk, dv, dout, dlse, ddense;
  if (on_gpu) {
    dq = to_device_bf16(data.q);
    dk = to_device_bf16(data.k);
    dv = to_device_bf16(data.v);
    dout = DeviceBuffer(DType::f32, {tokens, sc.heads_q, sc.dim});
    dlse = DeviceBuffer(DType::f32, {sc.heads_q, tokens});
    ap.q = dq.view();
    ap.k = dk.view();
    ap.v = dv.view();
    ap.out = dout.view();
    ap.lse = dlse.view();
  }
  PrefillResult res;
  if (estimate_only) {
    // The estimator alone (CPU estimator benchmarks, where the attention would dominate the run).
    res.estimate = estimate(ap.q, ap.k, ap.pattern, ec, pc.estimate_backend);
    const EstimateStats& es = res.estimate.stats;
    res.stats = PrefillStats{es.ms_sampling, es.ms_scoring, es.ms_selection, es.ms_total, 0.0, es.ms_total,
                             es.density, es.density_per_head};
  } else {
    res = prefill(ap, pc);
    if (on_gpu) out = dout.to_host();
  }
  const PrefillStats& st = res.stats;

  json j;
  j["method"] = method;
  j["tokens"] = tokens;
  j["heads"] = sc.heads_q;
  j["kv_heads"] = sc.heads_kv;
  j["dim"] = sc.dim;
  j["block"] = ec.block;
  j["stride"] = ec.stride;
  j["tau"] = ec.tau;
  j["offset"] = rr_offset_name(ec.offset);
  j["protect"] = pc.dense ? "n/a" : protections_text(ec.protections());
  j["backend"] = backend_name(pc.attention_backend);
  j["dtype"] = on_gpu ? "bf16" : "f32";
  j["synthetic"] = synthetic ? sc.mix : "random";
  j["theta"] = sc.rope_theta;
  j["seed"] = sc.seed;
  j["density"] = st.density;
  j["density_per_head"] = st.density_per_head;
  j["ms_sampling"] = st.ms_sampling;
  j["ms_scoring"] = st.ms_scoring;
  j["ms_selection"] = st.ms_selection;
  j["ms_estimate"] = st.ms_estimate;
  j["ms_attention"] = st.ms_attention;
  j["ms_total"] = st.ms_total;
  j["estimate_mac"] = pc.dense ? 0.0 : res.estimate.stats.mac;
  if (synthetic) {
    std::vector<std::string> types;
    for (HeadType t : data.head_types) types.push_back(head_type_name(t));
    j["head_types"] = types;
  }

  if (metrics) {
    // Ground truth: the oracle at the same block size and τ, and dense attention's output.
    EstimateConfig oc = ec;
    oc.method = Estimator::oracle;
    oc.protect.reset();
    const EstimateResult oracle = estimate(ap.q, ap.k, ap.pattern, oc);
    const BlockMask& mask = pc.dense ? BlockMask::all_visible(ap.pattern, ec.block, sc.heads_q, tokens, tokens)
                                     : res.estimate.mask;
    const MaskMetrics mm = compare_to_oracle(mask, oracle);
    j["mass_recall"] = mm.mass_recall;
    j["mass_recall_per_head"] = mm.mass_recall_per_head;
    j["block_precision"] = mm.precision;
    j["block_recall"] = mm.recall;
    j["block_f1"] = mm.f1;
    j["oracle_density"] = oracle.stats.density;
    j["ms_oracle"] = oracle.stats.ms_total;
    if (has_sweep) {
      // The same scores and masses, selected anew at each τ (select_mask; no second scoring pass).
      const auto t_sweep = std::chrono::steady_clock::now();
      const std::vector<TauSweepPoint> pts = tau_sweep(res.estimate, ec, oracle, oc, sweep);
      json arr = json::array();
      for (const TauSweepPoint& p : pts)
        arr.push_back({{"tau", p.tau},
                       {"density", p.metrics.density},
                       {"mass_recall", p.metrics.mass_recall},
                       {"block_precision", p.metrics.precision},
                       {"block_recall", p.metrics.recall},
                       {"block_f1", p.metrics.f1},
                       {"oracle_density", p.oracle_density},
                       {"density_per_head", p.density_per_head},
                       {"mass_recall_per_head", p.metrics.mass_recall_per_head}});
      j["tau_sweep"] = arr;
      j["ms_tau_sweep"] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_sweep).count();
    }
    if (!estimate_only) {
      Buffer dense_out(DType::f32, {tokens, sc.heads_q, sc.dim});
      AttentionParams dp = ap;
      dp.out = dense_out.view();
      if (on_gpu) {
        ddense = DeviceBuffer(DType::f32, {tokens, sc.heads_q, sc.dim});
        dp.out = ddense.view();
      }
      dp.lse = TensorView{};
      PrefillConfig dense_cfg = pc;
      dense_cfg.dense = true;
      const PrefillResult dres = prefill(dp, dense_cfg);
      if (on_gpu) dense_out = ddense.to_host();
      j["rel_err"] = rel_l2(out, dense_out);
      std::vector<double> per_head;
      for (int h = 0; h < sc.heads_q; ++h) per_head.push_back(rel_l2(out, dense_out, h));
      j["rel_err_per_head"] = per_head;
      j["ms_dense"] = dres.stats.ms_total;
    }
  }

  if (json_out) {
    cli::print_json(j);
  } else {
    std::cout << "prefill " << method << " N=" << tokens << " heads " << sc.heads_q << "/" << sc.heads_kv
              << " d=" << sc.dim << " B=" << ec.block << " S=" << ec.stride << " tau=" << ec.tau << "\n"
              << "  density " << st.density << "  estimate " << st.ms_estimate << " ms (sampling "
              << st.ms_sampling << ", scoring " << st.ms_scoring << ", selection " << st.ms_selection
              << ")  attention " << st.ms_attention << " ms  total " << st.ms_total << " ms\n";
    if (metrics)
      std::cout << "  mass recall " << j["mass_recall"].get<double>() << "  block F1 "
                << j["block_f1"].get<double>() << "  rel err "
                << (estimate_only ? std::string("n/a") : j["rel_err"].dump()) << "\n";
    if (j.contains("tau_sweep")) cli::print_tau_sweep(j["tau_sweep"], "  ");
  }
  return 0;
}

const ariadne::cli::Command reg{"prefill", "block-sparse causal prefill (RR / XAttention / oracle / dense)",
                                run_prefill};

}  // namespace
