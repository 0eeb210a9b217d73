// Helpers shared by the CUDA tests (see cuda_common.hpp).
#include "cuda/cuda_common.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <utility>

#include <gtest/gtest.h>


namespace ariadne::cuda_testing {

uint64_t base_seed() {
  static const uint64_t seed = [] {
    if (const char* s = std::getenv("ARIADNE_TEST_SEED")) return uint64_t(std::strtoull(s, nullptr, 10));
    return uint64_t(std::random_device{}());
  }();
  return seed;
}

Case make_case(const std::string& name, std::vector<int64_t> seq_q, int dim, DType dt, Pattern pat, int heads_q,
               int heads_kv) {
  Case c;
  c.name = name;
  c.seq_q = std::move(seq_q);
  c.dim = dim;
  c.dtype = dt;
  c.pattern = pat;
  c.heads_q = heads_q;
  c.heads_kv = heads_kv;
  return c;
}

GridOrders grid_orders(int rows, int cols) {
  const int total = rows * cols;
  GridOrders o{std::vector<int32_t>(total), std::vector<int32_t>(total)};
  for (int i = 0; i < total; ++i) o.column_major[i] = (i % rows) * cols + i / rows;
  std::iota(o.shuffled.begin(), o.shuffled.end(), 0);
  std::shuffle(o.shuffled.begin(), o.shuffled.end(), std::mt19937(uint32_t(base_seed())));
  return o;
}

namespace {
// Rows of a contiguous [total, ...] buffer taken in `order`: result row i = source row order[i].
Buffer gather_rows(const Buffer& src, const std::vector<int32_t>& order) {
  Buffer dst(src.dtype(), src.shape());
  const size_t row = size_t(src.numel() / src.shape()[0]) * dtype_size(src.dtype());
  for (size_t i = 0; i < order.size(); ++i)
    std::memcpy(static_cast<char*>(dst.data()) + i * row, static_cast<const char*>(src.data()) + order[i] * row, row);
  return dst;
}
}  // namespace

OrderedReference ordered_reference(const Case& c, const testing::Inputs& in, const std::vector<int32_t>& order) {
  const int64_t total = in.total_q;
  testing::Inputs logical;
  logical.q = gather_rows(in.q, order);
  logical.k = gather_rows(in.k, order);
  logical.v = gather_rows(in.v, order);
  logical.params = in.params;
  logical.params.q = make_view(logical.q.data(), c.dtype, {total, c.heads_q, c.dim});
  logical.params.k = make_view(logical.k.data(), c.dtype, {total, c.heads_kv, c.dim});
  logical.params.v = make_view(logical.v.data(), c.dtype, {total, c.heads_kv, c.dim});
  logical.total_q = logical.total_k = total;
  const testing::Result ref = testing::run_reference(logical);
  OrderedReference want{Buffer(DType::f32, {total, c.heads_q, c.dim}), Buffer(DType::f32, {c.heads_q, total})};
  for (int64_t i = 0; i < total; ++i)
    for (int h = 0; h < c.heads_q; ++h) {
      want.lse.view().set({h, order[i]}, ref.lse.view().get({h, i}));
      for (int x = 0; x < c.dim; ++x) want.out.view().set({order[i], h, x}, ref.out.view().get({i, h, x}));
    }
  return want;
}

TensorView on_device(const TensorView& host_view, const Buffer& host, const DeviceBuffer& dev) {
  TensorView t = host_view;
  t.data = static_cast<char*>(dev.data()) + (static_cast<char*>(host_view.data) - static_cast<char*>(host.data()));
  t.device = Device::cuda;
  return t;
}

DeviceCase upload(const testing::Inputs& in) {
  DeviceCase d;
  d.q = DeviceBuffer::from_host(in.q);
  d.k = DeviceBuffer::from_host(in.k);
  d.v = DeviceBuffer::from_host(in.v);
  d.p = in.params;
  d.p.q = on_device(in.params.q, in.q, d.q);
  d.p.k = on_device(in.params.k, in.k, d.k);
  d.p.v = on_device(in.params.v, in.v, d.v);
  if (in.params.sink_mode != SinkMode::none) {
    d.sink = DeviceBuffer::from_host(in.sink);
    d.p.sink = d.sink.view();
  }
  Pattern& pat = d.p.pattern;
  if (pat.cu_seqlens_q != nullptr) {
    d.cu_q = DeviceBuffer::from_ints(in.cu_q);
    d.cu_k = DeviceBuffer::from_ints(in.cu_k);
    pat.cu_seqlens_q = static_cast<const int32_t*>(d.cu_q.data());
    // Keys as long as the queries in every sequence go in as the pattern's "same as q" (null), the
    // form the ViT and the torch op use, so that paths that need it (the backward's direct dQ) run.
    pat.cu_seqlens_k = in.cu_k == in.cu_q ? nullptr : static_cast<const int32_t*>(d.cu_k.data());
  }
  if (pat.blocks.defined()) {
    d.base = DeviceBuffer::from_ints(in.mask.seq_block_base);
    d.row_ptr = DeviceBuffer::from_ints(in.mask.row_ptr);
    d.col_idx = DeviceBuffer::from_ints(in.mask.col_idx);
    pat.blocks.seq_block_base = static_cast<const int32_t*>(d.base.data());
    pat.blocks.row_ptr = static_cast<const int32_t*>(d.row_ptr.data());
    pat.blocks.col_idx = static_cast<const int32_t*>(d.col_idx.data());
  }
  return d;
}

std::vector<uint8_t> bytes_of(const Buffer& b) {
  const auto* p = static_cast<const uint8_t*>(b.data());
  return std::vector<uint8_t>(p, p + b.numel() * dtype_size(b.dtype()));
}

void check_runs(DeviceCase& d, DType out_dtype, const Buffer& want_out, const Buffer& want_lse, double tol,
                const AttentionOptions& options, const PlanCheck& check_plan, const PerRun& per_run) {
  std::vector<uint8_t> first_out, first_lse;
  for (int run = 0; run < 2; ++run) {
    DeviceBuffer out(out_dtype, want_out.shape());
    DeviceBuffer lse(DType::f32, want_lse.shape());
    out.fill_bytes(0xFF);  // NaN in bf16, f16 and f32: an unwritten element fails the comparison
    lse.fill_bytes(0xFF);
    d.p.out = out.view();
    d.p.lse = lse.view();
    AttentionOptions o = options;
    o.backend = Backend::cuda;
    if (per_run) per_run(run, o);
    AttentionPlan plan;
    ASSERT_NO_THROW(plan = plan_attention(d.p, o)) << "no plan for the route asked";
    if (check_plan) {
      ASSERT_NO_FATAL_FAILURE(check_plan(run, plan));
    }
    ariadne::run(plan, d.p);
    cuda_synchronize();
    const Buffer out_h = out.to_host(), lse_h = lse.to_host();
    if (run == 0) {
      EXPECT_TRUE(testing::close_enough("out", testing::compare(out_h.view(), want_out.view()), tol));
      EXPECT_TRUE(testing::lse_close(lse_h.view(), want_lse.view(), tol));
      first_out = bytes_of(out_h);
      first_lse = bytes_of(lse_h);
    } else {
      EXPECT_TRUE(first_out == bytes_of(out_h)) << "out differs between two identical runs";
      EXPECT_TRUE(first_lse == bytes_of(lse_h)) << "lse differs between two identical runs";
    }
  }
}

AttentionPlan plan_case(const Case& c, const AttentionOptions& options, bool f32_out) {
  const testing::Inputs in = testing::make_inputs(c);
  DeviceCase d = upload(in);
  DeviceBuffer out(f32_out ? DType::f32 : c.dtype, {in.total_q, c.heads_q, c.dim});
  d.p.out = out.view();
  AttentionOptions o = options;
  o.backend = Backend::cuda;
  return plan_attention(d.p, o);
}

AttentionOptions on_kernel(CudaKernel k) {
  AttentionOptions o;
  o.backend = Backend::cuda;
  o.overrides.cuda_kernel = k;
  return o;
}

void check_case(Case c, bool f32_out, const AttentionOptions& options, const PlanCheck& check_plan) {
  c.seed = base_seed() ^ std::hash<std::string>{}(c.name);
  SCOPED_TRACE(c.name + " (ARIADNE_TEST_SEED=" + std::to_string(base_seed()) + ", kernel " +
               cuda_kernel_name(options.overrides.cuda_kernel) + ")");
  const testing::Inputs in = testing::make_inputs(c);
  const testing::Result ref = testing::run_reference(in);
  DeviceCase d = upload(in);
  check_runs(d, f32_out ? DType::f32 : c.dtype, ref.out, ref.lse, testing::tolerance(c.dtype, testing::max_abs_logit(in)),
             options, check_plan);
}

void check_wgmma_case(Case c, bool f32_out, int require_tma) {
  AttentionOptions o = on_kernel(CudaKernel::wgmma);
  if (require_tma >= 0) o.overrides.tma = require_tma == 1 ? Toggle::on : Toggle::off;
  // The plan is asked with the outputs in place: the route may depend on the output dtype.
  check_case(std::move(c), f32_out, o, [&](int, const AttentionPlan& plan) {
    ASSERT_EQ(plan.cuda_kernel(), CudaKernel::wgmma) << "not routed to the wgmma kernel";
    if (require_tma >= 0) {
      ASSERT_EQ(plan.uses_tma(), require_tma == 1) << "not on the expected copy path";
    }
  });
}

}  // namespace ariadne::cuda_testing
