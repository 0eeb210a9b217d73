// Hopper backward main kernel for head dim 128 (bf16/fp16), one file per head dim so they compile in parallel.
#include "attention/cuda/attention_bwd_wgmma.cuh"

namespace ariadne::cuda {
ARIADNE_INSTANTIATE_BWD_WGMMA(128)
}  // namespace ariadne::cuda
