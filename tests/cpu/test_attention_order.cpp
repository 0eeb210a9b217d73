// AttentionParams::order on the host backends: checked against a direct softmax written here, which
// applies the pattern to logical indices and reads q, k, v at their stored rows (no gather), so it
// shares no code with the gather/scatter path under test.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>

#include "ariadne/order.hpp"
#include "common.hpp"

namespace ariadne {
namespace {

// out[stored row, h, :] and lse[h, stored row] in double, straight from the definition.
testing::Result direct(const testing::Inputs& in, const std::vector<int32_t>& order) {
  const AttentionParams& p = in.params;
  const int64_t n = in.total_q;
  const int hq = p.heads_q(), group = hq / p.heads_kv(), d = p.head_dim();
  const double scale = p.resolved_scale();
  testing::Result r{Buffer(DType::f32, {n, hq, d}), Buffer(DType::f32, {hq, n})};
  const SeqExtent e = p.pattern.seq(0, n, n);
  std::vector<double> s(static_cast<size_t>(n)), acc(static_cast<size_t>(d));
  for (int h = 0; h < hq; ++h)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t qi = order[size_t(i)];
      double m = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        s[size_t(j)] = -INFINITY;
        if (!p.pattern.allowed(0, e, h, i, j)) continue;
        double dot = 0;
        for (int c = 0; c < d; ++c) dot += double(p.q.get({qi, h, c})) * p.k.get({order[size_t(j)], h / group, c});
        s[size_t(j)] = dot * scale;
        m = std::max(m, s[size_t(j)]);
      }
      const double sink = p.sink_mode == SinkMode::denominator ? double(p.sink.get({h})) : -INFINITY;
      m = std::max(m, sink);
      double z = std::isfinite(sink) ? std::exp(sink - m) : 0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j < n; ++j) {
        if (!std::isfinite(s[size_t(j)])) continue;
        const double w = std::exp(s[size_t(j)] - m);
        z += w;
        for (int c = 0; c < d; ++c) acc[size_t(c)] += w * p.v.get({order[size_t(j)], h / group, c});
      }
      for (int c = 0; c < d; ++c) r.out.view().set({qi, h, c}, float(acc[size_t(c)] / z));
      r.lse.view().set({h, qi}, float(m + std::log(z)));
    }
  return r;
}

struct OrderCase {
  const char* name;
  Pattern pattern;
  int heads_q, heads_kv;
  SinkMode sink;
  DType dtype;
};

class HostOrder : public ::testing::TestWithParam<OrderCase> {};

TEST_P(HostOrder, MatchesDirectSoftmax) {
  const OrderCase& oc = GetParam();
  // A 6 x 10 grid in column-major order over row-major storage, Ariadne's alternate layers.
  const std::vector<Grid> grids{{6, 10}};
  const TokenOrder raster = make_order(OrderKind::raster, grids), col = make_order(OrderKind::block_col, grids);
  const std::vector<int32_t> order = order_conversion(raster, col);
  ASSERT_EQ(order.size(), size_t(60));

  testing::Case c;
  c.name = oc.name;
  c.seq_q = {60};
  c.heads_q = oc.heads_q;
  c.heads_kv = oc.heads_kv;
  c.dim = 24;
  c.pattern = oc.pattern;
  c.sink_mode = oc.sink;
  c.sink_value = std::nanf("");
  c.dtype = oc.dtype;
  c.token_pad = 3;  // strided rows: the gather must honour the token stride
  c.seed = 17;
  testing::Inputs in = testing::make_inputs(c);
  const testing::Result want = direct(in, order);
  const double tol = testing::tolerance(c.dtype, testing::max_abs_logit(in));

  for (Backend b : {Backend::reference, Backend::cpu}) {
    SCOPED_TRACE(backend_name(b));
    Buffer out(c.dtype, {in.total_q, c.heads_q, c.dim}), lse(DType::f32, {c.heads_q, in.total_q});
    out.fill(NAN);
    lse.fill(NAN);
    AttentionParams p = in.params;
    p.out = out.view();
    p.lse = lse.view();
    p.order = order.data();
    attention(p, b);
    EXPECT_TRUE(testing::close_enough("out", testing::compare(out.view(), want.out.view()), tol));
    EXPECT_TRUE(testing::lse_close(lse.view(), want.lse.view(), tol));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, HostOrder,
    ::testing::Values(OrderCase{"window3", Pattern::window(3, 3), 2, 2, SinkMode::none, DType::f32},
                      OrderCase{"window5_2_sink_gqa", Pattern::window(5, 2), 4, 2, SinkMode::denominator, DType::f32},
                      OrderCase{"causal_bf16", Pattern::causal(), 2, 1, SinkMode::none, DType::bf16},
                      OrderCase{"chunk8", Pattern::chunked(8), 2, 2, SinkMode::denominator, DType::f32}),
    [](const auto& info) { return std::string(info.param.name); });

// Diagnostics follow the order too: per-query statistics land at the query's stored row and received
// attention at the key's stored row, so permuting storage and order together changes nothing.
TEST(HostOrder, DiagnosticsFollowStoredRows) {
  testing::Case c;
  c.seq_q = {40};
  c.dim = 16;
  c.heads_q = c.heads_kv = 2;
  c.pattern = Pattern::window(4, 4);
  testing::Inputs in = testing::make_inputs(c);
  std::vector<int32_t> order(40);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(5));

  // Run 1: logical rows stored at order[i]. Run 2: the same logical tensors stored contiguously.
  Buffer cq(DType::f32, {40, 2});
  for (int64_t r = 0; r < 40; ++r) cq.view().set({r, 0}, float(r % 7)), cq.view().set({r, 1}, float(r / 7));
  auto run = [&](const AttentionParams& base, const int32_t* ord, Buffer& ent, Buffer& dist, Buffer& recv) {
    Buffer out(DType::f32, {40, 2, 16});
    AttentionParams p = base;
    p.out = out.view();
    p.entropy = ent.view();
    p.distance = dist.view();
    p.received = recv.view();
    p.coords_q = p.coords_k = cq.view();
    p.order = ord;
    attention(p, Backend::cpu);
  };
  Buffer e1(DType::f32, {2, 40}), d1(DType::f32, {2, 40}), r1(DType::f32, {2, 40});
  run(in.params, order.data(), e1, d1, r1);

  // Logical copies: row i of q2/k2/v2 = stored row order[i]; coords likewise.
  Buffer q2(DType::f32, {40, 2, 16}), k2(DType::f32, {40, 2, 16}), v2(DType::f32, {40, 2, 16});
  for (int64_t i = 0; i < 40; ++i)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t x = 0; x < 16; ++x) {
        q2.view().set({i, h, x}, in.params.q.get({order[size_t(i)], h, x}));
        k2.view().set({i, h, x}, in.params.k.get({order[size_t(i)], h, x}));
        v2.view().set({i, h, x}, in.params.v.get({order[size_t(i)], h, x}));
      }
  Buffer cq_logical(DType::f32, {40, 2});
  for (int64_t i = 0; i < 40; ++i)
    for (int64_t x = 0; x < 2; ++x) cq_logical.view().set({i, x}, cq.view().get({order[size_t(i)], x}));
  AttentionParams plain = in.params;
  plain.q = q2.view();
  plain.k = k2.view();
  plain.v = v2.view();
  Buffer e2(DType::f32, {2, 40}), d2(DType::f32, {2, 40}), r2(DType::f32, {2, 40});
  {
    Buffer out(DType::f32, {40, 2, 16});
    AttentionParams p = plain;
    p.out = out.view();
    p.entropy = e2.view();
    p.distance = d2.view();
    p.received = r2.view();
    p.coords_q = p.coords_k = cq_logical.view();
    attention(p, Backend::cpu);
  }
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 40; ++i) {
      const int64_t r = order[size_t(i)];
      EXPECT_EQ(e1.view().get({h, r}), e2.view().get({h, i}));
      EXPECT_EQ(d1.view().get({h, r}), d2.view().get({h, i}));
      EXPECT_EQ(r1.view().get({h, r}), r2.view().get({h, i}));
    }
}

TEST(HostOrder, RejectsNonPermutations) {
  testing::Case c;
  c.seq_q = {8};
  testing::Inputs in = testing::make_inputs(c);
  Buffer out(DType::f32, {8, c.heads_q, c.dim});
  AttentionParams p = in.params;
  p.out = out.view();
  std::vector<int32_t> dup{0, 1, 2, 3, 4, 5, 6, 6}, range{0, 1, 2, 3, 4, 5, 6, 8};
  for (const auto* bad : {&dup, &range}) {
    p.order = bad->data();
    try {
      attention(p, Backend::cpu);
      ADD_FAILURE() << "accepted a non-permutation";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("order["), std::string::npos) << e.what();
    }
  }
  // Different query and key counts cannot share one order.
  testing::Case ck = c;
  ck.seq_k = {9};
  testing::Inputs in2 = testing::make_inputs(ck);
  AttentionParams p2 = in2.params;
  p2.out = out.view();
  std::vector<int32_t> ok{0, 1, 2, 3, 4, 5, 6, 7};
  p2.order = ok.data();
  EXPECT_THROW(attention(p2, Backend::reference), Error);
}

}  // namespace
}  // namespace ariadne
