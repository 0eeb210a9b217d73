// FlexPrefill (Lai et al., ICLR 2025) as its release defines it, per (sequence, query head):
//   probe     the last L = min(B, lq) queries attend exactly (causal softmax over their keys); their
//             mean row is the vertical score of each key, and the mean mass at each distance
//             δ = position − key is the slash score;
//   budgets   the fewest tokens whose sorted scores reach γ, in blocks (count / B + 1), clamped to
//             [ceil(min_budget / B), min(ceil(max_budget / B), key blocks)], for each score;
//   head kind query-aware when sqrt(JSD(softmax(mean probe q · K̄ᵀ), pooled vertical)) < τ_js
//             (K̄: the key blocks' mean keys); such a head keeps min-budget vertical and slash
//             blocks plus the query-aware selection below;
//   vertical  the n_v key blocks of highest pooled vertical score (block 0 always), kept in every
//             query block that sees them;
//   slash     the n_s block distances of highest pooled slash score (distance 0, the diagonal,
//             always), each kept as key block diag(m) − s in every query block m;
//   query-aware the block-causal map softmax_c(q̄_m · K̄_c) (q̄_m: query block m's mean query) over
//             all rows at once: entries by descending value while the running sum stays <= γ times
//             the number of rows, and block (0, 0).
// Inputs of at most max(2B, ceil(min_budget / B)·B) queries run dense (every visible block).
// Deviations, all invisible at B = 128 on self-attention with lk a multiple of B (docs/rrattention.md):
// the release divides token counts by 128 whatever B is (here by B); it bins slash distances from
// the far end of the keys (here from the diagonal); it sorts ties in no fixed order (here the
// smaller index first); and 0·log 0 in the divergence is 0 here (NaN there: vertical-slash).
// The row scores of the result are the query-aware map's rows, for every head.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "estimate/internal.hpp"

namespace ariadne::est {
namespace {

// 1 + the number of leading entries of x sorted by descending value whose running sum is <= γ (the
// release's score_cover_topk): the tokens that reach γ of the mass.
int64_t cover_count(std::vector<double> x, double gamma) {
  std::sort(x.begin(), x.end(), std::greater<double>());
  double run = 0;
  int64_t n = 0;
  for (const double v : x) {
    run += v;
    if (run > gamma) break;
    ++n;
  }
  return n + 1;
}

// The indices of the n largest entries of x, ties to the smaller index.
std::vector<int64_t> top_n(const std::vector<double>& x, int64_t n) {
  std::vector<int64_t> idx(x.size());
  std::iota(idx.begin(), idx.end(), int64_t(0));
  n = std::min<int64_t>(n, int64_t(idx.size()));
  std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), [&](int64_t a, int64_t b) {
    return x[size_t(a)] != x[size_t(b)] ? x[size_t(a)] > x[size_t(b)] : a < b;
  });
  idx.resize(size_t(n));
  return idx;
}

// Softmax of x in place (double), returning nothing; x is not empty.
void softmax(std::vector<double>& x) {
  const double mx = *std::max_element(x.begin(), x.end());
  double sum = 0;
  for (double& v : x) sum += (v = std::exp(v - mx));
  for (double& v : x) v /= sum;
}

// sqrt of the Jensen–Shannon divergence (natural log) of two distributions of one length.
double sqrt_js(const std::vector<double>& p, const std::vector<double>& q) {
  double js = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double m = 0.5 * (p[i] + q[i]);
    if (p[i] > 0) js += 0.5 * p[i] * std::log(p[i] / m);
    if (q[i] > 0) js += 0.5 * q[i] * std::log(q[i] / m);
  }
  return std::sqrt(std::max(js, 0.0));
}

}  // namespace

double score_flexprefill(const Geometry& g, const TensorView& q, const TensorView& k, const EstimateConfig& c,
                         float scale, EstimateResult& r, std::vector<std::vector<int32_t>>& lists) {
  const int64_t d = g.dim, B = g.block;
  const double gamma = c.tau;
  lists.assign(size_t(g.rows), {});
  // (sequence, KV head) tasks: the keys and K̄ are built once and serve the group's query heads.
  std::vector<std::pair<int32_t, int>> tasks;
  for (int32_t s = 0; s < int32_t(g.seqs.size()); ++s)
    for (int kh = 0; kh < g.heads_kv; ++kh) tasks.emplace_back(s, kh);
  double mac = 0;
#pragma omp parallel for schedule(dynamic, 1) num_threads(cpu_threads()) reduction(+ : mac)
  for (size_t t = 0; t < tasks.size(); ++t) {
    const auto [s, kh] = tasks[t];
    const Seq& e = g.seqs[size_t(s)];
    const int64_t lq = e.lq, lk = e.lk, nqb = e.nqb, nkb = (lk + B - 1) / B;
    if (lq == 0) continue;

    // Keys (f32 rows) and the key blocks' mean keys K̄.
    std::vector<float> kf(static_cast<size_t>(lk * d));
    for (int64_t j = 0; j < lk; ++j) load_row(k, e.k0 + j, kh, 1.f, kf.data() + j * d);
    std::vector<double> kbar(static_cast<size_t>(nkb * d), 0.0);
    for (int64_t j = 0; j < lk; ++j)
      for (int64_t u = 0; u < d; ++u) kbar[size_t((j / B) * d + u)] += kf[size_t(j * d + u)];
    for (int64_t cb = 0; cb < nkb; ++cb) {
      const double n = double(std::min(lk, (cb + 1) * B) - cb * B);
      for (int64_t u = 0; u < d; ++u) kbar[size_t(cb * d + u)] /= n;
    }
    for (int h = kh * g.group; h < (kh + 1) * g.group; ++h) {
      const int64_t row0 = e.row_base + h * nqb;
      // Query blocks' mean queries (scaled) and the block-causal map: the rows' scores.
      std::vector<float> qrow(static_cast<size_t>(d));
      std::vector<std::vector<double>> map(static_cast<size_t>(nqb));
      for (int64_t m = 0; m < nqb; ++m) {
        std::vector<double> qbar(static_cast<size_t>(d), 0.0);
        const int64_t n = g.queries_in(e, m);
        for (int64_t i = 0; i < n; ++i) {
          load_row(q, e.q0 + m * B + i, h, scale, qrow.data());
          for (int64_t u = 0; u < d; ++u) qbar[size_t(u)] += qrow[size_t(u)];
        }
        const int64_t nvis = g.diag(e, m) + 1;
        std::vector<double>& z = map[size_t(m)];
        z.assign(size_t(nvis), 0.0);
        for (int64_t cb = 0; cb < nvis; ++cb) {
          double dot = 0;
          for (int64_t u = 0; u < d; ++u) dot += qbar[size_t(u)] * kbar[size_t(cb * d + u)];
          z[size_t(cb)] = dot / double(n);
        }
        softmax(z);
        float* out = r.scores.data() + r.score_ptr[size_t(row0 + m)];
        for (int64_t cb = 0; cb < nvis; ++cb) out[cb] = float(z[size_t(cb)]);
        mac += double(n + nvis) * double(d);
      }
      auto keep = [&](int64_t m, int64_t cb, std::vector<char>& flags) {
        if (cb >= 0 && cb <= g.diag(e, m)) flags[size_t(cb)] = 1;
      };
      std::vector<std::vector<char>> flags(static_cast<size_t>(nqb));
      for (int64_t m = 0; m < nqb; ++m) flags[size_t(m)].assign(size_t(g.diag(e, m) + 1), 0);
      const int64_t min_blocks = (c.flex_min_budget + B - 1) / B;
      if (lq <= std::max(2 * B, min_blocks * B)) {  // short: dense
        for (int64_t m = 0; m < nqb; ++m) std::fill(flags[size_t(m)].begin(), flags[size_t(m)].end(), char(1));
      } else {
        // The probe: the last L queries, exact causal softmax rows.
        const int64_t L = std::min(B, lq);
        std::vector<double> vertical(static_cast<size_t>(lk), 0.0), slash(size_t(lk), 0.0), qmean(size_t(d), 0.0);
        std::vector<float> logits(static_cast<size_t>(lk));
        for (int64_t i = lq - L; i < lq; ++i) {
          load_row(q, e.q0 + i, h, scale, qrow.data());
          for (int64_t u = 0; u < d; ++u) qmean[size_t(u)] += qrow[size_t(u)] / double(L);
          const int64_t p = i + e.off;  // keys 0 … p
          dot_rows(qrow.data(), 1, kf.data(), p + 1, d, logits.data(), p + 1);
          mac += double(p + 1) * double(d);
          const float mx = *std::max_element(logits.begin(), logits.begin() + p + 1);
          const double inv = 1.0 / exp_sum(logits.data(), p + 1, mx);
          for (int64_t j = 0; j <= p; ++j) {
            const double a = double(logits[size_t(j)]) * inv / double(L);
            vertical[size_t(j)] += a;
            slash[size_t(p - j)] += a;
          }
        }
        const int64_t max_blocks =
            std::min(nkb, c.flex_max_budget > 0 ? (c.flex_max_budget + B - 1) / B
                                                : std::numeric_limits<int64_t>::max());
        auto budget = [&](const std::vector<double>& x) {
          return std::clamp(cover_count(x, gamma) / B + 1, std::min(min_blocks, max_blocks), max_blocks);
        };
        int64_t n_v = budget(vertical), n_s = budget(slash);
        std::vector<double> vp(static_cast<size_t>(nkb), 0.0), sp(size_t(nkb), 0.0);
        for (int64_t j = 0; j < lk; ++j) {
          vp[size_t(j / B)] += vertical[size_t(j)];
          sp[size_t(j / B)] += slash[size_t(j)];
        }
        // The head's kind: the pooled estimate from the probe's mean query against the pooled truth.
        std::vector<double> est(static_cast<size_t>(nkb), 0.0);
        for (int64_t cb = 0; cb < nkb; ++cb)
          for (int64_t u = 0; u < d; ++u) est[size_t(cb)] += qmean[size_t(u)] * kbar[size_t(cb * d + u)];
        softmax(est);
        const bool query_aware = sqrt_js(est, vp) < c.flex_js_tau;
        if (query_aware) n_v = n_s = std::min(min_blocks, max_blocks);
        vp[0] = sp[0] = std::numeric_limits<double>::infinity();  // column 0 and the diagonal, always
        for (const int64_t cb : top_n(vp, n_v))
          for (int64_t m = 0; m < nqb; ++m) keep(m, cb, flags[size_t(m)]);
        for (const int64_t sd : top_n(sp, n_s))
          for (int64_t m = 0; m < nqb; ++m) keep(m, g.diag(e, m) - sd, flags[size_t(m)]);
        if (query_aware) {
          // Every entry of the map, by descending value (ties: row-major order), while the running
          // sum stays <= γ·rows; block (0, 0) always.
          std::vector<std::pair<double, std::pair<int64_t, int64_t>>> all;
          for (int64_t m = 0; m < nqb; ++m)
            for (int64_t cb = 0; cb < int64_t(map[size_t(m)].size()); ++cb)
              all.push_back({map[size_t(m)][size_t(cb)], {m, cb}});
          std::stable_sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
          double run = 0;
          for (const auto& [v, at] : all) {
            run += v;
            if (run > gamma * double(nqb)) break;
            flags[size_t(at.first)][size_t(at.second)] = 1;
          }
          flags[0][0] = 1;
        }
      }
      for (int64_t m = 0; m < nqb; ++m) {
        std::vector<int32_t>& l = lists[size_t(row0 + m)];
        for (int64_t cb = 0; cb < int64_t(flags[size_t(m)].size()); ++cb)
          if (flags[size_t(m)][size_t(cb)]) l.push_back(int32_t(cb));
      }
    }
  }
  return mac;
}

}  // namespace ariadne::est
