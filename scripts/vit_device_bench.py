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
     weights (--repeat; the median of the runs after the first, GPU time from the patch embed to the
     merger, as HF's is timed with its input already on the GPU; --stage-times 0, and at batch 1 a
     second call with per-stage events for the breakdown), and checks the chunk schedule's
     output against HF's (bf16: relative L2 <= 2e-2). full and ariadne differ from HF's windowed
     tower by design; their outputs are compared to HF only for information. At batch 1, chunk and
     ariadne run again with --cuda-order gather (token gathers instead of the kernel's fused order).
  5. At the smallest side, batch 1: HF's tower in fp32 on the same weights, so that the bf16 error of
     HF and of ariadne against fp32 are both on record.
  6. Writes results.json and a markdown table to --out; speed figures are ratios against HF sdpa
     measured in the same run. --budget-s stops starting new cases when the time is spent (the
     cases run smallest first).
"""
import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import save_file
from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

try:  # transformers >= 5.x with per-backend processors; older ones: the encoder's own pixel rows
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
except ImportError:
    Qwen2VLImageProcessorPil = None

SIDES = (448, 896, 1792)
SCHEDULES = ("full", "chunk", "ariadne")
# The 3B/7B vision tower; --smoke swaps in a tiny one (same layout, 32 layers kept for the schedules).
TOWER = {"depth": 32, "hidden_size": 1280, "num_heads": 16, "intermediate_size": 3420, "out_hidden_size": 2048}
SMOKE_TOWER = {"depth": 32, "hidden_size": 64, "num_heads": 1, "intermediate_size": 96, "out_hidden_size": 32}
SMOKE = False  # --smoke: the script's own logic on the CPU (ariadne --backend cpu, fp32 tower)


def qwen_config(attn: str) -> Qwen2_5_VLVisionConfig:
    cfg = Qwen2_5_VLVisionConfig(**(SMOKE_TOWER if SMOKE else TOWER), patch_size=14, spatial_merge_size=2,
                                 temporal_patch_size=2, window_size=112, fullatt_block_indexes=[7, 15, 23, 31],
                                 in_channels=3, hidden_act="silu")
    cfg._attn_implementation = attn
    return cfg


def init_weights(model: torch.nn.Module, seed: int) -> None:
    """uniform(±1/sqrt(fan_in)) weights and biases, norms 1 ± 0.1 (as random_vit_weights in C++)."""
    dev = next(model.parameters()).device
    gen = torch.Generator(device=dev).manual_seed(seed)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, p in params.items():
            if p.dim() == 1 and ("norm" in name or "ln_q" in name):
                v = 1 + 0.1 * (2 * torch.rand(p.shape, generator=gen, device=dev) - 1)
            else:
                w = p if p.dim() > 1 else params[name.rsplit(".", 1)[0] + ".weight"]
                v = (2 * torch.rand(p.shape, generator=gen, device=dev) - 1) / math.sqrt(w.shape[1:].numel())
            p.copy_(v.to(p.dtype))


def make_image(side: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:side, 0:side].astype(np.float64)
    rgb = np.stack([128 + 100 * np.sin(x / 23.0) * np.cos(y / 31.0), 255 * x / side, 255 * (y / side) ** 2], -1)
    rgb += rng.normal(0, 12, rgb.shape)
    return Image.fromarray(np.clip(np.rint(rgb), 0, 255).astype(np.uint8), "RGB")


def forward(model, pixel_values, grid_thw):
    out = model(hidden_states=pixel_values, grid_thw=grid_thw)
    return out.pooler_output if hasattr(out, "pooler_output") else out  # 4.x returned the tensor


def time_hf(model, pixel_values, grid_thw, warmup: int, iters: int):
    with torch.no_grad():
        for _ in range(warmup):
            out = forward(model, pixel_values, grid_thw)
        if SMOKE:
            times = []
            for _ in range(iters):
                t = time.perf_counter()
                out = forward(model, pixel_values, grid_thw)
                times.append(1e3 * (time.perf_counter() - t))
            return statistics.median(times), out.float().cpu()
        torch.cuda.synchronize()
        times = []
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = forward(model, pixel_values, grid_thw)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
    return statistics.median(times), out.float().cpu()


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def run_ariadne(binary: str, images, weights: Path, orders, repeat: int, prefix: Path, pixels: Path,
                stage_times: bool):
    """One CLI call: every schedule × token order on the same loaded weights and pixel rows.
    Returns {"chunk": (json, output), "chunk/gather": ...} or {"error": message}."""
    cmd = [binary, "encode", "--image", ",".join(str(i) for i in images), "--weights", str(weights),
           "--config", "qwen2.5-vl", "--schedule", ",".join(SCHEDULES), "--backend", "cpu" if SMOKE else "cuda",
           "--repeat", str(repeat), "--cuda-order", ",".join(orders), "--save-output", str(prefix),
           "--save-pixels", str(pixels), "--stage-times", str(int(stage_times)), "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return {"error": p.stderr.strip() or f"exit {p.returncode}"}
    runs = json.loads(p.stdout)["runs"]
    res = {}
    for r in runs:
        key = r["schedule"] if r["cuda_order"] == "fused" else f"{r['schedule']}/{r['cuda_order']}"
        f_out = Path(f"{prefix}{r['schedule']}_{r['cuda_order']}.safetensors")
        with safe_open(str(f_out), "pt") as f:
            output = f.get_tensor("output")
        f_out.unlink()
        res[key] = (r, output)
    return res


def steady_ms(res) -> float:
    """Median of the encodes after the first (which pays cuBLASLt's plan search and allocations)."""
    totals = res["encode_totals_ms"]
    return statistics.median(totals[1:] if len(totals) > 1 else totals)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ariadne", default="build/ariadne", help="path of the ariadne CLI built with CUDA")
    ap.add_argument("--out", default="vit_bench", help="output folder")
    ap.add_argument("--sides", default=",".join(map(str, SIDES)))
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--iters", type=int, default=10, help="HF timed runs (half at the largest side)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=6, help="ariadne encodes per CLI call (first one not counted)")
    ap.add_argument("--budget-s", type=float, default=1e9, help="start no new case after this many seconds")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--smoke", action="store_true", help="tiny tower on the CPU: checks this script, times nothing")
    args = ap.parse_args()
    global SMOKE
    SMOKE = args.smoke
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    assert SMOKE or torch.cuda.is_available(), "this script runs on the GPU machine"
    dev = torch.device("cpu" if SMOKE else "cuda")
    dtype = torch.float32 if SMOKE else torch.bfloat16

    with torch.device(dev):  # built and initialized on the GPU: seconds instead of a minute on the CPU
        base = Qwen2_5_VisionTransformerPretrainedModel(qwen_config("sdpa")).to(dtype)
    init_weights(base, args.seed)
    base.eval()
    state = {k: v.detach().contiguous().cpu() for k, v in base.state_dict().items()}
    weights = out / "weights.safetensors"
    vc = {**(SMOKE_TOWER if SMOKE else TOWER), "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 112,
          "fullatt_block_indexes": [7, 15, 23, 31], "rope_theta": 10000.0}
    save_file({"visual." + k: v for k, v in state.items()}, str(weights),
              metadata={"format": "pt", "vision_config": json.dumps(vc)})

    versions = {"torch": torch.__version__, "cuda": torch.version.cuda,
                "gpu": "cpu (smoke)" if SMOKE else torch.cuda.get_device_name(0),
                "transformers": __import__("transformers").__version__}
    try:
        import flash_attn  # noqa: F401
        versions["flash_attn"] = flash_attn.__version__
    except ImportError:
        versions["flash_attn"] = None
    print(json.dumps(versions), flush=True)
    backends = {}
    for attn in ("sdpa", "flash_attention_2"):
        if attn == "flash_attention_2" and versions["flash_attn"] is None:
            print("HF flash_attention_2: flash_attn is not installed; sdpa only", file=sys.stderr)
            backends[attn] = None
            continue
        if attn == "sdpa":
            backends[attn] = base
            continue
        try:
            with torch.device(dev):
                m = Qwen2_5_VisionTransformerPretrainedModel(qwen_config(attn)).to(torch.bfloat16)
            m.load_state_dict(state)
            backends[attn] = m.eval()
        except Exception as e:  # unsupported here
            print(f"HF {attn}: unavailable ({e})", file=sys.stderr)
            backends[attn] = None

    proc = Qwen2VLImageProcessorPil(min_pixels=3136, max_pixels=12845056) if Qwen2VLImageProcessorPil else None
    rows = []
    t0 = time.time()
    for side in map(int, args.sides.split(",")):
        img_path = out / f"image_{side}.png"
        make_image(side, args.seed + side).save(img_path)
        for batch in map(int, args.batches.split(",")):
            if time.time() - t0 > args.budget_s:
                print(f"budget spent: side {side} batch {batch} not run", flush=True)
                rows.append({"side": side, "batch": batch, "skipped": "time budget"})
                continue
            images = [Image.open(img_path).convert("RGB")] * batch
            row = {"side": side, "batch": batch, "hf": {}, "ariadne": {}}
            orders = ["fused", "gather"] if batch == 1 else ["fused"]
            pix_file = out / "pixels.safetensors"
            # Totals without per-stage events; at batch 1 a second call with them gives the breakdown.
            ours = run_ariadne(args.ariadne, [img_path] * batch, weights, orders, args.repeat, out / "o_", pix_file,
                               False)
            staged = (run_ariadne(args.ariadne, [img_path] * batch, weights, ["fused"], 3, out / "s_", pix_file, True)
                      if batch == 1 and "error" not in ours else {})
            if "error" in ours or "error" in staged:
                ours = ours if "error" in ours else staged
                print(json.dumps({"side": side, "batch": batch, "error": ours["error"]}), flush=True)
                row["error"] = ours["error"]
                rows.append(row)
                continue
            # The encoder's own pixel rows (bit-identical to HF's PIL processor, docs/encoder.md)
            # feed HF when this transformers has no PIL-backend processor.
            with safe_open(str(pix_file), "pt") as f:
                own_pv, own_thw = f.get_tensor("pixel_values"), f.get_tensor("grid_thw").to(torch.int64)
            pix_file.unlink()
            if proc is not None:
                enc = proc(images=images, return_tensors="pt")
                pv, thw = enc["pixel_values"], enc["image_grid_thw"]
                row["pixels_vs_hf_processor_max_abs"] = float((own_pv - pv.float()).abs().max())
            else:
                pv, thw = own_pv, own_thw
                row["pixels"] = "ariadne preprocess (no PIL-backend HF processor in this transformers)"
            pv = pv.to(dev, dtype)
            thw = thw.to(dev)
            row["tokens"] = int(pv.shape[0])
            hf_ref = None
            for attn, m in backends.items():
                if m is None:
                    row["hf"][attn] = {"error": "unavailable"}
                    continue
                it = args.iters if side < 1792 else max(3, args.iters // 2)
                ms, o = time_hf(m, pv, thw, args.warmup, it)
                row["hf"][attn] = {"ms": ms, "iters": it}
                if attn == "sdpa":
                    hf_ref = o
            if side == min(map(int, args.sides.split(","))) and batch == 1:
                # fp32 HF on the same (bf16-valued) weights: the error both bf16 towers make.
                with torch.device(dev):
                    m32 = Qwen2_5_VisionTransformerPretrainedModel(qwen_config("sdpa")).to(torch.float32)
                m32.load_state_dict({k: v.float() for k, v in state.items()})
                m32.eval()
                with torch.no_grad():
                    ref32 = forward(m32, pv.float(), thw).float().cpu()
                del m32
                row["hf_bf16_vs_fp32"] = rel_l2(hf_ref, ref32)
            for key, (res, o) in ours.items():
                sched = key.split("/")[0]
                entry = {"ms": steady_ms(res), "best_ms": res["times_ms"]["encode_total"],
                         "totals_ms": res["encode_totals_ms"], "times_ms": res["times_ms"],
                         "order_changes": res["order_changes"], "attention_backend": res["attention_backend"]}
                if hf_ref is not None:
                    entry["rel_l2_vs_hf_sdpa"] = rel_l2(o.float(), hf_ref)
                    if sched == "chunk":
                        entry["parity_ok"] = entry["rel_l2_vs_hf_sdpa"] <= 2e-2
                if "hf_bf16_vs_fp32" in row and key == "chunk":
                    row["ariadne_chunk_bf16_vs_fp32"] = rel_l2(o.float(), ref32)
                if key in staged:
                    entry["staged_times_ms"] = staged[key][0]["times_ms"]
                    entry["staged_totals_ms"] = staged[key][0]["encode_totals_ms"]
                row["ariadne"][key] = entry
            rows.append(row)
            print(json.dumps(row), flush=True)
            (out / "results.json").write_text(json.dumps({"versions": versions, "rows": rows}, indent=2))

    (out / "results.json").write_text(json.dumps({"versions": versions, "rows": rows}, indent=2))
    lines = ["| side | batch | tokens | HF sdpa ms | HF flash ms | full ms | chunk ms | ariadne ms | chunk gather ms | "
             "ariadne gather ms | ariadne vs full | ariadne vs chunk | HF sdpa / full | chunk rel L2 vs HF |",
             "|" + "---|" * 14]

    def ms(d):
        return f"{d['ms']:.2f}" if "ms" in d else "n/a"

    def change(a, b):
        return f"{100 * (a['ms'] / b['ms'] - 1):+.1f}%" if "ms" in a and "ms" in b else "n/a"

    for r in rows:
        if "skipped" in r:
            continue
        a = r["ariadne"]
        g = {k: a.get(k, {}) for k in ("full", "chunk", "ariadne", "chunk/gather", "ariadne/gather")}
        hf = r["hf"].get("sdpa", {})
        vs_hf = f"{hf['ms'] / g['full']['ms']:.2f}x" if "ms" in hf and "ms" in g["full"] else "n/a"
        par = g["chunk"].get("rel_l2_vs_hf_sdpa")
        lines.append(f"| {r['side']} | {r['batch']} | {r['tokens']} | {ms(hf)} | "
                     f"{ms(r['hf'].get('flash_attention_2', {}))} | {ms(g['full'])} | {ms(g['chunk'])} | "
                     f"{ms(g['ariadne'])} | {ms(g['chunk/gather'])} | {ms(g['ariadne/gather'])} | "
                     f"{change(g['ariadne'], g['full'])} | {change(g['ariadne'], g['chunk'])} | {vs_hf} | "
                     f"{'n/a' if par is None else f'{par:.2e}'} |")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
