#!/usr/bin/env python3
"""Makes the CPU parity reference of the vision encoder with HF transformers (CPU, fp32).

Builds a small random Qwen2.5-VL vision tower (the `small` config of include/ariadne/vit.hpp:
depth 4, hidden 32, 2 heads, intermediate 64, out 32, full layers [1, 3], window 56 px, patch 14,
merge 2, temporal 2), saves its weights (bf16 values, so the file is small; the model runs in fp32
on exactly those values) under the `model.visual.` prefix, writes two deterministic test images,
runs HF's PIL-backend Qwen2-VL image processor on them and the tower on the resulting batch, and
saves pixel_values, grid_thw and the tower's merged output.

Needs torch, transformers, safetensors, pillow, numpy in a virtual environment outside the repo:
    python3 -m venv /work/venv-hf && /work/venv-hf/bin/pip install torch transformers safetensors pillow numpy
    /work/venv-hf/bin/python scripts/make_vit_reference.py tests/data/vit
tests/cpu/test_vit.cpp checks our encoder against the files (relative error <= 1e-5).
"""
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file
from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

SEED = 20261129


def make_image(height: int, width: int, seed: int) -> Image.Image:
    """Smooth colour gradients plus a little seeded noise: resizing has real work to do."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    r = 128 + 100 * np.sin(x / 7.0) * np.cos(y / 11.0)
    g = 255 * x / max(width - 1, 1)
    b = 255 * (y / max(height - 1, 1)) ** 2
    rgb = np.stack([r, g, b], axis=-1) + rng.normal(0, 12, (height, width, 3))
    return Image.fromarray(np.clip(np.rint(rgb), 0, 255).astype(np.uint8), "RGB")


def init_weights(model: torch.nn.Module, seed: int) -> None:
    """PyTorch-Linear-like uniform(±1/sqrt(fan_in)) weights and biases, norms 1 ± 0.1; rounded to bf16."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and ("norm" in name or "ln_q" in name):
                v = 1 + 0.1 * (2 * torch.rand(p.shape, generator=gen) - 1)
            else:
                fan_in = p.shape[1:].numel() if p.dim() > 1 else model_fan_in(model, name)
                v = (2 * torch.rand(p.shape, generator=gen) - 1) / math.sqrt(fan_in)
            p.copy_(v.to(torch.bfloat16).to(torch.float32))


def model_fan_in(model: torch.nn.Module, bias_name: str) -> int:
    weight = dict(model.named_parameters())[bias_name.rsplit(".", 1)[0] + ".weight"]
    return weight.shape[1:].numel()


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/data/vit")
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(SEED)
    cfg = Qwen2_5_VLVisionConfig(depth=4, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=32,
                                 patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56,
                                 fullatt_block_indexes=[1, 3], in_channels=3, hidden_act="silu")
    cfg._attn_implementation = "eager"
    model = Qwen2_5_VisionTransformerPretrainedModel(cfg).to(torch.float32).eval()
    init_weights(model, SEED)

    # 61×90 resizes to 56×84 (grid 4×6: two Qwen windows of 2×2 merge units), 50×57 to 56×56.
    images = [make_image(61, 90, SEED + 1), make_image(50, 57, SEED + 2)]
    for i, im in enumerate(images):
        im.save(out / f"image_{i}.png")
    images = [Image.open(out / f"image_{i}.png").convert("RGB") for i in range(len(images))]
    proc = Qwen2VLImageProcessorPil(min_pixels=3136, max_pixels=12845056)
    batch = proc(images=images, return_tensors="pt")
    pixel_values = batch["pixel_values"].to(torch.float32)
    grid_thw = batch["image_grid_thw"]

    with torch.no_grad():
        merged = model(hidden_states=pixel_values, grid_thw=grid_thw).pooler_output
        single = [model(hidden_states=pixel_values[a:b], grid_thw=grid_thw[i:i + 1]).pooler_output
                  for i, (a, b) in enumerate([(0, 24), (24, 40)])]
    # HF's own batch equals its per-image runs: the check our multi-image test mirrors.
    assert torch.allclose(torch.cat(single), merged, rtol=1e-5, atol=1e-6)
    # The same weights with every layer full, and with every layer windowed: references for our
    # `full` schedule and for a custom all-chunk schedule ("WWWW").
    variants = {}
    for key, full_layers in (("output_all_full", [0, 1, 2, 3]), ("output_all_window", [])):
        vcfg = Qwen2_5_VLVisionConfig(**{**cfg.to_dict(), "fullatt_block_indexes": full_layers})
        vcfg._attn_implementation = "eager"
        vm = Qwen2_5_VisionTransformerPretrainedModel(vcfg).to(torch.float32).eval()
        vm.load_state_dict(model.state_dict())
        with torch.no_grad():
            variants[key] = vm(hidden_states=pixel_values, grid_thw=grid_thw).pooler_output.to(torch.float32).contiguous()

    weights = {"model.visual." + k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    save_file(weights, str(out / "weights.safetensors"), metadata={"format": "pt"})
    save_file({"pixel_values": pixel_values.contiguous(),
               "grid_thw": grid_thw.to(torch.float32).contiguous(),
               "output": merged.to(torch.float32).contiguous(), **variants},
              str(out / "reference.safetensors"),
              metadata={"made_by": "scripts/make_vit_reference.py", "transformers": __import__("transformers").__version__,
                        "torch": torch.__version__, "vision_config": json.dumps(cfg.to_dict(), default=str)})
    print(f"pixel_values {tuple(pixel_values.shape)}, grid_thw {grid_thw.tolist()}, output {tuple(merged.shape)}")


if __name__ == "__main__":
    main()
