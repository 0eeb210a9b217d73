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

// Sets an environment variable for one scope (value null: leaves it as it is) and restores the
// previous value, or its absence, at the end. Routing switches (ARIADNE_WGMMA, ARIADNE_TMA, ...)
// must not leak from one test into the next: device-check runs the whole binary under each setting.
class EnvGuard {
 public:
  explicit EnvGuard(const char* name, const char* value = nullptr);
  ~EnvGuard();
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;

 private:
  std::string name_, saved_;
  bool had_ = false;
};

// An environment variable unset for one scope (the previous value, or its absence, restored at
// the end): a test that must run the default route whatever the caller's environment says.
class EnvUnset : public EnvGuard {
 public:
  explicit EnvUnset(const char* name);
};

// ARIADNE_BAND_RUN (the band kernels' run length) for one scope, run <= 0 meaning unset (the
// launcher's own choice); the previous value is restored after it.
class RunLength {
 public:
  explicit RunLength(int run);

 private:
  EnvGuard guard_{"ARIADNE_BAND_RUN"};
};

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

// The end of every kernel check: launches d.p (attention on the CUDA backend) twice, each time into
// fresh out (out_dtype, want_out's shape) and lse (f32, want_lse's shape) buffers poisoned with 0xFF
// (NaN in bf16, f16 and f32: an element the kernel does not write fails the comparison); run 0 must
// match want_out / want_lse within `tol` (the tolerance rule), run 1 must equal run 0 bit for bit.
// before_launch, when set, runs before each launch on d.p with those outputs in place (routing
// asserts that depend on them); a fatal failure inside it ends the check.
void check_runs(DeviceCase& d, DType out_dtype, const Buffer& want_out, const Buffer& want_lse, double tol,
                const std::function<void(const AttentionParams&)>& before_launch = {});

// Runs one case on the device twice and checks it against the reference. f32_out: the output in
// f32 instead of q's dtype. require_wgmma: fail unless the call is routed to the wgmma kernel.
// require_tma: -1 any copy path; 1 / 0: fail unless that kernel does / does not copy with TMA.
void check_case(Case c, bool f32_out = false, bool require_wgmma = false, int require_tma = -1);

}  // namespace ariadne::cuda_testing
