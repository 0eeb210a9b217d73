// Internal: what an AttentionPlan holds (ariadne/attention.hpp), shared by the dispatch
// (src/attention/attention.cpp) and the backends that fill it.
#pragma once

#include <array>
#include <memory>
#include <string>

#include "ariadne/attention.hpp"

namespace ariadne {

#if defined(ARIADNE_WITH_CUDA)
struct CudaPlan;  // src/attention/cuda/attention_cuda.cu
#endif

namespace detail {

// The parts of AttentionParams a plan is made for; run() requires them unchanged.
struct PlanSignature {
  struct View {
    bool defined = false;
    DType dtype = DType::f32;
    Device device = Device::cpu;
    std::array<int64_t, 3> shape{}, stride{};
  };
  View q, k, v, out, lse, entropy, distance, received, coords_q, coords_k, sink;
  SinkMode sink_mode = SinkMode::none;
  int64_t window_left = 0, window_right = 0, chunk = 0;
  int32_t num_seqs = 1;
  bool varlen_q = false, varlen_k = false, blocks = false, order = false;
  int32_t block = 0, block_heads = 0;
};

PlanSignature::View view_of(const TensorView& t);
PlanSignature signature_of(const AttentionParams& p);
bool same_view(const PlanSignature::View& a, const PlanSignature::View& b);
std::string view_text(const PlanSignature::View& v);
// The first field of a call's signature that differs from what the plan was made for, as a
// message (empty: none); check_matches throws it for p.
std::string plan_mismatch(const PlanSignature& want, const PlanSignature& got);
void check_matches(const PlanSignature& want, const AttentionParams& p);

struct PlanState {
  Backend backend = Backend::cpu;
  CudaKernel kernel = CudaKernel::automatic;
  int query_tile_rows = 0, key_tile_rows = 0;
  bool uses_tma = false, stores_by_tma = false, pingpong = false, ordered_tiles = false;
  PlanSignature signature;
#if defined(ARIADNE_WITH_CUDA)
  std::shared_ptr<CudaPlan> cuda;
#endif
};

#if defined(ARIADNE_WITH_CUDA)
}  // namespace detail
struct CudaBackwardPlan;  // src/attention/cuda/backward_cuda.cu
namespace detail {
#endif

// What an AttentionBackwardPlan holds (ariadne/attention_backward.hpp).
struct BackwardPlanState {
  Backend backend = Backend::cpu;
  bool deterministic = false;
  std::string kernel;  // describe(): the CUDA kernel and its tiles; empty on host backends
  CudaKernel cuda_kernel = CudaKernel::automatic;  // the CUDA main kernel; automatic on host backends
  PlanSignature signature;  // the forward's params (out and lse are inputs here)
  PlanSignature::View dout, dq, dk, dv, dsink;
#if defined(ARIADNE_WITH_CUDA)
  std::shared_ptr<CudaBackwardPlan> cuda;
#endif
};

}  // namespace detail
}  // namespace ariadne
