// CUDA scoring of the stride-level estimators (RRAttention, XAttention): key-stride sums, stride
// logits, the row softmax over visible key strides and the block sums, written into the score
// rows of EstimateResult (the CPU estimator's layout, src/estimate/strided.cpp is the reference).
//
// One CTA owns one (query block, KV head, group of that KV head's query heads): up to 64 query-
// stride rows (heads_per_cta · B/S) that read the same keys, so a GQA group shares every key load.
// B/S > 64 (the oracle runs as XAttention with S = 1: one row per query) makes a CTA own one
// head and run its B/S rows in rounds of 64, each round adding to the same block sums in order.
// Key strides stream through shared memory 32 at a time. A row's softmax needs its maximum and
// sum before any probability is known, and the row (up to 16K strides at 128K tokens) does not fit
// on chip. So the logits are computed once and reduced per (row, key block) to a block-local
// (max, Σexp(x − max)) pair in a global scratch (8 bytes per row and visible block, ~2 GB at 128K
// tokens for Llama's 32 heads, read back twice: ~2 ms of traffic, against a second round of
// multiply-adds that would cost as much as the first); the row's max and sum then combine the
// pairs, and each block's mass is its pair rescaled. Every sum runs in a fixed order (no
// atomics), so the scores are bit-identical run to run.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "cuda/estimate.cuh"

namespace ariadne::cuda {
namespace {

__device__ __forceinline__ float load_elem(const void* base, int64_t idx, int dtype) {
  if (dtype == 1) return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[idx]);
  if (dtype == 2) return __half2float(static_cast<const __half*>(base)[idx]);
  return static_cast<const float*>(base)[idx];
}

// The sequence owning packed key-stride row x: the last one whose ks_base <= x (empty sequences
// share their successor's ks_base and come before it).
__device__ int seq_of_key_stride(const EstSeq* seqs, int n, int64_t x) {
  int lo = 0, hi = n;  // answer in [lo, hi)
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (seqs[mid].ks_base <= x) lo = mid; else hi = mid;
  }
  return lo;
}

// RR sampling, part 1: K̄_j = Σ_{t<S} k_{jS+t} per KV head, f32, summed in t order as the CPU does
// (so the sums are bit-identical to the CPU estimator's). Grid (total_ks, heads_kv).
__global__ void key_stride_sums_kernel(ScoreParams p) {
  const int64_t x = blockIdx.x;
  const int kvh = blockIdx.y;
  const EstSeq e = p.seqs[seq_of_key_stride(p.seqs, p.num_seqs, x)];
  const int64_t j = x - e.ks_base;
  float* dst = p.ksum + (int64_t(kvh) * p.total_ks + x) * p.d;
  for (int u = threadIdx.x; u < p.d; u += blockDim.x) {
    float acc = 0.f;
    for (int t = 0; t < p.stride && j * p.stride + t < e.lk; ++t)
      acc += load_elem(p.k, (e.k0 + j * p.stride + t) * p.k_tok + kvh * p.k_head + u, p.dtype);
    dst[u] = acc;
  }
}

constexpr int kQPitch = kScoreRows + 4;  // q tile [d][68]: float4-aligned, 4-way store conflicts at most
constexpr int kPPitch = kScoreCols + 1;

// Grid (total query blocks, heads_kv, ceil(group / heads_per_cta)), kScoreThreads threads.
// Shared: q tile [d][kQPitch], key tile [32][d+1], one chunk's logits [64][33].
__global__ void __launch_bounds__(kScoreThreads) scores_kernel(ScoreParams p) {
  extern __shared__ float smem[];
  const int d = p.d;
  float* qs = smem;
  float* ks = qs + d * kQPitch;
  float* ps = ks + kScoreCols * (d + 1);
  __shared__ int lim[kScoreRows];      // last visible key stride of each row (−1: no row)
  __shared__ int qpos[kScoreRows];     // rr: the sampled query's local index
  __shared__ int rhead[kScoreRows];    // the row's query head, relative to head0
  __shared__ int ril[kScoreRows];      // the row's query stride inside the block
  __shared__ float rmax[kScoreRows], rmul[kScoreRows];
  __shared__ int jmax;

  const int gb = blockIdx.x, kvh = blockIdx.y;
  const int s = p.qblock_seq[gb];
  const int64_t m = p.qblock_m[gb];
  const EstSeq e = p.seqs[s];
  const int S = p.stride, nr = p.spb;
  const int64_t i0 = m * nr;
  const int nr_act = int(min(int64_t(nr), e.nqs - i0));  // query strides of this block
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // Rows of this CTA: heads_per_cta heads x nr strides, or (row_split > 1) one head's nr strides
  // in row_split rounds of 64, one after the other (so the block sums stay in a fixed order).
  const bool split = p.row_split > 1;
  const int head0 = kvh * p.group + int(blockIdx.z) * p.heads_per_cta;  // first query head of the CTA
  const int heads_here = min(p.heads_per_cta, p.group - int(blockIdx.z) * p.heads_per_cta);
  const int rows_per_head = split ? kScoreRows : nr;

  for (int rg = 0; rg < p.row_split; ++rg) {
    if (tid == 0) jmax = -1;
    __syncthreads();
    if (tid < kScoreRows) {
      const int hl = tid / rows_per_head, il = tid % rows_per_head + rg * kScoreRows;
      int l = -1, pos = 0;
      if (hl < heads_here && il < nr_act) {
        const int64_t i = i0 + il;
        const int h = head0 + hl;
        int64_t rep;  // representative query of the row: rr the sampled one, xattn the stride's last
        if (p.rr) {
          const int hm = h % S;
          rep = min(i * S + (p.paper ? S - 1 - hm : hm), e.lq - 1);
          pos = int(rep);
        } else {
          rep = min(i * S + S - 1, e.lq - 1);
        }
        l = int((rep + e.off) / S);
      }
      lim[tid] = l;
      qpos[tid] = pos;
      rhead[tid] = hl;
      ril[tid] = il;
      atomicMax(&jmax, l);
    }
    __syncthreads();

    // Loads the q tile of segment `seg` (rr: the sampled query; xattn: q_{iS+S−1−seg}), scaled.
    auto load_q = [&](int seg) {
      for (int idx = tid; idx < kScoreRows * d; idx += kScoreThreads) {
        const int r = idx / d, t = idx % d;
        float v = 0.f;
        if (lim[r] >= 0) {
          const int h = head0 + rhead[r];
          const int64_t iq = p.rr ? int64_t(qpos[r]) : (i0 + ril[r]) * S + S - 1 - seg;
          if (iq < e.lq) v = load_elem(p.q, (e.q0 + iq) * p.q_tok + int64_t(h) * p.q_head + t, p.dtype) * p.qmul;
        }
        qs[t * kQPitch + r] = v;
      }
    };
    // Loads key strides j0 … j0+31 of segment `seg` (rr: K̄_j; xattn: k_{jS+seg}).
    auto load_k = [&](int64_t j0, int seg) {
      for (int idx = tid; idx < kScoreCols * d; idx += kScoreThreads) {
        const int c = idx / d, t = idx % d;
        const int64_t j = j0 + c;
        float v = 0.f;
        if (p.rr) {
          if (j < e.nks) v = p.ksum[(int64_t(kvh) * p.total_ks + e.ks_base + j) * d + t];
        } else {
          const int64_t tok = j * S + seg;
          if (j < e.nks && tok < e.lk) v = load_elem(p.k, (e.k0 + tok) * p.k_tok + int64_t(kvh) * p.k_head + t, p.dtype);
        }
        ks[c * (d + 1) + t] = v;
      }
    };
    // Logits of rows 8·warp … 8·warp+7 against key stride j0 + lane.
    auto logits = [&](int64_t j0, float acc[8]) {
      for (int e8 = 0; e8 < 8; ++e8) acc[e8] = 0.f;
      const int segs = p.rr ? 1 : S;
      for (int seg = 0; seg < segs; ++seg) {
        if (!p.rr) load_q(seg);
        load_k(j0, seg);
        __syncthreads();
        const float* kr = ks + lane * (d + 1);
        const float* qr = qs + warp * 8;
  #pragma unroll 4
        for (int t = 0; t < d; ++t) {
          const float kv = kr[t];
          const float4 a = *reinterpret_cast<const float4*>(qr + t * kQPitch);
          const float4 b = *reinterpret_cast<const float4*>(qr + t * kQPitch + 4);
          acc[0] = fmaf(a.x, kv, acc[0]);
          acc[1] = fmaf(a.y, kv, acc[1]);
          acc[2] = fmaf(a.z, kv, acc[2]);
          acc[3] = fmaf(a.w, kv, acc[3]);
          acc[4] = fmaf(b.x, kv, acc[4]);
          acc[5] = fmaf(b.y, kv, acc[5]);
          acc[6] = fmaf(b.z, kv, acc[6]);
          acc[7] = fmaf(b.w, kv, acc[7]);
        }
        __syncthreads();  // the tiles are overwritten by the next segment or chunk
      }
    };

    if (p.rr) load_q(0);  // one sampled query per row: loaded once
    __syncthreads();
    const int last = jmax;

    // ---- one pass over the key strides: per (row, key block) the max and Σexp(x − max) ----
    const int64_t qlast = min((m + 1) * p.block, e.lq) - 1;
    const int64_t nvis = (qlast + e.off) / p.block + 1;  // visible key blocks: 0 … diag(m)
    const int64_t nblk_cta = last >= 0 ? last / nr + 1 : 0;  // key blocks any row of the CTA sees
    // This CTA's partials: part[r · nvis + n] = (max, Σexp(x − max)) of row r over block n.
    float2* part = p.scratch + p.scratch_base[gb] + (int64_t(kvh) * gridDim.z + blockIdx.z) * kScoreRows * nvis;
    for (int64_t j0 = 0; j0 <= last; j0 += kScoreCols) {
      float acc[8];
      logits(j0, acc);
      for (int e8 = 0; e8 < 8; ++e8) {
        const int r = warp * 8 + e8;
        ps[r * kPPitch + lane] = j0 + lane <= lim[r] ? acc[e8] : -INFINITY;
      }
      __syncthreads();
      const int64_t jend = min(j0 + kScoreCols - 1, int64_t(last));
      const int64_t nb0 = j0 / nr, nblk = jend / nr - nb0 + 1;  // key blocks touched by this chunk
      // One thread per (row, block): the chunk's columns of key block nb0 + b, merged with the
      // block's partial from the previous chunk when the block started there.
      for (int idx = tid; idx < kScoreRows * nblk; idx += kScoreThreads) {
        const int r = idx / int(nblk), b = idx % int(nblk);
        const int64_t n = nb0 + b;
        const int64_t c0 = max(n * nr - j0, int64_t(0));
        const int64_t c1 = min((n + 1) * nr - j0, int64_t(kScoreCols));
        float cm = -INFINITY, cs = 0.f;
        for (int64_t c = c0; c < c1; ++c) cm = fmaxf(cm, ps[r * kPPitch + c]);
        if (cm != -INFINITY)
          for (int64_t c = c0; c < c1; ++c) cs += expf(ps[r * kPPitch + c] - cm);
        float2& slot = part[r * nvis + n];
        if (n * nr >= j0) {
          slot = make_float2(cm, cs);
        } else {
          const float2 o = slot;
          const float mm = fmaxf(o.x, cm);
          slot = make_float2(mm, mm == -INFINITY ? 0.f : o.y * expf(o.x - mm) + cs * expf(cm - mm));
        }
      }
      __syncthreads();  // ps is rewritten by the next chunk
    }

    // ---- per row: max and sum over its blocks (warp w owns rows 8w … 8w+7) ----
    for (int e8 = 0; e8 < 8; ++e8) {
      const int r = warp * 8 + e8;
      float m1 = -INFINITY, s1 = 0.f;
      for (int64_t n = lane; n < nblk_cta; n += 32) {
        const float2 v = part[r * nvis + n];
        const float mm = fmaxf(m1, v.x);
        s1 = mm == -INFINITY ? 0.f : s1 * expf(m1 - mm) + v.y * expf(v.x - mm);
        m1 = mm;
      }
      for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m1, o), s2 = __shfl_xor_sync(0xffffffffu, s1, o);
        const float mm = fmaxf(m1, m2);
        s1 = mm == -INFINITY ? 0.f : s1 * expf(m1 - mm) + s2 * expf(m2 - mm);
        m1 = mm;
      }
      if (lane == 0) {
        rmax[r] = m1;
        // 1 / (row sum · sampled rows of the block): every score row then sums to 1.
        rmul[r] = s1 > 0.f ? 1.f / (s1 * float(nr_act)) : 0.f;
      }
    }
    __syncthreads();

    // ---- block scores: Σ over the head's rows of the block's softmax mass, one thread per
    // (head, block), rows in order (deterministic) ----
    for (int64_t idx = tid; idx < heads_here * nblk_cta; idx += kScoreThreads) {
      const int hl = int(idx / nblk_cta);
      const int64_t n = idx % nblk_cta;
      float v = 0.f;
      for (int il = 0; il < rows_per_head; ++il) {
        const int r = hl * rows_per_head + il;
        const float2 pv = part[r * nvis + n];
        if (pv.y > 0.f) v += pv.y * expf(pv.x - rmax[r]) * rmul[r];
      }
      const int64_t row = e.row_base + int64_t(head0 + hl) * e.nqb + m;
      p.scores[p.score_ptr[row] + n] += v;
    }
    __syncthreads();
  }  // row rounds
}

}  // namespace

cudaError_t launch_key_stride_sums(const ScoreParams& p, cudaStream_t stream) {
  if (p.total_ks == 0) return cudaSuccess;
  const int threads = p.d < 128 ? ((p.d + 31) / 32) * 32 : 128;
  key_stride_sums_kernel<<<dim3(unsigned(p.total_ks), unsigned(p.heads_kv)), threads, 0, stream>>>(p);
  return cudaGetLastError();
}

namespace {
size_t scores_smem_bytes(int d) {
  return sizeof(float) * (size_t(d) * kQPitch + size_t(kScoreCols) * (d + 1) + size_t(kScoreRows) * kPPitch);
}

}  // namespace

cudaError_t launch_scores(const ScoreParams& p, int64_t total_qblocks, cudaStream_t stream) {
  if (total_qblocks == 0) return cudaSuccess;
  const size_t smem = scores_smem_bytes(p.d);
  cudaError_t err = cudaFuncSetAttribute(scores_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (err != cudaSuccess) return err;
  const unsigned zc = unsigned((p.group + p.heads_per_cta - 1) / p.heads_per_cta);
  scores_kernel<<<dim3(unsigned(total_qblocks), unsigned(p.heads_kv), zc), kScoreThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace ariadne::cuda
