// The CUDA backend's API behaviour outside the case table. Every comparison with the reference
// (patterns × head dims × dtypes × lengths, sinks, packed batches, chunked prefill, strided views,
// f32 outputs, long rows, fused token orders, diagnostics) is a row of the case table
// (tests/cases.hpp), run on the device by tests/cuda/test_cases_cuda.cpp.
#include <string>

#include <gtest/gtest.h>

#include "ariadne/attention.hpp"
#include "ariadne/device.hpp"
#include "common.hpp"
#include "cuda/cuda_common.hpp"

namespace ariadne {
namespace {

using testing::Case;
using namespace cuda_testing;

TEST(CudaAttention, RejectsWhatItCannotRun) {
  Case c = make_case("reject", {64}, 64, DType::bf16, Pattern::full(), 4, 4);
  c.token_pad = 4;  // rows no longer start on 16-byte boundaries
  const testing::Inputs in = testing::make_inputs(c);
  DeviceCase d = upload(in);
  DeviceBuffer out(DType::bf16, {in.total_q, c.heads_q, c.dim});
  d.p.out = out.view();
  EXPECT_THROW(attention(d.p, Backend::cuda), Error);
  std::string why;
  EXPECT_FALSE(backend_supports(Backend::cuda, d.p, &why));
  EXPECT_NE(why.find("16-byte"), std::string::npos) << why;
}

}  // namespace
}  // namespace ariadne
