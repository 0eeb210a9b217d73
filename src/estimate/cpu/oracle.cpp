// The oracle: exact block masses of full causal softmax attention, one (head, query block) at a
// time. Each task holds the B × (visible keys) logits of its query block (B·lk floats, never
// N×N), takes each query's log-sum-exp over its causal keys and sums exp(s − LSE) per key block.
#include <algorithm>
#include <cmath>

#include "estimate/internal.hpp"

namespace ariadne::est {

double score_oracle(const Geometry& g, const TensorView& q, const TensorView& k, float scale,
                    EstimateResult& r, double& ms_sampling) {
  const int64_t d = g.dim, B = g.block;
  double mac = 0;
  ms_sampling = 0;
  // One KV head at a time: its keys as contiguous f32 rows (total_k·d floats), so that the dot
  // kernel streams them; then every query head of its group.
  std::vector<float> kf(size_t(g.total_k * d));
  for (int kh = 0; kh < g.heads_kv; ++kh) {
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel for schedule(static) num_threads(cpu_threads())
    for (int64_t t = 0; t < g.total_k; ++t) load_row(k, t, kh, 1.f, kf.data() + t * d);
    ms_sampling += ms_since(t0);
    for (int h = kh * g.group; h < (kh + 1) * g.group; ++h) {
      const std::vector<Geometry::Row> rows = g.rows_of_head(h);
#pragma omp parallel num_threads(cpu_threads()) reduction(+ : mac)
      {
        std::vector<float> qb, logits;
        std::vector<double> bsum;
#pragma omp for schedule(dynamic, 1)
        for (size_t x = 0; x < rows.size(); ++x) {
          const Geometry::Row rw = rows[x];
          const Seq& e = g.seqs[size_t(rw.s)];
          const int64_t row = e.row_base + h * e.nqb + rw.m;
          const int64_t nb = g.queries_in(e, rw.m), iq0 = rw.m * B;
          const int64_t ncols = iq0 + nb - 1 + e.off + 1;  // keys up to the last query's position
          qb.resize(size_t(nb * d));
          for (int64_t i = 0; i < nb; ++i) load_row(q, e.q0 + iq0 + i, h, scale, qb.data() + i * d);
          logits.resize(size_t(nb * ncols));
          dot_rows(qb.data(), nb, kf.data() + e.k0 * d, ncols, d, logits.data(), ncols);
          mac += double(nb) * double(ncols) * double(d);
          const int64_t nvis = r.visible(row);
          bsum.assign(size_t(nvis), 0.0);
          for (int64_t i = 0; i < nb; ++i) {
            float* xr = logits.data() + i * ncols;
            const int64_t lim = iq0 + i + e.off;  // causal: keys 0 … p
            float mx = xr[0];
            for (int64_t j = 1; j <= lim; ++j) mx = std::max(mx, xr[j]);
            // exp(s − LSE) = exp(s − max) / Σ exp(s − max): the LSE and the masses share one pass
            // of exponentials.
            const double inv = 1.0 / exp_sum(xr, lim + 1, mx);
            for (int64_t n = 0; n * B <= lim; ++n) {
              double sum = 0;
              const int64_t hi = std::min((n + 1) * B - 1, lim);
              for (int64_t j = n * B; j <= hi; ++j) sum += xr[j];
              bsum[size_t(n)] += sum * inv;
            }
          }
          float* out = r.scores.data() + r.score_ptr[size_t(row)];
          for (int64_t n = 0; n < nvis; ++n) out[n] = float(bsum[size_t(n)] / double(nb));
        }
      }
    }
  }
  return mac;
}

}  // namespace ariadne::est
