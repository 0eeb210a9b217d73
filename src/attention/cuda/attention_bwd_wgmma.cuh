// Internal: the Hopper (sm_90a) backward main kernel: the products whose M side is the key tile
// run as wgmma from swizzled shared tiles, dQ as mma.sync. The prep and finish launches, the walk,
// the deterministic ranks and the semantics (masks, sinks, GQA, varlen, orders, block-sparse rows)
// are attention_bwd.cuh's; this file only replaces its main kernel.
//
// A CTA of 2 warpgroups owns (128 keys, KV head); warpgroup c holds keys 64c .. 64c + 63 with
// their dK and dV accumulators (m64nD, fp32, D/2 registers each) for the whole walk. Per
// (query head of the group, 64-query tile) pair:
//   Sᵀ  = K_c·Qᵀ, dPᵀ = V_c·dOᵀ     wgmma m64n64k16, both operands K-major in shared memory;
//   Pᵀ  = exp2(Sᵀ·scale·log2e − lse·log2e), dSᵀ = Pᵀ ⊙ (dPᵀ − D)   in registers;
//   dV += Pᵀ·dO, dK += dSᵀ·Q        wgmma m64nDk16, A packed from the accumulators (their layout
//                                   is the A fragment's), B = dO / Q read MN-major (transposed);
//   dSᵀ to shared memory (keys on rows), then dQ = dS·K over all 128 keys by the 8 warps with
//   mma.sync (16 query rows × D/2 columns each), added to the fp32 accumulator with float2
//   atomics, once per 128 keys (the tile kernel adds once per 64).
// The rs products run under the dS stores and the dQ step; they complete before the next pair
// overwrites the buffers. Q, dO and the row statistics of the next pair are copied with cp.async
// (gathered through the token order, zero past a sequence's end) during the current one, double
// buffered. Tiles use the forward wgmma kernel's swizzled layouts (attention_wgmma.cuh): W = 128
// bytes at D 64 and 128, W = 32 at D 80 (regions of 16 columns: 80 runs natively).
//
// Block-sparse rows need blocks that are multiples of 128 (a key tile lies in one key block);
// the dispatcher (backward_cuda.cu) keeps other blocks, head dim 96 and non-sm90 devices on the
// tile kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attention/cuda/attention_bwd.cuh"
#include "attention/cuda/attention_wgmma.cuh"
#include "device/cuda/wgmma.cuh"

namespace ariadne::cuda {

template <int D>
struct BwdWgShape {
  static constexpr int BK = 128, BQ = kBwdBQ, threads = 256;
  static constexpr int C = D / 8;                   // 16-byte chunks per row
  static constexpr int W = D % 64 == 0 ? 128 : 32;  // swizzle span in bytes (as WgShape)
  static constexpr int SS = BQ + 8;                 // dSᵀ rows: 64 queries + 16 bytes (conflict-free)
  static constexpr size_t k_bytes = size_t(BK) * D * 2, q_bytes = size_t(BQ) * D * 2;
  // K, V; then Q[2], dO[2]; then dSᵀ [BK][SS]; then lse·log2e [2][BQ] and D [2][BQ]. Every swizzled
  // tile starts on a 1024-byte boundary (1024 bytes of slack align the base).
  static constexpr size_t q_off = 2 * k_bytes, do_off = q_off + 2 * q_bytes, ds_off = do_off + 2 * q_bytes;
  static constexpr size_t stat_off = ds_off + size_t(BK) * SS * 2;
  static constexpr size_t smem_bytes = 1024 + stat_off + 4 * BQ * sizeof(float);
  static_assert(k_bytes % 1024 == 0 && q_bytes % 1024 == 0, "tiles keep the 1024-byte alignment");
};

// Copies `rows` rows (first.., gathered through `order`) of one head into a swizzled tile of ROWS
// rows with cp.async, zero-filling rows at or past `valid`. All 256 threads take part.
template <int ROWS, int W, int C, class T>
__device__ __forceinline__ void bwd_wg_load(T* dst, const T* head, int64_t stride, int64_t first, int64_t valid,
                                            const int32_t* order, int tid) {
#pragma unroll 2
  for (int i = tid; i < ROWS * C; i += 256) {
    const int r = i / C, ch = i % C;
    const bool ok = r < valid;
    const int64_t row = ok ? (order != nullptr ? order[first + r] : first + r) : 0;
    cp_async16(smem_addr(dst + swz_off<W, ROWS>(r, ch)), ok ? head + row * stride + ch * 8 : head, ok);
  }
}

template <int D, class E>
__global__ void __launch_bounds__(256, 1) attention_bwd_wgmma_kernel(const BwdParams p) {
  using S = BwdWgShape<D>;
  using T = typename E::type;
  constexpr int BK = S::BK, BQ = S::BQ, C = S::C, W = S::W, SS = S::SS;
  constexpr int NS = BQ / 2;   // accumulators of an m64n64 product per thread
  constexpr int NO = D / 2;    // dK, dV accumulators per thread (m64nD)
  constexpr int NH = D / 16;   // dQ: n8 tiles of D/2 columns per warp
  constexpr uint32_t kAtom8 = 8 * W, kRegionK = BK * W, kRegionQ = BQ * W;

  extern __shared__ __align__(16) unsigned char smem_dyn[];
  unsigned char* smem_raw = smem_dyn + ((1024 - (smem_addr(smem_dyn) & 1023)) & 1023);
  T* Ks = reinterpret_cast<T*>(smem_raw);
  T* Vs = Ks + BK * D;
  T* Qs = reinterpret_cast<T*>(smem_raw + S::q_off);    // 2 buffers of BQ·D
  T* dOs = reinterpret_cast<T*>(smem_raw + S::do_off);  // 2 buffers of BQ·D
  T* dSs = reinterpret_cast<T*>(smem_raw + S::ds_off);  // [BK][SS]: dSᵀ, keys on rows
  float* lse2s = reinterpret_cast<float*>(smem_raw + S::stat_off);  // 2 buffers of BQ
  float* Dls = lse2s + 2 * BQ;                                        // 2 buffers of BQ

  const Pattern& pat = p.pattern;
  const int tid = threadIdx.x, wg = tid / 128, warp = tid / 32, wwarp = warp % 4, lane = tid % 32;
  const int g = lane / 4, tq = lane % 4;
  const int kvh = blockIdx.y;
  const int32_t* cuk = pat.cu_seqlens_k != nullptr ? pat.cu_seqlens_k : pat.cu_seqlens_q;
  // Launch order as the tile kernel's: first to last by default (causal: heaviest first), last to
  // first in the deterministic mode (its ranks wait only on CTAs launched earlier).
  const int64_t launch = p.counters != nullptr ? int64_t(gridDim.x) - 1 - blockIdx.x : int64_t(blockIdx.x);
  const auto [s, kt] = cover_tile<BK>(pat, cuk, launch);
  const SeqExtent e = pat.seq(s, p.total_q, p.total_k);
  const int64_t k_lo = kt * BK;
  if (k_lo >= e.lk) return;  // uniform over the CTA
  const int64_t k_hi = k_lo + BK < e.lk ? k_lo + BK : e.lk;
  const KeyRange qr = pat.query_range(e, k_lo, k_hi);
  const int64_t qt_first = qr.empty() ? 0 : qr.lo / BQ;
  const int64_t qt_end = qr.empty() ? 0 : (qr.hi + BQ - 1) / BQ;
  const int64_t span = qt_end - qt_first;
  const int64_t pairs = span * p.group;

  // Pairs in walk order: head by head of the group, query tiles ascending. Every query tile of
  // [qt_first, qt_end) meets the key tile's query range, so only a block mask skips pairs.
  auto next_pair = [&](int64_t i) {
    if (pat.blocks.defined())
      while (i < pairs && !bwd_block_listed(pat, s, e, kvh * p.group + int(i / span), k_lo, qt_first + i % span)) ++i;
    return i;
  };
  // Q, dO and the row statistics of pair i into buffer b.
  auto load_pair = [&](int64_t i, int b) {
    const int h = kvh * p.group + int(i / span);
    const int64_t q_lo = (qt_first + i % span) * BQ;
    const int64_t valid = e.lq - q_lo;
    bwd_wg_load<BQ, W, C>(Qs + b * BQ * D, static_cast<const T*>(p.q) + h * p.q_head, p.q_tok, e.q0 + q_lo, valid,
                          p.order, tid);
    bwd_wg_load<BQ, W, C>(dOs + b * BQ * D, static_cast<const T*>(p.dout) + h * p.do_head, p.do_tok, e.q0 + q_lo,
                          valid, p.order, tid);
    if (tid < BQ) {
      float l2 = INFINITY, dd = 0.f;  // rows past the sequence: p = 0
      if (tid < valid) {
        const int64_t row = e.q0 + q_lo + tid;
        const int64_t at = int64_t(h) * p.total_q + (p.order != nullptr ? p.order[row] : row);
        const float lse = p.lse[at];
        // A row with no mass (lse −inf) has no probability anywhere: +inf makes p = 0.
        l2 = lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;
        dd = p.delta[at];
      }
      lse2s[b * BQ + tid] = l2;
      Dls[b * BQ + tid] = dd;
    }
  };

  bwd_wg_load<BK, W, C>(Ks, static_cast<const T*>(p.k) + kvh * p.k_head, p.k_tok, e.k0 + k_lo, k_hi - k_lo, p.order,
                        tid);
  bwd_wg_load<BK, W, C>(Vs, static_cast<const T*>(p.v) + kvh * p.v_head, p.v_tok, e.k0 + k_lo, k_hi - k_lo, p.order,
                        tid);
  int64_t cur = next_pair(0);
  if (cur < pairs) load_pair(cur, 0);
  cp_async_commit();

  float dk[NO], dv[NO];
#pragma unroll
  for (int i = 0; i < NO; ++i) dk[i] = dv[i] = 0.f;

  // This warpgroup's keys [kw_lo, kw_hi) and this thread's two key rows kw_lo + key_row (+ 8).
  const int64_t kw_lo = k_lo + 64 * wg, kw_hi = kw_lo + 64 < k_hi ? kw_lo + 64 : k_hi;
  const int key_row = 16 * wwarp + g;
  const bool key0 = p.sink_kind == kSinkKey0 && kw_lo == 0;  // this warpgroup holds key 0
  const uint32_t k_base = smem_addr(Ks) + uint32_t(wg) * 64 * W, v_base = smem_addr(Vs) + uint32_t(wg) * 64 * W;
  int buf = 0;
  float ds0 = 0.f;  // key0 sink: Σ dS over the current head's rows for local key 0
  int ds0_head = -1;
  while (cur < pairs) {
    const int64_t nxt = next_pair(cur + 1);
    const int h = kvh * p.group + int(cur / span);
    const int64_t qt = qt_first + cur % span;
    const int64_t q_lo = qt * BQ;
    const int64_t q_hi = q_lo + BQ < e.lq ? q_lo + BQ : e.lq;

    cp_async_wait<0>();
    wg::fence_proxy_async();  // this thread's cp.async writes, before the async proxy reads them
    __syncthreads();  // this pair's buffer landed; the other buffer's readers and dSᵀ's are done
    if (nxt < pairs) load_pair(nxt, buf ^ 1);
    cp_async_commit();

    const uint32_t q_base = smem_addr(Qs + buf * BQ * D), do_base = smem_addr(dOs + buf * BQ * D);
    const float* l2b = lse2s + buf * BQ;
    const float* Db = Dls + buf * BQ;

    // ---- Sᵀ = K_c·Qᵀ and dPᵀ = V_c·dOᵀ (64 keys × 64 queries each) ----
    float st[NS], dpt[NS];
    // Descriptors built once per operand; a k-step moves the start by 32 bytes within a region row
    // or to the next region (attention_wgmma.cuh's layout).
    const wg::DescWords dk_words = wg::desc_words<W>(k_base, 16, kAtom8), dv_words = wg::desc_words<W>(v_base, 16, kAtom8);
    const wg::DescWords dq_words = wg::desc_words<W>(q_base, 16, kAtom8), do_words = wg::desc_words<W>(do_base, 16, kAtom8);
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      // k-step ks: 32 bytes of each row, in region ks·32 / W at byte ks·32 % W of the row.
      const uint32_t in_row = (ks * 32) % W, region = ks * 32 / W;
      wg::Mma<E, 64>::ss(st, wg::desc_at(dk_words, region * kRegionK + in_row),
                         wg::desc_at(dq_words, region * kRegionQ + in_row), ks > 0);
      wg::Mma<E, 64>::ss(dpt, wg::desc_at(dv_words, region * kRegionK + in_row),
                         wg::desc_at(do_words, region * kRegionQ + in_row), ks > 0);
    }
    wg::commit();
    wg::wait<0>();
    wg::pin(st);
    wg::pin(dpt);

    // ---- Pᵀ and dSᵀ; element masks on the warpgroup's tiles the pattern cuts ----
    if (key0 && wwarp == 0 && ds0_head != h) {
      if (ds0_head >= 0 && lane == 0) p.sink_part[int64_t(ds0_head) * p.sink_parts + s] += ds0;
      ds0_head = h;
      ds0 = 0.f;
    }
    // Masks per key row, on the warpgroup's tiles the pattern cuts: the queries that see key ik
    // are the interval query_range(ik, ik + 1) (exact for windows and chunks), as local columns.
    const bool masked = key0 || kw_lo >= kw_hi || pat.classify(e, q_lo, q_hi, kw_lo, kw_hi) != TileKind::full;
    int col_lo[2] = {0, 0}, col_hi[2] = {BQ, BQ};
    if (masked) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int64_t ik = kw_lo + key_row + 8 * r;
        const KeyRange qk = ik < e.lk ? pat.query_range(e, ik, ik + 1) : KeyRange{0, 0};
        const int64_t lo = qk.lo - q_lo, hi = qk.hi - q_lo;
        col_lo[r] = int(lo < 0 ? 0 : lo > BQ ? BQ : lo);
        col_hi[r] = int(hi < 0 ? 0 : hi > BQ ? BQ : hi);
      }
    }
    const float sink_raw = key0 ? p.sink[h] * 1.4426950408889634f / p.scale_log2 : 0.f;
    const bool sink_row = key0 && key_row == 0;  // this thread's row r = 0 is key 0
#pragma unroll
    for (int j = 0; j < BQ / 8; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int col = j * 8 + 2 * tq + c;
        const float l2 = l2b[col], dd = Db[col];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float raw = st[4 * j + 2 * r + c] + (r == 0 && sink_row ? sink_raw : 0.f);
          const float pr = col < col_lo[r] || col >= col_hi[r] ? 0.f : ex2(fmaf(raw, p.scale_log2, -l2));
          st[4 * j + 2 * r + c] = pr;
          dpt[4 * j + 2 * r + c] = pr * (dpt[4 * j + 2 * r + c] - dd);
        }
      }
    // The key0 sink: Σ_i dS_i0 (key 0 is row 0 of warp 0 of warpgroup 0: lanes with g = 0, r = 0).
    if (key0 && wwarp == 0) {
      float v = 0.f;
#pragma unroll
      for (int j = 0; j < BQ / 8; ++j) v += g == 0 ? dpt[4 * j] + dpt[4 * j + 1] : 0.f;
      ds0 += quad_sum(v);
    }

    // ---- dV += Pᵀ·dO and dK += dSᵀ·Q: A from registers (16 queries per k-step) ----
    uint32_t pa[BQ / 16][4], da[BQ / 16][4];
#pragma unroll
    for (int kk = 0; kk < BQ / 16; ++kk)
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        pa[kk][x] = E::pack(st[8 * kk + 2 * x], st[8 * kk + 2 * x + 1]);
        da[kk][x] = E::pack(dpt[8 * kk + 2 * x], dpt[8 * kk + 2 * x + 1]);
      }
    wg::pin(dv);
    wg::pin(dk);
    const wg::DescWords bo_words = wg::desc_words<W>(do_base, kRegionQ, kAtom8);
    const wg::DescWords bq_words = wg::desc_words<W>(q_base, kRegionQ, kAtom8);
    wg::fence();
#pragma unroll
    for (int kk = 0; kk < BQ / 16; ++kk) wg::Mma<E, D>::rs(dv, pa[kk], wg::desc_at(bo_words, kk * 16 * W));
#pragma unroll
    for (int kk = 0; kk < BQ / 16; ++kk) wg::Mma<E, D>::rs(dk, da[kk], wg::desc_at(bq_words, kk * 16 * W));
    wg::commit();
    wg::pin(dv);
    wg::pin(dk);

    // ---- dSᵀ to shared memory, keys on rows (unscaled: dQ takes the scale at its adds) ----
    {
      T* row_a = dSs + (64 * wg + key_row) * SS + 2 * tq;
      T* row_b = row_a + 8 * SS;
#pragma unroll
      for (int kk = 0; kk < BQ / 16; ++kk) {
        *reinterpret_cast<uint32_t*>(row_a + 16 * kk) = da[kk][0];
        *reinterpret_cast<uint32_t*>(row_b + 16 * kk) = da[kk][1];
        *reinterpret_cast<uint32_t*>(row_a + 16 * kk + 8) = da[kk][2];
        *reinterpret_cast<uint32_t*>(row_b + 16 * kk + 8) = da[kk][3];
      }
    }
    __syncthreads();  // both warpgroups' dSᵀ written

    // ---- dQ = scale·dS·K: warp w takes query rows 16·(w mod 4) and columns (w / 4)·D/2 ----
    int* const counter = bwd_wait_turn<BK>(p, s, e, h, kt, qt, tid);
    // D 128 in two column parts, so that the part's accumulators fit beside dK, dV and the
    // in-flight products' A fragments.
    constexpr int DQP = D > 96 ? 2 : 1, NP = NH / DQP;  // parts, n8 tiles per part
#pragma unroll 1
    for (int part = 0; part < DQP; ++part) {
      const int q_row = 16 * wwarp, n_first = wg * NH + part * NP;  // n8 tiles n_first .. n_first + NP - 1
      float dq[NP][4];
#pragma unroll
      for (int j = 0; j < NP; ++j) dq[j][0] = dq[j][1] = dq[j][2] = dq[j][3] = 0.f;
#pragma unroll 1
      for (int kk = 0; kk < BK / 16; ++kk) {
        // A = dS (queries × keys) from dSᵀ, transposed: matrices (q 0-7, k 0-7), (q 8-15, k 0-7),
        // (q 0-7, k 8-15), (q 8-15, k 8-15).
        uint32_t a[4];
        ldmatrix_x4_trans(a, smem_addr(dSs + (kk * 16 + (lane & 7) + ((lane >> 4) << 3)) * SS + q_row +
                                       ((lane >> 3) & 1) * 8));
        // B = K (keys × head dim), transposed from its swizzled tile: 16-byte chunks of 8 columns.
        const int key = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
        for (int j2 = 0; j2 < NP / 2; ++j2) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, smem_addr(Ks + swz_off<W, BK>(key, n_first + 2 * j2 + (lane >> 4))));
          E::mma(dq[2 * j2], a, b[0], b[1]);
          E::mma(dq[2 * j2 + 1], a, b[2], b[3]);
        }
        if constexpr (NP % 2 == 1) {
          uint32_t b[2];
          ldmatrix_x2_trans(b, smem_addr(Ks + swz_off<W, BK>(key, n_first + NP - 1)));
          E::mma(dq[NP - 1], a, b[0], b[1]);
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int64_t iq = q_lo + q_row + g + 8 * r;
        if (iq >= e.lq) continue;
        const int64_t row = e.q0 + iq;
        float* acc = p.dq_acc + ((p.order != nullptr ? p.order[row] : row) * p.heads_q + h) * D + n_first * 8 + 2 * tq;
#pragma unroll
        for (int j = 0; j < NP; ++j)
          atomicAdd(reinterpret_cast<float2*>(acc + j * 8), make_float2(dq[j][2 * r] * p.scale, dq[j][2 * r + 1] * p.scale));
      }
    }
    bwd_pass_turn(counter, tid);
    wg::wait<0>();  // dV and dK of this pair: done with its Q and dO buffer and pa, da
    wg::pin(dv);
    wg::pin(dk);
    buf ^= 1;
    cur = nxt;
  }
  if (ds0_head >= 0 && lane == 0 && wwarp == 0 && key0) p.sink_part[int64_t(ds0_head) * p.sink_parts + s] += ds0;
  cp_async_wait<0>();

  // ---- epilogue: dK·scale and dV, this thread's two key rows ----
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t ik = kw_lo + key_row + 8 * r;
    if (ik >= e.lk) continue;
    const int64_t row = p.order != nullptr ? p.order[e.k0 + ik] : e.k0 + ik;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      const int c = j * 8 + 2 * tq;
      const float k0 = dk[4 * j + 2 * r] * p.scale, k1 = dk[4 * j + 2 * r + 1] * p.scale;
      const float v0 = dv[4 * j + 2 * r], v1 = dv[4 * j + 2 * r + 1];
      if (p.dkv_f32) {
        *reinterpret_cast<float2*>(static_cast<float*>(p.dk) + row * p.dk_tok + kvh * p.dk_head + c) = make_float2(k0, k1);
        *reinterpret_cast<float2*>(static_cast<float*>(p.dv) + row * p.dv_tok + kvh * p.dv_head + c) = make_float2(v0, v1);
      } else {
        *reinterpret_cast<uint32_t*>(static_cast<T*>(p.dk) + row * p.dk_tok + kvh * p.dk_head + c) = E::pack(k0, k1);
        *reinterpret_cast<uint32_t*>(static_cast<T*>(p.dv) + row * p.dv_tok + kvh * p.dv_head + c) = E::pack(v0, v1);
      }
    }
  }
}

// The three launches on `stream` (prep and finish as the tile kernel's); instantiated per head
// dim in attention_bwd_wgmma_d<D>.cu.
template <int D, class E>
cudaError_t launch_bwd_wgmma(const BwdParams& p, cudaStream_t stream) {
  using S = BwdWgShape<D>;
  const auto kernel = attention_bwd_wgmma_kernel<D, E>;
  static const cudaError_t configured = allow_dynamic_smem({kernel}, S::smem_bytes);
  if (configured != cudaSuccess) return configured;
  launch_bwd_prep<D, E>(p, stream);
  kernel<<<dim3(unsigned(bwd_key_tiles<S::BK>(p)), unsigned(p.heads_q / p.group)), S::threads, S::smem_bytes,
           stream>>>(p);
  launch_bwd_finish<D, E>(p, stream);
  return cudaGetLastError();
}

#define ARIADNE_BWD_WGMMA_KERNELS(X, D) X(launch_bwd_wgmma<D, Bf16>) X(launch_bwd_wgmma<D, F16>)
#define ARIADNE_INSTANTIATE_BWD_WGMMA(D) ARIADNE_BWD_WGMMA_KERNELS(ARIADNE_BWD_INSTANTIATE_ONE, D)
ARIADNE_BWD_WGMMA_KERNELS(ARIADNE_BWD_DECLARE_ONE, 64)
ARIADNE_BWD_WGMMA_KERNELS(ARIADNE_BWD_DECLARE_ONE, 80)
ARIADNE_BWD_WGMMA_KERNELS(ARIADNE_BWD_DECLARE_ONE, 128)

}  // namespace ariadne::cuda
