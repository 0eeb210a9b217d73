// The case table (tests/cases.hpp) on the CPU backend, once per kernel table this CPU can run
// (generic, AVX2, AVX-512 with bf16 dot products). On top of the runner's checks: a case with
// diagnostics runs again without received attention, which sends narrow patterns down the stream
// path (K and V packed per work item into a ring instead of once per call); the arithmetic is the
// same, so out, LSE, entropy and distance must be bit-identical to the first run.
#include "cases.hpp"

#include <cstring>
#include <string>

#include "cpu/force_isa.hpp"

namespace ariadne {
namespace {

using namespace testing;

CaseBackend cpu_backend(const char* isa, bool without_received = false) {
  CaseBackend b;
  b.name = std::string("cpu/") + isa;
  b.fp32_diagnostics = true;
  b.run = [isa, without_received](const PreparedCase& pc, CaseOutputs& o, std::string* why) {
    AttentionParams p = host_params(pc, o);
    if (without_received) p.received = TensorView{};
    if (!backend_supports(Backend::cpu, p, why)) return false;
    const ForceIsa force(isa);
    attention(p, Backend::cpu);
    return true;
  };
  return b;
}

class CpuCases : public ::testing::TestWithParam<AttnCase> {};

TEST_P(CpuCases, MatchesReference) {
  const PreparedCase pc = prepare(GetParam(), salt());
  for (const char* isa : kIsas) {
    if (!cpu::tile_kernels_available(isa)) continue;
    std::string why;
    CaseOutputs got;
    if (!run_case(pc, cpu_backend(isa), &why, &got)) GTEST_SKIP() << why;
    if (!pc.c.diagnostics) continue;
    SCOPED_TRACE(pc.name + " on cpu/" + isa + " without received attention");
    CaseOutputs plain = poisoned_outputs(pc);
    ASSERT_TRUE(cpu_backend(isa, /*without_received=*/true).run(pc, plain, &why)) << why;
    for (auto m : {&CaseOutputs::out, &CaseOutputs::lse, &CaseOutputs::entropy, &CaseOutputs::distance}) {
      const Buffer& a = got.*m;
      const Buffer& b = plain.*m;
      if (a.data() == nullptr) continue;
      ASSERT_EQ(0, std::memcmp(a.data(), b.data(), size_t(a.numel()) * dtype_size(a.dtype())))
          << (m == &CaseOutputs::out ? "out" : m == &CaseOutputs::lse ? "lse" : "entropy/distance")
          << " differs without received attention";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Table, CpuCases, ::testing::ValuesIn(cases()), test_name);

}  // namespace
}  // namespace ariadne
