// AttentionParams::order on host backends: gather the stored rows into the pattern's logical order,
// run the backend on those copies, scatter the per-row results back. The CUDA backend does not come
// here: it folds the order into its tile loads and epilogue stores.
#include <cstring>
#include <vector>

#include "ariadne/attention_backward.hpp"
#include "ariadne/order.hpp"
#include "attention/backends.hpp"

namespace ariadne {
namespace {

// A logical-order copy of a [total, ...] host view (order.hpp's row gather).
Buffer gathered(const TensorView& src, const std::vector<int32_t>& index) {
  std::vector<int64_t> shape(src.shape.begin(), src.shape.begin() + src.rank);
  Buffer dst(src.dtype, shape);
  gather_rows(src, dst.view(), index);
  return dst;
}

// dst[order[i], h, :] = src[i, h, :]; src is a contiguous [total, heads, dim] buffer.
void scatter_rows(const Buffer& src, const TensorView& dst, const int32_t* order) {
  const int64_t n = dst.shape[0], heads = dst.shape[1], dim = dst.shape[2];
  const size_t es = size_t(dtype_size(dst.dtype)), row_bytes = size_t(dim) * es;
  const auto* from = static_cast<const char*>(src.data());
  auto* to = static_cast<char*>(dst.data);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < heads; ++h)
      std::memcpy(to + size_t(dst.offset({order[i], h, 0})) * es, from + size_t((i * heads + h) * dim) * es,
                  row_bytes);
}

// Per-row statistics [heads, total] f32, contiguous (validate checked): logical column i -> stored order[i].
void scatter_stat(const Buffer& src, const TensorView& dst, const int32_t* order) {
  const int64_t heads = dst.shape[0], n = dst.shape[1];
  const float* from = src.as<float>();
  float* to = static_cast<float*>(dst.data);
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < n; ++i) to[h * n + order[i]] = from[h * n + i];
}

// Logical-order copy of per-row statistics [heads, total] f32: logical column i <- stored order[i].
Buffer gathered_stat(const TensorView& src, const int32_t* order) {
  const int64_t heads = src.shape[0], n = src.shape[1];
  Buffer dst(DType::f32, {heads, n});
  const float* from = static_cast<const float*>(src.data);
  float* to = dst.as<float>();
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < n; ++i) to[h * n + i] = from[h * n + order[i]];
  return dst;
}

Buffer like(const TensorView& t) { return Buffer(t.dtype, {t.shape[0], t.shape[1], t.shape[2]}); }

}  // namespace

void attention_host_ordered(const AttentionParams& p, void (*run)(const AttentionParams&)) {
  const int32_t* order = p.order;
  const std::vector<int32_t> index(order, order + p.q.shape[0]);
  AttentionParams lp = p;
  lp.order = nullptr;
  const Buffer q = gathered(p.q, index), k = gathered(p.k, index), v = gathered(p.v, index);
  lp.q = q.view();
  lp.k = k.view();
  lp.v = v.view();
  const Buffer out(p.out.dtype, {p.out.shape[0], p.out.shape[1], p.out.shape[2]});
  lp.out = out.view();

  // Statistics the caller asked for get logical-order scratch rows of the same shape.
  auto stat_scratch = [](const TensorView& t) {
    return t.defined() ? Buffer(DType::f32, {t.shape[0], t.shape[1]}) : Buffer();
  };
  const Buffer lse = stat_scratch(p.lse), ent = stat_scratch(p.entropy), dist = stat_scratch(p.distance),
               recv = stat_scratch(p.received);
  lp.lse = p.lse.defined() ? lse.view() : TensorView{};
  lp.entropy = p.entropy.defined() ? ent.view() : TensorView{};
  lp.distance = p.distance.defined() ? dist.view() : TensorView{};
  lp.received = p.received.defined() ? recv.view() : TensorView{};
  Buffer cq, ck;
  if (p.distance.defined()) {
    cq = gathered(p.coords_q, index);
    ck = gathered(p.coords_k, index);
    lp.coords_q = cq.view();
    lp.coords_k = ck.view();
  }

  run(lp);

  scatter_rows(out, p.out, order);
  if (p.lse.defined()) scatter_stat(lse, p.lse, order);
  if (p.entropy.defined()) scatter_stat(ent, p.entropy, order);
  if (p.distance.defined()) scatter_stat(dist, p.distance, order);
  if (p.received.defined()) scatter_stat(recv, p.received, order);
}

void attention_backward_host_ordered(const AttentionParams& p, const AttentionGrads& g,
                                     void (*run)(const AttentionParams&, const AttentionGrads&)) {
  const int32_t* order = p.order;
  const std::vector<int32_t> index(order, order + p.q.shape[0]);
  AttentionParams lp = p;
  lp.order = nullptr;
  const Buffer q = gathered(p.q, index), k = gathered(p.k, index), v = gathered(p.v, index),
               out = gathered(p.out, index), dout = gathered(g.dout, index), lse = gathered_stat(p.lse, order);
  lp.q = q.view();
  lp.k = k.view();
  lp.v = v.view();
  lp.out = out.view();
  lp.lse = lse.view();
  const Buffer dq = like(g.dq), dk = like(g.dk), dv = like(g.dv);
  AttentionGrads lg = g;
  lg.dout = dout.view();
  lg.dq = dq.view();
  lg.dk = dk.view();
  lg.dv = dv.view();

  run(lp, lg);

  scatter_rows(dq, g.dq, order);
  scatter_rows(dk, g.dk, order);
  scatter_rows(dv, g.dv, order);
}

}  // namespace ariadne
