#!/usr/bin/env python3
"""Makes the CPU parity reference of the vision encoder with HF transformers (CPU, fp32).

Builds a small random Qwen2.5-VL vision tower (the `small` config of include/ariadne/vit.hpp:
depth 4, hidden 32, 2 heads, intermediate 64, out 32, full layers [1, 3], window 56 px, patch 14,
merge 2, temporal 2), saves its weights (bf16 values, so the file is small; the model runs in fp32
on exactly those values) under the `model.visual.` prefix, writes two deterministic test images,
runs HF's PIL-backend Qwen2-VL image processor on them and the tower on the resulting batch, and
saves pixel_values, grid_thw and the tower's merged output.

The video reference uses the same tower (read back from weights.safetensors): three seeded 56×84
frames (no resize: the video processor resizes with torchvision, not PIL) through HF's
Qwen2VLVideoProcessor, which pads them to four (grid_thw [2, 4, 6]), and the tower on that clip.
It writes video_frame_{0,1,2}.png and video_reference.safetensors; `--video-only` makes only these
and leaves the image files as they are. The video processor needs torchvision as well.

Needs torch, transformers, safetensors, pillow, numpy in a virtual environment outside the repo:
    python3 -m venv /work/venv-hf && /work/venv-hf/bin/pip install torch transformers safetensors pillow numpy
    /work/venv-hf/bin/python scripts/make_vit_reference.py tests/data/vit
tests/cpu/test_vit.cpp and tests/cpu/test_vit_video.cpp check our encoder against the files
(relative error <= 1e-5).
"""
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file, save_file
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


def small_config(full_layers=(1, 3)) -> Qwen2_5_VLVisionConfig:
    cfg = Qwen2_5_VLVisionConfig(depth=4, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=32,
                                 patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56,
                                 fullatt_block_indexes=list(full_layers), in_channels=3, hidden_act="silu")
    cfg._attn_implementation = "eager"
    return cfg


def make_video_reference(out: Path) -> None:
    """The small tower of weights.safetensors on a three-frame clip, through HF's video processor."""
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    state = {k.removeprefix("model.visual."): v.to(torch.float32)
             for k, v in load_file(str(out / "weights.safetensors")).items()}
    frames = [make_image(56, 84, SEED + 10 + f) for f in range(3)]
    for f, im in enumerate(frames):
        im.save(out / f"video_frame_{f}.png")
    clip = np.stack([np.asarray(Image.open(out / f"video_frame_{f}.png").convert("RGB")) for f in range(3)])
    # The image processor's pixel bounds (ours for both): the class defaults of the video processor
    # (min 128·28·28) would upscale these small frames.
    proc = Qwen2VLVideoProcessor(size={"shortest_edge": 3136, "longest_edge": 12845056})
    batch = proc(videos=[clip], return_tensors="pt", do_sample_frames=False, cap_pixels_per_frame=False)
    pixel_values = batch["pixel_values_videos"].to(torch.float32)
    grid_thw = batch["video_grid_thw"]
    assert grid_thw.tolist() == [[2, 4, 6]], grid_thw

    outputs = {}
    for key, full_layers in (("output", [1, 3]), ("output_all_full", [0, 1, 2, 3]), ("output_all_window", [])):
        model = Qwen2_5_VisionTransformerPretrainedModel(small_config(full_layers)).to(torch.float32).eval()
        model.load_state_dict(state)
        with torch.no_grad():
            outputs[key] = model(hidden_states=pixel_values, grid_thw=grid_thw).pooler_output.contiguous()
            # HF's tower is block-diagonal over time: each temporal patch alone gives its rows.
            half = pixel_values.shape[0] // 2
            alone = [model(hidden_states=pixel_values[i * half:(i + 1) * half],
                           grid_thw=torch.tensor([[1, 4, 6]])).pooler_output for i in range(2)]
        assert torch.allclose(torch.cat(alone), outputs[key], rtol=1e-5, atol=1e-6), key
    save_file({"pixel_values": pixel_values.contiguous(), "grid_thw": grid_thw.to(torch.float32).contiguous(),
               **outputs},
              str(out / "video_reference.safetensors"),
              metadata={"made_by": "scripts/make_vit_reference.py",
                        "transformers": __import__("transformers").__version__, "torch": torch.__version__,
                        "frames": "3 (padded to 4 by the processor)"})
    print(f"video: pixel_values {tuple(pixel_values.shape)}, grid_thw {grid_thw.tolist()}, "
          f"output {tuple(outputs['output'].shape)}")


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    out = Path(args[0] if args else "tests/data/vit")
    out.mkdir(parents=True, exist_ok=True)
    if "--video-only" in sys.argv:
        make_video_reference(out)
        return
    torch.manual_seed(SEED)
    cfg = small_config()
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
        vm = Qwen2_5_VisionTransformerPretrainedModel(small_config(full_layers)).to(torch.float32).eval()
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
    make_video_reference(out)


if __name__ == "__main__":
    main()
