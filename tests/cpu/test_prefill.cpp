// Sparse prefill: estimate + block-sparse attention equals attention on the estimated
// mask, dense prefill equals causal attention, τ = 1 equals dense, stats and errors.
#include <cmath>
#include <limits>

#include "ariadne/prefill.hpp"
#include "common.hpp"

namespace ariadne {
namespace {

using testing::Case;
using testing::Inputs;

Case prefill_case(std::vector<int64_t> sq, std::vector<int64_t> sk, uint64_t seed) {
  Case c;
  c.name = "prefill";
  c.seq_q = std::move(sq);
  c.seq_k = std::move(sk);
  c.heads_q = 4;
  c.heads_kv = 2;
  c.dim = 32;
  c.seed = seed;
  c.input_scale = 1.5f;
  c.pattern = Pattern::causal();
  return c;
}

struct Out {
  Buffer out, lse;
};

Out run_prefill(const Inputs& in, const PrefillConfig& cfg, PrefillResult* res) {
  Out o;
  o.out = Buffer(DType::f32, {in.total_q, in.params.heads_q(), in.params.head_dim()});
  o.lse = Buffer(DType::f32, {in.params.heads_q(), in.total_q});
  o.out.fill(std::numeric_limits<float>::quiet_NaN());  // poison: every element must be written
  AttentionParams p = in.params;
  p.out = o.out.view();
  p.lse = o.lse.view();
  *res = prefill(p, cfg);
  return o;
}

Out run_attention(const Inputs& in, const Pattern& pattern) {
  Out o;
  o.out = Buffer(DType::f32, {in.total_q, in.params.heads_q(), in.params.head_dim()});
  o.lse = Buffer(DType::f32, {in.params.heads_q(), in.total_q});
  AttentionParams p = in.params;
  p.pattern = pattern;
  p.out = o.out.view();
  p.lse = o.lse.view();
  attention(p, Backend::reference);
  return o;
}

TEST(Prefill, SparseEqualsAttentionOnTheEstimatedMask) {
  Case cs = prefill_case({600, 100}, {600, 260}, 21);
  cs.input_scale = 3.f;  // peaked rows: a real choice of blocks
  const Inputs in = testing::make_inputs(cs);
  for (Estimator m : {Estimator::rr, Estimator::xattn}) {
    PrefillConfig cfg;
    cfg.estimate.method = m;
    cfg.estimate.block = 64;
    cfg.estimate.tau = 0.5;
    cfg.attention_backend = Backend::reference;
    PrefillResult res;
    const Out got = run_prefill(in, cfg, &res);
    const Out want = run_attention(in, in.params.pattern.with_blocks(res.estimate.mask.view()));
    EXPECT_TRUE(testing::close_enough("out", testing::compare(got.out.view(), want.out.view()), 1e-6));
    EXPECT_TRUE(testing::lse_close(got.lse.view(), want.lse.view(), 1e-6));
    // The mask really is sparse at τ = 0.5, so this is not the dense case in disguise.
    EXPECT_LT(res.stats.density, 1.0);
    EXPECT_GT(res.stats.density, 0.0);
    EXPECT_EQ(res.stats.density_per_head.size(), 4u);
    EXPECT_GE(res.stats.ms_total, res.stats.ms_attention);
    EXPECT_GE(res.stats.ms_estimate, res.stats.ms_scoring);
  }
}

TEST(Prefill, DenseAndTauOneEqualCausalAttention) {
  const Inputs in = testing::make_inputs(prefill_case({200}, {}, 22));
  const Out want = run_attention(in, Pattern::causal());
  PrefillConfig dense;
  dense.dense = true;
  dense.attention_backend = Backend::reference;
  PrefillResult res;
  const Out d = run_prefill(in, dense, &res);
  EXPECT_TRUE(testing::close_enough("dense", testing::compare(d.out.view(), want.out.view()), 1e-6));
  EXPECT_EQ(res.stats.density, 1.0);
  EXPECT_TRUE(res.estimate.mask.row_ptr.empty());  // no estimate ran
  PrefillConfig all;
  all.estimate.tau = 1.0;
  all.estimate.block = 64;
  all.attention_backend = Backend::reference;
  const Out a = run_prefill(in, all, &res);
  EXPECT_TRUE(testing::close_enough("tau=1", testing::compare(a.out.view(), want.out.view()), 1e-6));
  EXPECT_TRUE(testing::lse_close(a.lse.view(), want.lse.view(), 1e-6));
  EXPECT_DOUBLE_EQ(res.stats.density, 1.0);
}

TEST(Prefill, RejectsNonCausalPatternsAndSinks) {
  const Inputs in = testing::make_inputs(prefill_case({64}, {}, 23));
  Buffer out(DType::f32, {64, 4, 32});
  AttentionParams p = in.params;
  p.out = out.view();
  PrefillConfig cfg;
  cfg.attention_backend = Backend::reference;
  p.pattern = Pattern::full();
  EXPECT_THROW(prefill(p, cfg), Error);
  p.pattern = Pattern::causal();
  p.sink_mode = SinkMode::denominator;
  Buffer sink(DType::f32, {4});
  sink.fill(0.f);
  p.sink = sink.view();
  EXPECT_THROW(prefill(p, cfg), Error);
  p.sink_mode = SinkMode::none;
  p.sink = TensorView{};
  cfg.estimate.stride = 7;
  EXPECT_THROW(prefill(p, cfg), Error);
}

}  // namespace
}  // namespace ariadne
