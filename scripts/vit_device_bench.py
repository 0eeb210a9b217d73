#!/usr/bin/env python3
"""Device-side parity and timing of the vision encoder against HF transformers (issue 7).

Run on the GPU machine, from the repository root, after building the CLI with CUDA:
    python3 scripts/vit_device_bench.py --ariadne build/ariadne --out vit_bench
Needs torch (CUDA), transformers, safetensors, pillow, numpy; flash-attn is optional (its rows are
skipped, and say so, when it is missing).

What it does, all with the same random Qwen2.5-VL-3B-shaped tower (bf16 weights, seeded):
  1. Builds HF's Qwen2_5_VisionTransformerPretrainedModel from a Qwen2.5-VL vision config and saves
     its weights as safetensors (prefix `visual.`, metadata `vision_config`).
  2. Writes a deterministic test image per side (448, 896, 1792 px squares) and gets HF's
     pixel_values / grid_thw from the PIL-backend image processor.
  3. Times HF's tower (sdpa, flash_attention_2) with CUDA events: warm-up, then the median of
     --iters runs, batch 1 and batch 4 (four copies of the image).
  4. Times `ariadne encode --backend cuda --schedule {full,chunk,ariadne}` on the same image and
     weights (--repeat; the CLI reports its fastest run and per-stage times), and checks the chunk
     schedule's output against HF's (bf16: relative L2 <= 2e-2). full and ariadne differ from HF's
     windowed tower by design; their outputs are compared to HF only for information.
  5. Writes results.json and a markdown table to --out; speed figures are ratios against HF sdpa
     measured in the same run.
"""
import argparse
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import save_file
from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

SIDES = (448, 896, 1792)
SCHEDULES = ("full", "chunk", "ariadne")


def qwen_config(attn: str) -> Qwen2_5_VLVisionConfig:
    cfg = Qwen2_5_VLVisionConfig(depth=32, hidden_size=1280, num_heads=16, intermediate_size=3420,
                                 out_hidden_size=2048, patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
                                 window_size=112, fullatt_block_indexes=[7, 15, 23, 31], in_channels=3,
                                 hidden_act="silu")
    cfg._attn_implementation = attn
    return cfg


def init_weights(model: torch.nn.Module, seed: int) -> None:
    """uniform(±1/sqrt(fan_in)) weights and biases, norms 1 ± 0.1 (as random_vit_weights in C++)."""
    gen = torch.Generator().manual_seed(seed)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, p in params.items():
            if p.dim() == 1 and ("norm" in name or "ln_q" in name):
                v = 1 + 0.1 * (2 * torch.rand(p.shape, generator=gen) - 1)
            else:
                w = p if p.dim() > 1 else params[name.rsplit(".", 1)[0] + ".weight"]
                v = (2 * torch.rand(p.shape, generator=gen) - 1) / math.sqrt(w.shape[1:].numel())
            p.copy_(v.to(p.dtype))


def make_image(side: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:side, 0:side].astype(np.float64)
    rgb = np.stack([128 + 100 * np.sin(x / 23.0) * np.cos(y / 31.0), 255 * x / side, 255 * (y / side) ** 2], -1)
    rgb += rng.normal(0, 12, rgb.shape)
    return Image.fromarray(np.clip(np.rint(rgb), 0, 255).astype(np.uint8), "RGB")


def time_hf(model, pixel_values, grid_thw, warmup: int, iters: int):
    with torch.no_grad():
        for _ in range(warmup):
            out = model(hidden_states=pixel_values, grid_thw=grid_thw).pooler_output
        torch.cuda.synchronize()
        times = []
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = model(hidden_states=pixel_values, grid_thw=grid_thw).pooler_output
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
    return statistics.median(times), out.float().cpu()


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def run_ariadne(binary: str, images, weights: Path, schedule: str, repeat: int, out: Path):
    cmd = [binary, "encode", "--image", ",".join(str(i) for i in images), "--weights", str(weights),
           "--config", "qwen2.5-vl", "--schedule", schedule, "--backend", "cuda", "--repeat", str(repeat),
           "--save-output", str(out), "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return {"error": p.stderr.strip() or f"exit {p.returncode}"}, None
    res = json.loads(p.stdout)
    with safe_open(str(out), "pt") as f:
        output = f.get_tensor("output")
    return res, output


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ariadne", default="build/ariadne", help="path of the ariadne CLI built with CUDA")
    ap.add_argument("--out", default="vit_bench", help="output folder")
    ap.add_argument("--sides", default=",".join(map(str, SIDES)))
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    assert torch.cuda.is_available(), "this script runs on the GPU machine"
    dev = torch.device("cuda")

    base = Qwen2_5_VisionTransformerPretrainedModel(qwen_config("sdpa")).to(torch.bfloat16)
    init_weights(base, args.seed)
    state = {k: v.detach().contiguous() for k, v in base.state_dict().items()}
    weights = out / "weights.safetensors"
    vc = {"depth": 32, "hidden_size": 1280, "num_heads": 16, "intermediate_size": 3420, "out_hidden_size": 2048,
          "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 112,
          "fullatt_block_indexes": [7, 15, 23, 31], "rope_theta": 10000.0}
    save_file({"visual." + k: v for k, v in state.items()}, str(weights),
              metadata={"format": "pt", "vision_config": json.dumps(vc)})

    backends = {}
    for attn in ("sdpa", "flash_attention_2"):
        try:
            m = Qwen2_5_VisionTransformerPretrainedModel(qwen_config(attn)).to(torch.bfloat16)
            m.load_state_dict(state)
            backends[attn] = m.to(dev).eval()
        except Exception as e:  # flash-attn not installed, or unsupported
            print(f"HF {attn}: unavailable ({e})", file=sys.stderr)
            backends[attn] = None

    proc = Qwen2VLImageProcessorPil(min_pixels=3136, max_pixels=12845056)
    rows = []
    for side in map(int, args.sides.split(",")):
        img_path = out / f"image_{side}.png"
        make_image(side, args.seed + side).save(img_path)
        for batch in map(int, args.batches.split(",")):
            images = [Image.open(img_path).convert("RGB")] * batch
            enc = proc(images=images, return_tensors="pt")
            pv = enc["pixel_values"].to(dev, torch.bfloat16)
            thw = enc["image_grid_thw"].to(dev)
            row = {"side": side, "batch": batch, "tokens": int(pv.shape[0]), "hf": {}, "ariadne": {}}
            hf_ref = None
            for attn, m in backends.items():
                if m is None:
                    row["hf"][attn] = {"error": "unavailable"}
                    continue
                ms, o = time_hf(m, pv, thw, args.warmup, args.iters)
                row["hf"][attn] = {"ms": ms}
                if attn == "sdpa":
                    hf_ref = o
            for sched in SCHEDULES:
                res, o = run_ariadne(args.ariadne, [img_path] * batch, weights, sched, args.iters,
                                     out / f"out_{side}_{batch}_{sched}.safetensors")
                entry = {"error": res["error"]} if "error" in res else {
                    "ms": res["times_ms"]["encode_total"], "times_ms": res["times_ms"],
                    "order_changes": res["order_changes"]}
                if o is not None and hf_ref is not None:
                    entry["rel_l2_vs_hf_sdpa"] = rel_l2(o.float(), hf_ref)
                    if sched == "chunk":
                        entry["parity_ok"] = entry["rel_l2_vs_hf_sdpa"] <= 2e-2
                row["ariadne"][sched] = entry
            rows.append(row)
            print(json.dumps(row), flush=True)

    (out / "results.json").write_text(json.dumps(rows, indent=2))
    lines = ["| side | batch | tokens | HF sdpa ms | HF flash ms | full ms | chunk ms | ariadne ms | "
             "ariadne vs chunk | chunk rel L2 vs HF |", "|" + "---|" * 10]
    for r in rows:
        def ms(d):
            return f"{d['ms']:.1f}" if "ms" in d else "n/a"
        a = r["ariadne"]
        ratio = (f"{100 * (a['ariadne']['ms'] / a['chunk']['ms'] - 1):+.1f}%"
                 if "ms" in a.get("ariadne", {}) and "ms" in a.get("chunk", {}) else "n/a")
        par = a.get("chunk", {}).get("rel_l2_vs_hf_sdpa")
        lines.append(f"| {r['side']} | {r['batch']} | {r['tokens']} | {ms(r['hf']['sdpa'])} | "
                     f"{ms(r['hf']['flash_attention_2'])} | {ms(a['full'])} | {ms(a['chunk'])} | {ms(a['ariadne'])} | "
                     f"{ratio} | {'n/a' if par is None else f'{par:.2e}'} |")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
