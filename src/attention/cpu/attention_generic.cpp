// Portable tile primitives (plain loops the compiler may vectorize for the baseline ISA): the
// fallback for CPUs without AVX2 and the readable statement of what the SIMD files compute.
#include <cmath>
#include <limits>

#include "attention/cpu/attention_kernels.hpp"

namespace ariadne::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

bool lane_allowed(const RowMask& mk, int r, int j) {
  return j >= mk.lo[r] && j < mk.hi[r] && ((mk.keymask >> j) & 1u);
}

// t of row r, key j; −inf where masked.
float logit2(const float* s, const RowMask& mk, int r, int j) {
  if (!lane_allowed(mk, r, j)) return kNegInf;
  float t = s[r * kKeyTile + j] * mk.scale2;
  if (j == 0 && mk.apply_bias) t += mk.bias2;
  return t;
}

void qk_f32(const float* q, int64_t ldq, const float* k, int d, int rows, float* s) {
  for (int r = 0; r < rows; ++r) {
    float acc[kKeyTile] = {};
    for (int c = 0; c < d; ++c) {
      const float qv = q[r * ldq + c];
      for (int j = 0; j < kKeyTile; ++j) acc[j] += qv * k[c * kKeyTile + j];
    }
    for (int j = 0; j < kKeyTile; ++j) s[r * kKeyTile + j] = acc[j];
  }
}

void softmax(float* s, const RowMask& mk, int rows, float* m, float* l, float* alpha, float* t_out) {
  for (int r = 0; r < rows; ++r) {
    float t[kKeyTile];
    float mx = kNegInf;
    bool bad = false;  // a NaN or +inf logit (masked keys hold -inf)
    for (int j = 0; j < kKeyTile; ++j) {
      t[j] = logit2(s, mk, r, j);
      mx = std::fmax(mx, t[j]);
      bad = bad || !(t[j] <= std::numeric_limits<float>::max());
    }
    if (t_out)
      for (int j = 0; j < kKeyTile; ++j) t_out[r * kKeyTile + j] = t[j];
    float* p = s + r * kKeyTile;
    if (poison_row(bad, r, p, m, l, alpha)) continue;
    const float m_new = std::fmax(m[r], mx);
    if (m_new == kNegInf) {  // no key seen yet: keep the empty state
      alpha[r] = 1.f;
      for (int j = 0; j < kKeyTile; ++j) p[j] = 0.f;
      continue;
    }
    alpha[r] = m_new == m[r] ? 1.f : std::exp2(m[r] - m_new);  // the max rarely moves after a few tiles  // m[r] = −inf gives 0
    float sum = 0.f;
    for (int j = 0; j < kKeyTile; ++j) {
      p[j] = t[j] == kNegInf ? 0.f : std::exp2(t[j] - m_new);
      sum += p[j];
    }
    l[r] = l[r] * alpha[r] + sum;
    m[r] = m_new;
  }
}

void pv_f32(const float* p, const float* v, int64_t ldv, int dv, int rows, const float* alpha, float* o) {
  for (int r = 0; r < rows; ++r) {
    float* orow = o + int64_t(r) * dv;
    for (int c = 0; c < dv; ++c) orow[c] *= alpha[r];
    for (int j = 0; j < kKeyTile; ++j) {
      const float pj = p[r * kKeyTile + j];
      for (int c = 0; c < dv; ++c) orow[c] += pj * v[j * ldv + c];
    }
  }
}

void colsum(const float* s, const RowMask& mk, int rows, const float* off, float* cs) {
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < kKeyTile; ++j) {
      const float t = logit2(s, mk, r, j);
      if (t != kNegInf) cs[j] += std::exp2(t - off[r]);
    }
}

void probs(const float* s, const RowMask& mk, int rows, const float* off, float* p) {
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < kKeyTile; ++j) {
      const float t = logit2(s, mk, r, j);
      p[r * kKeyTile + j] = t == kNegInf ? 0.f : std::exp2(t - off[r]);
    }
}

const TileKernels kGeneric{"generic", qk_f32, nullptr, softmax, pv_f32, nullptr, nullptr, nullptr, nullptr, nullptr,
                           colsum, nullptr, nullptr, nullptr, nullptr, probs, nullptr, nullptr, nullptr, nullptr, nullptr};

}  // namespace

const TileKernels* tile_kernels_generic() { return &kGeneric; }

}  // namespace ariadne::cpu
