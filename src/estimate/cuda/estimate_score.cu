// CUDA scoring of the stride-level estimators (RRAttention, XAttention): key-stride sums, stride
// logits, the row softmax over visible key strides and the block sums, written into the score
// rows of EstimateResult (the CPU estimator's layout, src/estimate/cpu/strided.cpp is the reference).
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
//
// The logits come from one of two variants of the kernel (a template flag, the rest is shared):
// the f32 kernel (CUDA-core FMAs, each lane one key stride, the CPU's products) and the tensor-
// core kernel (mma.sync m16n8k16 bf16 → f32, 64 key strides per chunk). The tensor-core kernel
// keeps f32 accuracy by splitting each operand exactly into bf16 terms: a bf16 input is one
// term, an f16 input two (11 significant bits), an f32 value three (8 + 8 + 8 bits = 24, so
// hi + mid + lo is the value itself); K̄ (f32 sums) is always three. Every bf16 product is exact
// in f32, and the products of terms (i, j) with i + j <= 2 are all accumulated (the dropped ones
// are below 2^-24 of the product): the logits then differ from the f32 kernel's only by the order
// and rounding of the f32 sums (docs/numerics.md). The scale is applied to the finished logit,
// not folded into q (q·scale is not a bf16 number).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "estimate/cuda/estimate.cuh"
#include "device/cuda/mma.cuh"
#include "device/cuda/wgmma.cuh"

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

// x = hi + mid + lo exactly in bf16 terms (x − hi and its remainder are exact in f32; each term
// takes the next 8 significant bits). A non-finite x is all in hi (inf − inf would make NaN).
__device__ __forceinline__ void split_bf16(float x, __nv_bfloat16 (&t)[3]) {
  t[0] = __float2bfloat16_rn(x);
  const float r1 = x - __bfloat162float(t[0]);
  const bool finite = isfinite(x);
  t[1] = __float2bfloat16_rn(finite ? r1 : 0.f);
  const float r2 = r1 - __bfloat162float(t[1]);
  t[2] = __float2bfloat16_rn(finite ? r2 : 0.f);
}

// RR sampling, part 1: K̄_j = Σ_{t<S} k_{jS+t} per KV head, f32, summed in t order as the CPU does
// (so the sums are bit-identical to the CPU estimator's). Written as f32 (f32 scoring) or as its
// three bf16 terms, zero-padded to dpad (tensor-core scoring). Grid (total_ks, heads_kv).
__global__ void key_stride_sums_kernel(ScoreParams p) {
  const int64_t x = blockIdx.x;
  const int kvh = blockIdx.y;
  const EstSeq e = p.seqs[seq_of_key_stride(p.seqs, p.num_seqs, x)];
  const int64_t j = x - e.ks_base;
  const int width = p.mma ? p.dpad : p.d;
  for (int u = threadIdx.x; u < width; u += blockDim.x) {
    float acc = 0.f;
    if (u < p.d)
      for (int t = 0; t < p.stride && j * p.stride + t < e.lk; ++t)
        acc += load_elem(p.k, (e.k0 + j * p.stride + t) * p.k_tok + kvh * p.k_head + u, p.dtype);
    if (p.mma) {
      __nv_bfloat16 parts[3];
      split_bf16(acc, parts);
      __nv_bfloat16* dst = static_cast<__nv_bfloat16*>(p.ksplit) + (int64_t(kvh) * p.total_ks + x) * 3 * p.dpad;
#pragma unroll
      for (int i = 0; i < 3; ++i) dst[i * p.dpad + u] = parts[i];
    } else {
      p.ksum[(int64_t(kvh) * p.total_ks + x) * p.d + u] = acc;
    }
  }
}

// The same sums for 16-bit keys whose rows are 16-byte vectors (head_dim % 8 == 0, aligned base
// and strides; launch_key_stride_sums checks): one thread per (key stride, KV head, 8 elements),
// KV heads fastest, so a warp reads whole token rows. A thread loads up to 8 of its stride's key
// vectors before adding any (the scalar kernel above waits on each 2-byte load in turn: ~0.28 ms
// at 128K tokens, 27% of DRAM bandwidth, 77% of its stalls on that wait), then adds them in t
// order from 0, exactly as the scalar kernel and the CPU do, so the sums are the same bits.
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }

template <class T>
__global__ void key_stride_sums_vec_kernel(ScoreParams p, int64_t items) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= items) return;
  const int chunks = (p.mma ? p.dpad : p.d) / 8;  // output vectors per (stride, head); d % 8 == 0
  const int c = int(idx % chunks);
  const int64_t pair = idx / chunks;
  const int kvh = int(pair % p.heads_kv);
  const int64_t x = pair / p.heads_kv;
  const EstSeq e = p.seqs[seq_of_key_stride(p.seqs, p.num_seqs, x)];
  const int64_t j = x - e.ks_base;
  float acc[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] = 0.f;
  if (c * 8 < p.d) {
    // Keys of this stride inside the sequence: t < n (the scalar kernel's loop bound).
    const int64_t left = e.lk - j * p.stride;
    const int n = int(left < p.stride ? left : p.stride);
    const T* src = static_cast<const T*>(p.k) + (e.k0 + j * p.stride) * p.k_tok + kvh * p.k_head + c * 8;
    for (int t0 = 0; t0 < n; t0 += 8) {
      uint4 v[8];
#pragma unroll
      for (int u = 0; u < 8; ++u)
        v[u] = t0 + u < n ? __ldg(reinterpret_cast<const uint4*>(src + (t0 + u) * p.k_tok)) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        if (t0 + u >= n) break;
        const T* h = reinterpret_cast<const T*>(&v[u]);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] += to_f32(h[i]);
      }
    }
  }
  if (p.mma) {
    __align__(16) __nv_bfloat16 parts[3][8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      __nv_bfloat16 t[3];
      split_bf16(acc[i], t);
      parts[0][i] = t[0];
      parts[1][i] = t[1];
      parts[2][i] = t[2];
    }
    __nv_bfloat16* dst = static_cast<__nv_bfloat16*>(p.ksplit) + (int64_t(kvh) * p.total_ks + x) * 3 * p.dpad + c * 8;
#pragma unroll
    for (int i = 0; i < 3; ++i) *reinterpret_cast<uint4*>(dst + i * p.dpad) = *reinterpret_cast<const uint4*>(parts[i]);
  } else {
    float* dst = p.ksum + (int64_t(kvh) * p.total_ks + x) * p.d + c * 8;
    reinterpret_cast<float4*>(dst)[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    reinterpret_cast<float4*>(dst)[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
  }
}

// The K̄ tile copy of the v2 and v3 kernels: key strides j0 … j0+63 of one sequence and KV head,
// all three terms, into a key-stride-major tile (row 3c + i = term i of key stride c, rows of bp
// elements), one commit group. A chunk is one contiguous run of 16-byte vectors in global memory
// and in the tile, so a thread's vectors follow from its first one by a fixed step (int32, one
// carry test per vector, no division); term rows past the sequence's key strides are zero-filled
// (their source address stays inside the chunk).
template <int kThreads>
struct KbarTileCopy {
  const __nv_bfloat16* kseq;  // K̄ terms of the sequence's first key stride (this KV head)
  int dpad, v8, nvec, vstep_row, vstep_col, vrow0, vcol0, nks, tid;
  uint32_t dst0, dst_step;  // shared address of this thread's first vector; bytes per step

  __device__ KbarTileCopy(const ScoreParams& p, const EstSeq& e, int kvh, uint32_t kb_s, int bp, int t)
      : kseq(static_cast<const __nv_bfloat16*>(p.ksplit) + (int64_t(kvh) * p.total_ks + e.ks_base) * 3 * p.dpad),
        dpad(p.dpad),
        v8(p.dpad / 8),
        nvec(kMmaCols * 3 * (p.dpad / 8)),
        vstep_row(kThreads / (p.dpad / 8)),
        vstep_col(kThreads % (p.dpad / 8)),
        vrow0(t / (p.dpad / 8)),
        vcol0(t % (p.dpad / 8)),
        nks(int(e.nks)),
        tid(t),
        dst0(kb_s + uint32_t((t / (p.dpad / 8)) * bp + (t % (p.dpad / 8)) * 8) * 2u),
        dst_step(uint32_t((kThreads / (p.dpad / 8)) * bp + (kThreads % (p.dpad / 8)) * 8) * 2u) {}

  __device__ __forceinline__ void issue(int j0) const {
    const __nv_bfloat16* src = kseq + int64_t(j0) * 3 * dpad;
    int col = vcol0;
    uint32_t dst = dst0;
    if (j0 + kMmaCols <= nks) {  // every chunk but a sequence's last: no zero fill
      const __nv_bfloat16* g = src + tid * 8;
      for (int idx = tid; idx < nvec; idx += kThreads, g += kThreads * 8) {
        cp_async16(dst, g, true);
        col += vstep_col;
        dst += dst_step;
        if (col >= v8) {  // into the next term row: it starts 16 pad bytes past this row's end
          col -= v8;
          dst += 16u;
        }
      }
    } else {
      const int rows_ok = 3 * (nks - j0);
      int row = vrow0;
      for (int idx = tid; idx < nvec; idx += kThreads) {
        const bool ok = row < rows_ok;
        cp_async16(dst, src + (ok ? idx * 8 : 0), ok);
        row += vstep_row;
        col += vstep_col;
        dst += dst_step;
        if (col >= v8) {
          col -= v8;
          ++row;
          dst += 16u;
        }
      }
    }
    cp_async_commit();
  }
};

// The partials' quad transpose (v2, v3). x[q][k]: a warp's accumulator values of row-combination
// q = 2·mt + h2 (m16 tile mt, rows +8 if h2) at column 8·(k/2) + 2·cc + k%2 of an n8 pair (cc =
// lane % 4). Afterwards y[s][k] holds row-combination cc at column 8·(k/2) + 2·s + k%2: the 16
// columns of one row in one lane, in two xor stages of 8 shuffles.
__device__ __forceinline__ void quad_transpose(const float (&x)[4][4], float (&y)[4][4], int cc) {
  const bool b0 = (cc & 1) != 0, b1 = (cc & 2) != 0;
  // Stage 1 (lanes cc, cc ^ 1): f[p2][s0] = row-combination 2·p2 + (cc & 1) from the quad lane
  // whose bit 0 is s0.
  float f[2][2][4];
#pragma unroll
  for (int p2 = 0; p2 < 2; ++p2)
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float own = b0 ? x[2 * p2 + 1][k] : x[2 * p2][k];
      const float send = b0 ? x[2 * p2][k] : x[2 * p2 + 1][k];
      const float recv = __shfl_xor_sync(0xffffffffu, send, 1);
      f[p2][0][k] = b0 ? recv : own;
      f[p2][1][k] = b0 ? own : recv;
    }
  // Stage 2 (lanes cc, cc ^ 2): y[s][k] = row-combination cc from quad lane s.
#pragma unroll
  for (int s0 = 0; s0 < 2; ++s0)
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float own = b1 ? f[1][s0][k] : f[0][s0][k];
      const float send = b1 ? f[0][s0][k] : f[1][s0][k];
      const float recv = __shfl_xor_sync(0xffffffffu, send, 2);
      y[s0][k] = b1 ? recv : own;
      y[2 + s0][k] = b1 ? own : recv;
    }
}

// (max, Σexp(x − max)) of key block nb of a lane's 16 transposed columns y (nr 8: block nb is n8
// tile nb; nr 16: one block, both tiles). The Σexp runs in the f32 kernel's column order, cs +
// e(2s) + e(2s + 1) for s = 0 … 3 per n8 tile, with __fadd_rn: a plain + would let the compiler
// fuse expf's final multiply into the sum (an FFMA rounds once where v1, whose terms arrive by
// shuffle, rounds twice).
__device__ __forceinline__ float2 block_pair(const float (&y)[4][4], int nr, int nb) {
  const int nt0 = nr == 16 ? 0 : nb, nt1 = nr == 16 ? 1 : nb;
  float cm = -INFINITY;
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
    if (nt >= nt0 && nt <= nt1)
#pragma unroll
      for (int s = 0; s < 4; ++s) cm = fmaxf(fmaxf(cm, y[s][2 * nt]), y[s][2 * nt + 1]);
  float cs = 0.f;
  if (cm != -INFINITY)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
      if (nt >= nt0 && nt <= nt1)
#pragma unroll
        for (int s = 0; s < 4; ++s)
          cs = __fadd_rn(__fadd_rn(cs, expf(y[s][2 * nt] - cm)), expf(y[s][2 * nt + 1] - cm));
  return make_float2(cm, cs);
}

// Approximate partials (the wgmma kernel's kApprox builds, v3_kind 4-6; docs/rrattention.md, "Scoring
// kernel v3, approximate partials"): (max, Σexp) of each key block of a chunk's 32 columns, for this
// lane's two rows, straight from the m64n32 accumulators (acc[4t + 2h + v]: row lane/4 + 8h,
// column 8t + 2·cc + v). No transpose: a block's max and sum are combined over the quad by two
// butterfly shuffles each, and the terms are ex2.approx(acc·c2 − max·c2) with c2 = qmul·log2 e (one
// FFMA and one MUFU per logit). qmul > 0 (the caller's test), so the max of the raw accumulators,
// scaled once, is the max of the scaled logits bit for bit; Σexp differs from the exact path's by
// the approximation (rel. ~2^-22 per term) and the summation order: docs/numerics.md rule 2 and 3
// hold it, not bit-identity. kNB blocks per chunk (2 at B/S 16, 4 at B/S 8); the quad's 2·kNB
// (row, block) pairs are stored one per lane in turn. rows[h]: the partials row of row h; n0: the
// chunk's first block.
template <int kNB>
__device__ __forceinline__ void approx_block_pairs(const float (&acc)[16], float c2, float qmul, int cc,
                                                   float2* const (&rows)[2], int n0) {
  constexpr int kT = 4 / kNB;  // n8 tiles per block
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int b = 0; b < kNB; ++b) {
      float m = -INFINITY;
#pragma unroll
      for (int t = b * kT; t < (b + 1) * kT; ++t) m = fmaxf(m, fmaxf(acc[4 * t + 2 * h], acc[4 * t + 2 * h + 1]));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
      const float mo = m * c2;
      float s = 0.f;
#pragma unroll
      for (int t = b * kT; t < (b + 1) * kT; ++t)
        s += ex2(fmaf(acc[4 * t + 2 * h], c2, -mo)) + ex2(fmaf(acc[4 * t + 2 * h + 1], c2, -mo));
      s += __shfl_xor_sync(0xffffffffu, s, 1);
      s += __shfl_xor_sync(0xffffffffu, s, 2);
      if (((h * kNB + b) & 3) == cc) rows[h][n0 + b] = make_float2(__fmul_rn(m, qmul), s);
    }
}

constexpr int kQPitch = kScoreRows + 4;  // q tile [d][68]: float4-aligned, 4-way store conflicts at most

// Shared-memory plan of the scoring kernel (bytes from the dynamic base).
//   f32: logits [64][33] f32 | q tile [d][kQPitch] f32 | key tile [32][d+1] f32
//   mma: logits [64][65] f32 | q tile [qterms][64][dpad+8] bf16 | key tile [kterms][64][dpad+8] bf16
// The bf16 rows are padded by 8 elements (16 bytes): the 8 row addresses of an ldmatrix then fall
// in 8 different 4-bank groups, and every row start stays 16-byte aligned.
//   v2 (rr, blocks of 8 or 16 key strides): no logits | q tile as mma | key tile [64 · 3][dpad+8] bf16,
//   row 3c + i holding term i of key stride c (the global layout of K̄'s terms, so a chunk's copy
//   is one contiguous stream). The row pitch is 3 · (2 · dpad + 16) bytes between key strides, an
//   odd multiple of 16 modulo 128: an ldmatrix's 8 rows still fall in 8 different 4-bank groups.
template <bool kMma, bool kV2 = false>
struct ScoreSmem {
  static constexpr int cols = kMma ? kMmaCols : kScoreCols;  // key strides per chunk
  static constexpr int ppitch = cols + 1;
  static __host__ __device__ size_t logits_bytes() { return kV2 ? 0 : sizeof(float) * size_t(kScoreRows) * ppitch; }
  static __host__ __device__ int bpitch(const ScoreParams& p) { return p.dpad + 8; }
  static __host__ __device__ size_t q_bytes(const ScoreParams& p) {
    return kMma ? size_t(2) * p.qterms * kScoreRows * bpitch(p) : sizeof(float) * size_t(p.d) * kQPitch;
  }
  static __host__ __device__ size_t k_bytes(const ScoreParams& p) {
    return kMma ? size_t(2) * p.kterms * kMmaCols * bpitch(p) : sizeof(float) * size_t(kScoreCols) * (p.d + 1);
  }
  static __host__ __device__ size_t total(const ScoreParams& p) { return logits_bytes() + q_bytes(p) + k_bytes(p); }
};

// Grid (total query blocks, heads_kv, ceil(group / heads_per_cta)), kScoreThreads threads.
// kV2 (only with kMma; the host sets it only for rr with blocks of 8 or 16 key strides and one
// row round): the restructured chunk loop of "Scoring kernel v2" in docs/rrattention.md.
template <bool kMma, bool kV2 = false>
__global__ void __launch_bounds__(kScoreThreads) scores_kernel(ScoreParams p) {
  static_assert(kMma || !kV2, "v2 is a tensor-core variant");
  using Sm = ScoreSmem<kMma, kV2>;
  constexpr int kCols = Sm::cols, kPPitch = Sm::ppitch;
  extern __shared__ float4 smem4[];
  char* smem = reinterpret_cast<char*>(smem4);
  const int d = p.d;
  float* ps = reinterpret_cast<float*>(smem);
  // f32 tiles
  float* qs = reinterpret_cast<float*>(smem + Sm::logits_bytes());
  float* ks = reinterpret_cast<float*>(smem + Sm::logits_bytes() + Sm::q_bytes(p));
  // bf16 tiles (same addresses, the other variant)
  __nv_bfloat16* qa = reinterpret_cast<__nv_bfloat16*>(qs);
  __nv_bfloat16* kb = reinterpret_cast<__nv_bfloat16*>(ks);
  const int bp = Sm::bpitch(p);
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

    // q element t of row r in segment `seg` (rr: the sampled query; xattn: q_{iS+S−1−seg}),
    // unscaled; 0 for rows without a query.
    auto q_elem = [&](int r, int t, int seg) {
      float v = 0.f;
      if (lim[r] >= 0) {
        const int h = head0 + rhead[r];
        const int64_t iq = p.rr ? int64_t(qpos[r]) : (i0 + ril[r]) * S + S - 1 - seg;
        if (iq < e.lq) v = load_elem(p.q, (e.q0 + iq) * p.q_tok + int64_t(h) * p.q_head + t, p.dtype);
      }
      return v;
    };
    // xattn: k element t of key stride j in segment `seg` (k_{jS+seg}); 0 past the sequence.
    auto k_elem = [&](int64_t j, int t, int seg) {
      const int64_t tok = j * S + seg;
      return j < e.nks && tok < e.lk ? load_elem(p.k, (e.k0 + tok) * p.k_tok + int64_t(kvh) * p.k_head + t, p.dtype)
                                     : 0.f;
    };

    // ---- f32 tiles: q scaled by qmul (as the CPU folds it), fp32 FMAs ----
    auto load_q = [&](int seg) {
      for (int idx = tid; idx < kScoreRows * d; idx += kScoreThreads) {
        const int r = idx / d, t = idx % d;
        qs[t * kQPitch + r] = q_elem(r, t, seg) * p.qmul;
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
          v = k_elem(j, t, seg);
        }
        ks[c * (d + 1) + t] = v;
      }
    };

    // ---- bf16 tiles: each value as qterms / kterms exact bf16 terms, rows padded with zeros ----
    auto load_q_mma = [&](int seg) {
      for (int idx = tid; idx < kScoreRows * p.dpad; idx += kScoreThreads) {
        const int r = idx / p.dpad, t = idx % p.dpad;
        __nv_bfloat16 parts[3];
        split_bf16(t < d ? q_elem(r, t, seg) : 0.f, parts);
#pragma unroll
        for (int i = 0; i < 3; ++i)
          if (i < p.qterms) qa[(i * kScoreRows + r) * bp + t] = parts[i];
      }
    };
    // rr: issues the 16-byte asynchronous copies of K̄'s terms for key strides j0 … j0+63 (one
    // commit group; contiguous [3][dpad] per key stride), zero-filled past the sequence's end.
    auto issue_k_rr = [&](int64_t j0) {
      const int v8 = p.dpad / 8;  // 16-byte vectors per term row
      const __nv_bfloat16* src0 =
          static_cast<const __nv_bfloat16*>(p.ksplit) + (int64_t(kvh) * p.total_ks + e.ks_base) * 3 * p.dpad;
      for (int idx = tid; idx < kMmaCols * 3 * v8; idx += kScoreThreads) {
        const int c = idx / (3 * v8), rem = idx % (3 * v8), i = rem / v8, u = rem % v8;
        const int64_t j = j0 + c;
        const bool ok = j < e.nks;
        const __nv_bfloat16* src = src0 + (ok ? j : 0) * 3 * p.dpad + i * p.dpad + u * 8;
        cp_async16(smem_addr(kb + (i * kMmaCols + c) * bp + u * 8), src, ok);
      }
      cp_async_commit();
    };
    auto load_k_mma = [&](int64_t j0, int seg) {
      if (p.rr) {
        issue_k_rr(j0);
        cp_async_wait<0>();
      } else {
        for (int idx = tid; idx < kMmaCols * p.dpad; idx += kScoreThreads) {
          const int c = idx / p.dpad, t = idx % p.dpad;
          __nv_bfloat16 parts[3];
          split_bf16(t < d ? k_elem(j0 + c, t, seg) : 0.f, parts);
#pragma unroll
          for (int i = 0; i < 3; ++i)
            if (i < p.kterms) kb[(i * kMmaCols + c) * bp + t] = parts[i];
        }
      }
    };

    // ---- tensor-core logits. Warp w: rows 32·(w & 1) … +31 (two m16 tiles) × key strides
    // 16·(w >> 1) … +15 of the chunk (two n8 tiles). Accumulator layout of m16n8: c0, c1 at row
    // lane/4, columns 2·(lane%4) + 0, 1; c2, c3 the same 8 rows further down. ----
    const int wm = warp & 1, wn = warp >> 1;
    // acc += the tiles in shared memory, all d in steps of 16, every term pair (i, j), i + j <= 2.
    auto mma_tile = [&](float (&acc)[2][2][4]) {
      for (int k0 = 0; k0 < p.dpad; k0 += 16) {
        uint32_t a[3][2][4];
#pragma unroll
        for (int i = 0; i < 3; ++i)
          if (i < p.qterms)
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
              ldmatrix_x4(a[i][mt],
                          smem_addr(qa + (i * kScoreRows + wm * 32 + mt * 16 + (lane & 15)) * bp + k0 + (lane >> 4) * 8));
#pragma unroll
        for (int j = 0; j < 3; ++j) {
          if (j >= p.kterms) continue;
          uint32_t b[4];  // n8 tile 0: b[0], b[1]; tile 1: b[2], b[3]
          ldmatrix_x4(b, smem_addr(kb + (j * kMmaCols + wn * 16 + (lane >> 4) * 8 + (lane & 7)) * bp + k0 +
                                   ((lane >> 3) & 1) * 8));
#pragma unroll
          for (int i = 0; i < 3; ++i)
            if (i < p.qterms && i + j <= 2)
#pragma unroll
              for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int nt = 0; nt < 2; ++nt) Bf16::mma(acc[mt][nt], a[i][mt], b[2 * nt], b[2 * nt + 1]);
        }
      }
    };
    // The chunk's logits (unscaled) over all segments, loading the tiles synchronously.
    auto mma_chunk = [&](int64_t j0, float (&acc)[2][2][4]) {
      const int segs = p.rr ? 1 : S;
      for (int seg = 0; seg < segs; ++seg) {
        if (!p.rr) load_q_mma(seg);
        load_k_mma(j0, seg);
        __syncthreads();
        mma_tile(acc);
        __syncthreads();  // the tiles are overwritten by the next segment or chunk
      }
    };

    // Writes the chunk's logits of key strides j0 … j0+kCols−1 into ps (−inf where not visible).
    auto fill_logits = [&](int64_t j0) {
      if constexpr (!kMma) {
        const int segs = p.rr ? 1 : S;
        // Rows 8·warp … 8·warp+7 against key stride j0 + lane.
        float acc[8];
        for (int e8 = 0; e8 < 8; ++e8) acc[e8] = 0.f;
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
        for (int e8 = 0; e8 < 8; ++e8) {
          const int r = warp * 8 + e8;
          ps[r * kPPitch + lane] = j0 + lane <= lim[r] ? acc[e8] : -INFINITY;
        }
      } else {
        float acc[2][2][4] = {};
        mma_chunk(j0, acc);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int v = 0; v < 4; ++v) {
              const int r = wm * 32 + mt * 16 + (lane >> 2) + (v >> 1) * 8;
              const int c = wn * 16 + nt * 8 + 2 * (lane & 3) + (v & 1);
              ps[r * kPPitch + c] = j0 + c <= lim[r] ? __fmul_rn(acc[mt][nt][v], p.qmul) : -INFINITY;
            }
      }
    };

    if (p.rr) {  // one sampled query per row: loaded once
      if constexpr (kMma) load_q_mma(0); else load_q(0);
    }
    __syncthreads();
    const int last = jmax;

    // ---- one pass over the key strides: per (row, key block) the max and Σexp(x − max) ----
    const int64_t qlast = min((m + 1) * p.block, e.lq) - 1;
    const int64_t nvis = (qlast + e.off) / p.block + 1;  // visible key blocks: 0 … diag(m)
    const int64_t nblk_cta = last >= 0 ? last / nr + 1 : 0;  // key blocks any row of the CTA sees
    // This CTA's partials: part[r · nvis + n] = (max, Σexp(x − max)) of row r over block n.
    float2* part = p.scratch + p.scratch_base[gb] + (int64_t(kvh) * gridDim.z + blockIdx.z) * kScoreRows * nvis;
    if constexpr (kV2) {
      // ---- v2: rr, blocks of 8 or 16 key strides, one row round (the host guarantees it). Same
      // logits and the same (max, Σexp) partials, bit for bit, as the loop below; what differs is
      // the work per 64-stride chunk (docs/rrattention.md, "Scoring kernel v2"):
      //  * K̄'s copy: the chunk is one contiguous run of 16-byte vectors in global memory and in
      //    the key-stride-major tile, so a thread's vectors follow from its first one by a fixed
      //    step (int32, no division per vector);
      //  * the mma loop has the q terms as a compile-time count and per-lane addresses plus the k
      //    offset, and a warp whose 32 rows all end before the chunk skips it (at S 16 a CTA's
      //    rows 32 … 63 are empty: 4 heads × 8 strides);
      //  * the partials: a 4 × 4 transpose inside each quad (16 shuffles) gives every lane the 16
      //    columns of one row, whose max and in-order Σexp then need no shuffle at all.
      const uint32_t kb_s = smem_addr(kb);
      const KbarTileCopy<kScoreThreads> kcopy(p, e, kvh, kb_s, bp, tid);
      // Warp w: rows 32·(w & 1) … +31 (two m16 tiles) × key strides 16·(w >> 1) … +15, as above.
      const int wm = warp & 1, wn = warp >> 1;
      // ldmatrix row addresses (bytes): q term i, tile mt: row i·64 + wm·32 + mt·16 + lane % 16,
      // column (lane / 16)·8; K̄ term j of key stride c = wn·16 + (lane / 16)·8 + lane % 8: row
      // 3c + j, column ((lane / 8) % 2)·8. The k step adds 32 bytes to both.
      const uint32_t a_s = smem_addr(qa) + uint32_t(((wm * 32 + (lane & 15)) * bp + (lane >> 4) * 8) * 2);
      const uint32_t a_term = uint32_t(kScoreRows * bp * 2), a_tile = uint32_t(16 * bp * 2);
      const uint32_t b_s = kb_s + uint32_t((3 * (wn * 16 + (lane >> 4) * 8 + (lane & 7)) * bp + ((lane >> 3) & 1) * 8) * 2);
      const uint32_t b_term = uint32_t(bp * 2);
      // The last key stride any row of this warp sees: a chunk past it leaves the warp's logits all
      // masked, so its mma work is skipped (the empty rows at S 16: 4 heads × 8 strides of 64).
      const int warp_last = __reduce_max_sync(0xffffffffu, lim[wm * 32 + lane]);
      // acc += q · K̄ᵀ for the chunk in shared memory with Q q terms, the term pairs in mma_tile's
      // order (j outer, i inner, then mt, nt: each accumulator sums the same products in the same
      // order, so the logits are bit-identical to v1's).
      auto mma_tile_v2 = [&](auto q_terms, float (&acc)[2][2][4]) {
        constexpr int Q = decltype(q_terms)::value;
        uint32_t a_k = a_s, b_k = b_s;
#pragma unroll 2
        for (int k0 = 0; k0 < p.dpad; k0 += 16, a_k += 32u, b_k += 32u) {
          uint32_t a[Q][2][4];
#pragma unroll
          for (int i = 0; i < Q; ++i) {
            ldmatrix_x4(a[i][0], a_k + i * a_term);
            ldmatrix_x4(a[i][1], a_k + i * a_term + a_tile);
          }
#pragma unroll
          for (int j = 0; j < 3; ++j) {
            uint32_t b[4];  // n8 tile 0: b[0], b[1]; tile 1: b[2], b[3]
            ldmatrix_x4(b, b_k + j * b_term);
#pragma unroll
            for (int i = 0; i < Q; ++i)
              if (i + j <= 2)
#pragma unroll
                for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                  for (int nt = 0; nt < 2; ++nt) Bf16::mma(acc[mt][nt], a[i][mt], b[2 * nt], b[2 * nt + 1]);
          }
        }
      };
      const int nr_log2 = nr == 16 ? 4 : 3;
      const int cc = lane & 3;
      // After the transpose this lane holds row-combination q = cc (m16 tile q / 2, rows +8 if q odd).
      const int my_row = wm * 32 + (cc >> 1) * 16 + (lane >> 2) + (cc & 1) * 8;
      float2* my_part = part + my_row * nvis;
      // The partials of this chunk's blocks in the warp's 16 columns, from the accumulators.
      auto block_partials_v2 = [&](int j0, const float (&acc)[2][2][4]) {
        // x[q][k]: the scaled logit (−inf where not visible) of row-combination q = 2·mt + h2
        // (row wm·32 + mt·16 + lane/4 + 8·h2) at column 8·(k/2) + 2·cc + k%2 of the warp's 16.
        float x[4][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int h2 = 0; h2 < 2; ++h2) {
            const int lr = lim[wm * 32 + mt * 16 + (lane >> 2) + h2 * 8];
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
#pragma unroll
              for (int v = 0; v < 2; ++v)
                x[2 * mt + h2][2 * nt + v] = j0 + wn * 16 + nt * 8 + 2 * cc + v <= lr
                                                 ? __fmul_rn(acc[mt][nt][h2 * 2 + v], p.qmul)
                                                 : -INFINITY;
          }
        float y[4][4];
        quad_transpose(x, y, cc);
#pragma unroll
        for (int nb = 0; nb < 2; ++nb) {
          if (nb * nr >= 16) continue;  // nr 16: one block per warp
          const int n = (j0 + wn * 16 + nb * nr) >> nr_log2;
          if (n * nr > last) continue;  // past every row's last key stride (warp-uniform)
          my_part[n] = block_pair(y, nr, nb);
        }
      };
      if (last >= 0) kcopy.issue(0);
      for (int j0 = 0; j0 <= last; j0 += kMmaCols) {
        float acc[2][2][4] = {};
        cp_async_wait<0>();
        __syncthreads();  // the K̄ tile of j0 is in shared memory
        if (warp_last >= j0) {
          if (p.qterms == 1)
            mma_tile_v2(std::integral_constant<int, 1>{}, acc);
          else if (p.qterms == 2)
            mma_tile_v2(std::integral_constant<int, 2>{}, acc);
          else
            mma_tile_v2(std::integral_constant<int, 3>{}, acc);
        }
        __syncthreads();  // every warp is done with it
        if (j0 + kMmaCols <= last) kcopy.issue(j0 + kMmaCols);
        block_partials_v2(j0, acc);
      }
      __syncthreads();  // the partials are read by other threads below
    } else
    // Tensor-core kernel with blocks of 8 or 16 key strides (B 128 at S 16 / 8): every block of the
    // chunk lies in one warp's 16 columns, so its (max, Σexp) comes straight from the
    // accumulators, the quad's 4 lanes combined by shuffles; the Σexp runs over the columns in
    // the f32 kernel's order (the terms gathered by shuffles), so equal logits give bit-identical
    // partials (the scaled logit is a separately rounded product, __fmul_rn, never fused into the
    // subtraction of the max). rr also prefetches the next chunk's K̄ tile while the partials are
    // formed.
    if (kMma && (nr == 8 || nr == 16)) {
      // Partials of the blocks in this warp's columns from its accumulators.
      auto block_partials = [&](int64_t j0, const float (&acc)[2][2][4]) {
        const int cc = lane & 3;
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int h2 = 0; h2 < 2; ++h2) {
            const int r = wm * 32 + mt * 16 + (lane >> 2) + h2 * 8;
            const int lr = lim[r];
            float x[2][2];
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
#pragma unroll
              for (int v = 0; v < 2; ++v)
                x[nt][v] = j0 + wn * 16 + nt * 8 + 2 * cc + v <= lr ? __fmul_rn(acc[mt][nt][h2 * 2 + v], p.qmul)
                                                                    : -INFINITY;
#pragma unroll
            for (int nb = 0; nb < 2; ++nb) {
              if (nb * nr >= 16) continue;  // nr 16: one block per warp
              const int64_t n = (j0 + wn * 16 + nb * nr) / nr;
              if (n * nr > last) continue;  // past every row's last key stride (warp-uniform)
              const int nt0 = nr == 16 ? 0 : nb, nt1 = nr == 16 ? 1 : nb;
              float cm = -INFINITY;
#pragma unroll
              for (int nt = 0; nt < 2; ++nt)
                if (nt >= nt0 && nt <= nt1) cm = fmaxf(fmaxf(cm, x[nt][0]), x[nt][1]);
              cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 1));
              cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 2));
              float cs = 0.f;
#pragma unroll
              for (int nt = 0; nt < 2; ++nt) {
                if (nt < nt0 || nt > nt1) continue;
                const float e0 = expf(x[nt][0] - cm), e1 = expf(x[nt][1] - cm);
#pragma unroll
                for (int src = 0; src < 4; ++src) {  // columns 2·src, 2·src + 1 of this n8 tile
                  const float w0 = __shfl_sync(0xffffffffu, e0, (lane & ~3) | src);
                  const float w1 = __shfl_sync(0xffffffffu, e1, (lane & ~3) | src);
                  if (cm != -INFINITY) cs = cs + w0 + w1;
                }
              }
              if (cc == 0) part[r * nvis + n] = make_float2(cm, cs);
            }
          }
      };
      if (p.rr && last >= 0) issue_k_rr(0);
      for (int64_t j0 = 0; j0 <= last; j0 += kCols) {
        float acc[2][2][4] = {};
        if (p.rr) {
          cp_async_wait<0>();
          __syncthreads();  // the K̄ tile of j0 is in shared memory
          mma_tile(acc);
          __syncthreads();  // every warp is done with it
          if (j0 + kCols <= last) issue_k_rr(j0 + kCols);
        } else {
          mma_chunk(j0, acc);
        }
        block_partials(j0, acc);
      }
      __syncthreads();  // the partials are read by other threads below
    } else
    for (int64_t j0 = 0; j0 <= last; j0 += kCols) {
      fill_logits(j0);
      __syncthreads();
      const int64_t jend = min(j0 + kCols - 1, int64_t(last));
      const int64_t nb0 = j0 / nr, nblk = jend / nr - nb0 + 1;  // key blocks touched by this chunk
      // One thread per (row, block): the chunk's columns of key block nb0 + b, merged with the
      // block's partial from the previous chunk when the block started there.
      for (int idx = tid; idx < kScoreRows * nblk; idx += kScoreThreads) {
        const int r = idx / int(nblk), b = idx % int(nblk);
        const int64_t n = nb0 + b;
        const int64_t c0 = max(n * nr - j0, int64_t(0));
        const int64_t c1 = min((n + 1) * nr - j0, int64_t(kCols));
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

// ---- Scoring kernel v3 (docs/rrattention.md, "Scoring kernel v3"): rr, bf16 q (one term), blocks
// of 8 or 16 key strides, one row round. A CTA owns 128 rows: G = 128 / R adjacent query blocks of
// one sequence, R = heads_per_cta · B/S rows each (the rows of one v2 CTA), so every K̄ tile
// copied from L2 serves G·R rows instead of R (S 8: 2 × 64; S 16: 4 × 32, where v2 has 32 live
// rows of 64), and each B fragment feeds 8 mma instead of 4. 8 warps, each 64 rows × 16 key
// strides; v2's single K̄ tile and two barriers per chunk; two CTAs per SM (87 KB each at d 128).
// CTA x of the grid (CTAs, heads_kv, z) owns the query blocks p.v3_ctas[2x] … + p.v3_ctas[2x + 1]
// − 1 (host-built, the longest CTAs first). Each group's logits, partials, row sums and block
// scores are v2's bit for bit: the same products per accumulator in the same order, the same
// expf terms in the same order, and the same scratch rows (a group writes the partials of the v2
// CTA of its query block). With head_dim 128 the host runs the wgmma variant below instead.
constexpr int kV3Rows = 128, kV3Threads = 256, kV3MaxGroups = kV3Rows / 8;  // R >= 8
// Dynamic shared memory: q tile [128][dpad+8] bf16 | K̄ tile [64 · 3][dpad+8] bf16 (v2's).
struct V3Smem {
  static __host__ __device__ int bpitch(const ScoreParams& p) { return p.dpad + 8; }
  static __host__ __device__ size_t q_bytes(const ScoreParams& p) { return size_t(2) * kV3Rows * bpitch(p); }
  static __host__ __device__ size_t total(const ScoreParams& p) {
    return q_bytes(p) + size_t(2) * 3 * kMmaCols * bpitch(p);
  }
};

// The tables of a v3 CTA, both variants (in the kernel's shared memory): per group (query block
// m0 + g) the last key stride its rows see, its sampled strides, visible key blocks and partials
// (the v2 CTA's scratch rows); per row its last key stride, sampled query and query head
// (relative to head0). lim, qpos, rhead hold kRows entries; glast, gnract, gnvis, gpart
// kMaxGroups. Ends with a barrier. (Scalars and pointers, not references to the arrays: so
// written, both kernels compile to the SASS they had with this code inline, byte for byte.)
template <int kRows, int kMaxGroups>
__device__ __forceinline__ void v3_tables(const ScoreParams& p, const EstSeq& e, const int gb0, const int ngroups,
                                          const int64_t m0, const int kvh, const int S, const int nr, const int R,
                                          const int head0, const int heads_here, const int tid, int* lim, int* qpos,
                                          int* rhead, int* glast, int* gnract, int* gnvis, float2** gpart) {
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
  // Row r: group r / R, then v2's order inside the group (head-major, nr strides per head).
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

// The sampled queries of a v3 / wgmma CTA as a bf16 tile: row r of dst (pitch elements) holds q at
// local position qpos[r], query head head0 + rhead[r], for the rows with lim[r] >= 0; the other
// rows and the columns from d to ncols are zero. bf16 input whose rows start on 16 bytes (d a
// multiple of 8) is copied as 16-byte vectors, eight loads in flight per thread before any store:
// the input's bits, which is what load_elem then __float2bfloat16_rn gives for bf16. One scalar
// load per element, each waited before the next (the other inputs' path), left this copy a fifth
// of the wgmma kernel's stall samples at 32K (docs/rrattention.md, "Scoring latency: the CTA's
// prologue and epilogue").
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

// e^x for the row sums and block scores of a v3 CTA: expf in the exact builds (v2's bits), one
// ex2.approx of x·log2 e in the approximate ones (kApprox; relative error ~2^-22 plus |x|·2^-24
// from the scaling, on terms e^x <= 1 here: docs/numerics.md, "Approximate scoring").
template <bool kFast>
__device__ __forceinline__ float exp_term(float x) {
  if constexpr (kFast) return ex2(x * 1.4426950408889634f);
  return expf(x);
}

// (m, s) ⊕ (m2, s2) for two (max, Σexp(x − max)) pairs. Exact builds: v2's two expf, in v2's
// form (their bits). kFast: one exponential, of the non-positive difference, instead of two.
template <bool kFast>
__device__ __forceinline__ void merge_max_sum(float& m, float& s, const float m2, const float s2) {
  if constexpr (kFast) {
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

// After a v3 CTA's partials (and a barrier): each row's max and sum over its blocks (warp w owns
// rows 16w … 16w+15), then the block scores per group, as v2.
template <int kThreads, bool kFastExp = false>
__device__ __forceinline__ void v3_row_sums_and_scores(const ScoreParams& p, const EstSeq& e, const int ngroups,
                                                       const int64_t m0, const int nr, const int R, const int head0,
                                                       const int heads_here, const int tid, const int warp,
                                                       const int lane, const int* glast, const int* gnract,
                                                       const int* gnvis, float2* const* gpart, float* rmax, float* rmul) {
  // Exact builds (the else branch): four rows at a time: each lane loads its partials of the
  // four, kInFlight per row, before it combines any, and combines each row's in v2's order
  // (n = lane, lane + 32, ...): the values of the one-row, one-load-one-combine loop this replaces. That loop held a quarter of the wgmma
  // kernel's stall samples at 32K; the batched loads alone did not shorten it (the merges'
  // arithmetic bounds it), the approximate builds' one-exponential merge did, by 5% of the kernel
  // (docs/rrattention.md, "Scoring latency: the CTA's prologue and epilogue").
  constexpr int kRowsAtOnce = 4, kInFlight = 4;
  if constexpr (kFastExp) {
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
          if (x[j][il].y > 0.f) v += x[j][il].y * exp_term<kFastExp>(x[j][il].x - rmax[rh + il]) * rmul[rh + il];
        }
        p.scores[sp[j]] = old[j] + v;
      }
    }
  }
}

// At most 128 registers a thread: two CTAs per SM.
__global__ void __launch_bounds__(kV3Threads, 2) scores_v3_kernel(ScoreParams p) {
  constexpr int kRows = kV3Rows, kThreads = kV3Threads, kMaxGroups = kV3MaxGroups;
  extern __shared__ float4 smem4[];
  char* smem = reinterpret_cast<char*>(smem4);
  __nv_bfloat16* qa = reinterpret_cast<__nv_bfloat16*>(smem);
  const int bp = V3Smem::bpitch(p);
  const uint32_t kb_s = smem_addr(smem + V3Smem::q_bytes(p));
  __shared__ int lim[kRows];    // last visible key stride of each row (−1: no row)
  __shared__ int qpos[kRows];   // the sampled query's local index
  __shared__ int rhead[kRows];  // the row's query head, relative to head0
  __shared__ float rmax[kRows], rmul[kRows];
  // Per group (query block m0 + g): last key stride of its rows, sampled strides, visible key
  // blocks, and its partials (the v2 CTA's scratch rows).
  __shared__ int glast[kMaxGroups], gnract[kMaxGroups], gnvis[kMaxGroups];
  __shared__ float2* gpart[kMaxGroups];

  const int gb0 = p.v3_ctas[2 * blockIdx.x], ngroups = p.v3_ctas[2 * blockIdx.x + 1];
  const int kvh = blockIdx.y;
  const EstSeq e = p.seqs[p.qblock_seq[gb0]];
  const int64_t m0 = p.qblock_m[gb0];
  const int S = p.stride, nr = p.spb, R = p.heads_per_cta * nr;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int head0 = kvh * p.group + int(blockIdx.z) * p.heads_per_cta;
  const int heads_here = min(p.heads_per_cta, p.group - int(blockIdx.z) * p.heads_per_cta);

  v3_tables<kRows, kMaxGroups>(p, e, gb0, ngroups, m0, kvh, S, nr, R, head0, heads_here, tid, lim, qpos, rhead, glast,
                        gnract, gnvis, gpart);
  // The q tile: the sampled queries as bf16 (the input itself: one exact term), zero rows past
  // the CTA's rows and zero columns past d.
  stage_q_tile<kThreads>(p, e, kRows, p.dpad, head0, lim, qpos, rhead, qa, bp, tid);
  int last = -1;  // the last key stride any row of the CTA sees
  for (int g = 0; g < ngroups; ++g) last = max(last, glast[g]);

  const KbarTileCopy<kThreads> kcopy(p, e, kvh, kb_s, bp, tid);
  // Warp w: rows 64·(w % 2) … +63 (four m16 tiles) × key strides 16·(w / 2) … +15 (two n8 tiles)
  // of each 64-stride chunk. ldmatrix row addresses (bytes): q tile mt: row wm·64 + mt·16 +
  // lane % 16, column (lane / 16)·8; K̄ as v2. The k step adds 32 bytes to both.
  const int wm = warp % 2, wn = warp / 2;
  const uint32_t a_s = smem_addr(qa) + uint32_t(((wm * 64 + (lane & 15)) * bp + (lane >> 4) * 8) * 2);
  const uint32_t a_tile = uint32_t(16 * bp * 2);
  const uint32_t b_s =
      kb_s + uint32_t((3 * (wn * 16 + (lane >> 4) * 8 + (lane & 7)) * bp + ((lane >> 3) & 1) * 8) * 2);
  const uint32_t b_term = uint32_t(bp * 2);
  // A chunk past every row of this warp leaves its logits all masked: its mma work is skipped.
  const int warp_last = __reduce_max_sync(0xffffffffu, max(lim[wm * 64 + lane], lim[wm * 64 + 32 + lane]));
  const int nr_log2 = nr == 16 ? 4 : 3;
  const int cc = lane & 3;
  // After the transpose of half hp (m16 tiles 2·hp, 2·hp + 1) this lane holds one row: its
  // partials and its group's last key stride (−1 for rows outside every group: nothing written).
  float2* my_part[2];
  int my_last[2];
#pragma unroll
  for (int hp = 0; hp < 2; ++hp) {
    const int row = wm * 64 + hp * 32 + (cc >> 1) * 16 + (lane >> 2) + (cc & 1) * 8;
    const int g = row / R;
    my_part[hp] = g < ngroups ? gpart[g] + (row - g * R) * gnvis[g] : nullptr;
    my_last[hp] = g < ngroups ? glast[g] : -1;
  }

  if (last >= 0) kcopy.issue(0);
  for (int j0 = 0; j0 <= last; j0 += kMmaCols) {
    float acc[4][2][4] = {};
    cp_async_wait<0>();
    __syncthreads();  // the K̄ tile of j0 is in shared memory
    if (warp_last >= j0) {
      // acc += q · K̄ᵀ, per accumulator k step outer, then term j of K̄: v1's product order.
      uint32_t a_k = a_s, b_k = b_s;
#pragma unroll 2
      for (int k0 = 0; k0 < p.dpad; k0 += 16, a_k += 32u, b_k += 32u) {
        uint32_t a[4][4];
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) ldmatrix_x4(a[mt], a_k + mt * a_tile);
#pragma unroll
        for (int j = 0; j < 3; ++j) {
          uint32_t b[4];  // n8 tile 0: b[0], b[1]; tile 1: b[2], b[3]
          ldmatrix_x4(b, b_k + j * b_term);
#pragma unroll
          for (int mt = 0; mt < 4; ++mt)
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) Bf16::mma(acc[mt][nt], a[mt], b[2 * nt], b[2 * nt + 1]);
        }
      }
    }
    __syncthreads();  // every warp is done with the tile
    if (j0 + kMmaCols <= last) kcopy.issue(j0 + kMmaCols);
    // The partials of this chunk's blocks in the warp's 16 columns (v2's, per half).
#pragma unroll
    for (int hp = 0; hp < 2; ++hp) {
      float x[4][4];
#pragma unroll
      for (int mtl = 0; mtl < 2; ++mtl)
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
          const int mt = 2 * hp + mtl;
          const int lr = lim[wm * 64 + mt * 16 + (lane >> 2) + h2 * 8];
#pragma unroll
          for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int v = 0; v < 2; ++v)
              x[2 * mtl + h2][2 * nt + v] = j0 + wn * 16 + nt * 8 + 2 * cc + v <= lr
                                                ? __fmul_rn(acc[mt][nt][h2 * 2 + v], p.qmul)
                                                : -INFINITY;
        }
      float y[4][4];
      quad_transpose(x, y, cc);
#pragma unroll
      for (int nb = 0; nb < 2; ++nb) {
        if (nb * nr >= 16) continue;  // nr 16: one block per warp
        const int n = (j0 + wn * 16 + nb * nr) >> nr_log2;
        if (n * nr > my_last[hp]) continue;  // past every row of the group (v2's CTA-wide test)
        my_part[hp][n] = block_pair(y, nr, nb);
      }
    }
  }
  __syncthreads();  // the partials are read by other threads below

  v3_row_sums_and_scores<kThreads>(p, e, ngroups, m0, nr, R, head0, heads_here, tid, warp, lane, glast, gnract, gnvis,
                              gpart, rmax, rmul);
}

// ---- v3, wgmma variant (docs/rrattention.md, "Scoring kernel v3"): head_dim 128 (dpad 128) only,
// where the host runs it instead of the 128-row kernel above (ARIADNE_EST_V3_KIND=narrow keeps
// that one). One warpgroup of 64 rows (G = 64 / R query blocks, the v3 grouping) per CTA and 32 key
// strides per chunk. The logits run on wgmma m64n32k16 (q as the register operand, loaded once;
// K̄'s three terms from shared memory, K-major with the 128-byte swizzle) asynchronously: chunk c's
// wgmma run while the warps form chunk c − 1's partials from the other accumulator set, so the
// tensor work leaves the warps' instruction stream and overlaps the partials. K̄ tiles: two stages
// of 24 KB, four CTAs (16 warps) per SM. Per accumulator the products are summed in v1's order
// (k step outer, then K̄ term), each k-16 group by the tensor core (the same bits as mma.sync's
// on every case measured: docs/numerics.md); the partials, row sums and block scores are v3's.
constexpr int kWgCols = 32;          // key strides per chunk
constexpr int kWgRows = 64, kWgThreads = 128;
constexpr int kWgRegion = kWgCols * 128;  // bytes of one 64-element column region of a term tile
constexpr int kWgTerm = 2 * kWgRegion;    // one K̄ term of the chunk (d 128: two regions)
constexpr int kWgStage = 3 * kWgTerm;
// Dynamic shared memory: 1024 bytes of alignment slack (the swizzle atoms sit on 1 KB
// boundaries), then two stages; the q tile [64][136] bf16 is staged in them before the first copy.
constexpr size_t kWgSmem = 1024 + 2 * kWgStage;
static_assert(2 * kWgStage >= 2 * (2 * kWgRows) * 136, "the q staging fits in the K̄ stages (up to 128 rows)");

// Four CTAs per SM: at most 128 registers a thread (uncapped it takes 158 and fits 3 CTAs; capped
// it measured 11.03 ms against 11.94 at 128K S 8, session 4).
// kFast (v3_kind 2, ARIADNE_EST_V3_FAST=1; docs/rrattention.md, "Scoring kernel v3 fast
// partials"): the same values by fewer instructions per chunk. A chunk wholly visible to the
// warp's 16 rows skips the per-logit causal test and the per-block "past the group" test (both
// always pass there); a chunk wholly inside the sequence is copied by a thread-to-vector map whose
// swizzle is fixed per thread (every offset an immediate, no zero-fill select); the wgmma
// descriptors are one base plus constants. Logits, partials and their order are kFast = false's.
// kApprox (fast builds; v3_kind 4, ARIADNE_EST_V3_FAST=3, 64 rows): the mask-free chunks' partials
// by approx_block_pairs (no transpose, ex2.approx, the quad's order): the same logits, scores
// within docs/numerics.md's rules 2 and 3 instead of bit for bit; chunks crossing a row's last key
// stride keep the exact code. kTerms 2 (with kApprox; v3_kind 5, ARIADNE_EST_V3_FAST=4): K̄'s
// two high bf16 terms only (its value to ~2^-17 relative instead of exactly; a third fewer wgmma
// and copies), in three 16 KB stages instead of two of 24 KB: the copy runs two chunks ahead. kind 6
// (ARIADNE_EST_V3_FAST=5): kind 5 with 128 rows (two warpgroups sharing each K̄ stage: half the
// L2 bytes per logit). Kind 5 is the default; kinds 4 and 6 are kept as measurement switches
// (each approximation alone; the L2 bytes), both measured no faster than it (session 7).
// kRows 128 (fast build only; v3_kind 3, ARIADNE_EST_V3_FAST=2): two warpgroups of 64 rows share
// each K̄ stage (256 threads, two CTAs and still 16 warps per SM), which halves the L2 traffic per
// logit; each warpgroup runs its own wgmma on its rows with the same descriptors.
template <bool kFast, int kRows = kWgRows, bool kApprox = false, int kTerms = 3>
__global__ void __launch_bounds__(2 * kRows, kRows == kWgRows ? 4 : 2) scores_wg_kernel(ScoreParams p) {
  static_assert(kRows == kWgRows || (kFast && kRows == 2 * kWgRows), "64 rows, or 128 in the fast build");
  static_assert(!kApprox || kFast, "approximate partials: the fast builds");
  static_assert(kTerms == 3 || (kApprox && kTerms == 2), "two K̄ terms: the approximate build only");
  constexpr int kThreads = 2 * kRows, kMaxGroups = kRows / 8;
  constexpr int kRowStep = kThreads / 16;  // K̄ term rows one copy step covers (16 vectors each)
  extern __shared__ float4 smem4[];
  const uint32_t base = (smem_addr(smem4) + 1023u) & ~1023u;
  char* const base_ptr = reinterpret_cast<char*>(smem4) + (base - smem_addr(smem4));
  __shared__ int lim[kRows], qpos[kRows], rhead[kRows];
  __shared__ float rmax[kRows], rmul[kRows];
  __shared__ int glast[kMaxGroups], gnract[kMaxGroups], gnvis[kMaxGroups];
  __shared__ float2* gpart[kMaxGroups];

  const int gb0 = p.v3_ctas[2 * blockIdx.x], ngroups = p.v3_ctas[2 * blockIdx.x + 1];
  const int kvh = blockIdx.y;
  const EstSeq e = p.seqs[p.qblock_seq[gb0]];
  const int64_t m0 = p.qblock_m[gb0];
  const int S = p.stride, nr = p.spb, R = p.heads_per_cta * nr;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int head0 = kvh * p.group + int(blockIdx.z) * p.heads_per_cta;
  const int heads_here = min(p.heads_per_cta, p.group - int(blockIdx.z) * p.heads_per_cta);

  v3_tables<kRows, kMaxGroups>(p, e, gb0, ngroups, m0, kvh, S, nr, R, head0, heads_here, tid, lim, qpos, rhead, glast,
                        gnract, gnvis, gpart);
  // q staged as [64][136] bf16, then each warp's A fragments (rows 16·warp … +15, 8 k steps) into
  // registers for the whole CTA.
  __nv_bfloat16* qs = reinterpret_cast<__nv_bfloat16*>(base_ptr);
  constexpr int kQp = 136;
  stage_q_tile<kThreads>(p, e, kRows, 128, head0, lim, qpos, rhead, qs, kQp, tid);
  __syncthreads();
  uint32_t a[8][4];
  {
    const uint32_t a0 = base + uint32_t(((warp * 16 + (lane & 15)) * kQp + (lane >> 4) * 8) * 2);
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) ldmatrix_x4(a[ks], a0 + ks * 32);
  }
  int last = -1;
  for (int g = 0; g < ngroups; ++g) last = max(last, glast[g]);
  __syncthreads();  // the staging area becomes the K̄ stages

  // K̄ copy: chunk j0 … j0+31, 32 · 3 term rows of 16 vectors, 12 per thread (6 with 256). A
  // thread's vector column u = tid % 16 is fixed (128 threads = kRowStep = 8 term rows of 16
  // vectors); its term row 3n + j advances by kRowStep per step. Row n of term j, 16-byte piece u: region u / 8, piece (u % 8) ^ (n % 8)
  // of the row's 128 bytes (the 128-byte swizzle the descriptors below read).
  const __nv_bfloat16* kseq =
      static_cast<const __nv_bfloat16*>(p.ksplit) + (int64_t(kvh) * p.total_ks + e.ks_base) * 3 * 128;
  const int cu = tid & 15, row30 = tid >> 4;
  const uint32_t cu_region = uint32_t((cu >> 3) * kWgRegion);
  const int nks = int(e.nks);
  // A stage holds kTerms term tiles; with two terms three stages fit where two of three terms did
  // (48 KB), and the copy runs two chunks ahead instead of one.
  constexpr int kStage = kTerms * kWgTerm, kStages = kTerms == 2 ? 3 : 2;
  static_assert(kStages * kStage <= 2 * kWgStage, "the stages fit in kWgSmem");
  auto issue = [&](int j0, int stage) {
    const __nv_bfloat16* src = kseq + (int64_t(j0) * 3 + row30) * 128 + cu * 8;
    int n = row30 / 3, j = row30 % 3;
    const uint32_t sb = base + uint32_t(stage * kStage) + cu_region;
#pragma unroll
    for (int i = 0; i < 96 / kRowStep; ++i) {
      const bool ok = j0 + n < nks;
      if (kTerms == 3 || j < kTerms)
        cp_async16(sb + uint32_t(j * kWgTerm + n * 128 + (((cu & 7) ^ (n & 7)) << 4)), ok ? src : kseq, ok);
      src += kRowStep * 128;
      n += kRowStep / 3;
      j += kRowStep % 3;
      if (j >= 3) {
        j -= 3;
        ++n;
      }
    }
    cp_async_commit();
  };
  // B descriptor of term j, k step ks, stage st: region ks / 4, 32 bytes per k step inside it.
  auto bdesc = [&](int st, int j, int ks) {
    return wg::desc_swizzled<128>(base + uint32_t(st * kStage + j * kWgTerm + (ks >> 2) * kWgRegion + (ks & 3) * 32),
                                  16, 1024);
  };
  // kFast: bdesc's value with one 32-bit add (wg::desc_at: base + both stages < 256 KB).
  const wg::DescWords desc0 = wg::desc_words<128>(base, 16, 1024);
  auto bdesc_fast = [&](const wg::DescWords& st_words, int j, int ks) {
    return wg::desc_at(st_words, uint32_t(j * kWgTerm + (ks >> 2) * kWgRegion + (ks & 3) * 32));
  };
  // kFast copy of a chunk wholly inside the sequence (j0 + 32 <= nks): thread tid takes vector
  // column cu of rows n0 + kRowStep·k (n0 = tid / 16, k < 32 / kRowStep: 4 with 128 threads, 2
  // with 256) of each term j. Every row it writes has n % 8 = n0 % 8 (kRowStep is 8 or 16), so
  // its swizzled piece is fixed and its 12 (6) destinations and sources are its base plus
  // constants (row + kRowStep: kRowStep · 128 bytes; term: kWgTerm; source row 3n + j: 256 bytes
  // each). (With 128 threads n0 < 8 already: no mask, the SASS that was counted.)
  const int n0 = tid >> 4;
  const uint32_t fast_dst = base + cu_region + uint32_t(n0 * 128 + (((cu & 7) ^ (kRowStep == 8 ? n0 : n0 & 7)) << 4));
  const __nv_bfloat16* const fast_src = kseq + n0 * 3 * 128 + cu * 8;
  auto issue_full = [&](int j0, int stage) {
    const __nv_bfloat16* src = fast_src + int64_t(j0) * 3 * 128;
    const uint32_t sb = fast_dst + uint32_t(stage * kStage);
#pragma unroll
    for (int k = 0; k < 32 / kRowStep; ++k)
#pragma unroll
      for (int j = 0; j < kTerms; ++j)
        cp_async16(sb + uint32_t(j * kWgTerm + k * kRowStep * 128), src + (k * kRowStep * 3 + j) * 128, true);
    cp_async_commit();
  };
  // kFast: the smallest last visible key stride of the warp's 16 rows (−1 if one is not a row): a
  // chunk whose last column is at most this is visible to every row of the warp.
  int warp_lim = -1;
  if constexpr (kFast) warp_lim = __reduce_min_sync(0xffffffffu, lim[warp * 16 + (lane & 15)]);
  const int nr_log2 = nr == 16 ? 4 : 3;
  const int cc = lane & 3;
  // After the transpose this lane holds one row (16·warp + lane/4 + 8·(cc & 1)) and 16-column
  // group cc / 2 of the chunk.
  const int my_row = warp * 16 + (lane >> 2) + (cc & 1) * 8;
  const int my_g = my_row / R;
  float2* const my_part = my_g < ngroups ? gpart[my_g] + (my_row - my_g * R) * gnvis[my_g] : nullptr;
  const int my_last = my_g < ngroups ? glast[my_g] : -1;
  // kApprox: the partials rows of this lane's two accumulator rows (16·warp + lane/4 + 8h), and the
  // scale in log2 units. approx_block_pairs needs qmul > 0 (the max of the raw accumulators is the
  // max of the scaled logits); validate() admits scale >= 0 and the host resolves 0 to 1/√d, so
  // only a positive scale that underflows qmul to 0 takes the exact path here.
  float2* approx_rows[2] = {nullptr, nullptr};
  const float c2 = p.qmul * 1.4426950408889634f;
  const bool approx_ok = kApprox && p.qmul > 0.f;
  if constexpr (kApprox) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = warp * 16 + (lane >> 2) + 8 * h, g = row / R;
      if (g < ngroups) approx_rows[h] = gpart[g] + (row - g * R) * gnvis[g];
    }
  }
  // Partials of chunk c from its accumulators (m64n32: this warp's 16 rows; acc[4t + 2h + v] at
  // row lane/4 + 8h, column 8t + 2·cc + v).
  auto partials = [&](int c, const float (&acc)[16]) {
    const int j0 = c * kWgCols;
    if constexpr (kFast) {
      if (j0 + kWgCols - 1 <= warp_lim) {  // warp-uniform: every logit of the chunk is visible
        if constexpr (kApprox) {
          if (approx_ok) {  // uniform: a kernel parameter
            if (nr == 16)
              approx_block_pairs<2>(acc, c2, p.qmul, cc, approx_rows, j0 >> 4);
            else
              approx_block_pairs<4>(acc, c2, p.qmul, cc, approx_rows, j0 >> 3);
            return;
          }
        }
        float x[4][4];
#pragma unroll
        for (int q = 0; q < 4; ++q)
#pragma unroll
          for (int k = 0; k < 4; ++k) x[q][k] = __fmul_rn(acc[4 * (2 * (q >> 1) + (k >> 1)) + 2 * (q & 1) + (k & 1)], p.qmul);
        float y[4][4];
        quad_transpose(x, y, cc);
#pragma unroll
        for (int nb = 0; nb < 2; ++nb) {
          if (nb * nr >= 16) continue;
          // n · nr <= j0 + 31 <= this row's last stride <= its group's: the partial is always written.
          my_part[(j0 + (cc >> 1) * 16 + nb * nr) >> nr_log2] = block_pair(y, nr, nb);
        }
        return;
      }
    }
    float x[4][4];
#pragma unroll
    for (int gl = 0; gl < 2; ++gl)
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) {
        const int lr = lim[warp * 16 + (lane >> 2) + h2 * 8];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int v = 0; v < 2; ++v)
            x[2 * gl + h2][2 * nt + v] = j0 + gl * 16 + nt * 8 + 2 * cc + v <= lr
                                             ? __fmul_rn(acc[4 * (2 * gl + nt) + 2 * h2 + v], p.qmul)
                                             : -INFINITY;
      }
    float y[4][4];
    quad_transpose(x, y, cc);
#pragma unroll
    for (int nb = 0; nb < 2; ++nb) {
      if (nb * nr >= 16) continue;  // nr 16: one block per 16 columns
      const int n = (j0 + (cc >> 1) * 16 + nb * nr) >> nr_log2;
      if (n * nr > my_last) continue;
      my_part[n] = block_pair(y, nr, nb);
    }
  };
  const int nch = last >= 0 ? last / kWgCols + 1 : 0;
  // Chunk c: its wgmma run into cur while the warps reduce chunk c − 1 (prev); then cur is waited
  // for and becomes prev. Nothing is in flight across the loop's back edge (no register copy of an
  // accumulator a wgmma still writes), and the top barrier also frees the stage of chunk c − 1
  // (every warp waited for its wgmma) for the copy of chunk c + 1.
  float cur[16], prev[16];
  // The copy of chunk c into stage c % kStages (kFast: the fixed-swizzle copy when the chunk lies
  // wholly inside the sequence).
  auto issue_chunk = [&](int c) {
    const int stage = c % kStages;
    if (kFast && (c + 1) * kWgCols <= nks) issue_full(c * kWgCols, stage);
    else issue(c * kWgCols, stage);
  };
  if (nch > 0) issue(0, 0);
  if (kStages == 3 && nch > 1) issue_chunk(1);
  for (int c = 0; c < nch; ++c) {
    // Chunk c has landed; with three stages chunk c + 1's copy may stay in flight.
    if (kStages == 3 && c + 1 < nch) cp_async_wait<1>();
    else cp_async_wait<0>();
    wg::fence_proxy_async();  // the cp.async tile (generic proxy) before wgmma's reads (async proxy)
    __syncthreads();          // tile c is in shared memory for every warp; chunk c − 1's stage is free
    if (c + kStages - 1 < nch) issue_chunk(c + kStages - 1);
    const int st = c % kStages;
    // kFast: the descriptors' low word for stage st (the stage's offset / 16 added once a chunk).
    const wg::DescWords st_words = {desc0.lo + uint32_t(st * (kStage >> 4)), desc0.hi};  // stage st's base
#pragma unroll
    for (int i = 0; i < 16; ++i) cur[i] = 0.f;
    wg::pin(cur);
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < 8; ++ks)
#pragma unroll
      for (int j = 0; j < kTerms; ++j)
        wg::mma_m64n32k16_rs_kmajor(cur, a[ks], kFast ? bdesc_fast(st_words, j, ks) : bdesc(st, j, ks));
    wg::commit();
    if (c >= 1) partials(c - 1, prev);
    wg::wait<0>();
    wg::pin(cur);
#pragma unroll
    for (int i = 0; i < 16; ++i) prev[i] = cur[i];
  }
  if (nch > 0) partials(nch - 1, prev);
  __syncthreads();  // the partials are read by other threads below

  v3_row_sums_and_scores<kThreads, kApprox>(p, e, ngroups, m0, nr, R, head0, heads_here, tid, warp, lane, glast, gnract, gnvis,
                              gpart, rmax, rmul);
}

}  // namespace

cudaError_t launch_key_stride_sums(const ScoreParams& p, cudaStream_t stream) {
  if (p.total_ks == 0) return cudaSuccess;
  // 16-bit keys in 16-byte vectors: the vector kernel (same sums); anything else the scalar one.
  const bool vec = (p.dtype == 1 || p.dtype == 2) && p.d % 8 == 0 && reinterpret_cast<uintptr_t>(p.k) % 16 == 0 &&
                   p.k_tok % 8 == 0 && p.k_head % 8 == 0 && !p.sums_scalar;
  if (vec) {
    const int64_t items = p.total_ks * p.heads_kv * ((p.mma ? p.dpad : p.d) / 8);
    constexpr int threads = 256;
    const unsigned blocks = unsigned((items + threads - 1) / threads);
    if (p.dtype == 1)
      key_stride_sums_vec_kernel<__nv_bfloat16><<<blocks, threads, 0, stream>>>(p, items);
    else
      key_stride_sums_vec_kernel<__half><<<blocks, threads, 0, stream>>>(p, items);
    return cudaGetLastError();
  }
  const int threads = p.d < 128 ? ((p.d + 31) / 32) * 32 : 128;
  key_stride_sums_kernel<<<dim3(unsigned(p.total_ks), unsigned(p.heads_kv)), threads, 0, stream>>>(p);
  return cudaGetLastError();
}

size_t scores_smem_bytes(const ScoreParams& p) {
  if (p.v3) return p.v3_kind >= 1 ? kWgSmem : V3Smem::total(p);
  if (p.v2) return ScoreSmem<true, true>::total(p);
  return p.mma ? ScoreSmem<true>::total(p) : ScoreSmem<false>::total(p);
}

bool scores_v2_applies(const ScoreParams& p) {
  return p.mma && p.rr && p.kterms == 3 && (p.spb == 8 || p.spb == 16) && p.row_split == 1;
}

bool scores_v3_applies(const ScoreParams& p) {
  return scores_v2_applies(p) && p.qterms == 1 && (p.v3_kind == 0 || p.dpad == 128);
}

int scores_v3_blocks_per_cta(const ScoreParams& p) {
  const bool rows128 = p.v3_kind == 3 || p.v3_kind == 6;
  return (rows128 ? 2 * kWgRows : p.v3_kind >= 1 ? kWgRows : kV3Rows) / (p.heads_per_cta * p.spb);
}

cudaError_t launch_scores(const ScoreParams& p, int64_t total_qblocks, cudaStream_t stream) {
  if (total_qblocks == 0) return cudaSuccess;
  const size_t smem = scores_smem_bytes(p);
  const unsigned zc = unsigned((p.group + p.heads_per_cta - 1) / p.heads_per_cta);
  if (p.v3) {
    if (!scores_v3_applies(p) || p.v3_ctas == nullptr || p.v3_num_ctas <= 0) return cudaErrorInvalidValue;
    const auto kernel = p.v3_kind == 6   ? scores_wg_kernel<true, 2 * kWgRows, true, 2>
                        : p.v3_kind == 5 ? scores_wg_kernel<true, kWgRows, true, 2>
                        : p.v3_kind == 4 ? scores_wg_kernel<true, kWgRows, true>
                        : p.v3_kind == 3 ? scores_wg_kernel<true, 2 * kWgRows>
                        : p.v3_kind == 2 ? scores_wg_kernel<true>
                        : p.v3_kind == 1 ? scores_wg_kernel<false>
                                         : scores_v3_kernel;
    const int threads = p.v3_kind == 3 || p.v3_kind == 6 ? 2 * kWgThreads : p.v3_kind >= 1 ? kWgThreads : kV3Threads;
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (err == cudaSuccess) err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
    if (err != cudaSuccess) return err;
    kernel<<<dim3(unsigned(p.v3_num_ctas), unsigned(p.heads_kv), zc), threads, smem, stream>>>(p);
    return cudaGetLastError();
  }
  if (p.v2 && !scores_v2_applies(p)) return cudaErrorInvalidValue;  // the host checks first
  const auto kernel = p.v2 ? scores_kernel<true, true> : p.mma ? scores_kernel<true> : scores_kernel<false>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (err != cudaSuccess) return err;
  if (p.v2) {
    // v2 is sized for 3 CTAs per SM (70 KB each at bf16 q): ask for the largest shared-memory
    // carveout so that the L1 split does not cap that (its loads bypass L1: cp.async.cg).
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
    if (err != cudaSuccess) return err;
  }
  kernel<<<dim3(unsigned(total_qblocks), unsigned(p.heads_kv), zc), kScoreThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace ariadne::cuda
