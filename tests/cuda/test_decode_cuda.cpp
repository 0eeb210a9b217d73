// Decode over the device cache (include/ariadne/decode.hpp, src/decode/cuda): the CUDA kernels
// against the decode reference on the same stored keys, values and queries (bf16 / f16), dense and
// with host selections, every head dim, GQA groups from 1 to 16, page sizes from 1 to 128, windows,
// both sink forms, empty sequences, long contexts that split, and NaN propagation; the device page
// selection (select_pages on the device cache) against the host scorers on the twin host cache, and a
// sparse step (select, then decode) captured into a CUDA graph and replayed as the rotation advances.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <vector>

#include "ariadne/decode.hpp"
#include "ariadne/device.hpp"
#include "common.hpp"
#include "cuda_common.hpp"

namespace ariadne {
namespace {

struct Case {
  std::vector<int64_t> lengths;
  int heads_q = 4, heads_kv = 2, dim = 64, page = 16;
  DType dtype = DType::bf16;
  SinkMode sink_mode = SinkMode::none;
  int64_t window = -1;
  int stride = 0;  // summary_stride; 0: 8 where the page size allows, else 1
};

std::string name_of(const Case& c) {
  std::ostringstream os;
  os << "len";
  for (int64_t l : c.lengths) os << '_' << l;
  os << " hq" << c.heads_q << " hkv" << c.heads_kv << " d" << c.dim << " page" << c.page << ' ' << dtype_name(c.dtype)
     << " sink " << sink_mode_name(c.sink_mode) << " window " << c.window << " stride " << c.stride;
  return os.str();
}

float round_to(DType t, float x) {
  return t == DType::bf16 ? bf16_to_float(float_to_bf16(x)) : f16_to_float(float_to_f16(x));
}

// A host cache filled in random chunks, its device twin, and one step's queries (the same 16-bit
// values on both sides) with host reference outputs.
struct Inputs {
  PagedKVCache cache;
  CudaKVCache device;
  std::vector<int32_t> seqs;
  Buffer q;               // host [B, Hq, d] in the cache dtype
  std::vector<float> qf;  // the same values as f32 (the host scorers read them)
  std::vector<float> sink;
  float max_abs_k = 0;
  Inputs(const Case& c, uint64_t seed)
      : cache(KVCacheConfig{c.page, c.heads_kv, c.dim, c.dtype, c.stride > 0 ? c.stride : c.page % 8 == 0 ? 8 : 1}),
        q(c.dtype, {int64_t(c.lengths.size()), c.heads_q, c.dim}) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    const int64_t row = int64_t(c.heads_kv) * c.dim;
    for (int64_t len : c.lengths) {
      const int s = cache.add_sequence();
      seqs.push_back(s);
      std::vector<float> k(size_t(len * row)), v(size_t(len * row));
      for (float& x : k) x = u(rng), max_abs_k = std::max(max_abs_k, std::fabs(x));
      for (float& x : v) x = u(rng);
      for (int64_t done = 0; done < len;) {
        const int64_t n = std::min<int64_t>(len - done, 1 + int64_t(rng() % 300));
        cache.append(s, make_view(k.data() + done * row, DType::f32, {n, c.heads_kv, c.dim}),
                     make_view(v.data() + done * row, DType::f32, {n, c.heads_kv, c.dim}));
        done += n;
      }
    }
    device.sync(cache);
    qf.resize(size_t(q.numel()));
    for (int64_t i = 0; i < q.numel(); ++i) {
      qf[size_t(i)] = round_to(c.dtype, 2.f * u(rng));
      q.view().set({i / (int64_t(c.heads_q) * c.dim), (i / c.dim) % c.heads_q, i % c.dim}, qf[size_t(i)]);
    }
    sink.resize(size_t(c.heads_q));
    for (float& x : sink) x = 3.f * u(rng);
  }
  double max_abs_logit() const {
    float mq = 0;
    for (float x : qf) mq = std::max(mq, std::fabs(x));
    return double(mq) * max_abs_k * std::sqrt(double(q.shape()[2]));
  }
};

struct Outputs {
  std::vector<float> out, lse;
};

// Runs the reference on the host cache and the CUDA kernels on the device twin (sequence ids
// uploaded by the call, or given in device memory); returns both.
// With `device_sel`, the kernels read that device selection instead of `sel` (which the reference reads).
std::pair<Outputs, Outputs> run_both(const Case& c, Inputs& in, const PageSelection* sel, bool device_ids = false,
                                     const CudaPageSelection* device_sel = nullptr) {
  const int64_t B = int64_t(c.lengths.size());
  Outputs ref{std::vector<float>(size_t(in.q.numel()), std::nanf("")), std::vector<float>(size_t(B * c.heads_q))};
  DecodeParams p;
  p.q = in.q.view();
  p.out = make_view(ref.out.data(), DType::f32, {B, c.heads_q, c.dim});
  p.lse = make_view(ref.lse.data(), DType::f32, {B, c.heads_q});
  p.cache = &in.cache;
  p.seqs = in.seqs;
  p.sink_mode = c.sink_mode;
  if (c.sink_mode != SinkMode::none) p.sink = make_view(in.sink.data(), DType::f32, {c.heads_q});
  p.window = c.window;
  p.selection = sel;
  decode_attention(p, Backend::reference);

  const DeviceBuffer q = DeviceBuffer::from_host(in.q);
  DeviceBuffer out(DType::f32, {B, c.heads_q, c.dim}), lse(DType::f32, {B, c.heads_q});
  out.fill_bytes(0xFF);  // NaN: every element must be written
  lse.fill_bytes(0xFF);
  const DeviceBuffer sink = DeviceBuffer::from_host(in.sink.data(), DType::f32, {c.heads_q});
  DecodeParams d = p;
  d.cache = nullptr;
  d.device_cache = &in.device;
  d.q = q.view();
  d.out = out.view();
  d.lse = lse.view();
  if (c.sink_mode != SinkMode::none) d.sink = sink.view();
  const DeviceBuffer ids = DeviceBuffer::from_ints(in.seqs);
  if (device_ids) d.device_seqs = static_cast<const int32_t*>(ids.data());
  if (device_sel) {
    d.selection = nullptr;
    d.device_selection = device_sel;
  }
  decode_attention(d, Backend::cuda);
  Outputs gpu{std::vector<float>(ref.out.size()), std::vector<float>(ref.lse.size())};
  out.copy_to_host(gpu.out.data(), gpu.out.size() * sizeof(float));
  lse.copy_to_host(gpu.lse.data(), gpu.lse.size() * sizeof(float));
  return {ref, gpu};
}

void expect_close(const Case& c, const Inputs& in, const Outputs& ref, const Outputs& gpu) {
  const int64_t B = int64_t(c.lengths.size());
  const double tol = testing::tolerance(DType::f32, in.max_abs_logit());  // f32 arithmetic on the stored values
  EXPECT_TRUE(testing::close_enough("out", testing::compare(make_view(const_cast<float*>(gpu.out.data()), DType::f32,
                                                                      {B, c.heads_q, c.dim}),
                                                            make_view(const_cast<float*>(ref.out.data()), DType::f32,
                                                                      {B, c.heads_q, c.dim})),
                                    tol));
  EXPECT_TRUE(testing::lse_close(make_view(const_cast<float*>(gpu.lse.data()), DType::f32, {B, c.heads_q}),
                                 make_view(const_cast<float*>(ref.lse.data()), DType::f32, {B, c.heads_q}), tol));
}

// 41 sequences × 8 KV heads: more rows than one CTA of the selection's row scan covers.
Case many_rows() {
  Case c{{}, 16, 8, 64, 16};
  for (int64_t i = 0; i < 41; ++i) c.lengths.push_back((i * 37) % 200);
  return c;
}

std::vector<Case> cases() {
  return {
      {{1}, 4, 2, 64, 16},
      {{16}, 4, 2, 64, 16},
      {{17, 0, 5}, 4, 4, 64, 16},
      {{1000}, 9, 3, 64, 64},
      {{333, 1, 64, 65}, 8, 2, 128, 32},
      {{777}, 32, 8, 128, 64},
      {{500, 129}, 6, 2, 80, 64, DType::f16},
      {{700}, 4, 1, 64, 64, DType::bf16, SinkMode::denominator},
      {{700, 3}, 4, 2, 96, 16, DType::bf16, SinkMode::key0_bias},
      {{900, 40}, 4, 2, 64, 16, DType::bf16, SinkMode::none, 100},
      {{900}, 4, 2, 64, 64, DType::bf16, SinkMode::denominator, 0},
      {{300}, 4, 4, 64, 1},
      {{4096, 100}, 12, 4, 64, 128, DType::bf16, SinkMode::denominator, 1000},
      {{300, 45}, 16, 1, 96, 32, DType::f16},
      {{20000}, 32, 8, 128, 64},
      {{70000}, 8, 1, 80, 64, DType::bf16, SinkMode::denominator},
      {{5, 900, 64, 1, 3000, 128, 129, 2000, 77, 640, 1, 1, 333, 4000, 12, 1024}, 8, 8, 128, 64},
      many_rows(),
      // 12 × 8 rows of 100-132 pages: over eight terms CTAs per SM at 8 pages a CTA (on up to 200 SMs),
      // so the selection's terms kernel takes 16 pages a CTA.
      {{2100, 1601, 2048, 1999, 1700, 2111, 1800, 2047, 1905, 2000, 1650, 2112}, 16, 8, 64, 16},
      // summary_stride 1: 64 stride sums a page at d 128, 512 terms a terms CTA.
      {{3000, 700}, 8, 2, 128, 64, DType::bf16, SinkMode::none, -1, 1},
  };
}

TEST(DecodeCuda, DenseMatchesReference) {
  uint64_t seed = cuda_testing::base_seed();
  for (const Case& c : cases()) {
    SCOPED_TRACE(name_of(c));
    Inputs in(c, seed++);
    for (bool device_ids : {false, true}) {
      const auto [ref, gpu] = run_both(c, in, nullptr, device_ids);
      expect_close(c, in, ref, gpu);
    }
  }
}

// The kernels read only the pages a selection keeps: the same selection on both sides (from the
// host scorers on the same queries), so the outputs must agree exactly as the dense ones do.
TEST(DecodeCuda, SelectedPagesMatchReference) {
  uint64_t seed = cuda_testing::base_seed() + 100;
  for (const Case& c : cases()) {
    SCOPED_TRACE(name_of(c));
    Inputs in(c, seed++);
    DecodeParams hp;
    hp.q = make_view(in.qf.data(), DType::f32, {int64_t(c.lengths.size()), c.heads_q, c.dim});
    hp.cache = &in.cache;
    hp.seqs = in.seqs;
    hp.window = c.window;
    for (PageScorer scorer : {PageScorer::rr, PageScorer::oracle}) {
      PageSelectConfig cfg;
      cfg.scorer = scorer;
      cfg.tau = 0.7;
      const PageSelection sel = select_pages(hp, cfg);
      const auto [ref, gpu] = run_both(c, in, &sel);
      expect_close(c, in, ref, gpu);
    }
  }
}

// The host scorers' parameters on the twin host cache (f32 copies of the queries), and the device's.
DecodeParams host_params(const Case& c, Inputs& in) {
  DecodeParams hp;
  hp.q = make_view(in.qf.data(), DType::f32, {int64_t(c.lengths.size()), c.heads_q, c.dim});
  hp.cache = &in.cache;
  hp.seqs = in.seqs;
  hp.window = c.window;
  return hp;
}

DecodeParams device_params(const Case& c, Inputs& in, const DeviceBuffer& q) {
  DecodeParams dp;
  dp.q = q.view();
  dp.device_cache = &in.device;
  dp.seqs = in.seqs;
  dp.window = c.window;
  return dp;
}

std::string config_name(const PageSelectConfig& s) {
  std::ostringstream os;
  os << page_scorer_name(s.scorer) << " tau " << s.tau << " sink_pages " << s.sink_pages << " recent " << s.recent_pages
     << " rotate " << s.rotate << " step " << s.step;
  return os.str();
}

// Discrete outputs compared exactly: the same rows, visible counts and kept pages; kept_mass from
// f32 scores summed in another order.
void expect_same_selection(const PageSelection& host, const PageSelection& dev) {
  ASSERT_EQ(dev.kv_heads, host.kv_heads);
  EXPECT_EQ(dev.visible, host.visible);
  ASSERT_EQ(dev.row_ptr.size(), host.row_ptr.size());
  for (size_t r = 0; r + 1 < host.row_ptr.size(); ++r) {
    const std::vector<int32_t> h(host.pages.begin() + host.row_ptr[r], host.pages.begin() + host.row_ptr[r + 1]);
    const std::vector<int32_t> d(dev.pages.begin() + dev.row_ptr[r], dev.pages.begin() + dev.row_ptr[r + 1]);
    ASSERT_EQ(d, h) << "row " << r << " of " << host.rows();
    EXPECT_NEAR(dev.kept_mass[r], host.kept_mass[r], 1e-5) << "row " << r;
  }
  EXPECT_EQ(dev.row_ptr, host.row_ptr);
}

std::vector<PageSelectConfig> select_configs() {
  std::vector<PageSelectConfig> v(6);
  v[0].tau = 0.9;
  v[1].tau = 0.5, v[1].sink_pages = 0, v[1].recent_pages = 0, v[1].step = 3;
  v[2].tau = 0.9, v[2].rotate = false, v[2].sink_pages = 2, v[2].recent_pages = 3, v[2].step = 1;
  v[3].scorer = PageScorer::quest, v[3].tau = 0.9;
  v[4].scorer = PageScorer::quest, v[4].tau = 0.7, v[4].sink_pages = 0, v[4].recent_pages = 2;
  v[5].tau = 1.0, v[5].step = 2;
  return v;
}

// The device selection keeps the pages the host's keeps, on every case and rule (both scorers,
// rotation on and off, τ 0.5 … 1, forced pages, steps), twice with equal results, and decode over it
// matches the reference decode over the host selection.
TEST(DecodeCuda, DeviceSelectionEqualsTheHostSelection) {
  uint64_t seed = cuda_testing::base_seed() + 200;
  CudaPageSelection dsel;
  for (const Case& c : cases()) {
    SCOPED_TRACE(name_of(c));
    Inputs in(c, seed++);
    const DecodeParams hp = host_params(c, in);
    const DeviceBuffer q = DeviceBuffer::from_host(in.q);
    const DecodeParams dp = device_params(c, in, q);
    for (const PageSelectConfig& cfg : select_configs()) {
      SCOPED_TRACE(config_name(cfg));
      const PageSelection host = select_pages(hp, cfg);
      select_pages(dp, cfg, dsel);
      const PageSelection dev = dsel.to_host();
      expect_same_selection(host, dev);
      select_pages(dp, cfg, dsel);
      const PageSelection again = dsel.to_host();
      EXPECT_EQ(again.pages, dev.pages);
      EXPECT_EQ(again.kept_mass, dev.kept_mass);
      const auto [ref, gpu] = run_both(c, in, &host, false, &dsel);
      expect_close(c, in, ref, gpu);
    }
  }
}

// One sparse step (the device selection with advance_step, then decode over it) captured into a CUDA
// graph on a stream: replay s selects as the host does at step s and decodes as the reference does
// over that selection.
TEST(DecodeCuda, SparseStepReplaysFromAGraph) {
  const Case c{{3000, 1200, 64}, 8, 2, 128, 64, DType::bf16, SinkMode::denominator};
  Inputs in(c, cuda_testing::base_seed() + 300);
  const DecodeParams hp = host_params(c, in);
  const DeviceBuffer q = DeviceBuffer::from_host(in.q);
  const int64_t B = int64_t(c.lengths.size());
  DeviceBuffer out(DType::f32, {B, c.heads_q, c.dim}), lse(DType::f32, {B, c.heads_q});
  const DeviceBuffer sink = DeviceBuffer::from_host(in.sink.data(), DType::f32, {c.heads_q});
  const DeviceBuffer ids = DeviceBuffer::from_ints(in.seqs);
  cudaStream_t st = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  CudaPageSelection dsel;
  DecodeParams dp = device_params(c, in, q);
  dp.out = out.view();
  dp.lse = lse.view();
  dp.sink_mode = c.sink_mode;
  dp.sink = sink.view();
  dp.device_seqs = static_cast<const int32_t*>(ids.data());
  dp.stream = st;
  dp.device_selection = &dsel;
  PageSelectConfig cfg;
  cfg.tau = 0.8;
  select_pages(dp, cfg, dsel);  // sizes the selection's buffers, so the captured call allocates nothing
  ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
  DeviceBuffer ws(DType::f32, {int64_t(decode_workspace_bytes(dp) / 4 + 1)});
  dp.workspace = ws.data();
  dp.workspace_bytes = ws.bytes();
  dsel.reset_step(0);
  cfg.advance_step = true;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  select_pages(dp, cfg, dsel);
  decode_attention(dp, Backend::cuda);
  ASSERT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  std::vector<std::vector<int32_t>> kept;
  for (int64_t step = 0; step < 5; ++step) {
    SCOPED_TRACE("replay " + std::to_string(step));
    ASSERT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    PageSelectConfig at = cfg;
    at.advance_step = false;
    at.step = step;
    const PageSelection host = select_pages(hp, at);
    expect_same_selection(host, dsel.to_host());
    kept.push_back(host.pages);
    Outputs ref{std::vector<float>(size_t(in.q.numel())), std::vector<float>(size_t(B * c.heads_q))};
    DecodeParams rp = hp;
    rp.q = in.q.view();
    rp.out = make_view(ref.out.data(), DType::f32, {B, c.heads_q, c.dim});
    rp.lse = make_view(ref.lse.data(), DType::f32, {B, c.heads_q});
    rp.sink_mode = c.sink_mode;
    rp.sink = make_view(in.sink.data(), DType::f32, {c.heads_q});
    rp.selection = &host;
    decode_attention(rp, Backend::reference);
    Outputs gpu{std::vector<float>(ref.out.size()), std::vector<float>(ref.lse.size())};
    out.copy_to_host(gpu.out.data(), gpu.out.size() * sizeof(float));
    lse.copy_to_host(gpu.lse.data(), gpu.lse.size() * sizeof(float));
    expect_close(c, in, ref, gpu);
  }
  // The rotation moved the selection: the replays are not one selection repeated.
  EXPECT_TRUE(std::any_of(kept.begin() + 1, kept.end(), [&](const auto& k) { return k != kept[0]; }));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(st);
}

TEST(DecodeCuda, DeviceSelectionRefusalsNameTheField) {
  const Case c{{200, 90}, 4, 2, 64, 16};
  Inputs in(c, 5);
  const DeviceBuffer q = DeviceBuffer::from_host(in.q);
  DecodeParams dp = device_params(c, in, q);
  CudaPageSelection dsel;
  PageSelectConfig cfg;
  cfg.scorer = PageScorer::oracle;
  EXPECT_NE(testing::error_of([&] { select_pages(dp, cfg, dsel); }).find("oracle"), std::string::npos);
  cfg.scorer = PageScorer::rr;
  DecodeParams hp = host_params(c, in);
  EXPECT_NE(testing::error_of([&] { select_pages(hp, cfg, dsel); }).find("device cache"), std::string::npos);
  cfg.advance_step = true;
  EXPECT_NE(testing::error_of([&] { (void)select_pages(hp, cfg); }).find("advance_step"), std::string::npos);
  cfg.advance_step = false;
  select_pages(dp, cfg, dsel);
  const PageSelection host = select_pages(hp, cfg);
  const DeviceBuffer out(DType::f32, {2, 4, 64});
  dp.out = out.view();
  dp.device_selection = &dsel;
  dp.selection = &host;
  EXPECT_NE(testing::error_of([&] { decode_attention(dp, Backend::cuda); }).find("both set"), std::string::npos);
  dp.selection = nullptr;
  const DeviceBuffer q1 = DeviceBuffer::from_host(in.q.view().data, in.q.dtype(), {1, 4, 64});
  const DeviceBuffer out1(DType::f32, {1, 4, 64});
  dp.q = q1.view();
  dp.out = out1.view();
  dp.seqs = std::span<const int32_t>(in.seqs.data(), 1);
  EXPECT_NE(testing::error_of([&] { decode_attention(dp, Backend::cuda); }).find("device_selection has 4 rows"),
            std::string::npos);
  // Every head scoring each of a page's 64 stride sums: the terms kernel's per-chunk log-weights alone
  // exceed its shared memory.
  const Case wide{{100}, 64, 1, 128, 64, DType::bf16, SinkMode::none, -1, 1};
  Inputs win(wide, 6);
  const DeviceBuffer wq = DeviceBuffer::from_host(win.q);
  cfg.rotate = false;
  const std::string e = testing::error_of([&] { select_pages(device_params(wide, win, wq), cfg, dsel); });
  EXPECT_NE(e.find("64 query heads with 64 key strides"), std::string::npos) << e;
  EXPECT_NE(e.find("use rotate"), std::string::npos) << e;
}

// A NaN in a query poisons its row (out and lse NaN), never reads as a masked row; other rows stay
// finite.
// A bf16 or f16 out holds the f32 out rounded once to nearest even, whether the row is finished
// by the decode kernel itself or by the split-K merge (the long context), with a sink, a NaN row
// and an empty sequence.
TEST(DecodeCuda, SixteenBitOutputIsTheF32ResultRounded) {
  uint64_t seed = cuda_testing::base_seed() + 11;
  for (const Case& c : {Case{{300, 0, 45}, 8, 2, 80, 16}, Case{{70000, 5}, 8, 1, 128, 64, DType::bf16,
                                                             SinkMode::denominator}}) {
    SCOPED_TRACE(name_of(c));
    Inputs in(c, seed++);
    in.q.view().set({0, 1, 3}, std::nanf(""));
    const int64_t B = int64_t(c.lengths.size());
    const DeviceBuffer q = DeviceBuffer::from_host(in.q);
    const DeviceBuffer sink = DeviceBuffer::from_host(in.sink.data(), DType::f32, {c.heads_q});
    DecodeParams d;
    d.q = q.view();
    d.device_cache = &in.device;
    d.seqs = in.seqs;
    d.sink_mode = c.sink_mode;
    if (c.sink_mode != SinkMode::none) d.sink = sink.view();
    const auto run = [&](DType dt) {
      DeviceBuffer out(dt, {B, c.heads_q, c.dim});
      out.fill_bytes(0xFF);  // every element must be written
      d.out = out.view();
      decode_attention(d, Backend::cuda);
      std::vector<uint32_t> bits(size_t(B * c.heads_q * c.dim));
      std::vector<uint16_t> half(dt == DType::f32 ? 0 : bits.size());
      if (dt == DType::f32) out.copy_to_host(bits.data(), bits.size() * 4);
      else out.copy_to_host(half.data(), half.size() * 2);
      if (dt != DType::f32) std::copy(half.begin(), half.end(), bits.begin());
      return bits;
    };
    const std::vector<uint32_t> f32 = run(DType::f32);
    for (DType dt : {DType::bf16, DType::f16}) {
      SCOPED_TRACE(dtype_name(dt));
      const std::vector<uint32_t> got = run(dt);
      int64_t mismatched = 0, nans = 0;
      for (size_t i = 0; i < f32.size(); ++i) {
        float x;
        std::memcpy(&x, &f32[i], 4);
        const uint16_t want = dt == DType::bf16 ? float_to_bf16(x) : float_to_f16(x);
        const float back = dt == DType::bf16 ? bf16_to_float(uint16_t(got[i])) : f16_to_float(uint16_t(got[i]));
        if (std::isnan(x)) nans += std::isnan(back) ? 1 : 0;
        else mismatched += got[i] != want;
      }
      EXPECT_EQ(mismatched, 0);
      EXPECT_EQ(nans, c.dim);  // the NaN row only
    }
  }
}

TEST(DecodeCuda, NanQueryPropagatesToItsRow) {
  const Case c{{300, 200}, 4, 2, 64, 16};
  Inputs in(c, cuda_testing::base_seed() + 7);
  in.q.view().set({1, 2, 5}, std::nanf(""));
  const auto [ref, gpu] = run_both(c, in, nullptr);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 4; ++h) {
      const bool poisoned = b == 1 && h == 2;
      EXPECT_EQ(std::isnan(gpu.lse[size_t(b * 4 + h)]), poisoned) << b << ' ' << h;
      EXPECT_EQ(std::isnan(gpu.out[size_t((b * 4 + h) * 64)]), poisoned) << b << ' ' << h;
    }
}

// The pool's rows that no sequence holds (past a length in a last page, the pages no table points
// at) are NaN here: the bulk copies bring them into shared memory with the visible rows, and the
// kernel must neutralize them (score −inf, value 0), so every output stays finite and equal to the
// reference, dense and over a selection.
TEST(DecodeCuda, PoolRowsNoSequenceHoldsNeverReachTheOutput) {
  uint64_t seed = cuda_testing::base_seed() + 300;
  for (const Case& c : std::vector<Case>{{{17, 0, 5}, 4, 2, 64, 16},
                                         {{333, 1, 64, 65}, 8, 2, 128, 32},
                                         {{500, 129}, 6, 2, 80, 64, DType::f16},
                                         {{900, 40}, 4, 2, 64, 16, DType::bf16, SinkMode::none, 100},
                                         {{3001, 77}, 32, 8, 128, 64, DType::bf16, SinkMode::denominator}}) {
    SCOPED_TRACE(name_of(c));
    Inputs in(c, seed++);
    const int64_t P = c.page, row = int64_t(c.dim), per_page = int64_t(c.heads_kv) * P * row;
    const int64_t words = in.device.capacity_pages() * per_page;
    std::vector<int32_t> table(size_t(in.device.sequences()) * size_t(in.device.max_pages()));
    ASSERT_EQ(cudaMemcpy(table.data(), in.device.block_table(), table.size() * sizeof(int32_t),
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    const uint16_t nan16 = c.dtype == DType::bf16 ? 0x7FC0 : 0x7E00;
    for (const void* pool : {in.device.k_pool(), in.device.v_pool()}) {
      const size_t n = static_cast<size_t>(words);
      std::vector<uint16_t> held(n), poisoned(n, nan16);
      ASSERT_EQ(cudaMemcpy(held.data(), pool, held.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      for (int32_t s : in.seqs) {
        const int64_t len = in.device.length(s);
        for (int64_t page = 0; page * P < len; ++page) {
          const int64_t at = int64_t(table[size_t(s) * size_t(in.device.max_pages()) + size_t(page)]) * per_page;
          const int64_t rows = std::min(P, len - page * P);
          for (int h = 0; h < c.heads_kv; ++h)
            std::copy_n(held.begin() + (at + h * P * row), rows * row, poisoned.begin() + (at + h * P * row));
        }
      }
      ASSERT_EQ(cudaMemcpy(const_cast<void*>(pool), poisoned.data(), poisoned.size() * 2, cudaMemcpyHostToDevice),
                cudaSuccess);
    }
    PageSelectConfig cfg;
    cfg.tau = 0.7;
    const PageSelection sel = select_pages(host_params(c, in), cfg);
    for (const PageSelection* s : {static_cast<const PageSelection*>(nullptr), &sel}) {
      const auto [ref, gpu] = run_both(c, in, s);
      for (int64_t i = 0; i < int64_t(gpu.out.size()); ++i)
        ASSERT_TRUE(std::isfinite(gpu.out[size_t(i)])) << "out[" << i << "], selection " << (s != nullptr);
      expect_close(c, in, ref, gpu);
    }
  }
}

// Wrong memory or dtype names the field.
TEST(DecodeCuda, BadCallsNameTheField) {
  const Case c{{40}, 4, 2, 64, 16};
  Inputs in(c, 3);
  std::vector<float> out(size_t(4 * 64));
  DecodeParams d;
  d.device_cache = &in.device;
  d.q = in.q.view();  // host memory
  d.out = make_view(out.data(), DType::f32, {1, 4, 64});
  d.seqs = in.seqs;
  EXPECT_NE(testing::error_of([&] { decode_attention(d, Backend::cuda); }).find("q is in host memory"),
            std::string::npos);
  const DeviceBuffer q32(DType::f32, {1, 4, 64});
  d.q = q32.view();
  EXPECT_NE(testing::error_of([&] { decode_attention(d, Backend::cuda); }).find("bf16 or f16"), std::string::npos);
  const DeviceBuffer q = DeviceBuffer::from_host(in.q);
  d.q = q.view();
  EXPECT_NE(testing::error_of([&] { decode_attention(d, Backend::cuda); }).find("out must be device"),
            std::string::npos);
  const DeviceBuffer dout(DType::f32, {1, 4, 64});
  d.out = dout.view();
  EXPECT_NE(testing::error_of([&] { decode_attention(d, Backend::cpu); }).find("cannot read a device cache"),
            std::string::npos);
}

}  // namespace
}  // namespace ariadne
