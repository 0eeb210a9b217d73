// The decode task and the page scorers' loops compiled for the avx2 table (decode_kernel.hpp).
#include "decode/cpu/decode_kernel_body.hpp"

namespace ariadne::decode_detail {

#if defined(__x86_64__)
DecodeTaskFn decode_task_avx2() { return &decode_task_dispatch; }
ScoreKernels score_kernels_avx2() { return score_kernels_here(); }
#else
DecodeTaskFn decode_task_avx2() { return nullptr; }
ScoreKernels score_kernels_avx2() { return {}; }
#endif

}  // namespace ariadne::decode_detail
