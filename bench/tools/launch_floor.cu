// What a call costs on this GPU before it does any work: empty kernels timed the two ways the
// benchmarks time calls (bench/README.md, "Timing"): single calls (a spinning kernel queued first,
// events around the call alone: how bench/anchors.py times the anchors and bench_attention_cuda's
// `ms_single`) and the per-launch time of graph replays of back-to-back launches (its `ms`).
// Shapes: one warp; and the window kernel's launch (128 CTAs of 512 threads, 221 KB of dynamic
// shared memory, a 1.4 KB __grid_constant__ parameter block like its FwdParams + BandWgMaps).
// Not part of the CMake build (a diagnostic, built where it runs):
//   nvcc -O2 -std=c++17 -arch=sm_90a bench/tools/launch_floor.cu -o /tmp/launch_floor && /tmp/launch_floor
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "launch_floor: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

struct Big {
  unsigned char bytes[1408];
};

__global__ void spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}
__global__ void empty_small(int* sink) {
  if (sink != nullptr && threadIdx.x == 1000) *sink = 1;  // never true: the kernel has 32 threads
}
__global__ void empty_big(const __grid_constant__ Big p, int* sink) {
  extern __shared__ unsigned char smem[];
  if (threadIdx.x == 0) smem[0] = p.bytes[blockIdx.x % 1408];
  __syncthreads();
  if (sink != nullptr && smem[0] == 255 && threadIdx.x == 4096) *sink = 1;  // never true
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class F>
double single_us(cudaStream_t s, long long spin_cycles, F&& launch) {
  constexpr int reps = 200;
  std::vector<cudaEvent_t> ev(2 * reps);
  for (auto& e : ev) check(cudaEventCreate(&e), "event");
  for (int r = 0; r < reps; ++r) {
    spin<<<1, 1, 0, s>>>(spin_cycles);
    check(cudaEventRecord(ev[2 * r], s), "record");
    launch();
    check(cudaEventRecord(ev[2 * r + 1], s), "record");
  }
  check(cudaStreamSynchronize(s), "single");
  std::vector<double> t(reps);
  for (int r = 0; r < reps; ++r) {
    float ms = 0;
    check(cudaEventElapsedTime(&ms, ev[2 * r], ev[2 * r + 1]), "elapsed");
    t[r] = 1e3 * ms;
  }
  for (auto e : ev) cudaEventDestroy(e);
  return median(t);
}

template <class F>
double graph_us(cudaStream_t s, F&& launch) {
  constexpr int per = 100;
  cudaGraph_t g;
  cudaGraphExec_t x;
  check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "capture");
  for (int i = 0; i < per; ++i) launch();
  check(cudaStreamEndCapture(s, &g), "capture end");
  check(cudaGraphInstantiate(&x, g, 0), "instantiate");
  check(cudaGraphLaunch(x, s), "warm-up");
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "event");
  check(cudaEventCreate(&e1), "event");
  std::vector<double> t;
  for (int b = 0; b < 21; ++b) {
    check(cudaEventRecord(e0, s), "record");
    check(cudaGraphLaunch(x, s), "graph");
    check(cudaEventRecord(e1, s), "record");
    check(cudaEventSynchronize(e1), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
    t.push_back(1e3 * ms / per);
  }
  cudaGraphExecDestroy(x);
  cudaGraphDestroy(g);
  return median(t);
}

}  // namespace

int main() {
  int dev = 0, khz = 0;
  check(cudaGetDevice(&dev), "device");
  check(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev), "clock");
  const long long spin_cycles = 100LL * khz / 1000;  // ~100 us: longer than any enqueue below
  constexpr int kSmem = 226304;
  check(cudaFuncSetAttribute(empty_big, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem), "smem opt-in");
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  Big big{};
  const auto small = [&] { empty_small<<<1, 32, 0, s>>>(nullptr); };
  const auto wide = [&] { empty_big<<<dim3(8, 16), 512, kSmem, s>>>(big, nullptr); };
  for (int i = 0; i < 20; ++i) {
    small();
    wide();
  }
  check(cudaStreamSynchronize(s), "warm-up");
  std::printf("launch floor (us, medians)      single call   graph per launch\n");
  std::printf("empty, 1 warp                   %8.2f      %8.2f\n", single_us(s, spin_cycles, small), graph_us(s, small));
  std::printf("empty, window kernel's launch   %8.2f      %8.2f\n", single_us(s, spin_cycles, wide), graph_us(s, wide));
  check(cudaGetLastError(), "last");
  return 0;
}
