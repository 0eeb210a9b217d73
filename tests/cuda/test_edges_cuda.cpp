// Numerical edges on the CUDA backend that are not comparisons with the reference: a NaN in one
// query poisons that row only (docs/numerics.md, "Non-finite inputs"). The edges that compare with
// the reference (fully masked rows, logits near ±1e4, sinks ±10 and ±inf, one-token and decode
// shapes, every head dim) are rows of the case table (tests/cases.hpp), run on the device by
// tests/cuda/test_cases_cuda.cpp, the same harness as the CPU's. A case the backend declines
// (backend_supports) is skipped with its reason. Small shapes: scripts/device-check also runs this
// suite under compute-sanitizer.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ariadne/attention.hpp"
#include "ariadne/device.hpp"
#include "common.hpp"
#include "cuda_common.hpp"

namespace ariadne {
namespace {

using testing::Case;
using testing::Inputs;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct HostOut {
  Buffer out, lse;
};

// Runs `in` on the device (f32 out, NaN-poisoned) and returns host copies; false when unsupported.
bool run_cuda(const Inputs& in, HostOut* r, std::string* why) {
  cuda_testing::DeviceCase d = cuda_testing::upload(in);
  DeviceBuffer out(DType::f32, {in.total_q, in.params.heads_q(), in.params.head_dim()});
  DeviceBuffer lse(DType::f32, {in.params.heads_q(), in.total_q});
  out.fill_bytes(0xFF);
  lse.fill_bytes(0xFF);
  d.p.out = out.view();
  d.p.lse = lse.view();
  // Asked only once out and lse are set: without them the backend rightly declines every call,
  // and the edge tests would all have skipped.
  if (!backend_supports(Backend::cuda, d.p, why)) return false;
  attention(d.p, Backend::cuda);
  cuda_synchronize();
  r->out = out.to_host();
  r->lse = lse.to_host();
  return true;
}

Case edge_case(const std::string& name, std::vector<int64_t> sq, std::vector<int64_t> sk, Pattern pat, int dim = 64,
               DType dt = DType::bf16) {
  Case c;
  c.name = name;
  c.seq_q = std::move(sq);
  c.seq_k = std::move(sk);
  c.heads_q = 4;
  c.heads_kv = 2;
  c.dim = dim;
  c.dtype = dt;
  c.pattern = pat;
  c.seed = 23;
  return c;
}

#define RUN_OR_SKIP(in, out)                       \
  do {                                             \
    std::string why_;                              \
    if (!run_cuda(in, &out, &why_)) GTEST_SKIP() << why_; \
  } while (0)

TEST(CudaEdges, NaNInQueryPoisonsOnlyItsRow) {
  Inputs in = make_inputs(edge_case("nan-q", {80, 50}, {80, 50}, Pattern::full()));
  in.params.q.set({7, 1, 0}, kNaN);
  HostOut got;
  RUN_OR_SKIP(in, got);
  const int64_t hq = in.params.heads_q(), d = in.params.head_dim();
  for (int64_t t = 0; t < in.total_q; ++t)
    for (int64_t h = 0; h < hq; ++h) {
      const bool bad = t == 7 && h == 1;
      const float l = got.lse.as<float>()[h * in.total_q + t];
      EXPECT_EQ(std::isnan(l), bad) << "token " << t << " head " << h << " lse " << l;
      for (int64_t c = 0; c < d; ++c) {
        const float o = got.out.as<float>()[(t * hq + h) * d + c];
        if (bad) {
          EXPECT_TRUE(std::isnan(o)) << "token " << t << " head " << h;
        } else {
          ASSERT_TRUE(std::isfinite(o)) << "token " << t << " head " << h << " channel " << c;
        }
      }
    }
}

}  // namespace
}  // namespace ariadne
