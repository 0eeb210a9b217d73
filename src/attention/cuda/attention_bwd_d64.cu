// Backward kernels for head dim 64 (bf16/fp16), one file per head dim so they compile in parallel.
#include "attention/cuda/attention_bwd.cuh"

namespace ariadne::cuda {
ARIADNE_INSTANTIATE_BWD(64)
}  // namespace ariadne::cuda
