"""What the vendor BLAS makes of fp32 full attention's two products alone, beside PyTorch's CPU SDPA,
on the shapes of bench_attention_cpu (16 heads, N 4096): the bound behind bench/RESULTS.md's
"1.2× PyTorch SDPA is out of reach on this core" (docs/cpu-backend.md, "Why hand-written SIMD and
not a BLAS").

Per head and 512-row query block (the size a fused kernel keeps in cache), S = Q·Kᵀ then S·V
through torch.mm (MKL / oneDNN): every FLOP of attention and none of its softmax (no max, no
exponentials, no rescaling). If these products alone take longer than SDPA's time / 1.2, no
implementation whose products are not faster than the vendor's GEMM can be 1.2× SDPA. A large
square sgemm gives the BLAS's own best rate for comparison with the FMA peak that
bench_attention_cpu measures (BM_FmaPeak).

Benchmark-only (run inside .venv-bench like bench/torch_sdpa.py). Hold PyTorch to an instruction
set as scripts/bench-cpu does (ATEN_CPU_CAPABILITY, MKL_ENABLE_INSTRUCTIONS, ONEDNN_MAX_CPU_ISA).
Prints one JSON object per line; times are the fastest of --reps calls.

    taskset -c 1 python bench/gemm_bound.py --threads 1
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F


def fastest_ms(f, reps):
    f()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dims", default="80,128")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    n, heads, rows = args.n, args.heads, 512
    for d in (int(x) for x in args.dims.split(",")):
        q, k, v = (torch.rand(1, heads, n, d, generator=gen) - 0.5 for _ in range(3))
        s, o = torch.empty(rows, n), torch.empty(rows, d)

        def products():
            for h in range(heads):
                for r in range(0, n, rows):
                    m = min(rows, n - r)
                    torch.mm(q[0, h, r:r + m], k[0, h].t(), out=s[:m])
                    torch.mm(s[:m], v[0, h], out=o[:m])

        sdpa = fastest_ms(lambda: F.scaled_dot_product_attention(q, k, v), args.reps)
        prods = fastest_ms(products, args.reps)
        gflop = 4.0 * n * n * d * heads / 1e9
        print(json.dumps({"N": n, "d": d, "heads": heads, "threads": args.threads, "sdpa_ms": round(sdpa, 2),
                          "products_ms": round(prods, 2), "target_ms": round(sdpa / 1.2, 2),
                          "products_gflops": round(gflop / prods * 1e3, 1),
                          "capability": torch.backends.cpu.get_cpu_capability()}))
    side = 2048
    a, b, c = (torch.rand(side, side, generator=gen) - 0.5 for _ in range(3))
    t = fastest_ms(lambda: torch.mm(a, b, out=c), args.reps)
    print(json.dumps({"sgemm": side, "threads": args.threads, "gflops": round(2.0 * side ** 3 / t / 1e6, 1)}))


if __name__ == "__main__":
    main()
