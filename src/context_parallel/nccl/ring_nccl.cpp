// The ring over NCCL on device tensors: the schedule of the host simulation (ring_cpu.cpp) with the
// K/V transfer on a stream of its own. At step t the communication stream sends the K/V this rank
// holds to the next rank and receives the next step's from the previous one (one ncclGroup of two
// sends and two receives) while the compute stream runs the step's pieces; events order the two:
// the send waits for the previous step's pieces (they read the buffer the receive then overwrites),
// the next step's pieces wait for the receive.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "ariadne/context_parallel_nccl.hpp"
#include "ariadne/device.hpp"

namespace ariadne {

namespace {

void check(cudaError_t e, const char* what) {
  ARIADNE_CHECK(e == cudaSuccess, "ring_attention_nccl: ", what, " failed: ", cudaGetErrorString(e));
}
void check(ncclResult_t r, const char* what) {
  ARIADNE_CHECK(r == ncclSuccess, "ring_attention_nccl: ", what, " failed: ", ncclGetErrorString(r));
}

// A [n, heads, d] contiguous view of the first n rows of a K/V buffer.
TensorView kv_view(const DeviceBuffer& b, DType dt, int64_t n, int64_t heads, int64_t d) {
  return make_view(b.data(), dt, {n, heads, d}, Device::cuda);
}

}  // namespace

RingRankStats ring_attention_nccl(const NcclRingParams& p) {
  ARIADNE_CHECK(p.comm != nullptr, "ring_attention_nccl: comm is not set");
  ncclComm_t comm = static_cast<ncclComm_t>(p.comm);
  int rank = 0, world = 1;
  check(ncclCommUserRank(comm, &rank), "ncclCommUserRank");
  check(ncclCommCount(comm, &world), "ncclCommCount");
  for (auto [t, name] : {std::pair{&p.q, "q"}, {&p.k, "k"}, {&p.v, "v"}, {&p.out, "out"}}) {
    ARIADNE_CHECK(t->defined(), "ring_attention_nccl: ", name, " is not set");
    require_rank(*t, name, 3);
    require_device(*t, name, Device::cuda);
  }
  ARIADNE_CHECK(p.k.contiguous() && p.v.contiguous(), "ring_attention_nccl: k ", p.k.describe(), " and v ",
                p.v.describe(), " must be contiguous (they are sent as they are)");
  ARIADNE_CHECK(p.align >= 1, "ring_attention_nccl: align is ", p.align, ", expected >= 1");
  for (size_t s = 0; s < p.lengths.size(); ++s)
    ARIADNE_CHECK(p.lengths[s] >= 0, "ring_attention_nccl: lengths[", s, "] is ", p.lengths[s], ", expected >= 0");
  const std::vector<ShardRun> mine = zigzag_runs(p.lengths, rank, world, p.align);
  const int64_t n = rows_of(mine), hq = p.q.shape[1], hkv = p.k.shape[1], d = p.q.shape[2];
  ARIADNE_CHECK(p.q.shape[0] == n && p.k.shape[0] == n && p.v.shape[0] == n, "ring_attention_nccl: q, k, v have ",
                p.q.shape[0], ", ", p.k.shape[0], ", ", p.v.shape[0], " rows, expected ", n, " (rank ", rank,
                "'s zig-zag shard over ", world, " ranks)");
  ARIADNE_CHECK(p.masks.empty() || p.masks.size() == mine.size(), "ring_attention_nccl: masks has ", p.masks.size(),
                " entries, expected 0 or one per query run (", mine.size(), ")");
  ARIADNE_CHECK(p.masks.empty() || p.align % p.masks[0].block == 0, "ring_attention_nccl: align ", p.align,
                " must be a multiple of the masks' block");

  // Buffers: the K/V pair this rank holds and the one it receives (sized for the largest shard).
  int64_t most = 0;
  for (int r = 0; r < world; ++r) most = std::max(most, rows_of(zigzag_runs(p.lengths, r, world, p.align)));
  const DType dt = p.k.dtype;
  const int64_t row_bytes = hkv * d * dtype_size(dt);
  DeviceBuffer bufs[2][2];  // [which][k / v]
  for (auto& b : bufs)
    for (auto& x : b) x = DeviceBuffer(dt, {std::max<int64_t>(most, 1), hkv, d});
  DeviceBuffer acc(DType::f32, {std::max<int64_t>(n, 1), hq, d}), acc_lse(DType::f32, {hq, std::max<int64_t>(n, 1)});
  DeviceBuffer part(DType::f32, {std::max<int64_t>(n, 1), hq, d}), part_lse(DType::f32, {hq * std::max<int64_t>(n, 1)});
  DeviceBuffer scratch(DType::f32, {hq * std::max<int64_t>(n, 1)});
  const cudaStream_t compute = static_cast<cudaStream_t>(p.stream);
  cudaStream_t comm_stream = nullptr;
  check(cudaStreamCreateWithFlags(&comm_stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  cudaEvent_t computed = nullptr, received = nullptr;
  check(cudaEventCreateWithFlags(&computed, cudaEventDisableTiming), "cudaEventCreate");
  check(cudaEventCreateWithFlags(&received, cudaEventDisableTiming), "cudaEventCreate");

  RingRankStats st;
  st.step_entries.assign(size_t(world), 0);
  try {
    check(cudaMemcpyAsync(bufs[0][0].data(), p.k.data, size_t(n * row_bytes), cudaMemcpyDeviceToDevice, compute),
          "copy of k");
    check(cudaMemcpyAsync(bufs[0][1].data(), p.v.data, size_t(n * row_bytes), cudaMemcpyDeviceToDevice, compute),
          "copy of v");
    {  // the empty accumulator (out 0, lse −inf): one piece over no keys
      PieceParams none;
      none.q = p.q;
      none.k = none.v = kv_view(bufs[0][0], dt, 0, hkv, d);
      none.out = acc.view();
      none.lse = make_view(acc_lse.data(), DType::f32, {hq, n}, Device::cuda);
      none.stream = p.stream;
      if (n > 0) attention_piece(none, Backend::cuda);
    }
    const int next = (rank + 1) % world, prev = (rank + world - 1) % world;
    int cur = 0;
    for (int t = 0; t < world; ++t) {
      const int src = (rank - t + world) % world;
      const std::vector<ShardRun> held = zigzag_runs(p.lengths, src, world, p.align);
      const int64_t held_rows = rows_of(held);
      if (t + 1 < world) {
        const int64_t in_rows = rows_of(zigzag_runs(p.lengths, (src + world - 1) % world, world, p.align));
        check(cudaEventRecord(computed, compute), "cudaEventRecord");  // the previous step's pieces
        check(cudaStreamWaitEvent(comm_stream, computed, 0), "cudaStreamWaitEvent");
        check(ncclGroupStart(), "ncclGroupStart");
        for (int x = 0; x < 2; ++x) {
          check(ncclSend(bufs[cur][x].data(), size_t(held_rows * row_bytes), ncclUint8, next, comm, comm_stream),
                "ncclSend");
          check(ncclRecv(bufs[1 - cur][x].data(), size_t(in_rows * row_bytes), ncclUint8, prev, comm, comm_stream),
                "ncclRecv");
        }
        check(ncclGroupEnd(), "ncclGroupEnd");
        check(cudaEventRecord(received, comm_stream), "cudaEventRecord");
        st.bytes_sent += 2 * held_rows * row_bytes;
      }
      for (size_t qi = 0; qi < mine.size(); ++qi) {
        const ShardRun& qr = mine[qi];
        for (const ShardRun& kr : held) {
          if (kr.seq != qr.seq) continue;
          PieceParams pp;
          pp.q = row_range(p.q, qr.row, qr.row + qr.pos.size());
          pp.k = row_range(kv_view(bufs[cur][0], dt, held_rows, hkv, d), kr.row, kr.row + kr.pos.size());
          pp.v = row_range(kv_view(bufs[cur][1], dt, held_rows, hkv, d), kr.row, kr.row + kr.pos.size());
          pp.q_pos = qr.pos.lo;
          pp.k_pos = kr.pos.lo;
          pp.rule = p.rule;
          if (!p.masks.empty()) pp.blocks = p.masks[qi].view();
          pp.sink_mode = p.sink_mode == SinkMode::key0_bias ? SinkMode::key0_bias : SinkMode::none;
          pp.sink = p.sink;
          pp.scale = p.scale;
          const int64_t nq = qr.pos.size();
          pp.out = row_range(part.view(), 0, nq);
          pp.lse = make_view(part_lse.data(), DType::f32, {hq, nq}, Device::cuda);
          pp.lse_scratch = scratch.view();
          pp.stream = p.stream;
          const PieceWork w = attention_piece(pp, Backend::cuda);
          if (w.calls == 0) continue;
          TensorView al = make_view(acc_lse.data(), DType::f32, {hq, n}, Device::cuda);
          al.data = static_cast<float*>(al.data) + qr.row;
          al.shape[1] = nq;
          merge_partial(row_range(acc.view(), qr.row, qr.row + nq), al, pp.out, pp.lse, p.stream);
          st.entries += w.entries;
          st.calls += w.calls;
          st.step_entries[size_t(t)] += w.entries;
        }
      }
      if (t + 1 < world) {
        check(cudaStreamWaitEvent(compute, received, 0), "cudaStreamWaitEvent");
        cur = 1 - cur;
      }
    }
    TensorView al = make_view(acc_lse.data(), DType::f32, {hq, n}, Device::cuda);
    if (n > 0)
      finish_partials(row_range(acc.view(), 0, n), al, p.sink_mode, p.sink, p.out, p.lse, p.stream);
    check(cudaStreamSynchronize(comm_stream), "cudaStreamSynchronize");
  } catch (...) {
    cudaStreamSynchronize(comm_stream);
    cudaStreamDestroy(comm_stream);
    cudaEventDestroy(computed);
    cudaEventDestroy(received);
    throw;
  }
  check(cudaStreamSynchronize(compute), "cudaStreamSynchronize");  // the buffers die with this call
  cudaStreamDestroy(comm_stream);
  cudaEventDestroy(computed);
  cudaEventDestroy(received);
  return st;
}

}  // namespace ariadne
