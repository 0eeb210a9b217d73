#!/usr/bin/env python3
"""Markdown tables from `ariadne llm-probe ... --per-layer --json` outputs (bench/RESULTS.md, "SmolLM2 (CPU)").

    python3 scripts/llm_results.py [--per-layer CASE ...] [--per-head CASE ...] run1.json [run2.json ...]

Files from several invocations (scripts/llm_sweep.sh writes one per task, length and seed) are
pooled: accuracy counts add up, probe metrics are means weighted by the instances behind them. A
--compact file of an earlier pooling can be an input too (its runs, and its probe means per case
and layer; it has no per-head data, so per-head columns then leave that case out).

Tables:
  accuracy   per (task, length, method, RR offset, τ, S): exact-match answers, dense answers on the
             same prompts, their ratio, mean density of the runs.
  masks      per probe configuration (estimator, offset, τ, S, protections), scored on the dense
             run's real q/k at every layer against the oracle at the same τ and B: density,
             attention-mass recall, block precision / recall / F1, output error (--probe-outputs),
             and where the kept blocks differ from the oracle's (as shares of the visible blocks).
  per layer  (--per-layer REGEX, searched in the case names): mass recall, F1, density per layer.
  per head   (--per-head REGEX): F1 and density of each query head, mean over layers, with the
             query RR samples in each stride (paper: S − 1 − h mod S, released: h mod S).
  pooled     (--pooled): accuracy per method, offset, τ and S pooled over tasks and lengths (right
             where dense was right, and its share of dense's right answers; density per length),
             and the probe metrics per configuration and length pooled over tasks.
The length of a case is the target of the prompt (the prompt is up to one filler group shorter).
"""
import argparse
import json
import math
import re
from collections import defaultdict


def fmt(x, nd=3):
    return "" if x is None else f"{x:.{nd}f}"


ap = argparse.ArgumentParser()
ap.add_argument("files", nargs="+")
ap.add_argument("--per-layer", action="append", default=[], help="cases (regular expression) for per-layer rows")
ap.add_argument("--per-head", action="append", default=[], help="cases (regular expression) for per-head rows")
ap.add_argument("--no-accuracy", action="store_true")
ap.add_argument("--no-masks", action="store_true")
ap.add_argument("--cases", help="regular expression: only these cases in the masks table")
ap.add_argument("--grid", action="store_true",
                help="a compact table: per task, length, τ and S, density / mass recall / F1 of each estimator variant")
ap.add_argument("--pooled", action="store_true",
                help="accuracy and mask metrics pooled over tasks (and lengths), one row per method configuration")
ap.add_argument("--compact", help="also write the pooled results here as JSON: every generation run (no per-layer "
                "data) and per probe case the pooled means, breakdown and per-layer mass recall / F1 / density / error")
args = ap.parse_args()

CATS = ["last_row", "sink", "diagonal", "other"]


def target(tokens):
    return 2 ** round(math.log2(tokens))


# ---- pool the files ----
runs = []
probe = {}  # case -> pooled sums
KEYS = ("density", "mass_recall", "f1", "out_rel_err")


def add_probe(case, p, compact):
    """Adds one file's probe of a case: a run's summary entry, or a --compact file's pooled means
    (per layer only: its case then has no per-head sums, and per-head columns leave it out)."""
    n = p["instances"]
    acc = probe.setdefault(case, {"n": 0, **{k: 0 for k in KEYS}, "breakdown": defaultdict(int), "layers": None,
                                  "heads": None})
    acc["n"] += n
    for k in KEYS:
        acc[k] += p[k] * n
    for k, v in p["breakdown"].items():
        acc["breakdown"][k] += v
    pl = p["per_layer"]
    if acc["layers"] is None:
        acc["layers"] = [defaultdict(float) for _ in pl]
        if not compact:
            acc["heads"] = [[defaultdict(float) for _ in e.get("f1_per_head", [])] for e in pl]
    if compact:
        acc["heads"] = None
    for l, e in enumerate(pl):
        L = acc["layers"][l]
        for k in KEYS:
            L[k] += e[k] * n
        if compact:
            continue
        if e.get("mass_recall_per_head"):  # runs without per-head data leave the column out
            L["min_head_recall"] += min(e["mass_recall_per_head"]) * n
            L["min_head_n"] += n
        for h, f in enumerate(e.get("f1_per_head", []) if acc["heads"] is not None else []):
            H = acc["heads"][l][h]
            H["f1"] += f * n
            H["mass_recall"] += e["mass_recall_per_head"][h] * n
            b = e["breakdown_per_head"][h]
            H["density"] += b["kept"] / b["visible"] * n if b["visible"] else 0
        for k, v in e.get("breakdown", {}).items():
            L["b_" + k] += v


for path in args.files:
    with open(path) as fh:
        d = json.load(fh)
    runs += d["runs"]
    if "probes" in d:  # a --compact file of an earlier pooling
        for case, p in d["probes"].items():
            add_probe(case, p, True)
        continue
    for s in d["summary"]:
        if s.get("probe"):
            add_probe(s["case"], s["probe"], False)

# ---- accuracy ----
if runs and not args.no_accuracy:
    dense = {}
    for r in runs:
        if r["method"] == "dense":
            dense[(r["task"], r["tokens"], r["seed"], r["depth"])] = r["correct"]
    groups = defaultdict(list)
    for r in runs:
        if r["method"] == "dense":
            continue
        key = (r["task"], target(r["tokens"]), r["method"], r.get("offset", ""), r["tau"], r["stride"],
               r.get("protect", "published"))
        groups[key].append(r)
    dense_groups = defaultdict(list)
    for (task, tokens, seed, depth), ok in dense.items():
        dense_groups[(task, target(tokens))].append(ok)
    print("| task | tokens | method | RR offset | τ | S | protections | correct | dense correct, same prompts | vs dense "
          "| mean density |")
    print("| --- " * 11 + "|")
    for (task, tok) in sorted(dense_groups):
        dg = dense_groups[(task, tok)]
        print(f"| {task} | {tok} | dense | | | | | {sum(dg)}/{len(dg)} | | | 1 |")
        for key in sorted(k for k in groups if k[:2] == (task, tok)):
            rs = groups[key]
            ok = sum(r["correct"] for r in rs)
            dok = sum(dense.get((r["task"], r["tokens"], r["seed"], r["depth"]), False) for r in rs)
            dens = sum(r["density"] for r in rs) / len(rs)
            ratio = fmt(ok / dok, 2) if dok else ""
            print(f"| {task} | {tok} | {key[2]} | {key[3]} | {key[4]} | {key[5]} | {key[6]} | {ok}/{len(rs)} | {dok}/{len(rs)} | "
                  f"{ratio} | {dens:.3f} |")
    print()

# ---- pooled over tasks and lengths ----
if runs and args.pooled:
    dense = {(r["task"], r["tokens"], r["seed"], r["depth"]): r["correct"] for r in runs if r["method"] == "dense"}
    groups = defaultdict(list)
    for r in runs:
        if r["method"] != "dense":
            groups[(r["method"], r.get("offset", ""), r["tau"], r["stride"], r.get("protect", "published"))].append(r)
    lengths = sorted({target(r["tokens"]) for r in runs})
    nd = sum(dense.values())
    print(f"Accuracy pooled over tasks and lengths ({len(dense)} prompts, dense right on {nd}):")
    print()
    print("| method | RR offset | τ | S | protections | right where dense was right | vs dense | right overall | "
          "density " + " / ".join(f"{t // 1024}K" for t in lengths) + " |")
    print("| --- " * 9 + "|")
    for key in sorted(groups, key=lambda k: (k[0] != "rr", k[0], k[1] != "released", k[2], k[3], k[4])):
        rs = groups[key]
        both = sum(r["correct"] and dense.get((r["task"], r["tokens"], r["seed"], r["depth"]), False) for r in rs)
        dok = sum(dense.get((r["task"], r["tokens"], r["seed"], r["depth"]), False) for r in rs)
        ok = sum(r["correct"] for r in rs)
        dens = []
        for t in lengths:
            d = [r["density"] for r in rs if target(r["tokens"]) == t]
            dens.append(f"{sum(d) / len(d):.2f}" if d else "")
        print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {key[4]} | {both}/{dok} | {fmt(both / dok if dok else None, 3)} "
              f"| {ok}/{len(rs)} | " + " / ".join(dens) + " |")
    print()
    cols = sorted({(r["task"], target(r["tokens"])) for r in runs})
    print("Right where dense was right / dense right, per task and length:")
    print()
    print("| method | RR offset | τ | S | " + " | ".join(f"{t} {n // 1024}K" for t, n in cols) + " |")
    print("| --- " * (4 + len(cols)) + "|")
    for key in sorted(groups, key=lambda k: (k[0] != "rr", k[0], k[1] != "released", k[2], k[3], k[4])):
        cells = []
        for t, n in cols:
            rs = [r for r in groups[key] if r["task"] == t and target(r["tokens"]) == n]
            dk = [r for r in rs if dense.get((r["task"], r["tokens"], r["seed"], r["depth"]), False)]
            cells.append(f"{sum(r['correct'] for r in dk)}/{len(dk)}")
        print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | " + " | ".join(cells) + " |")
    print()
if probe and args.pooled:
    pooled = {}
    for case, a in probe.items():
        task, tok, label = case.split("/", 2)
        acc = pooled.setdefault((label, int(tok)), {"n": 0, "density": 0, "mass_recall": 0, "f1": 0})
        for k in ("n", "density", "mass_recall", "f1"):
            acc[k] += a[k]
    lengths = sorted({t for _, t in pooled})
    print("Masks on the dense runs' real q/k against the oracle at the same τ and B, pooled over tasks "
          "(mean over layers and prompts): density / mass recall / block F1")
    print()
    print("| configuration | " + " | ".join(f"{t // 1024}K" for t in lengths) + " |")
    print("| --- " * (1 + len(lengths)) + "|")
    for label in sorted({l for l, _ in pooled}):
        cells = []
        for t in lengths:
            a = pooled.get((label, t))
            cells.append(f"{a['density'] / a['n']:.3f} / {a['mass_recall'] / a['n']:.4f} / {a['f1'] / a['n']:.3f}"
                         if a else "")
        print(f"| {label} | " + " | ".join(cells) + " |")
    print()

# ---- masks on real heads ----
if probe and not args.no_masks:
    print("| case | instances | density | mass recall | precision | recall | block F1 | out err | "
          "FP last row | FP sink | FP diagonal | FP other | FN last row | FN sink | FN diagonal | FN other |")
    print("| --- " * 16 + "|")
    for case in sorted(probe, key=lambda c: (c.split("/")[0], int(c.split("/")[1]), c)):
        if args.cases and not re.search(args.cases, case):
            continue
        a = probe[case]
        n, b = a["n"], a["breakdown"]
        vis = b["visible"] or 1
        prec = b["tp"] / b["kept"] if b["kept"] else 0
        rec = b["tp"] / b["truth"] if b["truth"] else 0
        cells = [f"{100 * b['fp_' + c] / vis:.1f}" for c in CATS] + [f"{100 * b['fn_' + c] / vis:.1f}" for c in CATS]
        err = a["out_rel_err"] / n
        print(f"| {case} | {n} | {a['density'] / n:.3f} | {a['mass_recall'] / n:.4f} | {prec:.3f} | {rec:.3f} | "
              f"{a['f1'] / n:.3f} | {fmt(err, 4) if err else ''} | " + " | ".join(cells) + " |")
    print()
    print("(FP/FN columns: % of the visible blocks; each disagreeing block counted once, in the order last row, "
          "sink column, diagonal, other.)")
    print()

if args.grid and probe:
    variants = [("rr paper", ""), ("rr released", ""), ("xattn", ""), ("rr paper", " protect=sink+diagonal"),
                ("rr released", " protect=sink+diagonal"), ("rr paper", " protect=none"), ("xattn", " protect=none")]
    print("Density / mass recall / block F1 (mean over layers and prompts) on the dense runs' real q/k:")
    print()
    print("| task | tokens | τ | S | prompts | " + " | ".join(f"{m}{p or ' (published)'}" for m, p in variants) + " |")
    print("| --- " * (5 + len(variants)) + "|")
    keys = sorted({(c.split("/")[0], int(c.split("/")[1]), m.group(1), m.group(2))
                   for c in probe for m in [re.search(r"tau=([0-9.]+) S=(\d+)", c)] if m})
    for task, tok, tau, S in keys:
        cells, n = [], ""
        for m, p in variants:
            a = probe.get(f"{task}/{tok}/{m} tau={tau} S={S}{p}")
            if a is None:
                cells.append("")
                continue
            n = a["n"]
            cells.append(f"{a['density'] / a['n']:.3f} / {a['mass_recall'] / a['n']:.4f} / {a['f1'] / a['n']:.3f}")
        print(f"| {task} | {tok} | {tau} | {S} | {n} | " + " | ".join(cells) + " |")
    print()

for want in args.per_layer:
    cases = sorted(c for c in probe if re.search(want, c))
    if not cases:
        continue
    print(f"Per layer, cases matching '{want}': mass recall (worst head's mean) / block F1 / density"
          " [/ output error vs dense, with --probe-outputs]")
    print()
    print("| layer | " + " | ".join(cases) + " |")
    print("| --- " * (len(cases) + 1) + "|")
    for l in range(len(probe[cases[0]]["layers"])):
        cells = []
        for c in cases:
            L, n = probe[c]["layers"][l], probe[c]["n"]
            err = L["out_rel_err"] / n
            mh = f"{L['min_head_recall'] / L['min_head_n']:.3f}" if L["min_head_n"] else "—"
            cells.append(f"{L['mass_recall'] / n:.3f} ({mh}) / {L['f1'] / n:.2f} / "
                         f"{L['density'] / n:.2f}" + (f" / {err:.3f}" if err else ""))
        print(f"| {l} | " + " | ".join(cells) + " |")
    print()

for want in args.per_head:
    cases = sorted(c for c in probe if re.search(want, c) and probe[c]["heads"] is not None)
    if not cases:
        continue
    print(f"Per query head, cases matching '{want}' (mean over layers): block F1 / density / mass recall; "
          "RR's sampled query in each stride")
    print()
    print("| head | " + " | ".join(cases) + " |")
    print("| --- " * (len(cases) + 1) + "|")
    nh = len(probe[cases[0]]["heads"][0])
    for h in range(nh):
        cells = []
        for c in cases:
            a, n = probe[c], probe[c]["n"]
            L = len(a["heads"])
            f1 = sum(a["heads"][l][h]["f1"] for l in range(L)) / L / n
            den = sum(a["heads"][l][h]["density"] for l in range(L)) / L / n
            mr = sum(a["heads"][l][h]["mass_recall"] for l in range(L)) / L / n
            m = re.search(r"rr (paper|released) .*S=(\d+)", c)
            pos = ""
            if m:
                S = int(m.group(2))
                pos = f" [q {S - 1 - h % S if m.group(1) == 'paper' else h % S}]"
            cells.append(f"{f1:.3f} / {den:.3f} / {mr:.4f}{pos}")
        print(f"| {h} | " + " | ".join(cells) + " |")
    print()

# RR against XAttention with the same task, length, τ, S and protections, on the same heads.
pairs = []
for c in sorted(probe):
    m = re.match(r"(.*)/rr (paper|released) (.*)$", c)
    if m and f"{m.group(1)}/xattn {m.group(3)}" in probe:
        pairs.append((c, f"{m.group(1)}/xattn {m.group(3)}"))
if pairs and not args.no_masks:
    print("RR >= XAttention on the same real heads (layers, and (layer, head) pairs, where RR's value is >=):")
    print()
    print("| RR case | layers: mass recall | layers: block F1 | heads: block F1 |")
    print("| --- | --- | --- | --- |")
    for rc, xc in pairs:
        r, x = probe[rc], probe[xc]
        L = len(r["layers"])
        lr = sum(r["layers"][l]["mass_recall"] / r["n"] >= x["layers"][l]["mass_recall"] / x["n"] for l in range(L))
        lf = sum(r["layers"][l]["f1"] / r["n"] >= x["layers"][l]["f1"] / x["n"] for l in range(L))
        if r["heads"] is not None and x["heads"] is not None:
            nh = len(r["heads"][0])
            hf = sum(r["heads"][l][h]["f1"] / r["n"] >= x["heads"][l][h]["f1"] / x["n"] for l in range(L) for h in range(nh))
            heads = f"{hf}/{L * nh}"
        else:
            heads = "(compact input: no heads)"
        print(f"| {rc} | {lr}/{L} | {lf}/{L} | {heads} |")

if args.compact:
    out = {"runs": [{k: v for k, v in r.items() if k != "layers"} for r in runs], "probes": {}}
    for case, a in probe.items():
        n = a["n"]
        out["probes"][case] = {
            "instances": n, "density": a["density"] / n, "mass_recall": a["mass_recall"] / n, "f1": a["f1"] / n,
            "out_rel_err": a["out_rel_err"] / n, "breakdown": dict(a["breakdown"]),
            "per_layer": [{k: round(L[k] / n, 5) for k in ("density", "mass_recall", "f1", "out_rel_err")}
                          for L in a["layers"]]}
    with open(args.compact, "w") as fh:
        json.dump(out, fh, indent=0)
