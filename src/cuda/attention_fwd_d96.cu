// Forward kernels for head dim 96 (bf16/fp16 x 4/8 warps), one file per head dim so
// the instantiations compile in parallel.
#include "cuda/attention_fwd.cuh"

namespace ariadne::cuda {
ARIADNE_INSTANTIATE_FWD(96)
}  // namespace ariadne::cuda
