// The oracle: exact block masses of full causal softmax attention, one (head, query block) at a
// time. Each task holds the B × (visible keys) logits of its query block (B·lk floats, never
// N×N), takes each query's log-sum-exp over its causal keys and sums exp(s − LSE) per key block.
#include <algorithm>
#include <cmath>

#include "estimate/internal.hpp"

namespace ariadne::est {

double score_oracle(const Geometry& g, const TensorView& q, const TensorView& k, float scale,
                    EstimateResult& r, double& ms_sampling) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t d = g.dim, B = g.block;
  // Keys as contiguous f32 rows per KV head, so that the dot kernel streams them.
  std::vector<float> kf(size_t(g.heads_kv * g.total_k * d));
#pragma omp parallel for schedule(static) num_threads(cpu_threads())
  for (int64_t x = 0; x < g.heads_kv * g.total_k; ++x)
    load_row(k, x % g.total_k, x / g.total_k, 1.f, kf.data() + x * d);
  ms_sampling = ms_since(t0);

  double mac = 0;
#pragma omp parallel num_threads(cpu_threads()) reduction(+ : mac)
  {
    std::vector<float> qb, logits;
    std::vector<double> bsum;
#pragma omp for schedule(dynamic, 1)
    for (int64_t row = 0; row < g.rows; ++row) {
      const Geometry::Row rw = g.row(row);
      const Seq& e = g.seqs[size_t(rw.s)];
      const int kh = rw.h / g.group;
      const int64_t nb = g.queries_in(e, rw.m), iq0 = rw.m * B;
      const int64_t ncols = iq0 + nb - 1 + e.off + 1;  // keys up to the last query's position
      qb.resize(size_t(nb * d));
      for (int64_t i = 0; i < nb; ++i) load_row(q, e.q0 + iq0 + i, rw.h, scale, qb.data() + i * d);
      logits.resize(size_t(nb * ncols));
      dot_rows(qb.data(), nb, kf.data() + (kh * g.total_k + e.k0) * d, ncols, d, logits.data(), ncols);
      mac += double(nb) * double(ncols) * double(d);
      const int64_t nvis = r.visible(row);
      bsum.assign(size_t(nvis), 0.0);
      for (int64_t i = 0; i < nb; ++i) {
        float* x = logits.data() + i * ncols;
        const int64_t lim = iq0 + i + e.off;  // causal: keys 0 … p
        float mx = x[0];
        for (int64_t j = 1; j <= lim; ++j) mx = std::max(mx, x[j]);
        // exp(s − LSE) = exp(s − max) / Σ exp(s − max): the LSE pass and the mass pass share
        // the exponentials, computed once.
        const double inv = 1.0 / exp_sum(x, lim + 1, mx);
        for (int64_t n = 0; n * B <= lim; ++n) {
          double s = 0;
          const int64_t hi = std::min((n + 1) * B - 1, lim);
          for (int64_t j = n * B; j <= hi; ++j) s += x[j];
          bsum[size_t(n)] += s * inv;
        }
      }
      float* out = r.scores.data() + r.score_ptr[size_t(row)];
      for (int64_t n = 0; n < nvis; ++n) out[n] = float(bsum[size_t(n)] / double(nb));
    }
  }
  return mac;
}

}  // namespace ariadne::est
