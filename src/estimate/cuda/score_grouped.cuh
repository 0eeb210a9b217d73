// Device helpers of the grouped scoring kernels (score_grouped.cu: mma_grouped; score_wgmma.cu:
// wgmma_exact, wgmma_approximate). A grouped CTA owns G adjacent query blocks of one sequence
// (groups), R = heads_per_cta · B/S rows each (the rows of one mma_rr CTA), listed by the host in
// ScoreParams::group_ctas; each group writes the scratch rows the mma_rr CTA of its query block
// would, so the partials, row sums and block scores are mma_rr's.
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "estimate/cuda/estimate.cuh"
#include "estimate/cuda/score_common.cuh"
#include "device/cuda/mma.cuh"

namespace ariadne::cuda {
namespace {

// The tables of a grouped CTA (in the kernel's shared memory): per group (query block m0 + g) the
// last key stride its rows see, its sampled strides, visible key blocks and partials (the mma_rr
// CTA's scratch rows); per row its last key stride, sampled query and query head (relative to
// head0). lim, qpos, rhead hold kRows entries; glast, gnract, gnvis, gpart kMaxGroups. Ends with
// a barrier. (Scalars and pointers, not references to the arrays: so written, the kernels compile
// to the SASS they have with this code inline.)
template <int kRows, int kMaxGroups>
__device__ __forceinline__ void group_tables(const ScoreParams& p, const EstSeq& e, const int gb0, const int ngroups,
                                             const int64_t m0, const int kvh, const int S, const int nr, const int R,
                                             const int head0, const int heads_here, const int tid, int* lim,
                                             int* qpos, int* rhead, int* glast, int* gnract, int* gnvis,
                                             float2** gpart) {
  if (tid < kMaxGroups) {
    glast[tid] = -1;
    if (tid < ngroups) {
      const int64_t m = m0 + tid;
      const int64_t qlast = min((m + 1) * p.block, e.lq) - 1;
      const int64_t nvis = (qlast + e.off) / p.block + 1;  // visible key blocks: 0 … diag(m)
      gnract[tid] = int(min(int64_t(nr), e.nqs - m * nr));
      gnvis[tid] = int(nvis);
      gpart[tid] =
          p.scratch + p.scratch_base[gb0 + tid] + (int64_t(kvh) * gridDim.z + blockIdx.z) * kScoreRows * nvis;
    }
  }
  __syncthreads();
  // Row r: group r / R, then mma_rr's order inside the group (head-major, nr strides per head).
  if (tid < kRows) {
    const int g = tid / R, rl = tid % R, hl = rl / nr, il = rl % nr;
    int l = -1, pos = 0;
    if (g < ngroups && hl < heads_here && il < gnract[g]) {
      const int64_t i = (m0 + g) * nr + il;
      const int hm = (head0 + hl) % S;
      const int64_t rep = min(i * S + (p.paper ? S - 1 - hm : hm), e.lq - 1);
      pos = int(rep);
      l = int((rep + e.off) / S);
    }
    lim[tid] = l;
    qpos[tid] = pos;
    rhead[tid] = hl;
    if (g < ngroups) atomicMax(&glast[g], l);
  }
  __syncthreads();
}

// The sampled queries of a grouped CTA as a bf16 tile: row r of dst (pitch elements) holds q at
// local position qpos[r], query head head0 + rhead[r], for the rows with lim[r] >= 0; the other
// rows and the columns from d to ncols are zero. bf16 input whose rows start on 16 bytes (d a
// multiple of 8) is copied as 16-byte vectors, eight loads in flight per thread before any store:
// the input's bits, which is what load_elem then __float2bfloat16_rn gives for bf16. One scalar
// load per element, each waited before the next (the other inputs' path), left this copy a fifth
// of the wgmma kernel's stall samples at 32K (docs/design/estimate.md).
template <int kThreads>
__device__ __forceinline__ void stage_q_tile(const ScoreParams& p, const EstSeq& e, const int rows, const int ncols,
                                             const int head0, const int* lim, const int* qpos, const int* rhead,
                                             __nv_bfloat16* dst, const int pitch, const int tid) {
  const bool vec = p.dtype == 1 && p.d % 8 == 0 && ncols % 8 == 0 && pitch % 8 == 0 &&
                   ((reinterpret_cast<uintptr_t>(p.q) | uintptr_t(p.q_tok) * 2 | uintptr_t(p.q_head) * 2) & 15) == 0;
  if (vec) {
    constexpr int kInFlight = 8;
    const int vpr = ncols / 8, nvec = rows * vpr;
    const __nv_bfloat16* q = static_cast<const __nv_bfloat16*>(p.q);
    for (int v0 = tid; v0 < nvec; v0 += kInFlight * kThreads) {
      uint4 x[kInFlight];
#pragma unroll
      for (int i = 0; i < kInFlight; ++i) {
        const int idx = v0 + i * kThreads, r = idx / vpr, t = (idx % vpr) * 8;
        x[i] = make_uint4(0u, 0u, 0u, 0u);
        if (idx < nvec && t < p.d && lim[r] >= 0)
          x[i] = __ldg(reinterpret_cast<const uint4*>(q + (e.q0 + qpos[r]) * p.q_tok + int64_t(head0 + rhead[r]) * p.q_head + t));
      }
#pragma unroll
      for (int i = 0; i < kInFlight; ++i) {
        const int idx = v0 + i * kThreads;
        if (idx < nvec) *reinterpret_cast<uint4*>(dst + (idx / vpr) * pitch + (idx % vpr) * 8) = x[i];
      }
    }
    return;
  }
  for (int idx = tid; idx < rows * ncols; idx += kThreads) {
    const int r = idx / ncols, t = idx % ncols;
    float v = 0.f;
    if (t < p.d && lim[r] >= 0)
      v = load_elem(p.q, (e.q0 + qpos[r]) * p.q_tok + int64_t(head0 + rhead[r]) * p.q_head + t, p.dtype);
    dst[r * pitch + t] = __float2bfloat16_rn(v);
  }
}

// e^x for the row sums and block scores of a grouped CTA: expf in the exact builds (mma_rr's bits), one
// ex2.approx of x·log2 e in the approximate ones (kApprox; relative error ~2^-22 plus |x|·2^-24
// from the scaling, on terms e^x <= 1 here: docs/numerics.md, "Approximate scoring").
template <bool kApprox>
__device__ __forceinline__ float exp_term(float x) {
  if constexpr (kApprox) return ex2(x * 1.4426950408889634f);
  return expf(x);
}

// (m, s) ⊕ (m2, s2) for two (max, Σexp(x − max)) pairs. Exact builds: mma_rr's two expf, in its
// form (their bits). kApprox: one exponential, of the non-positive difference, instead of two.
template <bool kApprox>
__device__ __forceinline__ void merge_max_sum(float& m, float& s, const float m2, const float s2) {
  if constexpr (kApprox) {
    const float hi = fmaxf(m, m2);
    if (hi == -INFINITY) {
      s = 0.f;
    } else {
      const float e = exp_term<true>(fminf(m, m2) - hi);  // 0 when one side is empty (−inf)
      s = m >= m2 ? s + s2 * e : s * e + s2;
    }
    m = hi;
  } else {
    const float mm = fmaxf(m, m2);
    s = mm == -INFINITY ? 0.f : s * expf(m - mm) + s2 * expf(m2 - mm);
    m = mm;
  }
}

// After a grouped CTA's partials (and a barrier): each row's max and sum over its blocks (warp w
// owns rows 16w … 16w+15), then the block scores per group, as mma_rr forms them.
template <int kThreads, bool kApprox = false>
__device__ __forceinline__ void group_row_sums_and_scores(const ScoreParams& p, const EstSeq& e, const int ngroups,
                                                       const int64_t m0, const int nr, const int R, const int head0,
                                                       const int heads_here, const int tid, const int warp,
                                                       const int lane, const int* glast, const int* gnract,
                                                       const int* gnvis, float2* const* gpart, float* rmax, float* rmul) {
  // Exact builds (the else branch): four rows at a time: each lane loads its partials of the
  // four, kInFlight per row, before it combines any, and combines each row's in mma_rr's order
  // (n = lane, lane + 32, ...): the values of the one-row, one-load-one-combine loop this replaces. That loop held a quarter of the wgmma
  // kernel's stall samples at 32K; the batched loads alone did not shorten it (the merges'
  // arithmetic bounds it), the approximate builds' one-exponential merge did, by 5% of the kernel
  // (docs/design/estimate.md).
  constexpr int kRowsAtOnce = 4, kInFlight = 4;
  if constexpr (kApprox) {
    // Approximate builds: eight lanes per row, four rows side by side (lanes 8k … 8k+7: row
    // r0 + k), so a row's butterfly is 3 steps instead of 5 and the four rows' run at once: per
    // four rows a lane does 3 merges there instead of 20, and as many partial merges as before.
    // The merge order changes (rule 2 holds it, as the rest of these builds).
    const int sub = lane & 7, k = lane >> 3;
    for (int r0 = 0; r0 < 16; r0 += kRowsAtOnce) {
      const int r = warp * 16 + r0 + k, g = r / R;
      const int64_t nblk = g < ngroups && glast[g] >= 0 ? glast[g] / nr + 1 : 0;
      const float2* const part = g < ngroups ? gpart[g] + (r - g * R) * gnvis[g] : nullptr;
      float m1 = -INFINITY, s1 = 0.f;
      constexpr int kRowInFlight = 8;
      for (int64_t n0 = sub; n0 < nblk; n0 += 8 * kRowInFlight) {
        float2 x[kRowInFlight];
#pragma unroll
        for (int i = 0; i < kRowInFlight; ++i)
          if (n0 + 8 * i < nblk) x[i] = part[n0 + 8 * i];
#pragma unroll
        for (int i = 0; i < kRowInFlight; ++i)
          if (n0 + 8 * i < nblk) merge_max_sum<true>(m1, s1, x[i].x, x[i].y);
      }
      for (int o = 4; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m1, o), s2 = __shfl_xor_sync(0xffffffffu, s1, o);
        merge_max_sum<true>(m1, s1, m2, s2);
      }
      if (sub == 0 && g < ngroups) {
        rmax[r] = m1;
        rmul[r] = s1 > 0.f ? 1.f / (s1 * float(gnract[g])) : 0.f;
      }
    }
  } else {
    for (int r0 = 0; r0 < 16; r0 += kRowsAtOnce) {
      int64_t nblk[kRowsAtOnce];
      const float2* part[kRowsAtOnce];
      float m1[kRowsAtOnce], s1[kRowsAtOnce];
      int64_t nmax = 0;
#pragma unroll
      for (int k = 0; k < kRowsAtOnce; ++k) {
        const int r = warp * 16 + r0 + k, g = r / R;
        nblk[k] = g < ngroups && glast[g] >= 0 ? glast[g] / nr + 1 : 0;
        part[k] = g < ngroups ? gpart[g] + (r - g * R) * gnvis[g] : nullptr;
        nmax = max(nmax, nblk[k]);
        m1[k] = -INFINITY;
        s1[k] = 0.f;
      }
      for (int64_t n0 = lane; n0 < nmax; n0 += 32 * kInFlight) {
        float2 x[kRowsAtOnce][kInFlight];
#pragma unroll
        for (int k = 0; k < kRowsAtOnce; ++k)
#pragma unroll
          for (int i = 0; i < kInFlight; ++i)
            if (n0 + 32 * i < nblk[k]) x[k][i] = part[k][n0 + 32 * i];
#pragma unroll
        for (int k = 0; k < kRowsAtOnce; ++k)
#pragma unroll
          for (int i = 0; i < kInFlight; ++i)
            if (n0 + 32 * i < nblk[k]) merge_max_sum<false>(m1[k], s1[k], x[k][i].x, x[k][i].y);
      }
#pragma unroll
      for (int k = 0; k < kRowsAtOnce; ++k) {
        for (int o = 16; o > 0; o >>= 1) {
          const float m2 = __shfl_xor_sync(0xffffffffu, m1[k], o), s2 = __shfl_xor_sync(0xffffffffu, s1[k], o);
          merge_max_sum<false>(m1[k], s1[k], m2, s2);
        }
        const int r = warp * 16 + r0 + k, g = r / R;
        if (lane == 0 && g < ngroups) {
          rmax[r] = m1[k];
          rmul[r] = s1[k] > 0.f ? 1.f / (s1[k] * float(gnract[g])) : 0.f;
        }
      }
    }
  }
  __syncthreads();

  // ---- block scores per group: Σ over the head's rows, in order, one thread per (head, block) ----
  // Two (head, block) items a thread at a time: each item's score pointer and its head's nr (8 or
  // 16) partials of the block are loaded for both items before any is used, then both scores,
  // then each item is summed in row order and added to its score, as the one-item loop this
  // replaces did.
  constexpr int kItems = 2;
  for (int g = 0; g < ngroups; ++g) {
    const int64_t nblk = glast[g] >= 0 ? glast[g] / nr + 1 : 0, items = heads_here * nblk;
    const int64_t row0 = e.row_base + m0 + g;
    for (int64_t idx0 = tid; idx0 < items; idx0 += kItems * kThreads) {
      int64_t sp[kItems];
      float2 x[kItems][16];
#pragma unroll
      for (int j = 0; j < kItems; ++j) {
        const int64_t idx = idx0 + j * kThreads;
        if (idx >= items) break;
        const int hl = int(idx / nblk);
        const int64_t n = idx % nblk;
        sp[j] = p.score_ptr[row0 + int64_t(head0 + hl) * e.nqb] + n;
        const float2* const col = gpart[g] + int64_t(hl * nr) * gnvis[g] + n;
#pragma unroll
        for (int il = 0; il < 16; ++il)
          if (il < nr) x[j][il] = col[int64_t(il) * gnvis[g]];
      }
      float old[kItems];
#pragma unroll
      for (int j = 0; j < kItems; ++j)
        if (idx0 + j * kThreads < items) old[j] = p.scores[sp[j]];
#pragma unroll
      for (int j = 0; j < kItems; ++j) {
        const int64_t idx = idx0 + j * kThreads;
        if (idx >= items) break;
        const int rh = g * R + int(idx / nblk) * nr;
        float v = 0.f;
#pragma unroll
        for (int il = 0; il < 16; ++il) {
          if (il >= nr) break;
          if (x[j][il].y > 0.f) v += x[j][il].y * exp_term<kApprox>(x[j][il].x - rmax[rh + il]) * rmul[rh + il];
        }
        p.scores[sp[j]] = old[j] + v;
      }
    }
  }
}


}  // namespace
}  // namespace ariadne::cuda
