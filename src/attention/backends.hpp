// Internal: the backends behind ariadne::attention(). Each takes validated params.
#pragma once

#include <string>

#include "ariadne/attention.hpp"

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
// Hopper kernels (src/attention/cuda/). Tensors and pattern arrays are device memory.
void attention_cuda(const AttentionParams& p);
bool attention_cuda_supports(const AttentionParams& p, std::string* why);
#endif

}  // namespace ariadne
