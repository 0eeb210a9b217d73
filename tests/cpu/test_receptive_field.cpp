// Receptive field (receptive_field.hpp): the talk's figures and an element-level brute force.
#include <cmath>
#include <random>

#include <gtest/gtest.h>

#include "ariadne/error.hpp"
#include "ariadne/receptive_field.hpp"

namespace ariadne {
namespace {

TEST(ReceptiveField, TalkExampleRowOnly) {
  // 10×14 grid, token level, window 4, start at the centre (5, 7) = raster index 77: seven raster
  // layers reach 77 ± 28, i.e. 57 of 140 patches (about 41%).
  const ReceptiveField rf = receptive_field(parse_schedule("7xR", 4), {10, 14}, 5, 7, 1);
  ASSERT_EQ(rf.coverage.size(), 7u);
  for (int l = 0; l < 7; ++l) EXPECT_DOUBLE_EQ(rf.coverage[size_t(l)], double(1 + 8 * (l + 1)) / 140.0) << l;
  EXPECT_EQ(std::lround(100 * rf.coverage[6]), 41);
  EXPECT_EQ(rf.reached[77], 0);
  EXPECT_EQ(rf.reached[77 + 28], 7);
  EXPECT_EQ(rf.reached[77 - 29], -1);
}

TEST(ReceptiveField, TalkExampleRowThenColumn) {
  // RRRR-CCC: 4 row layers cover 77 ± 16 (row 5 whole); the first column layer then spreads that
  // row ±4 rows in every column (139 of 140: only (0, 0) is 5 column positions from (5, 0)), the
  // second reaches everything, so the image is covered by layer 7 (already at layer 6).
  const ReceptiveField rf = receptive_field(parse_schedule("RRRRCCC", 4), {10, 14}, 5, 7, 1);
  ASSERT_EQ(rf.coverage.size(), 7u);
  EXPECT_DOUBLE_EQ(rf.coverage[3], 33.0 / 140.0);
  EXPECT_DOUBLE_EQ(rf.coverage[4], 139.0 / 140.0);
  EXPECT_EQ(rf.reached[0], 6);
  EXPECT_DOUBLE_EQ(rf.coverage[5], 1.0);
  EXPECT_DOUBLE_EQ(rf.coverage[6], 1.0);
  for (int r : rf.reached) EXPECT_GE(r, 0);
}

// Brute force over every (query, key) pair with Pattern::allowed, patches tracked by position.
std::vector<int> brute_reached(const Schedule& s, Grid g, int r0, int c0, int merge, int win) {
  std::vector<int> reached(size_t(g.tokens()), -1);
  reached[size_t(r0 * g.w + c0)] = 0;
  for (size_t li = 0; li < s.layers.size(); ++li) {
    const TokenOrder o = make_order(s.layers[li].order, {g}, merge, win);
    const Pattern p = layer_pattern(s.layers[li], o);
    const std::vector<int> before = reached;
    for (int32_t sq = 0; sq < p.num_seqs; ++sq) {
      const SeqExtent e = p.seq(sq, o.tokens(), o.tokens());
      for (int64_t q = 0; q < e.lq; ++q)
        for (int64_t k = 0; k < e.lk; ++k)
          if (p.allowed(sq, e, 0, q, k) && before[size_t(o.perm[size_t(e.k0 + k)])] >= 0 &&
              reached[size_t(o.perm[size_t(e.q0 + q)])] < 0)
            reached[size_t(o.perm[size_t(e.q0 + q)])] = int(li) + 1;
    }
  }
  return reached;
}

TEST(ReceptiveField, MatchesBruteForce) {
  std::mt19937 rng(9);
  const char letters[] = {'R', 'C', 'Q', 'W', 'F'};
  for (int trial = 0; trial < 80; ++trial) {
    const int merge = 1 + int(rng() % 2), win = 1 + int(rng() % 3);
    const Grid g{merge * (1 + int(rng() % 8)), merge * (1 + int(rng() % 8))};
    std::string spec;
    for (int i = 0, n = 1 + int(rng() % 6); i < n; ++i) spec += letters[rng() % (trial % 3 == 0 ? 5 : 4)];
    const Schedule s = parse_schedule(spec, int64_t(rng() % 6));
    const int r0 = int(rng() % unsigned(g.h)), c0 = int(rng() % unsigned(g.w));
    const ReceptiveField rf = receptive_field(s, g, r0, c0, merge, win);
    ASSERT_EQ(rf.reached, brute_reached(s, g, r0, c0, merge, win)) << spec << " " << g.h << "x" << g.w;
    int64_t covered = 0;
    for (int r : rf.reached) covered += r >= 0;
    EXPECT_DOUBLE_EQ(rf.coverage.back(), double(covered) / double(g.tokens()));
  }
}

TEST(ReceptiveField, ChunksNeverLeaveTheirWindow) {
  // Qwen chunk layers alone keep information inside one 64-token window; one full layer frees it.
  const ReceptiveField rf = receptive_field(parse_schedule("7xW F", 64), {14, 16}, 0, 0, 2, 4);
  for (int l = 0; l < 7; ++l) EXPECT_DOUBLE_EQ(rf.coverage[size_t(l)], 64.0 / 224.0);
  EXPECT_DOUBLE_EQ(rf.coverage[7], 1.0);
}

TEST(ReceptiveField, BadStart) {
  EXPECT_THROW(receptive_field(parse_schedule("R", 4), {10, 14}, 10, 0), Error);
  EXPECT_THROW(receptive_field(parse_schedule("R", 4), {10, 14}, 0, -1), Error);
  EXPECT_THROW(receptive_field(parse_schedule("R", 4), {5, 14}, 0, 0, 2), Error);  // odd side, merge 2
}

}  // namespace
}  // namespace ariadne
