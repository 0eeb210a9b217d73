"""ariadne attention as torch.library custom ops, so that torch.compile traces it (fullgraph) and
CUDA graphs capture it.

    import torch, ariadne
    out, lse = ariadne.attention(q, k, v, pattern=ariadne.Pattern.window(64, 64), lse=True)  # torch tensors
    torch.ops.ariadne.attention(q, k, v, window_left=64, window_right=64)                     # the op itself

Two ops, both with CPU and CUDA kernels (the native attention_into on DLPack views of the
tensors, no copies) and fake (meta) kernels that only allocate:

- `ariadne::attention` (functional): returns (out, lse). out is a new tensor like q (contiguous,
  dtype of q, or float32 with out_f32=True); lse float32 [heads_q, total_q] when return_lse, else
  an empty float32 tensor [0].
  Differentiable in q, k, v and sink (torch.library autograd: the backward op below on the saved
  out and lse; the LSE itself is not differentiable).
- `ariadne::attention_backward` (functional): (dq, dk, dv, dsink) from q, k, v, out, lse and dout,
  with the pattern arguments of ariadne::attention and `deterministic`.
- `ariadne::attention_out` (in place, not differentiable): writes out (and lse, entropy, distance, received when given),
  returns nothing. ariadne.attention(..., out=t) routes here.

The pattern is encoded as op arguments: window_left / window_right (-1 = unbounded side) and chunk
as ints (Pattern.causal() is window(-1, 0)); cu_seqlens_q / cu_seqlens_k, order and the block mask
(block_size, block_heads, block_seq_base, block_row_ptr, block_col_idx: a BlockMask's CSR arrays)
as optional int32 tensors; sink a float32 tensor [heads_q] (float64 with float64 q, which runs on
the reference backend: torch.autograd.gradcheck in double) with sink_mode 'none' / 'denominator' /
'key0'. The kernels launch on torch's current stream of q's device (the capture stream under CUDA
graphs); host metadata for CUDA tensors is uploaded on that stream without synchronizing.
"""

from __future__ import annotations

import contextlib
import ctypes
from typing import Optional, Sequence, Tuple, Union

import numpy as np
import torch

from . import _ariadne

Tensor = torch.Tensor


def _stream(q: Tensor) -> int:
    return int(torch.cuda.current_stream(q.device).cuda_stream) if q.is_cuda else 0


def _device_ctx(q: Tensor):
    return torch.cuda.device(q.device) if q.is_cuda else contextlib.nullcontext()


def _pattern(window_left: int, window_right: int, chunk: int) -> _ariadne.Pattern:
    p = _ariadne.Pattern()
    p.window_left, p.window_right, p.chunk = int(window_left), int(window_right), int(chunk)
    return p


def _run(q, k, v, out, lse, window_left, window_right, chunk, cu_seqlens_q, cu_seqlens_k, block_size, block_heads,
         block_seq_base, block_row_ptr, block_col_idx, order, sink, sink_mode, scale, backend, entropy=None,
         distance=None, received=None, coords_q=None, coords_k=None) -> None:
    with _device_ctx(q):
        _ariadne.attention_into(
            q.detach(), k.detach(), v.detach(), out, lse, _pattern(window_left, window_right, chunk), cu_seqlens_q,
            cu_seqlens_k, None, sink, sink_mode, float(scale), backend, _stream(q), False, entropy, distance,
            received, coords_q, coords_k, order, block_size=int(block_size), block_heads=int(block_heads),
            block_seq_base=block_seq_base, block_row_ptr=block_row_ptr, block_col_idx=block_col_idx)


def _lse_shape(q: Tensor) -> Tuple:
    return (q.shape[1], q.shape[0])


@torch.library.custom_op("ariadne::attention", mutates_args=(), device_types=("cpu", "cuda"))
def attention_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window_left: int = -1,
    window_right: int = -1,
    chunk: int = 0,
    cu_seqlens_q: Optional[Tensor] = None,
    cu_seqlens_k: Optional[Tensor] = None,
    block_size: int = 0,
    block_heads: int = 0,
    block_seq_base: Optional[Tensor] = None,
    block_row_ptr: Optional[Tensor] = None,
    block_col_idx: Optional[Tensor] = None,
    order: Optional[Tensor] = None,
    sink: Optional[Tensor] = None,
    sink_mode: str = "none",
    scale: float = 0.0,
    return_lse: bool = False,
    out_f32: bool = False,
    backend: str = "auto",
) -> Tuple[Tensor, Tensor]:
    """Functional attention: (out [total_q, heads_q, head_dim], lse [heads_q, total_q] or [0])."""
    out = torch.empty(q.shape, dtype=torch.float32 if out_f32 else q.dtype, device=q.device)
    lse = torch.empty(_lse_shape(q) if return_lse else (0,), dtype=torch.float32, device=q.device)
    _run(q, k, v, out, lse if return_lse else None, window_left, window_right, chunk, cu_seqlens_q, cu_seqlens_k,
         block_size, block_heads, block_seq_base, block_row_ptr, block_col_idx, order, sink, sink_mode, scale, backend)
    return out, lse


@attention_op.register_fake
def _attention_fake(q, k, v, window_left=-1, window_right=-1, chunk=0, cu_seqlens_q=None, cu_seqlens_k=None,
                    block_size=0, block_heads=0, block_seq_base=None, block_row_ptr=None, block_col_idx=None,
                    order=None, sink=None, sink_mode="none", scale=0.0, return_lse=False, out_f32=False,
                    backend="auto"):
    torch._check(q.dim() == 3, lambda: f"ariadne::attention: q has rank {q.dim()}, expected 3")
    out = q.new_empty(q.shape, dtype=torch.float32 if out_f32 else q.dtype)
    lse = q.new_empty(_lse_shape(q) if return_lse else (0,), dtype=torch.float32)
    return out, lse


@torch.library.custom_op("ariadne::attention_out", mutates_args=("out", "lse", "entropy", "distance", "received"),
                         device_types=("cpu", "cuda"))
def attention_out_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Optional[Tensor],
    window_left: int,
    window_right: int,
    chunk: int,
    cu_seqlens_q: Optional[Tensor],
    cu_seqlens_k: Optional[Tensor],
    block_size: int,
    block_heads: int,
    block_seq_base: Optional[Tensor],
    block_row_ptr: Optional[Tensor],
    block_col_idx: Optional[Tensor],
    order: Optional[Tensor],
    sink: Optional[Tensor],
    sink_mode: str,
    scale: float,
    backend: str,
    entropy: Optional[Tensor],
    distance: Optional[Tensor],
    received: Optional[Tensor],
    coords_q: Optional[Tensor],
    coords_k: Optional[Tensor],
) -> None:
    """In-place attention into out (and lse and the diagnostics when given). Every argument is
    required (no defaults): torch 2.11 drops trailing arguments equal to their defaults before it
    looks up the mutated ones by position."""
    _run(q, k, v, out, lse, window_left, window_right, chunk, cu_seqlens_q, cu_seqlens_k, block_size, block_heads,
         block_seq_base, block_row_ptr, block_col_idx, order, sink, sink_mode, scale, backend, entropy, distance,
         received, coords_q, coords_k)


@attention_out_op.register_fake
def _attention_out_fake(q, k, v, out, lse, *args):
    return None


@torch.library.custom_op("ariadne::attention_backward", mutates_args=(), device_types=("cpu", "cuda"))
def attention_backward_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    dout: Tensor,
    window_left: int = -1,
    window_right: int = -1,
    chunk: int = 0,
    cu_seqlens_q: Optional[Tensor] = None,
    cu_seqlens_k: Optional[Tensor] = None,
    block_size: int = 0,
    block_heads: int = 0,
    block_seq_base: Optional[Tensor] = None,
    block_row_ptr: Optional[Tensor] = None,
    block_col_idx: Optional[Tensor] = None,
    order: Optional[Tensor] = None,
    sink: Optional[Tensor] = None,
    sink_mode: str = "none",
    scale: float = 0.0,
    backend: str = "auto",
    deterministic: bool = False,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Gradients (dq, dk, dv, dsink) of ariadne::attention; dsink [heads_q] in the sink's dtype (float32, or
    float64 with float64 q), or [0] without a sink."""
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dsink = torch.empty((q.shape[1],) if sink_mode != "none" else (0,), dtype=_sink_dtype(q), device=q.device)
    with _device_ctx(q):
        _ariadne.attention_backward_into(
            q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(), dout.detach(), dq, dk, dv,
            dsink if sink_mode != "none" else None, _pattern(window_left, window_right, chunk), cu_seqlens_q,
            cu_seqlens_k, None, None if sink is None else sink.detach(), sink_mode, float(scale), backend, _stream(q),
            False, order, block_size=int(block_size), block_heads=int(block_heads), block_seq_base=block_seq_base,
            block_row_ptr=block_row_ptr, block_col_idx=block_col_idx, deterministic=bool(deterministic))
    return dq, dk, dv, dsink


@attention_backward_op.register_fake
def _attention_backward_fake(q, k, v, out, lse, dout, window_left=-1, window_right=-1, chunk=0, cu_seqlens_q=None,
                             cu_seqlens_k=None, block_size=0, block_heads=0, block_seq_base=None, block_row_ptr=None,
                             block_col_idx=None, order=None, sink=None, sink_mode="none", scale=0.0, backend="auto",
                             deterministic=False):
    dsink = q.new_empty((q.shape[1],) if sink_mode != "none" else (0,), dtype=_sink_dtype(q))
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dsink


# ---- autograd of ariadne::attention: the backward op on the saved out and lse ----
# The arguments of ariadne::attention after q, k, v, by position (the order of attention_op).
_META = ("window_left", "window_right", "chunk", "cu_seqlens_q", "cu_seqlens_k", "block_size", "block_heads",
         "block_seq_base", "block_row_ptr", "block_col_idx", "order", "sink", "sink_mode", "scale", "return_lse",
         "out_f32", "backend")


def _setup_context(ctx, inputs, output):
    q, k, v = inputs[:3]
    meta = dict(zip(_META, inputs[3:]))
    out, lse = output
    ctx.mark_non_differentiable(lse)  # the LSE is an output for inspection; its gradient is not formed
    ctx.meta = {key: val for key, val in meta.items() if not isinstance(val, Tensor) and val is not None}
    ctx.tensor_names = [key for key, val in meta.items() if isinstance(val, Tensor)]
    ctx.save_for_backward(q, k, v, out, lse, *[meta[key] for key in ctx.tensor_names])


def _backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse, *tensors = ctx.saved_tensors
    meta = dict(ctx.meta)
    meta.update(zip(ctx.tensor_names, tensors))
    torch._check(lse.numel() > 0, lambda: "ariadne::attention: gradients need the LSE; call the op with "
                                          "return_lse=True (ariadne.attention does when an input requires grad)")
    args = {key: meta.get(key) for key in _META if key not in ("return_lse", "out_f32")}
    dout = grad_out.to(q.dtype).contiguous()
    # torch's switch for deterministic algorithms selects the backward's deterministic mode.
    dq, dk, dv, dsink = torch.ops.ariadne.attention_backward(
        q, k, v, out, lse, dout, **args, deterministic=torch.are_deterministic_algorithms_enabled())
    grads = [dq, dk, dv] + [None] * len(_META)
    if meta.get("sink") is not None and ctx.needs_input_grad[3 + _META.index("sink")]:
        grads[3 + _META.index("sink")] = dsink
    return tuple(grads)


attention_op.register_autograd(_backward, setup_context=_setup_context)


# ---- the front end: ariadne.attention's torch path ----

def _ints(x) -> Optional[Tensor]:
    """Metadata as an int32 contiguous tensor: lists and numpy arrays become host tensors (uploaded
    on the call's stream for CUDA q); tensors keep their device."""
    if x is None:
        return None
    if isinstance(x, Tensor):
        return x if x.dtype == torch.int32 and x.is_contiguous() else x.to(torch.int32).contiguous()
    return torch.tensor(np.asarray(x, dtype=np.int32).reshape(-1).tolist(), dtype=torch.int32)  # a few numbers


def _sink_dtype(q: Tensor) -> torch.dtype:
    """Sinks are float32, or float64 beside float64 q (the reference backend's exact checks, e.g.
    torch.autograd.gradcheck in double)."""
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _sink(x, q: Tensor) -> Optional[Tensor]:
    if x is None:
        return None
    if isinstance(x, Tensor):  # not detached: a sink that requires grad gets one (autograd of ariadne::attention)
        return x.to(device=q.device, dtype=_sink_dtype(q)).reshape(-1).contiguous()
    return torch.tensor(np.asarray(x, dtype=np.float64).reshape(-1).tolist(), dtype=_sink_dtype(q), device=q.device)


# Pattern and BlockMask are native objects whose attributes dynamo cannot read (nanobind getters),
# and older torch (2.11) cannot pass them to assume_constant_result either. So the traced code
# passes only their id() (an int dynamo guards with an identity match on the object), and these
# helpers, run at trace time with the real values, read the object back and return constants.
# A pattern or mask is therefore a constant of the compiled code: another object recompiles, and
# changing a Pattern's fields in place after compiling is not seen. Every object read at trace time
# is kept alive here, so that its id cannot be reused by another object the guard would accept.
_TRACED: list = []


def _object(object_id: int):
    for o in _TRACED:
        if id(o) == object_id:
            return o
    o = ctypes.cast(object_id, ctypes.py_object).value  # alive: the caller holds it during the call
    _TRACED.append(o)
    return o


@torch._dynamo.assume_constant_result
def _pattern_fields_of(pattern_id: int) -> Tuple[int, int, int]:
    p = _object(pattern_id)
    return int(p.window_left), int(p.window_right), int(p.chunk)


@torch._dynamo.assume_constant_result
def _mask_fields_of(mask_id: int) -> Tuple[int, int, bool]:
    m = _object(mask_id)
    return int(m.block), int(m.heads), len(m.seq_block_base) > 0


@torch._dynamo.assume_constant_result
def _mask_array_of(mask_id: int, name: str) -> Tensor:
    return torch.from_numpy(np.array(getattr(_object(mask_id), name), dtype=np.int32))


def _pattern_fields(pattern: _ariadne.Pattern) -> Tuple[int, int, int]:
    if not torch.compiler.is_compiling():
        return int(pattern.window_left), int(pattern.window_right), int(pattern.chunk)
    return _pattern_fields_of(id(pattern))


def _block_arrays(blocks) -> dict:
    """A BlockMask as the op's CSR arguments (host int32 tensors)."""
    if blocks is None:
        return {}
    if torch.compiler.is_compiling():
        mask_id = id(blocks)
        block, heads, has_base = _mask_fields_of(mask_id)
        arrays = {name: _mask_array_of(mask_id, name) for name in ("seq_block_base", "row_ptr", "col_idx")}
    else:
        block, heads, has_base = int(blocks.block), int(blocks.heads), len(blocks.seq_block_base) > 0
        arrays = {name: torch.from_numpy(np.array(getattr(blocks, name), dtype=np.int32))
                  for name in ("seq_block_base", "row_ptr", "col_idx")}
    return dict(block_size=block, block_heads=heads, block_seq_base=arrays["seq_block_base"] if has_base else None,
                block_row_ptr=arrays["row_ptr"], block_col_idx=arrays["col_idx"])


def attention_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dout: Tensor,
                       pattern: _ariadne.Pattern, sink=None, sink_mode: str = "none", cu_seqlens=None,
                       cu_seqlens_k=None, blocks=None, order=None, scale: float = 0.0, backend: str = "auto",
                       deterministic: bool = False) -> Tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
    """ariadne.attention_backward for torch tensors, through ariadne::attention_backward."""
    blocks_args = _block_arrays(blocks)
    dq, dk, dv, dsink = torch.ops.ariadne.attention_backward(
        q, k, v, out, lse, dout, *_pattern_fields(pattern), _ints(cu_seqlens), _ints(cu_seqlens_k),
        blocks_args.get("block_size", 0), blocks_args.get("block_heads", 0), blocks_args.get("block_seq_base"),
        blocks_args.get("block_row_ptr"), blocks_args.get("block_col_idx"), _ints(order), _sink(sink, q), sink_mode,
        float(scale), backend, bool(deterministic))
    return dq, dk, dv, (dsink if sink_mode != "none" else None)


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    pattern: _ariadne.Pattern,
    sink: Optional[Union[Tensor, Sequence[float]]] = None,
    sink_mode: str = "none",
    cu_seqlens: Optional[Union[Tensor, Sequence[int]]] = None,
    cu_seqlens_k: Optional[Union[Tensor, Sequence[int]]] = None,
    blocks=None,
    out: Optional[Tensor] = None,
    lse: Union[bool, Tensor] = False,
    scale: float = 0.0,
    backend: str = "auto",
    entropy: Optional[Tensor] = None,
    distance: Optional[Tensor] = None,
    received: Optional[Tensor] = None,
    coords_q: Optional[Tensor] = None,
    coords_k: Optional[Tensor] = None,
    order: Optional[Union[Tensor, Sequence[int]]] = None,
) -> Tuple[Tensor, Optional[Tensor]]:
    """ariadne.attention for torch tensors, through the custom ops (see the module's docstring)."""
    blocks_args = _block_arrays(blocks)
    # Arguments by position: torch 2.11's in-place custom ops find mutated arguments by position only.
    pattern_args = (*_pattern_fields(pattern), _ints(cu_seqlens), _ints(cu_seqlens_k),
                    blocks_args.get("block_size", 0), blocks_args.get("block_heads", 0),
                    blocks_args.get("block_seq_base"), blocks_args.get("block_row_ptr"),
                    blocks_args.get("block_col_idx"), _ints(order), _sink(sink, q), sink_mode, float(scale))
    diagnostics = any(x is not None for x in (entropy, distance, received, coords_q, coords_k))
    if out is None and not isinstance(lse, Tensor) and not diagnostics:
        # The backward reads the forward's LSE: it is kept whenever a gradient may be asked for.
        needs_lse = bool(lse) or (torch.is_grad_enabled() and any(
            isinstance(t, Tensor) and t.requires_grad for t in (q, k, v, pattern_args[11])))
        res, lse_t = torch.ops.ariadne.attention(q, k, v, *pattern_args, needs_lse, False, backend)
        return res, (lse_t if lse else None)
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if lse is True:
        lse = torch.empty(_lse_shape(q), dtype=torch.float32, device=q.device)
    elif lse is False:
        lse = None
    torch.ops.ariadne.attention_out(q, k, v, out, lse, *pattern_args, backend, entropy, distance, received, coords_q,
                                    coords_k)
    return out, lse
