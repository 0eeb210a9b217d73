// The exact reference: plain loops, every product and sum in double, O(N·d) memory.
//
// It is the oracle of every test, so it is written for obviousness, not speed: one query row at a
// time, scores of the row kept in a vector (never the N×N matrix), a first pass for the maximum, a
// second for the normalizer and the output. Received attention (column sums) is a separate pass
// over keys that recomputes scores from the saved LSE, so its sums run in a fixed order and the
// result does not depend on the thread count.
#include <cmath>
#include <limits>
#include <vector>

#include "attention/backends.hpp"
#include "attention/reference/rows.hpp"

namespace ariadne {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

using reference::dot;
using reference::load_head;

struct RowContext {
  const AttentionParams& p;
  const Pattern& pat;
  int32_t s;
  SeqExtent e;
  int head;
  double scale;
  double sink;  // logit, or -inf when no sink
  bool key0;    // key0_bias mode
};

// Scaled score of (iq, ik) including the key-0 bias; -inf when the pair is not allowed.
double score(const RowContext& c, const double* q, const double* k, int64_t iq, int64_t ik, int64_t d) {
  if (!c.pat.allowed(c.s, c.e, c.head, iq, ik)) return kNegInf;
  double v = c.scale * dot(q, k + ik * d, d);
  if (c.key0 && ik == 0) v += c.sink;
  return v;
}

}  // namespace

void attention_reference(const AttentionParams& p) {
  const Pattern& pat = p.pattern;
  const int64_t total_q = p.q.shape[0], total_k = p.k.shape[0];
  const int hq = p.heads_q(), group = hq / p.heads_kv();
  const int64_t d = p.head_dim();
  const double scale = p.resolved_scale();
  float* lse_out = static_cast<float*>(p.lse.data);
  std::vector<double> lse_all(size_t(hq * total_q));  // kept for the received pass

  for (int32_t s = 0; s < pat.num_seqs; ++s) {
    const SeqExtent e = pat.seq(s, total_q, total_k);
    if (e.lq == 0) continue;
    for (int h = 0; h < hq; ++h) {
      const int g = h / group;
      const std::vector<double> K = load_head(p.k, e.k0, e.lk, g), V = load_head(p.v, e.k0, e.lk, g);
      const std::vector<double> Q = load_head(p.q, e.q0, e.lq, h);
      const double sink = p.sink_mode == SinkMode::none ? kNegInf : p.sink.get_f64({h});
      const RowContext ctx{p, pat, s, e, h, scale, sink, p.sink_mode == SinkMode::key0_bias};
      const bool denom = p.sink_mode == SinkMode::denominator;

#pragma omp parallel for schedule(dynamic, 16)
      for (int64_t iq = 0; iq < e.lq; ++iq) {
        std::vector<double> sc(size_t(e.lk));
        double m = kNegInf;
        for (int64_t ik = 0; ik < e.lk; ++ik) {
          sc[size_t(ik)] = score(ctx, &Q[size_t(iq * d)], K.data(), iq, ik, d);
          // A NaN logit must poison the row (docs/numerics.md, non-finite inputs): std::max would
          // drop it, and a row of NaN logits would then pass for a fully masked one.
          const double x = sc[size_t(ik)];
          if (std::isnan(x)) m = x;
          else if (!std::isnan(m) && x > m) m = x;
        }
        // Keys only: log Σ exp(s_j); the sink joins the normalizer afterwards.
        double zk = 0;
        if (m != kNegInf)
          for (int64_t ik = 0; ik < e.lk; ++ik) zk += std::exp(sc[size_t(ik)] - m);
        const double lse_keys = m == kNegInf ? kNegInf : m + std::log(zk);
        double lse = lse_keys;
        if (denom) lse = lse_keys == kNegInf ? sink : std::max(lse_keys, sink) + std::log1p(std::exp(-std::abs(lse_keys - sink)));
        std::vector<double> o(size_t(d), 0.0);
        double ent = 0, dist = 0;
        if (lse_keys != kNegInf) {
          for (int64_t ik = 0; ik < e.lk; ++ik) {
            if (sc[size_t(ik)] == kNegInf) continue;
            const double a = std::exp(sc[size_t(ik)] - lse);
            for (int64_t c = 0; c < d; ++c) o[size_t(c)] += a * V[size_t(ik * d + c)];
            const double ahat = std::exp(sc[size_t(ik)] - lse_keys);  // renormalized over keys
            ent -= ahat * (sc[size_t(ik)] - lse_keys);
            if (p.distance.defined()) {
              const double dr = p.coords_q.get({e.q0 + iq, 0}) - p.coords_k.get({e.k0 + ik, 0});
              const double dc = p.coords_q.get({e.q0 + iq, 1}) - p.coords_k.get({e.k0 + ik, 1});
              dist += ahat * std::sqrt(dr * dr + dc * dc);
            }
          }
        }
        const int64_t row = e.q0 + iq;
        for (int64_t c = 0; c < d; ++c) p.out.set_f64({row, h, c}, o[size_t(c)]);
        lse_all[size_t(h * total_q + row)] = lse;
        if (lse_out) lse_out[h * total_q + row] = float(lse);
        if (p.entropy.defined()) static_cast<float*>(p.entropy.data)[h * total_q + row] = float(ent);
        if (p.distance.defined()) static_cast<float*>(p.distance.data)[h * total_q + row] = float(dist);
      }
    }
  }

  if (!p.received.defined()) return;
  float* recv = static_cast<float*>(p.received.data);
  for (int64_t i = 0; i < hq * total_k; ++i) recv[i] = 0.f;  // keys of empty-query sequences get 0
  for (int32_t s = 0; s < pat.num_seqs; ++s) {
    const SeqExtent e = pat.seq(s, total_q, total_k);
    if (e.lq == 0 || e.lk == 0) continue;
    for (int h = 0; h < hq; ++h) {
      const int g = h / group;
      const std::vector<double> K = load_head(p.k, e.k0, e.lk, g), Q = load_head(p.q, e.q0, e.lq, h);
      const double sink = p.sink_mode == SinkMode::none ? kNegInf : p.sink.get_f64({h});
      const RowContext ctx{p, pat, s, e, h, scale, sink, p.sink_mode == SinkMode::key0_bias};
#pragma omp parallel for schedule(dynamic, 16)
      for (int64_t ik = 0; ik < e.lk; ++ik) {
        double col = 0;
        for (int64_t iq = 0; iq < e.lq; ++iq) {
          const double lse = lse_all[size_t(h * total_q + e.q0 + iq)];
          if (lse == kNegInf) continue;
          const double sc = score(ctx, &Q[size_t(iq * d)], K.data(), iq, ik, d);
          if (sc != kNegInf) col += std::exp(sc - lse);
        }
        recv[h * total_k + e.k0 + ik] = float(col);
      }
    }
  }
}

}  // namespace ariadne
