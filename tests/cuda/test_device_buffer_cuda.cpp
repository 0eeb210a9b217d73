// DeviceBuffer::stream_ordered (include/ariadne/device.hpp): pool memory allocated and freed in
// the order of the legacy default stream. Contents must survive moves, assignments across both
// kinds of buffer and the pool's reuse of freed blocks; trimming must not touch live buffers.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ariadne/device.hpp"
#include "ariadne/error.hpp"
#include "kernels/bench_kernels.hpp"
#include "cuda_common.hpp"

namespace ariadne {
namespace {

bool pools_supported() {
  int device = 0, supported = 0;
  return cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device) == cudaSuccess && supported != 0;
}

size_t bytes_of(const Buffer& h) { return size_t(h.numel()) * size_t(dtype_size(h.dtype())); }

// Random f32 values of `shape` in a host buffer (seeded by the test seed).
Buffer random_host(const std::vector<int64_t>& shape, uint64_t seed) {
  Buffer h(DType::f32, shape);
  h.fill_random(seed);
  return h;
}

DeviceBuffer pooled_copy_of(const Buffer& h) {
  DeviceBuffer d = DeviceBuffer::stream_ordered(h.dtype(), h.shape());
  EXPECT_EQ(d.bytes(), bytes_of(h));
  EXPECT_EQ(cudaMemcpy(d.data(), h.data(), bytes_of(h), cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}

bool same_bytes(const Buffer& a, const Buffer& b) {
  return bytes_of(a) == bytes_of(b) && std::memcmp(a.data(), b.data(), bytes_of(a)) == 0;
}

class DeviceBufferCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(DeviceBufferCuda, StreamOrderedAllocateFillCopyBack) {
  const uint64_t seed = cuda_testing::base_seed();
  const Buffer h = random_host({3, 1001}, seed);
  DeviceBuffer d = pooled_copy_of(h);
  EXPECT_EQ(d.is_stream_ordered(), pools_supported());
  EXPECT_EQ(d.view().device, Device::cuda);
  EXPECT_EQ(d.view().shape[1], 1001);
  EXPECT_TRUE(same_bytes(d.to_host(), h)) << "ARIADNE_TEST_SEED=" << seed;
  d.fill_bytes(0xAB);
  const Buffer f = d.to_host();
  const auto* b = static_cast<const uint8_t*>(f.data());
  for (size_t i = 0; i < bytes_of(f); ++i) ASSERT_EQ(b[i], 0xAB) << "byte " << i;
  // Empty and invalid shapes behave as the constructor's.
  const DeviceBuffer empty = DeviceBuffer::stream_ordered(DType::bf16, {0, 4});
  EXPECT_EQ(empty.bytes(), size_t(0));
  EXPECT_NE(empty.data(), nullptr);
  EXPECT_THROW(DeviceBuffer::stream_ordered(DType::f32, {2, -1}), Error);
}

TEST_F(DeviceBufferCuda, StreamOrderedMovesAndAssignments) {
  const uint64_t seed = cuda_testing::base_seed() + 1;
  const Buffer h1 = random_host({517}, seed), h2 = random_host({64, 3}, seed + 1);
  DeviceBuffer a = pooled_copy_of(h1);
  void* const pa = a.data();
  // Move construction takes the pointer and the kind; the source is left empty.
  DeviceBuffer b(std::move(a));
  EXPECT_EQ(b.data(), pa);
  EXPECT_EQ(a.data(), nullptr);  // the moved-from state is specified: empty
  EXPECT_FALSE(a.is_stream_ordered());
  EXPECT_EQ(b.is_stream_ordered(), pools_supported());
  EXPECT_TRUE(same_bytes(b.to_host(), h1));
  // Pooled onto pooled: the target's block is freed (stream-ordered), the source's contents move.
  DeviceBuffer c = pooled_copy_of(h2);
  c = std::move(b);
  EXPECT_EQ(c.data(), pa);
  EXPECT_TRUE(same_bytes(c.to_host(), h1));
  // Plain onto pooled and pooled onto plain: each buffer is freed as it was allocated.
  DeviceBuffer plain = DeviceBuffer::from_host(h2);
  c = std::move(plain);
  EXPECT_FALSE(c.is_stream_ordered());
  EXPECT_TRUE(same_bytes(c.to_host(), h2));
  DeviceBuffer target = DeviceBuffer::from_host(h1);
  target = pooled_copy_of(h2);
  EXPECT_EQ(target.is_stream_ordered(), pools_supported());
  EXPECT_TRUE(same_bytes(target.to_host(), h2));
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// Allocation after release reuses the pool's blocks in stream order: each buffer must hold what
// was written into it, whatever an earlier, freed buffer of the same block held.
TEST_F(DeviceBufferCuda, StreamOrderedReuseKeepsContentsAndTrimSparesLiveBuffers) {
  const uint64_t seed = cuda_testing::base_seed() + 2;
  std::mt19937_64 rng(seed);
  const Buffer keep_h = random_host({4096}, seed);
  const DeviceBuffer keep = pooled_copy_of(keep_h);
  for (int i = 0; i < 200; ++i) {
    const int64_t n = 1 + int64_t(rng() % 70000);
    DeviceBuffer d = DeviceBuffer::stream_ordered(DType::f32, {n});
    const int v = int(rng() % 256);
    d.fill_bytes(v);
    uint8_t first = 0, last = 0;
    d.copy_to_host(&first, 1);
    ASSERT_EQ(cudaMemcpy(&last, static_cast<const uint8_t*>(d.data()) + d.bytes() - 1, 1, cudaMemcpyDeviceToHost),
              cudaSuccess);
    ASSERT_TRUE(first == v && last == v) << "iteration " << i << " (ARIADNE_TEST_SEED=" << cuda_testing::base_seed()
                                         << ")";
  }
  DeviceBuffer::trim_stream_ordered_pool();
  EXPECT_TRUE(same_bytes(keep.to_host(), keep_h)) << "a live buffer changed across the pool's trim";
}

// cuda_spin (bench/kernels/bench_kernels.hpp), the benchmarks' stream hold: the events around it see at least
// about the time asked for (the clock-rate attribute is the boost clock, so a slower clock only
// lengthens it), a zero hold runs, and a bad request is refused by name. The upper bound holds for
// the shortest of three holds: other processes on the GPU (the suite's parallel shards) time-slice
// with this one and can stretch any single hold many times over.
TEST_F(DeviceBufferCuda, SpinHoldsTheStream) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t e0, e1;
  ASSERT_EQ(cudaEventCreate(&e0), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&e1), cudaSuccess);
  cuda_spin(s, 0);
  for (const double us : {200.0, 1000.0}) {
    float shortest = INFINITY;
    for (int rep = 0; rep < 3; ++rep) {
      ASSERT_EQ(cudaEventRecord(e0, s), cudaSuccess);
      cuda_spin(s, us);
      ASSERT_EQ(cudaEventRecord(e1, s), cudaSuccess);
      ASSERT_EQ(cudaEventSynchronize(e1), cudaSuccess);
      float ms = 0;
      ASSERT_EQ(cudaEventElapsedTime(&ms, e0, e1), cudaSuccess);
      EXPECT_GE(ms * 1e3, 0.9 * us) << "a hold of " << us << " us";
      shortest = std::min(shortest, ms);
    }
    EXPECT_LT(shortest * 1e3, 20 * us + 1000) << "the shortest of three holds of " << us << " us";
  }
  try {
    cuda_spin(s, -1);
    ADD_FAILURE() << "a negative hold was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda_spin: microseconds"), std::string::npos) << e.what();
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(s);
}

}  // namespace
}  // namespace ariadne
