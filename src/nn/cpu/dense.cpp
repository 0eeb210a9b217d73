// Dense layers on the CPU (src/nn/cpu/dense.hpp).
#include "nn/cpu/dense.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "ariadne/attention.hpp"

// Declared here as well as in OpenBLAS's cblas.h: the generic cblas.h may come from another BLAS.
extern "C" void openblas_set_num_threads(int num_threads);

namespace ariadne::nn {

namespace {
// Element-wise loops below this many values run on one thread: on small inputs the fork/join of a
// parallel region costs more than the loop, much more on a busy machine.
constexpr int64_t kParallelMin = int64_t(1) << 16;
}  // namespace

// OpenBLAS's sgemm: ~23x a plain loop per core on the tower's shapes (bench/bench_vit_gemm.cpp).
// Threading: OpenBLAS is kept single-threaded and the rows are split over OpenMP threads here, so
// the process has one thread pool. With two pools (OpenBLAS's pthreads and OpenMP's, both spinning
// between calls) on this busy 2-core machine, the 4-layer test encodes took 0.1-1 s instead of 2 ms.
void linear(const float* x, int64_t n, int64_t in, const float* W, const float* b, int64_t out, float* y,
            bool accumulate) {
  if (n == 0) return;
  static const bool single = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)single;
  const int64_t work = n * in * out;
  const int threads = int(std::min<int64_t>({int64_t(cpu_threads()), n, std::max<int64_t>(1, work >> 21)}));
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int t = 0; t < threads; ++t) {
    const int64_t r0 = n * t / threads, r1 = n * (t + 1) / threads;
    if (r1 == r0) continue;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(r1 - r0), int(out), int(in), 1.f, x + r0 * in, int(in),
                W, int(in), accumulate ? 1.f : 0.f, y + r0 * out, int(out));
    if (b != nullptr)
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t o = 0; o < out; ++o) y[r * out + o] += b[o];
  }
}

void rmsnorm(const float* x, int64_t n, int64_t d, const float* w, float eps, float* y) {
#pragma omp parallel for schedule(static) if (n * d >= kParallelMin)
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * d;
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += double(xr[i]) * xr[i];
    const float inv = float(1.0 / std::sqrt(float(ss / double(d)) + double(eps)));
    for (int64_t i = 0; i < d; ++i) y[r * d + i] = w[i] * (xr[i] * inv);
  }
}

}  // namespace ariadne::nn
