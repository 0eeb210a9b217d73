"""Context-parallel (ring) attention over a torch.distributed process group.

Each rank holds its zig-zag shard of one self-attention sequence of ``seq_len`` tokens (chunks r and
2N - 1 - r of 2N, see ``shard``); K/V travel around the ring with ``batch_isend_irecv`` while the
rank computes the step's pieces, and the partial results merge by their log-sum-exp
(docs/context-parallel.md)::

    import torch.distributed as dist, ariadne
    from ariadne import context_parallel as cp

    dist.init_process_group("gloo")          # NCCL on GPUs; see below
    q_r = cp.shard(q, rank, world)             # [n_r, heads_q, head_dim], the same for k and v
    out_r, lse_r = cp.ring_attention(q_r, k_r, v_r, seq_len=len(q), pattern=ariadne.Pattern.causal())
    out = cp.unshard([...gathered out_r...], world)

Only the K/V heads travel. Sinks are applied once: a denominator sink after the merge, a key-0 bias
in the piece whose keys start at position 0. With ``rr=dict(tau=..., block=..., stride=...)`` each
rank sums its keys' strides, the sums are all-reduced (1/stride of K; exact, every position has one
contributor) and each rank estimates its own query chunks: the masks one-device ``estimate`` gives.

CPU tensors run the pieces on ariadne's host backends (the process group may be gloo); CUDA tensors
(a CUDA build, an NCCL group) run them on the CUDA backend on torch's current stream, with the RR
estimate on the host. The device path has not run on several GPUs yet (docs/context-parallel.md).
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from . import _ariadne
from ._ariadne import Pattern

Tensor = torch.Tensor


Run = Tuple[int, int, int, int]  # (sequence, first position, end position, first row in the rank's tensors)


def _lengths(seq_len: Optional[int], cu_seqlens: Optional[Sequence[int]]) -> List[int]:
    if (seq_len is None) == (cu_seqlens is None):
        raise ValueError("give one of seq_len (one sequence) and cu_seqlens (a packed batch)")
    if seq_len is not None:
        return [int(seq_len)]
    cu = [int(x) for x in cu_seqlens]
    if len(cu) < 2 or cu[0] != 0 or any(b < a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"cu_seqlens: {cu} is not a non-decreasing list of offsets from 0")
    return [b - a for a, b in zip(cu, cu[1:])]


def _runs(lengths: Sequence[int], rank: int, world: int, align: int) -> List[Run]:
    """Rank ``rank``'s rows: for each sequence in order, its chunk ``rank`` then its chunk
    ``2 * world - 1 - rank`` (empty chunks left out)."""
    return [tuple(r) for r in _ariadne.zigzag_runs(list(lengths), rank, world, align)]


def shard(x: Tensor, rank: int, world: int, align: int = 1, cu_seqlens: Optional[Sequence[int]] = None) -> Tensor:
    """Rank ``rank``'s zig-zag rows of ``x`` [tokens, ...] (a copy): one sequence, or the packed
    batch of ``cu_seqlens``, each sequence cut into 2 * world chunks of which the rank holds chunk
    ``rank`` and chunk ``2 * world - 1 - rank``."""
    cu = [0, x.shape[0]] if cu_seqlens is None else [int(c) for c in cu_seqlens]
    runs = _runs(_lengths(None, cu), rank, world, align)
    if not runs:
        return x[:0].clone()
    return torch.cat([x[cu[s] + lo:cu[s] + hi] for s, lo, hi, _ in runs])


def unshard(parts: Sequence[Tensor], world: int, align: int = 1, dim: int = 0,
            cu_seqlens: Optional[Sequence[int]] = None) -> Tensor:
    """The packed tokens from every rank's shard (``parts[r]`` as ``shard`` gave it), along ``dim``
    (0 for out, 1 for an LSE [heads, n])."""
    lengths = [sum(p.shape[dim] for p in parts)] if cu_seqlens is None else _lengths(None, cu_seqlens)
    starts = [sum(lengths[:s]) for s in range(len(lengths))]
    pieces = []
    for r in range(world):
        for s, lo, hi, row in _runs(lengths, r, world, align):
            pieces.append((starts[s] + lo, parts[r].narrow(dim, row, hi - lo)))
    pieces.sort(key=lambda p: p[0])
    return torch.cat([p for _, p in pieces], dim=dim)


def _peer(group, r: int) -> int:
    return r if group is None else dist.get_global_rank(group, r)


def _rr_masks(q: Tensor, k: Tensor, runs: List[Run], lengths: List[int], group, rr: dict):
    """Each of this rank's query runs' RR mask from all-reduced key-stride sums."""
    block, stride = int(rr.get("block", 128)), int(rr.get("stride", 8))
    heads_kv, dim = k.shape[1], k.shape[2]
    base = [0]  # first stride row of each sequence in the gathered sums
    for n in lengths:
        base.append(base[-1] + (n + stride - 1) // stride)
    sums = torch.zeros((base[-1], heads_kv, dim), dtype=torch.float32)
    k_host, q_host = k.cpu(), q.cpu()  # the estimator runs on the host
    for s, lo, hi, off in runs:
        part = torch.from_numpy(_ariadne.rr_key_sums(k_host[off:off + hi - lo], stride))
        sums[base[s] + lo // stride:base[s] + lo // stride + part.shape[0]] = part
    on_device = sums.to(k.device)  # NCCL reduces device tensors; gloo host ones
    dist.all_reduce(on_device, group=group)  # one contributor per stride: the sum is exact
    sums = on_device.cpu()
    masks = []
    for s, lo, hi, off in runs:
        est = _ariadne.estimate_rr_from_key_sums(
            q_host[off:off + hi - lo], sums[base[s]:base[s + 1]], lo, lengths[s], block=block, stride=stride,
            tau=float(rr.get("tau", 0.95)), offset=rr.get("offset", "paper"), protect=rr.get("protect"),
            scale=float(rr.get("scale", 0.0)))
        masks.append(est.mask)
    return masks


def ring_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    seq_len: Optional[int] = None,
    group: Optional["dist.ProcessGroup"] = None,
    pattern: Pattern = Pattern.causal(),
    sink: Optional[Tensor] = None,
    sink_mode: Optional[str] = None,
    scale: float = 0.0,
    align: int = 1,
    rr: Optional[dict] = None,
    backend: str = "cpu",
    cu_seqlens: Optional[Sequence[int]] = None,
) -> Tuple[Tensor, Tensor]:
    """Ring attention of this rank's shard over ``group`` (the default group when None).

    q: [n_r, heads_q, head_dim], k, v: [n_r, heads_kv, head_dim] — this rank's zig-zag rows of one
    sequence of ``seq_len`` tokens, or of each sequence of the packed batch ``cu_seqlens`` (the
    whole batch's offsets, the same on every rank): ``shard(x, rank, world, align, cu_seqlens)``;
    self-attention sequences. float32, bfloat16 or float16
    CPU tensors, or bfloat16 / float16 CUDA tensors. pattern: the sequence's window and/or chunk
    (Pattern.full(), causal(), window(l, r), chunked(c)). sink: float32 [heads_q] on q's device;
    sink_mode 'denominator' (default with a sink) or 'key0'.
    rr: RR block-sparse (causal only): dict with tau, block, stride, offset, protect; ``align`` must
    then be a multiple of block. Returns (out [n_r, heads_q, head_dim] in q's dtype, lse float32
    [heads_q, n_r]), the rows of one-device attention that this rank holds.
    """
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    if rr is not None:
        if not pattern.is_causal():
            raise ValueError(f"rr: the RR estimator builds causal masks, but pattern is {pattern!r}")
        if align % int(rr.get("block", 128)) != 0:
            raise ValueError(f"align: {align} is not a multiple of rr's block {rr.get('block', 128)}")
    mode = sink_mode if sink_mode is not None else ("denominator" if sink is not None else "none")
    lengths = _lengths(seq_len, cu_seqlens)
    mine = _runs(lengths, rank, world, align)
    n = sum(hi - lo for _, lo, hi, _ in mine)
    if q.shape[0] != n or k.shape[0] != n or v.shape[0] != n:
        raise ValueError(f"q, k, v: {q.shape[0]}, {k.shape[0]}, {v.shape[0]} rows, expected {n} "
                         f"(rank {rank}'s zig-zag shard of sequences {lengths} over {world} ranks, align {align})")
    heads_q, dim = q.shape[1], q.shape[2]
    masks = _rr_masks(q, k, mine, lengths, group, rr) if rr is not None else [None] * len(mine)
    dev = q.device
    if q.is_cuda:
        backend = "cuda"
    stream = int(torch.cuda.current_stream(dev).cuda_stream) if q.is_cuda else 0
    acc = torch.zeros((n, heads_q, dim), dtype=torch.float32, device=dev)
    acc_lse = torch.full((heads_q, n), float("-inf"), dtype=torch.float32, device=dev)
    part = torch.empty((n, heads_q, dim), dtype=torch.float32, device=dev)
    part_lse = torch.empty(heads_q * n, dtype=torch.float32, device=dev)  # a contiguous [heads, nq] per piece
    scratch = torch.empty(heads_q * n, dtype=torch.float32, device=dev)  # the pieces' calls' LSE
    cur_k, cur_v = k.contiguous(), v.contiguous()
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    for step in range(world):
        src = (rank - step) % world
        reqs = []
        if step + 1 < world:  # the next step's K/V, in flight while this step computes
            rows = sum(hi - lo for _, lo, hi, _ in _runs(lengths, (src - 1) % world, world, align))
            new_k = torch.empty((rows,) + tuple(k.shape[1:]), dtype=k.dtype, device=dev)
            new_v = torch.empty((rows,) + tuple(v.shape[1:]), dtype=v.dtype, device=dev)
            ops = [dist.P2POp(dist.isend, cur_k, _peer(group, nxt), group),
                   dist.P2POp(dist.isend, cur_v, _peer(group, nxt), group),
                   dist.P2POp(dist.irecv, new_k, _peer(group, prv), group),
                   dist.P2POp(dist.irecv, new_v, _peer(group, prv), group)]
            reqs = dist.batch_isend_irecv(ops)
        for (qs, qlo, qhi, qoff), mask in zip(mine, masks):
            nq = qhi - qlo
            for ks, klo, khi, koff in _runs(lengths, src, world, align):
                if ks != qs:
                    continue
                o, l = part[qoff:qoff + nq], part_lse[:heads_q * nq].view(heads_q, nq)
                calls, _ = _ariadne.attention_piece(
                    q[qoff:qoff + nq], cur_k[koff:koff + khi - klo], cur_v[koff:koff + khi - klo], qlo, klo, o, l,
                    rule=pattern, blocks=mask, sink=sink, sink_mode="key0" if mode == "key0" else "none",
                    scale=scale, backend=backend, stream=stream, lse_scratch=scratch)
                if calls:
                    _ariadne.merge_partial(acc[qoff:qoff + nq], acc_lse[:, qoff:qoff + nq], o, l, stream=stream)
        for req in reqs:
            req.wait()
        if reqs:
            cur_k, cur_v = new_k, new_v
    out = torch.empty((n, heads_q, dim), dtype=q.dtype, device=dev)
    lse = torch.empty((heads_q, n), dtype=torch.float32, device=dev)
    _ariadne.finish_partials(acc, acc_lse, out, lse, sink=sink, sink_mode=mode, stream=stream)
    return out, lse
