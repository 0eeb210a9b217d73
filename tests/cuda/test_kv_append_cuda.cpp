// Device appends into the paged KV cache (CudaKVCache::reserve / append) against the host twin
// given the same tokens: the pools, the key summaries, the block table and the lengths equal the
// host's bit for bit after every step pattern (pools grown on the device, pages filled across many
// steps, sequences of different lengths, one new sequence, pages reserved one step or eight steps
// ahead), dense decode on the grown device cache equals decode on a fresh copy of the host cache,
// one decode step (append, then dense decode into a caller's workspace) captured into a CUDA graph
// and replayed step after step keeps the cache equal to the host's (and the host mirror of the
// lengths, advanced by appended()) and each step's output within the f32 rule of the reference
// decode on the host cache, and the refusals name the field. Fresh random tokens per run
// (ARIADNE_TEST_SEED repeats one).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ariadne/decode.hpp"
#include "ariadne/device.hpp"
#include "common.hpp"
#include "cuda/cuda_common.hpp"

namespace ariadne {
namespace {

// One step's tokens: [batch, kv_heads, head_dim] in the cache dtype on the host.
Buffer random_tokens(std::mt19937_64& rng, DType dt, int64_t batch, const KVCacheConfig& c) {
  Buffer b(dt, {batch, c.kv_heads, c.head_dim});
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  for (int64_t i = 0; i < b.numel(); ++i)
    b.view().set({i / (int64_t(c.kv_heads) * c.head_dim), (i / c.head_dim) % c.kv_heads, i % c.head_dim}, u(rng));
  return b;
}

TensorView row_of(const Buffer& b, int64_t r) {  // token r of a step as a [1, kv_heads, head_dim] view
  TensorView v = b.view();
  v.data = static_cast<char*>(v.data) + r * v.stride[0] * dtype_size(v.dtype);
  v.shape[0] = 1;
  return v;
}

template <class T>
std::vector<T> download(const void* p, size_t n) {
  std::vector<T> h(n);
  if (n) {
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return h;
}

// Every stored byte a live sequence owns, and the summaries of its pages, against the host twin,
// logical page by logical page (pages reserved ahead may come from the pool in another order than
// the host took them), and no pool page held twice.
void expect_same(const PagedKVCache& host, const CudaKVCache& dev, const std::vector<int32_t>& seqs,
                 const std::string& when) {
  SCOPED_TRACE(when + " (ARIADNE_TEST_SEED=" + std::to_string(cuda_testing::base_seed()) + ")");
  const KVCacheConfig& c = host.config();
  const int64_t esz = dtype_size(c.dtype), row = int64_t(c.kv_heads) * c.head_dim;
  const int64_t page_elems = int64_t(c.page_size) * row, spp = host.strides_per_page();
  const int64_t cap = dev.capacity_pages();
  const auto dk = download<unsigned char>(dev.k_pool(), size_t(cap * page_elems * esz));
  const auto dv = download<unsigned char>(dev.v_pool(), size_t(cap * page_elems * esz));
  const auto dsum = download<float>(dev.key_sum(), size_t(cap * spp * row));
  const auto dmin = download<float>(dev.key_min(), size_t(cap * row));
  const auto dmax = download<float>(dev.key_max(), size_t(cap * row));
  const auto dlen = download<int32_t>(dev.lengths(), size_t(dev.sequences()));
  const auto dtab = download<int32_t>(dev.block_table(), size_t(dev.sequences()) * size_t(dev.max_pages()));
  const auto* hk = static_cast<const unsigned char*>(host.k_pool().data);
  const auto* hv = static_cast<const unsigned char*>(host.v_pool().data);
  std::vector<char> held(size_t(cap), 0);
  for (const int32_t s : seqs) {
    ASSERT_EQ(dev.length(s), host.length(s)) << "sequence " << s;
    ASSERT_EQ(int64_t(dlen[size_t(s)]), host.length(s)) << "device length of sequence " << s;
    const std::vector<int32_t>& pt = host.page_table(s);
    for (size_t i = 0; i < pt.size(); ++i) {
      const int64_t ph = pt[i], pd = dtab[size_t(s) * size_t(dev.max_pages()) + i];
      ASSERT_TRUE(pd >= 0 && pd < cap) << "sequence " << s << " page " << i << ": device pool page " << pd;
      ASSERT_FALSE(held[size_t(pd)]) << "pool page " << pd << " held twice";
      held[size_t(pd)] = 1;
      const int64_t rows = std::min<int64_t>(c.page_size, host.length(s) - int64_t(i) * c.page_size);
      for (int h = 0; h < c.kv_heads; ++h) {
        const auto at = [&](int64_t p) { return size_t(((p * c.kv_heads + h) * c.page_size) * c.head_dim * esz); };
        const size_t n = size_t(rows * c.head_dim * esz);
        ASSERT_EQ(0, std::memcmp(dk.data() + at(pd), hk + at(ph), n)) << "K of sequence " << s << " page " << i << " head " << h;
        ASSERT_EQ(0, std::memcmp(dv.data() + at(pd), hv + at(ph), n)) << "V of sequence " << s << " page " << i << " head " << h;
        const int64_t strides = (rows + c.summary_stride - 1) / c.summary_stride;
        ASSERT_EQ(0, std::memcmp(dsum.data() + (pd * c.kv_heads + h) * spp * c.head_dim,
                                 host.key_sum(ph) + int64_t(h) * spp * c.head_dim, size_t(strides * c.head_dim) * sizeof(float)))
            << "stride sums of sequence " << s << " page " << i << " head " << h;
      }
      ASSERT_EQ(0, std::memcmp(dmin.data() + pd * row, host.key_min(ph), size_t(row) * sizeof(float)))
          << "key min of sequence " << s << " page " << i;
      ASSERT_EQ(0, std::memcmp(dmax.data() + pd * row, host.key_max(ph), size_t(row) * sizeof(float)))
          << "key max of sequence " << s << " page " << i;
    }
  }
}

// Dense decode of one step's queries on the device cache against the same on a fresh device copy
// of the host cache: bitwise equal outputs (same pools, pages and lengths, so the same kernels).
void expect_same_decode(PagedKVCache& host, const CudaKVCache& dev, const std::vector<int32_t>& seqs, int heads_q,
                        std::mt19937_64& rng) {
  const KVCacheConfig& c = host.config();
  const int64_t B = int64_t(seqs.size());
  Buffer q(c.dtype, {B, heads_q, c.head_dim});
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  for (int64_t i = 0; i < q.numel(); ++i)
    q.view().set({i / (int64_t(heads_q) * c.head_dim), (i / c.head_dim) % heads_q, i % c.head_dim}, u(rng));
  const DeviceBuffer dq = DeviceBuffer::from_host(q), ids = DeviceBuffer::from_ints(seqs);
  const CudaKVCache fresh(host);
  std::vector<float> outs[2];
  for (int side = 0; side < 2; ++side) {
    DeviceBuffer out(DType::f32, {B, heads_q, c.head_dim});
    DecodeParams p;
    p.q = dq.view();
    p.out = out.view();
    p.device_cache = side == 0 ? &dev : &fresh;
    p.seqs = seqs;
    p.device_seqs = static_cast<const int32_t*>(ids.data());
    decode_attention(p, Backend::cuda);
    outs[side].resize(size_t(B * heads_q * c.head_dim));
    out.copy_to_host(outs[side].data(), outs[side].size() * sizeof(float));
  }
  EXPECT_EQ(0, std::memcmp(outs[0].data(), outs[1].data(), outs[0].size() * sizeof(float)))
      << "decode on the appended cache differs from decode on a copy of the host cache";
}

class CudaKvAppend : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

// Sequences added to `host`, one per length, each prefilled on the host with that many random
// tokens (the same rows as keys and values); their ids.
std::vector<int32_t> prefilled(PagedKVCache& host, std::mt19937_64& rng, std::initializer_list<int64_t> lengths) {
  const KVCacheConfig& c = host.config();
  std::vector<int32_t> seqs;
  for (const int64_t len : lengths) {
    const int s = host.add_sequence();
    seqs.push_back(s);
    if (len > 0) {
      const Buffer t = random_tokens(rng, c.dtype, len, c);
      host.append(s, t.view(), t.view());
    }
  }
  return seqs;
}

TEST_P(CudaKvAppend, StepsEqualTheHostTwin) {
  const DType dt = GetParam();
  std::mt19937_64 rng(cuda_testing::base_seed() ^ uint64_t(dt));
  const KVCacheConfig c{16, 2, 80, dt, 4};
  PagedKVCache host(c);
  std::vector<int32_t> seqs = prefilled(host, rng, {13, 0, 40});  // the device takes over from here
  CudaKVCache dev(host);
  for (int step = 0; step < 70; ++step) {
    if (step == 30) {  // a new sequence joins, on both sides, and the device copy is taken again
      seqs.push_back(host.add_sequence());
      dev.sync(host);
    }
    const int64_t B = int64_t(seqs.size());
    const Buffer k = random_tokens(rng, dt, B, c), v = random_tokens(rng, dt, B, c);
    for (int64_t b = 0; b < B; ++b) host.append(seqs[size_t(b)], row_of(k, b), row_of(v, b));
    // Reserve a step at a time early on, then eight at once (pages ahead of the tokens).
    if (step < 40 || step % 8 == 0) dev.reserve(seqs, step < 40 ? 1 : 8);
    const DeviceBuffer dk = DeviceBuffer::from_host(k), dv = DeviceBuffer::from_host(v), ids = DeviceBuffer::from_ints(seqs);
    dev.append(dk.view(), dv.view(), seqs, static_cast<const int32_t*>(ids.data()));
    if (step % 10 == 9) expect_same(host, dev, seqs, "after step " + std::to_string(step));
    if (::testing::Test::HasFatalFailure()) return;
  }
  EXPECT_GT(dev.capacity_pages(), 16) << "the pools were meant to grow on the device";
  expect_same(host, dev, seqs, "at the end");
  dev.refresh_lengths();
  for (const int32_t s : seqs) EXPECT_EQ(dev.length(s), host.length(s));
  expect_same_decode(host, dev, seqs, 6, rng);
}

// Blocks of rows appended at once (a prefill into the device cache) against the host twin given the
// same rows: blocks that start mid-page and mid-stride, span several pages, fill a page exactly, a
// single row, an empty block; the pools grow on the device; a strided view (every other token of
// a larger buffer); then single-token steps continue the same pages; dense decode at the end.
TEST_P(CudaKvAppend, BlocksOfRowsEqualTheHostTwin) {
  const DType dt = GetParam();
  std::mt19937_64 rng(cuda_testing::base_seed() ^ 31 ^ uint64_t(dt));
  const KVCacheConfig c{16, 2, 80, dt, 4};
  PagedKVCache host(c);
  std::vector<int32_t> seqs = prefilled(host, rng, {5, 0, 16});
  CudaKVCache dev(host);
  const std::vector<int64_t> blocks = {7, 1, 0, 16, 40, 3, 100, 2, 250};
  for (size_t i = 0; i < blocks.size(); ++i) {
    const int32_t s = seqs[i % seqs.size()];
    const int64_t n = blocks[i];
    const Buffer k = random_tokens(rng, dt, n, c), v = random_tokens(rng, dt, n, c);
    if (n > 0) host.append(s, k.view(), v.view());
    const DeviceBuffer dk = DeviceBuffer::from_host(k), dv = DeviceBuffer::from_host(v);
    dev.append_rows(s, dk.view(), dv.view());
    expect_same(host, dev, seqs, "after block " + std::to_string(i) + " (" + std::to_string(n) + " rows)");
    if (::testing::Test::HasFatalFailure()) return;
  }
  {  // a strided view: tokens 0, 2, 4, … of a buffer twice as long
    const int64_t n = 37;
    const Buffer wide = random_tokens(rng, dt, 2 * n, c);
    Buffer k(dt, {n, c.kv_heads, c.head_dim});
    for (int64_t t = 0; t < n; ++t)
      for (int h = 0; h < c.kv_heads; ++h)
        for (int e = 0; e < c.head_dim; ++e) k.view().set({t, h, e}, wide.view().get({2 * t, h, e}));
    host.append(seqs[1], k.view(), k.view());
    const DeviceBuffer dw = DeviceBuffer::from_host(wide);
    TensorView sv = dw.view();
    sv.shape[0] = n;
    sv.stride[0] *= 2;
    dev.append_rows(seqs[1], sv, sv);
    expect_same(host, dev, seqs, "after the strided block");
    if (::testing::Test::HasFatalFailure()) return;
  }
  EXPECT_GT(dev.capacity_pages(), 16) << "the pools were meant to grow on the device";
  for (int step = 0; step < 9; ++step) {  // decode steps continue the pages the blocks filled
    const int64_t B = int64_t(seqs.size());
    const Buffer k = random_tokens(rng, dt, B, c), v = random_tokens(rng, dt, B, c);
    for (int64_t b = 0; b < B; ++b) host.append(seqs[size_t(b)], row_of(k, b), row_of(v, b));
    dev.reserve(seqs, 1);
    const DeviceBuffer dk = DeviceBuffer::from_host(k), dv = DeviceBuffer::from_host(v), ids = DeviceBuffer::from_ints(seqs);
    dev.append(dk.view(), dv.view(), seqs, static_cast<const int32_t*>(ids.data()));
  }
  expect_same(host, dev, seqs, "after the steps");
  dev.refresh_lengths();
  for (const int32_t s : seqs) EXPECT_EQ(dev.length(s), host.length(s));
  expect_same_decode(host, dev, seqs, 6, rng);
}

TEST_P(CudaKvAppend, GraphOfAppendAndDecodeReplays) {
  const DType dt = GetParam();
  std::mt19937_64 rng(cuda_testing::base_seed() ^ 77 ^ uint64_t(dt));
  const KVCacheConfig c{64, 8, 128, dt, 8};
  const int heads_q = 32, steps = 12;
  PagedKVCache host(c);
  std::vector<int32_t> seqs;
  for (int64_t len : {1000, 64, 333}) {
    const int s = host.add_sequence();
    seqs.push_back(s);
    const Buffer t = random_tokens(rng, dt, len, c);
    host.append(s, t.view(), t.view());
  }
  CudaKVCache dev(host);
  const int64_t B = int64_t(seqs.size());
  dev.reserve(seqs, steps);
  const DeviceBuffer ids = DeviceBuffer::from_ints(seqs);
  DeviceBuffer kin(dt, {B, c.kv_heads, c.head_dim}), vin(dt, {B, c.kv_heads, c.head_dim});
  DeviceBuffer q(dt, {B, heads_q, c.head_dim}), out(DType::f32, {B, heads_q, c.head_dim});
  Buffer qh(dt, {B, heads_q, c.head_dim});
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  for (int64_t i = 0; i < qh.numel(); ++i)
    qh.view().set({i / (int64_t(heads_q) * c.head_dim), (i / c.head_dim) % heads_q, i % c.head_dim}, u(rng));
  ASSERT_EQ(cudaMemcpy(q.data(), qh.data(), size_t(qh.numel()) * dtype_size(dt), cudaMemcpyHostToDevice), cudaSuccess);
  cudaStream_t st = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  DecodeParams p;
  p.q = q.view();
  p.out = out.view();
  p.device_cache = &dev;
  p.seqs = seqs;
  p.device_seqs = static_cast<const int32_t*>(ids.data());
  p.stream = st;
  const auto* dids = static_cast<const int32_t*>(ids.data());

  // New tokens into the captured input buffers, the same into the host twin; after the step, the
  // output against the reference decode on the host cache.
  const auto next_tokens = [&] {
    const Buffer k = random_tokens(rng, dt, B, c), v = random_tokens(rng, dt, B, c);
    ASSERT_EQ(cudaMemcpy(kin.data(), k.data(), size_t(k.numel()) * dtype_size(dt), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(vin.data(), v.data(), size_t(v.numel()) * dtype_size(dt), cudaMemcpyHostToDevice), cudaSuccess);
    for (int64_t b = 0; b < B; ++b) host.append(seqs[size_t(b)], row_of(k, b), row_of(v, b));
  };
  const auto check_step = [&](int step) {
    std::vector<float> got(size_t(B * heads_q * c.head_dim)), want(got.size());
    out.copy_to_host(got.data(), got.size() * sizeof(float));
    DecodeParams r;
    r.q = qh.view();
    r.out = make_view(want.data(), DType::f32, {B, heads_q, c.head_dim});
    r.cache = &host;
    r.seqs = seqs;
    decode_attention(r, Backend::reference);
    const double tol = testing::tolerance(DType::f32, 2.0 * 2.0 * std::sqrt(double(c.head_dim)));
    EXPECT_TRUE(testing::close_enough("out", testing::compare(make_view(got.data(), DType::f32, {B, heads_q, c.head_dim}),
                                                              r.out),
                                      tol))
        << "step " << step << " (ARIADNE_TEST_SEED=" << cuda_testing::base_seed() << ")";
  };

  // Step 0 eagerly (first-call setup), then the workspace for this geometry and the capture.
  next_tokens();
  dev.append(kin.view(), vin.view(), seqs, dids, st);
  decode_attention(p, Backend::cuda);
  ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
  check_step(0);
  // The graph's decode runs after its append: the workspace for one more token a row.
  const size_t ws_bytes = decode_workspace_bytes(p, 1);
  EXPECT_GE(ws_bytes, decode_workspace_bytes(p));
  DeviceBuffer ws(DType::f32, {int64_t(std::max<size_t>(ws_bytes, 4) / 4)});
  p.workspace = ws.data();
  p.workspace_bytes = ws_bytes;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  dev.append(kin.view(), vin.view(), seqs, dids, st);
  decode_attention(p, Backend::cuda);
  ASSERT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int step = 1; step < steps; ++step) {
    next_tokens();
    ASSERT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    if (step > 1) dev.appended(seqs);  // the capture counted step 1's append on the host
    for (const int32_t sq : seqs) ASSERT_EQ(dev.length(sq), host.length(sq)) << "sequence " << sq << " step " << step;
    check_step(step);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(st);
  std::vector<int64_t> mirror;
  for (const int32_t sq : seqs) mirror.push_back(dev.length(sq));
  dev.refresh_lengths();  // the device's own lengths: the mirror that appended() kept must equal them
  for (size_t b = 0; b < seqs.size(); ++b) EXPECT_EQ(dev.length(seqs[b]), mirror[b]) << "sequence " << seqs[b];
  expect_same(host, dev, seqs, "after the replays");
  // A workspace smaller than the call needs is refused by name.
  if (ws_bytes > 0) {
    p.workspace_bytes = ws_bytes - 1;
    EXPECT_THROW(decode_attention(p, Backend::cuda), Error);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaKvAppend, ::testing::Values(DType::bf16, DType::f16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(CudaKvAppendErrors, NameTheField) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const KVCacheConfig c{16, 2, 64, DType::bf16, 8};
  PagedKVCache host(c);
  const int s = host.add_sequence();
  CudaKVCache dev(host);
  const std::vector<int32_t> seqs{s};
  const DeviceBuffer ids = DeviceBuffer::from_ints(seqs);
  DeviceBuffer k(DType::bf16, {1, 2, 64}), v(DType::bf16, {1, 2, 64}), wrong(DType::f16, {1, 2, 64});
  const auto expect_error = [&](const std::function<void()>& f, const std::string& words) {
    try {
      f();
      ADD_FAILURE() << "accepted; expected an error naming " << words;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  const auto* dids = static_cast<const int32_t*>(ids.data());
  expect_error([&] { dev.append(k.view(), v.view(), seqs, dids); }, "no page reserved for its token 0");
  dev.reserve(seqs, 2);
  expect_error([&] { dev.append(wrong.view(), v.view(), seqs, dids); }, "k has dtype f16");
  const std::vector<int32_t> twice{s, s};
  DeviceBuffer k2(DType::bf16, {2, 2, 64});
  expect_error([&] { dev.append(k2.view(), k2.view(), twice, dids); }, "appears twice");
  expect_error([&] { dev.reserve(std::vector<int32_t>{7}, 1); }, "sequence 7 is not a live sequence");
  Buffer hk(DType::bf16, {1, 2, 64});
  expect_error([&] { dev.append(hk.view(), v.view(), seqs, dids); }, "k must be a device tensor");
  dev.append(k.view(), v.view(), seqs, dids);
  EXPECT_EQ(dev.length(s), 1);
  // Blocks of rows.
  DeviceBuffer k3(DType::bf16, {3, 2, 64}), v2(DType::bf16, {2, 2, 64}), heads(DType::bf16, {3, 4, 64});
  expect_error([&] { dev.append_rows(7, k3.view(), k3.view()); }, "sequence 7 is not a live sequence");
  expect_error([&] { dev.append_rows(s, k3.view(), v2.view()); }, "v is bf16[2, 2, 64]");
  expect_error([&] { dev.append_rows(s, heads.view(), heads.view()); }, "expected [tokens, 2, 64]");
  expect_error([&] { dev.append_rows(s, hk.view(), hk.view()); }, "k must be a device tensor");
  DeviceBuffer k3f(DType::f16, {3, 2, 64});
  expect_error([&] { dev.append_rows(s, k3f.view(), k3f.view()); }, "k has dtype f16");
  dev.append_rows(s, k3.view(), k3.view());
  EXPECT_EQ(dev.length(s), 4);
}

}  // namespace
}  // namespace ariadne
