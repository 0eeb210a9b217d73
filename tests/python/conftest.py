"""Shared helpers of the Python tests: a numpy attention reference written from the formulas in
include/ariadne/attention.hpp and pattern.hpp (float64, dense masks), and the tolerance rule of
docs/numerics.md."""

import math
import os
import pathlib
import shutil
import zlib

import numpy as np
import pytest

import ariadne


def visible(pattern, lq, lk, block_rows=None, block=0):
    """Dense [lq, lk] bool mask of one sequence (and one head when block_rows is given: a list of
    key-block lists per query block)."""
    iq = np.arange(lq)[:, None]
    ik = np.arange(lk)[None, :]
    p = iq + (lk - lq)  # queries are aligned to the end of the keys
    m = np.ones((lq, lk), bool)
    if pattern.window_left >= 0:
        m &= ik >= p - pattern.window_left
    if pattern.window_right >= 0:
        m &= ik <= p + pattern.window_right
    if pattern.chunk > 0:
        m &= (ik // pattern.chunk) == (p // pattern.chunk)
    if block_rows is not None:
        b = np.zeros((lq, lk), bool)
        for qb, cols in enumerate(block_rows):
            for kb in cols:
                b[qb * block:(qb + 1) * block, kb * block:(kb + 1) * block] = True
        m &= b
    return m


def reference(q, k, v, pattern, cu_q=None, cu_k=None, mask=None, sink=None, sink_mode="none", scale=0.0):
    """(out [total_q, hq, d] float64, lse [hq, total_q] float64, a) with `a` the list of per
    (sequence, head) attention matrices. mask: BlockMask or None."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    tq, hq, d = q.shape
    tk, hkv, _ = k.shape
    cu_q = [0, tq] if cu_q is None else list(cu_q)
    cu_k = cu_q if cu_k is None else list(cu_k)
    scale = scale or 1.0 / math.sqrt(d)
    out = np.zeros((tq, hq, d))
    lse = np.full((hq, tq), -np.inf)
    mats = []
    for s in range(len(cu_q) - 1):
        q0, q1, k0, k1 = cu_q[s], cu_q[s + 1], cu_k[s], cu_k[s + 1]
        lq, lk = q1 - q0, k1 - k0
        for h in range(hq):
            rows = None
            if mask is not None:
                nqb = -(-lq // mask.block)
                base = int(mask.seq_block_base[s]) * hq + h * nqb
                rp, ci = mask.row_ptr, mask.col_idx
                rows = [ci[rp[base + m]:rp[base + m + 1]] for m in range(nqb)]
            allowed = visible(pattern, lq, lk, rows, mask.block if mask is not None else 0)
            g = h // (hq // hkv)
            logits = scale * q[q0:q1, h] @ k[k0:k1, g].T
            if sink_mode == "key0" and lk > 0:
                logits[:, 0] += sink[h]
            logits = np.where(allowed, logits, -np.inf)
            terms = [logits]
            if sink_mode == "denominator":
                terms.append(np.full((lq, 1), float(sink[h])))
            full = np.concatenate(terms, axis=1)
            mx = full.max(axis=1, keepdims=True) if full.shape[1] else np.zeros((lq, 1))
            mx = np.where(np.isfinite(mx), mx, 0.0)
            z = np.exp(full - mx).sum(axis=1, keepdims=True)
            with np.errstate(divide="ignore"):
                lse[h, q0:q1] = (np.log(z) + mx)[:, 0]
            a = np.where(z > 0, np.exp(logits - mx) / np.where(z > 0, z, 1), 0.0)
            out[q0:q1, h] = a @ v[k0:k1, g]
            mats.append(a)
    return out, lse, mats


def rel_l2(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    n = np.linalg.norm(ref)
    return np.linalg.norm(x - ref) / (n if n > 0 else 1.0)


BASE_TOL = {"float32": 2e-5, "bfloat16": 1e-2, "float16": 4e-3}


def close(x, ref, dtype, max_logit):
    """docs/numerics.md: rel_l2 <= tol and max_abs <= 10 tol max|ref|, tol = base + 1e-6 L."""
    tol = BASE_TOL[dtype] + 1e-6 * max_logit
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    assert np.all(np.isfinite(x)), "non-finite output"
    assert rel_l2(x, ref) <= tol, f"rel_l2 {rel_l2(x, ref):.3g} > {tol:.3g}"
    assert np.abs(x - ref).max(initial=0) <= 10 * tol * max(np.abs(ref).max(initial=0), 1e-3)


def lse_close(x, ref, tol):
    inf = np.isneginf(ref)
    assert np.array_equal(np.isneginf(x), inf), "-inf rows differ"
    assert np.all(np.abs(x[~inf] - ref[~inf]) <= tol * np.maximum(1, np.abs(ref[~inf])))


def fast_backends(q, k, v, **kw):
    """The backends this build can run for a call: the reference always, the others when they say so."""
    out = ["reference"]
    for name in ("cpu", "auto"):
        ok, _ = ariadne.backend_supports(name, q, k, v, **kw)
        if ok:
            out.append(name)
    return out


@pytest.fixture
def rng(request):
    """Inputs drawn fresh for each test (seeded by the test's id, so a failure reproduces);
    ARIADNE_TEST_SEED=n draws another set."""
    seed = zlib.crc32(request.node.nodeid.encode()) ^ int(os.environ.get("ARIADNE_TEST_SEED", "0"))
    return np.random.default_rng(seed)


def find_cli():
    """A built `ariadne` CLI: $ARIADNE_CLI, build/ariadne or build-cpu/ariadne of this checkout, or
    one on PATH; None when there is none (tests that need it skip)."""
    env = os.environ.get("ARIADNE_CLI")
    if env:
        return env
    root = pathlib.Path(__file__).resolve().parents[2]
    for build in ("build", "build-cpu"):
        path = root / build / "ariadne"
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return shutil.which("ariadne")
