"""Procedural images with exact instance masks for the training study (docs/study.md).

Every image is a function of (split seed, index) alone: its parameters are drawn on the host from
numpy's PCG64 seeded with [seed, index], and it is rendered with torch on the chosen device. A batch
is therefore the same whatever else was generated before it, and every schedule of a study sees the
same pixels. On one device the bits repeat exactly; CPU and GPU may differ in the last bit of a
texture value (their sin/exp differ), never in the parameters.

An image has a cluttered background (multi-scale value noise, stripes, strokes, soft blobs, in the
objects' colours too, so colour alone does not mark an object) and 1-4 objects of CLASSES, painted
with hard edges in order, later ones on top. The instance map holds, per pixel, 1 + the index of the
top-most object covering it, 0 for background: it is exact because it is made by the same inside
tests that paint the pixels. Objects stay at least MIN_VISIBLE visible under later ones.
The labels need the whole image: the set of classes present and the object count.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

# Sizes are specified at 448 px and scale with the image side (224 px: 15-90 px objects).
REFERENCE_SIDE = 448
SIZE_RANGE = (30.0, 180.0)
MAX_OBJECTS = 4
MIN_VISIBLE = 0.5       # share of an object's in-frame pixels that later objects may not cover
PLACEMENT_TRIES = 20


@dataclass(frozen=True)
class ObjectClass:
    name: str
    shape: str
    texture: str
    hue: float  # degrees


# Ten classes: one shape, one texture and one hue family each (shape x texture/colour family).
CLASSES: Tuple[ObjectClass, ...] = (
    ObjectClass("red-checker-disk", "disk", "checker", 0.0),
    ObjectClass("orange-dotted-square", "square", "dots", 36.0),
    ObjectClass("yellow-striped-triangle", "triangle", "stripes", 72.0),
    ObjectClass("green-solid-star", "star", "solid", 108.0),
    ObjectClass("teal-ringed-ring", "ring", "rings", 144.0),
    ObjectClass("cyan-checker-cross", "cross", "checker", 180.0),
    ObjectClass("blue-striped-ellipse", "ellipse", "stripes", 216.0),
    ObjectClass("violet-dotted-hexagon", "hexagon", "dots", 252.0),
    ObjectClass("magenta-solid-crescent", "crescent", "solid", 288.0),
    ObjectClass("pink-ringed-ell", "ell", "rings", 324.0),
)
NUM_CLASSES = len(CLASSES)


@dataclass
class Batch:
    """images uint8 [B, S, S, 3]; instances int32 [B, S, S] (0 background, k = k-th object);
    present float32 [B, classes] (1 where the class is in the image); count int64 [B] (1-4);
    object_classes: per image, the class of each object in painting order."""
    images: torch.Tensor
    instances: torch.Tensor
    present: torch.Tensor
    count: torch.Tensor
    object_classes: List[List[int]]


# ---------------------------------------------------------------- parameters (host, numpy)

def _rng(seed: int, index: int) -> np.random.Generator:
    if seed < 0 or index < 0:
        raise ValueError(f"study data: seed {seed} and index {index} must be non-negative")
    return np.random.default_rng([int(seed), int(index)])


def _colour(rng: np.random.Generator, hue: Optional[float] = None) -> np.ndarray:
    """An RGB colour in [0, 1]; near `hue` (±12°) when given, else any hue."""
    h = (hue + rng.uniform(-12, 12)) % 360 if hue is not None else rng.uniform(0, 360)
    s, v = rng.uniform(0.55, 1.0), rng.uniform(0.55, 1.0)
    return _hsv(h, s, v)


def _hsv(h: float, s: float, v: float) -> np.ndarray:
    c = v * s
    x = c * (1 - abs((h / 60) % 2 - 1))
    m = v - c
    sector = int(h // 60) % 6
    rgb = [(c, x, 0), (x, c, 0), (0, c, x), (0, x, c), (x, 0, c), (c, 0, x)][sector]
    return np.array(rgb) + m


def _background_params(rng: np.random.Generator, side: int) -> dict:
    scale = side / REFERENCE_SIDE
    hues = [c.hue for c in CLASSES]

    def pick() -> np.ndarray:
        # Clutter borrows the objects' hues half of the time: colour must not give an object away.
        return _colour(rng, hues[rng.integers(len(hues))] if rng.random() < 0.5 else None)

    noise = []
    for cells in (4, 8, 16, 32, 64):
        if side // cells >= 2:
            noise.append((rng.uniform(-1, 1, (3, cells + 1, cells + 1)), rng.uniform(0.05, 0.25) * 8 / (cells + 4)))
    stripes = [dict(colour=pick(), angle=rng.uniform(0, math.pi), period=rng.uniform(8, 40) * scale,
                    phase=rng.uniform(0, 2 * math.pi), duty=rng.uniform(-0.4, 0.4), alpha=rng.uniform(0.3, 0.8))
               for _ in range(rng.integers(1, 3))]
    strokes = []
    for _ in range(rng.integers(3, 9)):
        points = [rng.uniform(0, side, 2)]
        for _ in range(rng.integers(1, 4)):
            step = rng.uniform(20, 120) * scale
            a = rng.uniform(0, 2 * math.pi)
            points.append(points[-1] + step * np.array([math.cos(a), math.sin(a)]))
        strokes.append(dict(colour=pick(), width=rng.uniform(2, 10) * scale, points=points))
    blobs = [dict(colour=pick(), centre=rng.uniform(0, side, 2), radius=rng.uniform(15, 70) * scale,
                  lobes=int(rng.integers(2, 6)), wobble=rng.uniform(0.1, 0.5), phase=rng.uniform(0, 2 * math.pi),
                  alpha=rng.uniform(0.4, 0.9))
             for _ in range(rng.integers(2, 7))]
    return dict(base=rng.uniform(0.15, 0.85, 3), noise=noise, stripes=stripes, strokes=strokes, blobs=blobs)


def _object_params(rng: np.random.Generator, side: int, cls: int) -> dict:
    scale = side / REFERENCE_SIDE
    c = CLASSES[cls]
    size = rng.uniform(*SIZE_RANGE) * scale
    return dict(cls=cls, size=size, angle=rng.uniform(0, 2 * math.pi), colour=_colour(rng, c.hue),
                dark=rng.uniform(0.35, 0.65), period=rng.uniform(5, 11) * scale, tex_angle=rng.uniform(0, math.pi),
                tex_phase=rng.uniform(0, 1, 2), grain=rng.uniform(0.02, 0.06), grain_seed=int(rng.integers(1 << 30)))


def _centre(rng: np.random.Generator, side: int, size: float) -> np.ndarray:
    # Any position, with at least about half of the object inside the frame.
    margin = 0.2 * size
    return rng.uniform(margin, side - margin, 2)


# ---------------------------------------------------------------- rendering (torch)

def _grid(side: int, device) -> Tuple[torch.Tensor, torch.Tensor]:
    """Pixel-centre coordinates y, x float32 [side, side]."""
    t = torch.arange(side, device=device, dtype=torch.float32) + 0.5
    return t[:, None].expand(side, side), t[None, :].expand(side, side)


def _t(x, device) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x, dtype=np.float32), device=device)


def _segment_distance(y, x, a, b) -> torch.Tensor:
    ab = b - a
    denom = float(max(np.dot(ab, ab), 1e-6))
    t = (((x - float(a[0])) * float(ab[0]) + (y - float(a[1])) * float(ab[1])) / denom).clamp(0, 1)
    return torch.hypot(x - (float(a[0]) + t * float(ab[0])), y - (float(a[1]) + t * float(ab[1])))


def _render_background(p: dict, side: int, device) -> torch.Tensor:
    y, x = _grid(side, device)
    img = _t(p["base"], device)[:, None, None].expand(3, side, side).clone()
    for grid, amp in p["noise"]:
        low = _t(grid, device)[None]
        img += amp * torch.nn.functional.interpolate(low, size=(side, side), mode="bilinear", align_corners=False)[0]
    for s in p["stripes"]:
        u = x * math.cos(s["angle"]) + y * math.sin(s["angle"])
        on = torch.sin(2 * math.pi * u / s["period"] + s["phase"]) > s["duty"]
        col = _t(s["colour"], device)[:, None, None]
        img = torch.where(on, (1 - s["alpha"]) * img + s["alpha"] * col, img)
    for b in p["blobs"]:
        dy, dx = y - float(b["centre"][1]), x - float(b["centre"][0])
        r = torch.hypot(dx, dy)
        theta = torch.atan2(dy, dx)
        edge = b["radius"] * (1 + b["wobble"] * torch.sin(b["lobes"] * theta + b["phase"]))
        weight = b["alpha"] * torch.exp(-(r / edge) ** 2 * 2)  # soft: a blob has no edge to learn
        img = (1 - weight) * img + weight * _t(b["colour"], device)[:, None, None]
    for s in p["strokes"]:
        pts = s["points"]
        d = torch.stack([_segment_distance(y, x, pts[i], pts[i + 1]) for i in range(len(pts) - 1)]).amin(0)
        img = torch.where(d <= s["width"] / 2, _t(s["colour"], device)[:, None, None], img)
    return img


def _inside(shape: str, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Whether object-frame points (u, v), in units of the object's half size, are inside `shape`."""
    r = torch.hypot(u, v)
    theta = torch.atan2(v, u)
    if shape == "disk":
        return r <= 1
    if shape == "square":
        return torch.maximum(u.abs(), v.abs()) <= 0.8
    if shape == "triangle":
        return torch.stack([u * math.cos(a) + v * math.sin(a) for a in (math.pi / 2 * 3, math.pi / 6,
                                                                        math.pi * 5 / 6)]).amax(0) <= 0.5
    if shape == "star":
        frac = torch.remainder(5 * theta / (2 * math.pi), 1.0)
        return r <= 0.4 + 0.6 * (1 - (2 * frac - 1).abs())
    if shape == "ring":
        return (r <= 1) & (r >= 0.55)
    if shape == "cross":
        return ((u.abs() <= 0.3) & (v.abs() <= 1)) | ((v.abs() <= 0.3) & (u.abs() <= 1))
    if shape == "ellipse":
        return u ** 2 + (v / 0.55) ** 2 <= 1
    if shape == "hexagon":
        return torch.stack([(u * math.cos(a) + v * math.sin(a)).abs() for a in (0, math.pi / 3,
                                                                                2 * math.pi / 3)]).amax(0) <= 0.87
    if shape == "crescent":
        return (r <= 1) & (torch.hypot(u - 0.45, v) > 0.75)
    if shape == "ell":
        return (((u >= -0.8) & (u <= 0.8) & (v >= 0.3) & (v <= 0.8)) |
                ((u >= -0.8) & (u <= -0.3) & (v >= -0.8) & (v <= 0.8)))
    raise ValueError(f"study data: unknown shape '{shape}'")


def _object_layer(p: dict, centre: np.ndarray, side: int, device) -> Tuple[torch.Tensor, torch.Tensor]:
    """(inside bool [S, S], texture float32 [3, S, S]) of one object."""
    y, x = _grid(side, device)
    c = CLASSES[p["cls"]]
    dx, dy = x - float(centre[0]), y - float(centre[1])
    ca, sa = math.cos(p["angle"]), math.sin(p["angle"])
    half = p["size"] / 2
    u, v = (dx * ca + dy * sa) / half, (-dx * sa + dy * ca) / half
    inside = _inside(c.shape, u, v)
    col = _t(p["colour"], device)[:, None, None]
    period = p["period"]
    tu = dx * math.cos(p["tex_angle"]) + dy * math.sin(p["tex_angle"])
    tv = -dx * math.sin(p["tex_angle"]) + dy * math.cos(p["tex_angle"])
    if c.texture == "solid":
        on = torch.ones_like(inside)
    elif c.texture == "stripes":
        on = torch.remainder(tu / period + p["tex_phase"][0], 1.0) < 0.5
    elif c.texture == "checker":
        on = (torch.floor(tu / period + p["tex_phase"][0]) + torch.floor(tv / period + p["tex_phase"][1])) % 2 == 0
    elif c.texture == "dots":
        fu = torch.remainder(tu / period + p["tex_phase"][0], 1.0) - 0.5
        fv = torch.remainder(tv / period + p["tex_phase"][1], 1.0) - 0.5
        on = torch.hypot(fu, fv) > 0.3
    elif c.texture == "rings":
        on = torch.remainder(torch.hypot(dx, dy) / period + p["tex_phase"][0], 1.0) < 0.5
    else:
        raise ValueError(f"study data: unknown texture '{c.texture}'")
    tex = torch.where(on, col, col * p["dark"])
    gen = torch.Generator(device="cpu").manual_seed(p["grain_seed"])
    grain = torch.randn((1, side, side), generator=gen).to(device)  # host draws: the same on every device
    return inside, tex + p["grain"] * grain


def _quantize(img: torch.Tensor) -> torch.Tensor:
    """float [3, S, S] in [0, 1] -> uint8 [S, S, 3]."""
    return torch.round(img.clamp(0, 1) * 255).to(torch.uint8).permute(1, 2, 0).contiguous()


def render(seed: int, index: int, side: int = REFERENCE_SIDE, device="cpu", layers: bool = False):
    """One image: (image uint8 [S, S, 3], instances int32 [S, S], classes [object class per instance]).
    With layers=True also (background uint8 [S, S, 3], [(inside bool [S, S], texture uint8 [S, S, 3])]
    per painted object), from which tests check that the mask is exact."""
    if side % 28 or side < 56:
        raise ValueError(f"study data: image side {side} must be a multiple of 28 (patch 14, merge 2), at least 56")
    rng = _rng(seed, index)
    bg_params = _background_params(rng, side)
    n = int(rng.integers(1, MAX_OBJECTS + 1))
    classes = [int(c) for c in rng.integers(0, NUM_CLASSES, n)]
    img = _render_background(bg_params, side, device)
    background = _quantize(img)
    inst = torch.zeros((side, side), dtype=torch.int32, device=device)
    in_frame: List[int] = []
    painted, kept = [], []
    for cls in classes:
        p = _object_params(rng, side, cls)
        for _ in range(PLACEMENT_TRIES):
            centre = _centre(rng, side, p["size"])
            inside, tex = _object_layer(p, centre, side, device)
            area = int(inside.sum())
            if area == 0:
                continue
            after = torch.where(inside, len(kept) + 1, inst)
            visible = [int((after == k + 1).sum()) for k in range(len(kept))]
            if all(vis >= MIN_VISIBLE * tot for vis, tot in zip(visible, in_frame)):
                break
        else:
            continue  # no placement keeps the others visible: the image has one object fewer
        inst = after
        in_frame.append(area)
        img = torch.where(inside, tex, img)
        kept.append(cls)
        painted.append((inside, tex))
    if not kept:  # cannot happen for the first object (nothing to cover) unless it fell outside
        raise RuntimeError(f"study data: image (seed {seed}, index {index}) got no object")
    image = _quantize(img)
    if not layers:
        return image, inst, kept
    return image, inst, kept, background, [(i, _quantize(t)) for i, t in painted]


def make_batch(seed: int, indices: Sequence[int], side: int = REFERENCE_SIDE, device="cpu") -> Batch:
    """Images `indices` of split `seed`, stacked."""
    images, instances, object_classes = [], [], []
    for i in indices:
        image, inst, classes = render(seed, int(i), side, device)
        images.append(image)
        instances.append(inst)
        object_classes.append(classes)
    present = torch.zeros((len(indices), NUM_CLASSES), dtype=torch.float32, device=device)
    for b, classes in enumerate(object_classes):
        present[b, classes] = 1.0
    count = torch.tensor([len(c) for c in object_classes], dtype=torch.int64, device=device)
    return Batch(torch.stack(images), torch.stack(instances), present, count, object_classes)


# ---------------------------------------------------------------- files for `ariadne shs`

def _png_chunk(kind: bytes, data: bytes) -> bytes:
    body = kind + data
    return len(data).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")


def encode_png(pixels: np.ndarray) -> bytes:
    """An 8-bit PNG of uint8 [H, W, 3] (RGB) or [H, W] (gray), rows unfiltered."""
    a = np.ascontiguousarray(pixels)
    if a.dtype != np.uint8 or a.ndim not in (2, 3) or (a.ndim == 3 and a.shape[2] != 3):
        raise ValueError(f"encode_png: pixels are {a.dtype} {a.shape}, expected uint8 [H, W, 3] or [H, W]")
    h, w = a.shape[:2]
    colour_type = 2 if a.ndim == 3 else 0
    rows = a.reshape(h, -1)
    raw = np.concatenate([np.zeros((h, 1), np.uint8), rows], axis=1).tobytes()  # filter byte 0 per row
    header = w.to_bytes(4, "big") + h.to_bytes(4, "big") + bytes([8, colour_type, 0, 0, 0])
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", header) + _png_chunk(b"IDAT", zlib.compress(raw, 6)) +
            _png_chunk(b"IEND", b""))


def write_split(folder, seed: int, count: int, side: int = REFERENCE_SIDE, device="cpu") -> List[dict]:
    """Images 0..count-1 of split `seed` as `ariadne shs` reads them: images/<name>.png and
    masks/<name>.png (gray instance ids: 0 background, k the k-th object; every non-zero id is FG
    under shs's default rule). Returns per image its name, classes and count (also written to
    labels.json)."""
    import json

    folder = Path(folder)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    (folder / "masks").mkdir(parents=True, exist_ok=True)
    records = []
    for i in range(count):
        image, inst, classes = render(seed, i, side, device)
        name = f"s{seed}_{i:05d}"
        (folder / "images" / f"{name}.png").write_bytes(encode_png(image.cpu().numpy()))
        ids = inst.cpu().numpy()
        (folder / "masks" / f"{name}.png").write_bytes(encode_png(ids.astype(np.uint8)))
        records.append(dict(name=name, classes=classes, count=len(classes),
                            class_names=[CLASSES[c].name for c in classes]))
    (folder / "labels.json").write_text(json.dumps(dict(seed=seed, side=side, images=records), indent=1))
    return records
