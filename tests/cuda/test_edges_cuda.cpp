// Numerical edges on the CUDA backend (issue 10), the device twin of tests/cpu/test_edges.cpp:
// fully masked rows, logits near ±1e4, sinks ±10 and ±inf, NaN/Inf propagation (docs/numerics.md),
// zero-length and one-token sequences, every head dim the backend supports. Each case runs on the
// device and on the CPU reference with the same stored inputs; a case the backend declines
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

constexpr float kInf = std::numeric_limits<float>::infinity();
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

HostOut run_ref(const Inputs& in) {
  const testing::Result r = testing::run_reference(in);
  HostOut h;
  h.out = Buffer(DType::f32, {in.total_q, in.params.heads_q(), in.params.head_dim()});
  h.lse = Buffer(DType::f32, {in.params.heads_q(), in.total_q});
  std::copy_n(r.out.as<float>(), r.out.numel(), h.out.as<float>());
  std::copy_n(r.lse.as<float>(), r.lse.numel(), h.lse.as<float>());
  return h;
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

// Device result against the reference: tolerance rule, and -inf / +inf / NaN LSE entries and
// all-zero rows exactly where the reference has them.
void expect_matches(const Inputs& in, const HostOut& got, const HostOut& ref, const std::string& what, double extra = 0) {
  const double tol = testing::tolerance(in.params.q.dtype, testing::max_abs_logit(in) + extra);
  const int64_t rows = in.total_q * in.params.heads_q(), d = in.params.head_dim();
  bool finite_ref = true;
  for (int64_t i = 0; i < rows; ++i) {
    const float g = got.lse.as<float>()[i], r = ref.lse.as<float>()[i];
    if (!std::isfinite(r)) {
      finite_ref = false;
      if (std::isnan(r)) {
        EXPECT_TRUE(std::isnan(g)) << what << ": lse entry " << i;
      } else {
        EXPECT_EQ(g, r) << what << ": lse entry " << i;
      }
    }
  }
  // Rows the reference leaves all zero (masked rows, a +inf sink) must be exact zeros on the device.
  for (int64_t row = 0; row < rows; ++row) {
    bool zero_ref = true, zero_got = true;
    for (int64_t c = 0; c < d; ++c) {
      zero_ref = zero_ref && ref.out.as<float>()[row * d + c] == 0.f;
      zero_got = zero_got && got.out.as<float>()[row * d + c] == 0.f;
    }
    if (zero_ref) {
      EXPECT_TRUE(zero_got) << what << ": out row " << row << " (token-major) should be all zero";
    }
  }
  if (finite_ref) {
    EXPECT_TRUE(testing::close_enough(what.c_str(), testing::compare(got.out.view(), ref.out.view()), tol));
    EXPECT_TRUE(testing::lse_close(got.lse.view(), ref.lse.view(), tol));
  } else {
    // Compare finite reference entries only (out rows whose lse is finite).
    const int64_t hq = in.params.heads_q();
    for (int64_t t = 0; t < in.total_q; ++t)
      for (int64_t h = 0; h < hq; ++h) {
        const float r = ref.lse.as<float>()[h * in.total_q + t];
        if (!std::isfinite(r)) continue;
        EXPECT_NEAR(got.lse.as<float>()[h * in.total_q + t], r, tol * std::max(1.f, std::abs(r))) << what;
        for (int64_t c = 0; c < d; ++c) {
          const float rv = ref.out.as<float>()[(t * hq + h) * d + c], gv = got.out.as<float>()[(t * hq + h) * d + c];
          EXPECT_NEAR(gv, rv, 10 * tol * std::max(1.f, std::abs(rv))) << what << ": token " << t << " head " << h;
        }
      }
  }
}

#define RUN_OR_SKIP(in, out)                       \
  do {                                             \
    std::string why_;                              \
    if (!run_cuda(in, &out, &why_)) GTEST_SKIP() << why_; \
  } while (0)

TEST(CudaEdges, FullyMaskedRows) {
  for (Case c : {edge_case("masked", {70, 65, 0, 3}, {40, 0, 3, 3}, Pattern::causal()),
                 edge_case("masked-blocks", {200, 9}, {200, 9}, Pattern::causal())}) {
    if (c.name == "masked-blocks") {
      c.block_density = 0.2;
      c.block = 64;
    }
    for (const float sink : {kNaN, 2.5f}) {  // NaN here: no sink
      Inputs in = make_inputs(c);
      if (!std::isnan(sink)) {
        in.sink = Buffer(DType::f32, {c.heads_q});
        in.sink.fill(sink);
        in.params.sink_mode = SinkMode::denominator;
        in.params.sink = in.sink.view();
      }
      HostOut got;
      RUN_OR_SKIP(in, got);
      expect_matches(in, got, run_ref(in), c.name + (std::isnan(sink) ? "" : " + sink"));
    }
  }
}

TEST(CudaEdges, LogitsNear1e4) {
  // The logit shift rides on channel 0: q[.,.,0] = 100, k[.,.,0] = ±400 with scale 1/4 adds ±1e4
  // to every logit of a row (bf16 holds both exactly); the reference sees the same stored inputs.
  for (const float shift : {1e4f, -1e4f}) {
    Inputs in = make_inputs(edge_case("shift", {130}, {}, Pattern::causal()));
    in.params.scale = 0.25f;
    for (int64_t t = 0; t < in.total_q; ++t)
      for (int h = 0; h < in.params.heads_q(); ++h) in.params.q.set({t, h, 0}, 100.f);
    for (int64_t t = 0; t < in.total_k; ++t)
      for (int h = 0; h < in.params.heads_kv(); ++h) in.params.k.set({t, h, 0}, shift / 25.f);
    HostOut got;
    RUN_OR_SKIP(in, got);
    expect_matches(in, got, run_ref(in), "shift " + std::to_string(shift));
  }
}

TEST(CudaEdges, Sinks) {
  struct S {
    SinkMode mode;
    float value;
  };
  for (const S& s : {S{SinkMode::denominator, 10.f}, S{SinkMode::denominator, -10.f}, S{SinkMode::denominator, kInf},
                    S{SinkMode::denominator, -kInf}, S{SinkMode::key0_bias, 10.f}, S{SinkMode::key0_bias, -10.f},
                    S{SinkMode::key0_bias, -kInf}}) {
    Inputs in = make_inputs(edge_case("sinks", {100, 33}, {100, 33}, Pattern::causal()));
    in.sink = Buffer(DType::f32, {in.params.heads_q()});
    in.sink.fill(s.value);
    in.params.sink_mode = s.mode;
    in.params.sink = in.sink.view();
    HostOut got;
    RUN_OR_SKIP(in, got);
    expect_matches(in, got, run_ref(in), std::string(sink_mode_name(s.mode)) + " " + std::to_string(s.value), 10);
  }
}

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

TEST(CudaEdges, ZeroLengthAndOneToken) {
  for (const Case& c : {edge_case("ones", {1, 1, 0, 1}, {1, 1, 1, 0}, Pattern::causal()),
                        edge_case("decode", {1, 1}, {300, 7}, Pattern::causal()),
                        edge_case("decode-window", {1}, {300}, Pattern::window(16, 0)),
                        edge_case("one", {1}, {1}, Pattern::full(), 64, DType::f16)}) {
    const Inputs in = make_inputs(c);
    HostOut got;
    RUN_OR_SKIP(in, got);
    expect_matches(in, got, run_ref(in), c.name);
  }
}

TEST(CudaEdges, EveryHeadDim) {
  int ran = 0;
  for (const int d : {32, 64, 80, 96, 128, 256}) {
    // Built with append, not "d" + std::string: GCC 12 at -O3 raises a false -Wrestrict there.
    const std::string name = std::string("d").append(std::to_string(d));
    const Inputs in = make_inputs(edge_case(name, {77, 130}, {77, 130}, Pattern::causal(), d));
    HostOut got;
    std::string why;
    if (!run_cuda(in, &got, &why)) continue;  // head dims without a kernel are declined, not crashed
    ++ran;
    expect_matches(in, got, run_ref(in), in.params.q.describe());
  }
  EXPECT_GT(ran, 0) << "no head dim ran";
}

}  // namespace
}  // namespace ariadne
