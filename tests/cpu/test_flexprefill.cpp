// FlexPrefill (estimate.hpp, Estimator::flexprefill) against the plain double implementation of
// tests/flexprefill_brute.cpp (written from the rule stated in src/estimate/cpu/flexprefill.cpp): masks compared exactly on random
// heads (GQA, varlen with lq < lk, both head kinds forced by the JS threshold, budgets), the dense
// fallback of short inputs, planted vertical and slash heads, and the calls it refuses.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "ariadne/estimate.hpp"
#include "common.hpp"
#include "flexprefill_brute.hpp"

namespace ariadne {
namespace {

using testing::Case;
using testing::Inputs;

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
        const testing::FlexBrute fb = testing::brute_flex(in, cs, c);
        const std::vector<std::vector<int32_t>>& want = fb.rows;
        const int aware = fb.aware_heads;
        ASSERT_EQ(size_t(r.mask.rows()), want.size());
        for (size_t row = 0; row < want.size(); ++row) ASSERT_EQ(testing::mask_row(r.mask, row), want[row]) << "row " << row;
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
  std::vector<double> js;
  for (const testing::FlexHead& h : testing::brute_flex(in, cs, c).heads) js.push_back(h.js);
  std::sort(js.begin(), js.end());
  ASSERT_EQ(js.size(), size_t(cs.heads_q));
  ASSERT_LT(js[1], js[2]);
  c.flex_js_tau = 0.5 * (js[1] + js[2]);
  const testing::FlexBrute fb = testing::brute_flex(in, cs, c);
  const std::vector<std::vector<int32_t>>& want = fb.rows;
  EXPECT_EQ(fb.aware_heads, 2);
  const EstimateResult r = estimate(in.params.q, in.params.k, in.params.pattern, c);
  for (size_t row = 0; row < want.size(); ++row) ASSERT_EQ(testing::mask_row(r.mask, row), want[row]) << "row " << row;
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
    for (int64_t m = 0; m < 2; ++m) EXPECT_EQ(testing::mask_row(s.mask, size_t(h * 2 + m)).size(), size_t(m + 1));
}

TEST(FlexPrefill, FindsPlantedVerticalAndSlashHeads) {
  // Head 0 a vertical line at key 200, head 1 a slash at distance 100 (flexprefill_brute.hpp).
  Case cs = flex_case({640}, {}, 11);
  cs.heads_q = 2;
  cs.heads_kv = 2;
  cs.dim = 32;
  cs.input_scale = 0.1f;
  Inputs in = testing::make_inputs(cs);
  testing::plant_vertical_and_slash(in);
  EstimateConfig c;
  c.method = Estimator::flexprefill;
  c.block = 32;
  c.tau = 0.9;
  c.flex_min_budget = 64;  // two blocks of each kind: column 0 or the diagonal, and the best other
  c.flex_js_tau = 0;       // vertical-slash for both
  const EstimateResult r = estimate(in.params.q, in.params.k, in.params.pattern, c);
  const int64_t nqb = 20;
  for (int64_t m = 200 / 32; m < nqb; ++m) {  // head 0: key block 6 in every row that sees it
    const std::vector<int32_t> l = testing::mask_row(r.mask, size_t(m));
    EXPECT_EQ(std::count(l.begin(), l.end(), int32_t(200 / 32)), 1) << "query block " << m;
  }
  for (int64_t m = 100 / 32 + 1; m < nqb; ++m) {  // head 1: distance bin 100 / 32 = 3
    const std::vector<int32_t> l = testing::mask_row(r.mask, size_t(nqb + m));
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
