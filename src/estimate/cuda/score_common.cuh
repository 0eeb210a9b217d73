// Device helpers shared by the key-stride sums and the scoring kernels (key_sums.cu, score_*.cu):
// operand loads, the exact bf16 split, the K̄ tile copy of the RR tensor-core kernels, and the
// per-block (max, Σexp) partials formed from mma accumulators.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "estimate/cuda/estimate.cuh"
#include "device/cuda/mma.cuh"

// Internal linkage, as in one translation unit: each scoring file gets its own copies (and the
// inlining the kernels were measured with).
namespace ariadne::cuda {
namespace {

__device__ __forceinline__ float load_elem(const void* base, int64_t idx, int dtype) {
  if (dtype == 1) return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[idx]);
  if (dtype == 2) return __half2float(static_cast<const __half*>(base)[idx]);
  return static_cast<const float*>(base)[idx];
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

// The K̄ tile copy of the RR tensor-core kernels (mma_rr, mma_grouped): key strides j0 … j0+63 of
// one sequence and KV head, all three terms, into a key-stride-major tile (row 3c + i = term i of key stride c, rows of bp
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

// The partials' quad transpose (mma_rr, the grouped kernels). x[q][k]: a warp's accumulator values of row-combination
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
// fuse expf's final multiply into the sum (an FFMA rounds once where the generic kernel, whose
// terms arrive by shuffle, rounds twice).
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

}  // namespace
}  // namespace ariadne::cuda
