// The page selection of sparse decode on the device (select_pages with a device cache,
// include/ariadne/decode.hpp): the same scores as the host scorers of src/decode/decode.cpp, from
// the device cache's key summaries, and the same rule, so a sparse step runs without the host.
//
// Per row r = (sequence b, KV head g), six launches on the caller's stream, none of which reads
// anything back:
//   1. geometry   one CTA: each row's visible pages, first visible page and score offset (a block
//                 scan over the rows), the per-row τ, and this call's rotation step (advancing the
//                 counter under advance_step).
//   2. terms      a CTA per (row, 8 or 16 visible pages): the log-weights of the pages' terms (rr: one
//                 per key stride, log n + scale·q·k̄ for the rotated head or every head; quest:
//                 log rows + scale·Σ max(q·min, q·max) per head), in double with the dot products
//                 reduced across a warp; per head the chunk's max m_c and Σ exp(x − m_c), and per
//                 page and head e = Σ exp(x − m_c) over that head's terms.
//   3. scores     a CTA per row: the chunks merged per head (M, Z = Σ z_c·exp(m_c − M)), then
//                 each page's score, the mean over the heads that scored anything of
//                 e·exp(m_c − M)/Z, rounded to f32 as the host's are before selecting.
//   4. select     the estimators' selection over plain rows (launch_select_rows,
//                 src/estimate/cuda/estimate_select.cu): the smallest prefix of the score order
//                 holding the row's τ of its mass, the rule of select_blocks.
//   5. forced     a CTA per row ORs in the first sink_pages pages and the recent_pages last
//                 visible ones (RR keeps them whatever their score), counts, and sums the kept
//                 scores (kept_mass); the CTA that finishes last scans the counts into row_ptr.
//   6. compact    a CTA per row: its kept flags compacted in index order into logical pages.
// Every per-row kernel spreads a row over a CTA's threads: a warp per row would walk a row of 2048
// pages in 64 dependent steps (docs/design/decode.md has the per-launch durations).
// The host computes the same quantities in double with another summation order and its own exp
// and log, so scores agree to rounding and decisions agree unless one lies within rounding of its
// threshold (the selection kernel's own sums are exact fixed point).
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "ariadne/decode.hpp"
#include "ariadne/device.hpp"
#include "ariadne/error.hpp"
#include "decode/internal.hpp"
#include "estimate/cuda/estimate.cuh"

namespace ariadne {

namespace {

// Pages of one row per terms CTA (SelArgs::chunk): 8, or 16 when a call has CTAs to spare.
constexpr int kMinChunk = 8, kMaxChunk = 16;
constexpr int kTermThreads = 128;
constexpr size_t kMaxTermsSmem = 200 * 1024;  // the terms kernel's shared memory per CTA at most
constexpr int kScoreThreads = 256;
constexpr int kRowThreads = 256;  // the forced and compact kernels' CTA per row
constexpr int kGeometryThreads = 1024;
constexpr int kMaxGroup = 64;

void check(cudaError_t e, const char* what) {
  ARIADNE_CHECK(e == cudaSuccess, "select_pages (cuda): ", what, ": ", cudaGetErrorString(e));
}

DeviceBuffer bytes_buffer(size_t bytes) {
  return DeviceBuffer(DType::f32, {std::max<int64_t>(1, int64_t((bytes + 3) / 4))});
}

int chunks_of(int max_pages) { return (max_pages + kMinChunk - 1) / kMinChunk; }  // the most a row has

struct SelArgs {
  const float* sum;  // [capacity, kv_heads, J, d]
  const float* mn;   // [capacity, kv_heads, d]
  const float* mx;
  const int32_t* table;
  int max_pages;
  const int32_t* lengths;
  const int32_t* seqs;  // [B]
  const void* q;
  int64_t q_sb, q_sh;
  bool bf16;
  int Hkv, G, d, P, S, J, hpt, chunks, chunk;  // chunks: the chunk buffers' row stride
  bool quest, rotate, advance;
  long long window, step;
  double scale, tau, log_s;  // log_s = log(S), the host's value
  int sink_pages, recent_pages;
  int64_t rows;
  int32_t* visible;
  int32_t* page_lo;
  int64_t* score_ptr;  // [rows + 1]
  double* tau_rows;    // [rows]
  long long* step_ctr; // [2]: the persistent counter, this call's step
  double* epage;       // [score_ptr[rows], G]
  double* chunk_m;     // [rows, chunks, G]
  double* chunk_z;     // [rows, chunks, G]; −1: the head scored nothing in the chunk
  float* scores;       // [score_ptr[rows]]
  uint8_t* keep;       // [score_ptr[rows]]
  int32_t* counts;     // [rows]
  unsigned* done;      // the forced kernel's ticket, 0 between calls
  int32_t* row_ptr;     // [rows + 1]: written by the forced kernel's last CTA
  int32_t* pages;
  float* kept_mass;
};

__global__ void __launch_bounds__(kGeometryThreads) geometry_kernel(SelArgs a) {
  using Scan = cub::BlockScan<long long, kGeometryThreads>;
  __shared__ typename Scan::TempStorage tmp;
  __shared__ long long carry;
  if (threadIdx.x == 0) {
    carry = 0;
    const long long c = a.advance ? a.step_ctr[0] : 0;
    a.step_ctr[1] = a.step + c;
    if (a.advance) a.step_ctr[0] = c + 1;
  }
  __syncthreads();
  for (int64_t base = 0; base < a.rows; base += kGeometryThreads) {
    const int64_t r = base + threadIdx.x;
    long long n = 0;
    if (r < a.rows) {
      const int len = a.lengths[a.seqs[r / a.Hkv]];
      const int first = a.window < 0 ? 0 : int(max(0LL, (long long)len - 1 - a.window));
      const int lo = first / a.P;
      n = len > 0 ? (len - 1) / a.P - lo + 1 : 0;
      a.visible[r] = int(n);
      a.page_lo[r] = lo;
      a.tau_rows[r] = a.tau;
    }
    long long ex = 0, total = 0;
    Scan(tmp).ExclusiveSum(n, ex, total);
    if (r < a.rows) a.score_ptr[r] = carry + ex;
    __syncthreads();
    if (threadIdx.x == 0) carry += total;
    __syncthreads();
  }
  if (threadIdx.x == 0) a.score_ptr[a.rows] = carry;
}

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ double warp_max(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The sum over the 8 lanes of an aligned lane group (a term's lanes): the groups of a warp may
// work on terms of different kinds, so the shuffle names only its own group.
__device__ __forceinline__ double group8_sum(double v) {
  const unsigned mask = 0xffu << ((threadIdx.x & 31) & ~7);
#pragma unroll
  for (int o = 4; o > 0; o >>= 1) v += __shfl_xor_sync(mask, v, o);
  return v;
}

__device__ __forceinline__ double q_elem(const SelArgs& a, int b, int h, int i) {
  const size_t at = size_t(b) * a.q_sb + size_t(h) * a.q_sh + i;
  return a.bf16 ? double(__bfloat162float(static_cast<const __nv_bfloat16*>(a.q)[at]))
                : double(__half2float(static_cast<const __half*>(a.q)[at]));
}

// Up to four float4 of a d-element f32 row (d ≤ 128, a multiple of 4): lane l of a term's 8 takes
// the float4 l, l + 8, l + 16, l + 24 (zeros past the row), issued before any is used.
__device__ __forceinline__ void load_quarter(const float* row, int d4, int l8, float4 (&x)[4]) {
#pragma unroll
  for (int u = 0; u < 4; ++u)
    x[u] = l8 + 8 * u < d4 ? reinterpret_cast<const float4*>(row)[l8 + 8 * u] : make_float4(0.f, 0.f, 0.f, 0.f);
}

__device__ __forceinline__ double dot_quarter(const double* q, int d4, int l8, const float4 (&x)[4]) {
  double dot = 0;
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const int e = 4 * (l8 + 8 * u);
    if (l8 + 8 * u < d4) {
      dot = fma(q[e], double(x[u].x), dot);
      dot = fma(q[e + 1], double(x[u].y), dot);
      dot = fma(q[e + 2], double(x[u].z), dot);
      dot = fma(q[e + 3], double(x[u].w), dot);
    }
  }
  return dot;
}

__global__ void __launch_bounds__(kTermThreads) terms_kernel(SelArgs a) {
  extern __shared__ double sm[];
  const int64_t r = blockIdx.y;
  const int c = blockIdx.x, n = a.visible[r], i0 = c * a.chunk;
  if (i0 >= n) return;  // the scores kernel reads only chunks that hold pages
  const int b = int(r / a.Hkv), g = int(r % a.Hkv), seq = a.seqs[b], len = a.lengths[seq], lo = a.page_lo[r];
  const int G = a.G, d = a.d, d4 = d / 4, J = a.J, hpt = a.hpt, terms = a.chunk * J;
  const int step_g = int(a.step_ctr[1] % G);  // the step is ≥ 0, so (p + step + j) mod G needs only this
  __shared__ int64_t pool_of[kMaxChunk];
  double* qs = sm;                 // [G][d]
  double* xs = qs + G * d;         // [terms][hpt]
  double* hm = xs + terms * hpt;   // [G]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, l8 = lane & 7;
  // The queries and the pages' pool ids, loaded together before any term needs them.
  for (int x = tid; x < G * d; x += kTermThreads) qs[x] = q_elem(a, b, g * G + x / d, x % d);
  if (tid < a.chunk && i0 + tid < n) pool_of[tid] = a.table[int64_t(seq) * a.max_pages + lo + i0 + tid];
  __syncthreads();
  // The query head of term t's slot: stride j of page p goes to head (p + step + j) mod G under
  // rotation (the host's first_head / next_head), else the slot is the head.
  const auto head_of = [&](int t, int slot) { return hpt == G ? slot : (lo + i0 + t / J + step_g + t % J) % G; };
  // Rows of term t's page, and of its stride (0: no page or no stride there).
  const auto page_rows = [&](int t) {
    const int i = i0 + t / J;
    return t < terms && i < n ? min(a.P, len - (lo + i) * a.P) : 0;
  };
  const auto rows_of = [&](int t) { return max(0, min(a.S, page_rows(t) - t % J * a.S)); };
  constexpr int kGroups = kTermThreads / 8;  // eight lanes per term, four terms a warp at a time
  if (!a.quest) {
    // rr: the next term's stride sum is in flight while this one is scored.
    float4 next[4];
    const auto fetch = [&](int t) {
      if (rows_of(t) > 0) load_quarter(a.sum + ((pool_of[t / J] * a.Hkv + g) * J + t % J) * d, d4, l8, next);
    };
    fetch(tid / 8);
    for (int t = tid / 8; t < terms; t += kGroups) {
      const float4 kv[4] = {next[0], next[1], next[2], next[3]};
      fetch(t + kGroups);
      double* out = xs + t * hpt;
      const int nj = rows_of(t);
      if (nj == 0) {
        for (int s = l8; s < hpt; s += 8) out[s] = -INFINITY;
        continue;
      }
      const double log_n = nj == a.S ? a.log_s : log(double(nj));
      for (int s = 0; s < hpt; ++s) {
        const double dot = group8_sum(dot_quarter(qs + head_of(t, s) * d, d4, l8, kv));
        if (l8 == 0) out[s] = log_n + a.scale * dot / double(nj);
      }
    }
  }
  for (int t = tid / 8; a.quest && t < terms; t += kGroups) {
    const int i = i0 + t / J;
    double* out = xs + t * hpt;
    const int rows_in = page_rows(t);
    if (rows_in == 0) {
      for (int s = l8; s < hpt; s += 8) out[s] = -INFINITY;
      continue;
    }
    const int64_t pool = pool_of[i - i0];
    float4 mn[4], mx[4];
    load_quarter(a.mn + (pool * a.Hkv + g) * d, d4, l8, mn);
    load_quarter(a.mx + (pool * a.Hkv + g) * d, d4, l8, mx);
    const double log_rows = log(double(rows_in));
    for (int s = 0; s < hpt; ++s) {
      const double* q = qs + s * d;
      double bound = 0;
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int e = 4 * (l8 + 8 * u);
        if (l8 + 8 * u < d4) {
          bound += fmax(q[e] * double(mn[u].x), q[e] * double(mx[u].x));
          bound += fmax(q[e + 1] * double(mn[u].y), q[e + 1] * double(mx[u].y));
          bound += fmax(q[e + 2] * double(mn[u].z), q[e + 2] * double(mx[u].z));
          bound += fmax(q[e + 3] * double(mn[u].w), q[e + 3] * double(mx[u].w));
        }
      }
      bound = group8_sum(bound);
      if (l8 == 0) out[s] = log_rows + a.scale * bound;
    }
  }
  __syncthreads();
  // Per head, a warp: the chunk's max and Σ exp(x − max) over the head's terms (the host's mx and z,
  // per chunk).
  for (int h = warp; h < G; h += kTermThreads / 32) {
    double m = -INFINITY;
    bool any = false;
    for (int x = lane; x < terms * hpt; x += 32) {
      const double v = xs[x];
      if (v == -INFINITY || head_of(x / hpt, x % hpt) != h) continue;
      any = true;
      m = fmax(m, v);
    }
    m = warp_max(m);
    any = __any_sync(0xffffffffu, any);
    double z = 0;
    for (int x = lane; x < terms * hpt; x += 32) {
      const double v = xs[x];
      if (v != -INFINITY && head_of(x / hpt, x % hpt) == h) z += exp(v - m);
    }
    z = warp_sum(z);
    if (lane == 0) {
      hm[h] = m;
      const int64_t at = (r * a.chunks + c) * G + h;
      a.chunk_m[at] = m;
      a.chunk_z[at] = any ? z : -1.0;
    }
  }
  __syncthreads();
  const int64_t sp = a.score_ptr[r];
  for (int x = tid; x < a.chunk * G; x += kTermThreads) {
    const int pi = x / G, h = x % G;
    if (i0 + pi >= n) continue;
    double e = 0;
    for (int j = 0; j < J; ++j)
      for (int s = 0; s < hpt; ++s) {
        const int t = pi * J + j;
        const double v = xs[t * hpt + s];
        if (v != -INFINITY && head_of(t, s) == h) e += exp(v - hm[h]);
      }
    a.epage[(sp + i0 + pi) * G + h] = e;
  }
}

// Grid (⌈max_pages / 256⌉, rows): each CTA merges the row's chunks per head itself (a few hundred
// values) and scores 256 of the row's pages, so a long row is spread over many SMs.
__global__ void __launch_bounds__(kScoreThreads) scores_kernel(SelArgs a) {
  __shared__ double M[kMaxGroup], Z[kMaxGroup];
  __shared__ int scored[kMaxGroup];
  __shared__ int heads;
  const int64_t r = blockIdx.y;
  const int n = a.visible[r], G = a.G, chunks = (n + a.chunk - 1) / a.chunk;
  const int i = int(blockIdx.x) * kScoreThreads + int(threadIdx.x);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (int(blockIdx.x) * kScoreThreads >= n) return;
  const double* cm = a.chunk_m + r * a.chunks * G;
  const double* cz = a.chunk_z + r * a.chunks * G;
  // Per head, a warp: the chunks merged, M = max m_c, Z = Σ z_c · exp(m_c − M).
  for (int h = warp; h < G; h += kScoreThreads / 32) {
    double m = -INFINITY;
    bool any = false;
    for (int c = lane; c < chunks; c += 32)
      if (cz[c * G + h] >= 0) {
        any = true;
        m = fmax(m, cm[c * G + h]);
      }
    m = warp_max(m);
    any = __any_sync(0xffffffffu, any);
    double z = 0;
    for (int c = lane; c < chunks; c += 32)
      if (cz[c * G + h] > 0) z += cz[c * G + h] * exp(cm[c * G + h] - m);
    z = warp_sum(z);
    if (lane == 0) {
      M[h] = m;
      Z[h] = z;
      scored[h] = any;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int k = 0;
    for (int h = 0; h < G; ++h) k += scored[h];
    heads = k;
  }
  __syncthreads();
  if (i >= n) return;
  const int64_t sp = a.score_ptr[r];
  const int c = i / a.chunk;
  double sum = 0;
  for (int h = 0; h < G; ++h) {
    if (!scored[h]) continue;
    const double e = a.epage[(sp + i) * G + h];
    double w = e > 0 ? e * exp(cm[c * G + h] - M[h]) : e;
    if (Z[h] > 0) w /= Z[h];
    sum += w;
  }
  a.scores[sp + i] = heads > 0 ? float(sum / heads) : 0.f;
}

// A CTA per row: the forced pages OR-ed into the selection's flags, the kept count and mass. The
// CTA that finishes last (a ticket taken after its row is written) scans the counts into row_ptr,
// and leaves the ticket at 0 for the next call.
__global__ void __launch_bounds__(kRowThreads) forced_kernel(SelArgs a) {
  using Reduce = cub::BlockReduce<double, kRowThreads>;
  using Count = cub::BlockReduce<int, kRowThreads>;
  using Scan = cub::BlockScan<int, kRowThreads>;
  __shared__ union {
    typename Reduce::TempStorage reduce;
    typename Count::TempStorage count;
    typename Scan::TempStorage scan;
  } tmp;
  __shared__ bool last;
  __shared__ int carry;
  const int64_t r = blockIdx.x;
  const int n = a.visible[r], lo = a.page_lo[r];
  const int64_t sp = a.score_ptr[r];
  int count = 0;
  double mass = 0;
  for (int i = threadIdx.x; i < n; i += kRowThreads) {
    const bool f = a.keep[sp + i] != 0 || lo + i < a.sink_pages || i >= n - a.recent_pages;
    a.keep[sp + i] = f;
    count += f;
    if (f) mass += double(a.scores[sp + i]);
  }
  mass = Reduce(tmp.reduce).Sum(mass);
  __syncthreads();
  count = Count(tmp.count).Sum(count);
  if (threadIdx.x == 0) {
    a.counts[r] = count;
    a.kept_mass[r] = float(mass);
    __threadfence();
    last = atomicAdd(a.done, 1u) == unsigned(a.rows) - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  for (int64_t base = 0; base < a.rows; base += kRowThreads) {
    const int64_t x = base + threadIdx.x;
    int ex = 0, total = 0;
    Scan(tmp.scan).ExclusiveSum(x < a.rows ? __ldcg(a.counts + x) : 0, ex, total);
    if (x < a.rows) a.row_ptr[x] = carry + ex;
    __syncthreads();
    if (threadIdx.x == 0) carry += total;
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    a.row_ptr[a.rows] = carry;
    *a.done = 0;
  }
}

// A CTA per row: the kept flags in index order, compacted by a block scan into logical pages.
__global__ void __launch_bounds__(kRowThreads) compact_pages_kernel(SelArgs a) {
  using Scan = cub::BlockScan<int, kRowThreads>;
  __shared__ typename Scan::TempStorage tmp;
  const int64_t r = blockIdx.x;
  const int n = a.visible[r], lo = a.page_lo[r];
  const int64_t sp = a.score_ptr[r];
  int out = a.row_ptr[r];
  for (int base = 0; base < n; base += kRowThreads) {
    const int i = base + int(threadIdx.x);
    const int f = i < n && a.keep[sp + i] != 0;
    int at = 0, total = 0;
    Scan(tmp).ExclusiveSum(f, at, total);
    if (f) a.pages[out + at] = lo + i;
    out += total;
    __syncthreads();  // the scan's storage is reused
  }
}

// The terms kernel's dynamic shared memory limit, raised once to the most any call takes.
void allow_terms_smem() {
  static const bool once = [] {
    check(cudaFuncSetAttribute(terms_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kMaxTermsSmem)),
          "shared memory attribute");
    return true;
  }();
  (void)once;
}

}  // namespace

struct CudaPageSelection::Device {
  int64_t rows = 0;
  int max_pages = 0, group = 0;
  DeviceBuffer visible, page_lo, score_ptr, tau, epage, chunk_m, chunk_z, scores, keep, counts, row_ptr, pages,
      kept_mass, step, done;
};

CudaPageSelection::CudaPageSelection() = default;
CudaPageSelection::~CudaPageSelection() { delete dev_; }
CudaPageSelection::CudaPageSelection(CudaPageSelection&& o) noexcept
    : rows_(o.rows_), kv_heads_(o.kv_heads_), dev_(std::exchange(o.dev_, nullptr)) {}
CudaPageSelection& CudaPageSelection::operator=(CudaPageSelection&& o) noexcept {
  if (this != &o) {
    delete dev_;
    rows_ = o.rows_;
    kv_heads_ = o.kv_heads_;
    dev_ = std::exchange(o.dev_, nullptr);
  }
  return *this;
}

void CudaPageSelection::reserve(int64_t rows, int max_pages, int group) {
  ARIADNE_CHECK(rows >= 0 && rows <= 65535, "CudaPageSelection: ", rows,
                " rows (batch × kv_heads), expected at most 65535 (a grid row of the terms kernel each)");
  ARIADNE_CHECK(max_pages >= 0 && max_pages <= cuda::kMaxSelectBlocks, "CudaPageSelection: ", max_pages,
                " pages per sequence, the device selection holds rows of at most ", cuda::kMaxSelectBlocks,
                " pages (raise the page size)");
  ARIADNE_CHECK(group >= 1 && group <= kMaxGroup, "CudaPageSelection: a GQA group of ", group,
                " query heads, expected 1 … ", kMaxGroup);
  if (!dev_) {
    dev_ = new Device;
    dev_->step = DeviceBuffer(DType::f64, {2});
    check(cudaMemset(dev_->step.data(), 0, 16), "step counter");
    dev_->done = bytes_buffer(4);
    check(cudaMemset(dev_->done.data(), 0, 4), "ticket");
  }
  Device& d = *dev_;
  if (rows <= d.rows && max_pages <= d.max_pages && group <= d.group) return;
  const int64_t R = std::max(rows, d.rows);
  const int Pm = std::max({max_pages, d.max_pages, 1}), G = std::max(group, d.group);
  const int64_t cells = R * Pm;
  d.visible = bytes_buffer(size_t(R) * 4);
  d.page_lo = bytes_buffer(size_t(R) * 4);
  d.score_ptr = bytes_buffer(size_t(R + 1) * 8);
  d.tau = bytes_buffer(size_t(R) * 8);
  d.epage = bytes_buffer(size_t(cells) * G * 8);
  d.chunk_m = bytes_buffer(size_t(R) * chunks_of(Pm) * G * 8);
  d.chunk_z = bytes_buffer(size_t(R) * chunks_of(Pm) * G * 8);
  d.scores = bytes_buffer(size_t(cells) * 4);
  d.keep = bytes_buffer(size_t(cells));
  d.counts = bytes_buffer(size_t(R + 1) * 4);
  d.row_ptr = bytes_buffer(size_t(R + 1) * 4);
  d.pages = bytes_buffer(size_t(cells) * 4);
  d.kept_mass = bytes_buffer(size_t(R) * 4);
  d.rows = R;
  d.max_pages = Pm;
  d.group = G;
}

namespace {
// A selection's device buffers, once select_pages has written one.
const CudaPageSelection::Device& written(const CudaPageSelection::Device* d, int64_t rows) {
  ARIADNE_CHECK(d != nullptr && rows > 0, "CudaPageSelection: no selection written yet");
  return *d;
}
}  // namespace

const int32_t* CudaPageSelection::row_ptr() const {
  return static_cast<const int32_t*>(written(dev_, rows_).row_ptr.data());
}
const int32_t* CudaPageSelection::pages() const { return static_cast<const int32_t*>(written(dev_, rows_).pages.data()); }
const int32_t* CudaPageSelection::visible() const {
  return static_cast<const int32_t*>(written(dev_, rows_).visible.data());
}
const float* CudaPageSelection::kept_mass() const {
  return static_cast<const float*>(written(dev_, rows_).kept_mass.data());
}

void CudaPageSelection::reset_step(int64_t step) {
  if (!dev_) reserve(0, 0, 1);
  const long long v = step;
  check(cudaMemcpy(dev_->step.data(), &v, sizeof v, cudaMemcpyHostToDevice), "step counter");
}

PageSelection CudaPageSelection::to_host() const {
  PageSelection s;
  s.kv_heads = kv_heads_;
  if (rows_ == 0) {
    s.row_ptr.push_back(0);
    return s;
  }
  check(cudaDeviceSynchronize(), "waiting for the selection");
  s.row_ptr.resize(size_t(rows_) + 1);
  dev_->row_ptr.copy_to_host(s.row_ptr.data(), s.row_ptr.size() * 4);
  s.pages.resize(size_t(s.row_ptr.back()));
  if (!s.pages.empty()) dev_->pages.copy_to_host(s.pages.data(), s.pages.size() * 4);
  s.visible.resize(size_t(rows_));
  dev_->visible.copy_to_host(s.visible.data(), s.visible.size() * 4);
  s.kept_mass.resize(size_t(rows_));
  dev_->kept_mass.copy_to_host(s.kept_mass.data(), s.kept_mass.size() * 4);
  return s;
}

namespace decode_detail {

void select_cuda(const DecodeParams& p, const PageSelectConfig& cfg, CudaPageSelection::Device& d) {
  const CudaKVCache& cache = *p.device_cache;
  const KVCacheConfig& c = cache.config();
  const int64_t B = p.q.shape[0], rows = B * c.kv_heads;
  const int G = int(p.q.shape[1]) / c.kv_heads;
  const bool quest = cfg.scorer == PageScorer::quest;
  ARIADNE_CHECK(c.head_dim % 4 == 0 && c.head_dim <= 128, "select_pages (cuda): head dim ", c.head_dim,
                ", expected a multiple of 4 up to 128");
  const auto stream = static_cast<cudaStream_t>(p.stream);
  SelArgs a{};
  a.sum = cache.key_sum();
  a.mn = cache.key_min();
  a.mx = cache.key_max();
  a.table = cache.block_table();
  a.max_pages = cache.max_pages();
  a.lengths = cache.lengths();
  a.q = p.q.data;
  a.q_sb = p.q.stride[0];
  a.q_sh = p.q.stride[1];
  a.bf16 = p.q.dtype == DType::bf16;
  a.Hkv = c.kv_heads;
  a.G = G;
  a.d = c.head_dim;
  a.P = c.page_size;
  a.S = c.summary_stride;
  a.J = quest ? 1 : c.page_size / c.summary_stride;
  a.hpt = quest || !cfg.rotate ? G : 1;
  a.chunks = chunks_of(d.max_pages);
  a.quest = quest;
  a.rotate = cfg.rotate;
  a.advance = cfg.advance_step;
  a.window = p.window;
  a.step = cfg.step;
  a.scale = double(p.scale > 0 ? p.scale : 1.f / std::sqrt(float(c.head_dim)));
  a.log_s = std::log(double(c.summary_stride));
  a.tau = cfg.tau;
  a.sink_pages = cfg.sink_pages;
  a.recent_pages = cfg.recent_pages;
  a.rows = rows;
  a.visible = static_cast<int32_t*>(d.visible.data());
  a.page_lo = static_cast<int32_t*>(d.page_lo.data());
  a.score_ptr = static_cast<int64_t*>(d.score_ptr.data());
  a.tau_rows = static_cast<double*>(d.tau.data());
  a.step_ctr = static_cast<long long*>(d.step.data());
  a.epage = static_cast<double*>(d.epage.data());
  a.chunk_m = static_cast<double*>(d.chunk_m.data());
  a.chunk_z = static_cast<double*>(d.chunk_z.data());
  a.scores = static_cast<float*>(d.scores.data());
  a.keep = static_cast<uint8_t*>(d.keep.data());
  a.counts = static_cast<int32_t*>(d.counts.data());
  a.row_ptr = static_cast<int32_t*>(d.row_ptr.data());
  a.pages = static_cast<int32_t*>(d.pages.data());
  a.kept_mass = static_cast<float*>(d.kept_mass.data());
  a.done = static_cast<unsigned*>(d.done.data());

  // Sequence ids: device memory as given (nothing uploaded: a graph can capture the call), or
  // copied per call as decode_cuda does.
  DeviceBuffer ids;
  if (!p.device_seqs) ids = upload_ints(p.seqs.data(), size_t(B), p.stream);
  a.seqs = p.device_seqs ? p.device_seqs : static_cast<const int32_t*>(ids.data());

  geometry_kernel<<<1, kGeometryThreads, 0, stream>>>(a);
  check(cudaGetLastError(), "geometry launch");
  const auto terms_smem = [&](int chunk) {
    return (size_t(G) * a.d + size_t(chunk) * a.J * a.hpt + G) * sizeof(double);
  };
  // 16 pages a terms CTA once 8 would give eight CTAs or more per SM: each CTA's fixed phases (the
  // queries, the per-head reductions) then weigh half as much, while short rows keep the CTAs that
  // fill the GPU.
  a.chunk = rows * a.chunks >= 8 * int64_t(sm_count()) && terms_smem(kMaxChunk) <= kMaxTermsSmem ? kMaxChunk
                                                                                                : kMinChunk;
  const size_t smem = terms_smem(a.chunk);
  ARIADNE_CHECK(smem <= kMaxTermsSmem, "select_pages (cuda): a group of ", G, " query heads with ", a.J,
                " key strides a page needs ", smem, " bytes of shared memory per CTA, more than 200 KiB (raise ",
                "summary_stride or use rotate)");
  if (rows > 0 && a.chunks > 0) {
    allow_terms_smem();
    terms_kernel<<<dim3(unsigned((d.max_pages + a.chunk - 1) / a.chunk), unsigned(rows)), kTermThreads, smem,
                   stream>>>(a);
    check(cudaGetLastError(), "terms launch");
    scores_kernel<<<dim3(unsigned((d.max_pages + kScoreThreads - 1) / kScoreThreads), unsigned(rows)), kScoreThreads,
                    0, stream>>>(a);
    check(cudaGetLastError(), "scores launch");
  }
  const cuda::RowSelectParams s{a.score_ptr, a.scores, a.tau_rows, a.keep, a.counts};
  check(cuda::launch_select_rows(s, rows, std::max(d.max_pages, 1), stream), "select launch");
  if (rows == 0) return;
  forced_kernel<<<unsigned(rows), kRowThreads, 0, stream>>>(a);
  check(cudaGetLastError(), "forced launch");
  compact_pages_kernel<<<unsigned(rows), kRowThreads, 0, stream>>>(a);
  check(cudaGetLastError(), "compact launch");
}

}  // namespace decode_detail

}  // namespace ariadne
