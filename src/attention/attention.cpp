// ariadne::attention(): argument checks shared by every backend, and the dispatch between them.
#include "ariadne/attention.hpp"

#include <cmath>
#include <vector>

#include "attention/backends.hpp"

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

void validate(const AttentionParams& p) {
  require_rank(p.q, "q", 3);
  require_rank(p.k, "k", 3);
  require_rank(p.v, "v", 3);
  require_rank(p.out, "out", 3);
  const Device dev = p.q.device;
  for (auto [t, name] : {std::pair{&p.k, "k"}, {&p.v, "v"}, {&p.out, "out"}}) require_device(*t, name, dev);
  require_dtype(p.q, "q", {DType::f32, DType::bf16, DType::f16});
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
    require_dtype(p.sink, "sink", {DType::f32});
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
      return backend_supports(p.q.device == Device::cuda ? Backend::cuda : Backend::cpu, p, why);
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

void attention(const AttentionParams& p, Backend backend) {
  validate(p);
  if (backend == Backend::automatic) backend = p.q.device == Device::cuda ? Backend::cuda : Backend::cpu;
  std::string why;
  ARIADNE_CHECK(backend_supports(backend, p, &why), "attention: backend '", backend_name(backend),
                "' cannot run ", describe(p.pattern), ": ", why);
  switch (backend) {
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
      attention_cuda(p);
#endif
      break;
    case Backend::automatic: break;
  }
}

}  // namespace ariadne
