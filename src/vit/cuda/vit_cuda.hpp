// Internal: the encoder's CUDA forward pass (src/vit/cuda/vit_cuda.cu), called by encode() for
// Backend::cuda. Plain C++ (no CUDA headers), so src/vit can include it.
#pragma once

#include <vector>

#include "ariadne/vit.hpp"

namespace ariadne {

#if defined(ARIADNE_WITH_CUDA)
// encode() on the GPU; the arguments are already checked against each other by encode().
EncodeResult encode_cuda(const VitWeights& weights, const std::vector<float>& pixels, const std::vector<Grid>& grids,
                         const Schedule& schedule, const EncodeOptions& options, bool keep_hidden);
#endif

}  // namespace ariadne
