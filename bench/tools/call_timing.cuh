// The two clocks of bench/README.md ("Timing") for the stand-alone diagnostics in bench/tools
// (launch_floor.cu, copy_floor.cu; built where they run, not by CMake): single calls, each queued
// behind a spinning kernel with events around the call alone, and the per-launch time of graph
// replays of back-to-back calls. `launch(i)` enqueues call i (it may pick a buffer set by i).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace call_timing {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

__global__ void spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

// Cycles of a ~100 µs hold at the device's clock rate: longer than any enqueue of the tools.
inline long long hold_cycles() {
  int dev = 0, khz = 0;
  check(cudaGetDevice(&dev), "device");
  check(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev), "clock rate");
  return 100LL * khz / 1000;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median µs of `reps` single calls.
template <class F>
double single_us(cudaStream_t s, int reps, F&& launch) {
  const long long cycles = hold_cycles();
  std::vector<cudaEvent_t> ev(2 * size_t(reps));
  for (auto& e : ev) check(cudaEventCreate(&e), "event");
  for (int r = 0; r < reps; ++r) {
    spin<<<1, 1, 0, s>>>(cycles);
    check(cudaEventRecord(ev[2 * size_t(r)], s), "record");
    launch(r);
    check(cudaEventRecord(ev[2 * size_t(r) + 1], s), "record");
  }
  check(cudaStreamSynchronize(s), "single calls");
  std::vector<double> t(static_cast<size_t>(reps));
  for (int r = 0; r < reps; ++r) {
    float ms = 0;
    check(cudaEventElapsedTime(&ms, ev[2 * size_t(r)], ev[2 * size_t(r) + 1]), "elapsed");
    t[size_t(r)] = 1e3 * ms;
  }
  for (auto e : ev) cudaEventDestroy(e);
  return median(t);
}

// Median per-launch µs over `replays` replays of one graph of `per` back-to-back calls.
template <class F>
double graph_us(cudaStream_t s, int per, int replays, F&& launch) {
  cudaGraph_t g;
  cudaGraphExec_t x;
  check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "capture");
  for (int i = 0; i < per; ++i) launch(i);
  check(cudaStreamEndCapture(s, &g), "capture end");
  check(cudaGraphInstantiate(&x, g, 0), "instantiate");
  check(cudaGraphLaunch(x, s), "warm-up");
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "event");
  check(cudaEventCreate(&e1), "event");
  std::vector<double> t;
  for (int b = 0; b < replays; ++b) {
    check(cudaEventRecord(e0, s), "record");
    check(cudaGraphLaunch(x, s), "graph");
    check(cudaEventRecord(e1, s), "record");
    check(cudaEventSynchronize(e1), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
    t.push_back(1e3 * ms / per);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaGraphExecDestroy(x);
  cudaGraphDestroy(g);
  return median(t);
}

}  // namespace call_timing
