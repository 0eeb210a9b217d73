// Context parallelism's pieces on the device (include/ariadne/context_parallel.hpp): a sequence's
// queries and keys cut at random, every (query run, key run) piece on the CUDA backend, merged and
// finished by the device kernels, against the float64 reference under the case runner's checks.
// (Block masks of 64-token blocks: the CUDA kernels take multiples of 64.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "ariadne/context_parallel.hpp"
#include "ariadne/device.hpp"
#include "cases.hpp"
#include "cuda_common.hpp"

namespace ariadne {
namespace {

using namespace testing;

TEST(CudaContextParallel, PiecesOnTheDeviceMatchTheReference) {
  std::mt19937_64 rng(17 + cuda_testing::base_seed());
  const int64_t L = 301, H = 4, D = 64;
  const char* patterns[] = {"full", "causal", "window:37,5", "window:0,20", "chunk:48", "chunk:48+window:10,inf",
                            "causal+blocks:0.6@64"};
  for (const char* pattern : patterns)
    for (SinkMode sink : {SinkMode::none, SinkMode::denominator, SinkMode::key0_bias}) {
      AttnCase c;
      c.tokens_q = {L};
      c.heads_q = int(H);
      c.heads_kv = 2;
      c.pattern = pattern;
      c.sink_mode = sink;
      c.sink = sink == SinkMode::none ? 0.f : NAN;
      c.dtype = DType::bf16;
      c.seed = rng();
      const PreparedCase pc = prepare(c);
      SCOPED_TRACE(pc.name);
      const AttentionParams whole = host_params(pc, poisoned_outputs(pc));
      const DeviceBuffer dq = DeviceBuffer::from_host(pc.in.q), dk = DeviceBuffer::from_host(pc.in.k),
                         dv = DeviceBuffer::from_host(pc.in.v);
      const TensorView q = cuda_testing::on_device(whole.q, pc.in.q, dq);
      const TensorView k = cuda_testing::on_device(whole.k, pc.in.k, dk);
      const TensorView v = cuda_testing::on_device(whole.v, pc.in.v, dv);
      DeviceBuffer sink_dev;
      if (sink != SinkMode::none) sink_dev = DeviceBuffer::from_host(pc.in.sink);
      DeviceBuffer out(DType::bf16, {L, H, D}), lse(DType::f32, {H, L});
      const int64_t B = whole.pattern.blocks.defined() ? whole.pattern.blocks.block : 1;
      const std::vector<int64_t> qc = random_cuts(rng, L, B, 3), kc = random_cuts(rng, L, B, 4);
      Pattern rule = whole.pattern;
      rule.blocks = BlockSparseView{};
      for (size_t a = 0; a + 1 < qc.size(); ++a) {
        const int64_t q0 = qc[a], n = qc[a + 1] - q0;
        DeviceBuffer acc(DType::f32, {n, H, D}), acc_lse(DType::f32, {H, n}), part(DType::f32, {n, H, D}),
            part_lse(DType::f32, {H, n});
        {  // the empty accumulator: a piece over no keys
          PieceParams none;
          none.q = row_range(q, q0, q0 + n);
          none.k = none.v = row_range(k, 0, 0);
          none.q_pos = q0;
          none.out = acc.view();
          none.lse = acc_lse.view();
          EXPECT_EQ(attention_piece(none, Backend::cuda).calls, 0);
        }
        const BlockMask rows = B > 1 ? mask_rows(whole.pattern, 0, L, L, q0, n) : BlockMask{};
        for (size_t b = 0; b + 1 < kc.size(); ++b) {
          PieceParams pp;
          pp.q = row_range(q, q0, q0 + n);
          pp.k = row_range(k, kc[b], kc[b + 1]);
          pp.v = row_range(v, kc[b], kc[b + 1]);
          pp.q_pos = q0;
          pp.k_pos = kc[b];
          pp.rule = rule;
          if (B > 1) pp.blocks = rows.view();
          pp.sink_mode = whole.sink_mode;
          if (sink != SinkMode::none) pp.sink = sink_dev.view();
          pp.out = part.view();
          pp.lse = part_lse.view();
          attention_piece(pp, Backend::cuda);
          merge_partial(acc.view(), acc_lse.view(), part.view(), part_lse.view());
        }
        TensorView lse_cols = lse.view();
        lse_cols.data = static_cast<float*>(lse_cols.data) + q0;
        lse_cols.shape[1] = n;
        finish_partials(acc.view(), acc_lse.view(), whole.sink_mode, sink_dev.view(), row_range(out.view(), q0, q0 + n),
                        lse_cols);
      }
      CaseOutputs o = poisoned_outputs(pc);
      out.copy_to_host(o.out.data(), size_t(o.out.numel()) * 2);
      lse.copy_to_host(o.lse.data(), size_t(o.lse.numel()) * 4);
      check_outputs(pc, o, false);
    }
}

}  // namespace
}  // namespace ariadne
