#include "flexprefill_brute.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace ariadne::testing {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<double> softmax_of(std::vector<double> x) {
  const double mx = *std::max_element(x.begin(), x.end());
  double sum = 0;
  for (double& v : x) sum += (v = std::exp(v - mx));
  for (double& v : x) v /= sum;
  return x;
}

// The greedy rule "the largest entries while their running sum stays <= target": how many are
// kept, and the margin of that decision (target − the kept sum, the first dropped entry's
// overshoot).
struct Greedy {
  int64_t kept = 0;
  double below = kInf, above = kInf;
};
Greedy greedy(const std::vector<double>& sorted, double target) {
  Greedy g;
  double run = 0;
  while (g.kept < int64_t(sorted.size()) && run + sorted[size_t(g.kept)] <= target) run += sorted[size_t(g.kept++)];
  g.below = target - run;
  if (g.kept < int64_t(sorted.size())) g.above = run + sorted[size_t(g.kept)] - target;
  return g;
}

std::vector<double> sorted_desc(std::vector<double> x) {
  std::sort(x.rbegin(), x.rend());
  return x;
}

// The n largest (ties to the smaller index) and the gap between the n-th and the (n+1)-th.
std::vector<int64_t> largest(const std::vector<double>& x, int64_t n, double* gap) {
  std::vector<int64_t> idx(x.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return x[size_t(a)] > x[size_t(b)]; });
  n = std::min<int64_t>(n, int64_t(x.size()));
  *gap = n > 0 && n < int64_t(x.size()) ? x[size_t(idx[size_t(n - 1)])] - x[size_t(idx[size_t(n)])] : kInf;
  idx.resize(size_t(n));
  return idx;
}

}  // namespace

FlexBrute brute_flex(const Inputs& in, const Case& cs, const EstimateConfig& c) {
  const int64_t B = c.block, d = cs.dim;
  const int group = cs.heads_q / cs.heads_kv;
  const double scale = c.scale > 0 ? double(c.scale) : 1.0 / std::sqrt(double(d));
  FlexBrute out;
  const TensorView& Q = in.params.q;
  const TensorView& K = in.params.k;
  int64_t q0 = 0, k0 = 0;
  for (size_t s = 0; s < cs.seq_q.size(); ++s) {
    const int64_t lq = cs.seq_q[s], lk = cs.seq_k.empty() ? lq : cs.seq_k[s], off = lk - lq;
    const int64_t nqb = (lq + B - 1) / B, nkb = (lk + B - 1) / B;
    auto diag = [&](int64_t m) { return (std::min((m + 1) * B, lq) - 1 + off) / B; };
    auto dot = [&](int64_t iq, int h, int64_t ik) {
      double v = 0;
      for (int64_t u = 0; u < d; ++u) v += double(Q.get({q0 + iq, h, u})) * double(K.get({k0 + ik, h / group, u}));
      return v;
    };
    for (int h = 0; h < cs.heads_q; ++h) {
      FlexHead head;
      head.seq = int(s);
      head.head = h;
      head.margin = head.margin_js = head.margin_cover = head.margin_top = head.margin_aware = kInf;
      std::vector<std::vector<char>> keep(static_cast<size_t>(nqb));
      for (int64_t m = 0; m < nqb; ++m) keep[size_t(m)].assign(size_t(diag(m) + 1), 0);
      std::vector<std::vector<double>> kbar(static_cast<size_t>(nkb), std::vector<double>(size_t(d), 0.0));
      for (int64_t j = 0; j < lk; ++j)
        for (int64_t u = 0; u < d; ++u)
          kbar[size_t(j / B)][size_t(u)] +=
              double(K.get({k0 + j, h / group, u})) / double(std::min(lk, (j / B + 1) * B) - (j / B) * B);
      const int64_t minb = (c.flex_min_budget + B - 1) / B;
      if (lq <= std::max(2 * B, minb * B)) {
        for (auto& r : keep) std::fill(r.begin(), r.end(), char(1));
      } else {
        head.probed = true;
        const int64_t L = std::min(B, lq);
        std::vector<double> vert(static_cast<size_t>(lk), 0.0), sl(size_t(lk), 0.0), qm(size_t(d), 0.0);
        for (int64_t i = lq - L; i < lq; ++i) {
          const int64_t p = i + off;
          std::vector<double> a(static_cast<size_t>(p + 1));
          for (int64_t j = 0; j <= p; ++j) a[size_t(j)] = scale * dot(i, h, j);
          a = softmax_of(a);
          for (int64_t j = 0; j <= p; ++j) {
            vert[size_t(j)] += a[size_t(j)] / double(L);
            sl[size_t(p - j)] += a[size_t(j)] / double(L);
          }
          for (int64_t u = 0; u < d; ++u) qm[size_t(u)] += scale * double(Q.get({q0 + i, h, u})) / double(L);
        }
        const int64_t maxb = c.flex_max_budget > 0 ? std::min(nkb, (c.flex_max_budget + B - 1) / B) : nkb;
        const auto blocks = [&](int64_t n) { return std::clamp((n + 1) / B + 1, std::min(minb, maxb), maxb); };
        std::vector<double> cover_margins;
        const auto budget = [&](const std::vector<double>& x) {
          const Greedy g = greedy(sorted_desc(x), c.tau);
          const int64_t b = blocks(g.kept);
          if (g.kept > 0 && blocks(g.kept - 1) != b) cover_margins.push_back(g.below);
          if (blocks(g.kept + 1) != b) cover_margins.push_back(g.above);
          return b;
        };
        int64_t nv = budget(vert), ns = budget(sl);
        std::vector<double> vp(static_cast<size_t>(nkb), 0.0), sp(size_t(nkb), 0.0), est(size_t(nkb), 0.0);
        for (int64_t j = 0; j < lk; ++j) {
          vp[size_t(j / B)] += vert[size_t(j)];
          sp[size_t(j / B)] += sl[size_t(j)];
        }
        for (int64_t cb = 0; cb < nkb; ++cb)
          for (int64_t u = 0; u < d; ++u) est[size_t(cb)] += qm[size_t(u)] * kbar[size_t(cb)][size_t(u)];
        est = softmax_of(est);
        double js = 0;
        for (int64_t cb = 0; cb < nkb; ++cb) {
          const double mid = (est[size_t(cb)] + vp[size_t(cb)]) / 2;
          if (est[size_t(cb)] > 0) js += 0.5 * est[size_t(cb)] * std::log(est[size_t(cb)] / mid);
          if (vp[size_t(cb)] > 0) js += 0.5 * vp[size_t(cb)] * std::log(vp[size_t(cb)] / mid);
        }
        head.js = std::sqrt(std::max(js, 0.0));
        head.aware = head.js < c.flex_js_tau;
        head.margin_js = std::abs(head.js - c.flex_js_tau);
        if (head.aware) nv = ns = std::min(minb, maxb);
        else
          for (const double m : cover_margins) head.margin_cover = std::min(head.margin_cover, m);
        head.n_v = nv;
        head.n_s = ns;
        out.aware_heads += head.aware;
        vp[0] = sp[0] = kInf;
        double gap_v = kInf, gap_s = kInf;
        const std::vector<int64_t> top_v = largest(vp, nv, &gap_v), top_s = largest(sp, ns, &gap_s);
        head.margin_top = std::min(gap_v, gap_s);
        for (int64_t m = 0; m < nqb; ++m) {
          for (const int64_t cb : top_v)
            if (cb <= diag(m)) keep[size_t(m)][size_t(cb)] = 1;
          for (const int64_t sd : top_s)
            if (sd <= diag(m)) keep[size_t(m)][size_t(diag(m) - sd)] = 1;
        }
        if (head.aware) {
          struct Entry {
            double v;
            int64_t m, cb;
          };
          std::vector<Entry> all;
          for (int64_t m = 0; m < nqb; ++m) {
            std::vector<double> qb(static_cast<size_t>(d), 0.0);
            const int64_t n = std::min((m + 1) * B, lq) - m * B;
            for (int64_t i = m * B; i < m * B + n; ++i)
              for (int64_t u = 0; u < d; ++u) qb[size_t(u)] += scale * double(Q.get({q0 + i, h, u})) / double(n);
            std::vector<double> z(size_t(diag(m) + 1), 0.0);
            for (int64_t cb = 0; cb <= diag(m); ++cb)
              for (int64_t u = 0; u < d; ++u) z[size_t(cb)] += qb[size_t(u)] * kbar[size_t(cb)][size_t(u)];
            z = softmax_of(z);
            for (int64_t cb = 0; cb <= diag(m); ++cb) all.push_back({z[size_t(cb)], m, cb});
          }
          std::stable_sort(all.begin(), all.end(), [](const Entry& a, const Entry& b) { return a.v > b.v; });
          std::vector<double> vals(all.size());
          for (size_t i = 0; i < all.size(); ++i) vals[i] = all[i].v;
          const Greedy g = greedy(vals, c.tau * double(nqb));
          for (int64_t i = 0; i < g.kept; ++i) keep[size_t(all[size_t(i)].m)][size_t(all[size_t(i)].cb)] = 1;
          keep[0][0] = 1;
          head.margin_aware = std::min(g.below, g.above);
          if (g.kept > 0 && g.kept < int64_t(vals.size()))
            head.margin_aware = std::min(head.margin_aware, vals[size_t(g.kept - 1)] - vals[size_t(g.kept)]);
        }
        head.margin = std::min({head.margin_js, head.margin_cover, head.margin_top, head.margin_aware});
      }
      for (int64_t m = 0; m < nqb; ++m) {
        std::vector<int32_t> l;
        for (int64_t cb = 0; cb <= diag(m); ++cb)
          if (keep[size_t(m)][size_t(cb)]) l.push_back(int32_t(cb));
        out.rows.push_back(l);
      }
      out.heads.push_back(head);
    }
    q0 += lq;
    k0 += lk;
  }
  return out;
}

std::vector<int32_t> mask_row(const BlockMask& mk, size_t r) {
  return {mk.col_idx.begin() + mk.row_ptr[r], mk.col_idx.begin() + mk.row_ptr[r + 1]};
}

void plant_vertical_and_slash(Inputs& in) {
  in.params.k.set({200, 0, 0}, 10.f);
  for (int64_t t = 0; t < 640; ++t) in.params.q.set({t, 0, 0}, 10.f);
  const double w = 2 * 3.141592653589793 / 1000, amp = 34;
  for (int64_t t = 0; t < 640; ++t) {
    in.params.k.set({t, 1, 0}, float(amp * std::cos(w * double(t))));
    in.params.k.set({t, 1, 1}, float(amp * std::sin(w * double(t))));
    in.params.q.set({t, 1, 0}, float(amp * std::cos(w * double(t - 100))));
    in.params.q.set({t, 1, 1}, float(amp * std::sin(w * double(t - 100))));
  }
}

}  // namespace ariadne::testing
