// Internal: the dense layers shared by the ViT encoder (src/vit) and the Llama model (src/llm).
// Row-major f32 host arrays throughout.
#pragma once

#include <cstdint>
#include <vector>

namespace ariadne::nn {

// y[n, out] = x[n, in] · W[out, in]ᵀ + b  (accumulate: y += ...). b may be null.
// OpenBLAS's sgemm, single-threaded, with the rows split over OpenMP threads (dense.cpp says why).
void linear(const float* x, int64_t n, int64_t in, const float* W, const float* b, int64_t out, float* y,
            bool accumulate);
inline void linear(const float* x, int64_t n, int64_t in, const std::vector<float>& W, const std::vector<float>& b,
                   int64_t out, float* y, bool accumulate) {
  linear(x, n, in, W.data(), b.empty() ? nullptr : b.data(), out, y, accumulate);
}

// RMSNorm in fp32 (HF's LlamaRMSNorm / Qwen2RMSNorm): y = w · (x · rsqrt(mean(x²) + eps)), per row
// of d values; the mean is summed in double. y may alias x.
void rmsnorm(const float* x, int64_t n, int64_t d, const float* w, float eps, float* y);
inline void rmsnorm(const float* x, int64_t n, int64_t d, const std::vector<float>& w, float eps, float* y) {
  rmsnorm(x, n, d, w.data(), eps, y);
}

}  // namespace ariadne::nn
