// cuda_memory_floor (bench/kernels/bench_kernels.hpp), the benchmarks' memory floor: it must touch every byte
// it claims to (out = q ^ k ^ v word by word where all three exist, q alone where k and v are
// shorter), over q and k/v sizes equal, GQA-like (k and v shorter) and the reverse, at lengths that
// end inside a block; and refuse bad arguments by name.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
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

class MemoryFloorCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

std::vector<uint32_t> random_words(int64_t n, std::mt19937& rng) {
  std::vector<uint32_t> w(static_cast<size_t>(n));
  for (uint32_t& x : w) x = rng();
  return w;
}

DeviceBuffer upload_words(const std::vector<uint32_t>& w) {
  DeviceBuffer d(DType::f32, {int64_t(w.size())});
  EXPECT_EQ(cudaMemcpy(d.data(), w.data(), w.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}

TEST_F(MemoryFloorCuda, WritesQXorKXorVOverEveryWord) {
  std::mt19937 rng{uint32_t(cuda_testing::base_seed())};
  // (q, k/v) sizes in 16-byte words: equal, k/v a quarter (GQA 4:1), k/v longer, one word, blocks
  // of 512 threads plus one.
  const std::vector<std::pair<int64_t, int64_t>> sizes = {{4096, 4096}, {2052, 513}, {513, 2052}, {1, 1}, {513, 513}};
  for (const auto& [nq, nkv] : sizes) {
    SCOPED_TRACE("q words " + std::to_string(nq) + ", k/v words " + std::to_string(nkv));
    const auto q = random_words(4 * nq, rng), k = random_words(4 * nkv, rng), v = random_words(4 * nkv, rng);
    const DeviceBuffer dq = upload_words(q), dk = upload_words(k), dv = upload_words(v);
    DeviceBuffer dout(DType::f32, {4 * nq});
    ASSERT_EQ(cudaMemset(dout.data(), 0xff, size_t(16 * nq)), cudaSuccess);  // poisoned first
    cuda_memory_floor(dq.data(), dk.data(), dv.data(), dout.data(), 16 * nq, 16 * nkv, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<uint32_t> out(size_t(4 * nq));
    ASSERT_EQ(cudaMemcpy(out.data(), dout.data(), out.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    int64_t wrong = 0, first = -1;
    for (int64_t i = 0; i < 4 * nq; ++i) {
      const uint32_t want = i < 4 * nkv ? q[size_t(i)] ^ k[size_t(i)] ^ v[size_t(i)] : q[size_t(i)];
      if (out[size_t(i)] != want && wrong++ == 0) first = i;
    }
    EXPECT_EQ(wrong, 0) << "first wrong 32-bit word " << first;
  }
}

TEST_F(MemoryFloorCuda, RefusesBadArgumentsByName) {
  DeviceBuffer a(DType::f32, {64}), b(DType::f32, {64});
  const auto refused = [&](const void* q, int64_t q_bytes, int64_t kv_bytes, const std::string& needle) {
    try {
      cuda_memory_floor(q, a.data(), a.data(), b.data(), q_bytes, kv_bytes, nullptr);
      ADD_FAILURE() << "accepted; expected an error naming " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  refused(static_cast<const char*>(a.data()) + 4, 64, 64, "cuda_memory_floor: q must be a 16-byte aligned");
  refused(nullptr, 64, 64, "cuda_memory_floor: q must be");
  refused(a.data(), 24, 64, "cuda_memory_floor: q_bytes 24");
  refused(a.data(), 64, 0, "cuda_memory_floor: kv_bytes 0");
}

}  // namespace
}  // namespace ariadne
