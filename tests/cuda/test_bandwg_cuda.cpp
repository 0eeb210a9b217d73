// The wgmma band kernel (src/attention/cuda/attention_bandwg.cuh) against the CPU reference, on the edges
// that are its own: lengths that are not multiples of the 64-row tiles or 64-key ring chunks (1,
// 63, 65, 77, 300, 1500 + 70 keys), key hulls of 1 to 4 chunks (aligned ±64 sees 3, unaligned
// windows and key offsets lk - lq that are not multiples of 64 see 4), runs of query tiles that
// start, end or restart the ring inside a varlen batch, both sinks, GQA and f32 out. Token orders
// are routed here by default (the producer gathers rows with cp.async; FusedTokenOrder, and
// Routing checks that forcing the band kernel keeps them there).
// Each case first checks that the plan routes the call to this kernel by default (no override but
// the one named), so a change of eligibility cannot turn these tests into tests of another kernel.
// Run lengths are forced through AttentionOverrides::band_run. Case names end in "_v3" (the
// kernel's inputs as before). The checks are the common ones: fresh random inputs, outputs
// poisoned first, the tolerance rule, and a second run that must be bit-identical.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ariadne/attention.hpp"
#include "ariadne/device.hpp"
#include "ariadne/order.hpp"
#include "common.hpp"
#include "cuda/cuda_common.hpp"

namespace ariadne {
namespace {

using testing::Case;
using namespace cuda_testing;

class CudaBandWg : public ::testing::Test {};

Case wg_case(const std::string& name, std::vector<int64_t> seq_q, DType dt, Pattern pat) {
  return make_case(name, std::move(seq_q), 80, dt, pat);  // head dim 80, GQA 4:1
}

// The default route with run length `run` (0: the launcher's choice).
AttentionOptions wg_options(int run = 0) {
  AttentionOptions o;
  o.backend = Backend::cuda;
  o.overrides.band_run = run;
  return o;
}

void expect_bandwg(const AttentionPlan& plan, const std::string& name) {
  ASSERT_EQ(plan.cuda_kernel(), CudaKernel::bandwg) << name << ": not routed to the wgmma band kernel (" << plan.describe()
                                                    << ")";
}

// Runs the case on the default route, asserted to be this kernel first.
void check_wg(const Case& c, bool f32_out = false, int run = 0) {
  Case cv = c;
  cv.name += "_v3";
  check_case(cv, f32_out, wg_options(run), [&](int, const AttentionPlan& plan) { expect_bandwg(plan, cv.name); });
}

std::string wname(const Pattern& p) {
  std::string s = p.chunk > 0 ? "c" : "w";  // appended, not "w" + ...: g++ 12 reports a false -Wrestrict on that form
  s += std::to_string(p.chunk > 0 ? p.chunk : p.window_left);
  if (p.chunk > 0) return s;
  s += '_';
  s += std::to_string(p.window_right);
  return s;
}

TEST_F(CudaBandWg, WindowsAndLengths) {
  // Aligned (3-chunk hulls) and unaligned windows (4-chunk hulls), at the eligibility limit
  // (left + right = 129), one-sided and zero-width, over lengths around the 64-row tile.
  const std::vector<Pattern> windows = {Pattern::window(64, 64), Pattern::window(48, 80), Pattern::window(0, 128),
                                        Pattern::window(128, 0),  Pattern::window(63, 65), Pattern::window(64, 65),
                                        Pattern::window(3, 100),  Pattern::window(0, 0),   Pattern::window(17, 5)};
  int i = 0;
  for (const Pattern& w : windows)
    for (int64_t n : {1, 63, 65, 77, 300}) {
      const DType dt = (i++ % 2) ? DType::f16 : DType::bf16;
      Case c = wg_case("bandwg_" + wname(w) + "_" + dtype_name(dt) + "_n" + std::to_string(n), {n}, dt, w);
      if (n == 77) c.heads_q = c.heads_kv = 3;  // no GQA
      check_wg(c);
    }
}

TEST_F(CudaBandWg, KeyOffsetsAndSinks) {
  // lk != lq (bottom-right aligned): offsets that keep the hull 64-aligned (0, 64, -128) and that
  // do not (5, 16, -32); both sinks, the key-0 bias on key 0's chunk at the first tile.
  const std::vector<Pattern> windows = {Pattern::window(64, 64), Pattern::window(48, 80), Pattern::window(64, 65)};
  for (const Pattern& w : windows)
    for (int64_t shift : {0, 64, -128, 5, 16, -32})
      for (SinkMode mode : {SinkMode::none, SinkMode::denominator, SinkMode::key0_bias}) {
        Case c = wg_case("bandwg_off_" + wname(w) + "_shift" + std::to_string(shift) + "_" + sink_mode_name(mode),
                         {333, 260}, DType::bf16, w);
        c.seq_k = {333 + shift, 260 + shift};
        c.sink_mode = mode;
        c.sink_value = std::numeric_limits<float>::quiet_NaN();  // random per head
        check_wg(c);
      }
}

TEST_F(CudaBandWg, LongSequenceRuns) {
  // 1500 queries over 1570 keys: runs of 1, 3, 40 tiles and the launcher's choice, so the ring
  // wraps many times, runs start mid-sequence and a run holds one tile (each consumer's share
  // differs), in both dtypes, with a denominator sink.
  for (int run : {0, 1, 3, 40}) {
    for (const Pattern& w : {Pattern::window(64, 64), Pattern::window(63, 65)}) {
      Case c = wg_case("bandwg_long_" + wname(w) + "_run" + std::to_string(run), {1500}, run == 3 ? DType::f16 : DType::bf16, w);
      c.seq_k = {1570};
      c.heads_q = 4;
      c.heads_kv = 1;
      c.sink_mode = SinkMode::denominator;
      c.sink_value = std::numeric_limits<float>::quiet_NaN();
      check_wg(c, false, run);
    }
  }
}

TEST_F(CudaBandWg, RunBoundariesInVarlenBatches) {
  // Empty and one-token sequences, key lengths shorter and longer than the query lengths (some
  // tiles see no key at all), runs crossing sequence ends (the ring restarts).
  for (int run : {0, 1, 2, 3, 5}) {
    for (const Pattern& w : {Pattern::window(64, 64), Pattern::window(7, 40)}) {
      Case c = wg_case("bandwg_varlen_" + wname(w) + "_run" + std::to_string(run), {1, 0, 130, 64, 5, 200, 1}, DType::bf16, w);
      c.seq_k = {3, 4, 100, 64, 0, 260, 1};
      check_wg(c, false, run);
      Case same = wg_case("bandwg_varlen_same_" + wname(w) + "_run" + std::to_string(run), {65, 1, 128, 0, 191, 7},
                          DType::f16, w);
      check_wg(same, false, run);
    }
  }
}

TEST_F(CudaBandWg, SinksAndF32Out) {
  for (SinkMode mode : {SinkMode::denominator, SinkMode::key0_bias})
    for (float sink : {10.f, -10.f, std::numeric_limits<float>::quiet_NaN()})
      for (bool f32 : {false, true}) {
        Case c = wg_case(std::string("bandwg_sink_") + sink_mode_name(mode) + "_" + std::to_string(sink) +
                             (f32 ? "_f32out" : ""),
                         {70, 200}, DType::bf16, Pattern::window(64, 64));
        c.seq_k = {90, 150};
        c.sink_mode = mode;
        c.sink_value = sink;
        check_wg(c, f32);
      }
}

TEST_F(CudaBandWg, SmallCasesForSanitizers) {
  // Small enough for compute-sanitizer: a two-sequence batch with lk != lq, run length 1 (the ring
  // restarts on every tile) and the launcher's choice, 3- and 4-chunk hulls and Qwen's
  // 64-token chunks, both sinks.
  for (int run : {0, 1})
    for (const Pattern& w : {Pattern::window(64, 64), Pattern::window(64, 65), Pattern::chunked(64)}) {
      for (SinkMode mode : {SinkMode::none, SinkMode::denominator, SinkMode::key0_bias}) {
        Case c = wg_case("bandwg_small_run" + std::to_string(run) + "_" + wname(w) + "_" + sink_mode_name(mode),
                         {150, 33}, DType::bf16, w);
        c.seq_k = {155, 40};
        c.sink_mode = mode;
        c.sink_value = std::numeric_limits<float>::quiet_NaN();
        check_wg(c, false, run);
      }
    }
}

TEST_F(CudaBandWg, V2StoresStayInsideTheOutputView) {
  // The kernel stores whole tiles with the copy engine, clipped by the output's map at the view's
  // rows and head dim: out is here a view inside a larger buffer (88 columns per head, 70 rows
  // more), whose bytes outside the view must keep their poison. Lengths: whole tiles only (256),
  // a partial last tile clipped at the view's end (300), varlen partial tiles that must fall back
  // to per-thread stores (130 | 70 | 64), with LSE absent (null) this time. (Every output layout
  // the backend accepts, 16-byte aligned rows, can be mapped; strides that cannot are rejected
  // before any kernel, which CudaAttention.RejectsWhatItCannotRun checks.)
  constexpr int64_t kExtraRows = 70, kCols = 88;  // 8 columns of padding per head
  for (int variant : {3})
    for (const std::vector<int64_t>& seqs : {std::vector<int64_t>{256}, {300}, {130, 70, 64}})
      for (DType dt : {DType::bf16, DType::f16}) {
        Case c = wg_case("bandwg_v" + std::to_string(variant) + "_view" + std::to_string(kCols) + "_n" +
                             std::to_string(seqs.size()) + "_" + std::to_string(seqs[0]) + "_" + dtype_name(dt),
                         seqs, dt, Pattern::window(64, 64));
        c.seed = base_seed() ^ std::hash<std::string>{}(c.name);
        SCOPED_TRACE(c.name + " (ARIADNE_TEST_SEED=" + std::to_string(base_seed()) + ")");
        const testing::Inputs in = testing::make_inputs(c);
        const testing::Result ref = testing::run_reference(in);
        DeviceCase d = upload(in);
        const int64_t rows = in.total_q + kExtraRows;
        DeviceBuffer big(dt, {rows, c.heads_q, kCols});
        big.fill_bytes(0xFF);
        TensorView ov = big.view();
        ov.shape = {in.total_q, c.heads_q, c.dim, 0};  // strides stay the buffer's: [kCols·heads, kCols, 1]
        d.p.out = ov;
        const AttentionPlan plan = plan_attention(d.p, wg_options());
        ASSERT_NO_FATAL_FAILURE(expect_bandwg(plan, c.name));
        ariadne::run(plan, d.p);
        cuda_synchronize();
        const Buffer h = big.to_host();
        TensorView hv = h.view();
        hv.shape = ov.shape;
        EXPECT_TRUE(testing::close_enough("out", testing::compare(hv, ref.out.view()),
                                          testing::tolerance(dt, testing::max_abs_logit(in))));
        const std::vector<uint8_t> bytes = bytes_of(h);
        int64_t touched = 0;  // 16-bit elements outside the view that are no longer 0xFFFF
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t hh = 0; hh < c.heads_q; ++hh)
            for (int64_t col = 0; col < kCols; ++col) {
              if (r < in.total_q && col < c.dim) continue;
              const size_t at = size_t(((r * c.heads_q + hh) * kCols + col) * 2);
              if (bytes[at] != 0xFF || bytes[at + 1] != 0xFF) ++touched;
            }
        EXPECT_EQ(touched, 0) << "elements outside the output view were written";
      }
}

// The column-major traversal of a grid of ceil(sqrt(total)) columns stored row-major, its last row
// partial (cells past `total` skipped): Ariadne's column order, for any total.
std::vector<int32_t> column_major(int64_t total) {
  int64_t cols = 1;
  while (cols * cols < total) ++cols;
  const int64_t rows = (total + cols - 1) / cols;
  std::vector<int32_t> order;
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t r = 0; r < rows; ++r)
      if (r * cols + c < total) order.push_back(int32_t(r * cols + c));
  return order;
}

// A case with a fused token order on the wgmma band kernel (its default route): the routing
// asserted, outputs poisoned, the reference run on explicitly gathered inputs and scattered back to
// storage order (out and LSE), and a second run that must be bit-identical.
void check_ordered(const Case& base, const std::vector<int32_t>& order, bool f32_out = false, int run = 0) {
  {
    Case c = base;
    c.name += "_v3";
    c.seed = base_seed() ^ std::hash<std::string>{}(c.name);
    SCOPED_TRACE(c.name + " (ARIADNE_TEST_SEED=" + std::to_string(base_seed()) + ")");
    const testing::Inputs in = testing::make_inputs(c);
    const int64_t total = in.total_q;
    ASSERT_EQ(int64_t(order.size()), total);
    ASSERT_EQ(in.total_k, total);

    const OrderedReference want = ordered_reference(c, in, order);  // gathered, scattered back

    DeviceCase d = upload(in);
    const DeviceBuffer d_order = DeviceBuffer::from_ints(order);
    d.p.order = static_cast<const int32_t*>(d_order.data());  // the public route (AttentionParams::order)
    check_runs(d, f32_out ? DType::f32 : c.dtype, want.out, want.lse, testing::tolerance(c.dtype, testing::max_abs_logit(in)),
               wg_options(run), [&](int, const AttentionPlan& plan) { expect_bandwg(plan, c.name); });
  }
}

TEST_F(CudaBandWg, Chunks) {
  // Chunked patterns (Qwen's 64-token windows) on this kernel: chunks of 1, 17, 48, 64
  // (aligned with the 64-row tiles: one ring chunk a tile, no element mask) and 65 (the limit: 4
  // ring chunks a tile), chunk with a causal window and with a narrow two-sided one, over lengths
  // around the tiles, key offsets lk != lq, a varlen batch with empty and one-token sequences, both
  // sinks, runs of 1 and 3 tiles and the launcher's; then token orders (the gathering producer) over
  // 64- and 48-token chunks.
  struct P {
    const char* name;
    Pattern pattern;
  };
  std::vector<P> patterns = {{"chunk1", Pattern::chunked(1)},   {"chunk17", Pattern::chunked(17)},
                             {"chunk48", Pattern::chunked(48)}, {"chunk64", Pattern::chunked(64)},
                             {"chunk65", Pattern::chunked(65)}};
  Pattern causal_chunk = Pattern::causal();
  causal_chunk.chunk = 48;
  patterns.push_back({"causal_chunk48", causal_chunk});
  Pattern window_chunk = Pattern::window(300, 2);
  window_chunk.chunk = 40;
  patterns.push_back({"window300_2_chunk40", window_chunk});
  int i = 0;
  for (const P& pp : patterns) {
    for (int64_t n : {1, 63, 65, 300, 1500}) {
      const int run = i % 3 == 0 ? 0 : i % 3 == 1 ? 1 : 3;
      Case c = wg_case(std::string("bandwg_") + pp.name + "_n" + std::to_string(n), {n}, i % 2 ? DType::f16 : DType::bf16,
                       pp.pattern);
      c.sink_mode = i % 3 == 0 ? SinkMode::none : i % 3 == 1 ? SinkMode::denominator : SinkMode::key0_bias;
      c.sink_value = std::numeric_limits<float>::quiet_NaN();
      ++i;
      check_wg(c, false, run);
    }
    Case v = wg_case(std::string("bandwg_") + pp.name + "_varlen", {1, 0, 130, 64, 5, 200, 1}, DType::bf16, pp.pattern);
    v.seq_k = {3, 4, 100, 64, 0, 260, 1};
    check_wg(v);
    Case shifted = wg_case(std::string("bandwg_") + pp.name + "_shift", {333, 260}, DType::bf16, pp.pattern);
    shifted.seq_k = {338, 228};
    check_wg(shifted);
  }
  for (int64_t n : {300, 1500})
    for (const Pattern& pat : {Pattern::chunked(64), Pattern::chunked(48)}) {
      std::vector<int32_t> shuffled(size_t(n), 0);
      std::iota(shuffled.begin(), shuffled.end(), 0);
      std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(uint32_t(base_seed()) + uint32_t(n)));
      for (const auto& [oname, order] : {std::pair{"colmajor", column_major(n)}, std::pair{"shuffled", shuffled}}) {
        Case c = wg_case(std::string("bandwg_order_") + oname + "_" + wname(pat) + "_n" + std::to_string(n), {n},
                         n == 300 ? DType::f16 : DType::bf16, pat);
        c.sink_mode = n == 300 ? SinkMode::key0_bias : SinkMode::denominator;
        c.sink_value = std::numeric_limits<float>::quiet_NaN();
        check_ordered(c, order, false, n == 300 ? 3 : 0);
      }
    }
}

TEST_F(CudaBandWg, ChunkPassAgainstTheWindowKernel) {
  // Chunked calls run on the chunk kernel (a one-chunk pass for one-chunk hulls, the two 2-chunk
  // passes otherwise) unless AttentionOverrides::chunk_pass = off keeps the window kernel (the
  // 3-chunk pass, its chunks past the hull masked). Both ways against the reference, and for
  // 64-token chunks aligned with the tiles (every hull one chunk) bit for bit against each other:
  // the masked chunks' pairs are skipped and their P·V adds exact zeros, so the arithmetic is the same.
  int i = 0;
  for (const Pattern& pat : {Pattern::chunked(64), Pattern::chunked(48), Pattern::chunked(65)})
    for (const std::vector<int64_t>& seqs : {std::vector<int64_t>{1500}, std::vector<int64_t>{640, 1, 0, 200, 64}}) {
      const int run = i % 2 ? 3 : 0;
      Case c = wg_case("bandwg_chunkpass_" + wname(pat) + "_n" + std::to_string(seqs.size()), seqs,
                       i % 2 ? DType::f16 : DType::bf16, pat);
      c.sink_mode = i % 3 == 0 ? SinkMode::none : i % 3 == 1 ? SinkMode::denominator : SinkMode::key0_bias;
      c.sink_value = std::numeric_limits<float>::quiet_NaN();
      ++i;
      std::vector<uint8_t> out_bits[2], lse_bits[2];
      for (int pass : {1, 0}) {
        AttentionOptions o = wg_options(run);
        o.overrides.chunk_pass = pass ? Toggle::on : Toggle::off;
        Case cp = c;
        cp.name += pass ? "_chunkkernel" : "_windowkernel";
        check_case(cp, false, o, [&](int, const AttentionPlan& plan) { expect_bandwg(plan, cp.name); });
        Case same = c;  // the same inputs both ways
        same.seed = base_seed() ^ std::hash<std::string>{}(c.name);
        const testing::Inputs in = testing::make_inputs(same);
        DeviceCase d = upload(in);
        DeviceBuffer out(c.dtype, {in.total_q, int64_t(c.heads_q), int64_t(c.dim)});
        DeviceBuffer lse(DType::f32, {int64_t(c.heads_q), in.total_q});
        out.fill_bytes(0xFF);
        lse.fill_bytes(0xFF);
        d.p.out = out.view();
        d.p.lse = lse.view();
        const AttentionPlan plan = plan_attention(d.p, o);
        ASSERT_NO_FATAL_FAILURE(expect_bandwg(plan, c.name));
        ariadne::run(plan, d.p);
        cuda_synchronize();
        out_bits[pass] = bytes_of(out.to_host());
        lse_bits[pass] = bytes_of(lse.to_host());
      }
      if (pat.chunk == 64) {
        EXPECT_TRUE(out_bits[0] == out_bits[1]) << c.name << ": out differs between the chunk and window kernels";
        EXPECT_TRUE(lse_bits[0] == lse_bits[1]) << c.name << ": lse differs between the chunk and window kernels";
      }
    }
}

TEST_F(CudaBandWg, FusedTokenOrder) {
  // The gathering producer: column-major and random orders over the whole packed tensor, on
  // lengths 77 and 300 (3- and 4-chunk hulls), 1500 queries over 1570 keys followed by a
  // 70-query sequence with no key (totals equal, as an order needs), and a varlen batch with empty
  // and one-token sequences and per-sequence key counts that differ from the query counts; runs of
  // 1 and 3 tiles and the launcher's choice; both sinks; both dtypes; f32 out once.
  struct Shape {
    const char* name;
    std::vector<int64_t> seq_q, seq_k;
  };
  const std::vector<Shape> shapes = {{"n77", {77}, {}},
                                     {"n300", {300}, {}},
                                     {"n1500k1570", {1500, 70}, {1570, 0}},
                                     {"varlen", {1, 0, 130, 64, 5, 200, 1}, {3, 4, 100, 64, 0, 226, 4}}};
  int i = 0;
  for (const Shape& sh : shapes) {
    int64_t total = 0;
    for (int64_t n : sh.seq_q) total += n;
    std::vector<int32_t> shuffled(size_t(total), 0);
    std::iota(shuffled.begin(), shuffled.end(), 0);
    std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(uint32_t(base_seed()) + uint32_t(total)));
    for (const auto& [oname, order] : {std::pair{"colmajor", column_major(total)}, std::pair{"shuffled", shuffled}})
      for (const Pattern& w : {Pattern::window(64, 64), Pattern::window(63, 65)})
        for (SinkMode mode : {SinkMode::none, SinkMode::denominator, SinkMode::key0_bias}) {
          const int run = i % 3 == 0 ? 0 : i % 3 == 1 ? 1 : 3;
          const DType dt = (i++ % 2) ? DType::f16 : DType::bf16;
          Case c = wg_case(std::string("bandwg_order_") + sh.name + "_" + oname + "_" + wname(w) + "_" +
                               sink_mode_name(mode) + "_run" + std::to_string(run) + "_" + dtype_name(dt),
                           sh.seq_q, dt, w);
          c.seq_k = sh.seq_k;
          c.sink_mode = mode;
          c.sink_value = std::numeric_limits<float>::quiet_NaN();  // random per head
          check_ordered(c, order, false, run);
        }
  }
  Case f32 = wg_case("bandwg_order_n300_f32out", {300}, DType::bf16, Pattern::window(64, 64));
  f32.sink_mode = SinkMode::denominator;
  f32.sink_value = std::numeric_limits<float>::quiet_NaN();
  check_ordered(f32, column_major(300), true);
}

// One block_col case: against the gathered-and-scattered reference, then bit for bit between the
// copy engine (AttentionOverrides::ordered_tiles on, the default) and the gather (off) on the same call.
void check_block_col(const Grid& grid, const Pattern& w, int run, SinkMode mode, DType dt) {
  const std::vector<int32_t> order =
      order_conversion(make_order(OrderKind::block_row, {grid}), make_order(OrderKind::block_col, {grid}));
  Case c = wg_case("bandwg_blockcol_" + std::to_string(grid.h) + "x" + std::to_string(grid.w) + "_" + wname(w) +
                       "_run" + std::to_string(run) + "_" + sink_mode_name(mode) + "_v3",
                   {int64_t(grid.tokens())}, dt, w);
  c.sink_mode = mode;
  c.sink_value = std::numeric_limits<float>::quiet_NaN();
  c.seed = base_seed() ^ std::hash<std::string>{}(c.name);
  SCOPED_TRACE(c.name + " (ARIADNE_TEST_SEED=" + std::to_string(base_seed()) + ")");
  const testing::Inputs in = testing::make_inputs(c);
  const OrderedReference want = ordered_reference(c, in, order);
  DeviceCase d = upload(in);
  const DeviceBuffer d_order = DeviceBuffer::from_ints(order);
  d.p.order = static_cast<const int32_t*>(d_order.data());
  std::vector<uint8_t> tma_out, tma_lse;
  for (Toggle path : {Toggle::automatic, Toggle::off}) {  // copy engine (the default), then the gather
    DeviceBuffer out(c.dtype, want.out.shape());
    DeviceBuffer lse(DType::f32, want.lse.shape());
    out.fill_bytes(0xFF);  // NaN: an unwritten element fails
    lse.fill_bytes(0xFF);
    d.p.out = out.view();
    d.p.lse = lse.view();
    AttentionOptions o = wg_options(run);
    o.block_col = BlockColGrid{grid.h, grid.w};
    o.overrides.ordered_tiles = path;
    const AttentionPlan plan = plan_attention(d.p, o);
    ASSERT_NO_FATAL_FAILURE(expect_bandwg(plan, c.name));
    ASSERT_EQ(plan.ordered_tiles(), path == Toggle::automatic) << "the hint was not taken as expected";
    ariadne::run(plan, d.p);
    cuda_synchronize();
    const Buffer out_h = out.to_host(), lse_h = lse.to_host();
    if (tma_out.empty()) {
      const double tol = testing::tolerance(c.dtype, testing::max_abs_logit(in));
      EXPECT_TRUE(testing::close_enough("out", testing::compare(out_h.view(), want.out.view()), tol));
      EXPECT_TRUE(testing::lse_close(lse_h.view(), want.lse.view(), tol));
      tma_out = bytes_of(out_h);
      tma_lse = bytes_of(lse_h);
    } else {
      EXPECT_TRUE(tma_out == bytes_of(out_h)) << "copy engine and gather differ (out)";
      EXPECT_TRUE(tma_lse == bytes_of(lse_h)) << "copy engine and gather differ (lse)";
    }
  }
}

// Whether a plan with this block_col hint copies ordered tiles; forcing it must then throw.
bool takes_hint(const AttentionParams& p, BlockColGrid grid) {
  AttentionOptions o = wg_options();
  o.block_col = grid;
  const bool taken = plan_attention(p, o).ordered_tiles();
  o.overrides.ordered_tiles = Toggle::on;
  if (!taken) {
    EXPECT_THROW(plan_attention(p, o), Error) << "ordered_tiles = on where the hint cannot apply";
  }
  return taken;
}

// A block_col order with its hint (BlockColGrid): the producer copies the ordered tiles with 5-D
// tensor maps instead of gathering rows. Grids 32 x 34 (one 16-unit tile per unit column: 1088
// tokens) and 64 x 32 (two per column: 2048) in Qwen's block_row storage, windows with 3- and
// 4-chunk hulls, both sinks, GQA 8 over 2, bf16 and f16, run lengths 1 and the launcher's choice:
// against the gathered-and-scattered reference, and bit for bit against the gather path
// (AttentionOverrides::ordered_tiles = off) of the same call (both fill the same tiles). The hint
// is ignored, and rows gathered, where the shape does not allow it: varlen packs, an odd unit-grid
// height.
TEST_F(CudaBandWg, BlockColOrderOnTheCopyEngine) {
  struct Shape {
    int h, w;
  };
  int i = 0;
  for (const Shape sh : {Shape{32, 34}, Shape{64, 32}})
    for (const Pattern& w : {Pattern::window(64, 64), Pattern::window(64, 65)})
      for (int run : {0, 1}) {
        const Grid grid{sh.h, sh.w};
        const SinkMode mode = i % 3 == 0 ? SinkMode::none : i % 3 == 1 ? SinkMode::denominator : SinkMode::key0_bias;
        const DType dt = i % 2 == 0 ? DType::bf16 : DType::f16;
        ++i;
        check_block_col(grid, w, run, mode, dt);
      }
  // Ignored hints: a two-image pack, a unit-grid height of 17, a grid that does not match the length.
  Case pack = wg_case("bandwg_blockcol_pack", {1024, 1024}, DType::bf16, Pattern::window(64, 64));
  const testing::Inputs in = testing::make_inputs(pack);
  DeviceCase d = upload(in);
  DeviceBuffer out(DType::bf16, {in.total_q, pack.heads_q, pack.dim});
  d.p.out = out.view();
  const DeviceBuffer d_order = DeviceBuffer::from_ints(column_major(2048));
  const auto* ord = static_cast<const int32_t*>(d_order.data());
  d.p.order = ord;
  EXPECT_FALSE(takes_hint(d.p, BlockColGrid{32, 64}));
  Case odd = wg_case("bandwg_blockcol_odd", {34 * 32}, DType::bf16, Pattern::window(64, 64));
  DeviceCase dodd = upload(testing::make_inputs(odd));
  DeviceBuffer out_odd(DType::bf16, {34 * 32, odd.heads_q, odd.dim});
  dodd.p.out = out_odd.view();
  dodd.p.order = ord;
  EXPECT_FALSE(takes_hint(dodd.p, BlockColGrid{34, 32}));
  EXPECT_FALSE(takes_hint(dodd.p, BlockColGrid{32, 32}));
  dodd.p.order = nullptr;
  EXPECT_FALSE(takes_hint(dodd.p, BlockColGrid{32, 34}));
}

// Small enough for compute-sanitizer: a 32 x 6 grid (192 tokens, three unit columns), both hulls,
// run lengths 1 and the launcher's choice.
TEST_F(CudaBandWg, BlockColSmallForSanitizers) {
  for (const Pattern& w : {Pattern::window(64, 64), Pattern::window(64, 65)})
    for (int run : {0, 1}) check_block_col(Grid{32, 6}, w, run, SinkMode::key0_bias, DType::bf16);
}

TEST_F(CudaBandWg, OrderedSmallCasesForSanitizers) {
  // Small enough for compute-sanitizer: the gathering producer with run length 1 and the
  // launcher's choice, a 3- and a 4-chunk hull, a two-sequence batch.
  for (int run : {0, 1})
    for (const Pattern& w : {Pattern::window(64, 64), Pattern::window(64, 65)}) {
      Case c = wg_case("bandwg_order_small_run" + std::to_string(run) + "_" + wname(w), {150, 33}, DType::bf16, w);
      c.seq_k = {143, 40};
      c.sink_mode = SinkMode::key0_bias;
      c.sink_value = std::numeric_limits<float>::quiet_NaN();
      check_ordered(c, column_major(183), false, run);
    }
}

// Device params of a case (inputs uploaded, out allocated), for routing questions.
struct RouteCase {
  DeviceCase d;
  DeviceBuffer out;
  explicit RouteCase(const Case& c)
      : d(upload(testing::make_inputs(c))), out(c.dtype, {d.p.q.shape[0], int64_t(c.heads_q), int64_t(c.dim)}) {
    d.p.out = out.view();
  }
};

CudaKernel routed(const AttentionParams& p, CudaKernel forced = CudaKernel::automatic) {
  return plan_attention(p, on_kernel(forced)).cuda_kernel();
}

TEST_F(CudaBandWg, Routing) {
  // Head dim 80 sliding windows up to left + right = 129 take it by default; other head dims,
  // wider windows, wider chunks, one-sided unbounded windows do not (and cannot be forced there);
  // forcing the band kernel hands the call to the per-warp band kernel, forcing the tile kernel to that.
  Case narrow = wg_case("bandwg_route_w64", {300}, DType::bf16, Pattern::window(64, 64));
  RouteCase rn(narrow);
  const AttentionParams& pn = rn.d.p;
  EXPECT_EQ(routed(pn), CudaKernel::bandwg);
  Case d64 = narrow;
  d64.dim = 64;
  RouteCase r64(d64);
  EXPECT_EQ(routed(r64.d.p), CudaKernel::band);
  EXPECT_THROW(routed(r64.d.p, CudaKernel::bandwg), Error);
  Case wide = wg_case("bandwg_route_w65_65", {300}, DType::bf16, Pattern::window(65, 65));
  RouteCase rw(wide);
  EXPECT_NE(routed(rw.d.p), CudaKernel::bandwg);
  EXPECT_THROW(routed(rw.d.p, CudaKernel::bandwg), Error);
  // Chunks up to 65 keys come here; wider chunks never; the tile kernel forced keeps them there.
  Case chunk = wg_case("bandwg_route_chunk64", {300}, DType::bf16, Pattern::chunked(64));
  RouteCase rc(chunk);
  EXPECT_EQ(routed(rc.d.p), CudaKernel::bandwg);
  Case big_chunk = wg_case("bandwg_route_chunk64_n4096", {4096}, DType::bf16, Pattern::chunked(64));
  RouteCase rbig(big_chunk);
  EXPECT_EQ(routed(rbig.d.p), CudaKernel::bandwg);
  Case chunk66 = wg_case("bandwg_route_chunk66", {4096}, DType::bf16, Pattern::chunked(66));
  RouteCase r66(chunk66);
  EXPECT_NE(routed(r66.d.p), CudaKernel::bandwg);
  EXPECT_THROW(routed(r66.d.p, CudaKernel::bandwg), Error);
  EXPECT_EQ(routed(rbig.d.p, CudaKernel::tile), CudaKernel::tile);
  EXPECT_EQ(routed(rc.d.p, CudaKernel::tile), CudaKernel::tile);
  Case causal = wg_case("bandwg_route_causal", {300}, DType::bf16, Pattern::causal());
  RouteCase rcausal(causal);
  EXPECT_NE(routed(rcausal.d.p), CudaKernel::bandwg);
  EXPECT_THROW(routed(rcausal.d.p, CudaKernel::bandwg), Error);
  // A token order (a gather per row, which the copy engine's tiles cannot do; the producer gathers
  // with cp.async instead) comes here by default (FusedTokenOrder above); forcing the band kernel
  // keeps it there (CudaBand.FusedTokenOrder tests it there).
  const DeviceBuffer identity = DeviceBuffer::from_ints([] {
    std::vector<int32_t> v(300);
    std::iota(v.begin(), v.end(), 0);
    return v;
  }());
  AttentionParams ordered = pn;
  ordered.order = static_cast<const int32_t*>(identity.data());
  EXPECT_EQ(routed(ordered), CudaKernel::bandwg);
  EXPECT_EQ(routed(pn), CudaKernel::bandwg);  // no order: unchanged
  EXPECT_EQ(routed(ordered, CudaKernel::band), CudaKernel::band);
  // A view whose rows are closer together than its heads (heads outermost) has no tensor map.
  AttentionParams heads_outer = pn;
  heads_outer.q.stride[0] = 80;
  heads_outer.q.stride[1] = 300 * 80;
  EXPECT_NE(routed(heads_outer), CudaKernel::bandwg);
  try {
    routed(heads_outer, CudaKernel::bandwg);
    ADD_FAILURE() << "a view without tensor maps was forced onto the wgmma band kernel";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("strides"), std::string::npos) << e.what();
  }
  EXPECT_EQ(routed(rc.d.p, CudaKernel::bandwg), CudaKernel::bandwg);
  EXPECT_EQ(routed(pn, CudaKernel::band), CudaKernel::band);
  check_case(narrow, false, on_kernel(CudaKernel::band),
             [](int, const AttentionPlan& plan) { ASSERT_EQ(plan.cuda_kernel(), CudaKernel::band); });
  EXPECT_EQ(routed(pn, CudaKernel::tile), CudaKernel::tile);
}

}  // namespace
}  // namespace ariadne
