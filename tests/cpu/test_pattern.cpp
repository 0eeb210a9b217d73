// The pattern's tile-level answers must agree with its element rule, by brute force.
#include <random>

#include <gtest/gtest.h>

#include "ariadne/pattern.hpp"

namespace ariadne {
namespace {

std::vector<Pattern> dense_patterns() {
  return {Pattern::full(), Pattern::causal(), Pattern::window(3, 5), Pattern::window(0, 0), Pattern::window(kUnbounded, 7),
          Pattern::window(6, kUnbounded), Pattern::chunked(5), Pattern::chunked(8), [] {
            Pattern p = Pattern::window(4, 0);
            p.chunk = 6;
            return p;
          }()};
}

TEST(Pattern, TileClassificationAgreesWithElementRule) {
  std::mt19937 rng(1);
  for (const Pattern& pat : dense_patterns())
    for (auto [lq, lk] : {std::pair{23, 23}, {9, 30}, {30, 9}, {1, 1}, {16, 16}}) {
      SeqExtent e{0, 0, lq, lk};
      for (int trial = 0; trial < 300; ++trial) {
        const int64_t q_lo = rng() % lq, q_hi = q_lo + 1 + rng() % (lq - q_lo);
        const int64_t k_lo = rng() % lk, k_hi = k_lo + 1 + rng() % (lk - k_lo);
        int64_t allowed = 0, total = 0;
        for (int64_t i = q_lo; i < q_hi; ++i)
          for (int64_t j = k_lo; j < k_hi; ++j, ++total) allowed += pat.allowed_dense(e, i, j);
        const TileKind kind = pat.classify(e, q_lo, q_hi, k_lo, k_hi);
        const TileKind truth = allowed == 0 ? TileKind::none : allowed == total ? TileKind::full : TileKind::partial;
        ASSERT_EQ(int(kind), int(truth)) << describe(pat) << " lq " << lq << " lk " << lk << " q [" << q_lo << ","
                                         << q_hi << ") k [" << k_lo << "," << k_hi << ")";
      }
    }
}

TEST(Pattern, KeyRangeIsTheExactHullOfAllowedKeys) {
  for (const Pattern& pat : dense_patterns())
    for (auto [lq, lk] : {std::pair{23, 23}, {9, 30}, {30, 9}}) {
      SeqExtent e{0, 0, lq, lk};
      for (int64_t q_lo = 0; q_lo < lq; q_lo += 3)
        for (int64_t q_hi = q_lo + 1; q_hi <= lq; q_hi += 4) {
          int64_t lo = lk, hi = 0;
          for (int64_t i = q_lo; i < q_hi; ++i)
            for (int64_t j = 0; j < lk; ++j)
              if (pat.allowed_dense(e, i, j)) {
                lo = std::min(lo, j);
                hi = std::max(hi, j + 1);
              }
          const KeyRange r = pat.key_range(e, q_lo, q_hi);
          if (hi <= lo) {
            ASSERT_TRUE(r.empty()) << describe(pat);
          } else {
            ASSERT_EQ(r.lo, lo) << describe(pat) << " q [" << q_lo << "," << q_hi << ")";
            ASSERT_EQ(r.hi, hi) << describe(pat) << " q [" << q_lo << "," << q_hi << ")";
          }
          if (q_hi == q_lo + 1) {
            int64_t n = 0;
            for (int64_t j = 0; j < lk; ++j) n += pat.allowed_dense(e, q_lo, j);
            ASSERT_EQ(pat.keys_per_query(e, q_lo), n) << describe(pat);
          }
        }
    }
}

TEST(Pattern, BlockRowsAndLookup) {
  // Two sequences (lq 5 and 9, block 4 -> 2 and 3 query blocks), 2 heads.
  std::vector<std::vector<int32_t>> rows = {{0}, {0, 1}, {1}, {}, {0, 2}, {1}, {2}, {0, 1, 2}, {}, {2}};
  BlockMask m = BlockMask::from_lists(4, 2, {5, 9}, rows);
  ASSERT_EQ(m.seq_block_base, (std::vector<int32_t>{0, 2, 5}));
  int32_t cu[3] = {0, 5, 14};
  Pattern p = Pattern::full().with_varlen(2, cu).with_blocks(m.view());
  EXPECT_NO_THROW(validate_pattern(p, 14, 14, 2));
  const SeqExtent e1 = p.seq(1, 14, 14);
  EXPECT_EQ(p.block_row(1, e1, 0, 0), 4);
  EXPECT_EQ(p.block_row(1, e1, 1, 2), 9);
  EXPECT_TRUE(p.allowed(1, e1, 0, 0, 8));   // row 4 lists {0, 2}: key 8 is block 2
  EXPECT_FALSE(p.allowed(1, e1, 0, 0, 4));  // block 1 not listed
  EXPECT_FALSE(p.allowed(1, e1, 1, 8, 1));  // row 9 = (s1, h1, m2) lists {2}; key 1 is block 0
  const auto dense = m.to_dense(1, 1, 9, 9);
  EXPECT_EQ(dense, (std::vector<uint8_t>{1, 1, 1, 0, 0, 0, 0, 0, 1}));
}

TEST(Pattern, ValidationNamesTheField) {
  int32_t bad_cu[3] = {0, 7, 5};
  Pattern p = Pattern::full().with_varlen(2, bad_cu);
  try {
    validate_pattern(p, 5, 5, 1);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cu_seqlens_q"), std::string::npos) << e.what();
  }
  BlockMask unsorted = BlockMask::from_lists(4, 1, {8}, {{1, 0}, {0}});
  Pattern u = Pattern::full().with_blocks(unsorted.view());
  EXPECT_THROW(validate_pattern(u, 8, 8, 1), Error);
  BlockMask out_of_range = BlockMask::from_lists(4, 1, {8}, {{0, 2}, {0}});
  EXPECT_THROW(validate_pattern(Pattern::full().with_blocks(out_of_range.view()), 8, 8, 1), Error);
  EXPECT_THROW(validate_pattern(Pattern::window(-3, 2), 8, 8, 1), Error);
  EXPECT_THROW(validate_pattern(Pattern::chunked(-1), 8, 8, 1), Error);
  EXPECT_THROW(BlockMask::from_lists(4, 1, {8}, {{0}}), Error);  // one row given, two needed
  // A mask that keeps nothing is valid (every row fully masked); its col_idx array is empty.
  BlockMask empty = BlockMask::from_lists(4, 1, {8}, {{}, {}});
  EXPECT_NO_THROW(validate_pattern(Pattern::causal().with_blocks(empty.view()), 8, 8, 1));
}

}  // namespace
}  // namespace ariadne
