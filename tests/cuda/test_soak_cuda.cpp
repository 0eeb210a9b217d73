// A soak of the CUDA backend (issue: hostile input): two host threads, each on its own stream,
// issue thousands of mixed calls (attention forward and backward with random shapes, patterns,
// sinks, dtypes, head dims and GQA ratios; estimates; prefills), a sample of them checked against
// the CPU reference; bad calls in the middle (wrong shapes, a host tensor among device ones, a
// forced kernel the call cannot take) must throw ariadne::Error and leave no CUDA error state
// behind, and the next calls must work. Device memory is flat at the end: what the driver reports
// free returns to its level after a warm-up, up to the library's kept workspaces.
// ARIADNE_SOAK_CALLS sets the calls per thread (default 5000: 10^4 in all).
#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ariadne/attention_backward.hpp"
#include "ariadne/device.hpp"
#include "ariadne/estimate.hpp"
#include "ariadne/prefill.hpp"
#include "cuda/cuda_common.hpp"

namespace ariadne {
namespace {

using namespace testing;

int soak_calls() {
  const char* v = std::getenv("ARIADNE_SOAK_CALLS");
  return v != nullptr ? std::max(1, std::atoi(v)) : 5000;
}

size_t free_bytes() {
  size_t free = 0, total = 0;
  EXPECT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  return free;
}

struct Tally {
  std::atomic<int> attention{0}, backward{0}, estimate{0}, prefill{0}, checked{0}, bad{0};
};

// One random attention problem.
Case random_case(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> pick(0, 1 << 20);
  const int dims[] = {64, 80, 96, 128};
  const int groups[] = {1, 2, 4};
  Case c;
  const int nseq = 1 + pick(rng) % 3;
  for (int s = 0; s < nseq; ++s) c.seq_q.push_back(1 + pick(rng) % 400);
  c.dim = dims[pick(rng) % 4];
  c.heads_kv = 1 + pick(rng) % 3;
  c.heads_q = c.heads_kv * groups[pick(rng) % 3];
  c.dtype = pick(rng) % 2 ? DType::bf16 : DType::f16;
  switch (pick(rng) % 5) {
    case 0: c.pattern = Pattern::full(); break;
    case 1: c.pattern = Pattern::causal(); break;
    case 2: c.pattern = Pattern::window(pick(rng) % 70, pick(rng) % 70); break;
    case 3: c.pattern = Pattern::chunked(16 + pick(rng) % 100); break;
    default:
      c.pattern = Pattern::causal();
      c.block = 64;
      c.block_density = 0.5;
  }
  const int sink = pick(rng) % 3;
  c.sink_mode = sink == 0 ? SinkMode::none : sink == 1 ? SinkMode::denominator : SinkMode::key0_bias;
  c.sink_value = std::numeric_limits<float>::quiet_NaN();
  c.seed = uint64_t(pick(rng));
  c.name = "soak";
  return c;
}

void attention_call(std::mt19937_64& rng, cudaStream_t stream, bool check, Tally& t) {
  const Case c = random_case(rng);
  const Inputs in = make_inputs(c);
  cuda_testing::DeviceCase d = cuda_testing::upload(in);
  DeviceBuffer out(c.dtype, {in.total_q, c.heads_q, c.dim}), lse(DType::f32, {c.heads_q, in.total_q});
  d.p.out = out.view();
  d.p.lse = lse.view();
  d.p.stream = stream;
  run(plan_attention(d.p), d.p);
  ++t.attention;
  const bool backward = rng() % 2 == 0;
  DeviceBuffer dout, dq, dk, dv;
  if (backward) {
    Buffer hd(c.dtype, {in.total_q, c.heads_q, c.dim});
    hd.fill_random(rng());
    dout = DeviceBuffer::from_host(hd);
    dq = DeviceBuffer(c.dtype, {in.total_q, c.heads_q, c.dim});
    dk = DeviceBuffer(c.dtype, {in.total_k, c.heads_kv, c.dim});
    dv = DeviceBuffer(c.dtype, {in.total_k, c.heads_kv, c.dim});
    AttentionGrads g;
    g.dout = dout.view();
    g.dq = dq.view();
    g.dk = dk.view();
    g.dv = dv.view();
    BackwardOptions o;
    o.deterministic = rng() % 4 == 0;
    run(plan_attention_backward(d.p, g, o), d.p, g);
    ++t.backward;
  }
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  if (!check) return;
  const Result ref = run_reference(in);
  const Buffer got = out.to_host();
  EXPECT_TRUE(close_enough("soak out", compare(got.view(), ref.out.view()),
                           std::max(tolerance(c.dtype, max_abs_logit(in)), tolerance(c.dtype, 0))))
      << "seed " << c.seed << " " << describe(c.pattern);
  ++t.checked;
}

void estimate_call(std::mt19937_64& rng, cudaStream_t stream, Tally& t) {
  Case c;
  c.seq_q = {int64_t(512 + rng() % 3000)};
  c.heads_q = 8;
  c.heads_kv = 2;
  c.dim = 128;
  c.dtype = DType::bf16;
  c.pattern = Pattern::causal();
  c.seed = rng();
  c.name = "soak estimate";
  const Inputs in = make_inputs(c);
  cuda_testing::DeviceCase d = cuda_testing::upload(in);
  EstimateConfig ec;
  ec.block = 128;
  ec.stride = rng() % 2 ? 8 : 16;
  if (rng() % 2 == 0) {
    const EstimateResult r = estimate(d.p.q, d.p.k, Pattern::causal(), ec, Backend::cuda);
    EXPECT_GT(r.stats.kept_blocks, 0);
    ++t.estimate;
    return;
  }
  DeviceBuffer out(c.dtype, {in.total_q, c.heads_q, c.dim});
  d.p.out = out.view();
  d.p.stream = stream;
  PrefillConfig pc;
  pc.estimate = ec;
  const PrefillResult r = prefill(d.p, pc);
  EXPECT_GT(r.stats.density, 0);
  ++t.prefill;
}

// Calls that must fail cleanly: each throws ariadne::Error before any launch.
void bad_call(std::mt19937_64& rng, cudaStream_t stream, Tally& t) {
  Case c = random_case(rng);
  const Inputs in = make_inputs(c);
  cuda_testing::DeviceCase d = cuda_testing::upload(in);
  DeviceBuffer out(c.dtype, {in.total_q + 1, c.heads_q, c.dim});  // one row too many
  d.p.out = out.view();
  d.p.stream = stream;
  EXPECT_MSG(error_of([&] { attention(d.p); }), "out");
  DeviceBuffer good(c.dtype, {in.total_q, c.heads_q, c.dim});
  d.p.out = good.view();
  Buffer host_sink(DType::f32, {c.heads_q});
  AttentionParams mixed = d.p;
  mixed.sink_mode = SinkMode::denominator;
  mixed.sink = host_sink.view();  // a host tensor among device ones
  EXPECT_MSG(error_of([&] { attention(mixed); }), "sink");
  AttentionOptions forced;
  forced.overrides.cuda_kernel = CudaKernel::bandwg;
  AttentionParams full = d.p;
  full.pattern.window_left = full.pattern.window_right = kUnbounded;
  full.pattern.chunk = 0;
  full.pattern.blocks = {};
  EXPECT_MSG(error_of([&] { plan_attention(full, forced); }), "overrides.cuda_kernel");
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "a refused call left a CUDA error behind";
  ++t.bad;
}

TEST(CudaSoak, MixedCallsFromTwoThreadsLeaveNothingBehind) {
  const int calls = soak_calls();
  Tally tally;
  // Warm-up: module loads, shared-memory opt-ins, the estimator's kept workspace at its largest.
  {
    std::mt19937_64 rng(cuda_testing::base_seed());
    for (int i = 0; i < 20; ++i) attention_call(rng, nullptr, false, tally);
    for (int i = 0; i < 4; ++i) estimate_call(rng, nullptr, tally);
    cuda_synchronize();
  }
  const size_t before = free_bytes();
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w)
    threads.emplace_back([&, w] {
      cudaStream_t stream;
      ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
      std::mt19937_64 rng(cuda_testing::base_seed() * 31 + uint64_t(w));
      for (int i = 0; i < calls && !::testing::Test::HasFatalFailure(); ++i) {
        const int kind = int(rng() % 100);
        if (kind < 2) bad_call(rng, stream, tally);
        else if (kind < 6) estimate_call(rng, stream, tally);
        else attention_call(rng, stream, i % 50 == 0, tally);
      }
      EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      cudaStreamDestroy(stream);
    });
  for (std::thread& th : threads) th.join();
  cuda_synchronize();
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  const size_t after = free_bytes();
  // The estimator keeps its workspace and may grow it for a larger call than the warm-up's; 256
  // MB covers that, far below what 10^4 leaked calls would hold.
  EXPECT_LE(before > after ? before - after : 0, size_t(256) << 20)
      << "free device memory fell from " << before << " to " << after << " bytes";
  std::printf("soak: %d attention (%d with backward), %d estimates, %d prefills, %d checked, %d bad calls\n",
              tally.attention.load(), tally.backward.load(), tally.estimate.load(), tally.prefill.load(),
              tally.checked.load(), tally.bad.load());
  EXPECT_GT(tally.checked.load(), 0);
  EXPECT_GT(tally.bad.load(), 0);
}

}  // namespace
}  // namespace ariadne
