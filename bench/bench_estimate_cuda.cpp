// CUDA block-sparse prefill benchmark: RRAttention vs XAttention estimation at strides 8 and 16 and
// FlexPrefill at its released defaults, the block-sparse attention on each mask, and the total against our dense causal
// kernel, all in the same run on the same inputs. Prints one JSON list on stdout (one object per
// (tokens, method, stride); progress on stderr).
//
// Inputs: the synthetic long-context mix (synthetic.hpp; Llama-3.1-8B shape: 32 query / 8 KV
// heads, d 128, θ 500000), bf16 on the device, B 128, τ 0.95. q is 64 MB at 8K tokens and 1 GB at
// 128K, beyond the 60 MB L2 except at the shortest length, where some of k stays cached between
// repetitions. Times:
//   ms_estimate       median host wall time of the estimate() call over 7 calls at >= 64K tokens,
//                     9 below, after two warm-up calls (host geometry, the result's
//                     allocations, the kernels, the final synchronization; host_copy off, so the
//                     mask stays on the device as in a real prefill), with the estimator's cached
//                     workspace warm; ms_estimate_first: the first call of the case (which grows
//                     the workspace unless an earlier, larger call already did)
//   ms_sampling/scoring/selection  medians of the estimator's CUDA-event stage times
//   ms_stage_sum      median of sampling + scoring + selection (the kernels, from the first stage
//                     event to the last); ms_host_overhead = median of (wall − stage sum) per call;
//                     of it ms_host_setup (before the first kernel is enqueued) and ms_host_finish
//                     (after the final synchronization), EstimateStats' fields
//   ms_result_free    median time to free the previous call's result (its device arrays), which
//                     ms_estimate does not include
//   ms_attention      median of the block-sparse attention on that mask (CUDA events), default
//                     routing: the wgmma kernel for B 128 on the H200 (attention_kernel says which)
//   ms_attention_mma_sync  the same mask on the mma.sync tile kernel (forced through the plan's overrides)
//   ms_dense          median of dense causal attention (default routing: wgmma; same inputs)
//   ms_total          ms_estimate + ms_attention; speedup = ms_dense / ms_total
//   ms_estimate_pooled, ms_host_overhead_pooled, ms_result_free_pooled, ms_total_pooled: the same
//                     with EstimateConfig::cuda_pooled_result (the result's arrays from the
//                     library's stream-ordered pool, as the LLM path runs it)
// density: kept / causally visible blocks. mass_recall, block_f1: against the exact oracle (the
// CUDA oracle on the same bf16 inputs, up to --recall-max tokens, default 65536), also at τ 0.90;
// ms_oracle: its time (an exact N² pass on the CUDA cores).
// The cuDNN and FlashAttention-2 anchors (PyTorch SDPA, dense causal on the same shapes) are
// measured in the same device-check step by bench/anchors.py and joined there (speedup columns).
//
//   bench_estimate_cuda [tokens ...] [--recall-max N] [--methods rr,xattn,flexprefill] [--xattn-max N] [--strides 8,16]
//                       [--mix M] [--scoring automatic,wgmma_approximate,wgmma_exact,mma_grouped,mma_rr,mma_generic,f32]
//   default tokens 8192 32768 65536 131072; --xattn-max: XAttention only up to N tokens (its
//   estimate takes seconds at 128K); --mix: the synthetic head mix (default SyntheticConfig's);
//   --scoring: the scoring kernels to time, by their CudaScoring names (EstimateConfig::overrides;
//   default automatic, the library's choice). A kernel that cannot run a case (say mma_rr for
//   XAttention) leaves that case to the library's choice; the "scoring" field of every row names the
//   kernel that ran. The first gives the case's row (attention, recall); each further one adds a row
//   "<id>-<kernel>" with its estimate times and its largest score difference and count of rows
//   whose block list differs from the first's (vs_<first>_max_score_diff, vs_<first>_rows_differ)

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ariadne/attention.hpp"
#include "ariadne/device.hpp"
#include "ariadne/estimate.hpp"
#include "workloads/synthetic.hpp"

namespace {

using namespace ariadne;

void check(cudaError_t e, const char* what) {
  ARIADNE_CHECK(e == cudaSuccess, "bench: ", what, ": ", cudaGetErrorString(e));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

DeviceBuffer to_device_bf16(const Buffer& f) {
  Buffer b(DType::bf16, f.shape());
  const float* src = f.as<float>();
  uint16_t* dst = b.as<uint16_t>();
  for (int64_t i = 0; i < f.numel(); ++i) dst[i] = float_to_bf16(src[i]);
  return DeviceBuffer::from_host(b);
}

// Median device time of `reps` attention calls (after one warm-up), CUDA events on stream 0.
// Median time of `reps` runs of one plan (made once, outside the timing) on the legacy stream;
// `kernel` forces a kernel family through the plan's overrides (automatic: the library's route).
double time_attention(const AttentionParams& p, int reps, CudaKernel kernel = CudaKernel::automatic,
                      CudaKernel* ran = nullptr) {
  AttentionOptions opts;
  opts.backend = Backend::cuda;
  opts.overrides.cuda_kernel = kernel;
  const AttentionPlan plan = plan_attention(p, opts);
  if (ran != nullptr) *ran = plan.cuda_kernel();
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "event");
  check(cudaEventCreate(&e1), "event");
  run(plan, p);
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    check(cudaEventRecord(e0, nullptr), "record");
    run(plan, p);
    check(cudaEventRecord(e1, nullptr), "record");
    check(cudaEventSynchronize(e1), "sync");
    float t = 0;
    check(cudaEventElapsedTime(&t, e0, e1), "elapsed");
    ms.push_back(double(t));
  }
  check(cudaEventDestroy(e0), "event");
  check(cudaEventDestroy(e1), "event");
  return median(ms);
}

// Comma-separated integers ("8,16").
std::vector<int> int_list(const std::string& s) {
  std::vector<int> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t comma = std::min(s.find(',', pos), s.size());
    out.push_back(std::atoi(s.substr(pos, comma - pos).c_str()));
    pos = comma + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::vector<int64_t> lengths;
    int64_t recall_max = 65536, xattn_max = int64_t(1) << 40;
    std::vector<Estimator> methods = {Estimator::rr, Estimator::xattn, Estimator::flexprefill};
    std::vector<int> strides = {8, 16};
    std::string mix = SyntheticConfig{}.mix;
    std::vector<std::string> scorings = {"automatic"};
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--recall-max" && i + 1 < argc) recall_max = std::atoll(argv[++i]);
      else if (a == "--xattn-max" && i + 1 < argc) xattn_max = std::atoll(argv[++i]);
      else if (a == "--strides" && i + 1 < argc) strides = int_list(argv[++i]);
      else if (a == "--mix" && i + 1 < argc) mix = argv[++i];
      else if (a == "--scoring" && i + 1 < argc) {
        const std::string m = argv[++i];
        scorings.clear();
        size_t pos = 0;
        while (pos <= m.size()) {
          const size_t comma = std::min(m.find(',', pos), m.size());
          scorings.push_back(m.substr(pos, comma - pos));
          parse_cuda_scoring(scorings.back());  // throws naming the kernels when unknown
          pos = comma + 1;
        }
      }
      else if (a == "--methods" && i + 1 < argc) {
        const std::string m = argv[++i];
        methods.clear();
        size_t pos = 0;
        while (pos <= m.size()) {
          const size_t comma = std::min(m.find(',', pos), m.size());
          const Estimator e = parse_estimator(m.substr(pos, comma - pos));  // throws naming the methods
          ARIADNE_CHECK(e != Estimator::oracle, "bench_estimate_cuda: --methods: the oracle is the recall reference");
          methods.push_back(e);
          pos = comma + 1;
        }
      } else lengths.push_back(std::atoll(a.c_str()));
    }
    if (lengths.empty()) lengths = {8192, 32768, 65536, 131072};
    ARIADNE_CHECK(cuda_available(), "bench_estimate_cuda: no CUDA device");
    constexpr int kHq = 32, kHkv = 8, kDim = 128;
    nlohmann::json out = nlohmann::json::array();
    for (const int64_t n : lengths) {
      const auto tg = std::chrono::steady_clock::now();
      SyntheticConfig sc;
      sc.tokens = n;
      sc.heads_q = kHq;
      sc.heads_kv = kHkv;
      sc.dim = kDim;
      sc.rope_theta = 500000;
      sc.seed = 7;
      sc.mix = mix;
      const Synthetic syn = make_synthetic(sc);
      const DeviceBuffer q = to_device_bf16(syn.q), k = to_device_bf16(syn.k), v = to_device_bf16(syn.v);
      DeviceBuffer o(DType::bf16, {n, kHq, kDim});
      std::cerr << "n " << n << ": inputs ready in "
                << std::chrono::duration<double>(std::chrono::steady_clock::now() - tg).count() << " s\n";

      AttentionParams p;
      p.q = q.view();
      p.k = k.view();
      p.v = v.view();
      p.out = o.view();
      p.pattern = Pattern::causal();
      const double ms_dense = time_attention(p, 5);

      std::vector<EstimateResult> oracles;  // τ 0.95, 0.90
      double ms_oracle = 0;
      if (n <= recall_max)
        for (double tau : {0.95, 0.90}) {
          EstimateConfig oc;
          oc.method = Estimator::oracle;
          oc.tau = tau;
          oracles.push_back(estimate(q.view(), k.view(), Pattern::causal(), oc, Backend::cuda));
          ms_oracle = oracles.back().stats.ms_scoring + oracles.back().stats.ms_selection;
        }

      for (Estimator method : methods)
        for (int stride : strides) {
          if (method == Estimator::xattn && n > xattn_max) continue;
          // FlexPrefill has no stride: one row per length, at its released defaults (γ 0.95,
          // τ_js 0.1, min budget 1024 tokens: EstimateConfig's).
          const bool flex = method == Estimator::flexprefill;
          if (flex && stride != strides.front()) continue;
          EstimateConfig c;
          c.method = method;
          c.stride = stride;
          c.tau = 0.95;
          c.host_copy = false;
          // Timings of one scoring kernel (the first of --scoring; the others follow the case).
          struct Timed {
            EstimateConfig cfg;  // as run: the override dropped where its kernel cannot run the case
            EstimateResult r;
            double first = 0;
            std::vector<double> wall, samp, score, sel, stages, overhead, frees, setup, finish;
          };
          const auto time_estimate = [&](EstimateConfig cfg) {
            const auto ms_since = [](std::chrono::steady_clock::time_point t) {
              return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
            };
            Timed t;
            const auto tw = std::chrono::steady_clock::now();
            try {
              t.r = estimate(q.view(), k.view(), Pattern::causal(), cfg, Backend::cuda);  // warm-up
            } catch (const Error&) {
              if (cfg.overrides.scoring == CudaScoring::automatic) throw;
              cfg.overrides.scoring = CudaScoring::automatic;  // the forced kernel cannot run this case
              t.r = estimate(q.view(), k.view(), Pattern::causal(), cfg, Backend::cuda);
            }
            t.first = ms_since(tw);
            t.cfg = cfg;
            // A second warm-up, and medians of 7 / 9 calls: with one warm-up and medians of 3 the
            // kernel timed first in a call read 0.4-1 ms slower at 128K than the same kernel timed
            // later.
            t.r = estimate(q.view(), k.view(), Pattern::causal(), cfg, Backend::cuda);
            const int reps = n >= 65536 ? 7 : 9;
            for (int i = 0; i < reps; ++i) {
              const auto t0 = std::chrono::steady_clock::now();
              EstimateResult next = estimate(q.view(), k.view(), Pattern::causal(), cfg, Backend::cuda);
              const double w = ms_since(t0);
              const auto tf = std::chrono::steady_clock::now();
              t.r = std::move(next);  // frees the previous result's device arrays
              t.frees.push_back(ms_since(tf));
              const double stage = t.r.stats.ms_sampling + t.r.stats.ms_scoring + t.r.stats.ms_selection;
              t.wall.push_back(w);
              t.samp.push_back(t.r.stats.ms_sampling);
              t.score.push_back(t.r.stats.ms_scoring);
              t.sel.push_back(t.r.stats.ms_selection);
              t.stages.push_back(stage);
              t.overhead.push_back(w - stage);
              t.setup.push_back(t.r.stats.ms_host_setup);
              t.finish.push_back(t.r.stats.ms_host_finish);
            }
            return t;
          };
          c.overrides.scoring = parse_cuda_scoring(scorings[0]);
          Timed main_t = time_estimate(c);
          c = main_t.cfg;
          // The same estimate with the result's five arrays from the library's stream-ordered pool
          // (EstimateConfig::cuda_pooled_result, as the LLM path runs it): no cudaMalloc of ~2 x 4
          // bytes per visible block per call, and a cudaFreeAsync instead of cudaFree.
          EstimateConfig c_pool = c;
          c_pool.cuda_pooled_result = true;
          const Timed pooled_t = time_estimate(c_pool);
          const EstimateResult& r = main_t.r;
          const std::vector<double>& wall = main_t.wall;
          AttentionParams ps = p;
          ps.pattern = Pattern::causal().with_blocks(r.device.view());
          ps.blocks_nnz = r.stats.kept_blocks;
          CudaKernel attn_kernel = CudaKernel::automatic;
          const double ms_attn = time_attention(ps, 5, CudaKernel::automatic, &attn_kernel);
          // The same mask on the mma.sync tile kernel, forced through the plan's overrides.
          const double ms_attn_mma = time_attention(ps, 3, CudaKernel::tile);

          nlohmann::json j;
          j["id"] = std::string(estimator_name(method)) + "-n" + std::to_string(n) +
                    (flex ? std::string() : "-s" + std::to_string(stride));
          j["kind"] = "estimate";
          j["method"] = estimator_name(method);
          j["tokens"] = n;
          j["heads_q"] = kHq;
          j["heads_kv"] = kHkv;
          j["dim"] = kDim;
          j["block"] = c.block;
          if (!flex) j["stride"] = stride;
          j["tau"] = c.tau;
          const auto put_times = [&](nlohmann::json& o, const Timed& t) {
            o["ms_estimate"] = median(t.wall);
            o["ms_sampling"] = median(t.samp);
            o["ms_scoring"] = median(t.score);
            o["ms_selection"] = median(t.sel);
            o["ms_stage_sum"] = median(t.stages);
            o["ms_host_overhead"] = median(t.overhead);
            o["ms_host_setup"] = median(t.setup);
            o["ms_host_finish"] = median(t.finish);
            o["ms_estimate_first"] = t.first;
            o["ms_result_free"] = median(t.frees);
            o["scoring"] = cuda_scoring_name(t.r.stats.scoring);  // the kernel that ran
          };
          put_times(j, main_t);
          j["ms_attention"] = ms_attn;
          j["attention_kernel"] = attn_kernel == CudaKernel::wgmma ? "wgmma" : "mma.sync";
          j["ms_attention_mma_sync"] = ms_attn_mma;
          j["mix"] = mix;
          j["seed"] = sc.seed;  // the synthetic draw: block F1 moves with it (docs/rrattention.md, τ sweep)
          j["ms_dense"] = ms_dense;
          j["ms_total"] = median(wall) + ms_attn;
          j["speedup_vs_dense"] = ms_dense / (median(wall) + ms_attn);
          j["ms_estimate_pooled"] = median(pooled_t.wall);
          j["ms_host_overhead_pooled"] = median(pooled_t.overhead);
          j["ms_host_setup_pooled"] = median(pooled_t.setup);
          j["ms_host_finish_pooled"] = median(pooled_t.finish);
          j["ms_result_free_pooled"] = median(pooled_t.frees);
          j["ms_total_pooled"] = median(pooled_t.wall) + ms_attn;
          j["density"] = r.stats.density;
          j["gmac_scoring"] = r.stats.mac * 1e-9;
          if (!oracles.empty()) {
            for (size_t t = 0; t < oracles.size(); ++t) {
              EstimateConfig hc = c;
              hc.host_copy = true;
              hc.tau = t == 0 ? 0.95 : 0.90;
              const EstimateResult rh = estimate(q.view(), k.view(), Pattern::causal(), hc, Backend::cuda);
              const MaskMetrics mm = compare_to_oracle(rh.mask, oracles[t]);
              const std::string sfx = t == 0 ? "" : "_tau090";
              j["ms_oracle"] = ms_oracle;
              j["mass_recall" + sfx] = mm.mass_recall;
              j["block_f1" + sfx] = mm.f1;
              j["oracle_density" + sfx] = oracles[t].stats.density;
              if (t == 1) j["density_tau090"] = rh.stats.density;
            }
          } else {
            EstimateConfig hc = c;
            hc.tau = 0.90;
            j["density_tau090"] = estimate(q.view(), k.view(), Pattern::causal(), hc, Backend::cuda).stats.density;
          }
          std::cerr << j.dump() << "\n";
          out.push_back(j);

          // The other scoring kernels on the same case: their times, and how far their scores and
          // masks are from the first kernel's (host copies of both, τ 0.95).
          for (size_t v = 1; v < scorings.size() && !flex; ++v) {
            EstimateConfig cv = c;
            cv.overrides.scoring = parse_cuda_scoring(scorings[v]);
            EstimateConfig ha = c;
            ha.host_copy = true;
            const EstimateResult a = estimate(q.view(), k.view(), Pattern::causal(), ha, Backend::cuda);
            const Timed tv = time_estimate(cv);
            nlohmann::json jv;
            jv["id"] = j["id"].get<std::string>() + "-" + scorings[v];
            jv["kind"] = "estimate-scoring";
            jv["method"] = j["method"];
            jv["tokens"] = n;
            jv["stride"] = stride;
            put_times(jv, tv);
            jv["density"] = tv.r.stats.density;
            EstimateConfig hb = tv.cfg;
            hb.host_copy = true;
            const EstimateResult b = estimate(q.view(), k.view(), Pattern::causal(), hb, Backend::cuda);
            double worst = 0;
            for (size_t i = 0; i < a.scores.size(); ++i)
              worst = std::max(worst, double(std::abs(a.scores[i] - b.scores[i])));
            int64_t rows_differ = 0;
            for (int64_t row = 0; row < a.rows(); ++row) {
              const auto b0 = size_t(a.mask.row_ptr[size_t(row)]), b1 = size_t(a.mask.row_ptr[size_t(row) + 1]);
              const auto c0 = size_t(b.mask.row_ptr[size_t(row)]), c1 = size_t(b.mask.row_ptr[size_t(row) + 1]);
              rows_differ += !std::equal(a.mask.col_idx.begin() + long(b0), a.mask.col_idx.begin() + long(b1),
                                         b.mask.col_idx.begin() + long(c0), b.mask.col_idx.begin() + long(c1));
            }
            jv["vs_" + scorings[0] + "_max_score_diff"] = worst;
            jv["vs_" + scorings[0] + "_rows_differ"] = rows_differ;
            jv["rows"] = a.rows();
            std::cerr << jv.dump() << "\n";
            out.push_back(jv);
          }
        }
    }
    std::cout << out.dump(1) << "\n";
  } catch (const std::exception& e) {
    std::cerr << "bench_estimate_cuda: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
