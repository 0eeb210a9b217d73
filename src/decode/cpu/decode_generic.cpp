// The decode task and the page scorers' loops compiled for the generic table (decode_kernel.hpp).
#include "decode/cpu/decode_kernel_body.hpp"

namespace ariadne::decode_detail {

DecodeTaskFn decode_task_generic() { return &decode_task_dispatch; }
ScoreKernels score_kernels_generic() { return score_kernels_here(); }

}  // namespace ariadne::decode_detail
