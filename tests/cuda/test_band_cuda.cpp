// The band-walking window kernel (src/attention/cuda/attention_band.cuh) against the CPU reference, on the
// edges that are its own: lengths that are not multiples of the 64-row tiles or 16-key chunks,
// runs of query tiles that start or end inside a sequence, cross sequence boundaries (varlen,
// lq != lk) or hold one tile, asymmetric and one-sided windows at the eligibility limit, small and
// large chunks, both sinks, GQA, f32 out, and the fused token order. Each case first checks that
// the call is routed to the band kernel, so a change of eligibility cannot turn these tests into
// tests of the tile kernel. Sliding windows take the kernel by default (at head dim 80 the wgmma
// band kernel does), chunks only when forced: every case forces it through
// AttentionOverrides::cuda_kernel, and run lengths through AttentionOverrides::band_run.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
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

class CudaBand : public ::testing::Test {};

// The options that force the band kernel, with run length `run` (0: the launcher's choice).
AttentionOptions band_options(int run = 0) {
  AttentionOptions o = on_kernel(CudaKernel::band);
  o.overrides.band_run = run;
  return o;
}

Case band_case(const std::string& name, std::vector<int64_t> seq_q, int dim, DType dt, Pattern pat) {
  return make_case(name, std::move(seq_q), dim, dt, pat);  // GQA 4:1
}

// Routed to the band kernel, then the common check (fresh inputs, poisoned outputs, tolerance
// rule, two bit-identical runs).
void check_band(const Case& c, bool f32_out = false, int run = 0) {
  check_case(c, f32_out, band_options(run), [&](int, const AttentionPlan& plan) {
    ASSERT_EQ(plan.cuda_kernel(), CudaKernel::band) << c.name << ": not routed to the band kernel";
  });
}

std::string wname(const Pattern& p) {
  std::string s = "w";
  s += std::to_string(p.window_left);
  s += '_';
  s += std::to_string(p.window_right);
  return s;
}

TEST_F(CudaBand, WindowsEveryDimAndDtype) {
  // At the eligibility limit (left + right = 129), asymmetric, one-sided and zero-width windows.
  const std::vector<Pattern> windows = {Pattern::window(64, 64), Pattern::window(3, 100), Pattern::window(129, 0),
                                        Pattern::window(0, 129), Pattern::window(0, 0), Pattern::window(17, 5)};
  for (const Pattern& w : windows)
    for (int dim : {64, 80, 96})
      for (DType dt : {DType::bf16, DType::f16})
        for (int64_t n : {1, 17, 77, 300}) {
          Case c = band_case("band_" + wname(w) + "_d" + std::to_string(dim) + "_" + dtype_name(dt) + "_n" +
                                 std::to_string(n),
                             {n}, dim, dt, w);
          if (n == 77) c.heads_q = c.heads_kv = 3;  // no GQA
          check_band(c);
        }
}

TEST_F(CudaBand, HotPathWindows) {
  // Windows whose 16-row warps see exactly 9 chunks with masks on the first and last only (the hot
  // path) when the key offset lk - lq is a multiple of 16, and the guarded path when it is not;
  // ±64 with both sinks (key 0 lies in a hot warp's first chunk), and 10-chunk neighbours.
  const std::vector<Pattern> windows = {Pattern::window(64, 64), Pattern::window(48, 80), Pattern::window(0, 128),
                                        Pattern::window(128, 0), Pattern::window(63, 65), Pattern::window(64, 65)};
  for (const Pattern& w : windows)
    for (int64_t shift : {0, 16, -32, 5})
      for (SinkMode mode : {SinkMode::none, SinkMode::denominator, SinkMode::key0_bias}) {
        Case c = band_case("band_hot_" + wname(w) + "_shift" + std::to_string(shift) + "_" + sink_mode_name(mode),
                           {333, 260}, 80, DType::bf16, w);
        c.seq_k = {333 + shift, 260 + shift};
        c.sink_mode = mode;
        c.sink_value = mode == SinkMode::key0_bias ? std::numeric_limits<float>::quiet_NaN() : 2.5f;
        check_band(c);
      }
}

TEST_F(CudaBand, Chunks) {
  // Chunks of 1, 17 (not a multiple of the 16-key chunk), 64 (Qwen's windows) and 65 (the limit);
  // chunk with a causal window (chunked causal attention) and with a two-sided window.
  struct P {
    const char* name;
    Pattern pattern;
  };
  std::vector<P> patterns = {{"chunk1", Pattern::chunked(1)}, {"chunk17", Pattern::chunked(17)},
                             {"chunk64", Pattern::chunked(64)}, {"chunk65", Pattern::chunked(65)}};
  Pattern causal_chunk = Pattern::causal();
  causal_chunk.chunk = 48;
  patterns.push_back({"causal_chunk48", causal_chunk});
  Pattern window_chunk = Pattern::window(300, 2);  // the chunk makes it narrow
  window_chunk.chunk = 40;
  patterns.push_back({"window300_2_chunk40", window_chunk});
  for (const P& pp : patterns)
    for (int64_t n : {77, 333})
      check_band(band_case(std::string("band_") + pp.name + "_n" + std::to_string(n), {n}, 80, DType::bf16, pp.pattern));
}

TEST_F(CudaBand, RunBoundariesInVarlenBatches) {
  // Runs of 1, 2, 3 and 5 virtual tiles start inside sequences, end inside them and cross from one
  // sequence to the next (the ring restarts); the launcher's choice (0) gives one run per head
  // at these sizes. Key lengths differ from query lengths (bottom-right aligned), with empty and
  // one-token sequences on either side.
  for (int run : {0, 1, 2, 3, 5}) {
    for (const auto& [name, pat] : {std::pair{"w64", Pattern::window(64, 64)}, std::pair{"w7_40", Pattern::window(7, 40)},
                                    std::pair{"chunk64", Pattern::chunked(64)}}) {
      Case c = band_case(std::string("band_varlen_") + name + "_run" + std::to_string(run), {1, 0, 130, 64, 5, 200, 1},
                         80, DType::bf16, pat);
      c.seq_k = {3, 4, 100, 64, 0, 260, 1};
      check_band(c, false, run);
      Case same = band_case(std::string("band_varlen_same_") + name + "_run" + std::to_string(run),
                            {65, 1, 128, 0, 191, 7}, 64, DType::f16, pat);
      check_band(same, false, run);
    }
    // One long sequence: many tiles per run, the ring wrapping several times.
    Case longc = band_case("band_long_w64_run" + std::to_string(run), {1111}, 80, DType::bf16, Pattern::window(64, 64));
    longc.heads_q = longc.heads_kv = 2;
    check_band(longc, false, run);
  }
}

TEST_F(CudaBand, SinksAndF32Out) {
  for (SinkMode mode : {SinkMode::denominator, SinkMode::key0_bias})
    for (float sink : {10.f, -10.f, std::numeric_limits<float>::quiet_NaN()})
      for (bool f32 : {false, true}) {
        Case c = band_case(std::string("band_sink_") + sink_mode_name(mode) + "_" + std::to_string(sink) +
                               (f32 ? "_f32out" : ""),
                           {70, 200}, 80, DType::bf16, Pattern::window(64, 64));
        c.seq_k = {90, 150};
        c.sink_mode = mode;
        c.sink_value = sink;
        check_band(c, f32);
      }
}

TEST_F(CudaBand, SmallCasesForSanitizers) {
  // Small enough for compute-sanitizer: a two-sequence batch, run length 1 (ring restarts on
  // every tile and sequence) and the launcher's choice, both sinks.
  for (int run : {0, 1}) {
    for (SinkMode mode : {SinkMode::none, SinkMode::denominator, SinkMode::key0_bias}) {
      Case c = band_case("band_small_run" + std::to_string(run) + "_" + sink_mode_name(mode), {150, 33}, 80,
                         DType::bf16, Pattern::window(64, 64));
      c.sink_mode = mode;
      c.sink_value = std::numeric_limits<float>::quiet_NaN();
      check_band(c, false, run);
    }
  }
}

TEST_F(CudaBand, FusedTokenOrder) {
  // A 24 x 20 grid's column-major traversal and a random permutation, over the band kernel with
  // two run lengths. Expected: the reference on gathered inputs, scattered back to storage order.
  const int rows = 24, cols = 20, total = rows * cols;
  const GridOrders orders = grid_orders(rows, cols);
  for (int run : {0, 2})
    for (const auto& [oname, order] : {std::pair{"colmajor", orders.column_major}, std::pair{"shuffled", orders.shuffled}})
      for (const auto& [pname, pat] : {std::pair{"w64", Pattern::window(64, 64)}, std::pair{"chunk64", Pattern::chunked(64)}})
        for (SinkMode mode : {SinkMode::none, SinkMode::denominator}) {
                Case c = band_case(std::string("band_order_") + oname + "_" + pname + "_run" + std::to_string(run) + "_" +
                                 sink_mode_name(mode),
                             {total}, 80, DType::bf16, pat);
          c.sink_mode = mode;
          c.sink_value = std::numeric_limits<float>::quiet_NaN();
          c.seed = base_seed() ^ std::hash<std::string>{}(c.name);
          SCOPED_TRACE(c.name + " (ARIADNE_TEST_SEED=" + std::to_string(base_seed()) + ")");
          const testing::Inputs in = testing::make_inputs(c);

          const OrderedReference want = ordered_reference(c, in, order);

          DeviceCase d = upload(in);
          const DeviceBuffer d_order = DeviceBuffer::from_ints(order);
          DeviceBuffer out(c.dtype, {total, c.heads_q, c.dim}), lse(DType::f32, {c.heads_q, total});
          out.fill_bytes(0xFF);
          lse.fill_bytes(0xFF);
          d.p.out = out.view();
          d.p.lse = lse.view();
          d.p.order = static_cast<const int32_t*>(d_order.data());
          const AttentionPlan plan = plan_attention(d.p, band_options(run));
          ASSERT_EQ(plan.cuda_kernel(), CudaKernel::band);
          ariadne::run(plan, d.p);
          cuda_synchronize();
          const double tol = testing::tolerance(c.dtype, testing::max_abs_logit(in));
          EXPECT_TRUE(testing::close_enough("out", testing::compare(out.to_host().view(), want.out.view()), tol));
          EXPECT_TRUE(testing::lse_close(lse.to_host().view(), want.lse.view(), tol));
        }
}

TEST_F(CudaBand, WideBandsStayOnTheTileKernel) {
  // Past the eligibility bound (and head dim 128) the band kernel cannot be forced and the tile
  // kernel serves the call; so does every call with the tile kernel forced, and a chunked pattern
  // unless the band kernel is forced. Windows take it by default (at head dim 80: the wgmma band kernel).
  Case wide = band_case("band_wide_w65_65", {300}, 80, DType::bf16, Pattern::window(65, 65));
  EXPECT_THROW(plan_case(wide, band_options()), Error);
  EXPECT_EQ(plan_case(wide).cuda_kernel(), CudaKernel::tile);
  check_case(wide);
  Case d128 = band_case("band_d128_w64", {300}, 128, DType::bf16, Pattern::window(64, 64));
  EXPECT_THROW(plan_case(d128, band_options()), Error);
  EXPECT_NE(plan_case(d128).cuda_kernel(), CudaKernel::band);
  Case chunk = band_case("band_chunk66", {300}, 80, DType::bf16, Pattern::chunked(66));
  EXPECT_THROW(plan_case(chunk, band_options()), Error);
  EXPECT_NE(plan_case(chunk).cuda_kernel(), CudaKernel::band);
  Case narrow = band_case("band_w64_switched_off", {300}, 80, DType::bf16, Pattern::window(64, 64));
  EXPECT_EQ(plan_case(narrow, band_options()).cuda_kernel(), CudaKernel::band);
  Case chunk64 = band_case("band_chunk64_default", {300}, 80, DType::bf16, Pattern::chunked(64));
  EXPECT_EQ(plan_case(chunk64, band_options()).cuda_kernel(), CudaKernel::band);
  EXPECT_EQ(plan_case(narrow).cuda_kernel(), CudaKernel::bandwg);  // d 80: the wgmma band kernel
  Case narrow64 = band_case("band_w64_d64", {300}, 64, DType::bf16, Pattern::window(64, 64));
  EXPECT_EQ(plan_case(narrow64).cuda_kernel(), CudaKernel::band);
  Case chunk64_d64 = band_case("band_chunk64_d64", {300}, 64, DType::bf16, Pattern::chunked(64));
  EXPECT_EQ(plan_case(chunk64_d64).cuda_kernel(), CudaKernel::tile) << "chunks are not the band kernel's by default";
  EXPECT_EQ(plan_case(narrow, on_kernel(CudaKernel::tile)).cuda_kernel(), CudaKernel::tile);
  check_case(narrow, false, on_kernel(CudaKernel::tile));
}

}  // namespace
}  // namespace ariadne
