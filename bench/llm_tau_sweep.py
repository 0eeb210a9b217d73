"""Recall-vs-density curves of RR and XAttention on SmolLM2's real heads (docs/llm.md, "Recall at
equal density on real heads (τ sweep)"). Standard library only.

  python3 bench/llm_tau_sweep.py run --ariadne build/ariadne --tokens 1024 --prompts 1:0.1,2:0.3,3:0.5,4:0.7,5:0.9 \
      --out FILE.json
      one `ariadne llm-probe --accuracy 0 --probe-tau-sweep ...` per prompt (seed:depth), passkey:
      the dense run's real q/k of all 30 layers, each probe (RR paper / released and XAttention at
      S 8 and 16, published protections and sink + diagonal) scored once and its oracle once, then
      selected anew at every τ of the list. Writes {"runs": [{"command": [...], "output": <the
      CLI's JSON, the summary's per-layer rows dropped>}, ...]}; appends to FILE when it exists.
  python3 bench/llm_tau_sweep.py table FILE.json [FILE.json ...]
      pools every prompt of a length (mean over prompts of the CLI's pooled curves, i.e. the mean
      over layers and prompts, as the probes pool) and prints the markdown tables: each curve at
      some τ, RR at XAttention's density (linear interpolation on RR's curve, by density), and the
      density each needs for a mass recall (by recall). The oracle's density at each τ is shown with
      the curves; it keeps at least τ of every row's mass, so it is no point of a pooled-recall curve.
"""
import json
import os
import subprocess
import sys

from tau_sweep import at, fmt, md_header, sweep_cli  # the synthetic sweep's interpolation rule (flat stretches: the first point)

TAUS = [0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.875, 0.9, 0.925, 0.94, 0.95, 0.96, 0.97, 0.975, 0.98,
        0.985, 0.99, 0.995, 0.999, 1.0]
# (name, offset in the case label, protect suffix in the case label)
CONFIGS = [("rr paper", "rr paper", ""), ("rr released", "rr released", ""),
           ("rr paper, sink+diag", "rr paper", " protect=sink+diagonal"),
           ("rr released, sink+diag", "rr released", " protect=sink+diagonal"),
           ("xattn", "xattn", "")]


def run(args):
    sweep = ",".join(f"{t:g}" for t in TAUS)
    runs = json.load(open(args.out))["runs"] if os.path.exists(args.out) else []
    for prompt in args.prompts.split(","):
        seed, depth = prompt.split(":")
        cmd = [args.ariadne, "llm-probe", "--task", "passkey", "--tokens", str(args.tokens), "--seed", seed,
               "--seeds", "1", "--depth", depth, "--method", "rr,xattn", "--offset", "paper,released",
               "--tau", "0.95", "--stride", args.strides, "--block", "128",
               "--probe-protect", "published,sink+diagonal", "--probe-tau-sweep", sweep,
               "--accuracy", "0", "--new", "7", "--threads", str(args.threads), "--json"]
        if args.gguf:
            cmd[2:2] = ["--gguf", args.gguf]
        print(" ".join(cmd), file=sys.stderr, flush=True)
        out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        for s in out["summary"]:
            for part in ("probe", "own"):
                if part in s:
                    s[part].pop("per_layer", None)
        runs.append({"command": cmd[1:], "output": out})
        with open(args.out, "w") as f:  # one run per line
            f.write('{"runs": [\n' + ",\n".join(json.dumps(x, separators=(",", ":")) for x in runs) + "\n]}\n")


def pooled(runs):
    """{(tokens bucket, S, config name): [(density, recall, f1, tau, oracle_density), ...]}, each
    figure the mean over the prompts of that length; also the prompts per length."""
    acc, prompts = {}, {}
    for r in runs:
        o = r["output"]
        for s in o["summary"]:
            if "probe" not in s:
                continue
            task, length, label = s["case"].split("/", 2)
            for name, prefix, suffix in CONFIGS:
                for st in (8, 16):
                    if label == f"{prefix} tau=0.95 S={st}{suffix}":
                        acc.setdefault((int(length), st, name), []).append(s["probe"])
        length = int(o["summary"][0]["case"].split("/")[1])
        prompts.setdefault(length, []).append(o["runs"][0])
    curves = {}
    for key, probes in acc.items():
        pts = []
        for i, p0 in enumerate(probes[0]["tau_sweep"]):
            assert all(abs(p["tau_sweep"][i]["tau"] - p0["tau"]) < 1e-12 for p in probes)
            mean = lambda k: sum(p["tau_sweep"][i][k] for p in probes) / len(probes)
            pts.append((mean("density"), mean("mass_recall"), mean("block_f1"), p0["tau"], mean("oracle_density"),
                        mean("block_precision"), mean("block_recall")))
        curves[key] = (pts, sum(p["instances"] for p in probes))
    return curves, prompts


def per_prompt(runs):
    """{(tokens, S, τ, RR config name): [RR's mass recall − XAttention's at XAttention's density at τ,
    one per prompt, on that prompt's own curves]}."""
    out = {}
    for r in runs:
        cases = {}
        for s in r["output"]["summary"]:
            if "probe" in s:
                _, length, label = s["case"].split("/", 2)
                cases[label] = s["probe"]["tau_sweep"]
        for st in (8, 16):
            x = cases.get(f"xattn tau=0.95 S={st}")
            if not x:
                continue
            for t in (0.9, 0.95):
                px = next(p for p in x if abs(p["tau"] - t) < 1e-12)
                for name, prefix, suffix in CONFIGS:
                    c = cases.get(f"{prefix} tau=0.95 S={st}{suffix}")
                    if name == "xattn" or not c:
                        continue
                    v = at([(p["density"], p["mass_recall"]) for p in c], px["density"], 0, 1)
                    out.setdefault((int(length), st, t, name), []).append(
                        None if v is None else v - px["mass_recall"])
    return out


def table(args):
    runs = []
    for f in args.files:
        runs += json.load(open(f))["runs"]
    curves, prompts = pooled(runs)
    lengths = sorted(prompts)
    strides = sorted({k[1] for k in curves})
    print("### Prompts\n")
    for n in lengths:
        desc = ", ".join(f"seed {r['seed']} depth {r['depth']} ({r['tokens']} tok, dense "
                         f"{'right' if r['correct'] else 'wrong'})" for r in prompts[n])
        print(f"- {n}: {desc}")
    print()

    shown = [0.8, 0.85, 0.9, 0.925, 0.95, 0.97, 0.98, 0.99]
    print("### Curves (density / mass recall / block F1 at each τ; mean over layers and prompts)\n")
    for n in lengths:
        for s in strides:
            names = [c[0] for c in CONFIGS if (n, s, c[0]) in curves]
            if not names:
                continue
            print(f"{n} tokens, S {s}:\n")
            print("| τ | " + " | ".join(names) + " | oracle density |")
            print("| --- |" + " --- |" * (len(names) + 1))
            for t in shown:
                cells, od = [], None
                for name in names:
                    p = next((p for p in curves[(n, s, name)][0] if abs(p[3] - t) < 1e-12), None)
                    cells.append("—" if p is None else f"{p[0]:.3f} / {p[1]:.4f} / {p[2]:.3f}")
                    od = p[4] if p else od
                print(f"| {t:g} | " + " | ".join(cells) + f" | {fmt(od, 3)} |")
            print()

    rr_names = [c[0] for c in CONFIGS if c[0] != "xattn"]
    print("### RR at XAttention's density (XAttention's point at τ; RR's curve interpolated by density): "
          "mass recall / block F1\n")
    md_header(["tokens", "S", "τ", "XAttention density", "XAttention"] + rr_names)
    for n in lengths:
        for s in strides:
            x = curves.get((n, s, "xattn"))
            if not x:
                continue
            for t in (0.9, 0.95):
                px = next(p for p in x[0] if abs(p[3] - t) < 1e-12)
                cells = []
                for name in rr_names:
                    c = curves.get((n, s, name))
                    if not c:
                        cells.append("—")
                        continue
                    r, f = at(c[0], px[0], 0, 1), at(c[0], px[0], 0, 2)
                    cells.append(f"{fmt(r)} / {fmt(f, 3)}" + (f" ({r - px[1]:+.4f} / {f - px[2]:+.3f})" if r is not None else ""))
                print(f"| {n} | {s} | {t:g} | {px[0]:.3f} | {px[1]:.4f} / {px[2]:.3f} | " + " | ".join(cells) + " |")
    print()

    print("### Per prompt: RR's mass recall minus XAttention's at XAttention's density (each prompt's own "
          "curves; prompts where RR is at or above, and the range)\n")
    md_header(["tokens", "S", "τ"] + rr_names)
    per = per_prompt(runs)
    for n in lengths:
        for s in strides:
            for t in (0.9, 0.95):
                cells = []
                for name in rr_names:
                    d = [v for v in per.get((n, s, t, name), []) if v is not None]
                    cells.append(f"{sum(v >= 0 for v in d)}/{len(d)}, {min(d):+.4f} … {max(d):+.4f}" if d else "—")
                print(f"| {n} | {s} | {t:g} | " + " | ".join(cells) + " |")
    print()

    names = [c[0] for c in CONFIGS]
    print("### Density needed for a mass recall (each curve interpolated by recall; in brackets RR's over "
          "XAttention's)\n")
    md_header(["tokens", "S", "recall", "xattn"] + rr_names)
    for n in lengths:
        for s in strides:
            if (n, s, "xattn") not in curves:
                continue
            for target in (0.95, 0.97, 0.99):
                vals = {name: (at(curves[(n, s, name)][0], target, 1, 0) if (n, s, name) in curves else None)
                        for name in names}
                x = vals["xattn"]
                cell = lambda v: fmt(v, 3) + (f" ({v / x:.3f})" if v and x else "")
                print(f"| {n} | {s} | {target:g} | {fmt(x, 3)} | " + " | ".join(cell(vals[k]) for k in rr_names) + " |")
    print()


def main():
    def run_args(r):
        r.add_argument("--gguf", default="")
        r.add_argument("--prompts", default="1:0.1,2:0.3,3:0.5,4:0.7,5:0.9", help="seed:depth,...")
        r.add_argument("--threads", type=int, default=2)
    sweep_cli(__doc__, run_args, run, table)


if __name__ == "__main__":
    main()
