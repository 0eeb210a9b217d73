// CUDA decode benchmark (issue 32): decode over the device paged KV cache (CudaKVCache) at the
// Llama-3.1-8B attention shape (32 query / 8 KV heads, d 128, bf16 cache, pages of 64), one query
// per sequence, dense and with an rr page selection, against a device-to-device copy of the same
// KV bytes in the same run. Prints one JSON list on stdout (one object per (context, batch)),
// progress on stderr.
//
// Inputs: random keys and values (uniform in [-1, 1], a fresh seed per sequence) appended to a host
// cache, copied to `sets` device twins so that the twins together hold ≥ 256 MiB (8 at most): the
// timed calls rotate over them, so a small context is not served from the 60 MB L2 by the call
// before. Per sequence and KV head a random direction r (components ±1); the group's queries are
// 2·r, and the keys of one page in 50 ("hot" pages) are r plus the noise, so those pages hold
// nearly all the attention mass: a needle workload on which a selection can keep few pages (the
// density the row reports). Dense decode reads every page whatever the values.
// Times (median of single calls, each between two events and queued behind a spinning kernel that
// outlasts the host's enqueue, bench/anchors.py's method):
//   ms_dense        decode_attention over every page (sequence ids in device memory: no upload)
//   dense_tbps      KV bytes read / ms_dense; copy_tbps: 2 · bytes / (time of a cudaMemcpyAsync
//                   of as many bytes), the copy floor (read + write); dense_vs_copy their ratio
//   ms_floor        the call's memory floor: one launch (cuda_memory_floor) that reads the same K and V
//                   bytes from the same rotated twins, and q, and writes q's bytes; floor_tbps = KV
//                   bytes / ms_floor, what any decode kernel of this call can reach at most
//   ms_sparse       the same call with the rr selection at τ (uploaded per call: its arrays travel
//                   in the call), density = kept / visible pages, ms_select the host selection time
//   ms_select_device  the rr selection on the device (select_pages into a CudaPageSelection);
//                   device_selection_equal: it keeps the host's pages
//   ms_sparse_step  a whole sparse step on the device: that selection, then decode over it;
//                   ms_sparse_graph the same two calls captured into a CUDA graph (one per twin) and
//                   launched; select_share = ms_select_device / ms_sparse_step
// The anchors (PyTorch SDPA with one query per sequence, its cuDNN and flash backends) are the
// issue's numbers until bench/anchors.py measures them in the same run.
//
// `--stride` is the cache's summary_stride (rows per key-stride sum): the rr selection reads
// kv_heads · d f32 per stride of `stride` rows, 1 / stride of the bytes of its K and V at 16 bits;
// `--rotate 0` scores every stride with every query head of the group instead of one.
// `--dense-only 1` times dense decode alone (stderr only; no selection, no JSON row).
//
//   bench_decode_cuda [--contexts 8192,32768,131072] [--batches 1,8] [--tau 0.9] [--page 64] [--stride 8]
//                     [--rotate 1] [--dense-only 0]

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ariadne/decode.hpp"
#include "ariadne/device.hpp"
#include "ariadne/error.hpp"
#include "kernels/bench_kernels.hpp"

namespace {

using namespace ariadne;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "bench_decode_cuda: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

std::vector<int64_t> list_of(const std::string& s) {
  std::vector<int64_t> v;
  size_t at = 0;
  while (at <= s.size()) {
    const size_t comma = s.find(',', at);
    v.push_back(std::stoll(s.substr(at, comma - at)));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return v;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Median of single calls behind a spin hold (see the header); call(i) enqueues call i.
template <class F>
double single_call_ms(F&& call) {
  double host_us = 0;
  for (int i = 0; i < 4; ++i) {
    check(cudaDeviceSynchronize(), "warm-up");
    const auto t0 = std::chrono::steady_clock::now();
    call(i);
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    if (i >= 2) host_us = std::max(host_us, us);
  }
  check(cudaDeviceSynchronize(), "warm-up");
  const double hold_us = 1.5 * host_us + 50;
  const int reps = 30;
  std::vector<cudaEvent_t> ev(size_t(2 * reps));
  for (cudaEvent_t& e : ev) check(cudaEventCreate(&e), "event");
  for (int r = 0; r < reps; ++r) {
    cuda_spin(nullptr, hold_us);
    check(cudaEventRecord(ev[size_t(2 * r)], nullptr), "record");
    call(r);
    check(cudaEventRecord(ev[size_t(2 * r + 1)], nullptr), "record");
  }
  check(cudaDeviceSynchronize(), "calls");
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    float t = 0;
    check(cudaEventElapsedTime(&t, ev[size_t(2 * r)], ev[size_t(2 * r + 1)]), "elapsed");
    ms.push_back(t);
  }
  for (cudaEvent_t e : ev) check(cudaEventDestroy(e), "event");
  return median(ms);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> contexts = {8192, 32768, 131072}, batches = {1, 8};
  double tau = 0.9;
  int page = 64, stride = 8;
  bool rotate = true, dense_only = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string o = argv[i], v = argv[i + 1];
    if (o == "--contexts") contexts = list_of(v);
    else if (o == "--batches") batches = list_of(v);
    else if (o == "--tau") tau = std::stod(v);
    else if (o == "--page") page = std::stoi(v);
    else if (o == "--stride") stride = std::stoi(v);
    else if (o == "--rotate") rotate = std::stoi(v) != 0;
    else if (o == "--dense-only") dense_only = std::stoi(v) != 0;
    else {
      std::fprintf(stderr, "bench_decode_cuda: unknown option %s\n", o.c_str());
      return 2;
    }
  }
  if (!cuda_available()) {
    std::printf("[]\n");
    std::fprintf(stderr, "bench_decode_cuda: no CUDA device\n");
    return 0;
  }
  const int Hq = 32, Hkv = 8, d = 128;
  nlohmann::json rows = nlohmann::json::array();
  for (const int64_t N : contexts)
    for (const int64_t B : batches) {
      std::fprintf(stderr, "context %lld batch %lld\n", static_cast<long long>(N), static_cast<long long>(B));
      PagedKVCache host(KVCacheConfig{page, Hkv, d, DType::bf16, stride});
      std::vector<int32_t> seqs;
      std::vector<float> qf(size_t(B * Hq * d));
      const int64_t chunk = 4096;
      std::vector<float> k(size_t(chunk * Hkv * d)), v(k.size());
      for (int64_t b = 0; b < B; ++b) {
        std::mt19937_64 rng(uint64_t(1000 + b));
        std::uniform_real_distribution<float> u(-1.f, 1.f);
        std::vector<float> r(size_t(Hkv * d));
        for (float& x : r) x = rng() & 1 ? 1.f : -1.f;
        for (int h = 0; h < Hq; ++h)
          for (int i = 0; i < d; ++i) qf[size_t((b * Hq + h) * d + i)] = 2.f * r[size_t(h / (Hq / Hkv) * d + i)];
        seqs.push_back(host.add_sequence());
        for (int64_t done = 0; done < N; done += chunk) {
          const int64_t n = std::min(chunk, N - done);
          for (int64_t t = 0; t < n; ++t) {
            const bool hot = ((done + t) / page) % 50 == 7;
            for (size_t i = 0; i < size_t(Hkv * d); ++i) {
              k[size_t(t * Hkv * d) + i] = u(rng) + (hot ? r[i] : 0.f);
              v[size_t(t * Hkv * d) + i] = u(rng);
            }
          }
          host.append(seqs.back(), make_view(k.data(), DType::f32, {n, Hkv, d}),
                      make_view(v.data(), DType::f32, {n, Hkv, d}));
        }
      }
      const int64_t kv_bytes = B * N * Hkv * d * 2 * 2;
      const int sets = int(std::clamp<int64_t>((int64_t(256) << 20) / std::max<int64_t>(kv_bytes, 1) + 1, 1, 8));
      std::vector<CudaKVCache> twins;
      for (int s = 0; s < sets; ++s) twins.emplace_back(host);
      Buffer qh(DType::bf16, {B, Hq, d});
      for (int64_t i = 0; i < qh.numel(); ++i) static_cast<uint16_t*>(qh.data())[i] = float_to_bf16(qf[size_t(i)]);
      const DeviceBuffer q = DeviceBuffer::from_host(qh);
      DeviceBuffer out(DType::f32, {B, Hq, d}), lse(DType::f32, {B, Hq});
      const DeviceBuffer ids = DeviceBuffer::from_ints(seqs);
      DecodeParams p;
      p.q = q.view();
      p.out = out.view();
      p.lse = lse.view();
      p.seqs = seqs;
      p.device_seqs = static_cast<const int32_t*>(ids.data());
      const double ms_dense = single_call_ms([&](int i) {
        DecodeParams c = p;
        c.device_cache = &twins[size_t(i % sets)];
        decode_attention(c, Backend::cuda);
      });
      std::vector<float> dense(size_t(out.bytes() / 4));
      out.copy_to_host(dense.data(), out.bytes());
      // The call's memory floor: one launch that reads the same K and V bytes from the same twins
      // (rotated as the decode is) and q, and writes as many bytes as q (bench_kernels.hpp).
      DeviceBuffer floor_out(DType::bf16, {B, Hq, d});
      const double ms_floor = single_call_ms([&](int i) {
        const CudaKVCache& t = twins[size_t(i % sets)];
        cuda_memory_floor(q.data(), t.k_pool(), t.v_pool(), floor_out.data(), int64_t(q.bytes()), kv_bytes / 2,
                          nullptr);
      });
      if (dense_only) {
        std::fprintf(stderr, "  dense %.4f ms, floor %.4f ms\n", ms_dense, ms_floor);
        continue;
      }
      DeviceBuffer src(DType::bf16, {kv_bytes / 2}), dst(DType::bf16, {kv_bytes / 2});
      src.fill_bytes(1);
      const double ms_copy = single_call_ms([&](int) {
        check(cudaMemcpyAsync(dst.data(), src.data(), size_t(kv_bytes), cudaMemcpyDeviceToDevice, nullptr), "copy");
      });
      // The rr selection on the host queries (the values the device reads), timed on the host.
      DecodeParams hp;
      hp.q = make_view(qf.data(), DType::f32, {B, Hq, d});
      for (float& x : qf) x = bf16_to_float(float_to_bf16(x));
      hp.cache = &host;
      hp.seqs = seqs;
      PageSelectConfig cfg;
      cfg.scorer = PageScorer::rr;
      cfg.tau = tau;
      cfg.rotate = rotate;
      const PageSelection sel = select_pages(hp, cfg);
      const double ms_sparse = single_call_ms([&](int i) {
        DecodeParams c = p;
        c.device_cache = &twins[size_t(i % sets)];
        c.selection = &sel;
        decode_attention(c, Backend::cuda);
      });
      std::vector<float> sparse(dense.size());
      out.copy_to_host(sparse.data(), out.bytes());
      // The same rule on the device, alone and as a step with decode, plain and from a graph.
      CudaPageSelection dsel;
      const double ms_select_device = single_call_ms([&](int i) {
        DecodeParams c = p;
        c.device_cache = &twins[size_t(i % sets)];
        select_pages(c, cfg, dsel);
      });
      const PageSelection dev_sel = dsel.to_host();
      const bool same = dev_sel.row_ptr == sel.row_ptr && dev_sel.pages == sel.pages;
      const auto step = [&](int i, void* stream) {
        DecodeParams c = p;
        c.device_cache = &twins[size_t(i % sets)];
        c.stream = stream;
        select_pages(c, cfg, dsel);
        c.device_selection = &dsel;
        decode_attention(c, Backend::cuda);
      };
      const double ms_sparse_step = single_call_ms([&](int i) { step(i, nullptr); });
      DecodeParams wp = p;
      wp.device_cache = &twins[0];
      wp.device_selection = &dsel;
      DeviceBuffer ws(DType::f32, {int64_t(decode_workspace_bytes(wp) / 4 + 1)});
      p.workspace = ws.data();
      p.workspace_bytes = ws.bytes();
      cudaStream_t cap = nullptr;
      check(cudaStreamCreateWithFlags(&cap, cudaStreamNonBlocking), "stream");
      std::vector<cudaGraphExec_t> graphs(static_cast<size_t>(sets));
      for (int t = 0; t < sets; ++t) {
        cudaGraph_t g = nullptr;
        check(cudaStreamBeginCapture(cap, cudaStreamCaptureModeThreadLocal), "capture");
        step(t, cap);
        check(cudaStreamEndCapture(cap, &g), "capture");
        check(cudaGraphInstantiate(&graphs[size_t(t)], g, 0), "instantiate");
        check(cudaGraphDestroy(g), "graph");
      }
      const double ms_sparse_graph =
          single_call_ms([&](int i) { check(cudaGraphLaunch(graphs[size_t(i % sets)], nullptr), "launch"); });
      for (cudaGraphExec_t g : graphs) check(cudaGraphExecDestroy(g), "graph");
      check(cudaStreamDestroy(cap), "stream");
      p.workspace = nullptr;
      p.workspace_bytes = 0;
      double num = 0, den = 0;
      for (size_t i = 0; i < dense.size(); ++i) {
        num += double(sparse[i] - dense[i]) * (sparse[i] - dense[i]);
        den += double(dense[i]) * dense[i];
      }
      const double tb = double(kv_bytes) / (ms_dense * 1e9), copy_tb = 2.0 * double(kv_bytes) / (ms_copy * 1e9);
      rows.push_back({{"context", N}, {"batch", B}, {"heads", Hq}, {"kv_heads", Hkv}, {"head_dim", d}, {"page", page},
                      {"summary_stride", stride}, {"rotate", rotate}, {"kv_bytes", kv_bytes}, {"sets", sets},
                      {"ms_dense", ms_dense},
                      {"dense_tbps", tb},
                      {"ms_copy", ms_copy}, {"copy_tbps", copy_tb}, {"dense_vs_copy", tb / copy_tb},
                      {"ms_floor", ms_floor}, {"floor_tbps", double(kv_bytes) / (ms_floor * 1e9)},
                      {"tau", tau}, {"density", sel.density()}, {"ms_select", sel.ms_select},
                      {"ms_sparse", ms_sparse}, {"sparse_speedup", ms_dense / ms_sparse},
                      {"sparse_out_rel_err", den > 0 ? std::sqrt(num / den) : 0.0},
                      {"ms_select_device", ms_select_device}, {"device_selection_equal", same},
                      {"ms_sparse_step", ms_sparse_step}, {"ms_sparse_graph", ms_sparse_graph},
                      {"sparse_step_speedup", ms_dense / ms_sparse_step},
                      {"sparse_graph_speedup", ms_dense / ms_sparse_graph},
                      {"select_share", ms_select_device / ms_sparse_step}});
      std::fprintf(stderr, "  dense %.4f ms (%.2f TB/s, copy %.2f TB/s), rr tau %.2f density %.3f: %.4f ms\n", ms_dense,
                   tb, copy_tb, tau, sel.density(), ms_sparse);
      std::fprintf(stderr, "  device select %.4f ms (%s the host's), step %.4f ms, graph %.4f ms\n", ms_select_device,
                   same ? "equals" : "DIFFERS from", ms_sparse_step, ms_sparse_graph);
    }
  std::printf("%s\n", rows.dump(1).c_str());
  return 0;
}
