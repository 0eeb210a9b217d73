// The CUDA scoring kernels (estimate.hpp, CudaScoring) against each other and against the CPU:
// which kernel the routing picks for each case and that the override runs the one it names (or
// says why not); rule (1) of docs/numerics.md (bit for bit with the f32 kernel on exact inputs)
// for every exact kernel; rule (2) (within 1e-5 of the f32 kernel) for every tensor-core kernel;
// the restructured and grouped kernels bit for bit the generic one's; the approximate wgmma build
// under rules (2) and (3); small cases of every kernel for compute-sanitizer; the key-stride sums.
// Kernels are picked through EstimateConfig::overrides, never through the environment.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ariadne/device.hpp"
#include "ariadne/estimate.hpp"
#include "common.hpp"
#include "cuda/cuda_common.hpp"
#include "cuda/estimate_cuda_common.hpp"
#include "estimate/cuda/estimate.cuh"

namespace ariadne {
namespace {

using namespace estimate_testing;

constexpr CudaScoring kKernels[] = {CudaScoring::wgmma_approximate, CudaScoring::wgmma_exact,
                                    CudaScoring::mma_grouped,       CudaScoring::mma_rr,
                                    CudaScoring::mma_generic,       CudaScoring::f32};

// Whether kernel k runs a case (the conditions estimate.hpp lists under CudaScoring; shared
// memory always suffices on the H200 at these head dims).
bool runs(CudaScoring k, Estimator e, DType dt, int dim, int spb) {
  const bool rr_case = e == Estimator::rr && (spb == 8 || spb == 16);
  switch (k) {
    case CudaScoring::f32:
    case CudaScoring::mma_generic: return true;
    case CudaScoring::mma_rr: return rr_case;
    case CudaScoring::mma_grouped: return rr_case && dt == DType::bf16;
    case CudaScoring::wgmma_exact:
    case CudaScoring::wgmma_approximate: return rr_case && dt == DType::bf16 && (dim + 15) / 16 * 16 == 128;
    default: return false;
  }
}

// Forces k in c where it runs the case, else the generic tensor-core kernel; returns the kernel forced.
CudaScoring force(EstimateConfig& c, CudaScoring k, DType dt, int dim) {
  const int spb = c.method == Estimator::oracle ? c.block : c.block / c.stride;
  c.overrides.scoring = runs(k, c.method, dt, dim, spb) ? k : CudaScoring::mma_generic;
  return c.overrides.scoring;
}

// The routing's choice (overrides.scoring automatic) for each kind of case: the wgmma kernel's
// approximate build on the Llama shape (its exact build under cuda_exact_scoring), the grouped
// kernel at other head dims with bf16, the restructured one for f16 and f32 RR, the generic one
// for XAttention, the oracle and other block / stride ratios, the f32 one when asked for.
TEST_F(CudaEstimate, AutomaticScoringPicksTheKernelOfEachCase) {
  struct Want {
    int dim;
    DType dt;
    Estimator e;
    int block, stride;
    bool exact, f32;
    CudaScoring want;
  };
  const Want cases[] = {
      {128, DType::bf16, Estimator::rr, 128, 8, false, false, CudaScoring::wgmma_approximate},
      {128, DType::bf16, Estimator::rr, 128, 16, false, false, CudaScoring::wgmma_approximate},
      {128, DType::bf16, Estimator::rr, 64, 8, false, false, CudaScoring::wgmma_approximate},
      {120, DType::bf16, Estimator::rr, 128, 8, false, false, CudaScoring::wgmma_approximate},
      {128, DType::bf16, Estimator::rr, 128, 8, true, false, CudaScoring::wgmma_exact},
      {64, DType::bf16, Estimator::rr, 128, 8, false, false, CudaScoring::mma_grouped},
      {64, DType::bf16, Estimator::rr, 128, 16, true, false, CudaScoring::mma_grouped},
      {128, DType::f16, Estimator::rr, 128, 8, false, false, CudaScoring::mma_rr},
      {128, DType::f32, Estimator::rr, 64, 8, false, false, CudaScoring::mma_rr},
      {128, DType::bf16, Estimator::xattn, 128, 8, false, false, CudaScoring::mma_generic},
      {128, DType::bf16, Estimator::oracle, 64, 8, false, false, CudaScoring::mma_generic},
      {128, DType::bf16, Estimator::rr, 32, 8, false, false, CudaScoring::mma_generic},
      {128, DType::bf16, Estimator::rr, 128, 8, false, true, CudaScoring::f32},
      {128, DType::bf16, Estimator::rr, 128, 8, true, true, CudaScoring::f32},
  };
  for (const Want& w : cases) {
    const std::string what = std::string(estimator_name(w.e)) + " " + dtype_name(w.dt) + " d " +
                             std::to_string(w.dim) + " B " + std::to_string(w.block) + " S " +
                             std::to_string(w.stride) + (w.exact ? " exact" : "") + (w.f32 ? " f32" : "");
    SCOPED_TRACE(what);
    const Inputs in = testing::make_inputs(make_case("route-" + what, {300}, {}, 4, 2, w.dim, w.dt));
    const OnDevice d = upload(in);
    EstimateConfig c;
    c.method = w.e;
    c.block = w.block;
    c.stride = w.stride;
    c.cuda_exact_scoring = w.exact;
    c.cuda_f32_scoring = w.f32;
    EXPECT_EQ(cuda_scoring_name(estimate(d.qv, d.kv, d.layout, c, Backend::cuda).stats.scoring),
              std::string(cuda_scoring_name(w.want)));
  }
}

// overrides.scoring runs the kernel it names wherever that kernel can run the case, whatever
// cuda_f32_scoring and cuda_exact_scoring say (bf16 RR at head_dim 128, S 8, B 128: every kernel
// applies), and elsewhere throws an error naming the override, the kernel and the reason.
TEST_F(CudaEstimate, OverrideRunsTheNamedKernelOrSaysWhyNot) {
  const Inputs in = testing::make_inputs(make_case("override", {1100}, {}, 8, 2, 128, DType::bf16));
  const OnDevice d = upload(in);
  for (const CudaScoring k : kKernels)
    for (const bool numerics : {false, true}) {
      SCOPED_TRACE(std::string(cuda_scoring_name(k)) + (numerics ? " with f32 and exact asked for" : ""));
      EstimateConfig c;
      c.cuda_f32_scoring = numerics;
      c.cuda_exact_scoring = numerics;
      c.overrides.scoring = k;
      EXPECT_EQ(cuda_scoring_name(estimate(d.qv, d.kv, d.layout, c, Backend::cuda).stats.scoring),
                std::string(cuda_scoring_name(k)));
    }
  struct Refused {
    const char* name;
    int dim;
    DType dt;
    Estimator e;
    int block;
    CudaScoring k;
    const char* reason;
  };
  const Refused refused[] = {
      {"xattn", 128, DType::bf16, Estimator::xattn, 128, CudaScoring::mma_rr, "RR only"},
      {"oracle", 128, DType::bf16, Estimator::oracle, 64, CudaScoring::wgmma_approximate, "RR only"},
      {"B/S 4", 128, DType::bf16, Estimator::rr, 32, CudaScoring::mma_grouped, "block / stride"},
      {"f16", 128, DType::f16, Estimator::rr, 128, CudaScoring::mma_grouped, "bf16"},
      {"f32 in", 128, DType::f32, Estimator::rr, 128, CudaScoring::wgmma_exact, "bf16"},
      {"d64", 64, DType::bf16, Estimator::rr, 128, CudaScoring::wgmma_approximate, "head_dim"},
  };
  for (const Refused& r : refused) {
    SCOPED_TRACE(std::string(r.name) + " " + cuda_scoring_name(r.k));
    const Inputs ri = testing::make_inputs(make_case(std::string("refused-") + r.name, {300}, {}, 4, 2, r.dim, r.dt));
    const OnDevice rd = upload(ri);
    EstimateConfig c;
    c.method = r.e;
    c.block = r.block;
    c.overrides.scoring = r.k;
    try {
      estimate(rd.qv, rd.kv, rd.layout, c, Backend::cuda);
      ADD_FAILURE() << "the override was accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("overrides.scoring"), std::string::npos) << msg;
      EXPECT_NE(msg.find(cuda_scoring_name(r.k)), std::string::npos) << msg;
      EXPECT_NE(msg.find(r.reason), std::string::npos) << msg;
    }
  }
}

// Replaces q and k by integers in [−r, r] (exact in every dtype).
void integer_inputs(Inputs& in, int r, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_int_distribution<int> u(-r, r);
  for (Buffer* b : {&in.q, &in.k}) {
    const int64_t n = b->numel();
    if (b->dtype() == DType::bf16) {
      uint16_t* p = b->as<uint16_t>();
      for (int64_t i = 0; i < n; ++i) p[i] = float_to_bf16(float(u(g)));
    } else {
      ASSERT_EQ(b->dtype(), DType::f32);
      float* p = b->as<float>();
      for (int64_t i = 0; i < n; ++i) p[i] = float(u(g));
    }
  }
}

// Rule (1) of docs/numerics.md: on inputs whose products and sums are exact in f32 (integers in
// [−3, 3]: |q·K̄| <= 128 · 3 · 48 < 2^24, and a scale with scale / S a power of two), the
// tensor-core logits equal the f32 kernel's bit for bit, so the scores and masks of kernel k
// (forced where it runs the case: see force; the generic kernel elsewhere) and the f32 kernel
// must be identical, and both match the CPU under the usual rule. bf16 and f32 inputs, RR and
// XAttention, S 8 and 16 at B 128.
void exact_on_integers(CudaScoring k) {
  for (DType dt : {DType::bf16, DType::f32}) {
    Inputs in = testing::make_inputs(make_case(std::string("int-") + dtype_name(dt), {1900, 700}, {1900, 900}, 8, 2,
                                               128, dt));
    integer_inputs(in, 3, seed_base() ^ 0x5eedu);
    const OnDevice d = upload(in);
    for (Estimator e : {Estimator::rr, Estimator::xattn})
      for (int stride : {8, 16}) {
        EstimateConfig c;
        c.method = e;
        c.stride = stride;
        c.scale = float(stride) / 128.f;  // scale / S = 2^-7: logits of standard deviation ~1
        const CudaScoring ran = force(c, k, dt, 128);
        const std::string what = std::string(cuda_scoring_name(ran)) + " " + dtype_name(dt) + " " +
                                 estimator_name(e) + " S " + std::to_string(stride);
        SCOPED_TRACE(what);
        const EstimateResult tc = estimate(d.qv, d.kv, d.layout, c, Backend::cuda);
        EstimateConfig cf = c;
        cf.overrides.scoring = CudaScoring::f32;
        const EstimateResult f32 = estimate(d.qv, d.kv, d.layout, cf, Backend::cuda);
        ASSERT_EQ(tc.stats.scoring, ran);
        ASSERT_EQ(f32.stats.scoring, CudaScoring::f32);
        size_t differ = 0;
        for (size_t i = 0; i < tc.scores.size(); ++i) differ += tc.scores[i] != f32.scores[i];
        EXPECT_EQ(differ, size_t(0)) << "scores not bit-identical between the two kernels";
        EXPECT_TRUE(tc.mask.row_ptr == f32.mask.row_ptr && tc.mask.col_idx == f32.mask.col_idx)
            << "masks differ between the two kernels";
        check_config(in, d, c, "integers, " + what);
      }
  }
}

TEST_F(CudaEstimate, TensorCoreScoringExactOnIntegers) { exact_on_integers(CudaScoring::mma_generic); }
TEST_F(CudaEstimate, TensorCoreScoringRrExactOnIntegers) { exact_on_integers(CudaScoring::mma_rr); }
TEST_F(CudaEstimate, TensorCoreScoringGroupedExactOnIntegers) { exact_on_integers(CudaScoring::mma_grouped); }
TEST_F(CudaEstimate, TensorCoreScoringWgmmaExactOnIntegers) { exact_on_integers(CudaScoring::wgmma_exact); }

// Rule (2) of docs/numerics.md between two CUDA results of one config (`ref` the reference
// kernel's): scores within 1e-5, block lists identical on every row whose decision margin (from
// ref's scores) exceeds 1e-4, and those rows within it under 20%, counted and printed.
void expect_rule2(const EstimateResult& ref, const EstimateResult& got, const EstimateConfig& c, const char* label,
                  const std::string& what) {
  ASSERT_EQ(got.scores.size(), ref.scores.size());
  ASSERT_EQ(got.mask.row_ptr.size(), ref.mask.row_ptr.size());
  double worst = 0;
  for (size_t i = 0; i < got.scores.size(); ++i)
    worst = std::max(worst, std::abs(double(got.scores[i]) - double(ref.scores[i])));
  EXPECT_LE(worst, 1e-5);
  const Protections prot = c.protections();
  const bool xattn = c.method == Estimator::xattn;
  int64_t near = 0, mismatches = 0;
  for (int64_t row = 0; row < ref.rows(); ++row) {
    const int64_t n = ref.visible(row);
    std::vector<int32_t> forced;
    if (prot.sink) forced.push_back(0);
    if (prot.diagonal && n > 1) forced.push_back(int32_t(n - 1));
    const int64_t nqb = ref.mask.seq_block_base[1];
    const bool whole = prot.last_row && row % nqb == nqb - 1;
    const double margin =
        whole ? 1.0 : decision_margin(ref.scores.data() + ref.score_ptr[size_t(row)], n, c.tau, forced, xattn);
    if (margin <= 1e-4) {
      ++near;
      continue;
    }
    const auto list = [&](const EstimateResult& r) {
      return std::vector<int32_t>(r.mask.col_idx.begin() + r.mask.row_ptr[size_t(row)],
                                  r.mask.col_idx.begin() + r.mask.row_ptr[size_t(row) + 1]);
    };
    mismatches += list(got) != list(ref);
  }
  EXPECT_EQ(mismatches, 0) << "rows whose block lists differ between the kernels";
  EXPECT_LE(near * 5, ref.rows()) << near << " of " << ref.rows() << " rows within 1e-4 of the cut";
  std::printf("[ %s ] %s: scores within %.2e, %lld of %lld rows near the cut\n", label, what.c_str(), worst,
              (long long)near, (long long)ref.rows());
}

// Rule (2): on fresh random inputs (bf16, f16 and f32, so the 1-, 2- and 3-term splits all run)
// kernel k's scores (forced where it runs the case, the generic kernel elsewhere) and the f32
// kernel's agree within 1e-5 (half the CPU comparison's bound), and the masks agree exactly on
// every row whose decision margin (from the f32 kernel's scores: the distance of the cumulative
// mass from τ at each decision, or a near-tie at the cut) exceeds 1e-4; rows within it are counted
// and printed, and must stay below 20%. B 64 and (except for the generic kernel, which the other
// runs cover there) B 128, so that both block widths of the RR kernels run (B / S = 8 and 16).
void matches_f32_kernel(CudaScoring k) {
  for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
    const Inputs in = testing::make_inputs(make_case(std::string("tc-") + dtype_name(dt), {2300}, {}, 16, 4, 128, dt));
    const OnDevice d = upload(in);
    for (Estimator e : {Estimator::rr, Estimator::xattn})
      for (int stride : {8, 16})
        for (int block : {64, 128}) {
          if (block == 128 && k == CudaScoring::mma_generic) continue;
          EstimateConfig c;
          c.method = e;
          c.stride = stride;
          c.block = block;
          c.tau = 0.9;
          const CudaScoring ran = force(c, k, dt, 128);
          const std::string what = std::string(cuda_scoring_name(ran)) + " " + dtype_name(dt) + " " +
                                   estimator_name(e) + " S " + std::to_string(stride) + " B " + std::to_string(block);
          SCOPED_TRACE(what);
          const EstimateResult tc = estimate(d.qv, d.kv, d.layout, c, Backend::cuda);
          ASSERT_EQ(tc.stats.scoring, ran);
          EstimateConfig cf = c;
          cf.overrides.scoring = CudaScoring::f32;
          const EstimateResult f32 = estimate(d.qv, d.kv, d.layout, cf, Backend::cuda);
          expect_rule2(f32, tc, c, "mma vs f32", what);
        }
  }
}

TEST_F(CudaEstimate, TensorCoreScoringMatchesF32Kernel) { matches_f32_kernel(CudaScoring::mma_generic); }
TEST_F(CudaEstimate, TensorCoreScoringRrMatchesF32Kernel) { matches_f32_kernel(CudaScoring::mma_rr); }
TEST_F(CudaEstimate, TensorCoreScoringGroupedMatchesF32Kernel) { matches_f32_kernel(CudaScoring::mma_grouped); }
TEST_F(CudaEstimate, TensorCoreScoringWgmmaExactMatchesF32Kernel) { matches_f32_kernel(CudaScoring::wgmma_exact); }
TEST_F(CudaEstimate, TensorCoreScoringWgmmaApproxMatchesF32Kernel) {
  matches_f32_kernel(CudaScoring::wgmma_approximate);
}

// One shape of the bit-identity tests below.
struct BitShape {
  const char* name;
  std::vector<int64_t> sq, sk;
  int hq, hkv, dim;
  int64_t token_pad = 0;  // > 0: q and k are views into wider rows (testing::Case::token_pad)
};

// Every shape × dtype × (S, B) with B / S = 8 or 16 × offset, RR at τ 0.9: body(d, dtype, head dim,
// config, label) with the shape's fresh inputs on the device, under a trace naming the case and the seed.
void for_each_rr_case(const std::vector<BitShape>& shapes, const std::vector<DType>& dtypes,
                      const std::function<void(const OnDevice&, DType, int, EstimateConfig, const std::string&)>& body) {
  for (const BitShape& sh : shapes)
    for (DType dt : dtypes) {
      Case cs = make_case(std::string(sh.name) + "-" + dtype_name(dt), sh.sq, sh.sk, sh.hq, sh.hkv, sh.dim, dt);
      cs.token_pad = sh.token_pad;
      const Inputs in = testing::make_inputs(cs);
      const OnDevice d = upload(in);
      for (int stride : {8, 16})
        for (int block : {64, 128}) {
          if (block / stride != 8 && block / stride != 16) continue;
          for (RROffset off : {RROffset::paper, RROffset::released}) {
            EstimateConfig c;
            c.stride = stride;
            c.block = block;
            c.offset = off;
            c.tau = 0.9;
            const std::string what = std::string(sh.name) + " " + dtype_name(dt) + " S " + std::to_string(stride) +
                                     " B " + std::to_string(block) + " " + rr_offset_name(off);
            SCOPED_TRACE(what + " (ARIADNE_TEST_SEED=" + std::to_string(seed_base()) + ")");
            body(d, dt, sh.dim, c, what);
          }
        }
    }
}

// For every case of for_each_rr_case: the generic tensor-core kernel (forced) against the same
// config with `enable` applied. `ran(stats, dtype, head dim)` must hold for the variant, its
// scores must equal the generic kernel's bit for bit and its masks exactly, and the variant's
// second run must give its own bits again. Then the variant on the Llama shape (32 / 8 heads, d
// 128, bf16, S 8 and 16) against the CPU (check_config).
void check_bit_identical_to_generic(const std::vector<BitShape>& shapes, const std::vector<DType>& dtypes,
                                    const char* vname, const std::function<void(EstimateConfig&)>& enable,
                                    const std::function<bool(const EstimateStats&, DType, int)>& ran) {
  for_each_rr_case(shapes, dtypes, [&](const OnDevice& d, DType dt, int dim, EstimateConfig c, const std::string&) {
    c.overrides.scoring = CudaScoring::mma_generic;
    const EstimateResult ref = estimate(d.qv, d.kv, d.layout, c, Backend::cuda);
    EstimateConfig cv = c;
    cv.overrides = EstimateOverrides{};
    enable(cv);
    const EstimateResult v = estimate(d.qv, d.kv, d.layout, cv, Backend::cuda);
    ASSERT_EQ(ref.stats.scoring, CudaScoring::mma_generic);
    ASSERT_TRUE(ran(v.stats, dt, dim)) << vname << " did not run as expected: " << cuda_scoring_name(v.stats.scoring);
    ASSERT_EQ(ref.scores.size(), v.scores.size());
    size_t differ = 0, first = 0;
    for (size_t i = 0; i < ref.scores.size(); ++i)
      if (std::memcmp(&ref.scores[i], &v.scores[i], sizeof(float)) != 0 && differ++ == 0) first = i;
    EXPECT_EQ(differ, size_t(0)) << "scores not bit-identical, first at " << first << ": generic " << ref.scores[first]
                                 << " " << vname << " " << v.scores[first];
    EXPECT_TRUE(ref.mask.row_ptr == v.mask.row_ptr && ref.mask.col_idx == v.mask.col_idx)
        << "masks differ between the generic kernel and " << vname;
    // Run to run: the same call again gives the same bits.
    const EstimateResult again = estimate(d.qv, d.kv, d.layout, cv, Backend::cuda);
    EXPECT_TRUE(again.scores == v.scores);
  });
  const Inputs llama = testing::make_inputs(make_case(std::string(vname) + "-llama", {2100}, {}, 32, 8, 128, DType::bf16));
  const OnDevice dl = upload(llama);
  for (int stride : {8, 16}) {
    EstimateConfig c;
    c.stride = stride;
    enable(c);
    ASSERT_TRUE(ran(estimate(dl.qv, dl.kv, dl.layout, c, Backend::cuda).stats, DType::bf16, 128))
        << vname << " did not run on the llama shape";
    check_config(llama, dl, c, std::string(vname) + " llama rr stride " + std::to_string(stride));
  }
}

// The restructured RR kernel (mma_rr) computes the same logits (same products, same accumulation
// order) and the same partials (the same expf terms summed in the same column order) as the
// generic kernel, so its scores must equal the generic kernel's bit for bit and its masks
// exactly, on random inputs of every dtype (1, 2 and 3 q terms), head_dim 128, 80 (a tile row of
// 10 vectors: a thread's copy steps wrap between term rows) and 32, full GQA groups (64 rows per
// CTA) and half-empty ones (S 16 with 4 heads: warps without rows), both offsets, and varlen
// sequences with lq < lk whose last chunk is partly past the sequence (zero-filled key strides).
// It must also match the CPU (rule 3) on the benchmark shape.
TEST_F(CudaEstimate, TensorCoreScoringRrBitIdenticalToGeneric) {
  check_bit_identical_to_generic({{"rr-gqa8", {1500}, {}, 16, 2, 128},
                                  {"rr-d80-varlen", {700, 77, 1100}, {700, 300, 1333}, 8, 2, 80},
                                  {"rr-d32", {999}, {}, 4, 1, 32}},
                                 {DType::bf16, DType::f16, DType::f32}, "mma_rr",
                                 [](EstimateConfig& c) { c.overrides.scoring = CudaScoring::mma_rr; },
                                 [](const EstimateStats& s, DType, int) { return s.scoring == CudaScoring::mma_rr; });
}

// The grouped kernels (G = rows / R adjacent query blocks of R = heads_per_cta · B/S rows each per
// CTA: the wgmma kernel at head_dim 128, the 128-row mma.sync one elsewhere) compute every
// group's logits, partials, row sums and block scores as mma_rr does, so their scores must equal
// the generic kernel's bit for bit and their masks exactly (the wgmma kernel in its exact build),
// on GQA groups of 8 (two CTAs in z), 4 (S 16: R 32), 3 (R 48 or 24: rows past G·R empty) and 1
// (B 64: R 8, the most groups a CTA holds), head_dim 128, 80 (the copy's carry path), 64 and 32,
// odd block counts (a last CTA with fewer groups), both offsets, varlen sequences with lq < lk,
// one shorter than a block, and rows 3 elements wider than the heads (q rows off 16 bytes: the q
// tile's element path, where the others take its 16-byte one). The wgmma path's chunks are of
// every kind: wholly visible to a warp (the mask-free partials), crossing a row's last key stride,
// past a group, wholly inside the sequence and its last, partial one. It must also match the CPU
// (rule 3) on the benchmark shape. (That the wgmma path sums each k-16 group to the same bits as
// mma.sync is measured here, not documented by the ISA: docs/numerics.md.)
const std::vector<BitShape>& grouped_shapes() {
  static const std::vector<BitShape> shapes = {{"g-gqa8", {1500}, {}, 16, 2, 128},
                                               {"g-d80-varlen", {700, 77, 1100}, {700, 300, 1333}, 8, 2, 80},
                                               {"g-g3-varlen", {1300, 5, 260}, {1300, 64, 900}, 6, 2, 64},
                                               {"g-g3-varlen-d128", {1300, 5, 260}, {1300, 64, 900}, 6, 2, 128},
                                               {"g-mha", {2100}, {}, 2, 2, 32},
                                               {"g-mha-d128", {1100}, {}, 2, 2, 128},
                                               // rows 3 elements wider: q rows off 16 bytes
                                               {"g-pad3-d128", {900}, {}, 8, 2, 128, 3},
                                               {"g-pad3-d64", {900}, {}, 8, 2, 64, 3}};
  return shapes;
}

// The routing's exact choice (cuda_exact_scoring): the wgmma kernel's exact build at head_dim 128
// and the 128-row grouped kernel elsewhere for bf16; mma_rr for f16.
TEST_F(CudaEstimate, TensorCoreScoringExactRoutingBitIdenticalToGeneric) {
  check_bit_identical_to_generic(grouped_shapes(), {DType::bf16, DType::f16}, "exact routing",
                                 [](EstimateConfig& c) { c.cuda_exact_scoring = true; },
                                 [](const EstimateStats& s, DType dt, int dim) {
                                   const CudaScoring want = dt != DType::bf16 ? CudaScoring::mma_rr
                                                            : dim == 128      ? CudaScoring::wgmma_exact
                                                                              : CudaScoring::mma_grouped;
                                   return s.scoring == want;
                                 });
}

// The 128-row grouped kernel forced at every head dim, 128 included (where the routing runs the
// wgmma kernel instead).
TEST_F(CudaEstimate, TensorCoreScoringGroupedBitIdenticalToGeneric) {
  check_bit_identical_to_generic(grouped_shapes(), {DType::bf16}, "mma_grouped",
                                 [](EstimateConfig& c) { c.overrides.scoring = CudaScoring::mma_grouped; },
                                 [](const EstimateStats& s, DType, int) { return s.scoring == CudaScoring::mma_grouped; });
}

// The wgmma kernel's approximate build (the default at head_dim 128 with bf16; the same logits
// but K̄'s two high bf16 terms only, partials by ex2.approx in the quad's order), so its scores
// are held to rule 2 against the exact generic kernel (within 1e-5, masks identical on rows with
// margin > 1e-4), not to bit-identity, on the grouped shapes at head_dim 128 (GQA 8, 3 with varlen
// lq < lk and a sequence shorter than a block, MHA, rows off 16 bytes), S 8 and 16, B 64 and 128,
// both offsets; and to rule 3 against the CPU on the Llama shape. The routing picks it without an
// override, and EstimateStats::scoring says it ran.
TEST_F(CudaEstimate, TensorCoreScoringWgmmaApproxMatchesGeneric) {
  const auto generic_and_default = [](const OnDevice& d, EstimateConfig c) {
    EstimateConfig cg = c;
    cg.overrides.scoring = CudaScoring::mma_generic;
    EstimateResult g = estimate(d.qv, d.kv, d.layout, cg, Backend::cuda);
    return std::make_pair(std::move(g), estimate(d.qv, d.kv, d.layout, c, Backend::cuda));
  };
  const std::vector<BitShape> shapes = {{"a-gqa8", {1500}, {}, 16, 2, 128},
                                        {"a-g3-varlen", {1300, 5, 260}, {1300, 64, 900}, 6, 2, 128},
                                        {"a-mha", {1100}, {}, 2, 2, 128},
                                        {"a-pad3", {900}, {}, 8, 2, 128, 3}};
  for_each_rr_case(shapes, {DType::bf16}, [&](const OnDevice& d, DType, int, EstimateConfig c, const std::string& what) {
    const auto [g, v] = generic_and_default(d, c);
    ASSERT_EQ(g.stats.scoring, CudaScoring::mma_generic);
    ASSERT_EQ(v.stats.scoring, CudaScoring::wgmma_approximate);
    expect_rule2(g, v, c, "approx vs generic", what);
    const EstimateResult again = estimate(d.qv, d.kv, d.layout, c, Backend::cuda);
    EXPECT_TRUE(again.scores == v.scores) << "scores differ between two identical runs";
  });
  const Inputs llama = testing::make_inputs(make_case("a-llama", {2100}, {}, 32, 8, 128, DType::bf16));
  const OnDevice dl = upload(llama);
  for (int stride : {8, 16}) {
    EstimateConfig c;
    c.stride = stride;
    const auto [g, v] = generic_and_default(dl, c);
    ASSERT_EQ(v.stats.scoring, CudaScoring::wgmma_approximate);
    ASSERT_EQ(v.scores.size(), g.scores.size());
    size_t differ = 0;
    for (size_t i = 0; i < v.scores.size(); ++i) differ += std::memcmp(&v.scores[i], &g.scores[i], sizeof(float)) != 0;
    std::printf("[ approx vs generic ] llama S %d: %zu of %zu scores differ in some bit\n", stride, differ,
                v.scores.size());
    check_config(llama, dl, c, "wgmma approx llama rr stride " + std::to_string(stride));
  }
}

// A small bf16 case for compute-sanitizer on every tensor-core scoring kernel (scripts/device-check):
// varlen with lq < lk, a sequence shorter than a block, views into wider rows, GQA group 3 (rows
// past G·R empty), head_dim 128 and the three block widths, against the CPU, each kernel forced.
TEST_F(CudaEstimate, ScoringKernelsSmallCasesForSanitizers) {
  Case cs = make_case("san", {300, 77, 513, 5}, {300, 200, 700, 64}, 6, 2, 128, DType::bf16);
  cs.token_pad = 24;
  const Inputs in = testing::make_inputs(cs);
  const OnDevice d = upload(in);
  for (const CudaScoring k : kKernels) {
    if (k == CudaScoring::f32) continue;  // CUDA-core, covered by F32ScoringMatchesCpu
    for (int stride : {8, 16})
      for (int block : {64, 128}) {
        if (block / stride != 8 && block / stride != 16) continue;
        EstimateConfig c;
        c.stride = stride;
        c.block = block;
        c.tau = 0.9;
        c.overrides.scoring = k;
        ASSERT_EQ(estimate(d.qv, d.kv, d.layout, c, Backend::cuda).stats.scoring, k);
        check_config(in, d, c, std::string("sanitizer case ") + cuda_scoring_name(k) + " S " + std::to_string(stride) +
                                   " B " + std::to_string(block));
      }
  }
}

// RR's key-stride sums K̄ (sampling, part 1): the vector kernel (16-bit keys in 16-byte vectors,
// several loads in flight) against the scalar kernel bit for bit (the same keys 2 bytes off a
// 16-byte boundary, which launch_key_stride_sums gives the scalar kernel), and
// the f32 output against sums taken here in the same order (t = 0 .. S − 1 from 0). Sequences
// whose last stride is partial, head dims with a zero-padded tail vector (72 → dpad 80), a stride
// that is not a multiple of 8 (12: two load groups), token rows wider than the heads.
TEST(CudaKeyStrideSums, VectorKernelEqualsScalarKernelAndHostSums) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng{uint32_t(seed_base())};
  std::uniform_real_distribution<float> uni(-3.f, 3.f);
  const std::vector<int64_t> lens = {1000, 77, 5};
  const int heads_kv = 3;
  for (DType dt : {DType::bf16, DType::f16})
    for (int d : {128, 72})
      for (int stride : {8, 12, 16})
        for (int pad : {0, 8})
          for (bool mma : {true, false}) {
            SCOPED_TRACE(std::string(dtype_name(dt)) + " d " + std::to_string(d) + " S " + std::to_string(stride) +
                         " pad " + std::to_string(pad) + (mma ? " bf16 terms" : " f32"));
            const int64_t total_k = std::accumulate(lens.begin(), lens.end(), int64_t(0));
            const int64_t k_tok = heads_kv * d + pad;
            std::vector<uint16_t> kh(size_t(total_k * k_tok));
            for (auto& x : kh) x = dt == DType::bf16 ? float_to_bf16(uni(rng)) : float_to_f16(uni(rng));
            const auto kf = [&](int64_t i) { return dt == DType::bf16 ? bf16_to_float(kh[size_t(i)]) : f16_to_float(kh[size_t(i)]); };
            std::vector<cuda::EstSeq> seqs;
            int64_t k0 = 0, ks = 0;
            for (int64_t l : lens) {
              cuda::EstSeq e{};
              e.k0 = k0;
              e.lk = l;
              e.nks = int32_t((l + stride - 1) / stride);
              e.ks_base = int32_t(ks);
              seqs.push_back(e);
              k0 += l;
              ks += e.nks;
            }
            const int dpad = (d + 15) / 16 * 16;
            const int64_t out_elems = heads_kv * ks * (mma ? 3 * dpad : d);  // 2-byte terms or f32
            DeviceBuffer kd(DType::f32, {int64_t(kh.size() + 1) / 2});
            ASSERT_EQ(cudaMemcpy(kd.data(), kh.data(), kh.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
            DeviceBuffer kd_off(DType::f32, {int64_t(kh.size() + 2) / 2 + 1});
            char* const k_off = static_cast<char*>(kd_off.data()) + 2;
            ASSERT_EQ(cudaMemcpy(k_off, kh.data(), kh.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
            DeviceBuffer sd(DType::f32, {int64_t(seqs.size() * sizeof(cuda::EstSeq) + 3) / 4});
            ASSERT_EQ(cudaMemcpy(sd.data(), seqs.data(), seqs.size() * sizeof(cuda::EstSeq), cudaMemcpyHostToDevice), cudaSuccess);
            std::vector<std::vector<uint8_t>> outs;
            for (bool scalar : {true, false}) {
              DeviceBuffer od(DType::f32, {out_elems});
              // Poisoned: the kernels write every byte of the output.
              ASSERT_EQ(cudaMemset(od.data(), 0xff, size_t(out_elems) * 4), cudaSuccess);
              cuda::ScoreParams p{};
              p.k = scalar ? static_cast<const void*>(k_off) : kd.data();
              p.dtype = dt == DType::bf16 ? 1 : 2;
              p.k_tok = k_tok;
              p.k_head = d;
              p.d = d;
              p.dpad = dpad;
              p.stride = stride;
              p.heads_kv = heads_kv;
              p.total_ks = ks;
              p.seqs = static_cast<const cuda::EstSeq*>(sd.data());
              p.num_seqs = int(seqs.size());
              p.mma = mma;
              (mma ? p.ksplit : reinterpret_cast<void*&>(p.ksum)) = od.data();
              ASSERT_EQ(cuda::launch_key_stride_sums(p, nullptr), cudaSuccess);
              ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
              const size_t bytes = size_t(heads_kv * ks * (mma ? 3 * dpad * 2 : d * 4));
              outs.emplace_back(bytes);
              od.copy_to_host(outs.back().data(), bytes);
            }
            ASSERT_EQ(outs[0], outs[1]) << "vector and scalar kernels differ";
            // Host sums in the kernels' order; f32 output exactly, bf16 terms: the first term is
            // the sum rounded to bf16 and the padding columns are zero.
            for (int h = 0; h < heads_kv; ++h)
              for (const cuda::EstSeq& e : seqs)
                for (int64_t j = 0; j < e.nks; ++j)
                  for (int u = 0; u < (mma ? dpad : d); ++u) {
                    float acc = 0.f;
                    if (u < d)
                      for (int64_t t = 0; t < stride && j * stride + t < e.lk; ++t)
                        acc += kf((e.k0 + j * stride + t) * k_tok + h * d + u);
                    const int64_t x = e.ks_base + j;
                    if (mma) {
                      uint16_t hi;
                      std::memcpy(&hi, outs[1].data() + size_t(((h * ks + x) * 3 * dpad + u) * 2), 2);
                      ASSERT_EQ(hi, float_to_bf16(acc)) << "head " << h << " stride row " << x << " col " << u;
                    } else {
                      float got;
                      std::memcpy(&got, outs[1].data() + size_t(((h * ks + x) * d + u) * 4), 4);
                      ASSERT_EQ(std::memcmp(&got, &acc, 4), 0)
                          << "head " << h << " stride row " << x << " col " << u << ": " << got << " vs " << acc;
                    }
                  }
          }
}

}  // namespace
}  // namespace ariadne
