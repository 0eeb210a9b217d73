// FlexPrefill on the device (estimate.hpp, Estimator::flexprefill). The rule is the CPU estimator's
// (src/estimate/cpu/flexprefill.cpp states it and docs/rrattention.md its deviations from the
// release); the stages, all on the device, in stream order:
//
//   kbar       the mean key of every key block, [heads_kv, total_kb, d] f32
//   map        per query block and KV group: the group's mean queries q̄_m (scaled) against K̄ of
//              every visible block, softmax per row: the result's scores (every sequence)
//   probe      the last B queries of a probed sequence against all its keys, exact causal softmax,
//              in two passes over key chunks of 64 (one CTA per chunk and KV head, the group's
//              query heads in turn, so each key chunk is read once per group): row maxima and sums
//              per chunk, merged per row; then the probabilities, whose column sums are the
//              vertical scores and whose diagonal sums per chunk are merged into the slash scores
//   decide     per (probed sequence, query head): pooled scores, the γ budgets, the JS test, the
//              top vertical blocks and slash bins
//   aware      query-aware heads: the map's entries by descending value up to γ·rows, block (0, 0)
//   assemble   per row: the kept flags (vertical ∪ slash ∪ query-aware, dense for short inputs,
//              protections) and their count; the caller scans and compacts them into the CSR
//
// Selections without a sort. "The largest entries, in order, while their running sum stays <=
// target" (the γ budgets and the query-aware selection) is found by bisection on the f32 bit
// pattern, which orders non-negative floats: the smallest pattern T whose strictly larger entries
// sum to <= target; those entries are kept, and of the entries equal to T as many as still fit
// (in index order, as the CPU's stable sort takes ties). The top-n block choices rank each block
// against every other (ties to the smaller index). Every sum has a fixed order (block reductions
// are trees, the chunk partials are merged in chunk order), so a call is bitwise reproducible.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "estimate/cuda/estimate.cuh"
#include "estimate/cuda/score_common.cuh"

namespace ariadne::cuda {
namespace {

constexpr int kQT = 64;             // probe rows per tile
constexpr int kPitch = 68;          // transposed operand tiles: d rows of 64 (+4 pad) floats
constexpr int kPsPitch = 65;        // probability tile [64][65]
constexpr int kProbeThreads = 256;  // 16 × 16 threads, 4 × 4 logits each
constexpr int kDecideThreads = 512;

__device__ __forceinline__ float q_at(const FlexParams& p, int64_t token, int h, int u) {
  return load_elem(p.q, token * p.q_tok + int64_t(h) * p.q_head + u, p.dtype);
}
__device__ __forceinline__ float k_at(const FlexParams& p, int64_t token, int kh, int u) {
  return load_elem(p.k, token * p.k_tok + int64_t(kh) * p.k_head + u, p.dtype);
}

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the CTA, the same value in every thread (a butterfly per warp, then the warps' sums
// in warp order). `red` holds 32 entries; the CTA's threads all call it.
template <typename T>
__device__ T block_sum(T v, T* red) {
  v = warp_sum(v);
  const int warp = threadIdx.x / 32, nw = blockDim.x / 32;
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[warp] = v;
  __syncthreads();
  T s = 0;
  for (int w = 0; w < nw; ++w) s += red[w];
  return s;
}

__device__ double block_max(double v, double* red) {
  for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x / 32, nw = blockDim.x / 32;
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[warp] = v;
  __syncthreads();
  double m = -INFINITY;
  for (int w = 0; w < nw; ++w) m = fmax(m, red[w]);
  return m;
}

// How many `flag`s are set in the CTA's threads before this one (thread order), and in all of
// them (`total`). `red` holds 32 entries.
__device__ long long block_exclusive_count(bool flag, long long& total, long long* red) {
  const unsigned ballot = __ballot_sync(0xffffffffu, flag);
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, nw = blockDim.x / 32;
  __syncthreads();
  if (lane == 0) red[warp] = __popc(ballot);
  __syncthreads();
  long long before = __popc(ballot & ((1u << lane) - 1u));
  total = 0;
  for (int w = 0; w < nw; ++w) {
    if (w < warp) before += red[w];
    total += red[w];
  }
  return before;
}

// The kept prefix of x[0, n) (non-negative) sorted by descending value, ties in index order, whose
// running sum stays <= target: every entry whose bit pattern is above `bits`, and the first `ties`
// entries equal to it (bits == 0: every entry; the zeros add nothing to the sum).
struct Cut {
  uint32_t bits;
  long long above, ties;
};

__device__ Cut cut_of(const float* x, int64_t n, double target, double* red_d, long long* red_i) {
  uint32_t lo = 0, hi = 0x7f800000u;
  while (lo < hi) {
    const uint32_t mid = lo + (hi - lo) / 2;
    double f = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const float v = x[i];
      if (__float_as_uint(v) > mid) f += v;
    }
    if (block_sum(f, red_d) <= target) hi = mid;
    else lo = mid + 1;
  }
  double f = 0;
  long long above = 0, eq = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = x[i];
    const uint32_t u = __float_as_uint(v);
    if (u > lo) {
      f += v;
      ++above;
    } else if (u == lo) {
      ++eq;
    }
  }
  f = block_sum(f, red_d);
  above = block_sum(above, red_i);
  eq = block_sum(eq, red_i);
  Cut c{lo, above, eq};
  if (lo != 0) c.ties = min(eq, (long long)floor((target - f) / double(__uint_as_float(lo))));
  return c;
}

// 1 + the number of leading entries of x sorted by descending value whose running sum is <= γ.
__device__ int64_t cover_count(const float* x, int64_t n, double gamma, double* red_d, long long* red_i) {
  const Cut c = cut_of(x, n, gamma, red_d, red_i);
  return c.above + c.ties + 1;
}

__global__ void kbar_kernel(FlexParams p) {
  const int64_t gkb = blockIdx.x;
  const int kh = blockIdx.y;
  const FlexSeq e = p.seqs[p.kb_seq[gkb]];
  const int64_t j0 = (gkb - e.kb_base) * p.block, j1 = min(e.lk, j0 + p.block);
  for (int u = threadIdx.x; u < p.d; u += blockDim.x) {
    float s = 0;
    for (int64_t j = j0; j < j1; ++j) s += k_at(p, e.k0 + j, kh, u);
    p.kbar[(int64_t(kh) * p.total_kb + gkb) * p.d + u] = s / float(j1 - j0);
  }
}

// One CTA per (query block, KV head): the group's mean queries, their logits against every
// visible K̄ (a warp per key block), then a warp per head turns its row into a softmax in place.
__global__ void map_kernel(FlexParams p) {
  extern __shared__ float qbar[];  // [group][d]
  const int64_t gb = blockIdx.x;
  const int kh = blockIdx.y;
  const FlexSeq e = p.seqs[p.qb_seq[gb]];
  const int64_t m = p.qb_m[gb];
  const int64_t i0 = m * p.block, n = min(e.lq, i0 + p.block) - i0;
  const int nvis = int((i0 + n - 1 + e.off) / p.block + 1);
  for (int x = threadIdx.x; x < p.group * p.d; x += blockDim.x) {
    const int g = x / p.d, u = x % p.d;
    float s = 0;
    for (int64_t i = 0; i < n; ++i) s += q_at(p, e.q0 + i0 + i, kh * p.group + g, u) * p.scale;
    qbar[x] = s / float(n);
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, nw = blockDim.x / 32;
  const float* kb = p.kbar + (int64_t(kh) * p.total_kb + e.kb_base) * p.d;
  const auto row_scores = [&](int g) {
    return p.scores + p.score_ptr[e.row_base + int64_t(kh * p.group + g) * e.nqb + m];
  };
  for (int cb = warp; cb < nvis; cb += nw)
    for (int g = 0; g < p.group; ++g) {
      float s = 0;
      for (int u = lane; u < p.d; u += 32) s += qbar[g * p.d + u] * kb[int64_t(cb) * p.d + u];
      s = warp_sum(s);
      if (lane == 0) row_scores(g)[cb] = s;
    }
  __syncthreads();
  for (int g = warp; g < p.group; g += nw) {
    float* z = row_scores(g);
    float mx = -INFINITY;
    for (int c = lane; c < nvis; c += 32) mx = fmaxf(mx, z[c]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0;
    for (int c = lane; c < nvis; c += 32) sum += expf(z[c] - mx);
    sum = warp_sum(sum);
    for (int c = lane; c < nvis; c += 32) z[c] = expf(z[c] - mx) / sum;
  }
}

// The probe, one CTA per (key chunk, KV head). kProb false: each probe row's (max, Σexp) over the
// chunk; true: the probabilities, their column sums (vertical scores, one CTA owns each key) and
// their diagonal sums (partials of the slash scores, merged across chunks by slash_kernel).
// Logits are 64 × 64 tiles, f32 on the CUDA cores, operands transposed in shared memory.
template <bool kProb>
__global__ void __launch_bounds__(kProbeThreads) probe_kernel(FlexParams p) {
  extern __shared__ float sm[];
  const int64_t gc = blockIdx.x;
  const int kh = blockIdx.y;
  const FlexSeq e = p.seqs[p.ch_seq[gc]];
  const int L = p.block, lpad = (L + kQT - 1) / kQT * kQT, W = L + kFlexChunk - 1;
  const int64_t j0 = int64_t(gc - e.ch_base) * kFlexChunk, P0 = e.lk - L;
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  float* ks = sm;                     // [d][kPitch]
  float* qs = ks + p.d * kPitch;      // [d][kPitch]
  float* ps = qs + p.d * kPitch;      // [64][kPsPitch]
  float* colsum = ps + kQT * kPsPitch;  // [64]
  float* sacc = colsum + kFlexChunk;    // [lpad + 63]
  for (int x = tid; x < kFlexChunk * p.d; x += kProbeThreads) {
    const int jj = x / p.d, u = x % p.d;
    const int64_t j = j0 + jj;
    ks[u * kPitch + jj] = j < e.lk ? k_at(p, e.k0 + j, kh, u) : 0.f;
  }
  for (int g = 0; g < p.group; ++g) {
    const int h = kh * p.group + g;
    if (kProb) {
      for (int x = tid; x < kFlexChunk; x += kProbeThreads) colsum[x] = 0.f;
      for (int x = tid; x < lpad + kFlexChunk - 1; x += kProbeThreads) sacc[x] = 0.f;
    }
    for (int t0 = 0; t0 < L; t0 += kQT) {
      __syncthreads();
      for (int x = tid; x < kQT * p.d; x += kProbeThreads) {
        const int tt = x / p.d, u = x % p.d;
        qs[u * kPitch + tt] = t0 + tt < L ? q_at(p, e.q0 + e.lq - L + t0 + tt, h, u) * p.scale : 0.f;
      }
      __syncthreads();
      float acc[4][4] = {};
      for (int u = 0; u < p.d; ++u) {
        const float4 a = *reinterpret_cast<const float4*>(qs + u * kPitch + ty * 4);
        const float4 b = *reinterpret_cast<const float4*>(ks + u * kPitch + tx * 4);
        const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[r][c] = fmaf(av[r], bv[c], acc[r][c]);
      }
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int t = t0 + ty * 4 + r;
        bool ok[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) ok[c] = t < L && j0 + tx * 4 + c <= P0 + t;
        if (!kProb) {
          float mx = -INFINITY;
#pragma unroll
          for (int c = 0; c < 4; ++c)
            if (ok[c]) mx = fmaxf(mx, acc[r][c]);
          for (int o = 8; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
          float s = 0;
#pragma unroll
          for (int c = 0; c < 4; ++c)
            if (ok[c]) s += expf(acc[r][c] - mx);
          for (int o = 8; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
          if (tx == 0 && t < L) p.part[(int64_t(h) * p.total_ch + gc) * L + t] = make_float2(mx, s);
        } else {
          const float2 st = t < L ? p.stat[(int64_t(h) * p.num_probe + e.probe) * L + t] : make_float2(0.f, 1.f);
#pragma unroll
          for (int c = 0; c < 4; ++c)
            ps[(ty * 4 + r) * kPsPitch + tx * 4 + c] = ok[c] ? expf(acc[r][c] - st.x) / st.y / float(L) : 0.f;
        }
      }
      if (kProb) {
        __syncthreads();
        if (tid < kFlexChunk) {
          float s = 0;
          for (int tt = 0; tt < kQT; ++tt) s += ps[tt * kPsPitch + tid];
          colsum[tid] += s;
        }
        // Diagonal dd = tt − jj + 63 of the tile is entry t0 + dd of the chunk's diagonals
        // u = t − jj + 63 (distance P0 + t − j = P0 − j0 + u − 63).
        for (int dd = tid; dd < kQT + kFlexChunk - 1; dd += kProbeThreads) {
          float s = 0;
          for (int tt = max(0, dd - (kFlexChunk - 1)); tt < min(kQT, dd + 1); ++tt)
            s += ps[tt * kPsPitch + tt - dd + kFlexChunk - 1];
          sacc[t0 + dd] += s;
        }
      }
    }
    if (kProb) {
      __syncthreads();
      if (tid < kFlexChunk && j0 + tid < e.lk) p.vert[int64_t(h) * p.total_k + e.k0 + j0 + tid] = colsum[tid];
      for (int x = tid; x < W; x += kProbeThreads) p.slash_part[(int64_t(h) * p.total_ch + gc) * W + x] = sacc[x];
      __syncthreads();
    }
  }
}

// Each probe row's (max, Σexp) from its chunks', in chunk order.
__global__ void stat_kernel(FlexParams p) {
  const int pi = blockIdx.x, h = blockIdx.y, L = p.block;
  const FlexSeq e = p.seqs[p.probe_seq[pi]];
  const float2* part = p.part + (int64_t(h) * p.total_ch + e.ch_base) * L;
  for (int t = threadIdx.x; t < L; t += blockDim.x) {
    float mx = -INFINITY;
    for (int c = 0; c < e.nch; ++c) mx = fmaxf(mx, part[int64_t(c) * L + t].x);
    float s = 0;
    for (int c = 0; c < e.nch; ++c) {
      const float2 v = part[int64_t(c) * L + t];
      if (v.y > 0) s += v.y * expf(v.x - mx);
    }
    p.stat[(int64_t(h) * p.num_probe + pi) * L + t] = make_float2(mx, s);
  }
}

__device__ __forceinline__ int64_t ceil_div_signed(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }

// slash[δ] of every distance δ < lk: the chunk partials that hold it, in chunk order.
__global__ void slash_kernel(FlexParams p) {
  const int pi = blockIdx.y, h = blockIdx.z, L = p.block, W = L + kFlexChunk - 1;
  const FlexSeq e = p.seqs[p.probe_seq[pi]];
  const int64_t delta = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (delta >= e.lk) return;
  const int64_t P0 = e.lk - L;
  // Chunk c holds δ at u = δ − P0 + 64c + 63 when 0 <= u < W.
  const int64_t c_lo = max(int64_t(0), ceil_div_signed(P0 - delta - (kFlexChunk - 1), kFlexChunk));
  const int64_t c_hi = min(int64_t(e.nch) - 1, (e.lk - delta - 1) / kFlexChunk);
  float s = 0;
  for (int64_t c = c_lo; c <= c_hi; ++c)
    s += p.slash_part[(int64_t(h) * p.total_ch + e.ch_base + c) * W + delta - P0 + c * kFlexChunk + kFlexChunk - 1];
  p.slash[int64_t(h) * p.total_k + e.k0 + delta] = s;
}

// Per (probed sequence, query head): pooled scores, the budgets, the head's kind, the top blocks.
__global__ void __launch_bounds__(kDecideThreads) decide_kernel(FlexParams p) {
  extern __shared__ double dsm[];
  __shared__ double red_d[32];
  __shared__ long long red_i[32];
  const int pi = blockIdx.x, h = blockIdx.y, kh = h / p.group, L = p.block;
  const FlexSeq e = p.seqs[p.probe_seq[pi]];
  const int nkb = e.nkb, tid = threadIdx.x, nt = blockDim.x;
  double* vp = dsm;             // [nkb]
  double* sp = vp + nkb;        // [nkb]
  double* est = sp + nkb;       // [nkb]
  double* qmean = est + nkb;    // [d]
  const float* vert = p.vert + int64_t(h) * p.total_k + e.k0;
  const float* slash = p.slash + int64_t(h) * p.total_k + e.k0;
  for (int cb = tid; cb < nkb; cb += nt) {
    double v = 0, s = 0;
    for (int64_t j = int64_t(cb) * p.block; j < min(e.lk, int64_t(cb + 1) * p.block); ++j) {
      v += vert[j];
      s += slash[j];
    }
    vp[cb] = v;
    sp[cb] = s;
  }
  for (int u = tid; u < p.d; u += nt) {
    double s = 0;
    for (int t = 0; t < L; ++t) s += double(q_at(p, e.q0 + e.lq - L + t, h, u) * p.scale);
    qmean[u] = s / double(L);
  }
  __syncthreads();
  // The pooled estimate softmax(q̄_probe · K̄ᵀ) over every key block.
  const int warp = tid / 32, lane = tid & 31;
  const float* kb = p.kbar + (int64_t(kh) * p.total_kb + e.kb_base) * p.d;
  for (int cb = warp; cb < nkb; cb += nt / 32) {
    double s = 0;
    for (int u = lane; u < p.d; u += 32) s += qmean[u] * double(kb[int64_t(cb) * p.d + u]);
    s = warp_sum(s);
    if (lane == 0) est[cb] = s;
  }
  __syncthreads();
  double mx = -INFINITY;
  for (int cb = tid; cb < nkb; cb += nt) mx = fmax(mx, est[cb]);
  mx = block_max(mx, red_d);
  double z = 0;
  for (int cb = tid; cb < nkb; cb += nt) z += exp(est[cb] - mx);
  z = block_sum(z, red_d);
  double js = 0;
  for (int cb = tid; cb < nkb; cb += nt) {
    const double a = exp(est[cb] - mx) / z, b = vp[cb], mid = 0.5 * (a + b);
    if (a > 0) js += 0.5 * a * log(a / mid);
    if (b > 0) js += 0.5 * b * log(b / mid);
  }
  js = sqrt(fmax(block_sum(js, red_d), 0.0));
  const bool aware = js < p.js_tau;
  const int64_t maxb = min(int64_t(nkb), p.max_blocks), minb = min(p.min_blocks, maxb);
  const auto budget = [&](const float* x) {
    return min(max(cover_count(x, e.lk, p.gamma, red_d, red_i) / p.block + 1, minb), maxb);
  };
  int64_t nv = budget(vert), ns = budget(slash);
  if (aware) nv = ns = minb;
  __syncthreads();
  if (tid == 0) vp[0] = sp[0] = INFINITY;  // column 0 and the diagonal, always
  __syncthreads();
  uint8_t* vsel = p.vsel + int64_t(h) * p.total_kb + e.kb_base;
  uint8_t* ssel = p.ssel + int64_t(h) * p.total_kb + e.kb_base;
  for (int cb = tid; cb < nkb; cb += nt) {
    int64_t rv = 0, rs = 0;
    for (int c = 0; c < nkb && (rv < nv || rs < ns); ++c) {
      rv += vp[c] > vp[cb] || (vp[c] == vp[cb] && c < cb);
      rs += sp[c] > sp[cb] || (sp[c] == sp[cb] && c < cb);
    }
    vsel[cb] = rv < nv;
    ssel[cb] = rs < ns;
  }
  if (tid == 0) {
    float* info = p.head_info + (int64_t(h) * p.num_probe + pi) * 4;
    info[0] = float(js);
    info[1] = aware ? 1.f : 0.f;
    info[2] = float(nv);
    info[3] = float(ns);
  }
}

// Query-aware heads: the map's entries (the head's rows, contiguous in scores) by descending value
// while the running sum stays <= γ · rows, ties in row-major order; block (0, 0) always.
__global__ void __launch_bounds__(kDecideThreads) aware_kernel(FlexParams p) {
  __shared__ double red_d[32];
  __shared__ long long red_i[32];
  const int pi = blockIdx.x, h = blockIdx.y;
  if (p.head_info[(int64_t(h) * p.num_probe + pi) * 4 + 1] == 0.f) return;
  const FlexSeq e = p.seqs[p.probe_seq[pi]];
  const int64_t r0 = e.row_base + int64_t(h) * e.nqb, b = p.score_ptr[r0], n = p.score_ptr[r0 + e.nqb] - b;
  const float* x = p.scores + b;
  const Cut c = cut_of(x, n, p.gamma * double(e.nqb), red_d, red_i);
  long long seen = 0;
  for (int64_t base = 0; base < n; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    const uint32_t u = i < n ? __float_as_uint(x[i]) : 0u;
    const bool tie = i < n && u == c.bits;
    long long total = 0;
    const long long before = block_exclusive_count(tie, total, red_i);
    if (i < n && (u > c.bits || (tie && seen + before < c.ties))) p.keep[b + i] = 1;
    seen += total;
  }
  if (threadIdx.x == 0) p.keep[b] = 1;
}

// Per row (a warp each): the kept flags and their count.
__global__ void assemble_kernel(FlexParams p) {
  const int64_t gb = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int h = blockIdx.y, lane = threadIdx.x & 31;
  if (gb >= p.total_qb) return;
  const FlexSeq e = p.seqs[p.qb_seq[gb]];
  const int64_t m = p.qb_m[gb], row = e.row_base + int64_t(h) * e.nqb + m;
  const int64_t sp = p.score_ptr[row];
  const int nvis = int(p.score_ptr[row + 1] - sp);
  const bool all = e.probe < 0 || (p.last_row && m == e.nqb - 1);
  const uint8_t* vsel = p.vsel + int64_t(h) * p.total_kb + e.kb_base;
  const uint8_t* ssel = p.ssel + int64_t(h) * p.total_kb + e.kb_base;
  int count = 0;
  for (int base = 0; base < nvis; base += 32) {
    const int c = base + lane;
    bool k = false;
    if (c < nvis) {
      k = all || p.keep[sp + c] != 0 || (p.sink && c == 0) || (p.diagonal && c == nvis - 1);
      if (!k && e.probe >= 0) k = vsel[c] != 0 || ssel[nvis - 1 - c] != 0;
      p.keep[sp + c] = k;
    }
    count += __popc(__ballot_sync(0xffffffffu, k));
  }
  if (lane == 0) p.counts[row] = count;
}

size_t probe_smem(int d, int block) {
  const int lpad = (block + kQT - 1) / kQT * kQT;
  return size_t(2 * d * kPitch + kQT * kPsPitch + kFlexChunk + lpad + kFlexChunk - 1) * sizeof(float);
}
size_t decide_smem(int max_nkb, int d) { return size_t(3 * max_nkb + d) * sizeof(double); }

}  // namespace

std::string flexprefill_refusal(int d, int block, int group, size_t smem_optin) {
  if (probe_smem(d, block) > smem_optin)
    return "head_dim " + std::to_string(d) + " and block " + std::to_string(block) +
           ": the FlexPrefill probe needs " + std::to_string(probe_smem(d, block)) + " bytes of shared memory, the device " +
           std::to_string(smem_optin);
  if (decide_smem(kMaxSelectBlocks, d) > smem_optin)
    return "the FlexPrefill decisions need " + std::to_string(decide_smem(kMaxSelectBlocks, d)) +
           " bytes of shared memory, the device " + std::to_string(smem_optin);
  if (size_t(group) * size_t(d) * sizeof(float) > 48 * 1024)
    return "a KV group of " + std::to_string(group) + " heads of dim " + std::to_string(d) +
           ": the FlexPrefill map's mean queries exceed 48 KiB of shared memory";
  return "";
}

cudaError_t launch_flexprefill(const FlexParams& p, FlexStage stage, cudaStream_t st) {
  cudaError_t err = cudaSuccess;
  const auto ok = [&] { return (err = cudaGetLastError()) == cudaSuccess; };
  switch (stage) {
    case FlexStage::sampling: {
      if (p.total_kb > 0) {
        kbar_kernel<<<dim3(unsigned(p.total_kb), unsigned(p.heads_kv)), 128, 0, st>>>(p);
        if (!ok()) return err;
      }
      if (p.num_probe == 0) return cudaSuccess;
      const size_t psm = probe_smem(p.d, p.block);
      for (const void* f : {reinterpret_cast<const void*>(probe_kernel<false>),
                            reinterpret_cast<const void*>(probe_kernel<true>)})
        if ((err = cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, int(psm))) != cudaSuccess)
          return err;
      const dim3 pg(unsigned(p.total_ch), unsigned(p.heads_kv));
      probe_kernel<false><<<pg, kProbeThreads, psm, st>>>(p);
      if (!ok()) return err;
      stat_kernel<<<dim3(unsigned(p.num_probe), unsigned(p.heads_q)), 128, 0, st>>>(p);
      if (!ok()) return err;
      probe_kernel<true><<<pg, kProbeThreads, psm, st>>>(p);
      if (!ok()) return err;
      slash_kernel<<<dim3(unsigned((p.max_lk + 255) / 256), unsigned(p.num_probe), unsigned(p.heads_q)), 256, 0,
                     st>>>(p);
      ok();
      return err;
    }
    case FlexStage::scoring:
      if (p.total_qb == 0) return cudaSuccess;
      map_kernel<<<dim3(unsigned(p.total_qb), unsigned(p.heads_kv)), 256, size_t(p.group) * p.d * sizeof(float),
                   st>>>(p);
      ok();
      return err;
    case FlexStage::selection: {
      if (p.num_probe > 0) {
        const size_t dsm = decide_smem(int((p.max_lk + p.block - 1) / p.block), p.d);
        if ((err = cudaFuncSetAttribute(decide_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(dsm))) !=
            cudaSuccess)
          return err;
        decide_kernel<<<dim3(unsigned(p.num_probe), unsigned(p.heads_q)), kDecideThreads, dsm, st>>>(p);
        if (!ok()) return err;
        aware_kernel<<<dim3(unsigned(p.num_probe), unsigned(p.heads_q)), kDecideThreads, 0, st>>>(p);
        if (!ok()) return err;
      }
      if (p.total_qb > 0) {
        constexpr int warps = 8;
        assemble_kernel<<<dim3(unsigned((p.total_qb + warps - 1) / warps), unsigned(p.heads_q)), warps * 32, 0,
                          st>>>(p);
        ok();
      }
      return err;
    }
  }
  return cudaErrorInvalidValue;
}

}  // namespace ariadne::cuda
