// Kernels for head dim 80 (bf16/fp16: the dense and band configurations, the band one with
// diagnostics, the received pass), one file per head dim so the instantiations compile in parallel.
#include "attention/cuda/attention_fwd.cuh"

namespace ariadne::cuda {
ARIADNE_INSTANTIATE_FWD(80)
}  // namespace ariadne::cuda
