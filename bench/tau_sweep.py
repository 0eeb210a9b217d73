"""Recall-vs-density curves of RR and XAttention on the synthetic mix (docs/rrattention.md, "Recall
at equal density (τ sweep)"). Standard library only.

  python3 bench/tau_sweep.py run --ariadne build/ariadne --tokens 8192 --out FILE.json
      runs `ariadne prefill --estimate-only --tau-sweep ...` for S 8 and 16 and the methods
      rr (paper offset), rr --offset released, xattn, plus the oracle once (8 query / 2 KV heads;
      --heads, --kv-heads, --strides and --methods change that), and writes
      {"runs": [{"name": ..., "command": [...], "output": <the CLI's JSON>}, ...]}
  python3 bench/tau_sweep.py table FILE.json [FILE.json ...]
      prints the markdown tables: each curve's points, RR against XAttention at the other's density
      (linear interpolation on the curve, by density), and the density each needs for a mass recall.
"""
import argparse
import json
import subprocess
import sys

TAUS = [0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.875, 0.9, 0.925, 0.94, 0.95, 0.96, 0.97, 0.975, 0.98,
        0.985, 0.99, 0.995, 0.999, 1.0]
COMMON = ["--dim", "128", "--block", "128",
          "--synthetic", "sink:2,local:2,stripe:2,needle:2", "--theta", "500000", "--tau", "0.95",
          "--estimate-only", "--json"]
METHODS = [("rr", ["--method", "rr"]), ("rr-released", ["--method", "rr", "--offset", "released"]),
           ("xattn", ["--method", "xattn"])]


def run(args):
    sweep = ",".join(f"{t:g}" for t in TAUS)
    runs = []
    wanted = args.methods.split(",")
    strides = [int(x) for x in args.strides.split(",")]
    cases = [(s, name, extra) for s in strides for name, extra in METHODS if name in wanted]
    if "oracle" in wanted:
        cases.append((strides[0], "oracle", ["--method", "oracle"]))
    for s, name, extra in cases:
        cmd = [args.ariadne, "prefill", "--tokens", str(args.tokens), "--heads", str(args.heads),
               "--kv-heads", str(args.kv_heads), "--stride", str(s)] + extra + COMMON + ["--tau-sweep", sweep]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        print(" ".join(cmd), file=sys.stderr, flush=True)
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        runs.append({"name": name, "command": cmd, "output": json.loads(out)})
        json.dump({"runs": runs}, open(args.out, "w"), indent=1)


def curve(run):
    """(density, mass_recall, block_f1, tau) points, by τ (density and recall never fall with τ)."""
    return [(p["density"], p["mass_recall"], p["block_f1"], p["tau"]) for p in run["output"]["tau_sweep"]]


def at(points, x, xi, yi):
    """Linear interpolation of column yi at column xi = x; None outside the curve. On a flat stretch
    of xi (equal values) the first point of the stretch is taken (the smallest τ reaching x)."""
    for a, b in zip(points, points[1:]):
        if a[xi] <= x <= b[xi]:
            if b[xi] == a[xi]:
                return a[yi]
            return a[yi] + (b[yi] - a[yi]) * (x - a[xi]) / (b[xi] - a[xi])
    if points and points[0][xi] == x:
        return points[0][yi]
    return None


TYPES = ["sink", "local", "stripe", "needle"]


def per_head_at(points, density, key, heads):
    """Mean over `heads` of a per-head list `key`, interpolated at an overall density."""
    for a, b in zip(points, points[1:]):
        if a["density"] <= density <= b["density"]:
            w = 0 if b["density"] == a["density"] else (density - a["density"]) / (b["density"] - a["density"])
            return sum(a[key][h] + (b[key][h] - a[key][h]) * w for h in heads) / len(heads)
    return None


def fmt(v, nd=4):
    return "—" if v is None else f"{v:.{nd}f}"


def table(args):
    runs = []
    for f in args.files:
        runs += json.load(open(f))["runs"]
    # Cases are (tokens, query heads); the oracle's run is filed under every stride.
    by = {}
    for r in runs:
        o = r["output"]
        by[((o["tokens"], o["heads"]), o["stride"], r["name"])] = r
    sizes = sorted({(r["output"]["tokens"], r["output"]["heads"]) for r in runs})
    strides = sorted({r["output"]["stride"] for r in runs if r["name"] != "oracle"})
    for n in sizes:
        o = next((r for r in runs if r["name"] == "oracle" and (r["output"]["tokens"], r["output"]["heads"]) == n), None)
        for s in strides:
            if o:
                by[(n, s, "oracle")] = o
    label = lambda n: f"{n[0]}" if n[1] == 8 else f"{n[0]} ({n[1]} heads)"
    shown = [0.8, 0.85, 0.9, 0.925, 0.95, 0.97, 0.98, 0.99]

    print("### Curves (density / mass recall / block F1 at each τ)\n")
    for n in sizes:
        for s in strides:
            if not any((n, s, name) in by for name, _ in METHODS):
                continue
            print(f"N {label(n)}, S {s}:\n")
            print("| τ | " + " | ".join(name for name, _ in METHODS) + " | oracle density |")
            print("| --- |" + " --- |" * (len(METHODS) + 1))
            for t in shown:
                cells = []
                od = None
                for name, _ in METHODS:
                    r = by.get((n, s, name))
                    p = next((p for p in r["output"]["tau_sweep"] if abs(p["tau"] - t) < 1e-12), None) if r else None
                    cells.append("—" if p is None else f"{p['density']:.3f} / {p['mass_recall']:.4f} / {p['block_f1']:.3f}")
                    if p is not None:
                        od = p["oracle_density"]
                print(f"| {t:g} | " + " | ".join(cells) + f" | {fmt(od, 3)} |")
            print()

    print("### At the other's density (linear interpolation by density)\n")
    md_header(["N", "S", "τ", "XAttention density", "XAttention recall / F1", "RR recall / F1 at that density",
               "RR (released) recall / F1", "RR density", "RR recall / F1", "XAttention recall / F1 at that density"])
    for n in sizes:
        for s in strides:
            x = by.get((n, s, "xattn"))
            rr = by.get((n, s, "rr"))
            rel = by.get((n, s, "rr-released"))
            if not (x and rr):
                continue
            cx, cr = curve(x), curve(rr)
            cl = curve(rel) if rel else []
            for t in (0.9, 0.95):
                px = next(p for p in cx if abs(p[3] - t) < 1e-12)
                pr = next(p for p in cr if abs(p[3] - t) < 1e-12)
                print(f"| {label(n)} | {s} | {t:g} | {px[0]:.3f} | {px[1]:.4f} / {px[2]:.3f} | "
                      f"{fmt(at(cr, px[0], 0, 1))} / {fmt(at(cr, px[0], 0, 2), 3)} | "
                      f"{fmt(at(cl, px[0], 0, 1))} / {fmt(at(cl, px[0], 0, 2), 3)} | "
                      f"{pr[0]:.3f} | {pr[1]:.4f} / {pr[2]:.3f} | "
                      f"{fmt(at(cx, pr[0], 0, 1))} / {fmt(at(cx, pr[0], 0, 2), 3)} |")
    print()

    print("### Per head type at XAttention's density (mean over the heads of a type; XAttention / RR)\n")
    md_header(["N", "S", "τ"] + [c for ty in TYPES for c in (f"{ty} recall", f"{ty} density")])
    for n in sizes:
        for s in strides:
            x, rr = by.get((n, s, "xattn")), by.get((n, s, "rr"))
            if not (x and rr):
                continue
            types = x["output"]["head_types"]
            for t in (0.9, 0.95):
                px = next(p for p in x["output"]["tau_sweep"] if abs(p["tau"] - t) < 1e-12)
                pts = rr["output"]["tau_sweep"]
                cells = []
                for ty in TYPES:
                    hs = [h for h, name in enumerate(types) if name == ty]
                    for key in ("mass_recall_per_head", "density_per_head"):
                        xv = sum(px[key][h] for h in hs) / len(hs)
                        rv = per_head_at(pts, px["density"], key, hs)
                        cells.append(f"{xv:.3f} / {fmt(rv, 3)}")
                print(f"| {label(n)} | {s} | {t:g} | " + " | ".join(cells) + " |")
    print()

    print("### Density needed for a mass recall (linear interpolation by recall)\n")
    md_header(["N", "S", "recall", "rr", "rr (released)", "xattn", "oracle"])
    for n in sizes:
        for s in strides:
            o = by.get((n, s, "oracle"))
            if not any((n, s, name) in by for name, _ in METHODS):
                continue
            for target in (0.95, 0.97):
                cells = []
                for name in ("rr", "rr-released", "xattn"):
                    r = by.get((n, s, name))
                    cells.append(fmt(at(curve(r), target, 1, 0), 3) if r else "—")
                cells.append(fmt(at(curve(o), target, 1, 0), 3) if o else "—")
                print(f"| {label(n)} | {s} | {target:g} | " + " | ".join(cells) + " |")
    print()


def md_header(cols):
    """A markdown table's header row and separator."""
    print("| " + " | ".join(cols) + " |")
    print("| --- " * len(cols) + "|")


def sweep_cli(doc, run_args, run, table):
    """The sweeps' command line: `run` (its options from run_args(parser), each with --ariadne,
    --tokens, --strides and --out) writes a JSON file, `table FILE...` prints the tables."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--ariadne", default="build/ariadne")
    r.add_argument("--tokens", type=int, required=True)
    r.add_argument("--strides", default="8,16")
    r.add_argument("--out", required=True)
    run_args(r)
    sub.add_parser("table").add_argument("files", nargs="+")
    args = ap.parse_args()
    run(args) if args.cmd == "run" else table(args)


def main():
    def run_args(r):
        r.add_argument("--threads", type=int, default=0)
        r.add_argument("--heads", type=int, default=8)
        r.add_argument("--kv-heads", type=int, default=2)
        r.add_argument("--methods", default="rr,rr-released,xattn,oracle")
    sweep_cli(__doc__, run_args, run, table)


if __name__ == "__main__":
    main()
