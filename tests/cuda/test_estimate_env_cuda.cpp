// The estimators read no routing switch from the environment: the variables that used to pick a
// scoring kernel or build (ARIADNE_EST_V2, ARIADNE_EST_V3, ARIADNE_EST_V3_KIND, ARIADNE_EST_V3_FAST,
// ARIADNE_EST_F32, ARIADNE_EST_SUMS_SCALAR), set to values that once changed the route, leave the
// kernel that runs and the scores, bit for bit, as they are without them. Kernels are chosen by
// EstimateConfig (overrides, cuda_exact_scoring, cuda_f32_scoring) only. This is the one file of the
// estimator tests that touches the environment, and it restores what it changed.
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ariadne/estimate.hpp"
#include "common.hpp"
#include "cuda/cuda_common.hpp"
#include "cuda/estimate_cuda_common.hpp"

namespace ariadne {
namespace {

using namespace estimate_testing;

// Sets (or, with nullptr, unsets) the variables for its lifetime, then puts back what was there.
class ScopedEnvironment {
 public:
  explicit ScopedEnvironment(const std::vector<std::pair<const char*, const char*>>& vars) {
    for (const auto& [name, value] : vars) {
      const char* old = std::getenv(name);
      saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
      if (value) setenv(name, value, 1);
      else unsetenv(name);
    }
  }
  ~ScopedEnvironment() {
    for (const auto& [name, old] : saved_) {
      if (old) setenv(name, old->c_str(), 1);
      else unsetenv(name);
    }
  }
  ScopedEnvironment(const ScopedEnvironment&) = delete;
  ScopedEnvironment& operator=(const ScopedEnvironment&) = delete;

 private:
  std::vector<std::pair<const char*, std::optional<std::string>>> saved_;
};

constexpr const char* kOldSwitches[] = {"ARIADNE_EST_V2",      "ARIADNE_EST_V3",  "ARIADNE_EST_V3_KIND",
                                        "ARIADNE_EST_V3_FAST", "ARIADNE_EST_F32", "ARIADNE_EST_SUMS_SCALAR"};

TEST_F(CudaEstimate, OldEnvironmentSwitchesChangeNothing) {
  std::vector<std::pair<const char*, const char*>> unset;
  for (const char* name : kOldSwitches) unset.emplace_back(name, nullptr);
  // Values that once forced another kernel or build: the generic kernel, the f32 kernel, the
  // scalar sums (first); the 128-row grouped kernel and other wgmma builds (second, third).
  const std::vector<std::vector<std::pair<const char*, const char*>>> settings = {
      {{"ARIADNE_EST_V2", "0"}, {"ARIADNE_EST_V3", "0"}, {"ARIADNE_EST_F32", "1"}, {"ARIADNE_EST_SUMS_SCALAR", "1"}},
      {{"ARIADNE_EST_V2", "1"}, {"ARIADNE_EST_V3", "1"}, {"ARIADNE_EST_V3_KIND", "narrow"}, {"ARIADNE_EST_V3_FAST", "1"}},
      {{"ARIADNE_EST_V3_FAST", "3"}, {"ARIADNE_EST_F32", "0"}},
  };
  struct Run {
    const char* name;
    int dim;
    DType dt;
    Estimator e;
    bool exact;
  };
  const Run runs[] = {{"wgmma approx", 128, DType::bf16, Estimator::rr, false},
                      {"wgmma exact", 128, DType::bf16, Estimator::rr, true},
                      {"grouped", 64, DType::bf16, Estimator::rr, false},
                      {"rr f16", 128, DType::f16, Estimator::rr, false},
                      {"xattn", 128, DType::bf16, Estimator::xattn, false}};
  for (const Run& run : runs) {
    SCOPED_TRACE(run.name);
    const Inputs in = testing::make_inputs(make_case(std::string("env-") + run.name, {1100}, {}, 8, 2, run.dim, run.dt));
    const OnDevice d = upload(in);
    EstimateConfig c;
    c.method = run.e;
    c.cuda_exact_scoring = run.exact;
    EstimateResult want;
    {
      const ScopedEnvironment clean(unset);
      want = estimate(d.qv, d.kv, d.layout, c, Backend::cuda);
    }
    for (size_t i = 0; i < settings.size(); ++i) {
      SCOPED_TRACE("setting " + std::to_string(i));
      const ScopedEnvironment clean(unset);
      const ScopedEnvironment set(settings[i]);
      const EstimateResult got = estimate(d.qv, d.kv, d.layout, c, Backend::cuda);
      EXPECT_EQ(cuda_scoring_name(got.stats.scoring), std::string(cuda_scoring_name(want.stats.scoring)));
      ASSERT_EQ(got.scores.size(), want.scores.size());
      EXPECT_EQ(std::memcmp(got.scores.data(), want.scores.data(), got.scores.size() * sizeof(float)), 0)
          << "scores differ under the old switches";
      EXPECT_TRUE(got.mask.row_ptr == want.mask.row_ptr && got.mask.col_idx == want.mask.col_idx);
    }
  }
}

}  // namespace
}  // namespace ariadne
