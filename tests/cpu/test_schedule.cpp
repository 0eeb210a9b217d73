// Layer schedules (schedule.hpp): presets, the short syntax and its errors, per-layer patterns.
#include <string>

#include <gtest/gtest.h>

#include "ariadne/error.hpp"
#include "ariadne/schedule.hpp"
#include "common.hpp"

namespace ariadne {
namespace {

std::string parse_error(const std::string& spec) {
  return testing::error_of([&] { (void)parse_schedule(spec, 64); });
}

TEST(Schedule, AriadnePreset) {
  const Schedule s = preset_schedule("ariadne");
  ASSERT_EQ(s.layers.size(), 32u);
  for (int i = 0; i < 32; ++i) {
    const LayerSpec& l = s.layers[size_t(i)];
    const int j = i % 8;
    if (j < 4) {
      EXPECT_EQ(l.kind, LayerKind::window);
      EXPECT_EQ(l.order, OrderKind::block_row);
      EXPECT_EQ(l.window, 64);
      EXPECT_TRUE(l.sink);
    } else if (j < 7) {
      EXPECT_EQ(l.kind, LayerKind::window);
      EXPECT_EQ(l.order, OrderKind::block_col);
      EXPECT_TRUE(l.sink);
    } else {
      EXPECT_EQ(l.kind, LayerKind::full) << i;  // full at 7, 15, 23, 31
      EXPECT_FALSE(l.sink);
      EXPECT_EQ(l.order, OrderKind::block_col);  // no gather before the full layer
    }
  }
  // Gathers only at row <-> column boundaries: before layers 4, 8, 12, ..., 28.
  EXPECT_EQ(s.order_changes(), 7);
  EXPECT_EQ(s.letters().substr(0, 15), "R+R+R+R+C+C+C+F");
}

TEST(Schedule, ChunkPresetIsQwen) {
  const Schedule s = preset_schedule("chunk");
  ASSERT_EQ(s.layers.size(), 32u);
  for (int i = 0; i < 32; ++i) {
    const bool full = i == 7 || i == 15 || i == 23 || i == 31;
    EXPECT_EQ(s.layers[size_t(i)].kind, full ? LayerKind::full : LayerKind::chunk) << i;
    EXPECT_EQ(s.layers[size_t(i)].order, OrderKind::qwen_window) << i;
    EXPECT_FALSE(s.layers[size_t(i)].sink);
  }
  EXPECT_EQ(s.order_changes(), 0);
  const Schedule cs = preset_schedule("chunk+sink");
  for (int i = 0; i < 32; ++i) EXPECT_EQ(cs.layers[size_t(i)].sink, cs.layers[size_t(i)].kind == LayerKind::chunk);
}

TEST(Schedule, MimoPreset) {
  const Schedule s = preset_schedule("mimo");
  ASSERT_EQ(s.layers.size(), 28u);
  int sinks = 0;
  for (int i = 0; i < 28; ++i) {
    const LayerSpec& l = s.layers[size_t(i)];
    const bool full = i == 0 || i == 9 || i == 18 || i == 27;
    EXPECT_EQ(l.kind, full ? LayerKind::full : LayerKind::window) << i;
    EXPECT_EQ(l.sink, !full) << i;
    sinks += l.sink;
    if (!full) {
      EXPECT_EQ(l.order, (i % 9) <= 4 ? OrderKind::block_row : OrderKind::block_col) << i;
    }
  }
  EXPECT_EQ(sinks, 24);
  EXPECT_EQ(s.layers[0].order, OrderKind::block_row);
}

TEST(Schedule, OtherPresets) {
  const std::vector<std::string> names = schedule_presets();
  EXPECT_EQ(names.size(), 10u);
  for (const std::string& n : names) EXPECT_EQ(preset_schedule(n).name, n);
  const Schedule full = preset_schedule("full");
  for (const LayerSpec& l : full.layers) EXPECT_TRUE(l.kind == LayerKind::full && !l.sink);
  for (const LayerSpec& l : preset_schedule("full+sink").layers) EXPECT_TRUE(l.kind == LayerKind::full && l.sink);
  const Schedule s2 = preset_schedule("swa2d+sink", 32);
  EXPECT_EQ(s2.layers[0].order, OrderKind::qwen_window);
  EXPECT_EQ(s2.layers[0].window, 32);
  EXPECT_TRUE(s2.layers[0].sink);
  EXPECT_FALSE(s2.layers[7].sink);
  const Schedule s1 = preset_schedule("swa1d");
  EXPECT_EQ(s1.layers[3].order, OrderKind::block_row);
  EXPECT_EQ(s1.layers[3].kind, LayerKind::window);
  EXPECT_EQ(s1.layers[15].kind, LayerKind::full);
  EXPECT_THROW(preset_schedule("ariadne2"), Error);
}

TEST(Schedule, ShortSyntax) {
  const Schedule a = parse_schedule("4x(RRRRCCCF)", 64);
  const Schedule b = parse_schedule("4x(4xR 3xC F)", 64);
  const Schedule c = parse_schedule("RRRR-CCC-F RRRR-CCC-F RRRR_CCC_F RRRRCCCF", 64);
  EXPECT_EQ(a.letters(), "RRRRCCCFRRRRCCCFRRRRCCCFRRRRCCCF");
  EXPECT_EQ(b.letters(), a.letters());
  EXPECT_EQ(c.letters(), a.letters());
  EXPECT_EQ(parse_schedule("2x(2x(R)C+)W", 8).letters(), "RRC+RRC+W");
  EXPECT_EQ(parse_schedule("FQ", 8).layers[0].order, OrderKind::block_row);  // F first: block_row
  EXPECT_EQ(parse_schedule("WF", 8).layers[1].order, OrderKind::qwen_window);
  EXPECT_EQ(parse_schedule("12xR", 5).layers.size(), 12u);
  EXPECT_EQ(parse_schedule("R", 5).layers[0].window, 5);
  EXPECT_EQ(resolve_schedule("ariadne").layers.size(), 32u);
  EXPECT_EQ(resolve_schedule("RRC", 4).letters(), "RRC");
}

TEST(Schedule, ParseErrorsNamePosition) {
  EXPECT_NE(parse_error("RRZ").find("position 3 ('Z')"), std::string::npos) << parse_error("RRZ");
  EXPECT_NE(parse_error("4x").find("position 3 (end)"), std::string::npos) << parse_error("4x");
  EXPECT_NE(parse_error("4(R)").find("position 2"), std::string::npos) << parse_error("4(R)");
  EXPECT_NE(parse_error("R(RR").find("position 2"), std::string::npos) << parse_error("R(RR");
  EXPECT_NE(parse_error("RR)").find("position 3"), std::string::npos) << parse_error("RR)");
  EXPECT_NE(parse_error("0xR").find("position 1"), std::string::npos) << parse_error("0xR");
  EXPECT_NE(parse_error("R()").find("position 2"), std::string::npos) << parse_error("R()");
  EXPECT_NE(parse_error("rrr").find("position 1"), std::string::npos) << parse_error("rrr");
  EXPECT_NE(parse_error("4x R").find("position 3"), std::string::npos) << parse_error("4x R");
  EXPECT_NE(parse_error(""), testing::kNoError);
  EXPECT_NE(parse_error("---"), testing::kNoError);
  EXPECT_NE(parse_error("99999xR"), testing::kNoError);
  EXPECT_NE(parse_error("1000x(1000xR)"), testing::kNoError);
  EXPECT_NE(parse_error("R++"), testing::kNoError);
  EXPECT_THROW(parse_schedule("R", -1), Error);
}

TEST(Schedule, LayerPatterns) {
  const std::vector<Grid> grids{{14, 16}, {4, 4}};
  const TokenOrder row = make_order(OrderKind::block_row, grids);
  const TokenOrder win = make_order(OrderKind::qwen_window, grids);
  const Schedule s = parse_schedule("RWF", 64);

  const Pattern pr = layer_pattern(s.layers[0], row);
  EXPECT_EQ(pr.window_left, 64);
  EXPECT_EQ(pr.window_right, 64);
  EXPECT_EQ(pr.chunk, 0);
  EXPECT_EQ(pr.num_seqs, 2);
  EXPECT_EQ(pr.cu_seqlens_q, row.cu_seqlens.data());

  const Pattern pw = layer_pattern(s.layers[1], win);
  EXPECT_EQ(pw.window_left, kUnbounded);
  EXPECT_EQ(pw.num_seqs, 5);
  EXPECT_EQ(pw.cu_seqlens_q, win.cu_windows.data());

  const Pattern pf = layer_pattern(s.layers[2], row);  // full works on any order
  EXPECT_EQ(pf.window_left, kUnbounded);
  EXPECT_EQ(pf.window_right, kUnbounded);
  EXPECT_EQ(pf.num_seqs, 2);

  EXPECT_THROW(layer_pattern(s.layers[0], win), Error);  // R layer on window-ordered tokens
  EXPECT_THROW(layer_pattern(s.layers[1], row), Error);  // chunk layer without windows
}

}  // namespace
}  // namespace ariadne
