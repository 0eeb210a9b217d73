// Helpers shared by the CUDA tests: seeds, device copies of test inputs, and the one check every
// kernel case goes through (fresh inputs, NaN-poisoned outputs, tolerance rule, two bit-identical runs).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ariadne/attention.hpp"
#include "ariadne/device.hpp"
#include "common.hpp"

namespace ariadne::cuda_testing {

using testing::Case;

// The per-process seed (random unless ARIADNE_TEST_SEED pins it).
uint64_t base_seed();

// A device copy of a host view: same strides and offset inside its (copied) buffer.
TensorView on_device(const TensorView& host_view, const Buffer& host, const DeviceBuffer& dev);

// Device copies of a case's inputs and pattern arrays, and params pointing at them.
struct DeviceCase {
  DeviceBuffer q, k, v, sink, cu_q, cu_k, base, row_ptr, col_idx;
  AttentionParams p;
};
DeviceCase upload(const testing::Inputs& in);

std::vector<uint8_t> bytes_of(const Buffer& b);

// A case of one dtype, head dim and pattern over sequences `seq_q` (keys = queries), with GQA 4:1
// unless the caller passes other head counts.
Case make_case(const std::string& name, std::vector<int64_t> seq_q, int dim, DType dt, Pattern pat, int heads_q = 8,
               int heads_kv = 2);

// Two permutations of a rows x cols token grid stored row-major, for the fused-order tests: its
// column-major traversal (Ariadne's alternate layers) and a random shuffle (seeded by base_seed()).
struct GridOrders {
  std::vector<int32_t> column_major, shuffled;
};
GridOrders grid_orders(int rows, int cols);

// The expected out [total, heads_q, dim] (f32) and lse [heads_q, total] of a one-sequence case whose
// pattern runs over a token order (logical row i stored at packed row order[i] of q, k, v, out and
// lse): the reference on explicitly gathered inputs, its rows scattered back to storage order.
struct OrderedReference {
  Buffer out, lse;
};
OrderedReference ordered_reference(const Case& c, const testing::Inputs& in, const std::vector<int32_t>& order);

// The end of every kernel check: plans d.p (attention on the CUDA backend, `options`) and runs it
// twice, each time into fresh out (out_dtype, want_out's shape) and lse (f32, want_lse's shape)
// buffers poisoned with 0xFF (NaN in bf16, f16 and f32: an element the kernel does not write fails
// the comparison); run 0 must match want_out / want_lse within `tol` (the tolerance rule), run 1
// must equal run 0 bit for bit. per_run, when set, adjusts the options of each run (two routes
// compared bit for bit); check_plan, when set, runs on each run's plan before its launch (routing
// asserts); a fatal failure inside it ends the check.
using PlanCheck = std::function<void(int run, const AttentionPlan& plan)>;
using PerRun = std::function<void(int run, AttentionOptions& options)>;
void check_runs(DeviceCase& d, DType out_dtype, const Buffer& want_out, const Buffer& want_lse, double tol,
                const AttentionOptions& options = {}, const PlanCheck& check_plan = {}, const PerRun& per_run = {});

// The plan the CUDA backend makes for a case (inputs uploaded, out in q's dtype or f32); the
// buffers it was made for are gone when it returns, so it answers questions only.
AttentionPlan plan_case(const Case& c, const AttentionOptions& options = {}, bool f32_out = false);

// Options that force the CUDA backend onto kernel `k` (automatic: the library's choice).
AttentionOptions on_kernel(CudaKernel k);

// Runs one case on the device twice and checks it against the reference. f32_out: the output in
// f32 instead of q's dtype. options: the plan's (overrides force a route; a forced route the case
// cannot take fails the test); check_plan: asserts on the plan before each launch.
void check_case(Case c, bool f32_out = false, const AttentionOptions& options = {}, const PlanCheck& check_plan = {});

// check_case forced onto the wgmma kernel (the plan must say so). require_tma: -1 the default copy
// path; 1 / 0: forced to TMA / cp.async, and the plan must say so.
void check_wgmma_case(Case c, bool f32_out = false, int require_tma = -1);

}  // namespace ariadne::cuda_testing
