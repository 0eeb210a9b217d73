// ariadne::attention(): argument checks shared by every backend, and the dispatch between them.
#include "ariadne/attention.hpp"

#include <cmath>
#include <iterator>
#include <utility>
#include <vector>

#include "attention/backends.hpp"
#include "attention/plan.hpp"

namespace ariadne {

const char* sink_mode_name(SinkMode m) {
  switch (m) {
    case SinkMode::none: return "none";
    case SinkMode::denominator: return "denominator";
    case SinkMode::key0_bias: return "key0";
  }
  return "?";
}

SinkMode parse_sink_mode(const std::string& s) {
  if (s == "none" || s.empty()) return SinkMode::none;
  if (s == "denominator" || s == "denom") return SinkMode::denominator;
  if (s == "key0" || s == "key0_bias") return SinkMode::key0_bias;
  detail::fail("sink mode: '", s, "' is not one of none, denominator, key0");
}

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::automatic: return "auto";
    case Backend::reference: return "reference";
    case Backend::cpu: return "cpu";
    case Backend::cuda: return "cuda";
  }
  return "?";
}

Backend parse_backend(const std::string& s) {
  if (s == "auto") return Backend::automatic;
  if (s == "reference" || s == "ref") return Backend::reference;
  if (s == "cpu") return Backend::cpu;
  if (s == "cuda" || s == "gpu") return Backend::cuda;
  detail::fail("backend: '", s, "' is not one of auto, reference, cpu, cuda");
}

float AttentionParams::resolved_scale() const {
  return scale != 0.f ? scale : 1.f / std::sqrt(float(head_dim()));
}

namespace {

void check_stat(const TensorView& t, const char* name, int64_t heads, int64_t tokens, Device dev) {
  if (!t.defined()) return;
  require_rank(t, name, 2);
  require_dtype(t, name, {DType::f32});
  require_dim(t, name, 0, heads, "heads_q");
  require_dim(t, name, 1, tokens, "tokens");
  ARIADNE_CHECK(t.contiguous(), name, ": must be contiguous (", t.describe(), ")");
  require_device(t, name, dev);
}

void check_coords(const TensorView& t, const char* name, int64_t tokens, Device dev) {
  require_rank(t, name, 2);
  require_dtype(t, name, {DType::f32});
  require_dim(t, name, 0, tokens, "tokens");
  require_dim(t, name, 1, 2, "(row, col)");
  require_inner_contiguous(t, name);
  require_device(t, name, dev);
}

}  // namespace

void validate_order(const int32_t* order, int64_t total) {
  std::vector<uint8_t> seen(size_t(total), 0);
  for (int64_t i = 0; i < total; ++i) {
    const int64_t r = order[i];
    ARIADNE_CHECK(r >= 0 && r < total, "order[", i, "] = ", r, ", expected a row in [0, ", total, ")");
    ARIADNE_CHECK(!seen[size_t(r)], "order[", i, "] = ", r, " repeats an earlier entry; expected a permutation");
    seen[size_t(r)] = 1;
  }
}

Backend automatic_backend(const TensorView& q) {
  if (q.device == Device::cuda) return Backend::cuda;
  return q.dtype == DType::f64 ? Backend::reference : Backend::cpu;
}

void validate(const AttentionParams& p) {
  require_rank(p.q, "q", 3);
  require_rank(p.k, "k", 3);
  require_rank(p.v, "v", 3);
  require_rank(p.out, "out", 3);
  const Device dev = p.q.device;
  for (auto [t, name] : {std::pair{&p.k, "k"}, {&p.v, "v"}, {&p.out, "out"}}) require_device(*t, name, dev);
  require_dtype(p.q, "q", {DType::f32, DType::bf16, DType::f16, DType::f64});
  ARIADNE_CHECK(p.q.dtype != DType::f64 || dev == Device::cpu,
                "q: f64 tensors are host tensors (the reference backend's exact checks), got a device tensor");
  require_dtype(p.k, "k", {p.q.dtype});
  require_dtype(p.v, "v", {p.q.dtype});
  require_dtype(p.out, "out", {p.q.dtype, DType::f32});
  for (auto [t, name] : {std::pair{&p.q, "q"}, {&p.k, "k"}, {&p.v, "v"}, {&p.out, "out"}})
    require_inner_contiguous(*t, name);

  const int64_t total_q = p.q.shape[0], total_k = p.k.shape[0];
  const int64_t hq = p.q.shape[1], hkv = p.k.shape[1], d = p.q.shape[2];
  ARIADNE_CHECK(hq > 0 && hkv > 0, "q/k: head counts must be positive, got heads_q = ", hq, ", heads_kv = ", hkv);
  ARIADNE_CHECK(d > 0, "q: dim 2 (head_dim) is ", d, ", expected > 0");
  ARIADNE_CHECK(hq % hkv == 0, "GQA: heads_q = ", hq, " is not a multiple of heads_kv = ", hkv);
  require_dim(p.k, "k", 2, d, "head_dim, same as q");
  require_dim(p.v, "v", 0, total_k, "tokens, same as k");
  require_dim(p.v, "v", 1, hkv, "heads_kv, same as k");
  require_dim(p.v, "v", 2, d, "head_dim, same as q");
  require_dim(p.out, "out", 0, total_q, "tokens, same as q");
  require_dim(p.out, "out", 1, hq, "heads_q");
  require_dim(p.out, "out", 2, d, "head_dim");
  ARIADNE_CHECK(std::isfinite(p.scale), "scale is ", p.scale, ", expected a finite number (0 = 1/sqrt(head_dim))");
  ARIADNE_CHECK(p.blocks_nnz >= -1, "blocks_nnz is ", p.blocks_nnz,
                ", expected -1 (unknown) or the number of blocks pattern.blocks lists");

  check_stat(p.lse, "lse", hq, total_q, dev);
  check_stat(p.entropy, "entropy", hq, total_q, dev);
  check_stat(p.distance, "distance", hq, total_q, dev);
  check_stat(p.received, "received", hq, total_k, dev);
  if (p.distance.defined()) {
    ARIADNE_CHECK(p.coords_q.defined() && p.coords_k.defined(),
                  "distance: requested, but coords_q / coords_k (token positions) are missing");
    check_coords(p.coords_q, "coords_q", total_q, dev);
    check_coords(p.coords_k, "coords_k", total_k, dev);
  }
  if (p.sink_mode != SinkMode::none) {
    require_rank(p.sink, "sink", 1);
    if (p.q.dtype == DType::f64) require_dtype(p.sink, "sink", {DType::f32, DType::f64});
    else require_dtype(p.sink, "sink", {DType::f32});
    require_dim(p.sink, "sink", 0, hq, "heads_q");
    require_device(p.sink, "sink", dev);
    ARIADNE_CHECK(p.sink.stride[0] == 1, "sink: must be contiguous");
  }
  if (p.order != nullptr) {
    ARIADNE_CHECK(total_q == total_k, "order: a token order needs total_q == total_k, got ", total_q, " and ",
                  total_k);
    if (dev == Device::cpu) validate_order(p.order, total_q);
  }
  // Arrays behind the pattern can only be read here when they are host memory.
  if (dev == Device::cpu) validate_pattern(p.pattern, total_q, total_k, int(hq));
  else {
    ARIADNE_CHECK(p.pattern.chunk >= 0 && p.pattern.num_seqs >= 1, "pattern: chunk must be >= 0 and num_seqs >= 1");
    ARIADNE_CHECK(!p.pattern.blocks.defined() || p.pattern.blocks.heads == hq, "pattern.blocks.heads is ",
                  p.pattern.blocks.heads, ", expected heads_q = ", hq);
  }
}

bool backend_supports(Backend backend, const AttentionParams& p, std::string* why) {
  auto no = [&](const char* msg) {
    if (why) *why = msg;
    return false;
  };
  switch (backend) {
    case Backend::automatic:
      return backend_supports(automatic_backend(p.q), p, why);
    case Backend::reference:
      return p.q.device == Device::cpu ? true : no("the reference runs on host tensors only");
    case Backend::cpu:
      if (p.q.device != Device::cpu) return no("the cpu backend needs host tensors");
      return attention_cpu_supports(p, why);
    case Backend::cuda:
#if defined(ARIADNE_WITH_CUDA)
      if (p.q.device != Device::cuda) return no("the cuda backend needs device tensors");
      return attention_cuda_supports(p, why);
#else
      return no("this build of ariadne has no CUDA backend (configure with nvcc present)");
#endif
  }
  return no("unknown backend");
}

const char* toggle_name(Toggle t) {
  switch (t) {
    case Toggle::automatic: return "auto";
    case Toggle::off: return "off";
    case Toggle::on: return "on";
  }
  return "?";
}

const char* cuda_kernel_name(CudaKernel k) {
  switch (k) {
    case CudaKernel::automatic: return "auto";
    case CudaKernel::tile: return "tile";
    case CudaKernel::wgmma: return "wgmma";
    case CudaKernel::band: return "band";
    case CudaKernel::bandwg: return "bandwg";
  }
  return "?";
}

namespace detail {

PlanSignature::View view_of(const TensorView& t) {
  PlanSignature::View v;
  v.defined = t.defined();
  if (!v.defined) return v;
  v.dtype = t.dtype;
  v.device = t.device;
  for (int i = 0; i < 3 && i < t.rank; ++i) {
    v.shape[size_t(i)] = t.shape[i];
    v.stride[size_t(i)] = t.stride[i];
  }
  return v;
}

PlanSignature signature_of(const AttentionParams& p) {
  PlanSignature s;
  s.q = view_of(p.q);
  s.k = view_of(p.k);
  s.v = view_of(p.v);
  s.out = view_of(p.out);
  s.lse = view_of(p.lse);
  s.entropy = view_of(p.entropy);
  s.distance = view_of(p.distance);
  s.received = view_of(p.received);
  s.coords_q = view_of(p.coords_q);
  s.coords_k = view_of(p.coords_k);
  s.sink_mode = p.sink_mode;
  if (p.sink_mode != SinkMode::none) s.sink = view_of(p.sink);
  const Pattern& pat = p.pattern;
  s.window_left = pat.window_left;
  s.window_right = pat.window_right;
  s.chunk = pat.chunk;
  s.num_seqs = pat.num_seqs;
  s.varlen_q = pat.cu_seqlens_q != nullptr;
  s.varlen_k = pat.cu_seqlens_k != nullptr;
  s.blocks = pat.blocks.defined();
  s.block = pat.blocks.block;
  s.block_heads = pat.blocks.heads;
  s.order = p.order != nullptr;
  return s;
}

bool same_view(const PlanSignature::View& a, const PlanSignature::View& b) {
  return a.defined == b.defined &&
         (!a.defined || (a.dtype == b.dtype && a.device == b.device && a.shape == b.shape && a.stride == b.stride));
}

std::string view_text(const PlanSignature::View& v) {
  if (!v.defined) return "not given";
  std::string s = std::string(dtype_name(v.dtype)) + (v.device == Device::cuda ? " cuda [" : " cpu [");
  for (size_t i = 0; i < 3; ++i) s += (i ? ", " : "") + std::to_string(v.shape[i]);
  s += "] strides [";
  for (size_t i = 0; i < 3; ++i) s += (i ? ", " : "") + std::to_string(v.stride[i]);
  return s + "]";
}

// The first field of `got` (signature_of the call) that differs from what the plan was made for,
// as a message; empty if none.
std::string plan_mismatch(const PlanSignature& want, const PlanSignature& got) {
  using V = PlanSignature::View;
  const std::pair<const V*, const V*> views[] = {{&want.q, &got.q},           {&want.k, &got.k},
                                                 {&want.v, &got.v},           {&want.out, &got.out},
                                                 {&want.lse, &got.lse},       {&want.entropy, &got.entropy},
                                                 {&want.distance, &got.distance}, {&want.received, &got.received},
                                                 {&want.coords_q, &got.coords_q}, {&want.coords_k, &got.coords_k},
                                                 {&want.sink, &got.sink}};
  const char* names[] = {"q", "k", "v", "out", "lse", "entropy", "distance", "received", "coords_q", "coords_k", "sink"};
  for (size_t i = 0; i < std::size(views); ++i)
    if (!same_view(*views[i].first, *views[i].second))
      return std::string("run: ") + names[i] + " is " + view_text(*views[i].second) + ", the plan was made for " +
             view_text(*views[i].first);
  if (want.sink_mode != got.sink_mode)
    return std::string("run: sink_mode is ") + sink_mode_name(got.sink_mode) + ", the plan was made for " +
           sink_mode_name(want.sink_mode);
  const std::pair<const char*, std::pair<int64_t, int64_t>> fields[] = {
      {"window_left", {want.window_left, got.window_left}},
      {"window_right", {want.window_right, got.window_right}},
      {"chunk", {want.chunk, got.chunk}},
      {"num_seqs", {want.num_seqs, got.num_seqs}},
      {"cu_seqlens_q (given)", {want.varlen_q, got.varlen_q}},
      {"cu_seqlens_k (given)", {want.varlen_k, got.varlen_k}},
      {"blocks (given)", {want.blocks, got.blocks}},
      {"blocks.block", {want.block, got.block}},
      {"blocks.heads", {want.block_heads, got.block_heads}}};
  for (const auto& [name, wg] : fields)
    if (wg.first != wg.second)
      return std::string("run: pattern.") + name + " is " + std::to_string(wg.second) + ", the plan was made for " +
             std::to_string(wg.first);
  if (want.order != got.order)
    return std::string("run: order is ") + (got.order ? "given" : "not given") + ", the plan was made " +
           (want.order ? "with" : "without") + " a token order";
  return {};
}

void check_matches(const PlanSignature& want, const AttentionParams& p) {
  const std::string why = plan_mismatch(want, signature_of(p));
  ARIADNE_CHECK(why.empty(), why);
}

}  // namespace detail

Backend AttentionPlan::backend() const { return state().backend; }
CudaKernel AttentionPlan::cuda_kernel() const { return state().kernel; }
int AttentionPlan::query_tile_rows() const { return state().query_tile_rows; }
int AttentionPlan::key_tile_rows() const { return state().key_tile_rows; }
bool AttentionPlan::uses_tma() const { return state().uses_tma; }
bool AttentionPlan::stores_by_tma() const { return state().stores_by_tma; }
bool AttentionPlan::pingpong() const { return state().pingpong; }
bool AttentionPlan::ordered_tiles() const { return state().ordered_tiles; }
const detail::PlanState& AttentionPlan::state() const {
  ARIADNE_CHECK(state_ != nullptr, "attention plan: empty (made by plan_attention only)");
  return *state_;
}

std::string AttentionPlan::describe() const {
  const detail::PlanState& s = state();
  std::string d = backend_name(s.backend);
  if (s.backend != Backend::cuda) return d;
  d += std::string(" ") + cuda_kernel_name(s.kernel) + " kernel, " + std::to_string(s.query_tile_rows) + "x" +
       std::to_string(s.key_tile_rows) + " tiles";
  if (s.kernel == CudaKernel::wgmma) {
    d += s.uses_tma ? ", tma" : ", cp.async";
    if (s.stores_by_tma) d += ", out by tma";
    if (s.pingpong) d += ", ping-pong";
  }
  if (s.ordered_tiles) d += ", ordered tiles";
  return d;
}

AttentionPlan plan_attention(const AttentionParams& p, const AttentionOptions& options) {
  validate(p);
  Backend backend = options.backend;
  if (backend == Backend::automatic) backend = automatic_backend(p.q);
  auto state = std::make_shared<detail::PlanState>();
  state->backend = backend;
  state->signature = detail::signature_of(p);
  std::string why;
  ARIADNE_CHECK(backend_supports(backend, p, &why), "attention: backend '", backend_name(backend), "' cannot run ",
                describe(p.pattern), ": ", why);
  if (backend == Backend::cuda) {
#if defined(ARIADNE_WITH_CUDA)
    state->cuda = plan_cuda(p, options, *state);
#endif
  } else {
    const AttentionOverrides& ov = options.overrides;
    const AttentionOverrides none;
    ARIADNE_CHECK(ov.cuda_kernel == CudaKernel::automatic && ov.tma == none.tma && ov.out_tma == none.out_tma &&
                      ov.pingpong == none.pingpong && ov.launch_order == none.launch_order &&
                      ov.tile_128_rows == none.tile_128_rows && ov.band_run == none.band_run &&
                      ov.ordered_tiles == none.ordered_tiles && ov.chunk_pass == none.chunk_pass,
                  "attention: overrides (cuda_kernel = ", cuda_kernel_name(ov.cuda_kernel),
                  ", ...) choose CUDA kernels; backend '", backend_name(backend), "' takes none");
  }
  AttentionPlan plan;
  plan.state_ = std::move(state);
  return plan;
}

namespace {

// The launch of a plan on params that match it.
void run_matched(const detail::PlanState& s, const AttentionParams& p) {
  switch (s.backend) {
    case Backend::reference:
      if (p.order != nullptr) attention_host_ordered(p, attention_reference);
      else attention_reference(p);
      break;
    case Backend::cpu:
      if (p.order != nullptr) attention_host_ordered(p, attention_cpu);
      else attention_cpu(p);
      break;
    case Backend::cuda:
#if defined(ARIADNE_WITH_CUDA)
      run_cuda(*s.cuda, p);
#endif
      break;
    case Backend::automatic: break;
  }
}

}  // namespace

void run(const AttentionPlan& plan, const AttentionParams& p) {
  const detail::PlanState& s = plan.state();
  detail::check_matches(s.signature, p);
  // Host arrays behind the pattern (and a host order) may differ from the planned ones: the host
  // backends check them again, as they are read anyway.
  if (s.backend != Backend::cuda) validate(p);
  run_matched(s, p);
}

void attention(const AttentionParams& p, Backend backend) {
  AttentionOptions options;
  options.backend = backend;
  const AttentionPlan plan = plan_attention(p, options);
  run_matched(plan.state(), p);
}

}  // namespace ariadne
