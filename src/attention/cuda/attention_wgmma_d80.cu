// wgmma kernels for head dim 80 (bf16, fp16), one file per head dim so they compile in parallel.
#include "attention/cuda/attention_wgmma.cuh"

namespace ariadne::cuda {
ARIADNE_INSTANTIATE_WGMMA(80)
}  // namespace ariadne::cuda
