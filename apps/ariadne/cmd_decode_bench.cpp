// `ariadne decode-bench`: decode steps over the paged KV cache on synthetic long contexts at a
// model's attention shape (default Llama-3.1-8B: 32 query / 8 KV heads, head dim 128, bf16 cache):
// dense decode time and the bandwidth it reaches on the KV bytes against a copy of as many bytes
// in the same run, then each sparse decode (scorer × τ): selection and attention time, pages read,
// the oracle's mass of the kept pages and the output error against dense.
//
//   ariadne decode-bench --context 8192,32768 --batch 1,4 --decode rr,quest,oracle --decode-tau 0.8,0.9
//
// The contexts come from the synthetic heads (src/workloads/synthetic.hpp: sink, local, stripe and
// needle heads by default), one seed per sequence of the batch; the query of each sequence is the
// synthetic query at its last position, attending to the whole context (itself included).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <numeric>
#include <string>
#include <vector>

#include "ariadne/attention.hpp"
#include "ariadne/decode.hpp"
#include "ariadne/error.hpp"
#include "ariadne/estimate.hpp"
#include "cli.hpp"
#include "workloads/synthetic.hpp"

namespace {

using ariadne::cli::Args;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

// Median wall time of `repeats` calls, in ms.
template <class F>
double median_ms(int repeats, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = Clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// The copy floor: `bytes` copied between two buffers by all threads, read + write bytes per second.
double copy_gbps(int64_t bytes, int repeats) {
  std::vector<unsigned char> src(size_t(bytes), 1), dst(size_t(bytes), 0);
  const int threads = ariadne::cpu_threads();
  const double ms = median_ms(repeats, [&] {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int t = 0; t < threads; ++t) {
      const int64_t lo = bytes * t / threads, hi = bytes * (t + 1) / threads;
      std::memcpy(dst.data() + lo, src.data() + lo, size_t(hi - lo));
    }
  });
  volatile unsigned char sink = dst[size_t(bytes / 2)];
  (void)sink;
  return 2.0 * double(bytes) / (ms * 1e6);
}

int run_decode_bench(const Args& a) {
  const int Hq = a.i32("heads"), Hkv = a.i32("kv-heads"), d = a.i32("head-dim"), P = a.i32("page-size");
  const int repeats = a.i32("repeat");
  if (Hq % Hkv != 0) a.fail("heads", std::to_string(Hq) + " is not a multiple of --kv-heads " + std::to_string(Hkv));
  if (d % 2 != 0) a.fail("head-dim", "must be even (the synthetic heads are RoPE'd)");
  const int S = a.i32("summary-stride");
  if (P % S != 0)
    a.fail("page-size", std::to_string(P) + " is not a multiple of --summary-stride " + std::to_string(S));
  try {
    ariadne::parse_head_mix(a.str("mix"));
  } catch (const ariadne::Error& e) {
    a.fail("mix", e.what());
  }
  if (a.given("threads")) ariadne::set_cpu_threads(a.i32("threads"));
  const ariadne::DType dtype = ariadne::parse_dtype(a.str("dtype"));
  json rows = json::array();
  for (const int64_t N : a.i64s("context"))
    for (const int B : a.i32s("batch")) {
      ariadne::PagedKVCache cache(ariadne::KVCacheConfig{P, Hkv, d, dtype, S});
      std::vector<int32_t> seqs;
      std::vector<float> q(size_t(B) * size_t(Hq) * size_t(d));
      for (int b = 0; b < B; ++b) {
        ariadne::SyntheticConfig sc;
        sc.tokens = N, sc.heads_q = Hq, sc.heads_kv = Hkv, sc.dim = d, sc.rope_theta = a.real("rope-theta");
        sc.mix = a.str("mix"), sc.seed = uint64_t(a.i64("seed") + b);
        const ariadne::Synthetic syn = ariadne::make_synthetic(sc);
        const float* last = static_cast<const float*>(syn.q.view().data) + (N - 1) * Hq * d;
        std::copy_n(last, Hq * d, q.data() + size_t(b) * Hq * d);
        seqs.push_back(cache.add_sequence());
        cache.append(seqs.back(), syn.k.view(), syn.v.view());
      }
      std::vector<float> dense(q.size()), out(q.size());
      ariadne::DecodeParams p;
      p.q = ariadne::make_view(q.data(), ariadne::DType::f32, {B, Hq, d});
      p.out = ariadne::make_view(dense.data(), ariadne::DType::f32, {B, Hq, d});
      p.cache = &cache;
      p.seqs = seqs;
      const int64_t kv_bytes = int64_t(B) * N * Hkv * d * 2 * ariadne::dtype_size(dtype);
      ariadne::decode_attention(p);  // warm-up: page faults, thread pool
      const double ms_dense = median_ms(repeats, [&] { ariadne::decode_attention(p); });
      const double floor = copy_gbps(kv_bytes, repeats);
      const double gbps = double(kv_bytes) / (ms_dense * 1e6);
      json row = {{"context", N}, {"batch", B}, {"heads", Hq}, {"kv_heads", Hkv}, {"head_dim", d},
                  {"dtype", ariadne::dtype_name(dtype)}, {"page_size", P}, {"summary_stride", S}, {"threads", ariadne::cpu_threads()},
                  {"kv_bytes", kv_bytes}, {"ms_dense", ms_dense}, {"dense_gbps", gbps}, {"copy_gbps", floor},
                  {"dense_vs_copy", gbps / floor}};
      // The oracle's page masses, once: every scorer's recall is measured against them.
      const std::vector<std::vector<double>> masses = ariadne::page_masses(p);
      json sparse = json::array();
      for (const std::string& scorer : a.strs("decode"))
        for (const double tau : a.reals("decode-tau")) {
          ariadne::PageSelectConfig cfg;
          cfg.scorer = ariadne::parse_page_scorer(scorer);
          cfg.tau = tau;
          cfg.sink_pages = a.i32("sink-pages");
          cfg.recent_pages = a.i32("recent-pages");
          cfg.rotate = a.flag("decode-rotate");
          ariadne::PageSelection sel;
          const double ms_select = median_ms(repeats, [&] { sel = ariadne::select_pages(p, cfg); });
          ariadne::DecodeParams ps = p;
          ps.out = ariadne::make_view(out.data(), ariadne::DType::f32, {B, Hq, d});
          ps.selection = &sel;
          const double ms_attention = median_ms(repeats, [&] { ariadne::decode_attention(ps); });
          double recall = 0, worst = 1;
          for (const double kept : ariadne::kept_page_mass(p, sel, masses)) recall += kept, worst = std::min(worst, kept);
          const double err = ariadne::relative_l2_error(out.data(), dense.data(), out.size());
          sparse.push_back({{"scorer", scorer}, {"tau", tau}, {"density", sel.density()},
                            {"pages_read", sel.kept()}, {"pages_visible", sel.visible_total()},
                            {"ms_select", ms_select}, {"ms_attention", ms_attention},
                            {"attention_speedup", ms_dense / ms_attention},
                            {"step_speedup", ms_dense / (ms_select + ms_attention)},
                            {"select_share", ms_select / (ms_select + ms_attention)},
                            {"mass_recall", recall / double(sel.rows())}, {"min_mass_recall", worst},
                            {"out_rel_err", err}});
        }
      row["sparse"] = sparse;
      rows.push_back(row);
      if (!a.json()) {
        std::printf("context %lld batch %d: dense %.3f ms, %.1f GB/s on %.1f MiB of KV (copy %.1f GB/s, %.2fx)\n",
                    static_cast<long long>(N), B, ms_dense, gbps, double(kv_bytes) / (1 << 20), floor, gbps / floor);
        std::printf("  %-7s %5s %8s %10s %10s %9s %9s %8s %8s\n", "scorer", "tau", "density", "select ms", "attend ms",
                    "attend x", "step x", "recall", "out err");
        for (const json& s : sparse)
          std::printf("  %-7s %5.2f %8.3f %10.3f %10.3f %9.2f %9.2f %8.4f %8.4f\n",
                      s["scorer"].get<std::string>().c_str(), s["tau"].get<double>(), s["density"].get<double>(),
                      s["ms_select"].get<double>(), s["ms_attention"].get<double>(),
                      s["attention_speedup"].get<double>(), s["step_speedup"].get<double>(),
                      s["mass_recall"].get<double>(), s["out_rel_err"].get<double>());
      }
    }
  if (a.json()) ariadne::cli::print_json(rows);
  return 0;
}

using namespace ariadne::cli;
const Command reg{
    "decode-bench",
    "decode over the paged KV cache on synthetic long contexts: dense bandwidth, sparse decode speed and quality",
    {integer_list("context", "8192,32768", 16, 1 << 22, "context lengths (tokens per sequence)"),
     integer_list("batch", "1,4", 1, 4096, "sequences decoded per step"),
     integer("heads", 32, 1, 4096, "query heads"),
     integer("kv-heads", 8, 1, 4096, "KV heads (GQA)"),
     integer("head-dim", 128, 2, 1024, "head dimension (even)"),
     choice("dtype", "bf16", {"f32", "bf16", "f16"}, "KV cache storage"),
     integer("page-size", 64, 1, 4096, "tokens per KV cache page (a multiple of --summary-stride)"),
     integer("summary-stride", 8, 1, 4096, "rows per key-stride sum of a page (rr's stride)"),
     real("rope-theta", 500000, ariadne::cli::Range::above(1), "RoPE base of the synthetic heads"),
     text("mix", "sink:2,local:2,stripe:2,needle:2", "synthetic head types (src/workloads/synthetic.hpp)"),
     integer("seed", 1, 0, 1 << 30, "seed of the first sequence (the next ones count up)"),
     choice_list("decode", "rr,quest,oracle", {"oracle", "rr", "quest"}, "page scorers of sparse decode"),
     real_list("decode-tau", "0.8,0.9", ariadne::cli::Range::open_closed(0, 1), "page-mass thresholds"),
     integer("sink-pages", 1, 0, 1 << 20, "first pages always kept"),
     integer("recent-pages", 1, 0, 1 << 20, "last pages always kept"),
     boolean("decode-rotate", true, "rr: one query head of the group scores each key stride, rotated"),
     integer("repeat", 5, 1, 1000, "timed calls per figure (the median is reported)"),
     threads_option()},
    run_decode_bench};

}  // namespace
