// Internal: the backward kernels (mma.sync m16n8k16, ldmatrix, cp.async), one template for every
// pattern, in three launches:
//
//   prep:   D_i = dout_i · out_i per (row, query head); the dq accumulator and the sink partials
//           cleared; the denominator sink's terms −exp(sink − lse_i)·D_i summed per row block.
//   main:   a CTA of 4 warps owns (64 keys, KV head), 16 key rows per warp, and walks every
//           (query head of the group, 64-query tile) pair that sees its keys: the pattern's
//           transposed range (Pattern::query_range) and, block-sparse, the CSR rows that list its
//           key block. Per pair, with keys on the mma rows:
//             Sᵀ = K·Qᵀ,  Pᵀ = exp2(Sᵀ·scale·log2e − lse·log2e),  dV += Pᵀ·dO,
//             dPᵀ = V·dOᵀ, dSᵀ = Pᵀ ⊙ (dPᵀ − D),  dK += dSᵀ·Q,
//           then dS·scale goes through shared memory so that each warp adds 16 query rows of
//           dQ = dS·K to the fp32 accumulator (atomics). dK and dV stay in registers across the
//           whole walk (GQA sums the group's heads there) and are stored once.
//   finish: dq = the accumulator in dq's dtype; dsink reduced from its partials in a fixed order.
//
// Direct dQ (BwdParams::dq_direct, the tile kernel only): when every query tile is seen by exactly
// one key tile (a chunk that divides the 64-row tiles, queries and keys of equal length), that
// CTA's dQ is the whole gradient: it is stored in dq's dtype, so there is no accumulator to clear,
// no atomics, no finish copy and no turn-taking (deterministic by construction).
//
// Deterministic mode orders the dQ additions: the pairs that add into one query tile do so in
// descending key-tile order, each waiting on a per-(head, query tile) counter for its rank
// (bwd_rank). CTAs launch in that order, so a waited-for CTA is always resident or done.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ariadne/pattern.hpp"
#include "attention/cuda/attention_fwd.cuh"
#include "device/cuda/mma.cuh"

namespace ariadne::cuda {

struct BwdParams {
  const void* q;
  const void* k;
  const void* v;
  const void* out;   // [total_q, heads_q, D], dtype of q or f32 (out_f32)
  const void* dout;  // [total_q, heads_q, D], dtype of q
  const float* lse;  // [heads_q, total_q], the forward's (natural log, sink included)
  const float* sink; // [heads_q] or null
  const int32_t* order;  // as FwdParams::order
  void* dq;          // [total_q, heads_q, D], dtype of q or f32 (dq_f32)
  void* dk;          // [total_k, heads_kv, D]
  void* dv;
  float* dsink;      // [heads_q] or null
  // Workspace (the plan's): the dq accumulator [total_q, heads_q, D] f32 contiguous by stored
  // row; D [heads_q, total_q] by stored row; the sink partials; the deterministic counters.
  float* dq_acc;     // null with dq_direct
  float* delta;
  float* sink_part;  // [heads_q, sink_parts]: prep row blocks (denominator) or sequences (key0)
  int* counters;     // [heads_q, query tiles] (deterministic) or null
  int sink_parts;
  int64_t q_tok, q_head, k_tok, k_head, v_tok, v_head, o_tok, o_head, do_tok, do_head;
  int64_t dq_tok, dq_head, dk_tok, dk_head, dv_tok, dv_head;
  int64_t total_q, total_k;
  int heads_q, group;
  float scale, scale_log2;
  int sink_kind;
  bool out_f32, dq_f32, dkv_f32, deterministic;
  bool dq_direct;    // each query tile has one visiting key tile: dQ stored, not accumulated
  int64_t query_tiles;  // per head: the counters' row length (the virtual query tiles)
  Pattern pattern;
};

constexpr int kBwdBK = 64, kBwdBQ = 64, kBwdThreads = 128, kBwdPrepRows = 64;

// The shared memory of the main kernel: K and V of the key tile, Q and dO of two pairs (double
// buffered), dS of one pair, and per pair the rows' lse·log2e and D.
template <int D>
struct BwdShape {
  static constexpr int RS = D + 8;            // padded rows (see FwdShape)
  static constexpr int SS = kBwdBK + 8;       // dS rows: 64 keys + 16 bytes
  static constexpr size_t smem_bytes =
      size_t(2 * kBwdBK + 4 * kBwdBQ) * RS * 2 + size_t(kBwdBQ) * SS * 2 + size_t(4 * kBwdBQ) * sizeof(float);
};

// The sequence owning virtual tile t of a cover over cu (the forward's varlen trick: sequence s owns
// tiles [s + cu[s]/B, s + 1 + cu[s+1]/B)), and the tile's index inside it.
template <int B>
__device__ __forceinline__ CtaTile cover_tile(const Pattern& pat, const int32_t* cu, int64_t t) {
  CtaTile c{0, t};
  if (pat.cu_seqlens_q == nullptr) return c;
  int lo = 0, hi = pat.num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (mid + cu[mid] / B <= t) lo = mid; else hi = mid - 1;
  }
  c.s = lo;
  c.tile = t - (lo + cu[lo] / B);
  return c;
}

// The dense part of the walk: whether key tile [k_lo, k_lo + BK) (clipped to lk) may see query
// tile qt. Both ends of query_range are nondecreasing in the key, so the key tiles that see one
// query tile are an interval. BK: the kernel's key tile (64 here, 128 in attention_bwd_wgmma.cuh).
template <int BK>
__device__ __forceinline__ bool bwd_visits_dense(const Pattern& pat, const SeqExtent& e, int64_t k_lo, int64_t qt) {
  const int64_t k_hi = k_lo + BK < e.lk ? k_lo + BK : e.lk;
  const KeyRange qr = pat.query_range(e, k_lo, k_hi);
  const int64_t q_lo = qt * kBwdBQ;
  return !qr.empty() && qr.lo < q_lo + kBwdBQ && qr.hi > q_lo;
}
// Block-sparse, whether the CSR row of (s, h, qt) lists the key block holding k_lo. A walk over a key
// tile's own query range [qt_first, qt_end) needs only this test: the dense part holds there.
__device__ __forceinline__ bool bwd_block_listed(const Pattern& pat, int s, const SeqExtent& e, int h, int64_t k_lo,
                                                 int64_t qt) {
  return pat.block_listed(pat.block_row(s, e, h, qt * kBwdBQ / pat.blocks.block), k_lo / pat.blocks.block);
}
// The whole walk predicate: dense part and, block-sparse, the listed block. The one predicate both
// the walk and the deterministic ranks use.
template <int BK>
__device__ __forceinline__ bool bwd_visits(const Pattern& pat, int s, const SeqExtent& e, int h, int64_t k_lo,
                                           int64_t qt) {
  if (!bwd_visits_dense<BK>(pat, e, k_lo, qt)) return false;
  return !pat.blocks.defined() || bwd_block_listed(pat, s, e, h, k_lo, qt);
}

// The rank of key tile kt among the key tiles that visit query tile qt (deterministic mode), in
// descending key-tile order: the tiles add into a query tile from the last to the first. The main
// kernel walks its query tiles ascending and launches key tiles descending, so along a band
// (window, chunk) the tile that meets a query tile first adds first and the adds run in lockstep
// with the walk; a waited-for CTA always has a lower launch index, so it is resident or done. The
// dense visitors are an interval whose last tile is found by binary search (query_range(t).lo is
// nondecreasing in t; empty ranges keep their lo), moved below any tile that sees no query at all.
// Block-sparse counts the visitors inside the listed blocks after kt (blocks are multiples of BK).
template <int BK>
__device__ inline int bwd_rank(const Pattern& pat, int s, const SeqExtent& e, int h, int64_t kt, int64_t qt) {
  const int64_t q_hi = (qt + 1) * kBwdBQ;
  const int64_t nkt = (e.lk + BK - 1) / BK;
  auto query_lo = [&](int64_t t) {
    const int64_t k_lo = t * BK, k_hi = k_lo + BK < e.lk ? k_lo + BK : e.lk;
    return pat.query_range(e, k_lo, k_hi).lo;
  };
  int64_t lo = kt, hi = nkt;  // the first tile past kt whose queries all lie past the tile
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (query_lo(mid) >= q_hi) hi = mid; else lo = mid + 1;
  }
  int64_t last = lo - 1;
  while (last > kt && !bwd_visits_dense<BK>(pat, e, last * BK, qt)) --last;
  if (!pat.blocks.defined()) return int(last - kt);
  const int32_t per = pat.blocks.block / BK;
  const int64_t row = pat.block_row(s, e, h, qt * kBwdBQ / pat.blocks.block);
  int rank = 0;
  for (int32_t i = pat.blocks.row_ptr[row + 1] - 1; i >= pat.blocks.row_ptr[row]; --i)
    for (int j = per - 1; j >= 0; --j) {
      const int64_t t = int64_t(pat.blocks.col_idx[i]) * per + j;
      if (t <= kt) return rank;
      if (t <= last && bwd_visits_dense<BK>(pat, e, t * BK, qt)) ++rank;
    }
  return rank;
}

// The deterministic mode's counter of (head h, query tile qt) in sequence s; null in the default mode.
__device__ __forceinline__ int* bwd_counter(const BwdParams& p, int s, int h, int64_t qt) {
  if (p.counters == nullptr) return nullptr;
  const int32_t* cuq = p.pattern.cu_seqlens_q;
  return p.counters + int64_t(h) * p.query_tiles + (cuq != nullptr ? s + cuq[s] / kBwdBQ : 0) + qt;
}
// One thread waits until `counter` reaches the rank of the (key tile kt, query tile qt) pair.
template <int BK>
__device__ __forceinline__ void bwd_await_rank(const BwdParams& p, int* counter, int s, const SeqExtent& e, int h,
                                               int64_t kt, int64_t qt) {
  const int rank = bwd_rank<BK>(p.pattern, s, e, h, kt, qt);
  while (atomicAdd(counter, 0) != rank) __nanosleep(32);
  __threadfence();
}

// The deterministic mode's turn of one (key tile kt, query tile qt) pair at adding into dQ: the
// counter of (head h, query tile) reaches the pair's rank, then the CTA adds, then bwd_pass_turn
// bumps it. Null (no wait, nothing to bump) in the default mode. Every thread of the CTA calls both.
template <int BK>
__device__ __forceinline__ int* bwd_wait_turn(const BwdParams& p, int s, const SeqExtent& e, int h, int64_t kt,
                                              int64_t qt, int tid) {
  int* const counter = bwd_counter(p, s, h, qt);
  if (counter != nullptr) {
    if (tid == 0) bwd_await_rank<BK>(p, counter, s, e, h, kt, qt);
    __syncthreads();
  }
  return counter;
}
__device__ __forceinline__ void bwd_pass_turn(int* counter, int tid) {
  if (counter == nullptr) return;
  __threadfence();
  __syncthreads();
  if (tid == 0) atomicAdd(counter, 1);
}

// ---- prep: D, the cleared accumulator and partials, the denominator sink's terms ----
// Grid (ceil(total_q / 64), heads_q), 128 threads: a warp takes 16 of the block's rows one after the
// other, its lanes reading consecutive element pairs of the row (coalesced 4-byte loads of dout and
// out, coalesced float2 stores clearing the accumulator); the row's D is a fixed shuffle tree, so it
// is the same bits in every run.
template <int D, class E>
__global__ void __launch_bounds__(128) attention_bwd_prep_kernel(const BwdParams p) {
  using T = typename E::type;
  constexpr int PAIRS = D / 2, ROWS = kBwdPrepRows / 4;  // element pairs per row, rows per warp
  const int h = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float term = 0.f;  // lane 0: the warp's denominator-sink terms, summed in row order
#pragma unroll 1
  for (int i = 0; i < ROWS; ++i) {
    const int64_t row = int64_t(blockIdx.x) * kBwdPrepRows + warp * ROWS + i;  // stored row
    if (row >= p.total_q) break;
    const T* dog = static_cast<const T*>(p.dout) + row * p.do_tok + h * p.do_head;
    float* acc = p.dq_direct ? nullptr : p.dq_acc + (row * p.heads_q + h) * D;
    float dsum = 0.f;
#pragma unroll
    for (int c2 = lane; c2 < PAIRS; c2 += 32) {
      const float2 d2 = E::unpack(*reinterpret_cast<const uint32_t*>(dog + 2 * c2));
      const float2 o2 = p.out_f32
                            ? *reinterpret_cast<const float2*>(static_cast<const float*>(p.out) + row * p.o_tok +
                                                               h * p.o_head + 2 * c2)
                            : E::unpack(*reinterpret_cast<const uint32_t*>(static_cast<const T*>(p.out) +
                                                                          row * p.o_tok + h * p.o_head + 2 * c2));
      dsum = fmaf(d2.x, o2.x, fmaf(d2.y, o2.y, dsum));
      if (!p.dq_direct) *reinterpret_cast<float2*>(acc + 2 * c2) = make_float2(0.f, 0.f);
    }
    for (int o = 16; o > 0; o /= 2) dsum += __shfl_xor_sync(0xffffffffu, dsum, o);
    if (lane == 0) {
      p.delta[int64_t(h) * p.total_q + row] = dsum;
      if (p.sink_kind == kSinkDenominator) {
        // The sink's probability exp(sink − lse): 1 where sink = lse (a +inf sink takes all the
        // mass; a −inf sink on a row without keys), where the difference would be NaN.
        const float sink = p.sink[h], lse = p.lse[int64_t(h) * p.total_q + row];
        term += -(sink == lse ? 1.f : __expf(sink - lse)) * dsum;
      }
    }
  }
  if (p.sink_kind == kSinkDenominator) {
    // Block sum in a fixed order: the warps' row-ordered sums, added by thread 0.
    __shared__ float warp_sum[4];
    if (lane == 0) warp_sum[warp] = term;
    __syncthreads();
    if (threadIdx.x == 0)
      p.sink_part[int64_t(h) * p.sink_parts + blockIdx.x] = warp_sum[0] + warp_sum[1] + warp_sum[2] + warp_sum[3];
  } else if (p.sink_kind == kSinkKey0) {
    for (int64_t i = int64_t(blockIdx.x) * 128 + threadIdx.x; i < p.sink_parts; i += int64_t(gridDim.x) * 128)
      p.sink_part[int64_t(h) * p.sink_parts + i] = 0.f;
  }
  if (p.counters != nullptr)
    for (int64_t i = int64_t(blockIdx.x) * 128 + threadIdx.x; i < p.query_tiles; i += int64_t(gridDim.x) * 128)
      p.counters[int64_t(h) * p.query_tiles + i] = 0;
}

// ---- main: dK, dV per key tile; dQ added into the accumulator ----
template <int D, class E>
__global__ void __launch_bounds__(kBwdThreads) attention_bwd_kernel(const BwdParams p) {
  using S = BwdShape<D>;
  using T = typename E::type;
  constexpr int BK = kBwdBK, BQ = kBwdBQ, RS = S::RS, SS = S::SS, C = D / 8;
  constexpr int NQ = BQ / 16;  // query n-tiles of Sᵀ per warp and half tile
  constexpr int DT = D / 8;   // d n-tiles of dK, dV, dQ

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* Ks = reinterpret_cast<T*>(smem_raw);
  T* Vs = Ks + BK * RS;
  T* Qs = Vs + BK * RS;        // 2 buffers of BQ·RS
  T* dOs = Qs + 2 * BQ * RS;   // 2 buffers
  T* dSs = dOs + 2 * BQ * RS;  // [BQ][SS]: dS·scale, queries on rows
  float* lse2s = reinterpret_cast<float*>(dSs + BQ * SS);  // 2 buffers of BQ
  float* Ds = lse2s + 2 * BQ;                               // 2 buffers of BQ

  const Pattern& pat = p.pattern;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, tq = lane % 4;
  const int kvh = blockIdx.y;
  const int32_t* cuk = pat.cu_seqlens_k != nullptr ? pat.cu_seqlens_k : pat.cu_seqlens_q;
  // Key tiles launch first to last: under a causal mask the first see the most queries, and the
  // heaviest CTAs start first. The deterministic mode launches them last to first, so that the
  // order of its adds (bwd_rank) only waits on CTAs launched earlier.
  const int64_t launch = p.counters != nullptr ? int64_t(gridDim.x) - 1 - blockIdx.x : int64_t(blockIdx.x);
  const auto [s, kt] = cover_tile<BK>(pat, cuk, launch);
  const SeqExtent e = pat.seq(s, p.total_q, p.total_k);
  const int64_t k_lo = kt * BK;
  if (k_lo >= e.lk) return;
  const int64_t k_hi = k_lo + BK < e.lk ? k_lo + BK : e.lk;
  const KeyRange qr = pat.query_range(e, k_lo, k_hi);
  const int64_t qt_first = qr.empty() ? 0 : qr.lo / BQ;
  const int64_t qt_end = qr.empty() ? 0 : (qr.hi + BQ - 1) / BQ;
  const int64_t pairs = (qt_end - qt_first) * p.group;
  auto stored = [&](int64_t i) -> int64_t { return p.order != nullptr ? p.order[i] : i; };

  // Pairs in walk order: head by head of the group, query tiles ascending.
  auto visits = [&](int64_t i) {
    const int h = kvh * p.group + int(i / (qt_end - qt_first));
    return bwd_visits<BK>(pat, s, e, h, k_lo, qt_first + i % (qt_end - qt_first));
  };
  auto next_pair = [&](int64_t i) {
    while (i < pairs && !visits(i)) ++i;
    return i;
  };

  auto load_rows = [&](T* dst, const T* head, int64_t stride, int64_t first, int64_t valid) {
#pragma unroll 1
    for (int i = tid; i < 64 * C; i += kBwdThreads) {
      const int r = i / C, c = i % C;
      const bool ok = r < valid;
      cp_async16(smem_addr(dst + r * RS + c * 8), ok ? head + stored(first + r) * stride + c * 8 : head, ok);
    }
  };
  // Q, dO and the row statistics of pair i into buffer b.
  auto load_pair = [&](int64_t i, int b) {
    const int h = kvh * p.group + int(i / (qt_end - qt_first));
    const int64_t q_lo = (qt_first + i % (qt_end - qt_first)) * BQ;
    const int64_t valid = e.lq - q_lo;
    load_rows(Qs + b * BQ * RS, static_cast<const T*>(p.q) + h * p.q_head, p.q_tok, e.q0 + q_lo, valid);
    load_rows(dOs + b * BQ * RS, static_cast<const T*>(p.dout) + h * p.do_head, p.do_tok, e.q0 + q_lo, valid);
    if (tid < BQ) {
      float l2 = INFINITY, dd = 0.f;  // rows past the sequence: p = 0
      if (tid < valid) {
        const int64_t at = int64_t(h) * p.total_q + stored(e.q0 + q_lo + tid);
        const float lse = p.lse[at];
        // A row with no mass (lse −inf) has no probability anywhere: +inf makes p = 0.
        l2 = lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;
        dd = p.delta[at];
      }
      lse2s[b * BQ + tid] = l2;
      Ds[b * BQ + tid] = dd;
    }
  };

  load_rows(Ks, static_cast<const T*>(p.k) + kvh * p.k_head, p.k_tok, e.k0 + k_lo, k_hi - k_lo);
  load_rows(Vs, static_cast<const T*>(p.v) + kvh * p.v_head, p.v_tok, e.k0 + k_lo, k_hi - k_lo);
  int64_t cur = next_pair(0);
  if (cur < pairs) load_pair(cur, 0);
  cp_async_commit();

  float dk[DT][4], dv[DT][4];
#pragma unroll
  for (int j = 0; j < DT; ++j)
#pragma unroll
    for (int x = 0; x < 4; ++x) dk[j][x] = dv[j][x] = 0.f;

  const int key_row = warp * 16;  // this warp's 16 keys within the tile
  int buf = 0;
  float ds0 = 0.f;  // key0 sink: Σ dS over the current head's rows for local key 0
  int ds0_head = -1;
  while (cur < pairs) {
    const int64_t nxt = next_pair(cur + 1);
    const int h = kvh * p.group + int(cur / (qt_end - qt_first));
    const int64_t qt = qt_first + cur % (qt_end - qt_first);
    const int64_t q_lo = qt * BQ;
    const int64_t q_hi = q_lo + BQ < e.lq ? q_lo + BQ : e.lq;

    cp_async_wait<0>();
    __syncthreads();  // this pair's buffer landed; every warp is done with the other buffer and dS
    if (nxt < pairs) load_pair(nxt, buf ^ 1);
    cp_async_commit();

    const T* Qb = Qs + buf * BQ * RS;
    const T* dOb = dOs + buf * BQ * RS;
    const float* l2b = lse2s + buf * BQ;
    const float* Db = Ds + buf * BQ;

    const bool key0 = p.sink_kind == kSinkKey0 && k_lo == 0;
    const bool masked = key0 || pat.classify(e, q_lo, q_hi, k_lo, k_hi) != TileKind::full;
    const float sink_raw = key0 ? p.sink[h] * 1.4426950408889634f / p.scale_log2 : 0.f;
    if (key0 && warp == 0 && ds0_head != h) {
      if (ds0_head >= 0 && lane == 0) p.sink_part[int64_t(ds0_head) * p.sink_parts + s] += ds0;
      ds0_head = h;
      ds0 = 0.f;
    }
    // Two halves of 32 queries, one after the other: the score fragments of a half (32 registers)
    // rather than of the tile stay live beside dK and dV.
#pragma unroll 1
    for (int half = 0; half < 2; ++half) {
      const int q0 = half * (BQ / 2);
      // ---- Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ: this warp's 16 keys × 32 queries ----
      float st[NQ][4], dpt[NQ][4];
#pragma unroll
      for (int j = 0; j < NQ; ++j)
#pragma unroll
        for (int x = 0; x < 4; ++x) st[j][x] = dpt[j][x] = 0.f;
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        uint32_t ak[4], av[4];
        ldmatrix_x4(ak, smem_addr(Ks + (key_row + (lane % 16)) * RS + ks * 16 + (lane / 16) * 8));
        ldmatrix_x4(av, smem_addr(Vs + (key_row + (lane % 16)) * RS + ks * 16 + (lane / 16) * 8));
#pragma unroll
        for (int n2 = 0; n2 < NQ / 2; ++n2) {
          const int brow = q0 + n2 * 16 + (lane & 7) + ((lane >> 4) << 3), bcol = ks * 16 + ((lane >> 3) & 1) * 8;
          uint32_t bq[4], bo[4];
          ldmatrix_x4(bq, smem_addr(Qb + brow * RS + bcol));
          ldmatrix_x4(bo, smem_addr(dOb + brow * RS + bcol));
          E::mma(st[2 * n2], ak, bq[0], bq[1]);
          E::mma(st[2 * n2 + 1], ak, bq[2], bq[3]);
          E::mma(dpt[2 * n2], av, bo[0], bo[1]);
          E::mma(dpt[2 * n2 + 1], av, bo[2], bo[3]);
        }
      }

      // ---- Pᵀ and dSᵀ; element masks on tiles the pattern cuts ----
#pragma unroll
      for (int j = 0; j < NQ; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int col = q0 + j * 8 + 2 * tq + c;
          const float l2 = l2b[col], dd = Db[col];
          KeyRange kr{k_lo, k_hi};
          if (masked) kr = pat.key_range(e, q_lo + col, q_lo + col + 1);
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int64_t ik = k_lo + key_row + g + 8 * r;
            const float raw = st[j][2 * r + c] + (key0 && ik == 0 ? sink_raw : 0.f);
            const float pr = ik < kr.lo || ik >= kr.hi ? 0.f : ex2(fmaf(raw, p.scale_log2, -l2));
            st[j][2 * r + c] = pr;
            dpt[j][2 * r + c] = pr * (dpt[j][2 * r + c] - dd);
          }
        }

      // ---- dV += Pᵀ·dO and dK += dSᵀ·Q (B operands: dO and Q rows, transposed) ----
#pragma unroll
      for (int kk = 0; kk < NQ / 2; ++kk) {
        uint32_t ap[4], as[4];
        ap[0] = E::pack(st[2 * kk][0], st[2 * kk][1]);
        ap[1] = E::pack(st[2 * kk][2], st[2 * kk][3]);
        ap[2] = E::pack(st[2 * kk + 1][0], st[2 * kk + 1][1]);
        ap[3] = E::pack(st[2 * kk + 1][2], st[2 * kk + 1][3]);
        as[0] = E::pack(dpt[2 * kk][0], dpt[2 * kk][1]);
        as[1] = E::pack(dpt[2 * kk][2], dpt[2 * kk][3]);
        as[2] = E::pack(dpt[2 * kk + 1][0], dpt[2 * kk + 1][1]);
        as[3] = E::pack(dpt[2 * kk + 1][2], dpt[2 * kk + 1][3]);
#pragma unroll
        for (int d2 = 0; d2 < D / 16; ++d2) {
          const int brow = q0 + kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, bcol = d2 * 16 + (lane >> 4) * 8;
          uint32_t bo[4], bq[4];
          ldmatrix_x4_trans(bo, smem_addr(dOb + brow * RS + bcol));
          ldmatrix_x4_trans(bq, smem_addr(Qb + brow * RS + bcol));
          E::mma(dv[2 * d2], ap, bo[0], bo[1]);
          E::mma(dv[2 * d2 + 1], ap, bo[2], bo[3]);
          E::mma(dk[2 * d2], as, bq[0], bq[1]);
          E::mma(dk[2 * d2 + 1], as, bq[2], bq[3]);
        }
      }

      // ---- the key0 sink: Σ_i dS_i0, summed per head by the CTA that holds key 0 ----
      if (key0 && warp == 0) {
        float v = 0.f;
#pragma unroll
        for (int j = 0; j < NQ; ++j) v += g == 0 ? dpt[j][0] + dpt[j][1] : 0.f;
        ds0 += quad_sum(v);
      }

      // ---- dS·scale to shared memory, queries on rows ----
#pragma unroll
      for (int j = 0; j < NQ; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c)
#pragma unroll
          for (int r = 0; r < 2; ++r)
            dSs[(q0 + j * 8 + 2 * tq + c) * SS + key_row + g + 8 * r] = T(dpt[j][2 * r + c] * p.scale);
    }

    // ---- dQ = (dS·scale)·K, 16 query rows per warp, in DH column parts (D 128: two, so that
    // the part's accumulators fit beside dK and dV) ----
    __syncthreads();
    int* const counter = bwd_wait_turn<BK>(p, s, e, h, kt, qt, tid);
    constexpr int DH = D > 96 ? 2 : 1, DP = D / DH;  // parts and their columns
#pragma unroll 1
    for (int part = 0; part < DH; ++part) {
      float dq[DP / 8][4];
#pragma unroll
      for (int j = 0; j < DP / 8; ++j) dq[j][0] = dq[j][1] = dq[j][2] = dq[j][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) {
        uint32_t a[4];
        ldmatrix_x4(a, smem_addr(dSs + (warp * 16 + (lane % 16)) * SS + kk * 16 + (lane / 16) * 8));
#pragma unroll
        for (int d2 = 0; d2 < DP / 16; ++d2) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, smem_addr(Ks + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * RS + part * DP +
                                         d2 * 16 + (lane >> 4) * 8));
          E::mma(dq[2 * d2], a, b[0], b[1]);
          E::mma(dq[2 * d2 + 1], a, b[2], b[3]);
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int64_t iq = q_lo + warp * 16 + g + 8 * r;
        if (iq >= e.lq) continue;
        if (p.dq_direct) {  // the only visitor of this query tile: its dQ is the gradient
          const int64_t row = stored(e.q0 + iq), col = part * DP + 2 * tq;
#pragma unroll
          for (int j = 0; j < DP / 8; ++j) {
            const float x = dq[j][2 * r], y = dq[j][2 * r + 1];
            if (p.dq_f32)
              *reinterpret_cast<float2*>(static_cast<float*>(p.dq) + row * p.dq_tok + h * p.dq_head + col + j * 8) =
                  make_float2(x, y);
            else
              *reinterpret_cast<uint32_t*>(static_cast<T*>(p.dq) + row * p.dq_tok + h * p.dq_head + col + j * 8) =
                  E::pack(x, y);
          }
          continue;
        }
        float* acc = p.dq_acc + (stored(e.q0 + iq) * p.heads_q + h) * D + part * DP + 2 * tq;
#pragma unroll
        for (int j = 0; j < DP / 8; ++j) {
#if __CUDA_ARCH__ >= 900
          atomicAdd(reinterpret_cast<float2*>(acc + j * 8), make_float2(dq[j][2 * r], dq[j][2 * r + 1]));
#else
          atomicAdd(acc + j * 8, dq[j][2 * r]);
          atomicAdd(acc + j * 8 + 1, dq[j][2 * r + 1]);
#endif
        }
      }
    }
    bwd_pass_turn(counter, tid);
    buf ^= 1;
    cur = nxt;
  }
  if (ds0_head >= 0 && lane == 0 && warp == 0) p.sink_part[int64_t(ds0_head) * p.sink_parts + s] += ds0;
  cp_async_wait<0>();

  // ---- epilogue: dK·scale and dV, this warp's 16 key rows ----
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t ik = k_lo + key_row + g + 8 * r;
    if (ik >= e.lk) continue;
    const int64_t row = stored(e.k0 + ik);
#pragma unroll
    for (int j = 0; j < DT; ++j) {
      const int c = j * 8 + 2 * tq;
      const float k0 = dk[j][2 * r] * p.scale, k1 = dk[j][2 * r + 1] * p.scale;
      const float v0 = dv[j][2 * r], v1 = dv[j][2 * r + 1];
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

// ---- finish: dq from the accumulator; dsink from its partials ----
// Grid (x, heads_q): each head's rows × element pairs, consecutive threads on consecutive pairs of a
// row (the divisions are by the constant D / 2, the head comes from the grid).
template <int D, class E>
__global__ void __launch_bounds__(256) attention_bwd_finish_kernel(const BwdParams p) {
  using T = typename E::type;
  const int h = blockIdx.y;
  const int64_t n = p.dq_direct ? 0 : p.total_q * (D / 2);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / (D / 2);
    const int c = int(i - row * (D / 2)) * 2;
    const float2 v = *reinterpret_cast<const float2*>(p.dq_acc + (row * p.heads_q + h) * D + c);
    if (p.dq_f32) *reinterpret_cast<float2*>(static_cast<float*>(p.dq) + row * p.dq_tok + h * p.dq_head + c) = v;
    else *reinterpret_cast<uint32_t*>(static_cast<T*>(p.dq) + row * p.dq_tok + h * p.dq_head + c) = E::pack(v.x, v.y);
  }
  if (p.dsink != nullptr && blockIdx.x == 0 && threadIdx.x < 32) {
    // The head's first block, one warp: strided partial sums, then a fixed butterfly (the same
    // order in every run; the heads in parallel, not one warp walking them all).
    float v = 0.f;
    for (int i = threadIdx.x; i < p.sink_parts; i += 32) v += p.sink_part[int64_t(h) * p.sink_parts + i];
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x == 0) p.dsink[h] = v;
  }
}

// The prep launch and the finish launch, shared by both main kernels (this file's and the wgmma one's).
template <int D, class E>
void launch_bwd_prep(const BwdParams& p, cudaStream_t stream) {
  const unsigned prep_blocks = unsigned((p.total_q + kBwdPrepRows - 1) / kBwdPrepRows);
  attention_bwd_prep_kernel<D, E><<<dim3(prep_blocks, unsigned(p.heads_q)), 128, 0, stream>>>(p);
}
template <int D, class E>
void launch_bwd_finish(const BwdParams& p, cudaStream_t stream) {
  if (p.dq_direct && p.dsink == nullptr) return;  // nothing left to finish
  const int64_t work = p.dq_direct ? 0 : p.total_q * (D / 2), cap = 4096 / p.heads_q + 1;
  const unsigned blocks = unsigned(work / 256 + 1 < cap ? work / 256 + 1 : cap);
  attention_bwd_finish_kernel<D, E><<<dim3(blocks, unsigned(p.heads_q)), 256, 0, stream>>>(p);
}
// The CTAs of a main kernel with key tiles of BK rows: one per tile, the varlen cover for packed
// sequences (sequence s owns tiles [s + cu[s]/BK, s + 1 + cu[s+1]/BK)).
template <int BK>
int64_t bwd_key_tiles(const BwdParams& p) {
  return p.pattern.cu_seqlens_q != nullptr ? p.pattern.num_seqs + p.total_k / BK + 1 : (p.total_k + BK - 1) / BK;
}

// The three launches on `stream`; instantiated per head dim in attention_bwd_d<D>.cu.
template <int D, class E>
cudaError_t launch_bwd(const BwdParams& p, cudaStream_t stream) {
  using S = BwdShape<D>;
  const auto kernel = attention_bwd_kernel<D, E>;
  static const cudaError_t configured =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(S::smem_bytes));
  if (configured != cudaSuccess) return configured;
  launch_bwd_prep<D, E>(p, stream);
  kernel<<<dim3(unsigned(bwd_key_tiles<kBwdBK>(p)), unsigned(p.heads_q / p.group)), kBwdThreads, S::smem_bytes,
           stream>>>(p);
  launch_bwd_finish<D, E>(p, stream);
  return cudaGetLastError();
}

#define ARIADNE_BWD_KERNELS(X, D) X(launch_bwd<D, Bf16>) X(launch_bwd<D, F16>)
#define ARIADNE_BWD_INSTANTIATE_ONE(...) template cudaError_t __VA_ARGS__(const BwdParams&, cudaStream_t);
#define ARIADNE_BWD_DECLARE_ONE(...) extern template cudaError_t __VA_ARGS__(const BwdParams&, cudaStream_t);
#define ARIADNE_INSTANTIATE_BWD(D) ARIADNE_BWD_KERNELS(ARIADNE_BWD_INSTANTIATE_ONE, D)
ARIADNE_BWD_KERNELS(ARIADNE_BWD_DECLARE_ONE, 64)
ARIADNE_BWD_KERNELS(ARIADNE_BWD_DECLARE_ONE, 80)
ARIADNE_BWD_KERNELS(ARIADNE_BWD_DECLARE_ONE, 96)
ARIADNE_BWD_KERNELS(ARIADNE_BWD_DECLARE_ONE, 128)

}  // namespace ariadne::cuda
