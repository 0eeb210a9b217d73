"""Joins bench_attention_cpu's Google Benchmark JSON with torch_sdpa.py's lines and prints the
tables of bench/RESULTS.md. Usage: compare_cpu.py ARIADNE_JSON[,MORE] TORCH_JSONL[,MORE] (several
runs are merged, keeping the fastest repetition of each shape on both sides) [FMA_PEAK_GFLOPS]: absolute times, GFLOP/s (mask-aware), share of the measured FMA peak,
the ratio to PyTorch SDPA, and the three target ratios of issue 3; then the backward's table
(BM_AttentionBackward against torch_sdpa.py --backward) when the runs have it. Standard library
only."""
import json
import re
import sys

PATTERNS = ["full", "window64", "chunk64", "blocks50"]


def load_ariadne(paths):
    docs = [json.load(open(p)) for p in paths.split(",")]
    rows, peak = {}, {}
    # Every repetition of every run is listed; keep the fastest of each benchmark (the least
    # disturbed by other load on a shared machine).
    for b in (b for doc in docs for b in doc["benchmarks"]):
        if b.get("run_type") == "aggregate" or b.get("error_occurred"):
            continue  # a skipped benchmark (no AVX-512 BF16 under ISA=avx2) has no figures
        name = b["name"]
        if name.startswith(("BM_FmaPeak", "BM_Bf16DotPeak", "BM_AmxPeak")):
            key = name.split("/")[0][3:]
            peak[key] = max(peak.get(key, 0), b["GFLOPs"])
            continue
        m = re.match(r"BM_Attention(Backward)?/N:(\d+)/d:(\d+)/bf16:(\d)/pattern:(\d)", name)
        if not m:
            continue
        n, d, bf, pat = (int(x) for x in m.groups()[1:])
        key = (n, d, "bf16" if bf else "f32", PATTERNS[pat], "backward" if m.group(1) else "forward")
        if key in rows and rows[key]["ms"] <= b["real_time"]:
            continue
        rows[key] = {"ms": b["real_time"], "gflops": b["GFLOPs"], "fma_peak": b["fma_peak_GFLOPs"]}
    ctx = dict(docs[0].get("context", {}))
    ctx["fma_peak_GFLOPs"] = max(float(d.get("context", {}).get("fma_peak_GFLOPs", 0)) for d in docs)
    return ctx, rows, peak


def main():
    ctx, ours, peak = load_ariadne(sys.argv[1])
    torch = {}
    version = "?"
    for path in sys.argv[2].split(","):
        for line in open(path):
            r = json.loads(line)
            key = (r["N"], r["d"], r["dtype"], r["pattern"], r.get("pass", "forward"))
            torch[key] = min(torch.get(key, r["ms"]), r["ms"])
            version = r["torch"]
            if "capability" in r:
                version += f" ({r['capability']})"
    print(f"machine: {ctx.get('host_name', '?')}, {ctx.get('num_cpus', '?')} CPUs at {ctx.get('mhz_per_cpu', '?')} MHz; "
          f"ariadne kernels {ctx.get('kernels', '?')}, threads {ctx.get('threads', '?')}; torch {version}")
    # The start-up measurement (best of 40 short runs) and the best BM_FmaPeak repetition.
    fma = max(peak.get("FmaPeak", 0), float(ctx.get("fma_peak_GFLOPs", 0)))
    if len(sys.argv) > 3:  # an explicit peak (GFLOP/s), e.g. from an undisturbed BM_FmaPeak CPU time
        fma = float(sys.argv[3])
    # On the AMX table the bf16 products run on the tile unit: its peak is bf16's own.
    amx = ctx.get("kernels") == "amx" and peak.get("AmxPeak", 0) > 0
    dot = peak.get("Bf16DotPeak", 0)  # absent where the table has no bf16 dot product
    print(f"measured peak (best repetition): fp32 FMA {fma:.1f} GFLOP/s"
          + (f", bf16 dot {dot:.1f} GFLOP/s" if dot else "")
          + (f", AMX bf16 {peak['AmxPeak']:.1f} GFLOP/s" if amx else "") + "\n")
    # Tables without bf16 products (avx512, avx2, generic) run bf16 inputs on the fp32 ones: their
    # peak is the FMA's.
    bf16_peak = peak.get("AmxPeak", 0) if amx else peak.get("Bf16DotPeak", 0)
    for key, o in ours.items():
        o["peak_frac"] = o["gflops"] / fma if fma else 0
        o["own_peak_frac"] = o["gflops"] / (bf16_peak if key[2] == "bf16" and bf16_peak else fma) if fma else 0
    forward = {k: o for k, o in ours.items() if k[4] == "forward"}
    backward = {k: o for k, o in ours.items() if k[4] == "backward"}
    if forward:
        print_forward(forward, torch, fma)
    if backward:
        print("\nBackward alone (GFLOP/s at 2.5x the forward's mask-aware count; torch: SDPA's backward "
              "through autograd, dq/dk/dv in the input dtype on both sides):\n")
        print("| N | d | dtype | pattern | ariadne ms | GFLOP/s | % fp32 FMA peak | torch SDPA backward ms | speed-up vs torch |")
        print("|---|---|---|---|---|---|---|---|---|")
        for key in sorted(backward, key=lambda k: (k[0], k[1], k[2] != "f32", PATTERNS.index(k[3]))):
            o = backward[key]
            t = torch.get(key)
            ratio = f"{t / o['ms']:.2f}x" if t else "-"
            tms = f"{t:.1f}" if t else "-"
            print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {o['ms']:.1f} | {o['gflops']:.1f} | "
                  f"{100 * o['peak_frac']:.0f}% | {tms} | {ratio} |")


def print_forward(ours, torch, fma):
    print("| N | d | dtype | pattern | ariadne ms | GFLOP/s | % fp32 FMA peak | % own peak (bf16: dot or AMX) | torch SDPA ms | speed-up vs torch |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for key in sorted(ours, key=lambda k: (k[0], k[1], k[2] != "f32", PATTERNS.index(k[3]))):
        o = ours[key]
        t = torch.get(key)
        ratio = f"{t / o['ms']:.2f}x" if t else "-"
        tms = f"{t:.1f}" if t else "-"
        print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {o['ms']:.2f} | {o['gflops']:.1f} | "
              f"{100 * o['peak_frac']:.0f}% | {100 * o['own_peak_frac']:.0f}% | {tms} | {ratio} |")
    print("\nTargets (N 4096):")
    for d in (80, 128):
        for dt in ("f32", "bf16"):
            full = ours.get((4096, d, dt, "full", "forward"))
            win = ours.get((4096, d, dt, "window64", "forward"))
            t = torch.get((4096, d, dt, "full", "forward"))
            if not full:
                continue
            line = f"- d {d} {dt}: full {full['ms']:.1f} ms = {100 * full['peak_frac']:.0f}% of FMA peak"
            if t:
                line += f", {t / full['ms']:.2f}x torch SDPA"
            if win:
                line += f"; window±64 {full['ms'] / win['ms']:.1f}x faster than full"
            print(line)
        f32, bf = ours.get((4096, d, "f32", "full", "forward")), ours.get((4096, d, "bf16", "full", "forward"))
        if f32 and bf:
            print(f"- d {d}: bf16 full is {f32['ms'] / bf['ms']:.2f}x fp32 full")


if __name__ == "__main__":
    main()
