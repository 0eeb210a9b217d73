// The fast CPU backend's forward pass: work items over (sequence, head, query tile), the key tiles
// each query tile visits, the online softmax through the ISA's tile primitives, the diagnostics
// that ride on it, and the finalize that writes out, LSE, entropy and distance (runner.hpp).
#include <omp.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "attention/cpu/runner.hpp"

namespace ariadne::cpu {

namespace {
// Row bounds of a key tile that every row sees whole (the tables' softmax may read them even when
// RowMask::dense is set).
const std::array<int32_t, kWideQueryTile> kWholeLo{};
const std::array<int32_t, kWideQueryTile> kWholeHi = [] {
  std::array<int32_t, kWideQueryTile> a{};
  a.fill(kKeyTile);
  return a;
}();
}  // namespace

void key_tile_visits(const Pattern& pat, int32_t s, const SeqExtent& e, int h, int64_t q_lo, int64_t q_hi,
                     std::vector<TileVisit>& visits) {
  visits.clear();
  const KeyRange kr = pat.key_range(e, q_lo, q_hi);
  if (kr.empty()) return;
  if (!pat.blocks.defined()) {
    for (int64_t t = kr.lo / kKeyTile; t * kKeyTile < kr.hi; ++t) visits.push_back({t, ~0u});
    return;
  }
  const int64_t row = pat.block_row(s, e, h, q_lo / pat.blocks.block), B = pat.blocks.block;
  for (int32_t i = pat.blocks.row_ptr[row]; i < pat.blocks.row_ptr[row + 1]; ++i) {
    const int64_t kb = pat.blocks.col_idx[i];
    const int64_t a = std::max(kb * B, kr.lo), b = std::min((kb + 1) * B, kr.hi);
    for (int64_t t = a / kKeyTile; a < b && t * kKeyTile < b; ++t) {
      const int64_t j0 = std::max(a, t * kKeyTile) - t * kKeyTile, j1 = std::min(b, (t + 1) * kKeyTile) - t * kKeyTile;
      uint32_t bits = 0;
      for (int64_t j = j0; j < j1; ++j) bits |= 1u << j;
      if (!visits.empty() && visits.back().tile == t) visits.back().keymask |= bits;
      else visits.push_back({t, bits});
    }
  }
}

std::pair<int, int> clip_rows_to_tile(const int64_t* row_lo, const int64_t* row_hi, int rows, int64_t t, int32_t* lo,
                                      int32_t* hi, bool* dense) {
  const int64_t base = t * kKeyTile;
  int first = rows, last = 0;
  for (int r = 0; r < rows; ++r) {
    lo[r] = int32_t(std::clamp<int64_t>(row_lo[r] - base, 0, kKeyTile));
    hi[r] = int32_t(std::clamp<int64_t>(row_hi[r] - base, 0, kKeyTile));
    if (lo[r] < hi[r]) {
      first = std::min(first, r);
      last = r + 1;
    }
  }
  *dense = true;
  for (int r = first; r < last; ++r) *dense = *dense && lo[r] == 0 && hi[r] == kKeyTile;
  return {first, last};
}

void Runner::plan_visits(Scratch& sc, int32_t s, const SeqExtent& e, int h, int64_t q_lo, int64_t q_hi) const {
  key_tile_visits(pat_, s, e, h, q_lo, q_hi, sc.visits);
}

std::pair<int, int> Runner::clip_rows(Scratch& sc, int rows, int64_t t) const {
  return clip_rows_to_tile(sc.row_lo.data(), sc.row_hi.data(), rows, t, sc.lo.data(), sc.hi.data(), &sc.dense);
}

void Runner::forward() {
  std::vector<WorkItem> items;
  for (int32_t s = 0; s < pat_.num_seqs; ++s) {
    const SeqExtent& e = seqs_[size_t(s)];
    if (!stream_) {
      for (int h = 0; h < hq_; ++h)
        for_query_tiles(e, [&](int64_t lo, int64_t hi) { items.push_back({s, h, lo, hi}); });
      continue;
    }
    std::vector<int64_t> starts;  // first row of every kStreamRun-th query tile, then lq
    int count = 0;
    for_query_tiles(e, [&](int64_t lo, int64_t) {
      if (count++ % kStreamRun == 0) starts.push_back(lo);
    });
    starts.push_back(e.lq);
    for (int g = 0; g < hq_ / group_; g += kv_block_)
      for (size_t i = 0; i + 1 < starts.size(); ++i) items.push_back({s, g, starts[i], starts[i + 1]});
  }
#pragma omp parallel num_threads(threads_)
  {
    Scratch sc = make_scratch();
    const Bf16Session tiles(k_, bf16_, dp_);  // only this runner uses the tile unit inside the region
#pragma omp for schedule(dynamic, 1)
    for (size_t i = 0; i < items.size(); ++i) {
      const WorkItem& it = items[i];
      if (!stream_) {
        forward_tile(sc, it.seq, it.head, it.lo, it.hi);
        continue;
      }
      std::fill(sc.ring_tag.begin(), sc.ring_tag.end(), -1);  // the ring holds other heads' tiles
      const SeqExtent& e = seqs_[size_t(it.seq)];
      const int g_end = std::min(it.head + kv_block_, hq_ / group_);
      for (int64_t lo = it.lo; lo < it.hi;) {
        const int64_t hi = query_tile_end(e, lo);
        for (int g = it.head; g < g_end; ++g) {
          plan_prefetch(sc, e, g, lo, hi, hi, hi < it.hi ? query_tile_end(e, hi) : hi);
          for (int h = g * group_; h < (g + 1) * group_; ++h) forward_tile(sc, it.seq, h, lo, hi);
        }
        lo = hi;
      }
    }
#if defined(__SSE2__)
    _mm_sfence();  // order this thread's streaming stores before the region ends
#endif
  }
}

// Query rows [q_lo, q_hi) of sequence s, head h: one query tile.
void Runner::forward_tile(Scratch& sc, int32_t s, int h, int64_t q_lo, int64_t q_hi) const {
  const int g = h / group_;
  const SeqExtent& e = seqs_[size_t(s)];
  const int rows = int(q_hi - q_lo);
  load_q(sc, e, h, q_lo, rows);
  // [all_lo, all_hi): the keys every row of the tile sees (empty when the rows share none).
  int64_t all_lo = 0, all_hi = std::numeric_limits<int64_t>::max();
  for (int r = 0; r < rows; ++r) {
    const KeyRange kr = pat_.key_range(e, q_lo + r, q_lo + r + 1);
    sc.row_lo[r] = kr.lo;
    sc.row_hi[r] = kr.empty() ? kr.lo : kr.hi;
    all_lo = std::max(all_lo, sc.row_lo[r]);
    all_hi = std::min(all_hi, sc.row_hi[r]);
    sc.m[r] = kNegInf;
    sc.l[r] = 0.f;
    sc.ent[r] = sc.dist[r] = 0.0;
  }
  std::fill(sc.o.begin(), sc.o.begin() + int64_t(rows) * dv_, 0.f);
  plan_visits(sc, s, e, h, q_lo, q_hi);

  RowMask mk;
  mk.scale2 = scale2_;
  mk.bias2 = p_.sink_mode == SinkMode::key0_bias ? float(double(sink(h)) * kLog2e) : 0.f;
  mk.moving_max = stream_;
  mk.bf16_p = bf16_ && !diag_;  // p is only rounded to bf16 for P·V and summed into l
  if (group_pv_) {
    forward_groups(sc, g, s, rows, mk);
    finalize(sc, e, h, q_lo, rows);
    return;
  }
  // batch_pv_: a visit that every row sees whole (the interior of full, causal and wide patterns)
  // waits, and a batch of up to kPvBatch of them is done at once. On a table with dense_bf16 (AMX) a
  // batch is one softmax step per 16-row group over all its keys, P·V included; elsewhere each visit
  // runs Q·Kᵀ and the softmax at once but waits with P·V, and the batch is added in one
  // pv_bf16_batch call, so O is loaded into the accumulators and stored once per batch (each pending
  // P scaled by the α of the tiles after it, O by the product of them all).
  int pending = 0;
  const float* batch_p[kPvBatch];
  const uint16_t* batch_k[kPvBatch];
  const uint16_t* batch_v[kPvBatch];
  const float* batch_a[kPvBatch];
  auto flush = [&] {
    if (pending == 0) return;
    if (fused_) flush_dense(sc, batch_k, batch_v, pending, rows, mk);
    else k_.pv_bf16_batch(batch_p, batch_v, batch_a, pending, dv_, rows, sc.o.data());
    pending = 0;
  };
  for (size_t vi = 0; vi < sc.visits.size(); ++vi) {
    const TileVisit& v = sc.visits[vi];
    // Block-sparse visits jump between key tiles, which the hardware prefetcher cannot follow
    // (in stream mode the next tile is packed only when it is reached).
    if (pat_.blocks.defined() && !stream_ && vi + 1 < sc.visits.size())
      prefetch_tile(tile(sc, g, s, sc.visits[vi + 1].tile));
    // A whole tile inside the keys every row sees joins the fused batch without clipping the rows
    // (flush_dense reads no per-row bounds).
    const bool whole = v.keymask == ~0u && v.tile * kKeyTile >= all_lo && (v.tile + 1) * kKeyTile <= all_hi;
    if (fused_ && whole && !(p_.sink_mode == SinkMode::key0_bias && v.tile == 0)) {
      const Tile tl = tile(sc, g, s, v.tile);
      batch_k[pending] = static_cast<const uint16_t*>(tl.k);
      batch_v[pending] = static_cast<const uint16_t*>(tl.v);
      if (++pending == kPvBatch) flush();
      continue;
    }
    // A tile that every row sees whole needs no clipping (every tile of full attention).
    const auto [r0, r1] = whole ? std::pair<int, int>(0, rows) : clip_rows(sc, rows, v.tile);
    if (r0 >= r1) continue;
    if (whole) sc.dense = true;
    const int32_t* lo = whole ? kWholeLo.data() : sc.lo.data();
    const int32_t* hi = whole ? kWholeHi.data() : sc.hi.data();
    const Tile tl = tile(sc, g, s, v.tile);
    mk.keymask = v.keymask;
    mk.dense = sc.dense && v.keymask == ~0u;
    mk.apply_bias = p_.sink_mode == SinkMode::key0_bias && v.tile == 0;
    if (batch_pv_ && !fused_ && mk.dense && r0 == 0 && r1 == rows) {
      float* P = sc.batch_p.data() + size_t(pending) * size_t(qtile_) * kKeyTile;
      k_.qk_bf16(sc.q_b16, sc.ldq, static_cast<const uint16_t*>(tl.k), dp_, rows, P);
      mk.lo = lo;
      mk.hi = hi;
      float* A = sc.batch_alpha.data() + size_t(pending) * size_t(qtile_);
      k_.softmax(P, mk, rows, sc.m.data(), sc.l.data(), A, nullptr);
      batch_p[pending] = P;
      batch_v[pending] = static_cast<const uint16_t*>(tl.v);
      batch_a[pending] = A;
      if (++pending == kPvBatch) flush();
      continue;
    }
    flush();  // O must hold every earlier tile before a tile of its own updates it
    for (int c0 = r0; c0 < r1; c0 += chunk_rows_) {
      const int c1 = std::min(r1, c0 + chunk_rows_), n = c1 - c0;
      if (stream_) prefetch_some(sc);
      qk(sc, tl.k, c0, n);
      mk.lo = lo + c0;
      mk.hi = hi + c0;
      if (diag_) {
        std::copy(sc.m.begin() + c0, sc.m.begin() + c1, sc.m_old.begin() + c0);
        std::copy(sc.l.begin() + c0, sc.l.begin() + c1, sc.l_old.begin() + c0);
      }
      float* S = sc.s.data() + c0 * kKeyTile;
      k_.softmax(S, mk, n, sc.m.data() + c0, sc.l.data() + c0, sc.alpha.data() + c0,
                 diag_ ? sc.t.data() + c0 * kKeyTile : nullptr);
      if (diag_) accumulate_diagnostics(sc, e, q_lo, v.tile, c0, c1);
      float* O = sc.o.data() + int64_t(c0) * dv_;
      if (bf16_)
        k_.pv_bf16(S, static_cast<const uint16_t*>(tl.v), dv_, n, sc.alpha.data() + c0, O);
      else
        k_.pv_f32(S, static_cast<const float*>(tl.v), tl.ldv, dv_, n, sc.alpha.data() + c0, O);
    }
  }
  flush();
  finalize(sc, e, h, q_lo, rows);
}

// The pending whole key tiles of forward_tile on a table with dense_bf16: one fused step for the
// query tile's 16-row groups; a group the kernel sends back (a short group, a NaN or infinite dot,
// a poisoned row) runs the tiles one at a time through the per-tile kernels, which poison or mask
// as they always do.
void Runner::flush_dense(Scratch& sc, const uint16_t* const* k, const uint16_t* const* v, int count, int rows,
                         RowMask mk) const {
  unsigned undone = k_.dense_bf16(sc.q_b16, sc.ldq, k, v, count, dp_, dv_, scale2_, rows, sc.m.data(), sc.l.data(),
                                  sc.o.data());
  mk.dense = true;
  mk.apply_bias = false;
  mk.keymask = ~0u;
  mk.lo = kWholeLo.data();
  mk.hi = kWholeHi.data();
  for (int g0 = 0; undone != 0; g0 += kRowGroup, undone >>= 1) {
    if ((undone & 1u) == 0) continue;
    const int n = std::min(kRowGroup, rows - g0);
    float* m = sc.m.data() + g0;
    float* l = sc.l.data() + g0;
    float* o = sc.o.data() + int64_t(g0) * dv_;
    const uint16_t* q = sc.q_b16 + g0 * sc.ldq;
    for (int j = 0; j < count; ++j) {
      k_.qk_bf16(q, sc.ldq, k[j], dp_, n, sc.s.data());
      k_.softmax(sc.s.data(), mk, n, m, l, sc.alpha.data(), nullptr);
      k_.pv_bf16(sc.s.data(), v[j], dv_, n, sc.alpha.data(), o);
    }
  }
}

// Stream mode with a batched P·V (group_pv_): the query tile runs in groups of kRowGroup rows, each
// over every key tile it sees before the next group starts. A group's P of up to kPvBatch tiles waits
// and is added in one pv_bf16_batch call, so the group's O goes through the tile unit once per batch
// instead of once per key tile, where in a narrow band (whose row maxima move on most tiles) it was
// also rescaled per tile. A group is computed whole on each tile it meets (the tile unit and
// softmax16 take 16 rows): its rows that do not reach the tile see only masked keys (p = 0, α = 1).
// The visited tiles all lie in the query tile's span, so none of the pending ones leaves the ring.
void Runner::forward_groups(Scratch& sc, int g, int32_t s, int rows, RowMask mk) const {
  for (int g0 = 0; g0 < rows; g0 += kRowGroup) {
    const int n = std::min(kRowGroup, rows - g0);
    if (n == kRowGroup && band_) {
      forward_band(sc, g, s, g0, mk);
      continue;
    }
    forward_group_tiles(sc, g, s, g0, n, 0, sc.visits.size(), mk);
  }
}

// One whole 16-row group through band_bf16, its visits in runs of up to kPvBatch tiles: a tile that
// every row of the group sees whole goes without bounds (no clipping), a tile no row sees is left
// out, and a run the kernel leaves unchanged (a poisoned row, a NaN or infinite dot) runs tile by
// tile. Block masks and the key-0 bias take forward_group_tiles (band_ is off for them).
void Runner::forward_band(Scratch& sc, int g, int32_t s, int g0, RowMask mk) const {
  int64_t all_lo = 0, all_hi = std::numeric_limits<int64_t>::max();  // keys every row of the group sees
  for (int r = g0; r < g0 + kRowGroup; ++r) {
    all_lo = std::max(all_lo, sc.row_lo[r]);
    all_hi = std::min(all_hi, sc.row_hi[r]);
  }
  alignas(64) int32_t lo[kPvBatch][kRowGroup], hi[kPvBatch][kRowGroup];
  const uint16_t* kt[kPvBatch];
  const uint16_t* vt[kPvBatch];
  const int32_t* lo_of[kPvBatch];
  const int32_t* hi_of[kPvBatch];
  for (size_t v0 = 0; v0 < sc.visits.size(); v0 += kPvBatch) {
    const size_t v1 = std::min(sc.visits.size(), v0 + kPvBatch);
    int count = 0;
    for (size_t vi = v0; vi < v1; ++vi) {
      const int64_t t = sc.visits[vi].tile;
      prefetch_some(sc);
      if (t * kKeyTile >= all_lo && (t + 1) * kKeyTile <= all_hi) {
        lo_of[count] = hi_of[count] = nullptr;
      } else {
        bool dense = false;
        const auto [r0, r1] = clip_rows_to_tile(sc.row_lo.data() + g0, sc.row_hi.data() + g0, kRowGroup, t,
                                                lo[count], hi[count], &dense);
        if (r0 >= r1) continue;
        lo_of[count] = lo[count];
        hi_of[count] = hi[count];
      }
      const Tile tl = tile(sc, g, s, t);
      kt[count] = static_cast<const uint16_t*>(tl.k);
      vt[count] = static_cast<const uint16_t*>(tl.v);
      ++count;
    }
    if (count == 0) continue;
    const int64_t og = int64_t(g0) * dv_;
    if (!k_.band_bf16(sc.q_b16 + g0 * sc.ldq, sc.ldq, kt, vt, lo_of, hi_of, count, dp_, dv_, scale2_, sc.m.data() + g0,
                      sc.l.data() + g0, sc.o.data() + og))
      forward_group_tiles(sc, g, s, g0, kRowGroup, v0, v1, mk);
  }
}

// Visits [v0, v1) of the 16-row group at g0 (n rows) tile by tile: Q·Kᵀ, the softmax step, P·V
// batched per kPvBatch tiles.
void Runner::forward_group_tiles(Scratch& sc, int g, int32_t s, int g0, int n, size_t v0, size_t v1,
                                 RowMask mk) const {
  const float* batch_p[kPvBatch];
  const uint16_t* batch_v[kPvBatch];
  const float* batch_a[kPvBatch];
  int pending = 0;
  auto flush = [&] {
    if (pending > 0) k_.pv_bf16_batch(batch_p, batch_v, batch_a, pending, dv_, n, sc.o.data() + int64_t(g0) * dv_);
    pending = 0;
  };
  for (size_t vi = v0; vi < v1; ++vi) {
    const TileVisit& v = sc.visits[vi];
    bool dense = false;
    const auto [r0, r1] = clip_rows_to_tile(sc.row_lo.data() + g0, sc.row_hi.data() + g0, n, v.tile,
                                            sc.lo.data() + g0, sc.hi.data() + g0, &dense);
    if (r0 >= r1) continue;
    prefetch_some(sc);
    const Tile tl = tile(sc, g, s, v.tile);
    mk.keymask = v.keymask;
    mk.dense = dense && r0 == 0 && r1 == n && v.keymask == ~0u;
    mk.apply_bias = p_.sink_mode == SinkMode::key0_bias && v.tile == 0;
    mk.lo = sc.lo.data() + g0;
    mk.hi = sc.hi.data() + g0;
    float* P = sc.batch_p.data() + (size_t(pending) * size_t(qtile_) + size_t(g0)) * kKeyTile;
    float* A = sc.batch_alpha.data() + size_t(pending) * size_t(qtile_) + size_t(g0);
    k_.qk_bf16(sc.q_b16 + g0 * sc.ldq, sc.ldq, static_cast<const uint16_t*>(tl.k), dp_, n, P);
    prefetch_some(sc);
    k_.softmax(P, mk, n, sc.m.data() + g0, sc.l.data() + g0, A, nullptr);
    batch_p[pending] = P;
    batch_v[pending] = static_cast<const uint16_t*>(tl.v);
    batch_a[pending] = A;
    if (++pending == kPvBatch) flush();
  }
  flush();
}

// Entropy and distance ride on the online softmax: A = Σ_j p_j (t_j − m) and D = Σ_j p_j ‖c_i − c_j‖
// are rescaled with the same α as l; at the end H = ln l − ln2·A/l and distance = D/l. Keeping t − m
// (not t) avoids cancellation when logits are large.
void Runner::accumulate_diagnostics(Scratch& sc, const SeqExtent& e, int64_t q_lo, int64_t tile, int r0, int r1) const {
  const bool want_dist = p_.distance.defined();
  for (int r = r0; r < r1; ++r) {
    if (sc.m[r] == kNegInf) continue;
    const double a = sc.alpha[r], m_new = sc.m[r];
    const float* p = sc.s.data() + r * kKeyTile;
    const float* t = sc.t.data() + r * kKeyTile;
    double acc = 0, dist = 0;
    for (int j = 0; j < kKeyTile; ++j) {
      if (p[j] == 0.f) continue;
      acc += double(p[j]) * (double(t[j]) - m_new);
      if (want_dist) {
        const int64_t qi = e.q0 + q_lo + r, kj = e.k0 + tile * kKeyTile + j;
        const double dr = double(cq_[size_t(2 * qi)]) - ck_[size_t(2 * kj)];
        const double dc = double(cq_[size_t(2 * qi + 1)]) - ck_[size_t(2 * kj + 1)];
        dist += double(p[j]) * std::sqrt(dr * dr + dc * dc);
      }
    }
    const double shift = sc.l_old[r] > 0.f ? (double(sc.m_old[r]) - m_new) * sc.l_old[r] : 0.0;
    sc.ent[r] = a * (sc.ent[r] + shift) + acc;
    sc.dist[r] = a * sc.dist[r] + dist;
  }
}

void Runner::finalize(Scratch& sc, const SeqExtent& e, int h, int64_t q_lo, int rows) const {
  const bool denom = p_.sink_mode == SinkMode::denominator;
  const double sink2 = denom ? double(sink(h)) * kLog2e : 0.0;
  float* lse_out = static_cast<float*>(p_.lse.data);
  float* ent_out = static_cast<float*>(p_.entropy.data);
  float* dist_out = static_cast<float*>(p_.distance.data);
  const bool want_lse = lse_out != nullptr || !lse2_.empty();
  for (int r = 0; r < rows; ++r) {
    const int64_t row = e.q0 + q_lo + r;
    const int64_t out_off = row_offset(p_.out, row, h);
    const double l = sc.l[r], m = sc.m[r];
    double lse2;  // base-2 log of the normalizer, sink included
    float lse;
    if (std::isnan(l)) {  // a NaN or +inf logit poisoned the row (softmax kernels): out and LSE NaN
      lse2 = l;
      store_row(p_.out, out_off, d_, sc.o.data() + int64_t(r) * dv_, float(l), k_);
      lse = float(l);
    } else if (l > 0 && !denom) {  // Z = l·2^m: out = O / l; the logarithm only when it is output
      store_row(p_.out, out_off, d_, sc.o.data() + int64_t(r) * dv_, float(1.0 / l), k_);
      lse2 = want_lse ? m + std::log2(l) : 0.0;
      lse = float(lse2 * kLn2);
    } else if (l > 0) {
      lse2 = m + std::log2(l);
      if (std::isinf(sink2)) {
        if (sink2 > 0) lse2 = sink2;  // +inf takes all the mass: out 0, lse +inf
      } else {
        const double hi = std::max(lse2, sink2);
        lse2 = hi + std::log2(std::exp2(lse2 - hi) + std::exp2(sink2 - hi));
      }
      const float inv = float(std::exp2(m - lse2));  // out = O·2^m / Z
      store_row(p_.out, out_off, d_, sc.o.data() + int64_t(r) * dv_, inv, k_);
      lse = float(lse2 * kLn2);
    } else {  // no allowed key: out 0; LSE is the sink alone or −inf
      store_row(p_.out, out_off, d_, sc.o.data() + int64_t(r) * dv_, 0.f, k_);
      lse2 = denom ? sink2 : -std::numeric_limits<double>::infinity();
      lse = denom ? sink(h) : kNegInf;
    }
    const int64_t si = int64_t(h) * total_q_ + row;
    if (lse_out) lse_out[si] = lse;
    // NaN rows keep NaN in every output (l > 0 is false for NaN; `live` is not).
    const bool live = l > 0 || std::isnan(l);
    if (!lse2_.empty()) lse2_[size_t(si)] = live ? float(lse2) : kNegInf;
    if (ent_out) ent_out[si] = live ? float(std::log(l) - kLn2 * sc.ent[r] / l) : 0.f;
    if (dist_out) dist_out[si] = live ? float(sc.dist[r] / l) : 0.f;
  }
}

}  // namespace ariadne::cpu
