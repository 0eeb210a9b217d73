// The fast CPU backend's own properties, beyond the case table (tests/cpu/test_cases.cpp, which
// checks every output against the reference on every kernel table): bit-identical results for any
// thread count, on both the call-wide and the stream path, and the checks of its settings.
#include <cstring>
#include <vector>

#include "attention/backends.hpp"
#include "attention/cpu/attention_kernels.hpp"
#include "cases.hpp"

namespace ariadne {
namespace {

using namespace testing;

// Runs pc on the CPU backend with 1, 2 and 3 threads; every output of every run must be equal.
void expect_thread_independent(const PreparedCase& pc) {
  SCOPED_TRACE(pc.name);
  const int saved = cpu_threads();
  std::vector<CaseOutputs> runs;
  for (int t : {1, 2, 3}) {
    set_cpu_threads(t);
    runs.push_back(poisoned_outputs(pc));
    attention(host_params(pc, runs.back()), Backend::cpu);
  }
  set_cpu_threads(saved);
  for (size_t r = 1; r < runs.size(); ++r)
    for (auto m : {&CaseOutputs::out, &CaseOutputs::lse, &CaseOutputs::entropy, &CaseOutputs::distance,
                   &CaseOutputs::received}) {
      const Buffer& a = runs[0].*m;
      const Buffer& b = runs[r].*m;
      if (a.data() == nullptr) continue;
      ASSERT_EQ(0, std::memcmp(a.data(), b.data(), size_t(a.numel()) * dtype_size(a.dtype()))) << "run " << r << " differs";
    }
}

// Items are independent and nothing accumulates across threads (no float atomics).
TEST(AttentionCpu, DeterministicAcrossThreadCounts) {
  AttnCase c;
  c.tokens_q = {300, 77};
  c.heads_q = 4;
  c.heads_kv = 2;
  c.pattern = "window:40,40+blocks:0.7@64";
  c.sink_mode = SinkMode::denominator;
  c.sink = 1.f;
  c.dtype = DType::f32;
  c.diagnostics = true;
  expect_thread_independent(prepare(c));
  // Without received attention a narrow pattern takes the stream path: items of 16 query tiles.
  AttnCase w;
  w.tokens_q = {1500, 300};
  w.heads_q = 4;
  w.heads_kv = 2;
  w.dim = 80;
  w.pattern = "window:64,64";
  w.dtype = DType::bf16;
  w.f32_out = true;
  expect_thread_independent(prepare(w));
}

TEST(AttentionCpu, ThreadAndKernelSettingsRejectBadValues) {
  EXPECT_THROW(set_cpu_threads(0), Error);
  EXPECT_THROW(cpu::force_tile_kernels("sse9"), Error);
  EXPECT_GE(cpu_threads(), 1);
  EXPECT_TRUE(cpu::tile_kernels_available("generic"));
}

// force_tile_kernels("") returns to the table the process was configured with (ARIADNE_CPU_ISA's,
// read once, else the best), so a test that forces a table does not lift the user's cap.
TEST(AttentionCpu, ForcedKernelsReturnToTheConfiguredTable) {
  const cpu::TileKernels* configured = &cpu::active_tile_kernels();
  cpu::force_tile_kernels("generic");
  EXPECT_STREQ(cpu::active_tile_kernels().name, cpu::tile_kernels_generic()->name);
  cpu::force_tile_kernels("");
  EXPECT_EQ(&cpu::active_tile_kernels(), configured);
}

}  // namespace
}  // namespace ariadne
