// The CUDA estimators (RRAttention, XAttention, the oracle) against the CPU estimator on fresh
// random inputs, on the scoring kernel the routing picks (estimate_cuda_common.hpp gives the
// comparison); the selection kernel alone; refusals; the workspace; prefill on the device mask;
// the f32 kernel against the CPU. test_estimate_scoring_cuda.cpp compares the scoring kernels.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "ariadne/attention.hpp"
#include "ariadne/device.hpp"
#include "ariadne/estimate.hpp"
#include "ariadne/prefill.hpp"
#include "common.hpp"
#include "cuda/cuda_common.hpp"
#include "cuda/estimate_cuda_common.hpp"
#include "estimate/cuda/estimate.cuh"

namespace ariadne {
namespace {

using namespace estimate_testing;

TEST_F(CudaEstimate, RRMatchesCpuGqaOffsetsAndTau) {
  // GQA 8:2, one sequence not a multiple of S or B, bf16.
  const Inputs in = testing::make_inputs(make_case("rr", {1000}, {}, 8, 2, 64, DType::bf16));
  const OnDevice d = upload(in);
  for (RROffset off : {RROffset::paper, RROffset::released})
    for (double tau : {0.5, 0.9, 0.95}) {
      EstimateConfig c;
      c.block = 64;
      c.stride = 8;
      c.tau = tau;
      c.offset = off;
      check_config(in, d, c, std::string("offset ") + rr_offset_name(off) + " tau " + std::to_string(tau));
    }
}

TEST_F(CudaEstimate, XAttentionMatchesCpu) {
  const Inputs in = testing::make_inputs(make_case("xattn", {777}, {}, 4, 2, 64, DType::f16));
  const OnDevice d = upload(in);
  for (int stride : {4, 16})
    for (double tau : {0.6, 0.9}) {
      EstimateConfig c;
      c.method = Estimator::xattn;
      c.block = 64;
      c.stride = stride;
      c.tau = tau;
      check_config(in, d, c, "stride " + std::to_string(stride) + " tau " + std::to_string(tau));
    }
}

// The oracle on the device is XAttention's kernel at S = 1 (exact causal softmax per query,
// summed into blocks); B 128 runs each head's 128 rows in two rounds of 64.
TEST_F(CudaEstimate, OracleMatchesCpu) {
  const Inputs in = testing::make_inputs(make_case("oracle", {500, 333}, {640, 333}, 4, 2, 64, DType::bf16));
  const OnDevice d = upload(in);
  for (int block : {64, 128}) {
    EstimateConfig c;
    c.method = Estimator::oracle;
    c.block = block;
    c.tau = 0.9;
    check_config(in, d, c, "oracle block " + std::to_string(block));
  }
}

TEST_F(CudaEstimate, LlamaShapeBlock128) {
  // 32 query / 8 KV heads, d 128, B 128, S 8 and 16: the benchmark's shape, short.
  const Inputs in = testing::make_inputs(make_case("llama", {2100}, {}, 32, 8, 128, DType::bf16));
  const OnDevice d = upload(in);
  for (Estimator e : {Estimator::rr, Estimator::xattn})
    for (int stride : {8, 16}) {
      EstimateConfig c;
      c.method = e;
      c.stride = stride;
      check_config(in, d, c, std::string(estimator_name(e)) + " stride " + std::to_string(stride));
    }
}

TEST_F(CudaEstimate, VarlenChunkedPrefillAndStridedViews) {
  // Three sequences, two with lq < lk (queries are the last positions), one whose length is below
  // one block; q/k are views into wider rows (token stride > heads·dim); f32.
  Case c = make_case("varlen", {300, 77, 513, 5}, {300, 200, 700, 64}, 6, 3, 32, DType::f32);
  c.token_pad = 24;
  const Inputs in = testing::make_inputs(c);
  const OnDevice d = upload(in);
  for (Estimator e : {Estimator::rr, Estimator::xattn}) {
    EstimateConfig cfg;
    cfg.method = e;
    cfg.block = 64;
    cfg.stride = 8;
    cfg.tau = 0.9;
    check_config(in, d, cfg, std::string(estimator_name(e)) + " varlen");
    cfg.protect = Protections{};  // no protections at all
    cfg.tau_per_head = {0.5, 0.7, 0.8, 0.9, 0.95, 0.99};
    check_config(in, d, cfg, std::string(estimator_name(e)) + " varlen, no protections, tau per head");
  }
}

// The selection kernel alone on crafted rows, against the CPU's select_blocks, exactly: dyadic
// scores (multiples of 2^-20 below 1, so both the CPU's double sums and the kernel's fixed-point
// sums are exact) with ties, zeros, all-zero rows, one dominant block, rows of 1 to 4096 blocks
// (each of the kernel's three register widths), each τ, with and without the protections, RR's order
// (protections OR-ed in) and XAttention's (forced blocks counted first), and the last-row rule.
TEST_F(CudaEstimate, SelectionMatchesCpuOnCraftedRows) {
  std::mt19937_64 rng(seed_base() ^ 0x5e1ec7ull);
  SCOPED_TRACE("ARIADNE_TEST_SEED=" + std::to_string(seed_base()));
  // Row lengths: the edges of the widths (1024, 2048 and 4096 blocks) and random ones.
  std::vector<int> lens = {1, 2, 3, 31, 32, 33, 255, 256, 257, 1023, 1024, 1025, 2047, 2048, 2049, 4095, 4096};
  for (int i = 0; i < 9; ++i) lens.push_back(1 + int(rng() % 4096));
  enum Kind { kRandom, kTies, kSparse, kZeros, kDominant, kFlat };
  for (const int width : {1024, 2048, 4096}) {
    // One sequence, one query head per run; rows = query blocks. Rows longer than `width` run
    // only in the wide launch (the kernel takes the width from the longest row).
    std::vector<int> row_len;
    std::vector<int> row_kind;
    for (const int n : lens)
      if (n <= width)
        for (int k = kRandom; k <= kFlat; ++k) {
          row_len.push_back(n);
          row_kind.push_back(k);
        }
    if (width > 1024) {  // a row of `width` blocks makes the launch take that width's kernel
      row_len.push_back(width);
      row_kind.push_back(kRandom);
    }
    const int rows = int(row_len.size());
    std::vector<int64_t> ptr(size_t(rows) + 1, 0);
    for (int r = 0; r < rows; ++r) ptr[size_t(r) + 1] = ptr[size_t(r)] + row_len[size_t(r)];
    std::vector<float> scores(size_t(ptr.back()));
    const float unit = std::ldexp(1.f, -20);
    for (int r = 0; r < rows; ++r) {
      float* sc = scores.data() + ptr[size_t(r)];
      const int n = row_len[size_t(r)];
      for (int i = 0; i < n; ++i) {
        uint64_t v = 0;
        switch (row_kind[size_t(r)]) {
          case kRandom: v = rng() % (1u << 20); break;
          case kTies: v = (1 + rng() % 6) << 12; break;          // six distinct values, many ties
          case kSparse: v = rng() % 4 == 0 ? rng() % (1u << 18) : 0; break;
          case kZeros: v = 0; break;
          case kDominant: v = i == int(rng() % uint64_t(n)) ? (1u << 19) : rng() % 64; break;
          case kFlat: v = 1u << 10; break;
        }
        sc[i] = float(v) * unit;
      }
    }
    const std::vector<int32_t> qb_seq(size_t(rows), 0);
    std::vector<int32_t> qb_m(static_cast<size_t>(rows));
    std::iota(qb_m.begin(), qb_m.end(), 0);
    cuda::EstSeq seq{};
    seq.nqb = rows;  // row = row_base + h · nqb + m with h = 0

    auto upload = [](const void* src, size_t bytes) {
      DeviceBuffer b(DType::f32, {int64_t((bytes + 3) / 4 + 1)});
      if (bytes) {
        EXPECT_EQ(cudaMemcpy(b.data(), src, bytes, cudaMemcpyHostToDevice), cudaSuccess);
      }
      return b;
    };
    const DeviceBuffer d_qs = DeviceBuffer::from_ints(qb_seq), d_qm = DeviceBuffer::from_ints(qb_m);
    DeviceBuffer d_seq = upload(&seq, sizeof(seq)), d_ptr = upload(ptr.data(), ptr.size() * 8),
                 d_sc = upload(scores.data(), scores.size() * 4);
    DeviceBuffer d_keep(DType::f32, {ptr.back() / 4 + 1}), d_counts(DType::f32, {rows + 1}),
        d_row_ptr(DType::f32, {rows + 1}), d_col(DType::f32, {ptr.back() + 1});

    for (const double tau : {0.5, 0.9, 0.95, 0.999})
      for (const int mode : {0, 1, 2, 3}) {  // protections none / RR's / XAttention's / RR's + last row
        SCOPED_TRACE("width " + std::to_string(width) + ", tau " + std::to_string(tau) + ", mode " + std::to_string(mode));
        DeviceBuffer d_tau = upload(&tau, sizeof(tau));
        cuda::SelectParams sp{};
        sp.seqs = static_cast<const cuda::EstSeq*>(d_seq.data());
        sp.num_seqs = 1;
        sp.qblock_seq = static_cast<const int32_t*>(d_qs.data());
        sp.qblock_m = static_cast<const int32_t*>(d_qm.data());
        sp.score_ptr = static_cast<const int64_t*>(d_ptr.data());
        sp.scores = static_cast<const float*>(d_sc.data());
        sp.tau = static_cast<const double*>(d_tau.data());
        sp.keep = static_cast<uint8_t*>(d_keep.data());
        sp.counts = static_cast<int32_t*>(d_counts.data());
        sp.row_ptr = static_cast<const int32_t*>(d_row_ptr.data());
        sp.col_idx = static_cast<int32_t*>(d_col.data());
        sp.heads_q = 1;
        sp.block = 128;
        sp.sink = sp.diagonal = mode != 0;
        sp.forced_first = mode == 2;
        sp.last_row = mode == 3;
        const int max_len = *std::max_element(row_len.begin(), row_len.end());
        ASSERT_EQ(cudaMemset(d_counts.data(), 0, size_t(rows + 1) * 4), cudaSuccess);
        ASSERT_EQ(cuda::launch_select(sp, rows, max_len, nullptr), cudaSuccess);
        size_t scan_bytes = 0;
        ASSERT_EQ(cuda::exclusive_scan(sp.counts, static_cast<int32_t*>(d_row_ptr.data()), rows + 1, nullptr,
                                       scan_bytes, nullptr),
                  cudaSuccess);
        DeviceBuffer d_scan(DType::f32, {int64_t(scan_bytes / 4 + 1)});
        ASSERT_EQ(cuda::exclusive_scan(sp.counts, static_cast<int32_t*>(d_row_ptr.data()), rows + 1, d_scan.data(),
                                       scan_bytes, nullptr),
                  cudaSuccess);
        ASSERT_EQ(cuda::launch_compact(sp, rows, nullptr), cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<int32_t> rp(size_t(rows) + 1);
        d_row_ptr.copy_to_host(rp.data(), rp.size() * 4);
        std::vector<int32_t> col(size_t(rp.back()));
        if (!col.empty()) d_col.copy_to_host(col.data(), col.size() * 4);
        int bad = 0;
        for (int r = 0; r < rows; ++r) {
          const int n = row_len[size_t(r)];
          const std::vector<int32_t> forced = forced_blocks(sp.sink, sp.diagonal, n);
          const bool whole = sp.last_row && r == rows - 1;
          const std::vector<int32_t> want = select_blocks(scores.data() + ptr[size_t(r)], n, whole ? 1.0 : tau,
                                                          forced, sp.forced_first);
          const std::vector<int32_t> got(col.begin() + rp[size_t(r)], col.begin() + rp[size_t(r) + 1]);
          if (got != want && bad++ < 3)
            ADD_FAILURE() << "row " << r << " (" << n << " blocks, kind " << row_kind[size_t(r)] << "): cuda keeps "
                          << got.size() << " blocks " << list_str(got.data(), got.data() + std::min<size_t>(got.size(), 16))
                          << ", cpu " << want.size() << " " << list_str(want.data(), want.data() + std::min<size_t>(want.size(), 16));
        }
        EXPECT_EQ(bad, 0) << "rows whose kept blocks differ from the CPU's, of " << rows;
      }
  }
}

TEST_F(CudaEstimate, TauOneKeepsEveryVisibleBlock) {
  const Inputs in = testing::make_inputs(make_case("tau1", {321, 190}, {400, 190}, 4, 1, 64, DType::bf16));
  const OnDevice d = upload(in);
  for (Estimator e : {Estimator::rr, Estimator::xattn}) {
    EstimateConfig c;
    c.method = e;
    c.block = 64;
    c.stride = 16;
    c.tau = 1.0;
    c.protect = Protections{};
    const EstimateResult r = estimate(d.qv, d.kv, d.layout, c, Backend::cuda);
    ASSERT_EQ(r.mask.rows(), r.rows());
    for (int64_t row = 0; row < r.rows(); ++row) {
      std::vector<int32_t> all(size_t(r.visible(row)));
      std::iota(all.begin(), all.end(), 0);
      const std::vector<int32_t> got(r.mask.col_idx.begin() + r.mask.row_ptr[size_t(row)],
                                     r.mask.col_idx.begin() + r.mask.row_ptr[size_t(row) + 1]);
      ASSERT_EQ(got, all) << estimator_name(e) << " row " << row;
    }
    EXPECT_DOUBLE_EQ(r.stats.density, 1.0);
    check_config(in, d, c, std::string(estimator_name(e)) + " tau 1");
  }
}

TEST_F(CudaEstimate, RefusalsNameTheReason) {
  const Inputs in = testing::make_inputs(make_case("refuse", {128}, {}, 2, 1, 64, DType::bf16));
  const OnDevice d = upload(in);
  std::string why;
  EXPECT_FALSE(estimate_supports(Backend::cuda, in.params.q, &why));
  EXPECT_NE(why.find("device"), std::string::npos) << why;
  EXPECT_TRUE(estimate_supports(Backend::cuda, d.qv, &why)) << why;
  EstimateConfig c;
  c.block = 96;
  c.stride = 1;  // 96 query strides per block: neither <= 64 nor rounds of 64
  try {
    estimate(d.qv, d.kv, d.layout, c, Backend::cuda);
    ADD_FAILURE() << "block 96 / stride 1 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("block / stride"), std::string::npos) << e.what();
  }
}

// The CUDA estimator keeps its workspace (scratch, flags, tables, staging) between calls and
// shares it between threads (estimate_cuda.cu): a result must not depend on what an earlier call
// of another shape or method left in it, nor on calls running in other threads at the same time.
TEST_F(CudaEstimate, WorkspaceReuseAcrossShapesMethodsAndThreads) {
  const Inputs small = testing::make_inputs(make_case("ws-small", {300, 77}, {300, 200}, 8, 2, 64, DType::bf16));
  const Inputs big = testing::make_inputs(make_case("ws-big", {1500}, {}, 8, 2, 64, DType::bf16));
  const OnDevice ds = upload(small), db = upload(big);
  EstimateConfig rr;
  rr.block = 64;
  rr.stride = 8;
  rr.tau = 0.9;
  EstimateConfig xa = rr;
  xa.method = Estimator::xattn;
  const auto same = [](const EstimateResult& a, const EstimateResult& b) {
    return a.scores == b.scores && a.mask.row_ptr == b.mask.row_ptr && a.mask.col_idx == b.mask.col_idx &&
           a.stats.kept_blocks == b.stats.kept_blocks && a.stats.density_per_head == b.stats.density_per_head;
  };
  // s0 runs and then frees the workspace; b0 grows a new one that s1 (smaller) reuses with b0's
  // partials still in it; x0 (XAttention) and s2 reuse it again.
  EstimateConfig once = rr;
  once.keep_workspace = false;
  const EstimateResult s0 = estimate(ds.qv, ds.kv, ds.layout, once, Backend::cuda);
  const EstimateResult b0 = estimate(db.qv, db.kv, db.layout, rr, Backend::cuda);
  const EstimateResult s1 = estimate(ds.qv, ds.kv, ds.layout, rr, Backend::cuda);
  const EstimateResult x0 = estimate(ds.qv, ds.kv, ds.layout, xa, Backend::cuda);
  const EstimateResult s2 = estimate(ds.qv, ds.kv, ds.layout, rr, Backend::cuda);
  EXPECT_TRUE(same(s0, s1)) << "rr on the small case differs after a larger call";
  EXPECT_TRUE(same(s0, s2)) << "rr on the small case differs after an xattn call";
  EXPECT_GT(b0.stats.kept_blocks, s0.stats.kept_blocks);
  EXPECT_EQ(s0.stats.kept_blocks, int64_t(s0.mask.col_idx.size()));
  EXPECT_GE(s0.device.col_idx.bytes(), s0.mask.col_idx.size() * sizeof(int32_t));

  // Three threads, each cycling through (small rr, big rr, small xattn) from a different start.
  const EstimateResult* want[3] = {&s1, &b0, &x0};
  constexpr int kThreads = 3, kCalls = 6;
  std::vector<std::vector<EstimateResult>> got(kThreads);
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t)
    pool.emplace_back([&, t] {
      try {
        for (int i = 0; i < kCalls; ++i) {
          const int which = (t + i) % 3;
          const OnDevice& d = which == 1 ? db : ds;
          got[size_t(t)].push_back(estimate(d.qv, d.kv, d.layout, which == 2 ? xa : rr, Backend::cuda));
        }
      } catch (const std::exception& e) {
        errors[size_t(t)] = e.what();
      }
    });
  for (std::thread& th : pool) th.join();
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_EQ(errors[size_t(t)], "") << "thread " << t;
    ASSERT_EQ(got[size_t(t)].size(), size_t(kCalls));
    for (int i = 0; i < kCalls; ++i)
      EXPECT_TRUE(same(got[size_t(t)][size_t(i)], *want[(t + i) % 3])) << "thread " << t << " call " << i;
  }
}

// Sparse prefill on the device: the CUDA estimate's device mask feeds the CUDA attention; the
// output must match the CPU reference attention run with the same (host-copied) mask.
TEST_F(CudaEstimate, PrefillMatchesReferenceOnItsMask) {
  Case cs = make_case("prefill", {700, 260}, {900, 260}, 8, 2, 128, DType::bf16);
  cs.input_scale = 1.f;
  Inputs in = testing::make_inputs(cs);
  const OnDevice d = upload(in);
  for (Estimator e : {Estimator::rr, Estimator::xattn}) {
    SCOPED_TRACE(estimator_name(e));
    AttentionParams p = in.params;
    p.q = d.qv;
    p.k = d.kv;
    p.v = d.vv;
    p.pattern = d.layout;
    DeviceBuffer out(DType::f32, {in.total_q, cs.heads_q, cs.dim});
    DeviceBuffer lse(DType::f32, {cs.heads_q, in.total_q});
    out.fill_bytes(0xFF);
    lse.fill_bytes(0xFF);
    p.out = out.view();
    p.lse = lse.view();
    PrefillConfig pc;
    pc.estimate.method = e;
    pc.estimate.tau = 0.5;  // near-uniform random rows: a low τ keeps the mask visibly sparse
    pc.estimate.stride = 16;
    const PrefillResult res = prefill(p, pc);
    cuda_synchronize();
    EXPECT_GT(res.stats.ms_attention, 0);
    EXPECT_GT(res.stats.ms_scoring, 0);
    EXPECT_GT(res.stats.density, 0);
    EXPECT_LT(res.stats.density, 1);

    AttentionParams rp = in.params;
    rp.pattern = in.params.pattern.with_blocks(res.estimate.mask.view());
    Buffer ref_out(DType::f32, {in.total_q, cs.heads_q, cs.dim});
    Buffer ref_lse(DType::f32, {cs.heads_q, in.total_q});
    rp.out = ref_out.view();
    rp.lse = ref_lse.view();
    attention(rp, Backend::reference);
    const Buffer out_h = out.to_host(), lse_h = lse.to_host();
    const double tol = testing::tolerance(cs.dtype, testing::max_abs_logit(in));
    EXPECT_TRUE(testing::close_enough("out", testing::compare(out_h.view(), ref_out.view()), tol));
    EXPECT_TRUE(testing::lse_close(lse_h.view(), ref_lse.view(), tol));
  }
}

// A host mask copied to the device (DeviceEstimate::from_mask) holds the same CSR, and an empty
// mask still gets a valid col_idx pointer.
TEST_F(CudaEstimate, HostMaskUploadsExactly) {
  const BlockMask m = BlockMask::from_lists(64, 2, {200, 70}, {{0}, {0, 1}, {1, 2}, {0, 3}, {}, {0}, {0, 1}, {1},
                                                                 {}, {0}, {0, 1}, {0}});
  const DeviceEstimate d = DeviceEstimate::from_mask(m);
  EXPECT_EQ(d.block, 64);
  EXPECT_EQ(d.heads, 2);
  const auto back = [](const DeviceBuffer& b, size_t n) {
    std::vector<int32_t> v(n);
    b.copy_to_host(v.data(), n * sizeof(int32_t));
    return v;
  };
  EXPECT_EQ(back(d.seq_block_base, m.seq_block_base.size()), m.seq_block_base);
  EXPECT_EQ(back(d.row_ptr, m.row_ptr.size()), m.row_ptr);
  EXPECT_EQ(back(d.col_idx, m.col_idx.size()), m.col_idx);
  const BlockSparseView v = d.view();
  EXPECT_EQ(v.block, 64);
  EXPECT_NE(v.col_idx, nullptr);
  BlockMask empty = m;
  empty.col_idx.clear();
  std::fill(empty.row_ptr.begin(), empty.row_ptr.end(), 0);
  EXPECT_NE(DeviceEstimate::from_mask(empty).view().col_idx, nullptr);
  // mask_view_on(cuda) makes the same copy and points into it.
  DeviceEstimate held;
  const BlockSparseView on = mask_view_on(Device::cuda, m, held);
  EXPECT_EQ(on.row_ptr, static_cast<const int32_t*>(held.row_ptr.data()));
  EXPECT_NE(on.row_ptr, m.row_ptr.data());
  EXPECT_EQ(back(held.col_idx, m.col_idx.size()), m.col_idx);
}

// The f32 scoring kernel (EstimateConfig::cuda_f32_scoring) against the CPU:
// the benchmark shape, XAttention on f16 and the f32 varlen case.
TEST_F(CudaEstimate, F32ScoringMatchesCpu) {
  const Inputs llama = testing::make_inputs(make_case("f32-llama", {2100}, {}, 32, 8, 128, DType::bf16));
  const Inputs varlen = testing::make_inputs(make_case("f32-varlen", {300, 77, 513}, {300, 200, 700}, 6, 3, 32, DType::f32));
  const OnDevice dl = upload(llama), dv = upload(varlen);
  for (Estimator e : {Estimator::rr, Estimator::xattn}) {
    EstimateConfig c;
    c.method = e;
    c.cuda_f32_scoring = true;
    const EstimateResult r = estimate(dl.qv, dl.kv, dl.layout, c, Backend::cuda);
    EXPECT_EQ(r.stats.scoring, CudaScoring::f32);
    check_config(llama, dl, c, std::string("f32 scoring, llama ") + estimator_name(e));
    c.block = 64;
    c.tau = 0.9;
    check_config(varlen, dv, c, std::string("f32 scoring, varlen f32 ") + estimator_name(e));
  }
}

}  // namespace
}  // namespace ariadne
