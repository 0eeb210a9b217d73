"""Context-parallel ring attention over a real torch.distributed process group (gloo, one process
per rank): K/V pass between processes with batch_isend_irecv and every rank's rows must equal
one-device attention within the rule of docs/numerics.md; RR masks come from all-reduced key-stride
sums and must give one-device prefill's output. Also the bindings' pieces and errors."""

import math
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import ariadne  # noqa: E402
from ariadne import context_parallel as cp  # noqa: E402
from conftest import BASE_TOL, close, lse_close  # noqa: E402

L, HQ, HKV, D = 300, 4, 2, 32

CONFIGS = {
    "causal": dict(pattern=ariadne.Pattern.causal()),
    "window_sink": dict(pattern=ariadne.Pattern.window(40, 7), sink_mode="denominator"),
    "chunk_key0": dict(pattern=ariadne.Pattern.chunked(48), sink_mode="key0"),
    "rr": dict(pattern=ariadne.Pattern.causal(), rr=dict(tau=0.5, block=32, stride=8, protect=[]), align=32),
    # A packed batch with an empty sequence.
    "varlen_window_sink": dict(pattern=ariadne.Pattern.window(25, 0), sink_mode="denominator", cu=[0, 131, 131, L]),
    "varlen_rr": dict(pattern=ariadne.Pattern.causal(), rr=dict(tau=0.5, block=32, stride=8, protect=[]), align=32,
                      cu=[0, 100, L]),
}


def inputs(seed=3):
    g = torch.Generator().manual_seed(seed)
    q = torch.rand((L, HQ, D), generator=g) * 4 - 2
    k = torch.rand((L, HKV, D), generator=g) * 4 - 2
    v = torch.rand((L, HKV, D), generator=g) * 2 - 1
    sink = torch.rand((HQ,), generator=g) * 6 - 3
    return q, k, v, sink


def _worker(rank, world, init_file, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        q, k, v, sink = inputs()
        for name, c in CONFIGS.items():
            align = c.get("align", 1)
            mode = c.get("sink_mode")
            cu = c.get("cu")
            out, lse = cp.ring_attention(
                cp.shard(q, rank, world, align, cu), cp.shard(k, rank, world, align, cu),
                cp.shard(v, rank, world, align, cu), seq_len=None if cu else L, cu_seqlens=cu, pattern=c["pattern"],
                sink=sink if mode else None, sink_mode=mode, align=align, rr=c.get("rr"))
            torch.save((out, lse), os.path.join(out_dir, f"{name}_{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_ring_over_gloo_equals_one_device(tmp_path, world):
    mp.spawn(_worker, args=(world, str(tmp_path / "init"), str(tmp_path)), nprocs=world, join=True)
    q, k, v, sink = inputs()
    max_logit = 2 * 2 * D / math.sqrt(D)
    for name, c in CONFIGS.items():
        align = c.get("align", 1)
        parts = [torch.load(tmp_path / f"{name}_{r}.pt") for r in range(world)]
        cu = c.get("cu")
        out = cp.unshard([p[0] for p in parts], world, align, cu_seqlens=cu).numpy()
        lse = cp.unshard([p[1] for p in parts], world, align, dim=1, cu_seqlens=cu).numpy()
        if "rr" in c:
            ref, ref_lse, res = ariadne.prefill(q.numpy(), k.numpy(), v.numpy(), tau=c["rr"]["tau"],
                                                block=c["rr"]["block"], stride=c["rr"]["stride"], protect=[], lse=True,
                                                cu_seqlens=cu, estimate_backend="cpu", attention_backend="reference")
            assert 0.2 < res.stats.density < 0.95, (name, res.stats.density)  # a mask that matters
        else:
            mode = c.get("sink_mode")
            ref, ref_lse = ariadne.attention(q.numpy(), k.numpy(), v.numpy(), c["pattern"],
                                             sink=sink.numpy() if mode else None, sink_mode=mode, lse=True,
                                             cu_seqlens=cu, backend="reference")
        close(out, ref, "float32", max_logit)
        lse_close(lse, ref_lse, BASE_TOL["float32"])


def test_shard_and_unshard_are_inverse():
    x = torch.arange(1000).reshape(1000, 1)
    for world in (1, 2, 3, 8):
        for align in (1, 64):
            for cu in (None, [0, 1000], [0, 10, 10, 700, 1000]):
                parts = [cp.shard(x, r, world, align, cu) for r in range(world)]
                assert sum(p.shape[0] for p in parts) == 1000
                assert torch.equal(cp.unshard(parts, world, align, cu_seqlens=cu), x)
    # Rank 0 of 2 holds chunks 0 and 3 of each sequence.
    assert cp.shard(torch.arange(8), 0, 2).tolist() == [0, 1, 6, 7]
    assert cp.shard(torch.arange(12), 0, 2, cu_seqlens=[0, 8, 12]).tolist() == [0, 1, 6, 7, 8, 11]


def test_pieces_merge_to_attention(rng):
    """Two pieces of one query run (keys cut in two), merged and finished: one-device attention."""
    q = rng.uniform(-1, 1, (100, HQ, D)).astype(np.float32)
    k = rng.uniform(-1, 1, (100, HKV, D)).astype(np.float32)
    v = rng.uniform(-1, 1, (100, HKV, D)).astype(np.float32)
    pattern = ariadne.Pattern.window(30, 0)
    acc = np.zeros((60, HQ, D), np.float32)
    acc_lse = np.full((HQ, 60), -np.inf, np.float32)
    for k0, k1 in ((0, 55), (55, 100)):
        part = np.empty((60, HQ, D), np.float32)
        part_lse = np.empty((HQ, 60), np.float32)
        ariadne._ariadne.attention_piece(q[40:], k[k0:k1], v[k0:k1], 40, k0, part, part_lse, rule=pattern)
        ariadne._ariadne.merge_partial(acc, acc_lse, part, part_lse)
    out = np.empty((60, HQ, D), np.float32)
    lse = np.empty((HQ, 60), np.float32)
    ariadne._ariadne.finish_partials(acc, acc_lse, out, lse)
    ref, ref_lse = ariadne.attention(q, k, v, pattern, lse=True, backend="reference")
    close(out, ref[40:], "float32", 2.0)
    lse_close(lse, ref_lse[:, 40:], BASE_TOL["float32"])


def test_bad_calls_name_the_argument():
    q = np.zeros((64, HQ, D), np.float32)
    out = np.zeros((64, HQ, D), np.float32)
    lse = np.zeros((HQ, 64), np.float32)
    with pytest.raises(ariadne.Error, match="q_pos -1"):
        ariadne._ariadne.attention_piece(q, q[:, :HKV], q[:, :HKV], -1, 0, out, lse)
    with pytest.raises(ariadne.Error, match="lse"):
        ariadne._ariadne.attention_piece(q, q[:, :HKV], q[:, :HKV], 0, 0, out, lse[:, :10])
    with pytest.raises(ariadne.Error, match="q_pos"):
        ariadne._ariadne.estimate_rr_from_key_sums(q, np.zeros((8, HKV, D), np.float32), 5, 64, block=32)


def test_ring_of_one_rank_checks_its_shard(tmp_path):
    q, k, v, _ = inputs()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match="rows, expected 300"):
            cp.ring_attention(q[:10], k[:10], v[:10], seq_len=L)
        with pytest.raises(ValueError, match="causal masks"):
            cp.ring_attention(q, k, v, seq_len=L, pattern=ariadne.Pattern.full(), rr=dict(block=32))
        out, _ = cp.ring_attention(q, k, v, seq_len=L)  # one rank: plain causal attention
        ref, _ = ariadne.attention(q.numpy(), k.numpy(), v.numpy(), ariadne.Pattern.causal(), backend="reference")
        close(out.numpy(), ref, "float32", 2 * 2 * D / math.sqrt(D))
    finally:
        dist.destroy_process_group()
