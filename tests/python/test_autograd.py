"""Gradients of ariadne attention: torch autograd through ariadne.attention (the torch.library
autograd of ariadne::attention) and ariadne.attention_backward on numpy arrays and tensors, against
torch's own autograd of an explicit float64 attention with the same pattern, sink and GQA; gradcheck
of the op; torch.compile(fullgraph=True) of a forward and backward; the errors. On CUDA the same
checks run in bf16 against the float64 math. Needs torch (installed by scripts/test-python)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ariadne  # noqa: E402
import ariadne.ops  # noqa: E402

CUDA = torch.cuda.is_available() and ariadne.cuda_available()


def _host_backend():
    q = np.zeros((4, 2, 16), np.float32)
    d = np.zeros((4, 2, 16), np.float32)
    lse = np.zeros((2, 4), np.float32)
    try:
        ariadne.attention_backward(q, q, q, d, lse, d, backend="cpu")
        return "cpu"
    except ariadne.Error:
        return "reference"


HOST = _host_backend()


def _allowed(lq, lk, pattern, cu=None, cu_k=None):
    """[total_q, total_k] bool mask of the pattern over packed sequences (bottom-right aligned)."""
    cu = cu if cu is not None else [0, lq]
    cu_k = cu_k if cu_k is not None else cu
    m = torch.zeros(cu[-1], cu_k[-1], dtype=torch.bool)
    for s in range(len(cu) - 1):
        nq, nk = cu[s + 1] - cu[s], cu_k[s + 1] - cu_k[s]
        iq = torch.arange(nq)[:, None] + (nk - nq)
        ik = torch.arange(nk)[None, :]
        ok = torch.ones(nq, nk, dtype=torch.bool)
        if pattern.window_left >= 0:
            ok &= ik >= iq - pattern.window_left
        if pattern.window_right >= 0:
            ok &= ik <= iq + pattern.window_right
        if pattern.chunk > 0:
            ok &= torch.div(ik, pattern.chunk, rounding_mode="floor") == torch.div(iq, pattern.chunk,
                                                                                     rounding_mode="floor")
        m[cu[s]:cu[s + 1], cu_k[s]:cu_k[s + 1]] = ok
    return m


def _math(q, k, v, mask, sink=None, sink_mode="none", cu_k=None):
    """Explicit attention in the inputs' dtype (float64 here), differentiable by torch."""
    hq, hkv = q.shape[1], k.shape[1]
    kk = k.repeat_interleave(hq // hkv, dim=1)
    vv = v.repeat_interleave(hq // hkv, dim=1)
    s = torch.einsum("qhd,khd->hqk", q, kk) / q.shape[2] ** 0.5
    if sink_mode == "key0":
        first = torch.zeros(s.shape[2], dtype=s.dtype)
        for start in (cu_k[:-1] if cu_k is not None else [0]):
            first[start] = 1
        s = s + sink[:, None, None] * first[None, None, :]
    s = s.masked_fill(~mask[None], float("-inf"))
    if sink_mode == "denominator":
        z = torch.cat([s, sink[:, None, None].expand(-1, s.shape[1], 1)], dim=2)
        lse = torch.logsumexp(z, dim=2, keepdim=True)
    else:
        lse = torch.logsumexp(s, dim=2, keepdim=True)
    lse = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    p = torch.exp(s - lse)
    return torch.einsum("hqk,khd->qhd", p, vv)


CASES = [
    # name, lq per sequence, lk per sequence, pattern, sink mode, heads_q, heads_kv
    ("full", [50], None, ariadne.Pattern.full(), "none", 4, 4),
    ("causal_gqa", [70], None, ariadne.Pattern.causal(), "none", 4, 1),
    ("window_sink", [64], None, ariadne.Pattern.window(8, 5), "denominator", 2, 2),
    ("chunk_key0", [40], None, ariadne.Pattern.chunked(16), "key0", 2, 1),
    ("varlen_causal_short_q", [5, 17, 30], [12, 17, 40], ariadne.Pattern.causal(), "denominator", 4, 2),
]


def _inputs(lq, lk, hq, hkv, d=16, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    nq, nk = sum(lq), sum(lk or lq)
    q = torch.randn(nq, hq, d, generator=g)
    k = torch.randn(nk, hkv, d, generator=g)
    v = torch.randn(nk, hkv, d, generator=g)
    sink = torch.linspace(-1.5, 2.0, hq)
    dout = torch.randn(nq, hq, d, generator=g)
    return [x.to(device, dtype) for x in (q, k, v)], sink.to(device), dout.to(device, dtype)


def _cu(lens):
    return [0] + list(np.cumsum(lens)) if lens is not None else None


@pytest.mark.parametrize("name,lq,lk,pattern,mode,hq,hkv", CASES, ids=[c[0] for c in CASES])
def test_autograd_matches_float64_math(name, lq, lk, pattern, mode, hq, hkv):
    (q, k, v), sink, dout = _inputs(lq, lk, hq, hkv)
    cu, cu_k = _cu(lq), _cu(lk)
    varlen = len(lq) > 1
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    s = sink.clone().requires_grad_() if mode != "none" else None
    out, _ = ariadne.attention(*leaves, pattern=pattern, sink=s, sink_mode=mode if s is not None else None,
                               cu_seqlens=cu if varlen else None, cu_seqlens_k=cu_k if varlen and lk else None,
                               backend=HOST)
    (out * dout).sum().backward()

    ref = [x.double().requires_grad_() for x in (q, k, v)]
    rs = sink.double().requires_grad_() if s is not None else None
    mask = _allowed(sum(lq), sum(lk or lq), pattern, cu, cu_k)
    ro = _math(*ref, mask, rs, mode, cu_k if cu_k is not None else cu)
    (ro * dout.double()).sum().backward()

    torch.testing.assert_close(out.double(), ro, atol=2e-5, rtol=1e-4)
    for got, want, what in zip(leaves + ([s] if s is not None else []), ref + ([rs] if rs is not None else []),
                               ("dq", "dk", "dv", "dsink")):
        torch.testing.assert_close(got.grad.double(), want.grad, atol=1e-4, rtol=1e-4, msg=lambda m: f"{what}: {m}")


def test_attention_backward_numpy_equals_torch():
    (q, k, v), sink, dout = _inputs([40], None, 4, 2)
    out, lse = ariadne.attention(q.numpy(), k.numpy(), v.numpy(), pattern=ariadne.Pattern.window(6, 6),
                                 sink=sink.numpy(), lse=True, backend=HOST)
    dq, dk, dv, dsink = ariadne.attention_backward(q.numpy(), k.numpy(), v.numpy(), out, lse, dout.numpy(),
                                                   pattern=ariadne.Pattern.window(6, 6), sink=sink.numpy(),
                                                   backend=HOST)
    tq, tk, tv, ts = ariadne.attention_backward(q, k, v, torch.from_numpy(out), torch.from_numpy(lse), dout,
                                                pattern=ariadne.Pattern.window(6, 6), sink=sink,
                                                sink_mode="denominator", backend=HOST)
    assert dq.shape == q.shape and dk.shape == k.shape and dsink.shape == (4,)
    for a, b in ((dq, tq), (dk, tk), (dv, tv), (dsink, ts)):
        np.testing.assert_array_equal(a, b.numpy())


def test_gradcheck_of_the_op():
    """torch.autograd.gradcheck in float32 (the library has no float64 dtype; the C++ reference is
    checked against finite differences in double): tolerances above f32 rounding of the central
    differences, far below any missing term."""
    (q, k, v), sink, _ = _inputs([12], None, 2, 1, d=8)
    s = sink.clone().requires_grad_()

    def f(q, k, v, s):
        return ariadne.attention(q, k, v, pattern=ariadne.Pattern.window(3, 2), sink=s, backend=HOST)[0]

    inputs = tuple(x.clone().requires_grad_() for x in (q, k, v)) + (s,)
    assert torch.autograd.gradcheck(f, inputs, eps=1e-3, atol=2e-3, rtol=2e-2, fast_mode=False)


@pytest.mark.parametrize("sink_mode", ["denominator", "key0"])
def test_gradcheck_in_double_on_the_reference(sink_mode):
    """torch.autograd.gradcheck in float64 at its default tolerances: float64 tensors run on the
    reference backend, which reads and writes them exactly (the sink too); GQA 2:1, a window."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(11, 2, 8, dtype=torch.float64, generator=g)
    k, v = (torch.randn(11, 1, 8, dtype=torch.float64, generator=g) for _ in range(2))
    s = torch.randn(2, dtype=torch.float64, generator=g)

    def f(q, k, v, s):
        return ariadne.attention(q, k, v, pattern=ariadne.Pattern.window(3, 2), sink=s, sink_mode=sink_mode)[0]

    inputs = tuple(x.clone().requires_grad_() for x in (q, k, v, s))
    assert torch.autograd.gradcheck(f, inputs, fast_mode=False)
    # The fast CPU backend takes no float64: asked for, it says so.
    with pytest.raises(ariadne.Error, match="f64 runs on the reference backend"):
        ariadne.attention(q, k, v, backend="cpu")


def test_compile_traces_forward_and_backward():
    (q, k, v), sink, dout = _inputs([48], None, 4, 2)
    torch._dynamo.reset()
    causal = ariadne.Pattern.causal()  # built outside the compiled code (docs/python.md)

    def step(q, k, v, s):
        out, _ = ariadne.attention(q, k, v, pattern=causal, sink=s, backend=HOST)
        return (out * dout).sum()

    grads = []
    for fn in (step, torch.compile(step, fullgraph=True, backend="aot_eager")):
        leaves = [x.clone().requires_grad_() for x in (q, k, v, sink)]
        fn(*leaves).backward()
        grads.append([x.grad for x in leaves])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_lse_is_not_differentiable_and_gradients_need_it():
    (q, k, v), _, _ = _inputs([20], None, 2, 2)
    q.requires_grad_()
    out, lse = ariadne.attention(q, k, v, lse=True, backend=HOST)
    assert not lse.requires_grad
    # The op called directly without its LSE cannot be differentiated: the error says how.
    out, _ = torch.ops.ariadne.attention(q, k, v, backend=HOST)
    with pytest.raises(Exception, match="return_lse=True"):
        out.sum().backward()


def test_backward_errors_name_the_tensor():
    (q, k, v), _, dout = _inputs([20], None, 2, 2)
    out, lse = ariadne.attention(q, k, v, lse=True, backend=HOST)
    with pytest.raises(ariadne.Error, match="dout"):
        ariadne.attention_backward(q, k, v, out, lse, dout[:10], backend=HOST)
    with pytest.raises(ariadne.Error, match="lse"):
        ariadne.attention_backward(q, k, v, out, lse[:, :5].contiguous(), dout, backend=HOST)


@pytest.mark.skipif(not CUDA, reason="needs a GPU and a CUDA build")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name,lq,lk,pattern,mode,hq,hkv", CASES, ids=[c[0] for c in CASES])
def test_cuda_autograd_matches_float64_math(name, lq, lk, pattern, mode, hq, hkv, dtype):
    (q, k, v), sink, dout = _inputs(lq, lk, hq, hkv, d=64, dtype=dtype, device="cuda")
    cu, cu_k = _cu(lq), _cu(lk)
    varlen = len(lq) > 1
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    s = sink.clone().requires_grad_() if mode != "none" else None
    dev = lambda c: torch.tensor(c, dtype=torch.int32, device="cuda") if c is not None else None  # noqa: E731
    out, _ = ariadne.attention(*leaves, pattern=pattern, sink=s, sink_mode=mode if s is not None else None,
                               cu_seqlens=dev(cu) if varlen else None, cu_seqlens_k=dev(cu_k) if varlen and lk else None)
    (out.float() * dout.float()).sum().backward()

    ref = [x.detach().cpu().double().requires_grad_() for x in (q, k, v)]
    rs = sink.detach().cpu().double().requires_grad_() if s is not None else None
    mask = _allowed(sum(lq), sum(lk or lq), pattern, cu, cu_k)
    ro = _math(*ref, mask, rs, mode, cu_k if cu_k is not None else cu)
    (ro * dout.cpu().double()).sum().backward()
    # bf16 / f16 rounding of the inputs is shared; the kernels round P and dS to 16 bits.
    tol = 3e-2 if dtype == torch.bfloat16 else 1e-2
    for got, want, what in zip(leaves + ([s] if s is not None else []), ref + ([rs] if rs is not None else []),
                               ("dq", "dk", "dv", "dsink")):
        err = (got.grad.double().cpu() - want.grad).norm() / want.grad.norm().clamp_min(1e-6)
        assert err < tol, f"{what}: relative L2 error {err:.3g} (tolerance {tol})"


@pytest.mark.skipif(not CUDA, reason="needs a GPU and a CUDA build")
def test_cuda_deterministic_algorithms_give_identical_gradients():
    (q, k, v), _, dout = _inputs([2000], None, 8, 2, d=64, dtype=torch.bfloat16, device="cuda")
    grads = []
    torch.use_deterministic_algorithms(True)
    try:
        for _ in range(2):
            leaves = [x.clone().requires_grad_() for x in (q, k, v)]
            out, _ = ariadne.attention(*leaves, pattern=ariadne.Pattern.full())
            (out * dout).sum().backward()
            grads.append([x.grad for x in leaves])
    finally:
        torch.use_deterministic_algorithms(False)
    for a, b in zip(*grads):
        assert torch.equal(a, b)
