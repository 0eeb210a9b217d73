// Sharding for the ring: zig-zag chunks of each sequence, and the hand-off of query blocks that
// evens out block-sparse work across ranks.
#include <algorithm>
#include <numeric>

#include "ariadne/context_parallel.hpp"

namespace ariadne {

std::vector<std::pair<PosRange, PosRange>> zigzag_shards(int64_t len, int ranks, int64_t align) {
  ARIADNE_CHECK(ranks >= 1, "zigzag_shards: ranks is ", ranks, ", expected >= 1");
  ARIADNE_CHECK(align >= 1, "zigzag_shards: align is ", align, ", expected >= 1");
  ARIADNE_CHECK(len >= 0, "zigzag_shards: len is ", len, ", expected >= 0");
  const int64_t n = 2 * int64_t(ranks);
  const int64_t c = (len + n - 1) / n, chunk = (c + align - 1) / align * align;
  auto range = [&](int64_t i) { return PosRange{std::min(len, i * chunk), std::min(len, (i + 1) * chunk)}; };
  std::vector<std::pair<PosRange, PosRange>> out;
  for (int r = 0; r < ranks; ++r) out.emplace_back(range(r), range(n - 1 - r));
  return out;
}

std::vector<ShardRun> zigzag_runs(const std::vector<int64_t>& lengths, int rank, int ranks, int64_t align) {
  ARIADNE_CHECK(rank >= 0 && rank < ranks, "zigzag_runs: rank ", rank, " is not in [0, ", ranks, ")");
  std::vector<ShardRun> out;
  int64_t row = 0;
  for (size_t s = 0; s < lengths.size(); ++s) {
    const auto z = zigzag_shards(lengths[s], ranks, align)[size_t(rank)];
    for (const PosRange& pr : {z.first, z.second}) {
      if (pr.size() == 0) continue;
      out.push_back(ShardRun{int32_t(s), pr, row});
      row += pr.size();
    }
  }
  return out;
}

int64_t rows_of(const std::vector<ShardRun>& runs) {
  return runs.empty() ? 0 : runs.back().row + runs.back().pos.size();
}

BlockMask mask_rows(const Pattern& p, int32_t s, int64_t total_q, int64_t total_k, int64_t q0, int64_t n) {
  const BlockSparseView& b = p.blocks;
  ARIADNE_CHECK(b.defined() && b.block > 0, "mask_rows: the pattern has no block mask");
  ARIADNE_CHECK(q0 >= 0 && q0 % b.block == 0, "mask_rows: q0 is ", q0, ", expected a multiple of the block ", b.block);
  const SeqExtent e = p.seq(s, total_q, total_k);
  ARIADNE_CHECK(n >= 0 && q0 + n <= e.lq, "mask_rows: queries [", q0, ", ", q0 + n, ") are not in sequence ", s,
                " of ", e.lq);
  const int64_t nqb = (n + b.block - 1) / b.block;
  std::vector<std::vector<int32_t>> lists;
  for (int32_t h = 0; h < b.heads; ++h)
    for (int64_t m = 0; m < nqb; ++m) {
      const int64_t row = p.block_row(s, e, h, q0 / b.block + m);
      lists.emplace_back(b.col_idx + b.row_ptr[row], b.col_idx + b.row_ptr[row + 1]);
    }
  return BlockMask::from_lists(b.block, b.heads, {n}, lists);
}

namespace {
double max_over_mean(const std::vector<double>& v) {
  if (v.empty()) return 1.0;
  const double sum = std::accumulate(v.begin(), v.end(), 0.0);
  if (sum <= 0) return 1.0;
  return *std::max_element(v.begin(), v.end()) / (sum / double(v.size()));
}
}  // namespace

double BlockAssignment::imbalance() const { return max_over_mean(load); }
double BlockAssignment::imbalance_before() const { return max_over_mean(load_before); }

BlockAssignment balance_query_blocks(const std::vector<std::vector<double>>& work) {
  const int n = int(work.size());
  ARIADNE_CHECK(n >= 1, "balance_query_blocks: no ranks");
  BlockAssignment a;
  a.rank_of.resize(size_t(n));
  a.load.assign(size_t(n), 0.0);
  a.load_before.assign(size_t(n), 0.0);
  double total = 0;
  for (int r = 0; r < n; ++r) {
    a.rank_of[size_t(r)].assign(work[size_t(r)].size(), -1);
    for (size_t i = 0; i < work[size_t(r)].size(); ++i) {
      const double w = work[size_t(r)][i];
      ARIADNE_CHECK(w >= 0 && w == w, "balance_query_blocks: work[", r, "][", i, "] is ", w, ", expected >= 0");
      a.load_before[size_t(r)] += w;
      total += w;
    }
  }
  const double mean = total / double(n);
  struct Item {
    double w;
    int owner;
    size_t index;
  };
  std::vector<Item> pool;
  // Each owner keeps its heaviest blocks while they fit under the mean (a block heavier than the
  // mean on its own stays home when the owner has nothing yet): most blocks never move.
  for (int r = 0; r < n; ++r) {
    std::vector<size_t> order(work[size_t(r)].size());
    std::iota(order.begin(), order.end(), size_t(0));
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t x, size_t y) { return work[size_t(r)][x] > work[size_t(r)][y]; });
    for (size_t i : order) {
      const double w = work[size_t(r)][i];
      if (a.load[size_t(r)] + w <= mean || a.load[size_t(r)] == 0) {
        a.rank_of[size_t(r)][i] = r;
        a.load[size_t(r)] += w;
      } else {
        pool.push_back(Item{w, r, i});
      }
    }
  }
  // The rest: heaviest first, to the least-loaded rank (longest processing time first).
  std::stable_sort(pool.begin(), pool.end(), [](const Item& x, const Item& y) { return x.w > y.w; });
  for (const Item& it : pool) {
    const int r = int(std::min_element(a.load.begin(), a.load.end()) - a.load.begin());
    a.rank_of[size_t(it.owner)][it.index] = r;
    a.load[size_t(r)] += it.w;
    if (r != it.owner) ++a.moved;
  }
  return a;
}

double RingStats::imbalance() const {
  std::vector<double> e;
  for (const RingRankStats& r : ranks) e.push_back(double(r.entries));
  return max_over_mean(e);
}

}  // namespace ariadne
