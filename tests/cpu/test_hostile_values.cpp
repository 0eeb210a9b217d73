// Issue 29, NaN inputs: a metric computed from NaN must say so (NaN, or an error naming the
// input), never look perfect. `llm --qk` on all-NaN q reported mass recall 1.0 and `shs --qk` an
// SHS of 0.5.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ariadne/error.hpp"
#include "ariadne/estimate.hpp"
#include "ariadne/order.hpp"
#include "ariadne/shs.hpp"
#include "ariadne/tensor.hpp"
#include "common.hpp"

namespace {

using namespace ariadne;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

using ariadne::testing::error_of;

// Mass recall from NaN oracle masses: `total > 0` is false for NaN and read as a perfect 1.0.
TEST(HostileValues, MassRecallOfNaNMassesIsNaN) {
  EstimateResult o;
  o.heads = 1;
  o.score_ptr = {0, 1, 3};
  o.scores = {kNaN, kNaN, kNaN};
  o.row_queries = {2, 2};
  o.mask = BlockMask::from_lists(2, 1, {4}, {{0}, {0, 1}});
  const MaskMetrics m = compare_to_oracle(o.mask, o);
  EXPECT_TRUE(std::isnan(m.mass_recall)) << m.mass_recall;
  ASSERT_EQ(m.mass_recall_per_head.size(), 1u);
  EXPECT_TRUE(std::isnan(m.mass_recall_per_head[0]));
  // Finite masses still score, and an empty row set still counts as perfect.
  o.scores = {1.f, 0.5f, 0.5f};
  EXPECT_NEAR(compare_to_oracle(o.mask, o).mass_recall, 1.0, 1e-12);
}

// End to end: the oracle and RR on all-NaN q, then the metrics.
TEST(HostileValues, EstimatorMetricsOnNaNQueriesAreNotPerfect) {
  const int64_t n = 256;
  const int heads = 2, dim = 16;
  Buffer q(DType::f32, {n, heads, dim}), k(DType::f32, {n, heads, dim});
  q.fill(kNaN);
  k.fill_random(3);
  EstimateConfig c;
  c.block = 64;
  c.stride = 8;
  EstimateConfig oc = c;
  oc.method = Estimator::oracle;
  const Pattern causal = Pattern::causal();
  std::string err;
  try {
    const EstimateResult oracle = estimate(q.view(), k.view(), causal, oc, Backend::cpu);
    const EstimateResult est = estimate(q.view(), k.view(), causal, c, Backend::cpu);
    const MaskMetrics m = compare_to_oracle(est.mask, oracle);
    EXPECT_FALSE(m.mass_recall == 1.0) << "NaN q gave a perfect mass recall";
    EXPECT_TRUE(std::isnan(m.mass_recall)) << m.mass_recall;
  } catch (const Error& e) {
    err = e.what();  // refusing NaN input is fine too, when the message names it
    EXPECT_NE(err.find("NaN"), std::string::npos) << err;
  }
}

// SHS: NaN q or k is refused naming the input; NaN received attention gives NaN scores.
TEST(HostileValues, ShsOfNaNInputsIsAnErrorOrNaN) {
  const Grid g{4, 4};
  const TokenOrder o = make_order(OrderKind::block_row, {g}, 2, 4);
  Buffer q(DType::f32, {16, 2, 8}), k(DType::f32, {16, 2, 8});
  q.fill(kNaN);
  k.fill_random(2);
  LayerInput in;
  in.q = q.view();
  in.k = k.view();
  in.order = &o;
  in.pattern = Pattern::full();
  const std::string msg = error_of([&] { (void)diagnose_layer(in); });
  EXPECT_NE(msg.find("q: element (token 0, head 0, dim 0) is nan"), std::string::npos) << msg;
  q.fill_random(1);
  k.as<float>()[37] = std::numeric_limits<float>::infinity();
  EXPECT_NE(error_of([&] { (void)diagnose_layer(in); }).find("k: element"), std::string::npos);
  k.fill_random(2);

  // Received attention with a NaN in it (as from a NaN sink): NaN scores, NaN index, not 0.5.
  LayerDiag d = diagnose_layer(in);
  for (float& r : d.received) r = kNaN;
  std::vector<int8_t> labels(16, kPatchBackground);
  for (int i = 0; i < 6; ++i) labels[size_t(i)] = kPatchForeground;
  ShsAccumulator acc(1, 2);
  const ImageScores& s = acc.add("nan", g, labels, {d});
  EXPECT_TRUE(s.scored);
  EXPECT_TRUE(std::isnan(s.heads[0].auroc));
  const ShsSummary sum = acc.summary();
  EXPECT_TRUE(std::isnan(sum.shs_index)) << sum.shs_index;
  EXPECT_TRUE(std::isnan(sum.fg_dominant_share)) << sum.fg_dominant_share;
  EXPECT_TRUE(shs_summary_json(sum)["shs_index"].is_null());
}

// Heatmaps: `shs --cell 2000` asked for a 196 GB picture (bad_alloc); NaN received attention
// reached int(NaN) in the colour map.
TEST(HostileValues, HeatmapsRefuseHugeCellsAndDrawNaN) {
  const Image bg{8, 8, 3, std::vector<uint8_t>(8 * 8 * 3, 100)};
  const Grid g{32, 32};
  std::vector<float> received(size_t(16 * g.tokens()), 1.f);
  const std::string msg = error_of([&] { (void)heatmap_grid(bg, received.data(), 16, g, 2000, 4); });
  EXPECT_NE(msg.find("heatmap_grid: a 256010x256010 picture exceeds the limit"), std::string::npos) << msg;
  EXPECT_NE(error_of([&] { (void)label_picture(bg, std::vector<int8_t>(size_t(g.tokens()), 0), g, 100000); })
                .find("label_picture: a 3200000x3200000 picture"),
            std::string::npos);
  received[5] = kNaN;
  for (float& r : received) r = kNaN;
  const Image h = heatmap_grid(bg, received.data(), 2, Grid{2, 2}, 3, 2);
  EXPECT_EQ(h.channels, 3);
  EXPECT_GT(h.width, 0);
}


// The output error of a sparse run against dense (`llm-probe --qk`, the Llama traces): a NaN or
// all-zero dense output read as error 0 (`den > 0 ? … : 0`); it is NaN, the JSON's null.
TEST(HostileValues, RelativeErrorAgainstNaNOrZeroReferenceIsNaN) {
  const std::vector<float> ref = {1, -2, 2}, out = {1, -2, 2.5f}, zero = {0, 0, 0};
  EXPECT_DOUBLE_EQ(relative_l2_error(out.data(), ref.data(), 3), 0.5 / 3);
  EXPECT_EQ(relative_l2_error(ref.data(), ref.data(), 3), 0);
  const std::vector<float> nan_ref = {1, kNaN, 2}, inf_out = {1, std::numeric_limits<float>::infinity(), 2};
  EXPECT_TRUE(std::isnan(relative_l2_error(out.data(), nan_ref.data(), 3)));
  EXPECT_TRUE(std::isnan(relative_l2_error(nan_ref.data(), ref.data(), 3)));
  EXPECT_TRUE(std::isnan(relative_l2_error(inf_out.data(), ref.data(), 3)));
  EXPECT_TRUE(std::isnan(relative_l2_error(zero.data(), zero.data(), 3)));  // 0/0
  EXPECT_TRUE(std::isnan(relative_l2_error(out.data(), zero.data(), 3)));   // an error against nothing
  EXPECT_TRUE(std::isnan(relative_l2_error(out.data(), ref.data(), 0)));    // no values
}

}  // namespace
