// The wgmma kernel's two copy paths (src/attention/cuda/attention_wgmma.cuh, bench/cuda-notes.md v12): TMA
// box copies into swizzled tiles (the default), and the cp.async producer writing the same
// layout (ARIADNE_TMA=0, and every tile with rows past a sequence's end on either setting).
//
// Each case runs once per path, asserting the route first (cuda_uses_wgmma and
// cuda_wgmma_uses_tma): a silent fallback would make the TMA half test the cp.async producer
// twice. Otherwise as test_attention_wgmma.cpp: fresh random inputs (ARIADNE_TEST_SEED pins them),
// outputs poisoned with NaN, the CPU reference with the tolerance rule, two runs bit-identical.
// Lengths mix whole 128-row tiles (TMA) with partial last tiles (cp.async on both settings) and
// rings that wrap many times (1500 keys: 12 tiles through 3 or 4 stages). One test forces the
// consumers' ping-pong (ARIADNE_WG_PINGPONG) each way.
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ariadne/attention.hpp"
#include "common.hpp"
#include "cuda/cuda_common.hpp"
#include "attention/cuda/internal.hpp"

namespace ariadne {
namespace {

using testing::Case;
using namespace cuda_testing;

class WgmmaTma : public ::testing::Test {
 protected:
  EnvGuard wgmma_{"ARIADNE_WGMMA"}, tma_{"ARIADNE_TMA"};
  void SetUp() override { setenv("ARIADNE_WGMMA", "1", 1); }

  // Runs `c` on the TMA path, then on the cp.async path.
  static void both_paths(const Case& c) {
    for (int tma : {1, 0}) {
      if (tma) unsetenv("ARIADNE_TMA");
      else setenv("ARIADNE_TMA", "0", 1);
      Case run = c;
      run.name += tma ? "_tma" : "_cpasync";
      check_case(run, /*f32_out=*/false, /*require_wgmma=*/true, tma);
    }
  }
};

TEST_F(WgmmaTma, FullAndCausalEveryDimDtype) {
  for (const auto& [pname, pat] : {std::pair{"full", Pattern::full()}, std::pair{"causal", Pattern::causal()}})
    for (int dim : {64, 80, 128})
      for (DType dt : {DType::bf16, DType::f16})
        for (int64_t n : {128, 300, 1500}) {
          Case c = make_case(std::string("tma_") + pname + "_d" + std::to_string(dim) + "_" + dtype_name(dt) + "_n" +
                                 std::to_string(n),
                             {n}, dim, dt, pat);
          if (n == 300) c.heads_q = c.heads_kv = 3;  // MHA, an odd head count
          both_paths(c);
        }
}

TEST_F(WgmmaTma, VarlenPrefillSinksStrides) {
  for (int dim : {64, 80, 128}) {
    // Sequences that end inside a tile next to whole-tile sequences: the tails' neighbours in the
    // tensor are other sequences' rows, which only the cp.async tiles keep out.
    both_paths(make_case("tma_varlen_causal_d" + std::to_string(dim), {1, 0, 256, 130, 5, 384, 1}, dim, DType::bf16,
                         Pattern::causal()));
    Case pre = make_case("tma_prefill_d" + std::to_string(dim), {128, 7, 200, 256}, dim, DType::f16,
                         Pattern::causal());
    pre.seq_k = {512, 0, 333, 256};  // lq < lk (bottom-right causal), a sequence without keys
    pre.sink_mode = SinkMode::denominator;
    pre.sink_value = 1.5f;
    both_paths(pre);
    Case key0 = make_case("tma_key0_sink_d" + std::to_string(dim), {640}, dim, DType::bf16, Pattern::full());
    key0.sink_mode = SinkMode::key0_bias;
    key0.sink_value = std::numeric_limits<float>::quiet_NaN();  // random per head
    both_paths(key0);
    Case strided = make_case("tma_strided_d" + std::to_string(dim), {512}, dim, DType::bf16, Pattern::causal());
    strided.token_pad = 24;  // token stride not a multiple of the row: the map's stride, not its width
    both_paths(strided);
  }
}

TEST_F(WgmmaTma, BlockSparseRows) {
  for (int dim : {64, 80, 128})
    for (double density : {0.25, 0.6}) {
      Case c = make_case("tma_blocks" + std::to_string(int(density * 100)) + "_d" + std::to_string(dim), {1024}, dim,
                         DType::bf16, Pattern::causal());
      c.block = 128;
      c.block_density = density;
      both_paths(c);
      Case b = make_case("tma_blocks256_full" + std::to_string(int(density * 100)) + "_d" + std::to_string(dim),
                         {700}, dim, DType::f16, Pattern::full());
      b.block = 256;
      b.block_density = density;
      both_paths(b);
    }
}

TEST_F(WgmmaTma, ConsumerPingPongBothWays) {
  // The consumers' turn-taking (default on for d 64 and 80, off for d 128) forced each way on
  // every head dim: whole tiles, a partial last tile, a single tile (n = 1 issue pair), empty rows.
  EnvGuard pingpong("ARIADNE_WG_PINGPONG");
  for (const char* pp : {"1", "0"}) {
    setenv("ARIADNE_WG_PINGPONG", pp, 1);
    for (int dim : {64, 80, 128})
      for (const auto& [pname, pat] : {std::pair{"full", Pattern::full()}, std::pair{"causal", Pattern::causal()}}) {
        Case c = make_case(std::string("tma_pingpong") + pp + "_" + pname + "_d" + std::to_string(dim),
                           {1100, 128, 0, 1}, dim, DType::bf16, pat);
        check_case(c, /*f32_out=*/false, /*require_wgmma=*/true, /*require_tma=*/1);
      }
    // Block-sparse rows (blocks of 128 and 256) with either schedule: d 128 takes ping-pong on
    // short rows by default (cuda_wgmma_pingpong), so both must hold there too.
    for (int block : {128, 256})
      for (double density : {0.1, 0.6}) {
        Case c = make_case(std::string("tma_pingpong") + pp + "_blocks" + std::to_string(block) + "_" +
                               std::to_string(int(density * 100)),
                           {1300}, 128, DType::bf16, Pattern::causal());
        c.block = block;
        c.block_density = density;
        check_case(c, /*f32_out=*/false, /*require_wgmma=*/true, /*require_tma=*/1);
      }
  }
}

// At head dim 128 and 80 (the OT kernels) a consumer whose 64 rows lie in its sequence stores O
// through its half of the Q buffer and the copy engine (cuda_wgmma_stores_by_tma); the others,
// and ARIADNE_WG_OUT_TMA=0, store per thread. The two must give the same bits (run 0 off, run 1
// on, then the reference): whole tiles, partial last tiles (consumer 0's half whole, consumer 1's
// not), varlen prefill with empty and one-token sequences and a denominator sink, a key0 sink,
// block-sparse rows with the ping-pong schedule, GQA, both dtypes; and f32 out takes the
// per-thread path. At d 80 the two runs are two kernels (the OT
// instantiation and the other), so their bits agreeing checks the 32-byte swizzle's store layout.
TEST_F(WgmmaTma, OutputThroughTheCopyEngineBothWays) {
  EnvGuard out_tma("ARIADNE_WG_OUT_TMA");
  for (int dim : {128, 80}) {
    const std::string ds = "_d" + std::to_string(dim);
    Case causal = make_case("otma_causal" + ds, {1100, 128, 0, 1, 200}, dim, DType::bf16, Pattern::causal());
    Case full = make_case("otma_full_gqa" + ds, {640}, dim, DType::f16, Pattern::full());
    full.heads_q = 8;
    full.heads_kv = 2;
    Case pre = make_case("otma_prefill_sink" + ds, {128, 7, 200, 256}, dim, DType::f16, Pattern::causal());
    pre.seq_k = {512, 0, 333, 256};
    pre.sink_mode = SinkMode::denominator;
    pre.sink_value = 1.5f;
    Case key0 = make_case("otma_key0" + ds, {700}, dim, DType::bf16, Pattern::full());
    key0.sink_mode = SinkMode::key0_bias;
    key0.sink_value = std::numeric_limits<float>::quiet_NaN();
    Case blocks = make_case("otma_blocks" + ds, {1300}, dim, DType::bf16, Pattern::causal());
    blocks.block = 128;
    blocks.block_density = 0.2;
    for (Case c : {causal, full, pre, key0, blocks}) {
      c.seed = base_seed() ^ std::hash<std::string>{}(c.name);
      SCOPED_TRACE(c.name + " (ARIADNE_TEST_SEED=" + std::to_string(base_seed()) + ")");
      const testing::Inputs in = testing::make_inputs(c);
      const testing::Result ref = testing::run_reference(in);
      DeviceCase d = upload(in);
      d.p.blocks_nnz = c.block_density > 0 ? int64_t(in.mask.col_idx.size()) : -1;
      int run = 0;
      check_runs(d, c.dtype, ref.out, ref.lse, testing::tolerance(c.dtype, testing::max_abs_logit(in)),
                 [&](const AttentionParams& p) {
                   if (run == 0)
                     setenv("ARIADNE_WG_OUT_TMA", "0", 1);
                   else
                     unsetenv("ARIADNE_WG_OUT_TMA");
                   ASSERT_TRUE(cuda_uses_wgmma(p));
                   ASSERT_EQ(cuda_wgmma_stores_by_tma(p), run == 1) << "run " << run;
                   ++run;
                 });
      EXPECT_EQ(run, 2);
    }
  }
  unsetenv("ARIADNE_WG_OUT_TMA");
  for (int dim : {128, 80}) {
    Case f32 = make_case("otma_f32_out_d" + std::to_string(dim), {300}, dim, DType::bf16, Pattern::causal());
    {
      const testing::Inputs in = testing::make_inputs(f32);
      DeviceCase d = upload(in);
      DeviceBuffer out(DType::f32, {in.total_q, f32.heads_q, f32.dim});
      d.p.out = out.view();
      EXPECT_FALSE(cuda_wgmma_stores_by_tma(d.p)) << "f32 out stores per thread";
    }
    check_case(f32, /*f32_out=*/true, /*require_wgmma=*/true, /*require_tma=*/1);
  }
}

// Which calls store O through the copy engine by default: d 128 and 80 at every length, one
// sequence or a batch; d 64 never (v45: its OT kernel measured 1.3-1.7% slower at N 4096 and
// 0.5-0.8% at 8K-32K causal, 1.5-2.7% faster only on batches of 1024-token rows);
// ARIADNE_WG_OUT_TMA=0 nowhere.
TEST_F(WgmmaTma, OutputThroughTheCopyEngineRoutes) {
  EnvUnset out_tma("ARIADNE_WG_OUT_TMA");
  const auto routed = [](std::vector<int64_t> seqs, int dim) {
    Case c = make_case("otma_route", seqs, dim, DType::bf16, Pattern::full());
    c.heads_q = c.heads_kv = 1;
    const testing::Inputs in = testing::make_inputs(c);
    DeviceCase d = upload(in);
    DeviceBuffer out(DType::bf16, {in.total_q, c.heads_q, c.dim});
    d.p.out = out.view();
    return cuda_wgmma_stores_by_tma(d.p);
  };
  for (int dim : {80, 128}) {
    EXPECT_TRUE(routed({1024}, dim)) << dim;
    EXPECT_TRUE(routed({16384}, dim)) << dim;
    EXPECT_TRUE(routed({1024, 1024, 1024, 1024}, dim)) << dim;
  }
  EXPECT_FALSE(routed({1024}, 64));
  setenv("ARIADNE_WG_OUT_TMA", "0", 1);
  EXPECT_FALSE(routed({1024}, 80));
  EXPECT_FALSE(routed({1024}, 128));
}

// The d 128 kernel's default schedule (cuda_wgmma_pingpong): ping-pong when its query tiles visit at
// most 40 key tiles on average as the host knows it; d 64 / 80 always; the variable forces it.
TEST_F(WgmmaTma, PingPongRoutes) {
  EnvUnset pingpong("ARIADNE_WG_PINGPONG");
  const auto routed = [](int64_t tokens, int dim, Pattern pat, int64_t nnz) {
    Case c = make_case("pp_route", {tokens}, dim, DType::bf16, pat);
    c.heads_q = c.heads_kv = 1;
    const testing::Inputs in = testing::make_inputs(c);
    DeviceCase d = upload(in);
    DeviceBuffer out(DType::bf16, {in.total_q, c.heads_q, c.dim});
    d.p.out = out.view();
    d.p.blocks_nnz = nnz;
    return cuda_wgmma_pingpong(d.p);
  };
  // Causal: (N / 128 + 1) / 2 key tiles on average: 8K ~32.5 (on), 16K ~64.5 (off).
  EXPECT_TRUE(routed(8192, 128, Pattern::causal(), -1));
  EXPECT_FALSE(routed(16384, 128, Pattern::causal(), -1));
  // Full rows: N / 128 tiles: 4K 32 (on), 8K 64 (off).
  EXPECT_TRUE(routed(4096, 128, Pattern::full(), -1));
  EXPECT_FALSE(routed(8192, 128, Pattern::full(), -1));
  EXPECT_TRUE(routed(16384, 80, Pattern::causal(), -1)) << "d 80 keeps ping-pong whatever the length";
  // A varlen batch of dense rows: unknown on the host, off.
  {
    Case c = make_case("pp_route_varlen", {300, 500}, 128, DType::bf16, Pattern::causal());
    const testing::Inputs in = testing::make_inputs(c);
    DeviceCase d = upload(in);
    DeviceBuffer out(DType::bf16, {in.total_q, c.heads_q, c.dim});
    d.p.out = out.view();
    EXPECT_FALSE(cuda_wgmma_pingpong(d.p));
  }
  // Block-sparse rows: from blocks_nnz (1 head, 128 query blocks of 128 at 16K): 128 x 13 listed
  // blocks is ~13 tiles a row (on), 128 x 50 is 50 (off), unknown (-1) is off.
  {
    Case c = make_case("pp_route_blocks", {16384}, 128, DType::bf16, Pattern::causal());
    c.heads_q = c.heads_kv = 1;
    c.block = 128;
    c.block_density = 0.1;
    const testing::Inputs in = testing::make_inputs(c);
    DeviceCase d = upload(in);
    DeviceBuffer out(DType::bf16, {in.total_q, c.heads_q, c.dim});
    d.p.out = out.view();
    ASSERT_TRUE(cuda_uses_wgmma(d.p));
    d.p.blocks_nnz = 128 * 13;
    EXPECT_TRUE(cuda_wgmma_pingpong(d.p));
    d.p.blocks_nnz = 128 * 50;
    EXPECT_FALSE(cuda_wgmma_pingpong(d.p));
    d.p.blocks_nnz = -1;
    EXPECT_FALSE(cuda_wgmma_pingpong(d.p));
  }
  setenv("ARIADNE_WG_PINGPONG", "1", 1);
  EXPECT_TRUE(routed(16384, 128, Pattern::causal(), -1));
  setenv("ARIADNE_WG_PINGPONG", "0", 1);
  EXPECT_FALSE(routed(4096, 80, Pattern::causal(), -1));
}

TEST_F(WgmmaTma, SwitchRoutes) {
  Case c = make_case("tma_route", {256}, 80, DType::bf16, Pattern::full());
  const testing::Inputs in = testing::make_inputs(c);
  DeviceCase d = upload(in);
  DeviceBuffer out(DType::bf16, {in.total_q, c.heads_q, c.dim});
  d.p.out = out.view();
  const AttentionParams& p = d.p;
  unsetenv("ARIADNE_TMA");
  EXPECT_TRUE(cuda_wgmma_uses_tma(p));
  setenv("ARIADNE_TMA", "0", 1);
  EXPECT_FALSE(cuda_wgmma_uses_tma(p)) << "the switch off must keep the cp.async producer";
  unsetenv("ARIADNE_TMA");
  setenv("ARIADNE_WGMMA", "0", 1);
  EXPECT_FALSE(cuda_wgmma_uses_tma(p)) << "no wgmma kernel, no TMA path";
}

}  // namespace
}  // namespace ariadne
