// The CUDA backward (attention_backward.hpp) against the reference backward on the case table
// (tests/backward_cases.hpp): each case runs on the default plan with gradients in q's dtype, then
// deterministically with f32 gradients twice, bit-identical, and then on each main kernel the
// default plan did not take, forced (the tile kernel, the wgmma kernel where it runs: both modes),
// so that both main kernels meet every case they take. Then CUDA graph capture (replays equal the eager bits), determinism on a long sequence with
// many key tiles per query tile, and the errors of calls the kernels do not take.
#include <cuda_runtime.h>

#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "ariadne/attention_backward.hpp"
#include "ariadne/device.hpp"
#include "backward_cases.hpp"
#include "cuda/cuda_common.hpp"

namespace ariadne {
namespace {

using namespace testing;

void check_cuda(cudaError_t e, const char* what) { ASSERT_EQ(e, cudaSuccess) << what << ": " << cudaGetErrorString(e); }

// Everything one backward call reads and writes, on the device.
struct DeviceBackward {
  cuda_testing::DeviceCase d;
  DeviceBuffer out, lse, dout, dq, dk, dv, dsink, order;
  AttentionGrads g;

  DeviceBackward(const PreparedCase& pc, const BackwardCase& bc, const BackwardOutputs& poison)
      : d(cuda_testing::upload(pc.in)) {
    out = DeviceBuffer::from_host(bc.out);
    lse = DeviceBuffer::from_host(bc.lse);
    dout = DeviceBuffer::from_host(bc.dout);
    d.p.out = out.view();
    d.p.lse = lse.view();
    if (!pc.order.empty()) {
      order = DeviceBuffer::from_ints(pc.order);
      d.p.order = static_cast<const int32_t*>(order.data());
    }
    g.dout = dout.view();
    reset(poison);
  }
  // Fresh gradient buffers holding `poison`'s bytes (NaN).
  void reset(const BackwardOutputs& poison) {
    dq = DeviceBuffer::from_host(poison.dq);
    dk = DeviceBuffer::from_host(poison.dk);
    dv = DeviceBuffer::from_host(poison.dv);
    g.dq = dq.view();
    g.dk = dk.view();
    g.dv = dv.view();
    if (poison.dsink.data() != nullptr) {
      dsink = DeviceBuffer::from_host(poison.dsink);
      g.dsink = dsink.view();
    }
  }
  void download(BackwardOutputs& o) const {
    o.dq = dq.to_host();
    o.dk = dk.to_host();
    o.dv = dv.to_host();
    if (o.dsink.data() != nullptr) o.dsink = dsink.to_host();
  }
};

// Runs the backward on the CUDA backend; `took` (if given) receives the main kernel the plan chose.
bool run_cuda_backward(const PreparedCase& pc, const BackwardCase& bc, BackwardOutputs& o, std::string* why,
                       bool deterministic, CudaKernel kernel = CudaKernel::automatic, CudaKernel* took = nullptr) {
  DeviceBackward db(pc, bc, o);
  if (!backend_supports_backward(Backend::cuda, db.d.p, db.g, why)) return false;
  BackwardOptions opts;
  opts.backend = Backend::cuda;
  opts.deterministic = deterministic;
  opts.cuda_kernel = kernel;
  AttentionBackwardPlan plan;
  try {
    plan = plan_attention_backward(db.d.p, db.g, opts);
  } catch (const Error& e) {
    if (kernel == CudaKernel::automatic) throw;
    if (why != nullptr) *why = e.what();  // a forced kernel that does not take the call
    return false;
  }
  if (took != nullptr) *took = plan.cuda_kernel();
  run(plan, db.d.p, db.g);
  cuda_synchronize();
  db.download(o);
  return true;
}

class CudaBackwardCases : public ::testing::TestWithParam<AttnCase> {};

TEST_P(CudaBackwardCases, MatchesTheReference) {
  const PreparedCase pc = prepare(GetParam(), cuda_testing::base_seed());
  const BackwardCase bc = prepare_backward(pc);
  CudaKernel took = CudaKernel::automatic;
  BackwardBackend fast{"cuda", false, false,
                       [&took](const PreparedCase& c, const BackwardCase& b, BackwardOutputs& o, std::string* why) {
                         return run_cuda_backward(c, b, o, why, false, CudaKernel::automatic, &took);
                       }};
  std::string why;
  if (!run_backward_case(pc, bc, fast, &why)) GTEST_SKIP() << why;
  BackwardBackend det{"cuda deterministic, f32 gradients", true, true,
                      [](const PreparedCase& c, const BackwardCase& b, BackwardOutputs& o, std::string* w) {
                        return run_cuda_backward(c, b, o, w, true);
                      }};
  EXPECT_TRUE(run_backward_case(pc, bc, det, &why)) << why;
  for (const CudaKernel k : {CudaKernel::tile, CudaKernel::wgmma}) {
    if (k == took) continue;
    for (const bool deterministic : {false, true}) {
      const std::string name = std::string("cuda ") + cuda_kernel_name(k) + " kernel (forced)" +
                               (deterministic ? ", deterministic, f32 gradients" : "");
      BackwardBackend forced{name, deterministic, deterministic,
                             [k, deterministic](const PreparedCase& c, const BackwardCase& b, BackwardOutputs& o,
                                                std::string* w) {
                               return run_cuda_backward(c, b, o, w, deterministic, k);
                             }};
      // The tile kernel takes every case the backend takes; the wgmma kernel declines some (its
      // refusal is checked by ForcedKernelsNameWhyTheyCannotRun).
      if (!run_backward_case(pc, bc, forced, &why)) {
        EXPECT_EQ(k, CudaKernel::wgmma) << why;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Table, CudaBackwardCases, ::testing::ValuesIn(backward_cases(700)), test_name);

// Capture run(plan) of a deterministic plan into a graph and replay it: the eager bits, twice.
TEST(CudaBackward, GraphCaptureReplaysTheEagerBits) {
  AttnCase c;
  c.tokens_q = {300, 77};
  c.heads_q = 8;
  c.heads_kv = 2;
  c.dim = 128;
  c.pattern = "causal";
  c.sink_mode = SinkMode::denominator;
  c.sink = std::numeric_limits<float>::quiet_NaN();
  const PreparedCase pc = prepare(c, cuda_testing::base_seed());
  const BackwardCase bc = prepare_backward(pc);
  const BackwardOutputs poison = poisoned_grads(pc, false);
  DeviceBackward db(pc, bc, poison);
  cudaStream_t stream;
  ASSERT_NO_FATAL_FAILURE(check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream"));
  db.d.p.stream = stream;
  BackwardOptions opts;
  opts.deterministic = true;
  const AttentionBackwardPlan plan = plan_attention_backward(db.d.p, db.g, opts);
  run(plan, db.d.p, db.g);
  ASSERT_NO_FATAL_FAILURE(check_cuda(cudaStreamSynchronize(stream), "eager run"));
  BackwardOutputs eager = poisoned_grads(pc, false);
  db.download(eager);
  check_grads(pc, bc, eager);

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ASSERT_NO_FATAL_FAILURE(check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture"));
  run(plan, db.d.p, db.g);
  ASSERT_NO_FATAL_FAILURE(check_cuda(cudaStreamEndCapture(stream, &graph), "capture end"));
  ASSERT_NO_FATAL_FAILURE(check_cuda(cudaGraphInstantiate(&exec, graph, 0), "instantiate"));
  for (int replay = 0; replay < 2; ++replay) {
    db.dq.fill_bytes(0xFF);
    db.dk.fill_bytes(0xFF);
    db.dv.fill_bytes(0xFF);
    db.dsink.fill_bytes(0xFF);
    ASSERT_NO_FATAL_FAILURE(check_cuda(cudaGraphLaunch(exec, stream), "graph launch"));
    ASSERT_NO_FATAL_FAILURE(check_cuda(cudaStreamSynchronize(stream), "graph replay"));
    BackwardOutputs got = poisoned_grads(pc, false);
    db.download(got);
    for (const auto& [a, b] : {std::pair{&eager.dq, &got.dq}, {&eager.dk, &got.dk}, {&eager.dv, &got.dv},
                               {&eager.dsink, &got.dsink}})
      EXPECT_EQ(std::memcmp(a->data(), b->data(), size_t(a->numel()) * size_t(dtype_size(a->dtype()))), 0)
          << "replay " << replay << " differs from the eager run";
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// Many key tiles add into each query tile (full attention over 3000 tokens: 47 per tile, GQA 4:1,
// block-sparse causal too): the deterministic plan gives the same bits on every run; the default
// plan is within the tolerance of it.
TEST(CudaBackward, DeterministicModeRepeatsBitForBit) {
  for (const char* pattern : {"full", "causal+blocks:0.5@128"}) {
    AttnCase c;
    c.tokens_q = {3000};
    c.heads_q = 8;
    c.heads_kv = 2;
    c.dim = 64;
    c.pattern = pattern;
    SCOPED_TRACE(pattern);
    const PreparedCase pc = prepare(c, cuda_testing::base_seed());
    BackwardCase bc;
    {
      // The reference would take minutes here: the deterministic run itself is the baseline, and
      // the default run must agree with it within the tolerance.
      Buffer out32(DType::f32, {3000, 8, 64});
      bc.lse = Buffer(DType::f32, {8, 3000});
      AttentionParams p = pc.in.params;
      p.out = out32.view();
      p.lse = bc.lse.view();
      attention(p, Backend::cpu);
      bc.out = std::move(out32);
      bc.dout = Buffer(c.dtype, {3000, 8, 64});
      bc.dout.fill_random(pc.seed + 99);
    }
    BackwardOutputs runs[3];
    for (int r = 0; r < 3; ++r) {
      runs[r] = poisoned_grads(pc, true);
      std::string why;
      ASSERT_TRUE(run_cuda_backward(pc, bc, runs[r], &why, r < 2)) << why;
    }
    for (const auto& [a, b] : {std::pair{&runs[0].dq, &runs[1].dq}, {&runs[0].dk, &runs[1].dk}, {&runs[0].dv, &runs[1].dv}})
      EXPECT_EQ(std::memcmp(a->data(), b->data(), size_t(a->numel()) * 4), 0) << "two deterministic runs differ";
    EXPECT_TRUE(close_enough("dq (default vs deterministic)", compare(runs[2].dq.view(), runs[0].dq.view()), 1e-4));
    EXPECT_TRUE(close_enough("dk (default vs deterministic)", compare(runs[2].dk.view(), runs[0].dk.view()), 1e-4));
  }
}

TEST(CudaBackward, RefusesWhatTheKernelsDoNotTake) {
  AttnCase c;
  c.tokens_q = {200};
  c.pattern = "causal";
  const PreparedCase pc = prepare(c, cuda_testing::base_seed());
  const BackwardCase bc = prepare_backward(pc);
  DeviceBackward db(pc, bc, poisoned_grads(pc, false));
  Buffer dout32(DType::f32, {pc.in.total_q, pc.c.heads_q, pc.c.dim});
  DeviceBuffer d32 = DeviceBuffer::from_host(dout32);
  AttentionGrads g = db.g;
  g.dout = d32.view();
  std::string why;
  EXPECT_FALSE(backend_supports_backward(Backend::cuda, db.d.p, g, &why));
  EXPECT_NE(why.find("dout dtype f32"), std::string::npos) << why;
  // A plan refuses gradients of another shape than it was made for.
  BackwardOptions opts;
  opts.backend = Backend::cuda;
  if (!backend_supports_backward(Backend::cuda, db.d.p, db.g, &why)) GTEST_SKIP() << why;
  const AttentionBackwardPlan plan = plan_attention_backward(db.d.p, db.g, opts);
  DeviceBuffer dq32 = DeviceBuffer::from_host(Buffer(DType::f32, {pc.in.total_q, pc.c.heads_q, pc.c.dim}));
  g = db.g;
  g.dq = dq32.view();
  try {
    run(plan, db.d.p, g);
    ADD_FAILURE() << "run accepted a dq of another dtype";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("run: dq is f32"), std::string::npos) << e.what();
  }
}

// The main kernel a CUDA backward plan takes for one case (one sequence of `tokens` queries, head
// dim `dim`) with `kernel` asked for; when planning throws, its message goes to *error and
// automatic is returned.
CudaKernel planned_kernel(int64_t tokens, int dim, const char* pattern, CudaKernel kernel, std::string* error) {
  AttnCase c;
  c.tokens_q = {tokens};
  c.dim = dim;
  c.pattern = pattern;
  const PreparedCase pc = prepare(c, cuda_testing::base_seed());
  const BackwardCase bc = prepare_backward(pc);
  DeviceBackward db(pc, bc, poisoned_grads(pc, false));
  BackwardOptions opts;
  opts.backend = Backend::cuda;
  opts.cuda_kernel = kernel;
  error->clear();
  try {
    return plan_attention_backward(db.d.p, db.g, opts).cuda_kernel();
  } catch (const Error& e) {
    *error = e.what();
    return CudaKernel::automatic;
  }
}

// A forced main kernel the call cannot take is an error naming why; a forward-only kernel too.
TEST(CudaBackward, ForcedKernelsNameWhyTheyCannotRun) {
  for (const auto& [dim, pattern, expect] :
       {std::tuple{96, "causal", "head_dim 96"}, std::tuple{64, "causal+blocks:0.5@64", "block size 64"}}) {
    std::string error;
    planned_kernel(200, dim, pattern, CudaKernel::wgmma, &error);
    EXPECT_FALSE(error.empty()) << "a forced wgmma plan accepted " << pattern << " at d " << dim;
    EXPECT_NE(error.find(expect), std::string::npos) << error;
    EXPECT_EQ(planned_kernel(200, dim, pattern, CudaKernel::automatic, &error), CudaKernel::tile) << pattern;
    EXPECT_TRUE(error.empty()) << error;
    planned_kernel(200, dim, pattern, CudaKernel::band, &error);
    EXPECT_FALSE(error.empty()) << "a backward plan accepted the forward-only band kernel";
  }
}

// automatic takes the wgmma kernel wherever it runs but for chunks (full, causal, block-sparse with
// a block of 128, windows) and the tile kernel for chunks and what the wgmma kernel refuses
// (docs/design/backward.md).
TEST(CudaBackward, AutomaticRoutesAllButChunksToWgmma) {
  for (const auto& [dim, pattern, want] :
       {std::tuple{64, "full", CudaKernel::wgmma}, std::tuple{80, "causal", CudaKernel::wgmma},
        std::tuple{128, "causal+blocks:0.5@128", CudaKernel::wgmma}, std::tuple{80, "window:64,64", CudaKernel::wgmma},
        std::tuple{80, "chunk:64", CudaKernel::tile}, std::tuple{64, "window:100,0", CudaKernel::wgmma},
        std::tuple{96, "window:64,64", CudaKernel::tile}, std::tuple{80, "causal+blocks:0.5@64", CudaKernel::tile}}) {
    std::string error;
    planned_kernel(300, dim, pattern, CudaKernel::wgmma, &error);  // off compute capability 9.0: refused
    if (error.find("compute capability") != std::string::npos) GTEST_SKIP() << error;
    EXPECT_EQ(planned_kernel(300, dim, pattern, CudaKernel::automatic, &error), want) << pattern << " d " << dim;
    EXPECT_TRUE(error.empty()) << error;
  }
}

// The tile kernel stores dQ directly where each query tile has one visiting key tile (a chunk that
// divides 64, queries and keys of one length per sequence: docs/design/backward.md) and accumulates
// it elsewhere; MatchesTheReference checks the values of both on the case table.
TEST(CudaBackward, DirectDqOnlyWhereOneKeyTileSeesEachQueryTile) {
  struct Want {
    std::vector<int64_t> q, k;
    const char* pattern;
    CudaKernel kernel;
    bool direct;
  };
  for (const Want& w : {Want{{300}, {}, "chunk:64", CudaKernel::automatic, true},
                        Want{{1, 0, 130, 64, 200}, {}, "chunk:32", CudaKernel::automatic, true},
                        Want{{300}, {}, "chunk:16+window:3,3", CudaKernel::tile, true},
                        Want{{300}, {}, "chunk:48", CudaKernel::automatic, false},
                        Want{{300}, {}, "chunk:128", CudaKernel::automatic, false},
                        Want{{100}, {300}, "chunk:64", CudaKernel::automatic, false},
                        Want{{130, 64}, {130, 100}, "chunk:32", CudaKernel::automatic, false},
                        Want{{300}, {}, "causal+blocks:0.5@64", CudaKernel::tile, false},
                        Want{{300}, {}, "window:32,32", CudaKernel::tile, false}}) {
    AttnCase c;
    c.tokens_q = w.q;
    c.tokens_k = w.k;
    c.dim = 64;
    c.pattern = w.pattern;
    const PreparedCase pc = prepare(c, cuda_testing::base_seed());
    const BackwardCase bc = prepare_backward(pc);
    DeviceBackward db(pc, bc, poisoned_grads(pc, false));
    BackwardOptions opts;
    opts.backend = Backend::cuda;
    opts.cuda_kernel = w.kernel;
    for (const bool deterministic : {false, true}) {
      opts.deterministic = deterministic;
      const AttentionBackwardPlan plan = plan_attention_backward(db.d.p, db.g, opts);
      EXPECT_EQ(plan.describe().find("dq stored directly") != std::string::npos, w.direct)
          << w.pattern << " over " << w.q.size() << " sequence(s): " << plan.describe();
    }
  }
}


// More (key tile, KV head) items than the GPU holds CTAs (160 and 180 against 132 on an H100 or
// H200), on windows: the wgmma kernel's CTAs then take several items each (launch_bwd_wgmma), the
// ring of Q and dO stages and the K/V buffers running on from one item to the next. A denominator
// sink, and varlen with GQA and a key-0 sink (the cover's dead tiles between sequences); the
// default and the deterministic mode (whose turns then wait on items of other persistent CTAs).
TEST(CudaBackward, PersistentCtasMatchTheReference) {
  std::string error;
  planned_kernel(300, 80, "window:64,64", CudaKernel::wgmma, &error);  // off compute capability 9.0: refused
  if (error.find("compute capability") != std::string::npos) GTEST_SKIP() << error;
  std::vector<AttnCase> cases;
  {
    AttnCase c = make_case({4096}, {}, 5, 5, 80, "window:64,64", DType::bf16, 3);
    c.sink_mode = SinkMode::denominator;
    c.sink = std::numeric_limits<float>::quiet_NaN();
    cases.push_back(c);
  }
  {
    AttnCase c = make_case({3000, 1500, 777}, {}, 8, 4, 64, "window:64,64", DType::f16, 4);
    c.sink_mode = SinkMode::key0_bias;
    c.sink = std::numeric_limits<float>::quiet_NaN();
    cases.push_back(c);
  }
  for (const AttnCase& c : cases) {
    const PreparedCase pc = prepare(c, cuda_testing::base_seed());
    const BackwardCase bc = prepare_backward(pc);
    for (const bool deterministic : {false, true}) {
      CudaKernel took = CudaKernel::automatic;
      BackwardBackend b{deterministic ? "cuda deterministic" : "cuda", false, deterministic,
                        [&took, deterministic](const PreparedCase& x, const BackwardCase& y, BackwardOutputs& o,
                                               std::string* why) {
                          return run_cuda_backward(x, y, o, why, deterministic, CudaKernel::automatic, &took);
                        }};
      std::string why;
      ASSERT_TRUE(run_backward_case(pc, bc, b, &why)) << why;
      EXPECT_EQ(took, CudaKernel::wgmma) << pc.name;
    }
  }
}

}  // namespace
}  // namespace ariadne
