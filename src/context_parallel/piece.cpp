// The pieces of a ring: attention of a run of queries against a run of keys of the same sequence,
// at their positions in it, and the LSE merge of the partial results.
//
// A piece reuses attention() unchanged. Attention aligns a sequence's queries to the end of its
// keys (query i sits at key position i + lk − lq), so a view of queries ending at position qb and a
// view of keys ending at position kb are aligned as the sequence aligns them when the window is
// shifted by Δ = kb − qb: the rule i − L <= j <= i + R in positions becomes the local window
// (L + Δ, R − Δ). Trimming the views to the rows the window can reach keeps both sides >= 0, so
// every piece is one attention call (one per attention chunk when the pattern has chunks).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "ariadne/context_parallel.hpp"
#include "ariadne/device.hpp"
#include "ariadne/estimate.hpp"
#include "context_parallel/internal.hpp"

namespace ariadne {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// A rectangle of positions: queries [qa, qb), keys [ka, kb).
struct Rect {
  int64_t qa, qb, ka, kb;
  bool empty() const { return qb <= qa || kb <= ka; }
};

int64_t round_down(int64_t x, int64_t a) { return Pattern::floordiv(x, a) * a; }

// Trims r to the rows a window (L, R) lets meet (bounds kUnbounded or >= 0); starts stay
// multiples of `align` (the block mask's block, 1 without one) and never move below the originals.
Rect trim(Rect r, int64_t L, int64_t R, int64_t align) {
  if (L != kUnbounded) {
    r.qb = std::min(r.qb, r.kb + L);  // a query after kb − 1 + L sees no key of the run
    r.ka = std::max(r.ka, round_down(r.qa - L, align));
  }
  if (R != kUnbounded) {
    r.kb = std::min(r.kb, r.qb + R);  // a key after qb − 1 + R is seen by no query of the run
    r.qa = std::max(r.qa, round_down(r.ka - R, align));
  }
  return r;
}

// Allowed entries of one call: per query, the keys its local window allows, restricted to the
// listed blocks when there are any (rows of `mask`, local coordinates).
int64_t count_entries(const Pattern& local, const SeqExtent& e, int heads, const BlockMask* mask) {
  int64_t n = 0;
  for (int64_t iq = 0; iq < e.lq; ++iq) {
    const KeyRange kr = local.key_range(e, iq, iq + 1);
    if (kr.empty()) continue;
    if (!mask) {
      n += (kr.hi - kr.lo) * heads;
      continue;
    }
    const int64_t B = mask->block, nqb = (e.lq + B - 1) / B;
    for (int h = 0; h < heads; ++h) {
      const int64_t row = h * nqb + iq / B;
      for (int32_t i = mask->row_ptr[size_t(row)]; i < mask->row_ptr[size_t(row) + 1]; ++i) {
        const int64_t lo = std::max<int64_t>(kr.lo, int64_t(mask->col_idx[size_t(i)]) * B);
        const int64_t hi = std::min<int64_t>(kr.hi, (int64_t(mask->col_idx[size_t(i)]) + 1) * B);
        if (hi > lo) n += hi - lo;
      }
    }
  }
  return n;
}

void require_cuda_build(Device dev, const char* what) {
#if !defined(ARIADNE_WITH_CUDA)
  ARIADNE_CHECK(dev == Device::cpu, what, ": device tensors, but this build has no CUDA backend");
#else
  (void)dev;
  (void)what;
#endif
}

#if defined(ARIADNE_WITH_CUDA)
cp_detail::Row3 row3(const TensorView& t) {
  return cp_detail::Row3{static_cast<float*>(t.data), t.stride[0], t.stride[1], t.shape[2]};
}
#endif

void check_piece(const PieceParams& p) {
  ARIADNE_CHECK(p.q.defined(), "attention_piece: q is not set");
  const Device dev = p.q.device;
  require_cuda_build(dev, "attention_piece");
  for (auto [t, name] : {std::pair{&p.q, "q"}, {&p.k, "k"}, {&p.v, "v"}, {&p.out, "out"}}) {
    ARIADNE_CHECK(t->defined(), "attention_piece: ", name, " is not set");
    require_rank(*t, name, 3);
    require_device(*t, name, dev);
    require_inner_contiguous(*t, name);
  }
  require_dtype(p.q, "q", {DType::f32, DType::bf16, DType::f16});
  require_dtype(p.k, "k", {p.q.dtype});
  require_dtype(p.v, "v", {p.q.dtype});
  require_dtype(p.out, "out", {DType::f32});
  const int64_t n_q = p.q.shape[0], n_k = p.k.shape[0], hq = p.q.shape[1];
  require_dim(p.v, "v", 0, n_k, "keys, same as k");
  require_dim(p.out, "out", 0, n_q, "queries, same as q");
  require_dim(p.out, "out", 1, hq, "heads_q");
  require_dim(p.out, "out", 2, p.q.shape[2], "head_dim");
  ARIADNE_CHECK(p.lse.defined(), "attention_piece: lse is not set (the merge needs it)");
  require_rank(p.lse, "lse", 2);
  require_dtype(p.lse, "lse", {DType::f32});
  require_device(p.lse, "lse", dev);
  ARIADNE_CHECK(p.lse.contiguous(), "attention_piece: lse ", p.lse.describe(), " must be contiguous");
  require_dim(p.lse, "lse", 0, hq, "heads_q");
  require_dim(p.lse, "lse", 1, n_q, "queries, same as q");
  ARIADNE_CHECK(p.q_pos >= 0 && p.k_pos >= 0, "attention_piece: q_pos ", p.q_pos, " and k_pos ", p.k_pos,
                " must be >= 0");
  const Pattern& r = p.rule;
  ARIADNE_CHECK(r.num_seqs == 1 && r.cu_seqlens_q == nullptr && r.cu_seqlens_k == nullptr && !r.blocks.defined(),
                "attention_piece: rule is ", describe(r),
                ", expected a window and/or chunk of one sequence (the block mask goes in `blocks`)");
  ARIADNE_CHECK(r.window_left >= 0 || r.window_left == kUnbounded, "attention_piece: rule window_left is ",
                r.window_left, ", expected >= 0 or unbounded");
  ARIADNE_CHECK(r.window_right >= 0 || r.window_right == kUnbounded, "attention_piece: rule window_right is ",
                r.window_right, ", expected >= 0 or unbounded");
  ARIADNE_CHECK(r.chunk >= 0, "attention_piece: rule chunk is ", r.chunk, ", expected >= 0");
  if (p.lse_scratch.defined()) {
    require_dtype(p.lse_scratch, "lse_scratch", {DType::f32});
    require_device(p.lse_scratch, "lse_scratch", dev);
    ARIADNE_CHECK(p.lse_scratch.contiguous() && p.lse_scratch.numel() >= hq * n_q, "attention_piece: lse_scratch ",
                  p.lse_scratch.describe(), " must be contiguous with >= heads_q · n_q = ", hq * n_q, " elements");
  }
  if (p.blocks.defined()) {
    const BlockSparseView& b = p.blocks;
    ARIADNE_CHECK(b.block > 0 && b.heads == hq, "attention_piece: blocks have block ", b.block, " and ", b.heads,
                  " heads, expected block > 0 and heads_q = ", hq);
    ARIADNE_CHECK(p.q_pos % b.block == 0 && p.k_pos % b.block == 0, "attention_piece: q_pos ", p.q_pos,
                  " and k_pos ", p.k_pos, " must be multiples of the mask's block ", b.block);
    ARIADNE_CHECK(r.chunk == 0 || r.chunk % b.block == 0, "attention_piece: rule chunk ", r.chunk,
                  " must be a multiple of the mask's block ", b.block);
    const int64_t rows = hq * ((n_q + b.block - 1) / b.block);
    ARIADNE_CHECK(b.row_ptr[0] == 0, "attention_piece: blocks row_ptr[0] is ", b.row_ptr[0], ", expected 0");
    for (int64_t i = 0; i < rows; ++i)
      ARIADNE_CHECK(b.row_ptr[i + 1] >= b.row_ptr[i], "attention_piece: blocks row_ptr decreases at row ", i);
  }
}

}  // namespace

PieceWork attention_piece(const PieceParams& p, Backend backend) {
  check_piece(p);
  const int64_t n_q = p.q.shape[0], n_k = p.k.shape[0], hq = p.q.shape[1], d = p.q.shape[2];
  const bool on_gpu = p.q.device == Device::cuda;
  // Rows no call reaches keep the empty partial: out 0, lse −inf.
  if (on_gpu) {
#if defined(ARIADNE_WITH_CUDA)
    cp_detail::fill_partial_cuda(row3(p.out), static_cast<float*>(p.lse.data), n_q, hq, p.stream);
#endif
  } else {
    for (int64_t i = 0; i < n_q; ++i)
      for (int64_t h = 0; h < hq; ++h)
        std::memset(static_cast<float*>(p.out.data) + p.out.offset({i, h, 0}), 0, size_t(d) * sizeof(float));
    std::fill_n(static_cast<float*>(p.lse.data), hq * n_q, kNegInf);
  }

  const int64_t B = p.blocks.defined() ? p.blocks.block : 1;
  const Rect whole{p.q_pos, p.q_pos + n_q, p.k_pos, p.k_pos + n_k};
  std::vector<Rect> rects;
  if (p.rule.chunk > 0) {  // one rectangle per attention chunk both runs reach
    const int64_t C = p.rule.chunk;
    for (int64_t c = std::max(whole.qa, whole.ka) / C; c * C < std::min(whole.qb, whole.kb); ++c)
      rects.push_back(Rect{std::max(whole.qa, c * C), std::min(whole.qb, (c + 1) * C), std::max(whole.ka, c * C),
                           std::min(whole.kb, (c + 1) * C)});
  } else {
    rects.push_back(whole);
  }

  PieceWork work;
  const int64_t L = p.rule.window_left, R = p.rule.window_right;
  for (const Rect& r0 : rects) {
    const Rect r = trim(r0, L, R, B);
    if (r.empty()) continue;
    const int64_t delta = r.kb - r.qb;
    Pattern local = Pattern::window(L == kUnbounded ? kUnbounded : L + delta, R == kUnbounded ? kUnbounded : R - delta);
    const int64_t lq = r.qb - r.qa, lk = r.kb - r.ka;
    const SeqExtent e{0, 0, lq, lk};
    if (local.key_range(e, 0, lq).empty()) continue;

    BlockMask mask;  // the piece's rows for these queries, columns shifted to the key view
    DeviceEstimate mask_on_gpu;  // its device copy, for the CUDA backend
    if (p.blocks.defined()) {
      const int64_t nqb_in = (n_q + B - 1) / B, nqb = (lq + B - 1) / B, m0 = (r.qa - p.q_pos) / B;
      const int64_t c_lo = r.ka / B, c_hi = (r.kb + B - 1) / B;
      std::vector<std::vector<int32_t>> lists(size_t(hq * nqb));
      for (int64_t h = 0; h < hq; ++h)
        for (int64_t m = 0; m < nqb; ++m) {
          const int64_t row = h * nqb_in + m0 + m;
          for (int32_t i = p.blocks.row_ptr[row]; i < p.blocks.row_ptr[row + 1]; ++i) {
            const int64_t c = p.blocks.col_idx[i];
            if (c >= c_lo && c < c_hi) lists[size_t(h * nqb + m)].push_back(int32_t(c - c_lo));
          }
        }
      mask = BlockMask::from_lists(int32_t(B), int32_t(hq), {lq}, lists);
      local = local.with_blocks(mask_view_on(p.q.device, mask, mask_on_gpu));
    }

    // attention() writes a contiguous [heads, lq] LSE: a scratch, copied into the piece's columns.
    Buffer lse;
    DeviceBuffer lse_gpu;
    TensorView lse_view;
    if (p.lse_scratch.defined()) {
      lse_view = make_view(p.lse_scratch.data, DType::f32, {hq, lq}, p.q.device);
    } else if (on_gpu) {
      lse_gpu = DeviceBuffer(DType::f32, {hq, lq});
      lse_view = lse_gpu.view();
    } else {
      lse = Buffer(DType::f32, {hq, lq});
      lse_view = lse.view();
    }
    AttentionParams ap;
    ap.q = row_range(p.q, r.qa - p.q_pos, r.qb - p.q_pos);
    ap.k = row_range(p.k, r.ka - p.k_pos, r.kb - p.k_pos);
    ap.v = row_range(p.v, r.ka - p.k_pos, r.kb - p.k_pos);
    ap.out = row_range(p.out, r.qa - p.q_pos, r.qb - p.q_pos);
    ap.lse = lse_view;
    ap.pattern = local;
    ap.scale = p.scale;
    ap.stream = p.stream;
    if (p.blocks.defined()) ap.blocks_nnz = mask.nnz();
    // The key-0 bias belongs to the call whose key view starts at position 0; a denominator sink
    // is added once, after the merge.
    if (p.sink_mode == SinkMode::key0_bias && r.ka == 0) {
      ap.sink_mode = SinkMode::key0_bias;
      ap.sink = p.sink;
    }
    attention(ap, backend);
    if (on_gpu) {
#if defined(ARIADNE_WITH_CUDA)
      cp_detail::copy_lse_columns_cuda(static_cast<float*>(p.lse.data) + (r.qa - p.q_pos), n_q,
                                       static_cast<const float*>(lse_view.data), lq, lq, hq, p.stream);
#endif
    } else {
      for (int64_t h = 0; h < hq; ++h)
        std::memcpy(static_cast<float*>(p.lse.data) + h * n_q + (r.qa - p.q_pos),
                    static_cast<const float*>(lse_view.data) + h * lq, size_t(lq) * sizeof(float));
    }
    work.calls += 1;
    work.entries += count_entries(local, e, int(hq), p.blocks.defined() ? &mask : nullptr);
  }
  return work;
}

namespace {

void check_partial(const TensorView& out, const TensorView& lse, const char* what_out, const char* what_lse,
                   Device dev) {
  ARIADNE_CHECK(out.defined() && lse.defined(), "merge: ", what_out, " and ", what_lse, " must be set");
  require_rank(out, what_out, 3);
  require_dtype(out, what_out, {DType::f32});
  require_device(out, what_out, dev);
  require_inner_contiguous(out, what_out);
  require_rank(lse, what_lse, 2);
  require_dtype(lse, what_lse, {DType::f32});
  require_device(lse, what_lse, dev);
  ARIADNE_CHECK(lse.stride[1] == 1, "merge: ", what_lse, " ", lse.describe(), " must be contiguous along queries");
  require_dim(lse, what_lse, 0, out.shape[1], "heads, same as the partial out");
  require_dim(lse, what_lse, 1, out.shape[0], "queries, same as the partial out");
}

}  // namespace

void merge_partial(const TensorView& acc_out, const TensorView& acc_lse, const TensorView& part_out,
                   const TensorView& part_lse, void* stream) {
  ARIADNE_CHECK(acc_out.defined(), "merge: acc_out is not set");
  const Device dev = acc_out.device;
  require_cuda_build(dev, "merge_partial");
  check_partial(acc_out, acc_lse, "acc_out", "acc_lse", dev);
  check_partial(part_out, part_lse, "part_out", "part_lse", dev);
  for (int i = 0; i < 3; ++i)
    require_dim(part_out, "part_out", i, acc_out.shape[size_t(i)], "the shape of acc_out");
  const int64_t n = acc_out.shape[0], heads = acc_out.shape[1], d = acc_out.shape[2];
  if (dev == Device::cuda) {
#if defined(ARIADNE_WITH_CUDA)
    cp_detail::merge_partial_cuda(row3(acc_out), static_cast<float*>(acc_lse.data), acc_lse.stride[0], row3(part_out),
                                  static_cast<const float*>(part_lse.data), part_lse.stride[0], n, heads, stream);
#endif
    return;
  }
  float* lse_a = static_cast<float*>(acc_lse.data);
  const float* lse_b = static_cast<const float*>(part_lse.data);
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < n; ++i) {
      const double b = lse_b[h * part_lse.stride[0] + i];
      if (b == -INFINITY) continue;  // nothing to add
      float& a_ref = lse_a[h * acc_lse.stride[0] + i];
      const double a = a_ref, m = std::max(a, b);
      const double l = m + std::log(std::exp(a - m) + std::exp(b - m));
      const float wa = float(std::exp(a - l)), wb = float(std::exp(b - l));  // a = −inf: wa = 0
      float* o = static_cast<float*>(acc_out.data) + acc_out.offset({i, h, 0});
      const float* x = static_cast<const float*>(part_out.data) + part_out.offset({i, h, 0});
      for (int64_t u = 0; u < d; ++u) o[u] = wa * o[u] + wb * x[u];
      a_ref = float(l);
    }
}

void finish_partials(const TensorView& acc_out, const TensorView& acc_lse, SinkMode sink_mode, const TensorView& sink,
                     const TensorView& out, const TensorView& lse, void* stream) {
  ARIADNE_CHECK(acc_out.defined(), "finish_partials: acc_out is not set");
  const Device dev = acc_out.device;
  require_cuda_build(dev, "finish_partials");
  check_partial(acc_out, acc_lse, "acc_out", "acc_lse", dev);
  ARIADNE_CHECK(out.defined(), "finish_partials: out is not set");
  require_rank(out, "out", 3);
  require_dtype(out, "out", {DType::f32, DType::bf16, DType::f16});
  require_device(out, "out", dev);
  require_inner_contiguous(out, "out");
  for (int i = 0; i < 3; ++i) require_dim(out, "out", i, acc_out.shape[size_t(i)], "the shape of acc_out");
  const int64_t n = acc_out.shape[0], heads = acc_out.shape[1], d = acc_out.shape[2];
  if (lse.defined()) {
    require_rank(lse, "lse", 2);
    require_dtype(lse, "lse", {DType::f32});
    require_dim(lse, "lse", 0, heads, "heads");
    require_dim(lse, "lse", 1, n, "queries");
    require_device(lse, "lse", dev);
  }
  const bool denom = sink_mode == SinkMode::denominator;
  if (denom) {
    ARIADNE_CHECK(sink.defined() && sink.dtype == DType::f32 && sink.rank == 1 && sink.shape[0] == heads &&
                      sink.device == dev,
                  "finish_partials: sink must be f32 [", heads, "] on the device of acc_out with a denominator sink, "
                  "got ", sink.describe());
  }
  if (dev == Device::cuda) {
#if defined(ARIADNE_WITH_CUDA)
    cp_detail::finish_partials_cuda(row3(acc_out), static_cast<const float*>(acc_lse.data), acc_lse.stride[0], out, lse,
                                    denom ? static_cast<const float*>(sink.data) : nullptr, denom ? sink.stride[0] : 0,
                                    denom, n, heads, stream);
#endif
    return;
  }
  for (int64_t h = 0; h < heads; ++h) {
    const double s = denom ? double(static_cast<const float*>(sink.data)[h * sink.stride[0]]) : 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const double l = acc_lse.get({h, i});
      double l_out = l, w = 1.0;
      if (denom && s == INFINITY) {  // the sink takes all the mass
        l_out = INFINITY;
        w = 0.0;
      } else if (denom && s != -INFINITY) {
        const double m = std::max(l, s);
        l_out = m + std::log(std::exp(l - m) + std::exp(s - m));
        w = l == -INFINITY ? 0.0 : std::exp(l - l_out);
      }
      const float* o = static_cast<const float*>(acc_out.data) + acc_out.offset({i, h, 0});
      char* dst = static_cast<char*>(out.data) + out.offset({i, h, 0}) * dtype_size(out.dtype);
      for (int64_t u = 0; u < d; ++u) {
        const float x = float(w * double(o[u]));
        if (out.dtype == DType::f32) reinterpret_cast<float*>(dst)[u] = x;
        else if (out.dtype == DType::bf16) reinterpret_cast<uint16_t*>(dst)[u] = float_to_bf16(x);
        else reinterpret_cast<uint16_t*>(dst)[u] = float_to_f16(x);
      }
      if (lse.defined()) lse.set({h, i}, float(l_out));
    }
  }
}

}  // namespace ariadne
