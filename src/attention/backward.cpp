// ariadne::attention_backward(): the checks shared by every backend, the plan and the dispatch.
#include "ariadne/attention_backward.hpp"

#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "attention/backends.hpp"
#include "attention/plan.hpp"

namespace ariadne {
namespace {

// A gradient tensor shaped like `like` (its forward tensor), in q's dtype or f32, on q's device.
void check_grad(const TensorView& t, const char* name, const TensorView& like, const char* like_name,
                const AttentionParams& p) {
  ARIADNE_CHECK(t.defined(), name, ": required (the gradient of ", like_name, "), not given");
  require_rank(t, name, 3);
  for (int i = 0; i < 3; ++i) {
    static const char* what[] = {"tokens", "heads", "head_dim"};
    ARIADNE_CHECK(t.shape[i] == like.shape[i], name, ": dim ", i, " (", what[i], ") is ", t.shape[i], ", expected ",
                  like.shape[i], " as in ", like_name);
  }
  require_dtype(t, name, {p.q.dtype, DType::f32});
  require_inner_contiguous(t, name);
  require_device(t, name, p.q.device);
}

}  // namespace

void validate_backward(const AttentionParams& p, const AttentionGrads& g) {
  validate(p);
  ARIADNE_CHECK(p.lse.defined(), "lse: the backward needs the forward's LSE [heads_q, total_q] (not given)");
  ARIADNE_CHECK(!p.entropy.defined() && !p.distance.defined() && !p.received.defined(),
                "backward: entropy, distance and received are forward diagnostics; leave them undefined");
  check_grad(g.dout, "dout", p.out, "out", p);
  check_grad(g.dq, "dq", p.q, "q", p);
  check_grad(g.dk, "dk", p.k, "k", p);
  check_grad(g.dv, "dv", p.v, "v", p);
  if (g.dsink.defined()) {
    ARIADNE_CHECK(p.sink_mode != SinkMode::none, "dsink: given, but sink_mode is none (there is no sink to differentiate)");
    require_rank(g.dsink, "dsink", 1);
    if (p.q.dtype == DType::f64) require_dtype(g.dsink, "dsink", {DType::f32, DType::f64});
    else require_dtype(g.dsink, "dsink", {DType::f32});
    require_dim(g.dsink, "dsink", 0, p.heads_q(), "heads_q");
    ARIADNE_CHECK(g.dsink.stride[0] == 1, "dsink: must be contiguous");
    require_device(g.dsink, "dsink", p.q.device);
  }
}

bool backend_supports_backward(Backend backend, const AttentionParams& p, const AttentionGrads& g, std::string* why) {
  auto no = [&](const char* msg) {
    if (why) *why = msg;
    return false;
  };
  switch (backend) {
    case Backend::automatic:
      return backend_supports_backward(automatic_backend(p.q), p, g, why);
    case Backend::reference:
      return p.q.device == Device::cpu ? true : no("the reference runs on host tensors only");
    case Backend::cpu:
      if (p.q.device != Device::cpu) return no("the cpu backend needs host tensors");
      return attention_backward_cpu_supports(p, g, why);
    case Backend::cuda:
#if defined(ARIADNE_WITH_CUDA)
      if (p.q.device != Device::cuda) return no("the cuda backend needs device tensors");
      return attention_backward_cuda_supports(p, g, why);
#else
      (void)g;
      return no("this build of ariadne has no CUDA backend (configure with nvcc present)");
#endif
  }
  return no("unknown backend");
}

Backend AttentionBackwardPlan::backend() const { return state().backend; }
bool AttentionBackwardPlan::deterministic() const { return state().deterministic; }
CudaKernel AttentionBackwardPlan::cuda_kernel() const { return state().cuda_kernel; }
const detail::BackwardPlanState& AttentionBackwardPlan::state() const {
  ARIADNE_CHECK(state_ != nullptr, "attention backward plan: empty (made by plan_attention_backward only)");
  return *state_;
}

std::string AttentionBackwardPlan::describe() const {
  const detail::BackwardPlanState& s = state();
  std::string d = std::string(backend_name(s.backend)) + " backward";
  if (!s.kernel.empty()) d += ", " + s.kernel;
  if (s.deterministic) d += ", deterministic";
  return d;
}

AttentionBackwardPlan plan_attention_backward(const AttentionParams& p, const AttentionGrads& g,
                                              const BackwardOptions& options) {
  validate_backward(p, g);
  Backend backend = options.backend;
  if (backend == Backend::automatic) backend = automatic_backend(p.q);
  ARIADNE_CHECK(options.cuda_kernel == CudaKernel::automatic || backend == Backend::cuda,
                "attention_backward: cuda_kernel '", cuda_kernel_name(options.cuda_kernel),
                "' needs the cuda backend, not '", backend_name(backend), "'");
  std::string why;
  ARIADNE_CHECK(backend_supports_backward(backend, p, g, &why), "attention_backward: backend '", backend_name(backend),
                "' cannot run ", describe(p.pattern), ": ", why);
  auto state = std::make_shared<detail::BackwardPlanState>();
  state->backend = backend;
  // The host backends are deterministic for a given thread count whatever the option says.
  state->deterministic = options.deterministic || backend != Backend::cuda;
  state->signature = detail::signature_of(p);
  state->dout = detail::view_of(g.dout);
  state->dq = detail::view_of(g.dq);
  state->dk = detail::view_of(g.dk);
  state->dv = detail::view_of(g.dv);
  state->dsink = detail::view_of(g.dsink);
#if defined(ARIADNE_WITH_CUDA)
  if (backend == Backend::cuda) state->cuda = plan_cuda_backward(p, g, options, *state);
#endif
  AttentionBackwardPlan plan;
  plan.state_ = std::move(state);
  return plan;
}

namespace {

void run_matched(const detail::BackwardPlanState& s, const AttentionParams& p, const AttentionGrads& g) {
  switch (s.backend) {
    case Backend::reference:
      if (p.order != nullptr) attention_backward_host_ordered(p, g, attention_backward_reference);
      else attention_backward_reference(p, g);
      break;
    case Backend::cpu:
      if (p.order != nullptr) attention_backward_host_ordered(p, g, attention_backward_cpu);
      else attention_backward_cpu(p, g);
      break;
    case Backend::cuda:
#if defined(ARIADNE_WITH_CUDA)
      run_cuda_backward(*s.cuda, p, g);
#endif
      break;
    case Backend::automatic: break;
  }
}

}  // namespace

namespace {

// The first tensor of (p, g) that differs from what the backward plan was made for; empty if none.
// `got` is signature_of(p), computed once by the caller (the cache compares it with every plan).
std::string backward_mismatch(const detail::BackwardPlanState& s, const detail::PlanSignature& got,
                              const AttentionGrads& g) {
  std::string why = detail::plan_mismatch(s.signature, got);
  if (!why.empty()) return why;
  using V = detail::PlanSignature::View;
  const std::pair<const V*, const TensorView*> grads[] = {
      {&s.dout, &g.dout}, {&s.dq, &g.dq}, {&s.dk, &g.dk}, {&s.dv, &g.dv}, {&s.dsink, &g.dsink}};
  const char* names[] = {"dout", "dq", "dk", "dv", "dsink"};
  for (size_t i = 0; i < 5; ++i) {
    const V got = detail::view_of(*grads[i].second);
    if (!detail::same_view(*grads[i].first, got))
      return std::string("run: ") + names[i] + " is " + detail::view_text(got) +
             ", the backward plan was made for " + detail::view_text(*grads[i].first);
  }
  return {};
}

// The plans attention_backward(p, g, options) keeps for reuse, most recently used first. A plan
// is shared by the calls that fit it; `enqueue` is held while one of them enqueues its launches,
// so that the calls of two host threads on one stream do not interleave on its workspace.
struct CachedBackwardPlan {
  AttentionBackwardPlan plan;
  BackwardOptions options;
  void* stream = nullptr;
  int device = -1;  // the CUDA device (−1: a host backend)
  std::mutex enqueue;
};
constexpr size_t kBackwardPlanCacheSize = 8;
std::mutex backward_cache_mutex;
std::list<std::shared_ptr<CachedBackwardPlan>>& backward_cache() {
  static std::list<std::shared_ptr<CachedBackwardPlan>> cache;
  return cache;
}

}  // namespace

void run(const AttentionBackwardPlan& plan, const AttentionParams& p, const AttentionGrads& g) {
  const detail::BackwardPlanState& s = plan.state();
  const std::string why = backward_mismatch(s, detail::signature_of(p), g);
  ARIADNE_CHECK(why.empty(), why);
  if (s.backend != Backend::cuda) validate_backward(p, g);
  run_matched(s, p, g);
}

void attention_backward(const AttentionParams& p, const AttentionGrads& g, Backend backend) {
  BackwardOptions options;
  options.backend = backend;
  attention_backward(p, g, options);
}

void attention_backward(const AttentionParams& p, const AttentionGrads& g, const BackwardOptions& options) {
  validate_backward(p, g);
  int device = -1;
#if defined(ARIADNE_WITH_CUDA)
  const Backend backend = options.backend == Backend::automatic ? automatic_backend(p.q) : options.backend;
  if (backend == Backend::cuda) device = current_cuda_device();
#endif
  const detail::PlanSignature signature = detail::signature_of(p);
  std::shared_ptr<CachedBackwardPlan> entry;
  {
    const std::lock_guard<std::mutex> lock(backward_cache_mutex);
    auto& cache = backward_cache();
    for (auto it = cache.begin(); it != cache.end(); ++it) {
      const CachedBackwardPlan& c = **it;
      if (c.options.backend == options.backend && c.options.deterministic == options.deterministic &&
          c.options.cuda_kernel == options.cuda_kernel && c.stream == p.stream && c.device == device &&
          backward_mismatch(c.plan.state(), signature, g).empty()) {
        entry = *it;
        cache.splice(cache.begin(), cache, it);
        break;
      }
    }
    if (entry == nullptr) {
      entry = std::make_shared<CachedBackwardPlan>();
      entry->plan = plan_attention_backward(p, g, options);
      entry->options = options;
      entry->stream = p.stream;
      entry->device = device;
      cache.push_front(entry);
      // The evicted plan's workspace is freed when its last user lets go of it.
      if (cache.size() > kBackwardPlanCacheSize) cache.pop_back();
    }
  }
  const std::lock_guard<std::mutex> lock(entry->enqueue);
  run_matched(entry->plan.state(), p, g);
}

size_t backward_plan_cache_size() {
  const std::lock_guard<std::mutex> lock(backward_cache_mutex);
  return backward_cache().size();
}

void clear_backward_plan_cache() {
  std::list<std::shared_ptr<CachedBackwardPlan>> dropped;
  {
    const std::lock_guard<std::mutex> lock(backward_cache_mutex);
    dropped.swap(backward_cache());
  }
}

}  // namespace ariadne
