// The encoder's GEMM choice: OpenBLAS cblas_sgemm against a plain loop on the shapes of the
// Qwen2.5-VL tower (y[n, out] = x[n, in] · W[out, in]ᵀ), fp32, single thread each so the
// comparison is per core. Fresh random inputs per shape; both write every output element, and the
// two results are checked against each other before timing.
#include <cblas.h>

#include <cmath>
#include <random>
#include <vector>

#include <benchmark/benchmark.h>

extern "C" void openblas_set_num_threads(int num_threads);

namespace {

struct Shape {
  const char* name;
  int in, out;
};
// qkv, proj, mlp gate/up, mlp down, merger fc1 of the Qwen2.5-VL tower (hidden 1280, MLP 3420).
constexpr Shape kShapes[] = {{"qkv", 1280, 3840}, {"proj", 1280, 1280}, {"gate", 1280, 3420},
                             {"down", 3420, 1280}, {"merger1", 5120, 5120}};

std::vector<float> random_vec(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

void naive(const float* x, const float* W, float* y, int n, int in, int out) {
  for (int r = 0; r < n; ++r)
    for (int o = 0; o < out; ++o) {
      float s = 0;
      for (int i = 0; i < in; ++i) s += x[size_t(r) * size_t(in) + size_t(i)] * W[size_t(o) * size_t(in) + size_t(i)];
      y[size_t(r) * size_t(out) + size_t(o)] = s;
    }
}

void blas(const float* x, const float* W, float* y, int n, int in, int out) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in, 1.f, x, in, W, in, 0.f, y, out);
}

template <bool kBlas>
void BM_Gemm(benchmark::State& state) {
  openblas_set_num_threads(1);
  const Shape& s = kShapes[state.range(0)];
  const int n = int(state.range(1));
  const auto x = random_vec(size_t(n) * size_t(s.in), 1), W = random_vec(size_t(s.out) * size_t(s.in), 2);
  std::vector<float> y(size_t(n) * size_t(s.out), NAN), check(y.size(), NAN);
  // Both paths agree (relative L2 < 1e-5) before anything is timed.
  naive(x.data(), W.data(), check.data(), n, s.in, s.out);
  blas(x.data(), W.data(), y.data(), n, s.in, s.out);
  double num = 0, den = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    num += (double(y[i]) - check[i]) * (double(y[i]) - check[i]);
    den += double(check[i]) * check[i];
  }
  if (!(std::sqrt(num / den) < 1e-5)) {
    state.SkipWithError("OpenBLAS and the plain loop disagree");
    return;
  }
  for (auto _ : state) {
    if (kBlas) blas(x.data(), W.data(), y.data(), n, s.in, s.out);
    else naive(x.data(), W.data(), y.data(), n, s.in, s.out);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetLabel(s.name);
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * n * s.in * s.out * double(state.iterations()),
                                                 benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}

// 64 rows keep the plain loop's run short on a 2-core machine; the ratio holds for larger n.
BENCHMARK(BM_Gemm<false>)->Name("naive")->ArgsProduct({{0, 1, 2, 3, 4}, {64}})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Gemm<true>)->Name("openblas")->ArgsProduct({{0, 1, 2, 3, 4}, {64, 1024}})->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
