"""A Qwen2.5-VL-style vision encoder in PyTorch whose every attention call is ariadne's op.

The tower is the one include/ariadne/vit.hpp runs (patch embed as a GEMM on pixel rows, pre-norm
blocks with RMSNorm, 2D RoPE, SwiGLU, the 2x2 merger with exact GELU), with parameter names that
are the checkpoint's (`ariadne encode` / `ariadne shs --weights` read them; checkpoint.py writes
them), plus a pooled head for the study's labels: the multi-label class set and the object count.

Tokens stay in the native block_row order (the pixel rows' order) for the whole forward. A layer
whose schedule entry runs in another order (block_col, qwen_window) hands the op that order as its
fused row index (`order=`: logical row i of the pattern is stored at row order[i]), so nothing is
gathered in PyTorch and autograd needs nothing but the op's own backward. Full layers see whole
images in any order and take none. Sinks are per-head parameters of the layers whose schedule
entry has `+`, used in the denominator form (as the encoder's default).
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

import ariadne

Grid = Tuple[int, int]

# The study's schedules. Uniform presets go through ariadne.vit_schedule, which adapts them to the
# depth (local layers except config.full_layers); Ariadne repeats its 8-layer period RRRR-CCC-F.
SCHEDULES = ("full", "full+sink", "chunk", "chunk+sink", "swa2d", "swa2d+sink", "swa1d", "swa1d+sink", "ariadne")
ARIADNE_PERIOD = "R+R+R+R+C+C+C+F"


def study_config(depth: int = 8, hidden: int = 320, heads: int = 4, intermediate: Optional[int] = None,
                 out_hidden: Optional[int] = None) -> ariadne.VitConfig:
    """The encoder's architecture as ariadne's VitConfig: Qwen's patch 14, temporal 2, merge 2,
    112 px chunk windows and theta, full layers at every 8th layer (7, 15, ...) as Qwen's 4 of 32."""
    if hidden % heads or (hidden // heads) % 4:
        raise ValueError(f"study config: hidden {hidden} / heads {heads} must give a head_dim that is a multiple of 4")
    c = ariadne.VitConfig.named("small")
    c.depth, c.hidden, c.heads = depth, hidden, heads
    c.intermediate = intermediate if intermediate is not None else (hidden * 8 // 3 + 7) // 8 * 8
    c.out_hidden = out_hidden if out_hidden is not None else hidden
    c.window_px = 112
    c.full_layers = [i for i in range(depth) if i % 8 == 7] or [depth - 1]
    c.rope_theta = 10000.0
    c.validate()
    return c


def study_schedule(name: str, config: ariadne.VitConfig, window: int = 64) -> ariadne.Schedule:
    """A study schedule (SCHEDULES) or any short-syntax schedule of config.depth layers."""
    if name == "ariadne":
        if config.depth % 8:
            raise ValueError(f"study schedule 'ariadne': depth {config.depth} is not a multiple of its 8-layer period")
        return ariadne.vit_schedule(f"{config.depth // 8}x({ARIADNE_PERIOD})", config, window)
    return ariadne.vit_schedule(name, config, window)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * y).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, sink: bool):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        # Zero logits: the sink starts as one extra key with score 0 (exp(0) = 1 in the denominator).
        self.sinks = nn.Parameter(torch.zeros(heads)) if sink else None


class Mlp(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate)
        self.up_proj = nn.Linear(hidden, intermediate)
        self.down_proj = nn.Linear(intermediate, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, c: ariadne.VitConfig, sink: bool):
        super().__init__()
        self.norm1 = RMSNorm(c.hidden, c.eps)
        self.norm2 = RMSNorm(c.hidden, c.eps)
        self.attn = Attention(c.hidden, c.heads, sink)
        self.mlp = Mlp(c.hidden, c.intermediate)


class PatchEmbed(nn.Module):
    def __init__(self, c: ariadne.VitConfig):
        super().__init__()
        # Conv3d with kernel = stride is a GEMM on pixel rows of C*T*P*P values (ordered c, t, py, px).
        self.proj = nn.Linear(c.patch_dim, c.hidden, bias=False)


class Merger(nn.Module):
    def __init__(self, c: ariadne.VitConfig):
        super().__init__()
        unit = c.hidden * c.merge * c.merge
        self.ln_q = RMSNorm(c.hidden, c.eps)
        self.mlp = nn.Sequential(nn.Linear(unit, unit), nn.GELU(), nn.Linear(unit, c.out_hidden))


class Head(nn.Module):
    """Mean of an image's merged tokens -> class logits [classes] and count logits [max_count]."""

    def __init__(self, dim: int, classes: int, max_count: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.labels = nn.Linear(dim, classes)
        self.count = nn.Linear(dim, max_count)


class _Plan:
    """Per layer: (Pattern, cu_seqlens int32, order int32 or None) on one device for one grid list."""

    def __init__(self, config: ariadne.VitConfig, schedule: ariadne.Schedule, grids: Sequence[Grid], device):
        orders: Dict[str, ariadne.TokenOrder] = {}

        def order_of(kind: str) -> ariadne.TokenOrder:
            if kind not in orders:
                orders[kind] = ariadne.order(list(grids), kind, config.merge, config.window_units)
            return orders[kind]

        native = order_of("block_row")
        self.layers = []
        for spec in schedule.layers:
            kind = spec.order if spec.kind != "full" else "block_row"
            pattern, cu = ariadne.layer_pattern(spec, order_of(kind))
            index = None
            if kind != "block_row":
                index = torch.from_numpy(ariadne.order_conversion(native, order_of(kind)).copy()).to(device)
            self.layers.append((pattern, torch.from_numpy(np.array(cu)).to(device), index))
        self.config, self.schedule, self.grids, self.device = config, schedule, list(grids), device
        self._orders = orders  # the patterns may point into their orders' arrays: keep them alive
        self._masks: Optional[List[torch.Tensor]] = None
        self._flex_masks: Optional[list] = None

    def flex_masks(self) -> list:
        """Per layer, the FlexAttention BlockMask of dense_masks() (with the sink key where the layer
        has a sink)."""
        if self._flex_masks is None:
            self._flex_masks = _flex_block_masks(self.dense_masks(), [spec.sink for spec in self.schedule.layers])
        return self._flex_masks

    def dense_masks(self) -> List[torch.Tensor]:
        """Per layer, bool [n, n] over one image's tokens in native order: which keys a query sees
        (the same for every image; the SDPA path needs equal grids). Built from the same orders and
        patterns as the op's arguments, so both paths compute the same attention."""
        if self._masks is None:
            if len(set(self.grids)) != 1:
                raise ValueError(f"StudyViT: the sdpa and flex paths need images of one grid, got {self.grids}")
            grid = self.grids[0]
            native = ariadne.order([grid], "block_row", self.config.merge, self.config.window_units)
            self._masks = []
            for spec in self.schedule.layers:
                n = grid[0] * grid[1]
                if spec.kind == "full":
                    self._masks.append(torch.ones((n, n), dtype=torch.bool, device=self.device))
                    continue
                o = ariadne.order([grid], spec.order, self.config.merge, self.config.window_units)
                pattern, cu = ariadne.layer_pattern(spec, o)
                pos = np.empty(n, np.int64)
                pos[ariadne.order_conversion(native, o)] = np.arange(n)  # native row -> position in the layer
                if spec.kind == "window":
                    d = pos[:, None] - pos[None, :]
                    m = (d <= pattern.window_left) & (-d <= pattern.window_right)
                else:  # chunk: the same Qwen window
                    win = np.searchsorted(np.asarray(cu), pos, side="right")
                    m = win[:, None] == win[None, :]
                self._masks.append(torch.from_numpy(m).to(self.device))
        return self._masks


def rope_tables(grids: Sequence[Grid], merge: int, head_dim: int, theta: float, device) -> Tuple[torch.Tensor, ...]:
    """cos, sin float32 [tokens, head_dim] in block_row order, as vit_rope_tables (vit.hpp): angles
    [row * inv_freq, col * inv_freq] duplicated to head_dim, inv_freq in fp32 as HF makes it."""
    quarter, half = head_dim // 4, head_dim // 2
    inv = 1.0 / torch.pow(torch.tensor(float(theta), dtype=torch.float32),
                          torch.arange(0, half, 2, dtype=torch.float32) / half)
    rows, cols = [], []
    for h, w in grids:
        uy, ux, my, mx = torch.meshgrid(torch.arange(h // merge), torch.arange(w // merge), torch.arange(merge),
                                        torch.arange(merge), indexing="ij")
        rows.append((uy * merge + my).reshape(-1))
        cols.append((ux * merge + mx).reshape(-1))
    r = torch.cat(rows).float()[:, None] * inv[None, :quarter]
    c = torch.cat(cols).float()[:, None] * inv[None, :quarter]
    ang = torch.cat([r, c, r, c], dim=1).double()  # fp32 products, cos/sin taken in double as the C++ does
    return ang.cos().float().to(device), ang.sin().float().to(device)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, sink: Optional[torch.Tensor],
          images: int) -> torch.Tensor:
    """Attention of `images` equal-sized images packed as [tokens, heads, head_dim] with one bool
    mask [n, n] through torch's SDPA. A sink is one more key with k = 0 and v = 0 whose logit is
    the sink value (the denominator form), given as an additive mask column."""
    tokens, heads, hd = q.shape
    n = tokens // images
    qb, kb, vb = (t.reshape(images, n, heads, hd).transpose(1, 2) for t in (q, k, v))
    if sink is None:
        out = nn.functional.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask)
    else:
        zero = qb.new_zeros((images, heads, 1, hd))
        kb, vb = torch.cat([kb, zero], dim=2), torch.cat([vb, zero], dim=2)
        bias = torch.zeros((n, n), dtype=torch.float32, device=q.device).masked_fill(~mask, float("-inf"))
        bias = torch.cat([bias.expand(heads, n, n), sink.float()[:, None, None].expand(heads, n, 1)], dim=2)
        out = nn.functional.scaled_dot_product_attention(qb, kb, vb, attn_mask=bias[None].to(q.dtype))
    return out.transpose(1, 2).reshape(tokens, heads, hd)


_flex_compiled = None


def _flex_block_masks(masks: Sequence[torch.Tensor], sinks: Sequence[bool]) -> list:
    """Per layer, FlexAttention's BlockMask (its default 128-token blocks) of the dense bool mask
    [n, n]; a layer with a sink has one more key, n, that every query sees."""
    from torch.nn.attention.flex_attention import create_block_mask

    out = []
    for m, sink in zip(masks, sinks):
        n = m.shape[0]
        if sink:
            def mask_mod(b, h, qi, ki, m=m, n=n):
                return (ki == n) | m[qi, ki.clamp(max=n - 1)]
        else:
            def mask_mod(b, h, qi, ki, m=m):
                return m[qi, ki]
        out.append(create_block_mask(mask_mod, None, None, n, n + int(sink), device=m.device))
    return out


def _flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask, sink: Optional[torch.Tensor],
          images: int) -> torch.Tensor:
    """As _sdpa through FlexAttention (torch.compile'd on the GPU, eager on the CPU): the sink is the
    same extra key with k = v = 0, its logit set to the sink by a score_mod (so FlexAttention's
    backward gives the sink its gradient)."""
    global _flex_compiled
    from torch.nn.attention.flex_attention import flex_attention

    tokens, heads, hd = q.shape
    n = tokens // images
    qb, kb, vb = (t.reshape(images, n, heads, hd).transpose(1, 2) for t in (q, k, v))
    score_mod = None
    if sink is not None:
        zero = qb.new_zeros((images, heads, 1, hd))
        kb, vb = torch.cat([kb, zero], dim=2), torch.cat([vb, zero], dim=2)

        def score_mod(score, b, h, qi, ki):
            return torch.where(ki == n, sink[h].to(score.dtype), score)
    fn = flex_attention
    if q.is_cuda:
        if _flex_compiled is None:
            _flex_compiled = torch.compile(flex_attention, dynamic=False)
        fn = _flex_compiled
    out = fn(qb, kb, vb, score_mod=score_mod, block_mask=block_mask)
    return out.transpose(1, 2).reshape(tokens, heads, hd)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [tokens, heads, head_dim]: x*cos + rotate_half(x)*sin, rotate_half(x) = [-x2, x1]."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos[:, None] + torch.cat([-x2, x1], dim=-1) * sin[:, None]


class StudyViT(nn.Module):
    """The encoder plus the study's head. forward(pixels [tokens, patch_dim] block_row rows, image
    after image; grids [(h, w)]) -> (class logits [images, classes], count logits [images, max_count])."""

    def __init__(self, config: ariadne.VitConfig, schedule: ariadne.Schedule, classes: int, max_count: int,
                 window: int = 64, backend: str = "auto", attention_dtype: Optional[torch.dtype] = None,
                 attention: str = "ariadne"):
        super().__init__()
        if attention not in ("ariadne", "sdpa", "flex"):
            raise ValueError(f"StudyViT: attention '{attention}', expected 'ariadne', 'sdpa' or 'flex'")
        # 'sdpa' runs the same layers through torch's scaled_dot_product_attention with dense masks,
        # 'flex' through FlexAttention with the block masks of the same dense masks: the baselines of
        # the throughput comparison and independent checks of the op's results.
        self.attention = attention
        if len(schedule) != config.depth:
            raise ValueError(f"StudyViT: schedule '{schedule.letters()}' has {len(schedule)} layers, "
                             f"expected config.depth = {config.depth}")
        self.config, self.schedule, self.window = config, schedule, window
        self.backend = backend
        # None: q, k, v keep the activations' dtype; torch.bfloat16 on the GPU with autocast.
        self.attention_dtype = attention_dtype
        self.patch_embed = PatchEmbed(config)
        self.blocks = nn.ModuleList(Block(config, spec.sink) for spec in schedule.layers)
        self.merger = Merger(config)
        self.head = Head(config.out_hidden, classes, max_count)
        self._plans: Dict[Tuple, _Plan] = {}
        self._rope: Dict[Tuple, Tuple[torch.Tensor, torch.Tensor]] = {}

    def _plan(self, grids: Sequence[Grid], device) -> _Plan:
        key = (tuple(grids), str(device))
        if key not in self._plans:
            self._plans[key] = _Plan(self.config, self.schedule, grids, device)
            c = self.config
            self._rope[key] = rope_tables(grids, c.merge, c.head_dim, c.rope_theta, device)
        return self._plans[key]

    def encode(self, pixels: torch.Tensor, grids: Sequence[Grid], observe=None) -> torch.Tensor:
        """The tower: merged tokens [units, out_hidden] in native order (what `ariadne encode` returns).
        observe(layer, q, k, pattern, cu_seqlens, order, sink), when given, sees each layer's q and k
        after RoPE (native order) and the attention arguments, e.g. for diagnostics."""
        c = self.config
        x = self.hidden(pixels, grids, observe)
        unit = c.merge * c.merge
        h = self.merger.ln_q(x).reshape(x.shape[0] // unit, unit * c.hidden)
        return self.merger.mlp(h)

    def hidden(self, pixels: torch.Tensor, grids: Sequence[Grid], observe=None) -> torch.Tensor:
        """The last block's output [tokens, hidden] (fp32) in native order, before the merger."""
        c = self.config
        grids = [(int(h), int(w)) for h, w in grids]
        tokens = sum(h * w for h, w in grids)
        if pixels.dim() != 2 or pixels.shape[0] != tokens or pixels.shape[1] != c.patch_dim:
            raise ValueError(f"StudyViT: pixels have shape {tuple(pixels.shape)}, expected [tokens {tokens}, "
                             f"patch_dim {c.patch_dim}] for grids {grids}")
        plan = self._plan(grids, pixels.device)
        cos, sin = self._rope[(tuple(grids), str(pixels.device))]
        x = self.patch_embed.proj(pixels).float()
        hd = c.head_dim
        for layer, (block, (pattern, cu, order)) in enumerate(zip(self.blocks, plan.layers)):
            qkv = block.attn.qkv(block.norm1(x)).view(tokens, 3, c.heads, hd)
            q = apply_rope(qkv[:, 0].float(), cos, sin)
            k = apply_rope(qkv[:, 1].float(), cos, sin)
            v = qkv[:, 2]
            dtype = self.attention_dtype or x.dtype
            q, k, v = q.to(dtype), k.to(dtype), v.to(dtype).contiguous()
            sink = block.attn.sinks
            if observe is not None:
                observe(layer, q, k, pattern, cu, order, sink)
            if self.attention == "sdpa":
                out = _sdpa(q, k, v, plan.dense_masks()[layer], sink, len(grids))
            elif self.attention == "flex":
                out = _flex(q, k, v, plan.flex_masks()[layer], sink, len(grids))
            else:
                out, _ = ariadne.attention(q, k, v, pattern=pattern, sink=sink, cu_seqlens=cu, order=order,
                                           backend=self.backend)
            # The residual stream stays in fp32 under autocast (the encoder's CUDA path does the same).
            x = x + block.attn.proj(out.reshape(tokens, c.hidden)).float()
            x = x + block.mlp(block.norm2(x)).float()
        return x

    def forward(self, pixels: torch.Tensor, grids: Sequence[Grid]) -> Tuple[torch.Tensor, torch.Tensor]:
        merged = self.encode(pixels, grids)
        unit = self.config.merge ** 2
        counts = [h * w // unit for h, w in grids]
        if len(set(counts)) == 1:
            pooled = merged.reshape(len(grids), counts[0], -1).float().mean(1)
        else:
            pooled = torch.stack([m.float().mean(0) for m in torch.split(merged, counts)])
        z = self.head.norm(pooled)
        return self.head.labels(z), self.head.count(z)


# ---------------------------------------------------------------- pixels

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def pixel_rows(images: torch.Tensor, config: ariadne.VitConfig) -> Tuple[torch.Tensor, List[Grid]]:
    """uint8 [B, H, W, 3] images whose sides are multiples of patch*merge -> (float32 [tokens,
    patch_dim] block_row rows, image after image, grids). The same values as ariadne.preprocess
    (which leaves such sizes unresized): x/255 in double rounded to float, then (x - mean) / std in
    float, `temporal` identical frames, columns (channel, t, py, px)."""
    b, hh, ww, ch = images.shape
    p, m, t = config.patch, config.merge, config.temporal
    if images.dtype != torch.uint8 or ch != 3 or hh % (p * m) or ww % (p * m):
        raise ValueError(f"pixel_rows: images are {images.dtype} {tuple(images.shape)}, expected uint8 [B, H, W, 3] "
                         f"with H and W multiples of {p * m}")
    mean = torch.tensor(CLIP_MEAN, dtype=torch.float32, device=images.device)
    std = torch.tensor(CLIP_STD, dtype=torch.float32, device=images.device)
    x = ((images.double() / 255.0).float() - mean) / std                     # [B, H, W, C]
    gh, gw = hh // p, ww // p
    x = x.reshape(b, gh // m, m, p, gw // m, m, p, 3)                          # b, uy, my, py, ux, mx, px, c
    x = x.permute(0, 1, 4, 2, 5, 7, 3, 6)                                     # b, uy, ux, my, mx, c, py, px
    x = x.unsqueeze(6).expand(b, gh // m, gw // m, m, m, 3, t, p, p)          # temporal copies
    rows = x.reshape(b * gh * gw, 3 * t * p * p).contiguous()
    return rows, [(gh, gw)] * b
