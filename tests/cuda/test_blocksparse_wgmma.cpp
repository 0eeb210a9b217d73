// Block-sparse CSR rows on both CUDA kernels against the double-precision CPU reference.
//
// Every case runs twice: forced onto the wgmma kernel (blocks that are multiples of 128) and onto
// the mma.sync tile kernel (AttentionOverrides::cuda_kernel), each plan asserted to say so. A silent fallback would otherwise make the wgmma half test nothing.
// As everywhere in tests/cuda: fresh random inputs per process (ARIADNE_TEST_SEED pins them), out
// and lse poisoned with NaN before each call, the tolerance rule of tests/common.hpp, and a second
// run compared bit for bit. Masks are random (10 / 25 / 50 / 100% of the visible blocks) or built
// for an edge: rows that list nothing, rows that list only the diagonal block, rows that list
// blocks outside the causal range (which the kernels must skip), a block of 256 (two key tiles per
// block, the first or last one clipped by the causal range), GQA with a different mask per query
// head, packed batches with empty and one-token sequences, and chunked prefill (lq < lk).
#include <cstdlib>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ariadne/attention.hpp"
#include "ariadne/device.hpp"
#include "common.hpp"
#include "cuda/cuda_common.hpp"

namespace ariadne {
namespace {

using testing::Case;
using namespace cuda_testing;

// GQA 4:1 with blocks of 128 (the wgmma kernel's tile) unless a case says otherwise.
Case block_case(const std::string& name, std::vector<int64_t> seq_q, int dim, DType dt, Pattern pat) {
  Case c = make_case(name, std::move(seq_q), dim, dt, pat);
  c.block = 128;
  return c;
}

// Decides the key blocks of one CSR row: (sequence, query head, query block, the key blocks the
// dense pattern lets it see, the number of key blocks of the sequence) → the listed blocks, sorted.
using RowRule = std::function<std::vector<int32_t>(int32_t s, int h, int64_t m, const std::vector<int32_t>& visible,
                                                   int64_t nkb)>;

// Replaces the case's mask (if any) by one built row by row with `rule`.
void set_mask(testing::Inputs& in, int block, int heads, const RowRule& rule) {
  const Pattern dense = [&] {
    Pattern p = in.params.pattern;
    p.blocks = BlockSparseView{};
    return p;
  }();
  const BlockMask all = BlockMask::all_visible(dense, block, heads, in.total_q, in.total_k);
  std::vector<int64_t> lq;
  std::vector<std::vector<int32_t>> rows;
  for (int32_t s = 0; s < dense.num_seqs; ++s) {
    const SeqExtent e = dense.seq(s, in.total_q, in.total_k);
    lq.push_back(e.lq);
    const int64_t nqb = (e.lq + block - 1) / block, nkb = (e.lk + block - 1) / block;
    for (int h = 0; h < heads; ++h)
      for (int64_t m = 0; m < nqb; ++m) {
        const int64_t row = int64_t(all.seq_block_base[size_t(s)]) * heads + h * nqb + m;
        const std::vector<int32_t> visible(all.col_idx.begin() + all.row_ptr[size_t(row)],
                                           all.col_idx.begin() + all.row_ptr[size_t(row + 1)]);
        rows.push_back(rule(s, h, m, visible, nkb));
      }
  }
  in.mask = BlockMask::from_lists(block, heads, lq, rows);
  in.params.pattern = dense.with_blocks(in.mask.view());
  validate_pattern(in.params.pattern, in.total_q, in.total_k, heads);
}

// One case on one kernel: routing asserted, then as cuda_common's check_case on `in`.
void check_on(const std::string& name, const testing::Inputs& in, const testing::Result& ref, DType dtype,
              bool wgmma) {
  SCOPED_TRACE(name + (wgmma ? " [wgmma]" : " [mma.sync]") + " (ARIADNE_TEST_SEED=" + std::to_string(base_seed()) +
               ")");
  DeviceCase d = upload(in);
  const CudaKernel k = wgmma ? CudaKernel::wgmma : CudaKernel::tile;
  check_runs(d, dtype, ref.out, ref.lse, testing::tolerance(dtype, testing::max_abs_logit(in)), on_kernel(k),
             [&](int, const AttentionPlan& plan) { ASSERT_EQ(plan.cuda_kernel(), k) << "routed to the wrong kernel"; });
}

// Fresh inputs for `c`, the mask from `rule` (or c.block_density's random mask when rule is
// empty), the reference once, then both kernels.
void check_both(Case c, const RowRule& rule = {}) {
  c.seed = base_seed() ^ std::hash<std::string>{}(c.name);
  testing::Inputs in = testing::make_inputs(c);
  if (rule) set_mask(in, c.block, c.heads_q, rule);
  ASSERT_TRUE(in.params.pattern.blocks.defined()) << c.name << ": no mask";
  const testing::Result ref = testing::run_reference(in);
  for (bool wgmma : {true, false}) check_on(c.name, in, ref, c.dtype, wgmma);
}

// Keeps each visible block with probability `keep` (seeded per row), so rows differ per head.
RowRule random_rows(double keep, uint64_t seed) {
  return [=](int32_t s, int h, int64_t m, const std::vector<int32_t>& visible, int64_t) {
    std::mt19937_64 rng(seed ^ (uint64_t(s) << 40) ^ (uint64_t(h) << 20) ^ uint64_t(m));
    std::bernoulli_distribution take(keep);
    std::vector<int32_t> r;
    for (int32_t kb : visible)
      if (take(rng)) r.push_back(kb);
    return r;
  };
}

TEST(BlockSparseWgmma, RandomMasksEveryDimDtypeLength) {
  for (double density : {0.1, 0.25, 0.5, 1.0})
    for (int dim : {64, 80, 128})
      for (int64_t n : {1, 77, 128, 300, 700}) {
        const DType dt = (dim / 16 + n) % 2 == 0 ? DType::bf16 : DType::f16;  // both dtypes at every dim
        Case c = block_case("causal_blocks" + std::to_string(int(density * 100)) + "_d" + std::to_string(dim) + "_" +
                               dtype_name(dt) + "_n" + std::to_string(n),
                           {n}, dim, dt, Pattern::causal());
        check_both(c, random_rows(density, base_seed() + uint64_t(n) * 131 + uint64_t(dim)));
      }
}

TEST(BlockSparseWgmma, FullPatternAndRightWindow) {
  // Non-causal rows: every listed block is inside the key range.
  for (int dim : {80, 128}) {
    Case c = block_case("full_blocks40_d" + std::to_string(dim), {450}, dim, DType::bf16, Pattern::full());
    check_both(c, random_rows(0.4, base_seed() + 7));
  }
  Case r = block_case("causal_right9_blocks50", {500}, 64, DType::f16, Pattern::window(kUnbounded, 9));
  check_both(r, random_rows(0.5, base_seed() + 8));
}

TEST(BlockSparseWgmma, EmptyRowsAndAllEmpty) {
  // Every third row lists nothing: those queries see no key (out 0, lse -inf); the rest random.
  const RowRule holes = [&](int32_t s, int h, int64_t m, const std::vector<int32_t>& visible, int64_t nkb) {
    if ((h + m) % 3 == 0) return std::vector<int32_t>{};
    return random_rows(0.5, base_seed() + 11)(s, h, m, visible, nkb);
  };
  for (int dim : {64, 128}) check_both(block_case("empty_rows_d" + std::to_string(dim), {650}, dim, DType::bf16,
                                                 Pattern::causal()), holes);
  const RowRule none = [](int32_t, int, int64_t, const std::vector<int32_t>&, int64_t) {
    return std::vector<int32_t>{};
  };
  check_both(block_case("all_empty_d80", {300}, 80, DType::f16, Pattern::causal()), none);
  // With a denominator sink an empty row is the sink alone (out 0, lse = sink).
  Case s = block_case("empty_rows_sink_denominator", {400}, 128, DType::bf16, Pattern::causal());
  s.sink_mode = SinkMode::denominator;
  s.sink_value = std::numeric_limits<float>::quiet_NaN();
  check_both(s, holes);
}

TEST(BlockSparseWgmma, DiagonalOnlyRows) {
  // Each row lists only the block of its last query's position (the masked diagonal block).
  const RowRule diag = [](int32_t, int, int64_t, const std::vector<int32_t>& visible, int64_t) {
    return visible.empty() ? std::vector<int32_t>{} : std::vector<int32_t>{visible.back()};
  };
  for (int dim : {64, 80, 128})
    for (int64_t n : {77, 128, 500})
      check_both(block_case("diagonal_only_d" + std::to_string(dim) + "_n" + std::to_string(n), {n}, dim,
                           DType::bf16, Pattern::causal()),
                 diag);
  // Chunked prefill: the diagonal block of a query block is offset by lk - lq.
  Case c = block_case("diagonal_only_prefill", {200}, 128, DType::f16, Pattern::causal());
  c.seq_k = {777};
  check_both(c, diag);
}

TEST(BlockSparseWgmma, BlocksOutsideTheCausalRangeAreSkipped) {
  // Rows list every key block of the sequence, also those after the diagonal: causal must win,
  // so the result is dense causal attention. And a random half of all key blocks.
  const RowRule every = [](int32_t, int, int64_t, const std::vector<int32_t>&, int64_t nkb) {
    std::vector<int32_t> r;
    for (int32_t kb = 0; kb < nkb; ++kb) r.push_back(kb);
    return r;
  };
  check_both(block_case("every_key_block_causal", {600}, 128, DType::bf16, Pattern::causal()), every);
  const RowRule half = [&](int32_t s, int h, int64_t m, const std::vector<int32_t>&, int64_t nkb) {
    std::vector<int32_t> all;
    for (int32_t kb = 0; kb < nkb; ++kb) all.push_back(kb);
    return random_rows(0.5, base_seed() + 13)(s, h, m, all, nkb);
  };
  check_both(block_case("random_any_block_causal", {600}, 64, DType::f16, Pattern::causal()), half);
}

TEST(BlockSparseWgmma, Block256TwoTilesPerBlock) {
  // A block of 256 is two 128-key tiles: the causal range clips a listed block's second tile on the
  // diagonal (and lq < lk shifts where), so the kernel must count only the tiles inside the range.
  for (int64_t n : {200, 700, 1000}) {
    Case c = block_case("block256_n" + std::to_string(n), {n}, 128, DType::bf16, Pattern::causal());
    c.block = 256;
    check_both(c, random_rows(0.6, base_seed() + 17 + uint64_t(n)));
  }
  Case p = block_case("block256_prefill", {300}, 64, DType::f16, Pattern::causal());
  p.block = 256;
  p.seq_k = {650};
  check_both(p, random_rows(0.6, base_seed() + 19));
}

TEST(BlockSparseWgmma, GqaMaskPerQueryHead) {
  // 8 query heads over 2 KV heads and 16 over 4: the heads of one KV group list different blocks.
  for (const auto& [hq, hkv] : {std::pair{8, 2}, std::pair{16, 4}, std::pair{4, 4}}) {
    Case c = block_case("gqa_" + std::to_string(hq) + "_" + std::to_string(hkv), {520}, 128, DType::bf16,
                       Pattern::causal());
    c.heads_q = hq;
    c.heads_kv = hkv;
    check_both(c, [&](int32_t s, int h, int64_t m, const std::vector<int32_t>& visible, int64_t nkb) {
      return random_rows(0.2 + 0.1 * (h % 4), base_seed() + 23)(s, h, m, visible, nkb);
    });
  }
}

TEST(BlockSparseWgmma, VarlenAndChunkedPrefill) {
  for (DType dt : {DType::bf16, DType::f16}) {
    Case c = block_case(std::string("varlen_blocks_") + dtype_name(dt), {1, 0, 130, 64, 300, 129, 5}, 80, dt,
                       Pattern::causal());
    check_both(c, random_rows(0.5, base_seed() + 29));
  }
  // lq < lk per sequence, one sequence with queries and no keys.
  Case p = block_case("varlen_prefill_blocks", {50, 7, 33, 260}, 128, DType::bf16, Pattern::causal());
  p.seq_k = {300, 0, 33, 600};
  check_both(p, random_rows(0.4, base_seed() + 31));
  // A key0 sink whose block 0 is listed on some rows and not on others.
  Case s = block_case("varlen_blocks_key0_sink", {1, 300, 129}, 64, DType::f16, Pattern::causal());
  s.sink_mode = SinkMode::key0_bias;
  s.sink_value = std::numeric_limits<float>::quiet_NaN();
  check_both(s, random_rows(0.5, base_seed() + 37));
}

// AttentionOverrides::launch_order launches the wgmma kernel's grid tile-major ((query tiles, heads))
// or heads fastest ((heads, query tiles)); automatic, launch_wgmma picks (heads fastest for
// short causal grids, which the other tests here and in test_attention_wgmma.cpp exercise). Every
// CTA computes the same (head, tile) in either order, so the heads-fastest run must equal the
// tile-major run bit for bit, and that one the reference: GQA masks per query head (16 heads over
// 4), a dense causal varlen batch with empty and one-token sequences, and chunked prefill with a
// key0 sink.
TEST(BlockSparseWgmma, LaunchOrdersGiveTheSameBits) {
  Case gqa = block_case("order_gqa_16_4", {520}, 128, DType::bf16, Pattern::causal());
  gqa.heads_q = 16;
  gqa.heads_kv = 4;
  Case varlen = make_case("order_varlen_causal", {1, 0, 130, 300, 257}, 80, DType::f16, Pattern::causal());
  Case prefill = block_case("order_prefill_key0_sink", {50, 260}, 64, DType::bf16, Pattern::causal());
  prefill.seq_k = {300, 600};
  prefill.sink_mode = SinkMode::key0_bias;
  prefill.sink_value = 0.5f;
  for (Case c : {gqa, varlen, prefill}) {
    c.seed = base_seed() ^ std::hash<std::string>{}(c.name);
    testing::Inputs in = testing::make_inputs(c);
    if (c.name != "order_varlen_causal") set_mask(in, c.block, c.heads_q, random_rows(0.3, base_seed() + 41));
    const testing::Result ref = testing::run_reference(in);
    DeviceCase d = upload(in);
    SCOPED_TRACE(c.name + " (ARIADNE_TEST_SEED=" + std::to_string(base_seed()) + ")");
    int runs = 0;
    check_runs(
        d, c.dtype, ref.out, ref.lse, testing::tolerance(c.dtype, testing::max_abs_logit(in)),
        on_kernel(CudaKernel::wgmma),
        [&](int, const AttentionPlan& plan) {
          ASSERT_EQ(plan.cuda_kernel(), CudaKernel::wgmma) << "not routed to the wgmma kernel";
          ++runs;
        },
        [](int run, AttentionOptions& o) {
          o.overrides.launch_order = run == 0 ? LaunchOrder::tile_major : LaunchOrder::heads_fastest;
        });
    EXPECT_EQ(runs, 2);
  }
}

TEST(BlockSparseWgmma, RoutesBlocksOfMultiplesOf128Only) {
  for (const auto& [block, want] : {std::pair{64, false}, std::pair{128, true}, std::pair{192, false},
                                    std::pair{256, true}}) {
    Case c = block_case("route_block" + std::to_string(block), {300}, 128, DType::bf16, Pattern::causal());
    c.block = block;
    c.block_density = 0.5;
    const testing::Inputs in = testing::make_inputs(c);
    DeviceCase d = upload(in);
    DeviceBuffer out(DType::bf16, {in.total_q, c.heads_q, c.dim});
    d.p.out = out.view();
    const AttentionPlan plan = plan_attention(d.p);
    EXPECT_EQ(plan.cuda_kernel() == CudaKernel::wgmma, want) << "block " << block;
    if (want) {
      EXPECT_EQ(plan.query_tile_rows(), 128);
      EXPECT_EQ(plan.key_tile_rows(), 128);
    } else {
      EXPECT_THROW(plan_attention(d.p, on_kernel(CudaKernel::wgmma)), Error) << "block " << block;
    }
  }
}

}  // namespace
}  // namespace ariadne
