// The CPU decode (include/ariadne/decode.hpp): split-K over pages. Each task is one sequence, one
// GQA group and a run of its pages; it reads those pages once for all the group's query heads and
// leaves (m, l, acc) per head; the runs of a row are merged by their log-sum-exp. The number of
// runs per row grows until there are about two tasks per thread, so batch 1 at a long context
// still fills every core.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attention/cpu/attention_kernels.hpp"
#include "decode/cpu/decode_kernel.hpp"
#include "decode/internal.hpp"

namespace ariadne::decode_detail {

namespace {

// The decode table that matches the attention kernels' table (ARIADNE_CPU_ISA, force_tile_kernels).
DecodeTaskFn active_task() {
  const std::string isa = cpu::active_tile_kernels().name;
  DecodeTaskFn f = nullptr;
  if (isa.starts_with("avx512") || isa == "amx") f = decode_task_avx512();  // decode has no tile-unit product
  else if (isa == "avx2") f = decode_task_avx2();
  return f ? f : decode_task_generic();
}

// Fewer pages than this per run cost more in merging than they gain in parallelism.
constexpr int64_t kMinPagesPerRun = 4;

}  // namespace

ScoreKernels active_score_kernels() {
  const std::string isa = cpu::active_tile_kernels().name;
  ScoreKernels k;
  if (isa.starts_with("avx512") || isa == "amx") k = score_kernels_avx512();
  else if (isa == "avx2") k = score_kernels_avx2();
  return k.dot ? k : score_kernels_generic();
}

void decode_cpu(const DecodeParams& p) {
  const PagedKVCache& cache = *p.cache;
  const KVCacheConfig& c = cache.config();
  const int64_t B = p.q.shape[0], Hq = p.q.shape[1];
  const int d = c.head_dim, P = c.page_size, H = c.kv_heads, G = int(Hq / H);
  const float scale = p.scale > 0 ? p.scale : 1.f / std::sqrt(float(d));
  const int64_t rows = B * H;

  // Per row (b, g): the pages it reads.
  std::vector<std::vector<int32_t>> lists(static_cast<size_t>(rows));
  std::vector<Visible> vis(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) vis[size_t(b)] = visible_of(cache.length(p.seqs[size_t(b)]), p.window, P);
  for (int64_t r = 0; r < rows; ++r) {
    const Visible& v = vis[size_t(r / H)];
    std::vector<int32_t>& l = lists[size_t(r)];
    if (p.selection) {
      l.assign(p.selection->pages.begin() + p.selection->row_ptr[size_t(r)],
               p.selection->pages.begin() + p.selection->row_ptr[size_t(r) + 1]);
    } else {
      for (int64_t pg = v.page_lo; pg <= v.page_hi; ++pg) l.push_back(int32_t(pg));
    }
  }
  const int threads = cpu_threads();
  const int64_t want = std::max<int64_t>(1, (2 * int64_t(threads) + rows - 1) / rows);
  struct Run {
    int64_t row, begin, end;
  };
  std::vector<Run> runs;
  std::vector<int64_t> first_run(size_t(rows) + 1, 0);
  for (int64_t r = 0; r < rows; ++r) {
    first_run[size_t(r)] = int64_t(runs.size());
    const int64_t n = int64_t(lists[size_t(r)].size());
    const int64_t splits = std::max<int64_t>(1, std::min(want, n / kMinPagesPerRun));
    for (int64_t s = 0; s < splits; ++s) runs.push_back({r, n * s / splits, n * (s + 1) / splits});
  }
  first_run[size_t(rows)] = int64_t(runs.size());

  // Queries as f32 [B][Hq][d] (a group's heads adjacent), partials per run.
  std::vector<float> q(size_t(B * Hq * d));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int i = 0; i < d; ++i)
        q[size_t((b * Hq + h) * d + i)] = load(static_cast<const unsigned char*>(p.q.data), p.q.dtype,
                                               b * p.q.stride[0] + h * p.q.stride[1] + i);
  std::vector<float> key0(size_t(Hq), 0.f);
  if (p.sink_mode == SinkMode::key0_bias)
    for (int64_t h = 0; h < Hq; ++h) key0[size_t(h)] = p.sink.get({h});
  const int64_t nruns = int64_t(runs.size());
  std::vector<float> m(size_t(nruns * G)), l(size_t(nruns * G)), acc(size_t(nruns * G * d));
  const DecodeTaskFn task = active_task();
  const unsigned char* kp = static_cast<const unsigned char*>(cache.k_pool().data);
  const unsigned char* vp = static_cast<const unsigned char*>(cache.v_pool().data);
#pragma omp parallel num_threads(threads) if (nruns > 1)
  {
    std::vector<float> kf(size_t(P) * size_t(d)), vf(size_t(P) * size_t(d)), s(size_t(G) * size_t(P));
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < nruns; ++i) {
      const Run& run = runs[size_t(i)];
      const int64_t b = run.row / H;
      DecodeTask t;
      t.g = int(run.row % H);
      t.q = q.data() + (b * Hq + int64_t(t.g) * G) * d;
      t.k = kp, t.v = vp, t.dtype = c.dtype;
      t.table = cache.page_table(p.seqs[size_t(b)]).data();
      t.pages = lists[size_t(run.row)].data() + run.begin;
      t.npages = run.end - run.begin;
      t.first = vis[size_t(b)].first, t.length = vis[size_t(b)].length;
      t.P = P, t.kv_heads = H, t.d = d, t.G = G, t.scale = scale;
      t.key0_bias = p.sink_mode == SinkMode::key0_bias ? key0.data() + int64_t(t.g) * G : nullptr;
      t.m = m.data() + i * G, t.l = l.data() + i * G, t.acc = acc.data() + i * G * d;
      t.kf = kf.data(), t.vf = vf.data(), t.s = s.data();
      task(t);
    }
  }
  // Merge the runs of each (b, h): out = Σ e^(m_i − M) acc_i / (Σ e^(m_i − M) l_i [+ e^(sink − M)]).
  const float ninf = -std::numeric_limits<float>::infinity();
#pragma omp parallel for schedule(static) num_threads(threads) if (rows * G * d > (1 << 15))
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = r / H, g = r % H;
    for (int hg = 0; hg < G; ++hg) {
      const int64_t h = g * G + hg;
      const bool den = p.sink_mode == SinkMode::denominator;
      const float sink = den ? p.sink.get({h}) : 0.f;
      float M = den ? sink : ninf;
      bool nan = false;
      for (int64_t i = first_run[size_t(r)]; i < first_run[size_t(r) + 1]; ++i) {
        const float mi = m[size_t(i * G + hg)];
        nan |= std::isnan(mi);
        M = std::max(M, mi);
      }
      std::vector<float> out(size_t(d), 0.f);  // no key and no sink: 0
      float lse = ninf;
      if (nan) {
        std::fill(out.begin(), out.end(), std::numeric_limits<float>::quiet_NaN());
        lse = std::numeric_limits<float>::quiet_NaN();
      } else if (M != ninf) {
        double z = den ? std::exp(double(sink) - M) : 0.0;
        std::vector<double> o(size_t(d), 0.0);
        for (int64_t i = first_run[size_t(r)]; i < first_run[size_t(r) + 1]; ++i) {
          const float mi = m[size_t(i * G + hg)];
          if (mi == ninf) continue;
          const double w = std::exp(double(mi) - M);
          z += w * l[size_t(i * G + hg)];
          const float* a = acc.data() + (i * G + hg) * d;
          for (int j = 0; j < d; ++j) o[size_t(j)] += w * a[j];
        }
        for (int j = 0; j < d; ++j) out[size_t(j)] = float(o[size_t(j)] / z);
        lse = float(M + std::log(z));
      }
      store_row(p.out, b, h, out.data(), d);
      if (p.lse.defined()) static_cast<float*>(p.lse.data)[b * Hq + h] = lse;
    }
  }
}

}  // namespace ariadne::decode_detail
