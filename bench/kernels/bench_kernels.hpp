// Kernels that only benchmarks (and their tests) use, compiled into the ariadne_bench_kernels
// target, never into the engine. Plain C++ declarations, so host-compiled benchmarks can call them.
#pragma once

#include <cstdint>

namespace ariadne {

// Queues one single-thread kernel on `stream` (a cudaStream_t; null: the legacy stream) that spins
// for about `microseconds` at the device's clock rate: what a benchmark queues before a timed call so
// that the host has enqueued the call before the GPU reaches it (bench/anchors.py does the same with
// torch.cuda._sleep). Throws on a launch error.
void cuda_spin(void* stream, double microseconds);

// The memory floor of an attention call, for benchmarks (src/cuda/memory_floor.cu; bench/README.md,
// "Memory floor"): one launch that reads q_bytes of q and kv_bytes each of k and v and writes
// q_bytes of out (out = q ^ k ^ v over 16-byte words where they overlap), the traffic every
// attention kernel must do with none of its work. Pointers 16-byte aligned, sizes multiples of 16,
// out not overlapping the inputs; errors name the argument.
void cuda_memory_floor(const void* q, const void* k, const void* v, void* out, int64_t q_bytes, int64_t kv_bytes,
                       void* stream);

}  // namespace ariadne
