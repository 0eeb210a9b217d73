// The decode task and the page scorers' loops compiled for the avx512 table (decode_kernel.hpp).
// GCC 12's _mm512_undefined_ps() initializes a register with itself, which -Wmaybe-uninitialized
// reports inside the intrinsics' headers (as in attention_avx512.cpp).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "decode/cpu/decode_kernel_body.hpp"

namespace ariadne::decode_detail {

#if defined(__x86_64__)
DecodeTaskFn decode_task_avx512() { return &decode_task_dispatch; }
ScoreKernels score_kernels_avx512() { return score_kernels_here(); }
#else
DecodeTaskFn decode_task_avx512() { return nullptr; }
ScoreKernels score_kernels_avx512() { return {}; }
#endif

}  // namespace ariadne::decode_detail
