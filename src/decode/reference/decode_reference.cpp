// The decode oracle: one (sequence, query head) at a time, every product, exponential and sum in
// double over the tokens the query sees, read from the cache through its page table.
#include <cmath>
#include <limits>
#include <vector>

#include "decode/internal.hpp"

namespace ariadne::decode_detail {

void decode_reference(const DecodeParams& p) {
  const PagedKVCache& cache = *p.cache;
  const KVCacheConfig& c = cache.config();
  const int64_t B = p.q.shape[0], Hq = p.q.shape[1];
  const int d = c.head_dim, P = c.page_size, G = int(Hq / c.kv_heads);
  const double scale = p.scale > 0 ? p.scale : 1.0 / std::sqrt(double(d));
  const unsigned char* kp = static_cast<const unsigned char*>(cache.k_pool().data);
  const unsigned char* vp = static_cast<const unsigned char*>(cache.v_pool().data);
  const unsigned char* qp = static_cast<const unsigned char*>(p.q.data);
  std::vector<int64_t> tokens;
  std::vector<double> s, o(static_cast<size_t>(d));
  for (int64_t b = 0; b < B; ++b) {
    const std::vector<int32_t>& table = cache.page_table(p.seqs[size_t(b)]);
    const Visible vis = visible_of(cache.length(p.seqs[size_t(b)]), p.window, P);
    for (int64_t h = 0; h < Hq; ++h) {
      const int g = int(h / G);
      tokens.clear();
      if (p.selection) {
        const int64_t r = b * c.kv_heads + g;
        for (int32_t i = p.selection->row_ptr[size_t(r)]; i < p.selection->row_ptr[size_t(r) + 1]; ++i) {
          const int64_t page = p.selection->pages[size_t(i)];
          for (int64_t t = std::max(vis.first, page * P); t < std::min(vis.length, (page + 1) * P); ++t)
            tokens.push_back(t);
        }
      } else {
        for (int64_t t = vis.first; t < vis.length; ++t) tokens.push_back(t);
      }
      const double sink = p.sink_mode == SinkMode::none ? 0.0 : double(p.sink.get({h}));
      s.assign(tokens.size(), 0.0);
      double mx = p.sink_mode == SinkMode::denominator ? sink : -std::numeric_limits<double>::infinity();
      for (size_t j = 0; j < tokens.size(); ++j) {
        const int64_t t = tokens[j];
        const int64_t base = ((int64_t(table[size_t(t / P)]) * c.kv_heads + g) * P + t % P) * d;
        double dot = 0;
        for (int i = 0; i < d; ++i)
          dot += double(load(qp, p.q.dtype, b * p.q.stride[0] + h * p.q.stride[1] + i)) * double(load(kp, c.dtype, base + i));
        s[j] = scale * dot + (t == 0 && p.sink_mode == SinkMode::key0_bias ? sink : 0.0);
        mx = std::max(mx, s[j]);
      }
      std::fill(o.begin(), o.end(), 0.0);
      double z = 0;
      if (!tokens.empty() || p.sink_mode == SinkMode::denominator) {
        if (p.sink_mode == SinkMode::denominator) z += std::exp(sink - mx);
        for (size_t j = 0; j < tokens.size(); ++j) {
          const int64_t t = tokens[j];
          const int64_t base = ((int64_t(table[size_t(t / P)]) * c.kv_heads + g) * P + t % P) * d;
          const double e = std::exp(s[j] - mx);
          z += e;
          for (int i = 0; i < d; ++i) o[size_t(i)] += e * double(load(vp, c.dtype, base + i));
        }
      }
      // A NaN logit makes z NaN: it propagates to the row (docs/numerics.md), never reads as "no key".
      const bool any = z > 0 || std::isnan(z);
      std::vector<float> out(static_cast<size_t>(d));
      for (int i = 0; i < d; ++i) out[size_t(i)] = any ? float(o[size_t(i)] / z) : 0.f;
      store_row(p.out, b, h, out.data(), d);
      if (p.lse.defined())
        static_cast<float*>(p.lse.data)[b * Hq + h] =
            any ? float(mx + std::log(z)) : -std::numeric_limits<float>::infinity();
    }
  }
}

}  // namespace ariadne::decode_detail
