#!/usr/bin/env python3
"""CPU fp32 parity of `ariadne encode` with HF transformers at the real Qwen2.5-VL-3B tower shape.

Not run by CI (HF's tower takes about a minute here); tests/cpu/test_vit.cpp covers the small
shape on every run. This one checks what the small shape cannot: head_dim 80 (RoPE over 40
frequencies), 112-px windows with padding (a 18×22 grid: 9×11 merge units, 3×3 windows), 32 layers,
f32 weights under the `visual.` prefix with no metadata, two images of different sizes, and our
preprocessing (HF runs its own PIL-backend processor on the same PNG files).

    /work/venv-hf/bin/python scripts/vit_parity_qwen_cpu.py --ariadne build/ariadne [--out /tmp/vit-qwen]
Prints the relative L2 error of our output against HF's and exits non-zero above 1e-5.
"""
import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import torch
from PIL import Image
from safetensors.torch import load_file, save_file
from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_vit_reference import make_image  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ariadne", default="build/ariadne")
    ap.add_argument("--out", default="/tmp/vit-qwen-parity")
    ap.add_argument("--schedule", default="chunk", help="chunk is HF's tower; nothing else matches it")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    cfg = Qwen2_5_VLVisionConfig(depth=32, hidden_size=1280, num_heads=16, intermediate_size=3420,
                                 out_hidden_size=2048, patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
                                 window_size=112, fullatt_block_indexes=[7, 15, 23, 31])
    cfg._attn_implementation = "eager"
    model = Qwen2_5_VisionTransformerPretrainedModel(cfg).float().eval()
    gen = torch.Generator().manual_seed(3)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, p in params.items():
            if p.dim() == 1 and ("norm" in name or "ln_q" in name):
                p.copy_(1 + 0.1 * (2 * torch.rand(p.shape, generator=gen) - 1))
            else:
                w = p if p.dim() > 1 else params[name.rsplit(".", 1)[0] + ".weight"]
                p.copy_((2 * torch.rand(p.shape, generator=gen) - 1) / math.sqrt(w.shape[1:].numel()))
    weights = out / "weights.safetensors"
    save_file({"visual." + k: v.contiguous() for k, v in model.state_dict().items()}, str(weights))

    paths = [out / "image_0.png", out / "image_1.png"]
    make_image(250, 310, 1).save(paths[0])  # -> 252×308, grid 18×22
    make_image(130, 120, 2).save(paths[1])  # -> 140×112, grid 10×8
    batch = Qwen2VLImageProcessorPil()(images=[Image.open(p).convert("RGB") for p in paths], return_tensors="pt")
    with torch.no_grad():
        hf = model(hidden_states=batch["pixel_values"], grid_thw=batch["image_grid_thw"]).pooler_output.double()

    ours_file = out / "ours.safetensors"
    cmd = [args.ariadne, "encode", "--image", ",".join(map(str, paths)), "--weights", str(weights), "--config",
           "qwen2.5-vl", "--schedule", args.schedule, "--backend", "reference", "--save-output", str(ours_file),
           "--json"]
    res = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    ours = load_file(str(ours_file))["output"].double()
    rel = float((ours - hf).norm() / hf.norm())
    print(json.dumps({"grids": batch["image_grid_thw"].tolist(), "tokens": res["tokens"],
                      "output_shape": res["output_shape"], "rel_l2": rel,
                      "max_abs": float((ours - hf).abs().max()), "encode_ms": res["times_ms"]["encode_total"]}))
    sys.exit(0 if rel <= 1e-5 else 1)


if __name__ == "__main__":
    main()
