#!/usr/bin/env python3
"""Markdown tables from `ariadne llm ... --json` outputs (bench/RESULTS.md, "SmolLM2 (CPU)").

    python3 scripts/llm_results.py run1.json [run2.json ...]

Prints, per case (task/tokens/method τ S): generation runs, accuracy and its ratio to dense,
density of the run; and from --probe (masks scored on the dense run's real q/k, mean over layers and
instances): density, attention-mass recall, block F1, output error (with --probe-outputs); then
the per-layer rows of mass recall and block F1 when --layers was given, and the worst heads.
"""
import json
import sys


def fmt(x, nd=3):
    return "" if x is None else f"{x:.{nd}f}"


rows, layers = [], {}
for path in sys.argv[1:]:
    with open(path) as fh:
        d = json.load(fh)
    for s in d["summary"]:
        rows.append(s)
        p = s.get("probe")
        if p and p["per_layer"] and "mass_recall_per_head" in p["per_layer"][0]:
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
