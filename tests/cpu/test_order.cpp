// Token orders (order.hpp): exact permutations computed by hand, an independent sort-key
// definition on random grids, round trips, multi-image packing, padded windows, row gathers.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <tuple>

#include <gtest/gtest.h>

#include "ariadne/error.hpp"
#include "ariadne/order.hpp"

namespace ariadne {
namespace {

// Sequence position of every patch, spatial raster (the `inverse` array).
std::vector<int32_t> positions(OrderKind k, Grid g, int merge = 2, int window = 4) {
  return make_order(k, {g}, merge, window).inverse;
}

// The talk's 4x8 figure. Merge units are 2x2; numbers are sequence positions.
TEST(Order, Raster4x8ByHand) {
  std::vector<int32_t> expect(32);
  std::iota(expect.begin(), expect.end(), 0);
  EXPECT_EQ(positions(OrderKind::raster, {4, 8}), expect);
}

TEST(Order, BlockRow4x8ByHand) {
  const std::vector<int32_t> expect = {
      0,  1,  4,  5,  8,  9,  12, 13,  //
      2,  3,  6,  7,  10, 11, 14, 15,  //
      16, 17, 20, 21, 24, 25, 28, 29,  //
      18, 19, 22, 23, 26, 27, 30, 31};
  EXPECT_EQ(positions(OrderKind::block_row, {4, 8}), expect);
}

TEST(Order, BlockCol4x8ByHand) {
  // Units column-major, each unit's 2x2 kept in raster order (MiMo convention).
  const std::vector<int32_t> expect = {
      0, 1, 8,  9,  16, 17, 24, 25,  //
      2, 3, 10, 11, 18, 19, 26, 27,  //
      4, 5, 12, 13, 20, 21, 28, 29,  //
      6, 7, 14, 15, 22, 23, 30, 31};
  EXPECT_EQ(positions(OrderKind::block_col, {4, 8}), expect);
}

TEST(Order, QwenWindow4x8ByHand) {
  // Windows of 2x2 merge units: window 0 = left half, window 1 = right half.
  const std::vector<int32_t> expect = {
      0,  1,  4,  5,  16, 17, 20, 21,  //
      2,  3,  6,  7,  18, 19, 22, 23,  //
      8,  9,  12, 13, 24, 25, 28, 29,  //
      10, 11, 14, 15, 26, 27, 30, 31};
  const TokenOrder o = make_order(OrderKind::qwen_window, {{4, 8}}, 2, 2);
  EXPECT_EQ(o.inverse, expect);
  EXPECT_EQ(o.cu_windows, (std::vector<int32_t>{0, 16, 32}));
  // With the default window (4 units) the whole 2x4-unit grid is one window: block_row order.
  const TokenOrder one = make_order(OrderKind::qwen_window, {{4, 8}});
  EXPECT_EQ(one.inverse, positions(OrderKind::block_row, {4, 8}));
  EXPECT_EQ(one.cu_windows, (std::vector<int32_t>{0, 32}));
}

TEST(Order, MergeOneIsTokenLevel) {
  // merge 1: block_row is raster, block_col is column-major raster (the receptive-field example).
  const Grid g{3, 5};
  EXPECT_EQ(positions(OrderKind::block_row, g, 1), positions(OrderKind::raster, g, 1));
  const std::vector<int32_t> col = positions(OrderKind::block_col, g, 1);
  for (int r = 0; r < g.h; ++r)
    for (int c = 0; c < g.w; ++c) EXPECT_EQ(col[size_t(r * g.w + c)], c * g.h + r) << r << "," << c;
}

TEST(Order, QwenCuWindowSeqlens) {
  // SPEC C.1: a 14x16 patch grid (7x8 merge units, padded to 8x8) gives [0, 64, 128, 176, 224].
  EXPECT_EQ(make_order(OrderKind::qwen_window, {{14, 16}}).cu_windows,
            (std::vector<int32_t>{0, 64, 128, 176, 224}));
  // Sides already multiples of the window: no padded window appears.
  EXPECT_EQ(make_order(OrderKind::qwen_window, {{16, 16}}).cu_windows,
            (std::vector<int32_t>{0, 64, 128, 192, 256}));
  // 6x10 patches = 3x5 units: windows of 3x4 and 3x1 units.
  EXPECT_EQ(make_order(OrderKind::qwen_window, {{6, 10}}).cu_windows, (std::vector<int32_t>{0, 48, 60}));
  // Packed images: windows of the second image continue after the first.
  const TokenOrder two = make_order(OrderKind::qwen_window, {{14, 16}, {4, 4}});
  EXPECT_EQ(two.cu_windows, (std::vector<int32_t>{0, 64, 128, 176, 224, 240}));
  EXPECT_EQ(two.cu_seqlens, (std::vector<int32_t>{0, 224, 240}));
  // The other orders have no windows.
  EXPECT_TRUE(make_order(OrderKind::block_row, {{14, 16}}).cu_windows.empty());
}

TEST(Order, PaddedWindowByHand) {
  // 6x6 patches = 3x3 units, window 2: windows (2x2, 2x1, 1x2, 1x1 units) in raster order.
  const std::vector<int32_t> expect = {
      0,  1,  4,  5,  16, 17,  //
      2,  3,  6,  7,  18, 19,  //
      8,  9,  12, 13, 20, 21,  //
      10, 11, 14, 15, 22, 23,  //
      24, 25, 28, 29, 32, 33,  //
      26, 27, 30, 31, 34, 35};
  const TokenOrder o = make_order(OrderKind::qwen_window, {{6, 6}}, 2, 2);
  EXPECT_EQ(o.inverse, expect);
  EXPECT_EQ(o.cu_windows, (std::vector<int32_t>{0, 16, 24, 32, 36}));
}

// An independent definition: sort the patches by a key tuple of the order.
std::vector<int32_t> perm_by_sort(OrderKind k, const std::vector<Grid>& grids, int m, int win) {
  using Key = std::tuple<int, int, int, int, int, int, int>;
  std::vector<std::pair<Key, int32_t>> keyed;
  int32_t base = 0;
  for (int i = 0; i < int(grids.size()); ++i) {
    const Grid g = grids[size_t(i)];
    for (int r = 0; r < g.h; ++r)
      for (int c = 0; c < g.w; ++c) {
        const int ur = r / m, uc = c / m, dr = r % m, dc = c % m;
        Key key;
        switch (k) {
          case OrderKind::raster: key = {i, r, c, 0, 0, 0, 0}; break;
          case OrderKind::block_row: key = {i, ur, uc, dr, dc, 0, 0}; break;
          case OrderKind::block_col: key = {i, uc, ur, dr, dc, 0, 0}; break;
          case OrderKind::qwen_window: key = {i, ur / win, uc / win, ur, uc, dr, dc}; break;
        }
        keyed.push_back({key, base + r * g.w + c});
      }
    base += g.h * g.w;
  }
  std::sort(keyed.begin(), keyed.end());
  std::vector<int32_t> perm;
  for (const auto& kv : keyed) perm.push_back(kv.second);
  return perm;
}

TEST(Order, MatchesSortKeysOnRandomPackedGrids) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 60; ++trial) {
    const int m = 1 + int(rng() % 2), win = 1 + int(rng() % 5);
    std::vector<Grid> grids;
    for (int i = 0, n = 1 + int(rng() % 3); i < n; ++i)
      grids.push_back({m * (1 + int(rng() % 11)), m * (1 + int(rng() % 11))});
    for (OrderKind k : {OrderKind::raster, OrderKind::qwen_window, OrderKind::block_row, OrderKind::block_col}) {
      const TokenOrder o = make_order(k, grids, m, win);
      ASSERT_EQ(o.perm, perm_by_sort(k, grids, m, win)) << order_name(k) << " trial " << trial;
      for (size_t p = 0; p < o.perm.size(); ++p) ASSERT_EQ(o.inverse[size_t(o.perm[p])], int32_t(p));
      // Every image stays contiguous, in its own range.
      for (size_t i = 0; i + 1 < o.cu_seqlens.size(); ++i)
        for (int32_t p = o.cu_seqlens[i]; p < o.cu_seqlens[i + 1]; ++p)
          ASSERT_TRUE(o.perm[size_t(p)] >= o.cu_seqlens[i] && o.perm[size_t(p)] < o.cu_seqlens[i + 1]);
      if (k == OrderKind::qwen_window) {
        // Window sizes: m*m tokens times the real units of each window, in raster window order.
        std::vector<int32_t> cu{0};
        for (const Grid& g : grids) {
          const int uh = g.h / m, uw = g.w / m;
          for (int wr = 0; wr * win < uh; ++wr)
            for (int wc = 0; wc * win < uw; ++wc)
              cu.push_back(cu.back() + m * m * (std::min(uh, wr * win + win) - wr * win) *
                                           (std::min(uw, wc * win + win) - wc * win));
        }
        ASSERT_EQ(o.cu_windows, cu) << "trial " << trial;
      }
    }
  }
}

TEST(Order, CoordsFollowSequence) {
  const TokenOrder o = make_order(OrderKind::block_col, {{4, 8}, {2, 2}});
  ASSERT_EQ(o.coords.size(), size_t(2 * 36));
  // Position 4 of block_col is patch (2, 0); position 32 is the second image's (0, 0).
  EXPECT_EQ(o.coords[8], 2.f);
  EXPECT_EQ(o.coords[9], 0.f);
  EXPECT_EQ(o.coords[64], 0.f);
  EXPECT_EQ(o.coords[65], 0.f);
  for (size_t p = 0; p < 32; ++p) {
    EXPECT_EQ(int(o.coords[2 * p]) * 8 + int(o.coords[2 * p + 1]), o.perm[p]);
  }
}

TEST(Order, ConversionsComposeAndRoundTrip) {
  const std::vector<Grid> grids{{6, 10}, {4, 4}};
  std::vector<TokenOrder> all;
  for (OrderKind k : {OrderKind::raster, OrderKind::qwen_window, OrderKind::block_row, OrderKind::block_col})
    all.push_back(make_order(k, grids));
  for (const TokenOrder& a : all)
    for (const TokenOrder& b : all) {
      const std::vector<int32_t> ab = order_conversion(a, b), ba = order_conversion(b, a);
      for (size_t i = 0; i < ab.size(); ++i) {
        EXPECT_EQ(a.perm[size_t(ab[i])], b.perm[i]);  // same patch
        EXPECT_EQ(ab[size_t(ba[i])], int32_t(i));      // inverse gathers
      }
      for (const TokenOrder& c : all) {
        const std::vector<int32_t> ac = order_conversion(a, c), bc = order_conversion(b, c);
        for (size_t i = 0; i < ac.size(); ++i) EXPECT_EQ(ab[size_t(bc[i])], ac[i]);
      }
    }
}

TensorView host_view(void* data, DType t, std::vector<int64_t> shape, std::vector<int64_t> stride) {
  TensorView v;
  v.data = data;
  v.dtype = t;
  v.rank = int(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    v.shape[i] = shape[i];
    v.stride[i] = stride[i];
  }
  return v;
}

TEST(Order, PermuteTokensStridedRoundTripExact) {
  const std::vector<Grid> grids{{4, 6}, {2, 4}};
  const TokenOrder raster = make_order(OrderKind::raster, grids);
  const TokenOrder col = make_order(OrderKind::block_col, grids);
  const int64_t n = raster.tokens(), heads = 3, dim = 5, pad = 7;
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    const int es = dtype_size(t);
    // src rows are strided ([n, heads, dim] inside rows of heads*dim + pad elements); values are
    // random bit patterns so every byte is checked.
    std::vector<uint8_t> src(size_t(n * (heads * dim + pad) * es)), mid(size_t(n * heads * dim * es)),
        back(src.size(), 0);
    std::mt19937 rng(11);
    for (auto& b : src) b = uint8_t(rng());
    const TensorView s = host_view(src.data(), t, {n, heads, dim}, {heads * dim + pad, dim, 1});
    const TensorView m = host_view(mid.data(), t, {n, heads, dim}, {heads * dim, dim, 1});
    const TensorView b = host_view(back.data(), t, {n, heads, dim}, {heads * dim + pad, dim, 1});
    permute_tokens(s, m, raster, col);
    // Row i of the result is the raster row of the patch at block_col position i.
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(std::memcmp(&mid[size_t(i * heads * dim * es)], &src[size_t(col.perm[size_t(i)] * (heads * dim + pad) * es)],
                            size_t(heads * dim * es)), 0);
    permute_tokens(m, b, col, raster);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(std::memcmp(&back[size_t(i * (heads * dim + pad) * es)], &src[size_t(i * (heads * dim + pad) * es)],
                            size_t(heads * dim * es)), 0) << dtype_name(t) << " row " << i;
  }
}

TEST(Order, GatherNonContiguousInnerDim) {
  // A transposed view: inner stride 3, so elements are moved one at a time.
  std::vector<float> src(4 * 3), dst(4 * 3, -1.f);
  std::iota(src.begin(), src.end(), 0.f);
  const TensorView s = host_view(src.data(), DType::f32, {3, 4}, {1, 3});  // src[i, j] = src[j*3 + i]
  const TensorView d = host_view(dst.data(), DType::f32, {3, 4}, {4, 1});
  gather_rows(s, d, {2, 0, 1});
  const std::vector<float> expect = {2, 5, 8, 11, 0, 3, 6, 9, 1, 4, 7, 10};
  EXPECT_EQ(dst, expect);
}

TEST(Order, RopeTablesTravelWithTokens) {
  // Tables computed from the coordinates of one order, permuted to another, equal the tables
  // computed from the other order's coordinates.
  const std::vector<Grid> grids{{6, 8}};
  const TokenOrder from = make_order(OrderKind::block_row, grids);
  const TokenOrder to = make_order(OrderKind::qwen_window, grids, 2, 2);
  const int64_t n = from.tokens(), rd = 8;
  auto tables = [&](const TokenOrder& o, std::vector<float>& cs, std::vector<float>& sn) {
    cs.resize(size_t(n * rd));
    sn.resize(size_t(n * rd));
    for (int64_t p = 0; p < n; ++p)
      for (int64_t k = 0; k < rd; ++k) {
        const float inv = std::pow(10000.f, -float(k % (rd / 2)) / float(rd / 2));
        const float ang = (k < rd / 2 ? o.coords[size_t(2 * p)] : o.coords[size_t(2 * p + 1)]) * inv;
        cs[size_t(p * rd + k)] = std::cos(ang);
        sn[size_t(p * rd + k)] = std::sin(ang);
      }
  };
  std::vector<float> c0, s0, c1, s1, c2(size_t(n * rd)), s2(size_t(n * rd));
  tables(from, c0, s0);
  tables(to, c1, s1);
  permute_rope(host_view(c0.data(), DType::f32, {n, rd}, {rd, 1}), host_view(s0.data(), DType::f32, {n, rd}, {rd, 1}),
               host_view(c2.data(), DType::f32, {n, rd}, {rd, 1}), host_view(s2.data(), DType::f32, {n, rd}, {rd, 1}),
               from, to);
  EXPECT_EQ(c2, c1);
  EXPECT_EQ(s2, s1);
}

TEST(Order, NamesRoundTrip) {
  for (OrderKind k : {OrderKind::raster, OrderKind::qwen_window, OrderKind::block_row, OrderKind::block_col})
    EXPECT_EQ(parse_order(order_name(k)), k);
  EXPECT_THROW(parse_order("rowmajor"), Error);
}

TEST(Order, BadInputsThrow) {
  EXPECT_THROW(make_order(OrderKind::block_row, {{13, 16}}), Error);  // odd side with merge 2
  EXPECT_THROW(make_order(OrderKind::qwen_window, {{14, 15}}), Error);
  EXPECT_THROW(make_order(OrderKind::raster, {{0, 4}}, 1), Error);
  EXPECT_THROW(make_order(OrderKind::raster, {}), Error);
  EXPECT_THROW(make_order(OrderKind::raster, {{4, 4}}, 0), Error);
  EXPECT_THROW(make_order(OrderKind::qwen_window, {{4, 4}}, 2, 0), Error);
  EXPECT_NO_THROW(make_order(OrderKind::block_row, {{13, 15}}, 1));
  try {
    make_order(OrderKind::block_row, {{4, 4}, {13, 16}});
    FAIL() << "odd side accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("image 1"), std::string::npos) << e.what();
  }
  // Conversions between different grids, gathers with bad shapes, indices or overlap.
  EXPECT_THROW(order_conversion(make_order(OrderKind::raster, {{4, 4}}), make_order(OrderKind::raster, {{4, 6}})),
               Error);
  std::vector<float> a(8), b(8);
  const TensorView va = host_view(a.data(), DType::f32, {4, 2}, {2, 1});
  const TensorView vb = host_view(b.data(), DType::f32, {4, 2}, {2, 1});
  EXPECT_THROW(gather_rows(va, vb, {0, 1, 2}), Error);        // index length
  EXPECT_THROW(gather_rows(va, vb, {0, 1, 2, 4}), Error);     // out of range
  EXPECT_THROW(gather_rows(va, vb, {0, 1, 2, -1}), Error);
  EXPECT_THROW(gather_rows(va, va, {0, 1, 2, 3}), Error);     // in place
  TensorView bf = vb;
  bf.dtype = DType::bf16;
  EXPECT_THROW(gather_rows(va, bf, {0, 1, 2, 3}), Error);     // dtype
  const TensorView wide = host_view(b.data(), DType::f32, {2, 4}, {4, 1});
  EXPECT_THROW(gather_rows(va, wide, {0, 1}), Error);         // trailing shape
}

}  // namespace
}  // namespace ariadne
