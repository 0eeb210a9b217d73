// The wgmma kernel's two copy paths (src/attention/cuda/attention_wgmma.cuh): TMA
// box copies into swizzled tiles (the default), and the cp.async producer writing the same
// layout (AttentionOverrides::tma = off, and every tile with rows past a sequence's end on either setting).
//
// Each case runs once per path, asserting the route first (AttentionPlan::cuda_kernel and
// AttentionPlan::uses_tma): a silent fallback would make the TMA half test the cp.async producer
// twice. Otherwise as test_attention_wgmma.cpp: fresh random inputs (ARIADNE_TEST_SEED pins them),
// outputs poisoned with NaN, the CPU reference with the tolerance rule, two runs bit-identical.
// Lengths mix whole 128-row tiles (TMA) with partial last tiles (cp.async on both settings) and
// rings that wrap many times (1500 keys: 12 tiles through 3 or 4 stages). One test forces the
// consumers' ping-pong (AttentionOverrides::pingpong) each way.
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ariadne/attention.hpp"
#include "common.hpp"
#include "cuda/cuda_common.hpp"

namespace ariadne {
namespace {

using testing::Case;
using namespace cuda_testing;

// The wgmma kernel forced with these knobs (its other fields ignored), and the plan asserted to say so.
AttentionOptions wgmma_options(AttentionOverrides ov = {}) {
  AttentionOptions o;
  o.backend = Backend::cuda;
  o.overrides = ov;
  o.overrides.cuda_kernel = CudaKernel::wgmma;
  return o;
}

void check_wgmma_with(const Case& c, AttentionOverrides ov, bool f32_out = false) {
  const AttentionOptions o = wgmma_options(ov);
  check_case(c, f32_out, o, [&](int, const AttentionPlan& plan) {
    ASSERT_EQ(plan.cuda_kernel(), CudaKernel::wgmma) << "not routed to the wgmma kernel";
    ASSERT_TRUE(plan.uses_tma()) << "not on the TMA path";
    if (ov.pingpong != Toggle::automatic) {
      ASSERT_EQ(plan.pingpong(), ov.pingpong == Toggle::on);
    }
  });
}

class WgmmaTma : public ::testing::Test {
 protected:
  // Runs `c` on the TMA path, then on the cp.async path.
  static void both_paths(const Case& c) {
    for (int tma : {1, 0}) {
      Case run = c;
      run.name += tma ? "_tma" : "_cpasync";
      check_wgmma_case(run, /*f32_out=*/false, tma);
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
  for (const char* pp : {"1", "0"}) {
    AttentionOverrides ov;
    ov.tma = Toggle::on;
    ov.pingpong = std::string(pp) == "1" ? Toggle::on : Toggle::off;
    for (int dim : {64, 80, 128})
      for (const auto& [pname, pat] : {std::pair{"full", Pattern::full()}, std::pair{"causal", Pattern::causal()}}) {
        Case c = make_case(std::string("tma_pingpong") + pp + "_" + pname + "_d" + std::to_string(dim),
                           {1100, 128, 0, 1}, dim, DType::bf16, pat);
        check_wgmma_with(c, ov);
      }
    // Block-sparse rows (blocks of 128 and 256) with either schedule: d 128 takes ping-pong on
    // short rows by default (AttentionPlan::pingpong), so both must hold there too.
    for (int block : {128, 256})
      for (double density : {0.1, 0.6}) {
        Case c = make_case(std::string("tma_pingpong") + pp + "_blocks" + std::to_string(block) + "_" +
                               std::to_string(int(density * 100)),
                           {1300}, 128, DType::bf16, Pattern::causal());
        c.block = block;
        c.block_density = density;
        check_wgmma_with(c, ov);
      }
  }
}

// At head dim 128 and 80 (the OT kernels) a consumer whose 64 rows lie in its sequence stores O
// through its half of the Q buffer and the copy engine (AttentionPlan::stores_by_tma); the others,
// and AttentionOverrides::out_tma = off, store per thread. The two must give the same bits (run 0 off, run 1
// on, then the reference): whole tiles, partial last tiles (consumer 0's half whole, consumer 1's
// not), varlen prefill with empty and one-token sequences and a denominator sink, a key0 sink,
// block-sparse rows with the ping-pong schedule, GQA, both dtypes; and f32 out takes the
// per-thread path. At d 80 the two runs are two kernels (the OT
// instantiation and the other), so their bits agreeing checks the 32-byte swizzle's store layout.
TEST_F(WgmmaTma, OutputThroughTheCopyEngineBothWays) {
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
      int runs = 0;
      check_runs(
          d, c.dtype, ref.out, ref.lse, testing::tolerance(c.dtype, testing::max_abs_logit(in)), wgmma_options(),
          [&](int run, const AttentionPlan& plan) {
            ASSERT_EQ(plan.cuda_kernel(), CudaKernel::wgmma);
            ASSERT_EQ(plan.stores_by_tma(), run == 1) << "run " << run;
            ++runs;
          },
          [](int run, AttentionOptions& o) { o.overrides.out_tma = run == 0 ? Toggle::off : Toggle::automatic; });
      EXPECT_EQ(runs, 2);
    }
  }
  for (int dim : {128, 80}) {
    Case f32 = make_case("otma_f32_out_d" + std::to_string(dim), {300}, dim, DType::bf16, Pattern::causal());
    {
      const testing::Inputs in = testing::make_inputs(f32);
      DeviceCase d = upload(in);
      DeviceBuffer out(DType::f32, {in.total_q, f32.heads_q, f32.dim});
      d.p.out = out.view();
      EXPECT_FALSE(plan_attention(d.p).stores_by_tma()) << "f32 out stores per thread";
      AttentionOverrides on;
      on.out_tma = Toggle::on;
      EXPECT_THROW(plan_attention(d.p, wgmma_options(on)), Error) << "out_tma = on cannot apply to f32 out";
    }
    AttentionOverrides tma;
    tma.tma = Toggle::on;
    check_wgmma_with(f32, tma, /*f32_out=*/true);
  }
}

// Which calls store O through the copy engine by default: d 128 and 80 at every length, one
// sequence or a batch; d 64 never (its OT kernel measured 1.3-1.7% slower at N 4096 and
// 0.5-0.8% at 8K-32K causal, 1.5-2.7% faster only on batches of 1024-token rows);
// AttentionOverrides::out_tma = off nowhere.
TEST_F(WgmmaTma, OutputThroughTheCopyEngineRoutes) {
  const auto routed = [](std::vector<int64_t> seqs, int dim, Toggle out_tma = Toggle::automatic) {
    Case c = make_case("otma_route", seqs, dim, DType::bf16, Pattern::full());
    c.heads_q = c.heads_kv = 1;
    const testing::Inputs in = testing::make_inputs(c);
    DeviceCase d = upload(in);
    DeviceBuffer out(DType::bf16, {in.total_q, c.heads_q, c.dim});
    d.p.out = out.view();
    AttentionOptions o;
    o.overrides.out_tma = out_tma;
    return plan_attention(d.p, o).stores_by_tma();
  };
  for (int dim : {80, 128}) {
    EXPECT_TRUE(routed({1024}, dim)) << dim;
    EXPECT_TRUE(routed({16384}, dim)) << dim;
    EXPECT_TRUE(routed({1024, 1024, 1024, 1024}, dim)) << dim;
  }
  EXPECT_FALSE(routed({1024}, 64));
  EXPECT_FALSE(routed({1024}, 80, Toggle::off));
  EXPECT_FALSE(routed({1024}, 128, Toggle::off));
  EXPECT_THROW(routed({1024}, 64, Toggle::on), Error) << "head dim 64 has no output map";
}

// The d 128 kernel's default schedule (AttentionPlan::pingpong): ping-pong when its query tiles visit
// at most 40 key tiles on average as the host knows it; d 64 / 80 always; the override forces it.
TEST_F(WgmmaTma, PingPongRoutes) {
  const auto routed = [](int64_t tokens, int dim, Pattern pat, int64_t nnz, Toggle pp = Toggle::automatic) {
    Case c = make_case("pp_route", {tokens}, dim, DType::bf16, pat);
    c.heads_q = c.heads_kv = 1;
    const testing::Inputs in = testing::make_inputs(c);
    DeviceCase d = upload(in);
    DeviceBuffer out(DType::bf16, {in.total_q, c.heads_q, c.dim});
    d.p.out = out.view();
    d.p.blocks_nnz = nnz;
    AttentionOptions o;
    o.overrides.pingpong = pp;
    return plan_attention(d.p, o).pingpong();
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
    EXPECT_FALSE(plan_attention(d.p).pingpong());
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
    ASSERT_EQ(plan_attention(d.p).cuda_kernel(), CudaKernel::wgmma);
    d.p.blocks_nnz = 128 * 13;
    EXPECT_TRUE(plan_attention(d.p).pingpong());
    d.p.blocks_nnz = 128 * 50;
    EXPECT_FALSE(plan_attention(d.p).pingpong());
    d.p.blocks_nnz = -1;
    EXPECT_FALSE(plan_attention(d.p).pingpong());
  }
  EXPECT_TRUE(routed(16384, 128, Pattern::causal(), -1, Toggle::on));
  EXPECT_FALSE(routed(4096, 80, Pattern::causal(), -1, Toggle::off));
}

TEST_F(WgmmaTma, SwitchRoutes) {
  Case c = make_case("tma_route", {256}, 80, DType::bf16, Pattern::full());
  const testing::Inputs in = testing::make_inputs(c);
  DeviceCase d = upload(in);
  DeviceBuffer out(DType::bf16, {in.total_q, c.heads_q, c.dim});
  d.p.out = out.view();
  const AttentionParams& p = d.p;
  EXPECT_TRUE(plan_attention(p).uses_tma());
  AttentionOptions off;
  off.overrides.tma = Toggle::off;
  EXPECT_FALSE(plan_attention(p, off).uses_tma()) << "tma = off must keep the cp.async producer";
  EXPECT_FALSE(plan_attention(p, on_kernel(CudaKernel::tile)).uses_tma()) << "no wgmma kernel, no TMA path";
  AttentionOptions tile_tma = on_kernel(CudaKernel::tile);
  tile_tma.overrides.tma = Toggle::on;
  EXPECT_THROW(plan_attention(p, tile_tma), Error) << "tma applies to the wgmma kernel only";
}

}  // namespace
}  // namespace ariadne
