// FlexPrefill on the device (src/estimate/cuda/flexprefill.cu) against the CPU estimator and the
// plain double rule of tests/flexprefill_brute.cpp, on fresh random inputs (ARIADNE_TEST_SEED
// repeats a run): the map scores within 1e-5 (f32 against double), the masks exactly on every
// (sequence, head) whose decisions are not within 1e-5 of going the other way (the brute's margin),
// which must be most of them; each call twice with bit-identical results. Varlen with lq < lk,
// GQA, the three dtypes, both head kinds, budgets, the dense fallback of short inputs, planted
// vertical and slash heads, the protections, the Llama shape at B 128, and a refusal.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ariadne/estimate.hpp"
#include "common.hpp"
#include "cuda/cuda_common.hpp"
#include "cuda/estimate_cuda_common.hpp"
#include "flexprefill_brute.hpp"

namespace ariadne {
namespace {

using namespace estimate_testing;

constexpr double kMargin = 1e-5;

EstimateConfig flex_config(int64_t block, double gamma, double js_tau, int64_t min_budget, int64_t max_budget = 0) {
  EstimateConfig c;
  c.method = Estimator::flexprefill;
  c.block = block;
  c.tau = gamma;
  c.flex_js_tau = js_tau;
  c.flex_min_budget = min_budget;
  c.flex_max_budget = max_budget;
  return c;
}

// The device result against the CPU estimator and the brute rule; returns the heads compared.
int check_flex(const Case& cs, const Inputs& in, const OnDevice& d, EstimateConfig c, const std::string& what,
               double min_share = 0.75) {
  SCOPED_TRACE(what + " (ARIADNE_TEST_SEED=" + std::to_string(seed_base()) + ")");
  const EstimateResult cpu = estimate(in.params.q, in.params.k, in.params.pattern, c, Backend::cpu);
  c.host_copy = true;
  const EstimateResult gpu = estimate(d.qv, d.kv, d.layout, c, Backend::cuda);
  const EstimateResult again = estimate(d.qv, d.kv, d.layout, c, Backend::cuda);
  const testing::FlexBrute brute = testing::brute_flex(in, cs, c);
  EXPECT_EQ(gpu.mask.row_ptr, again.mask.row_ptr) << "two runs differ";
  EXPECT_EQ(gpu.mask.col_idx, again.mask.col_idx) << "two runs differ";
  EXPECT_EQ(0, std::memcmp(gpu.scores.data(), again.scores.data(), gpu.scores.size() * sizeof(float)))
      << "two runs' scores differ";
  EXPECT_EQ(gpu.mask.rows(), cpu.mask.rows());
  EXPECT_EQ(gpu.score_ptr, cpu.score_ptr);
  if (::testing::Test::HasFailure()) return 0;
  for (size_t i = 0; i < cpu.scores.size(); ++i)
    if (std::abs(double(gpu.scores[i]) - double(cpu.scores[i])) > 1e-5 + 1e-4 * std::abs(double(cpu.scores[i]))) {
      ADD_FAILURE() << "map score " << i << ": cuda " << gpu.scores[i] << " cpu " << cpu.scores[i];
      return 0;
    }
  // Rows of one (sequence, head): the brute's heads are sequence-major, rows are too.
  size_t row = 0;
  int compared = 0, probed = 0;
  for (const testing::FlexHead& h : brute.heads) {
    const int64_t lq = cs.seq_q[size_t(h.seq)], nqb = (lq + c.block - 1) / c.block;
    probed += h.probed;
    const bool clear = h.margin > kMargin;
    if (clear) ++compared;
    for (int64_t m = 0; m < nqb; ++m, ++row) {
      if (!clear) continue;
      const std::vector<int32_t> g = testing::mask_row(gpu.mask, row), cp = testing::mask_row(cpu.mask, row);
      EXPECT_EQ(cp, brute.rows[row]) << "cpu, sequence " << h.seq << " head " << h.head << " block " << m;
      if (g != cp) {
        ADD_FAILURE() << "cuda against cpu, sequence " << h.seq << " head " << h.head << " query block " << m
                      << " (margin " << h.margin << ": js " << h.margin_js << " cover " << h.margin_cover << " top "
                      << h.margin_top << " aware " << h.margin_aware << "; aware " << h.aware << ", js " << h.js << ", budgets " << h.n_v
                      << "/" << h.n_s << "): cuda " << ::testing::PrintToString(g) << " cpu "
                      << ::testing::PrintToString(cp);
        return compared;
      }
    }
  }
  EXPECT_GE(double(compared), min_share * double(brute.heads.size()))
      << compared << " of " << brute.heads.size() << " heads clear of the decision margins";
  EXPECT_EQ(gpu.stats.kept_blocks, int64_t(gpu.mask.col_idx.size()));
  EXPECT_NEAR(gpu.stats.density, cpu.stats.density, compared == int(brute.heads.size()) ? 1e-12 : 0.05);
  EXPECT_EQ(gpu.stats.mac, cpu.stats.mac);
  return compared;
}

class CudaFlexPrefill : public CudaEstimate {};

TEST_F(CudaFlexPrefill, MatchesCpuAndThePlainRule) {
  // Two sequences, the second chunked (lq < lk), GQA 8:2; the JS threshold at 0 (no head is
  // query-aware), 10 (every head is) and the released 0.1; budgets below, inside and above the
  // γ counts; B 64 and 32 (probe rows off the 64-row tile).
  for (const DType dt : {DType::bf16, DType::f16, DType::f32}) {
    const Case cs = make_case(std::string("flex_") + dtype_name(dt), {700, 520}, {700, 901}, 8, 2, 64, dt);
    const Inputs in = testing::make_inputs(cs);
    const OnDevice d = upload(in);
    for (const int64_t block : {64, 32})
      for (const double js : {0.0, 0.1, 10.0})
        for (const auto& [minb, maxb] : {std::pair<int64_t, int64_t>{0, 0}, {128, 0}, {64, 256}})
          for (const double gamma : {0.5, 0.95}) {
            if (dt != DType::bf16 && (block != 64 || minb != 0)) continue;  // the full sweep on bf16
            check_flex(cs, in, d, flex_config(block, gamma, js, minb, maxb),
                       std::string(dtype_name(dt)) + " B " + std::to_string(block) + " js " + std::to_string(js) +
                           " budgets " + std::to_string(minb) + "/" + std::to_string(maxb) + " gamma " +
                           std::to_string(gamma));
          }
  }
}

TEST_F(CudaFlexPrefill, ShortInputsRunDenseBesideProbedOnes) {
  // lq <= max(2B, min budget) keeps every visible block; a longer sequence in the same batch is
  // probed. Odd head dim, GQA 6:3.
  const Case cs = make_case("flex_short", {60, 900, 130}, {}, 6, 3, 72, DType::bf16);
  const Inputs in = testing::make_inputs(cs);
  const OnDevice d = upload(in);
  EstimateConfig c = flex_config(64, 0.9, 0.1, 0);
  check_flex(cs, in, d, c, "min budget 0");
  c.flex_min_budget = 1024;  // every sequence is short now
  c.host_copy = true;
  const EstimateResult r = estimate(d.qv, d.kv, d.layout, c, Backend::cuda);
  EXPECT_EQ(r.stats.density, 1.0);
}

TEST_F(CudaFlexPrefill, ProtectionsAreOredIn) {
  const Case cs = make_case("flex_protect", {800}, {}, 4, 4, 64, DType::bf16);
  const Inputs in = testing::make_inputs(cs);
  const OnDevice d = upload(in);
  EstimateConfig c = flex_config(64, 0.5, 0.0, 0);
  c.protect = Protections{true, true, true};
  c.host_copy = true;
  const EstimateResult cpu = estimate(in.params.q, in.params.k, in.params.pattern, c, Backend::cpu);
  const EstimateResult gpu = estimate(d.qv, d.kv, d.layout, c, Backend::cuda);
  const int64_t nqb = (800 + 63) / 64;
  for (int h = 0; h < 4; ++h)
    for (int64_t m = 0; m < nqb; ++m) {
      const std::vector<int32_t> l = testing::mask_row(gpu.mask, size_t(h * nqb + m));
      ASSERT_FALSE(l.empty());
      EXPECT_EQ(l.front(), 0);
      EXPECT_EQ(l.back(), int32_t(m));
      if (m == nqb - 1) {
        EXPECT_EQ(l.size(), size_t(nqb));
      }
    }
  // Where the rule itself is clear, the device equals the CPU row for row.
  const testing::FlexBrute brute = testing::brute_flex(in, cs, c);
  for (int h = 0; h < 4; ++h)
    if (brute.heads[size_t(h)].margin > kMargin) {
      for (int64_t m = 0; m < nqb; ++m) {
        EXPECT_EQ(testing::mask_row(gpu.mask, size_t(h * nqb + m)), testing::mask_row(cpu.mask, size_t(h * nqb + m)));
      }
    }
}

TEST_F(CudaFlexPrefill, FindsPlantedVerticalAndSlashHeads) {
  // Head 0 a vertical line at key 200, head 1 a slash at distance 100 (flexprefill_brute.hpp).
  Case cs = make_case("flex_planted", {640}, {}, 2, 2, 32, DType::f32);
  cs.input_scale = 0.1f;
  Inputs in = testing::make_inputs(cs);
  testing::plant_vertical_and_slash(in);
  const OnDevice d = upload(in);
  EstimateConfig c = flex_config(32, 0.9, 0.0, 64);
  c.host_copy = true;
  const EstimateResult r = estimate(d.qv, d.kv, d.layout, c, Backend::cuda);
  const int64_t nqb = 20;
  for (int64_t m = 200 / 32; m < nqb; ++m) {
    const std::vector<int32_t> l = testing::mask_row(r.mask, size_t(m));
    EXPECT_EQ(std::count(l.begin(), l.end(), int32_t(200 / 32)), 1) << "query block " << m;
  }
  for (int64_t m = 100 / 32 + 1; m < nqb; ++m) {
    const std::vector<int32_t> l = testing::mask_row(r.mask, size_t(nqb + m));
    EXPECT_EQ(std::count(l.begin(), l.end(), int32_t(m - 3)), 1) << "query block " << m;
  }
  EXPECT_LT(r.stats.density_per_head[0], 0.5);
  EXPECT_LT(r.stats.density_per_head[1], 0.5);
  check_flex(cs, in, d, flex_config(32, 0.9, 0.0, 64), "planted");
}

TEST_F(CudaFlexPrefill, LlamaShapeBlock128) {
  // 32 query / 8 KV heads, d 128, bf16, B 128, the released defaults (γ 0.95, τ 0.1, min budget
  // 1024): the shape of the device benchmark.
  const Case cs = make_case("flex_llama", {3000}, {}, 32, 8, 128, DType::bf16);
  const Inputs in = testing::make_inputs(cs);
  const OnDevice d = upload(in);
  check_flex(cs, in, d, flex_config(128, 0.95, 0.1, 1024), "released defaults");
}

TEST_F(CudaFlexPrefill, RefusalNamesTheReason) {
  // A KV group of 64 heads of dim 256 needs 64 KiB of mean queries in the map kernel.
  const Case cs = make_case("flex_refuse", {300}, {}, 64, 1, 256, DType::bf16);
  const Inputs in = testing::make_inputs(cs);
  const OnDevice d = upload(in);
  try {
    estimate(d.qv, d.kv, d.layout, flex_config(64, 0.9, 0.1, 0), Backend::cuda);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KV group of 64 heads of dim 256"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ariadne
