// Process-wide settings of the fast CPU backend: the worker count and the ISA table.
//
// Both are user configuration. ARIADNE_THREADS (worker count, 1..4096) and ARIADNE_CPU_ISA
// (generic | avx2 | avx512 | avx512bf16 | amx: the kernel table) are read once, at the first call that needs
// them, and kept for the life of the process; attention calls never read the environment.
// set_cpu_threads and force_tile_kernels change the settings at run time (tests, benchmarks, the
// CLI's --threads). An invalid value throws ariadne::Error naming the variable.
#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>

#include "ariadne/attention.hpp"
#include "attention/cpu/attention_kernels.hpp"

namespace ariadne {

// ---------------------------------------------------------------------------------------------
// Threads
// ---------------------------------------------------------------------------------------------
namespace {

std::atomic<int> g_threads{0};  // 0: not chosen yet

int threads_from_environment() {
  const char* env = std::getenv("ARIADNE_THREADS");
  if (env != nullptr && *env != '\0') {
    char* end = nullptr;
    const long n = std::strtol(env, &end, 10);
    ARIADNE_CHECK(end != env && *end == '\0' && n >= 1 && n <= 4096, "ARIADNE_THREADS: '", env,
                  "' is not a thread count (expected an integer in 1..4096)");
    return int(n);
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw > 0 ? int(hw) : 1;
}

}  // namespace

int cpu_threads() {
  int n = g_threads.load();
  if (n == 0) {
    n = threads_from_environment();
    int expected = 0;  // a concurrent set_cpu_threads wins over the environment
    if (!g_threads.compare_exchange_strong(expected, n)) n = expected;
  }
  return n;
}

void set_cpu_threads(int n) {
  ARIADNE_CHECK(n >= 1, "set_cpu_threads: ", n, " threads requested, expected >= 1");
  g_threads.store(n);
}

// ---------------------------------------------------------------------------------------------
// Instruction-set dispatch
// ---------------------------------------------------------------------------------------------
namespace cpu {
namespace {

std::atomic<const TileKernels*> g_kernels{nullptr};

constexpr const char* kTableNames = "generic, avx2, avx512, avx512bf16, amx";  // table_by_name's

const TileKernels* table_by_name(const std::string& name) {
  if (name == "generic") return tile_kernels_generic();
  if (name == "avx2") return tile_kernels_avx2();
  if (name == "avx512") return tile_kernels_avx512();
  if (name == "avx512bf16") return tile_kernels_avx512bf16();
  if (name == "amx") return tile_kernels_amx();
  return nullptr;
}

// AMX first: its bf16 products beat the AVX-512 ones on every pattern (docs/cpu-backend.md), and its
// fp32 path is the AVX-512 table's. Without AMX, vdpbf16ps only where the core issues it at twice the
// FMA's flop rate: on AMD's cores (Zen 5: bf16 products 1.8x the fp32 ones); Intel's issue it at half
// that rate, so there bf16 inputs run faster on the fp32 products (docs/cpu-backend.md).
const TileKernels* best_table() {
  if (tile_kernels_available("amx")) return tile_kernels_amx();
#if defined(__x86_64__)
  if (tile_kernels_available("avx512bf16") && __builtin_cpu_is("amd")) return tile_kernels_avx512bf16();
#endif
  if (tile_kernels_available("avx512")) return tile_kernels_avx512();
  if (tile_kernels_available("avx2")) return tile_kernels_avx2();
  return tile_kernels_generic();
}

// The table the process starts with: ARIADNE_CPU_ISA's when set, else the best one. Read once.
const TileKernels* configured_table() {
  static const TileKernels* const table = [] {
    const char* env = std::getenv("ARIADNE_CPU_ISA");
    if (env == nullptr || *env == '\0') return best_table();
    ARIADNE_CHECK(table_by_name(env) != nullptr, "ARIADNE_CPU_ISA: '", env, "' is not one of ", kTableNames);
    ARIADNE_CHECK(tile_kernels_available(env), "ARIADNE_CPU_ISA: this CPU cannot run the '", env, "' kernels");
    return table_by_name(env);
  }();
  return table;
}

}  // namespace

bool tile_kernels_available(const char* name) {
  const std::string n = name;
  if (n == "generic") return true;
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (n == "avx2")
    return tile_kernels_avx2() != nullptr && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (n == "avx512")
    return tile_kernels_avx512() != nullptr && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma");
  if (n == "avx512bf16")
    return tile_kernels_avx512bf16() != nullptr && tile_kernels_available("avx512") &&
           __builtin_cpu_supports("avx512bf16");
  if (n == "amx") return tile_kernels_amx() != nullptr && tile_kernels_available("avx512bf16") && amx_usable();
#endif
  return false;
}

void force_tile_kernels(const char* name) {
  const std::string n = name ? name : "";
  if (n.empty()) {
    g_kernels.store(configured_table());
    return;
  }
  ARIADNE_CHECK(table_by_name(n) != nullptr, "cpu kernels: '", n, "' is not one of ", kTableNames);
  ARIADNE_CHECK(tile_kernels_available(n.c_str()), "cpu kernels: this CPU cannot run the '", n, "' kernels");
  g_kernels.store(table_by_name(n));
}

const TileKernels& active_tile_kernels() {
  const TileKernels* k = g_kernels.load();
  if (k == nullptr) {
    k = configured_table();
    const TileKernels* expected = nullptr;  // a concurrent force_tile_kernels wins
    if (!g_kernels.compare_exchange_strong(expected, k)) k = expected;
  }
  return *k;
}

}  // namespace cpu
}  // namespace ariadne
