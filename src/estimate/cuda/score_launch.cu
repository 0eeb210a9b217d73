// Where each scoring kernel runs (scoring_refusal), its shared memory, and the launch of the one
// ScoreParams::kernel names. The kernels: score_generic.cu (f32, mma_generic, mma_rr),
// score_grouped.cu (mma_grouped), score_wgmma.cu (wgmma_exact, wgmma_approximate).
#include <string>

#include "estimate/cuda/estimate.cuh"

namespace ariadne::cuda {

size_t scores_smem_bytes(const ScoreParams& p) {
  switch (p.kernel) {
    case CudaScoring::wgmma_exact:
    case CudaScoring::wgmma_approximate: return scores_wgmma_smem_bytes();
    case CudaScoring::mma_grouped: return scores_grouped_smem_bytes(p);
    default: return scores_generic_smem_bytes(p);
  }
}

std::string scoring_refusal(const ScoreParams& p, CudaScoring k, size_t smem_optin) {
  ScoreParams probe = p;
  probe.kernel = k;
  probe.mma = k != CudaScoring::f32;
  const std::string name = std::string("the ") + cuda_scoring_name(k) + " scoring kernel";
  if (k == CudaScoring::automatic) return "automatic names no kernel";
  if (k != CudaScoring::f32 && k != CudaScoring::mma_generic) {
    if (!p.rr) return name + " runs RR only";
    if (p.spb != 8 && p.spb != 16)
      return name + " needs block / stride = 8 or 16 (here " + std::to_string(p.spb) + ")";
  }
  if (scores_grouped(k) && p.qterms != 1) return name + " needs bf16 q and k";
  if ((k == CudaScoring::wgmma_exact || k == CudaScoring::wgmma_approximate) && p.dpad != 128)
    return name + " needs head_dim 113 to 128 (padded to 128; here " + std::to_string(p.d) + ")";
  // The grouped kernels keep ~8 KB of static shared memory (row and group tables) besides.
  const size_t smem = scores_smem_bytes(probe) + (scores_grouped(k) ? 8192 : 0);
  if (smem > smem_optin)
    return name + " needs " + std::to_string(smem) + " bytes of shared memory per CTA at head_dim " +
           std::to_string(p.d) + ", the device allows " + std::to_string(smem_optin);
  return "";
}

int scores_blocks_per_cta(const ScoreParams& p) {
  const int rows = p.kernel == CudaScoring::mma_grouped ? kGroupedRows : kWgRows;
  return rows / (p.heads_per_cta * p.spb);
}

cudaError_t launch_scores(const ScoreParams& p, int64_t total_qblocks, cudaStream_t stream) {
  if (total_qblocks == 0) return cudaSuccess;
  if (p.kernel == CudaScoring::automatic || (p.kernel == CudaScoring::f32) == p.mma) return cudaErrorInvalidValue;
  const size_t smem = scores_smem_bytes(p);
  const unsigned zc = unsigned((p.group + p.heads_per_cta - 1) / p.heads_per_cta);
  if (p.grouped != scores_grouped(p.kernel) ||
      p.approximate != (p.kernel == CudaScoring::wgmma_approximate))
    return cudaErrorInvalidValue;
  if (p.grouped) {
    if (p.group_ctas == nullptr || p.num_group_ctas <= 0) return cudaErrorInvalidValue;
    const dim3 grid(unsigned(p.num_group_ctas), unsigned(p.heads_kv), zc);
    return p.kernel == CudaScoring::mma_grouped ? launch_scores_grouped(p, grid, smem, stream)
                                                : launch_scores_wgmma(p, grid, smem, stream);
  }
  return launch_scores_generic(p, dim3(unsigned(total_qblocks), unsigned(p.heads_kv), zc), smem, stream);
}

}  // namespace ariadne::cuda
