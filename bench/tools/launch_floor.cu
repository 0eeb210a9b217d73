// What a call costs on this GPU before it does any work: empty kernels timed the two ways the
// benchmarks time calls (bench/README.md, "Timing"): single calls (a spinning kernel queued first,
// events around the call alone: how bench/anchors.py times the anchors and bench_attention_cuda's
// `ms_single`) and the per-launch time of graph replays of back-to-back launches (its `ms`).
// Shapes: one warp; and the window kernel's launch (128 CTAs of 512 threads, 221 KB of dynamic
// shared memory, a 1.4 KB __grid_constant__ parameter block like its FwdParams + BandWgMaps).
// Not part of the CMake build (a diagnostic, built where it runs):
//   nvcc -O2 -std=c++17 -arch=sm_90a bench/tools/launch_floor.cu -o /tmp/launch_floor && /tmp/launch_floor
#include <cuda_runtime.h>

#include <cstdio>

#include "call_timing.cuh"

namespace {

using call_timing::check;

struct Big {
  unsigned char bytes[1408];
};

__global__ void empty_small(int* sink) {
  if (sink != nullptr && threadIdx.x == 1000) *sink = 1;  // never true: the kernel has 32 threads
}
__global__ void empty_big(const __grid_constant__ Big p, int* sink) {
  extern __shared__ unsigned char smem[];
  if (threadIdx.x == 0) smem[0] = p.bytes[blockIdx.x % 1408];
  __syncthreads();
  if (sink != nullptr && smem[0] == 255 && threadIdx.x == 4096) *sink = 1;  // never true
}

}  // namespace

int main() {
  constexpr int kSmem = 226304;
  check(cudaFuncSetAttribute(empty_big, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem), "smem opt-in");
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  Big big{};
  const auto small = [&](int = 0) { empty_small<<<1, 32, 0, s>>>(nullptr); };
  const auto wide = [&](int = 0) { empty_big<<<dim3(8, 16), 512, kSmem, s>>>(big, nullptr); };
  for (int i = 0; i < 20; ++i) {
    small();
    wide();
  }
  check(cudaStreamSynchronize(s), "warm-up");
  std::printf("launch floor (us, medians)      single call   graph per launch\n");
  std::printf("empty, 1 warp                   %8.2f      %8.2f\n", call_timing::single_us(s, 200, small),
              call_timing::graph_us(s, 100, 21, small));
  std::printf("empty, window kernel's launch   %8.2f      %8.2f\n", call_timing::single_us(s, 200, wide),
              call_timing::graph_us(s, 100, 21, wide));
  check(cudaGetLastError(), "last");
  return 0;
}
