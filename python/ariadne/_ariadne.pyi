"""
ariadne: cheap softmax attention for multimodal LLMs (native bindings; use the ariadne package)
"""

from collections.abc import Sequence
from typing import Annotated

import numpy
from numpy.typing import NDArray


class Error(ValueError):
    pass

class Pattern:
    """
    Which keys each query sees (pattern.hpp): a window [p - left, p + right] around the query's
    key position p (-1 = unbounded side) and/or chunks of `chunk` positions. Sequences
    (cu_seqlens) and block masks are given to attention() next to the pattern.
    """

    def __init__(self) -> None:
        """Full attention."""

    @staticmethod
    def full() -> Pattern:
        """Every key of the sequence."""

    @staticmethod
    def causal() -> Pattern:
        """Keys at or before the query's position (bottom-right aligned)."""

    @staticmethod
    def window(left: int, right: int) -> Pattern:
        """
        Keys p - left ... p + right (-1 = unbounded side); window(64, 64) is Ariadne's SWA.
        """

    @staticmethod
    def chunked(chunk: int) -> Pattern:
        """
        Block-diagonal: a query sees the keys of its own chunk of `chunk` positions.
        """

    @property
    def window_left(self) -> int:
        """Keys before the query position it may see (-1: all)."""

    @window_left.setter
    def window_left(self, arg: int, /) -> None: ...

    @property
    def window_right(self) -> int:
        """Keys after the query position it may see (-1: all)."""

    @window_right.setter
    def window_right(self, arg: int, /) -> None: ...

    @property
    def chunk(self) -> int:
        """Chunk size in positions (0: no chunks)."""

    @chunk.setter
    def chunk(self, arg: int, /) -> None: ...

    def is_causal(self) -> bool: ...

    def __eq__(self, arg: Pattern, /) -> bool: ...

    def __repr__(self) -> str: ...

class BlockMask:
    """
    Block-sparse mask in CSR form (pattern.hpp). Rows are (sequence, head, query block):
    row(s, h, m) = seq_block_base[s] * heads + h * nqb(s) + m; each row lists the visible key
    blocks (local to the sequence) in increasing order.
    """

    def __init__(self, block: int, heads: int, seq_block_base: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', writable=False)], row_ptr: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', writable=False)], col_idx: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', writable=False)]) -> None:
        """
        From CSR arrays (int32, host): seq_block_base [sequences + 1], row_ptr [rows + 1], col_idx [nnz].
        Checked against q and cu_seqlens when used.
        """

    @staticmethod
    def from_lists(block: int, heads: int, q_lengths: Sequence[int], rows: Sequence[Sequence[int]]) -> BlockMask:
        """
        From per-row key-block lists; q_lengths: query tokens of each sequence; rows in the order
        (sequence, head, query block).
        """

    @staticmethod
    def all_visible(pattern: Pattern, block: int, heads: int, total_q: int, total_k: int, cu_seqlens_q: Sequence[int] | None = None, cu_seqlens_k: Sequence[int] | None = None) -> BlockMask:
        """Every key block the dense pattern lets each query block touch."""

    @staticmethod
    def random(pattern: Pattern, block: int, heads: int, total_q: int, total_k: int, density: float, seed: int, keep_diagonal: bool = True, cu_seqlens_q: Sequence[int] | None = None, cu_seqlens_k: Sequence[int] | None = None) -> BlockMask:
        """
        Seeded random subset (share `density`) of the blocks the dense pattern lets each query block touch.
        """

    def to_dense(self, seq: int, head: int, lq: int, lk: int) -> NDArray[numpy.uint8]:
        """
        0/1 uint8 matrix [ceil(lq / block), ceil(lk / block)] of one (sequence, head).
        """

    @property
    def block(self) -> int:
        """Tokens per block (query and key blocks alike)."""

    @property
    def heads(self) -> int:
        """Query heads the mask has rows for."""

    @property
    def seq_block_base(self) -> Annotated[NDArray[numpy.int32], dict(writable=False)]:
        """
        int32 [sequences + 1]: prefix sum of query blocks per sequence (read-only view).
        """

    @property
    def row_ptr(self) -> Annotated[NDArray[numpy.int32], dict(writable=False)]:
        """int32 [rows + 1] (read-only view)."""

    @property
    def col_idx(self) -> Annotated[NDArray[numpy.int32], dict(writable=False)]:
        """int32 [nnz] (read-only view)."""

    @property
    def rows(self) -> int: ...

    @property
    def nnz(self) -> int: ...

    def __repr__(self) -> str: ...

def attention_into(q: Annotated[NDArray[numpy.float32 | numpy.float16 | numpy.uint16 | numpy.float64], dict(shape=(None, None, None), writable=False)], k: Annotated[NDArray[numpy.float32 | numpy.float16 | numpy.uint16 | numpy.float64], dict(shape=(None, None, None), writable=False)], v: Annotated[NDArray[numpy.float32 | numpy.float16 | numpy.uint16 | numpy.float64], dict(shape=(None, None, None), writable=False)], out: Annotated[NDArray[numpy.float32 | numpy.float16 | numpy.uint16 | numpy.float64], dict(shape=(None, None, None))], lse: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C')] | None = None, pattern: Pattern = ..., cu_seqlens_q: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', writable=False)] | None = None, cu_seqlens_k: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', writable=False)] | None = None, blocks: BlockMask | None = None, sink: Annotated[NDArray[numpy.float32 | numpy.float64], dict(shape=(None,), writable=False)] | None = None, sink_mode: str = 'none', scale: float = 0.0, backend: str = 'auto', stream: int = 0, bf16_bits: bool = False, entropy: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C')] | None = None, distance: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C')] | None = None, received: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C')] | None = None, coords_q: Annotated[NDArray[numpy.float32], dict(shape=(None, None), writable=False)] | None = None, coords_k: Annotated[NDArray[numpy.float32], dict(shape=(None, None), writable=False)] | None = None, order: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', writable=False)] | None = None, block_size: int = 0, block_heads: int = 0, block_seq_base: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', writable=False)] | None = None, block_row_ptr: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', writable=False)] | None = None, block_col_idx: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', writable=False)] | None = None) -> None:
    """
    Attention into caller-provided outputs (the package's attention() wraps this).

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
    The GIL is released while the kernel runs. Errors raise ariadne.Error (a ValueError).
    """

def attention_backward_into(q: Annotated[NDArray[numpy.float32 | numpy.float16 | numpy.uint16 | numpy.float64], dict(shape=(None, None, None), writable=False)], k: Annotated[NDArray[numpy.float32 | numpy.float16 | numpy.uint16 | numpy.float64], dict(shape=(None, None, None), writable=False)], v: Annotated[NDArray[numpy.float32 | numpy.float16 | numpy.uint16 | numpy.float64], dict(shape=(None, None, None), writable=False)], out: Annotated[NDArray[numpy.float32 | numpy.float16 | numpy.uint16 | numpy.float64], dict(shape=(None, None, None), writable=False)], lse: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C')], dout: Annotated[NDArray[numpy.float32 | numpy.float16 | numpy.uint16 | numpy.float64], dict(shape=(None, None, None), writable=False)], dq: Annotated[NDArray[numpy.float32 | numpy.float16 | numpy.uint16 | numpy.float64], dict(shape=(None, None, None))], dk: Annotated[NDArray[numpy.float32 | numpy.float16 | numpy.uint16 | numpy.float64], dict(shape=(None, None, None))], dv: Annotated[NDArray[numpy.float32 | numpy.float16 | numpy.uint16 | numpy.float64], dict(shape=(None, None, None))], dsink: Annotated[NDArray[numpy.float32 | numpy.float64], dict(shape=(None,))] | None = None, pattern: Pattern = ..., cu_seqlens_q: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', writable=False)] | None = None, cu_seqlens_k: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', writable=False)] | None = None, blocks: BlockMask | None = None, sink: Annotated[NDArray[numpy.float32 | numpy.float64], dict(shape=(None,), writable=False)] | None = None, sink_mode: str = 'none', scale: float = 0.0, backend: str = 'auto', stream: int = 0, bf16_bits: bool = False, order: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', writable=False)] | None = None, block_size: int = 0, block_heads: int = 0, block_seq_base: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', writable=False)] | None = None, block_row_ptr: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', writable=False)] | None = None, block_col_idx: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', writable=False)] | None = None, deterministic: bool = False) -> None:
    """
    Gradients of attention (ariadne/attention_backward.hpp) into caller-provided dq, dk, dv (dtype of q or
    float32) and dsink ([heads_q] in the sink's dtype, with a sink). out and lse are the forward's results; dout is
    dL/d out (dtype of q, or float32 on the host backends). Every other argument as for attention_into.
    deterministic: bitwise-reproducible dq on CUDA (the host backends always are).
    """

def backend_supports(backend: str, q: Annotated[NDArray[numpy.float32 | numpy.float16 | numpy.uint16 | numpy.float64], dict(shape=(None, None, None), writable=False)], k: Annotated[NDArray[numpy.float32 | numpy.float16 | numpy.uint16 | numpy.float64], dict(shape=(None, None, None), writable=False)], v: Annotated[NDArray[numpy.float32 | numpy.float16 | numpy.uint16 | numpy.float64], dict(shape=(None, None, None), writable=False)], out: Annotated[NDArray[numpy.float32 | numpy.float16 | numpy.uint16 | numpy.float64], dict(shape=(None, None, None))], lse: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C')] | None = None, pattern: Pattern = ..., cu_seqlens_q: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', writable=False)] | None = None, cu_seqlens_k: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', writable=False)] | None = None, blocks: BlockMask | None = None, sink: Annotated[NDArray[numpy.float32 | numpy.float64], dict(shape=(None,), writable=False)] | None = None, sink_mode: str = 'none', bf16_bits: bool = False) -> tuple[bool, str]:
    """
    (supported, why): whether `backend` ('auto', 'reference', 'cpu', 'cuda') can run this call; `why`
    names the missing feature when it cannot. Arguments as for attention_into.
    """

def cuda_available() -> bool:
    """Whether this build has the CUDA backend and a GPU is visible."""

def cpu_threads() -> int:
    """
    Worker threads of the CPU backend (ARIADNE_THREADS overrides the default).
    """

def set_cpu_threads(n: int) -> None:
    """Sets the CPU backend's worker count (0: hardware threads)."""

class TokenOrder:
    """
    A serialization of packed image grids (order.hpp). Arrays are read-only numpy views.
    """

    @property
    def kind(self) -> str:
        """'raster', 'qwen_window', 'block_row' or 'block_col'."""

    @property
    def merge(self) -> int:
        """Merge-unit side in patches."""

    @property
    def window(self) -> int:
        """qwen_window: window side in merge units."""

    @property
    def grids(self) -> list[tuple[int, int]]:
        """[(h, w)] patch grid per image."""

    @property
    def perm(self) -> Annotated[NDArray[numpy.int32], dict(writable=False)]:
        """
        int32 [total]: sequence position -> spatial index (cu_seqlens[i] + r * w + c).
        """

    @property
    def inverse(self) -> Annotated[NDArray[numpy.int32], dict(writable=False)]:
        """int32 [total]: spatial index -> sequence position."""

    @property
    def cu_seqlens(self) -> Annotated[NDArray[numpy.int32], dict(writable=False)]:
        """int32 [images + 1]: image boundaries (the same in every order)."""

    @property
    def cu_windows(self) -> Annotated[NDArray[numpy.int32], dict(writable=False)]:
        """
        int32 [windows + 1]: Qwen window boundaries (qwen_window only; else empty).
        """

    @property
    def coords(self) -> Annotated[NDArray[numpy.float32], dict(writable=False)]:
        """float32 [total, 2]: (row, col) of each sequence position's patch."""

    @property
    def tokens(self) -> int: ...

    @property
    def images(self) -> int: ...

    def __len__(self) -> int: ...

    def __repr__(self) -> str: ...

def make_order(kind: str, grids: Sequence[tuple[int, int]], merge: int = 2, window: int = 4) -> TokenOrder:
    """
    The token order `kind` of the packed images [(h, w), ...] (patch grids; sides multiples of merge).
    """

def order_conversion(from_: TokenOrder, to: TokenOrder) -> NDArray[numpy.int32]:
    """int32 [total] gather index: x_to[i] = x_from[index[i]]."""

def permute_tokens(src: Annotated[NDArray[numpy.float32 | numpy.float16], dict(writable=False)], dst: NDArray[numpy.float32 | numpy.float16], from_: TokenOrder, to: TokenOrder) -> None:
    """
    Host arrays [total, ...] (float32/bfloat16/float16, strides free): dst = src reordered from `from_` to `to`.
    """

class LayerSpec:
    """One encoder layer: its token order, pattern kind, window and sink."""

    @property
    def order(self) -> str: ...

    @property
    def kind(self) -> str:
        """'full', 'window' or 'chunk'."""

    @property
    def window(self) -> int:
        """Window layers: a query at p sees p - window ... p + window."""

    @property
    def sink(self) -> bool:
        """Whether the layer has a per-head sink."""

    @property
    def letter(self) -> str: ...

    def __repr__(self) -> str: ...

class Schedule:
    """Per-layer attention specs of a vision encoder (schedule.hpp)."""

    @property
    def name(self) -> str: ...

    @property
    def layers(self) -> list[LayerSpec]:
        """[LayerSpec] per layer (a copy)."""

    def order_changes(self) -> int:
        """Layers whose order differs from the previous layer's."""

    def letters(self) -> str:
        """The schedule in the short syntax, one letter per layer."""

    def __len__(self) -> int: ...

    def __repr__(self) -> str: ...

def schedule(text: str, window: int = 64) -> Schedule:
    """
    A preset ('ariadne', 'chunk', 'swa1d+sink', ...) or the short syntax ('4x(RRRRCCCF)'); window = SWA
    half-width of the window layers.
    """

def schedule_presets() -> list[str]:
    """The preset names."""

def layer_pattern(layer: LayerSpec, order: TokenOrder) -> tuple[Pattern, NDArray[numpy.int32]]:
    """
    (pattern, cu_seqlens int32 [sequences + 1]) of a layer on tokens in `order`: images for full and window
    layers, Qwen windows for chunk layers. Pass both to attention().
    """

class TileCount:
    """Tiles a kernel visits (flops.hpp)."""

    @property
    def full(self) -> int:
        """Visited tiles without an element mask."""

    @property
    def partial(self) -> int:
        """Visited tiles that need the element mask."""

    @property
    def visited(self) -> int: ...

    def __repr__(self) -> str: ...

def count_pairs(pattern: Pattern, total_q: int, total_k: int, heads: int = 1, cu_seqlens_q: Sequence[int] | None = None, cu_seqlens_k: Sequence[int] | None = None, blocks: BlockMask | None = None) -> int:
    """
    Allowed (query, key) pairs over packed runs of total_q queries and total_k keys, summed over heads.
    """

def count_tiles(pattern: Pattern, total_q: int, total_k: int, heads: int = 1, tile: tuple[int, int] = (128, 128), cu_seqlens_q: Sequence[int] | None = None, cu_seqlens_k: Sequence[int] | None = None, blocks: BlockMask | None = None) -> TileCount:
    """Tiles of (tile_q, tile_k) tokens a kernel visits, summed over heads."""

class ScheduleCost:
    """Whole-encoder attention cost of a schedule (flops.hpp)."""

    @property
    def schedule(self) -> str: ...

    @property
    def tokens(self) -> int: ...

    @property
    def layers(self) -> int: ...

    @property
    def pairs(self) -> int:
        """Allowed pairs, summed over layers and heads."""

    @property
    def flops(self) -> int:
        """One plain forward: 4 * head_dim * pairs."""

    @property
    def flops_paper(self) -> int:
        """The paper's convention: 4 x flops."""

    @property
    def tile(self) -> tuple[int, int]: ...

    @property
    def tiles(self) -> TileCount: ...

    @property
    def tile_flops(self) -> int:
        """Visited tiles * tile_q * tile_k * 4 * head_dim."""

    @property
    def useful_fraction(self) -> float:
        """flops / tile_flops."""

    @property
    def layer_pairs(self) -> Annotated[NDArray[numpy.int64], dict(writable=False)]:
        """int64 [layers]: allowed pairs per layer, summed over heads."""

    def __repr__(self) -> str: ...

def schedule_cost(schedule: Schedule, images: Sequence[tuple[int, int]], heads: int = 16, head_dim: int = 80, patch: int = 14, merge: int = 2, qwen_window: int = 4, tile: tuple[int, int] = (128, 128)) -> ScheduleCost:
    """
    Attention cost of every layer of `schedule` on the packed images [(h, w), ...] (Qwen2.5-VL defaults).
    """

def image_grid(side: int, patch: int = 14, merge: int = 2) -> tuple[int, int]:
    """(h, w) patch grid of a side x side pixel image."""

class ReceptiveField:
    """Token-level spread through a schedule (receptive_field.hpp)."""

    @property
    def grid(self) -> tuple[int, int]: ...

    @property
    def start_row(self) -> int: ...

    @property
    def start_col(self) -> int: ...

    @property
    def coverage(self) -> Annotated[NDArray[numpy.float64], dict(writable=False)]:
        """float64 [layers]: covered share of the grid after each layer."""

    @property
    def reached(self) -> Annotated[NDArray[numpy.int32], dict(writable=False)]:
        """
        int32 [h, w]: layer (1-based) after which each patch is first covered; 0 = start, -1 = never.
        """

def receptive_field(schedule: Schedule, grid: tuple[int, int], start_row: int, start_col: int, merge: int = 1, qwen_window: int = 4) -> ReceptiveField:
    """
    Spreads from patch (start_row, start_col) of grid (h, w) through every layer of `schedule`.
    """

class EstimateStats:
    """Stage times (ms), kept / visible blocks and scoring cost."""

    @property
    def ms_sampling(self) -> float: ...

    @property
    def ms_scoring(self) -> float: ...

    @property
    def ms_selection(self) -> float: ...

    @property
    def ms_total(self) -> float: ...

    @property
    def kept_blocks(self) -> int: ...

    @property
    def visible_blocks(self) -> int: ...

    @property
    def density(self) -> float:
        """kept / causally visible blocks."""

    @property
    def density_per_head(self) -> list[float]:
        """[heads_q] kept / visible per query head."""

    @property
    def mac(self) -> float:
        """Multiply-adds spent on scoring."""

class EstimateResult:
    """An estimator's mask and the block scores behind it."""

    @property
    def mask(self) -> BlockMask:
        """BlockMask: rows (sequence, query head, query block)."""

    @property
    def heads(self) -> int: ...

    @property
    def stats(self) -> EstimateStats: ...

    @property
    def rows(self) -> int: ...

    @property
    def score_ptr(self) -> Annotated[NDArray[numpy.int64], dict(writable=False)]:
        """
        int64 [rows + 1]: row r's scores are scores[score_ptr[r]:score_ptr[r + 1]].
        """

    @property
    def scores(self) -> Annotated[NDArray[numpy.float32], dict(writable=False)]:
        """
        float32: normalized scores of the visible key blocks 0 ... diag of each row.
        """

    @property
    def row_queries(self) -> Annotated[NDArray[numpy.int32], dict(writable=False)]:
        """int32 [rows]: queries in each row's query block."""

def estimate(q: Annotated[NDArray[numpy.float32 | numpy.float16 | numpy.uint16], dict(shape=(None, None, None), writable=False)], k: Annotated[NDArray[numpy.float32 | numpy.float16 | numpy.uint16], dict(shape=(None, None, None), writable=False)], method: str = 'rr', block: int = 128, stride: int = 8, tau: float = 0.95, tau_per_head: Sequence[float] = [], offset: str = 'paper', protect: Sequence[str] | None = None, scale: float = 0.0, cu_seqlens_q: Sequence[int] | None = None, cu_seqlens_k: Sequence[int] | None = None, backend: str = 'auto', bf16_bits: bool = False) -> EstimateResult:
    """
    Block-sparse mask of a causal prefill (estimate.hpp).

    q: [total_q, heads_q, head_dim]; k: [total_k, heads_kv, head_dim]; float32/bfloat16/float16 host
    arrays, head_dim contiguous. cu_seqlens_q / cu_seqlens_k: packed sequences (lq <= lk each).
    method 'rr' (RRAttention), 'xattn' (XAttention) or 'oracle' (exact block masses); block B, stride S
    (S divides B); tau: share of each row's score mass to keep (tau_per_head: one per query head);
    offset 'paper' or 'released' (rr's sampling formula); protect: None (as each method was released)
    or names among 'last_row', 'sink', 'diagonal'. The GIL is released while it runs.
    """

def rr_sample_position(offset: str, stride: int, i: int, head: int, lq: int) -> int:
    """
    RR's sampled query of query stride i for head h: iS + (S - 1 - h mod S) ('paper') or iS + (h mod S)
    ('released'), clamped to lq - 1.
    """

class MaskMetrics:
    """A mask against the oracle's: attention mass kept and block F1."""

    @property
    def mass_recall(self) -> float:
        """True attention mass on kept blocks / total mass."""

    @property
    def precision(self) -> float: ...

    @property
    def recall(self) -> float: ...

    @property
    def f1(self) -> float: ...

    @property
    def density(self) -> float: ...

    @property
    def kept(self) -> int: ...

    @property
    def oracle_kept(self) -> int: ...

    @property
    def true_positive(self) -> int: ...

    @property
    def visible(self) -> int: ...

    @property
    def mass_recall_per_head(self) -> list[float]: ...

def compare_to_oracle(mask: BlockMask, oracle: EstimateResult) -> MaskMetrics:
    """
    Metrics of `mask` (same geometry as the oracle's) against an oracle EstimateResult.
    """

class PrefillStats:
    """Stage times (ms) and the density of a prefill."""

    @property
    def ms_sampling(self) -> float: ...

    @property
    def ms_scoring(self) -> float: ...

    @property
    def ms_selection(self) -> float: ...

    @property
    def ms_estimate(self) -> float: ...

    @property
    def ms_attention(self) -> float: ...

    @property
    def ms_total(self) -> float: ...

    @property
    def density(self) -> float: ...

    @property
    def density_per_head(self) -> list[float]: ...

class PrefillResult:
    """The estimate a prefill used (empty when dense) and its stats."""

    @property
    def estimate(self) -> EstimateResult: ...

    @property
    def stats(self) -> PrefillStats: ...

def prefill_into(q: Annotated[NDArray[numpy.float32 | numpy.float16 | numpy.uint16], dict(shape=(None, None, None), writable=False)], k: Annotated[NDArray[numpy.float32 | numpy.float16 | numpy.uint16], dict(shape=(None, None, None), writable=False)], v: Annotated[NDArray[numpy.float32 | numpy.float16 | numpy.uint16], dict(shape=(None, None, None), writable=False)], out: Annotated[NDArray[numpy.float32 | numpy.float16 | numpy.uint16], dict(shape=(None, None, None))], lse: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C')] | None = None, dense: bool = False, method: str = 'rr', block: int = 128, stride: int = 8, tau: float = 0.95, offset: str = 'paper', protect: Sequence[str] | None = None, scale: float = 0.0, cu_seqlens_q: Sequence[int] | None = None, cu_seqlens_k: Sequence[int] | None = None, estimate_backend: str = 'auto', attention_backend: str = 'auto', bf16_bits: bool = False) -> PrefillResult:
    """
    Causal prefill: estimate a mask (unless dense), then attention on it, into out [total_q, heads_q,
    head_dim] (and lse float32 [heads_q, total_q]). Arguments as for estimate() and attention_into().
    """

class PagedKVCache:
    """
    Paged KV cache in host memory (ariadne/decode.hpp).

    K and V pools [capacity_pages, kv_heads, page_size, head_dim] in `dtype` ('f32', 'bf16' or 'f16'),
    a page table and a length per sequence, and per pool page and KV head the key summaries the page
    scorers read (float32): key-stride sums over `summary_stride` rows and per-dimension min / max.
    Methods that change the cache refuse to run while a decode call of another thread reads it.
    """

    def __init__(self, kv_heads: int, head_dim: int, page_size: int = 64, dtype: str = 'f32', summary_stride: int = 8) -> None:
        """
        An empty cache; page_size tokens per page, summary_stride (divides page_size) rows per key-stride sum.
        """

    def add_sequence(self) -> int:
        """
        A new empty sequence; returns its id (ids of released sequences are reused).
        """

    def release(self, seq: int) -> None:
        """Returns the sequence's pages to the pool; the id becomes free."""

    def clear(self, seq: int) -> None:
        """
        Drops every token of the sequence (its pages go back to the pool); the id stays valid.
        """

    def append(self, seq: int, k: Annotated[NDArray[numpy.float32 | numpy.float16 | numpy.uint16], dict(shape=(None, None, None), writable=False)], v: Annotated[NDArray[numpy.float32 | numpy.float16 | numpy.uint16], dict(shape=(None, None, None), writable=False)], bf16_bits: bool = False) -> None:
        """
        Appends n tokens: k, v [n, kv_heads, head_dim] host float32, bfloat16 or float16 (head_dim contiguous,
        any token stride), stored in the cache's dtype; the touched pages' key summaries are updated from the
        stored values. bf16_bits: read uint16 arrays as bfloat16 bits (ml_dtypes numpy arrays).
        """

    def length(self, seq: int) -> int:
        """Cached tokens of the sequence."""

    def pages(self, seq: int) -> int:
        """Logical pages of the sequence: ceil(length / page_size)."""

    def live(self, seq: int) -> bool:
        """Whether `seq` is a sequence id in use."""

    def page_table(self, seq: int) -> NDArray[numpy.int32]:
        """
        int32 [pages]: the pool page of each logical page of the sequence (a copy).
        """

    def key_sum(self, pool_page: int) -> NDArray[numpy.float32]:
        """
        float32 [kv_heads, strides_per_page, head_dim]: the sums of each key stride of a pool page (a copy).
        Strides past the page's filled rows hold nothing meaningful.
        """

    def key_min(self, pool_page: int) -> NDArray[numpy.float32]:
        """
        float32 [kv_heads, head_dim]: per-dimension minimum of a pool page's keys (a copy).
        """

    def key_max(self, pool_page: int) -> NDArray[numpy.float32]:
        """
        float32 [kv_heads, head_dim]: per-dimension maximum of a pool page's keys (a copy).
        """

    @property
    def kv_heads(self) -> int: ...

    @property
    def head_dim(self) -> int: ...

    @property
    def page_size(self) -> int: ...

    @property
    def summary_stride(self) -> int: ...

    @property
    def dtype(self) -> str:
        """Storage dtype of K and V: 'f32', 'bf16' or 'f16'."""

    @property
    def strides_per_page(self) -> int: ...

    @property
    def capacity_pages(self) -> int:
        """Pages of the pools (used and free)."""

    @property
    def sequence_slots(self) -> int:
        """Every sequence id handed out is below it."""

    @property
    def page_bytes(self) -> int:
        """Bytes of K and V one full page holds (both pools)."""

    def __repr__(self) -> str: ...

class PageSelection:
    """
    Pages kept per (batch entry b, KV head g): row r = b * kv_heads + g lists logical
    pages of sequence seqs[b], ascending, in pages[row_ptr[r]:row_ptr[r + 1]]. Holds no
    reference to the cache: decode_attention checks it against the cache and batch it
    is given.
    """

    def __init__(self, kv_heads: int, row_ptr: Sequence[int], pages: Sequence[int]) -> None:
        """
        A selection given as CSR rows (visible and kept_mass stay empty, ms_select 0).
        """

    @property
    def kv_heads(self) -> int: ...

    @property
    def row_ptr(self) -> Annotated[NDArray[numpy.int32], dict(writable=False)]:
        """int32 [rows + 1] (read-only view)."""

    @property
    def pages(self) -> Annotated[NDArray[numpy.int32], dict(writable=False)]:
        """int32 [kept]: logical page indices, row after row (read-only view)."""

    @property
    def visible(self) -> Annotated[NDArray[numpy.int32], dict(writable=False)]:
        """
        int32 [rows]: pages holding a token the window lets the query see (read-only view).
        """

    @property
    def kept_mass(self) -> Annotated[NDArray[numpy.float32], dict(writable=False)]:
        """
        float32 [rows]: the scorer's normalized score mass of the kept pages (read-only view).
        """

    @property
    def rows(self) -> int: ...

    @property
    def kept(self) -> int:
        """Pages kept over every row."""

    @property
    def visible_total(self) -> int: ...

    @property
    def density(self) -> float:
        """Kept / visible pages over every row."""

    @property
    def ms_select(self) -> float:
        """Host wall time of select_pages (ms)."""

    def __repr__(self) -> str: ...

def decode_into(q: Annotated[NDArray[numpy.float32 | numpy.float16 | numpy.uint16], dict(shape=(None, None, None), writable=False)], cache: PagedKVCache, seqs: Sequence[int], out: Annotated[NDArray[numpy.float32], dict(shape=(None, None, None))], lse: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C')] | None = None, window: int = -1, sink: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', writable=False)] | None = None, sink_mode: str = 'none', scale: float = 0.0, selection: PageSelection | None = None, backend: str = 'auto', bf16_bits: bool = False) -> None:
    """
    Decode attention into caller-provided outputs (decode_attention() wraps it).

    q: [batch, heads_q, head_dim] host float32, bfloat16 or float16, head_dim contiguous; row b is the
       newest token of cache sequence seqs[b], whose k and v are already appended.
    out: float32 [batch, heads_q, head_dim], head_dim contiguous, written in place.
    lse: None or float32 [batch, heads_q], contiguous, written in place (natural log, includes the sink).
    window: the query sees its `window` previous tokens and itself; < 0: every token.
    sink: None or float32 [heads_q]; sink_mode 'none', 'denominator' or 'key0'.
    scale: 0 selects 1/sqrt(head_dim). selection: None (dense) or a PageSelection for this batch.
    backend: 'auto' (= 'cpu'), 'cpu' or 'reference'. The GIL is released while it runs.
    """

def select_pages(q: Annotated[NDArray[numpy.float32 | numpy.float16 | numpy.uint16], dict(shape=(None, None, None), writable=False)], cache: PagedKVCache, seqs: Sequence[int], scorer: str = 'rr', tau: float = 0.9, sink_pages: int = 1, recent_pages: int = 1, rotate: bool = True, step: int = 0, window: int = -1, sink: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', writable=False)] | None = None, sink_mode: str = 'none', scale: float = 0.0, bf16_bits: bool = False) -> PageSelection:
    """
    The pages sparse decode reads for this step's queries, per (sequence, KV head): scorer 'rr' (key-stride
    sums), 'quest' (min/max bound) or 'oracle' (exact mass); the smallest set reaching tau of the group's mean
    normalized score, plus the first sink_pages and the last recent_pages visible pages. rotate / step: rr's
    head rotation over key strides. Other arguments as for decode_into (the sink matters to the oracle's key0).
    """

def page_masses(q: Annotated[NDArray[numpy.float32 | numpy.float16 | numpy.uint16], dict(shape=(None, None, None), writable=False)], cache: PagedKVCache, seqs: Sequence[int], window: int = -1, sink: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', writable=False)] | None = None, sink_mode: str = 'none', scale: float = 0.0, bf16_bits: bool = False) -> list[NDArray[numpy.float64]]:
    """
    Per row (b, g), the exact attention mass of each visible page (float64 [visible pages]), normalized per
    query head and averaged over the GQA group: the oracle's score.
    """

def kept_page_mass(q: Annotated[NDArray[numpy.float32 | numpy.float16 | numpy.uint16], dict(shape=(None, None, None), writable=False)], cache: PagedKVCache, seqs: Sequence[int], selection: PageSelection, window: int = -1, sink: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', writable=False)] | None = None, sink_mode: str = 'none', scale: float = 0.0, bf16_bits: bool = False) -> NDArray[numpy.float64]:
    """
    float64 [rows]: per row, the share of the exact attention mass (page_masses) that the selection's pages
    hold; 1 for a selection that keeps every visible page (the selection's recall).
    """

def attention_piece(q: Annotated[NDArray[numpy.float32 | numpy.float16 | numpy.uint16], dict(shape=(None, None, None), writable=False)], k: Annotated[NDArray[numpy.float32 | numpy.float16 | numpy.uint16], dict(shape=(None, None, None), writable=False)], v: Annotated[NDArray[numpy.float32 | numpy.float16 | numpy.uint16], dict(shape=(None, None, None), writable=False)], q_pos: int, k_pos: int, out: Annotated[NDArray[numpy.float32], dict(shape=(None, None, None))], lse: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C')], rule: Pattern = ..., blocks: BlockMask | None = None, sink: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', writable=False)] | None = None, sink_mode: str = 'none', scale: float = 0.0, backend: str = 'cpu', stream: int = 0, lse_scratch: Annotated[NDArray[numpy.float32], dict(order='C')] | None = None, bf16_bits: bool = False) -> tuple[int, int]:
    """
    One piece of a ring: queries at positions q_pos ... of one self-attention sequence against keys
    at positions k_pos ..., under the sequence's rule (a window and/or chunk Pattern, no varlen) and
    optionally its block mask restricted to these queries (rows head * nqb + local block, columns the
    sequence's key blocks: estimate_rr_from_key_sums(...).mask). Writes the partial out (float32
    [n_q, heads_q, head_dim]) and lse (float32 [heads_q, n_q], -inf where no key is allowed). A key-0
    sink applies in the piece whose keys start at position 0; a denominator sink is left to
    finish_partials. Host arrays on backend 'cpu' / 'reference', or CUDA arrays on 'cuda' (enqueued on
    `stream`, a cudaStream_t as an int; blocks stays a host BlockMask). lse_scratch: optional float32
    scratch of >= heads_q * n_q elements for the calls' LSE (else one is allocated per call). Returns
    (attention calls, allowed score entries).
    """

def merge_partial(acc_out: Annotated[NDArray[numpy.float32], dict(shape=(None, None, None))], acc_lse: Annotated[NDArray[numpy.float32], dict(shape=(None, None))], part_out: Annotated[NDArray[numpy.float32], dict(shape=(None, None, None), writable=False)], part_lse: Annotated[NDArray[numpy.float32], dict(shape=(None, None), writable=False)], stream: int = 0) -> None:
    """
    acc <- the LSE merge of acc and a piece's partial (float32 arrays on one device, out [n, heads, dim],
    lse [heads, n]); a partial row with lse -inf changes nothing. CUDA arrays: a kernel on `stream`.
    """

def finish_partials(acc_out: Annotated[NDArray[numpy.float32], dict(shape=(None, None, None), writable=False)], acc_lse: Annotated[NDArray[numpy.float32], dict(shape=(None, None), writable=False)], out: Annotated[NDArray[numpy.float32 | numpy.float16 | numpy.uint16], dict(shape=(None, None, None))], lse: Annotated[NDArray[numpy.float32], dict(shape=(None, None))] | None = None, sink: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', writable=False)] | None = None, sink_mode: str = 'none', stream: int = 0, bf16_bits: bool = False) -> None:
    """
    Writes the merged result into out (float32, bfloat16 or float16) and lse, adding a denominator
    sink once.
    """

def zigzag_shards(length: int, ranks: int, align: int = 1) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """
    Rank r's pair of zig-zag chunks ((lo, hi), (lo, hi)) of a sequence: chunks r and 2N - 1 - r of
    ceil(length / 2N) tokens rounded up to align.
    """

def zigzag_runs(lengths: Sequence[int], rank: int, ranks: int, align: int = 1) -> list[tuple[int, int, int, int]]:
    """
    Rank `rank`'s rows of a packed batch of sequences of `lengths` tokens: (sequence, first position,
    end position, first row in the rank's tensors) of each non-empty zig-zag chunk, sequence after
    sequence.
    """

def rr_key_sums(k: Annotated[NDArray[numpy.float32 | numpy.float16 | numpy.uint16], dict(shape=(None, None, None), writable=False)], stride: int = 8, bf16_bits: bool = False) -> Annotated[NDArray[numpy.float32], dict(shape=(None, None, None), order='C')]:
    """
    RR's key-stride sums of a run of keys starting on a stride boundary: float32
    [ceil(n / stride), heads_kv, head_dim], summed as estimate() sums them.
    """

def estimate_rr_from_key_sums(q: Annotated[NDArray[numpy.float32 | numpy.float16 | numpy.uint16], dict(shape=(None, None, None), writable=False)], key_sums: Annotated[NDArray[numpy.float32], dict(shape=(None, None, None), writable=False)], q_pos: int, seq_len: int, block: int = 128, stride: int = 8, tau: float = 0.95, offset: str = 'paper', protect: Sequence[str] | None = None, scale: float = 0.0, bf16_bits: bool = False) -> EstimateResult:
    """
    RR's estimate of the queries at positions q_pos ... of a causal sequence of seq_len tokens from the
    sequence's key-stride sums (rr_key_sums of its keys, all-gathered): the rows, scores and mask rows
    estimate() gives those query blocks on the whole sequence, bit for bit. q_pos: a multiple of block.
    """

def read_label_map(path: str) -> NDArray[numpy.int32]:
    """
    A segmentation mask file (PNG palette/gray or .npy) as int32 [height, width] ids.
    """

def patch_fractions(ids: Annotated[NDArray[numpy.int32], dict(shape=(None, None), order='C', device='cpu', writable=False)], grid: tuple[int, int], patch: int = 14, foreground: Sequence[int] | None = None, background: Sequence[int] | None = None, ignore: Sequence[int] | None = None) -> tuple[NDArray[numpy.float32], NDArray[numpy.float32]]:
    """
    (fg, bg) float32 [h, w]: foreground / background pixel shares of each patch after a nearest resize of
    the int32 [H, W] label map to the encoder's input (grid x patch). Rule: ids in `ignore` (default
    255 and crowd) are void; with `foreground` given only those ids are FG, else ids in `background`
    (default [0]) are BG and the rest FG.
    """

def label_patches(fg: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)], bg: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)], purity: float = 1.0) -> NDArray[numpy.int8]:
    """
    int8 [h, w]: 1 foreground, 0 background, -1 excluded (a patch is FG when fg >= purity and fg > 1/2,
    BG likewise; purity in [0.5, 1], 1 = only pure patches).
    """

def auroc(pos: Sequence[float], neg: Sequence[float]) -> float:
    """Mann-Whitney AUROC: P(pos > neg) + P(pos = neg) / 2."""

class LayerDiag:
    """
    One layer of one image as the SHS diagnostics see it (spatial raster order).
    """

    def __init__(self, received: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)], received_no_sink: Annotated[NDArray[numpy.float32], dict(order='C', device='cpu', writable=False)] | None = None, *, distance: Annotated[NDArray[numpy.float64], dict(shape=(None,), order='C', device='cpu', writable=False)], entropy: Annotated[NDArray[numpy.float64], dict(shape=(None,), order='C', device='cpu', writable=False)]) -> None:
        """
        From arrays: received float32 [heads, tokens] (column sums of the attention matrix), optionally
        the same without the sink; distance, entropy float64 [heads] (means over queries).
        """

    @property
    def heads(self) -> int: ...

    @property
    def tokens(self) -> int: ...

    @property
    def received(self) -> Annotated[NDArray[numpy.float32], dict(writable=False)]:
        """
        float32 [heads, tokens]: received attention per patch, spatial raster order.
        """

    @property
    def received_no_sink(self) -> Annotated[NDArray[numpy.float32], dict(writable=False)]:
        """
        float32 [heads, tokens] without the sink; [0, tokens] on layers without one.
        """

    @property
    def distance(self) -> Annotated[NDArray[numpy.float64], dict(writable=False)]:
        """float64 [heads]: mean attention distance in patches."""

    @property
    def entropy(self) -> Annotated[NDArray[numpy.float64], dict(writable=False)]:
        """float64 [heads]: mean row entropy (nats)."""

def diagnose_layer(q: Annotated[NDArray[numpy.float32 | numpy.float16 | numpy.uint16], dict(shape=(None, None, None), writable=False)], k: Annotated[NDArray[numpy.float32 | numpy.float16 | numpy.uint16], dict(shape=(None, None, None), writable=False)], order: TokenOrder, pattern: Pattern, cu_seqlens: Sequence[int] | None = None, sink: Annotated[NDArray[numpy.float32], dict(shape=(None,), order='C', writable=False)] | None = None, sink_mode: str = 'none', scale: float = 0.0, backend: str = 'auto', bf16_bits: bool = False) -> LayerDiag:
    """
    Received attention, distance and entropy of one layer of one image: q, k [tokens, heads, dim] host
    arrays after RoPE in `order`'s sequence order; pattern (and cu_seqlens) as layer_pattern gives them.
    A layer with a sink runs twice (with and without it).
    """

class HeadScore:
    """One head of one layer of one image."""

    @property
    def auroc(self) -> float: ...

    @property
    def folded(self) -> float:
        """max(auroc, 1 - auroc)."""

    @property
    def sink_fg(self) -> float: ...

    @property
    def sink_bg(self) -> float: ...

    @property
    def distance(self) -> float: ...

    @property
    def entropy(self) -> float: ...

class ImageScores:
    """Per-head scores of one image."""

    @property
    def name(self) -> str: ...

    @property
    def grid(self) -> tuple[int, int]: ...

    @property
    def fg(self) -> int: ...

    @property
    def bg(self) -> int: ...

    @property
    def excluded(self) -> int: ...

    @property
    def scored(self) -> bool:
        """False when the image has no FG or no BG patch."""

    @property
    def heads(self) -> list[HeadScore]:
        """[layers * heads] HeadScore, layer-major."""

class ShsAccumulator:
    """The SHS-Index over images, layers and heads."""

    def __init__(self, layers: int, heads: int, patch: int = 14) -> None: ...

    def add(self, name: str, grid: tuple[int, int], labels: Annotated[NDArray[numpy.int8], dict(order='C', device='cpu', writable=False)], diags: Sequence[LayerDiag]) -> ImageScores:
        """
        Adds one image: labels int8 [h, w] (label_patches), diags one LayerDiag per layer.
        """

    @property
    def images(self) -> list[ImageScores]: ...

    def summary(self) -> object:
        """
        The summary as a dict: shs_index, per_layer, per_head [layers][heads], fg_dominant_share,
        attention_distance, entropy, sink_allocation (when a layer has a sink), images_scored, ...
        """

def read_image(path: str) -> NDArray[numpy.uint8]:
    """A PNG or JPEG file decoded to RGB: uint8 [height, width, 3]."""

def decode_image(data: bytes, name: str = '<bytes>') -> NDArray[numpy.uint8]:
    """PNG or JPEG bytes decoded to RGB: uint8 [height, width, 3]."""

def resize_bicubic(image: Annotated[NDArray[numpy.uint8], dict(shape=(None, None, None), order='C', device='cpu', writable=False)], width: int, height: int) -> NDArray[numpy.uint8]:
    """
    PIL-exact bicubic resize (Image.resize(BICUBIC)) of a uint8 [height, width, channels] image.
    """

def smart_resize(height: int, width: int, factor: int = 28, min_pixels: int = 3136, max_pixels: int = 12845056) -> tuple[int, int]:
    """
    (height, width) after HF's smart_resize: multiples of factor, pixel count in [min_pixels, max_pixels].
    """

class VitConfig:
    """
    Architecture of the vision encoder (vit.hpp). Sizes in a loaded checkpoint come from its
    tensors; heads, window, full layers and theta from its 'vision_config' metadata.
    """

    def __init__(self) -> None:
        """The Qwen2.5-VL 3B tower."""

    @property
    def depth(self) -> int: ...

    @depth.setter
    def depth(self, arg: int, /) -> None: ...

    @property
    def hidden(self) -> int: ...

    @hidden.setter
    def hidden(self, arg: int, /) -> None: ...

    @property
    def heads(self) -> int: ...

    @heads.setter
    def heads(self, arg: int, /) -> None: ...

    @property
    def intermediate(self) -> int: ...

    @intermediate.setter
    def intermediate(self, arg: int, /) -> None: ...

    @property
    def out_hidden(self) -> int: ...

    @out_hidden.setter
    def out_hidden(self, arg: int, /) -> None: ...

    @property
    def in_channels(self) -> int: ...

    @in_channels.setter
    def in_channels(self, arg: int, /) -> None: ...

    @property
    def patch(self) -> int:
        """Pixels per patch side."""

    @patch.setter
    def patch(self, arg: int, /) -> None: ...

    @property
    def temporal(self) -> int:
        """Frames per temporal patch (a still image is repeated)."""

    @temporal.setter
    def temporal(self, arg: int, /) -> None: ...

    @property
    def merge(self) -> int:
        """Merge-unit side in patches."""

    @merge.setter
    def merge(self, arg: int, /) -> None: ...

    @property
    def window_px(self) -> int:
        """Qwen chunk window side in pixels."""

    @window_px.setter
    def window_px(self, arg: int, /) -> None: ...

    @property
    def full_layers(self) -> list[int]:
        """Layers with full attention in Qwen's own layout."""

    @full_layers.setter
    def full_layers(self, arg: Sequence[int], /) -> None: ...

    @property
    def rope_theta(self) -> float: ...

    @rope_theta.setter
    def rope_theta(self, arg: float, /) -> None: ...

    @property
    def eps(self) -> float:
        """RMSNorm epsilon."""

    @eps.setter
    def eps(self, arg: float, /) -> None: ...

    @property
    def head_dim(self) -> int: ...

    @property
    def patch_dim(self) -> int:
        """Values per pixel row: in_channels * temporal * patch^2."""

    @property
    def window_units(self) -> int:
        """Qwen window side in merge units."""

    @property
    def factor(self) -> int:
        """patch * merge: image sides are multiples of it."""

    def validate(self) -> None:
        """Raises ariadne.Error naming the first bad field."""

    def describe(self) -> str: ...

    @staticmethod
    def named(name: str) -> VitConfig:
        """'qwen2.5-vl' (3B), 'qwen2.5-vl-7b' or 'small' (the CI parity size)."""

    def __repr__(self) -> str: ...

class PixelBatch:
    """
    Pixel rows of a batch of images, as Qwen2.5-VL's image processor makes them.
    """

    @property
    def values(self) -> Annotated[NDArray[numpy.float32], dict(writable=False)]:
        """
        float32 [tokens, patch_dim] (read-only): rows in block_row order, image after image; columns
        ordered (channel, t, py, px).
        """

    @property
    def grids(self) -> list[tuple[int, int]]:
        """[(h, w)] patch grid per image."""

    @property
    def patch_dim(self) -> int: ...

    @property
    def tokens(self) -> int: ...

    def __len__(self) -> int: ...

    def __repr__(self) -> str: ...

def preprocess_images(images: Sequence[Annotated[NDArray[numpy.uint8], dict(shape=(None, None, None), order='C', device='cpu', writable=False)]], config: VitConfig, min_pixels: int = 3136, max_pixels: int = 12845056, mean: Sequence[float] = ..., std: Sequence[float] = ...) -> PixelBatch:
    """
    smart_resize -> PIL-exact bicubic -> /255 -> (x - mean) / std -> patch rows, for RGB uint8 images
    [height, width, 3]. Bit-compatible with HF's PIL-backend Qwen2VLImageProcessor.
    """

def preprocess_video(frames: Sequence[Annotated[NDArray[numpy.uint8], dict(shape=(None, None, None), order='C', device='cpu', writable=False)]], config: VitConfig, min_pixels: int = 3136, max_pixels: int = 12845056, mean: Sequence[float] = ..., std: Sequence[float] = ...) -> PixelBatch:
    """
    One clip's frames (RGB uint8 [height, width, 3], all one size, in time order) as video pixel rows:
    the size resized as an image's, the frame count padded to the temporal patch by repeating the
    last frame, one grid per temporal patch (HF's Qwen2VL video processor rules).
    """

class VitWeights:
    """Encoder weights (fp32 in memory; bf16/f16 checkpoints are widened)."""

    @property
    def config(self) -> VitConfig:
        """The architecture (a copy)."""

    @property
    def random(self) -> bool:
        """True when made by random_vit_weights, not read from a checkpoint."""

    @property
    def seed(self) -> int: ...

    @property
    def source(self) -> str:
        """File names, or 'random(seed)'."""

    @property
    def prefix(self) -> str:
        """'visual.' or 'model.visual.'."""

    @property
    def sink_init(self) -> float:
        """Value given to sinks absent from the file."""

    @property
    def depth(self) -> int: ...

    def sinks(self, layer: int) -> Annotated[NDArray[numpy.float32], dict(writable=False)]:
        """float32 [heads] (read-only): the sink logits of a layer."""

    def sinks_from_file(self, layer: int) -> bool:
        """Whether the layer's sinks were read from the checkpoint."""

    def __repr__(self) -> str: ...

def load_vit_weights(files: Sequence[str], defaults: VitConfig, sink_init: float = 0.0) -> VitWeights:
    """
    The tower from safetensors files (a sharded checkpoint: several). The prefix is detected; sizes come
    from the tensors, heads / window / full layers / theta from 'vision_config' metadata or `defaults`.
    Sinks absent from the files get sink_init. Errors name the file and the tensor.
    """

def random_vit_weights(config: VitConfig, seed: int = 0, sink_init: float = 0.0) -> VitWeights:
    """
    Seeded random weights (PyTorch Linear's uniform initialization), reported as random everywhere.
    """

def save_vit_weights(path: str, weights: VitWeights, dtype: str = 'f32', prefix: str = 'visual.', with_sinks: bool = False) -> None:
    """
    Writes the weights in the checkpoint layout ('vision_config' metadata included) as f32, bf16 or f16.
    """

def vit_schedule(text: str, config: VitConfig, window: int = 64) -> Schedule:
    """
    The schedule for an encoder of config.depth layers: `text` as is when its length matches, else the
    uniform presets adapted to the model (local layers except config.full_layers, which are full).
    """

class LayerPlan:
    """The attention one encoder layer runs (vit_layer_plan)."""

    @property
    def order(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def window(self) -> int: ...

    @property
    def sink(self) -> bool: ...

    @property
    def cu_seqlens(self) -> Annotated[NDArray[numpy.int32], dict(writable=False)]:
        """
        int32 [sequences + 1]: images (full / window layers) or Qwen windows (chunk layers).
        """

def vit_layer_plan(config: VitConfig, grids: Sequence[tuple[int, int]], schedule: Schedule) -> list[LayerPlan]:
    """
    Per layer of `schedule` on the images `grids`: order, kind, window, sink, cu.
    """

class EncodeResult:
    """The encoder's output (arrays are read-only views owned by the result)."""

    @property
    def out(self) -> Annotated[NDArray[numpy.float32], dict(writable=False)]:
        """
        float32 [units, out_hidden]: merged tokens in native (block_row) order, units = tokens / merge^2.
        """

    @property
    def hidden(self) -> Annotated[NDArray[numpy.float32], dict(writable=False)] | None:
        """
        float32 [tokens, hidden]: the last block's output in native order (keep_hidden=True), else None.
        """

    @property
    def tokens(self) -> int: ...

    @property
    def units(self) -> int: ...

    @property
    def out_hidden(self) -> int: ...

    @property
    def order_changes(self) -> int:
        """Token re-permutations done."""

    @property
    def attention_backend(self) -> str:
        """
        What ran the attention: 'cpu', 'reference', 'cpu+reference', ... as the library reports it.
        """

    @property
    def times(self) -> dict:
        """
        Milliseconds per stage, summed over layers: patch_embed, rope, norm, qkv, attention, proj, mlp,
        permute, merger, total.
        """

    def __repr__(self) -> str: ...

def encode(weights: VitWeights, pixels: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], grids: Sequence[tuple[int, int]], schedule: Schedule, backend: str = 'cpu', sink_mode: str = 'denominator', keep_hidden: bool = False) -> EncodeResult:
    """
    The encoder on pixel rows float32 [tokens, patch_dim] (block_row order, image after image, matching
    grids [(h, w)]) with `schedule` (vit_schedule). backend: the encoder's backend, as `ariadne encode
    --backend` takes it ('cpu', 'reference', 'cuda'); sink_mode for sink layers: 'denominator' or 'key0'.
    """
