// The decode task's body (decode_kernel.hpp), included by each ISA file only. Everything here is
// in an unnamed namespace: each ISA file keeps its own copy compiled for its flags, and the linker
// never merges an AVX-512 copy into the generic table.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "decode/cpu/decode_kernel.hpp"

namespace ariadne::decode_detail {
namespace {

template <class T>
inline float to_f32(T x) {
  if constexpr (sizeof(T) == 4) return x;
  else return bf16_to_float(x);
}

// Rows [r0, r1) of one page: convert each key row to f32, score it against every head, then fold
// the page into the running softmax and accumulate V (converted row by row, read once per group).
template <DType kDtype>
inline void decode_task_body(const DecodeTask& t) {
  using Elem = std::conditional_t<kDtype == DType::f32, float, uint16_t>;
  const int d = t.d, G = t.G, P = t.P;
  const Elem* kpool = reinterpret_cast<const Elem*>(t.k);
  const Elem* vpool = reinterpret_cast<const Elem*>(t.v);
  const int64_t row_stride = int64_t(t.kv_heads) * d;
  for (int hg = 0; hg < G; ++hg) {
    t.m[hg] = -std::numeric_limits<float>::infinity();
    t.l[hg] = 0.f;
    std::fill_n(t.acc + int64_t(hg) * d, d, 0.f);
  }
  float vf[1024];
  for (int64_t pi = 0; pi < t.npages; ++pi) {
    const int64_t page = t.pages[pi];
    const int64_t r0 = std::max<int64_t>(t.first - page * P, 0), r1 = std::min<int64_t>(t.length - page * P, P);
    if (r1 <= r0) continue;
    const int rows = int(r1 - r0);
    const int64_t base = (int64_t(t.table[page]) * P + r0) * row_stride + int64_t(t.g) * d;
    for (int r = 0; r < rows; ++r) {
      const Elem* kr = kpool + base + r * row_stride;
      float* dst = t.kf + int64_t(r) * d;
      if constexpr (kDtype == DType::f16) {
        for (int i = 0; i < d; ++i) dst[i] = f16_to_float(kr[i]);
      } else {
#pragma omp simd
        for (int i = 0; i < d; ++i) dst[i] = to_f32(kr[i]);
      }
    }
    for (int hg = 0; hg < G; ++hg) {
      const float* qh = t.q + int64_t(hg) * d;
      float* sh = t.s + int64_t(hg) * P;
      float mx = t.m[hg];
      bool nan = false;
      for (int r = 0; r < rows; ++r) {
        const float* kr = t.kf + int64_t(r) * d;
        float dot = 0.f;
#pragma omp simd reduction(+ : dot)
        for (int i = 0; i < d; ++i) dot += qh[i] * kr[i];
        float x = dot * t.scale;
        if (t.key0_bias && page * P + r0 + r == 0) x += t.key0_bias[hg];
        sh[r] = x;
        nan |= std::isnan(x);
        mx = std::max(mx, x);
      }
      // A NaN or +inf logit poisons the row (docs/numerics.md): m and l become NaN for good.
      if (nan || mx == std::numeric_limits<float>::infinity() || std::isnan(t.m[hg])) {
        t.m[hg] = t.l[hg] = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      const float alpha = t.m[hg] == -std::numeric_limits<float>::infinity() ? 0.f : std::exp(t.m[hg] - mx);
      float sum = 0.f;
      for (int r = 0; r < rows; ++r) sum += (sh[r] = std::exp(sh[r] - mx));
      t.l[hg] = t.l[hg] * alpha + sum;
      t.m[hg] = mx;
      float* a = t.acc + int64_t(hg) * d;
#pragma omp simd
      for (int i = 0; i < d; ++i) a[i] *= alpha;
    }
    for (int r = 0; r < rows; ++r) {
      const Elem* vr = vpool + base + r * row_stride;
      if constexpr (kDtype == DType::f16) {
        for (int i = 0; i < d; ++i) vf[i] = f16_to_float(vr[i]);
      } else {
#pragma omp simd
        for (int i = 0; i < d; ++i) vf[i] = to_f32(vr[i]);
      }
      for (int hg = 0; hg < G; ++hg) {
        if (std::isnan(t.m[hg])) continue;
        const float w = t.s[int64_t(hg) * P + r];
        float* a = t.acc + int64_t(hg) * d;
#pragma omp simd
        for (int i = 0; i < d; ++i) a[i] += w * vf[i];
      }
    }
  }
}

inline void decode_task_dispatch(const DecodeTask& t) {
  switch (t.dtype) {
    case DType::f32: decode_task_body<DType::f32>(t); break;
    case DType::bf16: decode_task_body<DType::bf16>(t); break;
    default: decode_task_body<DType::f16>(t); break;
  }
}

}  // namespace
}  // namespace ariadne::decode_detail
