// wgmma band kernels for head dim 80 (bf16, fp16): the only head dim they are built for (ViT's).
#include "attention/cuda/attention_bandwg.cuh"

namespace ariadne::cuda {
ARIADNE_INSTANTIATE_BANDWG(80)
}  // namespace ariadne::cuda
