// Python bindings: Pattern, BlockMask and attention() over DLPack arrays (no copies).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#ifdef ARIADNE_WITH_CUDA
#include <cuda_runtime.h>
#endif

#include "ariadne/attention.hpp"
#include "ariadne/attention_backward.hpp"
#include "ariadne/device.hpp"
#include "ariadne/error.hpp"
#include "ariadne/pattern.hpp"
#include "bindings.hpp"
#include "convert.hpp"

namespace ariadne::py {

namespace {

using namespace nb::literals;

// Optional float32 outputs of a fixed rank (lse and the diagnostics): typed in the signature so
// that a wrong dtype or layout is refused before any kernel runs; never converted (a converted
// copy would receive the results and be thrown away).
using F32Out2 = nb::ndarray<float, nb::ndim<2>, nb::c_contig>;
using F32In2 = nb::ndarray<const float, nb::ndim<2>>;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Host copy of a metadata array, whichever side it was given on (only host ones are read).
std::vector<int32_t> host_ints(const IntsIn& a) {
  return std::vector<int32_t>(a.data(), a.data() + a.shape(0));
}

bool on_host(int device_type) { return device_type == 1 || device_type == 3; }

// The rows a block mask must have for the sequences it is paired with. The library's
// validate_pattern reads CSR rows through raw pointers, so the owning vectors are checked for
// size here first: a mask built for other lengths is an error, never an out-of-range read.
void check_mask_fits(const BlockMask& m, bool varlen, int32_t num_seqs, const std::vector<int32_t>* cu_q_host,
                     int64_t total_q, int heads_q) {
  ARIADNE_CHECK(m.block > 0, "blocks: block is ", m.block, ", expected > 0");
  ARIADNE_CHECK(m.heads == heads_q, "blocks: the mask has rows for ", m.heads, " heads, q has ", heads_q);
  ARIADNE_CHECK(!m.row_ptr.empty(), "blocks: row_ptr is empty, expected rows + 1 entries");
  ARIADNE_CHECK(int64_t(m.col_idx.size()) == m.nnz(), "blocks: col_idx has ", m.col_idx.size(),
                " entries, row_ptr ends at ", m.nnz());
  int64_t qblocks = 0;
  if (varlen) {
    ARIADNE_CHECK(m.seq_block_base.size() == size_t(num_seqs) + 1, "blocks: seq_block_base has ",
                  m.seq_block_base.size(), " entries, expected sequences + 1 = ", num_seqs + 1);
    // Device cu_seqlens cannot be read here: then the mask's own prefix sums give the count.
    qblocks = m.seq_block_base.back();
    if (cu_q_host != nullptr) {
      int64_t expected = 0;
      for (int32_t s = 0; s < num_seqs; ++s)
        expected += ceil_div(int64_t((*cu_q_host)[s + 1]) - (*cu_q_host)[s], m.block);
      ARIADNE_CHECK(qblocks == expected, "blocks: seq_block_base ends at ", qblocks,
                    " query blocks, cu_seqlens_q gives ", expected, " blocks of ", m.block, " tokens");
    }
  } else {
    qblocks = ceil_div(total_q, m.block);
  }
  ARIADNE_CHECK(m.rows() == qblocks * heads_q, "blocks: the mask has ", m.rows(), " rows, expected ",
                qblocks * heads_q, " (query blocks of ", m.block, " tokens x ", heads_q, " heads)");
}

// Device copies of host metadata (cu_seqlens, block lists, orders) for one call, made in the order
// of the caller's stream: cudaMallocAsync, cudaMemcpyAsync from the pageable host array (which
// returns once the bytes are staged, so the host array may go at once) and, when the call is
// over, cudaFreeAsync on the same stream, after the kernels that read them. Nothing here waits
// for the device or for other streams. Under stream capture (CUDA graphs) a pageable upload
// cannot be recorded, so host metadata is refused there: pass it as tensors on q's device.
class StreamUploads {
 public:
  StreamUploads() = default;
  StreamUploads(const StreamUploads&) = delete;
  StreamUploads& operator=(const StreamUploads&) = delete;
  ~StreamUploads() { release(); }

  void set_stream(void* stream) { stream_ = stream; }
  bool empty() const { return ptrs_.empty(); }

  const int32_t* add(const int32_t* host, size_t n, const char* name) {
#ifdef ARIADNE_WITH_CUDA
    auto st = static_cast<cudaStream_t>(stream_);
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    check(cudaStreamIsCapturing(st, &capture), "cudaStreamIsCapturing");
    ARIADNE_CHECK(capture == cudaStreamCaptureStatusNone, name,
                  ": a host array cannot be uploaded while the stream is captured (CUDA graphs); pass it as an "
                  "int32 tensor on q's device");
    const size_t bytes = (n > 0 ? n : 1) * sizeof(int32_t);
    void* ptr = nullptr;
    check(cudaMallocAsync(&ptr, bytes, st), "cudaMallocAsync");
    ptrs_.push_back(ptr);
    if (n > 0) check(cudaMemcpyAsync(ptr, host, n * sizeof(int32_t), cudaMemcpyHostToDevice, st), "cudaMemcpyAsync");
    return static_cast<const int32_t*>(ptr);
#else
    (void)host;
    (void)n;
    detail::fail(name, ": CUDA tensors need a build with the CUDA backend");
#endif
  }

 private:
#ifdef ARIADNE_WITH_CUDA
  static void check(cudaError_t e, const char* what) {
    ARIADNE_CHECK(e == cudaSuccess, what, ": ", cudaGetErrorString(e));
  }
#endif
  void release() noexcept {
#ifdef ARIADNE_WITH_CUDA
    for (void* ptr : ptrs_) cudaFreeAsync(ptr, static_cast<cudaStream_t>(stream_));
#endif
    ptrs_.clear();
  }
  void* stream_ = nullptr;
  std::vector<void*> ptrs_;
};

// Everything one attention call needs, kept alive for the duration of the call: the parameters,
// host copies of the metadata and, for CUDA tensors given host metadata, its device copies
// (released in stream order when the call is over).
struct Call {
  AttentionParams p;
  std::vector<int32_t> cu_q_host, cu_k_host;
  BlockMask csr_host;  // block arrays given as host arrays (block_row_ptr, ...)
  StreamUploads uploads;

  bool device() const { return p.q.device == Device::cuda; }

  // Points the pattern at `a` (same device as q) or at a device copy of it (host array, CUDA q).
  const int32_t* ints_for_device(const IntsIn& a, const char* name) {
    if (!device()) {
      ARIADNE_CHECK(on_host(a.device_type()), name, ": is on a device but q is on the host");
      return a.data();
    }
    if (!on_host(a.device_type())) return a.data();
    return uploads.add(a.data(), a.shape(0), name);
  }
  const int32_t* upload(const std::vector<int32_t>& v, const char* name) {
    if (!device()) return v.data();
    return uploads.add(v.data(), v.size(), name);
  }
};

// Block-sparse rows given as arrays (the torch op's form of a BlockMask): host arrays are copied
// into `c.csr_host` and checked as a BlockMask; device arrays (q's device) are used as they are,
// with the checks their shapes allow.
struct BlockArrays {
  int32_t block = 0, heads = 0;
  std::optional<IntsIn> seq_block_base, row_ptr, col_idx;
  bool given() const { return row_ptr.has_value() || col_idx.has_value(); }
};

void build(Call& c, const AnyIn& q, const AnyIn& k, const AnyIn& v, const AnyOut& out, const std::optional<F32Out2>& lse,
           const Pattern& pattern, const std::optional<IntsIn>& cu_q, const std::optional<IntsIn>& cu_k,
           const BlockMask* blocks, const std::optional<AnyIn>& sink, const std::string& sink_mode, float scale,
           uintptr_t stream, bool bf16_bits, const std::optional<F32Out2>& entropy,
           const std::optional<F32Out2>& distance, const std::optional<F32Out2>& received,
           const std::optional<F32In2>& coords_q, const std::optional<F32In2>& coords_k,
           const std::optional<IntsIn>& order = std::nullopt, const BlockArrays& csr = {}) {
  AttentionParams& p = c.p;
  p.q = as_view(q, "q", bf16_bits);
  p.k = as_view(k, "k", bf16_bits);
  p.v = as_view(v, "v", bf16_bits);
  p.out = as_view(out, "out", bf16_bits);
  require_rank(p.q, "q", 3);
  if (lse) p.lse = as_view(*lse, "lse");
  if (entropy) p.entropy = as_view(*entropy, "entropy");
  if (distance) p.distance = as_view(*distance, "distance");
  if (received) p.received = as_view(*received, "received");
  if (coords_q) p.coords_q = as_view(*coords_q, "coords_q");
  if (coords_k) p.coords_k = as_view(*coords_k, "coords_k");
  p.scale = scale;
  p.stream = reinterpret_cast<void*>(stream);
  c.uploads.set_stream(p.stream);
  p.sink_mode = parse_sink_mode(sink_mode);
  if (sink) p.sink = as_view(*sink, "sink");
  ARIADNE_CHECK(p.sink_mode == SinkMode::none || sink.has_value(), "sink: sink_mode is '", sink_mode,
                "' but no sink was given");
  ARIADNE_CHECK(p.sink_mode != SinkMode::none || !sink.has_value(),
                "sink: given, but sink_mode is 'none' (use 'denominator' or 'key0')");

  // The pattern's pointers are never set from Python: the bound Pattern carries only the window
  // and chunk fields; sequences and blocks come from the arguments here.
  Pattern pat = pattern;
  pat.num_seqs = 1;
  pat.cu_seqlens_q = pat.cu_seqlens_k = nullptr;
  pat.blocks = BlockSparseView{};
  ARIADNE_CHECK(!cu_k || cu_q, "cu_seqlens_k: given without cu_seqlens_q");
  bool host_cu = true;
  if (cu_q) {
    ARIADNE_CHECK(cu_q->shape(0) >= 2, "cu_seqlens_q: has ", cu_q->shape(0),
                  " entries, expected sequences + 1 >= 2");
    pat.num_seqs = int32_t(cu_q->shape(0) - 1);
    host_cu = on_host(cu_q->device_type());
    if (host_cu) c.cu_q_host = host_ints(*cu_q);
    pat.cu_seqlens_q = c.ints_for_device(*cu_q, "cu_seqlens_q");
    if (cu_k) {
      ARIADNE_CHECK(cu_k->shape(0) == cu_q->shape(0), "cu_seqlens_k: has ", cu_k->shape(0),
                    " entries, expected the same as cu_seqlens_q (", cu_q->shape(0), ")");
      pat.cu_seqlens_k = c.ints_for_device(*cu_k, "cu_seqlens_k");
    }
  }
  bool host_blocks = true;
  if (csr.given()) {
    ARIADNE_CHECK(blocks == nullptr, "blocks: given both as a BlockMask and as arrays");
    ARIADNE_CHECK(csr.row_ptr && csr.col_idx, "block_row_ptr, block_col_idx: both are needed");
    ARIADNE_CHECK(!cu_q || csr.seq_block_base, "block_seq_base: needed with cu_seqlens_q");
    host_blocks = on_host(csr.row_ptr->device_type());
    for (const std::optional<IntsIn>* a : {&csr.seq_block_base, &csr.col_idx})
      ARIADNE_CHECK(!*a || on_host((*a)->device_type()) == host_blocks,
                    "block arrays: all on the host or all on q's device");
    if (host_blocks) {
      c.csr_host = BlockMask{csr.block, csr.heads,
                             csr.seq_block_base ? host_ints(*csr.seq_block_base) : std::vector<int32_t>{},
                             host_ints(*csr.row_ptr), host_ints(*csr.col_idx)};
      blocks = &c.csr_host;
    } else {
      ARIADNE_CHECK(c.device(), "block arrays: on a device but q is on the host");
      ARIADNE_CHECK(csr.block > 0, "block_size: is ", csr.block, ", expected > 0");
      ARIADNE_CHECK(csr.heads == int(p.q.shape[1]), "block_heads: the mask has rows for ", csr.heads,
                    " heads, q has ", p.q.shape[1]);
      ARIADNE_CHECK(!csr.seq_block_base || csr.seq_block_base->shape(0) == size_t(pat.num_seqs) + 1,
                    "block_seq_base: has ", csr.seq_block_base ? csr.seq_block_base->shape(0) : 0,
                    " entries, expected sequences + 1 = ", pat.num_seqs + 1);
      ARIADNE_CHECK(cu_q || csr.row_ptr->shape(0) == size_t(ceil_div(p.q.shape[0], csr.block) * csr.heads) + 1,
                    "block_row_ptr: has ", csr.row_ptr->shape(0), " entries, expected query blocks x heads + 1 = ",
                    ceil_div(p.q.shape[0], csr.block) * csr.heads + 1);
      BlockSparseView b;
      b.block = csr.block;
      b.heads = csr.heads;
      b.seq_block_base = csr.seq_block_base ? csr.seq_block_base->data() : nullptr;
      b.row_ptr = csr.row_ptr->data();
      b.col_idx = csr.col_idx->data();
      pat.blocks = b;
      p.blocks_nnz = int64_t(csr.col_idx->shape(0));
    }
  }
  if (blocks) {
    check_mask_fits(*blocks, cu_q.has_value(), pat.num_seqs, cu_q && host_cu ? &c.cu_q_host : nullptr,
                    p.q.shape[0], int(p.q.shape[1]));
    BlockSparseView b;
    b.block = blocks->block;
    b.heads = blocks->heads;
    b.seq_block_base = blocks->seq_block_base.empty() ? nullptr : c.upload(blocks->seq_block_base, "block_seq_base");
    b.row_ptr = c.upload(blocks->row_ptr, "block_row_ptr");
    b.col_idx = c.upload(blocks->col_idx, "block_col_idx");
    pat.blocks = b;
    p.blocks_nnz = int64_t(blocks->col_idx.size());  // the CUDA backend's schedule hint
  }
  p.pattern = pat;
  if (order) {
    ARIADNE_CHECK(int64_t(order->shape(0)) == p.q.shape[0], "order: has ", order->shape(0),
                  " entries, expected total_q = ", p.q.shape[0]);
    // validate() checks host orders only for host tensors: a host order for CUDA tensors is checked
    // here, before its device copy is used.
    if (c.device() && on_host(order->device_type())) validate_order(host_ints(*order).data(), p.q.shape[0]);
    p.order = c.ints_for_device(*order, "order");
  }
  // validate() can read the pattern's arrays only on the host. When CUDA tensors come with host
  // metadata, the host copies are checked here, before they are used on the device.
  if (c.device() && host_cu && (cu_q || blocks)) {
    Pattern host = pattern;
    host.blocks = BlockSparseView{};
    host.num_seqs = pat.num_seqs;
    host.cu_seqlens_q = cu_q ? c.cu_q_host.data() : nullptr;
    if (cu_k) {
      ARIADNE_CHECK(on_host(cu_k->device_type()), "cu_seqlens_k: on the device while cu_seqlens_q is on the host");
      c.cu_k_host = host_ints(*cu_k);
      host.cu_seqlens_k = c.cu_k_host.data();
    }
    if (blocks) host.blocks = blocks->view();
    validate_pattern(host, p.q.shape[0], p.k.rank >= 1 ? p.k.shape[0] : 0, int(p.q.shape[1]));
  }
  // The uploads are ordered before the kernels by the stream itself: no synchronization here.
}

constexpr const char* kAttentionDoc = R"doc(Attention into caller-provided outputs (the package's attention() wraps this).

q: [total_q, heads_q, head_dim]; k, v: [total_k, heads_kv, head_dim]; float32, bfloat16 or float16,
   last dim contiguous (other strides free); all on one device (cpu or cuda).
out: [total_q, heads_q, head_dim], dtype of q or float32, written in place (no copy).
lse: None or float32 [heads_q, total_q], C-contiguous, written in place (natural log, includes the sink).
cu_seqlens_q / cu_seqlens_k: None or int32 [sequences + 1] packed-batch offsets (host or q's device).
blocks: None or a BlockMask (CSR rows per sequence, head and query block).
sink: None or float32 [heads_q] (float32 or float64 with float64 q, which runs on the reference
backend), logits in the units of the scaled scores; sink_mode 'none',
   'denominator' (GPT-OSS/FA4/cuDNN) or 'key0' (MiMo-V2.5 reference).
scale: 0 selects 1/sqrt(head_dim). stream: cudaStream_t as an int (0 = default stream).
bf16_bits: read uint16 q/k/v/out as bfloat16 bits (ml_dtypes numpy arrays).
entropy, distance: None or float32 [heads_q, total_q]; received: None or float32 [heads_q, total_k];
coords_q / coords_k: float32 [tokens, 2] (row, col), needed by distance.
order: None or int32 [total_q] permutation (host or q's device; total_q == total_k): logical row i of
   the pattern is stored at row order[i] of q, k, v, out, lse and the diagnostics (fused on CUDA).
block_size, block_heads, block_seq_base, block_row_ptr, block_col_idx: a BlockMask's fields as int32
   arrays (host or q's device), instead of `blocks`; block_seq_base is needed with cu_seqlens_q.
Host metadata for CUDA tensors is uploaded on `stream` (cudaMallocAsync / cudaMemcpyAsync, freed
   with cudaFreeAsync after the kernels): no device-wide synchronization; refused under capture.
The GIL is released while the kernel runs. Errors raise ariadne.Error (a ValueError).)doc";

}  // namespace

void bind_attention(nb::module_& m) {
  nb::class_<Pattern>(m, "Pattern",
                      "Which keys each query sees (pattern.hpp): a window [p - left, p + right] around the query's\n"
                      "key position p (-1 = unbounded side) and/or chunks of `chunk` positions. Sequences\n"
                      "(cu_seqlens) and block masks are given to attention() next to the pattern.")
      .def(nb::init<>(), "Full attention.")
      .def_static("full", &Pattern::full, "Every key of the sequence.")
      .def_static("causal", &Pattern::causal, "Keys at or before the query's position (bottom-right aligned).")
      .def_static("window", &Pattern::window, "left"_a, "right"_a,
                  "Keys p - left ... p + right (-1 = unbounded side); window(64, 64) is Ariadne's SWA.")
      .def_static("chunked", &Pattern::chunked, "chunk"_a,
                  "Block-diagonal: a query sees the keys of its own chunk of `chunk` positions.")
      .def_rw("window_left", &Pattern::window_left, "Keys before the query position it may see (-1: all).")
      .def_rw("window_right", &Pattern::window_right, "Keys after the query position it may see (-1: all).")
      .def_rw("chunk", &Pattern::chunk, "Chunk size in positions (0: no chunks).")
      .def("is_causal", &Pattern::is_causal)
      .def("__eq__", [](const Pattern& a, const Pattern& b) {
        return a.window_left == b.window_left && a.window_right == b.window_right && a.chunk == b.chunk;
      })
      .def("__repr__", [](const Pattern& p) { return "Pattern(" + describe(p) + ")"; });

  nb::class_<BlockMask>(m, "BlockMask",
                        "Block-sparse mask in CSR form (pattern.hpp). Rows are (sequence, head, query block):\n"
                        "row(s, h, m) = seq_block_base[s] * heads + h * nqb(s) + m; each row lists the visible key\n"
                        "blocks (local to the sequence) in increasing order.")
      .def(
          "__init__",
          [](BlockMask* self, int32_t block, int32_t heads, const IntsIn& seq_block_base, const IntsIn& row_ptr,
             const IntsIn& col_idx) {
            for (auto [a, name] : {std::pair{&seq_block_base, "seq_block_base"}, {&row_ptr, "row_ptr"},
                                   {&col_idx, "col_idx"}})
              ARIADNE_CHECK(on_host(a->device_type()), "BlockMask: ", name, " must be a host array");
            ARIADNE_CHECK(block > 0 && heads > 0, "BlockMask: block ", block, " and heads ", heads,
                          " must be positive");
            ARIADNE_CHECK(row_ptr.shape(0) >= 1, "BlockMask: row_ptr is empty, expected rows + 1 entries");
            new (self) BlockMask{block, heads, host_ints(seq_block_base), host_ints(row_ptr), host_ints(col_idx)};
          },
          "block"_a, "heads"_a, "seq_block_base"_a, "row_ptr"_a, "col_idx"_a,
          "From CSR arrays (int32, host): seq_block_base [sequences + 1], row_ptr [rows + 1], col_idx [nnz].\n"
          "Checked against q and cu_seqlens when used.")
      .def_static("from_lists", &BlockMask::from_lists, "block"_a, "heads"_a, "q_lengths"_a, "rows"_a,
                  "From per-row key-block lists; q_lengths: query tokens of each sequence; rows in the order\n"
                  "(sequence, head, query block).")
      .def_static(
          "all_visible",
          [](const Pattern& dense, int32_t block, int32_t heads, int64_t total_q, int64_t total_k,
             std::optional<std::vector<int32_t>> cu_q, std::optional<std::vector<int32_t>> cu_k) {
            Pattern p = dense;
            if (cu_q) {
              ARIADNE_CHECK(cu_q->size() >= 2, "cu_seqlens_q: expected sequences + 1 >= 2 entries");
              ARIADNE_CHECK(!cu_k || cu_k->size() == cu_q->size(), "cu_seqlens_k: expected ", cu_q->size(), " entries");
              p = p.with_varlen(int32_t(cu_q->size() - 1), cu_q->data(), cu_k ? cu_k->data() : nullptr);
            }
            validate_pattern(p, total_q, total_k, heads);
            return BlockMask::all_visible(p, block, heads, total_q, total_k);
          },
          "pattern"_a, "block"_a, "heads"_a, "total_q"_a, "total_k"_a, "cu_seqlens_q"_a = nb::none(),
          "cu_seqlens_k"_a = nb::none(), "Every key block the dense pattern lets each query block touch.")
      .def_static(
          "random",
          [](const Pattern& dense, int32_t block, int32_t heads, int64_t total_q, int64_t total_k, double density,
             uint64_t seed, bool keep_diagonal, std::optional<std::vector<int32_t>> cu_q,
             std::optional<std::vector<int32_t>> cu_k) {
            Pattern p = dense;
            if (cu_q) {
              ARIADNE_CHECK(cu_q->size() >= 2, "cu_seqlens_q: expected sequences + 1 >= 2 entries");
              ARIADNE_CHECK(!cu_k || cu_k->size() == cu_q->size(), "cu_seqlens_k: expected ", cu_q->size(), " entries");
              p = p.with_varlen(int32_t(cu_q->size() - 1), cu_q->data(), cu_k ? cu_k->data() : nullptr);
            }
            validate_pattern(p, total_q, total_k, heads);
            return BlockMask::random(p, block, heads, total_q, total_k, density, seed, keep_diagonal);
          },
          "pattern"_a, "block"_a, "heads"_a, "total_q"_a, "total_k"_a, "density"_a, "seed"_a,
          "keep_diagonal"_a = true, "cu_seqlens_q"_a = nb::none(), "cu_seqlens_k"_a = nb::none(),
          "Seeded random subset (share `density`) of the blocks the dense pattern lets each query block touch.")
      .def(
          "to_dense",
          [](const BlockMask& b, int32_t seq, int32_t head, int64_t lq, int64_t lk) {
            ARIADNE_CHECK(b.block > 0, "BlockMask.to_dense: block is ", b.block);
            ARIADNE_CHECK(head >= 0 && head < b.heads, "BlockMask.to_dense: head ", head, " is out of range [0, ",
                          b.heads, ")");
            ARIADNE_CHECK(seq >= 0 && size_t(seq) + 1 < b.seq_block_base.size(), "BlockMask.to_dense: sequence ",
                          seq, " is out of range [0, ", int64_t(b.seq_block_base.size()) - 1, ")");
            const int64_t nqb = ceil_div(lq, b.block), nkb = ceil_div(lk, b.block);
            ARIADNE_CHECK(nqb == b.seq_block_base[size_t(seq) + 1] - b.seq_block_base[size_t(seq)],
                          "BlockMask.to_dense: lq = ", lq, " gives ", nqb, " query blocks, sequence ", seq, " has ",
                          b.seq_block_base[size_t(seq) + 1] - b.seq_block_base[size_t(seq)]);
            return to_numpy(b.to_dense(seq, head, lq, lk), {size_t(nqb), size_t(nkb)});
          },
          "seq"_a, "head"_a, "lq"_a, "lk"_a,
          "0/1 uint8 matrix [ceil(lq / block), ceil(lk / block)] of one (sequence, head).")
      .def_ro("block", &BlockMask::block, "Tokens per block (query and key blocks alike).")
      .def_ro("heads", &BlockMask::heads, "Query heads the mask has rows for.")
      .def_prop_ro("seq_block_base", [](const BlockMask& b) { return view_numpy(b.seq_block_base, nb::find(&b)); },
                   "int32 [sequences + 1]: prefix sum of query blocks per sequence (read-only view).")
      .def_prop_ro("row_ptr", [](const BlockMask& b) { return view_numpy(b.row_ptr, nb::find(&b)); },
                   "int32 [rows + 1] (read-only view).")
      .def_prop_ro("col_idx", [](const BlockMask& b) { return view_numpy(b.col_idx, nb::find(&b)); },
                   "int32 [nnz] (read-only view).")
      .def_prop_ro("rows", &BlockMask::rows)
      .def_prop_ro("nnz", &BlockMask::nnz)
      .def("__repr__", [](const BlockMask& b) {
        return "BlockMask(block=" + std::to_string(b.block) + ", heads=" + std::to_string(b.heads) +
               ", rows=" + std::to_string(b.rows()) + ", nnz=" + std::to_string(b.nnz()) + ")";
      });

  m.def(
      "attention_into",
      [](const AnyIn& q, const AnyIn& k, const AnyIn& v, const AnyOut& out, const std::optional<F32Out2>& lse,
         const Pattern& pattern, const std::optional<IntsIn>& cu_q, const std::optional<IntsIn>& cu_k,
         const BlockMask* blocks, const std::optional<AnyIn>& sink, const std::string& sink_mode, float scale,
         const std::string& backend, uintptr_t stream, bool bf16_bits, const std::optional<F32Out2>& entropy,
         const std::optional<F32Out2>& distance, const std::optional<F32Out2>& received,
         const std::optional<F32In2>& coords_q, const std::optional<F32In2>& coords_k,
         const std::optional<IntsIn>& order, int32_t block_size, int32_t block_heads,
         const std::optional<IntsIn>& block_seq_base, const std::optional<IntsIn>& block_row_ptr,
         const std::optional<IntsIn>& block_col_idx) {
        Call c;
        const BlockArrays csr{block_size, block_heads, block_seq_base, block_row_ptr, block_col_idx};
        build(c, q, k, v, out, lse, pattern, cu_q, cu_k, blocks, sink, sink_mode, scale, stream, bf16_bits, entropy,
              distance, received, coords_q, coords_k, order, csr);
        const Backend b = parse_backend(backend);
        {
          nb::gil_scoped_release unlocked;
          attention(c.p, b);
          // Device copies of host metadata are freed when `c` goes, in the order of the call's
          // stream (after the kernels that read them); nothing waits here.
        }
      },
      nb::sig("def attention_into("
        "q: " ARIADNE_SIG_ATTN_QKV ", "
        "k: " ARIADNE_SIG_ATTN_QKV ", "
        "v: " ARIADNE_SIG_ATTN_QKV ", "
        "out: " ARIADNE_SIG_ATTN_OUT ", "
        "lse: " ARIADNE_SIG_F32_OUT2 " | None = None, "
        "pattern: Pattern = ..., "
        "cu_seqlens_q: " ARIADNE_SIG_INTS " | None = None, "
        "cu_seqlens_k: " ARIADNE_SIG_INTS " | None = None, "
        "blocks: BlockMask | None = None, "
        "sink: " ARIADNE_SIG_SINK_IN " | None = None, "
        "sink_mode: str = 'none', "
        "scale: float = 0.0, "
        "backend: str = 'auto', "
        "stream: int = 0, "
        "bf16_bits: bool = False, "
        "entropy: " ARIADNE_SIG_F32_OUT2 " | None = None, "
        "distance: " ARIADNE_SIG_F32_OUT2 " | None = None, "
        "received: " ARIADNE_SIG_F32_OUT2 " | None = None, "
        "coords_q: " ARIADNE_SIG_F32_IN2 " | None = None, "
        "coords_k: " ARIADNE_SIG_F32_IN2 " | None = None, "
        "order: " ARIADNE_SIG_INTS " | None = None, "
        "block_size: int = 0, "
        "block_heads: int = 0, "
        "block_seq_base: " ARIADNE_SIG_INTS " | None = None, "
        "block_row_ptr: " ARIADNE_SIG_INTS " | None = None, "
        "block_col_idx: " ARIADNE_SIG_INTS " | None = None"
        ") -> None"),
      "q"_a.noconvert(), "k"_a.noconvert(), "v"_a.noconvert(), "out"_a.noconvert(), "lse"_a.noconvert() = nb::none(),
      "pattern"_a = Pattern::full(), "cu_seqlens_q"_a = nb::none(), "cu_seqlens_k"_a = nb::none(),
      "blocks"_a = nb::none(), "sink"_a = nb::none(), "sink_mode"_a = "none", "scale"_a = 0.f,
      "backend"_a = "auto", "stream"_a = 0, "bf16_bits"_a = false, "entropy"_a.noconvert() = nb::none(),
      "distance"_a.noconvert() = nb::none(), "received"_a.noconvert() = nb::none(), "coords_q"_a = nb::none(),
      "coords_k"_a = nb::none(), "order"_a = nb::none(), "block_size"_a = 0, "block_heads"_a = 0,
      "block_seq_base"_a = nb::none(), "block_row_ptr"_a = nb::none(), "block_col_idx"_a = nb::none(), kAttentionDoc);

  m.def(
      "attention_backward_into",
      [](const AnyIn& q, const AnyIn& k, const AnyIn& v, const AnyIn& out, const F32Out2& lse, const AnyIn& dout,
         const AnyOut& dq, const AnyOut& dk, const AnyOut& dv, const std::optional<AnyOut>& dsink,
         const Pattern& pattern, const std::optional<IntsIn>& cu_q, const std::optional<IntsIn>& cu_k,
         const BlockMask* blocks, const std::optional<AnyIn>& sink, const std::string& sink_mode, float scale,
         const std::string& backend, uintptr_t stream, bool bf16_bits, const std::optional<IntsIn>& order,
         int32_t block_size, int32_t block_heads, const std::optional<IntsIn>& block_seq_base,
         const std::optional<IntsIn>& block_row_ptr, const std::optional<IntsIn>& block_col_idx, bool deterministic) {
        Call c;
        const BlockArrays csr{block_size, block_heads, block_seq_base, block_row_ptr, block_col_idx};
        // out is read here, not written: build() takes it through the writable view type only for
        // its shape checks, so the read-only array is viewed the same way.
        build(c, q, k, v, AnyOut(out), lse, pattern, cu_q, cu_k, blocks, sink, sink_mode, scale, stream,
              bf16_bits, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, order, csr);
        AttentionGrads g;
        g.dout = as_view(dout, "dout", bf16_bits);
        g.dq = as_view(dq, "dq", bf16_bits);
        g.dk = as_view(dk, "dk", bf16_bits);
        g.dv = as_view(dv, "dv", bf16_bits);
        if (dsink) g.dsink = as_view(*dsink, "dsink");
        BackwardOptions options;
        options.backend = parse_backend(backend);
        options.deterministic = deterministic;
        {
          nb::gil_scoped_release unlocked;
          attention_backward(c.p, g, options);  // plans cached: no workspace allocated per call
        }
      },
      nb::sig("def attention_backward_into("
        "q: " ARIADNE_SIG_ATTN_QKV ", "
        "k: " ARIADNE_SIG_ATTN_QKV ", "
        "v: " ARIADNE_SIG_ATTN_QKV ", "
        "out: " ARIADNE_SIG_ATTN_QKV ", "
        "lse: " ARIADNE_SIG_F32_OUT2 ", "
        "dout: " ARIADNE_SIG_ATTN_QKV ", "
        "dq: " ARIADNE_SIG_ATTN_OUT ", "
        "dk: " ARIADNE_SIG_ATTN_OUT ", "
        "dv: " ARIADNE_SIG_ATTN_OUT ", "
        "dsink: " ARIADNE_SIG_SINK_OUT " | None = None, "
        "pattern: Pattern = ..., "
        "cu_seqlens_q: " ARIADNE_SIG_INTS " | None = None, "
        "cu_seqlens_k: " ARIADNE_SIG_INTS " | None = None, "
        "blocks: BlockMask | None = None, "
        "sink: " ARIADNE_SIG_SINK_IN " | None = None, "
        "sink_mode: str = 'none', "
        "scale: float = 0.0, "
        "backend: str = 'auto', "
        "stream: int = 0, "
        "bf16_bits: bool = False, "
        "order: " ARIADNE_SIG_INTS " | None = None, "
        "block_size: int = 0, "
        "block_heads: int = 0, "
        "block_seq_base: " ARIADNE_SIG_INTS " | None = None, "
        "block_row_ptr: " ARIADNE_SIG_INTS " | None = None, "
        "block_col_idx: " ARIADNE_SIG_INTS " | None = None, "
        "deterministic: bool = False"
        ") -> None"),
      "q"_a.noconvert(), "k"_a.noconvert(), "v"_a.noconvert(), "out"_a.noconvert(), "lse"_a.noconvert(),
      "dout"_a.noconvert(), "dq"_a.noconvert(), "dk"_a.noconvert(), "dv"_a.noconvert(),
      "dsink"_a.noconvert() = nb::none(), "pattern"_a = Pattern::full(), "cu_seqlens_q"_a = nb::none(),
      "cu_seqlens_k"_a = nb::none(), "blocks"_a = nb::none(), "sink"_a = nb::none(), "sink_mode"_a = "none",
      "scale"_a = 0.f, "backend"_a = "auto", "stream"_a = 0, "bf16_bits"_a = false, "order"_a = nb::none(),
      "block_size"_a = 0, "block_heads"_a = 0, "block_seq_base"_a = nb::none(), "block_row_ptr"_a = nb::none(),
      "block_col_idx"_a = nb::none(), "deterministic"_a = false,
      "Gradients of attention (ariadne/attention_backward.hpp) into caller-provided dq, dk, dv (dtype of q or\n"
      "float32) and dsink ([heads_q] in the sink's dtype, with a sink). out and lse are the forward's results; dout is\n"
      "dL/d out (dtype of q, or float32 on the host backends). Every other argument as for attention_into.\n"
      "deterministic: bitwise-reproducible dq on CUDA (the host backends always are).");

  m.def(
      "backend_supports",
      [](const std::string& backend, const AnyIn& q, const AnyIn& k, const AnyIn& v, const AnyOut& out,
         const std::optional<F32Out2>& lse, const Pattern& pattern, const std::optional<IntsIn>& cu_q,
         const std::optional<IntsIn>& cu_k, const BlockMask* blocks, const std::optional<AnyIn>& sink,
         const std::string& sink_mode, bool bf16_bits) {
        Call c;
        build(c, q, k, v, out, lse, pattern, cu_q, cu_k, blocks, sink, sink_mode, 0.f, 0, bf16_bits, std::nullopt,
              std::nullopt, std::nullopt, std::nullopt, std::nullopt);
        std::string why;
        const bool ok = ariadne::backend_supports(parse_backend(backend), c.p, &why);
        return std::pair<bool, std::string>(ok, why);
      },
      nb::sig("def backend_supports("
        "backend: str, "
        "q: " ARIADNE_SIG_ATTN_QKV ", "
        "k: " ARIADNE_SIG_ATTN_QKV ", "
        "v: " ARIADNE_SIG_ATTN_QKV ", "
        "out: " ARIADNE_SIG_ATTN_OUT ", "
        "lse: " ARIADNE_SIG_F32_OUT2 " | None = None, "
        "pattern: Pattern = ..., "
        "cu_seqlens_q: " ARIADNE_SIG_INTS " | None = None, "
        "cu_seqlens_k: " ARIADNE_SIG_INTS " | None = None, "
        "blocks: BlockMask | None = None, "
        "sink: " ARIADNE_SIG_SINK_IN " | None = None, "
        "sink_mode: str = 'none', "
        "bf16_bits: bool = False"
        ") -> tuple[bool, str]"),
      "backend"_a, "q"_a.noconvert(), "k"_a.noconvert(), "v"_a.noconvert(), "out"_a.noconvert(),
      "lse"_a.noconvert() = nb::none(), "pattern"_a = Pattern::full(), "cu_seqlens_q"_a = nb::none(),
      "cu_seqlens_k"_a = nb::none(), "blocks"_a = nb::none(), "sink"_a = nb::none(), "sink_mode"_a = "none",
      "bf16_bits"_a = false,
      "(supported, why): whether `backend` ('auto', 'reference', 'cpu', 'cuda') can run this call; `why`\n"
      "names the missing feature when it cannot. Arguments as for attention_into.");

  m.def("cuda_available", &cuda_available, "Whether this build has the CUDA backend and a GPU is visible.");
  m.def("cpu_threads", &cpu_threads, "Worker threads of the CPU backend (ARIADNE_THREADS overrides the default).");
  m.def("set_cpu_threads", &set_cpu_threads, "n"_a, "Sets the CPU backend's worker count (0: hardware threads).");
}

}  // namespace ariadne::py
