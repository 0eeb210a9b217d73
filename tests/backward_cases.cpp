#include "backward_cases.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

namespace ariadne::testing {
namespace {

bool has(const Buffer& b) { return b.data() != nullptr; }

Buffer converted(const Buffer& src, DType dt) {
  Buffer b(dt, src.shape());
  const TensorView from = src.view(), to = b.view();
  const int64_t n0 = from.shape[0], n1 = from.shape[1], n2 = from.shape[2];
  for (int64_t i = 0; i < n0; ++i)
    for (int64_t j = 0; j < n1; ++j)
      for (int64_t c = 0; c < n2; ++c) to.set({i, j, c}, from.get({i, j, c}));
  return b;
}

// Whether row `row` of head `h` of a [tokens, heads, dim] view is exactly zero.
bool row_zero(const TensorView& t, int64_t row, int64_t h) {
  for (int64_t c = 0; c < t.shape[2]; ++c)
    if (t.get({row, h, c}) != 0.f) return false;
  return true;
}

// By the pattern's own rule (stored rows): which (query row, query head) see no key, and which
// (key row, KV head) no query of the group sees. Those gradient rows are exactly zero. A row that
// merely comes out zero in the reference (one visible key: dS = p (dP - D) vanishes in exact
// arithmetic) is not among them: a backend's rounding leaves it near zero, within the tolerance.
struct Unseen {
  std::vector<uint8_t> query, key;  // [stored row * heads + head]
};
Unseen unseen_rows(const PreparedCase& pc) {
  const AttnCase& c = pc.c;
  const Pattern& pat = pc.in.params.pattern;
  const int64_t tq = pc.in.total_q, tk = pc.in.total_k;
  const int group = c.heads_q / c.heads_kv;
  Unseen u{std::vector<uint8_t>(size_t(tq * c.heads_q), 1), std::vector<uint8_t>(size_t(tk * c.heads_kv), 1)};
  auto stored = [&](int64_t i) { return pc.order.empty() ? i : int64_t(pc.order[size_t(i)]); };
  for (int32_t s = 0; s < pat.num_seqs; ++s) {
    const SeqExtent e = pat.seq(s, tq, tk);
    for (int h = 0; h < c.heads_q; ++h)
      for (int64_t iq = 0; iq < e.lq; ++iq)
        for (int64_t ik = 0; ik < e.lk; ++ik)
          if (pat.allowed(s, e, h, iq, ik)) {
            u.query[size_t(stored(e.q0 + iq) * c.heads_q + h)] = 0;
            u.key[size_t(stored(e.k0 + ik) * c.heads_kv + h / group)] = 0;
          }
  }
  return u;
}

// A [rows, heads, dim] view as doubles, row-major.
std::vector<double> doubles(const TensorView& t) {
  std::vector<double> out(size_t(t.shape[0] * t.shape[1] * t.shape[2]));
  size_t i = 0;
  for (int64_t r = 0; r < t.shape[0]; ++r)
    for (int64_t h = 0; h < t.shape[1]; ++h)
      for (int64_t c = 0; c < t.shape[2]; ++c) out[i++] = t.get({r, h, c});
  return out;
}

// The magnitude sums of check_grads (backward_cases.hpp) from the inputs, the saved out and lse and
// dout: the sums of the gradients' terms in absolute value, in stored rows.
void magnitudes(const PreparedCase& pc, BackwardCase& bc) {
  const AttnCase& c = pc.c;
  const Pattern& pat = pc.in.params.pattern;
  const int64_t tq = pc.in.total_q, tk = pc.in.total_k, d = c.dim;
  const int hq = c.heads_q, hkv = c.heads_kv, group = hq / hkv;
  const double scale = pc.in.params.resolved_scale();
  const std::vector<double> Q = doubles(pc.in.params.q), K = doubles(pc.in.params.k), V = doubles(pc.in.params.v),
                            O = doubles(bc.out.view()), dO = doubles(bc.dout.view());
  std::vector<double> mq(Q.size(), 0.0), mk(K.size(), 0.0), mv(V.size(), 0.0), ms(size_t(hq), 0.0);
  auto stored = [&](int64_t i) { return pc.order.empty() ? i : int64_t(pc.order[size_t(i)]); };
  for (int32_t s = 0; s < pat.num_seqs; ++s) {
    const SeqExtent e = pat.seq(s, tq, tk);
    for (int h = 0; h < hq; ++h) {
      const int g = h / group;
      const double sink = c.sink_mode == SinkMode::none ? 0.0 : double(pc.in.params.sink.get({h}));
      for (int64_t iq = 0; iq < e.lq; ++iq) {
        const int64_t qr = stored(e.q0 + iq);
        const double lse = bc.lse.view().get({h, qr});
        if (!std::isfinite(lse) && lse < 0) continue;  // no mass: no term anywhere
        const double* q = &Q[size_t((qr * hq + h) * d)];
        const double* go = &dO[size_t((qr * hq + h) * d)];
        double dabs = 0;
        for (int64_t x = 0; x < d; ++x) dabs += std::abs(go[x] * O[size_t((qr * hq + h) * d + x)]);
        if (c.sink_mode == SinkMode::denominator) ms[size_t(h)] += (sink == lse ? 1.0 : std::exp(sink - lse)) * dabs;
        for (int64_t ik = 0; ik < e.lk; ++ik) {
          if (!pat.allowed(s, e, h, iq, ik)) continue;
          const int64_t kr = stored(e.k0 + ik);
          const double* k = &K[size_t((kr * hkv + g) * d)];
          const double* v = &V[size_t((kr * hkv + g) * d)];
          double x = 0, dp = 0;
          for (int64_t y = 0; y < d; ++y) {
            x += q[y] * k[y];
            dp += go[y] * v[y];
          }
          x *= scale;
          if (c.sink_mode == SinkMode::key0_bias && ik == 0) x += sink;
          const double p = std::exp(x - lse);
          if (!(p > 0)) continue;
          const double m = p * (std::abs(dp) + dabs);
          if (c.sink_mode == SinkMode::key0_bias && ik == 0) ms[size_t(h)] += m;
          for (int64_t y = 0; y < d; ++y) {
            mq[size_t((qr * hq + h) * d + y)] += scale * m * std::abs(k[y]);
            mk[size_t((kr * hkv + g) * d + y)] += scale * m * std::abs(q[y]);
            mv[size_t((kr * hkv + g) * d + y)] += p * std::abs(go[y]);
          }
        }
      }
    }
  }
  auto to_buffer = [](const std::vector<double>& v, std::vector<int64_t> shape) {
    Buffer b(DType::f32, std::move(shape));
    for (size_t i = 0; i < v.size(); ++i) b.as<float>()[i] = float(v[i]);
    return b;
  };
  bc.mdq = to_buffer(mq, {tq, hq, d});
  bc.mdk = to_buffer(mk, {tk, hkv, d});
  bc.mdv = to_buffer(mv, {tk, hkv, d});
  if (c.sink_mode != SinkMode::none) bc.mdsink = to_buffer(ms, {hq});
}

// The rule of check_grads on one gradient: every element written (non-finite only where the
// reference is), ‖got − ref‖₂ ≤ tol · ‖M‖₂ and |got − ref| ≤ 10 · tol · (M + 10⁻³ max M).
::testing::AssertionResult within_magnitudes(const char* what, const Buffer& got, const Buffer& ref, const Buffer& mag,
                                             double tol) {
  const int64_t n = ref.numel();
  double num = 0, den = 0, mmax = 0;
  for (int64_t i = 0; i < n; ++i) mmax = std::max(mmax, double(mag.as<float>()[i]));
  const TensorView gv = got.view();
  auto at = [&](int64_t i) {  // got's element i (row-major), in any dtype
    const int64_t d = got.shape().back(), h = got.shape().size() > 1 ? got.shape()[1] : 1;
    if (got.shape().size() == 1) return double(gv.get({i}));
    return double(gv.get({i / (h * d), (i / d) % h, i % d}));
  };
  for (int64_t i = 0; i < n; ++i) {
    const double g = at(i), r = ref.as<float>()[i], m = mag.as<float>()[i];
    if (!std::isfinite(r)) {
      if (std::isnan(r) != std::isnan(g) || (!std::isnan(r) && g != r))
        return ::testing::AssertionFailure() << what << "[" << i << "] = " << g << ", the reference has " << r;
      continue;
    }
    if (!std::isfinite(g)) return ::testing::AssertionFailure() << what << "[" << i << "] = " << g << " (not written?)";
    const double err = std::abs(g - r), bound = 10 * tol * (m + 1e-3 * mmax);
    if (err > bound)
      return ::testing::AssertionFailure() << what << "[" << i << "] = " << g << ", reference " << r << ": error "
                                           << err << " > " << bound << " (10·tol·(M + 1e-3·max M), M = " << m << ")";
    num += err * err;
    den += m * m;
  }
  if (std::sqrt(num) > tol * std::sqrt(den) + 1e-30)
    return ::testing::AssertionFailure() << what << ": ‖error‖₂ " << std::sqrt(num) << " > tol " << tol << " · ‖M‖₂ "
                                         << std::sqrt(den);
  return ::testing::AssertionSuccess();
}

}  // namespace

BackwardCase prepare_backward(const PreparedCase& pc) {
  const AttnCase& c = pc.c;
  const int64_t tq = pc.in.total_q;
  BackwardCase bc;
  // The forward on the reference, into f32 out and an LSE (the case may ask for none).
  Buffer out32(DType::f32, {tq, c.heads_q, c.dim});
  bc.lse = Buffer(DType::f32, {c.heads_q, tq});
  AttentionParams p = pc.in.params;
  if (!pc.order.empty()) p.order = pc.order.data();
  p.out = out32.view();
  p.lse = bc.lse.view();
  attention(p, Backend::reference);
  bc.out = c.f32_out ? std::move(out32) : converted(out32, c.dtype);

  bc.dout = Buffer(c.dtype, {tq, c.heads_q, c.dim});
  bc.dout.fill_random(pc.seed * 0x9E3779B97F4A7C15ull + 11);
  bc.dq = Buffer(DType::f32, {tq, c.heads_q, c.dim});
  bc.dk = Buffer(DType::f32, {pc.in.total_k, c.heads_kv, c.dim});
  bc.dv = Buffer(DType::f32, {pc.in.total_k, c.heads_kv, c.dim});
  if (c.sink_mode != SinkMode::none) bc.dsink = Buffer(DType::f32, {c.heads_q});
  BackwardOutputs ref{std::move(bc.dq), std::move(bc.dk), std::move(bc.dv), std::move(bc.dsink)};
  attention_backward(backward_params(pc, bc), grads_of(bc, ref), Backend::reference);
  bc.dq = std::move(ref.dq);
  bc.dk = std::move(ref.dk);
  bc.dv = std::move(ref.dv);
  bc.dsink = std::move(ref.dsink);
  // docs/numerics.md, "Gradients": twice the forward's tolerance (P and dS are rounded to the
  // input dtype before their products, as out's P is in the forward), against the magnitudes.
  bc.tol = 2 * pc.tol;
  magnitudes(pc, bc);
  return bc;
}

BackwardOutputs poisoned_grads(const PreparedCase& pc, bool f32_grads) {
  const AttnCase& c = pc.c;
  const DType dt = f32_grads ? DType::f32 : c.dtype;
  BackwardOutputs o;
  o.dq = Buffer(dt, {pc.in.total_q, c.heads_q, c.dim});
  o.dk = Buffer(dt, {pc.in.total_k, c.heads_kv, c.dim});
  o.dv = Buffer(dt, {pc.in.total_k, c.heads_kv, c.dim});
  for (Buffer* b : {&o.dq, &o.dk, &o.dv}) b->fill(std::numeric_limits<float>::quiet_NaN());
  if (c.sink_mode != SinkMode::none) {
    o.dsink = Buffer(DType::f32, {c.heads_q});
    o.dsink.fill(std::numeric_limits<float>::quiet_NaN());
  }
  return o;
}

AttentionParams backward_params(const PreparedCase& pc, const BackwardCase& bc) {
  AttentionParams p = pc.in.params;
  if (!pc.order.empty()) p.order = pc.order.data();
  p.out = bc.out.view();
  p.lse = bc.lse.view();
  return p;
}

AttentionGrads grads_of(const BackwardCase& bc, const BackwardOutputs& o) {
  AttentionGrads g;
  g.dout = bc.dout.view();
  g.dq = o.dq.view();
  g.dk = o.dk.view();
  g.dv = o.dv.view();
  if (has(o.dsink)) g.dsink = o.dsink.view();
  return g;
}

void check_grads(const PreparedCase& pc, const BackwardCase& bc, const BackwardOutputs& got) {
  const AttnCase& c = pc.c;
  const double tol = std::max(bc.tol, tolerance(got.dq.dtype(), 0));
  const std::pair<const char*, std::pair<const Buffer*, const Buffer*>> grads[] = {
      {"dq", {&got.dq, &bc.dq}}, {"dk", {&got.dk, &bc.dk}}, {"dv", {&got.dv, &bc.dv}}};
  const Unseen unseen = unseen_rows(pc);
  const Buffer* mags[] = {&bc.mdq, &bc.mdk, &bc.mdv};
  int gi = 0;
  for (const auto& [name, bufs] : grads) {
    EXPECT_TRUE(within_magnitudes(name, *bufs.first, *bufs.second, *mags[gi++], tol));
    const TensorView g = bufs.first->view(), r = bufs.second->view();
    const std::vector<uint8_t>& none = name[1] == 'q' ? unseen.query : unseen.key;
    for (int64_t row = 0; row < r.shape[0]; ++row)
      for (int64_t h = 0; h < r.shape[1]; ++h)
        if (none[size_t(row * r.shape[1] + h)]) {
          EXPECT_TRUE(row_zero(r, row, h)) << "reference " << name << " row " << row << " head " << h;
          EXPECT_TRUE(row_zero(g, row, h)) << name << " row " << row << " head " << h << " should be zero";
        }
  }
  if (c.sink_mode != SinkMode::none && has(got.dsink)) {
    EXPECT_TRUE(within_magnitudes("dsink", got.dsink, bc.dsink, bc.mdsink, tol));
  }
}

bool run_backward_case(const PreparedCase& pc, const BackwardCase& bc, const BackwardBackend& backend,
                       std::string* why) {
  SCOPED_TRACE(pc.name + " on " + backend.name + " (input seed " + std::to_string(pc.seed) + ")");
  BackwardOutputs first = poisoned_grads(pc, backend.f32_grads);
  if (!backend.run(pc, bc, first, why)) return false;
  check_grads(pc, bc, first);
  if (backend.repeat) {
    BackwardOutputs second = poisoned_grads(pc, backend.f32_grads);
    EXPECT_TRUE(backend.run(pc, bc, second, why));
    for (const auto& [a, b] : {std::pair{&first.dq, &second.dq}, {&first.dk, &second.dk}, {&first.dv, &second.dv},
                               {&first.dsink, &second.dsink}}) {
      if (!has(*a)) continue;
      const size_t bytes = size_t(a->numel()) * size_t(dtype_size(a->dtype()));
      EXPECT_EQ(std::memcmp(a->data(), b->data(), bytes), 0) << "a second run differs from the first";
    }
  }
  return true;
}

std::vector<AttnCase> backward_cases(int64_t max_tokens) {
#if defined(ARIADNE_SANITIZED)
  max_tokens = std::min<int64_t>(max_tokens, 300);  // CMakeLists.txt: smaller sweeps under the sanitizers
#endif
  std::vector<AttnCase> out;
  for (const AttnCase& c : cases()) {
    int64_t tq = 0;
    for (int64_t t : c.tokens_q) tq += t;
    if (c.diagnostics || tq > max_tokens) continue;
    out.push_back(c);
  }
  return out;
}

}  // namespace ariadne::testing
