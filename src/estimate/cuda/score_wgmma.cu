// The wgmma scoring kernel (CudaScoring::wgmma_exact, wgmma_approximate): RR, bf16 q and k,
// head_dim padded to 128, blocks of 8 or 16 key strides. One warpgroup of 64 rows per CTA (G = 64 / R
// adjacent query blocks of one sequence, R = heads_per_cta · B/S rows each: the grouping of
// score_grouped.cuh) and 32 key strides per chunk. The logits run on wgmma m64n32k16 (q as the
// register operand, loaded once; K̄'s terms from shared memory, K-major with the 128-byte swizzle)
// asynchronously: chunk c's wgmma run while the warps form chunk c − 1's partials from the other
// accumulator set, so the tensor work leaves the warps' instruction stream and overlaps the
// partials. Four CTAs (16 warps) per SM. Per accumulator the products are summed in the generic
// kernel's order (k step outer, then K̄ term), each k-16 group by the tensor core (the same bits as
// mma.sync's on every case measured: docs/numerics.md); docs/design/estimate.md has the design and
// its measurements.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "estimate/cuda/estimate.cuh"
#include "estimate/cuda/score_common.cuh"
#include "estimate/cuda/score_grouped.cuh"
#include "device/cuda/mma.cuh"
#include "device/cuda/wgmma.cuh"

namespace ariadne::cuda {
namespace {

// Approximate partials (the approximate build; docs/numerics.md, "Approximate scoring"): (max,
// Σexp) of each key block of a chunk's 32 columns, for this lane's two rows, straight from the
// m64n32 accumulators (acc[4t + 2h + v]: row lane/4 + 8h, column 8t + 2·cc + v). No transpose: a
// block's max and sum are combined over the quad by two butterfly shuffles each, and the terms are
// ex2.approx(acc·c2 − max·c2) with c2 = qmul·log2 e (one FFMA and one MUFU per logit). qmul > 0
// (the caller's test), so the max of the raw accumulators, scaled once, is the max of the scaled
// logits bit for bit; Σexp differs from the exact path's by the approximation (rel. ~2^-22 per term)
// and the summation order: docs/numerics.md rule 2 and 3
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


constexpr int kWgCols = 32;          // key strides per chunk
constexpr int kWgThreads = 2 * kWgRows;
constexpr int kWgRegion = kWgCols * 128;  // bytes of one 64-element column region of a term tile
constexpr int kWgTerm = 2 * kWgRegion;    // one K̄ term of the chunk (d 128: two regions)
constexpr int kWgStage = 3 * kWgTerm;
// Dynamic shared memory: 1024 bytes of alignment slack (the swizzle atoms sit on 1 KB
// boundaries), then two stages; the q tile [64][136] bf16 is staged in them before the first copy.
constexpr size_t kWgSmem = 1024 + 2 * kWgStage;
static_assert(2 * kWgStage >= kWgRows * 136 * 2, "the q staging fits in the K̄ stages");

// Four CTAs per SM: at most 128 registers a thread (uncapped it takes 158 and fits three CTAs,
// 8% slower: docs/design/estimate.md).
// Both builds take fewer instructions per chunk where they can: a chunk wholly visible to the
// warp's 16 rows skips the per-logit causal test and the per-block "past the group" test (both
// always pass there); a chunk wholly inside the sequence is copied by a thread-to-vector map whose
// swizzle is fixed per thread (every offset an immediate, no zero-fill select); the wgmma
// descriptors are one base plus constants.
// kApprox (wgmma_approximate, the default): the mask-free chunks' partials by approx_block_pairs
// (no transpose, ex2.approx, the quad's order), the row sums and block scores by one-exponential
// merges, and K̄'s two high bf16 terms only (its value to ~2^-17 relative instead of exactly; a
// third fewer wgmma and copies) in three 16 KB stages instead of two of 24 KB, so that the copy
// runs two chunks ahead: scores within docs/numerics.md's rules 2 and 3 instead of bit for bit;
// chunks crossing a row's last key stride keep the exact code. Without it (wgmma_exact) the scores
// are the generic tensor-core kernel's bit for bit.
template <bool kApprox>
__global__ void __launch_bounds__(kWgThreads, 4) scores_wg_kernel(ScoreParams p) {
  constexpr int kRows = kWgRows, kTerms = kApprox ? 2 : 3;
  constexpr int kThreads = 2 * kRows, kMaxGroups = kRows / 8;
  constexpr int kRowStep = kThreads / 16;  // K̄ term rows one copy step covers (16 vectors each)
  extern __shared__ float4 smem4[];
  const uint32_t base = (smem_addr(smem4) + 1023u) & ~1023u;
  char* const base_ptr = reinterpret_cast<char*>(smem4) + (base - smem_addr(smem4));
  __shared__ int lim[kRows], qpos[kRows], rhead[kRows];
  __shared__ float rmax[kRows], rmul[kRows];
  __shared__ int glast[kMaxGroups], gnract[kMaxGroups], gnvis[kMaxGroups];
  __shared__ float2* gpart[kMaxGroups];

  const int gb0 = p.group_ctas[2 * blockIdx.x], ngroups = p.group_ctas[2 * blockIdx.x + 1];
  const int kvh = blockIdx.y;
  const EstSeq e = p.seqs[p.qblock_seq[gb0]];
  const int64_t m0 = p.qblock_m[gb0];
  const int S = p.stride, nr = p.spb, R = p.heads_per_cta * nr;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int head0 = kvh * p.group + int(blockIdx.z) * p.heads_per_cta;
  const int heads_here = min(p.heads_per_cta, p.group - int(blockIdx.z) * p.heads_per_cta);

  group_tables<kRows, kMaxGroups>(p, e, gb0, ngroups, m0, kvh, S, nr, R, head0, heads_here, tid, lim, qpos, rhead,
                                  glast, gnract, gnvis, gpart);
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

  // K̄ copy: chunk j0 … j0+31, 32 · 3 term rows of 16 vectors, 12 per thread. A thread's vector
  // column u = tid % 16 is fixed (128 threads = kRowStep = 8 term rows of 16 vectors); its term
  // row 3n + j advances by kRowStep per step. Row n of term j, 16-byte piece u: region u / 8,
  // piece (u % 8) ^ (n % 8) of the row's 128 bytes (the 128-byte swizzle the descriptors below read).
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
  // B descriptor of term j, k step ks, stage words st_words: region ks / 4, 32 bytes per k step
  // inside it, added to the stage's base with one 32-bit add (wg::desc_at: base + the stages < 256 KB).
  const wg::DescWords desc0 = wg::desc_words<128>(base, 16, 1024);
  auto bdesc_fast = [&](const wg::DescWords& st_words, int j, int ks) {
    return wg::desc_at(st_words, uint32_t(j * kWgTerm + (ks >> 2) * kWgRegion + (ks & 3) * 32));
  };
  // The copy of a chunk wholly inside the sequence (j0 + 32 <= nks): thread tid takes vector
  // column cu of rows n0 + kRowStep·k (n0 = tid / 16 < 8, k < 32 / kRowStep = 4) of each term j.
  // Every row it writes has n % 8 = n0 (kRowStep is 8), so its swizzled piece is fixed and its
  // destinations and sources are its base plus constants (row + kRowStep: kRowStep · 128 bytes;
  // term: kWgTerm; source row 3n + j: 256 bytes each).
  static_assert(kRowStep == 8, "the fixed swizzle of issue_full");
  const int n0 = tid >> 4;
  const uint32_t fast_dst = base + cu_region + uint32_t(n0 * 128 + (((cu & 7) ^ n0) << 4));
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
  // The smallest last visible key stride of the warp's 16 rows (−1 if one is not a row): a
  // chunk whose last column is at most this is visible to every row of the warp.
  const int warp_lim = __reduce_min_sync(0xffffffffu, lim[warp * 16 + (lane & 15)]);
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
  // The copy of chunk c into stage c % kStages (the fixed-swizzle copy when the chunk lies
  // wholly inside the sequence).
  auto issue_chunk = [&](int c) {
    const int stage = c % kStages;
    if ((c + 1) * kWgCols <= nks) issue_full(c * kWgCols, stage);
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
    // The descriptors' low word for stage st (the stage's offset / 16 added once a chunk).
    const wg::DescWords st_words = {desc0.lo + uint32_t(st * (kStage >> 4)), desc0.hi};  // stage st's base
#pragma unroll
    for (int i = 0; i < 16; ++i) cur[i] = 0.f;
    wg::pin(cur);
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < 8; ++ks)
#pragma unroll
      for (int j = 0; j < kTerms; ++j)
        wg::mma_m64n32k16_rs_kmajor(cur, a[ks], bdesc_fast(st_words, j, ks));
    wg::commit();
    if (c >= 1) partials(c - 1, prev);
    wg::wait<0>();
    wg::pin(cur);
#pragma unroll
    for (int i = 0; i < 16; ++i) prev[i] = cur[i];
  }
  if (nch > 0) partials(nch - 1, prev);
  __syncthreads();  // the partials are read by other threads below

  group_row_sums_and_scores<kThreads, kApprox>(p, e, ngroups, m0, nr, R, head0, heads_here, tid, warp, lane, glast,
                                               gnract, gnvis, gpart, rmax, rmul);
}

}  // namespace

size_t scores_wgmma_smem_bytes() { return kWgSmem; }

cudaError_t launch_scores_wgmma(const ScoreParams& p, dim3 grid, size_t smem, cudaStream_t stream) {
  const auto kernel =
      p.approximate ? scores_wg_kernel<true> : scores_wg_kernel<false>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (err == cudaSuccess) err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
  if (err != cudaSuccess) return err;
  kernel<<<grid, kWgThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace ariadne::cuda

