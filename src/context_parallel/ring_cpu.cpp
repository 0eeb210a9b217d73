// The ring simulated on the host: ranks are threads, messages are copies between their buffers.
// It runs the schedule a multi-GPU ring runs (zig-zag shards, K/V passed N − 1 times with double
// buffering, LSE merge, sinks once, RR from all-gathered key-stride sums, query blocks handed
// between ranks) so that CI checks the schedule itself against one-device attention.
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <thread>

#include "ariadne/context_parallel.hpp"

namespace ariadne {

namespace {

// Rows [lo, hi) of a [tokens, heads, dim] view, copied into a contiguous buffer of its dtype.
Buffer copy_rows(const TensorView& t, int64_t lo, int64_t hi) {
  const int64_t heads = t.shape[1], d = t.shape[2], es = dtype_size(t.dtype);
  Buffer b(t.dtype, {hi - lo, heads, d});
  for (int64_t i = lo; i < hi; ++i)
    for (int64_t h = 0; h < heads; ++h)
      std::memcpy(static_cast<char*>(b.data()) + ((i - lo) * heads + h) * d * es,
                  static_cast<const char*>(t.data) + t.offset({i, h, 0}) * es, size_t(d * es));
  return b;
}

int64_t bytes_of(const Buffer& b) { return b.numel() * dtype_size(b.dtype()); }

// A run of one sequence's queries that one rank computes, with what it needs and what it builds.
struct QueryRun {
  int32_t seq = 0;
  PosRange pos;
  int owner = 0;  // the rank that holds these queries in the zig-zag shards
  Buffer q;       // [n, heads_q, dim]: the owner's rows (sent when another rank computes them)
  BlockMask mask; // rows (head, local query block), the sequence's key blocks; empty: dense
  Buffer acc_out, acc_lse, part_out, part_lse, lse_scratch;
};

// What a rank passes to the next one: its K/V chunks (only the K/V heads travel).
struct KvChunk {
  int32_t seq = 0;
  PosRange pos;
  Buffer k, v;
};
using KvMessage = std::vector<KvChunk>;

KvMessage copy_message(const KvMessage& m) {
  KvMessage out;
  for (const KvChunk& c : m) {
    KvChunk x;
    x.seq = c.seq;
    x.pos = c.pos;
    x.k = copy_rows(c.k.view(), 0, c.pos.size());
    x.v = copy_rows(c.v.view(), 0, c.pos.size());
    out.push_back(std::move(x));
  }
  return out;
}

struct Problem {
  const AttentionParams* p = nullptr;
  Pattern rule;  // the dense part of p.pattern (window, chunk), one sequence
  int64_t hq = 0, d = 0;
};

// The ring proper: rank r computes runs[r] against every K/V chunk as the chunks pass.
void run_ring(const Problem& pb, std::vector<std::vector<QueryRun>>& runs, std::vector<KvMessage> own,
              const RingConfig& config, RingStats& stats) {
  const int n = config.ranks;
  std::vector<KvMessage> cur = std::move(own), next(static_cast<size_t>(n));
  stats.ranks.assign(size_t(n), RingRankStats{});
  for (RingRankStats& s : stats.ranks) s.step_entries.assign(size_t(n), 0);
  std::barrier sync(n);
  std::mutex error_lock;
  std::exception_ptr error;
  std::atomic<bool> failed{false};  // a rank threw: the others stop computing but keep the barriers
  auto rank_main = [&](int r) {
    RingRankStats& st = stats.ranks[size_t(r)];
    for (int t = 0; t < n; ++t) {
      try {
        if (!failed.load()) {
          if (t + 1 < n) {  // send before computing: the copy a real ring overlaps with the step
            next[size_t((r + 1) % n)] = copy_message(cur[size_t(r)]);
            for (const KvChunk& c : cur[size_t(r)]) st.bytes_sent += bytes_of(c.k) + bytes_of(c.v);
          }
          for (QueryRun& run : runs[size_t(r)])
            for (const KvChunk& c : cur[size_t(r)]) {
              if (c.seq != run.seq) continue;
              PieceParams pp;
              pp.q = run.q.view();
              pp.k = c.k.view();
              pp.v = c.v.view();
              pp.q_pos = run.pos.lo;
              pp.k_pos = c.pos.lo;
              pp.rule = pb.rule;
              if (run.mask.heads > 0) pp.blocks = run.mask.view();
              pp.sink_mode = pb.p->sink_mode;
              pp.sink = pb.p->sink;
              pp.scale = pb.p->scale;
              pp.out = run.part_out.view();
              pp.lse = run.part_lse.view();
              pp.lse_scratch = run.lse_scratch.view();
              const PieceWork w = attention_piece(pp, config.backend);
              if (w.calls == 0) continue;
              merge_partial(run.acc_out.view(), run.acc_lse.view(), run.part_out.view(), run.part_lse.view());
              st.entries += w.entries;
              st.calls += w.calls;
              st.step_entries[size_t(t)] += w.entries;
            }
        }
      } catch (...) {
        const std::lock_guard<std::mutex> g(error_lock);
        if (!error) error = std::current_exception();
        failed.store(true);
      }
      sync.arrive_and_wait();  // every rank has sent and computed step t
      if (t + 1 < n) std::swap(cur[size_t(r)], next[size_t(r)]);
      sync.arrive_and_wait();  // every rank has taken its message before the next send
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(rank_main, r);
  for (std::thread& th : threads) th.join();
  if (error) std::rethrow_exception(error);
}

void init_run(QueryRun& run, int64_t hq, int64_t d) {
  const int64_t len = run.pos.size();
  run.acc_out = Buffer(DType::f32, {len, hq, d});
  run.acc_out.fill(0.f);
  run.acc_lse = Buffer(DType::f32, {hq, len});
  run.acc_lse.fill(-std::numeric_limits<float>::infinity());
  run.part_out = Buffer(DType::f32, {len, hq, d});
  run.part_lse = Buffer(DType::f32, {hq, len});
  run.lse_scratch = Buffer(DType::f32, {hq * len});
}

// Writes a finished run into the packed outputs of p (the gather a real ring does last).
void finish_run(const AttentionParams& p, const SeqExtent& e, const QueryRun& run) {
  const TensorView out = row_range(p.out, e.q0 + run.pos.lo, e.q0 + run.pos.hi);
  TensorView lse;
  if (p.lse.defined()) {
    lse = p.lse;
    lse.data = static_cast<float*>(p.lse.data) + (e.q0 + run.pos.lo);
    lse.shape[1] = run.pos.size();
  }
  finish_partials(run.acc_out.view(), run.acc_lse.view(), p.sink_mode, p.sink, out, lse);
}

// Checks shared by both entry points; returns the problem and the chunk alignment.
Problem check_ring(const AttentionParams& p, const RingConfig& c, int64_t block, int64_t& align) {
  validate(p);
  ARIADNE_CHECK(p.q.device == Device::cpu, "ring: q ", p.q.describe(),
                " is on the device: the ring simulation runs host tensors (the NCCL ring runs device ones)");
  ARIADNE_CHECK(p.order == nullptr, "ring: token orders are not supported (permute q, k, v first)");
  ARIADNE_CHECK(c.ranks >= 1 && c.ranks <= 1024, "ring config: ranks is ", c.ranks, ", expected in [1, 1024]");
  ARIADNE_CHECK(c.backend == Backend::cpu || c.backend == Backend::reference || c.backend == Backend::automatic,
                "ring config: backend is ", backend_name(c.backend), ", expected cpu or reference (host tensors)");
  ARIADNE_CHECK(c.align >= 0, "ring config: align is ", c.align, ", expected >= 0");
  align = c.align > 0 ? c.align : (block > 0 ? block : 1);
  ARIADNE_CHECK(block == 0 || align % block == 0, "ring config: align ", align,
                " must be a multiple of the mask's block ", block, " (shards start on block boundaries)");
  for (int32_t s = 0; s < p.pattern.num_seqs; ++s) {
    const SeqExtent e = p.pattern.seq(s, p.q.shape[0], p.k.shape[0]);
    ARIADNE_CHECK(e.lq == e.lk, "ring: sequence ", s, " has ", e.lq, " queries and ", e.lk,
                  " keys, expected self-attention (lq == lk)");
  }
  Problem pb;
  pb.p = &p;
  pb.rule = p.pattern;
  pb.rule.num_seqs = 1;
  pb.rule.cu_seqlens_q = pb.rule.cu_seqlens_k = nullptr;
  pb.rule.blocks = BlockSparseView{};
  pb.hq = p.heads_q();
  pb.d = p.head_dim();
  return pb;
}

// Each rank's own K/V chunks, per the shards.
// Every sequence's length (check_ring has made them self-attention sequences).
std::vector<int64_t> lengths_of(const AttentionParams& p) {
  std::vector<int64_t> out;
  for (int32_t s = 0; s < p.pattern.num_seqs; ++s) out.push_back(p.pattern.seq(s, p.q.shape[0], p.k.shape[0]).lq);
  return out;
}

// Each rank's own K/V chunks, per the zig-zag runs.
std::vector<KvMessage> kv_messages(const AttentionParams& p, const std::vector<int64_t>& lengths, int ranks,
                                   int64_t align) {
  std::vector<KvMessage> own(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r)
    for (const ShardRun& run : zigzag_runs(lengths, r, ranks, align)) {
      const SeqExtent e = p.pattern.seq(run.seq, p.q.shape[0], p.k.shape[0]);
      KvChunk c;
      c.seq = run.seq;
      c.pos = run.pos;
      c.k = copy_rows(p.k, e.k0 + run.pos.lo, e.k0 + run.pos.hi);
      c.v = copy_rows(p.v, e.k0 + run.pos.lo, e.k0 + run.pos.hi);
      own[size_t(r)].push_back(std::move(c));
    }
  return own;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

RingStats ring_attention(const AttentionParams& p, const RingConfig& config) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t block = p.pattern.blocks.defined() ? p.pattern.blocks.block : 0;
  int64_t align = 1;
  const Problem pb = check_ring(p, config, block, align);
  const int n = config.ranks;
  const std::vector<int64_t> lengths = lengths_of(p);
  std::vector<std::vector<QueryRun>> runs(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    for (const ShardRun& sr : zigzag_runs(lengths, r, n, align)) {
      const SeqExtent e = p.pattern.seq(sr.seq, p.q.shape[0], p.k.shape[0]);
      QueryRun run;
      run.seq = sr.seq;
      run.pos = sr.pos;
      run.owner = r;
      run.q = copy_rows(p.q, e.q0 + sr.pos.lo, e.q0 + sr.pos.hi);
      // The owner's rows of the mask: its query blocks, every key block.
      if (block > 0) run.mask = mask_rows(p.pattern, sr.seq, p.q.shape[0], p.k.shape[0], sr.pos.lo, sr.pos.size());
      init_run(run, pb.hq, pb.d);
      runs[size_t(r)].push_back(std::move(run));
    }
  RingStats stats;
  run_ring(pb, runs, kv_messages(p, lengths, n, align), config, stats);
  for (const auto& rank_runs : runs)
    for (const QueryRun& run : rank_runs) finish_run(p, p.pattern.seq(run.seq, p.q.shape[0], p.k.shape[0]), run);
  stats.ms_total = ms_since(t0);
  return stats;
}

RingPrefillResult ring_prefill(const AttentionParams& p, const PrefillConfig& config, const RingConfig& ring) {
  const auto t0 = std::chrono::steady_clock::now();
  const Pattern& layout = p.pattern;
  ARIADNE_CHECK(layout.is_causal() && layout.chunk == 0 && !layout.blocks.defined(), "ring_prefill: params.pattern is ",
                describe(layout), ", expected causal (optionally varlen); the mask comes from the estimator");
  ARIADNE_CHECK(p.sink_mode == SinkMode::none, "ring_prefill: sink_mode is ", sink_mode_name(p.sink_mode),
                ", expected none (the estimators model plain softmax)");
  RingPrefillResult res;
  if (config.dense) {
    res.ring = ring_attention(p, ring);
    res.prefill.stats.density_per_head.assign(size_t(p.heads_q()), 1.0);
    res.prefill.stats.ms_total = ms_since(t0);
    return res;
  }
  const EstimateConfig& ec = config.estimate;
  validate(ec, p.heads_q());
  ARIADNE_CHECK(ec.method == Estimator::rr, "ring_prefill: method is ", estimator_name(ec.method),
                ", expected rr (it reads keys only as stride sums, which the ranks all-gather)");
  ARIADNE_CHECK(config.estimate_backend != Backend::cuda,
                "ring_prefill: estimate_backend is cuda, expected a host backend (the simulation runs on the host)");
  int64_t align = 1;
  const Problem pb = check_ring(p, ring, ec.block, align);
  const int n = ring.ranks;
  const int64_t B = ec.block, S = ec.stride, hq = pb.hq, hkv = p.heads_kv(), d = pb.d;

  const std::vector<int64_t> lengths = lengths_of(p);
  std::vector<KvMessage> own = kv_messages(p, lengths, n, align);
  RingStats& stats = res.ring;
  stats.ranks.assign(size_t(n), RingRankStats{});

  // Key-stride sums: each rank sums its own chunks; the all-gather gives every rank the sums of
  // every key (held once here, since every rank's copy is the same).
  std::vector<Buffer> sums;  // per sequence: [ceil(L / S), heads_kv, dim]
  for (int32_t s = 0; s < layout.num_seqs; ++s) {
    const int64_t L = layout.seq(s, p.q.shape[0], p.k.shape[0]).lq;
    sums.emplace_back(DType::f32, std::vector<int64_t>{(L + S - 1) / S, hkv, d});
  }
  for (int r = 0; r < n; ++r)
    for (const KvChunk& c : own[size_t(r)]) {
      const Buffer part = rr_key_sums(c.k.view(), int32_t(S));
      std::memcpy(sums[size_t(c.seq)].as<float>() + (c.pos.lo / S) * hkv * d, part.data(), size_t(bytes_of(part)));
      stats.ranks[size_t(r)].bytes_sent += bytes_of(part) * (n - 1);
    }

  // Each rank estimates its own query chunks.
  struct Owned {
    int32_t seq;
    PosRange pos;
    EstimateResult est;
  };
  std::vector<std::vector<Owned>> owned(static_cast<size_t>(n));
  std::vector<std::vector<double>> work(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    for (const ShardRun& sr : zigzag_runs(lengths, r, n, align)) {
      const SeqExtent e = layout.seq(sr.seq, p.q.shape[0], p.k.shape[0]);
      const PosRange pr = sr.pos;
      Owned o{sr.seq, pr,
              estimate_rr_from_key_sums(row_range(p.q, e.q0 + pr.lo, e.q0 + pr.hi), sums[size_t(sr.seq)].view(), pr.lo,
                                        e.lq, ec)};
      // A query block's work: its queries times the key blocks its rows list, over the heads.
      const int64_t nqb = (pr.size() + B - 1) / B;
      for (int64_t m = 0; m < nqb; ++m) {
        double w = 0;
        const double rows_in = double(std::min(B, pr.size() - m * B));
        for (int64_t h = 0; h < hq; ++h) {
          const int64_t row = h * nqb + m;
          w += rows_in * double(o.est.mask.row_ptr[size_t(row) + 1] - o.est.mask.row_ptr[size_t(row)]);
        }
        work[size_t(r)].push_back(w);
      }
      owned[size_t(r)].push_back(std::move(o));
    }
  // The per-block work is all-gathered (a few numbers a rank), and every rank computes the same
  // assignment from it.
  if (ring.balance) {
    res.assignment = balance_query_blocks(work);
  } else {
    res.assignment.rank_of.resize(size_t(n));
    res.assignment.load.assign(size_t(n), 0.0);
    for (int r = 0; r < n; ++r) {
      res.assignment.rank_of[size_t(r)].assign(work[size_t(r)].size(), r);
      for (double w : work[size_t(r)]) res.assignment.load[size_t(r)] += w;
    }
    res.assignment.load_before = res.assignment.load;
  }

  // Query runs: consecutive blocks of one owned chunk that go to the same rank.
  std::vector<std::vector<QueryRun>> runs(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    size_t bi = 0;
    for (const Owned& o : owned[size_t(r)]) {
      const SeqExtent e = layout.seq(o.seq, p.q.shape[0], p.k.shape[0]);
      const int64_t nqb = (o.pos.size() + B - 1) / B;
      for (int64_t m0 = 0; m0 < nqb;) {
        const int dest = res.assignment.rank_of[size_t(r)][bi + size_t(m0)];
        int64_t m1 = m0 + 1;
        while (m1 < nqb && res.assignment.rank_of[size_t(r)][bi + size_t(m1)] == dest) ++m1;
        QueryRun run;
        run.seq = o.seq;
        run.pos = PosRange{o.pos.lo + m0 * B, std::min(o.pos.hi, o.pos.lo + m1 * B)};
        run.owner = r;
        run.q = copy_rows(p.q, e.q0 + run.pos.lo, e.q0 + run.pos.hi);
        // The owned chunk's mask is a one-sequence mask of its queries: take blocks [m0, m1).
        run.mask = mask_rows(Pattern::full().with_blocks(o.est.mask.view()), 0, o.pos.size(), o.pos.size(), m0 * B,
                             run.pos.size());
        if (dest != r)  // the owner sends the queries and mask rows, and gets out and LSE back
          stats.ranks[size_t(r)].bytes_sent +=
              bytes_of(run.q) + int64_t(run.mask.col_idx.size() + run.mask.row_ptr.size()) * 4;
        init_run(run, hq, d);
        runs[size_t(dest)].push_back(std::move(run));
        m0 = m1;
      }
      bi += size_t(nqb);
    }
  }
  RingStats ring_stats;
  run_ring(pb, runs, std::move(own), ring, ring_stats);
  for (int r = 0; r < n; ++r) {
    RingRankStats& st = stats.ranks[size_t(r)];
    const RingRankStats& x = ring_stats.ranks[size_t(r)];
    st.entries = x.entries;
    st.calls = x.calls;
    st.step_entries = x.step_entries;
    st.bytes_sent += x.bytes_sent;
    for (const QueryRun& run : runs[size_t(r)]) {
      finish_run(p, layout.seq(run.seq, p.q.shape[0], p.k.shape[0]), run);
      if (run.owner != r) st.bytes_sent += bytes_of(run.acc_out) / 4 * dtype_size(p.out.dtype) + bytes_of(run.acc_lse);
    }
  }

  // The gathered mask, in the one-device row order (sequence, head, query block).
  std::vector<int64_t> q_lengths;
  std::vector<std::vector<int32_t>> lists;
  PrefillStats& ps = res.prefill.stats;
  std::vector<double> kept(static_cast<size_t>(hq), 0.0), visible(size_t(hq), 0.0);
  for (int32_t s = 0; s < layout.num_seqs; ++s) {
    const SeqExtent e = layout.seq(s, p.q.shape[0], p.k.shape[0]);
    q_lengths.push_back(e.lq);
    std::vector<const Owned*> by_block;  // the owned chunk of each query block
    for (int r = 0; r < n; ++r)
      for (const Owned& o : owned[size_t(r)])
        if (o.seq == s)
          for (int64_t m = o.pos.lo / B; m * B < o.pos.hi; ++m) {
            if (int64_t(by_block.size()) <= m) by_block.resize(size_t(m + 1), nullptr);
            by_block[size_t(m)] = &o;
          }
    for (int64_t h = 0; h < hq; ++h)
      for (size_t m = 0; m < by_block.size(); ++m) {
        const Owned& o = *by_block[m];
        const int64_t nqb = (o.pos.size() + B - 1) / B, row = h * nqb + int64_t(m) - o.pos.lo / B;
        lists.emplace_back(o.est.mask.col_idx.begin() + o.est.mask.row_ptr[size_t(row)],
                           o.est.mask.col_idx.begin() + o.est.mask.row_ptr[size_t(row) + 1]);
        kept[size_t(h)] += double(lists.back().size());
        visible[size_t(h)] += double(o.est.visible(row));
      }
  }
  res.prefill.estimate.mask = BlockMask::from_lists(int32_t(B), int32_t(hq), q_lengths, lists);
  res.prefill.estimate.heads = int32_t(hq);
  double k_all = 0, v_all = 0;
  for (int64_t h = 0; h < hq; ++h) {
    ps.density_per_head.push_back(visible[size_t(h)] > 0 ? kept[size_t(h)] / visible[size_t(h)] : 0.0);
    k_all += kept[size_t(h)];
    v_all += visible[size_t(h)];
  }
  ps.density = v_all > 0 ? k_all / v_all : 0.0;
  ps.ms_total = ms_since(t0);
  stats.ms_total = ps.ms_total;
  return res;
}

}  // namespace ariadne
