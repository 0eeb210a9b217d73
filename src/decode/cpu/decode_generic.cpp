// The decode task compiled for the generic table (decode_kernel.hpp).
#include "decode/cpu/decode_kernel_body.hpp"

namespace ariadne::decode_detail {

DecodeTaskFn decode_task_generic() { return &decode_task_dispatch; }

}  // namespace ariadne::decode_detail
