"""ariadne: cheap softmax attention for multimodal LLMs.

The C++ library does the work; this package is glue. Arrays cross by DLPack without a copy:
numpy arrays on the CPU, PyTorch and CuPy tensors on the CPU or on CUDA. See docs/python.md.

    import numpy as np, ariadne
    q = np.random.randn(1024, 16, 80).astype(np.float32)          # [tokens, heads, head_dim]
    out, lse = ariadne.attention(q, q, q, pattern=ariadne.Pattern.window(64, 64),
                                 sink=np.zeros(16, np.float32), lse=True, backend="reference")
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np

from . import _ariadne
from ._ariadne import (
    BlockMask,
    EncodeResult,
    Error,
    EstimateResult,
    EstimateStats,
    HeadScore,
    ImageScores,
    LayerDiag,
    LayerPlan,
    LayerSpec,
    MaskMetrics,
    PageSelection,
    Pattern,
    PixelBatch,
    PrefillResult,
    ReceptiveField,
    Schedule,
    ScheduleCost,
    ShsAccumulator,
    TileCount,
    TokenOrder,
    VitConfig,
    VitWeights,
    auroc,
    backend_supports as _backend_supports,
    compare_to_oracle,
    count_pairs,
    count_tiles,
    cpu_threads,
    cuda_available,
    decode_image,
    image_grid,
    label_patches,
    layer_pattern,
    order_conversion,
    patch_fractions,
    permute_tokens,
    random_vit_weights,
    read_image,
    read_label_map,
    resize_bicubic,
    rr_sample_position,
    schedule,
    schedule_cost,
    schedule_presets,
    save_vit_weights,
    set_cpu_threads,
    smart_resize,
    vit_layer_plan,
    vit_schedule,
)

__all__ = [
    "BlockMask", "EncodeResult", "Error", "EstimateResult", "EstimateStats", "HeadScore", "ImageScores", "LayerDiag",
    "LayerPlan", "LayerSpec", "MaskMetrics", "PageSelection", "PagedKVCache", "Pattern", "PixelBatch",
    "PrefillResult", "ReceptiveField", "Schedule",
    "ScheduleCost", "ShsAccumulator", "TileCount", "TokenOrder", "VitConfig", "VitWeights", "attention",
    "attention_backward", "auroc",
    "backend_supports", "compare_to_oracle", "count_pairs", "count_tiles", "cpu_threads", "cuda_available",
    "decode_attention", "decode_image", "diagnose_layer", "encode", "estimate", "flops", "image_grid",
    "kept_page_mass", "label_patches", "layer_pattern",
    "load_vit_weights", "order", "order_conversion", "page_masses", "patch_fractions", "permute_tokens", "prefill",
    "preprocess", "preprocess_video",
    "random_vit_weights", "read_image", "read_label_map", "receptive_field", "resize_bicubic", "rr_estimate",
    "rr_sample_position", "save_vit_weights", "schedule", "schedule_cost", "schedule_presets", "select_pages",
    "set_cpu_threads", "shs_index", "smart_resize", "vit_layer_plan", "vit_schedule",
]


@atexit.register
def _quiet_leak_report_under_torch() -> None:
    # With torch loaded, its teardown keeps objects alive past nanobind's leak check at exit, which
    # then reports leaks that are not ours. Without torch none are reported
    # (tests/python/test_stubs.py::test_no_leaks_at_exit checks), so the report stays on there.
    if "torch" in sys.modules:
        _ariadne._set_leak_warnings(False)


Array = Any  # numpy.ndarray, torch.Tensor, cupy.ndarray or anything else that speaks DLPack
Grid = Tuple[int, int]


# ---- arrays of several frameworks, told apart by their module (none of them is imported here) ----

def _framework(x: Array) -> str:
    return type(x).__module__.split(".")[0]


def _is_ml_dtypes_bf16(x: Array) -> bool:
    # numpy has no bfloat16; ml_dtypes adds one that DLPack cannot describe. Such arrays are passed
    # as their uint16 bits with a flag telling the native side what they are.
    return isinstance(x, np.ndarray) and x.dtype.name == "bfloat16"


def _bits(x: Optional[Array]) -> Optional[Array]:
    return x.view(np.uint16) if x is not None and _is_ml_dtypes_bf16(x) else x


def _empty(like: Array, shape: Tuple[int, ...], f32: bool) -> Array:
    """An uninitialized array of `shape` in the framework and on the device of `like`."""
    fw = _framework(like)
    if fw == "numpy":
        return np.empty(shape, np.float32 if f32 else like.dtype)
    if fw == "torch":
        import torch

        return torch.empty(shape, dtype=torch.float32 if f32 else like.dtype, device=like.device)
    if fw == "cupy":
        import cupy

        return cupy.empty(shape, cupy.float32 if f32 else like.dtype)
    raise TypeError(f"ariadne: cannot allocate outputs like a {type(like).__name__}; pass out= (and lse=) arrays")


def _ints(x: Optional[Union[Array, Sequence[int]]]) -> Optional[Array]:
    """cu_seqlens as int32: lists become numpy arrays; device tensors are passed through."""
    if x is None:
        return None
    if isinstance(x, (list, tuple)):
        return np.asarray(x, dtype=np.int32)
    if isinstance(x, np.ndarray) and x.dtype != np.int32:
        return np.ascontiguousarray(x, dtype=np.int32)
    if _framework(x) == "torch" and str(x.dtype) != "torch.int32":
        import torch

        return x.to(torch.int32).contiguous()
    return x


def _is_f64(q: Array) -> bool:
    return str(q.dtype) in ("float64", "torch.float64")


def _f32(x: Optional[Array], q: Optional[Array] = None) -> Optional[Array]:
    """Sink values as float32, or float64 with float64 q (the reference backend's exact checks);
    they are one number per head: a copy costs nothing."""
    if x is None:
        return None
    wide = q is not None and _is_f64(q)
    if isinstance(x, (list, tuple, float, int)):
        return np.asarray(x, dtype=np.float64 if wide else np.float32).reshape(-1)
    if _framework(x) == "torch":
        import torch

        return x.detach().to(torch.float64 if wide else torch.float32).contiguous()
    if _framework(x) == "numpy":
        return np.ascontiguousarray(x, dtype=np.float64 if wide else np.float32).reshape(-1)
    return x


def _stream_of(q: Array, stream: Optional[int]) -> int:
    """The CUDA stream to launch on: the one given, else the framework's current stream."""
    if stream is not None:
        return int(stream)
    fw = _framework(q)
    if fw == "torch" and q.is_cuda:
        import torch

        return int(torch.cuda.current_stream(q.device).cuda_stream)
    if fw == "cupy":
        import cupy

        return int(cupy.cuda.get_current_stream().ptr)
    return 0


class _on_device:
    """Makes q's GPU the current one while a kernel is launched (no-op on the CPU)."""

    def __init__(self, q: Array):
        self.ctx = None
        fw = _framework(q)
        if fw == "torch" and q.is_cuda:
            import torch

            self.ctx = torch.cuda.device(q.device)
        elif fw == "cupy":
            self.ctx = q.device

    def __enter__(self):
        if self.ctx is not None:
            self.ctx.__enter__()

    def __exit__(self, *exc):
        if self.ctx is not None:
            self.ctx.__exit__(*exc)


def _sink_mode(sink: Optional[Array], sink_mode: Optional[str]) -> str:
    if sink_mode is None:
        return "none" if sink is None else "denominator"
    return sink_mode


def attention(
    q: Array,
    k: Array,
    v: Array,
    pattern: Pattern = Pattern.full(),
    sink: Optional[Array] = None,
    sink_mode: Optional[str] = None,
    cu_seqlens: Optional[Union[Array, Sequence[int]]] = None,
    cu_seqlens_k: Optional[Union[Array, Sequence[int]]] = None,
    blocks: Optional[BlockMask] = None,
    out: Optional[Array] = None,
    lse: Union[bool, Array] = False,
    scale: float = 0.0,
    backend: str = "auto",
    stream: Optional[int] = None,
    entropy: Optional[Array] = None,
    distance: Optional[Array] = None,
    received: Optional[Array] = None,
    coords_q: Optional[Array] = None,
    coords_k: Optional[Array] = None,
    order: Optional[Union[Array, Sequence[int]]] = None,
) -> Tuple[Array, Optional[Array]]:
    """Softmax attention with a pattern, an optional per-head sink and packed sequences.

    q: [total_q, heads_q, head_dim]; k, v: [total_k, heads_kv, head_dim] (GQA: heads_q multiple of
    heads_kv). float32, float16 or bfloat16 (torch bf16, or ml_dtypes bf16 numpy arrays); the last
    dim contiguous, other strides free (q/k/v may be slices of one packed qkv tensor); all on one
    device. numpy arrays run on the CPU; torch/CuPy CUDA tensors on the GPU (CUDA builds only).
    pattern: Pattern.full() / causal() / window(l, r) / chunked(c); applied within each sequence.
    sink: [heads_q] logits (scaled-score units); sink_mode 'denominator' (default when a sink is
        given: GPT-OSS / FA4 / cuDNN) or 'key0' (MiMo-V2.5 reference: added to key 0's logit).
    cu_seqlens: int32 [sequences + 1] offsets of a packed batch (queries; keys too unless
        cu_seqlens_k is given). Host arrays or lists, or tensors on q's device.
    blocks: BlockMask, block-sparse rows per (sequence, head, query block), intersected with pattern.
    out: [total_q, heads_q, head_dim] (dtype of q or float32), written in place; allocated when None.
    lse: False, True (allocate) or a float32 [heads_q, total_q] array; natural log, includes the sink.
    scale: 0 selects 1/sqrt(head_dim). backend: 'auto', 'reference', 'cpu' or 'cuda'.
    stream: cudaStream_t as an int; None uses the current torch / CuPy stream of q's device.
    entropy, distance: float32 [heads_q, total_q]; received: float32 [heads_q, total_k]; optional
        diagnostics written in place (distance needs coords_q / coords_k float32 [tokens, 2]).
    order: int32 [total] permutation (needs total_q == total_k): logical row i of the pattern lives at
        stored row order[i] of q, k, v, out, lse and the diagnostics, e.g. a window over the
        column-major walk of an image on row-major tensors (`order_conversion`); CUDA fuses it into
        the kernel's loads and stores. Host arrays or lists, or tensors on q's device.

    Returns (out, lse), lse None when not requested. Raises ariadne.Error (a ValueError) with the
    library's message on bad input. The GIL is released while the kernel runs.

    torch tensors (without stream=) run through the custom ops torch.ops.ariadne.attention /
    attention_out (ariadne.ops), so torch.compile(fullgraph=True) traces the call and CUDA graphs
    capture it; the kernels then launch on torch's current stream of q's device.
    """
    # torch tensors go through the torch.library custom ops (ariadne.ops), which torch.compile traces
    # and CUDA graphs capture; they launch on torch's current stream. An explicit stream, numpy and
    # CuPy arrays take the direct path below.
    if stream is None and _framework(q) == "torch":
        from . import ops

        return ops.attention(q, k, v, pattern, sink, _sink_mode(sink, sink_mode), cu_seqlens, cu_seqlens_k, blocks,
                             out, lse, scale, backend, entropy, distance, received, coords_q, coords_k, order)
    # Allocated like q; a q of the wrong rank is reported by the library's checks below.
    if out is None:
        out = _empty(q, tuple(q.shape), False)
    if lse is True:
        lse = _empty(q, (q.shape[1], q.shape[0]) if len(q.shape) >= 2 else (0, 0), True)
    elif lse is False:
        lse = None
    bf16 = any(_is_ml_dtypes_bf16(x) for x in (q, k, v, out))
    with _on_device(q):
        _ariadne.attention_into(
            _bits(q), _bits(k), _bits(v), _bits(out), lse, pattern, _ints(cu_seqlens), _ints(cu_seqlens_k), blocks,
            _f32(sink, q), _sink_mode(sink, sink_mode), float(scale), backend, _stream_of(q, stream), bf16, entropy,
            distance, received, coords_q, coords_k, _ints(order))
    return out, lse


def attention_backward(
    q: Array,
    k: Array,
    v: Array,
    out: Array,
    lse: Array,
    dout: Array,
    pattern: Pattern = Pattern.full(),
    sink: Optional[Array] = None,
    sink_mode: Optional[str] = None,
    cu_seqlens: Optional[Union[Array, Sequence[int]]] = None,
    cu_seqlens_k: Optional[Union[Array, Sequence[int]]] = None,
    blocks: Optional[BlockMask] = None,
    order: Optional[Union[Array, Sequence[int]]] = None,
    scale: float = 0.0,
    backend: str = "auto",
    stream: Optional[int] = None,
    deterministic: bool = False,
) -> Tuple[Array, Array, Array, Optional[Array]]:
    """Gradients of `attention` with respect to q, k, v and the sink: (dq, dk, dv, dsink).

    out and lse are the forward's results (attention(..., lse=True)); dout is dL/d out, shaped like
    out. Every other argument is that of `attention`, for the same call. dq, dk and dv come in the
    dtype and shape of q, k and v; dsink float32 [heads_q] (float64 with float64 q) with a sink, else None. deterministic:
    bitwise-reproducible dq on CUDA (the host backends always are). torch tensors (without stream=)
    go through torch.ops.ariadne.attention_backward; torch autograd through ariadne.attention calls
    it by itself.
    """
    mode = _sink_mode(sink, sink_mode)
    if stream is None and _framework(q) == "torch":
        from . import ops

        return ops.attention_backward(q, k, v, out, lse, dout, pattern, sink, mode, cu_seqlens, cu_seqlens_k, blocks,
                                      order, scale, backend, deterministic)
    dq, dk, dv = (_empty(x, tuple(x.shape), False) for x in (q, k, v))
    dsink = _empty(q, (q.shape[1],), not _is_f64(q)) if mode != "none" else None  # float64 beside float64 q
    bf16 = any(_is_ml_dtypes_bf16(x) for x in (q, k, v, out, dout))
    with _on_device(q):
        _ariadne.attention_backward_into(
            _bits(q), _bits(k), _bits(v), _bits(out), lse, _bits(dout), _bits(dq), _bits(dk), _bits(dv), dsink,
            pattern, _ints(cu_seqlens), _ints(cu_seqlens_k), blocks, _f32(sink, q), mode, float(scale), backend,
            _stream_of(q, stream), bf16, _ints(order), deterministic=bool(deterministic))
    return dq, dk, dv, dsink


def backend_supports(
    backend: str,
    q: Array,
    k: Array,
    v: Array,
    pattern: Pattern = Pattern.full(),
    sink: Optional[Array] = None,
    sink_mode: Optional[str] = None,
    cu_seqlens: Optional[Union[Array, Sequence[int]]] = None,
    cu_seqlens_k: Optional[Union[Array, Sequence[int]]] = None,
    blocks: Optional[BlockMask] = None,
    out: Optional[Array] = None,
) -> Tuple[bool, str]:
    """(supported, why): whether `backend` can run attention() with these arguments; when it
    cannot, `why` names the missing feature. Shapes and dtypes are checked as attention() does."""
    if out is None:
        out = _empty(q, tuple(q.shape), False)
    bf16 = any(_is_ml_dtypes_bf16(x) for x in (q, k, v, out))
    return _backend_supports(backend, _bits(q), _bits(k), _bits(v), _bits(out), None, pattern, _ints(cu_seqlens),
                             _ints(cu_seqlens_k), blocks, _f32(sink, q), _sink_mode(sink, sink_mode), bf16)


def _grids(grids: Union[Grid, Sequence[Grid]]) -> list:
    """One (h, w) grid or a list of them, as a list of (h, w) tuples."""
    if len(grids) == 2 and all(isinstance(x, (int, np.integer)) for x in grids):
        return [(int(grids[0]), int(grids[1]))]
    return [(int(h), int(w)) for h, w in grids]


def order(grids: Union[Grid, Sequence[Grid]], kind: str = "block_row", merge: int = 2, window: int = 4) -> TokenOrder:
    """Token order `kind` ('raster', 'qwen_window', 'block_row', 'block_col') of one (h, w) patch
    grid or a list of them packed one after another. merge: merge-unit side in patches; window:
    Qwen window side in merge units. The result's perm / inverse / cu_seqlens / cu_windows / coords
    are read-only numpy arrays (int32, coords float32 [total, 2])."""
    return _ariadne.make_order(kind, _grids(grids), merge, window)


def _images(images: Union[int, Grid, Sequence[Grid]], patch: int, merge: int) -> list:
    if isinstance(images, (int, np.integer)):
        return [image_grid(int(images), patch, merge)]
    return _grids(images)


def flops(
    schedule: Union[str, Schedule] = "ariadne",
    images: Union[int, Grid, Sequence[Grid]] = 896,
    window: int = 64,
    heads: int = 16,
    head_dim: int = 80,
    patch: int = 14,
    merge: int = 2,
    qwen_window: int = 4,
    tile: Tuple[int, int] = (128, 128),
) -> ScheduleCost:
    """Whole-encoder attention cost of a schedule (name, short syntax or Schedule) on images given
    as one side in pixels (e.g. 896), one (h, w) patch grid, or a list of grids. Qwen2.5-VL
    defaults. `.flops` is one plain forward (4 * head_dim per allowed pair); `.flops_paper` the
    paper's convention (4x); `.tiles` / `.useful_fraction` what a tiled kernel visits."""
    s = _ariadne.schedule(schedule, window) if isinstance(schedule, str) else schedule
    return schedule_cost(s, _images(images, patch, merge), heads, head_dim, patch, merge, qwen_window, tuple(tile))


def receptive_field(
    schedule: Union[str, Schedule],
    grid: Grid,
    start: Optional[Tuple[int, int]] = None,
    window: int = 4,
    merge: int = 1,
    qwen_window: int = 4,
) -> ReceptiveField:
    """How far one token's information spreads through a schedule on an (h, w) grid, starting at
    patch `start` (default: the centre). merge 1 = token level, as in the talk's 10x14, window-4
    example. `.coverage` float64 [layers]; `.reached` int32 [h, w]."""
    s = _ariadne.schedule(schedule, window) if isinstance(schedule, str) else schedule
    h, w = int(grid[0]), int(grid[1])
    r, c = start if start is not None else (h // 2, w // 2)
    return _ariadne.receptive_field(s, (h, w), int(r), int(c), merge, qwen_window)


# ---- block-sparse prefill (estimate.hpp, prefill.hpp) ----

def estimate(
    q: Array,
    k: Array,
    method: str = "rr",
    tau: float = 0.95,
    stride: int = 8,
    block: int = 128,
    tau_per_head: Sequence[float] = (),
    offset: str = "paper",
    protect: Optional[Sequence[str]] = None,
    scale: float = 0.0,
    cu_seqlens: Optional[Sequence[int]] = None,
    cu_seqlens_k: Optional[Sequence[int]] = None,
    backend: str = "auto",
) -> EstimateResult:
    """Block-sparse mask of a causal prefill by `method`: 'rr' (RRAttention), 'xattn' (XAttention)
    or 'oracle' (exact block masses, the ground truth).

    q: [total_q, heads_q, head_dim]; k: [total_k, heads_kv, head_dim] host arrays (float32,
    float16, bfloat16), head_dim contiguous. tau: share of each row's score mass to keep (or one
    per query head in tau_per_head); stride S divides block B; offset 'paper' or 'released' (rr's
    sampling formula); protect: None (as published) or names among 'last_row', 'sink',
    'diagonal'. cu_seqlens: packed sequences (keys: cu_seqlens_k, lq <= lk). Returns an
    EstimateResult whose .mask is a BlockMask that attention(..., blocks=mask) reads as it is."""
    bf16 = _is_ml_dtypes_bf16(q) or _is_ml_dtypes_bf16(k)
    return _ariadne.estimate(_bits(q), _bits(k), method, block, stride, tau, list(tau_per_head), offset,
                             None if protect is None else list(protect), float(scale),
                             None if cu_seqlens is None else [int(x) for x in cu_seqlens],
                             None if cu_seqlens_k is None else [int(x) for x in cu_seqlens_k], backend, bf16)


def rr_estimate(q: Array, k: Array, tau: float = 0.95, stride: int = 8, block: int = 128, **kwargs) -> EstimateResult:
    """RRAttention's mask (SPEC B.2): estimate(q, k, method="rr", ...)."""
    return estimate(q, k, method="rr", tau=tau, stride=stride, block=block, **kwargs)


def prefill(
    q: Array,
    k: Array,
    v: Array,
    method: str = "rr",
    tau: float = 0.95,
    stride: int = 8,
    block: int = 128,
    dense: bool = False,
    offset: str = "paper",
    protect: Optional[Sequence[str]] = None,
    scale: float = 0.0,
    cu_seqlens: Optional[Sequence[int]] = None,
    cu_seqlens_k: Optional[Sequence[int]] = None,
    out: Optional[Array] = None,
    lse: Union[bool, Array] = False,
    estimate_backend: str = "auto",
    attention_backend: str = "auto",
) -> Tuple[Array, Optional[Array], PrefillResult]:
    """Causal block-sparse prefill: estimate a mask (skipped when dense), then attention on it.
    Shapes as attention(); returns (out, lse, result) with result.estimate and result.stats."""
    if out is None:
        out = _empty(q, tuple(q.shape), False)
    if lse is True:
        lse = _empty(q, (q.shape[1], q.shape[0]) if len(q.shape) >= 2 else (0, 0), True)
    elif lse is False:
        lse = None
    bf16 = any(_is_ml_dtypes_bf16(x) for x in (q, k, v, out))
    result = _ariadne.prefill_into(
        _bits(q), _bits(k), _bits(v), _bits(out), lse, dense, method, block, stride, tau, offset,
        None if protect is None else list(protect), float(scale),
        None if cu_seqlens is None else [int(x) for x in cu_seqlens],
        None if cu_seqlens_k is None else [int(x) for x in cu_seqlens_k], estimate_backend, attention_backend, bf16)
    return out, lse, result


# ---- decode over a paged KV cache (decode.hpp) ----

class PagedKVCache(_ariadne.PagedKVCache):
    """Paged KV cache in host memory (ariadne/decode.hpp): PagedKVCache(kv_heads, head_dim, page_size=64,
    dtype='f32' | 'bf16' | 'f16', summary_stride=8).

        cache = ariadne.PagedKVCache(kv_heads=2, head_dim=64, page_size=16)
        s = cache.add_sequence()
        cache.append(s, k, v)              # [n, kv_heads, head_dim]
        cache.length(s), cache.pages(s), cache.page_table(s)

    append() takes numpy arrays (float32, float16, ml_dtypes bfloat16) and torch CPU tensors; the rest
    is the native class's (key_sum / key_min / key_max per pool page, as copies)."""

    def append(self, seq: int, k: Array, v: Array) -> None:
        """Appends n tokens: k, v [n, kv_heads, head_dim] (head_dim contiguous, any token stride),
        stored in the cache's dtype; the touched pages' key summaries are updated."""
        _need_array(k, "k")
        _need_array(v, "v")
        bf16 = _is_ml_dtypes_bf16(k) or _is_ml_dtypes_bf16(v)
        super().append(seq, _bits(k), _bits(v), bf16)


def _need_array(x: Any, name: str) -> None:
    # The native functions take DLPack arrays only; a list would fail there with a signature dump
    # that does not say which argument was wrong.
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise Error(f"{name}: expected an array (numpy, torch), got {type(x).__name__}")


def _seq_ids(seqs: Union[Array, Sequence[int]]) -> list:
    """Sequence ids as a list of ints: from a list, a 1-d integer numpy array or a CPU tensor."""
    try:
        ids = np.asarray(seqs.cpu() if _framework(seqs) == "torch" else seqs)
    except Exception as e:  # an object numpy cannot read: say which argument it was
        raise Error(f"seqs: expected a 1-d sequence of sequence ids, got {type(seqs).__name__} ({e})") from None
    if ids.ndim != 1 or (ids.size > 0 and not np.issubdtype(ids.dtype, np.integer)):
        raise Error(f"seqs: expected a 1-d sequence of integer sequence ids, got {ids.dtype} with shape {ids.shape}")
    if ids.size and (ids.min() < np.iinfo(np.int32).min or ids.max() > np.iinfo(np.int32).max):
        raise Error("seqs: a sequence id is outside the int32 range")
    return [int(x) for x in ids]


def decode_attention(
    q: Array,
    cache: PagedKVCache,
    seqs: Union[Array, Sequence[int]],
    window: int = -1,
    sink: Optional[Array] = None,
    sink_mode: Optional[str] = None,
    scale: float = 0.0,
    selection: Optional[PageSelection] = None,
    out: Optional[Array] = None,
    lse: Union[bool, Array] = True,
    backend: str = "auto",
) -> Tuple[Array, Optional[Array]]:
    """Decode attention: row b of q is the newest token of cache sequence seqs[b] (its k and v
    already appended), and attends to that sequence's cached tokens (dense), or to the pages a
    `selection` keeps (sparse decode; select_pages() makes one).

    q: [batch, heads_q, head_dim] host array (numpy float32 / float16 / ml_dtypes bfloat16, or a torch
        CPU tensor), head_dim contiguous; heads_q a multiple of the cache's kv_heads (GQA).
    seqs: [batch] cache sequence ids (a list, an integer numpy array or a CPU tensor).
    window: the query sees its `window` previous tokens and itself; -1: every token.
    sink: [heads_q] logits (scaled-score units); sink_mode 'denominator' (default when a sink is
        given) or 'key0' (added to token 0's logit when the window reaches it).
    scale: 0 selects 1/sqrt(head_dim). selection: a PageSelection of this batch, or None.
    out: [batch, heads_q, head_dim] float32, float16 or bfloat16 (a torch tensor), written in place
        (each value rounded once from the float32 result); allocated like q (float32) when None.
    lse: True (allocate, the default), False (None) or a float32 [batch, heads_q] array; natural log,
        includes the sink.
    backend: 'auto' (the CPU kernel), 'cpu' or 'reference' (float64, one row at a time).

    Returns (out, lse). Raises ariadne.Error (a ValueError) naming the argument on bad input. The GIL
    is released while it runs.
    """
    _need_array(q, "q")
    if out is None:
        out = _empty(q, tuple(q.shape), True)
    if lse is True:
        lse = _empty(q, tuple(q.shape[:2]) if len(q.shape) >= 2 else (0, 0), True)
    elif lse is False:
        lse = None
    _ariadne.decode_into(_bits(q), cache, _seq_ids(seqs), out, lse, int(window), _f32(sink),
                         _sink_mode(sink, sink_mode), float(scale), selection, backend, _is_ml_dtypes_bf16(q))
    return out, lse


def select_pages(
    q: Array,
    cache: PagedKVCache,
    seqs: Union[Array, Sequence[int]],
    scorer: str = "rr",
    tau: float = 0.9,
    sink_pages: int = 1,
    recent_pages: int = 1,
    rotate: bool = True,
    step: int = 0,
    window: int = -1,
    sink: Optional[Array] = None,
    sink_mode: Optional[str] = None,
    scale: float = 0.0,
) -> PageSelection:
    """The pages sparse decode reads for this step's queries, one set per (sequence, KV head) shared
    by the GQA group: every visible page is scored by `scorer` ('rr': key-stride sums, 'quest': the
    min/max bound, 'oracle': the exact attention mass), normalized per query head and averaged over
    the group; the smallest set reaching `tau` of that mass is kept, plus the first `sink_pages`
    and the last `recent_pages` visible pages. rotate / step: rr scores each key stride with one
    query head of the group, rotated with the step. q, seqs, window, sink and scale as for
    decode_attention(); pass the result as its selection=. Fields: row_ptr, pages (int32), visible,
    kept_mass, density, ms_select."""
    _need_array(q, "q")
    return _ariadne.select_pages(_bits(q), cache, _seq_ids(seqs), scorer, float(tau), int(sink_pages),
                                 int(recent_pages), bool(rotate), int(step), int(window), _f32(sink),
                                 _sink_mode(sink, sink_mode), float(scale), _is_ml_dtypes_bf16(q))


def page_masses(
    q: Array,
    cache: PagedKVCache,
    seqs: Union[Array, Sequence[int]],
    window: int = -1,
    sink: Optional[Array] = None,
    sink_mode: Optional[str] = None,
    scale: float = 0.0,
) -> list:
    """Per row (b, g) = b * kv_heads + g, the exact attention mass of each visible page (float64
    [visible pages]), normalized per query head and averaged over the GQA group (the oracle's
    score). Arguments as for decode_attention()."""
    _need_array(q, "q")
    return _ariadne.page_masses(_bits(q), cache, _seq_ids(seqs), int(window), _f32(sink), _sink_mode(sink, sink_mode),
                                float(scale), _is_ml_dtypes_bf16(q))


def kept_page_mass(
    q: Array,
    cache: PagedKVCache,
    seqs: Union[Array, Sequence[int]],
    selection: PageSelection,
    window: int = -1,
    sink: Optional[Array] = None,
    sink_mode: Optional[str] = None,
    scale: float = 0.0,
) -> Array:
    """float64 [rows]: per row, the share of the exact attention mass that the selection's pages
    hold (its recall; 1 when it keeps every visible page). Arguments as for decode_attention()."""
    _need_array(q, "q")
    return _ariadne.kept_page_mass(_bits(q), cache, _seq_ids(seqs), selection, int(window), _f32(sink),
                                   _sink_mode(sink, sink_mode), float(scale), _is_ml_dtypes_bf16(q))


# ---- SHS-Index (shs.hpp) ----

def diagnose_layer(
    q: Array,
    k: Array,
    order: TokenOrder,
    pattern: Pattern = Pattern.full(),
    cu_seqlens: Optional[Sequence[int]] = None,
    sink: Optional[Array] = None,
    sink_mode: Optional[str] = None,
    scale: float = 0.0,
    backend: str = "auto",
) -> LayerDiag:
    """Received attention, attention distance and entropy of one encoder layer on one image.

    q, k: [tokens, heads, head_dim] host arrays after RoPE, tokens in `order`'s sequence order (one
    image). pattern and cu_seqlens: as layer_pattern() returns them for the layer. A layer with a
    sink is run twice, with and without it (for the sink allocation). The result's arrays are in
    spatial raster order: received [heads, tokens]."""
    bf16 = _is_ml_dtypes_bf16(q) or _is_ml_dtypes_bf16(k)
    cu = None if cu_seqlens is None else [int(x) for x in cu_seqlens]
    return _ariadne.diagnose_layer(_bits(q), _bits(k), order, pattern, cu, _f32(sink, q), _sink_mode(sink, sink_mode),
                                   float(scale), backend, bf16)


def shs_index(images: Sequence[Tuple[str, Array, Sequence[LayerDiag]]], patch: int = 14) -> dict:
    """The SHS-Index of images given as (name, labels int8 [h, w] from label_patches, [LayerDiag per
    layer]): mean over scored images, layers and heads of the folded AUROC of FG vs BG received
    attention, with the companion measures. Returns ShsAccumulator.summary()'s dict."""
    acc = None
    for name, labels, diags in images:
        labels = np.ascontiguousarray(labels, dtype=np.int8)
        if acc is None:
            acc = ShsAccumulator(len(diags), diags[0].heads, patch)
        acc.add(name, (labels.shape[0], labels.shape[1]), labels, list(diags))
    if acc is None:
        raise Error("shs_index: no image given")
    return acc.summary()


# ---- vision encoder (vit.hpp) ----

PathOrImage = Any  # a PNG / JPEG file (str or os.PathLike), or an RGB uint8 array [height, width, 3]


def _config(config: Union[str, VitConfig]) -> VitConfig:
    return VitConfig.named(config) if isinstance(config, str) else config


def load_vit_weights(
    files: Union[str, "os.PathLike[str]", Sequence[Union[str, "os.PathLike[str]"]]],
    config: Union[str, VitConfig] = "qwen2.5-vl",
    sink_init: float = 0.0,
) -> VitWeights:
    """The encoder's weights from one safetensors file or the shards of one checkpoint. Sizes come
    from the tensors; heads, window, full layers and theta from the file's 'vision_config' metadata,
    else from `config` (a VitConfig or a preset name: 'qwen2.5-vl', 'qwen2.5-vl-7b', 'small'). Sinks
    the file lacks get sink_init."""
    names = [files] if isinstance(files, (str, os.PathLike)) else list(files)
    return _ariadne.load_vit_weights([os.fspath(f) for f in names], _config(config), float(sink_init))


def _image(x: PathOrImage) -> Array:
    return read_image(os.fspath(x)) if isinstance(x, (str, os.PathLike)) else x


def _preprocess_options(min_pixels, max_pixels, mean, std) -> dict:
    """The options given (None: the library's default) as the native functions take them."""
    given = {"min_pixels": min_pixels, "max_pixels": max_pixels, "mean": mean, "std": std}
    return {k: (tuple(v) if k in ("mean", "std") else int(v)) for k, v in given.items() if v is not None}


def preprocess(
    images: Union[PathOrImage, Sequence[PathOrImage]],
    config: Union[str, VitConfig] = "qwen2.5-vl",
    min_pixels: Optional[int] = None,
    max_pixels: Optional[int] = None,
    mean: Optional[Tuple[float, float, float]] = None,
    std: Optional[Tuple[float, float, float]] = None,
) -> PixelBatch:
    """Pixel rows of one image or a batch, as HF's PIL-backend Qwen2VLImageProcessor makes them (bit
    for bit): smart_resize, PIL-exact bicubic, /255, (x - mean) / std, patch rows. Images are file
    paths or RGB uint8 arrays [height, width, 3]. Returns a PixelBatch: .values float32 [tokens,
    patch_dim] in block_row order, image after image, and .grids [(h, w)]. Options left None keep
    the library's defaults (PreprocessOptions in vit.hpp: Qwen's pixel bounds, CLIP's mean and std)."""
    single = isinstance(images, (str, os.PathLike)) or hasattr(images, "shape")
    batch = [images] if single else list(images)
    options = _preprocess_options(min_pixels, max_pixels, mean, std)
    return _ariadne.preprocess_images([_image(x) for x in batch], _config(config), **options)


def preprocess_video(
    frames: Union[str, "os.PathLike[str]", Sequence[PathOrImage]],
    config: Union[str, VitConfig] = "qwen2.5-vl",
    min_pixels: Optional[int] = None,
    max_pixels: Optional[int] = None,
    mean: Optional[Tuple[float, float, float]] = None,
    std: Optional[Tuple[float, float, float]] = None,
) -> PixelBatch:
    """Pixel rows of one video clip, as HF's Qwen2VL video processor makes them: `frames` is a folder
    (its .jpg/.jpeg/.png files in name order) or a sequence of file paths or RGB uint8 arrays, all of
    one size, in time order. The size is resized as an image's, the frame count is padded to a
    multiple of the temporal patch (2) by repeating the last frame, and each frame pair becomes one
    temporal patch: .grids holds one (h, w) per temporal patch, which encode() runs block-diagonally
    over time (every layer attends within its temporal patch)."""
    if isinstance(frames, (str, os.PathLike)):
        folder = os.fspath(frames)
        if not os.path.isdir(folder):
            raise Error(f"preprocess_video: {folder} is not a folder (give a folder or a list of frames)")
        names = sorted(n for n in os.listdir(folder) if n.lower().endswith((".jpg", ".jpeg", ".png")))
        if not names:
            raise Error(f"preprocess_video: {folder}: no .jpg, .jpeg or .png frame")
        frames = [os.path.join(folder, n) for n in names]
    options = _preprocess_options(min_pixels, max_pixels, mean, std)
    return _ariadne.preprocess_video([_image(x) for x in frames], _config(config), **options)


def encode(
    weights: VitWeights,
    pixels: Union[PixelBatch, Array],
    schedule: Union[str, Schedule],
    grids: Optional[Union[Grid, Sequence[Grid]]] = None,
    window: int = 64,
    backend: str = "cpu",
    sink_mode: str = "denominator",
    keep_hidden: bool = False,
) -> EncodeResult:
    """The vision encoder with an attention schedule.

    pixels: a PixelBatch (preprocess()), or float32 [tokens, patch_dim] host rows in block_row order
    with their grids [(h, w)] (patches; sides multiples of config.merge). schedule: a Schedule, a
    preset name ('chunk' is Qwen2.5-VL's own layout; 'full', 'ariadne', 'swa1d+sink', ...) or the
    short syntax, adapted to the encoder's depth by vit_schedule(schedule, weights.config, window).
    backend: the encoder's backend ('cpu', 'reference' or 'cuda'), as `ariadne encode --backend`.
    Returns an EncodeResult: .out float32 [units, out_hidden] (units = tokens / merge^2, native
    order), .attention_backend (what ran), .times (ms per stage), .hidden with keep_hidden. The
    pixel rows are copied once (the C++ API owns them); the GIL is released while it runs."""
    if isinstance(pixels, PixelBatch):
        if grids is None:
            grids = pixels.grids
        pixels = pixels.values
    if grids is None:
        raise Error("encode: grids are required with a pixel array (they come with a PixelBatch)")
    if isinstance(schedule, str):
        schedule = vit_schedule(schedule, weights.config, int(window))
    return _ariadne.encode(weights, pixels, _grids(grids), schedule, backend, sink_mode, bool(keep_hidden))
