// Estimators: RR, XAttention and the oracle against plain double implementations written
// here from the formulas of SPEC B.2 / C.4 / C.5, the selection rule, sampling positions,
// protections, metrics, determinism and bad parameters.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <random>
#include <string>

#include "ariadne/estimate.hpp"
#include "workloads/synthetic.hpp"
#include "common.hpp"
#include "estimate/internal.hpp"

namespace ariadne {
namespace {

using testing::Case;
using testing::Inputs;

// ---- brute force (double) ----

struct BruteRow {
  int s, h;
  int64_t m;
  std::vector<double> score;  // normalized block scores of key blocks 0 … diag
};

double qk(const Inputs& in, int64_t tq, int h, int64_t tk, int kh) {
  double s = 0;
  for (int64_t u = 0; u < in.params.q.shape[2]; ++u)
    s += double(in.params.q.get({tq, h, u})) * double(in.params.k.get({tk, kh, u}));
  return s;
}

// Rows in CSR order (sequence, head, query block), each the normalized block scores of `method`.
std::vector<BruteRow> brute_scores(const Inputs& in, const EstimateConfig& c) {
  const int hq = int(in.params.q.shape[1]), hkv = int(in.params.k.shape[1]);
  const int64_t d = in.params.q.shape[2], B = c.block, S = c.stride;
  const double scale = 1.0 / std::sqrt(double(d));
  std::vector<BruteRow> rows;
  for (size_t s = 0; s + 1 < in.cu_q.size(); ++s) {
    const int64_t q0 = in.cu_q[s], k0 = in.cu_k[s];
    const int64_t lq = in.cu_q[s + 1] - q0, lk = in.cu_k[s + 1] - k0, off = lk - lq;
    const int64_t nqb = (lq + B - 1) / B;
    for (int h = 0; h < hq; ++h) {
      const int kh = h / (hq / hkv);
      for (int64_t m = 0; m < nqb; ++m) {
        const int64_t last = std::min((m + 1) * B, lq) - 1;
        BruteRow row{int(s), h, m, std::vector<double>(size_t((last + off) / B + 1), 0.0)};
        std::vector<std::pair<int64_t, std::vector<double>>> dists;  // (first key, weights)
        if (c.method == Estimator::oracle) {
          for (int64_t iq = m * B; iq <= last; ++iq) {
            std::vector<double> x;
            for (int64_t ik = 0; ik <= iq + off; ++ik) x.push_back(scale * qk(in, q0 + iq, h, k0 + ik, kh));
            dists.push_back({1, x});
          }
        } else {
          for (int64_t i = m * B / S; i * S <= last; ++i) {
            int64_t p;  // key position deciding visibility
            std::vector<double> x;
            if (c.method == Estimator::rr) {
              const int64_t hm = h % S;
              const int64_t P = std::min(i * S + (c.offset == RROffset::paper ? S - 1 - hm : hm), lq - 1);
              p = P + off;
              for (int64_t j = 0; j * S <= p; ++j) {
                double v = 0;
                for (int64_t t = 0; t < S && j * S + t < lk; ++t) v += qk(in, q0 + P, h, k0 + j * S + t, kh);
                x.push_back(v * scale / double(S));
              }
            } else {
              p = std::min(i * S + S - 1, lq - 1) + off;
              for (int64_t j = 0; j * S <= p; ++j) {
                double v = 0;
                for (int64_t t = 0; t < S; ++t) {
                  const int64_t iq = i * S + S - 1 - t, ik = j * S + t;
                  if (iq < lq && ik < lk) v += qk(in, q0 + iq, h, k0 + ik, kh);
                }
                x.push_back(v * scale / double(S));
              }
            }
            dists.push_back({S, x});
          }
        }
        for (auto& [unit, x] : dists) {
          const double mx = *std::max_element(x.begin(), x.end());
          double z = 0;
          for (double v : x) z += std::exp(v - mx);
          for (size_t j = 0; j < x.size(); ++j) row.score[size_t(int64_t(j) * unit / B)] += std::exp(x[j] - mx) / z;
        }
        for (double& v : row.score) v /= double(dists.size());
        rows.push_back(std::move(row));
      }
    }
  }
  return rows;
}

// The published selection in double: descending score (ties: lower index), keep while the mass
// before the block is < τ·total; forced blocks counted first (XAttention) or OR-ed (RR/oracle).
// `margin` receives how close any decision came to the threshold or any two scores to a tie.
std::vector<int32_t> brute_select(const std::vector<double>& sc, double tau, std::vector<int32_t> forced,
                                  bool forced_first, double* margin) {
  const int64_t n = int64_t(sc.size());
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return sc[size_t(a)] > sc[size_t(b)]; });
  double total = 0, m = 1e9;
  for (double v : sc) total += v;
  for (int64_t i = 0; i + 1 < n; ++i) m = std::min(m, sc[size_t(order[size_t(i)])] - sc[size_t(order[size_t(i + 1)])]);
  std::vector<char> keep(size_t(n), 0);
  for (int32_t f : forced) keep[size_t(f)] = 1;
  double cum = 0;
  if (forced_first)
    for (int64_t i = 0; i < n; ++i) cum += keep[size_t(i)] ? sc[size_t(i)] : 0.0;
  if (tau >= 1) std::fill(keep.begin(), keep.end(), 1);
  else
    for (int32_t i : order) {
      if (forced_first && keep[size_t(i)]) continue;
      m = std::min(m, std::abs(cum - tau * total));
      if (cum >= tau * total) break;
      keep[size_t(i)] = 1;
      cum += sc[size_t(i)];
    }
  if (margin) *margin = m;
  std::vector<int32_t> out;
  for (int64_t i = 0; i < n; ++i)
    if (keep[size_t(i)]) out.push_back(int32_t(i));
  return out;
}

Case small_case(const char* name, std::vector<int64_t> sq, std::vector<int64_t> sk, uint64_t seed) {
  Case c;
  c.name = name;
  c.seq_q = std::move(sq);
  c.seq_k = std::move(sk);
  c.heads_q = 4;
  c.heads_kv = 2;
  c.dim = 16;
  c.seed = seed;
  c.input_scale = 1.5f;  // logits of a few nats: scores far from uniform
  c.pattern = Pattern::causal();
  return c;
}

// Compares one estimator run with the brute force: scores within 2e-5 (f32 dot products), block
// lists exactly on every row whose decisions are not within 1e-4 of a threshold or a tie.
void check_against_brute(const Inputs& in, const EstimateConfig& c, const std::string& what) {
  SCOPED_TRACE(what);
  const EstimateResult r = estimate(in.params.q, in.params.k, in.params.pattern, c);
  const std::vector<BruteRow> want = brute_scores(in, c);
  ASSERT_EQ(r.rows(), int64_t(want.size()));
  ASSERT_EQ(r.mask.rows(), int64_t(want.size()));
  const Protections prot = c.protections();
  int64_t compared = 0;
  for (size_t row = 0; row < want.size(); ++row) {
    const BruteRow& w = want[row];
    ASSERT_EQ(r.visible(int64_t(row)), int64_t(w.score.size())) << "row " << row;
    for (size_t n = 0; n < w.score.size(); ++n)
      ASSERT_NEAR(r.score(int64_t(row), int64_t(n)), w.score[n], 2e-5) << "row " << row << " block " << n;
    std::vector<int32_t> forced;
    if (prot.sink) forced.push_back(0);
    if (prot.diagonal && w.score.size() > 1) forced.push_back(int32_t(w.score.size() - 1));
    const int64_t nqb = r.mask.seq_block_base[size_t(w.s) + 1] - r.mask.seq_block_base[size_t(w.s)];
    const bool whole = prot.last_row && w.m == nqb - 1;
    double margin = 0;
    const std::vector<int32_t> expect =
        brute_select(w.score, whole ? 1.0 : c.tau_of(w.h), forced, c.method == Estimator::xattn, &margin);
    const std::vector<int32_t> got(r.mask.col_idx.begin() + r.mask.row_ptr[row],
                                   r.mask.col_idx.begin() + r.mask.row_ptr[row + 1]);
    if (margin > 1e-4 || whole) {
      ++compared;
      EXPECT_EQ(got, expect) << "row " << row << " (seq " << w.s << ", head " << w.h << ", block " << w.m << ")";
    }
  }
  // The inputs are continuous random values: near-ties are rare, so most rows are compared.
  EXPECT_GE(compared * 10, int64_t(want.size()) * 8) << "too few rows compared exactly";
}

TEST(Estimate, RRMatchesBruteForce) {
  // One sequence not a multiple of S or B, GQA 2:1, block 64 / stride 8.
  const Inputs in = testing::make_inputs(small_case("rr", {299}, {}, 11));
  for (RROffset off : {RROffset::paper, RROffset::released})
    for (double tau : {0.5, 0.9, 0.95}) {
      EstimateConfig c;
      c.block = 64;
      c.stride = 8;
      c.tau = tau;
      c.offset = off;
      check_against_brute(in, c, std::string("offset ") + rr_offset_name(off) + " tau " + std::to_string(tau));
    }
}

TEST(Estimate, XAttentionMatchesBruteForce) {
  const Inputs in = testing::make_inputs(small_case("xattn", {301}, {}, 12));
  for (int stride : {4, 16})
    for (double tau : {0.6, 0.9}) {
      EstimateConfig c;
      c.method = Estimator::xattn;
      c.block = 64;
      c.stride = stride;
      c.tau = tau;
      check_against_brute(in, c, "stride " + std::to_string(stride) + " tau " + std::to_string(tau));
    }
}

TEST(Estimate, VarlenAndChunkedPrefillMatchBruteForce) {
  // Four sequences: lq == lk, a prompt-only chunk with no queries (no rows), lq < lk with an
  // offset that is not a multiple of S or B, and a one-query sequence; token rows padded
  // (strided views).
  Case cs = small_case("varlen", {130, 0, 77, 1}, {130, 20, 203, 45}, 13);
  cs.token_pad = 5;
  const Inputs in = testing::make_inputs(cs);
  for (Estimator m : {Estimator::rr, Estimator::xattn, Estimator::oracle}) {
    EstimateConfig c;
    c.method = m;
    c.block = 32;
    c.stride = 8;
    c.tau = 0.9;
    c.tau_per_head = {0.9, 0.7, 0.95, 0.8};
    check_against_brute(in, c, estimator_name(m));
  }
}

TEST(Estimate, OracleEqualsBruteForceBlockMasses) {
  const Inputs in = testing::make_inputs(small_case("oracle", {200}, {}, 14));
  EstimateConfig c;
  c.method = Estimator::oracle;
  c.block = 64;
  check_against_brute(in, c, "oracle");
  // Masses are attention probabilities: each row sums to 1 over its visible blocks.
  const EstimateResult r = estimate(in.params.q, in.params.k, in.params.pattern, c);
  for (int64_t row = 0; row < r.rows(); ++row) {
    double s = 0;
    for (int64_t n = 0; n < r.visible(row); ++n) s += r.score(row, n);
    EXPECT_NEAR(s, 1.0, 1e-5);
  }
}

TEST(Estimate, SamplingPositionsPaperAndReleased) {
  EXPECT_EQ(rr_sample_position(RROffset::paper, 8, 0, 0, 100), 7);
  EXPECT_EQ(rr_sample_position(RROffset::paper, 8, 0, 3, 100), 4);
  EXPECT_EQ(rr_sample_position(RROffset::paper, 8, 2, 9, 100), 22);  // 16 + 7 − 1
  EXPECT_EQ(rr_sample_position(RROffset::paper, 8, 1, 7, 100), 8);
  EXPECT_EQ(rr_sample_position(RROffset::released, 8, 0, 0, 100), 0);
  EXPECT_EQ(rr_sample_position(RROffset::released, 8, 2, 9, 100), 17);
  EXPECT_EQ(rr_sample_position(RROffset::released, 16, 3, 31, 100), 63);
  EXPECT_EQ(rr_sample_position(RROffset::paper, 8, 12, 0, 100), 99);  // short last stride: clamped
  // Round robin: with heads >= S every position of a stride is sampled by some head.
  for (RROffset off : {RROffset::paper, RROffset::released}) {
    std::vector<int64_t> seen;
    for (int h = 0; h < 8; ++h) seen.push_back(rr_sample_position(off, 8, 5, h, 1000));
    std::sort(seen.begin(), seen.end());
    for (int t = 0; t < 8; ++t) EXPECT_EQ(seen[size_t(t)], 40 + t);
  }
}

TEST(Estimate, RRSchedulesRotateByTheirIndex) {
  EXPECT_EQ(rr_rotation(RRSchedule::head, 5, 3), 5);
  EXPECT_EQ(rr_rotation(RRSchedule::none, 5, 3), 0);
  EXPECT_EQ(rr_rotation(RRSchedule::layer, 5, 3), 3);
  EXPECT_EQ(rr_rotation(RRSchedule::hybrid, 5, 3), 8);
  for (const RRSchedule s : {RRSchedule::head, RRSchedule::none, RRSchedule::layer, RRSchedule::hybrid})
    EXPECT_EQ(parse_rr_schedule(rr_schedule_name(s)), s);
  EXPECT_THROW(parse_rr_schedule("heads"), Error);

  // Every query head holds the same values (one KV head), so under head-RR head j's rows differ from
  // head 0's only by the sampled position j mod S. Another schedule that gives head h rotation r
  // must then give it exactly head-RR's rows of head r mod S: masks and scores, bit for bit.
  Case cs = small_case("schedules", {700}, {}, 31);
  cs.heads_q = 8;
  cs.heads_kv = 1;
  Inputs in = testing::make_inputs(cs);
  for (int64_t t = 0; t < in.total_q; ++t)
    for (int h = 1; h < cs.heads_q; ++h)
      for (int64_t u = 0; u < cs.dim; ++u) in.params.q.set({t, h, u}, in.params.q.get({t, 0, u}));
  for (const RROffset off : {RROffset::paper, RROffset::released}) {
    EstimateConfig c;
    c.block = 64;
    c.stride = 8;
    c.tau = 0.9;
    c.offset = off;
    const EstimateResult base = estimate(in.params.q, in.params.k, in.params.pattern, c);
    const int64_t nqb = (700 + 63) / 64;
    for (const RRSchedule sch : {RRSchedule::none, RRSchedule::layer, RRSchedule::hybrid})
      for (const int32_t layer : {0, 3, 8, 13}) {
        SCOPED_TRACE(std::string(rr_offset_name(off)) + " " + rr_schedule_name(sch) + " layer " + std::to_string(layer));
        c.schedule = sch;
        c.layer = layer;
        const EstimateResult got = estimate(in.params.q, in.params.k, in.params.pattern, c);
        for (int h = 0; h < cs.heads_q; ++h) {
          const int like = rr_rotation(sch, h, layer) % 8;
          for (int64_t m = 0; m < nqb; ++m) {
            const int64_t r = h * nqb + m, rb = like * nqb + m;
            const auto row = [](const EstimateResult& e, int64_t i) {
              return std::vector<int32_t>(e.mask.col_idx.begin() + e.mask.row_ptr[size_t(i)],
                                          e.mask.col_idx.begin() + e.mask.row_ptr[size_t(i) + 1]);
            };
            const auto scores = [](const EstimateResult& e, int64_t i) {
              return std::vector<float>(e.scores.begin() + e.score_ptr[size_t(i)],
                                        e.scores.begin() + e.score_ptr[size_t(i) + 1]);
            };
            ASSERT_EQ(row(got, r), row(base, rb)) << "head " << h << " block " << m;
            ASSERT_EQ(scores(got, r), scores(base, rb)) << "head " << h << " block " << m;
          }
        }
      }
    // The schedules do differ from head-RR (the check above is not vacuous): none gives every head
    // head 0's rows, which head-RR's head 3 does not share.
    c.schedule = RRSchedule::none;
    c.layer = 0;
    const EstimateResult none = estimate(in.params.q, in.params.k, in.params.pattern, c);
    EXPECT_NE(std::vector<float>(none.scores.begin() + none.score_ptr[size_t(3 * nqb)], none.scores.end()),
              std::vector<float>(base.scores.begin() + base.score_ptr[size_t(3 * nqb)], base.scores.end()));
  }
  EstimateConfig bad;
  bad.layer = -1;
  EXPECT_THROW(validate(bad, 8), Error);
}

TEST(Estimate, RRReadsOnlyTheSampledQueries) {
  // Changing a query that no head samples leaves every score bit-identical; changing a sampled one
  // changes its head's scores. Head 1 with S = 8 samples offset 6 (paper) or 1 (released).
  Case cs = small_case("sampling", {128}, {}, 15);
  cs.heads_q = 2;
  cs.heads_kv = 1;
  for (RROffset off : {RROffset::paper, RROffset::released}) {
    Inputs in = testing::make_inputs(cs);
    EstimateConfig c;
    c.block = 64;
    c.offset = off;
    const EstimateResult a = estimate(in.params.q, in.params.k, in.params.pattern, c);
    const int64_t sampled = rr_sample_position(off, 8, 12, 1, 128);  // stride 12 (block 1) of head 1
    const int64_t unsampled = off == RROffset::paper ? 96 : 103;     // neither head samples it
    for (int64_t u = 0; u < 16; ++u) in.params.q.set({unsampled, 1, u}, 5.f);
    const EstimateResult b = estimate(in.params.q, in.params.k, in.params.pattern, c);
    EXPECT_EQ(a.scores, b.scores) << rr_offset_name(off);
    for (int64_t u = 0; u < 16; ++u) in.params.q.set({sampled, 1, u}, 5.f);
    const EstimateResult d = estimate(in.params.q, in.params.k, in.params.pattern, c);
    EXPECT_NE(a.scores, d.scores) << rr_offset_name(off);
    // Head 0's rows (the first two) are untouched by head 1's query.
    EXPECT_TRUE(std::equal(a.scores.begin(), a.scores.begin() + a.score_ptr[2], d.scores.begin()));
  }
}

TEST(Estimate, TauOneKeepsEveryVisibleBlock) {
  const Inputs in = testing::make_inputs(small_case("tau1", {250, 90}, {250, 180}, 16));
  for (Estimator m : {Estimator::rr, Estimator::xattn, Estimator::oracle}) {
    EstimateConfig c;
    c.method = m;
    c.block = 32;
    c.tau = 1.0;
    c.protect = Protections{};
    const EstimateResult r = estimate(in.params.q, in.params.k, in.params.pattern, c);
    const BlockMask all = BlockMask::all_visible(in.params.pattern, 32, 4, in.total_q, in.total_k);
    EXPECT_EQ(r.mask.row_ptr, all.row_ptr) << estimator_name(m);
    EXPECT_EQ(r.mask.col_idx, all.col_idx) << estimator_name(m);
    EXPECT_EQ(r.mask.seq_block_base, all.seq_block_base);
    EXPECT_DOUBLE_EQ(r.stats.density, 1.0);
  }
}

TEST(Estimate, ProtectionsAreKept) {
  const Inputs in = testing::make_inputs(small_case("protect", {400}, {}, 17));
  EstimateConfig c;
  c.block = 32;
  c.tau = 0.3;  // small τ: the dynamic part alone would drop many blocks
  c.protect = Protections{};
  const EstimateResult none = estimate(in.params.q, in.params.k, in.params.pattern, c);
  c.protect = Protections{true, true, true};
  const EstimateResult all = estimate(in.params.q, in.params.k, in.params.pattern, c);
  const int64_t nqb = 13;
  for (int h = 0; h < 4; ++h)
    for (int64_t m = 0; m < nqb; ++m) {
      const int64_t row = h * nqb + m;
      const std::vector<uint8_t> dense = all.mask.to_dense(0, h, 400, 400);
      EXPECT_TRUE(dense[size_t(m * nqb)]) << "sink block, row " << row;
      EXPECT_TRUE(dense[size_t(m * nqb + m)]) << "diagonal block, row " << row;
      if (m == nqb - 1) {
        for (int64_t n = 0; n <= m; ++n) EXPECT_TRUE(dense[size_t(m * nqb + n)]) << "last row, block " << n;
      }
    }
  // B_dynamic ∨ B_static: every unprotected choice is still there.
  for (int64_t row = 0; row < none.mask.rows(); ++row)
    for (int32_t x = none.mask.row_ptr[size_t(row)]; x < none.mask.row_ptr[size_t(row) + 1]; ++x) {
      const auto b = all.mask.col_idx.begin() + all.mask.row_ptr[size_t(row)];
      const auto e = all.mask.col_idx.begin() + all.mask.row_ptr[size_t(row) + 1];
      EXPECT_TRUE(std::binary_search(b, e, none.mask.col_idx[size_t(x)]));
    }
  EXPECT_GT(all.stats.kept_blocks, none.stats.kept_blocks);
}

TEST(Estimate, SelectionRuleOnHandBuiltRows) {
  // Exact binary fractions summing to 1, so that no rounding blurs the threshold.
  const float s[5] = {0.0625f, 0.375f, 0.3125f, 0.1875f, 0.0625f};
  // RR: descending 1, 2, 3 (mass before: 0, .375, .6875), then 0 (.875 < .9), 4 (.9375): stop.
  EXPECT_EQ(select_blocks(s, 5, 0.9, {}, false), (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(select_blocks(s, 5, 0.7, {}, false), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(select_blocks(s, 5, 0.9, {0, 4}, false), (std::vector<int32_t>{0, 1, 2, 3, 4}));
  // The smallest set reaching τ: at τ = .375 block 1 alone reaches it.
  EXPECT_EQ(select_blocks(s, 5, 0.375, {}, false), (std::vector<int32_t>{1}));
  // XAttention: forced 0 and 4 count first (.125), then 1 (.5), 2 (.8125 before block 3).
  EXPECT_EQ(select_blocks(s, 5, 0.9, {0, 4}, true), (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(select_blocks(s, 5, 0.75, {0, 4}, true), (std::vector<int32_t>{0, 1, 2, 4}));
  EXPECT_EQ(select_blocks(s, 5, 0.75, {}, false), (std::vector<int32_t>{1, 2, 3}));
  // Ties: the lower index first.
  const float t[4] = {0.25f, 0.25f, 0.25f, 0.25f};
  EXPECT_EQ(select_blocks(t, 4, 0.5, {}, false), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(select_blocks(t, 4, 1.0, {}, false), (std::vector<int32_t>{0, 1, 2, 3}));
}

// One sequence of 4 blocks of 2 tokens, one head: rows m = 0..3 see m + 1 blocks; an oracle's
// masses and mask built by hand.
EstimateResult hand_built_oracle() {
  EstimateResult o;
  o.heads = 1;
  o.score_ptr = {0, 1, 3, 6, 10};
  o.scores = {1.0f, 0.5f, 0.5f, 0.2f, 0.3f, 0.5f, 0.1f, 0.1f, 0.1f, 0.7f};
  o.row_queries = {2, 2, 2, 2};
  o.mask = BlockMask::from_lists(2, 1, {8}, {{0}, {0, 1}, {1, 2}, {3}});
  return o;
}

TEST(Estimate, MetricsOnHandBuiltCase) {
  const EstimateResult o = hand_built_oracle();
  const BlockMask mask = BlockMask::from_lists(2, 1, {8}, {{0}, {1}, {0, 2}, {0, 3}});
  const MaskMetrics m = compare_to_oracle(mask, o);
  // kept mass: 1 + 0.5 + 0.7 + 0.8 = 3.0 of 4 rows of mass 1
  EXPECT_NEAR(m.mass_recall, 0.75, 1e-6);
  EXPECT_EQ(m.kept, 6);
  EXPECT_EQ(m.oracle_kept, 6);
  EXPECT_EQ(m.true_positive, 4);  // row 0 {0}, row 1 {1}, row 2 {2}, row 3 {3}
  EXPECT_NEAR(m.precision, 4.0 / 6.0, 1e-12);
  EXPECT_NEAR(m.recall, 4.0 / 6.0, 1e-12);
  EXPECT_NEAR(m.f1, 4.0 / 6.0, 1e-12);
  EXPECT_NEAR(m.density, 0.6, 1e-12);  // 6 of 1 + 2 + 3 + 4 visible
  // A second mask with a different precision and recall pins the F1 formula.
  const MaskMetrics m2 = compare_to_oracle(BlockMask::from_lists(2, 1, {8}, {{0}, {0, 1}, {0, 1, 2}, {0, 1, 2, 3}}), o);
  EXPECT_NEAR(m2.precision, 6.0 / 10.0, 1e-12);
  EXPECT_NEAR(m2.recall, 1.0, 1e-12);
  EXPECT_NEAR(m2.f1, 2 * 0.6 / 1.6, 1e-12);
  EXPECT_NEAR(m2.mass_recall, 1.0, 1e-6);
  // Geometry mismatch is an error, not a silent zero.
  const BlockMask other = BlockMask::from_lists(4, 1, {8}, {{0}, {0, 1}});
  EXPECT_THROW(compare_to_oracle(other, o), Error);
}

// On the CPU the view is the host CSR itself and nothing is copied (the CUDA side:
// CudaEstimate.HostMaskUploadsExactly).
TEST(Estimate, MaskViewOnTheCpuIsTheHostMask) {
  const BlockMask mask = BlockMask::from_lists(2, 1, {8}, {{}, {1}, {0, 1}, {0, 1, 2}});
  DeviceEstimate untouched;
  const BlockSparseView v = mask_view_on(Device::cpu, mask, untouched);
  EXPECT_EQ(v.row_ptr, mask.row_ptr.data());
  EXPECT_EQ(v.col_idx, mask.col_idx.data());
  EXPECT_EQ(v.block, 2);
  EXPECT_FALSE(untouched.defined());
}

TEST(Estimate, OracleMaskLikeKeepsTheHeaviestBlocksAtTheMasksCounts) {
  // Per row, the same count as the mask, the heaviest blocks, ties (row 3's 0.1s) to the lower block.
  const EstimateResult o = hand_built_oracle();
  const BlockMask mask = BlockMask::from_lists(2, 1, {8}, {{}, {1}, {0, 1}, {0, 1, 2}});
  const BlockMask like = oracle_mask_like(mask, o);
  EXPECT_EQ(like.row_ptr, (std::vector<int32_t>{0, 0, 1, 3, 6}));
  EXPECT_EQ(like.col_idx, (std::vector<int32_t>{0, 1, 2, 0, 1, 3}));
  EXPECT_EQ(like.seq_block_base, mask.seq_block_base);
  EXPECT_THROW(oracle_mask_like(BlockMask::from_lists(4, 1, {8}, {{0}, {0, 1}}), o), Error);

  // On estimates of random inputs: the same count in every row, sorted rows, and in every row a
  // kept mass no lower than the estimator's (no set of that count keeps more), re-derived by sorting
  // each row's masses.
  const Inputs in = testing::make_inputs(small_case("like", {300, 170}, {300, 260}, 29));
  for (const Estimator m : {Estimator::rr, Estimator::xattn}) {
    EstimateConfig c;
    c.method = m;
    c.block = 32;
    c.stride = 8;
    c.tau = 0.8;
    EstimateConfig oc = c;
    oc.method = Estimator::oracle;
    oc.protect.reset();
    const EstimateResult est = estimate(in.params.q, in.params.k, in.params.pattern, c);
    const EstimateResult oracle = estimate(in.params.q, in.params.k, in.params.pattern, oc);
    const BlockMask got = oracle_mask_like(est.mask, oracle);
    ASSERT_EQ(got.rows(), est.mask.rows());
    for (int64_t r = 0; r < got.rows(); ++r) {
      const int32_t n = est.mask.row_ptr[size_t(r) + 1] - est.mask.row_ptr[size_t(r)];
      ASSERT_EQ(got.row_ptr[size_t(r) + 1] - got.row_ptr[size_t(r)], n) << "row " << r;
      std::vector<float> masses(oracle.scores.begin() + oracle.score_ptr[size_t(r)],
                                oracle.scores.begin() + oracle.score_ptr[size_t(r) + 1]);
      double kept = 0, est_kept = 0;
      for (int32_t i = got.row_ptr[size_t(r)]; i < got.row_ptr[size_t(r) + 1]; ++i) {
        if (i > got.row_ptr[size_t(r)]) {
          EXPECT_LT(got.col_idx[size_t(i) - 1], got.col_idx[size_t(i)]);
        }
        kept += masses[size_t(got.col_idx[size_t(i)])];
      }
      for (int32_t i = est.mask.row_ptr[size_t(r)]; i < est.mask.row_ptr[size_t(r) + 1]; ++i)
        est_kept += masses[size_t(est.mask.col_idx[size_t(i)])];
      std::sort(masses.begin(), masses.end(), std::greater<float>());
      double best = 0;
      for (int32_t i = 0; i < n; ++i) best += masses[size_t(i)];
      // The same blocks up to ties, summed in another order: equal to the rounding of a few adds.
      EXPECT_NEAR(kept, best, 1e-9) << "row " << r;
      EXPECT_GE(kept, est_kept - 1e-9) << "row " << r;
    }
  }
}

TEST(Estimate, TauSweepEqualsSingleTauRuns) {
  // Two sequences, one chunked (lq < lk), lengths off B and S: every selection path (sink,
  // diagonal, the last row of each sequence) is exercised on the sweep's re-selection.
  const Inputs in = testing::make_inputs(small_case("sweep", {300, 170}, {300, 260}, 23));
  const std::vector<double> taus = {0.3, 0.5, 0.8, 0.9, 0.925, 0.95, 0.99, 1.0};
  struct Variant {
    Estimator method;
    RROffset offset;
    std::optional<Protections> protect;
  };
  for (const Variant& v : {Variant{Estimator::rr, RROffset::paper, std::nullopt},
                           Variant{Estimator::rr, RROffset::released, std::nullopt},
                           Variant{Estimator::rr, RROffset::paper, Protections{}},
                           Variant{Estimator::xattn, RROffset::paper, std::nullopt},
                           Variant{Estimator::oracle, RROffset::paper, std::nullopt}}) {
    EstimateConfig c;
    c.method = v.method;
    c.offset = v.offset;
    c.protect = v.protect;
    c.block = 32;
    c.stride = 8;
    c.tau = 0.9;
    EstimateConfig oc = c;
    oc.method = Estimator::oracle;
    oc.protect.reset();
    SCOPED_TRACE(std::string(estimator_name(c.method)) + " " + rr_offset_name(c.offset) +
                 (c.protect ? " no protections" : " published protections"));
    const EstimateResult est = estimate(in.params.q, in.params.k, in.params.pattern, c);
    const EstimateResult oracle = estimate(in.params.q, in.params.k, in.params.pattern, oc);
    const std::vector<TauSweepPoint> sweep = tau_sweep(est, c, oracle, oc, taus);
    ASSERT_EQ(sweep.size(), taus.size());
    for (size_t i = 0; i < taus.size(); ++i) {
      SCOPED_TRACE("tau " + std::to_string(taus[i]));
      // A separate single-τ run (scoring again) against its own oracle: equal, not close.
      EstimateConfig ci = c, oci = oc;
      ci.tau = oci.tau = taus[i];
      const EstimateResult one = estimate(in.params.q, in.params.k, in.params.pattern, ci);
      const EstimateResult truth = estimate(in.params.q, in.params.k, in.params.pattern, oci);
      const MaskMetrics want = compare_to_oracle(one.mask, truth);
      const TauSweepPoint& p = sweep[i];
      EXPECT_EQ(p.tau, taus[i]);
      EXPECT_EQ(p.metrics.density, want.density);
      EXPECT_EQ(p.metrics.density, one.stats.density);
      EXPECT_EQ(p.density_per_head, one.stats.density_per_head);
      EXPECT_EQ(p.metrics.mass_recall, want.mass_recall);
      EXPECT_EQ(p.metrics.mass_recall_per_head, want.mass_recall_per_head);
      EXPECT_EQ(p.metrics.precision, want.precision);
      EXPECT_EQ(p.metrics.recall, want.recall);
      EXPECT_EQ(p.metrics.f1, want.f1);
      EXPECT_EQ(p.metrics.kept, want.kept);
      EXPECT_EQ(p.metrics.oracle_kept, want.oracle_kept);
      EXPECT_EQ(p.metrics.true_positive, want.true_positive);
      EXPECT_EQ(p.oracle_density, truth.stats.density);
      // select_mask on the first run's scores is the second run's mask, row for row.
      EstimateStats st;
      const BlockMask m = select_mask(est, ci, &st);
      EXPECT_EQ(m.row_ptr, one.mask.row_ptr);
      EXPECT_EQ(m.col_idx, one.mask.col_idx);
      EXPECT_EQ(m.seq_block_base, one.mask.seq_block_base);
      EXPECT_EQ(st.kept_blocks, one.stats.kept_blocks);
      EXPECT_EQ(st.visible_blocks, one.stats.visible_blocks);
      // The point at the run's own τ is the run's own figures.
      if (taus[i] == c.tau) {
        const MaskMetrics own = compare_to_oracle(est.mask, oracle);
        EXPECT_EQ(p.metrics.density, est.stats.density);
        EXPECT_EQ(p.metrics.mass_recall, own.mass_recall);
        EXPECT_EQ(p.metrics.f1, own.f1);
      }
      // A larger τ keeps a superset: density, mass recall and the oracle's density never fall.
      if (i > 0) {
        EXPECT_GE(p.metrics.density, sweep[i - 1].metrics.density);
        EXPECT_GE(p.metrics.mass_recall, sweep[i - 1].metrics.mass_recall);
        EXPECT_GE(p.oracle_density, sweep[i - 1].oracle_density);
        EXPECT_GE(p.metrics.kept, sweep[i - 1].metrics.kept);
      }
      if (c.method == Estimator::oracle) {
        EXPECT_EQ(p.metrics.f1, 1.0);
      }
    }
    // τ 1 keeps every visible block, the oracle's mask too.
    EXPECT_EQ(sweep.back().metrics.density, 1.0);
    EXPECT_EQ(sweep.back().oracle_density, 1.0);
    EXPECT_NEAR(sweep.back().metrics.mass_recall, 1.0, 1e-6);
    EXPECT_LT(sweep.front().metrics.density, sweep.back().metrics.density);
  }
}

TEST(Estimate, TauSweepAndSelectMaskErrors) {
  const Inputs in = testing::make_inputs(small_case("sweep-bad", {200}, {}, 24));
  EstimateConfig c;
  c.block = 32;
  EstimateConfig oc = c;
  oc.method = Estimator::oracle;
  oc.protect.reset();
  const EstimateResult est = estimate(in.params.q, in.params.k, in.params.pattern, c);
  const EstimateResult oracle = estimate(in.params.q, in.params.k, in.params.pattern, oc);
  for (double bad : {0.0, -0.5, 1.5, std::nan("")}) EXPECT_THROW(tau_sweep(est, c, oracle, oc, {0.9, bad}), Error);
  EXPECT_TRUE(tau_sweep(est, c, oracle, oc, {}).empty());
  EstimateConfig other = c;
  other.block = 64;  // not the block the scores were computed at
  EXPECT_THROW(select_mask(est, other), Error);
  EstimateResult no_scores;  // what a CUDA estimate with host_copy = false holds on the host
  no_scores.heads = est.heads;
  no_scores.score_ptr = est.score_ptr;
  no_scores.row_queries = est.row_queries;
  no_scores.mask = est.mask;
  try {
    select_mask(no_scores, c);
    ADD_FAILURE() << "no error without host scores";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("host_copy"), std::string::npos) << e.what();
  }
}

TEST(Estimate, DeterministicAcrossThreadCountsAndDtypes) {
  Case cs = small_case("det", {520}, {}, 18);
  cs.dim = 32;
  const Inputs in = testing::make_inputs(cs);
  for (Estimator m : {Estimator::rr, Estimator::xattn, Estimator::oracle}) {
    EstimateConfig c;
    c.method = m;
    c.block = 64;
    const int saved = cpu_threads();
    set_cpu_threads(1);
    const EstimateResult a = estimate(in.params.q, in.params.k, in.params.pattern, c);
    set_cpu_threads(3);
    const EstimateResult b = estimate(in.params.q, in.params.k, in.params.pattern, c);
    set_cpu_threads(saved);
    EXPECT_EQ(a.scores, b.scores) << estimator_name(m);
    EXPECT_EQ(a.mask.col_idx, b.mask.col_idx) << estimator_name(m);
  }
  // bf16 inputs give the same result as f32 inputs holding the same (rounded) values.
  Case cb = cs;
  cb.dtype = DType::bf16;
  const Inputs ib = testing::make_inputs(cb);
  Buffer qf(DType::f32, {520, 4, 32}), kf(DType::f32, {520, 2, 32});
  for (int64_t t = 0; t < 520; ++t)
    for (int64_t u = 0; u < 32; ++u) {
      for (int h = 0; h < 4; ++h) qf.view().set({t, h, u}, ib.params.q.get({t, h, u}));
      for (int h = 0; h < 2; ++h) kf.view().set({t, h, u}, ib.params.k.get({t, h, u}));
    }
  EstimateConfig c;
  const EstimateResult a = estimate(ib.params.q, ib.params.k, Pattern::causal(), c);
  const EstimateResult b = estimate(qf.view(), kf.view(), Pattern::causal(), c);
  EXPECT_EQ(a.scores, b.scores);
  EXPECT_EQ(a.mask.col_idx, b.mask.col_idx);
}

TEST(Estimate, PlantedNeedleIsFound) {
  SyntheticConfig sc;
  sc.tokens = 2048;
  sc.heads_q = 4;
  sc.heads_kv = 1;
  sc.dim = 64;
  sc.mix = "needle:1,diffuse:1,sink:1,local:1";
  sc.seed = 3;
  const Synthetic syn = make_synthetic(sc);
  ASSERT_EQ(syn.needles.size(), 4u);
  for (Estimator m : {Estimator::rr, Estimator::xattn, Estimator::oracle}) {
    EstimateConfig c;
    c.method = m;
    c.protect = Protections{};  // the needle must be found on its own merits
    const EstimateResult r = estimate(syn.q.view(), syn.k.view(), Pattern::causal(), c);
    for (const Needle& nd : syn.needles) {
      const std::vector<uint8_t> dense = r.mask.to_dense(0, nd.head, 2048, 2048);
      const int64_t kb = (nd.k_lo + nd.k_hi) / 2 / 128;
      for (int64_t qb = nd.q_lo / 128; qb <= (nd.q_hi - 1) / 128; ++qb)
        EXPECT_TRUE(dense[size_t(qb * 16 + kb)])
            << estimator_name(m) << ": needle keys " << nd.k_lo << ".." << nd.k_hi << " for queries " << nd.q_lo
            << ".." << nd.q_hi << " not kept";
    }
  }
}

TEST(Estimate, BadParametersAreErrors) {
  const Inputs in = testing::make_inputs(small_case("bad", {64}, {}, 19));
  const auto run = [&](EstimateConfig c) { estimate(in.params.q, in.params.k, in.params.pattern, c); };
  const auto expect_error = [&](EstimateConfig c, const char* needle) {
    try {
      run(c);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  EstimateConfig c;
  c.block = 0;
  expect_error(c, "block is 0");
  c = {};
  c.stride = 0;
  expect_error(c, "stride is 0");
  c = {};
  c.stride = 48;
  expect_error(c, "does not divide block");
  c = {};
  c.tau = 0;
  expect_error(c, "tau is 0");
  c = {};
  c.tau = 1.5;
  expect_error(c, "tau is 1.5");
  c = {};
  c.tau_per_head = {0.9, 0.9};
  expect_error(c, "tau_per_head has 2 entries");
  c = {};
  c.tau_per_head = {0.9, 0.9, 0.0, 0.9};
  expect_error(c, "tau_per_head[2]");
  c = {};
  c.scale = -1;
  expect_error(c, "scale");
  // Layouts: non-causal patterns and lq > lk.
  EXPECT_THROW(estimate(in.params.q, in.params.k, Pattern::full(), {}), Error);
  EXPECT_THROW(estimate(in.params.q, in.params.k, Pattern::window(8, 0), {}), Error);
  const int32_t cq[2] = {0, 64}, ck[2] = {0, 32};
  Buffer k32(DType::f32, {32, 2, 16});
  EXPECT_THROW(estimate(in.params.q, k32.view(), Pattern::causal().with_varlen(1, cq, ck), {}), Error);
  // Shapes: head_dim mismatch, GQA ratio, rank.
  Buffer kd(DType::f32, {64, 2, 8}), kh(DType::f32, {64, 3, 16}), q2(DType::f32, {64, 64});
  EXPECT_THROW(estimate(in.params.q, kd.view(), Pattern::causal(), {}), Error);
  EXPECT_THROW(estimate(in.params.q, kh.view(), Pattern::causal(), {}), Error);
  EXPECT_THROW(estimate(q2.view(), in.params.k, Pattern::causal(), {}), Error);
  // Host tensors on the cuda backend (or a build without CUDA): a clear error naming CUDA.
  std::string why;
  EXPECT_FALSE(estimate_supports(Backend::cuda, in.params.q, &why));
  EXPECT_NE(why.find("CUDA"), std::string::npos);
  EXPECT_THROW(estimate(in.params.q, in.params.k, Pattern::causal(), {}, Backend::cuda), Error);
  EXPECT_THROW(parse_estimator("flex"), Error);
  EXPECT_THROW(parse_rr_offset("middle"), Error);
}

}  // namespace
}  // namespace ariadne

namespace ariadne {
namespace {

TEST(Estimate, KernelsAgreeWithPlainLoops) {
  // The dispatched kernels (AVX2+FMA where the CPU has it) against the plain loops, on odd shapes
  // that exercise every tail: rows not a multiple of 4, columns not a multiple of 2, lengths not
  // a multiple of 8.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  for (int64_t rows : {1, 3, 4, 7})
    for (int64_t cols : {1, 2, 5})
      for (int64_t len : {1, 8, 13, 128}) {
        std::vector<float> a(size_t(rows * len)), b(size_t(cols * len)), c1(size_t(rows * cols)), c2(c1.size());
        for (float& x : a) x = u(rng);
        for (float& x : b) x = u(rng);
        est::dot_rows(a.data(), rows, b.data(), cols, len, c1.data(), cols);
        est::dot_rows_generic(a.data(), rows, b.data(), cols, len, c2.data(), cols);
        for (size_t i = 0; i < c1.size(); ++i)
          ASSERT_NEAR(c1[i], c2[i], 1e-5 * double(len) * 4) << rows << "x" << cols << "x" << len << " at " << i;
      }
  for (int64_t n : {1, 7, 8, 9, 1000}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = u(rng) * 20.f;
    const float mx = *std::max_element(x.begin(), x.end());
    std::vector<float> y = x;
    const double s1 = est::exp_sum(x.data(), n, mx), s2 = est::exp_sum_generic(y.data(), n, mx);
    EXPECT_NEAR(s1, s2, 1e-6 * s2) << n;
    for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(x[size_t(i)], y[size_t(i)], 1e-6 * y[size_t(i)] + 1e-30) << i;
  }
}

}  // namespace
}  // namespace ariadne
