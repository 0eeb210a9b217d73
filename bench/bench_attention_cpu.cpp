// Fast CPU attention: GFLOP/s with mask-aware counts next to the machine's measured FMA peak, on
// the CPU backend's reference shapes: H 16, d 80 / 128, N 1024 / 4096, fp32 / bf16, and the
// patterns full, window ±64, chunk 64 and block-sparse 50 % (blocks of 64 over the full pattern).
//
// FLOPs = allowed (query, key) pairs × 4 × d × heads: one multiply-add for Q·Kᵀ and one for P·V per
// pair and head-dim entry, as FlashAttention counts a forward pass. Masked pairs are not counted, so
// a sparse pattern gets no credit for work it skips.
//
// Peak: BM_FmaPeak runs independent 512-bit (or 256-bit) FMA chains on every worker thread, the
// same threads the attention uses; BM_Bf16DotPeak does the same with vdpbf16ps (2 multiply-adds
// per fp32 lane). Counters "peak_frac" divide by the fp32 FMA peak measured at start-up.
//
// BM_AttentionBackward times the backward (attention_backward.hpp) on the ViT shapes, from a
// plan made once, with GFLOP/s at 2.5× the forward's count (see below).
//
// Flags besides Google Benchmark's: none. Environment: ARIADNE_THREADS, ARIADNE_CPU_ISA.
#include <benchmark/benchmark.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "ariadne/attention.hpp"
#include "ariadne/attention_backward.hpp"
#include "attention/cpu/attention_kernels.hpp"

namespace ariadne {
namespace {

// ---- peak microbenchmarks ----
constexpr int kChains = 12;  // independent accumulators: covers FMA latency × ports

__attribute__((target("avx512f,fma"))) double fma_loop_avx512(int64_t iters) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(float(i) * 1e-3f);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it)
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  __m512 s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm512_add_ps(s, acc[i]);
  benchmark::DoNotOptimize(s);
  return double(iters) * kChains * 16 * 2;
}

__attribute__((target("avx2,fma"))) double fma_loop_avx2(int64_t iters) {
  __m256 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_ps(float(i) * 1e-3f);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it)
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  __m256 s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm256_add_ps(s, acc[i]);
  benchmark::DoNotOptimize(s);
  return double(iters) * kChains * 8 * 2;
}

__attribute__((target("avx512f,avx512bf16"))) double bf16_loop(int64_t iters) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(float(i) * 1e-3f);
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.5f), _mm512_set1_ps(0.25f));
  for (int64_t it = 0; it < iters; ++it)
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, a);
  __m512 s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm512_add_ps(s, acc[i]);
  benchmark::DoNotOptimize(s);
  return double(iters) * kChains * 32 * 2;
}

// TDPBF16PS on four independent 16×16 fp32 accumulators (two A and two B tiles): 16·16·32 multiply-
// adds per instruction. The configuration goes through an asm memory operand, as the kernel table
// loads it (attention_amx.cpp: GCC 12 drops the stores before _tile_loadconfig).
__attribute__((target("amx-tile,amx-bf16"))) double amx_loop(int64_t iters) {
  struct alignas(64) {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
    uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
  } config;
  asm volatile("ldtilecfg %0" : : "m"(config));
  alignas(64) uint16_t operand[16 * 32];
  for (int i = 0; i < 16 * 32; ++i) operand[i] = 0x3f00;  // 0.5
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, operand, 64);
  _tile_loadd(5, operand, 64);
  _tile_loadd(6, operand, 64);
  _tile_loadd(7, operand, 64);
  for (int64_t it = 0; it < iters; ++it) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) float out[16 * 16];
  _tile_stored(0, out, 64);
  _tile_release();
  benchmark::DoNotOptimize(out[0]);
  return double(iters) * 4 * 16 * 16 * 32 * 2;
}

// FLOPs of `iters` loop trips on every worker thread, in parallel. The FMA width is the active
// table's (ARIADNE_CPU_ISA=avx2 on an AVX-512 CPU measures the AVX2 peak its kernels can reach).
double run_peak(bool bf16, int64_t iters) {
  const std::string table = cpu::active_tile_kernels().name;
  const bool has512 = table.starts_with("avx512") || table == "amx";  // AMX: the AVX-512 table plus tiles
  double flops = 0;
#pragma omp parallel num_threads(cpu_threads()) reduction(+ : flops)
  flops += bf16 ? bf16_loop(iters) : has512 ? fma_loop_avx512(iters) : fma_loop_avx2(iters);
  return flops;
}

double g_fma_peak = 0;  // GFLOP/s, measured in main()

// Best of many short runs: on a shared machine one of them is likely undisturbed.
double measure_fma_peak() {
  run_peak(false, 1 << 20);  // warm-up (clocks, thread pool)
  double best = 0;
  for (int rep = 0; rep < 40; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    const double f = run_peak(false, 1 << 20);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, f / s * 1e-9);
  }
  return best;
}

void BM_FmaPeak(benchmark::State& st) {
  double flops = 0;
  for (auto _ : st) flops += run_peak(false, 1 << 22);
  st.counters["GFLOPs"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsRate);
  st.counters["threads"] = cpu_threads();
}
BENCHMARK(BM_FmaPeak)->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_Bf16DotPeak(benchmark::State& st) {
  const std::string table = cpu::active_tile_kernels().name;
  if (table != "avx512bf16" && table != "amx") {
    st.SkipWithError("the active kernel table has no AVX-512 BF16 dot product");
    return;
  }
  double flops = 0;
  for (auto _ : st) flops += run_peak(true, 1 << 22);
  st.counters["GFLOPs"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsRate);
  st.counters["threads"] = cpu_threads();
}
BENCHMARK(BM_Bf16DotPeak)->UseRealTime()->Unit(benchmark::kMillisecond);

// The AMX bf16 peak of the worker threads (the target of issue 34 is half of it); runs where the
// active table is "amx" (ARIADNE_CPU_ISA=amx), which also means the OS granted the tile state.
void BM_AmxPeak(benchmark::State& st) {
  if (std::string(cpu::active_tile_kernels().name) != "amx") {
    st.SkipWithError("the active kernel table is not amx");
    return;
  }
  double flops = 0;
  for (auto _ : st) {
#pragma omp parallel num_threads(cpu_threads()) reduction(+ : flops)
    flops += amx_loop(1 << 16);
  }
  st.counters["GFLOPs"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsRate);
  st.counters["threads"] = cpu_threads();
}
BENCHMARK(BM_AmxPeak)->UseRealTime()->Unit(benchmark::kMillisecond);

// ---- attention ----
enum PatternKind { kFull, kWindow64, kChunk64, kBlocks50 };
const char* const kPatternNames[] = {"full", "window64", "chunk64", "blocks50"};

struct Problem {
  Buffer q, k, v, out;
  BlockMask mask;
  AttentionParams params;
  double flops = 0;
};

Problem make_problem(int64_t n, int heads, int d, DType dt, PatternKind kind) {
  Problem pr;
  pr.q = Buffer(dt, {n, heads, d});
  pr.k = Buffer(dt, {n, heads, d});
  pr.v = Buffer(dt, {n, heads, d});
  pr.out = Buffer(dt, {n, heads, d});
  pr.q.fill_random(1);
  pr.k.fill_random(2);
  pr.v.fill_random(3);
  AttentionParams& p = pr.params;
  p.q = pr.q.view();
  p.k = pr.k.view();
  p.v = pr.v.view();
  p.out = pr.out.view();
  switch (kind) {
    case kFull: p.pattern = Pattern::full(); break;
    case kWindow64: p.pattern = Pattern::window(64, 64); break;
    case kChunk64: p.pattern = Pattern::chunked(64); break;
    case kBlocks50: {
      // Half of the 64×64 blocks of each (head, query block), drawn at random.
      constexpr int kBlock = 64;
      const int64_t nb = (n + kBlock - 1) / kBlock;
      std::mt19937_64 rng(7);
      std::vector<std::vector<int32_t>> rows;
      for (int h = 0; h < heads; ++h)
        for (int64_t m = 0; m < nb; ++m) {
          std::vector<int32_t> cols(static_cast<size_t>(nb));
          for (int64_t j = 0; j < nb; ++j) cols[size_t(j)] = int32_t(j);
          std::shuffle(cols.begin(), cols.end(), rng);
          cols.resize(size_t(nb / 2));
          std::sort(cols.begin(), cols.end());
          rows.push_back(cols);
        }
      pr.mask = BlockMask::from_lists(kBlock, heads, {n}, rows);
      p.pattern = Pattern::full().with_blocks(pr.mask.view());
      break;
    }
  }
  // Allowed pairs, counted exactly from the pattern (per head for block masks).
  double pairs = 0;
  const SeqExtent e = p.pattern.seq(0, n, n);
  for (int h = 0; h < heads; ++h)
    for (int64_t i = 0; i < n; ++i) {
      const KeyRange r = p.pattern.key_range(e, i, i + 1);
      if (!p.pattern.blocks.defined()) {
        pairs += double(r.hi - r.lo);
        continue;
      }
      const int64_t row = p.pattern.block_row(0, e, h, i / p.pattern.blocks.block), B = p.pattern.blocks.block;
      for (int32_t x = p.pattern.blocks.row_ptr[row]; x < p.pattern.blocks.row_ptr[row + 1]; ++x) {
        const int64_t kb = p.pattern.blocks.col_idx[x];
        pairs += double(std::max<int64_t>(0, std::min((kb + 1) * B, r.hi) - std::max(kb * B, r.lo)));
      }
    }
  pr.flops = pairs * 4.0 * d;  // pairs already summed over heads
  return pr;
}

// The counters both attention benchmarks report: GFLOP/s of `gflop` per iteration, its share of the
// measured FMA peak, the peak, the thread count; the label names pattern, dtype and ISA table.
void report(benchmark::State& st, double gflop, PatternKind kind, DType dt) {
  st.counters["GFLOPs"] = benchmark::Counter(gflop * double(st.iterations()), benchmark::Counter::kIsRate);
  st.counters["peak_frac"] =
      benchmark::Counter(gflop * double(st.iterations()) / g_fma_peak, benchmark::Counter::kIsRate);
  st.counters["fma_peak_GFLOPs"] = g_fma_peak;
  st.counters["threads"] = cpu_threads();
  st.SetLabel(std::string(kPatternNames[kind]) + " " + dtype_name(dt) + " " + cpu::active_tile_kernels().name);
}

void BM_Attention(benchmark::State& st) {
  const int64_t n = st.range(0);
  const int d = int(st.range(1));
  const DType dt = st.range(2) == 0 ? DType::f32 : DType::bf16;
  const auto kind = PatternKind(st.range(3));
  constexpr int kHeads = 16;
  Problem pr = make_problem(n, kHeads, d, dt, kind);
  for (auto _ : st) {
    attention(pr.params, Backend::cpu);
    benchmark::DoNotOptimize(pr.out.data());
    benchmark::ClobberMemory();
  }
  report(st, pr.flops * 1e-9, kind, dt);
}

void attention_args(benchmark::internal::Benchmark* b) {
  for (int64_t n : {1024, 4096})
    for (int64_t d : {80, 128})
      for (int64_t dt : {0, 1})
        for (int64_t kind : {kFull, kWindow64, kChunk64, kBlocks50}) b->Args({n, d, dt, kind});
  b->ArgNames({"N", "d", "bf16", "pattern"});
}
BENCHMARK(BM_Attention)->Apply(attention_args)->UseRealTime()->Unit(benchmark::kMillisecond);

// ---- backward ----
// FLOPs = allowed pairs × 10 × d × heads: the five products of a backward (S and dP recomputed,
// dq, dk, dv), 2.5× the forward's count as FlashAttention counts a backward pass. Ariadne's CPU
// backward computes S and dP twice (once per pass: backward.hpp), work not counted here.
struct BackwardProblem {
  Problem fwd;
  Buffer lse, dout, dq, dk, dv;
  AttentionGrads grads;
};

BackwardProblem make_backward_problem(int64_t n, int heads, int d, DType dt, PatternKind kind) {
  BackwardProblem bp;
  bp.fwd = make_problem(n, heads, d, dt, kind);
  bp.lse = Buffer(DType::f32, {heads, n});
  bp.fwd.params.lse = bp.lse.view();
  attention(bp.fwd.params, Backend::cpu);
  bp.dout = Buffer(dt, {n, heads, d});
  bp.dout.fill_random(4);
  for (Buffer* b : {&bp.dq, &bp.dk, &bp.dv}) *b = Buffer(dt, {n, heads, d});
  bp.grads.dout = bp.dout.view();
  bp.grads.dq = bp.dq.view();
  bp.grads.dk = bp.dk.view();
  bp.grads.dv = bp.dv.view();
  return bp;
}

void BM_AttentionBackward(benchmark::State& st) {
  const int64_t n = st.range(0);
  const int d = int(st.range(1));
  const DType dt = st.range(2) == 0 ? DType::f32 : DType::bf16;
  const auto kind = PatternKind(st.range(3));
  constexpr int kHeads = 16;
  BackwardProblem bp = make_backward_problem(n, kHeads, d, dt, kind);
  BackwardOptions opt;
  opt.backend = Backend::cpu;
  const AttentionBackwardPlan plan = plan_attention_backward(bp.fwd.params, bp.grads, opt);
  for (auto _ : st) {
    run(plan, bp.fwd.params, bp.grads);
    benchmark::DoNotOptimize(bp.dq.data());
    benchmark::ClobberMemory();
  }
  report(st, bp.fwd.flops * 2.5 * 1e-9, kind, dt);
}

// The ViT shapes of issue 30: d 80, full and window ±64.
void backward_args(benchmark::internal::Benchmark* b) {
  for (int64_t n : {1024, 4096})
    for (int64_t dt : {0, 1})
      for (int64_t kind : {kFull, kWindow64}) b->Args({n, 80, dt, kind});
  b->ArgNames({"N", "d", "bf16", "pattern"});
}
BENCHMARK(BM_AttentionBackward)->Apply(backward_args)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace ariadne

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  ariadne::g_fma_peak = ariadne::measure_fma_peak();
  benchmark::AddCustomContext("fma_peak_GFLOPs", std::to_string(ariadne::g_fma_peak));
  benchmark::AddCustomContext("threads", std::to_string(ariadne::cpu_threads()));
  benchmark::AddCustomContext("kernels", ariadne::cpu::active_tile_kernels().name);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
