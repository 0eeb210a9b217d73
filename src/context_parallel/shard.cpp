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
