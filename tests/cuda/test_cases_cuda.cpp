// The case table (tests/cases.hpp) on the CUDA backend: the same cases, inputs and checks as the
// CPU suite (tests/cpu/test_cases.cpp). Inputs, pattern arrays, the token order, the coordinates
// and the NaN-poisoned outputs are copied to the device, attention runs there, and the outputs come
// back for the runner's checks; every case runs twice and the two runs must be bit-identical (a
// race would show there). Inputs are drawn per process (ARIADNE_TEST_SEED pins them; every failure
// prints the input seed). Cases the backend declines (f32 inputs, head dims without a kernel, ...)
// are skipped with its reason.
#include "cases.hpp"

#include <string>

#include "ariadne/device.hpp"
#include "cuda/cuda_common.hpp"

namespace ariadne {
namespace {

using namespace testing;

DeviceBuffer upload_output(const Buffer& host, TensorView* view) {
  if (host.data() == nullptr) return {};
  DeviceBuffer d = DeviceBuffer::from_host(host);  // carries the poison
  *view = d.view();
  return d;
}

// `kernel`: the route, automatic (the library's choice) or a family forced through the plan's
// overrides; a family that cannot take the case declines it (the case is then skipped for it).
bool run_cuda_on(const PreparedCase& pc, CaseOutputs& o, std::string* why, CudaKernel kernel) {
  cuda_testing::DeviceCase d = cuda_testing::upload(pc.in);
  DeviceBuffer out = upload_output(o.out, &d.p.out);
  DeviceBuffer lse = upload_output(o.lse, &d.p.lse);
  DeviceBuffer ent = upload_output(o.entropy, &d.p.entropy);
  DeviceBuffer dist = upload_output(o.distance, &d.p.distance);
  DeviceBuffer recv = upload_output(o.received, &d.p.received);
  DeviceBuffer cq = upload_output(pc.coords_q, &d.p.coords_q);
  DeviceBuffer ck = upload_output(pc.coords_k, &d.p.coords_k);
  DeviceBuffer order;
  if (!pc.order.empty()) {
    order = DeviceBuffer::from_ints(pc.order);
    d.p.order = static_cast<const int32_t*>(order.data());
  }
  // Asked with the outputs in place: the route may depend on them.
  if (!backend_supports(Backend::cuda, d.p, why)) return false;
  AttentionOptions opts;
  opts.backend = Backend::cuda;
  opts.overrides.cuda_kernel = kernel;
  AttentionPlan plan;
  try {
    plan = plan_attention(d.p, opts);
  } catch (const Error& e) {
    if (kernel == CudaKernel::automatic) throw;
    *why = e.what();
    return false;
  }
  run(plan, d.p);
  cuda_synchronize();
  o.out = out.to_host();
  if (o.lse.data() != nullptr) o.lse = lse.to_host();
  if (o.entropy.data() != nullptr) o.entropy = ent.to_host();
  if (o.distance.data() != nullptr) o.distance = dist.to_host();
  if (o.received.data() != nullptr) o.received = recv.to_host();
  return true;
}

bool run_cuda(const PreparedCase& pc, CaseOutputs& o, std::string* why) {
  return run_cuda_on(pc, o, why, CudaKernel::automatic);
}
bool run_cuda_tile(const PreparedCase& pc, CaseOutputs& o, std::string* why) {
  return run_cuda_on(pc, o, why, CudaKernel::tile);
}

class CudaCases : public ::testing::TestWithParam<AttnCase> {};

// Each case on the library's route, then on the mma.sync tile kernel forced through the plan's
// overrides (the kernel that serves every pattern the Hopper kernels do not, kept correct on the
// cases those kernels take by default), against one reference: the reference is the CPU-bound part
// of the suite, so it is computed once for both routes.
TEST_P(CudaCases, MatchesReference) {
  const PreparedCase pc = prepare(GetParam(), cuda_testing::base_seed());
  std::string why;
  {
    SCOPED_TRACE("route: automatic");
    CaseBackend b;
    b.name = "cuda";
    b.run = run_cuda;
    b.repeat = true;
    if (!run_case(pc, b, &why)) GTEST_SKIP() << why;
  }
  SCOPED_TRACE("route: tile kernel");
  CaseBackend tile;
  tile.name = "cuda-tile";
  tile.run = run_cuda_tile;
  tile.repeat = true;
  std::string why_tile;
  if (!run_case(pc, tile, &why_tile)) RecordProperty("tile_kernel_declined", why_tile);
}

INSTANTIATE_TEST_SUITE_P(Table, CudaCases, ::testing::ValuesIn(cases()), test_name);

}  // namespace
}  // namespace ariadne
