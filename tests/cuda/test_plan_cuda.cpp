// Plan, then run on the CUDA backend (ariadne/attention.hpp): run() inside CUDA graph capture gives
// the eager run's bits for every kernel family and the received pass; the environment steers no
// route; a forced route the call cannot take, and a run on params the plan was not made for, are
// errors naming why; a plan runs on other tensors of its shapes (the wgmma kernel's tensor maps
// encoded again) with the bits of a plan made for them.
#include <cuda_runtime.h>

#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ariadne/attention.hpp"
#include "ariadne/device.hpp"
#include "ariadne/order.hpp"
#include "common.hpp"
#include "cuda/cuda_common.hpp"

namespace ariadne {
namespace {

using testing::Case;
using namespace cuda_testing;

void check_cuda(cudaError_t e, const char* what) { ASSERT_EQ(e, cudaSuccess) << what << ": " << cudaGetErrorString(e); }

// One call on the device: inputs, out (q's dtype), lse unless `received` (then received [heads, total_k]
// and no lse: the plan's scratch), an optional token order and block_col grid.
struct Call {
  Case c;
  testing::Inputs in;
  DeviceCase d;
  DeviceBuffer out, lse, received, order;
  AttentionOptions options;

  Call(Case cs, const AttentionOptions& o, bool with_received = false, const std::vector<int32_t>& ord = {})
      : c(std::move(cs)), options(o) {
    c.seed = base_seed() ^ std::hash<std::string>{}(c.name);
    in = testing::make_inputs(c);
    d = upload(in);
    out = DeviceBuffer(c.dtype, {in.total_q, int64_t(c.heads_q), int64_t(c.dim)});
    d.p.out = out.view();
    if (with_received) {
      received = DeviceBuffer(DType::f32, {int64_t(c.heads_q), in.total_k});
      d.p.received = received.view();
    } else {
      lse = DeviceBuffer(DType::f32, {int64_t(c.heads_q), in.total_q});
      d.p.lse = lse.view();
    }
    if (!ord.empty()) {
      order = DeviceBuffer::from_ints(ord);
      d.p.order = static_cast<const int32_t*>(order.data());
    }
    options.backend = Backend::cuda;
  }

  // NaN everywhere, finished before anything else runs (the fills run on the legacy stream, the
  // launches on d.p.stream).
  void poison() {
    out.fill_bytes(0xFF);
    if (d.p.lse.defined()) lse.fill_bytes(0xFF);
    if (d.p.received.defined()) received.fill_bytes(0xFF);
    cuda_synchronize();
  }
  std::vector<uint8_t> bits() const {
    std::vector<uint8_t> b = bytes_of(out.to_host());
    const std::vector<uint8_t> s = bytes_of(d.p.lse.defined() ? lse.to_host() : received.to_host());
    b.insert(b.end(), s.begin(), s.end());
    return b;
  }
};

struct Family {
  const char* name = "";
  CudaKernel kernel = CudaKernel::automatic;  // what the plan must say
  Case c;
  AttentionOptions options;
  bool received = false;
  std::vector<int32_t> order;
  BlockColGrid block_col;
};

std::vector<Family> families() {
  std::vector<Family> f;
  const auto add = [&](const char* name, CudaKernel kernel, Case c, CudaKernel forced = CudaKernel::automatic) {
    Family fam;
    fam.name = name;
    fam.kernel = kernel;
    fam.c = std::move(c);
    fam.options.overrides.cuda_kernel = forced;
    f.push_back(std::move(fam));
  };
  add("tile", CudaKernel::tile, make_case("plan_tile_causal_d64", {300, 77}, 64, DType::bf16, Pattern::causal()),
      CudaKernel::tile);
  add("wgmma", CudaKernel::wgmma, make_case("plan_wgmma_full_d128", {300}, 128, DType::bf16, Pattern::full()));
  Case sink = make_case("plan_wgmma_causal_sink_d80", {256, 1}, 80, DType::f16, Pattern::causal());
  sink.sink_mode = SinkMode::denominator;
  sink.sink_value = std::numeric_limits<float>::quiet_NaN();
  add("wgmma_sink", CudaKernel::wgmma, sink);
  add("band", CudaKernel::band, make_case("plan_band_w64_d64", {300}, 64, DType::bf16, Pattern::window(64, 64)));
  add("bandwg", CudaKernel::bandwg, make_case("plan_bandwg_w64_d80", {300}, 80, DType::bf16, Pattern::window(64, 64)));
  add("bandwg_chunk", CudaKernel::bandwg,
      make_case("plan_bandwg_chunk64_d80", {300}, 80, DType::f16, Pattern::chunked(64)));
  const Grid grid{32, 6};
  add("bandwg_block_col", CudaKernel::bandwg,
      make_case("plan_bandwg_blockcol", {int64_t(grid.tokens())}, 80, DType::bf16, Pattern::window(64, 64)));
  f.back().order = order_conversion(make_order(OrderKind::block_row, {grid}), make_order(OrderKind::block_col, {grid}));
  f.back().block_col = BlockColGrid{grid.h, grid.w};
  add("received", CudaKernel::band, make_case("plan_received_w16_d64", {130, 75}, 64, DType::bf16, Pattern::window(16, 16)));
  f.back().received = true;
  return f;
}

// (a) Capture run(plan, p) into a graph, replay: the eager run's bits, for every kernel family and
// the received pass (whose LSE scratch the plan owns).
TEST(CudaPlan, GraphCaptureReplaysTheEagerBits) {
  cudaStream_t stream;
  ASSERT_NO_FATAL_FAILURE(check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream"));
  for (const Family& fam : families()) {
    SCOPED_TRACE(std::string(fam.name) + " (ARIADNE_TEST_SEED=" + std::to_string(base_seed()) + ")");
    AttentionOptions o = fam.options;
    o.block_col = fam.block_col;
    Call call(fam.c, o, fam.received, fam.order);
    call.d.p.stream = stream;
    const AttentionPlan plan = plan_attention(call.d.p, call.options);
    ASSERT_EQ(plan.cuda_kernel(), fam.kernel) << plan.describe();
    if (!fam.order.empty()) {
      ASSERT_TRUE(plan.ordered_tiles()) << plan.describe();
    }
    call.poison();
    run(plan, call.d.p);
    ASSERT_NO_FATAL_FAILURE(check_cuda(cudaStreamSynchronize(stream), "eager run"));
    const std::vector<uint8_t> eager = call.bits();

    call.poison();
    ASSERT_NO_FATAL_FAILURE(check_cuda(cudaStreamSynchronize(stream), "poison"));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    ASSERT_NO_FATAL_FAILURE(check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture"));
    run(plan, call.d.p);
    ASSERT_NO_FATAL_FAILURE(check_cuda(cudaStreamEndCapture(stream, &graph), "capture end"));
    ASSERT_NO_FATAL_FAILURE(check_cuda(cudaGraphInstantiate(&exec, graph, 0), "instantiate"));
    for (int replay = 0; replay < 2; ++replay) {
      call.poison();
      ASSERT_NO_FATAL_FAILURE(check_cuda(cudaStreamSynchronize(stream), "poison"));
      ASSERT_NO_FATAL_FAILURE(check_cuda(cudaGraphLaunch(exec, stream), "graph launch"));
      ASSERT_NO_FATAL_FAILURE(check_cuda(cudaStreamSynchronize(stream), "graph replay"));
      EXPECT_TRUE(call.bits() == eager) << "replay " << replay << " differs from the eager run";
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(stream);
}

// (b) The old routing switches, each set to a value that once changed the route: plans and bits are
// those of the defaults.
TEST(CudaPlan, RunReadsNoEnvironment) {
  const std::vector<std::pair<const char*, const char*>> switches = {
      {"ARIADNE_WGMMA", "0"},         {"ARIADNE_BAND", "0"},          {"ARIADNE_BANDWG", "0"},
      {"ARIADNE_BANDWG_CHUNK", "0"},  {"ARIADNE_BANDWG_ORDER", "0"},  {"ARIADNE_BANDWG_TMA_ORDER", "0"},
      {"ARIADNE_BANDWG_CHUNK_PASS", "0"}, {"ARIADNE_BANDWG_V", "1"},  {"ARIADNE_BAND_RUN", "1"},
      {"ARIADNE_TMA", "0"},           {"ARIADNE_WG_OUT_TMA", "0"},    {"ARIADNE_WG_PINGPONG", "0"},
      {"ARIADNE_WGMMA_ORDER", "heads"}};
  for (const auto& [name, value] : switches)
    ASSERT_EQ(std::getenv(name), nullptr) << name << " is set in this process; unset it to run this test";
  for (const Family& fam : families()) {
    SCOPED_TRACE(std::string(fam.name) + " (ARIADNE_TEST_SEED=" + std::to_string(base_seed()) + ")");
    AttentionOptions o = fam.options;
    o.block_col = fam.block_col;
    Call call(fam.c, o, fam.received, fam.order);
    std::vector<uint8_t> bits[2];
    CudaKernel kernel[2];
    std::string described[2];
    for (int with_env : {0, 1}) {
      for (const auto& [name, value] : switches) {
        if (with_env) setenv(name, value, 1);
        else unsetenv(name);
      }
      const AttentionPlan plan = plan_attention(call.d.p, call.options);
      kernel[with_env] = plan.cuda_kernel();
      described[with_env] = plan.describe();
      call.poison();
      run(plan, call.d.p);
      cuda_synchronize();
      bits[with_env] = call.bits();
    }
    for (const auto& [name, value] : switches) unsetenv(name);
    EXPECT_EQ(kernel[0], fam.kernel);
    EXPECT_EQ(kernel[1], kernel[0]) << "the environment changed the route";
    EXPECT_EQ(described[1], described[0]) << "the environment changed the plan";
    EXPECT_TRUE(bits[1] == bits[0]) << "the environment changed the result";
  }
}

// (c) A forced route or knob the call cannot take is an error from plan_attention naming it.
TEST(CudaPlan, ForcedImpossibleOverridesThrowNamingThem) {
  Call d64(make_case("plan_force_d64_w64", {300}, 64, DType::bf16, Pattern::window(64, 64)), {});
  const auto message = [](const AttentionParams& p, const AttentionOptions& o) -> std::string {
    try {
      plan_attention(p, o);
    } catch (const Error& e) {
      return e.what();
    }
    return {};
  };
  AttentionOptions o = on_kernel(CudaKernel::bandwg);
  std::string m = message(d64.d.p, o);
  EXPECT_NE(m.find("cuda_kernel = bandwg"), std::string::npos) << m;
  EXPECT_NE(m.find("head_dim 64"), std::string::npos) << m;
  Call window(make_case("plan_force_w64_d128", {300}, 128, DType::bf16, Pattern::window(64, 64)), {});
  m = message(window.d.p, on_kernel(CudaKernel::wgmma));
  EXPECT_NE(m.find("cuda_kernel = wgmma"), std::string::npos) << m;
  EXPECT_NE(m.find("left window bound"), std::string::npos) << m;
  m = message(window.d.p, on_kernel(CudaKernel::band));
  EXPECT_NE(m.find("cuda_kernel = band"), std::string::npos) << m;
  AttentionOptions tma = on_kernel(CudaKernel::tile);
  tma.overrides.tma = Toggle::on;
  m = message(d64.d.p, tma);
  EXPECT_NE(m.find("overrides.tma"), std::string::npos) << m;
  AttentionOptions run_on_wgmma;
  run_on_wgmma.overrides.band_run = 2;
  Call full(make_case("plan_force_full_d128", {300}, 128, DType::bf16, Pattern::full()), {});
  m = message(full.d.p, run_on_wgmma);
  EXPECT_NE(m.find("overrides.band_run"), std::string::npos) << m;
  AttentionOptions tiles = on_kernel(CudaKernel::bandwg);
  tiles.overrides.ordered_tiles = Toggle::on;  // no order, no grid
  Call w80(make_case("plan_force_w64_d80", {300}, 80, DType::bf16, Pattern::window(64, 64)), {});
  m = message(w80.d.p, tiles);
  EXPECT_NE(m.find("overrides.ordered_tiles"), std::string::npos) << m;
  AttentionOptions pass;
  pass.overrides.chunk_pass = Toggle::on;  // a window, no chunk
  m = message(w80.d.p, pass);
  EXPECT_NE(m.find("overrides.chunk_pass"), std::string::npos) << m;
  AttentionOptions host = on_kernel(CudaKernel::tile);
  host.backend = Backend::cpu;
  m = message(d64.d.p, host);
  EXPECT_NE(m.find("cpu"), std::string::npos) << m;
}

// (d) run() on params the plan was not made for throws, naming the field.
TEST(CudaPlan, RunWithMismatchedParamsThrows) {
  Call a(make_case("plan_mismatch_a", {300}, 80, DType::bf16, Pattern::causal()), {});
  Call b(make_case("plan_mismatch_b", {200}, 80, DType::bf16, Pattern::causal()), {});
  const AttentionPlan plan = plan_attention(a.d.p, a.options);
  const auto message = [&](const AttentionParams& p) -> std::string {
    try {
      run(plan, p);
    } catch (const Error& e) {
      return e.what();
    }
    return {};
  };
  std::string m = message(b.d.p);
  EXPECT_NE(m.find("run: q"), std::string::npos) << m;
  AttentionParams p = a.d.p;
  p.pattern = Pattern::full();
  m = message(p);
  EXPECT_NE(m.find("window_right"), std::string::npos) << m;
  p = a.d.p;
  p.lse = TensorView{};
  m = message(p);
  EXPECT_NE(m.find("lse"), std::string::npos) << m;
  Call f16(make_case("plan_mismatch_f16", {300}, 80, DType::f16, Pattern::causal()), {});
  m = message(f16.d.p);
  EXPECT_NE(m.find("f16"), std::string::npos) << m;
  p = a.d.p;
  p.order = static_cast<const int32_t*>(a.d.cu_q.data() != nullptr ? a.d.cu_q.data() : a.out.data());
  m = message(p);
  EXPECT_NE(m.find("order"), std::string::npos) << m;
  EXPECT_THROW(run(AttentionPlan{}, a.d.p), Error) << "an empty plan";
}

// A plan made for one set of tensors runs on another set of its shapes (the wgmma kernel's maps
// encoded again in run) with the bits of a plan made for that set.
TEST(CudaPlan, RunsOnOtherTensorsOfItsShapes) {
  for (const Family& fam : families()) {
    SCOPED_TRACE(std::string(fam.name) + " (ARIADNE_TEST_SEED=" + std::to_string(base_seed()) + ")");
    AttentionOptions o = fam.options;
    o.block_col = fam.block_col;
    Call first(fam.c, o, fam.received, fam.order);
    Call second(fam.c, o, fam.received, fam.order);  // same inputs, other buffers
    const AttentionPlan plan = plan_attention(first.d.p, first.options);
    const AttentionPlan own = plan_attention(second.d.p, second.options);
    second.poison();
    run(own, second.d.p);
    cuda_synchronize();
    const std::vector<uint8_t> want = second.bits();
    second.poison();
    run(plan, second.d.p);
    cuda_synchronize();
    EXPECT_TRUE(second.bits() == want) << "the plan gave other bits on other tensors";
  }
}

}  // namespace
}  // namespace ariadne
