// The 128-row grouped scoring kernel (CudaScoring::mma_grouped): RR, bf16 q (one term), blocks of
// 8 or 16 key strides, one row round; the automatic choice at head dims other than 128 (at 128 the
// wgmma kernel runs). A CTA owns 128 rows: G = 128 / R adjacent query blocks of one sequence, R =
// heads_per_cta · B/S rows each (the rows of one mma_rr CTA), so every K̄ tile copied from L2
// serves G·R rows instead of R (S 8: 2 × 64; S 16: 4 × 32, where mma_rr has 32 live rows of 64),
// and each B fragment feeds 8 mma instead of 4. 8 warps, each 64 rows × 16 key strides; mma_rr's
// single K̄ tile and two barriers per chunk; two CTAs per SM (87 KB each at d 128). CTA x of the
// grid (CTAs, heads_kv, z) owns the query blocks p.group_ctas[2x] … + p.group_ctas[2x + 1] − 1
// (host-built, the longest CTAs first). Each group's logits, partials, row sums and block scores
// are mma_rr's bit for bit: the same products per accumulator in the same order, the same expf
// terms in the same order, and the same scratch rows.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "estimate/cuda/estimate.cuh"
#include "estimate/cuda/score_common.cuh"
#include "estimate/cuda/score_grouped.cuh"
#include "device/cuda/mma.cuh"

namespace ariadne::cuda {
namespace {

constexpr int kThreadsGrouped = 256, kMaxGroupsGrouped = kGroupedRows / 8;  // R >= 8
// Dynamic shared memory: q tile [128][dpad+8] bf16 | K̄ tile [64 · 3][dpad+8] bf16 (mma_rr's).
struct GroupedSmem {
  static __host__ __device__ int bpitch(const ScoreParams& p) { return p.dpad + 8; }
  static __host__ __device__ size_t q_bytes(const ScoreParams& p) { return size_t(2) * kGroupedRows * bpitch(p); }
  static __host__ __device__ size_t total(const ScoreParams& p) {
    return q_bytes(p) + size_t(2) * 3 * kMmaCols * bpitch(p);
  }
};

// At most 128 registers a thread: two CTAs per SM.
__global__ void __launch_bounds__(kThreadsGrouped, 2) scores_grouped_kernel(ScoreParams p) {
  constexpr int kRows = kGroupedRows, kThreads = kThreadsGrouped, kMaxGroups = kMaxGroupsGrouped;
  extern __shared__ float4 smem4[];
  char* smem = reinterpret_cast<char*>(smem4);
  __nv_bfloat16* qa = reinterpret_cast<__nv_bfloat16*>(smem);
  const int bp = GroupedSmem::bpitch(p);
  const uint32_t kb_s = smem_addr(smem + GroupedSmem::q_bytes(p));
  __shared__ int lim[kRows];    // last visible key stride of each row (−1: no row)
  __shared__ int qpos[kRows];   // the sampled query's local index
  __shared__ int rhead[kRows];  // the row's query head, relative to head0
  __shared__ float rmax[kRows], rmul[kRows];
  // Per group (query block m0 + g): last key stride of its rows, sampled strides, visible key
  // blocks, and its partials (the mma_rr CTA's scratch rows).
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
  // The q tile: the sampled queries as bf16 (the input itself: one exact term), zero rows past
  // the CTA's rows and zero columns past d.
  stage_q_tile<kThreads>(p, e, kRows, p.dpad, head0, lim, qpos, rhead, qa, bp, tid);
  int last = -1;  // the last key stride any row of the CTA sees
  for (int g = 0; g < ngroups; ++g) last = max(last, glast[g]);

  const KbarTileCopy<kThreads> kcopy(p, e, kvh, kb_s, bp, tid);
  // Warp w: rows 64·(w % 2) … +63 (four m16 tiles) × key strides 16·(w / 2) … +15 (two n8 tiles)
  // of each 64-stride chunk. ldmatrix row addresses (bytes): q tile mt: row wm·64 + mt·16 +
  // lane % 16, column (lane / 16)·8; K̄ as mma_rr. The k step adds 32 bytes to both.
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
      // acc += q · K̄ᵀ, per accumulator k step outer, then term j of K̄: the generic kernel's product order.
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
    // The partials of this chunk's blocks in the warp's 16 columns (mma_rr's, per half).
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
        if (n * nr > my_last[hp]) continue;  // past every row of the group (mma_rr's CTA-wide test)
        my_part[hp][n] = block_pair(y, nr, nb);
      }
    }
  }
  __syncthreads();  // the partials are read by other threads below

  group_row_sums_and_scores<kThreads>(p, e, ngroups, m0, nr, R, head0, heads_here, tid, warp, lane, glast, gnract,
                                      gnvis, gpart, rmax, rmul);
}

}  // namespace

size_t scores_grouped_smem_bytes(const ScoreParams& p) { return GroupedSmem::total(p); }

cudaError_t launch_scores_grouped(const ScoreParams& p, dim3 grid, size_t smem, cudaStream_t stream) {
  const auto kernel = scores_grouped_kernel;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (err == cudaSuccess) err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
  if (err != cudaSuccess) return err;
  kernel<<<grid, kThreadsGrouped, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace ariadne::cuda
