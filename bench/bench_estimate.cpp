// Pattern-estimation time on CPU: RRAttention vs XAttention at strides 8 and 16.
//
// Inputs: the synthetic mix (synthetic.hpp), 4 query heads / 1 KV head, d = 128, θ = 10000,
// B = 128, τ = 0.95. Every iteration runs the whole estimator (operands, scores, selection, CSR)
// on the same q/k; nothing is cached between iterations. Counters: multiply-adds per second of
// the scoring stage (RR: L²d/(2S²) per head, XAttention: L²d/(2S)) and the density of the mask.
// Run with OMP_WAIT_POLICY=passive on shared machines.
//
//   build/bench_estimate --benchmark_filter='N:8192'
#include <benchmark/benchmark.h>

#include <map>
#include <memory>

#include "ariadne/estimate.hpp"
#include "workloads/synthetic.hpp"

namespace {

using namespace ariadne;

const Synthetic& inputs(int64_t n) {
  static std::map<int64_t, std::unique_ptr<Synthetic>> cache;  // inputs only, never results
  auto& s = cache[n];
  if (!s) {
    SyntheticConfig c;
    c.tokens = n;
    c.heads_q = 4;
    c.heads_kv = 1;
    c.dim = 128;
    c.mix = "sink:1,local:1,stripe:1,needle:1";
    s = std::make_unique<Synthetic>(make_synthetic(c));
  }
  return *s;
}

void BM_Estimate(benchmark::State& state) {
  const int64_t n = state.range(0);
  EstimateConfig c;
  c.method = state.range(1) == 0 ? Estimator::rr : Estimator::xattn;
  c.stride = int32_t(state.range(2));
  const Synthetic& s = inputs(n);
  double mac = 0, density = 0, ms_sampling = 0, ms_scoring = 0, ms_selection = 0;
  for (auto _ : state) {
    const EstimateResult r = estimate(s.q.view(), s.k.view(), Pattern::causal(), c);
    benchmark::DoNotOptimize(r.mask.col_idx.data());
    mac = r.stats.mac;
    density = r.stats.density;
    ms_sampling += r.stats.ms_sampling;
    ms_scoring += r.stats.ms_scoring;
    ms_selection += r.stats.ms_selection;
  }
  state.counters["GMAC/s"] = benchmark::Counter(mac * 1e-9 * double(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["density"] = density;
  const double it = double(state.iterations());
  state.counters["ms_sampling"] = ms_sampling / it;
  state.counters["ms_scoring"] = ms_scoring / it;
  state.counters["ms_selection"] = ms_selection / it;
  state.SetLabel(c.method == Estimator::rr ? "rr" : "xattn");
}

void args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"N", "xattn", "S"});
  for (int64_t n : {8192, 16384, 32768})
    for (int64_t s : {8, 16})
      for (int64_t m : {0, 1}) b->Args({n, m, s});
  // Process CPU time (all threads) next to wall time: on a shared machine the CPU time of the
  // work is the steadier figure (run with OMP_WAIT_POLICY=passive so idle workers do not spin).
  b->Unit(benchmark::kMillisecond)->MeasureProcessCPUTime()->UseRealTime();
}

BENCHMARK(BM_Estimate)->Apply(args);

}  // namespace

BENCHMARK_MAIN();
