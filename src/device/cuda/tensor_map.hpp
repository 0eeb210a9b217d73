// Internal (host): the driver's cuTensorMapEncodeTiled for the TMA kernels' tensor maps, reached
// through the runtime's driver entry point so that nothing links libcuda (CI builds without a
// driver). Shared by the wgmma kernel's maps (attention_cuda.cu) and the wgmma band kernel's
// (attention_bandwg.cuh).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

namespace ariadne::cuda {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The encoder, looked up once per process; null when the driver lacks it.
inline EncodeTiled encode_tiled() {
  static const EncodeTiled fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      return EncodeTiled(nullptr);
    return reinterpret_cast<EncodeTiled>(f);
  }();
  return fn;
}

}  // namespace ariadne::cuda
