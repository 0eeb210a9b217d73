// The memory floor of an attention call: a kernel that does only the traffic every attention
// kernel must do (read Q, K and V once, write O once; no halo, no products), timed the two ways the
// benchmarks time calls (bench/README.md, "Timing"; the same clocks as launch_floor.cu): single calls
// (a spinning kernel queued first, events around the call alone) and the per-launch time of graph
// replays of back-to-back launches. Inputs rotate over enough buffer sets that every call reads
// from HBM, not from the L2 (at least 256 MB, as the benchmarks' rotation).
// The kernel: o = q ^ k ^ v over 16-byte words (every input word is needed), a grid-stride loop
// with UNROLL independent words a thread per iteration; the table shows the fastest of several
// grid sizes and unrolls per cell (so the floor is the best plain streaming kernel found, not one
// guessed configuration), then each configuration's time.
// Shapes: the ViT cells of bench/cases.json (H 16, d 80, bf16): N 1024 / 4096 / 16384, batch 1 and 8.
// Not part of the CMake build (a diagnostic, built where it runs):
//   nvcc -O2 -std=c++17 -arch=sm_90a bench/tools/copy_floor.cu -o /tmp/copy_floor && /tmp/copy_floor
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "call_timing.cuh"

namespace {

using call_timing::check;

template <int UNROLL>
__global__ void __launch_bounds__(512) qkv_to_o(const uint4* __restrict__ q, const uint4* __restrict__ k,
                                                const uint4* __restrict__ v, uint4* __restrict__ o, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t base = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; base < n; base += stride * UNROLL) {
    uint4 a[UNROLL], b[UNROLL], c[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int64_t i = base + u * stride;
      if (i < n) {
        a[u] = __ldcs(q + i);
        b[u] = __ldcs(k + i);
        c[u] = __ldcs(v + i);
      }
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int64_t i = base + u * stride;
      if (i < n) __stcs(o + i, make_uint4(a[u].x ^ b[u].x ^ c[u].x, a[u].y ^ b[u].y ^ c[u].y,
                                          a[u].z ^ b[u].z ^ c[u].z, a[u].w ^ b[u].w ^ c[u].w));
    }
  }
}

struct Config {
  int blocks_per_sm;  // 0: one thread per 16-byte word (no grid-stride loop)
  int unroll;
};

}  // namespace

int main() {
  int dev = 0, sms = 0;
  check(cudaGetDevice(&dev), "device");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "SMs");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, dev), "properties");
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  std::printf("%s, %d SMs, L2 %d MB; q, k, v read once and o written once (bf16, H 16, d 80)\n", prop.name, sms,
              prop.l2CacheSize >> 20);

  constexpr int64_t kRotateBytes = int64_t(256) << 20;
  const Config configs[] = {{1, 4}, {2, 4}, {4, 2}, {4, 4}, {8, 1}, {8, 2}, {16, 1}, {0, 1}};
  struct Cell {
    int batch, tokens;
  };
  const Cell cells[] = {{1, 1024}, {1, 4096}, {1, 16384}, {8, 1024}, {8, 4096}, {8, 16384}};
  std::printf("%-14s %9s %10s %10s %9s %9s   per configuration (blocks/SM x unroll: single / graph us)\n", "cell",
              "traffic", "single us", "graph us", "TB/s 1", "TB/s g");
  for (const Cell& c : cells) {
    const int64_t elems = int64_t(c.batch) * c.tokens * 16 * 80;
    const int64_t bytes = elems * 2, words = bytes / 16;
    const int sets = int(std::max<int64_t>(2, (kRotateBytes + 4 * bytes - 1) / (4 * bytes)));
    std::vector<uint4*> buf(4 * size_t(sets));
    for (auto& b : buf) {
      check(cudaMalloc(&b, bytes), "malloc");
      check(cudaMemset(b, 0x5a, bytes), "memset");
    }
    double best_single = 1e30, best_graph = 1e30;
    char detail[512];
    int len = 0;
    for (const Config& cfg : configs) {
      const int threads = 512;
      const int64_t grid = cfg.blocks_per_sm == 0 ? (words + threads - 1) / threads : int64_t(cfg.blocks_per_sm) * sms;
      const auto launch = [&](int r) {
        const size_t set = size_t(r % sets) * 4;
        const uint4 *q = buf[set], *k = buf[set + 1], *v = buf[set + 2];
        uint4* o = buf[set + 3];
        switch (cfg.unroll) {
          case 1: qkv_to_o<1><<<unsigned(grid), threads, 0, s>>>(q, k, v, o, words); break;
          case 2: qkv_to_o<2><<<unsigned(grid), threads, 0, s>>>(q, k, v, o, words); break;
          default: qkv_to_o<4><<<unsigned(grid), threads, 0, s>>>(q, k, v, o, words); break;
        }
      };
      for (int i = 0; i < 2 * sets; ++i) launch(i);
      check(cudaStreamSynchronize(s), "warm-up");
      const double t1 = call_timing::single_us(s, 120, launch);
      const double tg = call_timing::graph_us(s, std::max(sets, 40), 15, launch);
      best_single = std::min(best_single, t1);
      best_graph = std::min(best_graph, tg);
      len += std::snprintf(detail + len, sizeof(detail) - size_t(len), " %s%dx%d %.2f/%.2f",
                           cfg.blocks_per_sm == 0 ? "word/thread" : "", cfg.blocks_per_sm, cfg.unroll, t1, tg);
    }
    check(cudaGetLastError(), "last");
    const double traffic = 4.0 * double(bytes);
    char name[32];
    std::snprintf(name, sizeof(name), "b%d N%d", c.batch, c.tokens);
    std::printf("%-14s %7.1fMB %10.2f %10.2f %9.2f %9.2f  %s\n", name, traffic / 1e6, best_single, best_graph,
                traffic / best_single / 1e6, traffic / best_graph / 1e6, detail);
    for (auto b : buf) cudaFree(b);
  }
  return 0;
}
