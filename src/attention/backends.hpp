// Internal: the backends behind ariadne::attention(). Each takes validated params.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ariadne/attention.hpp"
#include "ariadne/attention_backward.hpp"
#include "attention/plan.hpp"

namespace ariadne {

// Plain loops, double accumulation, O(N·d) memory. The oracle of every test (src/attention/reference/reference.cpp).
void attention_reference(const AttentionParams& p);

// Host side of AttentionParams::order: runs `run` (the reference or the CPU backend) on copies of
// q, k, v (and coords) gathered into the pattern's logical order, then scatters out, lse and the
// diagnostics back to their stored rows (src/attention/host_ordered.cpp).
void attention_host_ordered(const AttentionParams& p, void (*run)(const AttentionParams&));

// The backward's oracle: double, two passes (rows, then keys), recomputing each row's LSE and
// output from q, k, v (src/attention/reference/backward.cpp).
void attention_backward_reference(const AttentionParams& p, const AttentionGrads& g);

// attention_host_ordered for the backward: gathers q, k, v, out, lse and dout into logical order,
// runs `run`, scatters dq, dk and dv back.
void attention_backward_host_ordered(const AttentionParams& p, const AttentionGrads& g,
                                     void (*run)(const AttentionParams&, const AttentionGrads&));

// Tiled online-softmax CPU kernels (src/attention/cpu/attention_cpu.cpp).
void attention_cpu(const AttentionParams& p);
bool attention_cpu_supports(const AttentionParams& p, std::string* why);

// The CPU backward (src/attention/cpu/backward.cpp).
void attention_backward_cpu(const AttentionParams& p, const AttentionGrads& g);
bool attention_backward_cpu_supports(const AttentionParams& p, const AttentionGrads& g, std::string* why);

#if defined(ARIADNE_WITH_CUDA)
// cp.async and the epilogues move 16 bytes at a time, so every row start must be 16-byte aligned:
// the base pointer and the token/head strides (in 2-byte elements) multiples of 8 (`elems`).
inline bool rows_aligned(const TensorView& t, int64_t elems) {
  return reinterpret_cast<uintptr_t>(t.data) % uintptr_t(elems * dtype_size(t.dtype)) == 0 &&
         t.stride[0] % elems == 0 && t.stride[1] % elems == 0;
}

// Hopper kernels (src/attention/cuda/). Tensors and pattern arrays are device memory. plan_cuda
// checks support and the overrides (throwing ariadne::Error naming the field), routes, prepares the
// launch and fills the plan's public answers in `info`; run_cuda launches a plan on params that
// match it (checked by the caller).
struct CudaPlan;
bool attention_cuda_supports(const AttentionParams& p, std::string* why);
std::shared_ptr<CudaPlan> plan_cuda(const AttentionParams& p, const AttentionOptions& options, detail::PlanState& info);
void run_cuda(const CudaPlan& plan, const AttentionParams& p);

// Whether the current device is compute capability 9.0 (the Hopper kernels' sm_90a build).
bool current_device_is_sm90();
int current_cuda_device();  // cudaGetDevice (−1 on failure)

// The backward kernels (src/attention/cuda/backward_cuda.cu), planned and run like the forward's.
bool attention_backward_cuda_supports(const AttentionParams& p, const AttentionGrads& g, std::string* why);
std::shared_ptr<CudaBackwardPlan> plan_cuda_backward(const AttentionParams& p, const AttentionGrads& g,
                                                     const BackwardOptions& options, detail::BackwardPlanState& info);
void run_cuda_backward(const CudaBackwardPlan& plan, const AttentionParams& p, const AttentionGrads& g);
#endif

}  // namespace ariadne
