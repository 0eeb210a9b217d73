"""ariadne.attention on CuPy arrays (CUDA, through DLPack, no copies) against the float64 numpy
reference of conftest.py: strided views, GQA, sinks, device cu_seqlens, streams. Needs CuPy, a GPU
and a CUDA build; skipped otherwise (CI has none of them)."""

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

import ariadne  # noqa: E402
from conftest import close, lse_close, reference, rel_l2  # noqa: E402


def _gpu():
    try:
        return cupy.cuda.runtime.getDeviceCount() > 0
    except cupy.cuda.runtime.CUDARuntimeError:
        return False


pytestmark = pytest.mark.skipif(not (_gpu() and ariadne.cuda_available()), reason="needs a GPU and a CUDA build")


def test_window_sink_gqa_matches_reference(rng):
    n, hq, hkv, d = 300, 8, 2, 64
    qkv_host = rng.standard_normal((n, hq + 2 * hkv, d)).astype(np.float16)
    qkv = cupy.asarray(qkv_host)
    q, k, v = qkv[:, :hq], qkv[:, hq:hq + hkv], qkv[:, hq + hkv:]  # strided views of one projection
    sink = cupy.linspace(-3, 3, hq, dtype=cupy.float32)
    out = cupy.full((n, hq, d), np.nan, dtype=cupy.float16)
    pattern = ariadne.Pattern.window(64, 64)
    res, lse = ariadne.attention(q, k, v, pattern=pattern, sink=sink, out=out, lse=True, backend="cuda")
    assert res is out and res.data.ptr == out.data.ptr  # written in place
    assert isinstance(lse, cupy.ndarray) and lse.shape == (hq, n) and lse.dtype == cupy.float32
    h = qkv_host.astype(np.float64)
    ref, ref_lse, _ = reference(h[:, :hq], h[:, hq:hq + hkv], h[:, hq + hkv:], pattern, sink=cupy.asnumpy(sink),
                                sink_mode="denominator")
    print(f"cupy window+sink+gqa f16: rel_l2 {rel_l2(cupy.asnumpy(out), ref):.3g}")
    close(cupy.asnumpy(out), ref, "float16", max_logit=float(np.abs(h).max() ** 2 * d ** 0.5))
    lse_close(cupy.asnumpy(lse), ref_lse, 4e-3)


def test_varlen_with_device_cu_seqlens(rng):
    lengths = [17, 0, 64, 5]
    cu_host = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    n = int(cu_host[-1])
    q_host = rng.standard_normal((n, 4, 64)).astype(np.float16)
    q = cupy.asarray(q_host)
    out, _ = ariadne.attention(q, q, q, pattern=ariadne.Pattern.causal(), cu_seqlens=cupy.asarray(cu_host),
                               backend="cuda")
    h = q_host.astype(np.float64)
    ref, _, _ = reference(h, h, h, ariadne.Pattern.causal(), cu_q=cu_host)
    print(f"cupy varlen causal f16: rel_l2 {rel_l2(cupy.asnumpy(out), ref):.3g}")
    close(cupy.asnumpy(out), ref, "float16", max_logit=float(np.abs(h).max() ** 2 * 8))


def test_explicit_and_current_stream():
    q = cupy.random.standard_normal((1000, 8, 64), dtype=cupy.float32).astype(cupy.float16)
    cupy.cuda.Device().synchronize()
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        a, _ = ariadne.attention(q, q, q, pattern=ariadne.Pattern.causal())  # CuPy's current stream: s
    b, _ = ariadne.attention(q, q, q, pattern=ariadne.Pattern.causal(), stream=s.ptr)
    s.synchronize()
    assert bool((a == b).all())
    h = cupy.asnumpy(q).astype(np.float64)
    ref, _, _ = reference(h, h, h, ariadne.Pattern.causal())
    close(cupy.asnumpy(a), ref, "float16", max_logit=float(np.abs(h).max() ** 2 * 8))


def test_host_device_mix_is_an_error():
    q = cupy.zeros((10, 2, 64), cupy.float16)
    with pytest.raises(ValueError, match="k: "):
        ariadne.attention(q, cupy.asnumpy(q), q, backend="cuda")
