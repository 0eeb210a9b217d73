// Shared test helpers (see common.hpp).
#include "common.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <system_error>

namespace ariadne::testing {

namespace {

// A [tokens, heads, dim] view into a buffer whose rows are `pad` elements wider than heads·dim.
TensorView padded_view(const Buffer& b, int64_t tokens, int heads, int dim, int64_t pad) {
  TensorView t = make_view(b.data(), b.dtype(), {tokens, heads, dim});
  t.stride[0] = int64_t(heads) * dim + pad;
  return t;
}

Buffer random_rows(DType dt, int64_t tokens, int heads, int dim, int64_t pad, uint64_t seed, float scale) {
  Buffer b(dt, {tokens, int64_t(heads) * dim + pad});
  b.fill_random(seed, -scale, scale);
  return b;
}

}  // namespace

Inputs make_inputs(const Case& c) {
  Inputs in;
  const std::vector<int64_t>& sq = c.seq_q;
  const std::vector<int64_t>& sk = c.seq_k.empty() ? c.seq_q : c.seq_k;
  EXPECT_EQ(sq.size(), sk.size()) << c.name << ": seq_q and seq_k differ in length";
  in.cu_q.push_back(0);
  in.cu_k.push_back(0);
  for (size_t i = 0; i < sq.size(); ++i) {
    in.cu_q.push_back(in.cu_q.back() + int32_t(sq[i]));
    in.cu_k.push_back(in.cu_k.back() + int32_t(sk[i]));
  }
  in.total_q = in.cu_q.back();
  in.total_k = in.cu_k.back();
  const uint64_t seed = c.seed * 0x9E3779B97F4A7C15ull;
  in.q = random_rows(c.dtype, in.total_q, c.heads_q, c.dim, c.token_pad, seed + 1, c.input_scale);
  in.k = random_rows(c.dtype, in.total_k, c.heads_kv, c.dim, c.token_pad, seed + 2, c.input_scale);
  in.v = random_rows(c.dtype, in.total_k, c.heads_kv, c.dim, c.token_pad, seed + 3, 1.f);

  AttentionParams& p = in.params;
  p.q = padded_view(in.q, in.total_q, c.heads_q, c.dim, c.token_pad);
  p.k = padded_view(in.k, in.total_k, c.heads_kv, c.dim, c.token_pad);
  p.v = padded_view(in.v, in.total_k, c.heads_kv, c.dim, c.token_pad);
  p.pattern = c.pattern;
  if (sq.size() > 1) p.pattern = p.pattern.with_varlen(int32_t(sq.size()), in.cu_q.data(), in.cu_k.data());

  if (c.block_density > 0) {
    in.mask = BlockMask::random(p.pattern, c.block, c.heads_q, in.total_q, in.total_k, c.block_density, seed + 4,
                                /*keep_diagonal=*/false);
    p.pattern = p.pattern.with_blocks(in.mask.view());
  }

  p.sink_mode = c.sink_mode;
  if (c.sink_mode != SinkMode::none) {
    in.sink = Buffer(DType::f32, {c.heads_q});
    if (std::isnan(c.sink_value)) in.sink.fill_random(seed + 5, -3.f, 3.f);
    else in.sink.fill(c.sink_value);
    p.sink = in.sink.view();
  }
  return in;
}

Result run_reference(const Inputs& in) {
  Result r;
  const AttentionParams& src = in.params;
  r.out = Buffer(DType::f32, {in.total_q, src.q.shape[1], src.q.shape[2]});
  r.lse = Buffer(DType::f32, {src.q.shape[1], in.total_q});
  r.out.fill(std::numeric_limits<float>::quiet_NaN());
  r.lse.fill(std::numeric_limits<float>::quiet_NaN());
  AttentionParams p = src;
  p.out = r.out.view();
  p.lse = r.lse.view();
  attention(p, Backend::reference);
  return r;
}

double max_abs_logit(const Inputs& in) {
  auto maxabs = [](const TensorView& t) {
    double m = 0;
    for (int64_t i = 0; i < t.shape[0]; ++i)
      for (int64_t h = 0; h < t.shape[1]; ++h)
        for (int64_t c = 0; c < t.shape[2]; ++c) m = std::max(m, double(std::abs(t.get({i, h, c}))));
    return m;
  };
  const AttentionParams& p = in.params;
  return p.resolved_scale() * maxabs(p.q) * maxabs(p.k) * double(p.head_dim());
}

double tolerance(DType dtype, double max_abs_logit) {
  // docs/numerics.md: a base per dtype (fp32 accumulation; for 16-bit types the rounding of the
  // probabilities and of the output), plus a term for the absolute rounding of large logits.
  const double base = dtype == DType::f32 ? 2e-5 : dtype == DType::bf16 ? 1e-2 : 4e-3;
  return base + 1e-6 * max_abs_logit;
}

Diff compare(const TensorView& out, const TensorView& ref) {
  Diff d;
  double num = 0, den = 0;
  const int64_t n0 = out.shape[0], n1 = out.rank > 1 ? out.shape[1] : 1, n2 = out.rank > 2 ? out.shape[2] : 1;
  for (int64_t i = 0; i < n0; ++i)
    for (int64_t j = 0; j < n1; ++j)
      for (int64_t c = 0; c < n2; ++c) {
        const double o = out.rank == 3 ? out.get({i, j, c}) : out.rank == 2 ? out.get({i, j}) : out.get({i});
        const double r = ref.rank == 3 ? ref.get({i, j, c}) : ref.rank == 2 ? ref.get({i, j}) : ref.get({i});
        if (!std::isfinite(o) || !std::isfinite(r)) {
          if (!(std::isinf(o) && std::isinf(r) && (o > 0) == (r > 0))) ++d.nonfinite;
          continue;
        }
        num += (o - r) * (o - r);
        den += r * r;
        d.max_abs = std::max(d.max_abs, std::abs(o - r));
        d.ref_max = std::max(d.ref_max, std::abs(r));
      }
  d.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return d;
}

::testing::AssertionResult close_enough(const char* what, const Diff& d, double tol) {
  if (d.nonfinite > 0)
    return ::testing::AssertionFailure() << what << ": " << d.nonfinite << " non-finite or unwritten elements";
  if (d.rel_l2 > tol)
    return ::testing::AssertionFailure() << what << ": relative L2 error " << d.rel_l2 << " > tolerance " << tol;
  const double abs_bound = 10 * tol * std::max(d.ref_max, 1e-3);
  if (d.max_abs > abs_bound)
    return ::testing::AssertionFailure() << what << ": max abs error " << d.max_abs << " > " << abs_bound
                                         << " (10·tol·max|ref|)";
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult lse_close(const TensorView& lse, const TensorView& ref, double tol) {
  for (int64_t h = 0; h < ref.shape[0]; ++h)
    for (int64_t i = 0; i < ref.shape[1]; ++i) {
      const double o = lse.get({h, i}), r = ref.get({h, i});
      if (std::isinf(r) && r < 0) {
        if (!(std::isinf(o) && o < 0))
          return ::testing::AssertionFailure() << "lse[" << h << "," << i << "] = " << o << ", expected -inf";
        continue;
      }
      if (!std::isfinite(o) || std::abs(o - r) > tol * std::max(1.0, std::abs(r)))
        return ::testing::AssertionFailure() << "lse[" << h << "," << i << "] = " << o << ", reference " << r
                                             << " (tol " << tol << ")";
    }
  return ::testing::AssertionSuccess();
}

std::vector<int64_t> random_cuts(std::mt19937_64& rng, int64_t len, int64_t align, int n) {
  std::vector<int64_t> at{0, len};
  for (int i = 1; i < n; ++i) at.push_back(int64_t(rng() % uint64_t(std::max<int64_t>(len / align, 1))) * align);
  std::sort(at.begin(), at.end());
  at.erase(std::unique(at.begin(), at.end()), at.end());
  return at;
}

TempDir::TempDir(const std::string& prefix) {
  std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
  if (::mkdtemp(tmpl.data()) == nullptr)
    throw std::runtime_error("mkdtemp(" + tmpl + "): " + std::strerror(errno));
  dir_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;  // a folder that cannot be removed is left behind, not an exception at exit
  std::filesystem::remove_all(dir_, ec);
}

}  // namespace ariadne::testing
