// The fast CPU backend: tiled online-softmax attention (flash style) over every pattern.
//
// Work is split into items (sequence, query head, query tile of up to 64 rows); OpenMP threads take
// items dynamically, and each item is computed start to end by one thread in a fixed order, so the
// result is bit-identical for any thread count. Per item:
//   1. the query tile is read in place (fp32), converted to fp32 (f16, or bf16 without a bf16 dot
//      product), or copied as bf16 pairs for vdpbf16ps;
//   2. each row's allowed key interval comes from Pattern::key_range (window and chunk make it one
//      interval), and the key tiles to visit are those the tile's key range covers, intersected
//      with the CSR row of its query block when the pattern is block-sparse;
//   3. per key tile only the rows whose interval reaches the tile are computed, so a ±64 window
//      pays for about 161 keys per query (129 allowed) instead of 192 for a 64-row tile;
//   4. S = Q·Kᵀ, online softmax (base 2, scale folded into the exponent), O = α·O + P·V through
//      the ISA's tile primitives (attention_kernels.hpp);
//   5. finalize: the denominator sink joins the normalizer, out = O / Z, LSE, entropy, distance.
// K and V are packed into key tiles (transposed / pair-interleaved, see the kernels header): once
// per call for wide patterns, shared by every query tile and, with GQA, by every query head of a
// group; for narrow bands (stream mode) per work item into a small per-thread ring, with the next
// query tile's rows prefetched (docs/cpu-backend.md).
// Received attention is a second, transposed pass: items (sequence, head, key tile) recompute the
// scores of every query tile that sees the key tile and add 2^(t − lse) column-wise in query-tile
// order, again one thread per item (no atomics, no N×N).
//
// The code is split by concern (runner.hpp lists the files); this file holds the entry points and
// the call's setup.
#include <algorithm>
#include <string>
#include <vector>

#include "attention/backends.hpp"
#include "attention/cpu/runner.hpp"

namespace ariadne {
namespace cpu {

Runner::Runner(const AttentionParams& p)
    : p_(p), pat_(p.pattern), k_(active_tile_kernels()) {
  total_q_ = p.q.shape[0];
  total_k_ = p.k.shape[0];
  hq_ = p.heads_q();
  group_ = hq_ / p.heads_kv();
  d_ = p.head_dim();
  dp_ = (d_ + 1) / 2;
  dv_ = (d_ + 15) / 16 * 16;
  bf16_ = p.q.dtype == DType::bf16 && k_.qk_bf16 != nullptr && k_.pv_bf16 != nullptr;
  // V is read in place only for narrow patterns: there each V tile serves a few query tiles, so
  // copying it costs more memory traffic than it saves; wide patterns reuse the tile many times
  // and gain from a contiguous copy (input rows sit heads·d apart and collide in L1 sets).
  const Pattern& pt = p.pattern;
  const bool narrow = (pt.window_left != kUnbounded && pt.window_right != kUnbounded &&
                       pt.window_left + pt.window_right <= 1024) ||
                      (pt.chunk > 0 && pt.chunk <= 1024);
  direct_v_ = !bf16_ && p.v.dtype == DType::f32 && d_ % 16 == 0 && narrow;
  // Narrow patterns also pack K and V just in time into a small per-thread ring of key tiles
  // (stream mode, see forward) instead of once per call: a tile then serves only the few query
  // tiles next to it, and the call-wide packed copy, written out and read back, was 15-20 % of a
  // bf16 ±64-window call. The received pass reads the call-wide copy, so it keeps it.
  stream_ = narrow && !p.received.defined();
  diag_ = p.entropy.defined() || p.distance.defined();
  // Stream mode on a table with a batched bf16 P·V (AMX) and without the diagnostics (which read
  // each tile's P and α as the tile is done) walks the query tile in 16-row groups, each over all
  // its key tiles with P·V batched per group (forward_groups): the tile unit's row count, and O
  // through the tiles once per group instead of once (and rescaled once) per key tile.
  group_pv_ = stream_ && bf16_ && !diag_ && k_.pv_bf16_batch != nullptr;
  // Such a group on a table with band_bf16 (AMX) takes one softmax step per run of its tiles, as
  // dense_bf16 does for full attention, with the rows' key bounds on the tiles that cut them; block
  // masks (per-key bits) and the key-0 bias keep the per-tile kernels.
  band_ = group_pv_ && k_.band_bf16 != nullptr && k_.dense_bf16_takes(dp_, dv_) && !pt.blocks.defined() &&
          p.sink_mode != SinkMode::key0_bias;
  // Other bf16 tiles in stream mode are computed 8 rows at a time (Q·Kᵀ, softmax, P·V), with a few
  // prefetches between those steps: measured 4-7 % faster than whole-tile steps with one prefetch
  // burst per tile at d 80 and 128 on the AVX-512 products; fp32 measured 2 % slower that way.
  // AMX takes 16 rows (a short group is padded through local buffers).
  chunk_rows_ = !stream_ || !bf16_ ? kQueryTile : k_.pv_bf16_batch != nullptr ? kRowGroup : 8;
  scale2_ = float(double(p.resolved_scale()) * kLog2e);
  threads_ = cpu_threads();
  // The diagnostics read each tile's P and α as the tile is done, so they keep P·V per tile.
  batch_pv_ = bf16_ && !stream_ && !diag_ && k_.pv_bf16_batch != nullptr;
  fused_ = batch_pv_ && k_.dense_bf16 != nullptr && k_.dense_bf16_takes(dp_, dv_);
  for (int32_t s = 0; s < pat_.num_seqs; ++s) {
    seqs_.push_back(pat_.seq(s, total_q_, total_k_));
    tile_base_.push_back(total_tiles_);
    total_tiles_ += (seqs_.back().lk + kKeyTile - 1) / kKeyTile;
  }
  ktile_ = bf16_ ? int64_t(dp_) * 2 * kKeyTile : int64_t(d_) * kKeyTile;
  vtile_ = int64_t(kKeyTile) * dv_;
  // Wide patterns whose packed K and V of one head and sequence exceed 1 MiB (about half of a
  // server core's L2) take 128-row query tiles: each key tile, streamed from L3 once per query
  // tile, then serves twice the rows. Measured at 16 heads, one thread, N 4096: fp32 (2.5-4 MiB
  // per head) 2-5 % faster, bf16 on AMX (1.3-2 MiB) 3 %; fp32 at N 1024 (0.6-1 MiB) 2 % slower, so
  // smaller sequences keep 64 rows.
  int64_t longest = 0;
  for (const SeqExtent& e : seqs_) longest = std::max(longest, e.lk);
  const int64_t head_bytes = (longest + kKeyTile - 1) / kKeyTile * (ktile_ + vtile_) * (bf16_ ? 2 : 4);
  if (!narrow && !p.received.defined() && head_bytes > (int64_t(1) << 20)) {
    qtile_ = kWideQueryTile;
    chunk_rows_ = qtile_;
  }
  if (stream_) {
    // Ring slots: the most key tiles one query tile spans, plus the two that the next query
    // tile adds, so a band's tiles stay in the ring while consecutive query tiles need them.
    int64_t span = 0;
    for (const SeqExtent& e : seqs_)
      for_query_tiles(e, [&](int64_t lo, int64_t hi) {
        const KeyRange kr = pat_.key_range(e, lo, hi);
        if (!kr.empty()) span = std::max(span, (kr.hi - 1) / kKeyTile - kr.lo / kKeyTile + 1);
      });
    ring_ = int(span) + 2;
    kv_block_ = stream_kv_block(p.k, p.v, p.heads_kv());
  }
  if (p.distance.defined()) load_coords();
}

int stream_kv_block(const TensorView& k, const TensorView& v, int heads_kv) {
  // A block's rows are one run of b·row bytes only where the heads sit side by side.
  const bool side_by_side = k.stride[1] == k.shape[2] && v.stride[1] == v.shape[2];
  const int64_t krow = k.shape[2] * dtype_size(k.dtype), vrow = v.shape[2] * dtype_size(v.dtype);
  for (int b = 1; b <= (side_by_side ? std::min(4, heads_kv) : 1); ++b)
    if ((b * krow) % 64 == 0 && (b * vrow) % 64 == 0) return b;
  return 1;
}

void Runner::run() {
  pack_kv();
  if (p_.received.defined()) lse2_.assign(size_t(hq_ * total_q_), kNegInf);
  forward();
  if (p_.received.defined()) received();
}

Runner::Scratch Runner::make_scratch() const {
  Scratch sc;
  const size_t R = size_t(qtile_);
  if (bf16_) sc.qb.resize(R * size_t(2 * dp_));
  else sc.qf.resize(R * size_t(d_));
  sc.s.resize(R * kKeyTile);
  if (batch_pv_ || group_pv_) {
    sc.batch_p.resize(size_t(kPvBatch) * R * kKeyTile);
    sc.batch_alpha.resize(size_t(kPvBatch) * R);
  }
  sc.t.resize(R * kKeyTile);
  sc.o.resize(R * size_t(dv_));
  for (auto* v : {&sc.m, &sc.l, &sc.alpha, &sc.m_old, &sc.l_old}) v->resize(R);
  sc.colsum.resize(kKeyTile);
  sc.row_lo.resize(R);
  sc.row_hi.resize(R);
  sc.lo.resize(R);
  sc.hi.resize(R);
  sc.ent.resize(R);
  sc.dist.resize(R);
  if (stream_) {
    const size_t n = size_t(ring_) * size_t(kv_block_);
    if (bf16_) {
      sc.ring_kb.resize(n * size_t(ktile_ / 2));
      sc.ring_vb.resize(n * size_t(vtile_ / 2));
    } else {
      sc.ring_kf.resize(n * size_t(ktile_));
      sc.ring_vf.resize(n * size_t(vtile_));
    }
    sc.ring_tag.assign(n, -1);
  }
  return sc;
}

void Runner::load_coords() {
  auto read = [](const TensorView& t, int64_t n, std::vector<float>& out) {
    const float* base = static_cast<const float*>(t.data);
    out.resize(size_t(2 * n));
    for (int64_t i = 0; i < n; ++i) {
      out[size_t(2 * i)] = base[i * t.stride[0]];
      out[size_t(2 * i + 1)] = base[i * t.stride[0] + t.stride[1]];
    }
  };
  read(p_.coords_q, total_q_, cq_);
  read(p_.coords_k, total_k_, ck_);
}

}  // namespace cpu

bool attention_cpu_supports(const AttentionParams& p, std::string* why) {
  if (p.q.device != Device::cpu) {
    if (why) *why = "the cpu backend needs host tensors";
    return false;
  }
  if (p.q.dtype == DType::f64) {
    if (why) *why = "the cpu backend takes f32, bf16 and f16 (f64 runs on the reference backend)";
    return false;
  }
  return true;
}

void attention_cpu(const AttentionParams& p) {
  ARIADNE_CHECK(p.q.device == Device::cpu, "attention_cpu: q is on ", p.q.device == Device::cuda ? "cuda" : "?",
                ", expected host memory");
  cpu::Runner(p).run();
}

}  // namespace ariadne
