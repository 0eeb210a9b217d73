// The CPU suites' kernel-table switch: the tables a suite runs each case on, and a scope that
// forces one of them (tests/cpu/test_cases.cpp, tests/cpu/test_backward_cases.cpp).
#pragma once

#include <cstdint>
#include <cstdlib>

#include <gtest/gtest.h>

#include "ariadne/attention.hpp"
#include "attention/cpu/attention_kernels.hpp"

namespace ariadne::testing {

// "avx512", "avx512bf16" and "amx" run only where the CPU has them (CI's machines vary).
inline const char* const kIsas[] = {"generic", "avx2", "avx512", "avx512bf16", "amx"};

// ARIADNE_TEST_SEED draws other inputs for every case (0 or unset: the table's own seeds).
inline uint64_t salt() {
  static const uint64_t s = [] {
    const char* v = std::getenv("ARIADNE_TEST_SEED");
    return v ? uint64_t(std::strtoull(v, nullptr, 10)) : uint64_t(0);
  }();
  return s;
}

// Forces a kernel table for one scope, then returns to the configured one (which throws when
// ARIADNE_CPU_ISA names a table this CPU cannot run: a failure of the test, not a terminate).
struct ForceIsa {
  explicit ForceIsa(const char* isa) { cpu::force_tile_kernels(isa); }
  ~ForceIsa() {
    try {
      cpu::force_tile_kernels("");
    } catch (const Error& e) {
      ADD_FAILURE() << e.what();
    }
  }
  ForceIsa(const ForceIsa&) = delete;
  ForceIsa& operator=(const ForceIsa&) = delete;
};

}  // namespace ariadne::testing
