#!/usr/bin/env python3
"""Markdown tables from `ariadne llm ... --json` outputs (bench/RESULTS.md, "SmolLM2 (CPU)").

    python3 scripts/llm_results.py [--layers-of SUBSTRING ...] run1.json [run2.json ...]

Prints, per case (task/tokens/method τ S): generation runs, accuracy and its ratio to dense,
density of the run; and from --probe (masks scored on the dense run's real q/k, mean over layers and
instances): density, attention-mass recall, block F1, output error (with --probe-outputs); then
the per-layer rows of mass recall and block F1 when --layers was given, and the worst heads.
"""
import argparse
import json


def fmt(x, nd=3):
    return "" if x is None else f"{x:.{nd}f}"


ap = argparse.ArgumentParser()
ap.add_argument("files", nargs="+")
ap.add_argument("--layers-of", action="append", default=[],
                help="per-layer table only for cases containing this text (repeatable; default all)")
args = ap.parse_args()

rows, layers = [], {}
for path in args.files:
    with open(path) as fh:
        d = json.load(fh)
    for s in d["summary"]:
        rows.append(s)
        p = s.get("probe")
        wanted = not args.layers_of or any(w in s["case"] for w in args.layers_of)
        if wanted and p and p["per_layer"] and "mass_recall_per_head" in p["per_layer"][0]:
            layers[s["case"]] = p["per_layer"]

print("| case | runs | accuracy | vs dense | density (run) | probe instances | density | mass recall | block F1 | out err |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for s in rows:
    p = s.get("probe", {})
    print(f"| {s['case']} | {s['runs']} | {fmt(s.get('accuracy'), 2)} | {fmt(s.get('accuracy_vs_dense'), 2)} | "
          f"{fmt(s.get('density'))} | {p.get('instances', '')} | {fmt(p.get('density'))} | "
          f"{fmt(p.get('mass_recall'), 4)} | {fmt(p.get('f1'))} | {fmt(p.get('out_rel_err') or None, 4)} |")

if layers:
    print()
    print("Per layer (probe, mean over instances): mass recall / block F1; worst head's mass recall.")
    print()
    cases = sorted(layers)
    print("| layer | " + " | ".join(cases) + " |")
    print("| --- | " + " | ".join("---" for _ in cases) + " |")
    for l in range(len(layers[cases[0]])):
        cells = []
        for c in cases:
            e = layers[c][l]
            cells.append(f"{e['mass_recall']:.3f} / {e['f1']:.2f} (min {min(e['mass_recall_per_head']):.3f})")
        print(f"| {l} | " + " | ".join(cells) + " |")

# RR against XAttention at the same task, length, τ and S, on the same heads (probe rows).
probe = {s["case"]: s["probe"] for s in rows if s.get("probe") and "mass_recall_per_head" in s["probe"]["per_layer"][0]}
pairs = [(c, c.replace("/rr ", "/xattn ")) for c in sorted(probe) if "/rr " in c and c.replace("/rr ", "/xattn ") in probe]
if pairs:
    print()
    print("RR >= XAttention on the same real heads (counts of layers, and of (layer, head) pairs):")
    print()
    print("| case | layers: mass recall | layers: block F1 | heads: mass recall | heads: block F1 |")
    print("| --- | --- | --- | --- | --- |")
    for rc, xc in pairs:
        r, x = probe[rc]["per_layer"], probe[xc]["per_layer"]
        n_l, n_h = len(r), sum(len(e["mass_recall_per_head"]) for e in r)
        lr = sum(a["mass_recall"] >= b["mass_recall"] for a, b in zip(r, x))
        lf = sum(a["f1"] >= b["f1"] for a, b in zip(r, x))
        hr = sum(u >= v for a, b in zip(r, x) for u, v in zip(a["mass_recall_per_head"], b["mass_recall_per_head"]))
        hf = sum(u >= v for a, b in zip(r, x) for u, v in zip(a["f1_per_head"], b["f1_per_head"]))
        print(f"| {rc} | {lr}/{n_l} | {lf}/{n_l} | {hr}/{n_h} | {hf}/{n_h} |")

# Retrieval accuracy pooled over every file's runs, by (tokens, method, τ, S, RR offset); dense
# runs of the same prompt (task, tokens, seed, depth) in several files count once.
acc, dense_seen = {}, {}
for path in args.files:
    with open(path) as fh:
        d = json.load(fh)
    for r in d["runs"]:
        if "correct" not in r or r.get("method") is None:
            continue
        prompt = (r["task"], r["tokens"], r["seed"], r["depth"])
        if r["method"] == "dense":
            dense_seen[prompt] = r["correct"]
            continue
        key = (r["task"], r["tokens"], r["method"], r["tau"], r["stride"], d.get("offset", "paper") if r["method"] == "rr" else "")
        acc.setdefault(key, []).append((prompt, r["correct"]))
if acc:
    print()
    print("| task | tokens | method | τ | S | RR offset | correct | dense correct on the same prompts | ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for key in sorted(acc):
        runs = acc[key]
        ok = sum(c for _, c in runs)
        dense_ok = sum(dense_seen.get(p, False) for p, _ in runs)
        ratio = f"{ok / dense_ok:.2f}" if dense_ok else ""
        print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {key[4]} | {key[5]} | {ok}/{len(runs)} | {dense_ok}/{len(runs)} | {ratio} |")
