// Numerical edges on every host backend that are identities rather than comparisons with the
// reference: logits shifted by ±1e4, the sinks' limits, NaN/Inf inputs (the propagation rule of
// docs/numerics.md, "Non-finite inputs"), no queries or no keys at all, one query on one key, and
// 64-bit offsets (token stride × tokens beyond 2^31 elements). Parametrized over Backend::reference
// and Backend::cpu; a backend that says it cannot run a case (backend_supports) skips it with its
// reason. The edge cases that compare with the reference (fully masked rows, sinks ±10 and ±inf,
// one-token and decode shapes, head dims 1 to 512) are rows of the case table (tests/cases.hpp).
#include <sys/mman.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common.hpp"

namespace ariadne {
namespace {

using testing::Case;
using testing::Inputs;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct Out {
  Buffer out, lse;
};

// Runs `src` on `b` into fresh f32 out/lse poisoned with NaN (every element must be written).
Out run_on(const AttentionParams& src, Backend b) {
  Out r;
  const int64_t tq = src.q.shape[0], hq = src.q.shape[1], d = src.q.shape[2];
  r.out = Buffer(DType::f32, {tq, hq, d});
  r.lse = Buffer(DType::f32, {hq, tq});
  r.out.fill(kNaN);
  r.lse.fill(kNaN);
  AttentionParams p = src;
  p.out = r.out.view();
  p.lse = r.lse.view();
  attention(p, b);
  return r;
}

bool row_all(const Buffer& out, int64_t row, int h, bool (*pred)(float)) {
  const int64_t hq = out.shape()[1], d = out.shape()[2];
  const float* o = out.as<float>() + (row * hq + h) * d;
  for (int64_t c = 0; c < d; ++c)
    if (!pred(o[c])) return false;
  return true;
}
bool is_zero(float x) { return x == 0.f; }
bool is_nan(float x) { return std::isnan(x); }
bool is_finite(float x) { return std::isfinite(x); }

class Edges : public ::testing::TestWithParam<Backend> {
 protected:
  // False (and the test should return) when the backend cannot run p; the reason is recorded.
  bool supported(const AttentionParams& p) {
    std::string why;
    if (backend_supports(GetParam(), p, &why)) return true;
    skipped_ = why;
    return false;
  }
  std::string skipped_;
};

#define REQUIRE_SUPPORTED(p)                          \
  do {                                                \
    if (!supported(p)) GTEST_SKIP() << skipped_;      \
  } while (0)

Case small_case(const char* name, std::vector<int64_t> sq, std::vector<int64_t> sk, Pattern pat) {
  Case c;
  c.name = name;
  c.seq_q = std::move(sq);
  c.seq_k = std::move(sk);
  c.heads_q = 4;
  c.heads_kv = 2;
  c.dim = 16;
  c.pattern = pat;
  c.seed = 11;
  return c;
}

// ---------------------------------------------------------------- logits near ±1e4

// Shifting every logit of a row by the same constant leaves out unchanged and moves lse by it.
// The shift is built into the inputs: one extra dimension with q = A and k = B adds scale·A·B.
TEST_P(Edges, LogitsNear1e4) {
  for (const DType dt : {DType::f32, DType::bf16})
    for (const float shift : {1e4f, -1e4f}) {
      const int64_t n = 70, d = 16, hq = 2;
      Case c = small_case("shift", {n}, {}, Pattern::causal());
      c.heads_q = c.heads_kv = int(hq);
      c.dim = int(d);
      c.dtype = dt;
      Inputs base = make_inputs(c);
      base.params.scale = 0.25f;
      const float A = 100.f, B = shift / (0.25f * A);  // 100 and ±400: exact in bf16
      auto widen = [&](const TensorView& t, float extra) {
        Buffer b(dt, {t.shape[0], t.shape[1], d + 1});
        const TensorView v = b.view();
        for (int64_t i = 0; i < t.shape[0]; ++i)
          for (int64_t h = 0; h < t.shape[1]; ++h) {
            for (int64_t x = 0; x < d; ++x) v.set({i, h, x}, t.get({i, h, x}));
            v.set({i, h, d}, extra);
          }
        return b;
      };
      const Buffer q = widen(base.params.q, A), k = widen(base.params.k, B), v = widen(base.params.v, 0.f);
      AttentionParams p = base.params;
      p.q = q.view();
      p.k = k.view();
      p.v = v.view();
      REQUIRE_SUPPORTED(p);
      const Out ref = run_on(base.params, Backend::reference);  // small logits (|s| <= 4)
      const Out got = run_on(p, GetParam());
      // Compare the first d channels (the extra channel of v is 0 and so is its output).
      Buffer head(DType::f32, {n, hq, d});
      for (int64_t i = 0; i < n; ++i)
        for (int64_t h = 0; h < hq; ++h)
          for (int64_t x = 0; x < d; ++x) head.view().set({i, h, x}, got.out.view().get({i, h, x}));
      const std::string what = std::string(dtype_name(dt)) + " shift " + std::to_string(shift);
      EXPECT_TRUE(testing::close_enough(what.c_str(), testing::compare(head.view(), ref.out.view()),
                                        testing::tolerance(dt, std::abs(shift))));
      for (int64_t i = 0; i < hq * n; ++i) {
        const float l = got.lse.as<float>()[i], l0 = ref.lse.as<float>()[i];
        // fp32 spacing at 1e4 is 1e-3: lse is accurate to a few of those.
        EXPECT_NEAR(l - shift, l0, 1e-2) << what << ": lse entry " << i;
      }
    }
}

// ---------------------------------------------------------------- sinks ±10 and ±inf

// The sink's limits as identities (the table checks ±10 and ±inf against the reference): a
// denominator sink of −inf is the plain softmax, one of +inf takes all the mass (out 0, LSE +inf);
// a key-0 bias of −inf removes key 0, so query 0 of each causal sequence, which sees only key 0,
// becomes an empty row.
TEST_P(Edges, SinkLimits) {
  const Case c = small_case("sinks", {33, 20}, {33, 20}, Pattern::causal());
  const Inputs plain = make_inputs(c);
  REQUIRE_SUPPORTED(plain.params);
  const Out none = run_on(plain.params, Backend::reference);
  struct S {
    SinkMode mode;
    float value;
  };
  for (const S& s : {S{SinkMode::denominator, -kInf}, S{SinkMode::denominator, kInf}, S{SinkMode::key0_bias, -kInf}}) {
    Inputs in = make_inputs(c);
    in.sink = Buffer(DType::f32, {c.heads_q});
    in.sink.fill(s.value);
    in.params.sink_mode = s.mode;
    in.params.sink = in.sink.view();
    const std::string what = std::string(sink_mode_name(s.mode)) + (s.value > 0 ? " +inf" : " -inf");
    REQUIRE_SUPPORTED(in.params);
    const Out got = run_on(in.params, GetParam());
    const float* lse = got.lse.as<float>();
    const int64_t rows = in.total_q * c.heads_q;
    if (s.mode == SinkMode::denominator && s.value > 0) {
      for (int64_t i = 0; i < rows; ++i) EXPECT_EQ(lse[i], kInf) << what << ": lse entry " << i;
      for (int64_t i = 0; i < rows * c.dim; ++i) ASSERT_EQ(got.out.as<float>()[i], 0.f) << what << ": out " << i;
      continue;
    }
    if (s.mode == SinkMode::denominator) {
      EXPECT_TRUE(testing::close_enough(what.c_str(), testing::compare(got.out.view(), none.out.view()),
                                        testing::tolerance(c.dtype, testing::max_abs_logit(in))));
      EXPECT_TRUE(testing::lse_close(got.lse.view(), none.lse.view(), testing::tolerance(c.dtype, 10)));
      continue;
    }
    for (int h = 0; h < c.heads_q; ++h)
      for (const int64_t row : {int64_t(0), int64_t(33)}) {
        EXPECT_TRUE(row_all(got.out, row, h, is_zero)) << what << ": row " << row;
        EXPECT_TRUE(std::isinf(lse[h * in.total_q + row]) && lse[h * in.total_q + row] < 0) << what;
      }
  }
}

// ---------------------------------------------------------------- NaN / Inf inputs

// The rule (docs/numerics.md): non-finite values are not detected; a query row whose logits include
// NaN or +inf, or whose allowed keys carry a non-finite value, comes out non-finite; rows of other
// sequences (and other heads for q and the sink) are untouched.
TEST_P(Edges, NonFiniteInputsPropagate) {
  const Case c = small_case("nonfinite", {12, 9}, {12, 9}, Pattern::full());
  const int64_t seq1 = 12;  // first row of sequence 1
  struct Poison {
    const char* what;
    char tensor;  // 'q', 'k', 'v', 's' (sink)
    float value;
  };
  for (const Poison& z : {Poison{"q NaN", 'q', kNaN}, Poison{"q +inf", 'q', kInf}, Poison{"q -inf", 'q', -kInf},
                         Poison{"k NaN", 'k', kNaN}, Poison{"k +inf", 'k', kInf}, Poison{"v NaN", 'v', kNaN},
                         Poison{"v -inf", 'v', -kInf}, Poison{"sink NaN", 's', kNaN}}) {
    Inputs in = make_inputs(c);
    const int h = 1, g = h / (c.heads_q / c.heads_kv);  // head 1 reads KV head 0
    const int64_t row = 5;
    switch (z.tensor) {
      case 'q': in.params.q.set({row, h, 0}, z.value); break;
      case 'k': in.params.k.set({row, g, 0}, z.value); break;
      case 'v': in.params.v.set({row, g, 3}, z.value); break;
      case 's':
        in.sink = Buffer(DType::f32, {c.heads_q});
        in.sink.fill(0.5f);
        in.sink.as<float>()[h] = z.value;
        in.params.sink_mode = SinkMode::denominator;
        in.params.sink = in.sink.view();
        break;
    }
    // An infinite q or k component makes logits ±inf; with a random k, some are +inf.
    REQUIRE_SUPPORTED(in.params);
    const Out got = run_on(in.params, GetParam());
    const float* lse = got.lse.as<float>();
    for (int hh = 0; hh < c.heads_q; ++hh)
      for (int64_t r = 0; r < in.total_q; ++r) {
        bool bad;
        // k = +inf·e0 gives row r the logit +inf (NaN row) where q[r, hh, 0] >= 0 and -inf (key
        // dropped, row finite) where it is negative.
        const bool k_inf_dropped = z.tensor == 'k' && std::isinf(z.value) && in.params.q.get({r, hh, 0}) < 0;
        if (z.tensor == 'q') bad = hh == h && r == row;
        else if (k_inf_dropped) bad = false;
        else if (z.tensor == 's') bad = hh == h;
        else bad = hh / (c.heads_q / c.heads_kv) == g && r < seq1;
        const float l = lse[hh * in.total_q + r];
        if (!bad) {
          EXPECT_TRUE(row_all(got.out, r, hh, is_finite) && std::isfinite(l)) << z.what << ": clean row " << r
                                                                               << " head " << hh << " is not finite";
        } else if (z.tensor == 'v') {
          // Weights are finite; the poisoned value channel (3) goes non-finite, lse stays finite.
          const float o = got.out.as<float>()[(r * c.heads_q + hh) * c.dim + 3];
          EXPECT_FALSE(std::isfinite(o)) << z.what << ": row " << r << " head " << hh << " out " << o;
          EXPECT_TRUE(std::isfinite(l)) << z.what << ": row " << r;
        } else if (z.tensor == 'q' && z.value == -kInf) {
          // q = -inf·e0 gives logits ±inf too: some key has k0 < 0, its logit is +inf.
          EXPECT_TRUE(row_all(got.out, r, hh, is_nan) && std::isnan(l)) << z.what << ": row " << r;
        } else {
          EXPECT_TRUE(row_all(got.out, r, hh, is_nan)) << z.what << ": row " << r << " head " << hh;
          EXPECT_TRUE(std::isnan(l)) << z.what << ": row " << r << " head " << hh << " lse " << l;
        }
      }
  }
}

// ---------------------------------------------------------------- zero-length and one-token

TEST_P(Edges, ZeroLengthAndOneToken) {
  const int hq = 2, d = 8;
  float dummy[4] = {};
  std::vector<float> q(1 * hq * d), k(1 * hq * d), v(1 * hq * d);
  for (size_t i = 0; i < q.size(); ++i) {
    q[i] = 0.1f * float(i % 7) - 0.3f;
    k[i] = 0.05f * float(i % 5) + 0.1f;
    v[i] = float(i) - 4.f;
  }
  // No queries at all (out has no rows), and no keys at all (every row empty).
  {
    AttentionParams p;
    p.q = make_view(dummy, DType::f32, {0, hq, d});
    p.k = make_view(k.data(), DType::f32, {1, hq, d});
    p.v = make_view(v.data(), DType::f32, {1, hq, d});
    p.out = make_view(dummy, DType::f32, {0, hq, d});
    REQUIRE_SUPPORTED(p);
    EXPECT_NO_THROW(attention(p, GetParam()));
  }
  {
    AttentionParams p;
    p.q = make_view(q.data(), DType::f32, {1, hq, d});
    p.k = make_view(dummy, DType::f32, {0, hq, d});
    p.v = make_view(dummy, DType::f32, {0, hq, d});
    REQUIRE_SUPPORTED(p);
    const Out r = run_on(p, GetParam());
    for (int h = 0; h < hq; ++h) {
      EXPECT_TRUE(row_all(r.out, 0, h, is_zero)) << "no keys: head " << h;
      EXPECT_EQ(r.lse.as<float>()[h], -kInf) << "no keys: head " << h;
    }
  }
  // One query, one key: weight 1, out = v, lse = the logit.
  {
    AttentionParams p;
    p.q = make_view(q.data(), DType::f32, {1, hq, d});
    p.k = make_view(k.data(), DType::f32, {1, hq, d});
    p.v = make_view(v.data(), DType::f32, {1, hq, d});
    for (const Pattern& pat : {Pattern::full(), Pattern::causal(), Pattern::window(0, 0), Pattern::chunked(1)}) {
      p.pattern = pat;
      REQUIRE_SUPPORTED(p);
      const Out r = run_on(p, GetParam());
      for (int h = 0; h < hq; ++h) {
        double s = 0;
        for (int x = 0; x < d; ++x) s += double(q[size_t(h * d + x)]) * k[size_t(h * d + x)];
        s /= std::sqrt(double(d));
        EXPECT_NEAR(r.lse.as<float>()[h], s, 1e-6) << describe(pat) << " head " << h;
        for (int x = 0; x < d; ++x)
          EXPECT_NEAR(r.out.as<float>()[h * d + x], v[size_t(h * d + x)], 1e-5) << describe(pat) << " head " << h;
      }
    }
  }
}

// ---------------------------------------------------------------- 64-bit offsets

// q, k, v and out are views with a token stride of 2^30 + 64 elements over one reserved (never
// committed) mapping: row 2 starts beyond element 2^31, so 32-bit offset math would read and write
// the wrong place (ASan / a mismatch shows it). Only the pages of the 3 rows are ever touched.
TEST_P(Edges, OffsetsBeyond32Bits) {
  const int64_t T = 3, hq = 2, d = 4, row = hq * d;  // 8 elements per tensor row
  const int64_t stride = (int64_t(1) << 30) + 64;
  ASSERT_GT(stride * (T - 1), int64_t(1) << 31);
  const size_t bytes = size_t(stride * (T - 1) + 4 * row) * sizeof(float);
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mem == MAP_FAILED) GTEST_SKIP() << "cannot reserve " << bytes << " bytes of address space";
  struct Unmap {
    void* p;
    size_t n;
    ~Unmap() { munmap(p, n); }
  } unmap{mem, bytes};
  float* base = static_cast<float*>(mem);
  auto view = [&](int slot) {
    TensorView t = make_view(base + slot * row, DType::f32, {T, hq, d});
    t.stride[0] = stride;
    return t;
  };
  // Compact copies for the expected result.
  std::vector<float> q(size_t(T * row)), k(q.size()), v(q.size());
  for (int64_t i = 0; i < T * row; ++i) {
    q[size_t(i)] = std::sin(0.7f * float(i));
    k[size_t(i)] = std::cos(0.3f * float(i));
    v[size_t(i)] = 0.1f * float(i);
  }
  AttentionParams big;
  big.q = view(0);
  big.k = view(1);
  big.v = view(2);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t x = 0; x < row; ++x) {
      base[t * stride + 0 * row + x] = q[size_t(t * row + x)];
      base[t * stride + 1 * row + x] = k[size_t(t * row + x)];
      base[t * stride + 2 * row + x] = v[size_t(t * row + x)];
      base[t * stride + 3 * row + x] = kNaN;  // out, poisoned
    }
  AttentionParams small;
  small.q = make_view(q.data(), DType::f32, {T, hq, d});
  small.k = make_view(k.data(), DType::f32, {T, hq, d});
  small.v = make_view(v.data(), DType::f32, {T, hq, d});
  const int32_t cu[3] = {0, 1, 3};
  for (const Pattern& pat : {Pattern::full(), Pattern::causal().with_varlen(2, cu)}) {
    big.pattern = small.pattern = pat;
    big.out = view(3);
    Buffer lse(DType::f32, {hq, T});
    big.lse = lse.view();
    REQUIRE_SUPPORTED(big);
    attention(big, GetParam());
    const Out ref = run_on(small, Backend::reference);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t x = 0; x < row; ++x)
        EXPECT_NEAR(base[t * stride + 3 * row + x], ref.out.as<float>()[t * row + x], 1e-5)
            << describe(pat) << ": token " << t << " element " << x;
    for (int64_t i = 0; i < hq * T; ++i) EXPECT_NEAR(lse.as<float>()[i], ref.lse.as<float>()[i], 1e-5) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Edges, ::testing::Values(Backend::reference, Backend::cpu),
                         [](const ::testing::TestParamInfo<Backend>& i) { return std::string(backend_name(i.param)); });

}  // namespace
}  // namespace ariadne
