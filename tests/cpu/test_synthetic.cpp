// Synthetic long-context generator: determinism, the mix syntax, and that each planted
// head type shows its structure in the exact attention (the oracle's block masses).
#include <cmath>

#include "ariadne/estimate.hpp"
#include "workloads/synthetic.hpp"
#include "common.hpp"

namespace ariadne {
namespace {

TEST(Synthetic, MixSyntax) {
  const std::vector<HeadType> m = parse_head_mix("sink:2,local,needle:1");
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[0], HeadType::sink);
  EXPECT_EQ(m[1], HeadType::sink);
  EXPECT_EQ(m[2], HeadType::local);
  EXPECT_EQ(m[3], HeadType::needle);
  EXPECT_THROW(parse_head_mix(""), Error);
  EXPECT_THROW(parse_head_mix("sink:0"), Error);
  EXPECT_THROW(parse_head_mix("sink:x"), Error);
  EXPECT_THROW(parse_head_mix("sinks:2"), Error);
  EXPECT_THROW(parse_head_mix("sink:2,,local"), Error);
}

TEST(Synthetic, SeededAndDeterministic) {
  SyntheticConfig c;
  c.tokens = 300;
  c.heads_q = 4;
  c.heads_kv = 2;
  c.dim = 32;
  const Synthetic a = make_synthetic(c), b = make_synthetic(c);
  c.seed = 2;
  const Synthetic d = make_synthetic(c);
  const auto same = [](const Buffer& x, const Buffer& y) {
    return std::equal(x.as<float>(), x.as<float>() + x.numel(), y.as<float>());
  };
  EXPECT_TRUE(same(a.q, b.q) && same(a.k, b.k) && same(a.v, b.v));
  EXPECT_FALSE(same(a.q, d.q));
  EXPECT_FALSE(same(a.k, d.k));
  // Head h gets mix entry h mod 8 (default mix): sink, sink, local, local.
  EXPECT_EQ(a.head_types[0], HeadType::sink);
  EXPECT_EQ(a.head_types[3], HeadType::local);
  EXPECT_EQ(a.q.shape(), (std::vector<int64_t>{300, 4, 32}));
  EXPECT_EQ(a.k.shape(), (std::vector<int64_t>{300, 2, 32}));
  for (int64_t i = 0; i < a.q.numel(); ++i) ASSERT_TRUE(std::isfinite(a.q.as<float>()[i]));
  // Bad configs.
  c.dim = 30;
  EXPECT_THROW(make_synthetic(c), Error);
  c.dim = 32;
  c.heads_q = 3;
  EXPECT_THROW(make_synthetic(c), Error);
  c.heads_q = 4;
  c.rope_theta = 1;
  EXPECT_THROW(make_synthetic(c), Error);
  c.rope_theta = 10000;
  c.tokens = 0;
  EXPECT_THROW(make_synthetic(c), Error);
}

TEST(Synthetic, RoPEBandIsRelative) {
  // A local head's q·k depends (up to noise) on m − n only: the mean logit at distance 0 is far
  // above the mean at distance 500, at the start and at the end of the sequence alike.
  SyntheticConfig c;
  c.tokens = 2048;
  c.heads_q = 1;
  c.heads_kv = 1;
  c.dim = 64;
  c.mix = "local";
  c.rope_theta = 500000;
  const Synthetic s = make_synthetic(c);
  const auto logit = [&](int64_t m, int64_t n) {
    double v = 0;
    for (int64_t u = 0; u < 64; ++u) v += double(s.q.view().get({m, 0, u})) * s.k.view().get({n, 0, u});
    return v / 8.0;
  };
  for (int64_t base : {600, 1900}) {
    double near = 0, far = 0;
    for (int64_t t = 0; t < 32; ++t) {
      near += logit(base + t, base + t) / 32;
      far += logit(base + t, base + t - 500) / 32;
    }
    EXPECT_GT(near, far + 8) << "at " << base;
  }
}

TEST(Synthetic, PlantedStructuresShowInTheExactAttention) {
  SyntheticConfig c;
  c.tokens = 2048;
  c.heads_q = 6;
  c.heads_kv = 2;
  c.dim = 64;
  c.mix = "sink,local,stripe,needle,slash,diffuse";
  c.seed = 5;
  const Synthetic s = make_synthetic(c);
  EstimateConfig oc;
  oc.method = Estimator::oracle;
  const EstimateResult o = estimate(s.q.view(), s.k.view(), Pattern::causal(), oc);
  const int64_t nqb = 16;
  const auto mass = [&](int h, int64_t m, int64_t n) { return o.score(h * nqb + m, n); };
  for (int64_t m = 1; m < nqb; ++m) {
    // Sink head (sink + a weaker local band, an A-shape head): the sink block holds the most,
    // sink and diagonal blocks together nearly all.
    EXPECT_GT(mass(0, m, 0), 0.5) << "sink head, query block " << m;
    EXPECT_GT(mass(0, m, 0) + mass(0, m, m), 0.8) << "sink head, query block " << m;
    EXPECT_GT(mass(1, m, m) + mass(1, m, m - 1), 0.6) << "local head, query block " << m;
  }
  // The needle head is a local head outside its retrieving queries (rows 2..7 hold none of them:
  // retrieving queries sit in [N/2, N)).
  for (int64_t m = 2; m < nqb / 2; ++m)
    EXPECT_GT(mass(3, m, m) + mass(3, m, m - 1), 0.6) << "needle head away from its needles, query block " << m;
  // The diffuse head spreads its mass: block 0 (sink included) holds well under half of it once
  // the rows see many blocks.
  for (int64_t m = 8; m < nqb; ++m) EXPECT_LT(mass(5, m, 0), 0.5) << "diffuse head, query block " << m;
  // Stripe head (KV head 0): the blocks holding stripe keys and the diagonal blocks (its local
  // band) take most of the late rows' mass, and the stripe blocks off the diagonal a real share.
  double stripe_mass = 0, off_diagonal = 0;
  std::vector<char> has(16, 0);
  for (int64_t key : s.stripe_keys[0]) has[size_t(key / 128)] = 1;
  for (int64_t n = 0; n < 16; ++n) {
    if (has[size_t(n)] || n == 0 || n >= 14) stripe_mass += mass(2, 15, n);
    if (has[size_t(n)] && n > 0 && n < 14) off_diagonal += mass(2, 15, n);
  }
  EXPECT_GT(stripe_mass, 0.8);
  EXPECT_GT(off_diagonal, 0.2);
  // Needles: the needle queries' block puts at least 1/16 of its mass (16 of 128 queries, most of
  // their mass) on the needle keys' block.
  ASSERT_EQ(s.needles.size(), 4u);
  for (const Needle& nd : s.needles) {
    EXPECT_EQ(nd.head, 3);
    const int64_t qb = nd.q_lo / 128, kb = (nd.k_lo + 16) / 128;
    if (nd.q_hi - 1 < (qb + 1) * 128) {
      EXPECT_GT(mass(3, qb, kb), 1.0 / 16) << "needle at " << nd.k_lo;
    }
  }
  // Slash head: a band at distance δ: the block δ back carries a large share.
  const int64_t delta = s.slash_offset[4];
  ASSERT_GE(delta, 64);
  double slash = 0;
  for (int64_t n = (15 * 128 - delta) / 128 - 1; n <= (16 * 128 - delta) / 128; ++n) slash += mass(4, 15, n);
  EXPECT_GT(slash, 0.5) << "delta " << delta;
}

}  // namespace
}  // namespace ariadne
