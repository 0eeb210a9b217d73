// Context parallelism on the host: the pieces (attention of a run of queries against a run of keys
// at their positions, the LSE merge, sinks once), the zig-zag shards, the hand-off of query blocks,
// RR from all-gathered key-stride sums, and the ring simulation against one-device attention.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "ariadne/context_parallel.hpp"
#include "cases.hpp"
#include "cpu/force_isa.hpp"

namespace ariadne {
namespace {

using namespace testing;

TEST(ContextParallel, ZigzagShardsCoverEverySequenceOnce) {
  for (int64_t len : {0, 1, 7, 128, 1000, 4097})
    for (int ranks : {1, 2, 3, 8})
      for (int64_t align : {1, 64}) {
        SCOPED_TRACE("len " + std::to_string(len) + " ranks " + std::to_string(ranks) + " align " +
                     std::to_string(align));
        const auto shards = zigzag_shards(len, ranks, align);
        ASSERT_EQ(shards.size(), size_t(ranks));
        std::vector<int> seen(size_t(len), 0);
        for (int r = 0; r < ranks; ++r)
          for (const PosRange& pr : {shards[size_t(r)].first, shards[size_t(r)].second}) {
            EXPECT_EQ(pr.lo % align == 0 || pr.lo == len, true) << "chunk starts off the alignment at " << pr.lo;
            for (int64_t i = pr.lo; i < pr.hi; ++i) ++seen[size_t(i)];
          }
        for (int64_t i = 0; i < len; ++i) ASSERT_EQ(seen[size_t(i)], 1) << "position " << i;
        // Rank r's pair is chunk r and chunk 2N − 1 − r: the early chunk comes first.
        if (ranks > 1 && len >= 2 * ranks * align) {
          EXPECT_LT(shards[0].first.lo, shards[0].second.lo);
        }
      }
}

// Splits one sequence's queries and keys at random cut points, runs every (query run, key run)
// piece, merges and finishes: the runner's checks against the reference must hold.
TEST(ContextParallel, PiecesMergedOverRandomSplitsMatchTheReference) {
  std::mt19937_64 rng(11 + salt());
  const char* patterns[] = {"full", "causal", "window:37,5", "window:0,20", "window:inf,3", "chunk:48",
                            "chunk:48+window:10,inf", "causal+blocks:0.6@32", "window:50,inf+blocks:0.5@16"};
  for (const char* pattern : patterns)
    for (SinkMode sink : {SinkMode::none, SinkMode::denominator, SinkMode::key0_bias}) {
      AttnCase c;
      c.tokens_q = {301};
      c.heads_q = 4;
      c.heads_kv = 2;
      c.pattern = pattern;
      c.sink_mode = sink;
      c.sink = sink == SinkMode::none ? 0.f : NAN;
      c.dtype = DType::f32;
      c.seed = rng();
      const PreparedCase pc = prepare(c);
      SCOPED_TRACE(pc.name);
      const AttentionParams whole = host_params(pc, poisoned_outputs(pc));
      const int64_t B = whole.pattern.blocks.defined() ? whole.pattern.blocks.block : 1;
      const std::vector<int64_t> qc = random_cuts(rng, 301, B, 3), kc = random_cuts(rng, 301, B, 4);
      CaseOutputs o = poisoned_outputs(pc);
      Pattern rule = whole.pattern;
      rule.blocks = BlockSparseView{};
      for (size_t a = 0; a + 1 < qc.size(); ++a) {
        const int64_t q0 = qc[a], n = qc[a + 1] - q0;
        Buffer acc(DType::f32, {n, 4, 64}), acc_lse(DType::f32, {4, n}), part(DType::f32, {n, 4, 64}),
            part_lse(DType::f32, {4, n});
        acc.fill(0.f);
        acc_lse.fill(-INFINITY);
        const BlockMask rows = B > 1 ? mask_rows(whole.pattern, 0, 301, 301, q0, n) : BlockMask{};
        for (size_t b = 0; b + 1 < kc.size(); ++b) {
          PieceParams pp;
          pp.q = row_range(whole.q, q0, q0 + n);
          pp.k = row_range(whole.k, kc[b], kc[b + 1]);
          pp.v = row_range(whole.v, kc[b], kc[b + 1]);
          pp.q_pos = q0;
          pp.k_pos = kc[b];
          pp.rule = rule;
          if (B > 1) pp.blocks = rows.view();
          pp.sink_mode = whole.sink_mode;
          pp.sink = whole.sink;
          pp.out = part.view();
          pp.lse = part_lse.view();
          attention_piece(pp, Backend::cpu);
          merge_partial(acc.view(), acc_lse.view(), part.view(), part_lse.view());
        }
        TensorView out = row_range(o.out.view(), q0, q0 + n);
        TensorView lse = o.lse.view();
        lse.data = o.lse.as<float>() + q0;
        lse.shape[1] = n;
        finish_partials(acc.view(), acc_lse.view(), whole.sink_mode, whole.sink, out, lse);
      }
      check_outputs(pc, o, false);
    }
}

CaseBackend ring_backend(int ranks) {
  CaseBackend b;
  b.name = "ring/" + std::to_string(ranks);
  b.run = [ranks](const PreparedCase& pc, CaseOutputs& o, std::string* why) {
    if (pc.c.order != TokenOrder::none) return *why = "token orders are permuted before a ring", false;
    if (pc.c.diagnostics) return *why = "the ring has no diagnostics", false;
    if (!pc.c.tokens_k.empty() && pc.c.tokens_k != pc.c.tokens_q) return *why = "the ring needs lq == lk", false;
    RingConfig rc;
    rc.ranks = ranks;
    ring_attention(host_params(pc, o), rc);
    return true;
  };
  return b;
}

class RingCases : public ::testing::TestWithParam<AttnCase> {};

// The whole case table (every pattern, sink mode, GQA ratio, dtype, varlen batch, strided input)
// through the ring on 2 and 3 ranks, under the runner's checks against the reference.
TEST_P(RingCases, MatchesTheReference) {
  const PreparedCase pc = prepare(GetParam(), salt());
  for (int ranks : {2, 3}) {
    std::string why;
    if (!run_case(pc, ring_backend(ranks), &why)) GTEST_SKIP() << why;
  }
}

INSTANTIATE_TEST_SUITE_P(Table, RingCases, ::testing::ValuesIn(cases()), test_name);

// Causal zig-zag sharding: the ranks' entries add up to the causal triangle exactly, and every
// rank does the same work up to a chunk's rounding.
TEST(ContextParallel, CausalZigzagBalancesTheRanksExactly) {
  AttnCase c;
  c.tokens_q = {1024};
  c.heads_q = 2;
  c.heads_kv = 1;
  c.pattern = "causal";
  c.dtype = DType::bf16;
  const PreparedCase pc = prepare(c, salt());
  for (int ranks : {1, 2, 4, 8}) {
    CaseOutputs o = poisoned_outputs(pc);
    RingConfig rc;
    rc.ranks = ranks;
    const RingStats st = ring_attention(host_params(pc, o), rc);
    int64_t total = 0;
    for (const RingRankStats& r : st.ranks) total += r.entries;
    EXPECT_EQ(total, 2 * 1024 * 1025 / 2) << ranks << " ranks";
    EXPECT_LT(st.imbalance(), 1.0 + 1e-9 + 2.0 / 1024 * ranks) << ranks << " ranks";
    check_outputs(pc, o, false);
  }
}

TEST(ContextParallel, BalanceHandsOffTheHeaviestBlocksOnly) {
  // Rank 0 owns all the work: blocks leave it heaviest-first only past the mean.
  const BlockAssignment a = balance_query_blocks({{8, 1, 1, 1, 1}, {0, 0}, {0}});
  ASSERT_EQ(a.rank_of.size(), 3u);
  EXPECT_EQ(a.rank_of[0][0], 0);  // 8 > mean 4, but the owner has nothing yet: it stays
  double sum = 0;
  for (double l : a.load) sum += l;
  EXPECT_EQ(sum, 12.0);
  EXPECT_EQ(a.load[0], 8.0);
  EXPECT_EQ(a.load[1] + a.load[2], 4.0);
  EXPECT_EQ(a.moved, 4);
  EXPECT_NEAR(a.imbalance_before(), 3.0, 1e-12);
  EXPECT_NEAR(a.imbalance(), 2.0, 1e-12);
  // Equal work moves nothing.
  const BlockAssignment b = balance_query_blocks({{1, 1}, {1, 1}});
  EXPECT_EQ(b.moved, 0);
  EXPECT_EQ(b.imbalance(), 1.0);
  EXPECT_NE(error_of([] { balance_query_blocks({{1, -1}}); }).find("work[0][1]"), std::string::npos);
}

// RR reads keys only through K̄: from all-gathered sums, a chunk of queries gets the rows (scores
// and mask) that estimate() gives its blocks on the whole sequence, bit for bit.
TEST(ContextParallel, RREstimateFromKeySumsEqualsTheWholeSequenceBitForBit) {
  std::mt19937_64 rng(5 + salt());
  for (DType dt : {DType::f32, DType::bf16})
    for (RROffset off : {RROffset::paper, RROffset::released}) {
      const int64_t L = 1000, B = 64, hq = 4, hkv = 2, d = 32;
      Buffer q(dt, {L, hq, d}), k(dt, {L, hkv, d});
      q.fill_random(rng(), -2.f, 2.f);
      k.fill_random(rng(), -2.f, 2.f);
      EstimateConfig ec;
      ec.block = int32_t(B);
      ec.stride = 8;
      ec.tau = 0.9;
      ec.offset = off;
      const EstimateResult whole = estimate(q.view(), k.view(), Pattern::causal(), ec, Backend::cpu);
      // Sums of the whole sequence, assembled from three ranks' pieces as the all-gather does.
      Buffer sums(DType::f32, {L / 8, hkv, d});
      for (auto [lo, hi] : {std::pair<int64_t, int64_t>{0, 384}, {384, 640}, {640, 1000}}) {
        TensorView kv = k.view();
        kv.data = static_cast<char*>(kv.data) + lo * hkv * d * dtype_size(dt);
        kv.shape[0] = hi - lo;
        const Buffer part = rr_key_sums(kv, 8);
        std::memcpy(sums.as<float>() + lo / 8 * hkv * d, part.data(), size_t(part.numel()) * 4);
      }
      for (auto [lo, hi] : {std::pair<int64_t, int64_t>{0, 192}, {192, 640}, {640, 1000}}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " " + rr_offset_name(off) + " queries " + std::to_string(lo));
        TensorView qv = q.view();
        qv.data = static_cast<char*>(qv.data) + lo * hq * d * dtype_size(dt);
        qv.shape[0] = hi - lo;
        const EstimateResult part = estimate_rr_from_key_sums(qv, sums.view(), lo, L, ec);
        const int64_t nqb = (hi - lo + B - 1) / B, nqb_all = (L + B - 1) / B;
        ASSERT_EQ(part.rows(), hq * nqb);
        for (int64_t h = 0; h < hq; ++h)
          for (int64_t m = 0; m < nqb; ++m) {
            const int64_t r = h * nqb + m, w = h * nqb_all + lo / B + m;
            ASSERT_EQ(part.visible(r), whole.visible(w));
            ASSERT_EQ(0, std::memcmp(&part.scores[size_t(part.score_ptr[size_t(r)])],
                                     &whole.scores[size_t(whole.score_ptr[size_t(w)])], size_t(part.visible(r)) * 4))
                << "scores of head " << h << " block " << lo / B + m;
            const std::vector<int32_t> a(part.mask.col_idx.begin() + part.mask.row_ptr[size_t(r)],
                                         part.mask.col_idx.begin() + part.mask.row_ptr[size_t(r) + 1]);
            const std::vector<int32_t> b(whole.mask.col_idx.begin() + whole.mask.row_ptr[size_t(w)],
                                         whole.mask.col_idx.begin() + whole.mask.row_ptr[size_t(w) + 1]);
            ASSERT_EQ(a, b) << "mask row of head " << h << " block " << lo / B + m;
          }
      }
    }
}

// Block-sparse prefill under context parallelism: the gathered mask equals one-device prefill's
// exactly, the output matches it within the rule, and the hand-off evens out the ranks' work.
TEST(ContextParallel, RingPrefillEqualsOneDevicePrefill) {
  std::mt19937_64 rng(9 + salt());
  const std::vector<int32_t> cu{0, 1500, 1500 + 700};
  const int64_t total = cu.back(), hq = 4, hkv = 2, d = 64;
  Buffer q(DType::bf16, {total, hq, d}), k(DType::bf16, {total, hkv, d}), v(DType::bf16, {total, hkv, d});
  q.fill_random(rng(), -2.f, 2.f);
  k.fill_random(rng(), -2.f, 2.f);
  v.fill_random(rng());
  Buffer out1(DType::f32, {total, hq, d}), lse1(DType::f32, {hq, total});
  AttentionParams p;
  p.q = q.view();
  p.k = k.view();
  p.v = v.view();
  p.out = out1.view();
  p.lse = lse1.view();
  p.pattern = Pattern::causal().with_varlen(2, cu.data());
  PrefillConfig pc;
  pc.estimate.block = 64;
  pc.estimate.stride = 8;
  pc.estimate.tau = 0.8;
  pc.estimate_backend = pc.attention_backend = Backend::cpu;
  const PrefillResult one = prefill(p, pc);
  for (int ranks : {1, 2, 3})
    for (bool balance : {false, true}) {
      SCOPED_TRACE(std::to_string(ranks) + " ranks, balance " + std::to_string(balance));
      Buffer out(DType::f32, {total, hq, d}), lse(DType::f32, {hq, total});
      out.fill(NAN);
      lse.fill(NAN);
      AttentionParams pr = p;
      pr.out = out.view();
      pr.lse = lse.view();
      RingConfig rc;
      rc.ranks = ranks;
      rc.balance = balance;
      const RingPrefillResult res = ring_prefill(pr, pc, rc);
      ASSERT_EQ(res.prefill.estimate.mask.row_ptr, one.estimate.mask.row_ptr);
      ASSERT_EQ(res.prefill.estimate.mask.col_idx, one.estimate.mask.col_idx);
      EXPECT_NEAR(res.prefill.stats.density, one.stats.density, 1e-12);
      // Both are sums of bf16 products in another order: the rule's bf16 tolerance for logits up
      // to scale · max|q| · max|k| · d = 32.
      const double tol = tolerance(DType::bf16, 32.0);
      EXPECT_TRUE(close_enough("out", compare(out.view(), out1.view()), tol));
      EXPECT_TRUE(lse_close(lse.view(), lse1.view(), tol));
      int64_t assigned = 0;
      for (const auto& owner : res.assignment.rank_of)
        for (int r : owner) {
          EXPECT_GE(r, 0);
          EXPECT_LT(r, ranks);
          ++assigned;
        }
      EXPECT_EQ(assigned, one.estimate.mask.rows() / hq);
      if (balance) {
        EXPECT_LE(res.assignment.imbalance(), res.assignment.imbalance_before() + 1e-12);
      }
    }
}

TEST(ContextParallel, BadCallsNameTheField) {
  AttnCase c;
  c.tokens_q = {100};
  c.tokens_k = {120};
  c.dtype = DType::f32;
  const PreparedCase pc = prepare(c);
  CaseOutputs o = poisoned_outputs(pc);
  RingConfig rc;
  EXPECT_NE(error_of([&] { ring_attention(host_params(pc, o), rc); }).find("lq == lk"), std::string::npos);
  AttnCase b;
  b.tokens_q = {256};
  b.pattern = "causal+blocks:0.5@64";
  b.dtype = DType::f32;
  const PreparedCase pb = prepare(b);
  CaseOutputs ob = poisoned_outputs(pb);
  rc.align = 48;
  EXPECT_NE(error_of([&] { ring_attention(host_params(pb, ob), rc); }).find("align 48"), std::string::npos);
  rc.align = 0;
  rc.ranks = 0;
  EXPECT_NE(error_of([&] { ring_attention(host_params(pb, ob), rc); }).find("ranks is 0"), std::string::npos);

  Buffer q(DType::f32, {64, 2, 16}), k(DType::f32, {64, 2, 16}), out(DType::f32, {64, 2, 16}), lse(DType::f32, {2, 64});
  q.fill(0.f);
  k.fill(0.f);
  PieceParams pp;
  pp.q = q.view();
  pp.k = pp.v = k.view();
  pp.out = out.view();
  pp.lse = lse.view();
  pp.q_pos = -1;
  EXPECT_NE(error_of([&] { attention_piece(pp); }).find("q_pos -1"), std::string::npos);
  pp.q_pos = 0;
  pp.rule = Pattern::causal().with_varlen(1, nullptr);
  pp.rule.cu_seqlens_q = reinterpret_cast<const int32_t*>(q.data());
  EXPECT_NE(error_of([&] { attention_piece(pp); }).find("rule is"), std::string::npos);
  pp.rule = Pattern::causal();
  pp.lse = TensorView{};
  EXPECT_NE(error_of([&] { attention_piece(pp); }).find("lse is not set"), std::string::npos);
  EXPECT_NE(error_of([&] { estimate_rr_from_key_sums(q.view(), k.view(), 32, 64, EstimateConfig{}); }).find("q_pos"),
            std::string::npos);
}

}  // namespace
}  // namespace ariadne
