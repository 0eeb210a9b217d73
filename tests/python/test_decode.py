"""Decode attention over the paged KV cache through the Python bindings (include/ariadne/decode.hpp).

The cpu and reference backends are checked against a float64 numpy decode written from the formula
in decode.hpp, and against ariadne.attention's reference on the same keys laid out contiguously;
page selections are checked as discrete outputs (exactly); bad calls raise ariadne.Error naming
the argument. Tolerances follow docs/numerics.md: the f32 rule for every cache dtype, since decode
computes in f32 on the stored (rounded) values and the references read those same values."""

import math
import subprocess
import sys
import threading

import numpy as np
import pytest

import ariadne
from conftest import BASE_TOL, close, lse_close

HQ, HKV, D = 6, 2, 32  # GQA: three query heads per KV head


def bf16_round(x):
    """float32 -> nearest bfloat16 (ties to even), back in float32: what a bf16 cache stores."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32)


def stored(x, dtype):
    """The values a cache of `dtype` holds for float32 input x, as float64."""
    if dtype == "f16":
        return x.astype(np.float16).astype(np.float64)
    if dtype == "bf16":
        return bf16_round(x).astype(np.float64)
    return x.astype(np.float64)


class Batch:
    """A cache holding one sequence per entry of `lengths` (appended in uneven chunks, so pages and
    key strides are filled across appends), the float32 keys and values appended, and one query per
    sequence."""

    def __init__(self, rng, lengths, page_size, dtype="f32", summary_stride=None, scale_k=1.0):
        stride = summary_stride or next(s for s in (4, 2, 1) if page_size % s == 0)
        self.cache = ariadne.PagedKVCache(kv_heads=HKV, head_dim=D, page_size=page_size, dtype=dtype,
                                          summary_stride=stride)
        self.dtype = dtype
        self.lengths = list(lengths)
        self.k, self.v = [], []
        self.seqs = []
        for n in self.lengths:
            s = self.cache.add_sequence()
            k = (scale_k * rng.standard_normal((n, HKV, D))).astype(np.float32)
            v = rng.standard_normal((n, HKV, D)).astype(np.float32)
            cut = n // 3
            for a, b in ((0, cut), (cut, n)):
                if b > a:
                    self.cache.append(s, k[a:b], v[a:b])
            self.seqs.append(s)
            self.k.append(k)
            self.v.append(v)
        self.q = rng.standard_normal((len(self.lengths), HQ, D)).astype(np.float32)

    def max_logit(self, scale=0.0):
        scale = scale or 1.0 / math.sqrt(D)
        kmax = max((np.abs(k).max() for k in self.k if k.size), default=0.0)
        return scale * np.abs(self.q).max() * kmax * D


def visible_pages(length, window, page_size):
    """(first visible token, first visible page, last visible page); pages empty when length is 0."""
    if length == 0:
        return 0, 0, -1
    first = 0 if window < 0 else max(0, length - 1 - window)
    return first, first // page_size, (length - 1) // page_size


def numpy_decode(batch, window=-1, sink=None, sink_mode="none", scale=0.0, selection=None):
    """(out [B, HQ, D], lse [B, HQ]) in float64 from decode.hpp's formula on the stored values."""
    scale = scale or 1.0 / math.sqrt(D)
    P = batch.cache.page_size
    q = batch.q.astype(np.float64)
    out = np.zeros((len(batch.lengths), HQ, D))
    lse = np.full((len(batch.lengths), HQ), -np.inf)
    for b, n in enumerate(batch.lengths):
        k, v = stored(batch.k[b], batch.dtype), stored(batch.v[b], batch.dtype)
        first, _, _ = visible_pages(n, window, P)
        for h in range(HQ):
            g = h // (HQ // HKV)
            allowed = np.arange(n) >= first
            if selection is not None:
                r = b * HKV + g
                kept = selection.pages[selection.row_ptr[r]:selection.row_ptr[r + 1]]
                allowed &= np.isin(np.arange(n) // P, kept)
            logits = scale * (k[:, g] @ q[b, h])
            if sink_mode == "key0" and n > 0:
                logits[0] += sink[h]
            logits = logits[allowed]
            terms = list(logits) + ([float(sink[h])] if sink_mode == "denominator" else [])
            if not terms:
                continue
            m = max(terms)
            z = sum(math.exp(t - m) for t in terms)
            lse[b, h] = m + math.log(z)
            out[b, h] = (np.exp(logits - m) / z) @ v[allowed, g]
    return out, lse


def poisoned(shape):
    return np.full(shape, np.nan, np.float32)


def run_both(batch, **kw):
    """The cpu and reference backends on the same call, into NaN-poisoned outputs (so an element
    left unwritten fails the comparison)."""
    res = {}
    for backend in ("cpu", "reference"):
        out, lse = poisoned(batch.q.shape), poisoned(batch.q.shape[:2])
        got = ariadne.decode_attention(batch.q, batch.cache, batch.seqs, out=out, lse=lse, backend=backend, **kw)
        assert got[0] is out and got[1] is lse
        res[backend] = (out, lse)
    return res


def sink_args(rng, mode):
    if mode == "none":
        return {}
    return {"sink": rng.uniform(-3, 3, HQ).astype(np.float32), "sink_mode": mode}


@pytest.mark.parametrize("page_size", [16, 7])
@pytest.mark.parametrize("window", [-1, 0, 23])
@pytest.mark.parametrize("mode", ["none", "denominator", "key0"])
def test_dense_decode_matches_references(rng, page_size, window, mode):
    """GQA 6:2, ragged lengths (one empty, one of a single token, page sizes that do not divide
    them), windows and both sink forms: cpu and reference against the numpy decode, and the
    reference against ariadne.attention on the same keys laid out contiguously."""
    batch = Batch(rng, [37, 1, 130, 0, 64], page_size)
    sink = sink_args(rng, mode)
    want_out, want_lse = numpy_decode(batch, window, sink.get("sink"), mode)
    tol = BASE_TOL["float32"] + 1e-6 * batch.max_logit()
    res = run_both(batch, window=window, **sink)
    for backend, (out, lse) in res.items():
        close(out, want_out, "float32", batch.max_logit())
        lse_close(lse, want_lse, tol)

    # One query per sequence at its last key (attention aligns queries to the end of the keys).
    cu_k = np.concatenate([[0], np.cumsum(batch.lengths)]).astype(np.int32)
    pattern = ariadne.Pattern.causal() if window < 0 else ariadne.Pattern.window(window, 0)
    a_out, a_lse = ariadne.attention(batch.q, np.concatenate(batch.k), np.concatenate(batch.v), pattern=pattern,
                                     cu_seqlens=np.arange(len(batch.lengths) + 1, dtype=np.int32), cu_seqlens_k=cu_k,
                                     lse=True, backend="reference", **sink)
    close(res["reference"][0], a_out, "float32", batch.max_logit())
    lse_close(res["reference"][1], a_lse.T, tol)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_half_caches_match_the_stored_values(rng, dtype):
    """A bf16 / f16 cache stores rounded keys and values; both backends read those exactly (numpy
    decode on the rounded values), and the key summaries are taken from them too."""
    batch = Batch(rng, [50, 9, 96], 16, dtype=dtype)
    kw = dict(window=40, **sink_args(rng, "denominator"))
    want_out, want_lse = numpy_decode(batch, 40, kw["sink"], "denominator")
    tol = BASE_TOL["float32"] + 1e-6 * batch.max_logit()
    for out, lse in run_both(batch, **kw).values():
        close(out, want_out, "float32", batch.max_logit())
        lse_close(lse, want_lse, tol)
    s, k = batch.seqs[1], stored(batch.k[1], dtype).astype(np.float32)
    pool = batch.cache.page_table(s)[0]
    np.testing.assert_array_equal(batch.cache.key_min(pool), k.min(axis=0))
    np.testing.assert_array_equal(batch.cache.key_max(pool), k.max(axis=0))


def test_bf16_queries_and_keys_from_ml_dtypes(rng):
    """ml_dtypes bfloat16 arrays cross as their bits: the same as float32 arrays holding the same values."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    k = bf16_round(rng.standard_normal((40, HKV, D)).astype(np.float32))
    v = bf16_round(rng.standard_normal((40, HKV, D)).astype(np.float32))
    q = bf16_round(rng.standard_normal((1, HQ, D)).astype(np.float32))
    results = []
    for cast in (lambda x: x, lambda x: x.astype(ml_dtypes.bfloat16)):
        cache = ariadne.PagedKVCache(HKV, D, page_size=16, dtype="bf16")
        s = cache.add_sequence()
        cache.append(s, cast(k), cast(v))
        results.append(ariadne.decode_attention(cast(q), cache, [s]))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])


def test_torch_cpu_tensors(rng):
    """torch CPU tensors go through DLPack like numpy arrays: the same bits, outputs as tensors."""
    torch = pytest.importorskip("torch")
    batch = Batch(rng, [33, 70], 16)
    want_out, want_lse = ariadne.decode_attention(batch.q, batch.cache, batch.seqs, window=20)
    cache = ariadne.PagedKVCache(HKV, D, page_size=16, summary_stride=4)
    seqs = [cache.add_sequence() for _ in batch.lengths]
    for s, k, v in zip(seqs, batch.k, batch.v):
        cache.append(s, torch.from_numpy(k), torch.from_numpy(v))
    out, lse = ariadne.decode_attention(torch.from_numpy(batch.q), cache, torch.tensor(seqs), window=20)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    np.testing.assert_array_equal(out.numpy(), want_out)
    np.testing.assert_array_equal(lse.numpy(), want_lse)


def test_half_outputs_are_the_float32_output_rounded(rng):
    """A float16 out (or a bfloat16 tensor) holds the float32 result rounded once to nearest even,
    on both backends, every element written."""
    batch = Batch(rng, [33, 70, 5], 16)
    for backend in ("cpu", "reference"):
        want, _ = ariadne.decode_attention(batch.q, batch.cache, batch.seqs, window=20, backend=backend)
        out = np.full(batch.q.shape, np.nan, np.float16)
        got, _ = ariadne.decode_attention(batch.q, batch.cache, batch.seqs, window=20, out=out, backend=backend)
        assert got is out
        np.testing.assert_array_equal(out, want.astype(np.float16))
    torch = pytest.importorskip("torch")
    out = torch.full(batch.q.shape, float("nan"), dtype=torch.bfloat16)
    ariadne.decode_attention(batch.q, batch.cache, batch.seqs, window=20, out=out)
    want, _ = ariadne.decode_attention(batch.q, batch.cache, batch.seqs, window=20)
    assert torch.equal(out, torch.from_numpy(want).to(torch.bfloat16))


def check_selection(sel, batch, window, sink_pages, recent_pages):
    """Rows (b, g) list ascending, distinct pages among the visible ones, with the forced ones."""
    P = batch.cache.page_size
    assert sel.kv_heads == HKV and sel.rows == len(batch.lengths) * HKV
    assert sel.row_ptr.dtype == np.int32 and sel.pages.dtype == np.int32
    assert sel.row_ptr[0] == 0 and sel.row_ptr[-1] == len(sel.pages) == sel.kept
    for r in range(sel.rows):
        n = batch.lengths[r // HKV]
        _, lo, hi = visible_pages(n, window, P)
        row = sel.pages[sel.row_ptr[r]:sel.row_ptr[r + 1]]
        assert sel.visible[r] == hi - lo + 1
        assert np.all(np.diff(row) > 0), row
        assert np.all((row >= lo) & (row <= hi)), (row, lo, hi)
        forced = [p for p in range(lo, hi + 1) if p < sink_pages or p > hi - recent_pages]
        assert set(forced) <= set(row.tolist()), (forced, row)
        assert 0 <= sel.kept_mass[r] <= 1 + 1e-6


@pytest.mark.parametrize("scorer", ["rr", "quest", "oracle"])
@pytest.mark.parametrize("window", [-1, 45])
def test_selection_keeps_visible_pages_and_decodes_them(rng, scorer, window):
    """A selection's pages lie within the visible pages and include the forced ones; decoding with it
    reads exactly those pages (cpu and reference against the numpy decode restricted to them), and
    the same rows given as a PageSelection built from arrays decode the same."""
    batch = Batch(rng, [150, 20, 0, 97], 8)
    sink = sink_args(rng, "key0")
    sel = ariadne.select_pages(batch.q, batch.cache, batch.seqs, scorer=scorer, tau=0.6, sink_pages=1,
                               recent_pages=2, window=window, step=3, **sink)
    check_selection(sel, batch, window, 1, 2)
    assert sel.density < 1  # τ = 0.6 over up to 19 pages leaves some out
    want_out, want_lse = numpy_decode(batch, window, sink["sink"], "key0", selection=sel)
    tol = BASE_TOL["float32"] + 1e-6 * batch.max_logit()
    res = run_both(batch, window=window, selection=sel, **sink)
    for out, lse in res.values():
        close(out, want_out, "float32", batch.max_logit())
        lse_close(lse, want_lse, tol)
    rebuilt = ariadne.PageSelection(HKV, sel.row_ptr, sel.pages)
    out, lse = ariadne.decode_attention(batch.q, batch.cache, batch.seqs, window=window, selection=rebuilt,
                                        backend="cpu", **sink)
    np.testing.assert_array_equal(out, res["cpu"][0])
    np.testing.assert_array_equal(lse, res["cpu"][1])


@pytest.mark.parametrize("window", [-1, 30])
def test_oracle_at_tau_one_is_dense(rng, window):
    """The oracle at τ = 1 keeps every visible page, and sparse decode with it equals dense decode."""
    batch = Batch(rng, [77, 5, 128], 16)
    sink = sink_args(rng, "denominator")
    sel = ariadne.select_pages(batch.q, batch.cache, batch.seqs, scorer="oracle", tau=1.0, window=window, **sink)
    check_selection(sel, batch, window, 1, 1)
    assert sel.kept == sel.visible_total and sel.density == 1.0
    np.testing.assert_allclose(ariadne.kept_page_mass(batch.q, batch.cache, batch.seqs, sel, window=window, **sink),
                               1.0, rtol=1e-12)
    tol = BASE_TOL["float32"] + 1e-6 * batch.max_logit()
    for backend in ("cpu", "reference"):
        dense = ariadne.decode_attention(batch.q, batch.cache, batch.seqs, window=window, backend=backend, **sink)
        sparse = ariadne.decode_attention(batch.q, batch.cache, batch.seqs, window=window, selection=sel,
                                          backend=backend, **sink)
        close(sparse[0], dense[0], "float32", batch.max_logit())
        lse_close(sparse[1], dense[1], tol)


def test_oracle_selection_equals_its_rederivation(rng):
    """The oracle's pages re-derived from page_masses with the τ rule (largest first, ties by index,
    until the kept float32 scores reach τ of their sum, then the forced pages): compared exactly; its
    kept_mass is the masses' sum over the kept pages, which kept_page_mass returns too."""
    batch = Batch(rng, [200, 64, 3], 16)
    tau, window = 0.8, 150
    sel = ariadne.select_pages(batch.q, batch.cache, batch.seqs, scorer="oracle", tau=tau, sink_pages=1,
                               recent_pages=1, window=window)
    masses = ariadne.page_masses(batch.q, batch.cache, batch.seqs, window=window)
    assert len(masses) == sel.rows
    for r, m in enumerate(masses):
        _, lo, hi = visible_pages(batch.lengths[r // HKV], window, 16)
        assert m.shape == (hi - lo + 1,) and m.dtype == np.float64
        np.testing.assert_allclose(m.sum(), 1.0, rtol=1e-12)
        f = m.astype(np.float32)
        need = tau * sum(float(x) for x in f)
        keep, cum = set(), 0.0
        for i in sorted(range(len(f)), key=lambda i: (-f[i], i)):
            if not cum < need:
                break
            keep.add(i)
            cum += float(f[i])
        keep |= {i for i in range(len(f)) if lo + i < 1 or i == len(f) - 1}
        want = sorted(lo + i for i in keep)
        assert sel.pages[sel.row_ptr[r]:sel.row_ptr[r + 1]].tolist() == want
        np.testing.assert_allclose(sel.kept_mass[r], sum(m[i - lo] for i in want), rtol=1e-6)
    kept = ariadne.kept_page_mass(batch.q, batch.cache, batch.seqs, sel, window=window)
    np.testing.assert_allclose(kept, sel.kept_mass, rtol=1e-6)


def test_cache_bookkeeping(rng):
    """Lengths, page tables and the key summaries (stride sums in row order, min, max) of what was
    appended; released pages and ids are reused; clear keeps the id."""
    P, S = 8, 4
    cache = ariadne.PagedKVCache(HKV, D, page_size=P, summary_stride=S)
    assert (cache.kv_heads, cache.head_dim, cache.page_size, cache.summary_stride, cache.dtype) == (HKV, D, P, S, "f32")
    assert cache.strides_per_page == P // S and cache.page_bytes == 2 * P * HKV * D * 4
    a, b = cache.add_sequence(), cache.add_sequence()
    k = rng.standard_normal((21, HKV, D)).astype(np.float32)
    v = rng.standard_normal((21, HKV, D)).astype(np.float32)
    cache.append(a, k[:5], v[:5])  # strides filled across appends, too
    cache.append(b, v[:3], k[:3])
    cache.append(a, k[5:], v[5:])
    assert (cache.length(a), cache.pages(a), cache.length(b), cache.pages(b)) == (21, 3, 3, 1)
    table = cache.page_table(a)
    assert table.dtype == np.int32 and len(table) == 3
    assert len(set(table.tolist()) | set(cache.page_table(b).tolist())) == 4
    for logical, pool in enumerate(table):
        keys = k[logical * P:(logical + 1) * P]
        sums = cache.key_sum(int(pool))
        assert sums.shape == (HKV, P // S, D)
        for j in range(-(-len(keys) // S)):
            acc = np.zeros((HKV, D), np.float32)
            for row in keys[j * S:(j + 1) * S]:  # in row order, as the cache sums
                acc += row
            np.testing.assert_array_equal(sums[:, j], acc)
        np.testing.assert_array_equal(cache.key_min(int(pool)), keys.min(axis=0))
        np.testing.assert_array_equal(cache.key_max(int(pool)), keys.max(axis=0))
    cache.release(a)
    assert not cache.live(a) and cache.live(b)
    c = cache.add_sequence()
    assert c == a and cache.length(c) == 0
    cache.append(c, k[:9], v[:9])
    assert set(cache.page_table(c).tolist()) <= set(table.tolist())  # taken back from the free list
    cache.clear(c)
    assert cache.live(c) and cache.length(c) == 0 and cache.pages(c) == 0


def error_cases():
    """(name, call, pattern the message must match) over one small cache; each call is a mistake."""
    cache = ariadne.PagedKVCache(HKV, D, page_size=8)
    s = cache.add_sequence()
    rng = np.random.default_rng(7)
    k = rng.standard_normal((10, HKV, D)).astype(np.float32)
    cache.append(s, k, k)
    q = rng.standard_normal((1, HQ, D)).astype(np.float32)
    dec = ariadne.decode_attention
    return [
        ("q head_dim", lambda: dec(q[:, :, :16], cache, [s]), r"q's head dim is 16"),
        ("q heads", lambda: dec(q[:, :5], cache, [s]), r"q has 5 heads"),
        ("q rank", lambda: dec(q[0], cache, [s]), r"q must be \[batch, heads_q, head_dim\]"),
        ("q dtype", lambda: dec(q.astype(np.int32), cache, [s]), r"q: dtype int32"),
        ("q float64", lambda: dec(q.astype(np.float64), cache, [s]), r"q has dtype f64"),
        ("q list", lambda: dec(q.tolist(), cache, [s]), r"q: expected an array"),
        ("seqs length", lambda: dec(q, cache, [s, s]), r"seqs has 2 entries"),
        ("seqs unknown id", lambda: dec(q, cache, [7]), r"seqs\[0\] = 7 is not a live sequence"),
        ("seqs dtype", lambda: dec(q, cache, [0.5]), r"seqs: expected .* integer"),
        ("out shape", lambda: dec(q, cache, [s], out=np.zeros((1, HQ, 8), np.float32)), r"out must be"),
        ("out dtype", lambda: dec(q, cache, [s], out=np.zeros((1, HQ, D), np.float64)), r"out must be"),
        ("lse shape", lambda: dec(q, cache, [s], lse=np.zeros((HQ, 1), np.float32)), r"lse must be"),
        ("sink length", lambda: dec(q, cache, [s], sink=np.zeros(3, np.float32)), r"needs sink as .*\[6\]"),
        ("sink mode", lambda: dec(q, cache, [s], sink=np.zeros(HQ), sink_mode="sideways"), r"sink mode: 'sideways'"),
        ("sink missing", lambda: dec(q, cache, [s], sink_mode="key0"), r"sink: sink_mode is 'key0' but no sink"),
        ("backend", lambda: dec(q, cache, [s], backend="cuda"), r"backend 'cuda' has no decode kernel"),
        ("scale", lambda: dec(q, cache, [s], scale=-1.0), r"scale is -1"),
        ("selection rows", lambda: dec(q, cache, [s], selection=ariadne.PageSelection(HKV, [0, 1, 2, 3, 4], [0] * 4)),
         r"the selection has 4 rows"),
        ("selection page", lambda: dec(q, cache, [s], selection=ariadne.PageSelection(HKV, [0, 1, 2], [0, 9])),
         r"selection row 1 lists page 9"),
        ("selection row_ptr", lambda: ariadne.PageSelection(HKV, [0, 5, 2], [0, 1]), r"row_ptr decreases at row 1"),
        ("selection end", lambda: ariadne.PageSelection(HKV, [0, 1, 3], [0, 1]), r"row_ptr ends at 3"),
        ("scorer", lambda: ariadne.select_pages(q, cache, [s], scorer="best"), r"scorer: 'best' is not one of"),
        ("tau", lambda: ariadne.select_pages(q, cache, [s], tau=1.5), r"tau is 1.5"),
        ("select seqs", lambda: ariadne.select_pages(q, cache, [3]), r"seqs\[0\] = 3"),
        ("masses seqs", lambda: ariadne.page_masses(q, cache, [3]), r"seqs\[0\] = 3"),
        ("kept seqs", lambda: ariadne.kept_page_mass(q, cache, [3], ariadne.PageSelection(HKV, [0, 0, 0], [])),
         r"seqs\[0\] = 3"),
        ("append k shape", lambda: cache.append(s, k[:, :1], k), r"k is .*expected \[10, 2, 32\]"),
        ("append v shape", lambda: cache.append(s, k, k[:4]), r"v is .*expected \[10, 2, 32\]"),
        ("append dtype", lambda: cache.append(s, k.astype(np.float64), k), r"k has dtype f64"),
        ("append seq", lambda: cache.append(5, k, k), r"sequence 5 is not a live sequence"),
        ("append list", lambda: cache.append(s, k.tolist(), k), r"k: expected an array"),
        ("length seq", lambda: cache.length(5), r"sequence 5 is not a live sequence"),
        ("page_table seq", lambda: cache.page_table(-1), r"sequence -1 is not a live sequence"),
        ("key_sum page", lambda: cache.key_sum(cache.capacity_pages), r"pool_page is"),
        ("cache dtype", lambda: ariadne.PagedKVCache(HKV, D, dtype="int8"), r"dtype: 'int8'"),
        ("cache f64", lambda: ariadne.PagedKVCache(HKV, D, dtype="f64"), r"dtype f64 is not a storage type"),
        ("cache stride", lambda: ariadne.PagedKVCache(HKV, D, page_size=8, summary_stride=3), r"summary_stride 3"),
        ("cache heads", lambda: ariadne.PagedKVCache(0, D), r"kv_heads is 0"),
    ]


ERRORS = error_cases()


@pytest.mark.parametrize("name, call, pattern", ERRORS, ids=[c[0] for c in ERRORS])
def test_bad_calls_name_the_argument(name, call, pattern):
    with pytest.raises(ariadne.Error, match=pattern):
        call()


def test_a_cache_being_read_refuses_changes(rng):
    """A decode releases the GIL; an append from another thread meanwhile is refused (it could move
    the pools under the running call), and the decode sees the cache as it was when it started or
    after the append, never a mixture."""
    cache = ariadne.PagedKVCache(HKV, 64, page_size=64)
    s = cache.add_sequence()
    # 512 full pages fill the pools (they grow by doubling from 16), so the append below reallocates them.
    k = rng.standard_normal((512 * 64, HKV, 64)).astype(np.float32)
    cache.append(s, k, k)
    q = rng.standard_normal((1, 8, 64)).astype(np.float32)
    extra = rng.standard_normal((64, HKV, 64)).astype(np.float32)
    before = ariadne.decode_attention(q, cache, [s], backend="reference")[0]
    result, refused = [], 0
    worker = threading.Thread(target=lambda: result.append(ariadne.decode_attention(q, cache, [s],
                                                                                    backend="reference")[0]))
    worker.start()
    while True:
        try:
            cache.append(s, extra, extra)
            break
        except ariadne.Error as e:
            assert "being read by a call running in another thread" in str(e)
            refused += 1
    worker.join()
    after = ariadne.decode_attention(q, cache, [s], backend="reference")[0]
    assert np.array_equal(result[0], before) or np.array_equal(result[0], after)
    assert cache.length(s) == 513 * 64 and cache.capacity_pages == 1024


LEAK_SCRIPT = """
import numpy as np, ariadne
cache = ariadne.PagedKVCache(2, 16, page_size=8)
s = cache.add_sequence()
k = np.ones((20, 2, 16), np.float32)
cache.append(s, k, k)
q = np.ones((1, 4, 16), np.float32)
sel = ariadne.select_pages(q, cache, [s], scorer="quest", tau=0.5)
KEEP = [cache, sel, sel.pages, cache.key_sum(0), ariadne.decode_attention(q, cache, [s], selection=sel),
        ariadne.page_masses(q, cache, [s])]
try:
    ariadne.decode_attention(q, cache, [9])
except ariadne.Error as e:
    KEEP.append(e)
"""


def test_no_leaks_at_exit():
    """Caches, selections and the arrays viewing them are all freed at interpreter exit."""
    run = subprocess.run([sys.executable, "-c", LEAK_SCRIPT], capture_output=True, text=True, check=True)
    assert "leaked" not in run.stderr, run.stderr
