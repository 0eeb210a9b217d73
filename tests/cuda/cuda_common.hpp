// Helpers shared by the CUDA tests: seeds, device copies of test inputs, and the one check every
// kernel case goes through (fresh inputs, NaN-poisoned outputs, tolerance rule, two bit-identical runs).
#pragma once

#include <cstdint>
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

// Runs one case on the device twice and checks it against the reference. f32_out: the output in
// f32 instead of q's dtype. require_wgmma: fail unless the call is routed to the wgmma kernel.
// require_tma: -1 any copy path; 1 / 0: fail unless that kernel does / does not copy with TMA.
void check_case(Case c, bool f32_out = false, bool require_wgmma = false, int require_tma = -1);

}  // namespace ariadne::cuda_testing
