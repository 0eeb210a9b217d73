// Internal entry points of the CUDA backend beyond backends.hpp. Plain C++ (no CUDA headers), so
// benchmarks and tests compiled by the host compiler can call them. Routes are chosen and read
// through the plan (ariadne/attention.hpp: plan_attention, AttentionOverrides, AttentionPlan).
#pragma once

#include "ariadne/attention.hpp"

namespace ariadne {

// Whether plan_attention(p, {Backend::cuda}) picks the wgmma kernel; for the estimators' benchmark,
// which predates AttentionPlan::cuda_kernel().
bool cuda_uses_wgmma(const AttentionParams& p);

}  // namespace ariadne
