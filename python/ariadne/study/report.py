"""The study's results as Markdown: one row per run name (schedule, or schedule@sdpa) with mean ±
sample standard deviation over seeds, and the Pearson r between SHS-Index and held-out accuracy
across the configurations. Reads the results.json that `python -m ariadne.study` writes.

    python -m ariadne.study.report study-out/results.json
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

COLUMNS = (("exact", "held-out exact", 3), ("set", "class set", 3), ("count", "count", 3),
           ("shs_index", "SHS-Index", 3), ("images_per_s", "train images/s", 1), ("loss_last", "final loss", 3))


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
        n = max(x["n"] for x in v.values())
        cells = [f"{v[k]['mean']:.{d}f} ± {v[k]['std']:.{d}f}" if k in v else "—" for k, _, d in cols]
        lines.append(f"| {name} | {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def shs_vs_accuracy(summary: Dict[str, dict]) -> Tuple[Optional[float], List[str]]:
    """r between mean SHS-Index and mean exact accuracy over the runs that have both."""
    names = [k for k, v in summary.items() if "shs_index" in v and "exact" in v]
    r = pearson([summary[k]["shs_index"]["mean"] for k in names], [summary[k]["exact"]["mean"] for k in names])
    return r, names


def render(results: dict) -> str:
    summary = results["summary"]
    args = results.get("args", {})
    device = results["runs"][0]["device"] if results.get("runs") else "?"
    out = [f"Study: {args.get('steps')} steps of {args.get('batch')} images of {args.get('size')} px, depth "
           f"{args.get('depth')}, hidden {args.get('hidden')}, {args.get('heads')} heads, "
           f"window ±{args.get('window')}, device {device}.", "", table(summary), ""]
    r, names = shs_vs_accuracy(summary)
    if r is None:
        out.append(f"Pearson r (SHS-Index vs exact accuracy): not defined for {len(names)} configuration(s) "
                   "(needs at least 3 with spread).")
    else:
        out.append(f"Pearson r (SHS-Index vs exact accuracy) over {len(names)} configurations: {r:.3f}.")
    return "\n".join(out) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1:
        print("usage: python -m ariadne.study.report RESULTS.json", file=sys.stderr)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
