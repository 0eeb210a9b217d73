// The wgmma kernel's two copy paths (src/cuda/attention_wgmma.cuh, bench/cuda-notes.md v12): TMA
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
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ariadne/attention.hpp"
#include "common.hpp"
#include "cuda/cuda_common.hpp"
#include "cuda/internal.hpp"

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
  }
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
