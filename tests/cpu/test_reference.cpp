// Properties of the exact reference. Each property compares two reference runs that must
// agree; the hand-computed cases pin the absolute values.
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "common.hpp"

namespace ariadne {
namespace {

using testing::Case;
using testing::Inputs;
using testing::Result;

constexpr float kInf = std::numeric_limits<float>::infinity();

// Reference run of `in` with its params replaced by `p` (same inputs, other pattern or sink).
Result run_with(const Inputs& in, const AttentionParams& p) {
  Result r;
  r.out = Buffer(DType::f32, {p.q.shape[0], p.q.shape[1], p.q.shape[2]});
  r.lse = Buffer(DType::f32, {p.q.shape[1], p.q.shape[0]});
  r.out.fill(std::numeric_limits<float>::quiet_NaN());
  AttentionParams a = p;
  a.out = r.out.view();
  a.lse = r.lse.view();
  attention(a, Backend::reference);
  return r;
}

void expect_identical(const Buffer& a, const Buffer& b, const char* what) {
  ASSERT_EQ(a.numel(), b.numel());
  const float* x = a.as<float>();
  const float* y = b.as<float>();
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (std::isinf(x[i]) && std::isinf(y[i]) && (x[i] > 0) == (y[i] > 0)) continue;
    ASSERT_EQ(x[i], y[i]) << what << " differs at element " << i;
  }
}

Case base_case(const char* name, std::vector<int64_t> seqs, uint64_t seed = 1) {
  Case c;
  c.name = name;
  c.seq_q = std::move(seqs);
  c.heads_q = 4;
  c.heads_kv = 2;
  c.dim = 16;
  c.seed = seed;
  return c;
}

TEST(Reference, HandComputedTwoKeys) {
  // d = 1, scale 1: q = 1, k = (0, ln 3), v = (1, 5) -> weights (1/4, 3/4), out 4, lse ln 4.
  float q[1] = {1.f}, k[2] = {0.f, std::log(3.f)}, v[2] = {1.f, 5.f}, out[1], lse[1], sink[1];
  AttentionParams p;
  p.q = make_view(q, DType::f32, {1, 1, 1});
  p.k = make_view(k, DType::f32, {2, 1, 1});
  p.v = make_view(v, DType::f32, {2, 1, 1});
  p.out = make_view(out, DType::f32, {1, 1, 1});
  p.lse = make_view(lse, DType::f32, {1, 1});
  p.scale = 1.f;
  attention(p, Backend::reference);
  EXPECT_NEAR(out[0], 4.0f, 1e-6);
  EXPECT_NEAR(lse[0], std::log(4.f), 1e-6);

  // Denominator sink ln 4: Z = 4 + 4 = 8 -> out (1·1 + 3·5) / 8 = 2, lse ln 8.
  sink[0] = std::log(4.f);
  p.sink_mode = SinkMode::denominator;
  p.sink = make_view(sink, DType::f32, {1});
  attention(p, Backend::reference);
  EXPECT_NEAR(out[0], 2.0f, 1e-6);
  EXPECT_NEAR(lse[0], std::log(8.f), 1e-6);

  // Key-0 bias ln 3: logits (ln 3, ln 3) -> out (1 + 5) / 2 = 3, lse ln 6.
  sink[0] = std::log(3.f);
  p.sink_mode = SinkMode::key0_bias;
  attention(p, Backend::reference);
  EXPECT_NEAR(out[0], 3.0f, 1e-6);
  EXPECT_NEAR(lse[0], std::log(6.f), 1e-6);
}

TEST(Reference, HandComputedCausalAndWindow) {
  // Three tokens, d = 1, q = k = 0: uniform over the allowed keys; v = (1, 2, 4).
  float q[3] = {0, 0, 0}, k[3] = {0, 0, 0}, v[3] = {1, 2, 4}, out[3], lse[3];
  AttentionParams p;
  p.q = make_view(q, DType::f32, {3, 1, 1});
  p.k = make_view(k, DType::f32, {3, 1, 1});
  p.v = make_view(v, DType::f32, {3, 1, 1});
  p.out = make_view(out, DType::f32, {3, 1, 1});
  p.lse = make_view(lse, DType::f32, {1, 3});
  p.pattern = Pattern::causal();
  attention(p, Backend::reference);
  EXPECT_FLOAT_EQ(out[0], 1.f);
  EXPECT_FLOAT_EQ(out[1], 1.5f);
  EXPECT_FLOAT_EQ(out[2], 7.f / 3.f);
  EXPECT_NEAR(lse[2], std::log(3.f), 1e-6);
  p.pattern = Pattern::window(0, 1);  // each token sees itself and the next one
  attention(p, Backend::reference);
  EXPECT_FLOAT_EQ(out[0], 1.5f);
  EXPECT_FLOAT_EQ(out[1], 3.f);
  EXPECT_FLOAT_EQ(out[2], 4.f);
  p.pattern = Pattern::chunked(2);  // chunks {0,1}, {2}
  attention(p, Backend::reference);
  EXPECT_FLOAT_EQ(out[0], 1.5f);
  EXPECT_FLOAT_EQ(out[1], 1.5f);
  EXPECT_FLOAT_EQ(out[2], 4.f);
}

TEST(Reference, WindowCoveringEverythingEqualsFull) {
  Inputs in = testing::make_inputs(base_case("w", {37, 1, 20}, 3));
  AttentionParams w = in.params;
  w.pattern.window_left = 40;
  w.pattern.window_right = 36;
  expect_identical(run_with(in, in.params).out, run_with(in, w).out, "out");
}

TEST(Reference, OneChunkEqualsFull) {
  Inputs in = testing::make_inputs(base_case("c", {50}, 4));
  AttentionParams c = in.params;
  c.pattern.chunk = 64;
  const Result a = run_with(in, in.params), b = run_with(in, c);
  expect_identical(a.out, b.out, "out");
  expect_identical(a.lse, b.lse, "lse");
}

TEST(Reference, AllBlocksEqualsDense) {
  for (Pattern dense : {Pattern::full(), Pattern::causal(), Pattern::window(9, 3)}) {
    Case c = base_case("b", {70, 33}, 5);
    c.pattern = dense;
    Inputs in = testing::make_inputs(c);
    BlockMask all = BlockMask::all_visible(in.params.pattern, 16, 4, in.total_q, in.total_k);
    AttentionParams b = in.params;
    b.pattern = b.pattern.with_blocks(all.view());
    const Result x = run_with(in, in.params), y = run_with(in, b);
    expect_identical(x.out, y.out, "out");
    expect_identical(x.lse, y.lse, "lse");
  }
}

TEST(Reference, SinkMinusInfinityEqualsNoSink) {
  Case c = base_case("s", {40, 9}, 6);
  c.pattern = Pattern::window(5, 5);
  c.sink_mode = SinkMode::denominator;
  c.sink_value = -kInf;
  Inputs in = testing::make_inputs(c);
  AttentionParams none = in.params;
  none.sink_mode = SinkMode::none;
  const Result a = run_with(in, in.params), b = run_with(in, none);
  expect_identical(a.out, b.out, "out");
  expect_identical(a.lse, b.lse, "lse");
}

TEST(Reference, SinkCorrectionMatchesSinkAwareResult) {
  // o' = o · σ(LSE − s) and LSE' = logaddexp(LSE, s) (SPEC C.3).
  Case c = base_case("sc", {33, 64}, 7);
  c.pattern = Pattern::causal();
  c.sink_mode = SinkMode::denominator;
  c.sink_value = std::numeric_limits<float>::quiet_NaN();  // random per head
  Inputs in = testing::make_inputs(c);
  AttentionParams none = in.params;
  none.sink_mode = SinkMode::none;
  const Result with = run_with(in, in.params), without = run_with(in, none);
  for (int64_t i = 0; i < in.total_q; ++i)
    for (int h = 0; h < 4; ++h) {
      const double s = in.sink.as<float>()[h], lse = without.lse.as<float>()[h * in.total_q + i];
      const double sig = 1 / (1 + std::exp(s - lse));
      for (int d = 0; d < 16; ++d) {
        const double o = without.out.view().get({i, h, d}), o2 = with.out.view().get({i, h, d});
        EXPECT_NEAR(o * sig, o2, 1e-6 * (1 + std::abs(o2)));
      }
      const double lse2 = std::max(lse, s) + std::log1p(std::exp(-std::abs(lse - s)));
      EXPECT_NEAR(with.lse.as<float>()[h * in.total_q + i], lse2, 1e-5 * (1 + std::abs(lse2)));
    }
}

TEST(Reference, GqaEqualsRepeatedKv) {
  Case c = base_case("g", {45}, 8);
  c.heads_q = 8;
  c.heads_kv = 2;
  c.pattern = Pattern::window(7, 2);
  Inputs in = testing::make_inputs(c);
  // Repeat each KV head 4 times into an 8-head K/V.
  Buffer k8(DType::f32, {in.total_k, 8, 16}), v8(DType::f32, {in.total_k, 8, 16});
  for (int64_t t = 0; t < in.total_k; ++t)
    for (int h = 0; h < 8; ++h)
      for (int d = 0; d < 16; ++d) {
        k8.view().set({t, h, d}, in.params.k.get({t, h / 4, d}));
        v8.view().set({t, h, d}, in.params.v.get({t, h / 4, d}));
      }
  AttentionParams rep = in.params;
  rep.k = k8.view();
  rep.v = v8.view();
  expect_identical(run_with(in, in.params).out, run_with(in, rep).out, "out");
}

TEST(Reference, PermutingQueriesPermutesOutputsAndKeysDoNotMatter) {
  // Full attention is equivariant in queries and invariant in keys: permute both with one random
  // permutation and the output rows follow the permutation.
  Inputs in = testing::make_inputs(base_case("p", {31}, 9));
  std::vector<int64_t> perm(31);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(9));
  auto permuted = [&](const TensorView& t) {
    Buffer b(DType::f32, {t.shape[0], t.shape[1], t.shape[2]});
    for (int64_t i = 0; i < t.shape[0]; ++i)
      for (int64_t h = 0; h < t.shape[1]; ++h)
        for (int64_t d = 0; d < t.shape[2]; ++d) b.view().set({i, h, d}, t.get({perm[size_t(i)], h, d}));
    return b;
  };
  Buffer q = permuted(in.params.q), k = permuted(in.params.k), v = permuted(in.params.v);
  AttentionParams pp = in.params;
  pp.q = q.view();
  pp.k = k.view();
  pp.v = v.view();
  const Result a = run_with(in, in.params), b = run_with(in, pp);
  for (int64_t i = 0; i < 31; ++i)
    for (int h = 0; h < 4; ++h)
      for (int d = 0; d < 16; ++d)
        EXPECT_NEAR(b.out.view().get({i, h, d}), a.out.view().get({perm[size_t(i)], h, d}), 1e-6);
}

TEST(Reference, VarlenEqualsSeparateCalls) {
  Case c = base_case("v", {19, 1, 40, 0, 7}, 10);
  c.seq_k = {25, 3, 40, 5, 7};  // lq <= lk: bottom-right aligned causal
  c.pattern = Pattern::causal();
  c.sink_mode = SinkMode::key0_bias;
  c.sink_value = 1.5f;
  Inputs in = testing::make_inputs(c);
  const Result packed = run_with(in, in.params);
  for (size_t s = 0; s + 1 < in.cu_q.size(); ++s) {
    const int64_t q0 = in.cu_q[s], lq = in.cu_q[s + 1] - q0, k0 = in.cu_k[s], lk = in.cu_k[s + 1] - k0;
    if (lq == 0) continue;
    AttentionParams one = in.params;
    one.pattern = Pattern::causal();
    one.q.data = static_cast<float*>(one.q.data) + q0 * one.q.stride[0];
    one.q.shape[0] = lq;
    one.k.data = static_cast<float*>(one.k.data) + k0 * one.k.stride[0];
    one.k.shape[0] = lk;
    one.v.data = static_cast<float*>(one.v.data) + k0 * one.v.stride[0];
    one.v.shape[0] = lk;
    const Result r = run_with(in, one);
    for (int64_t i = 0; i < lq; ++i)
      for (int h = 0; h < 4; ++h) {
        for (int d = 0; d < 16; ++d)
          ASSERT_EQ(r.out.view().get({i, h, d}), packed.out.view().get({q0 + i, h, d})) << "sequence " << s;
        ASSERT_EQ(r.lse.view().get({h, i}), packed.lse.view().get({h, q0 + i}));
      }
  }
}

TEST(Reference, FullyMaskedRowsGiveZeroAndMinusInfinity) {
  // Causal with lq > lk: the first lq − lk queries sit before key 0 and see nothing.
  Case c = base_case("m", {12});
  c.seq_k = {5};
  c.pattern = Pattern::causal();
  Inputs in = testing::make_inputs(c);
  const Result r = run_with(in, in.params);
  for (int64_t i = 0; i < 12; ++i)
    for (int h = 0; h < 4; ++h) {
      const float lse = r.lse.view().get({h, i});
      if (i < 7) {
        EXPECT_TRUE(std::isinf(lse) && lse < 0) << "row " << i;
        for (int d = 0; d < 16; ++d) EXPECT_EQ(r.out.view().get({i, h, d}), 0.f);
      } else {
        EXPECT_TRUE(std::isfinite(lse)) << "row " << i;
      }
    }
  // With a denominator sink the masked rows still output 0 and their LSE is the sink.
  c.sink_mode = SinkMode::denominator;
  c.sink_value = 2.5f;
  Inputs in2 = testing::make_inputs(c);
  const Result r2 = run_with(in2, in2.params);
  EXPECT_FLOAT_EQ(r2.lse.view().get({0, 0}), 2.5f);
  EXPECT_EQ(r2.out.view().get({0, 0, 0}), 0.f);
}

TEST(Reference, EmptyBlockRowsAreFullyMasked) {
  Case c = base_case("e", {40});
  c.block = 16;
  c.pattern = Pattern::causal();
  Inputs in = testing::make_inputs(c);
  std::vector<std::vector<int32_t>> rows(size_t(3 * 4));
  for (int h = 0; h < 4; ++h) rows[size_t(h * 3 + 0)] = {0};  // query block 0 keeps its diagonal; 1 and 2 keep nothing
  BlockMask m = BlockMask::from_lists(16, 4, {40}, rows);
  AttentionParams p = in.params;
  p.pattern = p.pattern.with_blocks(m.view());
  const Result r = run_with(in, p);
  for (int64_t i = 16; i < 40; ++i) {
    EXPECT_TRUE(std::isinf(r.lse.view().get({1, i})));
    EXPECT_EQ(r.out.view().get({i, 1, 3}), 0.f);
  }
  EXPECT_TRUE(std::isfinite(r.lse.view().get({1, 15})));
}

TEST(Reference, StridedViewsEqualDenseCopies) {
  Case c = base_case("st", {29, 17}, 12);
  c.token_pad = 5;
  c.pattern = Pattern::window(4, 4);
  Inputs in = testing::make_inputs(c);
  auto dense = [](const TensorView& t) {
    Buffer b(DType::f32, {t.shape[0], t.shape[1], t.shape[2]});
    for (int64_t i = 0; i < t.shape[0]; ++i)
      for (int64_t h = 0; h < t.shape[1]; ++h)
        for (int64_t d = 0; d < t.shape[2]; ++d) b.view().set({i, h, d}, t.get({i, h, d}));
    return b;
  };
  Buffer q = dense(in.params.q), k = dense(in.params.k), v = dense(in.params.v);
  AttentionParams d = in.params;
  d.q = q.view();
  d.k = k.view();
  d.v = v.view();
  expect_identical(run_with(in, in.params).out, run_with(in, d).out, "out");
}

TEST(Reference, DiagnosticsOnUniformRows) {
  // q = 0: every allowed key gets equal weight. A 1x4 grid, window ±1: token 0 sees {0,1},
  // tokens 1 and 2 see three keys, token 3 sees {2,3}.
  float q[4] = {0, 0, 0, 0}, k[4] = {1, 2, 3, 4}, v[4] = {0, 0, 0, 0}, out[4];
  float ent[4], dist[4], recv[4], coords[8] = {0, 0, 0, 1, 0, 2, 0, 3};
  AttentionParams p;
  p.q = make_view(q, DType::f32, {4, 1, 1});
  p.k = make_view(k, DType::f32, {4, 1, 1});
  p.v = make_view(v, DType::f32, {4, 1, 1});
  p.out = make_view(out, DType::f32, {4, 1, 1});
  p.entropy = make_view(ent, DType::f32, {1, 4});
  p.distance = make_view(dist, DType::f32, {1, 4});
  p.received = make_view(recv, DType::f32, {1, 4});
  p.coords_q = make_view(coords, DType::f32, {4, 2});
  p.coords_k = p.coords_q;
  p.pattern = Pattern::window(1, 1);
  attention(p, Backend::reference);
  EXPECT_NEAR(ent[0], std::log(2.0), 1e-6);
  EXPECT_NEAR(ent[1], std::log(3.0), 1e-6);
  EXPECT_NEAR(dist[0], 0.5, 1e-6);
  EXPECT_NEAR(dist[1], 2.0 / 3.0, 1e-6);
  // received: key 0 from tokens 0 (1/2) and 1 (1/3); key 1 from 0, 1, 2.
  EXPECT_NEAR(recv[0], 0.5 + 1.0 / 3, 1e-6);
  EXPECT_NEAR(recv[1], 0.5 + 2.0 / 3, 1e-6);
  EXPECT_NEAR(recv[0] + recv[1] + recv[2] + recv[3], 4.0, 1e-5);  // rows sum to 1
}

TEST(Reference, ReceivedLosesTheSinkMass) {
  Case c = base_case("r", {24});
  c.sink_mode = SinkMode::denominator;
  c.sink_value = 1.0f;
  Inputs in = testing::make_inputs(c);
  Buffer recv(DType::f32, {4, in.total_k}), out(DType::f32, {in.total_q, 4, 16}), lse(DType::f32, {4, in.total_q});
  AttentionParams p = in.params;
  p.received = recv.view();
  p.out = out.view();
  p.lse = lse.view();
  attention(p, Backend::reference);
  for (int h = 0; h < 4; ++h) {
    double col_total = 0, row_total = 0;
    for (int64_t j = 0; j < in.total_k; ++j) col_total += recv.view().get({h, j});
    for (int64_t i = 0; i < in.total_q; ++i) row_total += 1 - std::exp(1.0 - lse.view().get({h, i}));  // 1 − sink share
    EXPECT_NEAR(col_total, row_total, 1e-4);
  }
}

}  // namespace
}  // namespace ariadne
