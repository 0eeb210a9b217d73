// Shared by the CUDA estimator tests (test_estimate_cuda.cpp: against the CPU estimator;
// test_estimate_scoring_cuda.cpp: the scoring kernels against each other; test_estimate_env_cuda.cpp):
// device copies of the inputs, the CPU-vs-CUDA comparison of one config, the decision margins
// that decide which rows are compared exactly, and the case builder.
//
// Scores: every visible block of every row within 2e-5 (both are f32 dot products, summed in
// different orders). Block lists: compared exactly on every row whose decisions are not within
// 1e-4 of the threshold or of a tie at the kept/dropped boundary (margins taken from the CPU
// scores; the rule of tests/cpu/test_estimate.cpp), and such rows must be >= 80% of all.
// The first mismatch is printed with its row, scores and both lists. Each case also runs twice
// (bit-identical scores and masks: the kernels use no float atomics) and once device-only.
#pragma once

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

namespace ariadne::estimate_testing {

using testing::Case;
using testing::Inputs;

inline uint64_t seed_base() {
  static const uint64_t seed = [] {
    if (const char* s = std::getenv("ARIADNE_TEST_SEED")) return uint64_t(std::strtoull(s, nullptr, 10));
    return uint64_t(std::random_device{}());
  }();
  return seed;
}

inline TensorView on_device(const TensorView& host_view, const Buffer& host, const DeviceBuffer& dev) {
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

inline OnDevice upload(const Inputs& in) {
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
inline std::vector<int32_t> forced_blocks(bool sink, bool diagonal, int64_t n) {
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
inline double decision_margin(const float* sc, int64_t n, double tau, const std::vector<int32_t>& forced,
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

inline std::string list_str(const int32_t* b, const int32_t* e) {
  std::ostringstream o;
  o << "[";
  for (const int32_t* p = b; p != e; ++p) o << (p == b ? "" : " ") << *p;
  o << "]";
  return o.str();
}

// CPU vs CUDA on one input set and config.
inline void check_config(const Inputs& in, const OnDevice& d, const EstimateConfig& c, const std::string& what) {
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
              cuda_scoring_name(got.stats.scoring), what.c_str(), worst, (long long)compared,
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

inline Case make_case(const std::string& name, std::vector<int64_t> sq, std::vector<int64_t> sk, int hq, int hkv, int dim,
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

}  // namespace ariadne::estimate_testing
