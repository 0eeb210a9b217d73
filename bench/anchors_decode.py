#!/usr/bin/env python3
"""The decode anchors of bench/bench_decode_cuda.cpp: PyTorch SDPA with one query per sequence
(q [B, 32, 1, 128], k and v [B, 8, N, 128], bf16, GQA through enable_gqa), on its cuDNN and flash
backends, at the same contexts and batches, timed as the other anchors are (anchors.Timer: a
sleep kernel ahead of each call, events around it, inputs rotated so that the sets together hold
at least 256 MiB and a small context is not served from the L2). "ms" is the median; "tbps" the
KV bytes read per call over it. A backend that refuses the shape is recorded as unsupported.

    python3 bench/anchors_decode.py --out anchors_decode.json [--contexts 8192,32768,131072] [--batches 1,8]
"""

import argparse
import json
import os
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import anchors as A  # noqa: E402

BACKENDS = {"sdpa_cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa_flash": SDPBackend.FLASH_ATTENTION}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--contexts", default="8192,32768,131072")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    args = ap.parse_args(argv)
    dev = torch.device("cuda")
    timer = A.Timer(dev, 0.25)
    hq, hkv, d = args.heads, args.kv_heads, args.head_dim
    gen = torch.Generator(device=dev).manual_seed(1)
    rows = []
    for n in (int(x) for x in args.contexts.split(",")):
        for b in (int(x) for x in args.batches.split(",")):
            kv_bytes = 2 * b * hkv * n * d * 2
            count = max(1, min(8, (256 << 20) // kv_bytes + 1))
            sets = [(torch.randn(b, hq, 1, d, device=dev, dtype=torch.bfloat16, generator=gen),
                     torch.randn(b, hkv, n, d, device=dev, dtype=torch.bfloat16, generator=gen),
                     torch.randn(b, hkv, n, d, device=dev, dtype=torch.bfloat16, generator=gen)) for _ in range(count)]
            for name, backend in BACKENDS.items():
                def call(q, k, v, backend=backend):
                    with sdpa_kernel(backend):
                        return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                row = dict(impl=name, context=n, batch=b, heads=hq, kv_heads=hkv, head_dim=d, kv_bytes=kv_bytes,
                           sets=count)
                try:
                    ref = call(*sets[0]).float()
                    # The output against the float reference on the first set (a wrong anchor is no anchor).
                    q, k, v = (t.float() for t in sets[0])
                    exp = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                    row["rel_err"] = float((ref - exp).norm() / exp.norm())
                    host = max(timer.host_ms(call, sets[i % count]) for i in range(3))
                    ms = sorted(timer.times(call, sets, 30, host))[15]
                    row.update(ms=ms, tbps=kv_bytes / (ms * 1e9))
                except RuntimeError as e:  # the backend refuses the shape
                    row.update(unsupported=str(e).split("\n")[0][:200])
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
            del sets
            torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(dict(env=A.env_info(dev), rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
