"""ariadne.attention on torch tensors against torch's scaled_dot_product_attention: DLPack without
copies (data pointers), strided views, bf16, GQA, sinks, streams. Needs torch (skipped without it;
scripts/test-python installs CPU-usable torch for CI). Runs on CUDA when the build and the machine have it (then CUDA-only tests run too),
else on the CPU with the best CPU backend the build supports."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ariadne  # noqa: E402

CUDA = torch.cuda.is_available() and ariadne.cuda_available()
DEVICES = ["cpu"] + (["cuda"] if CUDA else [])


def _backend(device):
    if device == "cuda":
        return "cuda"
    q = np.zeros((4, 2, 16), np.float32)
    return "cpu" if ariadne.backend_supports("cpu", q, q, q)[0] else "reference"


def sdpa(q, k, v, mask=None, sink=None):
    """torch reference in float64: [tokens, heads, dim] in and out; mask [tq, tk] bool."""
    q, k, v = (x.double().transpose(0, 1) for x in (q, k, v))
    rep = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
    s = q @ k.transpose(1, 2) / q.shape[-1] ** 0.5
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    if sink is not None:
        s = torch.cat([s, sink.double().view(-1, 1, 1).expand(-1, s.shape[1], 1)], dim=2)
    a = torch.softmax(s, dim=-1)[..., : k.shape[1]]
    return (a @ v).transpose(0, 1)


def window_mask(n, left, right, device):
    i = torch.arange(n, device=device)
    d = i[None, :] - i[:, None]
    return (d >= -left) & (d <= right)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_window_sink_gqa_matches_sdpa(device, dtype):
    if device == "cuda" and dtype == torch.float32:
        pytest.skip("the CUDA kernels take bf16 and f16 inputs")
    g = torch.Generator(device="cpu").manual_seed(3)
    n, hq, hkv, d = 300, 8, 2, 64
    qkv = torch.randn(n, hq + 2 * hkv, d, generator=g).to(device, dtype)
    q, k, v = qkv[:, :hq], qkv[:, hq:hq + hkv], qkv[:, hq + hkv:]  # strided views of one projection
    sink = torch.linspace(-3, 3, hq, device=device)
    out = torch.full((n, hq, d), float("nan"), device=device, dtype=dtype)
    res, lse = ariadne.attention(q, k, v, pattern=ariadne.Pattern.window(64, 64), sink=sink, out=out, lse=True,
                                 backend=_backend(device))
    assert res is out and out.data_ptr() == res.data_ptr()
    ref = sdpa(q, k, v, window_mask(n, 64, 64, device), sink)
    err = float((out.double() - ref).norm() / ref.norm())
    print(f"window+sink+gqa {device} {dtype}: rel_l2 {err:.3g}, max |diff| {float((out.double() - ref).abs().max()):.3g}")
    assert err < (2e-5 if dtype == torch.float32 else 1e-2), err
    assert lse.shape == (hq, n) and lse.dtype == torch.float32 and lse.device.type == device


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_with_device_cu_seqlens(device):
    lengths = [17, 0, 64, 5]
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32, device=device)
    n = int(cu[-1])
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    q = torch.randn(n, 4, 64, device=device, dtype=dtype)
    out, _ = ariadne.attention(q, q, q, pattern=ariadne.Pattern.causal(), cu_seqlens=cu, backend=_backend(device))
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        if b > a:
            ref = sdpa(q[a:b], q[a:b], q[a:b], window_mask(b - a, b - a, 0, device))
            assert float((out[a:b].double() - ref).norm() / ref.norm()) < (2e-5 if device == "cpu" else 1e-2)


def test_cpu_cuda_mix_is_an_error():
    if not CUDA:
        pytest.skip("needs a CUDA build and a GPU")
    q = torch.randn(10, 2, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="k: "):
        ariadne.attention(q, q.cpu(), q, backend="cuda")


def test_explicit_stream():
    if not CUDA:
        pytest.skip("needs a CUDA build and a GPU")
    s = torch.cuda.Stream()
    q = torch.randn(1000, 8, 64, device="cuda", dtype=torch.bfloat16)
    with torch.cuda.stream(s):
        out, _ = ariadne.attention(q, q, q, pattern=ariadne.Pattern.causal())  # the current stream: s
    out2, _ = ariadne.attention(q, q, q, pattern=ariadne.Pattern.causal(), stream=s.cuda_stream)
    s.synchronize()
    assert torch.equal(out, out2)
    ref = sdpa(q, q, q, window_mask(1000, 1000, 0, "cuda"))
    err = float((out.double() - ref).norm() / ref.norm())
    print(f"explicit stream, causal bf16 n=1000: rel_l2 {err:.3g}")
    assert err < 1e-2
