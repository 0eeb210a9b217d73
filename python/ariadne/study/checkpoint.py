"""Study checkpoints: safetensors in the layout ariadne's encoder reads (vit.hpp load_vit_weights).

The tower's tensors carry the `visual.` prefix and HF's names (patch_embed.proj.weight as the 5-D
Conv3d weight [hidden, channels, temporal, patch, patch], blocks.{i}.attn.sinks on sink layers);
the metadata holds `vision_config` (heads, window, full layers, theta: what the tensors cannot
tell) and `study` (schedule, window, image side, labels, seed, step, metrics), so `ariadne shs
--weights FILE --schedule S` and ariadne.load_vit_weights read the file as it is. The study's head
is stored beside the tower as `study_head.*`, which the encoder's loader does not look at.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, Tuple

import numpy as np
import torch

import ariadne

from .model import StudyViT, study_config, study_schedule

PREFIX = "visual."
HEAD_PREFIX = "study_head."
_DTYPES = {"F32": (torch.float32, np.float32), "BF16": (torch.bfloat16, np.uint16)}


def vision_config(c: ariadne.VitConfig) -> dict:
    """HF's field names, as save_vit_weights writes them."""
    return {"depth": c.depth, "hidden_size": c.hidden, "num_heads": c.heads, "intermediate_size": c.intermediate,
            "out_hidden_size": c.out_hidden, "patch_size": c.patch, "temporal_patch_size": c.temporal,
            "spatial_merge_size": c.merge, "window_size": c.window_px,
            "fullatt_block_indexes": list(c.full_layers), "rope_theta": c.rope_theta}


def checkpoint_tensors(model: StudyViT) -> Dict[str, torch.Tensor]:
    """The model's parameters under the checkpoint's names (float32, host)."""
    c = model.config
    out = {}
    for name, p in model.state_dict().items():
        t = p.detach().float().cpu()
        if name.startswith("head."):
            out[HEAD_PREFIX + name[len("head."):]] = t
            continue
        if name == "patch_embed.proj.weight":
            t = t.reshape(c.hidden, c.in_channels, c.temporal, c.patch, c.patch)
        out[PREFIX + name] = t
    return out


def write_safetensors(path, tensors: Dict[str, torch.Tensor], metadata: Dict[str, str], dtype: str = "F32"):
    """A safetensors file: 8-byte little-endian header size, JSON header, tensors back to back.
    dtype 'F32' or 'BF16' (round to nearest even, as torch converts)."""
    if dtype not in _DTYPES:
        raise ValueError(f"write_safetensors: dtype '{dtype}', expected one of {sorted(_DTYPES)}")
    header, blobs, offset = {"__metadata__": dict(metadata)}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        if dtype == "BF16":
            data = t.to(torch.bfloat16).view(torch.int16).numpy().tobytes()
        else:
            data = t.to(torch.float32).numpy().tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)  # a reader never sees half a file


def read_safetensors(path) -> Tuple[Dict[str, torch.Tensor], Dict[str, str]]:
    """(tensors float32, metadata) of a file write_safetensors made (F32 or BF16)."""
    raw = Path(path).read_bytes()
    if len(raw) < 8:
        raise ValueError(f"{path}: {len(raw)} bytes, expected a safetensors file (8-byte header size first)")
    n = int.from_bytes(raw[:8], "little")
    if 8 + n > len(raw):
        raise ValueError(f"{path}: header size {n} runs past the file's {len(raw)} bytes")
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    out = {}
    for name, e in header.items():
        if e["dtype"] not in _DTYPES:
            raise ValueError(f"{path}: tensor '{name}' has dtype {e['dtype']}, expected F32 or BF16")
        a, b = e["data_offsets"]
        if not 0 <= a <= b <= len(raw) - 8 - n:
            raise ValueError(f"{path}: tensor '{name}' has data_offsets [{a}, {b}] outside the data")
        arr = np.frombuffer(raw[8 + n + a:8 + n + b], _DTYPES[e["dtype"]][1]).reshape(e["shape"])
        t = torch.from_numpy(arr.copy())
        out[name] = (t.view(torch.bfloat16) if e["dtype"] == "BF16" else t).float()
    return out, meta


def save(path, model: StudyViT, study: dict, dtype: str = "F32") -> None:
    """Writes `model` with its study record (merged into the metadata's `study` JSON)."""
    record = dict(study, schedule=model.schedule.letters(), window=model.window)
    write_safetensors(path, checkpoint_tensors(model),
                      {"format": "pt", "vision_config": json.dumps(vision_config(model.config)),
                       "study": json.dumps(record)}, dtype)


def load(path, backend: str = "auto") -> Tuple[StudyViT, dict]:
    """(model, study record) from a file save() wrote; errors name the file and the tensor."""
    tensors, meta = read_safetensors(path)
    if "vision_config" not in meta or "study" not in meta:
        raise ValueError(f"{path}: metadata lacks 'vision_config' or 'study'; not a study checkpoint")
    vc, study = json.loads(meta["vision_config"]), json.loads(meta["study"])
    c = study_config(vc["depth"], vc["hidden_size"], vc["num_heads"], vc["intermediate_size"], vc["out_hidden_size"])
    c.window_px, c.full_layers, c.rope_theta = vc["window_size"], vc["fullatt_block_indexes"], vc["rope_theta"]
    schedule = study_schedule(study["schedule"], c, study["window"])
    model = StudyViT(c, schedule, study["classes"], study["max_count"], study["window"], backend)
    state = {}
    for name, p in model.state_dict().items():
        key = HEAD_PREFIX + name[len("head."):] if name.startswith("head.") else PREFIX + name
        if key not in tensors:
            raise ValueError(f"{path}: no tensor '{key}'")
        state[name] = tensors[key].reshape(p.shape) if tensors[key].numel() == p.numel() else tensors[key]
        if state[name].shape != p.shape:
            raise ValueError(f"{path}: tensor '{key}' has shape {list(tensors[key].shape)}, expected {list(p.shape)}")
    model.load_state_dict(state)
    return model, study
