// The one-block-per-CTA scoring kernels of the stride-level estimators (RRAttention, XAttention,
// and the oracle as XAttention at S = 1): f32, mma_generic and mma_rr (CudaScoring). Stride
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
// The logits come from one of the kernel's variants (template flags, the rest is shared): the
// f32 kernel (CUDA-core FMAs, each lane one key stride, the CPU's products) and the tensor-
// core kernel (mma.sync m16n8k16 bf16 → f32, 64 key strides per chunk). The tensor-core kernel
// keeps f32 accuracy by splitting each operand exactly into bf16 terms: a bf16 input is one
// term, an f16 input two (11 significant bits), an f32 value three (8 + 8 + 8 bits = 24, so
// hi + mid + lo is the value itself); K̄ (f32 sums) is always three. Every bf16 product is exact
// in f32, and the products of terms (i, j) with i + j <= 2 are all accumulated (the dropped ones
// are below 2^-24 of the product): the logits then differ from the f32 kernel's only by the order
// and rounding of the f32 sums (docs/numerics.md). The scale is applied to the finished logit,
// not folded into q (q·scale is not a bf16 number). The RR variant (mma_rr) restructures the
// tensor-core chunk loop for blocks of 8 or 16 key strides, with the same scores bit for bit.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "estimate/cuda/estimate.cuh"
#include "estimate/cuda/score_common.cuh"
#include "device/cuda/mma.cuh"

namespace ariadne::cuda {
namespace {

constexpr int kQPitch = kScoreRows + 4;  // q tile [d][68]: float4-aligned, 4-way store conflicts at most

// Shared-memory plan of the scoring kernel (bytes from the dynamic base).
//   f32: logits [64][33] f32 | q tile [d][kQPitch] f32 | key tile [32][d+1] f32
//   mma: logits [64][65] f32 | q tile [qterms][64][dpad+8] bf16 | key tile [kterms][64][dpad+8] bf16
// The bf16 rows are padded by 8 elements (16 bytes): the 8 row addresses of an ldmatrix then fall
// in 8 different 4-bank groups, and every row start stays 16-byte aligned.
//   kRR (rr, blocks of 8 or 16 key strides): no logits | q tile as mma | key tile [64 · 3][dpad+8] bf16,
//   row 3c + i holding term i of key stride c (the global layout of K̄'s terms, so a chunk's copy
//   is one contiguous stream). The row pitch is 3 · (2 · dpad + 16) bytes between key strides, an
//   odd multiple of 16 modulo 128: an ldmatrix's 8 rows still fall in 8 different 4-bank groups.
template <bool kMma, bool kRR = false>
struct ScoreSmem {
  static constexpr int cols = kMma ? kMmaCols : kScoreCols;  // key strides per chunk
  static constexpr int ppitch = cols + 1;
  static __host__ __device__ size_t logits_bytes() { return kRR ? 0 : sizeof(float) * size_t(kScoreRows) * ppitch; }
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
// kRR (mma_rr; only with kMma, and the host runs it only for rr with blocks of 8 or 16 key strides
// and one row round): the restructured chunk loop below (docs/design/estimate.md).
template <bool kMma, bool kRR = false>
__global__ void __launch_bounds__(kScoreThreads) scores_kernel(ScoreParams p) {
  static_assert(kMma || !kRR, "the RR variant is a tensor-core one");
  using Sm = ScoreSmem<kMma, kRR>;
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
    if constexpr (kRR) {
      // ---- mma_rr: rr, blocks of 8 or 16 key strides, one row round (the host guarantees it). Same
      // logits and the same (max, Σexp) partials, bit for bit, as the loop below; what differs is
      // the work per 64-stride chunk:
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
      // order, so the logits are bit-identical to the generic kernel's).
      auto mma_tile_rr = [&](auto q_terms, float (&acc)[2][2][4]) {
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
      auto block_partials_rr = [&](int j0, const float (&acc)[2][2][4]) {
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
            mma_tile_rr(std::integral_constant<int, 1>{}, acc);
          else if (p.qterms == 2)
            mma_tile_rr(std::integral_constant<int, 2>{}, acc);
          else
            mma_tile_rr(std::integral_constant<int, 3>{}, acc);
        }
        __syncthreads();  // every warp is done with it
        if (j0 + kMmaCols <= last) kcopy.issue(j0 + kMmaCols);
        block_partials_rr(j0, acc);
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

}  // namespace

size_t scores_generic_smem_bytes(const ScoreParams& p) {
  if (p.kernel == CudaScoring::mma_rr) return ScoreSmem<true, true>::total(p);
  return p.mma ? ScoreSmem<true>::total(p) : ScoreSmem<false>::total(p);
}

cudaError_t launch_scores_generic(const ScoreParams& p, dim3 grid, size_t smem, cudaStream_t stream) {
  const bool rr = p.kernel == CudaScoring::mma_rr;
  const auto kernel = rr ? scores_kernel<true, true> : p.mma ? scores_kernel<true> : scores_kernel<false>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (err != cudaSuccess) return err;
  if (rr) {
    // Sized for 3 CTAs per SM (70 KB each at bf16 q): ask for the largest shared-memory carveout
    // so that the L1 split does not cap that (its loads bypass L1: cp.async.cg).
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
    if (err != cudaSuccess) return err;
  }
  kernel<<<grid, kScoreThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace ariadne::cuda
