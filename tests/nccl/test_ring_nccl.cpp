// The ring over NCCL (include/ariadne/context_parallel_nccl.hpp) on every GPU of the host, one
// thread per rank with communicators from ncclCommInitAll, against one-device attention on the CPU
// backend: dense causal, a window with a denominator sink, and RR block masks, over a packed batch
// with an empty sequence. Rings of 1 rank, 2 ranks and every GPU the machine has (one GPU runs the
// ring of one: pieces, merges and sinks, no transfer). Built where NCCL is found.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <cmath>
#include <cstring>
#include <random>
#include <thread>

#include "ariadne/context_parallel_nccl.hpp"
#include "ariadne/device.hpp"
#include "common.hpp"

namespace ariadne {
namespace {

using namespace testing;

// Rows of a packed [tokens, heads, d] bf16 host buffer, in the shard's order.
Buffer gather(const Buffer& x, const std::vector<ShardRun>& runs, const std::vector<int32_t>& cu) {
  const int64_t row = x.numel() / x.shape()[0];
  Buffer out(x.dtype(), {std::max<int64_t>(rows_of(runs), 1), x.shape()[1], x.shape()[2]});
  for (const ShardRun& r : runs)
    std::memcpy(static_cast<char*>(out.data()) + r.row * row * 2,
                static_cast<const char*>(x.data()) + (cu[size_t(r.seq)] + r.pos.lo) * row * 2,
                size_t(r.pos.size() * row * 2));
  return out;
}

TEST(NcclRing, EqualsOneDeviceAttention) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 1) GTEST_SKIP() << "needs a GPU";
  const std::vector<int64_t> lengths{1000, 0, 777};
  const std::vector<int32_t> cu{0, 1000, 1000, 1777};
  const int64_t total = 1777, hq = 8, hkv = 2, d = 128, B = 64;
  Buffer q(DType::bf16, {total, hq, d}), k(DType::bf16, {total, hkv, d}), v(DType::bf16, {total, hkv, d});
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("input seed " + std::to_string(seed));
  q.fill_random(seed + 1, -2.f, 2.f);
  k.fill_random(seed + 2, -2.f, 2.f);
  v.fill_random(seed + 3);
  Buffer sink(DType::f32, {hq});
  sink.fill_random(7, -3.f, 3.f);
  for (int config = 0; config < 3; ++config) {
    SCOPED_TRACE("config " + std::to_string(config));
    AttentionParams one;
    Buffer want(DType::f32, {total, hq, d}), want_lse(DType::f32, {hq, total});
    one.q = q.view();
    one.k = k.view();
    one.v = v.view();
    one.out = want.view();
    one.lse = want_lse.view();
    one.pattern = (config == 1 ? Pattern::window(100, 0) : Pattern::causal()).with_varlen(3, cu.data());
    if (config == 1) {
      one.sink_mode = SinkMode::denominator;
      one.sink = sink.view();
    }
    EstimateResult est;
    if (config == 2) {
      EstimateConfig ec;
      ec.block = int32_t(B);
      ec.tau = 0.8;
      est = estimate(q.view(), k.view(), Pattern::causal().with_varlen(3, cu.data()), ec, Backend::cpu);
      one.pattern = one.pattern.with_blocks(est.mask.view());
    }
    attention(one, Backend::cpu);
    // One rank runs the pieces, merges and sinks without a transfer; then 2 ranks and every GPU.
    std::vector<int> worlds{1};
    if (devices >= 2) worlds.push_back(2);
    if (devices > 2) worlds.push_back(devices);
    for (int world : worlds) {
      SCOPED_TRACE(std::to_string(world) + " ranks");
      std::vector<ncclComm_t> comms(static_cast<size_t>(world));
      std::vector<int> devs(static_cast<size_t>(world));
      for (int r = 0; r < world; ++r) devs[size_t(r)] = r;
      ASSERT_EQ(ncclCommInitAll(comms.data(), world, devs.data()), ncclSuccess);
      Buffer got(DType::f32, {total, hq, d}), got_lse(DType::f32, {hq, total});
      got.fill(NAN);
      got_lse.fill(NAN);
      std::vector<std::string> errors(static_cast<size_t>(world));
      std::vector<std::thread> ranks;
      for (int r = 0; r < world; ++r)
        ranks.emplace_back([&, r] {
          try {
            ARIADNE_CHECK(cudaSetDevice(r) == cudaSuccess, "cudaSetDevice");
            const std::vector<ShardRun> runs = zigzag_runs(lengths, r, world, B);
            const int64_t n_r = rows_of(runs);
            const DeviceBuffer dq = DeviceBuffer::from_host(gather(q, runs, cu));
            const DeviceBuffer dk = DeviceBuffer::from_host(gather(k, runs, cu));
            const DeviceBuffer dv = DeviceBuffer::from_host(gather(v, runs, cu));
            const DeviceBuffer dsink = DeviceBuffer::from_host(sink);
            const int64_t rows = std::max<int64_t>(n_r, 1);
            DeviceBuffer out(DType::f32, {rows, hq, d}), lse(DType::f32, {hq, rows});
            NcclRingParams p;
            p.q = make_view(dq.data(), DType::bf16, {n_r, hq, d}, Device::cuda);
            p.k = make_view(dk.data(), DType::bf16, {n_r, hkv, d}, Device::cuda);
            p.v = make_view(dv.data(), DType::bf16, {n_r, hkv, d}, Device::cuda);
            p.out = make_view(out.data(), DType::f32, {n_r, hq, d}, Device::cuda);
            p.lse = make_view(lse.data(), DType::f32, {hq, n_r}, Device::cuda);
            p.lengths = lengths;
            p.align = B;
            p.rule = config == 1 ? Pattern::window(100, 0) : Pattern::causal();
            if (config == 1) {
              p.sink_mode = SinkMode::denominator;
              p.sink = dsink.view();
            }
            if (config == 2)  // each run's rows of the one-device mask
              for (const ShardRun& run : runs)
                p.masks.push_back(mask_rows(one.pattern, run.seq, total, total, run.pos.lo, run.pos.size()));
            p.comm = comms[size_t(r)];
            ring_attention_nccl(p);
            const Buffer o = out.to_host(), l = lse.to_host();
            for (const ShardRun& run : runs) {
              const int64_t at = run.row, g = cu[size_t(run.seq)] + run.pos.lo, len = run.pos.size();
              std::memcpy(got.as<float>() + g * hq * d, o.as<float>() + at * hq * d, size_t(len * hq * d) * 4);
              for (int64_t h = 0; h < hq; ++h)
                std::memcpy(got_lse.as<float>() + h * total + g, l.as<float>() + h * n_r + at, size_t(len) * 4);
            }
          } catch (const std::exception& e) {
            errors[size_t(r)] = e.what();
          }
        });
      for (std::thread& t : ranks) t.join();
      for (ncclComm_t c : comms) ncclCommDestroy(c);
      for (int r = 0; r < world; ++r) ASSERT_EQ(errors[size_t(r)], "") << "rank " << r;
      const double tol = tolerance(DType::bf16, 2.0 * 2.0 * double(d) / std::sqrt(double(d)));
      EXPECT_TRUE(close_enough("out", compare(got.view(), want.view()), tol));
      EXPECT_TRUE(lse_close(got_lse.view(), want_lse.view(), tol));
    }
  }
}

}  // namespace
}  // namespace ariadne
