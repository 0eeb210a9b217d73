// Internal: the backends behind ariadne::attention(). Each takes validated params.
#pragma once

#include <memory>
#include <string>

#include "ariadne/attention.hpp"
#include "attention/plan.hpp"

namespace ariadne {

// Plain loops, double accumulation, O(N·d) memory. The oracle of every test (src/attention/reference/reference.cpp).
void attention_reference(const AttentionParams& p);

// Host side of AttentionParams::order: runs `run` (the reference or the CPU backend) on copies of
// q, k, v (and coords) gathered into the pattern's logical order, then scatters out, lse and the
// diagnostics back to their stored rows (src/attention/host_ordered.cpp).
void attention_host_ordered(const AttentionParams& p, void (*run)(const AttentionParams&));

// Tiled online-softmax CPU kernels (src/attention/cpu/attention_cpu.cpp).
void attention_cpu(const AttentionParams& p);
bool attention_cpu_supports(const AttentionParams& p, std::string* why);

#if defined(ARIADNE_WITH_CUDA)
// Hopper kernels (src/attention/cuda/). Tensors and pattern arrays are device memory. plan_cuda
// checks support and the overrides (throwing ariadne::Error naming the field), routes, prepares the
// launch and fills the plan's public answers in `info`; run_cuda launches a plan on params that
// match it (checked by the caller).
struct CudaPlan;
bool attention_cuda_supports(const AttentionParams& p, std::string* why);
std::shared_ptr<CudaPlan> plan_cuda(const AttentionParams& p, const AttentionOptions& options, detail::PlanState& info);
void run_cuda(const CudaPlan& plan, const AttentionParams& p);
#endif

}  // namespace ariadne
