// Why the CPU attention multiplies its tiles with its own SIMD kernels and not with a BLAS: the
// tile products of a flash-style forward are small (64 queries × 32 keys × d), and this program
// times them both ways on one core, single-threaded:
//   QK: S[64×32] = Q[64×d] · Kᵀ        PV: O[64×d] += P[64×32] · V[32×d]
// with d = 80 and 128, and, for scale, one large sgemm (what an unfused S = QKᵀ of N = 4096 would
// need, plus an N×N buffer). OpenBLAS is loaded at run time (dlopen of libopenblas.so.0), so the
// library and its tests never depend on it; without it the BLAS rows are skipped.
//
// FLOPs are 2·m·n·k per product; counters are GFLOP/s.
#include <benchmark/benchmark.h>
#include <dlfcn.h>

#include <random>
#include <vector>

#include "attention/cpu/attention_kernels.hpp"

namespace ariadne {
namespace {

// cblas_sgemm(order, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)
using SgemmFn = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float,
                         float*, int);
using SetThreadsFn = void (*)(int);
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

SgemmFn blas_sgemm() {
  static SgemmFn fn = [] {
    void* h = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) return SgemmFn(nullptr);
    if (auto set = reinterpret_cast<SetThreadsFn>(dlsym(h, "openblas_set_num_threads"))) set(1);
    return reinterpret_cast<SgemmFn>(dlsym(h, "cblas_sgemm"));
  }();
  return fn;
}

std::vector<float> random_vec(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

constexpr int kRows = 64, kKeys = cpu::kKeyTile;

void BM_TileQK_Ariadne(benchmark::State& st) {
  const int d = int(st.range(0));
  const auto q = random_vec(size_t(kRows) * d, 1), kt = random_vec(size_t(d) * kKeys, 2);
  std::vector<float> s(size_t(kRows) * kKeys);
  const cpu::TileKernels& k = cpu::active_tile_kernels();
  for (auto _ : st) {
    k.qk_f32(q.data(), d, kt.data(), d, kRows, s.data());
    benchmark::DoNotOptimize(s.data());
  }
  st.counters["GFLOPs"] = benchmark::Counter(2.0 * kRows * kKeys * d * double(st.iterations()) * 1e-9,
                                             benchmark::Counter::kIsRate);
  st.SetLabel(k.name);
}

void BM_TileQK_OpenBlas(benchmark::State& st) {
  const SgemmFn gemm = blas_sgemm();
  if (gemm == nullptr) return st.SkipWithError("libopenblas.so.0 not found");
  const int d = int(st.range(0));
  const auto q = random_vec(size_t(kRows) * d, 1), kr = random_vec(size_t(kKeys) * d, 2);
  std::vector<float> s(size_t(kRows) * kKeys);
  for (auto _ : st) {
    gemm(kRowMajor, kNoTrans, kTrans, kRows, kKeys, d, 1.f, q.data(), d, kr.data(), d, 0.f, s.data(), kKeys);
    benchmark::DoNotOptimize(s.data());
  }
  st.counters["GFLOPs"] = benchmark::Counter(2.0 * kRows * kKeys * d * double(st.iterations()) * 1e-9,
                                             benchmark::Counter::kIsRate);
}

void BM_TilePV_Ariadne(benchmark::State& st) {
  const int d = int(st.range(0));
  const auto p = random_vec(size_t(kRows) * kKeys, 3), v = random_vec(size_t(kKeys) * d, 4);
  std::vector<float> o(size_t(kRows) * d, 0.f), alpha(kRows, 1.f);
  const cpu::TileKernels& k = cpu::active_tile_kernels();
  for (auto _ : st) {
    k.pv_f32(p.data(), v.data(), d, d, kRows, alpha.data(), o.data());
    benchmark::DoNotOptimize(o.data());
  }
  st.counters["GFLOPs"] = benchmark::Counter(2.0 * kRows * kKeys * d * double(st.iterations()) * 1e-9,
                                             benchmark::Counter::kIsRate);
  st.SetLabel(k.name);
}

void BM_TilePV_OpenBlas(benchmark::State& st) {
  const SgemmFn gemm = blas_sgemm();
  if (gemm == nullptr) return st.SkipWithError("libopenblas.so.0 not found");
  const int d = int(st.range(0));
  const auto p = random_vec(size_t(kRows) * kKeys, 3), v = random_vec(size_t(kKeys) * d, 4);
  std::vector<float> o(size_t(kRows) * d, 0.f);
  for (auto _ : st) {
    gemm(kRowMajor, kNoTrans, kNoTrans, kRows, d, kKeys, 1.f, p.data(), kKeys, v.data(), d, 1.f, o.data(), d);
    benchmark::DoNotOptimize(o.data());
  }
  st.counters["GFLOPs"] = benchmark::Counter(2.0 * kRows * kKeys * d * double(st.iterations()) * 1e-9,
                                             benchmark::Counter::kIsRate);
}

// One large product for scale: S[N×N] = Q[N×d]·Kᵀ, the unfused way.
void BM_LargeQK_OpenBlas(benchmark::State& st) {
  const SgemmFn gemm = blas_sgemm();
  if (gemm == nullptr) return st.SkipWithError("libopenblas.so.0 not found");
  const int n = 4096, d = int(st.range(0));
  const auto q = random_vec(size_t(n) * d, 5), k = random_vec(size_t(n) * d, 6);
  std::vector<float> s(size_t(n) * n);
  for (auto _ : st) {
    gemm(kRowMajor, kNoTrans, kTrans, n, n, d, 1.f, q.data(), d, k.data(), d, 0.f, s.data(), n);
    benchmark::DoNotOptimize(s.data());
  }
  st.counters["GFLOPs"] = benchmark::Counter(2.0 * n * n * double(d) * double(st.iterations()) * 1e-9,
                                             benchmark::Counter::kIsRate);
}

BENCHMARK(BM_TileQK_Ariadne)->Arg(80)->Arg(128);
BENCHMARK(BM_TileQK_OpenBlas)->Arg(80)->Arg(128);
BENCHMARK(BM_TilePV_Ariadne)->Arg(80)->Arg(128);
BENCHMARK(BM_TilePV_OpenBlas)->Arg(80)->Arg(128);
BENCHMARK(BM_LargeQK_OpenBlas)->Arg(128)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace ariadne

BENCHMARK_MAIN();
