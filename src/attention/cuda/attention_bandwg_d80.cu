// wgmma band kernels for head dim 80 (bf16, fp16): the only head dim they are built for (ViT's).
#include "attention/cuda/attention_bandwg.cuh"

#include <vector>

namespace ariadne::cuda {
ARIADNE_INSTANTIATE_BANDWG(80)

#if defined(ARIADNE_BANDWG_TIMELINE)
// The timeline words of this translation unit's kernels (attention_bandwg.cuh), zeroed after reading.
cudaError_t bandwg_timeline_read(unsigned long long* host, size_t words) {
  const size_t n = words < size_t(kTimelineCtas * kTimelineWords) ? words : size_t(kTimelineCtas * kTimelineWords);
  cudaError_t e = cudaMemcpyFromSymbol(host, g_bandwg_timeline, n * sizeof(unsigned long long));
  if (e != cudaSuccess) return e;
  static const std::vector<unsigned long long> zeros(size_t(kTimelineCtas * kTimelineWords), 0ull);
  return cudaMemcpyToSymbol(g_bandwg_timeline, zeros.data(), zeros.size() * sizeof(unsigned long long));
}
#endif
}  // namespace ariadne::cuda
