// Plan, then run on the host backends (ariadne/attention.hpp): the plan names its backend, run()
// gives attention()'s bits, a plan runs again on other tensors of its shapes, CUDA overrides and
// mismatched params are errors naming why.
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ariadne/attention.hpp"
#include "common.hpp"

namespace ariadne {
namespace {

using testing::Case;

Case plan_case(const std::string& name, std::vector<int64_t> seq, Pattern pat, DType dt = DType::f32) {
  Case c;
  c.name = name;
  c.seq_q = std::move(seq);
  c.pattern = pat;
  c.dtype = dt;
  c.heads_q = 4;
  c.heads_kv = 2;
  c.seed = std::hash<std::string>{}(name);
  return c;
}

struct Outputs {
  Buffer out, lse;
  Outputs(const testing::Inputs& in, DType dt)
      : out(dt, {in.total_q, in.params.heads_q(), in.params.head_dim()}), lse(DType::f32, {in.params.heads_q(), in.total_q}) {}
  void attach(AttentionParams& p) {
    p.out = out.view();
    p.lse = lse.view();
  }
  bool same(const Outputs& o) const {
    return std::memcmp(out.data(), o.out.data(), size_t(out.numel()) * dtype_size(out.dtype())) == 0 &&
           std::memcmp(lse.data(), o.lse.data(), size_t(lse.numel()) * sizeof(float)) == 0;
  }
};

std::string thrown(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

TEST(AttentionPlan, HostBackendsRunAsAttentionDoes) {
  for (Backend b : {Backend::reference, Backend::cpu, Backend::automatic})
    for (const Pattern& pat : {Pattern::causal(), Pattern::window(8, 3), Pattern::chunked(16)}) {
      const Case c = plan_case(std::string("plan_") + backend_name(b) + "_" + describe(pat), {70, 0, 33}, pat);
      SCOPED_TRACE(c.name);
      const testing::Inputs in = testing::make_inputs(c);
      AttentionParams p = in.params;
      Outputs want(in, c.dtype), got(in, c.dtype);
      want.attach(p);
      attention(p, b);
      got.attach(p);
      AttentionOptions o;
      o.backend = b;
      const AttentionPlan plan = plan_attention(p, o);
      EXPECT_EQ(plan.backend(), b == Backend::automatic ? Backend::cpu : b);
      EXPECT_EQ(plan.cuda_kernel(), CudaKernel::automatic);
      EXPECT_EQ(plan.query_tile_rows(), 0);
      EXPECT_FALSE(plan.uses_tma());
      EXPECT_EQ(plan.describe(), backend_name(plan.backend()));
      run(plan, p);
      EXPECT_TRUE(got.same(want)) << "run(plan) differs from attention()";
      // The same plan on other tensors of its shapes (another copy of the inputs).
      const testing::Inputs again = testing::make_inputs(c);
      AttentionParams q = again.params;
      Outputs other(again, c.dtype);
      other.attach(q);
      run(plan, q);
      EXPECT_TRUE(other.same(want)) << "the plan on other tensors differs";
    }
}

TEST(AttentionPlan, TokenOrderOnTheHost) {
  const Case c = plan_case("plan_order", {48}, Pattern::window(5, 5));
  const testing::Inputs in = testing::make_inputs(c);
  std::vector<int32_t> order(48);
  for (int i = 0; i < 48; ++i) order[size_t(i)] = (i % 6) * 8 + i / 6;  // column-major walk of 6 x 8
  AttentionParams p = in.params;
  p.order = order.data();
  Outputs want(in, c.dtype), got(in, c.dtype);
  want.attach(p);
  attention(p, Backend::cpu);
  got.attach(p);
  run(plan_attention(p), p);
  EXPECT_TRUE(got.same(want));
  AttentionParams no_order = p;
  no_order.order = nullptr;
  const std::string m = thrown([&] { run(plan_attention(p), no_order); });
  EXPECT_NE(m.find("order"), std::string::npos) << m;
}

TEST(AttentionPlan, CudaOverridesOnHostBackendsThrow) {
  const Case c = plan_case("plan_overrides", {40}, Pattern::causal());
  const testing::Inputs in = testing::make_inputs(c);
  AttentionParams p = in.params;
  Outputs o(in, c.dtype);
  o.attach(p);
  for (Backend b : {Backend::reference, Backend::cpu, Backend::automatic}) {
    AttentionOptions opt;
    opt.backend = b;
    opt.overrides.cuda_kernel = CudaKernel::wgmma;
    std::string m = thrown([&] { plan_attention(p, opt); });
    EXPECT_NE(m.find("cuda_kernel = wgmma"), std::string::npos) << m;
    opt.overrides.cuda_kernel = CudaKernel::automatic;
    opt.overrides.band_run = 3;
    m = thrown([&] { plan_attention(p, opt); });
    EXPECT_NE(m.find("overrides"), std::string::npos) << m;
  }
  AttentionOptions cuda;
  cuda.backend = Backend::cuda;
  const std::string m = thrown([&] { plan_attention(p, cuda); });
  EXPECT_NE(m.find("cuda"), std::string::npos) << m;
}

TEST(AttentionPlan, RunWithMismatchedParamsThrowsNamingTheField) {
  const Case c = plan_case("plan_mismatch", {40, 24}, Pattern::causal());
  const testing::Inputs in = testing::make_inputs(c);
  AttentionParams p = in.params;
  Outputs o(in, c.dtype);
  o.attach(p);
  const AttentionPlan plan = plan_attention(p);

  const testing::Inputs longer = testing::make_inputs(plan_case("plan_mismatch_long", {50, 24}, Pattern::causal()));
  AttentionParams q = longer.params;
  Outputs lo(longer, c.dtype);
  lo.attach(q);
  std::string m = thrown([&] { run(plan, q); });
  EXPECT_NE(m.find("run: q"), std::string::npos) << m;

  AttentionParams w = p;
  w.pattern.window_left = 4;
  m = thrown([&] { run(plan, w); });
  EXPECT_NE(m.find("pattern.window_left"), std::string::npos) << m;

  AttentionParams no_lse = p;
  no_lse.lse = TensorView{};
  m = thrown([&] { run(plan, no_lse); });
  EXPECT_NE(m.find("run: lse"), std::string::npos) << m;

  AttentionParams sink = p;
  sink.sink_mode = SinkMode::denominator;
  m = thrown([&] { run(plan, sink); });
  EXPECT_NE(m.find("sink"), std::string::npos) << m;

  const testing::Inputs bf = testing::make_inputs(plan_case("plan_mismatch_bf16", {40, 24}, Pattern::causal(), DType::bf16));
  AttentionParams b = bf.params;
  Outputs bo(bf, DType::bf16);
  bo.attach(b);
  m = thrown([&] { run(plan, b); });
  EXPECT_NE(m.find("bf16"), std::string::npos) << m;

  m = thrown([&] { run(AttentionPlan{}, p); });
  EXPECT_NE(m.find("empty"), std::string::npos) << m;
}

TEST(AttentionPlan, ValidatesAndAnswersSupportOnce) {
  const Case c = plan_case("plan_validate", {40}, Pattern::causal());
  const testing::Inputs in = testing::make_inputs(c);
  AttentionParams p = in.params;
  const std::string m = thrown([&] { plan_attention(p); });  // no out
  EXPECT_NE(m.find("out"), std::string::npos) << m;
}

TEST(AttentionPlan, Names) {
  EXPECT_STREQ(toggle_name(Toggle::automatic), "auto");
  EXPECT_STREQ(toggle_name(Toggle::on), "on");
  EXPECT_STREQ(toggle_name(Toggle::off), "off");
  EXPECT_STREQ(cuda_kernel_name(CudaKernel::tile), "tile");
  EXPECT_STREQ(cuda_kernel_name(CudaKernel::wgmma), "wgmma");
  EXPECT_STREQ(cuda_kernel_name(CudaKernel::band), "band");
  EXPECT_STREQ(cuda_kernel_name(CudaKernel::bandwg), "bandwg");
  EXPECT_STREQ(cuda_kernel_name(CudaKernel::automatic), "auto");
}

}  // namespace
}  // namespace ariadne
