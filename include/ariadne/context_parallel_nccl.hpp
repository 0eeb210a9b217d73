// ariadne/context_parallel_nccl.hpp — the ring of context_parallel.hpp over NCCL on device tensors
// (library ariadne_nccl, built where CUDA and NCCL are found). One call per rank, each on its own
// GPU with its own communicator of the ring (ncclCommInitRank / ncclCommInitAll, or the one
// torch.distributed's NCCL group holds); every rank passes the same lengths, align, rule and sinks.
#pragma once

#include <cstdint>
#include <vector>

#include "ariadne/context_parallel.hpp"

namespace ariadne {

struct NcclRingParams {
  // This rank's zig-zag rows of every sequence (zigzag_shards(lengths[s], world, align)[rank]:
  // the first chunk then the second, sequence after sequence), on this rank's GPU. k and v
  // contiguous: they are sent as they are (only the K/V heads travel).
  TensorView q, k, v;       // [n_r, heads_q, head_dim], [n_r, heads_kv, head_dim]
  TensorView out;           // [n_r, heads_q, head_dim], q's dtype or f32, written
  TensorView lse;           // optional f32 [heads_q, n_r], written
  std::vector<int64_t> lengths;  // every sequence's length (self-attention), the same on every rank
  int64_t align = 1;        // chunk sizes are multiples of it (a multiple of the masks' block)
  Pattern rule;             // the sequences' window and/or chunk
  // Optional: one block mask per query run of this rank (in run order), as
  // estimate_rr_from_key_sums gives it for that run's queries; host arrays.
  std::vector<BlockMask> masks;
  SinkMode sink_mode = SinkMode::none;
  TensorView sink;          // f32 [heads_q] on this GPU
  float scale = 0.f;
  void* comm = nullptr;     // ncclComm_t
  void* stream = nullptr;   // cudaStream_t of the pieces; the transfers run on a stream of their own
};

// Runs the ring on this rank and returns when its out and lse are written (it synchronizes its
// streams: the transfer buffers are freed at return). Throws ariadne::Error naming the field, or
// the CUDA / NCCL call that failed.
RingRankStats ring_attention_nccl(const NcclRingParams& p);

}  // namespace ariadne
