#!/usr/bin/env python3
"""The decode anchors of bench/bench_decode_cuda.cpp: one query per sequence (q [B, 32, 1, 128],
k and v [B, 8, N, 128], bf16, GQA), on PyTorch SDPA's cuDNN and flash backends and on FlexAttention
(compiled; with one query row it takes its decoding kernel), at the same contexts and batches, timed
as the other anchors are (anchors.Timer: a sleep kernel ahead of each call, events around it, inputs
rotated so that the sets together hold at least 256 MiB and a small context is not served from the
L2). "ms" is the median; "tbps" the KV bytes read per call over it. Each anchor's output is checked
against the float reference on the first set ("rel_err"); a backend that refuses the shape is
recorded as unsupported.

    python3 bench/anchors_decode.py --out anchors_decode.json [--contexts 8192,32768,131072] [--batches 1,8]
    python3 bench/anchors_decode.py --out x.json --smoke     # CPU, tiny shapes: the code paths only
"""

import argparse
import json
import os
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import flex_attention

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import anchors as A  # noqa: E402

BACKENDS = {"sdpa_cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa_flash": SDPBackend.FLASH_ATTENTION}
IMPLS = tuple(BACKENDS) + ("flex",)


def _flex_decode(q, k, v):
    # No block mask: every cached key is visible to the one query.
    return flex_attention(q, k, v, enable_gqa=True)


def make_call(name, smoke):
    if name == "flex":
        # Compiled once per shape (dynamic=False): the timed calls run the decoding kernel.
        return A.compiled(_flex_decode)
    backend = BACKENDS[name]

    def call(q, k, v):
        if smoke:  # no cuDNN or flash kernels on the CPU: the math backend stands in
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    return call


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--contexts", default="8192,32768,131072")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--impls", default=",".join(IMPLS), help="subset of " + ",".join(IMPLS))
    ap.add_argument("--smoke", action="store_true", help="CPU, float32, the given (tiny) shapes, 3 timed calls")
    args = ap.parse_args(argv)
    impls = args.impls.split(",")
    for i in impls:
        if i not in IMPLS:
            ap.error(f"--impls: unknown anchor {i!r}, expected a subset of {','.join(IMPLS)}")
    dev = torch.device("cpu" if args.smoke else "cuda")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    timer = A.Timer(dev, 0.25, smoke=args.smoke)
    hq, hkv, d = args.heads, args.kv_heads, args.head_dim
    gen = torch.Generator(device=dev).manual_seed(1)
    reps = 3 if args.smoke else 30
    rows = []
    for n in (int(x) for x in args.contexts.split(",")):
        for b in (int(x) for x in args.batches.split(",")):
            kv_bytes = 2 * b * hkv * n * d * dtype.itemsize
            count = max(1, min(8, (256 << 20) // kv_bytes + 1))
            if args.smoke:
                count = 2
            sets = [(torch.randn(b, hq, 1, d, device=dev, dtype=dtype, generator=gen),
                     torch.randn(b, hkv, n, d, device=dev, dtype=dtype, generator=gen),
                     torch.randn(b, hkv, n, d, device=dev, dtype=dtype, generator=gen)) for _ in range(count)]
            for name in impls:
                call = make_call(name, args.smoke)
                row = dict(impl=name, context=n, batch=b, heads=hq, kv_heads=hkv, head_dim=d, kv_bytes=kv_bytes,
                           sets=count)
                try:
                    got = call(*sets[0]).float()
                    # The output against the float reference on the first set (a wrong anchor is no anchor).
                    q, k, v = (t.double() for t in sets[0])
                    exp = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                    row["rel_err"] = float((got.double() - exp).norm() / exp.norm())
                    host = max(timer.host_ms(call, sets[i % count]) for i in range(3))
                    ms = sorted(timer.times(call, sets, reps, host))[reps // 2]
                    row.update(ms=ms, tbps=kv_bytes / (ms * 1e9))
                except RuntimeError as e:  # the backend refuses the shape
                    row.update(unsupported=str(e).split("\n")[0][:200])
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
            del sets
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(dict(env=A.env_info(dev), rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
