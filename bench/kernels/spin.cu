// cuda_spin (bench_kernels.hpp): a stream hold for benchmarks' single-call timing.
#include <cuda_runtime.h>

#include "ariadne/error.hpp"
#include "kernels/bench_kernels.hpp"

namespace ariadne {
namespace {

__global__ void spin_kernel(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

}  // namespace

void cuda_spin(void* stream, double microseconds) {
  ARIADNE_CHECK(microseconds >= 0 && microseconds <= 1e6, "cuda_spin: microseconds ", microseconds,
                ", expected 0 to 1e6");
  int device = 0, khz = 0;
  ARIADNE_CHECK(cudaGetDevice(&device) == cudaSuccess, "cuda_spin: no current device");
  ARIADNE_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device) == cudaSuccess && khz > 0,
                "cuda_spin: the device's clock rate is unknown");
  spin_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<long long>(microseconds * 1e-3 * khz));
  const cudaError_t e = cudaGetLastError();
  ARIADNE_CHECK(e == cudaSuccess, "cuda_spin: launch failed: ", cudaGetErrorString(e));
}

}  // namespace ariadne
