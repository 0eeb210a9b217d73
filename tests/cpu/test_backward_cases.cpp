// The backward case table (tests/backward_cases.hpp) on the CPU backend, once per kernel table
// this CPU can run, against the reference backward; every run is repeated and must be
// bit-identical. Then the edges the table's backward selection leaves out (its CPU sweeps carry
// diagnostics, which a backward does not take): the same cases without diagnostics, up to a size
// that keeps the suite quick; dout and out in f32 over 16-bit inputs; strided dout and gradient
// views; and the thread-count invariance the design gives (backward.hpp: every output element
// belongs to one work item).
#include <cstring>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "backward_cases.hpp"
#include "cpu/force_isa.hpp"

namespace ariadne {
namespace {

using namespace testing;

BackwardBackend cpu_backward(const char* isa, bool f32_grads) {
  BackwardBackend b;
  b.name = std::string("cpu/") + isa + (f32_grads ? " (f32 gradients)" : "");
  b.f32_grads = f32_grads;
  b.repeat = true;
  b.run = [isa](const PreparedCase& pc, const BackwardCase& bc, BackwardOutputs& o, std::string* why) {
    const AttentionParams p = backward_params(pc, bc);
    const AttentionGrads g = grads_of(bc, o);
    if (!backend_supports_backward(Backend::cpu, p, g, why)) return false;
    const ForceIsa force(isa);
    attention_backward(p, g, Backend::cpu);
    return true;
  };
  return b;
}

// Every available table in q's dtype; the configured table also into f32 gradients.
void run_all_isas(const AttnCase& c) {
  const PreparedCase pc = prepare(c, salt());
  const BackwardCase bc = prepare_backward(pc);
  for (const char* isa : kIsas) {
    if (!cpu::tile_kernels_available(isa)) continue;
    std::string why;
    if (!run_backward_case(pc, bc, cpu_backward(isa, false), &why)) GTEST_SKIP() << why;
  }
  if (c.dtype != DType::f32) {
    std::string why;
    EXPECT_TRUE(run_backward_case(pc, bc, cpu_backward("", true), &why)) << why;
  }
}

class CpuBackwardCases : public ::testing::TestWithParam<AttnCase> {};
TEST_P(CpuBackwardCases, MatchesReference) { run_all_isas(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Table, CpuBackwardCases, ::testing::ValuesIn(backward_cases()), test_name);

// The table's diagnostics cases (the CPU sweeps: lengths off the tiles, head dims 16..128, packed
// batches with empty and one-token sequences, GQA 4:1 over strided views, lq < lk and lq > lk,
// fully masked rows, windows, chunks, block masks, sinks ±10 and random, logits near ±1e4, the
// random shapes) without their diagnostics, those of at most 400 query tokens (the reference's
// time is the suite's), minus any whose name the backward table already has.
std::vector<AttnCase> sweep_cases() {
  std::set<std::string> have;
  for (const AttnCase& c : backward_cases()) have.insert(name_of(c));
  std::vector<AttnCase> out;
  for (AttnCase c : cases()) {
    if (!c.diagnostics) continue;
    int64_t tq = 0;
    for (int64_t t : c.tokens_q) tq += t;
#if defined(ARIADNE_SANITIZED)
    if (tq > 200) continue;  // CMakeLists.txt: smaller sweeps under the sanitizers
#else
    if (tq > 400) continue;
#endif
    c.diagnostics = false;
    if (have.insert(name_of(c)).second) out.push_back(c);
  }
  return out;
}

class CpuBackwardSweeps : public ::testing::TestWithParam<AttnCase> {};
TEST_P(CpuBackwardSweeps, MatchesReference) { run_all_isas(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Sweeps, CpuBackwardSweeps, ::testing::ValuesIn(sweep_cases()), test_name);

// A packed batch of the ViT's shape (GQA 4:1, d 80, bf16) with a sink.
AttnCase vit_case(std::vector<int64_t> tokens, std::string pattern, SinkMode mode, float sink) {
  AttnCase c;
  c.tokens_q = std::move(tokens);
  c.heads_q = 8;
  c.heads_kv = 2;
  c.dim = 80;
  c.pattern = std::move(pattern);
  c.sink_mode = mode;
  c.sink = sink;
  c.dtype = DType::bf16;
  return c;
}

// dout and out in f32 while q, k, v are bf16 (a mixed-precision training step).
TEST(CpuBackward, F32DoutAndOutOverHalfInputs) {
  AttnCase c = vit_case({70, 33}, "window:16,16", SinkMode::denominator, 1.5f);
  c.f32_out = true;
  const PreparedCase pc = prepare(c, salt());
  BackwardCase bc = prepare_backward(pc);
  Buffer dout32(DType::f32, bc.dout.shape());
  const TensorView from = bc.dout.view(), to = dout32.view();
  for (int64_t i = 0; i < from.shape[0]; ++i)
    for (int64_t h = 0; h < from.shape[1]; ++h)
      for (int64_t x = 0; x < from.shape[2]; ++x) to.set({i, h, x}, from.get({i, h, x}));
  bc.dout = std::move(dout32);  // the same values: the reference gradients still hold
  for (const bool f32_grads : {false, true}) {
    std::string why;
    EXPECT_TRUE(run_backward_case(pc, bc, cpu_backward("", f32_grads), &why)) << why;
  }
}

// Rows of `tokens` × `heads` × `dim` stored `pad` elements apart beyond heads · dim, filled with x.
struct Strided {
  Buffer b;
  TensorView v;
  Strided(DType dt, int64_t tokens, int heads, int dim, int64_t pad, float x)
      : b(dt, {tokens, int64_t(heads) * dim + pad}) {
    b.fill(x);
    v = make_view(b.data(), dt, {tokens, heads, dim});
    v.stride[0] = int64_t(heads) * dim + pad;
  }
};

// dout, dq, dk and dv as strided views (rows padded, head_dim contiguous) give the contiguous
// run's gradients bit for bit and leave the padding alone.
TEST(CpuBackward, StridedDoutAndGradients) {
  AttnCase c = vit_case({90, 45}, "window:20,9", SinkMode::key0_bias, 1.f);
  c.token_pad = 7;
  const PreparedCase pc = prepare(c, salt());
  const BackwardCase bc = prepare_backward(pc);
  BackwardOutputs plain = poisoned_grads(pc, false);
  std::string why;
  ASSERT_TRUE(cpu_backward("", false).run(pc, bc, plain, &why)) << why;
  check_grads(pc, bc, plain);

  const int64_t tq = pc.in.total_q, tk = pc.in.total_k;
  const float fill = 7.f;
  Strided dout(c.dtype, tq, c.heads_q, c.dim, 5, fill), dq(c.dtype, tq, c.heads_q, c.dim, 3, fill),
      dk(c.dtype, tk, c.heads_kv, c.dim, 11, fill), dv(c.dtype, tk, c.heads_kv, c.dim, 1, fill);
  const TensorView src = bc.dout.view();
  for (int64_t i = 0; i < tq; ++i)
    for (int64_t h = 0; h < c.heads_q; ++h)
      for (int64_t x = 0; x < c.dim; ++x) dout.v.set({i, h, x}, src.get({i, h, x}));
  AttentionGrads g;
  g.dout = dout.v;
  g.dq = dq.v;
  g.dk = dk.v;
  g.dv = dv.v;
  Buffer dsink(DType::f32, {c.heads_q});
  g.dsink = dsink.view();
  attention_backward(backward_params(pc, bc), g, Backend::cpu);
  for (const auto& [got, want] : {std::pair{&dq, &plain.dq}, {&dk, &plain.dk}, {&dv, &plain.dv}}) {
    const TensorView a = got->v, b = want->view();
    for (int64_t i = 0; i < a.shape[0]; ++i) {
      for (int64_t h = 0; h < a.shape[1]; ++h)
        for (int64_t x = 0; x < a.shape[2]; ++x) ASSERT_EQ(a.get({i, h, x}), b.get({i, h, x})) << i << " " << h;
      for (int64_t x = a.shape[1] * a.shape[2]; x < a.stride[0]; ++x)
        ASSERT_EQ(got->b.view().get({i, x}), fill) << "padding written at row " << i;
    }
  }
  EXPECT_EQ(0, std::memcmp(dsink.data(), plain.dsink.data(), size_t(c.heads_q) * sizeof(float)));
}

// The gradients do not depend on the thread count, bit for bit.
TEST(CpuBackward, IdenticalAcrossThreadCounts) {
  const int saved = cpu_threads();
  std::vector<AttnCase> picks;
  for (const char* filter :
       {"n300_h8x2_d128_full_bf16", "n300_h8x2_d64_window:64,64_bf16", "n300_h8x2_d64_causal+blocks:0.5@64_bf16",
        "n100,33_h4x2_d64_causal_sink:key0+10_bf16", "n200,9_h4x2_d64_causal+blocks:0.2@64_sink:denominator+2.5",
        "n1,1,0,1_k1,1,1,0_h4x2_d16"})
    for (const AttnCase& c : backward_cases())
      if (name_of(c).find(filter) != std::string::npos) {
        picks.push_back(c);
        break;
      }
  ASSERT_EQ(picks.size(), 6u);
  for (const AttnCase& c : picks) {
    SCOPED_TRACE(name_of(c));
    const PreparedCase pc = prepare(c, salt());
    const BackwardCase bc = prepare_backward(pc);
    BackwardOutputs runs[2] = {poisoned_grads(pc, false), poisoned_grads(pc, false)};
    const int threads[2] = {1, 3};
    for (int i = 0; i < 2; ++i) {
      set_cpu_threads(threads[i]);
      attention_backward(backward_params(pc, bc), grads_of(bc, runs[i]), Backend::cpu);
    }
    set_cpu_threads(saved);
    check_grads(pc, bc, runs[0]);
    for (auto m : {&BackwardOutputs::dq, &BackwardOutputs::dk, &BackwardOutputs::dv, &BackwardOutputs::dsink}) {
      const Buffer& a = runs[0].*m;
      const Buffer& b = runs[1].*m;
      if (a.data() == nullptr) continue;
      EXPECT_EQ(0, std::memcmp(a.data(), b.data(), size_t(a.numel()) * size_t(dtype_size(a.dtype()))))
          << "1 and 3 threads differ";
    }
  }
  set_cpu_threads(saved);
}

// attention_backward(p, g, options) keeps the 8 plans used last and reuses one only where it fits
// (shapes, pattern structure, options); a reused plan gives the same bits as a fresh one. The
// cases are prepared first and checked last: their reference runs go through the cache too.
TEST(CpuBackward, PlanCacheReusesOnlyFittingPlans) {
  const std::vector<std::pair<int64_t, const char*>> shapes = {
      {70, "window:16,16"}, {71, "window:16,16"}, {70, "window:8,8"}, {70, "causal"}, {72, "full"},
      {73, "full"}, {74, "full"}, {75, "full"}, {76, "full"}};
  std::vector<PreparedCase> pcs;
  std::vector<BackwardCase> bcs;
  for (const auto& [n, pattern] : shapes) {
    pcs.push_back(prepare(make_case({n}, {}, 4, 2, 32, pattern, DType::bf16, 1), salt()));
    bcs.push_back(prepare_backward(pcs.back()));
  }
  BackwardOptions options;
  options.backend = Backend::cpu;
  BackwardOutputs fresh = poisoned_grads(pcs[0], false);
  run(plan_attention_backward(backward_params(pcs[0], bcs[0]), grads_of(bcs[0], fresh), options),
      backward_params(pcs[0], bcs[0]), grads_of(bcs[0], fresh));
  clear_backward_plan_cache();
  ASSERT_EQ(backward_plan_cache_size(), 0u);
  std::vector<BackwardOutputs> outs;
  for (size_t i = 0; i < shapes.size(); ++i) outs.push_back(poisoned_grads(pcs[i], false));
  BackwardOutputs again = poisoned_grads(pcs[0], false);
  for (BackwardOutputs* o : {&outs[0], &again}) {
    attention_backward(backward_params(pcs[0], bcs[0]), grads_of(bcs[0], *o), options);
    EXPECT_EQ(backward_plan_cache_size(), 1u) << "a second call of one shape made another plan";
  }
  // Another length or pattern is another plan; the ninth evicts the one used longest ago.
  for (size_t i = 1; i < shapes.size(); ++i) {
    attention_backward(backward_params(pcs[i], bcs[i]), grads_of(bcs[i], outs[i]), options);
    EXPECT_EQ(backward_plan_cache_size(), std::min<size_t>(i + 1, 8)) << shapes[i].second;
  }
  BackwardOptions deterministic = options;  // another option is another plan too
  deterministic.deterministic = true;
  BackwardOutputs det = poisoned_grads(pcs[1], false);
  const size_t before = backward_plan_cache_size();
  attention_backward(backward_params(pcs[1], bcs[1]), grads_of(bcs[1], det), deterministic);
  EXPECT_EQ(backward_plan_cache_size(), before) << "full at 8: a new plan evicts one";
  clear_backward_plan_cache();
  EXPECT_EQ(backward_plan_cache_size(), 0u);
  for (BackwardOutputs* o : {&outs[0], &again})
    for (auto m : {&BackwardOutputs::dq, &BackwardOutputs::dk, &BackwardOutputs::dv}) {
      const Buffer& a = fresh.*m;
      const Buffer& b = (*o).*m;
      EXPECT_EQ(0, std::memcmp(a.data(), b.data(), size_t(a.numel()) * size_t(dtype_size(a.dtype()))));
    }
  for (size_t i = 0; i < shapes.size(); ++i) check_grads(pcs[i], bcs[i], outs[i]);
  check_grads(pcs[1], bcs[1], det);
}

}  // namespace
}  // namespace ariadne
