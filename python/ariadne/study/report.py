"""The study's results as Markdown: one row per run name (schedule, or schedule@sdpa) with mean ±
sample standard deviation over seeds, the Pearson r between SHS-Index and held-out accuracy across
the configurations, and two SVG pictures beside the results (per-layer SHS-Index per run, accuracy
against SHS-Index). Reads the results.json that `python -m ariadne.study` writes, or merges the runs
of several study folders (parts of one study run apart, e.g. concurrently on one GPU) into one.

    python -m ariadne.study.report study-out/results.json
    python -m ariadne.study.report --merge OUT DIR [DIR ...]
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

COLUMNS = (("exact", "held-out exact", 3), ("set", "class set", 3), ("count", "count", 3),
           ("heldout_label_auroc", "class AUROC", 3), ("heldout_loss", "held-out loss", 3),
           ("shs_index", "SHS-Index", 3), ("shs_ood_index", "SHS-Index VOC", 3),
           ("fg_dominant_share", "FG-dominant share", 3),
           ("sink_bg_heavier_share", "sink takes more from BG", 3), ("attention_distance_px", "attn distance px", 1),
           ("entropy", "row entropy", 2), ("erf", "ERF 90% share", 3), ("erf_distance_px", "ERF distance px", 1),
           ("images_per_s", "train images/s", 1), ("loss_last", "final loss", 3))


def pearson(xs: Sequence[float], ys: Sequence[float]) -> Optional[float]:
    """Pearson's r, or None with fewer than 3 points or no spread."""
    if len(xs) != len(ys) or len(xs) < 3:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else None


def table(summary: Dict[str, dict]) -> str:
    cols = [c for c in COLUMNS if any(c[0] in v for v in summary.values())]
    lines = ["| run | seeds | " + " | ".join(c[1] for c in cols) + " |",
             "|---|---|" + "---|" * len(cols)]
    for name, v in summary.items():
        n = max(x["n"] for x in v.values() if isinstance(x, dict))
        cells = [f"{v[k]['mean']:.{d}f} ± {v[k]['std']:.{d}f}" if k in v else "—" for k, _, d in cols]
        lines.append(f"| {name} | {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# The accuracies the SHS-Index is correlated with: exact (class set and count both right) is the
# whole task, but it stays near zero for short runs, where count and the threshold-free class AUROC
# still separate the schedules.
ACCURACIES = (("exact", "exact accuracy"), ("count", "count accuracy"), ("heldout_label_auroc", "class AUROC"))


def shs_vs_accuracy(summary: Dict[str, dict], key: str = "exact") -> Tuple[Optional[float], List[str]]:
    """r between mean SHS-Index and the mean of accuracy `key` over the runs that have both."""
    names = [k for k, v in summary.items() if "shs_index" in v and key in v]
    r = pearson([summary[k]["shs_index"]["mean"] for k in names], [summary[k][key]["mean"] for k in names])
    return r, names


def render(results: dict) -> str:
    summary = results["summary"]
    args = results.get("args", {})
    device = results["runs"][0]["device"] if results.get("runs") else "?"
    out = [f"Study: {args.get('steps')} steps of {args.get('batch')} images of {args.get('size')} px, depth "
           f"{args.get('depth')}, hidden {args.get('hidden')}, {args.get('heads')} heads, "
           f"window ±{args.get('window')}, device {device}.", "", table(summary), ""]
    for key, label in ACCURACIES:
        r, names = shs_vs_accuracy(summary, key)
        if not names:
            continue
        if r is None:
            out.append(f"Pearson r (SHS-Index vs {label}): not defined for {len(names)} configuration(s) "
                       "(needs at least 3 with spread).")
        else:
            out.append(f"Pearson r (SHS-Index vs {label}) over {len(names)} configurations: {r:.3f}.")
    return "\n".join(out) + "\n"


# ---- pictures: plain SVG, so that no plotting package is needed

_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf")


def _axes(w: int, h: int, m: int, xr: Tuple[float, float], yr: Tuple[float, float], title: str, xlabel: str,
          ylabel: str, right: int = 0) -> Tuple[List[str], callable]:
    """The frame of a chart: margin m on every side plus `right` for a legend; at(x, y) -> pixels."""
    def at(x: float, y: float) -> Tuple[float, float]:
        fx = (x - xr[0]) / ((xr[1] - xr[0]) or 1)
        fy = (y - yr[0]) / ((yr[1] - yr[0]) or 1)
        return m + fx * (w - 2 * m - right), h - m - fy * (h - 2 * m)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" '
             f'font-size="12">', f'<rect width="{w}" height="{h}" fill="white"/>',
             f'<text x="{w / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>',
             f'<line x1="{m}" y1="{h - m}" x2="{w - m - right}" y2="{h - m}" stroke="black"/>',
             f'<line x1="{m}" y1="{m}" x2="{m}" y2="{h - m}" stroke="black"/>',
             f'<text x="{w / 2}" y="{h - 12}" text-anchor="middle">{xlabel}</text>',
             f'<text x="14" y="{h / 2}" text-anchor="middle" transform="rotate(-90 14 {h / 2})">{ylabel}</text>']
    for i in range(5):
        y = yr[0] + (yr[1] - yr[0]) * i / 4
        px, py = at(xr[0], y)
        parts.append(f'<text x="{px - 6}" y="{py + 4}" text-anchor="end">{y:.3g}</text>')
    return parts, at


def _range(values: Sequence[float]) -> Tuple[float, float]:
    lo, hi = min(values), max(values)
    pad = (hi - lo) * 0.1 or 0.01
    return lo - pad, hi + pad


def svg_shs_per_layer(summary: Dict[str, dict]) -> Optional[str]:
    """Per-layer SHS-Index (mean over seeds), one line per run; None without SHS figures."""
    runs = {k: v["shs_per_layer"] for k, v in summary.items() if v.get("shs_per_layer")}
    if not runs:
        return None
    depth = max(len(v) for v in runs.values())
    w, h, m, legend = 800, 400, 60, 160
    parts, at = _axes(w, h, m, (0, max(1, depth - 1)), _range([y for v in runs.values() for y in v]),
                      "SHS-Index per layer (mean over seeds)", "layer", "SHS-Index", legend)
    for i in range(depth):
        px, py = at(i, _range([y for v in runs.values() for y in v])[0])
        parts.append(f'<text x="{px}" y="{py + 16}" text-anchor="middle">{i}</text>')
    for j, (name, ys) in enumerate(runs.items()):
        colour = _COLOURS[j % len(_COLOURS)]
        points = " ".join("%.1f,%.1f" % at(i, y) for i, y in enumerate(ys))
        parts.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"/>')
        parts.append(f'<text x="{w - m - legend + 12}" y="{m + 16 * j}" fill="{colour}">{name}</text>')
    return "\n".join(parts + ["</svg>"]) + "\n"


def svg_accuracy_vs_shs(summary: Dict[str, dict]) -> Optional[str]:
    """Mean accuracy against mean SHS-Index, one point per run: class AUROC where the runs have it,
    else exact accuracy; None without SHS figures."""
    key, label = ACCURACIES[2] if any(ACCURACIES[2][0] in v for v in summary.values()) else ACCURACIES[0]
    runs = {k: (v["shs_index"]["mean"], v[key]["mean"]) for k, v in summary.items() if "shs_index" in v and key in v}
    if not runs:
        return None
    w, h, m = 520, 420, 60
    r, _ = shs_vs_accuracy(summary, key)
    title = f"held-out {label} vs SHS-Index" + (f" (Pearson r = {r:.3f})" if r is not None else "")
    parts, at = _axes(w, h, m, _range([x for x, _ in runs.values()]), _range([y for _, y in runs.values()]),
                      title, "SHS-Index", label)
    for j, (name, (x, y)) in enumerate(runs.items()):
        px, py = at(x, y)
        colour = _COLOURS[j % len(_COLOURS)]
        parts.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="5" fill="{colour}"/>')
        parts.append(f'<text x="{px + 8:.1f}" y="{py + 4:.1f}" fill="{colour}">{name}</text>')
    return "\n".join(parts + ["</svg>"]) + "\n"


def write_pictures(results: dict, folder) -> List[Path]:
    """shs_per_layer.svg and accuracy_vs_shs.svg in `folder` when the runs have SHS figures."""
    written = []
    for name, make in (("shs_per_layer.svg", svg_shs_per_layer), ("accuracy_vs_shs.svg", svg_accuracy_vs_shs)):
        text = make(results["summary"])
        if text is not None:
            path = Path(folder) / name
            path.write_text(text)
            written.append(path)
    return written


def merge(folders: Sequence[Path], out: Path) -> dict:
    """One results.json (and results.md, pictures) in `out` over the runs of every folder: the runs
    must share their settings (study_settings) and no (run, seed) may appear twice."""
    from .train import summarize  # train imports this module

    records, where = [], {}
    for folder in folders:
        paths = sorted((Path(folder) / "runs").glob("*/seed*/metrics.json"))
        if not paths:
            raise ValueError(f"{folder}: no runs/*/seed*/metrics.json")
        for path in paths:
            r = json.loads(path.read_text())
            r.pop("losses", None)
            key = (r["run"], r["seed"])
            if key in where:
                raise ValueError(f"run {key[0]} seed {key[1]} is in both {where[key]} and {path}")
            where[key] = path
            records.append(r)
    settings = {json.dumps(r["settings"], sort_keys=True) for r in records}
    if len(settings) != 1:
        raise ValueError(f"the runs were made with {len(settings)} different settings "
                         "(study_settings: every option but the schedules, seeds and attention path); "
                         "only runs of one study can be merged")
    records.sort(key=lambda r: (r["run"], r["seed"]))
    results = dict(args=dict(records[0]["settings"]), runs=records, summary=summarize(records),
                   merged_from=[str(f) for f in folders])
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "results.md").write_text(render(results))
    write_pictures(results, out)
    return results


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--merge"]:
        if len(argv) < 3:
            print("usage: python -m ariadne.study.report --merge OUT DIR [DIR ...]", file=sys.stderr)
            return 2
        try:
            results = merge([Path(a) for a in argv[2:]], Path(argv[1]))
        except (OSError, ValueError, KeyError) as e:
            print(f"study report: {e}", file=sys.stderr)
            return 1
        sys.stdout.write(render(results))
        return 0
    if len(argv) != 1:
        print("usage: python -m ariadne.study.report RESULTS.json | --merge OUT DIR [DIR ...]", file=sys.stderr)
        return 2
    path = Path(argv[0])
    try:
        results = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        print(f"study report: {path}: {e}", file=sys.stderr)
        return 1
    if "summary" not in results:
        print(f"study report: {path}: no 'summary' field; expected the results.json of python -m ariadne.study",
              file=sys.stderr)
        return 1
    sys.stdout.write(render(results))
    for path in write_pictures(results, path.parent):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
