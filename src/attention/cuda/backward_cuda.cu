// The CUDA backend's backward: what it supports, the plan's workspace and the launch
// (attention_bwd.cuh holds the kernels).
#include <cuda_runtime.h>

#include <string>

#include "attention/backends.hpp"
#include "attention/cuda/attention_bwd.cuh"
#include "attention/cuda/attention_bwd_wgmma.cuh"

namespace ariadne {

// The plan's device workspace, owned; sized for the planned shapes.
struct CudaBackwardPlan {
  float* dq_acc = nullptr;     // [total_q, heads_q, D]; none with dq_direct
  float* delta = nullptr;      // [heads_q, total_q]
  float* sink_part = nullptr;  // [heads_q, sink_parts]
  int* counters = nullptr;     // [heads_q, query_tiles], deterministic only
  int sink_parts = 0;
  int64_t query_tiles = 0;
  bool deterministic = false;
  bool dq_direct = false;  // the tile kernel stores dQ (one key tile per query tile): dq_direct_holds
  CudaKernel kernel = CudaKernel::tile;  // the main kernel: tile (attention_bwd.cuh) or wgmma
  CudaBackwardPlan() = default;
  CudaBackwardPlan(const CudaBackwardPlan&) = delete;
  CudaBackwardPlan& operator=(const CudaBackwardPlan&) = delete;
  ~CudaBackwardPlan() {
    cudaFree(dq_acc);
    cudaFree(delta);
    cudaFree(sink_part);
    cudaFree(counters);
  }
};

namespace {

bool no(std::string* why, const std::string& msg) {
  if (why != nullptr) *why = msg;
  return false;
}

template <class T>
T* device_alloc(size_t count, const char* what) {
  void* ptr = nullptr;
  if (count == 0) return nullptr;
  const cudaError_t e = cudaMalloc(&ptr, count * sizeof(T));
  ARIADNE_CHECK(e == cudaSuccess, "cuda backward: allocating the ", what, " (", count * sizeof(T), " bytes): ",
                cudaGetErrorString(e));
  return static_cast<T*>(ptr);
}

// Why the wgmma backward kernel (attention_bwd_wgmma.cuh) cannot run p (empty: it can): head dims
// 64, 80 and 128, block masks whose block is a multiple of its 128-key tiles, compute capability
// 9.0. Every pattern, sink, GQA ratio, order and lq/lk shape the tile kernel runs it runs too.
std::string wgmma_backward_refuses(const AttentionParams& p) {
  const int d = p.head_dim();
  if (d != 64 && d != 80 && d != 128)
    return "head_dim " + std::to_string(d) + " (the wgmma backward has 64, 80 and 128)";
  if (p.pattern.blocks.defined() && p.pattern.blocks.block % cuda::BwdWgShape<64>::BK != 0)
    return "block size " + std::to_string(p.pattern.blocks.block) + " (the wgmma backward needs a multiple of 128)";
  if (!current_device_is_sm90()) return "a device that is not compute capability 9.0";
  return {};
}

// Whether every query tile of the tile kernel is seen by exactly one of its key tiles, so that the
// key tile's CTA may store dQ instead of adding it (BwdParams::dq_direct): a chunk that divides the
// 64-row tiles, no block mask, and queries and keys of one length in every sequence (cu_seqlens_k
// null, or no cu_seqlens and total_q == total_k; both are part of the plan's signature). Then a
// query and its keys lie in the same 64-row tile of their sequence, and each row sees itself.
bool dq_direct_holds(const AttentionParams& p) {
  static_assert(cuda::kBwdBQ == cuda::kBwdBK, "direct dQ pairs query tile t with key tile t");
  const Pattern& pat = p.pattern;
  if (pat.chunk <= 0 || cuda::kBwdBQ % pat.chunk != 0 || pat.blocks.defined()) return false;
  return pat.cu_seqlens_q != nullptr ? pat.cu_seqlens_k == nullptr : p.q.shape[0] == p.k.shape[0];
}

}  // namespace

bool attention_backward_cuda_supports(const AttentionParams& p, const AttentionGrads& g, std::string* why) {
  if (!attention_cuda_supports(p, why)) return false;
  if (g.dout.dtype != p.q.dtype)
    return no(why, std::string("cuda backward: dout dtype ") + dtype_name(g.dout.dtype) + ", expected " +
                       dtype_name(p.q.dtype) + " (the dtype of q)");
  if (!rows_aligned(g.dout, 8) || g.dout.stride[0] >= (int64_t(1) << 24) || g.dout.stride[1] >= (int64_t(1) << 24))
    return no(why, "cuda backward: dout rows must start on 16-byte boundaries with strides below 2^24 elements");
  for (const auto& [t, name] : {std::pair{&g.dq, "dq"}, std::pair{&g.dk, "dk"}, std::pair{&g.dv, "dv"}})
    if (!rows_aligned(*t, 2)) return no(why, std::string("cuda backward: ") + name + " rows must be 4-byte aligned (even strides)");
  if (g.dk.dtype != g.dv.dtype) return no(why, "cuda backward: dk and dv must have one dtype");
  if (p.lse.device != Device::cuda || g.dout.device != Device::cuda) return no(why, "cuda backward: lse and dout must be device tensors");
  if (g.dsink.defined() && g.dsink.device != Device::cuda) return no(why, "cuda backward: dsink must be a device tensor");
  return true;
}

std::shared_ptr<CudaBackwardPlan> plan_cuda_backward(const AttentionParams& p, const AttentionGrads& g,
                                                     const BackwardOptions& options, detail::BackwardPlanState& info) {
  (void)g;
  auto plan = std::make_shared<CudaBackwardPlan>();
  const int64_t total_q = p.q.shape[0], hq = p.heads_q(), d = p.head_dim();
  plan->deterministic = options.deterministic;
  // The routing decision. automatic takes the warp-specialized wgmma kernel wherever it runs except
  // chunks: full, causal and block-sparse rows (1.45-1.64x the kernel before it on an H100) and
  // sliding windows (±64 at N 4096: 0.140 against the tile kernel's 0.158 ms); chunks stay on the
  // tile kernel, whose 64-key CTAs match a chunk's tiles (0.113 against 0.121 ms at chunk 64;
  // docs/design/backward.md, "The Hopper kernel").
  switch (options.cuda_kernel) {
    case CudaKernel::automatic:
      plan->kernel = p.pattern.chunk == 0 && wgmma_backward_refuses(p).empty()
                         ? CudaKernel::wgmma
                         : CudaKernel::tile;
      break;
    case CudaKernel::tile: plan->kernel = CudaKernel::tile; break;
    case CudaKernel::wgmma: {
      const std::string why = wgmma_backward_refuses(p);
      ARIADNE_CHECK(why.empty(), "attention_backward: cuda_kernel 'wgmma' cannot run this call: ", why);
      plan->kernel = CudaKernel::wgmma;
      break;
    }
    default:
      ARIADNE_CHECK(false, "attention_backward: cuda_kernel '", cuda_kernel_name(options.cuda_kernel),
                    "' is a forward kernel (the backward has tile and wgmma)");
  }
  // Direct dQ needs no accumulator (nor, deterministic, any turn-taking).
  plan->dq_direct = plan->kernel == CudaKernel::tile && dq_direct_holds(p);
  if (!plan->dq_direct)
    plan->dq_acc = device_alloc<float>(
        size_t(checked_mul(checked_mul(total_q, hq, "dq accumulator"), d, "dq accumulator")), "dq accumulator");
  plan->delta = device_alloc<float>(size_t(total_q * hq), "D = rowsum(dout * out)");
  if (p.sink_mode == SinkMode::denominator) plan->sink_parts = int((total_q + cuda::kBwdPrepRows - 1) / cuda::kBwdPrepRows);
  if (p.sink_mode == SinkMode::key0_bias) plan->sink_parts = p.pattern.num_seqs;
  plan->sink_part = device_alloc<float>(size_t(hq) * size_t(plan->sink_parts), "sink partials");
  if (options.deterministic && !plan->dq_direct) {
    plan->query_tiles = p.pattern.cu_seqlens_q != nullptr ? p.pattern.num_seqs + total_q / cuda::kBwdBQ + 1
                                                          : (total_q + cuda::kBwdBQ - 1) / cuda::kBwdBQ;
    plan->counters = device_alloc<int>(size_t(hq * plan->query_tiles), "deterministic counters");
  }
  info.cuda_kernel = plan->kernel;
  info.kernel = plan->kernel == CudaKernel::wgmma ? "wgmma kernel, 128 keys x 64 queries"
                : plan->dq_direct                 ? "tile kernel, 64x64 tiles, dq stored directly"
                                                  : "tile kernel, 64x64 tiles";
  return plan;
}

void run_cuda_backward(const CudaBackwardPlan& plan, const AttentionParams& p, const AttentionGrads& g) {
  const auto st = static_cast<cudaStream_t>(p.stream);
  const int64_t total_q = p.q.shape[0], total_k = p.k.shape[0];
  if (total_q == 0 || total_k == 0) {
    // Nothing attends: every gradient is zero. Views of zero rows need no write.
    for (const TensorView* t : {&g.dq, &g.dk, &g.dv, &g.dsink}) {
      if (!t->defined() || t->numel() == 0) continue;
      ARIADNE_CHECK(t->contiguous(), "cuda backward: with no query or no key, ", t == &g.dsink ? "dsink" : "dq/dk/dv",
                    " must be contiguous to be cleared");
      const cudaError_t e = cudaMemsetAsync(t->data, 0, size_t(t->numel()) * size_t(dtype_size(t->dtype)), st);
      ARIADNE_CHECK(e == cudaSuccess, "cuda backward: clearing gradients: ", cudaGetErrorString(e));
    }
    return;
  }
  cuda::BwdParams bp{};
  bp.q = p.q.data;
  bp.k = p.k.data;
  bp.v = p.v.data;
  bp.out = p.out.data;
  bp.dout = g.dout.data;
  bp.lse = static_cast<const float*>(p.lse.data);
  bp.sink = p.sink_mode != SinkMode::none ? static_cast<const float*>(p.sink.data) : nullptr;
  bp.order = p.order;
  bp.dq = g.dq.data;
  bp.dk = g.dk.data;
  bp.dv = g.dv.data;
  bp.dsink = g.dsink.defined() ? static_cast<float*>(g.dsink.data) : nullptr;
  bp.dq_acc = plan.dq_acc;
  bp.delta = plan.delta;
  bp.sink_part = plan.sink_part;
  bp.counters = plan.counters;
  bp.sink_parts = plan.sink_parts;
  bp.q_tok = p.q.stride[0];
  bp.q_head = p.q.stride[1];
  bp.k_tok = p.k.stride[0];
  bp.k_head = p.k.stride[1];
  bp.v_tok = p.v.stride[0];
  bp.v_head = p.v.stride[1];
  bp.o_tok = p.out.stride[0];
  bp.o_head = p.out.stride[1];
  bp.do_tok = g.dout.stride[0];
  bp.do_head = g.dout.stride[1];
  bp.dq_tok = g.dq.stride[0];
  bp.dq_head = g.dq.stride[1];
  bp.dk_tok = g.dk.stride[0];
  bp.dk_head = g.dk.stride[1];
  bp.dv_tok = g.dv.stride[0];
  bp.dv_head = g.dv.stride[1];
  bp.total_q = total_q;
  bp.total_k = total_k;
  bp.heads_q = p.heads_q();
  bp.group = p.heads_q() / p.heads_kv();
  bp.scale = p.resolved_scale();
  bp.scale_log2 = bp.scale * 1.4426950408889634f;
  bp.sink_kind = p.sink_mode == SinkMode::denominator ? cuda::kSinkDenominator
                 : p.sink_mode == SinkMode::key0_bias ? cuda::kSinkKey0
                                                      : cuda::kSinkNone;
  bp.out_f32 = p.out.dtype == DType::f32;
  bp.dq_f32 = g.dq.dtype == DType::f32;
  bp.dkv_f32 = g.dk.dtype == DType::f32;
  bp.deterministic = plan.deterministic;
  bp.dq_direct = plan.dq_direct;
  bp.query_tiles = plan.query_tiles;
  bp.pattern = p.pattern;

  const bool bf16 = p.q.dtype == DType::bf16;
  cudaError_t e = cudaErrorInvalidValue;
  if (plan.kernel == CudaKernel::wgmma) {
    switch (p.head_dim()) {
      case 64: e = bf16 ? cuda::launch_bwd_wgmma<64, cuda::Bf16>(bp, st) : cuda::launch_bwd_wgmma<64, cuda::F16>(bp, st); break;
      case 80: e = bf16 ? cuda::launch_bwd_wgmma<80, cuda::Bf16>(bp, st) : cuda::launch_bwd_wgmma<80, cuda::F16>(bp, st); break;
      case 128: e = bf16 ? cuda::launch_bwd_wgmma<128, cuda::Bf16>(bp, st) : cuda::launch_bwd_wgmma<128, cuda::F16>(bp, st); break;
      default: break;
    }
    ARIADNE_CHECK(e == cudaSuccess, "cuda backward: launch failed: ", cudaGetErrorString(e));
    return;
  }
  switch (p.head_dim()) {
    case 64: e = bf16 ? cuda::launch_bwd<64, cuda::Bf16>(bp, st) : cuda::launch_bwd<64, cuda::F16>(bp, st); break;
    case 80: e = bf16 ? cuda::launch_bwd<80, cuda::Bf16>(bp, st) : cuda::launch_bwd<80, cuda::F16>(bp, st); break;
    case 96: e = bf16 ? cuda::launch_bwd<96, cuda::Bf16>(bp, st) : cuda::launch_bwd<96, cuda::F16>(bp, st); break;
    case 128: e = bf16 ? cuda::launch_bwd<128, cuda::Bf16>(bp, st) : cuda::launch_bwd<128, cuda::F16>(bp, st); break;
    default: break;
  }
  ARIADNE_CHECK(e == cudaSuccess, "cuda backward: launch failed: ", cudaGetErrorString(e));
}

}  // namespace ariadne
