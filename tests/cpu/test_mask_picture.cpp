// mask_picture (ariadne/mask_picture.hpp): the picture's size, the colour of each verdict on a mask
// built from the oracle's own by removing one block and adding another, white invisible cells, and
// the calls it refuses.
#include "ariadne/mask_picture.hpp"

#include <algorithm>

#include "common.hpp"

namespace ariadne {
namespace {

struct Rgb {
  int r, g, b;
};
Rgb pixel(const Image& img, int64_t m, int64_t c, int cell) {
  const int y = int(m * cell + cell / 2 - 1), x = int(c * cell + cell / 2 - 1);
  return {img.at(y, x, 0), img.at(y, x, 1), img.at(y, x, 2)};
}

TEST(MaskPicture, ColoursEachVerdict) {
  testing::Case cs;
  cs.seq_q = {320};
  cs.heads_q = 2;
  cs.heads_kv = 1;
  cs.dim = 16;
  cs.seed = 5;
  cs.input_scale = 2.f;
  cs.pattern = Pattern::causal();
  const testing::Inputs in = testing::make_inputs(cs);
  EstimateConfig oc;
  oc.method = Estimator::oracle;
  oc.block = 32;
  oc.tau = 0.8;
  const EstimateResult oracle = estimate(in.params.q, in.params.k, in.params.pattern, oc);
  // Head 1's row of query block 9 (ten visible key blocks): drop one block the oracle keeps, add
  // one it does not.
  const int64_t row = 10 + 9;
  std::vector<int32_t> l(oracle.mask.col_idx.begin() + oracle.mask.row_ptr[row],
                         oracle.mask.col_idx.begin() + oracle.mask.row_ptr[row + 1]);
  ASSERT_GE(l.size(), 2u);
  ASSERT_LT(l.size(), 10u);
  const int32_t dropped = l.front(), kept_too = l.back();
  int32_t added = 0;
  while (std::binary_search(l.begin(), l.end(), added)) ++added;
  l.erase(l.begin());
  l.insert(std::lower_bound(l.begin(), l.end(), added), added);
  BlockMask mk = oracle.mask;
  mk.col_idx.clear();
  mk.row_ptr.assign(1, 0);
  for (int64_t r = 0; r < oracle.mask.rows(); ++r) {
    std::vector<int32_t> lr(oracle.mask.col_idx.begin() + oracle.mask.row_ptr[r],
                            oracle.mask.col_idx.begin() + oracle.mask.row_ptr[r + 1]);
    if (r == row) lr = l;
    mk.col_idx.insert(mk.col_idx.end(), lr.begin(), lr.end());
    mk.row_ptr.push_back(int32_t(mk.col_idx.size()));
  }
  const int cell = 6;
  const Image img = mask_picture(mk, oracle, 0, 1, cell);
  EXPECT_EQ(img.width, 10 * cell);
  EXPECT_EQ(img.height, 10 * cell);
  EXPECT_EQ(img.channels, 3);
  const Rgb tp = pixel(img, 9, kept_too, cell), fn = pixel(img, 9, dropped, cell), fp = pixel(img, 9, added, cell);
  EXPECT_TRUE(tp.g > tp.r && tp.g > tp.b) << "kept by both: green";
  EXPECT_TRUE(fn.r > fn.g && fn.r > fn.b) << "missed: red";
  EXPECT_TRUE(fp.b > fp.r && fp.b > fp.g) << "extra: blue";
  const Rgb inv = pixel(img, 2, 7, cell);  // query block 2 sees key blocks 0-2
  EXPECT_TRUE(inv.r == 255 && inv.g == 255 && inv.b == 255) << "invisible: white";
  const Rgb same = pixel(mask_picture(oracle.mask, oracle, 0, 1, cell), 9, dropped, cell);
  EXPECT_TRUE(same.g > same.r) << "the oracle's own mask keeps the block: green";

  EXPECT_THROW(mask_picture(mk, oracle, 1, 0), Error);   // one sequence
  EXPECT_THROW(mask_picture(mk, oracle, 0, 2), Error);   // two heads
  EXPECT_THROW(mask_picture(mk, oracle, 0, 0, 0), Error);
  BlockMask other = mk;
  other.block = 64;
  EXPECT_THROW(mask_picture(other, oracle, 0, 0), Error);
}

}  // namespace
}  // namespace ariadne
