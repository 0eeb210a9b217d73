// The CUDA backend against the double-precision CPU reference (docs/numerics.md tolerance rule).
//
// Every case draws fresh random inputs (the seed changes per process; ARIADNE_TEST_SEED pins it and
// every failure prints it), uploads them and the pattern's arrays to the device, poisons out and
// lse with NaN, runs attention(p, Backend::cuda) twice and checks: every element written and close
// to the reference, LSE entry by entry, and the two runs bit-identical (a race would show there).
// Each case runs on the library's route and on the mma.sync tile kernel forced through the plan's
// overrides (the tile kernel serves every pattern; the Hopper kernels take the cases they apply to).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "ariadne/attention.hpp"
#include "ariadne/device.hpp"
#include "common.hpp"
#include "cuda/cuda_common.hpp"

namespace ariadne::testing {
// gtest prints a parameter with this instead of its bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }
}  // namespace ariadne::testing

namespace ariadne {
namespace {

using testing::Case;
using namespace cuda_testing;

// Four query and four KV heads unless a case sets GQA.
Case mha_case(const std::string& name, std::vector<int64_t> seq_q, int dim, DType dt, Pattern pat) {
  return make_case(name, std::move(seq_q), dim, dt, pat, 4, 4);
}

// ---- the sweep: pattern x head dim x dtype x length ----
struct NamedPattern {
  const char* name;
  Pattern pattern;
  double density;  // > 0: random block-sparse on top of `pattern`
  int block;
};

std::vector<Case> sweep() {
  const std::vector<NamedPattern> patterns = {
      {"full", Pattern::full(), 0, 0},
      {"causal", Pattern::causal(), 0, 0},
      {"window64", Pattern::window(64, 64), 0, 0},
      {"window17_5", Pattern::window(17, 5), 0, 0},
      {"chunk64", Pattern::chunked(64), 0, 0},
      {"chunk48", Pattern::chunked(48), 0, 0},
      {"causal_blocks64", Pattern::causal(), 0.5, 64},
      {"full_blocks128", Pattern::full(), 0.4, 128},
  };
  std::vector<Case> cases;
  for (const NamedPattern& np : patterns)
    for (int dim : {64, 80, 96, 128})
      for (DType dt : {DType::bf16, DType::f16})
        for (int64_t n : {1, 77, 300}) {
          Case c = mha_case(std::string(np.name) + "_d" + std::to_string(dim) + "_" + dtype_name(dt) + "_n" +
                                 std::to_string(n),
                             {n}, dim, dt, np.pattern);
          c.block_density = np.density;
          if (np.block) c.block = np.block;
          // GQA 4:1 on half of the cases, MHA on the rest.
          if ((dim / 16 + n) % 2 == 0) {
            c.heads_q = 8;
            c.heads_kv = 2;
          }
          cases.push_back(c);
        }
  return cases;
}

// The routes every case of this file runs on: the library's choice, and the tile kernel forced.
constexpr CudaKernel kRoutes[] = {CudaKernel::automatic, CudaKernel::tile};

void check_routes(const Case& c, bool f32_out = false) {
  for (CudaKernel k : kRoutes) check_case(c, f32_out, on_kernel(k));
}

class Sweep : public ::testing::TestWithParam<std::tuple<Case, CudaKernel>> {};
TEST_P(Sweep, MatchesReference) {
  const auto& [c, kernel] = GetParam();
  check_case(c, false, on_kernel(kernel), [&](int, const AttentionPlan& plan) {
    if (kernel != CudaKernel::automatic) {
      ASSERT_EQ(plan.cuda_kernel(), kernel) << plan.describe();
    }
  });
}
INSTANTIATE_TEST_SUITE_P(Cuda, Sweep, ::testing::Combine(::testing::ValuesIn(sweep()), ::testing::ValuesIn(kRoutes)),
                         [](const ::testing::TestParamInfo<std::tuple<Case, CudaKernel>>& i) {
                           return std::get<0>(i.param).name + "_" + cuda_kernel_name(std::get<1>(i.param));
                         });

// ---- edges ----
TEST(CudaAttention, SinksBothFormsPlusMinus10) {
  for (SinkMode mode : {SinkMode::denominator, SinkMode::key0_bias})
    for (float sink : {10.f, -10.f, std::numeric_limits<float>::quiet_NaN()})
      for (const auto& [name, pat] : {std::pair{"full", Pattern::full()}, std::pair{"window", Pattern::window(32, 32)},
                                      std::pair{"causal", Pattern::causal()}})
        for (int dim : {80, 128}) {
          Case c = mha_case(std::string("sink_") + sink_mode_name(mode) + "_" + std::to_string(sink) + "_" + name +
                                 "_d" + std::to_string(dim),
                             {190}, dim, DType::bf16, pat);
          c.sink_mode = mode;
          c.sink_value = sink;
          c.heads_q = 8;
          c.heads_kv = 2;
          check_routes(c);
        }
}

TEST(CudaAttention, VarlenWithOneTokenAndEmptySequences) {
  for (const auto& [name, pat] : {std::pair{"full", Pattern::full()}, std::pair{"causal", Pattern::causal()},
                                  std::pair{"window", Pattern::window(20, 3)}, std::pair{"chunk", Pattern::chunked(40)}})
    for (DType dt : {DType::bf16, DType::f16}) {
      Case c = mha_case(std::string("varlen_") + name + "_" + dtype_name(dt), {1, 0, 130, 64, 5, 200, 1}, 80, dt, pat);
      c.heads_q = 8;
      c.heads_kv = 2;
      check_routes(c);
    }
  // Block-sparse over a packed batch: CSR rows per (sequence, head, query block).
  Case c = mha_case("varlen_causal_blocks", {1, 0, 130, 64, 200}, 64, DType::bf16, Pattern::causal());
  c.block_density = 0.6;
  check_routes(c);
  // Sinks in a packed batch: key 0 is each sequence's own first key.
  for (SinkMode mode : {SinkMode::denominator, SinkMode::key0_bias}) {
    Case s = mha_case(std::string("varlen_sink_") + sink_mode_name(mode), {1, 0, 70, 129}, 96, DType::f16,
                       Pattern::window(16, 16));
    s.sink_mode = mode;
    s.sink_value = std::numeric_limits<float>::quiet_NaN();
    check_routes(s);
  }
}

TEST(CudaAttention, ChunkedPrefillAndQueriesWithoutKeys) {
  // lq < lk: queries are bottom-right aligned; a sequence with queries and no keys gives
  // out = 0, lse = -inf (or the sink with a denominator sink).
  for (SinkMode mode : {SinkMode::none, SinkMode::denominator}) {
    Case c = mha_case(std::string("prefill_") + sink_mode_name(mode), {50, 7, 33}, 128, DType::bf16,
                       Pattern::causal());
    c.seq_k = {300, 0, 33};
    c.sink_mode = mode;
    c.sink_value = 1.5f;
    check_routes(c);
  }
  Case w = mha_case("prefill_window", {70}, 64, DType::f16, Pattern::window(40, 0));
  w.seq_k = {451};
  check_routes(w);
}

TEST(CudaAttention, StridedViewsAndF32Out) {
  for (int64_t pad : {8, 24})
    for (int dim : {80, 96}) {
      Case c = mha_case("strided_pad" + std::to_string(pad) + "_d" + std::to_string(dim), {257}, dim, DType::bf16,
                         Pattern::window(64, 64));
      c.token_pad = pad;
      c.heads_q = 8;
      c.heads_kv = 2;
      check_routes(c);
    }
  check_routes(mha_case("f32_out_causal", {150}, 64, DType::f16, Pattern::causal()), /*f32_out=*/true);
}

TEST(CudaAttention, LongRowsAndLargeLogits) {
  // Many key tiles through the double-buffered pipeline; logits up to ~±60 stress the online max.
  Case c = mha_case("long_full_d80", {1500}, 80, DType::bf16, Pattern::full());
  c.heads_q = 2;
  c.heads_kv = 2;
  check_routes(c);
  Case big = mha_case("large_logits_causal_d128", {400}, 128, DType::f16, Pattern::causal());
  big.input_scale = 2.f;
  check_routes(big);
}

TEST(CudaAttention, FusedTokenOrder) {
  // A 24 x 20 token grid stored row-major; the pattern runs over its column-major traversal
  // (Ariadne's alternate layers), or over a random permutation. Expected: the reference on
  // explicitly gathered inputs, its rows scattered back to storage order.
  const int rows = 24, cols = 20, total = rows * cols;
  const GridOrders orders = grid_orders(rows, cols);
  for (const auto& [oname, order] : {std::pair{"colmajor", orders.column_major}, std::pair{"shuffled", orders.shuffled}})
    for (const auto& [pname, pat] : {std::pair{"window", Pattern::window(8, 8)}, std::pair{"chunk", Pattern::chunked(24)},
                                     std::pair{"causal", Pattern::causal()}})
      for (int dim : {64, 80}) {
        Case c = mha_case(std::string("order_") + oname + "_" + pname + "_d" + std::to_string(dim), {total}, dim,
                           DType::bf16, pat);
        c.heads_q = 8;
        c.heads_kv = 2;
        c.seed = base_seed() ^ std::hash<std::string>{}(c.name);
        SCOPED_TRACE(c.name + " (ARIADNE_TEST_SEED=" + std::to_string(base_seed()) + ")");
        const testing::Inputs in = testing::make_inputs(c);

        const OrderedReference want = ordered_reference(c, in, order);

        DeviceCase d = upload(in);
        const DeviceBuffer d_order = DeviceBuffer::from_ints(order);
        DeviceBuffer out(c.dtype, {total, c.heads_q, dim}), lse(DType::f32, {c.heads_q, total});
        out.fill_bytes(0xFF);
        lse.fill_bytes(0xFF);
        d.p.out = out.view();
        d.p.lse = lse.view();
        d.p.order = static_cast<const int32_t*>(d_order.data());  // the public route (AttentionParams::order)
        for (CudaKernel k : kRoutes) {
          SCOPED_TRACE(cuda_kernel_name(k));
          out.fill_bytes(0xFF);
          lse.fill_bytes(0xFF);
          run(plan_attention(d.p, on_kernel(k)), d.p);
          cuda_synchronize();
          const double tol = testing::tolerance(c.dtype, testing::max_abs_logit(in));
          EXPECT_TRUE(testing::close_enough("out", testing::compare(out.to_host().view(), want.out.view()), tol));
          EXPECT_TRUE(testing::lse_close(lse.to_host().view(), want.lse.view(), tol));
        }
      }
}

TEST(CudaAttention, DiagnosticsMatchReference) {
  // Entropy and distance in the forward epilogue, received attention by the transposed pass, on
  // packed batches with empty and one-token sequences, every sink form, block-sparse masks.
  struct Diag {
    const char* name;
    Pattern pattern;
    double density;
    SinkMode sink;
    int dim;
    bool with_lse;
  };
  const std::vector<Diag> diags = {
      {"full", Pattern::full(), 0, SinkMode::none, 64, true},
      {"window", Pattern::window(16, 16), 0, SinkMode::denominator, 80, true},
      {"window_key0", Pattern::window(20, 3), 0, SinkMode::key0_bias, 80, false},
      {"chunk", Pattern::chunked(48), 0, SinkMode::none, 96, false},
      {"causal_blocks", Pattern::causal(), 0.6, SinkMode::denominator, 128, true},
  };
  for (const Diag& dg : diags)
    for (DType dt : {DType::bf16, DType::f16}) {
      Case c = mha_case(std::string("diag_") + dg.name + "_" + dtype_name(dt), {1, 0, 130, 75, 200}, dg.dim, dt,
                         dg.pattern);
      c.heads_q = 8;
      c.heads_kv = 2;
      c.block_density = dg.density;
      c.sink_mode = dg.sink;
      c.sink_value = std::numeric_limits<float>::quiet_NaN();
      c.seed = base_seed() ^ std::hash<std::string>{}(c.name);
      SCOPED_TRACE(c.name + " (ARIADNE_TEST_SEED=" + std::to_string(base_seed()) + ")");
      const testing::Inputs in = testing::make_inputs(c);
      if (dg.density > 0 && in.mask.nnz() == 0) continue;  // see check_case
      Buffer coords_q(DType::f32, {in.total_q, 2}), coords_k(DType::f32, {in.total_k, 2});
      coords_q.fill_random(c.seed + 7, 0.f, 30.f);
      coords_k.fill_random(c.seed + 8, 0.f, 30.f);

      AttentionParams rp = in.params;
      Buffer r_out(DType::f32, {in.total_q, c.heads_q, c.dim}), r_lse(DType::f32, {c.heads_q, in.total_q});
      Buffer r_ent(DType::f32, {c.heads_q, in.total_q}), r_dist(DType::f32, {c.heads_q, in.total_q});
      Buffer r_recv(DType::f32, {c.heads_q, in.total_k});
      rp.out = r_out.view();
      rp.lse = r_lse.view();
      rp.entropy = r_ent.view();
      rp.distance = r_dist.view();
      rp.received = r_recv.view();
      rp.coords_q = coords_q.view();
      rp.coords_k = coords_k.view();
      attention(rp, Backend::reference);

      DeviceCase d = upload(in);
      const DeviceBuffer d_cq = DeviceBuffer::from_host(coords_q), d_ck = DeviceBuffer::from_host(coords_k);
      DeviceBuffer out(dt, {in.total_q, c.heads_q, c.dim}), lse(DType::f32, {c.heads_q, in.total_q});
      DeviceBuffer ent(DType::f32, {c.heads_q, in.total_q}), dist(DType::f32, {c.heads_q, in.total_q});
      DeviceBuffer recv(DType::f32, {c.heads_q, in.total_k});
      for (DeviceBuffer* b : {&out, &lse, &ent, &dist, &recv}) b->fill_bytes(0xFF);
      d.p.out = out.view();
      d.p.lse = dg.with_lse ? lse.view() : TensorView{};  // without: the pass uses a scratch LSE
      d.p.entropy = ent.view();
      d.p.distance = dist.view();
      d.p.received = recv.view();
      d.p.coords_q = d_cq.view();
      d.p.coords_k = d_ck.view();
      attention(d.p, Backend::cuda);
      cuda_synchronize();
      const double tol = testing::tolerance(c.dtype, testing::max_abs_logit(in));
      EXPECT_TRUE(testing::close_enough("out", testing::compare(out.to_host().view(), r_out.view()), tol));
      if (dg.with_lse) {
        EXPECT_TRUE(testing::lse_close(lse.to_host().view(), r_lse.view(), tol));
      }
      EXPECT_TRUE(testing::close_enough("entropy", testing::compare(ent.to_host().view(), r_ent.view()), tol));
      EXPECT_TRUE(testing::close_enough("distance", testing::compare(dist.to_host().view(), r_dist.view()), tol));
      EXPECT_TRUE(testing::close_enough("received", testing::compare(recv.to_host().view(), r_recv.view()), tol));
    }
}

TEST(CudaAttention, RejectsWhatItCannotRun) {
  Case c = mha_case("reject", {64}, 64, DType::bf16, Pattern::full());
  c.token_pad = 4;  // rows no longer start on 16-byte boundaries
  const testing::Inputs in = testing::make_inputs(c);
  DeviceCase d = upload(in);
  DeviceBuffer out(DType::bf16, {in.total_q, c.heads_q, c.dim});
  d.p.out = out.view();
  EXPECT_THROW(attention(d.p, Backend::cuda), Error);
  std::string why;
  EXPECT_FALSE(backend_supports(Backend::cuda, d.p, &why));
  EXPECT_NE(why.find("16-byte"), std::string::npos) << why;
}

}  // namespace
}  // namespace ariadne
