"""ariadne as an attention backend of HF transformers.

    import ariadne.hf
    ariadne.hf.register()                       # once per process
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="ariadne")
    # or: model.set_attn_implementation("ariadne")

What is mapped from the model (per layer, as transformers passes it to attention functions):
  - causal or not: the `is_causal` argument, else `module.is_causal` (decoder LMs are causal,
    vision towers such as Qwen2.5-VL's are not);
  - sliding window: the `sliding_window` argument (Mistral, Qwen2, GPT-OSS sliding layers...), else
    `module.sliding_window`. transformers' window W lets a query see W keys ending at itself, so
    causal layers get Pattern.window(W - 1, 0) and bidirectional ones Pattern.window(W - 1, W - 1);
  - sinks: the `s_aux` argument (GPT-OSS passes its per-head `sinks`), else `module.sinks`; the
    denominator form, in the units of the scaled scores, as GPT-OSS defines them;
  - scale: the `scaling` argument; GQA: read from the tensor shapes;
  - padding: the 2D padding mask of transformers' flash-attention mask function (registered for the
    same name), None when no token is padded. Each batch row's unpadded keys must be one contiguous
    run (left or right padding; dynamic or static KV cache); padded query rows get zeros. Without a
    mask, the empty slots of a static cache are told by the position ids (counting from 0);
  - packed sequences: the `cu_seq_lens_q` / `cu_seq_lens_k` arguments of flash-style callers, or
    position ids restarting at 0 inside one unpadded row (packed training-style batches).
Vision towers that split work by windows themselves (Qwen2.5-VL calls the attention function once
per window or image when the implementation is not flash attention) work as they are.

Under torch.compile (transformers compiles static-cache generation on GPUs by default) the ariadne
calls are custom ops (ariadne.ops) inside the compiled graph; reading a padding mask or position ids
on the host (which needs the values) breaks the graph at that point only.

Training works: with gradients enabled the calls are the differentiable op (q, k, v and a module's
learnable `sinks` get their gradients). Not supported (raises NotImplementedError): dropout in
training, softcapping, arbitrary 4D masks and padding masks with holes.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

import ariadne

_BACKEND = {"name": "auto"}


def _pattern(causal: bool, sliding_window: Optional[int]) -> ariadne.Pattern:
    if sliding_window is None or sliding_window <= 0:
        return ariadne.Pattern.causal() if causal else ariadne.Pattern.full()
    w = int(sliding_window) - 1
    return ariadne.Pattern.window(w, 0 if causal else w)


def _valid_run(mask_row: torch.Tensor) -> Tuple[int, int]:
    """[start, end) of the unpadded tokens of one batch row of a 2D padding mask."""
    idx = torch.nonzero(mask_row, as_tuple=False).flatten()
    if idx.numel() == 0:
        return 0, 0
    start, end = int(idx[0]), int(idx[-1]) + 1
    if end - start != idx.numel():
        raise NotImplementedError("ariadne HF backend: a padding mask with holes (padding inside a sequence)")
    return start, end


def _packed_from_positions(position_ids: Optional[torch.Tensor], length: int) -> Optional[torch.Tensor]:
    """cu_seqlens of sequences packed into one row, told by position ids restarting at 0 (as
    transformers' flash-attention path reads them); None for a single sequence."""
    if position_ids is None or position_ids.dim() != 2 or position_ids.shape != (1, length):
        return None
    starts = torch.nonzero(position_ids[0] == 0, as_tuple=False).flatten()
    if starts.numel() <= 1 or int(starts[0]) != 0:
        return None
    end = torch.tensor([length], device=starts.device, dtype=starts.dtype)
    return torch.cat([starts, end]).to(torch.int32)


def _seen_keys(position_ids: Optional[torch.Tensor], q_len: int, kv_len: int) -> int:
    """Keys holding real tokens when no padding mask is given. A static cache hands over all its
    slots, the unused ones past the tokens seen so far included; without padding transformers
    passes no mask then, and the position of the last query (positions counting from 0) tells how
    many slots are filled. Dynamic caches and plain forwards give kv_len as it is."""
    if q_len >= kv_len or position_ids is None or position_ids.dim() != 2:
        return kv_len
    seen = int(position_ids[0, -1]) + 1
    return seen if q_len <= seen < kv_len else kv_len


# Traced by torch.compile: ariadne.attention on torch tensors is the custom op ariadne::attention_out
# (ariadne.ops), so a compiled model keeps it in its graph. The host-side reading of a padding mask
# or of position ids (int() of a tensor) still splits the graph there; without a mask, position ids
# or packing, the function traces whole.
def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    sliding_window: Optional[int] = None,
    s_aux: Optional[torch.Tensor] = None,
    **kwargs,
) -> Tuple[torch.Tensor, None]:
    """transformers attention function. query: [batch, heads_q, q_len, head_dim]; key, value:
    [batch, heads_kv, kv_len, head_dim]. Returns ([batch, q_len, heads_q, head_dim], None), the
    layout transformers expects from attention functions."""
    if dropout and module.training:
        raise NotImplementedError("ariadne HF backend: attention dropout in training")
    if kwargs.get("softcap") is not None:
        raise NotImplementedError("ariadne HF backend: logit softcapping")
    if attention_mask is not None and attention_mask.dim() != 2:
        raise NotImplementedError(
            "ariadne HF backend: a 4D attention mask; register() installs the 2D padding-mask function for the name")

    is_causal = kwargs.get("is_causal")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    if sliding_window is None:
        sliding_window = getattr(module, "sliding_window", None)
    if s_aux is None:
        s_aux = getattr(module, "sinks", None)
    pattern = _pattern(bool(is_causal), sliding_window)
    # Not detached: learnable sinks (a module's `sinks` parameter) get their gradient.
    sink = None if s_aux is None else s_aux.to(torch.float32).reshape(-1).contiguous()
    # Training: the functional op (differentiable), its results copied into `out` by autograd-aware
    # slice assignment; inference writes into `out` directly.
    grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (query, key, value, sink))
    scale = 0.0 if scaling is None else float(scaling)
    backend = _BACKEND["name"]

    batch, heads_q, q_len, head_dim = query.shape
    kv_len = key.shape[2]
    out = (torch.zeros if grad else torch.empty)(batch, q_len, heads_q, head_dim, dtype=query.dtype,
                                                 device=query.device)

    def attend(q, k, v, dst, **args):
        if grad:
            dst[...] = ariadne.attention(q, k, v, pattern=pattern, sink=sink, scale=scale, backend=backend, **args)[0]
        else:
            ariadne.attention(q, k, v, pattern=pattern, sink=sink, out=dst, scale=scale, backend=backend, **args)

    # [batch, heads, len, dim] -> per batch row [len, heads, dim]: a strided view, no copy.
    qs, ks, vs = (t.transpose(1, 2) for t in (query, key, value))

    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is None and batch == 1 and attention_mask is None and q_len == kv_len:
        cu_q = _packed_from_positions(kwargs.get("position_ids"), q_len)
    if cu_q is not None and batch == 1 and attention_mask is None:
        attend(qs[0], ks[0], vs[0], out[0], cu_seqlens=cu_q.to(torch.int32),
               cu_seqlens_k=None if cu_k is None else cu_k.to(torch.int32))
        return out, None

    seen = _seen_keys(kwargs.get("position_ids"), q_len, kv_len) if attention_mask is None else kv_len
    for b in range(batch):
        if attention_mask is None:
            attend(qs[b], ks[b, :seen], vs[b, :seen], out[b])
            continue
        # Keys [start, end) are real tokens. The mask may be shorter than kv_len (a static cache:
        # the slots past it are unused). In a prefill (q_len == kv_len) query j is token j; with a
        # cache the queries are the last q_len real tokens, ending at `end`.
        start, end = _valid_run(attention_mask[b, -kv_len:])
        if q_len == kv_len:
            q_lo, q_hi = start, end
        else:
            q_lo, q_hi = max(start - (end - q_len), 0), q_len
        if not grad:
            out[b].zero_()
        if q_hi <= q_lo:
            continue
        # The last real query sits at the last real key, so ariadne's bottom-right alignment of
        # queries to keys holds for the trimmed sequence.
        attend(qs[b, q_lo:q_hi], ks[b, start:end], vs[b, start:end], out[b, q_lo:q_hi])
    return out, None


def register(name: str = "ariadne", backend: str = "auto") -> None:
    """Registers attention_forward with transformers as `name` (use attn_implementation=name), with
    transformers' flash-attention mask function for the same name so that only 2D padding masks
    are built. backend: 'auto', 'reference', 'cpu' or 'cuda'."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    _BACKEND["name"] = backend
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS["flash_attention_2"])
