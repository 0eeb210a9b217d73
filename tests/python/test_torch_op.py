"""The torch.library custom ops (ariadne.ops): opcheck of their schema, fake kernels and dispatch;
torch.compile(fullgraph=True) of a module calling ariadne.attention (eager and inductor backends),
equal to eager bit for bit with no graph break; on CUDA, CUDA graphs (mode="reduce-overhead")
replaying equal to eager. Needs torch (installed by scripts/test-python); the CUDA test skips
without a GPU and a CUDA build."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ariadne  # noqa: E402
import ariadne.ops  # noqa: E402

CUDA = torch.cuda.is_available() and ariadne.cuda_available()


def _cpu_backend():
    q = np.zeros((4, 2, 16), np.float32)
    return "cpu" if ariadne.backend_supports("cpu", q, q, q)[0] else "reference"


BACKEND = _cpu_backend()


def _qkv(n, hq, hkv, d, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(n, hq + 2 * hkv, d, generator=g).to(device, dtype)
    return qkv[:, :hq], qkv[:, hq:hq + hkv], qkv[:, hq + hkv:]


def _mask_args(mask):
    return dict(block_size=mask.block, block_heads=mask.heads,
                block_seq_base=torch.tensor(np.array(mask.seq_block_base)),
                block_row_ptr=torch.tensor(np.array(mask.row_ptr)), block_col_idx=torch.tensor(np.array(mask.col_idx)))


# ---- opcheck: schema, fake (meta) kernel against the real one, autograd registration, AOT dispatch ----

def _opcheck_cases():
    n, hq, hkv, d = 96, 4, 2, 32
    q, k, v = _qkv(n, hq, hkv, d)
    sink = torch.linspace(-2, 2, hq)
    cu = torch.tensor([0, 30, 30, 96], dtype=torch.int32)
    mask = ariadne.BlockMask.random(ariadne.Pattern.causal(), 16, hq, n, n, 0.5, 7)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(1)).to(torch.int32)
    yield "full", (q, k, v), dict(backend=BACKEND)
    yield "causal_lse", (q, k, v), dict(window_left=-1, window_right=0, return_lse=True, backend=BACKEND)
    yield "window_sink_gqa", (q, k, v), dict(window_left=8, window_right=8, sink=sink, sink_mode="denominator",
                                             return_lse=True, backend=BACKEND)
    yield "chunk_key0", (q, k, v), dict(chunk=32, sink=sink, sink_mode="key0", scale=0.3, backend=BACKEND)
    yield "varlen_causal", (q, k, v), dict(window_right=0, cu_seqlens_q=cu, return_lse=True, backend=BACKEND)
    yield "blocks", (q, k, v), dict(window_right=0, return_lse=True, backend=BACKEND, **_mask_args(mask))
    yield "order_window", (q, k, v), dict(window_left=5, window_right=5, order=perm, backend=BACKEND)
    yield "bf16_causal_gqa", tuple(x.to(torch.bfloat16) for x in (q, k, v)), dict(window_right=0, return_lse=True,
                                                                                  backend=BACKEND)
    yield "bf16_out_f32", tuple(x.to(torch.bfloat16) for x in (q, k, v)), dict(window_left=16, window_right=0,
                                                                                out_f32=True, backend=BACKEND)


@pytest.mark.parametrize("name,tensors,kwargs", list(_opcheck_cases()), ids=[c[0] for c in _opcheck_cases()])
def test_opcheck_functional(name, tensors, kwargs):
    torch.library.opcheck(torch.ops.ariadne.attention.default, tensors, kwargs)


def test_opcheck_in_place():
    q, k, v = _qkv(64, 4, 1, 16, seed=2)
    out = torch.empty(64, 4, 16)
    lse = torch.empty(4, 64)
    # By position: torch 2.11's in-place custom ops find mutated arguments by position only.
    args = (q, k, v, out, lse, -1, 0, 0, None, None, 0, 0, None, None, None, None, torch.zeros(4), "denominator", 0.0,
            BACKEND, None, None, None, None, None)
    torch.library.opcheck(torch.ops.ariadne.attention_out.default, args)


def test_fake_kernel_shapes_and_meta_device():
    q, k, v = (x.to("meta") for x in _qkv(50, 6, 3, 8))
    out, lse = torch.ops.ariadne.attention(q, k, v, return_lse=True)
    assert out.shape == (50, 6, 8) and out.dtype == torch.float32 and out.device.type == "meta"
    assert lse.shape == (6, 50) and lse.dtype == torch.float32
    out, lse = torch.ops.ariadne.attention(q.to(torch.float16), k.to(torch.float16), v.to(torch.float16), out_f32=True)
    assert out.dtype == torch.float32 and lse.shape == (0,)


def test_op_matches_the_direct_path_bit_for_bit():
    """The op is the same native call as the numpy path: equal outputs, every pattern argument."""
    q, k, v = _qkv(80, 4, 2, 32, seed=3)
    sink = np.linspace(-1, 1, 4).astype(np.float32)
    mask = ariadne.BlockMask.random(ariadne.Pattern.causal(), 16, 4, 80, 80, 0.6, 3)
    for kw in (dict(pattern=ariadne.Pattern.window(7, 3), sink=sink),
               dict(pattern=ariadne.Pattern.causal(), cu_seqlens=[0, 20, 80]),
               dict(pattern=ariadne.Pattern.causal(), blocks=mask),
               dict(pattern=ariadne.Pattern.chunked(16), sink=sink, sink_mode="key0")):
        out_t, lse_t = ariadne.attention(q, k, v, lse=True, backend=BACKEND, **kw)
        out_n, lse_n = ariadne.attention(*(np.ascontiguousarray(x.numpy()) for x in (q, k, v)), lse=True,
                                         backend=BACKEND, **kw)
        assert np.array_equal(out_t.numpy(), out_n), kw
        assert np.array_equal(lse_t.numpy(), lse_n), kw


def test_torch_calls_route_through_the_op():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    q, k, v = _qkv(32, 2, 2, 16)
    with Seen() as seen:
        ariadne.attention(q, k, v, backend=BACKEND)
        ariadne.attention(q, k, v, out=torch.empty(32, 2, 16), backend=BACKEND)
    assert "ariadne.attention.default" in seen.ops, seen.ops
    assert "ariadne.attention_out.default" in seen.ops, seen.ops


def test_in_place_route_writes_where_out_lies():
    q, k, v = _qkv(40, 4, 2, 16)
    out = torch.full((40, 4, 16), float("nan"))
    res, lse = ariadne.attention(q, k, v, pattern=ariadne.Pattern.causal(), out=out, lse=True, backend=BACKEND)
    assert res is out and torch.isfinite(out).all() and lse.shape == (4, 40)
    ref, ref_lse = ariadne.attention(q, k, v, pattern=ariadne.Pattern.causal(), lse=True, backend=BACKEND)
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)


def test_errors_still_name_the_argument():
    q, k, v = _qkv(20, 4, 2, 16)
    with pytest.raises(ariadne.Error, match="head_dim"):
        ariadne.attention(q, k[..., :8], v, backend=BACKEND)


# ---- torch.compile ----

class Block(torch.nn.Module):
    """Projection, ariadne attention (window + sink + GQA), output projection."""

    def __init__(self, dim=64, hq=4, hkv=2, window=16, causal=False, cu=None, mask=None, lse=False, backend=BACKEND):
        super().__init__()
        self.hq, self.hkv, self.d = hq, hkv, dim // hq
        g = torch.Generator().manual_seed(5)
        self.qkv = torch.nn.Linear(dim, (hq + 2 * hkv) * self.d)
        self.proj = torch.nn.Linear(dim, dim)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
        self.sink = torch.nn.Parameter(torch.linspace(-1, 1, hq), requires_grad=False)
        self.pattern = ariadne.Pattern.window(window, 0 if causal else window)
        self.cu, self.mask, self.lse, self.backend = cu, mask, lse, backend

    def forward(self, x):
        t = self.qkv(x).view(x.shape[0], self.hq + 2 * self.hkv, self.d)
        q, k, v = t[:, :self.hq], t[:, self.hq:self.hq + self.hkv], t[:, self.hq + self.hkv:]
        o, lse = ariadne.attention(q, k, v, pattern=self.pattern, sink=self.sink, cu_seqlens=self.cu,
                                   blocks=self.mask, lse=self.lse, backend=self.backend)
        y = self.proj(o.reshape(x.shape[0], -1))
        return (y, lse) if self.lse else y


def _modules():
    yield "window_sink_gqa", Block(), 128
    yield "causal_varlen_lse", Block(causal=True, cu=torch.tensor([0, 50, 128], dtype=torch.int32), lse=True), 128
    yield "blocks", Block(causal=True, window=-1,
                          mask=ariadne.BlockMask.random(ariadne.Pattern.causal(), 16, 4, 96, 96, 0.5, 11)), 96


def _as_tuple(y):
    return y if isinstance(y, tuple) else (y,)


@pytest.mark.parametrize("name,module,n", list(_modules()), ids=[m[0] for m in _modules()])
def test_compile_fullgraph_eager_backend_bit_for_bit(name, module, n):
    torch._dynamo.reset()
    x = torch.randn(n, 64, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        ref = _as_tuple(module(x))
        compiled = torch.compile(module, fullgraph=True, backend="eager")
        got = _as_tuple(compiled(x))
    for a, b in zip(got, ref):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name,module,n", list(_modules()), ids=[m[0] for m in _modules()])
def test_no_graph_break(name, module, n):
    torch._dynamo.reset()
    x = torch.randn(n, 64)
    with torch.no_grad():
        explain = torch._dynamo.explain(module)(x)
    assert explain.graph_break_count == 0, explain.break_reasons
    assert explain.graph_count == 1
    ops = [str(node.target) for g in explain.graphs for node in g.graph.nodes if node.op == "call_function"]
    assert any("ariadne.attention" in o for o in ops), ops


def test_fullgraph_would_raise_on_a_break():
    """The fullgraph tests can fail: a call dynamo cannot trace does raise under fullgraph=True."""
    torch._dynamo.reset()

    def f(x):
        return torch.from_numpy(np.asarray(ariadne.flops("ariadne", 448).flops)) + x  # an opaque native call

    with pytest.raises(Exception):
        torch.compile(f, fullgraph=True, backend="eager")(torch.ones(1))


def _inductor_works():
    try:
        torch._dynamo.reset()
        torch.compile(lambda x: x * 2 + 1)(torch.ones(4))
        return True
    except Exception:  # noqa: BLE001 - no C++ compiler or a broken toolchain: skip the inductor test
        return False


@pytest.mark.parametrize("name,module,n", list(_modules())[:2], ids=[m[0] for m in list(_modules())[:2]])
def test_compile_inductor_cpu(name, module, n):
    if not _inductor_works():
        pytest.skip("inductor cannot compile on this machine")
    torch._dynamo.reset()
    x = torch.randn(n, 64, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref = _as_tuple(module(x))
        got = _as_tuple(torch.compile(module, fullgraph=True)(x))
    # Inductor may fuse the surrounding linear / view ops differently: docs/numerics.md's f32 rule.
    for a, b in zip(got, ref):
        tol = 2e-5
        rel = float((a.double() - b.double()).norm() / b.double().norm())
        assert rel <= tol, rel
        assert float((a - b).abs().max()) <= 10 * tol * max(float(b.abs().max()), 1e-3)


def test_compiled_out_argument_functionalized():
    """out= under compile: the in-place op is functionalized and the result lands in out."""
    torch._dynamo.reset()
    q, k, v = _qkv(64, 4, 2, 16, seed=8)
    causal = ariadne.Pattern.causal()  # built outside: a native constructor call inside would break the graph

    def f(q, k, v, out):
        ariadne.attention(q * 1.0, k, v, pattern=causal, out=out, backend=BACKEND)
        return out.sum()

    out_e = torch.empty(64, 4, 16)
    s_e = f(q, k, v, out_e)
    out_c = torch.empty(64, 4, 16)
    s_c = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v, out_c)
    assert torch.equal(out_e, out_c) and torch.equal(s_e, s_c)


# ---- CUDA graphs (the GPU machine) ----

@pytest.mark.skipif(not CUDA, reason="needs a CUDA build and a GPU")
def test_cuda_graphs_reduce_overhead_replay_equals_eager():
    torch._dynamo.reset()
    cu = torch.tensor([0, 300, 1024], dtype=torch.int32, device="cuda")  # device metadata: capturable
    module = Block(dim=512, hq=8, hkv=2, window=64, cu=cu, backend="cuda").cuda().to(torch.bfloat16)
    for m in module.modules():
        if isinstance(m, Block):
            m.sink.data = m.sink.data.float()
    xs = [torch.randn(1024, 512, device="cuda", dtype=torch.bfloat16, generator=torch.Generator("cuda").manual_seed(s))
          for s in range(4)]
    from torch._dynamo.utils import counters

    counters.clear()
    with torch.no_grad():
        compiled = torch.compile(module, mode="reduce-overhead", fullgraph=True)
        for x in xs:  # warm-up, recording, then replays
            got = compiled(x).clone()
            ref = module(x)
            assert torch.equal(got, ref)
    torch.cuda.synchronize()
    # The graph did run as a CUDA graph: inductor skips cudagraphs (and says why) for, e.g., CPU tensors.
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])


@pytest.mark.skipif(not CUDA, reason="needs a CUDA build and a GPU")
def test_cuda_host_metadata_runs_without_device_sync():
    """Host cu_seqlens / block masks for CUDA tensors are uploaded on the current stream: the result
    on a side stream equals the one with device metadata."""
    q, k, v = _qkv(512, 8, 2, 64, dtype=torch.bfloat16, device="cuda")
    cu_h = [0, 100, 512]
    mask = ariadne.BlockMask.random(ariadne.Pattern.causal(), 128, 8, 512, 512, 0.5, 2, cu_seqlens_q=cu_h)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out_h, _ = ariadne.attention(q, k, v, pattern=ariadne.Pattern.causal(), cu_seqlens=cu_h, blocks=mask)
    s.synchronize()
    dev = {key: (val.cuda() if isinstance(val, torch.Tensor) else val) for key, val in _mask_args(mask).items()}
    out_d, _ = torch.ops.ariadne.attention(q, k, v, window_right=0, cu_seqlens_q=torch.tensor(cu_h, dtype=torch.int32,
                                           device="cuda"), **dev)
    assert torch.equal(out_h, out_d)
