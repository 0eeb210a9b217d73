// The Hopper wgmma kernel (src/attention/cuda/attention_wgmma.cuh) against the double-precision CPU reference.
//
// Every case forces the kernel through AttentionOverrides::cuda_kernel and asserts that the plan
// really routes it to the wgmma kernel
// (AttentionPlan::cuda_kernel): a silent fallback to the mma.sync kernel would make these tests pass without
// testing anything. Otherwise as test_attention_cuda.cpp: fresh random inputs per case (the seed
// changes per process, ARIADNE_TEST_SEED pins it), out and lse poisoned with NaN, the tolerance
// rule of tests/common.hpp, two runs compared bit for bit (a race would show there). Lengths are
// chosen around the 128-row query and key tiles (1, 77, 128, 300, 1500: partial tiles, exact
// tiles, many tiles through the 2-stage ring).
#include <cstdlib>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ariadne/attention.hpp"
#include "ariadne/device.hpp"
#include "common.hpp"
#include "cuda/cuda_common.hpp"

namespace ariadne {
namespace {

using testing::Case;
using namespace cuda_testing;

// Every case forces the wgmma kernel through the plan's overrides (a case it cannot take fails
// the plan, and the test).
class Wgmma : public ::testing::Test {};

void check_wgmma(Case c, bool f32_out = false) { check_wgmma_case(std::move(c), f32_out); }

TEST_F(Wgmma, FullAndCausalEveryDimDtypeLength) {
  for (const auto& [pname, pat] : {std::pair{"full", Pattern::full()}, std::pair{"causal", Pattern::causal()},
                                   std::pair{"causal_right9", Pattern::window(kUnbounded, 9)}})
    for (int dim : {64, 80, 128})
      for (DType dt : {DType::bf16, DType::f16})
        for (int64_t n : {1, 77, 128, 300}) {
          Case c = make_case(std::string("wgmma_") + pname + "_d" + std::to_string(dim) + "_" + dtype_name(dt) +
                                 "_n" + std::to_string(n),
                             {n}, dim, dt, pat);
          if ((dim / 16 + n) % 2 == 1) c.heads_q = c.heads_kv = 4;  // MHA on half of the cases
          check_wgmma(c);
        }
}

TEST_F(Wgmma, LongRowsAndLargeLogits) {
  // Many key tiles through the 2-stage ring (both consumers and the producer wrap several times);
  // logits up to about ±60 stress the online max.
  for (int dim : {64, 80, 128}) {
    Case c = make_case("wgmma_long_full_d" + std::to_string(dim), {1500}, dim, DType::bf16, Pattern::full());
    c.heads_q = c.heads_kv = 2;
    check_wgmma(c);
  }
  Case big = make_case("wgmma_large_logits_causal_d128", {700}, 128, DType::f16, Pattern::causal());
  big.input_scale = 2.f;
  check_wgmma(big);
}

TEST_F(Wgmma, SinksBothForms) {
  for (SinkMode mode : {SinkMode::denominator, SinkMode::key0_bias})
    for (float sink : {10.f, -10.f, std::numeric_limits<float>::quiet_NaN()})
      for (const auto& [name, pat] : {std::pair{"full", Pattern::full()}, std::pair{"causal", Pattern::causal()}})
        for (int dim : {80, 128}) {
          Case c = make_case(std::string("wgmma_sink_") + sink_mode_name(mode) + "_" + std::to_string(sink) + "_" +
                                 name + "_d" + std::to_string(dim),
                             {190}, dim, DType::bf16, pat);
          c.sink_mode = mode;
          c.sink_value = sink;
          check_wgmma(c);
        }
}

TEST_F(Wgmma, VarlenWithOneTokenAndEmptySequences) {
  for (const auto& [name, pat] : {std::pair{"full", Pattern::full()}, std::pair{"causal", Pattern::causal()}})
    for (DType dt : {DType::bf16, DType::f16})
      for (int dim : {64, 80}) {
        check_wgmma(make_case(std::string("wgmma_varlen_") + name + "_" + dtype_name(dt) + "_d" + std::to_string(dim),
                              {1, 0, 130, 64, 5, 300, 1}, dim, dt, pat));
      }
  for (SinkMode mode : {SinkMode::denominator, SinkMode::key0_bias}) {
    Case s = make_case(std::string("wgmma_varlen_sink_") + sink_mode_name(mode), {1, 0, 70, 129}, 128, DType::f16,
                       Pattern::causal());
    s.sink_mode = mode;
    s.sink_value = std::numeric_limits<float>::quiet_NaN();
    check_wgmma(s);
  }
}

TEST_F(Wgmma, ChunkedPrefillAndQueriesWithoutKeys) {
  // lq < lk (bottom-right causal), a sequence with queries and no keys (out = 0, lse = -inf, or the
  // sink's), and lq > lk (the first rows see no key).
  for (SinkMode mode : {SinkMode::none, SinkMode::denominator}) {
    Case c = make_case(std::string("wgmma_prefill_") + sink_mode_name(mode), {50, 7, 33, 200}, 128, DType::bf16,
                       Pattern::causal());
    c.seq_k = {300, 0, 33, 70};
    c.sink_mode = mode;
    c.sink_value = 1.5f;
    check_wgmma(c);
  }
  Case f = make_case("wgmma_prefill_full_d80", {70}, 80, DType::f16, Pattern::full());
  f.seq_k = {451};
  check_wgmma(f);
}

TEST_F(Wgmma, StridedViewsAndF32Out) {
  for (int64_t pad : {8, 24})
    for (int dim : {80, 128}) {
      Case c = make_case("wgmma_strided_pad" + std::to_string(pad) + "_d" + std::to_string(dim), {257}, dim,
                         DType::bf16, Pattern::causal());
      c.token_pad = pad;
      check_wgmma(c);
    }
  check_wgmma(make_case("wgmma_f32_out_causal", {150}, 64, DType::f16, Pattern::causal()), /*f32_out=*/true);
  check_wgmma(make_case("wgmma_f32_out_full_d80", {150}, 80, DType::bf16, Pattern::full()), /*f32_out=*/true);
}

TEST_F(Wgmma, RoutesOnlyWhatItSupports) {
  // By default supported calls go to wgmma, the rest stay on the other kernels.
  Case c = make_case("wgmma_route", {64}, 80, DType::bf16, Pattern::full());
  const testing::Inputs in = testing::make_inputs(c);
  DeviceCase d = upload(in);
  DeviceBuffer out(DType::bf16, {in.total_q, c.heads_q, c.dim});
  d.p.out = out.view();
  const AttentionParams& p = d.p;
  const AttentionPlan plan = plan_attention(p);
  EXPECT_EQ(plan.cuda_kernel(), CudaKernel::wgmma);
  EXPECT_EQ(plan.query_tile_rows(), 128);
  AttentionParams w = p;
  w.pattern = Pattern::window(64, 64);
  EXPECT_NE(plan_attention(w).cuda_kernel(), CudaKernel::wgmma) << "windows stay on the band kernel";
  EXPECT_THROW(plan_attention(w, on_kernel(CudaKernel::wgmma)), Error) << "a window cannot be forced onto wgmma";
  w.pattern = Pattern::chunked(64);
  EXPECT_NE(plan_attention(w).cuda_kernel(), CudaKernel::wgmma) << "chunks stay on the band kernel";
  EXPECT_THROW(plan_attention(w, on_kernel(CudaKernel::wgmma)), Error) << "a chunk cannot be forced onto wgmma";
  EXPECT_EQ(plan_attention(p, on_kernel(CudaKernel::tile)).cuda_kernel(), CudaKernel::tile)
      << "the tile kernel forced must route nothing to wgmma";
}

}  // namespace
}  // namespace ariadne
