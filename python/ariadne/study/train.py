"""Training and evaluation of the study: every schedule on the same data, steps and seeds.

For one seed s, every schedule starts from the same initial weights (parameters are created in the
same order from torch's generator seeded with s; sinks start at 0 without drawing from it), reads
the same training images (split s, a fixed set of --train-images cycled in a per-epoch order drawn
from s) in the same batches, and is evaluated on the same held-out split (--eval-seed, which no
training split uses). Only the schedule differs. See docs/study.md.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch

import ariadne

from . import checkpoint, data, measure, report
from .model import SCHEDULES, StudyViT, pixel_rows, study_config, study_schedule


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    d = torch.device(name)
    if d.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"study: --device {name}, but torch sees no CUDA device")
    return d


def render_split(seed: int, count: int, side: int, device, batch: int = 256, masks: bool = True) -> data.Batch:
    """Images 0..count-1 of split `seed`, rendered in batches and kept on `device`. masks=False
    drops the instance maps (training needs the labels only; at 448 px they would double the memory)."""
    parts = []
    for i in range(0, count, batch):
        part = data.make_batch(seed, range(i, min(count, i + batch)), side, device)
        if not masks:
            part.instances = part.instances[:0]
        parts.append(part)
    return data.Batch(torch.cat([p.images for p in parts]), torch.cat([p.instances for p in parts]),
                      torch.cat([p.present for p in parts]), torch.cat([p.count for p in parts]),
                      [c for p in parts for c in p.object_classes])


def batch_order(seed: int, steps: int, batch: int, images: int) -> torch.Tensor:
    """int64 [steps, batch]: the training images of each step, epoch after epoch in orders drawn
    from `seed` (the same for every schedule)."""
    gen = torch.Generator().manual_seed(seed)
    need = steps * batch
    epochs = [torch.randperm(images, generator=gen) for _ in range(math.ceil(need / images))]
    return torch.cat(epochs)[:need].reshape(steps, batch)


def lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    """Linear warmup to lr, then cosine decay to 0 at `steps`."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * 0.5 * (1 + math.cos(math.pi * t))


def loss_of(label_logits, count_logits, present, count) -> torch.Tensor:
    bce = torch.nn.functional.binary_cross_entropy_with_logits(label_logits.float(), present)
    ce = torch.nn.functional.cross_entropy(count_logits.float(), count - 1)
    return bce + ce


def macro_auroc(scores: torch.Tensor, present: torch.Tensor) -> float:
    """Mean over classes of the ROC AUC of `scores` [images, classes] for `present` (0/1)
    (ariadne.auroc: Mann-Whitney, ties counted half); classes that are present in every image or in
    none have no AUC and are left out (nan when no class has one)."""
    aucs = []
    for c in range(scores.shape[1]):
        s, y = scores[:, c].double().cpu().numpy(), present[:, c].bool().cpu().numpy()
        if y.any() and not y.all():
            aucs.append(ariadne.auroc(s[y].tolist(), s[~y].tolist()))
    return sum(aucs) / len(aucs) if aucs else math.nan


@torch.no_grad()
def evaluate(model: StudyViT, split: data.Batch, batch: int, autocast: bool) -> Dict[str, float]:
    """Held-out accuracy: `exact` (class set and count both right), `set` (class set right),
    `count`, `label` (per class and image), `label_auroc` (macro_auroc of the class logits: graded,
    so it separates models that the all-or-nothing `set` scores alike) and the loss."""
    model.eval()
    n = split.images.shape[0]
    totals = dict(exact=0.0, set=0.0, count=0.0, label=0.0, loss=0.0)
    logits = []
    for i in range(0, n, batch):
        imgs = split.images[i:i + batch]
        px, grids = pixel_rows(imgs, model.config)
        with torch.autocast(px.device.type, dtype=torch.bfloat16, enabled=autocast):
            lab, cnt = model(px, grids)
        present, count = split.present[i:i + batch], split.count[i:i + batch]
        set_ok = ((lab.float() > 0).float() == present).all(1)
        count_ok = cnt.float().argmax(1) + 1 == count
        totals["exact"] += float((set_ok & count_ok).sum())
        totals["set"] += float(set_ok.sum())
        totals["count"] += float(count_ok.sum())
        totals["label"] += float(((lab.float() > 0).float() == present).float().mean(1).sum())
        totals["loss"] += float(loss_of(lab, cnt, present, count)) * imgs.shape[0]
        logits.append(lab.float())
    model.train()
    out = {k: v / n for k, v in totals.items()}
    out["label_auroc"] = macro_auroc(torch.cat(logits), split.present[:n])
    return out


def run_shs_cli(cli: str, weights: Path, schedule: str, window: int, images: Path, masks: Path, backend: str,
                limit: int, out: Path, heatmap_layers: int) -> dict:
    """`ariadne shs` on images and their masks with the trained weights; its JSON summary. `out`
    receives what `ariadne shs --out` writes: received.npy per image and the heatmaps of
    `heatmap_layers` layers over the image, with the patch labels."""
    cmd = [cli, "shs", "--weights", str(weights), "--schedule", schedule, "--window", str(window),
           "--image", str(images), "--masks", str(masks), "--backend", backend,
           "--limit", str(limit), "--json", "yes", "--out", str(out), "--heatmap-layers", str(heatmap_layers)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"study: {' '.join(cmd)} failed ({r.returncode}): {r.stdout[-2000:]}{r.stderr[-2000:]}")
    return json.loads(r.stdout)


def train_one(args, schedule_name: str, seed: int, train: data.Batch, heldout: data.Batch, order: torch.Tensor,
              device: torch.device, out: Path) -> dict:
    config = study_config(args.depth, args.hidden, args.heads, args.intermediate)
    schedule = study_schedule(schedule_name, config, args.window)
    gpu = device.type == "cuda"
    torch.manual_seed(seed)
    model = StudyViT(config, schedule, data.NUM_CLASSES, data.MAX_OBJECTS, args.window, args.backend,
                     torch.bfloat16 if gpu else None, args.attention).to(device)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": other, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95))
    losses: List[float] = []
    timed_images, timed_seconds = 0, 0.0
    start = time.perf_counter()
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        idx = order[step].to(train.images.device)
        if gpu:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        px, grids = pixel_rows(train.images[idx], config)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=gpu):
            lab, cnt = model(px, grids)
        loss = loss_of(lab, cnt, train.present[idx], train.count[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        if gpu:
            torch.cuda.synchronize()
        if step >= min(3, args.steps - 1):  # the first steps pay for plans, allocations and autotuning
            timed_images += len(idx)
            timed_seconds += time.perf_counter() - t0
        losses.append(float(loss.detach()))
        if args.log_every and (step % args.log_every == 0 or step == args.steps - 1):
            print(f"[{schedule_name} seed {seed}] step {step}/{args.steps} loss {losses[-1]:.4f} "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
    train_seconds = time.perf_counter() - start
    phases = {}  # seconds of each step after training: where a run's time beyond the steps goes
    mark = [time.perf_counter()]

    def lap(name: str) -> None:
        now = time.perf_counter()
        phases[name], mark[0] = now - mark[0], now

    metrics = evaluate(model, heldout, args.batch, gpu)
    lap("evaluate")
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=gpu):
        rf = measure.receptive_field(model, heldout.images[:args.rf_images]) if args.rf_images else None
    lap("receptive_field")
    # Runs of the SDPA and FlexAttention baselines are kept apart from ariadne's: `chunk@sdpa`, `chunk@flex`.
    run = schedule_name if args.attention == "ariadne" else f"{schedule_name}@{args.attention}"
    record = dict(run=run, schedule_name=schedule_name, seed=seed, attention=args.attention, steps=args.steps,
                  batch=args.batch, side=args.size,
                  classes=data.NUM_CLASSES, max_count=data.MAX_OBJECTS, train_images=args.train_images,
                  eval_seed=args.eval_seed, eval_images=args.eval_images, device=str(device),
                  heldout=metrics, loss_first=losses[0], loss_last=sum(losses[-10:]) / len(losses[-10:]),
                  images_per_s=timed_images / timed_seconds if timed_seconds else None,
                  train_seconds=train_seconds, receptive_field=rf,
                  settings=study_settings(args))
    run_dir = out / "runs" / record["run"] / f"seed{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    weights = run_dir / "model.safetensors"
    checkpoint.save(weights, model, record, args.save_dtype)
    lap("save")
    if args.shs_cli:
        keys = ("shs_index", "per_layer", "fg_dominant_share", "attention_distance", "entropy", "sink_allocation",
                "images_scored")
        summary = run_shs_cli(args.shs_cli, weights, schedule.letters(), args.window, out / "heldout" / "images",
                              out / "heldout" / "masks", args.shs_backend, args.shs_images, run_dir / "shs",
                              args.heatmap_layers)
        (run_dir / "shs.json").write_text(json.dumps(summary, indent=1))
        record["shs"] = {k: summary.get(k) for k in keys}
        record["shs_index"] = summary.get("shs_index")
        if args.ood_images:  # real photos the model never saw: do its heads still split FG from BG?
            ood = run_shs_cli(args.shs_cli, weights, schedule.letters(), args.window, Path(args.ood_images),
                              Path(args.ood_masks), args.shs_backend, args.shs_images, run_dir / "shs_ood",
                              args.heatmap_layers)
            (run_dir / "shs_ood.json").write_text(json.dumps(ood, indent=1))
            record["shs_ood"] = {k: ood.get(k) for k in keys}
        lap("shs")
    record["phase_seconds"] = phases
    print(f"[{schedule_name} seed {seed}] train {train_seconds:.0f} s, then " +
          ", ".join(f"{k} {v:.1f} s" for k, v in phases.items()), flush=True)
    (run_dir / "metrics.json").write_text(json.dumps(dict(record, losses=losses), indent=1))
    return record


def study_settings(args) -> dict:
    """What must be equal for two runs to be compared: all but the schedule, seed and attention path."""
    keys = ("steps", "batch", "size", "depth", "hidden", "heads", "intermediate", "window", "lr", "warmup",
            "weight_decay", "clip", "train_images", "eval_images", "eval_seed", "backend", "shs_images")
    return {k: getattr(args, k) for k in keys}


def collect(out: Path, settings: dict) -> List[dict]:
    """The records of every run under out/runs made with `settings`, in name and seed order."""
    found = []
    for path in sorted((out / "runs").glob("*/seed*/metrics.json")):
        r = json.loads(path.read_text())
        if r.get("settings") == settings:
            r.pop("losses", None)
            found.append(r)
    return sorted(found, key=lambda r: (r["run"], r["seed"]))


def summarize(records: Sequence[dict]) -> Dict[str, dict]:
    """Per run name (schedule, or schedule@sdpa): mean and sample standard deviation over seeds of
    each measured number."""
    by: Dict[str, List[dict]] = {}
    for r in records:
        by.setdefault(r["run"], []).append(r)
    out = {}
    for name, rs in by.items():
        values = {"exact": [r["heldout"]["exact"] for r in rs], "set": [r["heldout"]["set"] for r in rs],
                  "count": [r["heldout"]["count"] for r in rs], "loss_last": [r["loss_last"] for r in rs]}
        for key in ("label_auroc", "loss"):  # absent from records written before they were measured
            if all(key in r["heldout"] for r in rs):
                values["heldout_" + key] = [r["heldout"][key] for r in rs]
        if all(r.get("receptive_field") for r in rs):
            values["erf"] = [r["receptive_field"]["erf"] for r in rs]
            values["erf_distance_px"] = [r["receptive_field"]["distance_px"] for r in rs]
        if all(r.get("images_per_s") for r in rs):
            values["images_per_s"] = [r["images_per_s"] for r in rs]
        if all(r.get("shs_index") is not None for r in rs):
            values["shs_index"] = [r["shs_index"] for r in rs]
            shs = [r["shs"] for r in rs]
            values["fg_dominant_share"] = [x["fg_dominant_share"] for x in shs]
            values["attention_distance_px"] = [x["attention_distance"]["pixels"] for x in shs]
            values["entropy"] = [x["entropy"]["mean"] for x in shs]
            if all(r.get("shs_ood") for r in rs):
                values["shs_ood_index"] = [r["shs_ood"]["shs_index"] for r in rs]
            if all((x.get("sink_allocation") or {}).get("bg_heavier_head_share") is not None for x in shs):
                values["sink_bg_heavier_share"] = [x["sink_allocation"]["bg_heavier_head_share"] for x in shs]
        out[name] = {k: dict(mean=statistics.fmean(v), std=statistics.stdev(v) if len(v) > 1 else 0.0, n=len(v))
                     for k, v in values.items()}
        if all(r.get("shs") for r in rs):  # per-layer SHS-Index, mean over seeds
            layers = [r["shs"]["per_layer"] for r in rs]
            out[name]["shs_per_layer"] = [statistics.fmean(col) for col in zip(*layers)]
    return out


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ariadne.study",
                                description="Train the study's ViT under attention schedules (docs/study.md)")
    p.add_argument("--schedules", default="full,chunk,swa1d+sink,ariadne",
                   help=f"comma list of {', '.join(SCHEDULES)} or short-syntax schedules of --depth layers")
    p.add_argument("--seeds", default="0,1,2", help="comma list of seeds (model init, training split, data order)")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--size", type=int, default=448, help="image side in pixels (multiple of 28; 224 for smoke runs)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    p.add_argument("--depth", type=int, default=8)
    p.add_argument("--hidden", type=int, default=320)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=None, help="MLP width (default about 8/3 hidden)")
    p.add_argument("--window", type=int, default=64, help="half-width of the window layers, in tokens")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=None, help="warmup steps (default 5%% of --steps)")
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--clip", type=float, default=1.0, help="gradient-norm clip")
    p.add_argument("--train-images", type=int, default=20000, help="training split size (cycled)")
    p.add_argument("--eval-images", type=int, default=1000)
    p.add_argument("--eval-seed", type=int, default=1_000_000,
                   help="the held-out split (no training seed may equal it)")
    p.add_argument("--backend", default="auto", help="ariadne attention backend: auto, cpu, reference, cuda")
    p.add_argument("--attention", default="ariadne", choices=["ariadne", "sdpa", "flex"],
                   help="ariadne's op, or torch SDPA with dense masks, or FlexAttention with their block masks "
                        "(the throughput baselines)")
    p.add_argument("--save-dtype", default="F32", choices=["F32", "BF16"])
    p.add_argument("--out", default="study-out")
    p.add_argument("--shs-cli", default=None, help="a built `ariadne` CLI: run `ariadne shs` on each checkpoint")
    p.add_argument("--shs-images", type=int, default=64, help="held-out images written for and scored by shs")
    p.add_argument("--shs-backend", default=None,
                   help="encoder backend of `ariadne shs` (cpu, cuda, reference; default cuda with a CUDA --device)")
    p.add_argument("--ood-images", default=None,
                   help="images of an out-of-distribution SHS probe (with --ood-masks and --shs-cli), e.g. "
                        "labelme's VOC photos (docs/study.md)")
    p.add_argument("--ood-masks", default=None, help="their label maps (<stem>.png or .npy)")
    p.add_argument("--rf-images", type=int, default=16,
                   help="held-out images of the receptive-field measurement on the trained model (0: none)")
    p.add_argument("--heatmap-layers", type=int, default=4, help="layers with `ariadne shs` heatmaps per run")
    p.add_argument("--threads", type=int, default=None, help="CPU threads of torch and of ariadne's CPU backend")
    p.add_argument("--log-every", type=int, default=50)
    args = p.parse_args(argv)
    if args.warmup is None:
        args.warmup = max(1, args.steps // 20)
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
        ariadne.set_cpu_threads(args.threads)
    device = _device(args.device)
    if args.shs_backend is None:
        args.shs_backend = "cuda" if device.type == "cuda" else "cpu"
    seeds = [int(s) for s in args.seeds.split(",") if s]
    schedules = [s for s in args.schedules.split(",") if s]
    if bool(args.ood_images) != bool(args.ood_masks):
        raise SystemExit("study: --ood-images and --ood-masks go together")
    if args.eval_seed in seeds:
        raise SystemExit(f"study: --eval-seed {args.eval_seed} is also a training seed; held-out data must differ")
    for name in schedules:  # fail before any training on a schedule that does not resolve
        study_schedule(name, study_config(args.depth, args.hidden, args.heads, args.intermediate), args.window)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"study: {len(schedules)} schedules x {len(seeds)} seeds, {args.steps} steps of {args.batch} images "
          f"{args.size}px on {device}", flush=True)
    t0 = time.perf_counter()
    heldout = render_split(args.eval_seed, args.eval_images, args.size, device)
    data.write_split(out / "heldout", args.eval_seed, min(args.shs_images, args.eval_images), args.size, device)
    records = []
    for seed in seeds:
        train = render_split(seed, args.train_images, args.size, device, masks=False)
        print(f"study: split {seed} rendered ({args.train_images} images), {time.perf_counter() - t0:.1f} s "
              "since start", flush=True)
        order = batch_order(seed, args.steps, args.batch, args.train_images)
        for name in schedules:
            records.append(train_one(args, name, seed, train, heldout, order, device, out))
            r = records[-1]
            print(f"[{name} seed {seed}] held-out exact {r['heldout']['exact']:.3f} set {r['heldout']['set']:.3f} "
                  f"count {r['heldout']['count']:.3f} class AUROC {r['heldout']['label_auroc']:.3f} "
                  f"loss {r['heldout']['loss']:.3f}", flush=True)
        del train
    # Earlier calls with the same settings into the same folder (other schedules, the SDPA baseline)
    # join the summary: a study may be run in parts.
    records = collect(out, study_settings(args))
    results = dict(args=vars(args), runs=records, summary=summarize(records))
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "results.md").write_text(report.render(results))
    report.write_pictures(results, out)
    print(report.render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
