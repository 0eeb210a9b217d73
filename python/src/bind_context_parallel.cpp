// Python bindings: the pieces of context-parallel (ring) attention (context_parallel.hpp) and RR from
// all-gathered key-stride sums (estimate.hpp). ariadne.context_parallel builds a ring over a
// torch.distributed process group on them.
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "ariadne/context_parallel.hpp"
#include "bindings.hpp"
#include "convert.hpp"

namespace ariadne::py {

namespace {

using namespace nb::literals;

#define SIG_F32_IN3 "Annotated[NDArray[numpy.float32], dict(shape=(None, None, None), writable=False)]"
#define SIG_F32_OUT3 "Annotated[NDArray[numpy.float32], dict(shape=(None, None, None))]"
#define SIG_F32_OUT2 "Annotated[NDArray[numpy.float32], dict(shape=(None, None))]"

}  // namespace

void bind_context_parallel(nb::module_& m) {
  m.def(
      "attention_piece",
      [](const AnyIn& q, const AnyIn& k, const AnyIn& v, int64_t q_pos, int64_t k_pos, const AnyOut& out,
         const AnyOut& lse, const Pattern& rule, const BlockMask* blocks, const std::optional<AnyIn>& sink,
         const std::string& sink_mode, float scale, const std::string& backend, uintptr_t stream,
         const std::optional<AnyOut>& lse_scratch, bool bf16_bits) {
        PieceParams p;
        p.stream = reinterpret_cast<void*>(stream);
        if (lse_scratch) p.lse_scratch = as_view(*lse_scratch, "lse_scratch");
        p.q = as_view(q, "q", bf16_bits);
        p.k = as_view(k, "k", bf16_bits);
        p.v = as_view(v, "v", bf16_bits);
        p.out = as_view(out, "out");
        p.lse = as_view(lse, "lse");
        p.q_pos = q_pos;
        p.k_pos = k_pos;
        p.rule = rule;
        if (blocks) p.blocks = blocks->view();
        p.sink_mode = parse_sink_mode(sink_mode);
        if (sink) p.sink = as_view(*sink, "sink");
        ARIADNE_CHECK(p.sink_mode == SinkMode::none || sink.has_value(), "sink: sink_mode is '", sink_mode,
                      "' but no sink was given");
        p.scale = scale;
        const Backend b = parse_backend(backend);
        nb::gil_scoped_release unlocked;
        const PieceWork w = attention_piece(p, b);
        return std::pair<int64_t, int64_t>(w.calls, w.entries);
      },
      nb::sig("def attention_piece(q: " ARIADNE_SIG_QKV ", k: " ARIADNE_SIG_QKV ", v: " ARIADNE_SIG_QKV
              ", q_pos: int, k_pos: int, out: " SIG_F32_OUT3 ", lse: " ARIADNE_SIG_F32_OUT2
              ", rule: Pattern = ..., blocks: BlockMask | None = None, sink: " ARIADNE_SIG_F32_IN1
              " | None = None, sink_mode: str = 'none', scale: float = 0.0, backend: str = 'cpu', "
              "stream: int = 0, lse_scratch: Annotated[NDArray[numpy.float32], dict(order='C')] | None = None, "
              "bf16_bits: bool = False) -> tuple[int, int]"),
      "q"_a.noconvert(), "k"_a.noconvert(), "v"_a.noconvert(), "q_pos"_a, "k_pos"_a, "out"_a.noconvert(),
      "lse"_a.noconvert(), "rule"_a = Pattern::full(), "blocks"_a = nb::none(), "sink"_a = nb::none(),
      "sink_mode"_a = "none", "scale"_a = 0.f, "backend"_a = "cpu", "stream"_a = 0, "lse_scratch"_a = nb::none(),
      "bf16_bits"_a = false,
      R"doc(One piece of a ring: queries at positions q_pos ... of one self-attention sequence against keys
at positions k_pos ..., under the sequence's rule (a window and/or chunk Pattern, no varlen) and
optionally its block mask restricted to these queries (rows head * nqb + local block, columns the
sequence's key blocks: estimate_rr_from_key_sums(...).mask). Writes the partial out (float32
[n_q, heads_q, head_dim]) and lse (float32 [heads_q, n_q], -inf where no key is allowed). A key-0
sink applies in the piece whose keys start at position 0; a denominator sink is left to
finish_partials. Host arrays on backend 'cpu' / 'reference', or CUDA arrays on 'cuda' (enqueued on
`stream`, a cudaStream_t as an int; blocks stays a host BlockMask). lse_scratch: optional float32
scratch of >= heads_q * n_q elements for the calls' LSE (else one is allocated per call). Returns
(attention calls, allowed score entries).)doc");

  m.def(
      "merge_partial",
      [](const AnyOut& acc_out, const AnyOut& acc_lse, const AnyIn& part_out, const AnyIn& part_lse, uintptr_t stream) {
        const TensorView ao = as_view(acc_out, "acc_out"), al = as_view(acc_lse, "acc_lse");
        const TensorView po = as_view(part_out, "part_out"), pl = as_view(part_lse, "part_lse");
        nb::gil_scoped_release unlocked;
        merge_partial(ao, al, po, pl, reinterpret_cast<void*>(stream));
      },
      nb::sig("def merge_partial(acc_out: " SIG_F32_OUT3 ", acc_lse: " SIG_F32_OUT2 ", part_out: " SIG_F32_IN3
              ", part_lse: " ARIADNE_SIG_F32_IN2 ", stream: int = 0) -> None"),
      "acc_out"_a.noconvert(), "acc_lse"_a.noconvert(), "part_out"_a.noconvert(), "part_lse"_a.noconvert(),
      "stream"_a = 0,
      "acc <- the LSE merge of acc and a piece's partial (float32 arrays on one device, out [n, heads, dim],\n"
      "lse [heads, n]); a partial row with lse -inf changes nothing. CUDA arrays: a kernel on `stream`.");

  m.def(
      "finish_partials",
      [](const AnyIn& acc_out, const AnyIn& acc_lse, const AnyOut& out, const std::optional<AnyOut>& lse,
         const std::optional<AnyIn>& sink, const std::string& sink_mode, uintptr_t stream, bool bf16_bits) {
        const TensorView ao = as_view(acc_out, "acc_out"), al = as_view(acc_lse, "acc_lse");
        const TensorView o = as_view(out, "out", bf16_bits);
        const TensorView l = lse ? as_view(*lse, "lse") : TensorView{};
        const TensorView s = sink ? as_view(*sink, "sink") : TensorView{};
        const SinkMode mode = parse_sink_mode(sink_mode);
        nb::gil_scoped_release unlocked;
        finish_partials(ao, al, mode, s, o, l, reinterpret_cast<void*>(stream));
      },
      nb::sig("def finish_partials(acc_out: " SIG_F32_IN3 ", acc_lse: " ARIADNE_SIG_F32_IN2 ", out: " ARIADNE_SIG_OUT
              ", lse: " SIG_F32_OUT2 " | None = None, sink: " ARIADNE_SIG_F32_IN1
              " | None = None, sink_mode: str = 'none', stream: int = 0, bf16_bits: bool = False) -> None"),
      "acc_out"_a.noconvert(), "acc_lse"_a.noconvert(), "out"_a.noconvert(), "lse"_a = nb::none(),
      "sink"_a = nb::none(), "sink_mode"_a = "none", "stream"_a = 0, "bf16_bits"_a = false,
      "Writes the merged result into out (float32, bfloat16 or float16) and lse, adding a denominator\n"
      "sink once.");

  m.def(
      "zigzag_shards",
      [](int64_t length, int ranks, int64_t align) {
        std::vector<std::pair<std::pair<int64_t, int64_t>, std::pair<int64_t, int64_t>>> out;
        for (const auto& [a, b] : zigzag_shards(length, ranks, align))
          out.push_back({{a.lo, a.hi}, {b.lo, b.hi}});
        return out;
      },
      "length"_a, "ranks"_a, "align"_a = 1,
      "Rank r's pair of zig-zag chunks ((lo, hi), (lo, hi)) of a sequence: chunks r and 2N - 1 - r of\n"
      "ceil(length / 2N) tokens rounded up to align.");

  m.def(
      "zigzag_runs",
      [](const std::vector<int64_t>& lengths, int rank, int ranks, int64_t align) {
        std::vector<std::tuple<int32_t, int64_t, int64_t, int64_t>> out;
        for (const ShardRun& r : zigzag_runs(lengths, rank, ranks, align))
          out.emplace_back(r.seq, r.pos.lo, r.pos.hi, r.row);
        return out;
      },
      "lengths"_a, "rank"_a, "ranks"_a, "align"_a = 1,
      "Rank `rank`'s rows of a packed batch of sequences of `lengths` tokens: (sequence, first position,\n"
      "end position, first row in the rank's tensors) of each non-empty zig-zag chunk, sequence after\n"
      "sequence.");

  m.def(
      "rr_key_sums",
      [](const AnyIn& k, int32_t stride, bool bf16_bits) {
        const TensorView kv = as_view(k, "k", bf16_bits);
        Buffer sums;
        {
          nb::gil_scoped_release unlocked;
          sums = rr_key_sums(kv, stride);
        }
        std::vector<float> values(sums.as<float>(), sums.as<float>() + sums.numel());
        std::vector<size_t> shape(sums.shape().begin(), sums.shape().end());
        return take_numpy(std::move(values), shape);
      },
      nb::sig("def rr_key_sums(k: " ARIADNE_SIG_QKV ", stride: int = 8, bf16_bits: bool = False) -> "
              "Annotated[NDArray[numpy.float32], dict(shape=(None, None, None), order='C')]"),
      "k"_a.noconvert(), "stride"_a = 8, "bf16_bits"_a = false,
      "RR's key-stride sums of a run of keys starting on a stride boundary: float32\n"
      "[ceil(n / stride), heads_kv, head_dim], summed as estimate() sums them.");

  m.def(
      "estimate_rr_from_key_sums",
      [](const AnyIn& q, const AnyIn& key_sums, int64_t q_pos, int64_t seq_len, int32_t block, int32_t stride,
         double tau, const std::string& offset, const std::optional<std::vector<std::string>>& protect, float scale,
         bool bf16_bits) {
        const TensorView qv = as_view(q, "q", bf16_bits), sv = as_view(key_sums, "key_sums");
        EstimateConfig c;
        c.method = Estimator::rr;
        c.block = block;
        c.stride = stride;
        c.tau = tau;
        c.offset = parse_rr_offset(offset);
        c.protect = protections_of(protect);
        c.scale = scale;
        nb::gil_scoped_release unlocked;
        return estimate_rr_from_key_sums(qv, sv, q_pos, seq_len, c);
      },
      nb::sig("def estimate_rr_from_key_sums(q: " ARIADNE_SIG_QKV ", key_sums: " SIG_F32_IN3
              ", q_pos: int, seq_len: int, block: int = 128, stride: int = 8, tau: float = 0.95, "
              "offset: str = 'paper', protect: Sequence[str] | None = None, scale: float = 0.0, "
              "bf16_bits: bool = False) -> EstimateResult"),
      "q"_a.noconvert(), "key_sums"_a.noconvert(), "q_pos"_a, "seq_len"_a, "block"_a = 128, "stride"_a = 8,
      "tau"_a = 0.95, "offset"_a = "paper", "protect"_a = nb::none(), "scale"_a = 0.f, "bf16_bits"_a = false,
      "RR's estimate of the queries at positions q_pos ... of a causal sequence of seq_len tokens from the\n"
      "sequence's key-stride sums (rr_key_sums of its keys, all-gathered): the rows, scores and mask rows\n"
      "estimate() gives those query blocks on the whole sequence, bit for bit. q_pos: a multiple of block.");
}

}  // namespace ariadne::py
