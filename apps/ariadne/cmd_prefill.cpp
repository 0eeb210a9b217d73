// ariadne prefill — block-sparse causal prefill on synthetic (or random) q/k/v, with quality
// metrics against the exact oracle and dense attention.
//
//   ariadne prefill --tokens 8192 --heads 8 --kv-heads 2 --dim 128 --method rr --tau 0.95
//                   --stride 8 --block 128 --synthetic sink:2,local:2,stripe:2,needle:2 --json
//
// Other options: --offset paper|released (RR sampling), --protect published|none|sink+diagonal+last_row
// (default published: as each method was released), --tau-heads T0,T1,... (one τ per query head), --backend
// cpu|reference|cuda (cuda: q/k/v go to the GPU as bf16 and the estimator, the oracle and the
// attention all run there), --theta (RoPE base), --seed, --threads, --metrics 0 (skip the oracle
// and dense runs), --estimate-only (no attention: estimator time and mask quality only),
// --tau-sweep T0,T1,... (after the run, the estimator's and the oracle's scores selected anew at each
// τ of the list, no second scoring pass: density, mass recall and block precision/recall/F1 per τ,
// the JSON's `tau_sweep` array; needs the oracle, so not with --metrics 0), --ranks N (context
// parallelism: the ring of ring_prefill simulated on the host with N ranks, dense or rr; the JSON's
// `ring` object has each rank's work and bytes sent and the hand-off's balance).
// Without --synthetic, q/k/v are i.i.d. uniform in [-1, 1].
#include <chrono>
#include <cmath>
#include <iostream>
#include <limits>
#include <sstream>

#include "ariadne/context_parallel.hpp"
#include "ariadne/device.hpp"
#include "ariadne/image.hpp"
#include "ariadne/mask_picture.hpp"
#include "ariadne/prefill.hpp"
#include "workloads/synthetic.hpp"
#include "cli.hpp"
#include "protect.hpp"

namespace {

using namespace ariadne;
using nlohmann::json;

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
  const int64_t tokens = args.i64("tokens");
  SyntheticConfig sc;
  sc.tokens = tokens;
  sc.heads_q = args.i32("heads");
  sc.heads_kv = args.i32("kv-heads");
  sc.dim = args.i32("dim");
  sc.rope_theta = args.real("theta");
  sc.seed = uint64_t(args.i64("seed"));
  const bool synthetic = args.given("synthetic");
  if (synthetic) sc.mix = args.str("synthetic");

  const std::string method = args.str("method");
  PrefillConfig pc;
  pc.dense = method == "dense";
  EstimateConfig& ec = pc.estimate;
  if (!pc.dense) ec.method = parse_estimator(method);
  ec.block = args.i32("block");
  ec.stride = args.i32("stride");
  ec.tau = args.real("tau");
  ec.offset = parse_rr_offset(args.str("offset"));
  ec.schedule = parse_rr_schedule(args.str("rr-schedule"));
  ec.layer = args.i32("layer");
  ec.flex_js_tau = args.real("flex-js-tau");
  ec.flex_min_budget = args.i64("flex-min-budget");
  ec.flex_max_budget = args.i64("flex-max-budget");
  ec.tau_per_head = args.reals("tau-heads");  // optional per-head τ table
  ec.protect = cli::parse_protect(args.str("protect"), false);
  const std::vector<double> sweep = args.reals("tau-sweep");  // τ values for select_mask on the same scores
  const bool has_sweep = !sweep.empty();
  pc.attention_backend = parse_backend(args.str("backend"));
  const bool metrics = args.flag("metrics");
  const std::string picture_dir = args.str("picture");
  if (!picture_dir.empty() && !metrics) args.fail("picture", "needs the oracle, not --metrics no");
  const bool estimate_only = args.flag("estimate-only");
  const bool json_out = args.json();
  if (estimate_only && pc.dense) args.fail("estimate-only", "needs an estimator method, not dense");
  const int ranks = args.i32("ranks");
  if (ranks > 0) {
    if (!pc.dense && ec.method != Estimator::rr)
      args.fail("ranks", "context parallelism runs dense or rr (RR reads keys only as stride sums, which the ranks all-gather)");
    if (pc.attention_backend == Backend::cuda) args.fail("ranks", "simulates the ring on the host: use --backend cpu or reference");
    if (estimate_only) args.fail("ranks", "runs the ring's attention: drop --estimate-only");
  }
  if (has_sweep) {
    if (pc.dense) args.fail("tau-sweep", "needs an estimator method, not dense");
    if (ec.method == Estimator::flexprefill)
      args.fail("tau-sweep", "flexprefill selects by its own rule, not by a threshold on scores: run it per --tau (γ)");
    if (!metrics) args.fail("tau-sweep", "needs the oracle, not --metrics no");
    if (!ec.tau_per_head.empty()) args.fail("tau-sweep", "sets one τ for every head; drop --tau-heads");
  }
  if (sc.heads_q % sc.heads_kv != 0) args.fail("kv-heads", "must divide --heads");
  validate(ec, sc.heads_q);
  cli::require_cuda_if_asked(args, "backend");
  if (synthetic) {  // the mix and the shapes, checked on a tiny prompt before the real one is built
    SyntheticConfig tiny = sc;
    tiny.tokens = std::min<int64_t>(tokens, 64);
    try {
      make_synthetic(tiny);
    } catch (const Error& e) {
      args.fail("synthetic", e.what());
    }
  }
  // q, out, dense out and lse [tokens, heads, dim] f32, k and v [tokens, kv_heads, dim] (and bf16
  // device copies, not counted: they live on the GPU).
  cli::check_memory("prefill", "--tokens",
                    4.0 * double(tokens) * (3.0 * sc.heads_q * double(sc.dim) + 2.0 * sc.heads_kv * double(sc.dim)));
  if (args.given("threads")) set_cpu_threads(args.i32("threads"));

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
  json ring_json;  // --ranks: the ring's statistics
  if (estimate_only) {
    // The estimator alone (CPU estimator benchmarks, where the attention would dominate the run).
    res.estimate = estimate(ap.q, ap.k, ap.pattern, ec, pc.estimate_backend);
    const EstimateStats& es = res.estimate.stats;
    res.stats = PrefillStats{es.ms_sampling, es.ms_scoring, es.ms_selection, es.ms_total, 0.0, es.ms_total,
                             es.density, es.density_per_head};
  } else if (ranks > 0) {
    RingConfig rc;
    rc.ranks = ranks;
    rc.backend = pc.attention_backend;
    RingPrefillResult rr = ring_prefill(ap, pc, rc);
    res = std::move(rr.prefill);
    const BlockMask gathered = res.estimate.mask;
    json jr;
    if (!pc.dense) {
      // The one-device estimate, for the metrics (they read its scores) and to show that the
      // ranks' gathered mask is the same mask.
      res.estimate = estimate(ap.q, ap.k, ap.pattern, ec, pc.estimate_backend);
      jr["mask_equals_one_device"] = res.estimate.mask.col_idx == gathered.col_idx &&
                                     res.estimate.mask.row_ptr == gathered.row_ptr;
    }
    jr["ranks"] = ranks;
    jr["imbalance"] = rr.ring.imbalance();
    jr["ms_ring"] = rr.ring.ms_total;
    std::vector<int64_t> entries, bytes;
    for (const RingRankStats& r : rr.ring.ranks) {
      entries.push_back(r.entries);
      bytes.push_back(r.bytes_sent);
    }
    jr["entries"] = entries;
    jr["bytes_sent"] = bytes;
    if (!pc.dense) {
      jr["work_imbalance_before"] = rr.assignment.imbalance_before();
      jr["work_imbalance"] = rr.assignment.imbalance();
      jr["blocks_moved"] = rr.assignment.moved;
    }
    ring_json = jr;
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
  j["rr_schedule"] = rr_schedule_name(ec.schedule);
  j["layer"] = ec.layer;
  j["protect"] = pc.dense ? "n/a" : cli::protections_text(ec.protections());
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
  if (!ring_json.is_null()) j["ring"] = ring_json;
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
    if (!picture_dir.empty()) {
      // One picture per query head: the mask over the oracle's block masses (mask_picture.hpp).
      json files = json::array();
      for (int h = 0; h < sc.heads_q; ++h) {
        const std::string file = picture_dir + "/" + method + "_h" + std::to_string(h) + ".png";
        write_png(file, mask_picture(mask, oracle, 0, h, args.i32("picture-cell")));
        files.push_back(file);
      }
      j["pictures"] = files;
    }
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
      if (!pc.dense) {
        // The oracle's mask at this mask's count in every row (oracle_mask_like): the output error
        // the estimator is read against at equal density.
        const BlockMask like = oracle_mask_like(mask, oracle);
        DeviceEstimate like_dev;
        AttentionParams lp = dp;
        lp.pattern = ap.pattern.with_blocks(mask_view_on(on_gpu ? Device::cuda : Device::cpu, like, like_dev));
        lp.blocks_nnz = like.nnz();
        Buffer like_out(DType::f32, {tokens, sc.heads_q, sc.dim});
        if (!on_gpu) lp.out = like_out.view();  // on the GPU it reuses ddense, read back into dense_out above
        attention(lp, pc.attention_backend);
        if (on_gpu) like_out = ddense.to_host();
        j["oracle_rel_err"] = rel_l2(like_out, dense_out);
      }
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
                << (estimate_only ? std::string("n/a") : j["rel_err"].dump())
                << (j.contains("oracle_rel_err") ? "  oracle at this density " + j["oracle_rel_err"].dump() : "")
                << "\n";
    if (j.contains("tau_sweep")) cli::print_tau_sweep(j["tau_sweep"], "  ");
    if (!ring_json.is_null())
      std::cout << "  ring of " << ranks << " ranks: work max/mean " << ring_json["imbalance"].get<double>()
                << (ring_json.contains("blocks_moved")
                        ? " after moving " + ring_json["blocks_moved"].dump() + " query blocks (before " +
                              ring_json["work_imbalance_before"].dump() + ")"
                        : std::string())
                << "\n";
  }
  return 0;
}

using namespace ariadne::cli;
const Command reg{
    "prefill", "block-sparse causal prefill (RR / XAttention / oracle / dense)",
    {integer("tokens", 8192, 1, 1 << 22, "prompt tokens"),
     integer("heads", 32, 1, 1024, "query heads"),
     integer("kv-heads", 8, 1, 1024, "key/value heads (must divide --heads)"),
     integer("dim", 128, 1, 1024, "head dimension"),
     real("theta", 10000, Range::above(1), "RoPE base of the synthetic heads"),
     integer("seed", 1, 0, int64_t(1) << 62, "input seed"),
     text("synthetic", "", "synthetic head mix, e.g. sink:2,local:2,stripe:2,needle:2 (bare: that mix; "
                           "absent: i.i.d. uniform q/k/v)")
         .bare_means(SyntheticConfig{}.mix),
     choice("method", "rr", {"dense", "rr", "xattn", "oracle", "flexprefill"}, "mask estimator, or dense attention"),
     integer("block", 128, 1, 1 << 16, "block size B in tokens"),
     integer("stride", 8, 1, 1 << 16, "sampling stride S (must divide --block)"),
     real("tau", 0.95, Range::open_closed(0, 1), "attention-mass threshold"),
     choice("offset", "paper", {"paper", "released"}, "RR's sampling offsets"),
     choice("rr-schedule", "head", {"head", "none", "layer", "hybrid"},
            "RR's schedule, which index rotates the sampled position: head (published), none, layer, head + layer"),
     integer("layer", 0, 0, (1 << 30) - 1, "the layer index the layer and hybrid RR schedules rotate with"),
     real("flex-js-tau", 0.1, Range::closed(0, 1), "flexprefill: query-aware when sqrt(JSD) is below it (--tau is γ)"),
     integer("flex-min-budget", 1024, 0, int64_t(1) << 30, "flexprefill: minimum budget in tokens"),
     integer("flex-max-budget", 0, 0, int64_t(1) << 30, "flexprefill: maximum budget in tokens (0: none)"),
     real_list("tau-heads", "", Range::open_closed(0, 1), "one τ per query head"),
     text("protect", "published", "protected blocks: published, none, or sink/diagonal/last_row joined by '+'")
         .checked([](const std::string& s) { parse_protect(s, false); }),
     real_list("tau-sweep", "", Range::open_closed(0, 1),
               "after the run, the same scores selected anew at each τ (needs the oracle)"),
     choice("backend", "cpu", {"cpu", "reference", "cuda"}, "attention backend (cuda: bf16 on the GPU)"),
     boolean("metrics", true, "oracle and dense runs for mask quality and output error"),
     path("picture", PathKind::out_dir,
          "folder for one PNG per query head: the mask over the oracle's block masses (green kept, red missed, "
          "blue extra; needs --metrics yes)"),
     integer("picture-cell", 4, 1, 64, "pixels per block of --picture"),
     threads_option(),
     boolean("estimate-only", false, "the estimator alone: no attention"),
     integer("ranks", 0, 0, 1024,
             "context parallelism: simulate a ring of this many ranks on the host (0: one device); dense or rr")},
    run_prefill};

}  // namespace
