// Stride-level estimators: RRAttention (one sampled query per stride and head) and XAttention
// (antidiagonal sums). Both reduce to the same shape of work once their operands are laid out as
// rows: a query-stride row per (head, stride) and a key-stride row per (KV head, stride), scored
// by dot products, soft-maxed per query-stride row over its visible key strides and summed into
// blocks. RR rows have head_dim values, XAttention rows S·head_dim: hence the S× cost ratio.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "estimate/internal.hpp"

namespace ariadne::est {

namespace {

int64_t rr_position(const EstimateConfig& c, const Seq& e, int64_t i, int h) {
  return rr_sample_position(c.offset, c.stride, i, rr_rotation(c.schedule, h, c.layer), e.lq);
}

// Last visible key stride of query-stride row i: key stride j is visible when jS <= p, p the key
// position of the row's representative query (RR: the sampled query; XAttention: the stride's last
// query, which keeps the diagonal stride whole).
int64_t last_key_stride(const EstimateConfig& c, const Seq& e, int64_t i, int h) {
  const int64_t q = c.method == Estimator::rr ? rr_position(c, e, i, h)
                                              : std::min(i * c.stride + c.stride - 1, e.lq - 1);
  return (q + e.off) / c.stride;
}

}  // namespace

void sum_key_stride(const TensorView& k, int64_t first, int64_t count, int64_t kh, float* tmp, float* dst) {
  const int64_t d = k.shape[2];
  for (int64_t t = 0; t < count; ++t) {
    load_row(k, first + t, kh, 1.f, tmp);
    for (int64_t u = 0; u < d; ++u) dst[u] += tmp[u];
  }
}

double score_strided(const Geometry& g, const TensorView& q, const TensorView& k,
                     const EstimateConfig& c, float scale, EstimateResult& r, double& ms_sampling,
                     const TensorView* key_sums) {
  const bool rr = c.method == Estimator::rr;
  const int64_t S = c.stride, d = g.dim, len = rr ? d : S * d;
  const float qmul = scale / float(S);  // the 1/(S·√d) of both papers, folded into the queries

  const int64_t spb = g.block / S;  // strides per block
  double mac = 0;
  ms_sampling = 0;
  // One KV head at a time, then its query heads one at a time: the operand rows of a single head
  // are live (total_ks·len + total_qs·len floats), not those of all heads.
  std::vector<float> krows(size_t(g.total_ks * len)), qrows(size_t(g.total_qs * len));
  for (int kh = 0; kh < g.heads_kv; ++kh) {
    // ---- sampling, key side: RR sums each key stride (K̄_j); XAttention lays it out as a row ----
    auto t_s = std::chrono::steady_clock::now();
    std::fill(krows.begin(), krows.end(), 0.f);
    for (const Seq& e : g.seqs) {
      if (key_sums) {  // RR from sums made elsewhere (rr_key_sums): copied, not summed again
        for (int64_t j = 0; j < e.nks; ++j)
          std::memcpy(krows.data() + (e.ks_base + j) * len,
                      static_cast<const float*>(key_sums->data) + key_sums->offset({j, kh, 0}),
                      size_t(d) * sizeof(float));
        continue;
      }
#pragma omp parallel num_threads(cpu_threads())
      {
        std::vector<float> tmp(static_cast<size_t>(d));
#pragma omp for schedule(static)
        for (int64_t j = 0; j < e.nks; ++j) {
          float* dst = krows.data() + (e.ks_base + j) * len;
          const int64_t n = std::min(S, e.lk - j * S);
          if (rr) sum_key_stride(k, e.k0 + j * S, n, kh, tmp.data(), dst);
          else
            for (int64_t t = 0; t < n; ++t) load_row(k, e.k0 + j * S + t, kh, 1.f, dst + t * d);
        }
      }
    }
    ms_sampling += ms_since(t_s);

    for (int h = kh * g.group; h < (kh + 1) * g.group; ++h) {
      // ---- sampling, query side: RR gathers the sampled query of each stride; XAttention lays
      // the stride out reversed (segment t holds q_{iS+S−1−t}, paired with k_{jS+t}) ----
      t_s = std::chrono::steady_clock::now();
      for (const Seq& e : g.seqs) {
#pragma omp parallel for schedule(static) num_threads(cpu_threads())
        for (int64_t i = 0; i < e.nqs; ++i) {
          float* dst = qrows.data() + (e.qs_base + i) * len;
          if (rr) {
            load_row(q, e.q0 + rr_position(c, e, i, h), h, qmul, dst);
          } else {
            for (int64_t t = 0; t < S; ++t) {
              const int64_t iq = i * S + S - 1 - t;
              if (iq < e.lq) load_row(q, e.q0 + iq, h, qmul, dst + t * d);
              else std::memset(dst + t * d, 0, size_t(d) * sizeof(float));
            }
          }
        }
      }
      ms_sampling += ms_since(t_s);

      // ---- scoring: per query block, logits → softmax per stride row → block sums ----
      const std::vector<Geometry::Row> rows = g.rows_of_head(h);
#pragma omp parallel num_threads(cpu_threads()) reduction(+ : mac)
      {
        std::vector<float> logits;
        std::vector<double> bsum;
#pragma omp for schedule(dynamic, 1)
        for (size_t x = 0; x < rows.size(); ++x) {
          const Geometry::Row rw = rows[x];
          const Seq& e = g.seqs[size_t(rw.s)];
          const int64_t row = e.row_base + h * e.nqb + rw.m;
          const int64_t i0 = rw.m * spb, i1 = std::min(e.nqs, i0 + spb), nr = i1 - i0;
          const int64_t ncols = last_key_stride(c, e, i1 - 1, h) + 1;
          logits.resize(size_t(nr * ncols));
          dot_rows(qrows.data() + (e.qs_base + i0) * len, nr, krows.data() + e.ks_base * len, ncols, len,
                   logits.data(), ncols);
          mac += double(nr) * double(ncols) * double(len);
          const int64_t nvis = r.visible(row);
          bsum.assign(size_t(nvis), 0.0);
          for (int64_t i = i0; i < i1; ++i) {
            float* xr = logits.data() + (i - i0) * ncols;
            const int64_t lim = last_key_stride(c, e, i, h);
            float mx = xr[0];
            for (int64_t j = 1; j <= lim; ++j) mx = std::max(mx, xr[j]);
            const double inv = 1.0 / exp_sum(xr, lim + 1, mx);
            for (int64_t j = 0; j <= lim; ++j) bsum[size_t(j / spb)] += double(xr[j]) * inv;
          }
          float* out = r.scores.data() + r.score_ptr[size_t(row)];
          for (int64_t n = 0; n < nvis; ++n) out[n] = float(bsum[size_t(n)] / double(nr));
        }
      }
    }
  }
  return mac;
}

}  // namespace ariadne::est

namespace ariadne {

int64_t rr_sample_position(RROffset offset, int32_t stride, int64_t i, int rotation, int64_t lq) {
  const int64_t s = stride, hm = rotation % s;
  // A short final stride has fewer than S queries: its sample is clamped to the last one.
  const int64_t pos = i * s + (offset == RROffset::paper ? s - 1 - hm : hm);
  return std::min(pos, lq - 1);
}

}  // namespace ariadne
