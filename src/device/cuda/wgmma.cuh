// Internal: wrappers over the sm_90a warpgroup instructions (wgmma.mma_async, its fences, mbarrier,
// setmaxnreg) used by the wgmma attention kernel. Each wgmma shape is one asm statement whose operand
// list names every accumulator register (N/2 floats per thread for m64nNk16), written out once per N
// for both 16-bit element types.
#pragma once

#include <cstdint>

#include "device/cuda/mma.cuh"

namespace ariadne::cuda::wg {

// Shared-memory matrix descriptor, no swizzle ("interleave"): 8x8 core matrices of 128 contiguous
// bytes; lbo = byte step between core matrices along K, sbo = along M/N (PTX ISA, matrix
// descriptor; the same meaning for K-major and MN-major operands in this mode).
__device__ __forceinline__ uint64_t desc(uint32_t smem_byte_addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((smem_byte_addr & 0x3FFFF) >> 4) | (uint64_t(lbo >> 4) << 16) | (uint64_t(sbo >> 4) << 32);
}
// The same with a swizzled layout of span W bytes (32, 64 or 128; the descriptor's bits 62-63:
// 1 = 128B, 2 = 64B, 3 = 32B). Rows of W bytes whose 16-byte chunks are XOR-permuted by the row's
// position in an 8-row atom, the pattern the TMA unit writes for CU_TENSOR_MAP_SWIZZLE_<W>B. For a
// K-major operand sbo is the 8-row step and lbo is unused (the k-step lies inside one row); for an
// MN-major one lbo is the step between W-byte atoms along M/N and sbo the 8-row step along K. The
// atom must start on a 1024-byte boundary (base offset 0); start addresses may move by k · 32 bytes
// inside a row, since the swizzle reads only the address bits above the row.
template <int W>
__device__ __forceinline__ uint64_t desc_swizzled(uint32_t smem_byte_addr, uint32_t lbo, uint32_t sbo) {
  static_assert(W == 32 || W == 64 || W == 128, "swizzle span");
  constexpr uint64_t mode = W == 128 ? 1 : W == 64 ? 2 : 3;
  return desc(smem_byte_addr, lbo, sbo) | (mode << 62);
}

// A swizzled descriptor in two words, for operands walked by k-steps: the low word holds the start
// address (bits 0-13: address >> 4) and lbo, the high word sbo and the mode. Moving the start by a
// byte offset adds offset >> 4 to the low word alone (shared-memory addresses are below 2^18, so the
// address field never carries into lbo), so a kernel builds the words once per buffer and each
// wgmma's descriptor costs one add, where desc_swizzled per k-step masks, shifts and ORs again.
struct DescWords {
  uint32_t lo, hi;
};
template <int W>
__device__ __forceinline__ DescWords desc_words(uint32_t smem_byte_addr, uint32_t lbo, uint32_t sbo) {
  const uint64_t d = desc_swizzled<W>(smem_byte_addr, lbo, sbo);
  return {uint32_t(d), uint32_t(d >> 32)};
}
// The descriptor of the operand byte_off bytes (a multiple of 16) past d's start.
__device__ __forceinline__ uint64_t desc_at(DescWords d, uint32_t byte_off) {
  return (uint64_t(d.hi) << 32) | uint64_t(d.lo + (byte_off >> 4));
}

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accumulator reads/writes across an in-flight wgmma.
template <int N>
__device__ __forceinline__ void pin(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// Orders generic-proxy shared-memory writes (cp.async) the thread has observed before its later
// async-proxy reads (wgmma operands).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// ---- mbarrier (CTA scope) ----
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Arrives once this thread's earlier cp.async copies have landed (the count was set for it).
__device__ __forceinline__ void mbar_arrive_cp_async(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// Arrives and raises the phase's expected transaction bytes (the TMA copies that complete on it).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// TMA: copies the box of `map` at element coordinates (c0, c1, c2) into shared memory at dst,
// completing `bytes` of transactions on mbarrier bar. `map` is the address of a __grid_constant__
// kernel parameter (a CUtensorMap) in the generic space.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void* map, int c0, int c1, int c2, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::
          "r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
// TMA store: the box of `map` at (c0, c1, c2) from shared memory at src (the map's layout and
// swizzle), in the current bulk group; rows past the tensor's end are clipped.
__device__ __forceinline__ void tma_store_3d(const void* map, uint32_t src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(c2), "r"(src)
               : "memory");
}
// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) from global memory into shared
// memory at dst with the bulk copy engine (no tensor map), completing the bytes on mbarrier bar.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Adds `bytes` (a multiple of 16; both addresses 16-byte aligned) of f32 from shared memory into
// global memory element by element, the additions done at the memory as atomics are, in this
// thread's bulk group (bulk_commit, then bulk_wait_read_all or bulk_wait_all).
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
               "r"(bytes)
               : "memory");
}
// Waits until the committed bulk operations are complete, their writes included.
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
// Waits until the committed bulk stores have read their shared memory (not for their writes).
__device__ __forceinline__ void bulk_wait_read_all() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
// The same with a 5-D tensor map (the wgmma band kernel's block_col tiles: head dim, head, row of
// a merge unit, unit column, unit row).
__device__ __forceinline__ void tma_load_5d(uint32_t dst, const void* map, int c0, int c1, int c2, int c3, int c4,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5, %6}], "
      "[%7];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// Named barriers (ids 1..15; 0 is __syncthreads'): sync waits until `count` threads arrived
// (itself included), arrive counts this thread's warp without waiting.
__device__ __forceinline__ void named_bar_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

template <int R>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
}
template <int R>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
}

// m64nNk16, f32 accumulators. ss: A and B from shared memory, both K-major (S = Q·Kᵀ).
// ss_mn: A and B from shared memory, both MN-major (the backward's dQ = dS·K: dSᵀ stored keys x
// queries, K stored keys x head dim). rs: A from registers (the mma.sync m16n8k16 A fragment per
// warp), B from shared memory MN-major (transposed: V stored keys x head dim, head dim contiguous).
// scale_d = 0 overwrites d.
template <class E, int N>
struct Mma;

// Each shape is written once below and stamped out for both element types; only the PTX type
// name differs. The asm templates number the N/2 accumulators %0.. first, then the inputs, so the
// operand numbers after the accumulators are spelled per shape.
#define ARIADNE_WG_R0 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
#define ARIADNE_WG_R16 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define ARIADNE_WG_R32 ",%32, %33, %34, %35, %36, %37, %38, %39"
#define ARIADNE_WG_R40 ", %40, %41, %42, %43, %44, %45, %46, %47," ARIADNE_WG_R48
#define ARIADNE_WG_R48 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define ARIADNE_WG_REGS8 "{%0, %1, %2, %3, %4, %5, %6, %7}"
#define ARIADNE_WG_REGS32 "{" ARIADNE_WG_R0 ARIADNE_WG_R16 "}"
#define ARIADNE_WG_REGS40 "{" ARIADNE_WG_R0 ARIADNE_WG_R16 ARIADNE_WG_R32 "}"
#define ARIADNE_WG_REGS64 "{" ARIADNE_WG_R0 ARIADNE_WG_R16 ARIADNE_WG_R32 ARIADNE_WG_R40 "}"
// The matching read-write operands d[i], eight at a time.
#define ARIADNE_WG_D8(i)                                                                                              \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]),                                                         \
      "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define ARIADNE_WG_D32 ARIADNE_WG_D8(0), ARIADNE_WG_D8(8), ARIADNE_WG_D8(16), ARIADNE_WG_D8(24)
#define ARIADNE_WG_D40 ARIADNE_WG_D32, ARIADNE_WG_D8(32)
#define ARIADNE_WG_D64 ARIADNE_WG_D40, ARIADNE_WG_D8(40), ARIADNE_WG_D8(48), ARIADNE_WG_D8(56)

// ss member of Mma<E, N> for PTX type T: AB names the descriptor operands, SCALE the scale_d one.
#define ARIADNE_WG_SS(T, N, REGS, AB, SCALE, DOPS)                                                                    \
  static __device__ __forceinline__ void ss(float (&d)[N / 2], uint64_t a, uint64_t b, int scale_d) {                 \
    asm volatile(                                                                                                     \
        "{\n.reg .pred p;\nsetp.ne.b32 p, " SCALE ", 0;\n"                                                            \
        "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." T "." T " " REGS ", " AB ", p, 1, 1, 0, 0;\n}\n"            \
        : DOPS                                                                                                        \
        : "l"(a), "l"(b), "r"(scale_d));                                                                              \
  }
// ss_mn member: the same with both transpose bits set.
#define ARIADNE_WG_SS_MN(T, N, REGS, AB, SCALE, DOPS)                                                                 \
  static __device__ __forceinline__ void ss_mn(float (&d)[N / 2], uint64_t a, uint64_t b, int scale_d) {              \
    asm volatile(                                                                                                     \
        "{\n.reg .pred p;\nsetp.ne.b32 p, " SCALE ", 0;\n"                                                            \
        "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." T "." T " " REGS ", " AB ", p, 1, 1, 1, 1;\n}\n"            \
        : DOPS                                                                                                        \
        : "l"(a), "l"(b), "r"(scale_d));                                                                              \
  }
// rs member: AB names the four A-fragment registers and the B descriptor, SCALE the constant 1.
#define ARIADNE_WG_RS(T, N, REGS, AB, SCALE, DOPS)                                                                    \
  static __device__ __forceinline__ void rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b) {                  \
    asm volatile(                                                                                                     \
        "{\n.reg .pred p;\nsetp.ne.b32 p, " SCALE ", 0;\n"                                                            \
        "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." T "." T " " REGS ", " AB ", p, 1, 1, 1;\n}\n"               \
        : DOPS                                                                                                        \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));                                                \
  }
// Every shape the kernels use, for element type E (PTX name T).
#define ARIADNE_WG_MMA_SHAPES(E, T)                                                                                   \
  template <>                                                                                                         \
  struct Mma<E, 16> {                                                                                                 \
    ARIADNE_WG_RS(T, 16, ARIADNE_WG_REGS8, "{%8, %9, %10, %11}, %12", "%13", ARIADNE_WG_D8(0))                        \
  };                                                                                                                  \
  template <>                                                                                                         \
  struct Mma<E, 64> {                                                                                                 \
    ARIADNE_WG_SS(T, 64, ARIADNE_WG_REGS32, "%32, %33", "%34", ARIADNE_WG_D32)                                        \
    ARIADNE_WG_SS_MN(T, 64, ARIADNE_WG_REGS32, "%32, %33", "%34", ARIADNE_WG_D32)                                     \
    ARIADNE_WG_RS(T, 64, ARIADNE_WG_REGS32, "{%32, %33, %34, %35}, %36", "%37", ARIADNE_WG_D32)                       \
  };                                                                                                                  \
  template <>                                                                                                         \
  struct Mma<E, 80> {                                                                                                 \
    ARIADNE_WG_SS(T, 80, ARIADNE_WG_REGS40, "%40, %41", "%42", ARIADNE_WG_D40)                                        \
    ARIADNE_WG_SS_MN(T, 80, ARIADNE_WG_REGS40, "%40, %41", "%42", ARIADNE_WG_D40)                                     \
    ARIADNE_WG_RS(T, 80, ARIADNE_WG_REGS40, "{%40, %41, %42, %43}, %44", "%45", ARIADNE_WG_D40)                       \
  };                                                                                                                  \
  template <>                                                                                                         \
  struct Mma<E, 128> {                                                                                                \
    ARIADNE_WG_SS(T, 128, ARIADNE_WG_REGS64, "%64, %65", "%66", ARIADNE_WG_D64)                                       \
    ARIADNE_WG_SS_MN(T, 128, ARIADNE_WG_REGS64, "%64, %65", "%66", ARIADNE_WG_D64)                                    \
    ARIADNE_WG_RS(T, 128, ARIADNE_WG_REGS64, "{%64, %65, %66, %67}, %68", "%69", ARIADNE_WG_D64)                      \
  };

ARIADNE_WG_MMA_SHAPES(Bf16, "bf16")
ARIADNE_WG_MMA_SHAPES(F16, "f16")

#undef ARIADNE_WG_MMA_SHAPES
#undef ARIADNE_WG_RS
#undef ARIADNE_WG_SS
#undef ARIADNE_WG_SS_MN
#undef ARIADNE_WG_D64
#undef ARIADNE_WG_D40
#undef ARIADNE_WG_D32
#undef ARIADNE_WG_D8
#undef ARIADNE_WG_REGS64
#undef ARIADNE_WG_REGS40
#undef ARIADNE_WG_REGS32
#undef ARIADNE_WG_REGS8
#undef ARIADNE_WG_R48
#undef ARIADNE_WG_R40
#undef ARIADNE_WG_R32
#undef ARIADNE_WG_R16
#undef ARIADNE_WG_R0

// m64n32k16 with A from registers (the mma.sync m16n8k16 A fragment per warp) and B from shared
// memory K-major (not transposed: the RR scoring's K̄ tile, key strides x head dim, head dim
// contiguous); d += A·B (the accumulators are read: zero them for a fresh product).
__device__ __forceinline__ void mma_m64n32k16_rs_kmajor(float (&d)[16], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "{%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

}  // namespace ariadne::cuda::wg
