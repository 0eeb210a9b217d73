// Internal: the FlashAttention-2-style forward kernel (mma.sync m16n8k16, ldmatrix, cp.async
// double buffering, online softmax in registers), one template for every pattern.
//
// A CTA of NW warps owns one (sequence, query head, query tile of BM = 16·MT·NW rows); each warp
// owns MT 16-row m-tiles. Key tiles of BN rows stream through shared memory, double buffered: K of
// tile j+1 loads while tile j's softmax runs, V of tile j+1 while tile j's P·V runs. The key tiles
// visited come from Pattern::key_range (window, chunk, causal: a band) or the CSR row of the
// block-sparse mask intersected with it; only tiles that Pattern::classify would call partial pay
// for the element mask. Masks and sinks are runtime branches: the template parameters are the head
// dim, the dtype, the tile configuration (two production configs) and whether the diagnostics
// (entropy, distance) are accumulated, compiled for the 64-row config only: 24 forward kernels,
// plus 8 of the transposed received-attention pass.
//
// Configurations (measured on the H200): dense rows use FA2's layout, 4 warps
// x 32 rows (each K/V fragment read from shared memory feeds two m-tiles); bands use 4 warps x 16
// rows, whose 64-row tile keeps the key range of a ±64 window at 192 keys (useful fraction 0.67).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>

#include "ariadne/pattern.hpp"
#include "device/cuda/mma.cuh"

namespace ariadne::cuda {

enum SinkKind : int { kSinkNone = 0, kSinkDenominator = 1, kSinkKey0 = 2 };

// The end of a finished row, shared by every kernel's epilogue. fold_sink_row: a denominator sink
// (Z = exp(sink) + Σ exp(s): one more key with no value) folded into the row's max m and sum l
// (fold_sink), and the row's accumulators scaled to match: at(j, 0) and at(j, 1) are the row's
// two columns of 8-column block j, for j < NT (each kernel's accumulator layout). row_lse: the
// row's natural-log LSE from the base-2 max and sum (−inf when the row has no mass).
template <int NT, class At>
__device__ __forceinline__ void fold_sink_row(int sink_kind, float sink_log2, float& m, float& l, At&& at) {
  if (sink_kind != kSinkDenominator) return;
  const float rescale = fold_sink(m, l, sink_log2);
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    at(j, 0) *= rescale;
    at(j, 1) *= rescale;
  }
}
__device__ __forceinline__ float row_lse(float m, float l) {
  return row_has_mass(l) ? (m + __log2f(l)) * 0.6931471805599453f : -INFINITY;
}

// Everything the kernel reads, by value. Strides are in elements; head_dim is contiguous.
struct FwdParams {
  const void* q;
  const void* k;
  const void* v;
  void* out;    // [total_q, heads_q, D], dtype of q, or f32 when out_f32
  float* lse;   // [heads_q, total_q] contiguous, or null
  const float* sink;  // [heads_q] or null
  // Optional token order [total_q] (total_q == total_k): logical row i of the pattern is stored at
  // packed row order[i] of q, k, v, out and lse. Fuses a token re-permutation (Ariadne's row <->
  // column orders) into the loads and stores instead of gathering q, k, v and scattering out.
  const int32_t* order;
  // Diagnostics (null when not requested): [heads_q, total_q] / [heads_q, total_k] f32, and token
  // coordinates [total, 2] f32 (row, col) in storage order.
  float* entropy;
  float* distance;
  float* received;
  const float2* coords_q;
  const float2* coords_k;
  int64_t q_tok, q_head, k_tok, k_head, v_tok, v_head, o_tok, o_head;
  int64_t total_q, total_k;
  int heads_q, group;  // group = heads_q / heads_kv (GQA)
  float scale_log2;    // scale · log2(e): scores live in base 2 inside the kernel
  int sink_kind;
  bool out_f32;
  Pattern pattern;
  // With `order`: the merge-unit grid (units_h x units_w) when the order is known to be Qwen's
  // block_col walk of one image stored in block_row order (merge 2; BlockColGrid in
  // AttentionOptions::block_col), which the wgmma band kernel copies with 5-D tensor maps; 0: unknown.
  int order_units_h = 0, order_units_w = 0;
};

// Key tiles are at most this many rows; block-sparse blocks must be a multiple of it.
constexpr int kMaxBlockN = 64;

// A kernel configuration: NW warps, MT 16-row m-tiles per warp (query tile BM = 16·MT·NW rows),
// BN-row key tiles, MIN_CTAS resident CTAs asked of the register allocator (__launch_bounds__).
template <int NW_, int MT_, int BN_, int MIN_CTAS_>
struct Config {
  static constexpr int NW = NW_, MT = MT_, BN = BN_, MIN_CTAS = MIN_CTAS_;
  static constexpr int BM = 16 * MT * NW;
  static_assert(BN % 16 == 0 && kMaxBlockN % BN == 0, "key tiles divide the block-sparse unit");
};

template <int D, class Cfg>
struct FwdShape {
  static constexpr int MT = Cfg::MT;  // 16-row m-tiles per warp
  static constexpr int BM = Cfg::BM;
  static constexpr int threads = 32 * Cfg::NW;
  static constexpr int BN = Cfg::BN;
  // Shared rows are padded by 16 bytes: the row pitch is an odd number of 16-byte units, so the 8
  // row addresses of every ldmatrix phase land in 8 different bank groups (no swizzle needed,
  // and it works for D = 80 and 96, whose 10 and 12 chunks an XOR swizzle of 8 would not fit).
  static constexpr int RS = D + 8;
  static constexpr int CHUNKS = D / 8;  // 16-byte chunks per row
  static constexpr size_t smem_bytes = size_t(BM + 4 * BN) * RS * 2;
};

// Varlen grids cover "virtual" query tiles: sequence s owns virtual tiles
// [s + cu_q[s]/BM, s+1 + cu_q[s+1]/BM), at least ceil(lq/BM) of them, so a grid of
// num_seqs + total_q/BM + 1 tiles covers every sequence without a prefix pass over the
// device-resident lengths; at most one tile per sequence is idle. The sequence owning virtual tile
// t, by binary search over cu_seqlens_q (pattern.cu_seqlens_q must be set).
template <int BM>
__device__ __forceinline__ int virtual_tile_seq(const Pattern& pat, int64_t t) {
  int lo = 0, hi = pat.num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (mid + pat.cu_seqlens_q[mid] / BM <= t) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// CTA slots of the whole GPU for `kernel` (SMs x resident CTAs per SM at this shared memory); 0 when
// the runtime cannot say. Callers keep the result in a static of their own instantiation.
template <class Kernel>
int resident_cta_slots(Kernel kernel, int threads, size_t smem) {
  int dev = 0, sms = 0, per_sm = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) != cudaSuccess)
    return 0;
  return sms * per_sm;
}

// Opts each kernel into `smem` bytes of dynamic shared memory (above 48 KB a kernel must, once per
// process); the first error, or success. Callers keep the result in a static of their own
// instantiation.
template <class Kernel>
cudaError_t allow_dynamic_smem(std::initializer_list<Kernel> kernels, size_t smem) {
  for (const Kernel k : kernels) {
    const cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

// The (sequence, query tile within it) of a one-tile-per-CTA kernel: the grid's last tiles, the
// heaviest, launch first. The tile may lie past the sequence's end (an idle CTA).
struct CtaTile {
  int s;
  int64_t tile;
};
// `index` of `count` CTAs along the grid's tile axis (blockIdx.x of gridDim.x unless the launch
// ordered the grid otherwise: the wgmma kernel's WgMaps::order).
template <int BM>
__device__ __forceinline__ CtaTile cta_tile(const Pattern& pat, int64_t index, int64_t count) {
  const int64_t t = count - 1 - index;
  // A default overridden for varlen, not an early return: the kernels' SASS stays as before.
  CtaTile c{0, t};
  if (pat.cu_seqlens_q != nullptr) {
    c.s = virtual_tile_seq<BM>(pat, t);
    c.tile = t - (c.s + pat.cu_seqlens_q[c.s] / BM);
  }
  return c;
}
template <int BM>
__device__ __forceinline__ CtaTile cta_tile(const Pattern& pat) {
  return cta_tile<BM>(pat, blockIdx.x, gridDim.x);
}

// The key tiles one query tile visits, in increasing order. Dense patterns: every BN-tile that
// meets Pattern::key_range. Block-sparse: the listed key blocks of this query block, each cut into
// block/BN tiles, those outside key_range skipped. Uniform across the CTA (no divergence).
// Sequence-local positions fit 32 bits (cu_seqlens are int32), so the loop runs on int: 64-bit
// divisions there cost a call and many registers.
template <int BN>
struct KeyTiles {
  const int32_t* cols = nullptr;  // CSR column list of this row (block-sparse) or null
  int pos = 0, end = 0;           // dense: tile index; sparse: entry·per + sub-tile
  int per = 1, block = 0;
  int lo = 0, hi = 0;             // Pattern::key_range of the query tile

  __device__ bool next(int& k_lo) {
    while (pos < end) {
      const int i = pos++;
      if (cols == nullptr) {
        k_lo = i * BN;
        return true;
      }
      k_lo = cols[i / per] * block + (i % per) * BN;
      if (k_lo + BN > lo && k_lo < hi) return true;
    }
    return false;
  }
};

template <int D, class E, class Cfg, bool DIAG>
__global__ void __launch_bounds__(32 * Cfg::NW, Cfg::MIN_CTAS) attention_fwd_kernel(const FwdParams p) {
  using S = FwdShape<D, Cfg>;
  constexpr int MT = S::MT, kThreads = S::threads;
  constexpr int BM = S::BM, BN = S::BN, RS = S::RS, C = S::CHUNKS;
  constexpr int NT = BN / 8;  // score n-tiles per m-tile
  constexpr int DT = D / 8;   // output n-tiles per m-tile
  using T = typename E::type;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* Qs = reinterpret_cast<T*>(smem_raw);
  T* Ks = Qs + BM * RS;       // 2 buffers of BN·RS
  T* Vs = Ks + 2 * BN * RS;   // 2 buffers of BN·RS

  const Pattern& pat = p.pattern;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int h = blockIdx.y;
  const int kvh = h / p.group;

  // ---- which (sequence, query tile) this CTA owns; heaviest (last) tiles launch first ----
  const auto [s, tile] = cta_tile<BM>(pat);
  const SeqExtent e = pat.seq(s, p.total_q, p.total_k);
  const int64_t q_lo = tile * BM;
  if (q_lo >= e.lq) return;
  const int64_t q_hi = q_lo + BM < e.lq ? q_lo + BM : e.lq;

  // ---- the key tiles to visit ----
  KeyTiles<BN> tiles;
  const KeyRange range = pat.key_range(e, q_lo, q_hi);
  tiles.lo = int(range.lo);
  tiles.hi = int(range.hi);
  if (pat.blocks.defined()) {
    const int64_t row = pat.block_row(s, e, h, q_lo / pat.blocks.block);
    tiles.cols = pat.blocks.col_idx + pat.blocks.row_ptr[row];
    tiles.per = pat.blocks.block / BN;
    tiles.block = pat.blocks.block;
    tiles.end = (pat.blocks.row_ptr[row + 1] - pat.blocks.row_ptr[row]) * tiles.per;
  } else if (!range.empty()) {
    tiles.pos = tiles.lo / BN;
    tiles.end = (tiles.hi + BN - 1) / BN;
  }
  // Element masks, decided once per CTA with Pattern::key_range: a single row's allowed keys form
  // one interval (window ∩ chunk ∩ sequence), and both ends are nondecreasing in the row. So a
  // tile needs no mask (Pattern::classify's "full") exactly when it starts at or after the last
  // row's lower end and ends at or before the first row's upper end.
  const int full_lo = int(pat.key_range(e, q_hi - 1, q_hi).lo);
  const int full_hi = int(pat.key_range(e, q_lo, q_lo + 1).hi);

  const T* qg = static_cast<const T*>(p.q) + h * p.q_head;  // head bases; rows added below
  const T* kg = static_cast<const T*>(p.k) + kvh * p.k_head;
  const T* vg = static_cast<const T*>(p.v) + kvh * p.v_head;
  // Packed storage row of logical packed row i.
  auto stored = [&](int64_t i) -> int64_t { return p.order != nullptr ? p.order[i] : i; };

  // Offsets inside one tile fit 32 bits (attention_cuda_supports bounds the strides); keeping
  // them 32-bit saves the registers the compiler would spend on hoisted 64-bit addresses.
  // Rows first_row .. first_row + rows of one head (logical packed rows), `valid` of them real.
  auto load_rows = [&](T* dst, const T* head, int64_t stride, int64_t first_row, int rows, int64_t valid) {
    if (p.order == nullptr) {
      const T* src = head + first_row * stride;
#pragma unroll
      for (int i = tid; i < rows * C; i += kThreads) {
        const int r = i / C, c = i % C;
        const bool ok = r < valid;
        cp_async16(smem_addr(dst + r * RS + c * 8), src + (ok ? r * int(stride) + c * 8 : 0), ok);
      }
    } else {
      // Not unrolled: the gathered path must not raise the register count of the plain one.
#pragma unroll 1
      for (int i = tid; i < rows * C; i += kThreads) {
        const int r = i / C, c = i % C;
        const bool ok = r < valid;
        const T* src = ok ? head + p.order[first_row + r] * stride + c * 8 : head;
        cp_async16(smem_addr(dst + r * RS + c * 8), src, ok);
      }
    }
  };
  auto load_kv = [&](T* dst, const T* head, int64_t stride, int k_lo) {
    load_rows(dst, head, stride, e.k0 + k_lo, BN, e.lk - k_lo);
  };

  int k_cur = 0;
  bool have = tiles.next(k_cur);
  load_rows(Qs, qg, p.q_tok, e.q0 + q_lo, BM, q_hi - q_lo);
  if (have) load_kv(Ks, kg, p.k_tok, k_cur);
  cp_async_commit();
  if (have) load_kv(Vs, vg, p.v_tok, k_cur);
  cp_async_commit();

  float acc[MT][DT][4];
  float m_row[MT][2], l_row[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int j = 0; j < DT; ++j) acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.f;
    m_row[mt][0] = m_row[mt][1] = -INFINITY;
    l_row[mt][0] = l_row[mt][1] = 0.f;
  }

  const int g = lane / 4, tq = lane % 4;  // mma fragment row group and column pair
  const int warp_row = warp * MT * 16;
  // This thread's rows (g and g + 8 of each m-tile): their exact key intervals.
  int row_lo[MT][2], row_hi[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t iq = q_lo + warp_row + mt * 16 + g + 8 * r;
      const KeyRange kr = pat.key_range(e, iq, iq + 1);
      row_lo[mt][r] = int(kr.lo);
      row_hi[mt][r] = int(kr.hi);
    }
  float u_row[MT][2] = {}, w_row[MT][2] = {};  // diagnostics: Σ p·s and Σ p·dist, rescaled like l
  float2 cq[MT][2] = {};             // diagnostics: this thread's query coordinates
  if constexpr (DIAG) {
    if (p.coords_q != nullptr)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int64_t iq = q_lo + warp_row + mt * 16 + g + 8 * r;
          if (iq < e.lq) cq[mt][r] = p.coords_q[stored(e.q0 + iq)];
        }
  }
  const float sink_log2 =
      p.sink_kind != kSinkNone ? p.sink[h] * 1.4426950408889634f : 0.f;
  const float sink_raw = sink_log2 / p.scale_log2;  // the key0 bias in unscaled score units
  int buf = 0;

  while (have) {
    int k_next = 0;
    const bool have_next = tiles.next(k_next);
    const T* Kb = Ks + buf * BN * RS;
    const T* Vb = Vs + buf * BN * RS;

    cp_async_wait<1>();  // K of this tile (and Q) landed; V may still be in flight
    __syncthreads();

    // ---- S = Q·Kᵀ for this warp's MT·16 rows × BN keys ----
    float sc[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int j = 0; j < NT; ++j) sc[mt][j][0] = sc[mt][j][1] = sc[mt][j][2] = sc[mt][j][3] = 0.f;
#pragma unroll 1
    for (int ks = 0; ks < D / 16; ++ks) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        ldmatrix_x4(a[mt], smem_addr(Qs + (warp_row + mt * 16 + (lane % 16)) * RS + ks * 16 +
                                     (lane / 16) * 8));
#pragma unroll
      for (int n2 = 0; n2 < BN / 16; ++n2) {
        uint32_t b[4];
        ldmatrix_x4(b, smem_addr(Kb + (n2 * 16 + (lane & 7) + ((lane >> 4) << 3)) * RS + ks * 16 +
                                 ((lane >> 3) & 1) * 8));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          E::mma(sc[mt][2 * n2], a[mt], b[0], b[1]);
          E::mma(sc[mt][2 * n2 + 1], a[mt], b[2], b[3]);
        }
      }
    }

    if (have_next) load_kv(Ks + (buf ^ 1) * BN * RS, kg, p.k_tok, k_next);
    cp_async_commit();  // committed even when empty, so the wait counts above stay uniform

    // ---- mask (boundary tiles only), online softmax ----
    // Scores stay unscaled here; the scale folds into the exponent's FMA (one FFMA per element
    // instead of FMUL + FADD). The running max m_row is kept in scaled base-2 units.
    const bool key0 = p.sink_kind == kSinkKey0 && k_cur == 0;
    const bool masked = key0 || k_cur < full_lo || k_cur + BN > full_hi;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      if (masked) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int lo = row_lo[mt][r] - k_cur, hi = row_hi[mt][r] - k_cur;
#pragma unroll
          for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const int col = j * 8 + 2 * tq + c;
              if (col < lo || col >= hi) sc[mt][j][2 * r + c] = -INFINITY;
              else if (key0 && col == 0) sc[mt][j][2 * r + c] += sink_raw;
            }
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < NT; ++j) mx = fmax_nan(mx, fmax_nan(sc[mt][j][2 * r], sc[mt][j][2 * r + 1]));
        mx = quad_max(mx);
        mx = fmax_nan(m_row[mt][r], mx * p.scale_log2);  // scale > 0: max commutes with it
        // A row with nothing allowed so far keeps max −inf; subtracting 0 instead keeps
        // exp2(−inf − base) = 0 rather than NaN.
        const float base = mx == -INFINITY ? 0.f : mx;
        const float alpha = ex2(m_row[mt][r] - base);
        m_row[mt][r] = mx;
        float sum = 0.f, u = 0.f, w = 0.f;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const float raw = sc[mt][j][2 * r + c];
            const float pr = ex2(fmaf(raw, p.scale_log2, -base));
            sc[mt][j][2 * r + c] = pr;
            sum += pr;
            if constexpr (DIAG) {
              // Entropy needs Σ p·s, distance Σ p·‖c_i − c_j‖ (masked keys have p = 0).
              if (pr > 0.f) {
                u += pr * raw;
                if (p.coords_k != nullptr) {
                  const float2 ck = p.coords_k[stored(e.k0 + k_cur + j * 8 + 2 * tq + c)];
                  const float dr = cq[mt][r].x - ck.x, dc = cq[mt][r].y - ck.y;
                  w += pr * sqrtf(dr * dr + dc * dc);
                }
              }
            }
          }
        }
        // l is kept per thread (a quarter of the row) and reduced across the quad at the end.
        l_row[mt][r] = l_row[mt][r] * alpha + sum;
        if constexpr (DIAG) {
          u_row[mt][r] = u_row[mt][r] * alpha + u;
          w_row[mt][r] = w_row[mt][r] * alpha + w;
        }
#pragma unroll
        for (int j = 0; j < DT; ++j) {
          acc[mt][j][2 * r] *= alpha;
          acc[mt][j][2 * r + 1] *= alpha;
        }
      }
    }

    cp_async_wait<1>();  // V of this tile landed; next K may still be in flight
    __syncthreads();

    // ---- O += P·V; P goes from the score accumulators straight into A fragments ----
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        a[mt][0] = E::pack(sc[mt][2 * kk][0], sc[mt][2 * kk][1]);
        a[mt][1] = E::pack(sc[mt][2 * kk][2], sc[mt][2 * kk][3]);
        a[mt][2] = E::pack(sc[mt][2 * kk + 1][0], sc[mt][2 * kk + 1][1]);
        a[mt][3] = E::pack(sc[mt][2 * kk + 1][2], sc[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int d2 = 0; d2 < D / 16; ++d2) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, smem_addr(Vb + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * RS +
                                       d2 * 16 + (lane >> 4) * 8));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          E::mma(acc[mt][2 * d2], a[mt], b[0], b[1]);
          E::mma(acc[mt][2 * d2 + 1], a[mt], b[2], b[3]);
        }
      }
    }

    if (have_next) load_kv(Vs + (buf ^ 1) * BN * RS, vg, p.v_tok, k_next);
    cp_async_commit();
    buf ^= 1;
    k_cur = k_next;
    have = have_next;
  }
  // The epilogue reuses Qs. Q rows were copied by every thread of the CTA, so a CTA that visited
  // no key tile must wait for all of them (a barrier), not only for its own copies.
  cp_async_wait<0>();
  __syncthreads();

  // ---- epilogue: normalize, sink, LSE; stage 16-bit rows in this warp's Q rows ----
  T* stage = Qs;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = quad_sum(l_row[mt][r]);
      float m = m_row[mt][r];
      const int row = warp_row + mt * 16 + g + 8 * r;
      const int64_t iq = q_lo + row;
      if constexpr (DIAG) {
        // Over the keys only (the sink's mass left out): H = ln Z_k − Σ â·s, distance = Σ â·dist.
        const float u = quad_sum(u_row[mt][r]), w = quad_sum(w_row[mt][r]);
        if (tq == 0 && iq < e.lq) {
          const int64_t at = int64_t(h) * p.total_q + stored(e.q0 + iq);
          const float scale = p.scale_log2 * 0.6931471805599453f;
          if (p.entropy != nullptr)
            p.entropy[at] = row_has_mass(l) ? row_lse(m, l) - scale * u / l : 0.f;
          if (p.distance != nullptr) p.distance[at] = row_has_mass(l) ? w / l : 0.f;
        }
      }
      fold_sink_row<DT>(p.sink_kind, sink_log2, m, l, [&](int j, int x) -> float& { return acc[mt][j][2 * r + x]; });
      const float inv = row_has_mass(l) ? 1.f / l : 0.f;  // no key and no sink: out = 0
#pragma unroll
      for (int j = 0; j < DT; ++j) {
        const float o0 = acc[mt][j][2 * r] * inv, o1 = acc[mt][j][2 * r + 1] * inv;
        if (p.out_f32) {
          if (iq < e.lq) {
            float* og = static_cast<float*>(p.out) + stored(e.q0 + iq) * p.o_tok + h * p.o_head +
                        j * 8 + 2 * tq;
            *reinterpret_cast<float2*>(og) = make_float2(o0, o1);
          }
        } else {
          *reinterpret_cast<uint32_t*>(stage + row * RS + j * 8 + 2 * tq) = E::pack(o0, o1);
        }
      }
      if (p.lse != nullptr && tq == 0 && iq < e.lq)
        p.lse[int64_t(h) * p.total_q + stored(e.q0 + iq)] = row_lse(m, l);
    }
  }
  if (!p.out_f32) {
    __syncwarp();
    // 16-byte coalesced stores of this warp's rows.
    T* og = static_cast<T*>(p.out) + h * p.o_head;
    for (int i = lane; i < MT * 16 * C; i += 32) {
      const int row = warp_row + i / C, c = i % C;
      if (q_lo + row < e.lq)
        *reinterpret_cast<uint4*>(og + stored(e.q0 + q_lo + row) * p.o_tok + c * 8) =
            *reinterpret_cast<const uint4*>(stage + row * RS + c * 8);
    }
  }
}

// ---- received attention: Σ_i a_ij per key, by a transposed pass over the saved LSE ----
//
// A CTA of 4 warps owns (sequence, query head, 64 keys), 16 key rows per warp, and walks the
// sequence's 64-query tiles that Pattern::classify (and the CSR row, block-sparse) lets see its
// keys. Sᵀ = K·Qᵀ puts keys on mma rows, so the sum over queries is a row sum in registers, as l
// is in the forward pass: a_ij = exp(s_ij − lse_i) with the sink-inclusive lse of the forward.
// One Q buffer, no overlap: a diagnostics pass, kept simple.
template <int D, class E>
__global__ void __launch_bounds__(128) attention_received_kernel(const FwdParams p) {
  constexpr int BK = 64, BQ = 64, RS = D + 8, C = D / 8, NT = BQ / 8, kThreads = 128;
  using T = typename E::type;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* Ks = reinterpret_cast<T*>(smem_raw);
  T* Qs = Ks + BK * RS;

  const Pattern& pat = p.pattern;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, tq = lane % 4;
  const int h = blockIdx.y, kvh = h / p.group;
  const int64_t t = blockIdx.x;
  int s = 0;
  int64_t tile = t;
  if (pat.cu_seqlens_q != nullptr) {  // the forward kernel's virtual-tile cover, over keys
    const int32_t* cuk = pat.cu_seqlens_k != nullptr ? pat.cu_seqlens_k : pat.cu_seqlens_q;
    int lo = 0, hi = pat.num_seqs - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (mid + cuk[mid] / BK <= t) lo = mid; else hi = mid - 1;
    }
    s = lo;
    tile = t - (s + cuk[s] / BK);
  }
  const SeqExtent e = pat.seq(s, p.total_q, p.total_k);
  const int64_t k_lo = tile * BK;
  if (k_lo >= e.lk) return;
  const int64_t k_hi = k_lo + BK < e.lk ? k_lo + BK : e.lk;
  auto stored = [&](int64_t i) -> int64_t { return p.order != nullptr ? p.order[i] : i; };
  auto load = [&](T* dst, const T* head, int64_t stride, int64_t first, int64_t valid) {
    for (int i = tid; i < 64 * C; i += kThreads) {
      const int r = i / C, c = i % C;
      const bool ok = r < valid;
      cp_async16(smem_addr(dst + r * RS + c * 8), ok ? head + stored(first + r) * stride + c * 8 : head, ok);
    }
    cp_async_commit();
  };
  load(Ks, static_cast<const T*>(p.k) + kvh * p.k_head, p.k_tok, e.k0 + k_lo, k_hi - k_lo);

  const bool key0 = p.sink_kind == kSinkKey0 && k_lo == 0;
  const float sink_raw = key0 ? p.sink[h] * 1.4426950408889634f / p.scale_log2 : 0.f;
  const float* lse = p.lse + int64_t(h) * p.total_q;
  float recv[2] = {0.f, 0.f};  // key rows g and g + 8 of this warp
  for (int64_t q_lo = 0; q_lo < e.lq; q_lo += BQ) {
    const int64_t q_hi = q_lo + BQ < e.lq ? q_lo + BQ : e.lq;
    const TileKind kind = pat.classify(e, q_lo, q_hi, k_lo, k_hi);
    if (kind == TileKind::none) continue;
    if (pat.blocks.defined() &&
        !pat.block_listed(pat.block_row(s, e, h, q_lo / pat.blocks.block), k_lo / pat.blocks.block))
      continue;
    __syncthreads();  // every warp is done with the previous Q tile
    load(Qs, static_cast<const T*>(p.q) + h * p.q_head, p.q_tok, e.q0 + q_lo, q_hi - q_lo);
    cp_async_wait<0>();
    __syncthreads();

    float sc[NT][4] = {};
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      uint32_t a[4];
      ldmatrix_x4(a, smem_addr(Ks + (warp * 16 + (lane % 16)) * RS + ks * 16 + (lane / 16) * 8));
#pragma unroll
      for (int n2 = 0; n2 < BQ / 16; ++n2) {
        uint32_t b[4];
        ldmatrix_x4(b, smem_addr(Qs + (n2 * 16 + (lane & 7) + ((lane >> 4) << 3)) * RS + ks * 16 +
                                 ((lane >> 3) & 1) * 8));
        E::mma(sc[2 * n2], a, b[0], b[1]);
        E::mma(sc[2 * n2 + 1], a, b[2], b[3]);
      }
    }
    // Columns are queries: each needs its lse, and (boundary tiles) its exact key interval.
    const bool masked = key0 || kind != TileKind::full || q_lo + BQ > e.lq;
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int64_t iq = q_lo + j * 8 + 2 * tq + c;
        if (iq >= e.lq) continue;
        const float lse2 = lse[stored(e.q0 + iq)] * 1.4426950408889634f;
        KeyRange kr{k_lo, k_hi};
        if (masked) kr = pat.key_range(e, iq, iq + 1);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int64_t ik = k_lo + warp * 16 + g + 8 * r;
          if (ik < kr.lo || ik >= kr.hi) continue;
          const float raw = sc[j][2 * r + c] + (key0 && ik == 0 ? sink_raw : 0.f);
          recv[r] += ex2(fmaf(raw, p.scale_log2, -lse2));
        }
      }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float v = quad_sum(recv[r]);
    const int64_t ik = k_lo + warp * 16 + g + 8 * r;
    if (tq == 0 && ik < e.lk) p.received[int64_t(h) * p.total_k + stored(e.k0 + ik)] = v;
  }
  cp_async_wait<0>();  // a CTA that met no query tile still has K copies in flight
}

// Launches one instantiation; explicitly instantiated per head dim in attention_fwd_d<D>.cu so the
// kernels compile in parallel. Grid: (query tiles, heads_q). Returns the launch error.
template <int D, class E, class C, bool DIAG>
cudaError_t launch_fwd(const FwdParams& p, cudaStream_t stream) {
  using S = FwdShape<D, C>;
  const auto kernel = attention_fwd_kernel<D, E, C, DIAG>;
  // Above 48 KB of dynamic shared memory a kernel must opt in once per process.
  static const cudaError_t configured = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(S::smem_bytes));
  if (configured != cudaSuccess) return configured;
  const int64_t tiles = p.pattern.cu_seqlens_q != nullptr
                            ? p.pattern.num_seqs + p.total_q / S::BM + 1
                            : (p.total_q + S::BM - 1) / S::BM;
  kernel<<<dim3(unsigned(tiles), unsigned(p.heads_q)), S::threads, S::smem_bytes, stream>>>(p);
  return cudaGetLastError();
}

// The received pass (needs p.lse and p.received). Grid: (key tiles, heads_q).
template <int D, class E>
cudaError_t launch_received(const FwdParams& p, cudaStream_t stream) {
  constexpr size_t smem = size_t(2 * 64) * (D + 8) * 2;
  const auto kernel = attention_received_kernel<D, E>;
  static const cudaError_t configured =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (configured != cudaSuccess) return configured;
  const int64_t tiles = p.pattern.cu_seqlens_q != nullptr ? p.pattern.num_seqs + p.total_k / 64 + 1
                                                          : (p.total_k + 63) / 64;
  kernel<<<dim3(unsigned(tiles), unsigned(p.heads_q)), 128, smem, stream>>>(p);
  return cudaGetLastError();
}

// The production configurations: 128-row tiles for long dense rows, 64-row tiles for bands (and
// for every call that asks for diagnostics, the only configuration compiled with them).
using WideConfig = Config<4, 2, 64, 1>;
using BandConfig = Config<4, 1, 64, 3>;

#define ARIADNE_FWD_KERNELS(X, D)                                                                \
  X(launch_fwd<D, Bf16, WideConfig, false>) X(launch_fwd<D, Bf16, BandConfig, false>)            \
  X(launch_fwd<D, Bf16, BandConfig, true>) X(launch_fwd<D, F16, WideConfig, false>)              \
  X(launch_fwd<D, F16, BandConfig, false>) X(launch_fwd<D, F16, BandConfig, true>)               \
  X(launch_received<D, Bf16>) X(launch_received<D, F16>)
#define ARIADNE_FWD_INSTANTIATE_ONE(...) template cudaError_t __VA_ARGS__(const FwdParams&, cudaStream_t);
#define ARIADNE_FWD_DECLARE_ONE(...) extern template cudaError_t __VA_ARGS__(const FwdParams&, cudaStream_t);
#define ARIADNE_INSTANTIATE_FWD(D) ARIADNE_FWD_KERNELS(ARIADNE_FWD_INSTANTIATE_ONE, D)
ARIADNE_FWD_KERNELS(ARIADNE_FWD_DECLARE_ONE, 64)
ARIADNE_FWD_KERNELS(ARIADNE_FWD_DECLARE_ONE, 80)
ARIADNE_FWD_KERNELS(ARIADNE_FWD_DECLARE_ONE, 96)
ARIADNE_FWD_KERNELS(ARIADNE_FWD_DECLARE_ONE, 128)

}  // namespace ariadne::cuda
