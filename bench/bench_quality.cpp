// Block-selection quality on the synthetic mix: density, attention-mass recall and block
// precision/recall/F1 against the exact oracle at the same τ, for RR (both sampling offsets, with
// each protection on and off) and XAttention, at strides 8 and 16.
//
// The "time" column is the estimator's wall time; the counters carry the quality figures. The
// oracle (ground truth, an input here) is computed once per (N, τ) and reused across methods.
//
//   build/bench_quality --benchmark_filter='N:16384' --benchmark_format=json
#include <benchmark/benchmark.h>

#include <map>
#include <memory>
#include <tuple>

#include "ariadne/estimate.hpp"
#include "workloads/synthetic.hpp"

namespace {

using namespace ariadne;

const Synthetic& inputs(int64_t n) {
  static std::map<int64_t, std::unique_ptr<Synthetic>> cache;
  auto& s = cache[n];
  if (!s) {
    SyntheticConfig c;
    c.tokens = n;
    c.heads_q = 8;
    c.heads_kv = 2;
    c.dim = 128;
    c.mix = "sink:2,local:2,stripe:2,needle:2";
    s = std::make_unique<Synthetic>(make_synthetic(c));
  }
  return *s;
}

const EstimateResult& oracle(int64_t n, double tau) {
  static std::map<std::pair<int64_t, double>, std::unique_ptr<EstimateResult>> cache;
  auto& o = cache[{n, tau}];
  if (!o) {
    EstimateConfig c;
    c.method = Estimator::oracle;
    c.tau = tau;
    const Synthetic& s = inputs(n);
    o = std::make_unique<EstimateResult>(estimate(s.q.view(), s.k.view(), Pattern::causal(), c));
  }
  return *o;
}

// Variants: 0 RR paper, 1 RR released, 2 XAttention, 3 RR no protection, 4 RR without last row,
// 5 RR without sink, 6 RR without diagonal, 7 XAttention without forced blocks, 8 oracle + RR's
// protections (what the protections cost on a perfect estimate).
const char* kVariant[] = {"rr",          "rr-released", "xattn",       "rr-noprotect", "rr-nolast",
                          "rr-nosink",   "rr-nodiag",   "xattn-noforce", "oracle+protect"};

void BM_Quality(benchmark::State& state) {
  const int64_t n = state.range(0), variant = state.range(1);
  const double tau = double(state.range(2)) / 100.0;
  EstimateConfig c;
  c.stride = int32_t(state.range(3));
  c.tau = tau;
  c.method = variant == 2 || variant == 7 ? Estimator::xattn : variant == 8 ? Estimator::oracle : Estimator::rr;
  if (variant == 1) c.offset = RROffset::released;
  if (variant == 3 || variant == 7) c.protect = Protections{};
  if (variant == 4) c.protect = Protections{false, true, true};
  if (variant == 5) c.protect = Protections{true, false, true};
  if (variant == 6) c.protect = Protections{true, true, false};
  if (variant == 8) c.protect = Protections{true, true, true};
  const Synthetic& s = inputs(n);
  const EstimateResult& truth = oracle(n, tau);
  MaskMetrics m;
  for (auto _ : state) {
    const EstimateResult r = estimate(s.q.view(), s.k.view(), Pattern::causal(), c);
    m = compare_to_oracle(r.mask, truth);
  }
  state.counters["density"] = m.density;
  state.counters["mass_recall"] = m.mass_recall;
  state.counters["precision"] = m.precision;
  state.counters["recall"] = m.recall;
  state.counters["f1"] = m.f1;
  state.counters["oracle_density"] = truth.stats.density;
  state.SetLabel(kVariant[variant]);
}

void args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"N", "variant", "tau", "S"});
  for (int64_t n : {8192, 16384, 32768})
    for (int64_t tau : {90, 95}) {
      for (int64_t s : {8, 16}) {
        b->Args({n, 0, tau, s});
        b->Args({n, 2, tau, s});
      }
      b->Args({n, 1, tau, 8});
      for (int64_t v = 3; v <= 8; ++v) b->Args({n, v, tau, 8});
    }
  b->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1);
}

BENCHMARK(BM_Quality)->Apply(args);

}  // namespace

BENCHMARK_MAIN();
