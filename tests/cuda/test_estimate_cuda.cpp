// The CUDA estimators (RRAttention, XAttention) against the CPU estimator on fresh random inputs.
//
// Scores: every visible block of every row within 2e-5 (both are f32 dot products, summed in
// different orders). Block lists: compared exactly on every row whose decisions are not within
// 1e-4 of the threshold or of a tie at the kept/dropped boundary (margins taken from the CPU
// scores; the rule of tests/cpu/test_estimate.cpp), and such rows must be >= 80% of all.
// The first mismatch is printed with its row, scores and both lists. Each case also runs twice
// (bit-identical scores and masks: the kernels use no float atomics) and once device-only.
// The cases run on the default tensor-core scoring; F32Scoring* repeat some on the f32 kernel,
// and TensorCoreScoring* compare the two kernels directly (docs/numerics.md, "Estimator scores");
// TensorCoreScoringV2* repeat those on the v2 tensor-core kernel and compare it with v1 bit for bit.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "ariadne/attention.hpp"
#include "ariadne/device.hpp"
#include "ariadne/estimate.hpp"
#include "ariadne/prefill.hpp"
#include "common.hpp"
#include "cuda/cuda_common.hpp"
#include "estimate/cuda/estimate.cuh"

namespace ariadne {
namespace {

using testing::Case;
using testing::Inputs;

uint64_t seed_base() {
  static const uint64_t seed = [] {
    if (const char* s = std::getenv("ARIADNE_TEST_SEED")) return uint64_t(std::strtoull(s, nullptr, 10));
    return uint64_t(std::random_device{}());
  }();
  return seed;
}

TensorView on_device(const TensorView& host_view, const Buffer& host, const DeviceBuffer& dev) {
  TensorView t = host_view;
  t.data = static_cast<char*>(dev.data()) + (static_cast<char*>(host_view.data) - static_cast<char*>(host.data()));
  t.device = Device::cuda;
  return t;
}

// Device copies of q, k (and v) and of the layout's cu_seqlens.
struct OnDevice {
  DeviceBuffer q, k, v, cu_q, cu_k;
  TensorView qv, kv, vv;
  Pattern layout;
};

OnDevice upload(const Inputs& in) {
  OnDevice d;
  d.q = DeviceBuffer::from_host(in.q);
  d.k = DeviceBuffer::from_host(in.k);
  d.v = DeviceBuffer::from_host(in.v);
  d.qv = on_device(in.params.q, in.q, d.q);
  d.kv = on_device(in.params.k, in.k, d.k);
  d.vv = on_device(in.params.v, in.v, d.v);
  d.layout = in.params.pattern;
  if (d.layout.cu_seqlens_q != nullptr) {
    d.cu_q = DeviceBuffer::from_ints(in.cu_q);
    d.cu_k = DeviceBuffer::from_ints(in.cu_k);
    d.layout.cu_seqlens_q = static_cast<const int32_t*>(d.cu_q.data());
    d.layout.cu_seqlens_k = static_cast<const int32_t*>(d.cu_k.data());
  }
  return d;
}

// The blocks a row's protections force (sink: block 0; diagonal: its last visible block), as
// select_blocks takes them.
std::vector<int32_t> forced_blocks(bool sink, bool diagonal, int64_t n) {
  std::vector<int32_t> forced;
  if (sink) forced.push_back(0);
  if (diagonal && n > 1) forced.push_back(int32_t(n - 1));
  return forced;
}

// How close one row's selection came to going another way, from the (CPU) scores: the smallest
// |mass before − τ·total| over the greedy decisions, and the gap between the last kept and the
// first dropped score (a near-tie there could swap them; ties elsewhere leave the kept set alone,
// so unlike the CPU test's rule over all pairs they are not counted: long rows would otherwise
// rarely qualify).
double decision_margin(const float* sc, int64_t n, double tau, const std::vector<int32_t>& forced,
                       bool forced_first) {
  std::vector<char> is_forced(size_t(n), 0);
  for (int32_t f : forced) is_forced[size_t(f)] = 1;
  std::vector<int32_t> order;
  for (int32_t i = 0; i < int32_t(n); ++i)
    if (!(forced_first && is_forced[size_t(i)])) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return sc[a] > sc[b]; });
  double total = 0, m = 1e9, cum = 0;
  for (int64_t i = 0; i < n; ++i) total += sc[i];
  if (forced_first)
    for (int32_t f : forced) cum += sc[f];
  size_t kept = 0;
  for (; kept < order.size(); ++kept) {
    m = std::min(m, std::abs(cum - tau * total));
    if (cum >= tau * total) break;
    cum += sc[order[kept]];
  }
  if (kept > 0 && kept < order.size()) m = std::min(m, double(sc[order[kept - 1]]) - double(sc[order[kept]]));
  return m;
}

std::string list_str(const int32_t* b, const int32_t* e) {
  std::ostringstream o;
  o << "[";
  for (const int32_t* p = b; p != e; ++p) o << (p == b ? "" : " ") << *p;
  o << "]";
  return o.str();
}

// CPU vs CUDA on one input set and config.
void check_config(const Inputs& in, const OnDevice& d, const EstimateConfig& c, const std::string& what) {
  SCOPED_TRACE(what + " (ARIADNE_TEST_SEED=" + std::to_string(seed_base()) + ")");
  const EstimateResult want = estimate(in.params.q, in.params.k, in.params.pattern, c, Backend::cpu);
  const EstimateResult got = estimate(d.qv, d.kv, d.layout, c, Backend::cuda);
  ASSERT_TRUE(got.device.defined());
  ASSERT_EQ(got.rows(), want.rows());
  ASSERT_EQ(got.score_ptr, want.score_ptr);
  ASSERT_EQ(got.row_queries, want.row_queries);
  ASSERT_EQ(got.mask.rows(), want.mask.rows());
  ASSERT_EQ(got.mask.seq_block_base, want.mask.seq_block_base);
  ASSERT_EQ(got.mask.block, want.mask.block);
  ASSERT_EQ(got.mask.heads, want.mask.heads);

  // Scores: report the worst element, not thousands of lines.
  double worst = 0;
  int64_t worst_at = -1;
  for (size_t i = 0; i < want.scores.size(); ++i) {
    const double e = std::abs(double(got.scores[i]) - double(want.scores[i]));
    if (!(e <= worst)) {
      worst = e;
      worst_at = int64_t(i);
    }
  }
  EXPECT_LE(worst, 2e-5) << "largest score difference at flat index " << worst_at << ": cuda "
                         << got.scores[size_t(worst_at)] << " cpu " << want.scores[size_t(worst_at)];

  const Protections prot = c.protections();
  const bool forced_first = c.method == Estimator::xattn;
  int64_t compared = 0, mismatches = 0;
  for (int64_t row = 0; row < want.rows(); ++row) {
    const int64_t n = want.visible(row);
    // Which sequence / head / block this row is (rows are (s, h, m) in order).
    int32_t s = 0;
    while (int64_t(want.mask.seq_block_base[size_t(s) + 1]) * want.heads <= row) ++s;
    const int64_t nqb = want.mask.seq_block_base[size_t(s) + 1] - want.mask.seq_block_base[size_t(s)];
    const int64_t local = row - int64_t(want.mask.seq_block_base[size_t(s)]) * want.heads;
    const int h = int(local / nqb);
    const int64_t m = local % nqb;
    const std::vector<int32_t> forced = forced_blocks(prot.sink, prot.diagonal, n);
    const bool whole = (prot.last_row && m == nqb - 1) || c.tau_of(h) >= 1;
    const double margin =
        whole ? 1.0 : decision_margin(want.scores.data() + want.score_ptr[size_t(row)], n, c.tau_of(h), forced, forced_first);
    if (margin <= 1e-4) continue;
    ++compared;
    const int32_t* gb = got.mask.col_idx.data() + got.mask.row_ptr[size_t(row)];
    const int32_t* ge = got.mask.col_idx.data() + got.mask.row_ptr[size_t(row) + 1];
    const int32_t* wb = want.mask.col_idx.data() + want.mask.row_ptr[size_t(row)];
    const int32_t* we = want.mask.col_idx.data() + want.mask.row_ptr[size_t(row) + 1];
    if (std::vector<int32_t>(gb, ge) != std::vector<int32_t>(wb, we)) {
      if (mismatches++ == 0) {
        std::ostringstream sc;
        for (int64_t b = 0; b < std::min<int64_t>(n, 24); ++b)
          sc << " " << want.score(row, b) << "/" << got.score(row, b);
        ADD_FAILURE() << "first mismatching row " << row << " (seq " << s << ", head " << h << ", block " << m
                      << ", " << n << " visible, margin " << margin << "): cuda " << list_str(gb, ge) << " cpu "
                      << list_str(wb, we) << "\n  scores cpu/cuda:" << sc.str();
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << "rows whose block lists differ, of " << compared << " compared";
  EXPECT_GE(compared * 10, want.rows() * 8) << "too few rows compared exactly (" << compared << " of " << want.rows() << ")";
  // The rows left out (a decision within 1e-4 of τ or a near-tie at the cut), for the log.
  std::printf("[ %s ] %s: scores within %.2e of the cpu, %lld of %lld rows compared exactly (%lld near the cut)\n",
              got.stats.tensor_core_scoring ? "mma" : "f32", what.c_str(), worst, (long long)compared,
              (long long)want.rows(), (long long)(want.rows() - compared));
  EXPECT_EQ(got.stats.kept_blocks, int64_t(got.mask.col_idx.size()));
  EXPECT_EQ(got.stats.visible_blocks, want.stats.visible_blocks);
  EXPECT_DOUBLE_EQ(got.stats.mac, want.stats.mac);

  // A second run is bit-identical; a device-only run leaves the host copies empty and the same
  // arrays on the device.
  const EstimateResult again = estimate(d.qv, d.kv, d.layout, c, Backend::cuda);
  EXPECT_TRUE(again.scores == got.scores) << "scores differ between two identical runs";
  EXPECT_TRUE(again.mask.col_idx == got.mask.col_idx && again.mask.row_ptr == got.mask.row_ptr)
      << "masks differ between two identical runs";
  EstimateConfig dc = c;
  dc.host_copy = false;
  const EstimateResult dev_only = estimate(d.qv, d.kv, d.layout, dc, Backend::cuda);
  EXPECT_TRUE(dev_only.mask.col_idx.empty() && dev_only.scores.empty());
  std::vector<int32_t> rp(got.mask.row_ptr.size()), ci(got.mask.col_idx.size());
  dev_only.device.row_ptr.copy_to_host(rp.data(), rp.size() * sizeof(int32_t));
  if (!ci.empty()) dev_only.device.col_idx.copy_to_host(ci.data(), ci.size() * sizeof(int32_t));
  EXPECT_TRUE(rp == got.mask.row_ptr && ci == got.mask.col_idx) << "device-only mask differs";

  // The result's arrays from the stream-ordered pool (cuda_pooled_result, as the LLM prefill asks):
  // the same host copies and the same device arrays, bit for bit, with and without host copies.
  // Each result is released before the next call allocates, so the pool hands the same memory
  // back: stale contents must not leak into a result.
  EstimateConfig pc = c;
  pc.cuda_pooled_result = true;
  for (const bool copy : {true, false}) {
    pc.host_copy = copy;
    const EstimateResult pooled = estimate(d.qv, d.kv, d.layout, pc, Backend::cuda);
    if (copy)
      EXPECT_TRUE(pooled.scores == got.scores && pooled.mask.col_idx == got.mask.col_idx &&
                  pooled.mask.row_ptr == got.mask.row_ptr)
          << "pooled result's host copies differ";
    else
      EXPECT_TRUE(pooled.mask.col_idx.empty() && pooled.scores.empty());
    std::vector<int32_t> prp(rp.size()), pci(ci.size());
    std::vector<float> psc(got.scores.size());
    pooled.device.row_ptr.copy_to_host(prp.data(), prp.size() * sizeof(int32_t));
    if (!pci.empty()) pooled.device.col_idx.copy_to_host(pci.data(), pci.size() * sizeof(int32_t));
    if (!psc.empty()) pooled.device.scores.copy_to_host(psc.data(), psc.size() * sizeof(float));
    EXPECT_TRUE(prp == got.mask.row_ptr && pci == got.mask.col_idx) << "pooled device mask differs, host_copy " << copy;
    EXPECT_TRUE(psc == got.scores) << "pooled device scores differ, host_copy " << copy;
  }
}

Case make_case(const std::string& name, std::vector<int64_t> sq, std::vector<int64_t> sk, int hq, int hkv, int dim,
               DType dt) {
  Case c;
  c.name = name;
  c.seq_q = std::move(sq);
  c.seq_k = std::move(sk);
  c.heads_q = hq;
  c.heads_kv = hkv;
  c.dim = dim;
  c.dtype = dt;
  // Stride-level logits average S tokens, so uniform inputs give nearly flat block scores whose
  // neighbours differ by < 1e-4 (near-ties, not compared). Inputs in [−3, 3] make the stride
  // logits ~1 nat apart: block scores well separated, most rows compared exactly.
  c.input_scale = 3.f;
  c.pattern = Pattern::causal();
  c.seed = seed_base() ^ std::hash<std::string>{}(name);
  return c;
}

class CudaEstimate : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

// The scoring kernel from the config alone, for tests that compare one kernel with another: the
// A/B switches that override the config (ARIADNE_EST_V2, ARIADNE_EST_V3, ARIADNE_EST_F32; read per
// call) are unset for the scope and restored after it, so a run of the suite under one of them
// (as scripts/device-check's sanitizer passes do) still compares the kernels each test names.
// ARIADNE_EST_V3_KIND and ARIADNE_EST_V3_FAST pick builds inside v3 and stay the caller's.
struct KernelsFromConfig {
  const cuda_testing::EnvUnset v2{"ARIADNE_EST_V2"}, v3{"ARIADNE_EST_V3"}, f32{"ARIADNE_EST_F32"};
};

// The switches override the config per call, both ways: ARIADNE_EST_V3=0 / 1, ARIADNE_EST_V2=0 / 1
// and ARIADNE_EST_F32=1 against configs that ask for the other kernel; any other value leaves the
// config's choice (bf16 RR at head_dim 128 and S 8, B 128, where v3, v2 and v1 all apply).
TEST_F(CudaEstimate, ScoringSwitchesOverrideTheConfig) {
  const KernelsFromConfig clean;
  const Inputs in = testing::make_inputs(make_case("switches", {1100}, {}, 8, 2, 128, DType::bf16));
  const OnDevice d = upload(in);
  const auto run = [&](bool v2, bool v3) {
    EstimateConfig c;
    c.cuda_scoring_v2 = v2;
    c.cuda_scoring_v3 = v3;
    return estimate(d.qv, d.kv, d.layout, c, Backend::cuda).stats;
  };
  const EstimateStats v3_default = run(true, true);
  ASSERT_TRUE(v3_default.tensor_core_scoring && v3_default.scoring_v3);
  {
    const cuda_testing::EnvGuard off("ARIADNE_EST_V3", "0");
    const EstimateStats s = run(true, true);
    EXPECT_TRUE(s.tensor_core_scoring && !s.scoring_v3 && s.scoring_v2) << "ARIADNE_EST_V3=0: v2";
    const cuda_testing::EnvGuard off2("ARIADNE_EST_V2", "0");
    const EstimateStats s1 = run(true, true);
    EXPECT_TRUE(s1.tensor_core_scoring && !s1.scoring_v3 && !s1.scoring_v2) << "both 0: v1";
  }
  {
    const cuda_testing::EnvGuard on("ARIADNE_EST_V3", "1");
    EXPECT_TRUE(run(false, false).scoring_v3) << "ARIADNE_EST_V3=1 over a v1 config";
  }
  {
    const cuda_testing::EnvGuard on("ARIADNE_EST_V2", "1");
    const EstimateStats s = run(false, false);
    EXPECT_TRUE(s.scoring_v2 && !s.scoring_v3) << "ARIADNE_EST_V2=1 over a v1 config";
  }
  {
    const cuda_testing::EnvGuard f32("ARIADNE_EST_F32", "1");
    EXPECT_FALSE(run(true, true).tensor_core_scoring) << "ARIADNE_EST_F32=1: the f32 kernel";
  }
  for (const char* other : {"", "yes", "2", "01"}) {
    SCOPED_TRACE(std::string("value '") + other + "'");
    const cuda_testing::EnvGuard v3("ARIADNE_EST_V3", other), v2("ARIADNE_EST_V2", other),
        f32("ARIADNE_EST_F32", other);
    const EstimateStats a = run(true, true), b = run(false, false);
    EXPECT_TRUE(a.tensor_core_scoring && a.scoring_v3);
    EXPECT_TRUE(b.tensor_core_scoring && !b.scoring_v3 && !b.scoring_v2);
  }
}

TEST_F(CudaEstimate, RRMatchesCpuGqaOffsetsAndTau) {
  // GQA 8:2, one sequence not a multiple of S or B, bf16.
  const Inputs in = testing::make_inputs(make_case("rr", {1000}, {}, 8, 2, 64, DType::bf16));
  const OnDevice d = upload(in);
  for (RROffset off : {RROffset::paper, RROffset::released})
    for (double tau : {0.5, 0.9, 0.95}) {
      EstimateConfig c;
      c.block = 64;
      c.stride = 8;
      c.tau = tau;
      c.offset = off;
      check_config(in, d, c, std::string("offset ") + rr_offset_name(off) + " tau " + std::to_string(tau));
    }
}

TEST_F(CudaEstimate, XAttentionMatchesCpu) {
  const Inputs in = testing::make_inputs(make_case("xattn", {777}, {}, 4, 2, 64, DType::f16));
  const OnDevice d = upload(in);
  for (int stride : {4, 16})
    for (double tau : {0.6, 0.9}) {
      EstimateConfig c;
      c.method = Estimator::xattn;
      c.block = 64;
      c.stride = stride;
      c.tau = tau;
      check_config(in, d, c, "stride " + std::to_string(stride) + " tau " + std::to_string(tau));
    }
}

// The oracle on the device is XAttention's kernel at S = 1 (exact causal softmax per query,
// summed into blocks); B 128 runs each head's 128 rows in two rounds of 64.
TEST_F(CudaEstimate, OracleMatchesCpu) {
  const Inputs in = testing::make_inputs(make_case("oracle", {500, 333}, {640, 333}, 4, 2, 64, DType::bf16));
  const OnDevice d = upload(in);
  for (int block : {64, 128}) {
    EstimateConfig c;
    c.method = Estimator::oracle;
    c.block = block;
    c.tau = 0.9;
    check_config(in, d, c, "oracle block " + std::to_string(block));
  }
}

TEST_F(CudaEstimate, LlamaShapeBlock128) {
  // 32 query / 8 KV heads, d 128, B 128, S 8 and 16: the benchmark's shape, short.
  const Inputs in = testing::make_inputs(make_case("llama", {2100}, {}, 32, 8, 128, DType::bf16));
  const OnDevice d = upload(in);
  for (Estimator e : {Estimator::rr, Estimator::xattn})
    for (int stride : {8, 16}) {
      EstimateConfig c;
      c.method = e;
      c.stride = stride;
      check_config(in, d, c, std::string(estimator_name(e)) + " stride " + std::to_string(stride));
    }
}

TEST_F(CudaEstimate, VarlenChunkedPrefillAndStridedViews) {
  // Three sequences, two with lq < lk (queries are the last positions), one whose length is below
  // one block; q/k are views into wider rows (token stride > heads·dim); f32.
  Case c = make_case("varlen", {300, 77, 513, 5}, {300, 200, 700, 64}, 6, 3, 32, DType::f32);
  c.token_pad = 24;
  const Inputs in = testing::make_inputs(c);
  const OnDevice d = upload(in);
  for (Estimator e : {Estimator::rr, Estimator::xattn}) {
    EstimateConfig cfg;
    cfg.method = e;
    cfg.block = 64;
    cfg.stride = 8;
    cfg.tau = 0.9;
    check_config(in, d, cfg, std::string(estimator_name(e)) + " varlen");
    cfg.protect = Protections{};  // no protections at all
    cfg.tau_per_head = {0.5, 0.7, 0.8, 0.9, 0.95, 0.99};
    check_config(in, d, cfg, std::string(estimator_name(e)) + " varlen, no protections, tau per head");
  }
}

// The selection kernel alone on crafted rows, against the CPU's select_blocks, exactly: dyadic
// scores (multiples of 2^-20 below 1, so both the CPU's double sums and the kernel's fixed-point
// sums are exact) with ties, zeros, all-zero rows, one dominant block, rows of 1 to 4096 blocks
// (both of the kernel's register widths), each τ, with and without the protections, RR's order
// (protections OR-ed in) and XAttention's (forced blocks counted first), and the last-row rule.
TEST_F(CudaEstimate, SelectionMatchesCpuOnCraftedRows) {
  std::mt19937_64 rng(seed_base() ^ 0x5e1ec7ull);
  SCOPED_TRACE("ARIADNE_TEST_SEED=" + std::to_string(seed_base()));
  // Row lengths: the edges of both widths (1024 and 4096 blocks) and random ones.
  std::vector<int> lens = {1, 2, 3, 31, 32, 33, 255, 256, 257, 1023, 1024, 1025, 2048, 4095, 4096};
  for (int i = 0; i < 9; ++i) lens.push_back(1 + int(rng() % 4096));
  enum Kind { kRandom, kTies, kSparse, kZeros, kDominant, kFlat };
  for (const int width : {1024, 4096}) {
    // One sequence, one query head per run; rows = query blocks. Rows longer than `width` run
    // only in the wide launch (the kernel takes the width from the longest row).
    std::vector<int> row_len;
    std::vector<int> row_kind;
    for (const int n : lens)
      if (n <= width)
        for (int k = kRandom; k <= kFlat; ++k) {
          row_len.push_back(n);
          row_kind.push_back(k);
        }
    if (width == 4096) {  // at least one row past 1024 makes the launch take the wide kernel
      row_len.push_back(4096);
      row_kind.push_back(kRandom);
    }
    const int rows = int(row_len.size());
    std::vector<int64_t> ptr(size_t(rows) + 1, 0);
    for (int r = 0; r < rows; ++r) ptr[size_t(r) + 1] = ptr[size_t(r)] + row_len[size_t(r)];
    std::vector<float> scores(size_t(ptr.back()));
    const float unit = std::ldexp(1.f, -20);
    for (int r = 0; r < rows; ++r) {
      float* sc = scores.data() + ptr[size_t(r)];
      const int n = row_len[size_t(r)];
      for (int i = 0; i < n; ++i) {
        uint64_t v = 0;
        switch (row_kind[size_t(r)]) {
          case kRandom: v = rng() % (1u << 20); break;
          case kTies: v = (1 + rng() % 6) << 12; break;          // six distinct values, many ties
          case kSparse: v = rng() % 4 == 0 ? rng() % (1u << 18) : 0; break;
          case kZeros: v = 0; break;
          case kDominant: v = i == int(rng() % uint64_t(n)) ? (1u << 19) : rng() % 64; break;
          case kFlat: v = 1u << 10; break;
        }
        sc[i] = float(v) * unit;
      }
    }
    const std::vector<int32_t> qb_seq(size_t(rows), 0);
    std::vector<int32_t> qb_m(static_cast<size_t>(rows));
    std::iota(qb_m.begin(), qb_m.end(), 0);
    cuda::EstSeq seq{};
    seq.nqb = rows;  // row = row_base + h · nqb + m with h = 0

    auto upload = [](const void* src, size_t bytes) {
      DeviceBuffer b(DType::f32, {int64_t((bytes + 3) / 4 + 1)});
      if (bytes) {
        EXPECT_EQ(cudaMemcpy(b.data(), src, bytes, cudaMemcpyHostToDevice), cudaSuccess);
      }
      return b;
    };
    const DeviceBuffer d_qs = DeviceBuffer::from_ints(qb_seq), d_qm = DeviceBuffer::from_ints(qb_m);
    DeviceBuffer d_seq = upload(&seq, sizeof(seq)), d_ptr = upload(ptr.data(), ptr.size() * 8),
                 d_sc = upload(scores.data(), scores.size() * 4);
    DeviceBuffer d_keep(DType::f32, {ptr.back() / 4 + 1}), d_counts(DType::f32, {rows + 1}),
        d_row_ptr(DType::f32, {rows + 1}), d_col(DType::f32, {ptr.back() + 1});

    for (const double tau : {0.5, 0.9, 0.95, 0.999})
      for (const int mode : {0, 1, 2, 3}) {  // protections none / RR's / XAttention's / RR's + last row
        SCOPED_TRACE("width " + std::to_string(width) + ", tau " + std::to_string(tau) + ", mode " + std::to_string(mode));
        DeviceBuffer d_tau = upload(&tau, sizeof(tau));
        cuda::SelectParams sp{};
        sp.seqs = static_cast<const cuda::EstSeq*>(d_seq.data());
        sp.num_seqs = 1;
        sp.qblock_seq = static_cast<const int32_t*>(d_qs.data());
        sp.qblock_m = static_cast<const int32_t*>(d_qm.data());
        sp.score_ptr = static_cast<const int64_t*>(d_ptr.data());
        sp.scores = static_cast<const float*>(d_sc.data());
        sp.tau = static_cast<const double*>(d_tau.data());
        sp.keep = static_cast<uint8_t*>(d_keep.data());
        sp.counts = static_cast<int32_t*>(d_counts.data());
        sp.row_ptr = static_cast<const int32_t*>(d_row_ptr.data());
        sp.col_idx = static_cast<int32_t*>(d_col.data());
        sp.heads_q = 1;
        sp.block = 128;
        sp.sink = sp.diagonal = mode != 0;
        sp.forced_first = mode == 2;
        sp.last_row = mode == 3;
        const int max_len = *std::max_element(row_len.begin(), row_len.end());
        ASSERT_EQ(cudaMemset(d_counts.data(), 0, size_t(rows + 1) * 4), cudaSuccess);
        ASSERT_EQ(cuda::launch_select(sp, rows, max_len, nullptr), cudaSuccess);
        size_t scan_bytes = 0;
        ASSERT_EQ(cuda::exclusive_scan(sp.counts, static_cast<int32_t*>(d_row_ptr.data()), rows + 1, nullptr,
                                       scan_bytes, nullptr),
                  cudaSuccess);
        DeviceBuffer d_scan(DType::f32, {int64_t(scan_bytes / 4 + 1)});
        ASSERT_EQ(cuda::exclusive_scan(sp.counts, static_cast<int32_t*>(d_row_ptr.data()), rows + 1, d_scan.data(),
                                       scan_bytes, nullptr),
                  cudaSuccess);
        ASSERT_EQ(cuda::launch_compact(sp, rows, nullptr), cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<int32_t> rp(size_t(rows) + 1);
        d_row_ptr.copy_to_host(rp.data(), rp.size() * 4);
        std::vector<int32_t> col(size_t(rp.back()));
        if (!col.empty()) d_col.copy_to_host(col.data(), col.size() * 4);
        int bad = 0;
        for (int r = 0; r < rows; ++r) {
          const int n = row_len[size_t(r)];
          const std::vector<int32_t> forced = forced_blocks(sp.sink, sp.diagonal, n);
          const bool whole = sp.last_row && r == rows - 1;
          const std::vector<int32_t> want = select_blocks(scores.data() + ptr[size_t(r)], n, whole ? 1.0 : tau,
                                                          forced, sp.forced_first);
          const std::vector<int32_t> got(col.begin() + rp[size_t(r)], col.begin() + rp[size_t(r) + 1]);
          if (got != want && bad++ < 3)
            ADD_FAILURE() << "row " << r << " (" << n << " blocks, kind " << row_kind[size_t(r)] << "): cuda keeps "
                          << got.size() << " blocks " << list_str(got.data(), got.data() + std::min<size_t>(got.size(), 16))
                          << ", cpu " << want.size() << " " << list_str(want.data(), want.data() + std::min<size_t>(want.size(), 16));
        }
        EXPECT_EQ(bad, 0) << "rows whose kept blocks differ from the CPU's, of " << rows;
      }
  }
}

TEST_F(CudaEstimate, TauOneKeepsEveryVisibleBlock) {
  const Inputs in = testing::make_inputs(make_case("tau1", {321, 190}, {400, 190}, 4, 1, 64, DType::bf16));
  const OnDevice d = upload(in);
  for (Estimator e : {Estimator::rr, Estimator::xattn}) {
    EstimateConfig c;
    c.method = e;
    c.block = 64;
    c.stride = 16;
    c.tau = 1.0;
    c.protect = Protections{};
    const EstimateResult r = estimate(d.qv, d.kv, d.layout, c, Backend::cuda);
    ASSERT_EQ(r.mask.rows(), r.rows());
    for (int64_t row = 0; row < r.rows(); ++row) {
      std::vector<int32_t> all(size_t(r.visible(row)));
      std::iota(all.begin(), all.end(), 0);
      const std::vector<int32_t> got(r.mask.col_idx.begin() + r.mask.row_ptr[size_t(row)],
                                     r.mask.col_idx.begin() + r.mask.row_ptr[size_t(row) + 1]);
      ASSERT_EQ(got, all) << estimator_name(e) << " row " << row;
    }
    EXPECT_DOUBLE_EQ(r.stats.density, 1.0);
    check_config(in, d, c, std::string(estimator_name(e)) + " tau 1");
  }
}

TEST_F(CudaEstimate, RefusalsNameTheReason) {
  const Inputs in = testing::make_inputs(make_case("refuse", {128}, {}, 2, 1, 64, DType::bf16));
  const OnDevice d = upload(in);
  std::string why;
  EXPECT_FALSE(estimate_supports(Backend::cuda, in.params.q, &why));
  EXPECT_NE(why.find("device"), std::string::npos) << why;
  EXPECT_TRUE(estimate_supports(Backend::cuda, d.qv, &why)) << why;
  EstimateConfig c;
  c.block = 96;
  c.stride = 1;  // 96 query strides per block: neither <= 64 nor rounds of 64
  try {
    estimate(d.qv, d.kv, d.layout, c, Backend::cuda);
    ADD_FAILURE() << "block 96 / stride 1 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("block / stride"), std::string::npos) << e.what();
  }
}

// The CUDA estimator keeps its workspace (scratch, flags, tables, staging) between calls and
// shares it between threads (estimate_cuda.cu): a result must not depend on what an earlier call
// of another shape or method left in it, nor on calls running in other threads at the same time.
TEST_F(CudaEstimate, WorkspaceReuseAcrossShapesMethodsAndThreads) {
  const Inputs small = testing::make_inputs(make_case("ws-small", {300, 77}, {300, 200}, 8, 2, 64, DType::bf16));
  const Inputs big = testing::make_inputs(make_case("ws-big", {1500}, {}, 8, 2, 64, DType::bf16));
  const OnDevice ds = upload(small), db = upload(big);
  EstimateConfig rr;
  rr.block = 64;
  rr.stride = 8;
  rr.tau = 0.9;
  EstimateConfig xa = rr;
  xa.method = Estimator::xattn;
  const auto same = [](const EstimateResult& a, const EstimateResult& b) {
    return a.scores == b.scores && a.mask.row_ptr == b.mask.row_ptr && a.mask.col_idx == b.mask.col_idx &&
           a.stats.kept_blocks == b.stats.kept_blocks && a.stats.density_per_head == b.stats.density_per_head;
  };
  // s0 runs and then frees the workspace; b0 grows a new one that s1 (smaller) reuses with b0's
  // partials still in it; x0 (XAttention) and s2 reuse it again.
  EstimateConfig once = rr;
  once.keep_workspace = false;
  const EstimateResult s0 = estimate(ds.qv, ds.kv, ds.layout, once, Backend::cuda);
  const EstimateResult b0 = estimate(db.qv, db.kv, db.layout, rr, Backend::cuda);
  const EstimateResult s1 = estimate(ds.qv, ds.kv, ds.layout, rr, Backend::cuda);
  const EstimateResult x0 = estimate(ds.qv, ds.kv, ds.layout, xa, Backend::cuda);
  const EstimateResult s2 = estimate(ds.qv, ds.kv, ds.layout, rr, Backend::cuda);
  EXPECT_TRUE(same(s0, s1)) << "rr on the small case differs after a larger call";
  EXPECT_TRUE(same(s0, s2)) << "rr on the small case differs after an xattn call";
  EXPECT_GT(b0.stats.kept_blocks, s0.stats.kept_blocks);
  EXPECT_EQ(s0.stats.kept_blocks, int64_t(s0.mask.col_idx.size()));
  EXPECT_GE(s0.device.col_idx.bytes(), s0.mask.col_idx.size() * sizeof(int32_t));

  // Three threads, each cycling through (small rr, big rr, small xattn) from a different start.
  const EstimateResult* want[3] = {&s1, &b0, &x0};
  constexpr int kThreads = 3, kCalls = 6;
  std::vector<std::vector<EstimateResult>> got(kThreads);
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t)
    pool.emplace_back([&, t] {
      try {
        for (int i = 0; i < kCalls; ++i) {
          const int which = (t + i) % 3;
          const OnDevice& d = which == 1 ? db : ds;
          got[size_t(t)].push_back(estimate(d.qv, d.kv, d.layout, which == 2 ? xa : rr, Backend::cuda));
        }
      } catch (const std::exception& e) {
        errors[size_t(t)] = e.what();
      }
    });
  for (std::thread& th : pool) th.join();
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_EQ(errors[size_t(t)], "") << "thread " << t;
    ASSERT_EQ(got[size_t(t)].size(), size_t(kCalls));
    for (int i = 0; i < kCalls; ++i)
      EXPECT_TRUE(same(got[size_t(t)][size_t(i)], *want[(t + i) % 3])) << "thread " << t << " call " << i;
  }
}

// Sparse prefill on the device: the CUDA estimate's device mask feeds the CUDA attention; the
// output must match the CPU reference attention run with the same (host-copied) mask.
TEST_F(CudaEstimate, PrefillMatchesReferenceOnItsMask) {
  Case cs = make_case("prefill", {700, 260}, {900, 260}, 8, 2, 128, DType::bf16);
  cs.input_scale = 1.f;
  Inputs in = testing::make_inputs(cs);
  const OnDevice d = upload(in);
  for (Estimator e : {Estimator::rr, Estimator::xattn}) {
    SCOPED_TRACE(estimator_name(e));
    AttentionParams p = in.params;
    p.q = d.qv;
    p.k = d.kv;
    p.v = d.vv;
    p.pattern = d.layout;
    DeviceBuffer out(DType::f32, {in.total_q, cs.heads_q, cs.dim});
    DeviceBuffer lse(DType::f32, {cs.heads_q, in.total_q});
    out.fill_bytes(0xFF);
    lse.fill_bytes(0xFF);
    p.out = out.view();
    p.lse = lse.view();
    PrefillConfig pc;
    pc.estimate.method = e;
    pc.estimate.tau = 0.5;  // near-uniform random rows: a low τ keeps the mask visibly sparse
    pc.estimate.stride = 16;
    const PrefillResult res = prefill(p, pc);
    cuda_synchronize();
    EXPECT_GT(res.stats.ms_attention, 0);
    EXPECT_GT(res.stats.ms_scoring, 0);
    EXPECT_GT(res.stats.density, 0);
    EXPECT_LT(res.stats.density, 1);

    AttentionParams rp = in.params;
    rp.pattern = in.params.pattern.with_blocks(res.estimate.mask.view());
    Buffer ref_out(DType::f32, {in.total_q, cs.heads_q, cs.dim});
    Buffer ref_lse(DType::f32, {cs.heads_q, in.total_q});
    rp.out = ref_out.view();
    rp.lse = ref_lse.view();
    attention(rp, Backend::reference);
    const Buffer out_h = out.to_host(), lse_h = lse.to_host();
    const double tol = testing::tolerance(cs.dtype, testing::max_abs_logit(in));
    EXPECT_TRUE(testing::close_enough("out", testing::compare(out_h.view(), ref_out.view()), tol));
    EXPECT_TRUE(testing::lse_close(lse_h.view(), ref_lse.view(), tol));
  }
}

// The f32 scoring kernel (EstimateConfig::cuda_f32_scoring, or ARIADNE_EST_F32=1) stays tested:
// the benchmark shape, XAttention on f16 and the f32 varlen case.
TEST_F(CudaEstimate, F32ScoringMatchesCpu) {
  const Inputs llama = testing::make_inputs(make_case("f32-llama", {2100}, {}, 32, 8, 128, DType::bf16));
  const Inputs varlen = testing::make_inputs(make_case("f32-varlen", {300, 77, 513}, {300, 200, 700}, 6, 3, 32, DType::f32));
  const OnDevice dl = upload(llama), dv = upload(varlen);
  for (Estimator e : {Estimator::rr, Estimator::xattn}) {
    EstimateConfig c;
    c.method = e;
    c.cuda_f32_scoring = true;
    const EstimateResult r = estimate(dl.qv, dl.kv, dl.layout, c, Backend::cuda);
    EXPECT_FALSE(r.stats.tensor_core_scoring);
    check_config(llama, dl, c, std::string("f32 scoring, llama ") + estimator_name(e));
    c.block = 64;
    c.tau = 0.9;
    check_config(varlen, dv, c, std::string("f32 scoring, varlen f32 ") + estimator_name(e));
  }
}

// Replaces q and k by integers in [−r, r] (exact in every dtype).
void integer_inputs(Inputs& in, int r, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_int_distribution<int> u(-r, r);
  for (Buffer* b : {&in.q, &in.k}) {
    const int64_t n = b->numel();
    if (b->dtype() == DType::bf16) {
      uint16_t* p = b->as<uint16_t>();
      for (int64_t i = 0; i < n; ++i) p[i] = float_to_bf16(float(u(g)));
    } else {
      ASSERT_EQ(b->dtype(), DType::f32);
      float* p = b->as<float>();
      for (int64_t i = 0; i < n; ++i) p[i] = float(u(g));
    }
  }
}

// Rule (1) of docs/numerics.md: on inputs whose products and sums are exact in f32 (integers in
// [−3, 3]: |q·K̄| <= 128 · 3 · 48 < 2^24, and a scale with scale / S a power of two), the
// tensor-core logits equal the f32 kernel's bit for bit, so the scores and masks of the two
// kernels must be identical, and both match the CPU under the usual rule.
// v2: the same on the v2 tensor-core kernel (EstimateConfig::cuda_scoring_v2), which must then
// have run on every RR case (B / S = 16 and 8 here) and on no XAttention one. v3: the same with
// cuda_scoring_v3, which must have run on the bf16 RR cases (v2 on the f32 ones).
void exact_on_integers(int version) {
  const KernelsFromConfig clean;
  const bool v2 = version >= 2;
  for (DType dt : {DType::bf16, DType::f32}) {
    Inputs in = testing::make_inputs(make_case(std::string("int-") + dtype_name(dt), {1900, 700}, {1900, 900}, 8, 2,
                                               128, dt));
    integer_inputs(in, 3, seed_base() ^ 0x5eedu);
    const OnDevice d = upload(in);
    for (Estimator e : {Estimator::rr, Estimator::xattn})
      for (int stride : {8, 16}) {
        EstimateConfig c;
        c.method = e;
        c.stride = stride;
        c.scale = float(stride) / 128.f;  // scale / S = 2^-7: logits of standard deviation ~1
        c.cuda_scoring_v2 = v2;
        c.cuda_scoring_v3 = version == 3;
        c.cuda_exact_scoring = true;  // bit for bit needs the exact build at head_dim 128
        const bool v3_runs = version == 3 && e == Estimator::rr && dt == DType::bf16;
        const std::string what = (v2 ? "v" + std::to_string(version) + " " : std::string()) + dtype_name(dt) + " " +
                                 estimator_name(e) + " S " + std::to_string(stride);
        SCOPED_TRACE(what);
        const EstimateResult tc = estimate(d.qv, d.kv, d.layout, c, Backend::cuda);
        EstimateConfig cf = c;
        cf.cuda_f32_scoring = true;
        const EstimateResult f32 = estimate(d.qv, d.kv, d.layout, cf, Backend::cuda);
        ASSERT_TRUE(tc.stats.tensor_core_scoring);
        ASSERT_EQ(tc.stats.scoring_v3, v3_runs);
        ASSERT_EQ(tc.stats.scoring_v2, v2 && e == Estimator::rr && !v3_runs);
        ASSERT_FALSE(tc.stats.approximate_scoring);
        ASSERT_FALSE(f32.stats.tensor_core_scoring);
        size_t differ = 0;
        for (size_t i = 0; i < tc.scores.size(); ++i) differ += tc.scores[i] != f32.scores[i];
        EXPECT_EQ(differ, size_t(0)) << "scores not bit-identical between the two kernels";
        EXPECT_TRUE(tc.mask.row_ptr == f32.mask.row_ptr && tc.mask.col_idx == f32.mask.col_idx)
            << "masks differ between the two kernels";
        check_config(in, d, c, "integers, " + what);
      }
  }
}

TEST_F(CudaEstimate, TensorCoreScoringExactOnIntegers) { exact_on_integers(1); }
TEST_F(CudaEstimate, TensorCoreScoringV2ExactOnIntegers) { exact_on_integers(2); }
TEST_F(CudaEstimate, TensorCoreScoringV3ExactOnIntegers) { exact_on_integers(3); }

// Rule (2) of docs/numerics.md between two CUDA results of one config (`ref` the reference
// kernel's): scores within 1e-5, block lists identical on every row whose decision margin (from
// ref's scores) exceeds 1e-4, and those rows within it under 20%, counted and printed.
void expect_rule2(const EstimateResult& ref, const EstimateResult& got, const EstimateConfig& c, const char* label,
                  const std::string& what) {
  ASSERT_EQ(got.scores.size(), ref.scores.size());
  ASSERT_EQ(got.mask.row_ptr.size(), ref.mask.row_ptr.size());
  double worst = 0;
  for (size_t i = 0; i < got.scores.size(); ++i)
    worst = std::max(worst, std::abs(double(got.scores[i]) - double(ref.scores[i])));
  EXPECT_LE(worst, 1e-5);
  const Protections prot = c.protections();
  const bool xattn = c.method == Estimator::xattn;
  int64_t near = 0, mismatches = 0;
  for (int64_t row = 0; row < ref.rows(); ++row) {
    const int64_t n = ref.visible(row);
    std::vector<int32_t> forced;
    if (prot.sink) forced.push_back(0);
    if (prot.diagonal && n > 1) forced.push_back(int32_t(n - 1));
    const int64_t nqb = ref.mask.seq_block_base[1];
    const bool whole = prot.last_row && row % nqb == nqb - 1;
    const double margin =
        whole ? 1.0 : decision_margin(ref.scores.data() + ref.score_ptr[size_t(row)], n, c.tau, forced, xattn);
    if (margin <= 1e-4) {
      ++near;
      continue;
    }
    const auto list = [&](const EstimateResult& r) {
      return std::vector<int32_t>(r.mask.col_idx.begin() + r.mask.row_ptr[size_t(row)],
                                  r.mask.col_idx.begin() + r.mask.row_ptr[size_t(row) + 1]);
    };
    mismatches += list(got) != list(ref);
  }
  EXPECT_EQ(mismatches, 0) << "rows whose block lists differ between the kernels";
  EXPECT_LE(near * 5, ref.rows()) << near << " of " << ref.rows() << " rows within 1e-4 of the cut";
  std::printf("[ %s ] %s: scores within %.2e, %lld of %lld rows near the cut\n", label, what.c_str(), worst,
              (long long)near, (long long)ref.rows());
}

// Rule (2): on fresh random inputs (bf16, f16 and f32, so the 1-, 2- and 3-term splits all run)
// the two kernels' scores agree within 1e-5 (half the CPU comparison's bound), and the masks
// agree exactly on every row whose decision margin (from the f32 kernel's scores: the distance of
// the cumulative mass from τ at each decision, or a near-tie at the cut) exceeds 1e-4; rows
// within it are counted and printed, and must stay below 20%.
// v2: the same on the v2 kernel, with B 128 added so that both of its block widths run (B / S =
// 8 and 16); it must have run exactly on the RR cases with B / S 8 or 16. v3: the same with
// cuda_scoring_v3, which must have run on those cases with bf16 inputs (v2 on the others).
void matches_f32_kernel(int version) {
  const KernelsFromConfig clean;
  const bool v2 = version >= 2;
  for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
    const Inputs in = testing::make_inputs(make_case(std::string("tc-") + dtype_name(dt), {2300}, {}, 16, 4, 128, dt));
    const OnDevice d = upload(in);
    for (Estimator e : {Estimator::rr, Estimator::xattn})
      for (int stride : {8, 16})
        for (int block : {64, 128}) {
          if (block == 128 && !v2) continue;
          EstimateConfig c;
          c.method = e;
          c.stride = stride;
          c.block = block;
          c.tau = 0.9;
          c.cuda_scoring_v2 = v2;
          c.cuda_scoring_v3 = version == 3;
          const std::string what = (v2 ? "v" + std::to_string(version) + " " : std::string()) + dtype_name(dt) + " " +
                                   estimator_name(e) + " S " + std::to_string(stride) + " B " + std::to_string(block);
          SCOPED_TRACE(what);
          const EstimateResult tc = estimate(d.qv, d.kv, d.layout, c, Backend::cuda);
          const int spb = block / stride;
          const bool v2_case = e == Estimator::rr && (spb == 8 || spb == 16);
          const bool v3_runs = version == 3 && v2_case && dt == DType::bf16;
          ASSERT_EQ(tc.stats.scoring_v3, v3_runs);
          ASSERT_EQ(tc.stats.scoring_v2, v2 && v2_case && !v3_runs);
          EstimateConfig cf = c;
          cf.cuda_f32_scoring = true;
          const EstimateResult f32 = estimate(d.qv, d.kv, d.layout, cf, Backend::cuda);
          expect_rule2(f32, tc, c, "mma vs f32", what);
        }
  }
}

TEST_F(CudaEstimate, TensorCoreScoringMatchesF32Kernel) { matches_f32_kernel(1); }
TEST_F(CudaEstimate, TensorCoreScoringV2MatchesF32Kernel) { matches_f32_kernel(2); }
TEST_F(CudaEstimate, TensorCoreScoringV3MatchesF32Kernel) { matches_f32_kernel(3); }

// One shape of the bit-identity tests below.
struct BitShape {
  const char* name;
  std::vector<int64_t> sq, sk;
  int hq, hkv, dim;
  int64_t token_pad = 0;  // > 0: q and k are views into wider rows (testing::Case::token_pad)
};

// For every shape × dtype × (S, B) with B / S = 8 or 16 × offset (τ 0.9): the v1 tensor-core
// kernel (v2 and v3 off) against the same config with `enable` applied. v1 must have run as v1,
// `ran(stats, dtype)` must hold for the variant, its scores must equal v1's bit for bit and its
// masks exactly, and the variant's second run must give its own bits again. Then the variant on
// the Llama shape (32 / 8 heads, d 128, bf16, S 8 and 16) against the CPU (check_config).
// Every shape × dtype × (S, B) with B / S = 8 or 16 × offset, RR at τ 0.9: body(d, dtype, config,
// label) with the shape's fresh inputs on the device, under a trace naming the case and the seed.
void for_each_rr_case(const std::vector<BitShape>& shapes, const std::vector<DType>& dtypes,
                      const std::function<void(const OnDevice&, DType, EstimateConfig, const std::string&)>& body) {
  for (const BitShape& sh : shapes)
    for (DType dt : dtypes) {
      Case cs = make_case(std::string(sh.name) + "-" + dtype_name(dt), sh.sq, sh.sk, sh.hq, sh.hkv, sh.dim, dt);
      cs.token_pad = sh.token_pad;
      const Inputs in = testing::make_inputs(cs);
      const OnDevice d = upload(in);
      for (int stride : {8, 16})
        for (int block : {64, 128}) {
          if (block / stride != 8 && block / stride != 16) continue;
          for (RROffset off : {RROffset::paper, RROffset::released}) {
            EstimateConfig c;
            c.stride = stride;
            c.block = block;
            c.offset = off;
            c.tau = 0.9;
            const std::string what = std::string(sh.name) + " " + dtype_name(dt) + " S " + std::to_string(stride) +
                                     " B " + std::to_string(block) + " " + rr_offset_name(off);
            SCOPED_TRACE(what + " (ARIADNE_TEST_SEED=" + std::to_string(seed_base()) + ")");
            body(d, dt, c, what);
          }
        }
    }
}

void check_bit_identical_to_v1(const std::vector<BitShape>& shapes, const std::vector<DType>& dtypes, const char* vname,
                               const std::function<void(EstimateConfig&)>& enable,
                               const std::function<bool(const EstimateStats&, DType)>& ran) {
  const KernelsFromConfig clean;
  for_each_rr_case(shapes, dtypes, [&](const OnDevice& d, DType dt, EstimateConfig c, const std::string&) {
    c.cuda_scoring_v2 = false;
    c.cuda_scoring_v3 = false;  // whatever the defaults: v1
    const EstimateResult v1 = estimate(d.qv, d.kv, d.layout, c, Backend::cuda);
    EstimateConfig cv = c;
    enable(cv);
    const EstimateResult v = estimate(d.qv, d.kv, d.layout, cv, Backend::cuda);
    ASSERT_TRUE(v1.stats.tensor_core_scoring);
    ASSERT_FALSE(v1.stats.scoring_v2 || v1.stats.scoring_v3);
    ASSERT_TRUE(ran(v.stats, dt)) << vname << " did not run as expected";
    ASSERT_EQ(v1.scores.size(), v.scores.size());
    size_t differ = 0, first = 0;
    for (size_t i = 0; i < v1.scores.size(); ++i)
      if (std::memcmp(&v1.scores[i], &v.scores[i], sizeof(float)) != 0 && differ++ == 0) first = i;
    EXPECT_EQ(differ, size_t(0)) << "scores not bit-identical, first at " << first << ": v1 " << v1.scores[first]
                                 << " " << vname << " " << v.scores[first];
    EXPECT_TRUE(v1.mask.row_ptr == v.mask.row_ptr && v1.mask.col_idx == v.mask.col_idx)
        << "masks differ between v1 and " << vname;
    // Run to run: the same call again gives the same bits.
    const EstimateResult again = estimate(d.qv, d.kv, d.layout, cv, Backend::cuda);
    EXPECT_TRUE(again.scores == v.scores);
  });
  const Inputs llama = testing::make_inputs(make_case(std::string(vname) + "-llama", {2100}, {}, 32, 8, 128, DType::bf16));
  const OnDevice dl = upload(llama);
  for (int stride : {8, 16}) {
    EstimateConfig c;
    c.stride = stride;
    c.cuda_scoring_v2 = false;
    c.cuda_scoring_v3 = false;
    enable(c);
    ASSERT_TRUE(ran(estimate(dl.qv, dl.kv, dl.layout, c, Backend::cuda).stats, DType::bf16))
        << vname << " did not run on the llama shape";
    check_config(llama, dl, c, std::string(vname) + " llama rr stride " + std::to_string(stride));
  }
}

// The v2 kernel computes the same logits (same products, same accumulation order) and the same
// partials (the same expf terms summed in the same column order) as v1, so its scores must equal
// v1's bit for bit and its masks exactly, on random inputs of every dtype (1, 2 and 3 q terms),
// head_dim 128, 80 (a tile row of 10 vectors: a thread's copy steps wrap between term rows) and
// 32, full GQA groups (64 rows per CTA) and half-empty ones (S 16 with 4 heads: warps without
// rows), both offsets, and varlen sequences with lq < lk whose last chunk is partly past the
// sequence (zero-filled key strides). It must also match the CPU (rule 3) on the benchmark shape.
TEST_F(CudaEstimate, TensorCoreScoringV2BitIdenticalToV1) {
  check_bit_identical_to_v1({{"v2-gqa8", {1500}, {}, 16, 2, 128},
                             {"v2-d80-varlen", {700, 77, 1100}, {700, 300, 1333}, 8, 2, 80},
                             {"v2-d32", {999}, {}, 4, 1, 32}},
                            {DType::bf16, DType::f16, DType::f32}, "v2",
                            [](EstimateConfig& c) { c.cuda_scoring_v2 = true; },
                            [](const EstimateStats& s, DType) { return s.scoring_v2; });
}

// The v3 kernel (G = rows / R adjacent query blocks of R = heads_per_cta · B/S rows each per CTA;
// at head_dim 128 the wgmma variant, elsewhere, or under ARIADNE_EST_V3_KIND=narrow, the 128-row
// mma.sync one) computes every group's logits, partials, row sums and block scores as v2 does, so
// its scores must equal v1's bit for bit and its masks exactly, on bf16 inputs (the only ones it
// takes; f16 must fall back to v2): GQA groups of 8 (two CTAs in z), 4 (S 16: R 32), 3 (R 48 or
// 24: rows past G·R empty) and 1 (B 64: R 8, the most groups a CTA holds), head_dim 128 (the
// wgmma variant), 80 (the copy's carry path), 64 and 32, odd block counts (a last CTA with fewer
// groups), both offsets, varlen sequences with lq < lk, one shorter than a block, and rows 3
// elements wider than the heads (q rows off 16 bytes: the q tile's element path, where the
// others take its 16-byte one). It must also match the CPU (rule 3) on the benchmark shape. (That the wgmma path sums each k-16 group
// to the same bits as mma.sync is measured here, not documented by the ISA: docs/numerics.md.)
// With cuda_exact_scoring (the default is the approximate build at head_dim 128: see below). The
// routing switches (ARIADNE_EST_V3_KIND, ARIADNE_EST_V3_FAST) are the caller's.
void v3_bit_identical_to_v1() {
  check_bit_identical_to_v1({{"v3-gqa8", {1500}, {}, 16, 2, 128},
                             {"v3-d80-varlen", {700, 77, 1100}, {700, 300, 1333}, 8, 2, 80},
                             {"v3-g3-varlen", {1300, 5, 260}, {1300, 64, 900}, 6, 2, 64},
                             {"v3-g3-varlen-d128", {1300, 5, 260}, {1300, 64, 900}, 6, 2, 128},
                             {"v3-mha", {2100}, {}, 2, 2, 32},
                             {"v3-mha-d128", {1100}, {}, 2, 2, 128},
                             // rows 3 elements wider: q rows off 16 bytes, the q tile's element path
                             {"v3-pad3-d128", {900}, {}, 8, 2, 128, 3},
                             {"v3-pad3-d64", {900}, {}, 8, 2, 64, 3}},
                            {DType::bf16, DType::f16}, "v3",
                            [](EstimateConfig& c) {
                              c.cuda_scoring_v3 = true;
                              c.cuda_exact_scoring = true;  // at head_dim 128: the exact fast build
                            },
                            // bf16 only: f16 falls back to v2
                            [](const EstimateStats& s, DType dt) { return s.scoring_v3 == (dt == DType::bf16); });
}

TEST_F(CudaEstimate, TensorCoreScoringV3BitIdenticalToV1) { v3_bit_identical_to_v1(); }

// The wgmma kernel's other exact builds (ARIADNE_EST_V3_FAST=0: the plain one; 2: 128-row fast
// partials, two warpgroups; the 64-row fast-partials build, the exact one, runs in the test above;
// head_dim 128, the other head dims keep the 128-row mma.sync kernel) must give v1's scores bit
// for bit as well: their mask-free chunks, their copy of whole chunks, their
// descriptors and the 128-row grouping change instructions, not values. The shapes above have
// chunks of every kind: wholly visible to a warp (the fast partials), crossing a row's last key
// stride, past a group, wholly inside the sequence and its last, partial one; and CTAs of several
// query blocks, the last one short.
TEST_F(CudaEstimate, TensorCoreScoringV3FastBitIdenticalToV1) {
  for (const char* fast : {"0", "2"}) {
    SCOPED_TRACE(std::string("ARIADNE_EST_V3_FAST=") + fast);
    const cuda_testing::EnvGuard guard("ARIADNE_EST_V3_FAST", fast);
    v3_bit_identical_to_v1();
  }
}

// The wgmma kernel's approximate builds (head_dim 128, bf16; ARIADNE_EST_V3_FAST=3: the same
// logits, partials by ex2.approx in the quad's order; 4: the same with K̄'s two high bf16 terms,
// logits to ~2^-17 relative of |K̄|; 5: that with 128 rows), so their scores are held to rule 2
// against the exact v1 kernel (within 1e-5, masks identical on rows with margin > 1e-4), not to
// bit-identity, on the v3 shapes at head_dim 128 (GQA 8, 3 with varlen lq < lk and a sequence
// shorter than a block, MHA), S 8 and 16, B 64 and 128, both offsets; and to rule 3 against the
// CPU on the Llama shape; EstimateStats::approximate_scoring says it ran. Without the variable the
// config's default (cuda_exact_scoring false) must pick the approximate build too.
// The v1 kernel's result and then the v3 kernel's (as the switches route it) for config c.
std::pair<EstimateResult, EstimateResult> v1_and_v3(const OnDevice& d, EstimateConfig c) {
  c.cuda_scoring_v2 = false;
  c.cuda_scoring_v3 = false;
  EstimateResult v1 = estimate(d.qv, d.kv, d.layout, c, Backend::cuda);
  c.cuda_scoring_v3 = true;
  return {std::move(v1), estimate(d.qv, d.kv, d.layout, c, Backend::cuda)};
}

void v3_approx_matches_v1() {
  const KernelsFromConfig clean;
  // The approximate builds are the wgmma kernel's: ARIADNE_EST_V3_KIND=narrow would route around them.
  const cuda_testing::EnvUnset kind("ARIADNE_EST_V3_KIND");
  const std::vector<BitShape> shapes = {{"v3a-gqa8", {1500}, {}, 16, 2, 128},
                                        {"v3a-g3-varlen", {1300, 5, 260}, {1300, 64, 900}, 6, 2, 128},
                                        {"v3a-mha", {1100}, {}, 2, 2, 128},
                                        {"v3a-pad3", {900}, {}, 8, 2, 128, 3}};
  for_each_rr_case(shapes, {DType::bf16}, [](const OnDevice& d, DType, EstimateConfig c, const std::string& what) {
    const auto [v1, v] = v1_and_v3(d, c);
    c.cuda_scoring_v3 = true;
    ASSERT_TRUE(v.stats.scoring_v3 && v.stats.approximate_scoring);
    expect_rule2(v1, v, c, "approx vs v1", what);
    const EstimateResult again = estimate(d.qv, d.kv, d.layout, c, Backend::cuda);
    EXPECT_TRUE(again.scores == v.scores) << "scores differ between two identical runs";
  });
  const Inputs llama = testing::make_inputs(make_case("v3a-llama", {2100}, {}, 32, 8, 128, DType::bf16));
  const OnDevice dl = upload(llama);
  for (int stride : {8, 16}) {
    EstimateConfig c;
    c.stride = stride;
    const auto [v1, v] = v1_and_v3(dl, c);
    c.cuda_scoring_v3 = true;
    ASSERT_TRUE(v.stats.scoring_v3 && v.stats.approximate_scoring);
    ASSERT_EQ(v.scores.size(), v1.scores.size());
    size_t differ = 0;
    for (size_t i = 0; i < v.scores.size(); ++i) differ += std::memcmp(&v.scores[i], &v1.scores[i], sizeof(float)) != 0;
    std::printf("[ approx vs v1 ] llama S %d: %zu of %zu scores differ in some bit\n", stride, differ, v.scores.size());
    check_config(llama, dl, c, "v3 approx llama rr stride " + std::to_string(stride));
  }
}

TEST_F(CudaEstimate, TensorCoreScoringV3ApproxMatchesV1) {
  for (const char* fast : {"", "3", "4", "5"}) {
    SCOPED_TRACE(std::string("ARIADNE_EST_V3_FAST=") + fast);
    const cuda_testing::EnvUnset guard("ARIADNE_EST_V3_FAST");  // "": the default build, whatever the caller set
    if (*fast != 0) setenv("ARIADNE_EST_V3_FAST", fast, 1);
    v3_approx_matches_v1();
  }
}

// A small bf16 case for compute-sanitizer on the v3 kernel, every variant (scripts/device-check):
// varlen with lq < lk, a sequence shorter than a block, views into wider rows, GQA group 3 (rows
// past G·R empty), head_dim 128 and the three block widths, against the CPU; under
// ARIADNE_EST_V3_FAST 0 to 5 (the wgmma kernel, its two fast-partials builds and the three
// approximate ones).
TEST_F(CudaEstimate, TensorCoreScoringV3SmallCasesForSanitizers) {
  const KernelsFromConfig clean;
  Case cs = make_case("v3-san", {300, 77, 513, 5}, {300, 200, 700, 64}, 6, 2, 128, DType::bf16);
  cs.token_pad = 24;
  const Inputs in = testing::make_inputs(cs);
  const OnDevice d = upload(in);
  for (const char* fast : {"0", "1", "2", "3", "4", "5"}) {
    const cuda_testing::EnvGuard guard("ARIADNE_EST_V3_FAST", fast);
    for (int stride : {8, 16})
      for (int block : {64, 128}) {
        if (block / stride != 8 && block / stride != 16) continue;
        EstimateConfig c;
        c.stride = stride;
        c.block = block;
        c.tau = 0.9;
        c.cuda_scoring_v3 = true;
        ASSERT_TRUE(estimate(d.qv, d.kv, d.layout, c, Backend::cuda).stats.scoring_v3);
        check_config(in, d, c,
                     "v3 sanitizer case S " + std::to_string(stride) + " B " + std::to_string(block) + " fast " + fast);
      }
  }
}


// RR's key-stride sums K̄ (sampling, part 1): the vector kernel (16-bit keys in 16-byte vectors,
// several loads in flight) against the scalar kernel (ScoreParams::sums_scalar) bit for bit, and
// the f32 output against sums taken here in the same order (t = 0 .. S − 1 from 0). Sequences
// whose last stride is partial, head dims with a zero-padded tail vector (72 → dpad 80), a stride
// that is not a multiple of 8 (12: two load groups), token rows wider than the heads.
TEST(CudaKeyStrideSums, VectorKernelEqualsScalarKernelAndHostSums) {
  std::mt19937 rng{uint32_t(seed_base())};
  std::uniform_real_distribution<float> uni(-3.f, 3.f);
  const std::vector<int64_t> lens = {1000, 77, 5};
  const int heads_kv = 3;
  for (DType dt : {DType::bf16, DType::f16})
    for (int d : {128, 72})
      for (int stride : {8, 12, 16})
        for (int pad : {0, 8})
          for (bool mma : {true, false}) {
            SCOPED_TRACE(std::string(dtype_name(dt)) + " d " + std::to_string(d) + " S " + std::to_string(stride) +
                         " pad " + std::to_string(pad) + (mma ? " bf16 terms" : " f32"));
            const int64_t total_k = std::accumulate(lens.begin(), lens.end(), int64_t(0));
            const int64_t k_tok = heads_kv * d + pad;
            std::vector<uint16_t> kh(size_t(total_k * k_tok));
            for (auto& x : kh) x = dt == DType::bf16 ? float_to_bf16(uni(rng)) : float_to_f16(uni(rng));
            const auto kf = [&](int64_t i) { return dt == DType::bf16 ? bf16_to_float(kh[size_t(i)]) : f16_to_float(kh[size_t(i)]); };
            std::vector<cuda::EstSeq> seqs;
            int64_t k0 = 0, ks = 0;
            for (int64_t l : lens) {
              cuda::EstSeq e{};
              e.k0 = k0;
              e.lk = l;
              e.nks = int32_t((l + stride - 1) / stride);
              e.ks_base = int32_t(ks);
              seqs.push_back(e);
              k0 += l;
              ks += e.nks;
            }
            const int dpad = (d + 15) / 16 * 16;
            const int64_t out_elems = heads_kv * ks * (mma ? 3 * dpad : d);  // 2-byte terms or f32
            DeviceBuffer kd(DType::f32, {int64_t(kh.size() + 1) / 2});
            ASSERT_EQ(cudaMemcpy(kd.data(), kh.data(), kh.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
            DeviceBuffer sd(DType::f32, {int64_t(seqs.size() * sizeof(cuda::EstSeq) + 3) / 4});
            ASSERT_EQ(cudaMemcpy(sd.data(), seqs.data(), seqs.size() * sizeof(cuda::EstSeq), cudaMemcpyHostToDevice), cudaSuccess);
            std::vector<std::vector<uint8_t>> outs;
            for (bool scalar : {true, false}) {
              DeviceBuffer od(DType::f32, {out_elems});
              // Poisoned: the kernels write every byte of the output.
              ASSERT_EQ(cudaMemset(od.data(), 0xff, size_t(out_elems) * 4), cudaSuccess);
              cuda::ScoreParams p{};
              p.k = kd.data();
              p.dtype = dt == DType::bf16 ? 1 : 2;
              p.k_tok = k_tok;
              p.k_head = d;
              p.d = d;
              p.dpad = dpad;
              p.stride = stride;
              p.heads_kv = heads_kv;
              p.total_ks = ks;
              p.seqs = static_cast<const cuda::EstSeq*>(sd.data());
              p.num_seqs = int(seqs.size());
              p.mma = mma;
              (mma ? p.ksplit : reinterpret_cast<void*&>(p.ksum)) = od.data();
              p.sums_scalar = scalar;
              ASSERT_EQ(cuda::launch_key_stride_sums(p, nullptr), cudaSuccess);
              ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
              const size_t bytes = size_t(heads_kv * ks * (mma ? 3 * dpad * 2 : d * 4));
              outs.emplace_back(bytes);
              od.copy_to_host(outs.back().data(), bytes);
            }
            ASSERT_EQ(outs[0], outs[1]) << "vector and scalar kernels differ";
            // Host sums in the kernels' order; f32 output exactly, bf16 terms: the first term is
            // the sum rounded to bf16 and the padding columns are zero.
            for (int h = 0; h < heads_kv; ++h)
              for (const cuda::EstSeq& e : seqs)
                for (int64_t j = 0; j < e.nks; ++j)
                  for (int u = 0; u < (mma ? dpad : d); ++u) {
                    float acc = 0.f;
                    if (u < d)
                      for (int64_t t = 0; t < stride && j * stride + t < e.lk; ++t)
                        acc += kf((e.k0 + j * stride + t) * k_tok + h * d + u);
                    const int64_t x = e.ks_base + j;
                    if (mma) {
                      uint16_t hi;
                      std::memcpy(&hi, outs[1].data() + size_t(((h * ks + x) * 3 * dpad + u) * 2), 2);
                      ASSERT_EQ(hi, float_to_bf16(acc)) << "head " << h << " stride row " << x << " col " << u;
                    } else {
                      float got;
                      std::memcpy(&got, outs[1].data() + size_t(((h * ks + x) * d + u) * 4), 4);
                      ASSERT_EQ(std::memcmp(&got, &acc, 4), 0)
                          << "head " << h << " stride row " << x << " col " << u << ": " << got << " vs " << acc;
                    }
                  }
          }
}

}  // namespace
}  // namespace ariadne
