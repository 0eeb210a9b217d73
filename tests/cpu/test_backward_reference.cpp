// The reference backward against central finite differences of an independent double forward
// (written here from the formulas of attention.hpp, not from the library), on every pattern, both
// sink forms, GQA, varlen with lq < lk, block-sparse masks with fully masked rows and token orders.
// Then the plan/run contract and the errors of bad gradients.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "ariadne/attention_backward.hpp"
#include "common.hpp"

namespace ariadne::testing {
namespace {

// An attention problem in double with its own forward (the FD oracle).
struct Problem {
  Case c;
  Inputs in;
  std::vector<int32_t> order;  // empty: none
  std::vector<double> q, k, v, sink, w;  // w: the upstream gradient dout (the loss is Σ w · out)

  int64_t tq() const { return in.total_q; }
  int64_t tk() const { return in.total_k; }

  // L = Σ w · out, out from the formulas: scores over the pattern's visible keys (logical rows,
  // stored at order[i]), a denominator sink in the normalizer or a key-0 bias on local key 0.
  double loss() const {
    const Pattern& pat = in.params.pattern;
    const int hq = c.heads_q, group = c.heads_q / c.heads_kv, d = c.dim;
    const double scale = 1.0 / std::sqrt(double(d));
    auto row = [&](int64_t logical) { return order.empty() ? logical : int64_t(order[size_t(logical)]); };
    double L = 0;
    for (int32_t s = 0; s < pat.num_seqs; ++s) {
      const SeqExtent e = pat.seq(s, tq(), tk());
      for (int h = 0; h < hq; ++h) {
        const int g = h / group;
        for (int64_t iq = 0; iq < e.lq; ++iq) {
          const int64_t qr = row(e.q0 + iq);
          std::vector<double> sc;
          std::vector<int64_t> keys;
          for (int64_t ik = 0; ik < e.lk; ++ik) {
            if (!pat.allowed(s, e, h, iq, ik)) continue;
            const int64_t kr = row(e.k0 + ik);
            double x = 0;
            for (int c2 = 0; c2 < d; ++c2) x += q[size_t((qr * hq + h) * d + c2)] * k[size_t((kr * c.heads_kv + g) * d + c2)];
            x *= scale;
            if (c.sink_mode == SinkMode::key0_bias && ik == 0) x += sink[size_t(h)];
            sc.push_back(x);
            keys.push_back(kr);
          }
          if (sc.empty()) continue;
          double m = *std::max_element(sc.begin(), sc.end());
          if (c.sink_mode == SinkMode::denominator) m = std::max(m, sink[size_t(h)]);
          double z = c.sink_mode == SinkMode::denominator ? std::exp(sink[size_t(h)] - m) : 0.0;
          for (double x : sc) z += std::exp(x - m);
          for (size_t j = 0; j < sc.size(); ++j) {
            const double a = std::exp(sc[j] - m) / z;
            for (int c2 = 0; c2 < d; ++c2)
              L += a * v[size_t((keys[j] * c.heads_kv + g) * d + c2)] * w[size_t((qr * hq + h) * d + c2)];
          }
        }
      }
    }
    return L;
  }
};

std::vector<double> to_double(const Buffer& b) {
  std::vector<double> out(size_t(b.numel()));
  for (int64_t i = 0; i < b.numel(); ++i) out[size_t(i)] = b.as<float>()[i];
  return out;
}

Problem make_problem(const Case& c, bool shuffled) {
  Problem P;
  P.c = c;
  P.in = make_inputs(c);
  if (shuffled) {
    P.order.resize(size_t(P.in.total_q));
    std::iota(P.order.begin(), P.order.end(), 0);
    std::shuffle(P.order.begin(), P.order.end(), std::mt19937(unsigned(c.seed)));
    P.in.params.order = P.order.data();
  }
  P.q = to_double(P.in.q);
  P.k = to_double(P.in.k);
  P.v = to_double(P.in.v);
  if (c.sink_mode != SinkMode::none) P.sink = to_double(P.in.sink);
  std::mt19937_64 rng(c.seed * 77 + 5);
  std::uniform_real_distribution<double> u(-1, 1);
  P.w.resize(size_t(P.in.total_q * c.heads_q * c.dim));
  for (double& x : P.w) x = float(u(rng));
  return P;
}

// The library's gradients of P (f32 buffers), from a reference forward and backward.
struct Grads {
  Buffer out, lse, dout, dq, dk, dv, dsink;
};

Grads library_grads(Problem& P, Backend backend = Backend::reference) {
  const Case& c = P.c;
  Grads G;
  G.out = Buffer(DType::f32, {P.tq(), c.heads_q, c.dim});
  G.lse = Buffer(DType::f32, {c.heads_q, P.tq()});
  G.dout = Buffer(DType::f32, {P.tq(), c.heads_q, c.dim});
  for (size_t i = 0; i < P.w.size(); ++i) G.dout.as<float>()[i] = float(P.w[i]);
  G.dq = Buffer(DType::f32, {P.tq(), c.heads_q, c.dim});
  G.dk = Buffer(DType::f32, {P.tk(), c.heads_kv, c.dim});
  G.dv = Buffer(DType::f32, {P.tk(), c.heads_kv, c.dim});
  for (Buffer* b : {&G.dq, &G.dk, &G.dv}) b->fill(std::numeric_limits<float>::quiet_NaN());
  AttentionParams p = P.in.params;
  p.out = G.out.view();
  p.lse = G.lse.view();
  attention(p, Backend::reference);
  AttentionGrads g;
  g.dout = G.dout.view();
  g.dq = G.dq.view();
  g.dk = G.dk.view();
  g.dv = G.dv.view();
  if (c.sink_mode != SinkMode::none) {
    G.dsink = Buffer(DType::f32, {c.heads_q});
    G.dsink.fill(std::numeric_limits<float>::quiet_NaN());
    g.dsink = G.dsink.view();
  }
  attention_backward(p, g, backend);
  return G;
}

// Central differences of P.loss() in every coordinate of `x`, against `got`.
void expect_fd(Problem& P, std::vector<double>& x, const Buffer& got, const char* what) {
  const double eps = 1e-5;
  double worst = 0, scale = 1e-3;
  std::vector<double> fd(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + eps;
    const double lp = P.loss();
    x[i] = x0 - eps;
    const double lm = P.loss();
    x[i] = x0;
    fd[i] = (lp - lm) / (2 * eps);
    scale = std::max(scale, std::abs(fd[i]));
  }
  for (size_t i = 0; i < x.size(); ++i) {
    const double g = got.as<float>()[i];
    ASSERT_TRUE(std::isfinite(g)) << what << "[" << i << "] is " << g;
    worst = std::max(worst, std::abs(g - fd[i]));
  }
  // f32 gradients (2^-24 relative) and O(eps²) truncation: 1e-5 of the largest entry is far above
  // both and far below any missing or misplaced term.
  EXPECT_LE(worst, 1e-5 * scale) << what << ": worst |backward - finite difference| " << worst << " of " << scale;
}

void check_case(const Case& c, bool shuffled = false) {
  SCOPED_TRACE(c.name + (shuffled ? " (shuffled order)" : ""));
  Problem P = make_problem(c, shuffled);
  const Grads G = library_grads(P);
  expect_fd(P, P.q, G.dq, "dq");
  expect_fd(P, P.k, G.dk, "dk");
  expect_fd(P, P.v, G.dv, "dv");
  if (c.sink_mode != SinkMode::none) expect_fd(P, P.sink, G.dsink, "dsink");
}

Case small(const char* name, Pattern pat, std::vector<int64_t> lq = {13}, std::vector<int64_t> lk = {}) {
  Case c;
  c.name = name;
  c.seq_q = std::move(lq);
  c.seq_k = std::move(lk);
  c.heads_q = 2;
  c.heads_kv = 2;
  c.dim = 5;
  c.pattern = pat;
  c.seed = 3;
  return c;
}

TEST(BackwardReference, FullMatchesFiniteDifferences) { check_case(small("full", Pattern::full())); }
TEST(BackwardReference, CausalMatchesFiniteDifferences) { check_case(small("causal", Pattern::causal())); }
TEST(BackwardReference, WindowMatchesFiniteDifferences) { check_case(small("window(3,2)", Pattern::window(3, 2))); }
TEST(BackwardReference, ChunkMatchesFiniteDifferences) { check_case(small("chunk(5)", Pattern::chunked(5))); }

TEST(BackwardReference, VarlenShorterQueriesMatchFiniteDifferences) {
  check_case(small("varlen causal lq<lk", Pattern::causal(), {4, 1, 7}, {9, 3, 7}));
}

TEST(BackwardReference, BlockSparseWithMaskedRowsMatchesFiniteDifferences) {
  Case c = small("blocks", Pattern::full(), {12, 9});
  c.block = 3;
  c.block_density = 0.4;
  // The sampled mask must leave some rows without a key, so that their zero terms are exercised.
  const Inputs in = make_inputs(c);
  bool empty_row = false;
  for (int64_t r = 0; r < in.mask.rows(); ++r) empty_row |= in.mask.row_ptr[size_t(r + 1)] == in.mask.row_ptr[size_t(r)];
  ASSERT_TRUE(empty_row) << "seed " << c.seed << " gives no fully masked block row; pick another";
  check_case(c);
}

TEST(BackwardReference, DenominatorSinkMatchesFiniteDifferences) {
  Case c = small("causal sink", Pattern::causal());
  c.sink_mode = SinkMode::denominator;
  c.sink_value = std::numeric_limits<float>::quiet_NaN();  // random per head
  check_case(c);
}

TEST(BackwardReference, Key0SinkMatchesFiniteDifferences) {
  Case c = small("window key0", Pattern::window(4, 0), {6, 8});
  c.sink_mode = SinkMode::key0_bias;
  c.sink_value = std::numeric_limits<float>::quiet_NaN();
  check_case(c);
}

TEST(BackwardReference, GqaMatchesFiniteDifferences) {
  Case c = small("gqa 4:1 sink", Pattern::window(2, 5));
  c.heads_q = 4;
  c.heads_kv = 1;
  c.sink_mode = SinkMode::denominator;
  c.sink_value = 1.5f;
  check_case(c);
}

TEST(BackwardReference, TokenOrderMatchesFiniteDifferences) {
  Case c = small("shuffled window", Pattern::window(2, 2), {12});
  c.sink_mode = SinkMode::denominator;
  c.sink_value = -0.5f;
  check_case(c, /*shuffled=*/true);
}

TEST(BackwardReference, MaskedRowsGetZeroGradients) {
  // lq > lk with a causal mask: the first lq - lk queries (bottom-right aligned) see no key.
  Case c = small("causal lq>lk", Pattern::causal(), {8}, {5});
  c.sink_mode = SinkMode::denominator;
  c.sink_value = 0.7f;
  Problem P = make_problem(c, false);
  const Grads G = library_grads(P);
  for (int64_t i = 0; i < 3; ++i)
    for (int h = 0; h < c.heads_q; ++h)
      for (int d = 0; d < c.dim; ++d) EXPECT_EQ(G.dq.view().get({i, h, d}), 0.f) << "row " << i;
  expect_fd(P, P.q, G.dq, "dq");
  expect_fd(P, P.sink, G.dsink, "dsink");
}

// ---- the API contract ----

struct Fixture {
  Problem P = make_problem(small("causal", Pattern::causal()), false);
  Grads G = library_grads(P);
  AttentionParams p() {
    AttentionParams a = P.in.params;
    a.out = G.out.view();
    a.lse = G.lse.view();
    return a;
  }
  AttentionGrads g() {
    AttentionGrads r;
    r.dout = G.dout.view();
    r.dq = G.dq.view();
    r.dk = G.dk.view();
    r.dv = G.dv.view();
    return r;
  }
};

TEST(BackwardApi, PlanRunEqualsOneCall) {
  Fixture F;
  Buffer dq(DType::f32, {F.P.tq(), 2, 5});
  AttentionGrads g = F.g();
  g.dq = dq.view();
  BackwardOptions o;
  o.backend = Backend::reference;
  const AttentionBackwardPlan plan = plan_attention_backward(F.p(), g, o);
  EXPECT_TRUE(plan.deterministic());
  EXPECT_EQ(plan.describe(), "reference backward, deterministic");
  run(plan, F.p(), g);
  for (int64_t i = 0; i < dq.numel(); ++i) ASSERT_EQ(dq.as<float>()[i], F.G.dq.as<float>()[i]) << i;
}

TEST(BackwardApi, RunRefusesAMismatchedGradient) {
  Fixture F;
  BackwardOptions o;
  o.backend = Backend::reference;
  const AttentionBackwardPlan plan = plan_attention_backward(F.p(), F.g(), o);
  Buffer dk16(DType::bf16, {F.P.tk(), 2, 5});
  AttentionGrads g = F.g();
  g.dk = dk16.view();
  EXPECT_NE(error_of([&] { run(plan, F.p(), g); }).find("run: dk is bf16"), std::string::npos);
}

TEST(BackwardApi, ErrorsNameTheTensorAndField) {
  Fixture F;
  auto err = [&](AttentionParams p, AttentionGrads g) {
    return error_of([&] { attention_backward(p, g, Backend::reference); });
  };
  AttentionParams p = F.p();
  p.lse = {};
  EXPECT_NE(err(p, F.g()).find("lse: the backward needs"), std::string::npos);

  Buffer wrong(DType::f32, {F.P.tq() + 1, 2, 5});
  AttentionGrads g = F.g();
  g.dq = wrong.view();
  EXPECT_NE(err(F.p(), g).find("dq: dim 0 (tokens) is 14, expected 13 as in q"), std::string::npos) << err(F.p(), g);
  g = F.g();
  g.dout = {};
  EXPECT_NE(err(F.p(), g).find("dout: required"), std::string::npos);

  Buffer ds(DType::f32, {2});
  g = F.g();
  g.dsink = ds.view();
  EXPECT_NE(err(F.p(), g).find("dsink: given, but sink_mode is none"), std::string::npos);

  Buffer recv(DType::f32, {2, F.P.tk()});
  p = F.p();
  p.received = recv.view();
  EXPECT_NE(err(p, F.g()).find("forward diagnostics"), std::string::npos);
}

}  // namespace
}  // namespace ariadne::testing

namespace ariadne::testing {
namespace {

// f64 through the public API (the reference backend, what a float64 gradcheck calls): the forward
// of f32-representable inputs equals the f32 run rounded once, and the backward matches central
// differences of the library's own f64 forward to 1e-6 (an f32 path could not: its rounding alone
// is ~1e-7 of the outputs, ~1e-2 of an FD quotient at this step). The fast backends refuse f64.
TEST(BackwardApi, Float64RunsExactlyOnTheReference) {
  const int64_t n = 9, hq = 2, hkv = 1, d = 4;
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(-1, 1);
  auto f64_buffer = [&](std::vector<int64_t> shape) {
    Buffer b(DType::f64, shape);
    for (int64_t i = 0; i < b.numel(); ++i) b.as<double>()[i] = double(float(u(rng)));  // f32-representable
    return b;
  };
  Buffer q = f64_buffer({n, hq, d}), k = f64_buffer({n, hkv, d}), v = f64_buffer({n, hkv, d}), sink = f64_buffer({hq});
  Buffer out(DType::f64, {n, hq, d}), lse(DType::f32, {hq, n});
  AttentionParams p;
  p.q = q.view();
  p.k = k.view();
  p.v = v.view();
  p.out = out.view();
  p.lse = lse.view();
  p.pattern = Pattern::window(3, 1);
  p.sink_mode = SinkMode::denominator;
  p.sink = sink.view();
  std::string why;
  EXPECT_FALSE(backend_supports(Backend::cpu, p, &why));
  EXPECT_NE(why.find("f64 runs on the reference backend"), std::string::npos) << why;
  EXPECT_EQ(automatic_backend(p.q), Backend::reference);
  attention(p);  // automatic: the reference

  // The same values in f32 (sink too): out rounded to f32 is the f32 run's out exactly.
  auto to_f32 = [](const Buffer& b) {
    Buffer f(DType::f32, b.shape());
    for (int64_t i = 0; i < b.numel(); ++i) f.as<float>()[i] = float(b.as<double>()[i]);
    return f;
  };
  Buffer q32 = to_f32(q), k32 = to_f32(k), v32 = to_f32(v), s32 = to_f32(sink), out32(DType::f32, {n, hq, d});
  AttentionParams p32 = p;
  p32.q = q32.view();
  p32.k = k32.view();
  p32.v = v32.view();
  p32.sink = s32.view();
  p32.out = out32.view();
  p32.lse = TensorView{};
  attention(p32, Backend::reference);
  for (int64_t i = 0; i < out.numel(); ++i) ASSERT_EQ(float(out.as<double>()[i]), out32.as<float>()[i]) << i;

  // Gradients of L = Σ w · out against central differences of the f64 forward.
  Buffer w = f64_buffer({n, hq, d});
  AttentionGrads g;
  Buffer dq(DType::f64, {n, hq, d}), dk(DType::f64, {n, hkv, d}), dv(DType::f64, {n, hkv, d}), ds(DType::f64, {hq});
  g.dout = w.view();
  g.dq = dq.view();
  g.dk = dk.view();
  g.dv = dv.view();
  g.dsink = ds.view();
  attention_backward(p, g);
  auto loss = [&]() {
    Buffer o(DType::f64, {n, hq, d});
    AttentionParams pl = p;
    pl.out = o.view();
    pl.lse = TensorView{};
    attention(pl, Backend::reference);
    double s = 0;
    for (int64_t i = 0; i < o.numel(); ++i) s += o.as<double>()[i] * w.as<double>()[i];
    return s;
  };
  const double eps = 1e-5;
  for (auto [x, gx, name] : {std::tuple{&q, &dq, "q"}, {&k, &dk, "k"}, {&v, &dv, "v"}, {&sink, &ds, "sink"}})
    for (int64_t i = 0; i < x->numel(); ++i) {
      double& xi = x->as<double>()[i];
      const double keep = xi;
      xi = keep + eps;
      const double up = loss();
      xi = keep - eps;
      const double down = loss();
      xi = keep;
      const double fd = (up - down) / (2 * eps), got = gx->as<double>()[i];
      EXPECT_NEAR(got, fd, 1e-6 * (1 + std::abs(fd))) << name << "[" << i << "]";
    }
}

}  // namespace
}  // namespace ariadne::testing
