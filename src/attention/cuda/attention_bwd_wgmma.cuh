// Internal: the Hopper (sm_90a) backward main kernel: every product as wgmma from swizzled shared
// tiles, warp-specialized. The prep and finish launches, the walk, the deterministic ranks and the
// semantics (masks, sinks, GQA, varlen, orders, block-sparse rows) are attention_bwd.cuh's; this
// file only replaces its main kernel.
//
// A work item is (128 keys, KV head); a CTA of 3 warpgroups takes items I = blockIdx.x,
// blockIdx.x + gridDim.x, ... (one item per CTA, or as many CTAs as the GPU holds when the items
// cost alike: launch_bwd_wgmma) and walks each item's (query head of the group, 64-query tile)
// pairs that see its keys. The ring of Q and dO stages runs on across items, and at D <= 80 K and V
// are double-buffered, so an item's first loads go under the previous item's last pairs and its
// dK/dV epilogue:
//   - warpgroup 0, the producer (few registers, setmaxnreg): warps 0-2 copy an item's K and V once,
//     then per pair Q, dO and the rows' raw lse and D with cp.async (gathered through the token
//     order, zero past a sequence's end) into a ring of 2 stages, each stage's arrival on its
//     mbarrier, and after the item's last pair an end-of-item entry;
//     warp 3, the writer, adds each pair's summed dQ tile to the f32 accumulator by one bulk
//     reduce-add per query row (cp.reduce.async.bulk), and in the deterministic mode takes the
//     pair's turn first, so that neither the turn's spin nor the adds hold up the products.
//   - consumer warpgroups c = 0, 1 hold keys 64c .. 64c + 63 with their dK and dV accumulators
//     (m64nD, fp32, D/2 registers each) for the item's walk. Per pair:
//       Sᵀ  = K_c·Qᵀ, dPᵀ = V_c·dOᵀ     wgmma m64n64k16, both operands K-major in shared memory;
//       Pᵀ  = exp2(Sᵀ·scale·log2e − lse·log2e), dSᵀ = Pᵀ ⊙ (dPᵀ − D)   in registers;
//       dV += Pᵀ·dO, dK += dSᵀ·Q        wgmma m64nDk16, A packed from the accumulators (their
//                                       layout is the A fragment's), B = dO / Q read MN-major;
//       dSᵀ to shared memory (keys on rows, swizzled), then dQ_c = dS·K_c over the warpgroup's own
//       64 keys as wgmma with both operands MN-major (m64nD; D 128 in two 64-column parts).
//     Consumer 0 stores dQ_0 into one of two f32 dQ tiles, consumer 1 adds dQ_1 and the scale and
//     hands the tile to the writer: named barriers between the roles, none across the whole CTA.
// Tiles use the forward wgmma kernel's swizzled layouts (attention_wgmma.cuh): W = 128 bytes at
// D 64 and 128, W = 32 at D 80 (regions of 16 columns: 80 runs natively).
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
  static constexpr int BK = 128, BQ = kBwdBQ, threads = 384, STAGES = 2;
  static constexpr int C = D / 8;                   // 16-byte chunks per row
  static constexpr int W = D % 64 == 0 ? 128 : 32;  // swizzle span in bytes (as WgShape)
  static constexpr int QS = D + 8;                  // dQ tile rows: D floats + 32 bytes (conflict-free halves)
  // setmaxnreg: the consumers hold dK, dV (D floats each) beside the products; at D 128 they take
  // all the producer can spare (its loads then keep a few values in local memory).
  // The pool is what the launch gave the CTA: 384 threads at 168 registers (launch bounds); a
  // setmaxnreg.inc that the pool cannot cover never returns.
  static constexpr int consumer_regs = D > 96 ? 232 : 216, producer_regs = D > 96 ? 40 : 72;
  static_assert(128 * producer_regs + 256 * consumer_regs <= 384 * 168, "the registers the launch allocated");
  static constexpr size_t k_bytes = size_t(BK) * D * 2, q_bytes = size_t(BQ) * D * 2;
  static constexpr size_t dq_bytes = size_t(BQ) * QS * sizeof(float);
  // K and V buffers: two where they fit beside the rest (D <= 80), so that the next item's K and V
  // load while the consumers finish this one; one at D 128 (the next item's load then waits for
  // the consumers' last product of this one).
  static constexpr int KVB = D > 80 ? 1 : 2;
  // CTAs that take several items (launch_bwd_wgmma) where K and V are double-buffered.
  static constexpr bool persistent = KVB == 2;
  // KVB × (K, V); then the stages' Q and dO; then dSᵀ [BK keys][BQ queries] (128-byte rows, swizzled: the
  // MN-major A operand of dQ = dS·K); then two f32 dQ tiles [BQ][QS]; then the stages' raw lse and
  // D [BQ] each; then the mbarriers; then each stage's pair (head, query tile). Every swizzled tile starts on a 1024-byte boundary (1024 bytes
  // of slack align the base).
  static constexpr size_t q_off = KVB * 2 * k_bytes, do_off = q_off + STAGES * q_bytes, ds_off = do_off + STAGES * q_bytes;
  static constexpr size_t dq_off = ds_off + size_t(BK) * BQ * 2;
  static constexpr size_t stat_off = dq_off + 2 * dq_bytes;
  static constexpr size_t bar_off = stat_off + 2 * STAGES * BQ * sizeof(float);
  static constexpr size_t meta_off = bar_off + (2 * STAGES + 2 * KVB) * 8;
  static constexpr size_t smem_bytes = 1024 + meta_off + STAGES * 8;
  static_assert(k_bytes % 1024 == 0 && q_bytes % 1024 == 0, "tiles keep the 1024-byte alignment");
  static_assert(BQ * 2 == 128, "a dSᵀ row is one 128-byte swizzle span");
  static_assert(QS * sizeof(float) % 16 == 0, "dQ rows are bulk-copy aligned");
  static_assert(smem_bytes <= 227 * 1024, "one CTA per SM");
};

// One work item of the main kernel: key tile kt of sequence s and KV head kvh, its keys
// [k_lo, k_hi) and the query tiles [qt_first, qt_first + span) that see them (pairs: span × group).
// Every role of the CTA derives the same items from the index; `live` is false for the varlen
// cover's tiles past a sequence's end (no keys: skipped by every role).
struct BwdWgItem {
  int s, kvh;
  bool live;
  int64_t kt, k_lo, k_hi, qt_first, span, pairs;
  SeqExtent e;
};
template <int BK>
__device__ __forceinline__ BwdWgItem bwd_wg_item(const BwdParams& p, int64_t tiles, int64_t index) {
  const Pattern& pat = p.pattern;
  const int32_t* cuk = pat.cu_seqlens_k != nullptr ? pat.cu_seqlens_k : pat.cu_seqlens_q;
  BwdWgItem w{};
  w.kvh = int(index / tiles);
  // Items in launch order as the tile kernel's CTAs: first to last by default (causal: heaviest
  // first), last to first in the deterministic mode (its ranks wait only on items taken earlier).
  const int64_t x = index % tiles, launch = p.counters != nullptr ? tiles - 1 - x : x;
  const auto [s, kt] = cover_tile<BK>(pat, cuk, launch);
  w.s = s;
  w.kt = kt;
  w.e = pat.seq(s, p.total_q, p.total_k);
  w.k_lo = kt * BK;
  w.live = w.k_lo < w.e.lk;
  if (!w.live) return w;
  w.k_hi = w.k_lo + BK < w.e.lk ? w.k_lo + BK : w.e.lk;
  const KeyRange qr = pat.query_range(w.e, w.k_lo, w.k_hi);
  w.qt_first = qr.empty() ? 0 : qr.lo / kBwdBQ;
  w.span = qr.empty() ? 0 : (qr.hi + kBwdBQ - 1) / kBwdBQ - w.qt_first;
  w.pairs = w.span * p.group;
  return w;
}

// Copies `rows` rows (first.., gathered through `order`) of one head into a swizzled tile of ROWS
// rows with cp.async by NT threads (index t), zero-filling rows at or past `valid`.
template <int ROWS, int W, int C, int NT, class T>
__device__ __forceinline__ void bwd_wg_load(T* dst, const T* head, int64_t stride, int64_t first, int64_t valid,
                                            const int32_t* order, int t) {
#pragma unroll 2
  for (int i = t; i < ROWS * C; i += NT) {
    const int r = i / C, ch = i % C;
    const bool ok = r < valid;
    const int64_t row = ok ? (order != nullptr ? order[first + r] : first + r) : 0;
    cp_async16(smem_addr(dst + swz_off<W, ROWS>(r, ch)), ok ? head + row * stride + ch * 8 : head, ok);
  }
}

// Named barriers of the main kernel (0 is __syncthreads'): per dQ tile b, `combine` (consumer 0
// has stored its part), `dq_full` (the sum is in the tile, for the writer warp) and `dq_free` (the
// writer's bulk adds have read the tile); per consumer warpgroup c, `ds_ready` (its dSᵀ rows).
__device__ __forceinline__ int bwd_bar_combine(int b) { return 1 + b; }
__device__ __forceinline__ int bwd_bar_dq_full(int b) { return 3 + b; }
__device__ __forceinline__ int bwd_bar_dq_free(int b) { return 5 + b; }
__device__ __forceinline__ int bwd_bar_ds_ready(int c) { return 7 + c; }

template <int D, class E>
__global__ void __launch_bounds__(384, 1) attention_bwd_wgmma_kernel(const BwdParams p, int64_t tiles, int64_t items) {
  using S = BwdWgShape<D>;
  using T = typename E::type;
  constexpr int BK = S::BK, BQ = S::BQ, C = S::C, W = S::W, QS = S::QS, STAGES = S::STAGES, KVB = S::KVB;
  constexpr int NS = BQ / 2;   // accumulators of an m64n64 product per thread
  constexpr int NO = D / 2;    // dK, dV accumulators per thread (m64nD)
  constexpr uint32_t kAtom8 = 8 * W, kRegionK = BK * W, kRegionQ = BQ * W;

  extern __shared__ __align__(16) unsigned char smem_dyn[];
  unsigned char* smem_raw = smem_dyn + ((1024 - (smem_addr(smem_dyn) & 1023)) & 1023);
  auto Ks = [&](int kb) { return reinterpret_cast<T*>(smem_raw + size_t(kb) * 2 * S::k_bytes); };  // K of buffer kb
  auto Vs = [&](int kb) { return Ks(kb) + BK * D; };                                                // V of buffer kb
  T* Qs = reinterpret_cast<T*>(smem_raw + S::q_off);    // STAGES buffers of BQ·D
  T* dOs = reinterpret_cast<T*>(smem_raw + S::do_off);  // STAGES buffers of BQ·D
  T* dSs = reinterpret_cast<T*>(smem_raw + S::ds_off);  // [BK][BQ] swizzled: dSᵀ, keys on rows
  float* dQs = reinterpret_cast<float*>(smem_raw + S::dq_off);     // 2 tiles [BQ][QS]: a pair's dQ
  float* lses = reinterpret_cast<float*>(smem_raw + S::stat_off);  // STAGES buffers of BQ (raw lse)
  float* Dls = lses + STAGES * BQ;                                 // STAGES buffers of BQ
  const uint32_t bars = smem_addr(smem_raw + S::bar_off);
  auto full = [&](int st) { return bars + 8u * uint32_t(st); };            // a stage's Q, dO, stats landed
  auto empty = [&](int st) { return bars + 8u * uint32_t(STAGES + st); };  // both consumers done with it
  auto kv_full = [&](int kb) { return bars + 8u * uint32_t(2 * STAGES + kb); };         // buffer kb's K, V landed
  auto kv_empty = [&](int kb) { return bars + 8u * uint32_t(2 * STAGES + KVB + kb); };  // consumers done with it
  int2* meta = reinterpret_cast<int2*>(smem_raw + S::meta_off);  // a stage's (head, query tile); head −1: item end

  const Pattern& pat = p.pattern;
  const int tid = threadIdx.x, wg = tid / 128;

  // An item's pairs in walk order: head by head of the group, query tiles ascending. Every query
  // tile of [qt_first, qt_first + span) meets the key tile's query range, so only a block mask skips
  // pairs. The producer and the writer warp each walk it; the consumers read each stage's pair from
  // `meta`, so a block mask's lookups stay off their path.
  auto next_pair = [&](const BwdWgItem& w, int64_t i) {
    if (pat.blocks.defined())
      while (i < w.pairs &&
             !bwd_block_listed(pat, w.s, w.e, w.kvh * p.group + int(i / w.span), w.k_lo, w.qt_first + i % w.span))
        ++i;
    return i;
  };

  const BwdWgItem w0 = bwd_wg_item<BK>(p, tiles, blockIdx.x);
  if (!S::persistent && !w0.live) return;
  // Runs a role's walk on each live item of the CTA: blockIdx.x, blockIdx.x + gridDim.x, ... where
  // the launch made the CTAs persistent (D <= 80, launch_bwd_wgmma), else on its one item, with no
  // loop around the walk (a loop's state costs the d 128 consumers registers they do not have).
  const auto for_each_item = [&](const auto& walk) {
    if constexpr (S::persistent) {
      for (int64_t index = blockIdx.x; index < items; index += gridDim.x) {
        const BwdWgItem w = bwd_wg_item<BK>(p, tiles, index);
        if (w.live) walk(w);
      }
    } else {
      walk(w0);
    }
  };

  if (tid == 0) {
    for (int st = 0; st < STAGES; ++st) {
      wg::mbar_init(full(st), 97);    // one cp.async arrival per loading producer thread, thread 0's for meta
      wg::mbar_init(empty(st), 256);  // one arrival per consumer thread
    }
    for (int kb = 0; kb < KVB; ++kb) {
      wg::mbar_init(kv_full(kb), 96);
      wg::mbar_init(kv_empty(kb), 256);
    }
  }
  __syncthreads();

  if (wg == 0) {
    // ================= producer warpgroup: warps 0-2 load, warp 3 adds dQ =================
    wg::setmaxnreg_dec<S::producer_regs>();
    if (tid < 96) {
      int it = 0, n = 0;  // ring entries and live items so far
      const auto produce = [&](const BwdWgItem& w) {
        const int kb = n % KVB;
        if (n >= KVB) wg::mbar_wait(kv_empty(kb), uint32_t((n / KVB) - 1) & 1);
        ++n;
        bwd_wg_load<BK, W, C, 96>(Ks(kb), static_cast<const T*>(p.k) + w.kvh * p.k_head, p.k_tok, w.e.k0 + w.k_lo,
                                  w.k_hi - w.k_lo, p.order, tid);
        bwd_wg_load<BK, W, C, 96>(Vs(kb), static_cast<const T*>(p.v) + w.kvh * p.v_head, p.v_tok, w.e.k0 + w.k_lo,
                                  w.k_hi - w.k_lo, p.order, tid);
        wg::mbar_arrive_cp_async(kv_full(kb));
        for (int64_t cur = next_pair(w, 0);; cur = next_pair(w, cur + 1), ++it) {
          const int st = it % STAGES;
          if (it >= STAGES) wg::mbar_wait(empty(st), uint32_t((it / STAGES) - 1) & 1);
          const bool live = cur < w.pairs;  // else the item's end (span may be 0 then)
          const int h = live ? w.kvh * p.group + int(cur / w.span) : -1;
          const int64_t qt = live ? w.qt_first + cur % w.span : 0, q_lo = qt * BQ;
          if (tid == 0) meta[st] = make_int2(h, int(qt));
          if (live) {
            const int64_t valid = w.e.lq - q_lo;
            bwd_wg_load<BQ, W, C, 96>(Qs + st * BQ * D, static_cast<const T*>(p.q) + h * p.q_head, p.q_tok,
                                      w.e.q0 + q_lo, valid, p.order, tid);
            bwd_wg_load<BQ, W, C, 96>(dOs + st * BQ * D, static_cast<const T*>(p.dout) + h * p.do_head, p.do_tok,
                                      w.e.q0 + q_lo, valid, p.order, tid);
            if (tid < BQ) {  // raw lse and D of the rows (zero past the sequence: the consumers mask them)
              const bool ok = tid < valid;
              const int64_t row = ok ? w.e.q0 + q_lo + tid : 0;
              const int64_t at = int64_t(h) * p.total_q + (ok && p.order != nullptr ? p.order[row] : row);
              cp_async4(smem_addr(lses + st * BQ + tid), p.lse + at, ok);
              cp_async4(smem_addr(Dls + st * BQ + tid), p.delta + at, ok);
            }
          }
          wg::mbar_arrive_cp_async(full(st));
          if (tid == 0) wg::mbar_arrive(full(st));  // releases meta[st]
          if (!live) {
            ++it;
            break;  // the item's end is out
          }
        }
      };
      for_each_item(produce);
      wg::cp_async_wait_all();
    } else {
      // The writer warp: per pair, the summed dQ tile into the f32 accumulator by one bulk add per
      // query row (rows gathered through the order); deterministic mode takes its turn first.
      const int lane = tid % 32;
      int np = 0;  // pairs so far (the consumers' count: dQ tile np % 2)
      const auto write = [&](const BwdWgItem& w) {
        for (int64_t cur = next_pair(w, 0); cur < w.pairs; cur = next_pair(w, cur + 1), ++np) {
          const int b = np % 2;
          const int h = w.kvh * p.group + int(cur / w.span);
          const int64_t qt = w.qt_first + cur % w.span;
          const int64_t q_lo = qt * BQ;
          wg::named_bar_sync(bwd_bar_dq_full(b), 160);
          int* const counter = bwd_counter(p, w.s, h, qt);
          if (counter != nullptr) {
            if (lane == 0) bwd_await_rank<BK>(p, counter, w.s, w.e, h, w.kt, qt);
            __syncwarp();
          }
#pragma unroll
          for (int r = lane; r < BQ; r += 32)
            if (q_lo + r < w.e.lq) {
              const int64_t row = w.e.q0 + q_lo + r;
              wg::bulk_reduce_add_f32(p.dq_acc + ((p.order != nullptr ? p.order[row] : row) * p.heads_q + h) * D,
                                      smem_addr(dQs + b * (BQ * QS) + r * QS), D * sizeof(float));
            }
          wg::bulk_commit();
          if (counter != nullptr) {
            wg::bulk_wait_all();  // added before the turn passes
            __threadfence();
            __syncwarp();
            if (lane == 0) atomicAdd(counter, 1);
          } else {
            wg::bulk_wait_read_all();
          }
          __syncwarp();
          // Tile b is free for the pair two places on. After the last two pairs nobody waits: the
          // barrier keeps those arrivals until the CTA exits.
          wg::named_bar_arrive(bwd_bar_dq_free(b), 160);
        }
      };
      for_each_item(write);
      wg::bulk_wait_all();
    }
    return;
  }

  // ================= consumer warpgroups =================
  wg::setmaxnreg_inc<S::consumer_regs>();
  const int c = wg - 1, warp = tid / 32, wwarp = warp % 4, lane = tid % 32;
  const int g = lane / 4, tq = lane % 4;
  const int key_row = 16 * wwarp + g;  // this thread's two key rows of the warpgroup's 64: key_row (+ 8)
  int it = 0, np = 0, n = 0;           // ring entries, pairs and live items so far (the producer's counts)
  const auto consume = [&](const BwdWgItem& w) {
    const SeqExtent& e = w.e;
    const int kb = n % KVB;
    wg::mbar_wait(kv_full(kb), uint32_t(n / KVB) & 1);
    ++n;
    float dk[NO], dv[NO];
#pragma unroll
    for (int i = 0; i < NO; ++i) dk[i] = dv[i] = 0.f;

    // This warpgroup's keys [kw_lo, kw_hi).
    const int64_t kw_lo = w.k_lo + 64 * c, kw_hi = kw_lo + 64 < w.k_hi ? kw_lo + 64 : w.k_hi;
    const bool key0 = p.sink_kind == kSinkKey0 && kw_lo == 0;  // this warpgroup holds key 0
    const uint32_t k_base = smem_addr(Ks(kb)) + uint32_t(c) * 64 * W, v_base = smem_addr(Vs(kb)) + uint32_t(c) * 64 * W;
    float ds0 = 0.f;  // key0 sink: Σ dS over the current head's rows for local key 0
    int ds0_head = -1;
    for (;; ++it) {
      const int st = it % STAGES, b = (S::persistent ? np : it) % 2;
      wg::mbar_wait(full(st), uint32_t(it / STAGES) & 1);
      const int2 pair = meta[st];
      if (pair.x < 0) {
        wg::mbar_arrive(empty(st));
        ++it;
        break;
      }
      const int h = pair.x;
      const int64_t qt = pair.y;
      const int64_t q_lo = qt * BQ;
      const int64_t q_hi = q_lo + BQ < e.lq ? q_lo + BQ : e.lq;
      const int nvalid = int(q_hi - q_lo);
      const uint32_t q_base = smem_addr(Qs + st * BQ * D), do_base = smem_addr(dOs + st * BQ * D);
      const float* lb = lses + st * BQ;
      const float* Db = Dls + st * BQ;
      // ---- Sᵀ = K_c·Qᵀ and dPᵀ = V_c·dOᵀ (64 keys × 64 queries each) ----
      float st_[NS], dpt[NS];
      // Descriptors built once per operand; a k-step moves the start by 32 bytes within a region row
      // or to the next region (attention_wgmma.cuh's layout).
      const wg::DescWords dk_words = wg::desc_words<W>(k_base, 16, kAtom8), dv_words = wg::desc_words<W>(v_base, 16, kAtom8);
      const wg::DescWords dq_words = wg::desc_words<W>(q_base, 16, kAtom8), do_words = wg::desc_words<W>(do_base, 16, kAtom8);
      wg::fence();
  #pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        // k-step ks: 32 bytes of each row, in region ks·32 / W at byte ks·32 % W of the row.
        const uint32_t in_row = (ks * 32) % W, region = ks * 32 / W;
        wg::Mma<E, 64>::ss(st_, wg::desc_at(dk_words, region * kRegionK + in_row),
                           wg::desc_at(dq_words, region * kRegionQ + in_row), ks > 0);
        wg::Mma<E, 64>::ss(dpt, wg::desc_at(dv_words, region * kRegionK + in_row),
                           wg::desc_at(do_words, region * kRegionQ + in_row), ks > 0);
      }
      wg::commit();
      wg::wait<0>();
      wg::pin(st_);
      wg::pin(dpt);

      // ---- Pᵀ and dSᵀ; element masks on the warpgroup's tiles the pattern cuts ----
      if (key0 && wwarp == 0 && ds0_head != h) {
        if (ds0_head >= 0 && lane == 0) p.sink_part[int64_t(ds0_head) * p.sink_parts + w.s] += ds0;
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
        for (int cc = 0; cc < 2; ++cc) {
          const int col = j * 8 + 2 * tq + cc;
          // Rows past the sequence (zero-filled) and rows with no mass (lse −inf) have p = 0.
          const float lse = lb[col];
          const float l2 = col >= nvalid || lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;
          const float dd = Db[col];
  #pragma unroll
          for (int r = 0; r < 2; ++r) {
            const float raw = st_[4 * j + 2 * r + cc] + (r == 0 && sink_row ? sink_raw : 0.f);
            const float pr = col < col_lo[r] || col >= col_hi[r] ? 0.f : ex2(fmaf(raw, p.scale_log2, -l2));
            st_[4 * j + 2 * r + cc] = pr;
            dpt[4 * j + 2 * r + cc] = pr * (dpt[4 * j + 2 * r + cc] - dd);
          }
        }
      // The key0 sink: Σ_i dS_i0 (key 0 is row 0 of warp 0 of consumer 0: lanes with g = 0, r = 0).
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
          pa[kk][x] = E::pack(st_[8 * kk + 2 * x], st_[8 * kk + 2 * x + 1]);
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

      // ---- dSᵀ to shared memory, keys on rows, swizzled (unscaled: dQ takes the scale at its adds) ----
      // Thread rows key_row and key_row + 8 of the warpgroup's 64; queries 16·kk + 2·tq (+ 8) are
      // 16-byte chunk 2·kk (+ 1) of the 128-byte row, XOR-ed with the row's place in its 8-row atom.
      {
        const int r_a = 64 * c + key_row, r_b = r_a + 8;
  #pragma unroll
        for (int kk = 0; kk < BQ / 16; ++kk)
  #pragma unroll
          for (int h8 = 0; h8 < 2; ++h8) {
            const int ch = 2 * kk + h8;
            *reinterpret_cast<uint32_t*>(dSs + r_a * BQ + ((ch ^ (r_a & 7)) * 8) + 2 * tq) = da[kk][2 * h8];
            *reinterpret_cast<uint32_t*>(dSs + r_b * BQ + ((ch ^ (r_b & 7)) * 8) + 2 * tq) = da[kk][2 * h8 + 1];
          }
      }
      wg::fence_proxy_async();   // the generic stores, before this warpgroup's wgmma reads them
      wg::named_bar_sync(bwd_bar_ds_ready(c), 128);

      // ---- dQ_c = dS·K over this warpgroup's 64 keys (wgmma, both operands MN-major) ----
      // dQ_c in parts of NQ columns (D 128: two parts of one 64-column region each, so that a part's
      // accumulators fit beside dK and dV). Consumer 0 stores its parts into dQ tile b (once the
      // writer has read the tile's last pair) and arrives on `combine`; consumer 1 waits there, adds
      // its own parts and the scale, and hands the tile to the writer warp. m64nNQ accumulator
      // layout: warp w of the warpgroup holds rows 16w + g (+ 8), columns 8j + 2tq (+ 1) in dq[4j + 2r + c].
      constexpr int DQP = D > 96 ? 2 : 1, NQ = D / DQP;
      static_assert(DQP == 1 || (NQ * 2) % W == 0, "a dQ part starts on a swizzle region");
      // A: dSᵀ rows 64c.., one 128-byte span of queries per row (sbo: 8 rows); a k-step is 16 keys.
      // B: the K tile from this warpgroup's first key, head-dim regions of W bytes (lbo) as dV's dO.
      const wg::DescWords a_words = wg::desc_words<128>(smem_addr(dSs) + uint32_t(c) * 64 * 128, 64 * 128, 1024);
      const wg::DescWords b_words = wg::desc_words<W>(k_base, kRegionK, kAtom8);
      const int q_row = 16 * wwarp + g;
      float* const tile_b = dQs + b * (BQ * QS);
  #pragma unroll 1
      for (int part = 0; part < DQP; ++part) {
        float dq[NQ / 2];
        const uint32_t b_part = uint32_t(part) * (NQ * 2 / W) * kRegionK;
        wg::fence();
  #pragma unroll
        for (int kk = 0; kk < 4; ++kk)
          wg::Mma<E, NQ>::ss_mn(dq, wg::desc_at(a_words, kk * 16 * 128), wg::desc_at(b_words, b_part + kk * 16 * W),
                                kk > 0);
        wg::commit();
        wg::wait<0>();  // with the rs products: done with this pair's Q, dO, pa and da
        wg::pin(dv);
        wg::pin(dk);
        wg::pin(dq);
        if (part == 0) wg::mbar_arrive(empty(st));  // the stage's Q, dO and statistics are read
        float* const tile = tile_b + part * NQ + 2 * tq;
        if (c == 0) {
          if (part == 0 && (S::persistent ? np : it) >= 2) wg::named_bar_sync(bwd_bar_dq_free(b), 160);
  #pragma unroll
          for (int j = 0; j < NQ / 8; ++j)
  #pragma unroll
            for (int r = 0; r < 2; ++r)
              *reinterpret_cast<float2*>(tile + (q_row + 8 * r) * QS + 8 * j) =
                  make_float2(dq[4 * j + 2 * r], dq[4 * j + 2 * r + 1]);
          if (part == DQP - 1) wg::named_bar_arrive(bwd_bar_combine(b), 256);
        } else {
          if (part == 0) wg::named_bar_sync(bwd_bar_combine(b), 256);
  #pragma unroll
          for (int j = 0; j < NQ / 8; ++j)
  #pragma unroll
            for (int r = 0; r < 2; ++r) {
              float2* at = reinterpret_cast<float2*>(tile + (q_row + 8 * r) * QS + 8 * j);
              const float2 o = *at;
              *at = make_float2((o.x + dq[4 * j + 2 * r]) * p.scale, (o.y + dq[4 * j + 2 * r + 1]) * p.scale);
            }
        }
      }
      if (c == 1) {
        wg::fence_proxy_async();  // the generic stores, before the writer's bulk adds read them
        wg::named_bar_arrive(bwd_bar_dq_full(b), 160);
      }
      ++np;
    }
    if (ds0_head >= 0 && lane == 0 && wwarp == 0 && key0) p.sink_part[int64_t(ds0_head) * p.sink_parts + w.s] += ds0;
    // Every product reading this item's K and V has completed (the last pair's dQ waited for its
    // own): the buffer may take the item after next (or the next one, with one buffer).
    wg::mbar_arrive(kv_empty(kb));

    // ---- epilogue: dK·scale and dV, this thread's two key rows ----
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t ik = kw_lo + key_row + 8 * r;
      if (ik >= e.lk) continue;
      const int64_t row = p.order != nullptr ? p.order[e.k0 + ik] : e.k0 + ik;
#pragma unroll
      for (int j = 0; j < D / 8; ++j) {
        const int cc = j * 8 + 2 * tq;
        const float k0 = dk[4 * j + 2 * r] * p.scale, k1 = dk[4 * j + 2 * r + 1] * p.scale;
        const float v0 = dv[4 * j + 2 * r], v1 = dv[4 * j + 2 * r + 1];
        if (p.dkv_f32) {
          *reinterpret_cast<float2*>(static_cast<float*>(p.dk) + row * p.dk_tok + w.kvh * p.dk_head + cc) =
              make_float2(k0, k1);
          *reinterpret_cast<float2*>(static_cast<float*>(p.dv) + row * p.dv_tok + w.kvh * p.dv_head + cc) =
              make_float2(v0, v1);
        } else {
          *reinterpret_cast<uint32_t*>(static_cast<T*>(p.dk) + row * p.dk_tok + w.kvh * p.dk_head + cc) =
              E::pack(k0, k1);
          *reinterpret_cast<uint32_t*>(static_cast<T*>(p.dv) + row * p.dv_tok + w.kvh * p.dv_head + cc) =
              E::pack(v0, v1);
        }
      }
    }
  };
  for_each_item(consume);
}

// Whether the main kernel's items cost alike, so that as many CTAs as the GPU holds may take them
// in turn (each CTA's next item then loads under its current one's end): rows with a left bound
// (windows: every key tile sees a band of the same width), no block mask. A window's item walks a
// handful of pairs, so its fill and drain weigh; a full or causal item walks all its rows, and one
// CTA per item lets the hardware hand the next (unequal) item to whichever SM frees first.
inline bool bwd_items_alike(const Pattern& pat) { return !pat.blocks.defined() && pat.window_left != kUnbounded; }

// The three launches on `stream` (prep and finish as the tile kernel's); instantiated per head
// dim in attention_bwd_wgmma_d<D>.cu.
template <int D, class E>
cudaError_t launch_bwd_wgmma(const BwdParams& p, cudaStream_t stream) {
  using S = BwdWgShape<D>;
  const auto kernel = attention_bwd_wgmma_kernel<D, E>;
  static const cudaError_t configured = allow_dynamic_smem({kernel}, S::smem_bytes);
  if (configured != cudaSuccess) return configured;
  static const int slots = resident_cta_slots(kernel, S::threads, S::smem_bytes);
  const int64_t tiles = bwd_key_tiles<S::BK>(p), items = tiles * (p.heads_q / p.group);
  // Persistent CTAs are all resident (at most `slots`), which the deterministic mode's turns need:
  // a CTA waits only on items of lower index, taken earlier by resident CTAs.
  const int64_t ctas = S::persistent && bwd_items_alike(p.pattern) && slots > 0 && items > slots ? slots : items;
  launch_bwd_prep<D, E>(p, stream);
  kernel<<<unsigned(ctas), S::threads, S::smem_bytes, stream>>>(p, tiles, items);
  launch_bwd_finish<D, E>(p, stream);
  return cudaGetLastError();
}

#define ARIADNE_BWD_WGMMA_KERNELS(X, D) X(launch_bwd_wgmma<D, Bf16>) X(launch_bwd_wgmma<D, F16>)
#define ARIADNE_INSTANTIATE_BWD_WGMMA(D) ARIADNE_BWD_WGMMA_KERNELS(ARIADNE_BWD_INSTANTIATE_ONE, D)
ARIADNE_BWD_WGMMA_KERNELS(ARIADNE_BWD_DECLARE_ONE, 64)
ARIADNE_BWD_WGMMA_KERNELS(ARIADNE_BWD_DECLARE_ONE, 80)
ARIADNE_BWD_WGMMA_KERNELS(ARIADNE_BWD_DECLARE_ONE, 128)

}  // namespace ariadne::cuda
