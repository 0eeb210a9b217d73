// CUDA attention benchmark: reads bench/cases.json (the case list shared with bench/anchors.py) and
// prints one JSON list of {"id", "impl": "ariadne", "ms", "tflops", ...} on stdout.
//
// Timing (docs of the device machine, METHOD.md): random inputs (never zeros), rotated among
// enough buffer sets that the sets together exceed 3x the 60 MB L2, warm-up first, then the median
// over many batches of the per-launch time. Each batch is one CUDA graph replay of `per_batch`
// launches (so host launch gaps do not count, as they would not in a captured model); "ms_stream"
// is the same median over plain stream launches, host overhead included; "ms_single" times single
// calls the way bench/anchors.py times the anchors (each call alone between two events, queued
// behind a spinning kernel so the host's enqueue does not count: launch latency included, no
// back-to-back overlap), the like-for-like figure for ratios to the anchors. FLOPs count only allowed
// (query, key) pairs: 4 · d · pairs · heads. "useful" is allowed pairs over the pairs the kernel's
// tiles compute (the band-aware tiling's efficiency). "ms_colorder" (window cases on a square
// grid): the same attention over the column-major token order, gathered inside the kernel;
// "ms_idorder": the same fused-order path over the identity order. "ms_floor" / "ms_floor_single":
// the memory floor of the case (cuda_memory_floor: q, k, v read and out written once, "floor_mb"
// megabytes, none of the work), as graph replays / single calls on the same sets (bench/README.md,
// "Memory floor").
//
// Calls the plan routes to the Hopper wgmma kernel (the default for dense rows) report impl
// "ariadne_wgmma" (decided per case by AttentionPlan::cuda_kernel, so a case that stays on another
// kernel keeps "ariadne"); stack cases report "ariadne_wgmma" unless --kernel=tile. Every record
// names its plan ("plan": AttentionPlan::describe).
//
// --backward: the backward instead (attention_backward on each set's forward results, dout random):
// impl "ariadne_bwd" with "ms_single" the backward alone, "ms_fwdbwd_single" forward + backward and
// "ms_det_single" the deterministic plan's backward, "ms_<kernel>_single" each main kernel's that the
// default plan did not take (forced: tile, and wgmma where it runs the call; "ms_<kernel>_det_single"
// its deterministic plan), all single calls as the anchors time theirs
// (bench/anchors_backward.py); TFLOP/s at 2.5x the forward's FLOPs (five products instead of two).
//
// Usage: bench_attention_cuda [--backward] [--OVERRIDE=VALUE ...] [cases.json] [id-prefix[,id-prefix...] ...]
// Overrides (AttentionOverrides; a case the forced route cannot take fails): --kernel=auto|tile|
// wgmma|band|bandwg, --tma=on|off, --out-tma=on|off, --pingpong=on|off, --launch-order=tiles|heads,
// --tile-128-rows=on|off, --band-run=N, --ordered-tiles=on|off, --chunk-pass=on|off.

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ariadne/attention.hpp"
#include "ariadne/attention_backward.hpp"
#include "ariadne/device.hpp"
#include "ariadne/order.hpp"
#include "ariadne/pattern.hpp"
#include "kernels/bench_kernels.hpp"

namespace {

using namespace ariadne;

bool g_backward = false;  // --backward

// The plan options every case runs with (from the command line).
AttentionOptions g_options = [] {
  AttentionOptions o;
  o.backend = Backend::cuda;
  return o;
}();

Toggle parse_toggle(const std::string& flag, const std::string& v) {
  if (v == "on" || v == "1") return Toggle::on;
  if (v == "off" || v == "0") return Toggle::off;
  if (v == "auto") return Toggle::automatic;
  ariadne::detail::fail(flag, ": '", v, "' is not one of on, off, auto");
}

// Reads one --OVERRIDE=VALUE argument into g_options; false when `arg` is not one.
bool parse_override(const std::string& arg) {
  if (arg.rfind("--", 0) != 0) return false;
  const size_t eq = arg.find('=');
  ARIADNE_CHECK(eq != std::string::npos, arg, ": expected --NAME=VALUE");
  const std::string name = arg.substr(0, eq), v = arg.substr(eq + 1);
  AttentionOverrides& o = g_options.overrides;
  if (name == "--kernel") {
    const std::pair<const char*, CudaKernel> kernels[] = {{"auto", CudaKernel::automatic}, {"tile", CudaKernel::tile},
                                                          {"wgmma", CudaKernel::wgmma},    {"band", CudaKernel::band},
                                                          {"bandwg", CudaKernel::bandwg}};
    bool found = false;
    for (const auto& [n, k] : kernels)
      if (v == n) {
        o.cuda_kernel = k;
        found = true;
      }
    ARIADNE_CHECK(found, name, ": '", v, "' is not one of auto, tile, wgmma, band, bandwg");
  } else if (name == "--tma") o.tma = parse_toggle(name, v);
  else if (name == "--out-tma") o.out_tma = parse_toggle(name, v);
  else if (name == "--pingpong") o.pingpong = parse_toggle(name, v);
  else if (name == "--tile-128-rows") o.tile_128_rows = parse_toggle(name, v);
  else if (name == "--ordered-tiles") o.ordered_tiles = parse_toggle(name, v);
  else if (name == "--chunk-pass") o.chunk_pass = parse_toggle(name, v);
  else if (name == "--band-run") o.band_run = std::stoi(v);
  else if (name == "--launch-order") {
    ARIADNE_CHECK(v == "tiles" || v == "heads" || v == "auto", name, ": '", v, "' is not one of tiles, heads, auto");
    o.launch_order = v == "tiles" ? LaunchOrder::tile_major : v == "heads" ? LaunchOrder::heads_fastest : LaunchOrder::automatic;
  } else
    ariadne::detail::fail(arg, ": unknown option");
  return true;
}

void check(cudaError_t e, const char* what) {
  ARIADNE_CHECK(e == cudaSuccess, "bench: ", what, ": ", cudaGetErrorString(e));
}

// Fills a device buffer with uniform random 16-bit values in [-1, 1): a 16 MB random host block,
// copied at a different offset into each place, so no two buffers hold the same bytes in order.
void fill_random(const DeviceBuffer& d, DType dt, std::mt19937_64& rng) {
  static std::vector<uint16_t> block;
  if (block.empty()) {
    Buffer b(dt, {int64_t(8) << 20});
    b.fill_random(rng());
    block.assign(b.as<uint16_t>(), b.as<uint16_t>() + b.numel());
  }
  const size_t n = d.bytes() / 2, bn = block.size();
  size_t done = 0, off = rng() % bn;
  while (done < n) {
    const size_t take = std::min(n - done, bn - off);
    check(cudaMemcpy(static_cast<uint16_t*>(d.data()) + done, block.data() + off, take * 2, cudaMemcpyHostToDevice),
          "upload");
    done += take;
    off = 0;
  }
}

struct Counts {
  double pairs = 0;     // allowed (query, key) pairs, one head
  double computed = 0;  // pairs inside the tiles the kernel visits, one head
};

// Allowed pairs and computed tile area of head `h`, from the host copy of the pattern (the same
// Pattern methods the kernel calls).
Counts count_pairs(const Pattern& pat, int64_t total_q, int64_t total_k, int h, int bm, int bn) {
  Counts c;
  for (int32_t s = 0; s < pat.num_seqs; ++s) {
    const SeqExtent e = pat.seq(s, total_q, total_k);
    for (int64_t q_lo = 0; q_lo < e.lq; q_lo += bm) {
      const int64_t q_hi = std::min(q_lo + bm, e.lq);
      const KeyRange r = pat.key_range(e, q_lo, q_hi);
      auto tile = [&](int64_t k_lo) {
        const int64_t k_hi = std::min(k_lo + bn, e.lk);
        c.computed += double(bm) * bn;
        const TileKind kind = pat.classify(e, q_lo, q_hi, k_lo, k_hi);
        if (kind == TileKind::full) c.pairs += double(q_hi - q_lo) * (k_hi - k_lo);
        else if (kind == TileKind::partial)
          for (int64_t iq = q_lo; iq < q_hi; ++iq) {
            const KeyRange kr = pat.key_range(e, iq, iq + 1);
            c.pairs += double(std::max<int64_t>(0, std::min(kr.hi, k_hi) - std::max(kr.lo, k_lo)));
          }
      };
      if (pat.blocks.defined()) {
        const int64_t row = pat.block_row(s, e, h, q_lo / pat.blocks.block);
        for (int32_t i = pat.blocks.row_ptr[row]; i < pat.blocks.row_ptr[row + 1]; ++i)
          for (int64_t k_lo = int64_t(pat.blocks.col_idx[i]) * pat.blocks.block;
               k_lo < int64_t(pat.blocks.col_idx[i] + 1) * pat.blocks.block; k_lo += bn)
            if (k_lo + bn > r.lo && k_lo < r.hi) tile(k_lo);
      } else if (!r.empty()) {
        for (int64_t k_lo = r.lo / bn * bn; k_lo < r.hi; k_lo += bn) tile(k_lo);
      }
    }
  }
  return c;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Milliseconds the work that `enqueue` puts on `stream` takes, between events e0 and e1.
template <class F>
double timed_ms(cudaStream_t stream, cudaEvent_t e0, cudaEvent_t e1, F&& enqueue) {
  check(cudaEventRecord(e0, stream), "record");
  enqueue();
  check(cudaEventRecord(e1, stream), "record");
  check(cudaEventSynchronize(e1), "sync");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
  return ms;
}

// The anchors' method (bench/anchors.py, Timer.times): the median of single calls, each between two
// events and queued behind a spinning kernel (cuda_spin, as the anchors' torch.cuda._sleep) that
// outlasts the host's enqueue time of the call, so that the events bracket GPU work only: the
// call's launch latency counts, and no call overlaps or follows another back to back as in a
// graph. `call(i)` enqueues one call on input set i % sets (one attention call; a stack case's 32).
// Like for like with the anchors' "ms", which this records as "ms_single"; "ms" stays the graph
// replays' per-launch time.
template <class F>
double single_call_ms(cudaStream_t stream, int sets, double rough_ms, F&& call) {
  double host_us = 0;  // the slower of two enqueues, after warm-up calls
  for (int i = 0; i < 4; ++i) {
    check(cudaStreamSynchronize(stream), "single-call warm-up");
    const auto t0 = std::chrono::steady_clock::now();
    call(i);
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    if (i >= 2) host_us = std::max(host_us, us);
  }
  check(cudaStreamSynchronize(stream), "single-call warm-up");
  const double hold_us = 1.5 * host_us + 50;  // bench/anchors.py's sleep: 1.5 x host + 0.05 ms
  // About 0.4 s of holds and calls, 10 to 200 calls.
  const int reps = std::clamp(int(400.0 / (rough_ms + 1e-3 * hold_us)), 10, 200);
  std::vector<cudaEvent_t> ev(size_t(2 * reps));
  for (cudaEvent_t& e : ev) check(cudaEventCreate(&e), "event");
  for (int r = 0; r < reps; ++r) {
    cuda_spin(stream, hold_us);
    check(cudaEventRecord(ev[size_t(2 * r)], stream), "record");
    call(r % sets);
    check(cudaEventRecord(ev[size_t(2 * r + 1)], stream), "record");
  }
  check(cudaStreamSynchronize(stream), "single calls");
  std::vector<double> ms(static_cast<size_t>(reps));
  for (int r = 0; r < reps; ++r) {
    float t = 0;
    check(cudaEventElapsedTime(&t, ev[size_t(2 * r)], ev[size_t(2 * r + 1)]), "elapsed");
    ms[size_t(r)] = t;
  }
  for (cudaEvent_t e : ev) check(cudaEventDestroy(e), "event");
  return median(ms);
}

// The backward of one case on its buffer sets (params / plans of the forward, one per set): each
// set's forward runs once for out and lse, then the backward is timed alone, after the forward, and
// on the deterministic plan.
nlohmann::json backward_record(const std::string& id, const Pattern& host, int64_t total, DType dt,
                               const std::vector<AttentionParams>& params, const std::vector<AttentionPlan>& plans,
                               cudaStream_t stream, std::mt19937_64& rng) {
  const int sets = int(params.size());
  const int hq = params[0].heads_q(), hkv = params[0].heads_kv(), d = params[0].head_dim();
  struct Grads {
    DeviceBuffer dout, dq, dk, dv, dsink;
  };
  std::vector<Grads> grads;
  std::vector<AttentionGrads> views;
  std::vector<AttentionBackwardPlan> fast, det;
  // The main kernels the default plan did not take, forced, default and deterministic plans.
  struct Forced {
    CudaKernel kernel;
    std::vector<AttentionBackwardPlan> plans, det;
  };
  std::vector<Forced> forced;
  for (int i = 0; i < sets; ++i) {
    run(plans[size_t(i)], params[size_t(i)]);
    Grads g{DeviceBuffer(dt, {total, hq, d}), DeviceBuffer(dt, {total, hq, d}), DeviceBuffer(dt, {total, hkv, d}),
            DeviceBuffer(dt, {total, hkv, d}), {}};
    fill_random(g.dout, dt, rng);
    AttentionGrads v;
    v.dout = g.dout.view();
    v.dq = g.dq.view();
    v.dk = g.dk.view();
    v.dv = g.dv.view();
    if (params[0].sink_mode != SinkMode::none) {
      g.dsink = DeviceBuffer(DType::f32, {hq});
      v.dsink = g.dsink.view();
    }
    grads.push_back(std::move(g));
    views.push_back(v);
    BackwardOptions o;
    o.backend = Backend::cuda;
    fast.push_back(plan_attention_backward(params[size_t(i)], v, o));
    o.deterministic = true;
    det.push_back(plan_attention_backward(params[size_t(i)], v, o));
    for (const CudaKernel k : {CudaKernel::tile, CudaKernel::wgmma}) {
      if (k == fast.back().cuda_kernel()) continue;
      if (i == 0) forced.push_back({k, {}, {}});
      for (Forced& f : forced) {
        if (f.kernel != k) continue;
        BackwardOptions fo = o;
        fo.cuda_kernel = k;
        try {
          fo.deterministic = false;
          f.plans.push_back(plan_attention_backward(params[size_t(i)], v, fo));
          fo.deterministic = true;
          f.det.push_back(plan_attention_backward(params[size_t(i)], v, fo));
        } catch (const Error&) {  // this kernel does not take the call: no column
        }
      }
    }
  }
  const auto bwd = [&](int i) { run(fast[size_t(i % sets)], params[size_t(i % sets)], views[size_t(i % sets)]); };
  const auto bwd_det = [&](int i) { run(det[size_t(i % sets)], params[size_t(i % sets)], views[size_t(i % sets)]); };
  const auto fwd_bwd = [&](int i) {
    run(plans[size_t(i % sets)], params[size_t(i % sets)]);
    bwd(i);
  };
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "event");
  check(cudaEventCreate(&e1), "event");
  for (int i = 0; i < 2 * sets; ++i) bwd_det(i);  // warm-up: module load, shared-memory opt-in
  const double rough = timed_ms(stream, e0, e1, [&] {
                         for (int i = 0; i < sets; ++i) bwd(i);
                       }) / sets;
  check(cudaEventDestroy(e0), "event");
  check(cudaEventDestroy(e1), "event");
  const double ms = single_call_ms(stream, sets, rough, bwd);
  const double ms_fwdbwd = single_call_ms(stream, sets, rough * 1.5, fwd_bwd);
  const double ms_det = single_call_ms(stream, sets, rough, bwd_det);
  std::vector<std::pair<std::string, double>> forced_ms;
  for (const Forced& f : forced) {
    if (int(f.plans.size()) != sets) continue;
    for (const auto* plans : {&f.plans, &f.det}) {
      for (int i = 0; i < sets; ++i) run((*plans)[size_t(i)], params[size_t(i)], views[size_t(i)]);  // warm-up
      const double t = single_call_ms(stream, sets, rough * 2, [&](int i) {
        run((*plans)[size_t(i % sets)], params[size_t(i % sets)], views[size_t(i % sets)]);
      });
      forced_ms.emplace_back(std::string("ms_") + cuda_kernel_name(f.kernel) + (plans == &f.det ? "_det" : "") + "_single", t);
    }
  }
  check(cudaStreamSynchronize(stream), "backward");
  Counts c;
  const int heads_counted = host.blocks.defined() ? hq : 1;
  for (int h = 0; h < heads_counted; ++h) c.pairs += count_pairs(host, total, total, h, 64, 64).pairs;
  c.pairs *= double(hq) / heads_counted;
  nlohmann::json r;
  r["id"] = id;
  r["impl"] = "ariadne_bwd";
  r["plan"] = fast[0].describe();
  r["ms"] = ms;
  r["ms_single"] = ms;
  r["ms_fwdbwd_single"] = ms_fwdbwd;
  r["ms_det_single"] = ms_det;
  for (const auto& [key, t] : forced_ms) r[key] = t;
  r["tflops"] = 2.5 * 4.0 * d * c.pairs / (ms * 1e-3) / 1e12;
  r["sets"] = sets;
  return r;
}

nlohmann::json run_case(const nlohmann::json& jc, std::mt19937_64& rng) {
  const std::string id = jc.at("id");
  const int64_t batch = jc.at("batch"), tokens = jc.at("tokens");
  const int hq = jc.at("heads_q"), hkv = jc.at("heads_kv"), d = jc.at("dim");
  const DType dt = parse_dtype(jc.value("dtype", std::string("bf16")));
  const PatternSpec spec = parse_pattern_spec(jc.at("pattern"));
  const SinkMode sink_mode = parse_sink_mode(jc.value("sink", std::string("none")));
  const int64_t total = batch * tokens;

  // Host pattern (for the mask and the counts) and its device twin.
  std::vector<int32_t> cu(batch + 1);
  for (int64_t b = 0; b <= batch; ++b) cu[b] = int32_t(b * tokens);
  Pattern host = spec.dense;
  if (batch > 1) host = host.with_varlen(int32_t(batch), cu.data());
  BlockMask mask;
  if (spec.block_density > 0) {
    mask = BlockMask::random(host, spec.block, hq, total, total, spec.block_density, std::hash<std::string>{}(id),
                             /*keep_diagonal=*/true);
    host = host.with_blocks(mask.view());
  }
  DeviceBuffer d_cu, d_base, d_row, d_col;
  Pattern dev = host;
  if (batch > 1) {
    d_cu = DeviceBuffer::from_ints(cu);
    dev.cu_seqlens_q = static_cast<const int32_t*>(d_cu.data());
    dev.cu_seqlens_k = nullptr;
  }
  if (spec.block_density > 0) {
    d_base = DeviceBuffer::from_ints(mask.seq_block_base);
    d_row = DeviceBuffer::from_ints(mask.row_ptr);
    d_col = DeviceBuffer::from_ints(mask.col_idx);
    dev.blocks.seq_block_base = static_cast<const int32_t*>(d_base.data());
    dev.blocks.row_ptr = static_cast<const int32_t*>(d_row.data());
    dev.blocks.col_idx = static_cast<const int32_t*>(d_col.data());
  }

  // Buffer sets: enough that their inputs and outputs together exceed 3x L2, within 24 GB.
  const double set_bytes = double(total) * d * 2 * (2.0 * hq + 2.0 * hkv) + double(total) * hq * 4;
  const int sets = int(std::clamp(std::ceil(180e6 / set_bytes), 2.0, std::max(2.0, std::floor(24e9 / set_bytes))));
  struct Set {
    DeviceBuffer q, k, v, out, lse;
  };
  std::vector<Set> bufs;
  for (int i = 0; i < sets; ++i) {
    Set s{DeviceBuffer(dt, {total, hq, d}), DeviceBuffer(dt, {total, hkv, d}), DeviceBuffer(dt, {total, hkv, d}),
          DeviceBuffer(dt, {total, hq, d}), DeviceBuffer(DType::f32, {hq, total})};
    fill_random(s.q, dt, rng);
    fill_random(s.k, dt, rng);
    fill_random(s.v, dt, rng);
    bufs.push_back(std::move(s));
  }
  DeviceBuffer sink;
  if (sink_mode != SinkMode::none) {
    Buffer hs(DType::f32, {hq});
    hs.fill_random(rng(), 3.f, 6.f);  // the anchors' range (bench/README.md)
    sink = DeviceBuffer::from_host(hs);
  }
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  std::vector<AttentionParams> params;
  for (Set& s : bufs) {
    AttentionParams p;
    p.q = s.q.view();
    p.k = s.k.view();
    p.v = s.v.view();
    p.out = s.out.view();
    p.lse = s.lse.view();
    p.pattern = dev;
    p.blocks_nnz = spec.block_density > 0 ? int64_t(mask.col_idx.size()) : -1;  // the schedule hint
    p.sink_mode = sink_mode;
    if (sink_mode != SinkMode::none) p.sink = sink.view();
    p.stream = stream;
    params.push_back(p);
  }

  // One plan per buffer set (run() would re-encode the tensor maps for other pointers).
  std::vector<AttentionPlan> plans;
  for (const AttentionParams& p : params) plans.push_back(plan_attention(p, g_options));
  const auto call = [&](int i) { run(plans[size_t(i % sets)], params[size_t(i % sets)]); };
  if (g_backward) {
    nlohmann::json r = backward_record(id, host, total, dt, params, plans, stream, rng);
    check(cudaStreamDestroy(stream), "stream");
    return r;
  }

  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "event");
  check(cudaEventCreate(&e1), "event");
  auto time_launches = [&](int n, int start) {
    const auto launches = [&] {
      for (int i = 0; i < n; ++i) call(start + i);
    };
    return timed_ms(stream, e0, e1, launches) / n;
  };
  // Window cases on a square image also run over the column-major traversal of the grid (the
  // token order of Ariadne's alternate layers) and over the identity order, both fused into the
  // kernel's loads and stores (AttentionParams::order; empty: not such a case).
  const int64_t side = int64_t(std::llround(std::sqrt(double(tokens))));
  std::vector<int32_t> col_order, id_order;
  // The ordered calls: each set's params with `order`, and their plans.
  const auto ordered = [&](const int32_t* order) {
    std::vector<AttentionParams> ps = params;
    std::vector<AttentionPlan> pl;
    for (AttentionParams& p : ps) {
      p.order = order;
      pl.push_back(plan_attention(p, g_options));
    }
    return std::pair{ps, pl};
  };
  if (batch == 1 && side * side == tokens && spec.dense.window_left != kUnbounded && !host.blocks.defined()) {
    col_order.resize(size_t(tokens));
    id_order.resize(size_t(tokens));
    for (int64_t i = 0; i < tokens; ++i) {
      col_order[size_t(i)] = int32_t((i % side) * side + i / side);
      id_order[size_t(i)] = int32_t(i);
    }
  }
  // ARIADNE_BENCH_PROFILE=1 (for a profiler such as Nsight Compute): no timing, 2 launches of each path instead,
  // storage order first, then (window cases on a square grid) the identity and the column-major
  // order, so a profiler's launch-skip picks one: 1, 3 or 5.
  if (const char* prof = std::getenv("ARIADNE_BENCH_PROFILE"); prof != nullptr && std::string(prof) == "1") {
    for (int i = 0; i < 2; ++i) call(i);
    if (!col_order.empty()) {
      const DeviceBuffer d_id = DeviceBuffer::from_ints(id_order), d_col = DeviceBuffer::from_ints(col_order);
      for (const DeviceBuffer* o : {&d_id, &d_col}) {
        const auto [ps, pl] = ordered(static_cast<const int32_t*>(o->data()));
        for (int i = 0; i < 2; ++i) run(pl[size_t(i % sets)], ps[size_t(i % sets)]);
      }
    }
    check(cudaStreamSynchronize(stream), "profile launches");
    check(cudaEventDestroy(e0), "event");
    check(cudaEventDestroy(e1), "event");
    check(cudaStreamDestroy(stream), "stream");
    nlohmann::json r;
    r["id"] = id;
    r["profile"] = true;
    return r;
  }
  time_launches(3, 0);  // warm-up: module load, shared-memory opt-in
  const double rough = time_launches(5, 0);
  // About 2 ms of work per batch, at least `sets` launches so every set is used.
  const int per_batch = std::max(sets, int(std::ceil(2.0 / std::max(rough, 1e-3))));
  // Fewer batches for long kernels: about 1.5 s per timing method and case at most.
  const double batch_ms = per_batch * rough;
  const int n_stream = std::clamp(int(1500 / batch_ms), 3, 15), n_graph = std::clamp(int(1500 / batch_ms), 5, 25);
  std::vector<double> stream_ms;
  for (int b = 0; b < n_stream; ++b) stream_ms.push_back(time_launches(per_batch, b));

  // Median per-launch time of one captured graph of `per_batch` calls of `graph_call(set index)`.
  auto time_graph = [&](auto&& graph_call) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
    for (int i = 0; i < per_batch; ++i) graph_call(i % sets);
    check(cudaStreamEndCapture(stream, &graph), "capture end");
    check(cudaGraphInstantiate(&exec, graph, 0), "graph instantiate");
    check(cudaGraphLaunch(exec, stream), "graph warm-up");
    std::vector<double> ms_per_launch;
    const auto launch = [&] { check(cudaGraphLaunch(exec, stream), "graph launch"); };
    for (int b = 0; b < n_graph; ++b) ms_per_launch.push_back(timed_ms(stream, e0, e1, launch) / per_batch);
    check(cudaGraphExecDestroy(exec), "graph");
    check(cudaGraphDestroy(graph), "graph");
    return median(ms_per_launch);
  };
  const double ms = time_graph(call);
  const double ms_single = single_call_ms(stream, sets, ms, call);

  // The memory floor (cuda_memory_floor; bench/README.md, "Memory floor"): one launch that reads
  // this case's q, k and v and writes its out once with none of the work, timed both ways on the
  // same rotated sets.
  const int64_t q_bytes = total * hq * d * dtype_size(dt), kv_bytes = total * hkv * d * dtype_size(dt);
  const auto floor_call = [&](int i) {
    const AttentionParams& p = params[size_t(i % sets)];
    cuda_memory_floor(p.q.data, p.k.data, p.v.data, p.out.data, q_bytes, kv_bytes, stream);
  };
  for (int i = 0; i < sets; ++i) floor_call(i);  // warm-up outside the capture
  const double ms_floor = time_graph(floor_call);
  const double ms_floor_single = single_call_ms(stream, sets, ms_floor, floor_call);

  double ms_colorder = 0, ms_idorder = 0;
  if (!col_order.empty()) {
    const DeviceBuffer d_order = DeviceBuffer::from_ints(col_order);
    const auto [cps, cpl] = ordered(static_cast<const int32_t*>(d_order.data()));
    run(cpl[0], cps[0]);  // warm-up outside the capture
    ms_colorder = time_graph([&](int i) { run(cpl[size_t(i)], cps[size_t(i)]); });
    // The same path over the identity order: what the fused-order code costs by itself (the
    // gathering producer, the output's row copies), apart from where the rows lie.
    const DeviceBuffer d_id = DeviceBuffer::from_ints(id_order);
    const auto [ips, ipl] = ordered(static_cast<const int32_t*>(d_id.data()));
    ms_idorder = time_graph([&](int i) { run(ipl[size_t(i)], ips[size_t(i)]); });
  }
  check(cudaEventDestroy(e0), "event");
  check(cudaEventDestroy(e1), "event");
  check(cudaStreamDestroy(stream), "stream");

  // Pairs: heads differ only for block-sparse masks (one CSR row set per head).
  const int bm = plans[0].query_tile_rows(), bn = plans[0].key_tile_rows();
  Counts c;
  const int heads_counted = host.blocks.defined() ? hq : 1;
  for (int h = 0; h < heads_counted; ++h) {
    const Counts ch = count_pairs(host, total, total, h, bm, bn);
    c.pairs += ch.pairs;
    c.computed += ch.computed;
  }
  c.pairs *= double(hq) / heads_counted;
  c.computed *= double(hq) / heads_counted;
  nlohmann::json r;
  r["id"] = id;
  r["impl"] = plans[0].cuda_kernel() == CudaKernel::wgmma ? "ariadne_wgmma" : "ariadne";
  r["plan"] = plans[0].describe();
  r["ms"] = ms;
  r["tflops"] = 4.0 * d * c.pairs / (ms * 1e-3) / 1e12;
  r["ms_stream"] = median(stream_ms);
  r["ms_single"] = ms_single;
  r["useful"] = c.computed > 0 ? c.pairs / c.computed : 0.0;
  r["ms_floor"] = ms_floor;
  r["ms_floor_single"] = ms_floor_single;
  r["floor_mb"] = double(2 * q_bytes + 2 * kv_bytes) / 1e6;
  r["tile"] = std::to_string(bm) + "x" + std::to_string(bn);
  r["sets"] = sets;
  if (ms_colorder > 0) r["ms_colorder"] = ms_colorder;
  if (ms_idorder > 0) r["ms_idorder"] = ms_idorder;
  return r;
}

// The 32 attention layers of the Qwen2.5-VL-style encoder at a side x side image (bench/README.md,
// "Stack cases"), each layer on its own q, k, v (16 heads, d 80, tokens in the native block-row
// order). Layers that run in another order (Ariadne's column layers, Qwen's window order) take it
// as a fused token order (AttentionParams::order): no gather of q, k, v, no inverse gather of the
// output, which stays in the native order. Timed as one captured graph of the 32 launches.
nlohmann::json run_stack(const nlohmann::json& jc, std::mt19937_64& rng) {
  const std::string id = jc.at("id"), schedule = jc.at("schedule");
  const int side = jc.at("side"), batch = jc.value("batch", 1);
  ARIADNE_CHECK(batch == 1, id, ": stack cases with batch > 1 are not implemented");
  constexpr int kLayers = 32, kHeads = 16, kDim = 80, kPatch = 14, kWindow = 64;
  const Grid grid{side / kPatch, side / kPatch};
  const int64_t n = grid.tokens();
  const TokenOrder native = make_order(OrderKind::block_row, {grid});
  const std::vector<int32_t> to_col = order_conversion(native, make_order(OrderKind::block_col, {grid}));
  const std::vector<int32_t> to_win = order_conversion(native, make_order(OrderKind::qwen_window, {grid}));
  const DeviceBuffer d_col = DeviceBuffer::from_ints(to_col), d_win = DeviceBuffer::from_ints(to_win);

  struct Layer {
    Pattern pattern;
    SinkMode sink = SinkMode::none;
    const int32_t* order = nullptr;  // device; null: native order
    BlockColGrid block_col;          // the column layers' order, for the copy-engine path
  };
  std::vector<Layer> layers;
  for (int i = 0; i < kLayers; ++i) {
    Layer l;  // full by default
    if (schedule == "chunk" && i % 8 != 7) {
      l.pattern = Pattern::chunked(64);
      l.order = static_cast<const int32_t*>(d_win.data());
    } else if (schedule == "ariadne" && i % 8 != 7) {
      l.pattern = Pattern::window(kWindow, kWindow);
      l.sink = SinkMode::denominator;
      if (i % 8 >= 4) {
        l.order = static_cast<const int32_t*>(d_col.data());
        l.block_col = BlockColGrid{grid.h, grid.w};
      }
    } else {
      ARIADNE_CHECK(schedule == "full" || schedule == "chunk" || schedule == "ariadne", id, ": schedule '",
                    schedule, "' is not full, chunk or ariadne");
    }
    layers.push_back(l);
  }

  struct Set {
    DeviceBuffer q, k, v, out;
  };
  std::vector<Set> bufs;
  for (int i = 0; i < kLayers; ++i) {
    Set st{DeviceBuffer(DType::bf16, {n, kHeads, kDim}), DeviceBuffer(DType::bf16, {n, kHeads, kDim}),
           DeviceBuffer(DType::bf16, {n, kHeads, kDim}), DeviceBuffer(DType::bf16, {n, kHeads, kDim})};
    fill_random(st.q, DType::bf16, rng);
    fill_random(st.k, DType::bf16, rng);
    fill_random(st.v, DType::bf16, rng);
    bufs.push_back(std::move(st));
  }
  Buffer hs(DType::f32, {kHeads});
  hs.fill_random(rng(), 3.f, 6.f);
  const DeviceBuffer sink = DeviceBuffer::from_host(hs);
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  std::vector<AttentionParams> params;
  std::vector<AttentionPlan> plans;
  double flops = 0;
  for (int i = 0; i < kLayers; ++i) {
    AttentionParams p;
    p.q = bufs[i].q.view();
    p.k = bufs[i].k.view();
    p.v = bufs[i].v.view();
    p.out = bufs[i].out.view();
    p.pattern = layers[i].pattern;
    p.sink_mode = layers[i].sink;
    if (p.sink_mode != SinkMode::none) p.sink = sink.view();
    p.stream = stream;
    p.order = layers[i].order;
    params.push_back(p);
    AttentionOptions o = g_options;
    o.block_col = layers[i].block_col;
    plans.push_back(plan_attention(p, o));
    flops += 4.0 * kDim * kHeads * count_pairs(layers[i].pattern, n, n, 0, 64, 64).pairs;
  }
  auto stack = [&] {
    for (int i = 0; i < kLayers; ++i) run(plans[size_t(i)], params[size_t(i)]);
  };
  stack();  // warm-up
  check(cudaStreamSynchronize(stream), "warm-up");
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
  stack();
  check(cudaStreamEndCapture(stream, &graph), "capture end");
  check(cudaGraphInstantiate(&exec, graph, 0), "graph instantiate");
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "event");
  check(cudaEventCreate(&e1), "event");
  std::vector<double> ms_runs;
  const auto launch = [&] { check(cudaGraphLaunch(exec, stream), "graph launch"); };
  for (int r = 0; r < 30; ++r) ms_runs.push_back(timed_ms(stream, e0, e1, launch));
  const double ms_single = single_call_ms(stream, 1, median(ms_runs), [&](int) { stack(); });
  check(cudaGraphExecDestroy(exec), "graph");
  check(cudaGraphDestroy(graph), "graph");
  check(cudaEventDestroy(e0), "event");
  check(cudaEventDestroy(e1), "event");
  check(cudaStreamDestroy(stream), "stream");
  const double ms = median(ms_runs);
  nlohmann::json r;
  r["id"] = id;
  r["impl"] = g_options.overrides.cuda_kernel == CudaKernel::tile ? "ariadne" : "ariadne_wgmma";
  r["ms"] = ms;
  r["tflops"] = flops / (ms * 1e-3) / 1e12;
  r["ms_single"] = ms_single;
  r["note"] = "32 layers, each on its own q/k/v; token orders fused into the kernels (no gathers)";
  return r;
}

}  // namespace

int main(int argc_in, char** argv_in) {
  try {
    std::vector<char*> args{argv_in[0]};  // the positional arguments; overrides read into g_options
    for (int i = 1; i < argc_in; ++i) {
      if (std::string(argv_in[i]) == "--backward") g_backward = true;
      else if (!parse_override(argv_in[i])) args.push_back(argv_in[i]);
    }
    const int argc = int(args.size());
    char** argv = args.data();
    const std::string path = argc > 1 ? argv[1] : "bench/cases.json";
    std::ifstream f(path);
    ARIADNE_CHECK(f.good(), path, ": cannot open (pass the path of bench/cases.json)");
    const nlohmann::json cases = nlohmann::json::parse(f);
    ARIADNE_CHECK(cases.is_array(), path, ": expected a JSON list of cases");
    std::mt19937_64 rng(12345);
    nlohmann::json out = nlohmann::json::array();
    for (const auto& jc : cases) {
      const std::string id = jc.value("id", std::string("?"));
      // Filters: id prefixes, given as separate arguments or comma-separated.
      bool wanted = argc <= 2;
      for (int i = 2; i < argc && !wanted; ++i) {
        std::string list = argv[i];
        for (size_t pos = 0; pos <= list.size();) {
          const size_t comma = std::min(list.find(',', pos), list.size());
          const std::string prefix = list.substr(pos, comma - pos);
          if (!prefix.empty() && id.rfind(prefix, 0) == 0) wanted = true;
          pos = comma + 1;
        }
      }
      if (!wanted) continue;
      const bool stack = jc.value("kind", std::string("attention")) == "stack";
      if (stack && g_backward) continue;  // the stacks' backward: not measured yet
      const nlohmann::json r = stack ? run_stack(jc, rng) : run_case(jc, rng);
      std::cerr << r.dump() << "\n";
      out.push_back(r);
    }
    std::cout << out.dump(1) << "\n";
  } catch (const std::exception& e) {
    std::cerr << "bench_attention_cuda: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
