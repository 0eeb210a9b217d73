"""ariadne.attention from numpy: every pattern, sinks, packed sequences, GQA and block masks against
the numpy reference of conftest.py; no-copy and strided-view checks; error messages."""

import threading
import time
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import pytest

import ariadne
from conftest import close, fast_backends, lse_close, reference


@dataclass
class Case:
    name: str
    seq_q: List[int]
    seq_k: Optional[List[int]] = None
    heads_q: int = 4
    heads_kv: int = 4
    dim: int = 32
    pattern: ariadne.Pattern = field(default_factory=ariadne.Pattern.full)
    sink_mode: str = "none"
    sink_range: float = 3.0
    block: int = 0  # > 0: a random block mask of this block size
    density: float = 0.5
    scale: float = 0.0
    input_scale: float = 1.0

    def __str__(self):
        return self.name


CASES = [
    Case("full", [77]),
    Case("causal", [64], pattern=ariadne.Pattern.causal()),
    Case("window_3_5", [50], pattern=ariadne.Pattern.window(3, 5)),
    Case("window_left_only", [41], pattern=ariadne.Pattern.window(7, 0)),
    Case("chunk_7", [45], pattern=ariadne.Pattern.chunked(7)),
    Case("one_token", [1], pattern=ariadne.Pattern.causal()),
    Case("varlen_full", [5, 17, 1, 9]),
    Case("varlen_with_empty", [6, 0, 11], pattern=ariadne.Pattern.window(2, 2)),
    Case("chunked_prefill", [9, 4], seq_k=[20, 4], pattern=ariadne.Pattern.causal()),
    Case("no_keys_rows", [5, 3], seq_k=[0, 7]),
    Case("gqa_8_2", [33], heads_q=8, heads_kv=2, pattern=ariadne.Pattern.causal()),
    Case("sink_denominator", [40], pattern=ariadne.Pattern.window(4, 4), sink_mode="denominator"),
    Case("sink_pm10", [40], pattern=ariadne.Pattern.window(4, 4), sink_mode="denominator", sink_range=10.0),
    Case("sink_key0", [3, 30], pattern=ariadne.Pattern.window(4, 4), sink_mode="key0"),
    Case("sink_no_keys", [4], seq_k=[0], sink_mode="denominator"),
    Case("blocks", [70], pattern=ariadne.Pattern.causal(), block=16),
    Case("blocks_varlen_gqa", [40, 23], heads_q=4, heads_kv=2, pattern=ariadne.Pattern.causal(), block=8),
    Case("head_dim_80_scale", [30], dim=80, scale=0.3),
    Case("large_logits", [24], input_scale=30.0, dim=16),
]


def make(case, rng, dtype=np.float32):
    seq_k = case.seq_k or case.seq_q
    cu_q = np.concatenate([[0], np.cumsum(case.seq_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(seq_k)]).astype(np.int32)
    tq, tk = int(cu_q[-1]), int(cu_k[-1])
    s = case.input_scale
    q = rng.uniform(-s, s, (tq, case.heads_q, case.dim)).astype(dtype)
    k = rng.uniform(-s, s, (tk, case.heads_kv, case.dim)).astype(dtype)
    v = rng.uniform(-1, 1, (tk, case.heads_kv, case.dim)).astype(dtype)
    kw = dict(pattern=case.pattern, scale=case.scale)
    if len(case.seq_q) > 1 or case.seq_k is not None:
        kw["cu_seqlens"] = cu_q
        if case.seq_k is not None:
            kw["cu_seqlens_k"] = cu_k
    if case.sink_mode != "none":
        kw["sink"] = rng.uniform(-case.sink_range, case.sink_range, case.heads_q).astype(np.float32)
        kw["sink"][0] = case.sink_range  # the edge of the range is always covered
        kw["sink_mode"] = case.sink_mode
    if case.block:
        kw["blocks"] = ariadne.BlockMask.random(case.pattern, case.block, case.heads_q, tq, tk, case.density,
                                                int(rng.integers(1 << 30)), True, cu_q.tolist(), cu_k.tolist())
    return q, k, v, kw


def ref_of(q, k, v, kw):
    return reference(q.astype(np.float64) if q.dtype != np.float32 else q,
                     k.astype(np.float64) if k.dtype != np.float32 else k,
                     v.astype(np.float64) if v.dtype != np.float32 else v,
                     kw["pattern"], kw.get("cu_seqlens"), kw.get("cu_seqlens_k"), kw.get("blocks"),
                     kw.get("sink"), kw.get("sink_mode", "none"), kw.get("scale", 0.0))


def max_logit(q, k, scale):
    d = q.shape[-1]
    scale = scale or 1 / np.sqrt(d)
    return scale * np.abs(q.astype(np.float64)).max(initial=0) * np.abs(k.astype(np.float64)).max(initial=0) * d


@pytest.mark.parametrize("case", CASES, ids=str)
def test_matches_numpy_reference(case, rng):
    q, k, v, kw = make(case, rng)
    ref_out, ref_lse, _ = ref_of(q, k, v, kw)
    for backend in fast_backends(q, k, v, **{x: y for x, y in kw.items() if x != "scale"}):
        out = np.full(q.shape, np.nan, np.float32)  # poisoned: every element must be written
        lse = np.full((q.shape[1], q.shape[0]), np.nan, np.float32)
        res, res_lse = ariadne.attention(q, k, v, out=out, lse=lse, backend=backend, **kw)
        assert res is out and res_lse is lse
        close(out, ref_out, "float32", max_logit(q, k, case.scale))
        lse_close(lse, ref_lse, 1e-5)


@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_half_precision(dtype_name, rng):
    if dtype_name == "bfloat16":
        ml_dtypes = pytest.importorskip("ml_dtypes")
        dtype = ml_dtypes.bfloat16
    else:
        dtype = np.float16
    case = Case("half", [3, 50], heads_q=4, heads_kv=2, pattern=ariadne.Pattern.window(8, 8), sink_mode="denominator")
    q, k, v, kw = make(case, rng, dtype)
    out, lse = ariadne.attention(q, k, v, lse=True, backend="reference", **kw)
    assert out.dtype == dtype
    # The reference reads the stored 16-bit values exactly.
    ref_out, ref_lse, _ = ref_of(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), kw)
    close(out.astype(np.float32), ref_out, dtype_name, max_logit(q, k, 0))
    lse_close(lse, ref_lse, 1e-5)
    # A float32 output of 16-bit inputs is allowed too.
    out32 = np.empty(q.shape, np.float32)
    ariadne.attention(q, k, v, out=out32, backend="reference", **kw)
    close(out32, ref_out, "float32", max_logit(q, k, 0))


def test_strided_views_match_contiguous(rng):
    """q, k, v sliced out of one packed qkv [tokens, 3, heads, dim] and written into a strided out."""
    qkv = rng.standard_normal((60, 3, 4, 32)).astype(np.float32)
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    assert not q.flags.c_contiguous
    wide = np.full((60, 4, 48), np.nan, np.float32)
    out = wide[:, :, 8:40]  # rows of 48 floats, 32 used
    pattern = ariadne.Pattern.window(5, 5)
    res, _ = ariadne.attention(q, k, v, pattern=pattern, out=out, backend="reference")
    assert res is out
    assert np.isnan(wide[:, :, :8]).all() and np.isnan(wide[:, :, 40:]).all(), "wrote outside the view"
    dense, _ = ariadne.attention(*(np.ascontiguousarray(x) for x in (q, k, v)), pattern=pattern, backend="reference")
    np.testing.assert_array_equal(out, dense)
    ref_out, _, _ = reference(q, k, v, pattern)
    close(out, ref_out, "float32", max_logit(q, k, 0))


def test_out_is_written_in_place_without_copy(rng):
    q = rng.standard_normal((20, 2, 16)).astype(np.float32)
    out = np.zeros_like(q)
    lse = np.zeros((2, 20), np.float32)
    ptr, lse_ptr = out.ctypes.data, lse.ctypes.data
    res, res_lse = ariadne.attention(q, q, q, out=out, lse=lse, backend="reference")
    assert res is out and res_lse is lse
    assert res.ctypes.data == ptr and res_lse.ctypes.data == lse_ptr
    assert np.abs(out).sum() > 0 and np.abs(lse).sum() > 0
    # A float64 output beside float32 q would need a copy: refused instead of silently converted.
    with pytest.raises(ValueError, match="out: dtype is f64, expected f32"):
        ariadne.attention(q, q, q, out=np.zeros(q.shape), backend="reference")
    with pytest.raises(TypeError):
        ariadne.attention(q, q, q, lse=np.zeros((2, 20)), backend="reference")


def test_returns_allocated_outputs(rng):
    q = rng.standard_normal((9, 2, 8)).astype(np.float32)
    out, lse = ariadne.attention(q, q, q, backend="reference")
    assert out.shape == q.shape and out.dtype == np.float32 and lse is None
    out, lse = ariadne.attention(q, q, q, lse=True, backend="reference")
    assert lse.shape == (2, 9) and lse.dtype == np.float32


def test_diagnostics_entropy_distance_received(rng):
    q, k, v, kw = make(Case("diag", [24], heads_q=2, heads_kv=2, pattern=ariadne.Pattern.window(3, 3),
                            sink_mode="denominator"), rng)
    coords = rng.uniform(0, 10, (24, 2)).astype(np.float32)
    ent = np.full((2, 24), np.nan, np.float32)
    dist = np.full((2, 24), np.nan, np.float32)
    rec = np.full((2, 24), np.nan, np.float32)
    ariadne.attention(q, k, v, entropy=ent, distance=dist, received=rec, coords_q=coords, coords_k=coords,
                      backend="reference", **kw)
    _, _, mats = ref_of(q, k, v, kw)
    for h, a in enumerate(mats):
        ahat = a / a.sum(axis=1, keepdims=True)  # the sink's mass left out
        with np.errstate(divide="ignore", invalid="ignore"):
            e = -np.where(ahat > 0, ahat * np.log(ahat), 0).sum(axis=1)
        dd = np.linalg.norm(coords[:, None, :].astype(np.float64) - coords[None, :, :], axis=2)
        np.testing.assert_allclose(ent[h], e, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(dist[h], (ahat * dd).sum(axis=1), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(rec[h], a.sum(axis=0), rtol=1e-5, atol=1e-6)


def test_gil_is_released_while_the_kernel_runs(rng):
    # Long enough (about 0.3 s on the reference) for a stalled main thread to show.
    q = rng.standard_normal((2048, 4, 64)).astype(np.float32)
    done = threading.Event()

    def run():
        ariadne.attention(q, q, q, backend="reference")
        done.set()

    t = threading.Thread(target=run)
    start = time.perf_counter()
    t.start()
    ticks = 0
    while not done.is_set():
        ticks += 1
        time.sleep(0.001)
    t.join()
    elapsed = time.perf_counter() - start
    # With the GIL held this loop would stall for the whole kernel: a tick or two at most.
    assert ticks >= 10, f"{ticks} ticks in {elapsed:.2f} s"


# ---- bad input: ariadne.Error (a ValueError) with the library's message ----

def _qkv(rng, tq=10, hq=4, hkv=4, d=16, tk=None):
    tk = tq if tk is None else tk
    return (rng.standard_normal((tq, hq, d)).astype(np.float32), rng.standard_normal((tk, hkv, d)).astype(np.float32),
            rng.standard_normal((tk, hkv, d)).astype(np.float32))


@pytest.mark.parametrize("mutate,message", [
    (lambda q, k, v: (q[:, :, :8], k, v, {}), r"k: dim 2 \(head_dim, same as q\) is 16, expected 8"),
    (lambda q, k, v: (q[:, :3], k[:, :2], v[:, :2], {}), r"GQA: heads_q = 3 is not a multiple of heads_kv = 2"),
    (lambda q, k, v: (q.astype(np.float64), k, v, {}), r"k: dtype is f32, expected f64"),
    (lambda q, k, v: (q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), {"backend": "cpu"}),
     r"f64 runs on the reference backend"),
    (lambda q, k, v: (q.astype(np.int32), k, v, {}), r"q: dtype int32 is not supported"),
    (lambda q, k, v: (q[0], k, v, {}), r"q: .*rank"),
    (lambda q, k, v: (q, k, v[:9], {}), r"v: dim 0 \(tokens, same as k\) is 9, expected 10"),
    (lambda q, k, v: (q[:, :, ::2], k[:, :, ::2], v[:, :, ::2], {}), r"q: .*contiguous"),
    (lambda q, k, v: (q, k, v, {"cu_seqlens": [0, 4, 9]}), r"cu_seqlens_q\[2\] is 9, expected the packed length 10"),
    (lambda q, k, v: (q, k, v, {"cu_seqlens": [0, 6, 4, 10]}), r"cu_seqlens_q must be non-decreasing"),
    (lambda q, k, v: (q, k, v, {"cu_seqlens": [0]}), r"cu_seqlens_q: has 1 entries"),
    (lambda q, k, v: (q, k, v, {"pattern": ariadne.Pattern.window(-3, 2)}), r"pattern.window_left is -3"),
    (lambda q, k, v: (q, k, v, {"sink": np.zeros(3, np.float32)}), r"sink: dim 0 \(heads_q\) is 3, expected 4"),
    (lambda q, k, v: (q, k, v, {"sink_mode": "denominator"}), r"sink: sink_mode is 'denominator' but no sink"),
    (lambda q, k, v: (q, k, v, {"sink": np.zeros(4, np.float32), "sink_mode": "sideways"}), r"sink mode: 'sideways'"),
    (lambda q, k, v: (q, k, v, {"backend": "tpu"}), r"backend: 'tpu' is not one of"),
    (lambda q, k, v: (q, k, v, {"lse": np.zeros((4, 9), np.float32)}), r"lse: dim 1 \(tokens\) is 9, expected 10"),
    (lambda q, k, v: (q, k, v, {"backend": "cuda"}), r"cuda"),
])
def test_errors_name_the_argument(rng, mutate, message):
    q, k, v = _qkv(rng)
    q, k, v, kw = mutate(q, k, v)
    kw.setdefault("backend", "reference")
    with pytest.raises(ariadne.Error, match=message) as info:
        ariadne.attention(q, k, v, **kw)
    assert isinstance(info.value, ValueError)


def test_block_mask_for_other_lengths_is_an_error(rng):
    q, k, v = _qkv(rng, tq=40)
    mask = ariadne.BlockMask.random(ariadne.Pattern.causal(), 8, 4, 32, 32, 0.5, 3)
    with pytest.raises(ValueError, match=r"blocks: the mask has 16 rows, expected 20"):
        ariadne.attention(q, k, v, pattern=ariadne.Pattern.causal(), blocks=mask, backend="reference")
    wrong_heads = ariadne.BlockMask.random(ariadne.Pattern.causal(), 8, 2, 40, 40, 0.5, 3)
    with pytest.raises(ValueError, match=r"blocks: the mask has rows for 2 heads, q has 4"):
        ariadne.attention(q, k, v, blocks=wrong_heads, backend="reference")
    bad = ariadne.BlockMask(8, 4, np.array([0, 5], np.int32), np.zeros(21, np.int32) + np.r_[0, [1] * 20].astype(np.int32),
                            np.array([7], np.int32))
    with pytest.raises(ValueError, match=r"col_idx\[0\] = 7 is out of range"):
        ariadne.attention(q, k, v, blocks=bad, backend="reference")


def test_read_only_inputs_are_accepted_but_not_outputs(rng):
    q, k, v = _qkv(rng)
    for x in (q, k, v):
        x.flags.writeable = False
    out, _ = ariadne.attention(q, k, v, backend="reference")
    ro = np.zeros_like(out)
    ro.flags.writeable = False
    with pytest.raises(TypeError):
        ariadne.attention(q, k, v, out=ro, backend="reference")


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_token_order_runs_the_pattern_over_the_permuted_rows(backend, rng):
    """order: logical row i is stored at row order[i]. Expected: the numpy reference on the gathered
    rows (logical order), scattered back to storage order."""
    grid = ariadne.order((6, 10), "raster"), ariadne.order((6, 10), "block_col")
    order = np.asarray(ariadne.order_conversion(*grid), np.int32)  # column-major walk of a row-major grid
    q, k, v = (rng.standard_normal((60, 2, 16)).astype(np.float32) for _ in range(3))
    pattern = ariadne.Pattern.window(4, 4)
    out, lse = ariadne.attention(q, k, v, pattern=pattern, order=order, lse=True, backend=backend)
    ref_out, ref_lse, _ = reference(q[order], k[order], v[order], pattern)
    want_out, want_lse = np.empty_like(ref_out), np.empty_like(ref_lse)
    want_out[order], want_lse[:, order] = ref_out, ref_lse
    close(out, want_out, "float32", max_logit(q, k, 0))
    np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=1e-5)
    # The order matters: without it the same window over storage rows gives another result.
    plain, _ = ariadne.attention(q, k, v, pattern=pattern, backend=backend)
    assert np.abs(plain - out).max() > 0.1
    with pytest.raises(ariadne.Error, match=r"order\["):
        bad = order.copy()
        bad[1] = bad[0]
        ariadne.attention(q, k, v, pattern=pattern, order=bad, backend=backend)
