// Received attention on the fast CPU backend, a second, transposed pass after the forward: items
// (sequence, head, key tile) recompute the scores of every query tile that sees the key tile and
// add 2^(t − lse) column-wise in query-tile order, one thread per item (no atomics, no N×N).
#include <omp.h>

#include <algorithm>
#include <vector>

#include "attention/cpu/runner.hpp"

namespace ariadne::cpu {

// Key-block bits of key tile t for one CSR row (block-sparse patterns).
uint32_t tile_block_bits(const Pattern& pat, int64_t row, int64_t t, int64_t lk) {
  const int64_t B = pat.blocks.block, k_lo = t * kKeyTile, k_hi = std::min(k_lo + kKeyTile, lk);
  uint32_t bits = 0;
  for (int64_t kb = k_lo / B; kb * B < k_hi; ++kb) {
    if (!pat.block_listed(row, kb)) continue;
    const int64_t a = std::max(kb * B, k_lo) - k_lo, b = std::min((kb + 1) * B, k_hi) - k_lo;
    for (int64_t j = a; j < b; ++j) bits |= 1u << j;
  }
  return bits;
}

void Runner::received() {
  std::vector<WorkItem> items;
  for (int32_t s = 0; s < pat_.num_seqs; ++s) {
    const int64_t nt = (seqs_[size_t(s)].lk + kKeyTile - 1) / kKeyTile;
    for (int h = 0; h < hq_; ++h)
      for (int64_t t = 0; t < nt; ++t) items.push_back({s, h, t, t + 1});
  }
  float* recv = static_cast<float*>(p_.received.data);
  // Keys of sequences without key tiles do not exist; every other key is written by its item.
#pragma omp parallel num_threads(threads_)
  {
    Scratch sc = make_scratch();
    const Bf16Session tiles(k_, bf16_, dp_);  // only this runner uses the tile unit inside the region
#pragma omp for schedule(dynamic, 1)
    for (size_t i = 0; i < items.size(); ++i) received_item(sc, items[i], recv);
  }
}

void Runner::received_item(Scratch& sc, const WorkItem& it, float* recv) const {
  const int32_t s = it.seq;
  const int h = it.head, g = h / group_;
  const SeqExtent& e = seqs_[size_t(s)];
  const int64_t t = it.lo, k_lo = t * kKeyTile, k_hi = std::min(k_lo + kKeyTile, e.lk);
  std::fill(sc.colsum.begin(), sc.colsum.end(), 0.f);
  RowMask mk;
  mk.scale2 = scale2_;
  mk.bias2 = p_.sink_mode == SinkMode::key0_bias ? float(double(sink(h)) * kLog2e) : 0.f;
  mk.apply_bias = p_.sink_mode == SinkMode::key0_bias && t == 0;
  for_query_tiles(e, [&](int64_t q_lo, int64_t q_hi) {
    const KeyRange kr = pat_.key_range(e, q_lo, q_hi);
    if (kr.hi <= k_lo || kr.lo >= k_hi) return;
    uint32_t bits = ~0u;
    if (pat_.blocks.defined()) {
      bits = tile_block_bits(pat_, pat_.block_row(s, e, h, q_lo / pat_.blocks.block), t, e.lk);
      if (bits == 0) return;
    }
    const int rows = int(q_hi - q_lo);
    float* off = sc.m.data();  // per-row base-2 LSE
    for (int r = 0; r < rows; ++r) {
      const KeyRange rr = pat_.key_range(e, q_lo + r, q_lo + r + 1);
      off[r] = lse2_[size_t(int64_t(h) * total_q_ + e.q0 + q_lo + r)];
      const bool none = rr.empty() || off[r] == kNegInf;
      sc.row_lo[r] = rr.lo;
      sc.row_hi[r] = none ? rr.lo : rr.hi;
    }
    const auto [r0, r1] = clip_rows(sc, rows, t);
    if (r0 >= r1) return;
    load_q(sc, e, h, q_lo, rows);
    qk(sc, tile(sc, g, s, t).k, r0, r1 - r0);
    mk.lo = sc.lo.data() + r0;
    mk.hi = sc.hi.data() + r0;
    mk.keymask = bits;
    mk.dense = sc.dense && bits == ~0u;
    k_.colsum(sc.s.data() + r0 * kKeyTile, mk, r1 - r0, off + r0, sc.colsum.data());
  });
  for (int64_t k = k_lo; k < k_hi; ++k) recv[int64_t(h) * total_k_ + e.k0 + k] = sc.colsum[size_t(k - k_lo)];
}

}  // namespace ariadne::cpu
