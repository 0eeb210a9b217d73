"""PyTorch CPU scaled_dot_product_attention on the shapes of bench_attention_cpu (the anchor of
bench/RESULTS.md). Benchmark-only: run from scripts/bench-cpu inside .venv-bench, never by the
build or the tests.

Patterns other than full are given to SDPA as a boolean [N, N] mask shared by the heads (SDPA has
no native window/chunk/block-sparse form); block-sparse keeps a random half of the 64x64 blocks,
the same density as the C++ benchmark (its masks are per head, drawn with another generator).
Prints one JSON object per line: N, d, dtype, pattern, ms (the fastest of --reps timed calls: on a
shared machine the minimum is the least disturbed estimate; scripts/bench-cpu reads ariadne's
repetitions the same way), median_ms.

--backward times the backward alone instead (the shapes of BM_AttentionBackward: d 80, full and
window ±64): one forward with autograd, then out.backward(dout) repeated on the retained graph,
gradients cleared before each call; the lines carry "pass": "backward".
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F


def make_mask(n, pattern, gen):
    if pattern == "full":
        return None
    i = torch.arange(n).unsqueeze(1)
    j = torch.arange(n).unsqueeze(0)
    if pattern == "window64":
        return (j - i).abs() <= 64
    if pattern == "chunk64":
        return (i // 64) == (j // 64)
    if pattern == "blocks50":
        nb = (n + 63) // 64
        keep = torch.zeros(nb, nb, dtype=torch.bool)
        for m in range(nb):
            keep[m, torch.randperm(nb, generator=gen)[: nb // 2]] = True
        return keep.repeat_interleave(64, 0).repeat_interleave(64, 1)[:n, :n]
    raise ValueError(pattern)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--sizes", default="1024,4096")
    ap.add_argument("--backward", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(7)
    heads = 16
    if args.backward:
        backward(args, gen, heads)
        return
    for n in [int(s) for s in args.sizes.split(",")]:
        for d in (80, 128):
            for dtype in (torch.float32, torch.bfloat16):
                for pattern in ("full", "window64", "chunk64", "blocks50"):
                    q, k, v = (torch.rand(1, heads, n, d, generator=gen) * 2 - 1 for _ in range(3))
                    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
                    mask = make_mask(n, pattern, gen)
                    with torch.no_grad():
                        F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # warm-up
                        times = []
                        for _ in range(args.reps):
                            t0 = time.perf_counter()
                            F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                            times.append((time.perf_counter() - t0) * 1e3)
                    print(json.dumps({"N": n, "d": d, "dtype": "bf16" if dtype == torch.bfloat16 else "f32",
                                      "pattern": pattern, "ms": min(times), "median_ms": statistics.median(times),
                                      "torch": torch.__version__,
                                      "capability": torch.backends.cpu.get_cpu_capability()}), flush=True)


def backward(args, gen, heads):
    for n in [int(s) for s in args.sizes.split(",")]:
        for dtype in (torch.float32, torch.bfloat16):
            for pattern in ("full", "window64"):
                q, k, v, dout = (torch.rand(1, heads, n, 80, generator=gen) * 2 - 1 for _ in range(4))
                q, k, v = (x.to(dtype).requires_grad_() for x in (q, k, v))
                dout = dout.to(dtype)
                mask = make_mask(n, pattern, gen)
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                times = []
                for rep in range(args.reps + 1):  # the first call warms up
                    for x in (q, k, v):
                        x.grad = None
                    t0 = time.perf_counter()
                    out.backward(dout, retain_graph=True)
                    if rep:
                        times.append((time.perf_counter() - t0) * 1e3)
                print(json.dumps({"N": n, "d": 80, "dtype": "bf16" if dtype == torch.bfloat16 else "f32",
                                  "pattern": pattern, "pass": "backward", "grad_fn": type(out.grad_fn).__name__,
                                  "ms": min(times), "median_ms": statistics.median(times),
                                  "torch": torch.__version__,
                                  "capability": torch.backends.cpu.get_cpu_capability()}), flush=True)


if __name__ == "__main__":
    main()
