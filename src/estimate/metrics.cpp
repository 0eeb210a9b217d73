// Metrics of a block mask against the oracle: attention-mass recall and block precision/recall/F1,
// at the oracle's τ or, for a τ sweep, at each τ of a list.
#include <algorithm>
#include <cmath>
#include <limits>

#include "estimate/internal.hpp"

namespace ariadne {

namespace {

// `mask` against `truth` (a selection on the oracle's masses), with the oracle's masses.
MaskMetrics compare_to_truth(const BlockMask& mask, const BlockMask& truth, const EstimateResult& oracle) {
  ARIADNE_CHECK(mask.block == truth.block, "compare_to_oracle: mask block ", mask.block,
                ", expected the oracle's ", truth.block);
  ARIADNE_CHECK(mask.heads == truth.heads, "compare_to_oracle: mask heads ", mask.heads,
                ", expected the oracle's ", truth.heads);
  ARIADNE_CHECK(mask.rows() == truth.rows() && mask.rows() == oracle.rows(),
                "compare_to_oracle: mask has ", mask.rows(), " rows, expected the oracle's ", truth.rows());
  ARIADNE_CHECK(mask.seq_block_base == truth.seq_block_base,
                "compare_to_oracle: mask seq_block_base differs from the oracle's (other sequences)");
  MaskMetrics m;
  const int heads = truth.heads;
  std::vector<double> got(size_t(heads), 0.0), total(size_t(heads), 0.0);
  // Rows are (sequence, head, query block): recover the head from the sequence's block range.
  for (size_t s = 0; s + 1 < truth.seq_block_base.size(); ++s) {
    const int64_t base = int64_t(truth.seq_block_base[s]) * heads;
    const int64_t nqb = truth.seq_block_base[s + 1] - truth.seq_block_base[s];
    for (int h = 0; h < heads; ++h)
      for (int64_t qb = 0; qb < nqb; ++qb) {
        const int64_t r = base + h * nqb + qb;
        const int64_t nvis = oracle.visible(r);
        const double w = oracle.row_queries[size_t(r)];
        double row_mass = 0, row_total = 0;
        for (int64_t n = 0; n < nvis; ++n) row_total += oracle.score(r, n);
        int64_t a = mask.row_ptr[size_t(r)], b = truth.row_ptr[size_t(r)];
        const int64_t ae = mask.row_ptr[size_t(r) + 1], be = truth.row_ptr[size_t(r) + 1];
        for (int64_t x = a; x < ae; ++x) {
          const int32_t n = mask.col_idx[size_t(x)];
          ARIADNE_CHECK(n >= 0 && n < nvis, "compare_to_oracle: mask row ", r, " lists key block ", n,
                        ", outside the visible blocks 0..", nvis - 1);
          row_mass += oracle.score(r, n);
        }
        // Both lists are sorted: count the intersection by merging.
        while (a < ae && b < be) {
          const int32_t x = mask.col_idx[size_t(a)], y = truth.col_idx[size_t(b)];
          if (x == y) ++m.true_positive, ++a, ++b;
          else if (x < y) ++a;
          else ++b;
        }
        m.kept += mask.row_ptr[size_t(r) + 1] - mask.row_ptr[size_t(r)];
        m.oracle_kept += be - truth.row_ptr[size_t(r)];
        m.visible += nvis;
        got[size_t(h)] += w * row_mass;
        total[size_t(h)] += w * row_total;
      }
  }
  double g = 0, t = 0;
  m.mass_recall_per_head.resize(size_t(heads));
  // Empty sets count as perfect (nothing claimed, nothing missed), but masses that are NaN (from
  // NaN or infinite q/k) give a NaN recall: `total > 0` is false for NaN, which read as 1.0.
  const auto recall_of = [](double got_mass, double total_mass) {
    if (std::isnan(got_mass) || std::isnan(total_mass)) return std::numeric_limits<double>::quiet_NaN();
    return total_mass > 0 ? got_mass / total_mass : 1.0;
  };
  for (int h = 0; h < heads; ++h) {
    m.mass_recall_per_head[size_t(h)] = recall_of(got[size_t(h)], total[size_t(h)]);
    g += got[size_t(h)];
    t += total[size_t(h)];
  }
  m.mass_recall = recall_of(g, t);
  m.precision = m.kept ? double(m.true_positive) / double(m.kept) : 1.0;
  m.recall = m.oracle_kept ? double(m.true_positive) / double(m.oracle_kept) : 1.0;
  m.f1 = m.precision + m.recall > 0 ? 2 * m.precision * m.recall / (m.precision + m.recall) : 0.0;
  m.density = m.visible ? double(m.kept) / double(m.visible) : 0.0;
  return m;
}

}  // namespace

BlockMask oracle_mask_like(const BlockMask& mask, const EstimateResult& oracle) {
  ARIADNE_CHECK(mask.block == oracle.mask.block && mask.heads == oracle.mask.heads && mask.rows() == oracle.rows() &&
                    mask.seq_block_base == oracle.mask.seq_block_base,
                "oracle_mask_like: the mask (block ", mask.block, ", ", mask.heads, " heads, ", mask.rows(),
                " rows) has another geometry than the oracle (block ", oracle.mask.block, ", ", oracle.mask.heads,
                " heads, ", oracle.rows(), " rows, or other sequences)");
  BlockMask out;
  out.block = mask.block;
  out.heads = mask.heads;
  out.seq_block_base = mask.seq_block_base;
  out.row_ptr.assign(1, 0);
  out.col_idx.reserve(size_t(mask.nnz()));
  std::vector<int32_t> order;
  for (int64_t r = 0; r < mask.rows(); ++r) {
    const int64_t nvis = oracle.visible(r), want = mask.row_ptr[size_t(r) + 1] - mask.row_ptr[size_t(r)];
    ARIADNE_CHECK(want >= 0 && want <= nvis, "oracle_mask_like: mask row ", r, " keeps ", want,
                  " blocks, the oracle's row has ", nvis, " visible");
    order.resize(size_t(nvis));
    for (int64_t n = 0; n < nvis; ++n) order[size_t(n)] = int32_t(n);
    const float* s = oracle.scores.data() + oracle.score_ptr[size_t(r)];
    std::partial_sort(order.begin(), order.begin() + want, order.end(),
                      [s](int32_t a, int32_t b) { return s[a] > s[b] || (s[a] == s[b] && a < b); });
    std::sort(order.begin(), order.begin() + want);
    out.col_idx.insert(out.col_idx.end(), order.begin(), order.begin() + want);
    out.row_ptr.push_back(int32_t(out.col_idx.size()));
  }
  return out;
}

double relative_l2_error(const float* out, const float* ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = double(out[i]) - double(ref[i]);
    num += d * d;
    den += double(ref[i]) * double(ref[i]);
  }
  // `den > 0` is false for NaN: without this test a NaN reference read as error 0.
  if (!std::isfinite(num) || !std::isfinite(den) || !(den > 0)) return std::numeric_limits<double>::quiet_NaN();
  return std::sqrt(num / den);
}

MaskMetrics compare_to_oracle(const BlockMask& mask, const EstimateResult& oracle) {
  return compare_to_truth(mask, oracle.mask, oracle);
}

std::vector<TauSweepPoint> tau_sweep(const EstimateResult& scored, const EstimateConfig& config,
                                     const EstimateResult& oracle, const EstimateConfig& oracle_config,
                                     const std::vector<double>& taus) {
  std::vector<TauSweepPoint> out;
  out.reserve(taus.size());
  for (const double tau : taus) {
    ARIADNE_CHECK(tau > 0 && tau <= 1, "tau_sweep: tau ", tau, " is outside (0, 1]");
    EstimateConfig c = config, oc = oracle_config;
    c.tau = oc.tau = tau;
    c.tau_per_head.clear();
    oc.tau_per_head.clear();
    TauSweepPoint p;
    p.tau = tau;
    EstimateStats st, ost;
    const BlockMask mask = select_mask(scored, c, &st);
    const BlockMask truth = select_mask(oracle, oc, &ost);
    p.metrics = compare_to_truth(mask, truth, oracle);
    p.density_per_head = std::move(st.density_per_head);
    p.oracle_density = ost.density;
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace ariadne
