// Decode over the device cache (include/ariadne/decode.hpp): one query per sequence against its
// paged keys and values, split-K over the row's pages with a log-sum-exp merge.
//
// Work: a row is (sequence b, KV head g); its pages are the visible ones (dense) or the ones a
// selection keeps. A page is read in tiles of up to 32 rows (64 at d 128), and the tiles of a row
// are cut into `splits` contiguous ranges, one CTA each (choose_splits: whole waves of resident
// CTAs, at most two), so that a batch-1 long context still fills the GPU.
// A CTA serves up to MAXG query heads of g's group (GQA): every K and V tile is read once from
// global memory for all of them, which is where decode's bytes go.
// Pipeline: one thread hands whole K and V tiles (contiguous in the pool) to the bulk copy engine,
// kStages deep (3, or 2 at d 128), each stage completing on its mbarrier; the other threads only wait and compute, so
// kStages − 1 tiles stay in flight per CTA at no instruction cost. Rows outside the query's view
// (past the length, before the window, past the page's end) hold whatever the stage held before:
// their scores are −inf and their values are read as zeros, so no stale NaN can spread.
// Compute: a half-warp owns a key row at a time, each lane D/16 of its dimensions; the 16 partial
// dot products meet in 4 shuffles. Every half-warp keeps its own online softmax (m, l, acc) per
// head over the kRows rows of each tile it owns; the CTA merges its 8 half-warps at the end, and a
// second kernel merges the splits (skipped when one split covers the row).
// Scores are kept in log2 units (scale · log2 e folded into q), as the attention kernels do.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "ariadne/decode.hpp"
#include "ariadne/device.hpp"
#include "ariadne/error.hpp"
#include "decode/internal.hpp"
#include "device/cuda/mma.cuh"
#include "device/cuda/wgmma.cuh"

namespace ariadne::decode_detail {

namespace {

constexpr int kThreads = 128;  // 4 warps, 8 half-warps
constexpr int kHalfWarps = kThreads / 16;
// Rows per stage and stages, by head dim: at d 128 64-row tiles in two stages measured fastest on
// the H100 (against 32 × 2 and 32 × 3 with the same copies: docs/design/decode.md); the other head
// dims keep 32 × 3.
template <int D>
constexpr int kTileOf = D == 128 ? 64 : 32;
template <int D>
constexpr int kStagesOf = D == 128 ? 2 : 3;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct Args {
  const void* q;
  int64_t q_sb, q_sh;
  void* out;
  int out_dtype;  // 0 f32, 1 bf16, 2 f16: the output is rounded once, where it is written
  int64_t o_sb, o_sh;
  float* lse;  // [B, Hq] contiguous, or null
  const void* k;
  const void* v;
  const int32_t* table;
  int max_pages;
  const int32_t* lengths;
  const int32_t* seqs;     // [B]
  const int32_t* row_ptr;  // selection CSR over rows b · Hkv + g, or null (dense)
  const int32_t* pages;
  const float* sink;
  int sink_mode;  // 0 none, 1 denominator, 2 key0 bias
  long long window;
  float scale_log2;
  int B, Hq, Hkv, group, P, tile, tiles_per_page, splits, head_chunks;
  float* part_o;   // [B · Hq, splits, D]
  float* part_ml;  // [B · Hq, splits, 2]: m (log2 units), l
  cudaStream_t stream;
};

template <class T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <>
__device__ __forceinline__ float to_float(__half x) {
  return __half2float(x);
}

// E consecutive 16-bit elements from shared or global memory, with the widest loads their
// alignment allows (E · 2 bytes: 16 for d 128, 8 for d 64, 12 for d 96, 10 for d 80).
template <int E, class T>
__device__ __forceinline__ void load_row(const T* p, float (&x)[E]) {
  if constexpr (E % 8 == 0) {
#pragma unroll
    for (int c = 0; c < E / 8; ++c) {
      const uint4 w = reinterpret_cast<const uint4*>(p)[c];
      const T* h = reinterpret_cast<const T*>(&w);
#pragma unroll
      for (int i = 0; i < 8; ++i) x[c * 8 + i] = to_float(h[i]);
    }
  } else if constexpr (E % 4 == 0) {
#pragma unroll
    for (int c = 0; c < E / 4; ++c) {
      const uint2 w = reinterpret_cast<const uint2*>(p)[c];
      const T* h = reinterpret_cast<const T*>(&w);
#pragma unroll
      for (int i = 0; i < 4; ++i) x[c * 4 + i] = to_float(h[i]);
    }
  } else if constexpr (E % 2 == 0) {
#pragma unroll
    for (int c = 0; c < E / 2; ++c) {
      const uint32_t w = reinterpret_cast<const uint32_t*>(p)[c];
      const T* h = reinterpret_cast<const T*>(&w);
      x[c * 2] = to_float(h[0]);
      x[c * 2 + 1] = to_float(h[1]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < E; ++i) x[i] = to_float(p[i]);
  }
}

__device__ __forceinline__ float half_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 8);
  v += __shfl_xor_sync(0xffffffffu, v, 4);
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  return v + __shfl_xor_sync(0xffffffffu, v, 1);
}

// The row's visible tokens [first, len) and its page list (dense: page_lo + i; else the selection).
struct Row {
  int seq, len, first, page_lo, n_pages;
  const int32_t* list;  // selection pages, or null
  __device__ int page(int i) const { return list ? list[i] : page_lo + i; }
};

__device__ __forceinline__ Row row_of(const Args& a, int b, int g) {
  Row r;
  r.seq = a.seqs[b];
  r.len = a.lengths[r.seq];
  r.first = a.window < 0 ? 0 : int(max(0LL, (long long)r.len - 1 - a.window));
  r.page_lo = r.first / a.P;
  r.list = nullptr;
  if (a.row_ptr) {
    const int at = b * a.Hkv + g;
    r.list = a.pages + a.row_ptr[at];
    r.n_pages = a.row_ptr[at + 1] - a.row_ptr[at];
  } else {
    r.n_pages = r.len > 0 ? (r.len - 1) / a.P - r.page_lo + 1 : 0;
  }
  return r;
}

// The final value of one (b, h, dim) from its merged (m, l, o): the sink joins the denominator,
// then o / l; a row with no key and no sink gets 0 (lse −inf), and a NaN stays a NaN.
__device__ __forceinline__ void finish(const Args& a, int b, int h, int dim, float m, float l, float o) {
  if (a.sink_mode == 1) {
    const float s = a.sink[h] * kLog2e;
    const float m2 = ariadne::cuda::fmax_nan(m, s);
    const float c = m == -INFINITY ? 0.f : exp2f(m - m2);
    l = l * c + exp2f(s - m2);
    o *= c;
    m = m2;
  }
  const bool any = l > 0.f || isnan(l);
  const float x = any ? o / l : 0.f;
  const int64_t at = b * a.o_sb + h * a.o_sh + dim;
  if (a.out_dtype == 0) static_cast<float*>(a.out)[at] = x;
  else if (a.out_dtype == 1) static_cast<uint16_t*>(a.out)[at] = float_to_bf16(x);  // the host's rounding
  else static_cast<__half*>(a.out)[at] = __float2half_rn(x);
  if (dim == 0 && a.lse) a.lse[b * a.Hq + h] = any ? (m + log2f(l)) * kLn2 : -INFINITY;
}

template <int D, int MAXG, class T>
__global__ void __launch_bounds__(kThreads) decode_kernel(const Args a) {
  constexpr int kTile = kTileOf<D>, kStages = kStagesOf<D>;
  constexpr int kRows = kTile / kHalfWarps;  // rows per half-warp and stage
  constexpr int E = D / 16;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) uint64_t full[kStages];  // stage s's K and V tiles landed
  T* ks = reinterpret_cast<T*>(smem);
  T* vs = ks + kStages * kTile * D;

  const int b = blockIdx.z, g = blockIdx.y / a.head_chunks, chunk = blockIdx.y % a.head_chunks;
  const int h0 = g * a.group + chunk * MAXG, nh = min(MAXG, a.group - chunk * MAXG);
  const int split = blockIdx.x;
  const Row row = row_of(a, b, g);
  const int units = row.n_pages * a.tiles_per_page;
  const int per = (units + a.splits - 1) / a.splits;
  const int u0 = min(units, split * per), u1 = min(units, u0 + per);
  const int tid = threadIdx.x, lane = tid & 31, hw = tid >> 4, l16 = lane & 15;  // hw: the half-warp

  // The query heads of this CTA, E dims per lane, pre-scaled into log2 units.
  float q[MAXG][E];
#pragma unroll
  for (int h = 0; h < MAXG; ++h) {
    if (h < nh) {
      load_row<E>(static_cast<const T*>(a.q) + b * a.q_sb + (h0 + h) * a.q_sh + l16 * E, q[h]);
#pragma unroll
      for (int e = 0; e < E; ++e) q[h][e] *= a.scale_log2;
    } else {
#pragma unroll
      for (int e = 0; e < E; ++e) q[h][e] = 0.f;
    }
  }

  // The merge launch may start now: its CTAs wait for this grid's completion (and its writes)
  // at griddepcontrol.wait, so only its launch overlaps this kernel.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  namespace wg = ariadne::cuda::wg;
  const uint32_t bar0 = ariadne::cuda::smem_addr(&full[0]);
  if (tid == 0)
    for (int s = 0; s < kStages; ++s) wg::mbar_init(bar0 + 8 * s, 1);
  __syncthreads();

  // Thread 0: unit u (page entry u / tiles_per_page, rows from (u % tiles_per_page) · tile) into a
  // stage, the page's rows only (a short last tile leaves the rest of the stage as it was).
  const auto load_unit = [&](int u, int stage) {
    const int page = row.page(u / a.tiles_per_page), row0 = (u % a.tiles_per_page) * a.tile;
    const int rows = min(a.tile, a.P - row0);
    const int pool = a.table[int64_t(row.seq) * a.max_pages + page];
    const int64_t base = ((int64_t(pool) * a.Hkv + g) * a.P + row0) * D;
    const uint32_t bytes = uint32_t(rows) * D * sizeof(T);
    wg::mbar_arrive_expect_tx(bar0 + 8 * stage, 2 * bytes);
    wg::bulk_load(ariadne::cuda::smem_addr(ks + stage * kTile * D), static_cast<const T*>(a.k) + base, bytes,
                  bar0 + 8 * stage);
    wg::bulk_load(ariadne::cuda::smem_addr(vs + stage * kTile * D), static_cast<const T*>(a.v) + base, bytes,
                  bar0 + 8 * stage);
  };

  float m[MAXG], l[MAXG], acc[MAXG][E];
#pragma unroll
  for (int h = 0; h < MAXG; ++h) {
    m[h] = -INFINITY;
    l[h] = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[h][e] = 0.f;
  }

  if (tid == 0)
    for (int s = 0; s < kStages && u0 + s < u1; ++s) load_unit(u0 + s, s);
  for (int u = u0; u < u1; ++u) {
    const int it = u - u0;
    wg::mbar_wait(bar0 + 8 * (it % kStages), uint32_t(it / kStages) & 1u);
    const int stage = it % kStages;
    const int page = row.page(u / a.tiles_per_page), row0 = (u % a.tiles_per_page) * a.tile;
    const int rows = min(a.tile, a.P - row0);
    const T* kt = ks + stage * kTile * D;
    const T* vt = vs + stage * kTile * D;

    // Scores of this half-warp's rows.
    float s[kRows][MAXG];
    bool seen[kRows];
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int j = hw * kRows + i;
      const int t = page * a.P + row0 + j;
      const bool ok = j < rows && t >= row.first && t < row.len;
      seen[i] = ok;
      float kx[E];
      load_row<E>(kt + j * D + l16 * E, kx);
#pragma unroll
      for (int h = 0; h < MAXG; ++h) {
        float dot = 0.f;
#pragma unroll
        for (int e = 0; e < E; ++e) dot = fmaf(q[h][e], kx[e], dot);
        dot = half_sum(dot);
        if (a.sink_mode == 2 && t == 0 && h < nh) dot += a.sink[h0 + h] * kLog2e;
        s[i][h] = ok ? dot : -INFINITY;
      }
    }
    // Online softmax per head over its rows, then the values.
#pragma unroll
    for (int h = 0; h < MAXG; ++h) {
      float mt = s[0][h];
#pragma unroll
      for (int i = 1; i < kRows; ++i) mt = ariadne::cuda::fmax_nan(mt, s[i][h]);
      const float mn = ariadne::cuda::fmax_nan(m[h], mt);
      if (mn == -INFINITY) {  // no visible row yet: nothing to scale or add
#pragma unroll
        for (int i = 0; i < kRows; ++i) s[i][h] = 0.f;
        continue;
      }
      const float c = exp2f(m[h] - mn);
      m[h] = mn;
      l[h] *= c;
#pragma unroll
      for (int e = 0; e < E; ++e) acc[h][e] *= c;
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        s[i][h] = exp2f(s[i][h] - mn);
        l[h] += s[i][h];
      }
    }
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      float vx[E];
      load_row<E>(vt + (hw * kRows + i) * D + l16 * E, vx);
#pragma unroll
      for (int e = 0; e < E; ++e) vx[e] = seen[i] ? vx[e] : 0.f;
#pragma unroll
      for (int h = 0; h < MAXG; ++h)
#pragma unroll
        for (int e = 0; e < E; ++e) acc[h][e] = fmaf(s[i][h], vx[e], acc[h][e]);
    }
    __syncthreads();  // every thread is done with this stage: refill it
    if (tid == 0 && u + kStages < u1) load_unit(u + kStages, it % kStages);
  }

  // Merge the 8 half-warps through shared memory (the stages are free now).
  float* ml = reinterpret_cast<float*>(smem);  // [8][MAXG][2]
  float* ao = ml + 8 * MAXG * 2;               // [8][MAXG][D]
  if (l16 == 0) {
#pragma unroll
    for (int h = 0; h < MAXG; ++h) {
      ml[(hw * MAXG + h) * 2] = m[h];
      ml[(hw * MAXG + h) * 2 + 1] = l[h];
    }
  }
#pragma unroll
  for (int h = 0; h < MAXG; ++h)
#pragma unroll
    for (int e = 0; e < E; ++e) ao[(hw * MAXG + h) * D + l16 * E + e] = acc[h][e];
  __syncthreads();
  for (int x = tid; x < nh * D; x += kThreads) {
    const int h = x / D, dim = x % D;
    float M = -INFINITY;
    for (int k = 0; k < 8; ++k) M = ariadne::cuda::fmax_nan(M, ml[(k * MAXG + h) * 2]);
    float L = 0.f, O = 0.f;
    if (M != -INFINITY)
      for (int k = 0; k < 8; ++k) {
        const float mk = ml[(k * MAXG + h) * 2];
        const float w = mk == -INFINITY ? 0.f : exp2f(mk - M);
        L += w * ml[(k * MAXG + h) * 2 + 1];
        O += w * ao[(k * MAXG + h) * D + dim];
      }
    const int hq = h0 + h;
    if (a.splits == 1) {
      finish(a, b, hq, dim, M, L, O);
    } else {
      const int64_t at = (int64_t(b) * a.Hq + hq) * a.splits + split;
      a.part_o[at * D + dim] = O;
      if (dim == 0) {
        a.part_ml[at * 2] = M;
        a.part_ml[at * 2 + 1] = L;
      }
    }
  }
}

// The most splits a row is cut into (choose_splits), so the merge's weights fit its shared memory.
constexpr int kMaxSplits = 1024;
// The merge CTA: 4 groups of 128 threads; group g sums the splits s ≡ g (mod 4) of every dimension.
constexpr int kMergeThreads = 512, kMergeGroups = kMergeThreads / 128;

// One CTA per (b, h): the splits' (m, l, o) merged by their maxima, then finish(). Each thread
// loads the (m, l) pairs of its splits once (a split per thread, two at most); the CTA reduces the
// maxima, then the weights exp2(m_s − M) (kept in shared memory) and L = Σ w_s · l_s; then each
// group of 128 threads sums a quarter of the splits per dimension, 4 loads in flight, and the
// groups' sums meet in shared memory. So the merge costs about three round trips to L2, not a
// dependent load per split.
template <int D>
__global__ void __launch_bounds__(kMergeThreads) merge_kernel(const Args a) {
  static_assert(D <= 128, "a group's thread per dimension");
  constexpr int kPer = kMaxSplits / kMergeThreads;
  __shared__ float w[kMaxSplits];
  __shared__ float red[kMergeThreads / 32];
  __shared__ float part[kMergeGroups][D];
  const int b = blockIdx.x / a.Hq, h = blockIdx.x % a.Hq, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t base = (int64_t(b) * a.Hq + h) * a.splits;
  const float2* ml = reinterpret_cast<const float2*>(a.part_ml) + base;
  asm volatile("griddepcontrol.wait;" ::: "memory");  // the decode grid's partials are complete
  float2 mine[kPer];
  float M = -INFINITY;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int s = tid + k * kMergeThreads;
    mine[k] = s < a.splits ? ml[s] : make_float2(-INFINITY, 0.f);
    M = ariadne::cuda::fmax_nan(M, mine[k].x);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) M = ariadne::cuda::fmax_nan(M, __shfl_xor_sync(0xffffffffu, M, o));
  if (lane == 0) red[warp] = M;
  __syncthreads();
  M = red[0];
#pragma unroll
  for (int k = 1; k < kMergeThreads / 32; ++k) M = ariadne::cuda::fmax_nan(M, red[k]);
  __syncthreads();  // red is reused for L
  // Each split's weight (0 for a split that saw no key) and L = Σ w_s · l_s.
  float L = 0.f;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int s = tid + k * kMergeThreads;
    const float ws = M == -INFINITY || mine[k].x == -INFINITY ? 0.f : exp2f(mine[k].x - M);
    if (s < a.splits) w[s] = ws;
    L += ws * mine[k].y;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) L += __shfl_xor_sync(0xffffffffu, L, o);
  if (lane == 0) red[warp] = L;
  __syncthreads();
  L = 0.f;
#pragma unroll
  for (int k = 0; k < kMergeThreads / 32; ++k) L += red[k];
  const int g = tid / 128, dim = tid % 128;
  if (dim < D) {
    const float* po = a.part_o + base * D + dim;
    float O = 0.f;
#pragma unroll 4
    for (int s = g; s < a.splits; s += kMergeGroups) O += w[s] * po[int64_t(s) * D];
    part[g][dim] = O;
  }
  __syncthreads();
  if (tid < D) {
    float O = 0.f;
#pragma unroll
    for (int k = 0; k < kMergeGroups; ++k) O += part[k][tid];
    finish(a, b, h, tid, M, L, O);
  }
}

void check(cudaError_t e, const char* what) {
  ARIADNE_CHECK(e == cudaSuccess, "decode (cuda): ", what, ": ", cudaGetErrorString(e));
}

// The split of each row's tiles: the smallest count that minimizes waves × tiles per CTA, the
// waves counted against the CTAs the GPU holds at once (`capacity`). A memory-bound kernel whose
// last wave is partly empty leaves bandwidth unused; among equal costs fewer splits mean less
// merging. Never below two tiles a CTA (something to pipeline), and never more CTAs than two waves
// hold: many small waves of short CTAs tie with one long wave in that count, but each CTA costs a
// pipeline fill and each split a pass of the merge (uncapped, 128K batch 8 comes to 683 splits of
// 6 tiles, whose merge alone takes 0.21 ms).
int choose_splits(int64_t ctas, int64_t units, int64_t capacity) {
  const int64_t fill = (2 * capacity + ctas - 1) / std::max<int64_t>(ctas, 1);
  const int64_t most = std::clamp<int64_t>(std::min(units / 2, fill), 1, kMaxSplits);
  int64_t best = 1, best_cost = INT64_MAX;
  for (int64_t s = 1; s <= most; ++s) {
    const int64_t waves = (ctas * s + capacity - 1) / capacity, per = (units + s - 1) / s;
    if (waves * per < best_cost) {
      best_cost = waves * per;
      best = s;
    }
  }
  return int(best);
}

template <int D, int MAXG, class T>
size_t smem_bytes() {
  return std::max<size_t>(size_t(2) * kStagesOf<D> * kTileOf<D> * D * sizeof(T),
                          size_t(8) * MAXG * (2 + D) * sizeof(float));
}

// CTAs of one instantiation an SM holds (the occupancy API; its shared-memory attribute set once).
template <int D, int MAXG, class T>
int resident() {
  static const int n = [] {
    const size_t smem = smem_bytes<D, MAXG, T>();
    check(cudaFuncSetAttribute(decode_kernel<D, MAXG, T>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
          "shared memory attribute");
    int r = 0;
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&r, decode_kernel<D, MAXG, T>, kThreads, smem), "occupancy");
    return std::max(r, 1);
  }();
  return n;
}

template <int D, int MAXG, class T>
void launch(const Args& a) {
  decode_kernel<D, MAXG, T><<<dim3(unsigned(a.splits), unsigned(a.Hkv * a.head_chunks), unsigned(a.B)), kThreads,
                              smem_bytes<D, MAXG, T>(), a.stream>>>(a);
  check(cudaGetLastError(), "decode kernel launch");
  if (a.splits > 1) {
    // A programmatic dependent launch: the merge is launched while the decode grid runs and waits
    // inside (griddepcontrol.wait), so the launch latency between the two kernels is hidden.
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(unsigned(a.B * a.Hq));
    cfg.blockDim = dim3(kMergeThreads);
    cfg.stream = a.stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    check(cudaLaunchKernelEx(&cfg, merge_kernel<D>, a), "merge kernel launch");
  }
}

// What the host needs of an instantiation: its CTAs per SM and its key tile.
struct Instance {
  int resident = 1, tile = 0;
};

// The instantiation of (d, maxg, dtype): `run` gets a callable of its launch and its Instance.
template <class F>
void dispatch(int d, int maxg, DType dt, F&& run) {
  const auto by_group = [&](auto dim, auto t) {
    constexpr int D = decltype(dim)::value;
    using T = typename decltype(t)::type;
    switch (maxg) {
      case 1: run(launch<D, 1, T>, Instance{resident<D, 1, T>(), kTileOf<D>}); break;
      case 2: run(launch<D, 2, T>, Instance{resident<D, 2, T>(), kTileOf<D>}); break;
      case 4: run(launch<D, 4, T>, Instance{resident<D, 4, T>(), kTileOf<D>}); break;
      default: run(launch<D, 8, T>, Instance{resident<D, 8, T>(), kTileOf<D>}); break;
    }
  };
  const auto by_dim = [&](auto t) {
    switch (d) {
      case 64: by_group(std::integral_constant<int, 64>{}, t); break;
      case 80: by_group(std::integral_constant<int, 80>{}, t); break;
      case 96: by_group(std::integral_constant<int, 96>{}, t); break;
      default: by_group(std::integral_constant<int, 128>{}, t); break;
    }
  };
  if (dt == DType::bf16) by_dim(std::type_identity<__nv_bfloat16>{});
  else by_dim(std::type_identity<__half>{});
}

// A call's geometry: the CTAs per split, the tiles of the longest row, the split.
struct Split {
  int d = 0, B = 0, Hq = 0, group = 0, maxg = 1, head_chunks = 1, tile = 0, tiles_per_page = 1, splits = 1;
  int64_t ctas = 0, units = 0;
  // The partials' bytes: o [B·Hq, splits, d] then (m, l) [B·Hq, splits, 2], f32, 256-byte aligned.
  size_t o_bytes() const { return splits > 1 ? (size_t(B) * Hq * splits * d * sizeof(float) + 255) / 256 * 256 : 0; }
  size_t bytes() const { return splits > 1 ? o_bytes() + size_t(B) * Hq * splits * 2 * sizeof(float) : 0; }
};

// extra: tokens each row will have gained when the call runs (a step captured before its append).
Split split_of(const DecodeParams& p, int64_t extra = 0) {
  const CudaKVCache& cache = *p.device_cache;
  const KVCacheConfig& c = cache.config();
  Split s;
  s.d = c.head_dim;
  ARIADNE_CHECK(s.d == 64 || s.d == 80 || s.d == 96 || s.d == 128, "decode (cuda): head dim ", s.d,
                " has no kernel, expected 64, 80, 96 or 128");
  s.B = int(p.q.shape[0]);
  s.Hq = int(p.q.shape[1]);
  s.group = s.Hq / c.kv_heads;
  // The kernel's head slots: the group rounded up to 1, 2, 4 or 8; larger groups in chunks of 8.
  s.maxg = s.group > 4 ? 8 : s.group > 2 ? 4 : s.group;
  s.head_chunks = (s.group + s.maxg - 1) / s.maxg;
  Instance in;
  dispatch(s.d, s.maxg, c.dtype, [&](auto, Instance i) { in = i; });
  s.tile = std::min(c.page_size, in.tile);
  s.tiles_per_page = (c.page_size + s.tile - 1) / s.tile;
  int64_t most = 0;  // the longest row's page count (a device selection's counts stay on the device:
                     // its rows are bounded by the visible pages)
  if (p.selection)
    for (int64_t r = 0; r < p.selection->rows(); ++r)
      most = std::max<int64_t>(most, p.selection->row_ptr[size_t(r) + 1] - p.selection->row_ptr[size_t(r)]);
  else
    for (int b = 0; b < s.B; ++b)
      most = std::max<int64_t>(
          most, visible_of(cache.length(p.seqs[size_t(b)]) + extra, p.window, c.page_size).pages());
  s.units = most * s.tiles_per_page;
  s.ctas = int64_t(s.B) * c.kv_heads * s.head_chunks;
  if (s.B > 0) s.splits = choose_splits(s.ctas, s.units, int64_t(in.resident) * sm_count());
  return s;
}

}  // namespace

int sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    check(cudaGetDevice(&dev), "cudaGetDevice");
    check(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev), "SM count");
    return v;
  }();
  return n;
}

size_t decode_cuda_workspace(const DecodeParams& p, int64_t extra_tokens) {
  return split_of(p, extra_tokens).bytes();
}

DeviceBuffer scratch_words(int64_t n, void* stream) {
  return stream == nullptr ? DeviceBuffer::stream_ordered(DType::f32, {std::max<int64_t>(n, 1)})
                           : DeviceBuffer(DType::f32, {std::max<int64_t>(n, 1)});
}

DeviceBuffer upload_ints(const int32_t* host, size_t n, void* stream) {
  DeviceBuffer d = scratch_words(int64_t(n), stream);
  if (n)
    check(cudaMemcpyAsync(d.data(), host, n * sizeof(int32_t), cudaMemcpyHostToDevice,
                          static_cast<cudaStream_t>(stream)),
          "upload");
  return d;
}

void decode_cuda(const DecodeParams& p) {
  const CudaKVCache& cache = *p.device_cache;
  const KVCacheConfig& c = cache.config();
  ARIADNE_CHECK(p.q.stride[2] == 1 && p.out.stride[2] == 1, "decode (cuda): q and out need a contiguous head dim");
  const Split s = split_of(p);
  if (s.B == 0) return;
  const auto stream = static_cast<cudaStream_t>(p.stream);
  ARIADNE_CHECK(p.workspace == nullptr || p.workspace_bytes >= s.bytes(), "decode (cuda): workspace_bytes is ",
                p.workspace_bytes, ", this call needs ", s.bytes(), " (decode_workspace_bytes)");

  // Per-call arrays: sequence ids unless given in device memory, a host selection, the partials
  // without a workspace.
  DeviceBuffer seq_ids, row_ptr, pages, parts;
  if (!p.device_seqs) seq_ids = upload_ints(p.seqs.data(), p.seqs.size(), p.stream);
  if (p.selection) {
    row_ptr = upload_ints(p.selection->row_ptr.data(), p.selection->row_ptr.size(), p.stream);
    pages = upload_ints(p.selection->pages.data(), p.selection->pages.size(), p.stream);
  }
  char* part = static_cast<char*>(p.workspace);
  if (s.splits > 1 && part == nullptr) {
    parts = scratch_words(int64_t((s.bytes() + 3) / 4), p.stream);
    part = static_cast<char*>(parts.data());
  }
  Args a{};
  a.q = p.q.data;
  a.q_sb = p.q.stride[0];
  a.q_sh = p.q.stride[1];
  a.out = p.out.data;
  a.out_dtype = p.out.dtype == DType::f32 ? 0 : p.out.dtype == DType::bf16 ? 1 : 2;
  a.o_sb = p.out.stride[0];
  a.o_sh = p.out.stride[1];
  a.lse = p.lse.defined() ? static_cast<float*>(p.lse.data) : nullptr;
  a.k = cache.k_pool();
  a.v = cache.v_pool();
  a.table = cache.block_table();
  a.max_pages = cache.max_pages();
  a.lengths = cache.lengths();
  a.seqs = p.device_seqs ? p.device_seqs : static_cast<const int32_t*>(seq_ids.data());
  a.row_ptr = p.selection ? static_cast<const int32_t*>(row_ptr.data())
              : p.device_selection ? p.device_selection->row_ptr() : nullptr;
  a.pages = p.selection ? static_cast<const int32_t*>(pages.data())
            : p.device_selection ? p.device_selection->pages() : nullptr;
  a.sink = p.sink_mode == SinkMode::none ? nullptr : static_cast<const float*>(p.sink.data);
  a.sink_mode = p.sink_mode == SinkMode::none ? 0 : p.sink_mode == SinkMode::denominator ? 1 : 2;
  a.window = p.window;
  a.scale_log2 = (p.scale > 0 ? p.scale : 1.f / std::sqrt(float(s.d))) * kLog2e;
  a.B = s.B;
  a.Hq = s.Hq;
  a.Hkv = c.kv_heads;
  a.group = s.group;
  a.P = c.page_size;
  a.tile = s.tile;
  a.tiles_per_page = s.tiles_per_page;
  a.splits = s.splits;
  a.head_chunks = s.head_chunks;
  a.part_o = s.splits > 1 ? reinterpret_cast<float*>(part) : nullptr;
  a.part_ml = s.splits > 1 ? reinterpret_cast<float*>(part + s.o_bytes()) : nullptr;
  a.stream = stream;
  dispatch(s.d, s.maxg, c.dtype, [&](auto run, Instance) { run(a); });
}

}  // namespace ariadne::decode_detail
