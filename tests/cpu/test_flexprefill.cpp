// FlexPrefill (estimate.hpp, Estimator::flexprefill) against a plain double implementation written
// here from the rule stated in src/estimate/cpu/flexprefill.cpp: masks compared exactly on random
// heads (GQA, varlen with lq < lk, both head kinds forced by the JS threshold, budgets), the dense
// fallback of short inputs, planted vertical and slash heads, and the calls it refuses.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "ariadne/estimate.hpp"
#include "common.hpp"

namespace ariadne {
namespace {

using testing::Case;
using testing::Inputs;

std::vector<double> softmax_of(std::vector<double> x) {
  const double mx = *std::max_element(x.begin(), x.end());
  double sum = 0;
  for (double& v : x) sum += (v = std::exp(v - mx));
  for (double& v : x) v /= sum;
  return x;
}

// 1 + how many of the largest entries (sorted) fit under γ.
int64_t cover(std::vector<double> x, double gamma) {
  std::sort(x.rbegin(), x.rend());
  double run = 0;
  int64_t n = 0;
  while (n < int64_t(x.size()) && (run += x[size_t(n)]) <= gamma) ++n;
  return n + 1;
}

std::vector<int64_t> largest(const std::vector<double>& x, int64_t n) {
  std::vector<int64_t> idx(x.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return x[size_t(a)] > x[size_t(b)]; });
  idx.resize(size_t(std::min<int64_t>(n, int64_t(x.size()))));
  return idx;
}

// The mask rows (sequence, head, query block) of FlexPrefill, as sorted lists; query_aware_heads
// counts the heads the JS test called query-aware.
std::vector<std::vector<int32_t>> brute_flex(const Inputs& in, const Case& cs, const EstimateConfig& c,
                                             int* query_aware_heads, std::vector<double>* js_of = nullptr) {
  const int64_t B = c.block, d = cs.dim;
  const int group = cs.heads_q / cs.heads_kv;
  const double scale = 1.0 / std::sqrt(double(d));
  std::vector<std::vector<int32_t>> rows;
  *query_aware_heads = 0;
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
      std::vector<std::vector<char>> keep(static_cast<size_t>(nqb));
      for (int64_t m = 0; m < nqb; ++m) keep[size_t(m)].assign(size_t(diag(m) + 1), 0);
      // Mean keys of each key block, mean queries of each query block.
      std::vector<std::vector<double>> kbar(static_cast<size_t>(nkb), std::vector<double>(size_t(d), 0.0));
      for (int64_t j = 0; j < lk; ++j)
        for (int64_t u = 0; u < d; ++u)
          kbar[size_t(j / B)][size_t(u)] += double(K.get({k0 + j, h / group, u})) / double(std::min(lk, (j / B + 1) * B) - (j / B) * B);
      const int64_t minb = (c.flex_min_budget + B - 1) / B;
      if (lq <= std::max(2 * B, minb * B)) {
        for (auto& r : keep) std::fill(r.begin(), r.end(), char(1));
      } else {
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
        int64_t nv = std::clamp(cover(vert, c.tau) / B + 1, std::min(minb, maxb), maxb);
        int64_t ns = std::clamp(cover(sl, c.tau) / B + 1, std::min(minb, maxb), maxb);
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
        if (js_of != nullptr) js_of->push_back(std::sqrt(std::max(js, 0.0)));
        const bool aware = std::sqrt(std::max(js, 0.0)) < c.flex_js_tau;
        *query_aware_heads += aware;
        if (aware) nv = ns = std::min(minb, maxb);
        vp[0] = sp[0] = std::numeric_limits<double>::infinity();
        for (int64_t m = 0; m < nqb; ++m) {
          for (const int64_t cb : largest(vp, nv))
            if (cb <= diag(m)) keep[size_t(m)][size_t(cb)] = 1;
          for (const int64_t sd : largest(sp, ns))
            if (sd <= diag(m)) keep[size_t(m)][size_t(diag(m) - sd)] = 1;
        }
        if (aware) {
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
          double run = 0;
          for (const Entry& x : all) {
            if ((run += x.v) > c.tau * double(nqb)) break;
            keep[size_t(x.m)][size_t(x.cb)] = 1;
          }
          keep[0][0] = 1;
        }
      }
      for (int64_t m = 0; m < nqb; ++m) {
        std::vector<int32_t> l;
        for (int64_t cb = 0; cb <= diag(m); ++cb)
          if (keep[size_t(m)][size_t(cb)]) l.push_back(int32_t(cb));
        rows.push_back(l);
      }
    }
    q0 += lq;
    k0 += lk;
  }
  return rows;
}

std::vector<int32_t> mask_row(const BlockMask& mk, size_t r) {
  return {mk.col_idx.begin() + mk.row_ptr[r], mk.col_idx.begin() + mk.row_ptr[r + 1]};
}

Case flex_case(std::vector<int64_t> sq, std::vector<int64_t> sk, uint64_t seed) {
  Case c;
  c.name = "flex";
  c.seq_q = std::move(sq);
  c.seq_k = std::move(sk);
  c.heads_q = 4;
  c.heads_kv = 2;
  c.dim = 16;
  c.seed = seed;
  c.input_scale = 1.5f;
  c.pattern = Pattern::causal();
  return c;
}

TEST(FlexPrefill, MatchesThePlainImplementation) {
  // Two sequences (the second chunked: lq < lk), GQA 2:1, B 32; the JS threshold at 0 (no head is
  // query-aware), at 10 (every head is) and at the released 0.1; budgets below, inside and above.
  const Case cs = flex_case({300, 200}, {300, 330}, 7);
  const Inputs in = testing::make_inputs(cs);
  for (const double js : {0.0, 0.1, 10.0})
    for (const auto& [minb, maxb] : {std::pair<int64_t, int64_t>{0, 0}, {64, 0}, {32, 96}})
      for (const double gamma : {0.5, 0.9}) {
        SCOPED_TRACE("js " + std::to_string(js) + " budgets " + std::to_string(minb) + "/" + std::to_string(maxb) +
                     " gamma " + std::to_string(gamma));
        EstimateConfig c;
        c.method = Estimator::flexprefill;
        c.block = 32;
        c.tau = gamma;
        c.flex_js_tau = js;
        c.flex_min_budget = minb;
        c.flex_max_budget = maxb;
        const EstimateResult r = estimate(in.params.q, in.params.k, in.params.pattern, c);
        int aware = 0;
        const std::vector<std::vector<int32_t>> want = brute_flex(in, cs, c, &aware);
        ASSERT_EQ(size_t(r.mask.rows()), want.size());
        for (size_t row = 0; row < want.size(); ++row) ASSERT_EQ(mask_row(r.mask, row), want[row]) << "row " << row;
        if (js == 0.0) {
          EXPECT_EQ(aware, 0);
        }
        if (js == 10.0) {
          EXPECT_EQ(aware, 2 * cs.heads_q);
        }
        // The row scores (the q̄·K̄ map) sum to 1; the density counts what the mask keeps.
        for (int64_t row = 0; row < r.mask.rows(); ++row) {
          double sum = 0;
          for (int64_t i = r.score_ptr[size_t(row)]; i < r.score_ptr[size_t(row) + 1]; ++i) sum += r.scores[size_t(i)];
          EXPECT_NEAR(sum, 1.0, 1e-5);
        }
        EXPECT_EQ(r.stats.kept_blocks, int64_t(r.mask.col_idx.size()));
        EXPECT_GT(r.stats.density, 0.0);
        EXPECT_LE(r.stats.density, 1.0);
      }
}

TEST(FlexPrefill, TheDivergenceThresholdSplitsTheHeads) {
  // A threshold between two heads' divergences: the heads below it are query-aware, the others not,
  // and the masks still match the plain implementation.
  const Case cs = flex_case({400}, {}, 21);
  const Inputs in = testing::make_inputs(cs);
  EstimateConfig c;
  c.method = Estimator::flexprefill;
  c.block = 32;
  c.tau = 0.9;
  c.flex_min_budget = 0;
  int aware = 0;
  std::vector<double> js;
  brute_flex(in, cs, c, &aware, &js);
  std::sort(js.begin(), js.end());
  ASSERT_EQ(js.size(), size_t(cs.heads_q));
  ASSERT_LT(js[1], js[2]);
  c.flex_js_tau = 0.5 * (js[1] + js[2]);
  const std::vector<std::vector<int32_t>> want = brute_flex(in, cs, c, &aware);
  EXPECT_EQ(aware, 2);
  const EstimateResult r = estimate(in.params.q, in.params.k, in.params.pattern, c);
  for (size_t row = 0; row < want.size(); ++row) ASSERT_EQ(mask_row(r.mask, row), want[row]) << "row " << row;
}

TEST(FlexPrefill, ShortInputsRunDense) {
  // lq <= max(2B, min budget): every visible block; past it the rule selects.
  const Case cs = flex_case({64, 600}, {}, 3);
  const Inputs in = testing::make_inputs(cs);
  EstimateConfig c;
  c.method = Estimator::flexprefill;
  c.block = 32;
  c.tau = 0.3;
  c.flex_min_budget = 600;  // 19 blocks = 608 tokens >= both lengths
  const EstimateResult r = estimate(in.params.q, in.params.k, in.params.pattern, c);
  EXPECT_EQ(r.stats.density, 1.0);
  c.flex_min_budget = 0;  // the 600-token sequence is now past 2B = 64: sparse
  const EstimateResult s = estimate(in.params.q, in.params.k, in.params.pattern, c);
  EXPECT_LT(s.stats.density, 0.9);
  for (int h = 0; h < cs.heads_q; ++h)  // the 64-token sequence's rows (2 per head) stay whole
    for (int64_t m = 0; m < 2; ++m) EXPECT_EQ(mask_row(s.mask, size_t(h * 2 + m)).size(), size_t(m + 1));
}

TEST(FlexPrefill, FindsPlantedVerticalAndSlashHeads) {
  // Head 0: every query's strongest key by far is key 200 (a vertical line). Head 1: a rotary code
  // in dims 0-1, q_t·k_j = A cos(ω(j − t + 100)) with one period longer than the sequence, so each
  // query's mass sits within ~10 tokens of distance 100 (a slash). Small random values elsewhere.
  Case cs = flex_case({640}, {}, 11);
  cs.heads_q = 2;
  cs.heads_kv = 2;
  cs.dim = 32;
  cs.input_scale = 0.1f;
  Inputs in = testing::make_inputs(cs);
  in.params.k.set({200, 0, 0}, 10.f);
  for (int64_t t = 0; t < 640; ++t) in.params.q.set({t, 0, 0}, 10.f);
  const double w = 2 * 3.141592653589793 / 1000, amp = 34;
  for (int64_t t = 0; t < 640; ++t) {
    in.params.k.set({t, 1, 0}, float(amp * std::cos(w * double(t))));
    in.params.k.set({t, 1, 1}, float(amp * std::sin(w * double(t))));
    in.params.q.set({t, 1, 0}, float(amp * std::cos(w * double(t - 100))));
    in.params.q.set({t, 1, 1}, float(amp * std::sin(w * double(t - 100))));
  }
  EstimateConfig c;
  c.method = Estimator::flexprefill;
  c.block = 32;
  c.tau = 0.9;
  c.flex_min_budget = 64;  // two blocks of each kind: column 0 or the diagonal, and the best other
  c.flex_js_tau = 0;       // vertical-slash for both
  const EstimateResult r = estimate(in.params.q, in.params.k, in.params.pattern, c);
  const int64_t nqb = 20;
  for (int64_t m = 200 / 32; m < nqb; ++m) {  // head 0: key block 6 in every row that sees it
    const std::vector<int32_t> l = mask_row(r.mask, size_t(m));
    EXPECT_EQ(std::count(l.begin(), l.end(), int32_t(200 / 32)), 1) << "query block " << m;
  }
  for (int64_t m = 100 / 32 + 1; m < nqb; ++m) {  // head 1: distance bin 100 / 32 = 3
    const std::vector<int32_t> l = mask_row(r.mask, size_t(nqb + m));
    EXPECT_EQ(std::count(l.begin(), l.end(), int32_t(m - 3)), 1) << "query block " << m;
  }
  EXPECT_LT(r.stats.density_per_head[0], 0.5);
  EXPECT_LT(r.stats.density_per_head[1], 0.5);
}

TEST(FlexPrefill, RefusesThresholdSelectionAndBadBudgets) {
  const Case cs = flex_case({300}, {}, 5);
  const Inputs in = testing::make_inputs(cs);
  EstimateConfig c;
  c.method = Estimator::flexprefill;
  c.block = 32;
  const EstimateResult r = estimate(in.params.q, in.params.k, in.params.pattern, c);
  try {
    select_mask(r, c);
    ADD_FAILURE() << "select_mask accepted a flexprefill config";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("flexprefill selects by its own rule"), std::string::npos) << e.what();
  }
  EXPECT_EQ(parse_estimator("flexprefill"), Estimator::flexprefill);
  c.flex_min_budget = -1;
  EXPECT_THROW(estimate(in.params.q, in.params.k, in.params.pattern, c), Error);
  c.flex_min_budget = 0;
  c.flex_js_tau = std::nan("");
  EXPECT_THROW(estimate(in.params.q, in.params.k, in.params.pattern, c), Error);
}

}  // namespace
}  // namespace ariadne
