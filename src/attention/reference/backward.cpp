// The exact reference backward: plain loops in double, O(N·d) memory.
//
// It is the oracle of every backward test, so it trusts nothing the forward saved: each row's
// scores, LSE and output are recomputed in double from q, k, v and the sink (the fast backends read
// the saved out and lse instead; the difference is the rounding of those, inside the tolerance of
// docs/numerics.md). Two passes keep every sum in a fixed order, independent of the thread count:
//   rows:  lse_i, out_i, D_i = dout_i · out_i, then dq_i = scale Σ_j dS_ij k_j and the sink terms;
//   keys:  dk_j = scale Σ_i dS_ij q_i and dv_j = Σ_i p_ij dout_i over the group's query heads.
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

// One query head of one sequence, in double.
struct Head {
  const Pattern& pat;
  int32_t s;
  SeqExtent e;
  int h;
  int64_t d;
  double scale;
  double sink;  // logit, or -inf without a sink
  SinkMode mode;
  std::vector<double> Q;
  const std::vector<double>& K;
  const std::vector<double>& V;
  std::vector<double> dO;

  double score(int64_t iq, int64_t ik) const {
    if (!pat.allowed(s, e, h, iq, ik)) return kNegInf;
    double x = scale * dot(&Q[size_t(iq * d)], &K[size_t(ik * d)], d);
    if (mode == SinkMode::key0_bias && ik == 0) x += sink;
    return x;
  }
};

// The row statistics pass 1 leaves for pass 2.
struct RowStats {
  double lse = kNegInf;  // includes a denominator sink; -inf: the row has no key (no term anywhere)
  double D = 0;
};

}  // namespace

void attention_backward_reference(const AttentionParams& p, const AttentionGrads& g) {
  const Pattern& pat = p.pattern;
  const int64_t total_q = p.q.shape[0], total_k = p.k.shape[0];
  const int hq = p.heads_q(), hkv = p.heads_kv(), group = hq / hkv;
  const int64_t d = p.head_dim();
  const double scale = p.resolved_scale();
  std::vector<double> dsink(size_t(hq), 0.0);

  for (int32_t s = 0; s < pat.num_seqs; ++s) {
    const SeqExtent e = pat.seq(s, total_q, total_k);
    for (int kvh = 0; kvh < hkv; ++kvh) {
      std::vector<double> dK(size_t(e.lk * d), 0.0), dV(size_t(e.lk * d), 0.0);
      const std::vector<double> K = load_head(p.k, e.k0, e.lk, kvh), V = load_head(p.v, e.k0, e.lk, kvh);
      std::vector<Head> heads;
      std::vector<std::vector<RowStats>> stats(static_cast<size_t>(group));
      for (int r = 0; r < group; ++r) {
        const int h = kvh * group + r;
        const double sink = p.sink_mode == SinkMode::none ? kNegInf : p.sink.get_f64({h});
        heads.push_back(Head{pat, s, e, h, d, scale, sink, p.sink_mode, load_head(p.q, e.q0, e.lq, h), K, V,
                             load_head(g.dout, e.q0, e.lq, h)});
        stats[size_t(r)].resize(size_t(e.lq));
      }

      // Pass 1: rows.
      for (int r = 0; r < group; ++r) {
        const Head& H = heads[size_t(r)];
        std::vector<RowStats>& st = stats[size_t(r)];
        std::vector<double> sink_terms(size_t(e.lq), 0.0);
#pragma omp parallel for schedule(dynamic, 16)
        for (int64_t iq = 0; iq < e.lq; ++iq) {
          std::vector<double> sc(size_t(e.lk));
          double m = kNegInf;
          bool nan = false;
          for (int64_t ik = 0; ik < e.lk; ++ik) {
            sc[size_t(ik)] = H.score(iq, ik);
            if (std::isnan(sc[size_t(ik)])) nan = true;
            else if (sc[size_t(ik)] > m) m = sc[size_t(ik)];
          }
          std::vector<double> dq(size_t(d), 0.0);
          RowStats rs;
          if (nan) {
            rs.lse = std::numeric_limits<double>::quiet_NaN();
            rs.D = rs.lse;
            dq.assign(size_t(d), rs.lse);
          } else if (m != kNegInf) {
            double z = 0;
            for (int64_t ik = 0; ik < e.lk; ++ik) z += std::exp(sc[size_t(ik)] - m);
            const double lse_keys = m + std::log(z);
            rs.lse = lse_keys;
            if (H.mode == SinkMode::denominator)
              rs.lse = std::max(lse_keys, H.sink) + std::log1p(std::exp(-std::abs(lse_keys - H.sink)));
            std::vector<double> o(size_t(d), 0.0);
            for (int64_t ik = 0; ik < e.lk; ++ik) {
              if (sc[size_t(ik)] == kNegInf) continue;
              const double a = std::exp(sc[size_t(ik)] - rs.lse);
              for (int64_t c = 0; c < d; ++c) o[size_t(c)] += a * H.V[size_t(ik * d + c)];
            }
            rs.D = dot(&H.dO[size_t(iq * d)], o.data(), d);
            for (int64_t ik = 0; ik < e.lk; ++ik) {
              if (sc[size_t(ik)] == kNegInf) continue;
              const double a = std::exp(sc[size_t(ik)] - rs.lse);
              const double ds = a * (dot(&H.dO[size_t(iq * d)], &H.V[size_t(ik * d)], d) - rs.D);
              for (int64_t c = 0; c < d; ++c) dq[size_t(c)] += scale * ds * H.K[size_t(ik * d + c)];
              if (H.mode == SinkMode::key0_bias && ik == 0) sink_terms[size_t(iq)] = ds;
            }
            // The sink's probability, 1 when it takes all the mass (a +inf sink: lse = sink).
            if (H.mode == SinkMode::denominator)
              sink_terms[size_t(iq)] = -(H.sink == rs.lse ? 1.0 : std::exp(H.sink - rs.lse)) * rs.D;
          }
          st[size_t(iq)] = rs;
          for (int64_t c = 0; c < d; ++c) g.dq.set_f64({e.q0 + iq, H.h, c}, dq[size_t(c)]);
        }
        for (int64_t iq = 0; iq < e.lq; ++iq) dsink[size_t(H.h)] += sink_terms[size_t(iq)];
      }

      // Pass 2: keys, summed over the group's query heads in head order.
#pragma omp parallel for schedule(dynamic, 16)
      for (int64_t ik = 0; ik < e.lk; ++ik) {
        double* dk = &dK[size_t(ik * d)];
        double* dv = &dV[size_t(ik * d)];
        for (int r = 0; r < group; ++r) {
          const Head& H = heads[size_t(r)];
          const std::vector<RowStats>& st = stats[size_t(r)];
          for (int64_t iq = 0; iq < e.lq; ++iq) {
            const RowStats& rs = st[size_t(iq)];
            if (rs.lse == kNegInf) continue;
            const double x = H.score(iq, ik);
            if (x == kNegInf) continue;
            const double a = std::exp(x - rs.lse);
            const double ds = a * (dot(&H.dO[size_t(iq * d)], &H.V[size_t(ik * d)], d) - rs.D);
            for (int64_t c = 0; c < d; ++c) {
              dk[c] += scale * ds * H.Q[size_t(iq * d + c)];
              dv[c] += a * H.dO[size_t(iq * d + c)];
            }
          }
        }
      }
      for (int64_t ik = 0; ik < e.lk; ++ik)
        for (int64_t c = 0; c < d; ++c) {
          g.dk.set_f64({e.k0 + ik, kvh, c}, dK[size_t(ik * d + c)]);
          g.dv.set_f64({e.k0 + ik, kvh, c}, dV[size_t(ik * d + c)]);
        }
    }
  }
  if (g.dsink.defined())
    for (int h = 0; h < hq; ++h) g.dsink.set_f64({h}, dsink[size_t(h)]);
}

}  // namespace ariadne
