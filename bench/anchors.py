#!/usr/bin/env python3
"""Anchor timings for ariadne's GPU benchmarks: PyTorch SDPA (cuDNN and flash backends) and
FlexAttention on every case of bench/cases.json, in the same run and on the same GPU as ariadne's
own kernels, so that speed claims are ratios against anchors measured side by side.

    python3 bench/anchors.py --out anchors.json             # the real run, on a CUDA GPU
    python3 bench/anchors.py --device cpu --smoke --out x   # logic check on tiny shapes, no GPU

Output: a JSON list; the first record is {"id": "env", "env": {...}}, then one record per case and
implementation: {"id", "impl", "ms", "tflops", "note", ...}; "ms" and "tflops" are null when the
implementation cannot run the case, with the reason in "note". bench/README.md documents the
method (timing, FLOP counts, masks, sink correction); the main points:

- every output is checked against a float32 reference on a subset of query rows before it is
  timed; an implementation that fails the check is not timed (its note says why), so a
  misconfigured anchor cannot win;
- FlexAttention is compiled (torch.compile) outside the timing, with dynamo's recompile limits
  raised and failing instead of falling back to eager;
- times are CUDA-event medians of single calls; a sleep kernel queued before each call lets the
  host enqueue the call before the GPU reaches it, so host overhead is not counted; inputs rotate
  over enough buffer sets to exceed the L2 cache several times. With --graph each anchor is also
  timed as CUDA-graph replays of back-to-back calls ("ms_graph", ariadne's `ms` method).
"""

import argparse
import datetime
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import casespec as cs  # noqa: E402  (path set up above)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.nn.attention.flex_attention import BlockMask, flex_attention  # noqa: E402

try:
    from torch.nn.attention.flex_attention import AuxRequest
except ImportError:  # older torch: return_lse=True instead of return_aux
    AuxRequest = None
try:
    from torch.nn.attention import varlen as _varlen
except ImportError:
    _varlen = None

IMPLS = ("sdpa_cudnn", "sdpa_flash", "flex", "flex_b64")
TOLERANCE = 2e-2      # relative Frobenius error vs the fp32 reference (bf16 in and out)
CHECK_ROWS = 64       # query rows checked per case
L2_BYTES = 60 << 20   # H200; replaced by the device's own figure when torch reports it

# Never let dynamo give up on recompiling and silently run FlexAttention eagerly (the unfused
# reference path): every case has its own shapes and masks, so many recompiles are expected.
_dc = torch._dynamo.config
for _name, _val in (("recompile_limit", 1 << 16), ("cache_size_limit", 1 << 16),
                    ("accumulated_recompile_limit", 1 << 20), ("accumulated_cache_size_limit", 1 << 20)):
    if hasattr(_dc, _name):
        setattr(_dc, _name, _val)
if hasattr(_dc, "fail_on_recompile_limit_hit"):
    _dc.fail_on_recompile_limit_hit = True


class Unsupported(Exception):
    """The implementation cannot run this case; the message is recorded as the note."""


class OverBudget(BaseException):
    """Raised by SIGALRM; a BaseException so that library code catching Exception lets it through."""


def _alarm(signum, frame):
    raise OverBudget()


# ---- specs and data -------------------------------------------------------------------------

class Spec:
    """One attention problem: shapes, pattern, sink, as read from a case."""

    def __init__(self, case):
        self.id = case["id"]
        self.batch, self.tokens = case["batch"], case["tokens"]
        self.hq, self.hkv, self.dim = case["heads_q"], case["heads_kv"], case["dim"]
        self.pattern = cs.Pattern(case["pattern"])
        self.sink = case["sink"] == "denominator"
        self.scale = 1.0 / math.sqrt(self.dim)
        self.seed = zlib.crc32(self.id.encode())

    @property
    def groups(self):
        return self.hq // self.hkv


def randn(shape, gen, dev):
    return torch.randn(shape, generator=gen, device=dev, dtype=torch.float32).to(torch.bfloat16)


def alloc_qkv(spec, layout, gen, dev):
    """Random q [B,Hq,N,d], k, v [B,Hkv,N,d] (logical shapes) stored in `layout`: "bhnd" (heads
    outer) or "bnhd" (tokens outer, the packed [B*N, H, d] layout of varlen kernels)."""
    out = []
    for h in (spec.hq, spec.hkv, spec.hkv):
        if layout == "bhnd":
            out.append(randn((spec.batch, h, spec.tokens, spec.dim), gen, dev))
        else:
            out.append(randn((spec.batch, spec.tokens, h, spec.dim), gen, dev).transpose(1, 2))
    return out


def relayout(t, layout):
    """Logical [B,H,N,d] tensor t stored in `layout` (t itself when it already is)."""
    if layout == "bhnd":
        return t.contiguous()
    return t.transpose(1, 2).contiguous().transpose(1, 2)


def sink_logits(spec, dev):
    """Per-head sink logits, in units of the scaled scores. Random scores of N(0,1) entries give a
    window row an LSE near ln(129) + 0.5 = 5.4, so logits in [3, 6] take a sizable share of the
    mass: a wrong correction shows in the check."""
    g = torch.Generator().manual_seed(spec.seed + 1)
    return (3.0 + 3.0 * torch.rand(spec.hq, generator=g)).to(dev)


def kept_blocks(spec, dev):
    """The "blocks:F" mask: bool [Hq, nb, nb] over 128x128 blocks; per head the nb diagonal blocks
    plus a seeded uniform draw of strictly-lower blocks, casespec.blocks_kept_count in total."""
    n, nb = spec.tokens, spec.tokens // cs.BLOCK
    extra = cs.blocks_kept_count(n, spec.pattern.fraction) - nb
    low = torch.tril_indices(nb, nb, offset=-1)
    kept = torch.zeros(spec.hq, nb, nb, dtype=torch.bool)
    diag = torch.arange(nb)
    kept[:, diag, diag] = True
    g = torch.Generator().manual_seed(spec.seed)
    for h in range(spec.hq):
        pick = torch.randperm(low.shape[1], generator=g)[:extra]
        kept[h, low[0, pick], low[1, pick]] = True
    return kept.to(dev)


def allowed_matrix(spec, rows, keys, kept, head):
    """bool [len(rows), len(keys)]: which keys each of the query rows may see in `head`."""
    p, q, k = spec.pattern, rows[:, None], keys[None, :]
    if p.kind == "full":
        return torch.ones(len(rows), len(keys), dtype=torch.bool, device=rows.device)
    if p.kind == "causal":
        return k <= q
    if p.kind == "window":
        return (k >= q - p.left) & (k <= q + p.right)
    if p.kind == "chunk":
        return (q // p.chunk) == (k // p.chunk)
    return (k <= q) & kept[head][q // cs.BLOCK, k // cs.BLOCK]


def check_rows(spec, gen_seed, dev):
    n = spec.tokens
    fixed = {0, 1, n - 1, n - 2, min(127, n - 1), min(128, n - 1)}
    g = torch.Generator().manual_seed(gen_seed)
    extra = torch.randint(0, n, (CHECK_ROWS,), generator=g).tolist()
    if n <= CHECK_ROWS:
        return torch.arange(n, device=dev)
    rows = set(fixed)
    for r in extra:
        if len(rows) >= CHECK_ROWS:
            break
        rows.add(r)
    rows = sorted(rows)
    return torch.tensor(rows, device=dev)


def reference_rows(spec, q, k, v, sinks, kept, rows):
    """float32 attention output for the query `rows` only: [B, Hq, R, d]. Plain softmax over the
    allowed keys, the sink (if any) as an extra denominator term exp(s_h); GQA maps query head h to
    key head h // groups. Matmuls in true fp32 (no TF32)."""
    keys = torch.arange(spec.tokens, device=q.device)
    out = torch.empty(spec.batch, spec.hq, len(rows), spec.dim, dtype=torch.float32, device=q.device)
    for h in range(spec.hq):
        qh = q[:, h, rows].float()
        kh, vh = k[:, h // spec.groups].float(), v[:, h // spec.groups].float()
        s = torch.matmul(qh, kh.transpose(-1, -2)) * spec.scale
        s = s.masked_fill(~allowed_matrix(spec, rows, keys, kept, h), float("-inf"))
        lse = torch.logsumexp(s, dim=-1)
        if sinks is not None:
            lse = torch.logaddexp(lse, sinks[h].expand_as(lse))
        out[:, h] = torch.matmul(torch.exp(s - lse[..., None]), vh)
    return out


def rel_error(got_rows, ref):
    return (got_rows.float() - ref).norm().item() / max(ref.norm().item(), 1e-30)


# ---- FlexAttention block masks --------------------------------------------------------------

_MASK_MODS = {}


def mask_mod_for(pattern):
    """One mask_mod object per pattern text, so that compiled graphs are shared between cases.
    Only partial blocks evaluate it; which blocks exist is the BlockMask's job."""
    if pattern.text in _MASK_MODS:
        return _MASK_MODS[pattern.text]
    if pattern.kind in ("causal", "blocks"):
        def mm(b, h, q, k):
            return q >= k
    elif pattern.kind == "window":
        left, right = pattern.left, pattern.right

        def mm(b, h, q, k):
            return (q - k <= left) & (k - q <= right)
    elif pattern.kind == "chunk":
        c = pattern.chunk

        def mm(b, h, q, k):
            return (q // c) == (k // c)
    else:
        mm = None
    _MASK_MODS[pattern.text] = mm
    return mm


def block_classes(spec, bs, kept):
    """uint8 [H, nbq, nbk] with 0 = no allowed pair, 1 = some pairs (mask_mod applies), 2 = all
    pairs, for blocks of bs x bs tokens; H = 1 (all heads) except for blocks patterns. Computed from
    block corners: every pattern's allowed set is an intersection of half-planes or diagonal
    squares, so a block is full when its corner pairs are allowed and empty when its key range
    misses the query range's neighborhood. Equal to create_block_mask's result (tested)."""
    p, n = spec.pattern, spec.tokens
    dev = kept.device if kept is not None else None
    nb = -(-n // bs)
    start = torch.arange(nb, device=dev) * bs
    end = torch.clamp(start + bs, max=n) - 1
    qs, qe, ks, ke = start[:, None], end[:, None], start[None, :], end[None, :]
    if p.kind in ("causal", "window"):
        left = n if p.kind == "causal" else p.left
        right = 0 if p.kind == "causal" else p.right
        full = (ks >= qe - left) & (ke <= qs + right)
        empty = (ke < qs - left) | (ks > qe + right)
    elif p.kind == "chunk":
        c = p.chunk
        full = (qs // c == qe // c) & (ks // c == ke // c) & (qs // c == ks // c)
        empty = (ke // c < qs // c) | (ks // c > qe // c)
    elif p.kind == "blocks":
        if bs != cs.BLOCK:
            raise Unsupported(f"blocks patterns are defined on {cs.BLOCK}-token blocks")
        diag = torch.eye(nb, dtype=torch.bool, device=dev)
        cls = torch.zeros(kept.shape, dtype=torch.uint8, device=dev)
        cls[kept & ~diag] = 2
        cls[kept & diag] = 1
        return cls
    else:
        return torch.full((1, nb, nb), 2, dtype=torch.uint8, device=dev)
    cls = torch.ones(nb, nb, dtype=torch.uint8, device=dev)
    cls[full] = 2
    cls[empty] = 0
    return cls[None]


def make_block_mask(spec, bs, kept, dev):
    """The BlockMask create_block_mask would build, made directly from block_classes (no N x N
    evaluation: create_block_mask at N = 131072 evaluates 17 G mask entries)."""
    cls = block_classes(spec, bs, kept.to(dev) if kept is not None else torch.empty(0, device=dev))

    def to_lists(sel):
        num = sel.sum(-1, dtype=torch.int32)
        idx = torch.argsort(sel.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
        return num[None].contiguous(), idx[None].contiguous()

    kv_num, kv_idx = to_lists(cls == 1)
    full_num, full_idx = to_lists(cls == 2)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=bs,
                                    mask_mod=mask_mod_for(spec.pattern),
                                    seq_lengths=(spec.tokens, spec.tokens))


def _flex_plain(q, k, v, block_mask, scale, gqa, kernel_options):
    return flex_attention(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=gqa,
                          kernel_options=kernel_options)


def _flex_sink(q, k, v, block_mask, scale, gqa, kernel_options, sinks):
    # FlexAttention has no denominator sink (a score_mod cannot add a term to the denominator);
    # the documented correction rescales the output: o' = o * sigmoid(LSE - s).
    if AuxRequest is not None:
        o, aux = flex_attention(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=gqa,
                                kernel_options=kernel_options, return_aux=AuxRequest(lse=True))
        lse = aux.lse
    else:
        o, lse = flex_attention(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=gqa,
                                kernel_options=kernel_options, return_lse=True)
    w = torch.sigmoid(lse - sinks[None, :, None])
    return (o.float() * w[..., None]).to(o.dtype)


_COMPILED = {}


def compiled(fn):
    if fn not in _COMPILED:
        _COMPILED[fn] = torch.compile(fn, dynamic=False, fullgraph=True)
    return _COMPILED[fn]


# ---- implementations ------------------------------------------------------------------------

def sink_correct(o, lse, sinks):
    """o [B,H,N,d] (any strides), lse [B,H,N] fp32: o * sigmoid(lse - s_h)."""
    return _sink_correct_c(o, lse, sinks)


def _sink_correct_eager(o, lse, sinks):
    w = torch.sigmoid(lse.float() - sinks[None, :, None])
    return (o.float() * w[..., None]).to(o.dtype)


_sink_correct_c = _sink_correct_eager  # replaced by a compiled version on CUDA (one fused kernel)


class Runner:
    """One implementation bound to one case: `call(q, k, v)` takes logical [B,H,N,d] views in
    `layout` and returns the output as a logical [B,Hq,N,d] view (no copy)."""

    def __init__(self, layout, call, notes, repeat_kv=False):
        self.layout, self.call, self.notes, self.repeat_kv = layout, call, notes, repeat_kv

    def gather(self, t, idx):
        """t with its token dimension permuted by idx, stored in this runner's layout."""
        if self.layout == "bhnd":
            return t.index_select(2, idx)
        return t.transpose(1, 2).index_select(1, idx).transpose(1, 2)


def _varlen_emulated(q, k, v, cu_q, cu_k, max_q, max_k, *, return_aux=None, scale=None,
                     window_size=(-1, -1)):
    """CPU stand-in for torch.nn.attention.varlen.varlen_attn (CUDA only) with its documented
    contract: q/k/v [T, H, d], out [T, H, d], lse [H, T]; window (left, right), -1 = unbounded.
    Only used by --device cpu to test this script's packing and LSE handling."""
    t = q.shape[0]
    pos = torch.arange(t)
    seq = torch.bucketize(pos, cu_q[1:].cpu(), right=True)
    allowed = seq[:, None] == seq[None, :]
    left, right = window_size
    if left >= 0:
        allowed &= pos[None, :] >= pos[:, None] - left
    if right >= 0:
        allowed &= pos[None, :] <= pos[:, None] + right
    s = torch.einsum("thd,shd->hts", q.float(), k.float()) * scale
    s = s.masked_fill(~allowed[None], float("-inf"))
    lse = torch.logsumexp(s, -1)
    o = torch.einsum("hts,shd->thd", torch.exp(s - lse[..., None]), v.float()).to(q.dtype)
    return (o, lse) if return_aux is not None else o


def make_runner(impl, spec, dev, kept, sinks, gqa_native=True):
    """Builds the Runner of `impl` for `spec`; raises Unsupported with the reason."""
    p, cuda = spec.pattern, dev.type == "cuda"
    b, n, hq, d = spec.batch, spec.tokens, spec.hq, spec.dim
    notes = []
    if impl in ("sdpa_cudnn", "sdpa_flash") and p.kind == "blocks":
        raise Unsupported("SDPA has no block-sparse attention (a dense mask computes every pair); "
                          "the causal case gives the dense time")
    gqa = spec.groups > 1
    # The LSE-returning SDPA ops (needed for the sink) take no enable_gqa: repeat k/v there.
    lse_op = spec.sink and (impl == "sdpa_cudnn" or (impl == "sdpa_flash" and p.kind not in ("window", "chunk")))
    repeat = gqa and (not gqa_native or lse_op) and impl in ("sdpa_cudnn", "sdpa_flash")
    if gqa:
        notes.append("GQA: k/v repeat_interleave'd outside the timing" + ("" if lse_op else " (enable_gqa failed)")
                     if repeat else "GQA: enable_gqa=True")

    if impl in ("flex", "flex_b64"):
        bs = 64 if impl == "flex_b64" else 128
        kopts = {"BLOCK_M": 64, "BLOCK_N": 64} if impl == "flex_b64" else None
        if impl == "flex_b64":
            notes.append("64x64 mask blocks and kernel tiles")
        bm = None if p.kind == "full" else make_block_mask(spec, bs, kept, dev)
        if spec.sink:
            # Inductor's CPU FlexAttention cannot return the LSE: on CPU (smoke runs only) the sink
            # path runs flex_attention eagerly, which checks the correction, not the kernel.
            fn = compiled(_flex_sink) if cuda else _flex_sink
            notes.append("sink: o*sigmoid(LSE-s) fused in the compiled graph" if cuda else
                         "cpu: sink path eager (Inductor CPU flex returns no LSE)")
            return Runner("bhnd", lambda q, k, v: fn(q, k, v, bm, spec.scale, gqa, kopts, sinks), notes)
        fn = compiled(_flex_plain)
        return Runner("bhnd", lambda q, k, v: fn(q, k, v, bm, spec.scale, gqa, kopts), notes)

    if impl == "sdpa_flash" and p.kind in ("window", "chunk"):
        # SDPA takes no window or varlen argument; PyTorch's public varlen_attn runs the same
        # flash kernel with cu_seqlens and a window (Qwen2.5-VL's windows use flash varlen).
        if cuda:
            if _varlen is None:
                raise Unsupported("torch.nn.attention.varlen is missing in this torch")
            varlen = _varlen.varlen_attn
        else:
            varlen = _varlen_emulated
            notes.append("cpu: emulated varlen_attn")
        if p.kind == "window":
            cu = torch.arange(0, b * n + 1, n, dtype=torch.int32, device=dev)
            maxlen, window = n, (p.left, p.right)
            notes.append("varlen_attn(window_size=(l, r)), one sequence per batch item")
        else:
            starts = [s + i * n for i in range(b) for s in range(0, n, p.chunk)] + [b * n]
            cu = torch.tensor(starts, dtype=torch.int32, device=dev)
            maxlen, window = min(p.chunk, n), (-1, -1)
            notes.append(f"varlen_attn over {p.chunk}-token chunks")
        aux = None
        if spec.sink:
            if _varlen is not None and hasattr(_varlen, "AuxRequest"):
                aux = _varlen.AuxRequest(lse=True)
            elif cuda:
                raise Unsupported("varlen_attn cannot return the LSE in this torch: no sink correction")
            else:
                aux = True
            notes.append("sink: o*sigmoid(LSE-s) after the kernel")

        def call(q, k, v):
            pk = [t.transpose(1, 2).reshape(b * n, t.shape[1], d) for t in (q, k, v)]
            r = varlen(*pk, cu, cu, maxlen, maxlen, return_aux=aux, scale=spec.scale, window_size=window)
            o = (r[0] if aux is not None else r).reshape(b, n, hq, d).transpose(1, 2)
            if aux is None:
                return o
            lse = r[1].reshape(hq, b, n).transpose(0, 1)
            return sink_correct(o, lse, sinks)
        return Runner("bnhd", call, notes)

    # SDPA proper: cuDNN or flash backend (on CPU: the math backend, resp. the CPU flash kernel).
    if impl == "sdpa_cudnn":
        backend = SDPBackend.CUDNN_ATTENTION if cuda else SDPBackend.MATH
    else:
        backend = SDPBackend.FLASH_ATTENTION
    if not cuda:
        notes.append(f"cpu: SDPA {backend.name} backend stands in")
    bias = None
    causal = p.kind == "causal"
    if p.kind == "window":
        if impl == "sdpa_flash":
            raise Unsupported("internal: window handled by varlen")
        pos = torch.arange(n, device=dev)
        ok = allowed_matrix(spec, pos, pos, None, 0)
        bias = torch.zeros(n, n, dtype=torch.bfloat16, device=dev).masked_fill(~ok, float("-inf"))[None, None]
        notes.append("window as a dense N x N additive mask (SDPA cuDNN has no window): computes all pairs")
    chunked = p.kind == "chunk"
    if chunked:
        if n % p.chunk:
            raise Unsupported("chunk size does not divide the tokens (the batched view needs equal chunks)")
        notes.append(f"{p.chunk}-token chunks as a batched view [B, H*N/{p.chunk}, {p.chunk}, d] "
                     "(every window is full, so equal to varlen)")

    def fold(t):
        return t.reshape(t.shape[0], t.shape[1] * (n // p.chunk), p.chunk, d) if chunked else t

    def unfold(o):
        return o.reshape(b, hq, n, d) if chunked else o

    if spec.sink:
        notes.append("sink: o*sigmoid(LSE-s) after the kernel")

        def call(q, k, v):
            qf, kf, vf = fold(q), fold(k), fold(v)
            if not cuda:
                o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                    qf, kf, vf, 0.0, causal, attn_mask=bias, scale=spec.scale)
            elif impl == "sdpa_cudnn":
                # The op itself, unlike F.scaled_dot_product_attention, does not broadcast the mask.
                full_bias = None if bias is None else bias.expand(qf.shape[0], qf.shape[1], n, n)
                r = torch.ops.aten._scaled_dot_product_cudnn_attention(
                    qf, kf, vf, full_bias, True, 0.0, causal, False, scale=spec.scale)
                o, lse = r[0], r[1]
            else:
                r = torch.ops.aten._scaled_dot_product_flash_attention(
                    qf, kf, vf, 0.0, causal, False, scale=spec.scale)
                o, lse = r[0], r[1]
            return sink_correct(unfold(o), lse.reshape(b, hq, n), sinks)
        return Runner("bhnd", call, notes, repeat_kv=repeat)

    use_gqa = gqa and not repeat

    def call(q, k, v):
        with sdpa_kernel([backend]):
            o = F.scaled_dot_product_attention(fold(q), fold(k), fold(v), attn_mask=bias,
                                               is_causal=causal, scale=spec.scale, enable_gqa=use_gqa)
        return unfold(o)
    return Runner("bhnd", call, notes, repeat_kv=repeat)


def build_runner(impl, spec, dev, kept, sinks, probe):
    """make_runner with native GQA first and repeated k/v if that fails on `probe` inputs."""
    err = None
    for native in ((True, False) if spec.groups > 1 else (True,)):
        try:
            r = make_runner(impl, spec, dev, kept, sinks, gqa_native=native)
            q, k, v = probe
            if r.repeat_kv:
                k, v = (relayout(t.repeat_interleave(spec.groups, dim=1), r.layout) for t in (k, v))
            out = r.call(q, k, v)
            return r, out
        except Unsupported:
            raise
        except OverBudget:
            raise
        except Exception as e:  # a backend refusing these inputs: try the GQA fallback, else report
            err = e
    raise Unsupported(f"failed: {type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}")


# ---- timing ---------------------------------------------------------------------------------

class Timer:
    def __init__(self, dev, target_s, smoke=False):
        self.dev, self.target_s, self.smoke = dev, target_s, smoke
        self.cycles_per_ms = None
        if dev.type == "cuda":
            torch.cuda._sleep(1000)
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            torch.cuda._sleep(2_000_000)
            e.record()
            torch.cuda.synchronize()
            self.cycles_per_ms = 2_000_000 / max(s.elapsed_time(e), 1e-3)

    def sync(self):
        if self.dev.type == "cuda":
            torch.cuda.synchronize()

    def host_ms(self, fn, args):
        self.sync()
        t0 = time.perf_counter()
        fn(*args)
        host = (time.perf_counter() - t0) * 1e3
        self.sync()
        return host

    def times(self, fn, sets, reps, host_ms):
        """Per-call times in ms. On CUDA each call is preceded by a sleep kernel longer than the
        host's enqueue time, so the events bracket GPU work only."""
        if self.dev.type != "cuda":
            out = []
            for r in range(reps):
                t0 = time.perf_counter()
                fn(*sets[r % len(sets)])
                out.append((time.perf_counter() - t0) * 1e3)
            return out
        # Capped: past 20 ms of host time per call the GPU work dwarfs any launch gap anyway.
        sleep = int(self.cycles_per_ms * min(20.0, max(0.05, 1.5 * host_ms + 0.05)))
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for r in range(reps):
            torch.cuda._sleep(sleep)
            ev[r][0].record()
            fn(*sets[r % len(sets)])
            ev[r][1].record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in ev]

    def graph_ms(self, fn, sets, est_ms):
        """Per-launch time of CUDA-graph replays of back-to-back calls over the rotating sets: the
        median of 11 replays of one captured graph of about 2 ms of calls (at least one call per
        set, at most 64 calls). How ariadne's benchmark times its `ms`; here it is the anchors'
        `ms_graph`, the like-for-like figure for that method. CUDA only."""
        per = max(len(sets), min(64, math.ceil(2.0 / max(est_ms, 1e-3))))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capturing stream, as capture requires
            for i in range(max(3, len(sets))):
                fn(*sets[i % len(sets)])
        torch.cuda.current_stream().wait_stream(side)
        self.sync()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(per):
                fn(*sets[i % len(sets)])
        g.replay()
        self.sync()
        out = []
        for _ in range(11):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            g.replay()
            e.record()
            self.sync()
            out.append(s.elapsed_time(e) / per)
        del g
        return statistics.median(out)

    def measure(self, fn, sets):
        """Warm-up, then the median of enough single calls to fill about target_s."""
        host = max(self.host_ms(fn, sets[i % len(sets)]) for i in range(2))
        if self.smoke:  # the smoke run checks the code path, its times mean nothing
            return statistics.median(self.times(fn, sets, 2, host)), 2
        est = statistics.median(self.times(fn, sets, 3, host))
        reps = 3 if est > 50 else max(10, min(100, int(self.target_s * 1e3 / max(est, 1e-3))))
        return statistics.median(self.times(fn, sets, reps, host)), reps


def n_sets(set_bytes, smoke):
    """Buffer sets to rotate: their total is at least 4x the L2 (at least 2, at most 64)."""
    if smoke:
        return 2
    return max(2, min(64, math.ceil(4 * L2_BYTES / max(set_bytes, 1))))


def make_sets(spec, r, first, dev, smoke):
    """Buffer sets in the runner's layout; set 0 holds the checked data `first` (logical views)."""
    gen = torch.Generator(device=dev).manual_seed(spec.seed + 7)
    base = [relayout(t, r.layout) for t in first]
    set_bytes = sum(t.numel() * t.element_size() for t in base)
    sets = [base] + [alloc_qkv(spec, r.layout, gen, dev) for _ in range(n_sets(set_bytes, smoke) - 1)]
    if r.repeat_kv:
        sets = [[q] + [relayout(t.repeat_interleave(spec.groups, dim=1), r.layout) for t in (k, v)]
                for q, k, v in sets]
    return sets


# ---- cases ----------------------------------------------------------------------------------

def record(cid, impl, ms, flops, note, **extra):
    rec = {"id": cid, "impl": impl, "ms": None if ms is None else round(ms, 5),
           "tflops": None if ms is None else round(flops / (ms * 1e9), 2), "note": note}
    rec.update(extra)
    return rec


def graph_extra(timer, fn, sets, ms):
    """With --graph (Timer.graph): {"ms_graph": ...} and no note, or {} and the reason capture failed."""
    if not getattr(timer, "graph", False) or ms is None:
        return {}, []
    try:
        return {"ms_graph": round(timer.graph_ms(fn, sets, ms), 5)}, []
    except Exception as e:  # an anchor that cannot be captured keeps its single-call time
        torch.cuda.synchronize()
        return {}, [f"graph capture failed: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"]


def impls_for(spec_or_case, impls):
    """flex_b64 only where 64x64 blocks can pay: local patterns and stacks with local layers."""
    if isinstance(spec_or_case, Spec):
        local = spec_or_case.pattern.kind in ("window", "chunk")
    else:
        local = spec_or_case["schedule"] != "full"
    return [i for i in impls if i != "flex_b64" or local]


def run_attention_case(case, impls, dev, timer, smoke, deadline, case_budget):
    spec = Spec(case)
    flops = cs.attention_flops(case)
    gen = torch.Generator(device=dev).manual_seed(spec.seed)
    first = alloc_qkv(spec, "bhnd", gen, dev)
    sinks = sink_logits(spec, dev) if spec.sink else None
    kept = kept_blocks(spec, dev) if spec.pattern.kind == "blocks" else None
    rows = check_rows(spec, spec.seed + 3, dev)
    ref = reference_rows(spec, *first, sinks, kept, rows)
    out = []
    for impl in impls_for(spec, impls):
        if time.monotonic() > deadline:
            out.append(record(spec.id, impl, None, flops, "skipped: global time budget spent"))
            continue
        t0 = time.monotonic()
        signal.alarm(case_budget)
        try:
            runner, got = build_runner(impl, spec, dev, kept, sinks, first)
            timer.sync()
            first_s = time.monotonic() - t0
            err = rel_error(got[:, :, rows], ref)
            if not err <= TOLERANCE:
                out.append(record(spec.id, impl, None, flops,
                                  f"WRONG RESULT: rel err {err:.3g} > {TOLERANCE} vs fp32 reference; not timed",
                                  rel_err=err))
                continue
            sets = make_sets(spec, runner, first, dev, smoke)
            ms, reps = timer.measure(runner.call, sets)
            extra, gnote = graph_extra(timer, runner.call, sets, ms)
            note = "; ".join(runner.notes + [f"first call {first_s:.1f} s", f"{reps} reps, {len(sets)} buffer sets"]
                             + gnote)
            out.append(record(spec.id, impl, ms, flops, note, rel_err=round(err, 6), **extra))
        except Unsupported as e:
            out.append(record(spec.id, impl, None, flops, f"unsupported: {e}"))
        except OverBudget:
            out.append(record(spec.id, impl, None, flops, f"skipped: over the {case_budget} s budget "
                              "of one implementation on one case (compile + check + timing)"))
        except torch.OutOfMemoryError as e:
            out.append(record(spec.id, impl, None, flops, f"failed: out of memory: {str(e)[:200]}"))
        finally:
            signal.alarm(0)
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        print(f"  {spec.id:28s} {impl:11s} {out[-1]['ms']} ms  {out[-1]['tflops']} TF/s  "
              f"({time.monotonic() - t0:.1f} s) {out[-1]['note'][:90]}", flush=True)
    return out


def stack_spec(side, pattern, sink, batch=1):
    return Spec({"id": f"stack-layer-{pattern}-{sink}-{side}", "batch": batch,
                 "tokens": cs.stack_tokens(side), "heads_q": cs.STACK_HEADS, "heads_kv": cs.STACK_HEADS,
                 "dim": cs.STACK_DIM, "pattern": pattern, "sink": sink, "dtype": "bf16"})


def run_stack_case(case, impls, dev, timer, smoke, deadline, case_budget):
    """The 32 attention layers of an encoder schedule, each on its own q, k, v, with the token
    gathers of q, k, v at every order change and the inverse gather of the last output."""
    layers = cs.stack_layers(case["schedule"])
    side, flops = case["side"], cs.stack_flops(case)
    hp = side // cs.PATCH
    perms = {o: torch.tensor(cs.order_permutation(o, hp, hp), device=dev) for o in ("row", "col", "window")}
    invs = {o: torch.argsort(pm) for o, pm in perms.items()}
    out = []
    for impl in impls_for(case, impls):
        if time.monotonic() > deadline:
            out.append(record(case["id"], impl, None, flops, "skipped: global time budget spent"))
            continue
        t0 = time.monotonic()
        signal.alarm(case_budget)
        try:
            runners = {}
            for pat, sink, _ in layers:
                if (pat, sink) in runners:
                    continue
                sp = stack_spec(side, pat, sink, case["batch"])
                sinks = sink_logits(sp, dev) if sp.sink else None
                lay_impl = impl if impl != "flex_b64" or sp.pattern.kind != "full" else "flex"
                probe = alloc_qkv(sp, "bhnd", torch.Generator(device=dev).manual_seed(sp.seed), dev)
                r, got = build_runner(lay_impl, sp, dev, None, sinks, probe)
                rows = check_rows(sp, sp.seed + 3, dev)
                err = rel_error(got[:, :, rows], reference_rows(sp, *probe, sinks, None, rows))
                if not err <= TOLERANCE:
                    raise Unsupported(f"WRONG RESULT of the {pat} layer: rel err {err:.3g}")
                runners[(pat, sink)] = (r, sp)
            gen = torch.Generator(device=dev).manual_seed(zlib.crc32(case["id"].encode()))
            inputs = []
            for pat, sink, _ in layers:
                r, sp = runners[(pat, sink)]
                inputs.append(alloc_qkv(sp, r.layout, gen, dev))
            plan = []
            cur = "row"
            for (pat, sink, order), qkv in zip(layers, inputs):
                idx = None
                if order is not None and order != cur:
                    idx = invs[cur][perms[order]]   # x_new[i] = x_cur[inv_cur[perm_new[i]]]
                    cur = order
                plan.append((runners[(pat, sink)][0], qkv, idx))
            final_idx = None if cur == "row" else invs[cur]

            def run_stack():
                o = None
                for r, (q, k, v), idx in plan:
                    if idx is not None:
                        q, k, v = r.gather(q, idx), r.gather(k, idx), r.gather(v, idx)
                    o = r.call(q, k, v)
                return o if final_idx is None else o.index_select(2, final_idx)

            got = run_stack()
            timer.sync()
            if not bool(torch.isfinite(got.float()).all()):
                raise Unsupported("WRONG RESULT: non-finite stack output")
            first_s = time.monotonic() - t0
            ms, reps = timer.measure(run_stack, [()])
            extra, notes = graph_extra(timer, run_stack, [()], ms)
            for r, sp in runners.values():
                notes += [f"{sp.pattern.text}: {x}" for x in r.notes]
            changes = sum(1 for _, _, idx in plan if idx is not None)
            notes += [f"{changes} order changes (3 gathers each) + {int(final_idx is not None)} output gather",
                      "layers checked against the fp32 reference", f"first call {first_s:.1f} s",
                      f"{reps} reps, 32 distinct q/k/v sets"]
            out.append(record(case["id"], impl, ms, flops, "; ".join(notes), **extra))
        except Unsupported as e:
            out.append(record(case["id"], impl, None, flops, f"unsupported: {e}"))
        except OverBudget:
            out.append(record(case["id"], impl, None, flops, f"skipped: over the {case_budget} s budget"))
        except torch.OutOfMemoryError as e:
            out.append(record(case["id"], impl, None, flops, f"failed: out of memory: {str(e)[:200]}"))
        finally:
            signal.alarm(0)
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        print(f"  {case['id']:28s} {impl:11s} {out[-1]['ms']} ms  {out[-1]['tflops']} TF/s  "
              f"({time.monotonic() - t0:.1f} s) {out[-1]['note'][:90]}", flush=True)
    return out


# ---- environment and smoke cases -------------------------------------------------------------

def env_info(dev):
    info = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "device": str(dev)}
    try:
        import triton
        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        info.update(gpu=props.name, sm_count=props.multi_processor_count,
                    l2_bytes=getattr(props, "L2_cache_size", None),
                    cudnn=torch.backends.cudnn.version())
        try:
            info["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
        except (OSError, IndexError, subprocess.SubprocessError):
            try:
                import pynvml
                pynvml.nvmlInit()
                info["driver"] = pynvml.nvmlSystemGetDriverVersion()
            except Exception:  # no way to read it: say so rather than guess
                info["driver"] = None
    else:
        info.update(gpu=None, driver=None, cudnn=None, cpu=platform.processor() or platform.machine())
    return info


def smoke_cases():
    """Tiny shapes for --smoke: every pattern, an asymmetric window (catches a left/right swap),
    GQA, batch > 1, lengths that are not multiples of the block size, and small stacks."""
    vit = dict(heads_q=2, heads_kv=2, dim=16, dtype="bf16")
    llm = dict(batch=1, heads_q=4, heads_kv=2, dim=32, dtype="bf16")
    return [
        dict(id="smoke-full", batch=2, tokens=200, pattern="full", sink="none", **vit),
        dict(id="smoke-win", batch=2, tokens=320, pattern="window:20,9", sink="none", **vit),
        dict(id="smoke-win-sink", batch=2, tokens=320, pattern="window:20,9", sink="denominator", **vit),
        dict(id="smoke-chunk", batch=2, tokens=256, pattern="chunk:64", sink="none", **vit),
        dict(id="smoke-causal", tokens=384, pattern="causal", sink="none", **llm),
        dict(id="smoke-blocks", tokens=512, pattern="blocks:0.4", sink="none", **llm),
        dict(id="smoke-stack-ariadne", kind="stack", schedule="ariadne", side=224, batch=1),
        dict(id="smoke-stack-chunk", kind="stack", schedule="chunk", side=224, batch=1),
    ]


def smoke_self_checks(dev):
    """Checks that need no implementation: the closed-form pair counts against dense masks, the
    block-sparse draw, and block_classes against create_block_mask. Returns failure messages."""
    from torch.nn.attention.flex_attention import create_block_mask
    fails = []
    for case in smoke_cases():
        if case.get("kind") == "stack":
            continue
        spec = Spec(case)
        kept = kept_blocks(spec, dev) if spec.pattern.kind == "blocks" else None
        pos = torch.arange(spec.tokens, device=dev)
        for h in range(spec.hq if kept is not None else 1):
            mat = allowed_matrix(spec, pos, pos, kept, h)
            # Element-wise against casespec's plain-Python rule: the reference and the dense SDPA
            # mask both come from allowed_matrix, so it must not share a mistake with them.
            plain = torch.tensor([[spec.pattern.allowed(q, k) and (kept is None or bool(kept[h, q // cs.BLOCK, k // cs.BLOCK]))
                                   for k in range(spec.tokens)] for q in range(spec.tokens)], device=dev)
            if not torch.equal(mat, plain):
                fails.append(f"{spec.id}: allowed_matrix differs from casespec.Pattern.allowed (head {h})")
            dense = int(mat.sum())
            if dense != cs.allowed_pairs(spec.pattern, spec.tokens):
                fails.append(f"{spec.id}: dense mask has {dense} pairs, allowed_pairs says "
                             f"{cs.allowed_pairs(spec.pattern, spec.tokens)}")
        if kept is not None:
            want = cs.blocks_kept_count(spec.tokens, spec.pattern.fraction)
            if not bool((kept.sum((1, 2)) == want).all()) or bool(kept.triu(1).any()):
                fails.append(f"{spec.id}: kept block counts {kept.sum((1, 2)).tolist()} != {want} or acausal")
        for bs in (64, 128):
            if spec.pattern.kind in ("full", "blocks") or spec.tokens % bs:
                continue
            mm = mask_mod_for(spec.pattern)
            want = create_block_mask(mm, None, None, spec.tokens, spec.tokens, device=dev, BLOCK_SIZE=bs)
            got = make_block_mask(spec, bs, kept, dev)
            for name in ("kv_num_blocks", "full_kv_num_blocks"):
                if not torch.equal(getattr(want, name), getattr(got, name)):
                    fails.append(f"{spec.id} bs {bs}: {name} differs from create_block_mask")
            for num, idx in (("kv_num_blocks", "kv_indices"), ("full_kv_num_blocks", "full_kv_indices")):
                a, b = getattr(want, idx), getattr(got, idx)
                for r in range(a.shape[-2]):
                    k = int(getattr(want, num)[0, 0, r])
                    if sorted(a[0, 0, r, :k].tolist()) != sorted(b[0, 0, r, :k].tolist()):
                        fails.append(f"{spec.id} bs {bs}: {idx} row {r} differs from create_block_mask")
                        break
    return fails


def write_json(path, results):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(results, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


# ---- main -----------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "cases.json"))
    ap.add_argument("--out", required=True, help="JSON output path")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--smoke", action="store_true", help="tiny built-in cases instead of --cases")
    ap.add_argument("--only", default=None, help="comma-separated case ids or id prefixes to run")
    ap.add_argument("--impls", default=",".join(IMPLS), help=f"comma-separated subset of {','.join(IMPLS)}")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="wall time after which remaining (case, impl) pairs are skipped and recorded "
                         "(default 225; 3000 with --smoke, whose CPU compiles are slow)")
    ap.add_argument("--case-budget-s", type=int, default=None,
                    help="limit for one implementation on one case, compile included (default 60; 600 with --smoke)")
    ap.add_argument("--target-s", type=float, default=0.25, help="timed GPU work per measurement")
    ap.add_argument("--graph", action="store_true",
                    help="also time each anchor as CUDA-graph replays of back-to-back calls (ms_graph), "
                         "the method of ariadne's ms (CUDA only)")
    a = ap.parse_args(argv)

    global L2_BYTES, _sink_correct_c
    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        sys.exit("anchors: --device cuda but torch sees no CUDA device (use --device cpu --smoke)")
    impls = [i.strip() for i in a.impls.split(",") if i.strip()]
    bad = [i for i in impls if i not in IMPLS]
    if bad:
        sys.exit(f"anchors: --impls: unknown {bad}; expected a subset of {list(IMPLS)}")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    signal.signal(signal.SIGALRM, _alarm)
    if dev.type == "cuda":
        L2_BYTES = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0) or L2_BYTES
        _sink_correct_c = torch.compile(_sink_correct_eager, dynamic=False)

    if a.budget_s is None:
        a.budget_s = 3000.0 if a.smoke else 225.0
    if a.case_budget_s is None:
        a.case_budget_s = 600 if a.smoke else 60
    start = time.monotonic()
    env = env_info(dev)
    print(f"anchors: {env}", flush=True)
    results = [{"id": "env", "env": env}]
    failures = []
    if a.smoke:
        cases = smoke_cases()
        failures += smoke_self_checks(dev)
    else:
        try:
            cases = cs.load_cases(a.cases)
        except cs.CaseError as e:
            sys.exit(f"anchors: {e}")
    if a.only:
        keys = [k.strip() for k in a.only.split(",") if k.strip()]
        cases = [c for c in cases if any(c["id"] == k or c["id"].startswith(k) for k in keys)]
    deadline = start + a.budget_s
    timer = Timer(dev, a.target_s, a.smoke)
    timer.graph = a.graph and dev.type == "cuda"
    for case in cases:
        print(f"case {case['id']}", flush=True)
        if case.get("kind") == "stack":
            results += run_stack_case(case, impls, dev, timer, a.smoke, deadline, a.case_budget_s)
        else:
            results += run_attention_case(case, impls, dev, timer, a.smoke, deadline, a.case_budget_s)
        env["wall_s"] = round(time.monotonic() - start, 1)
        write_json(a.out, results)  # after every case, so that a run killed from outside keeps its results
    wrong = [r for r in results[1:] if "WRONG" in (r.get("note") or "")]
    write_json(a.out, results)
    print(f"anchors: {len(results) - 1} records in {env['wall_s']} s -> {a.out}", flush=True)
    if a.smoke:
        # In the smoke run every implementation must run every case and match the reference.
        failures += [f"{r['id']} {r['impl']}: {r['note']}" for r in results[1:]
                     if r["ms"] is None and "SDPA has no block-sparse" not in r["note"]]
        for msg in failures:
            print(f"SMOKE FAIL: {msg}", flush=True)
        print(f"smoke: {sum(r['ms'] is not None for r in results[1:])} passed, {len(failures)} failed", flush=True)
        return 1 if failures else 0
    for r in wrong:
        print(f"anchors: WARNING {r['id']} {r['impl']}: {r['note']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
