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


# ---------------------------------------------------------------- rendering (torch, many images at once)
#
# A batch is rendered as one set of tensor operations over [B, ...] tensors, with each image's
# parameters as per-image tensors. The k-th stripe, blob, stroke or stroke segment is drawn on the
# images that have one (a subset of rows), so an image is the same bits in any batch.

def _grid(side: int, device) -> Tuple[torch.Tensor, torch.Tensor]:
    """Pixel-centre coordinates y, x float32 [side, side]."""
    t = torch.arange(side, device=device, dtype=torch.float32) + 0.5
    return t[:, None].expand(side, side), t[None, :].expand(side, side)


def _t(x, device) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x, dtype=np.float32), device=device)


def _per_image(values, device) -> torch.Tensor:
    """float32 [B, 1, 1] from B numbers: broadcasts against [B, S, S]."""
    return _t(values, device).view(-1, 1, 1)


def _colours(values, device) -> torch.Tensor:
    """float32 [B, 3, 1, 1] from B colours."""
    return _t(np.stack(values), device).view(-1, 3, 1, 1)


def _kth(lists: Sequence[Sequence], device):
    """For k = 0, 1, ...: (rows, items): the images that have a k-th element (an index tensor) and
    those elements."""
    for k in range(max((len(x) for x in lists), default=0)):
        rows = [b for b, x in enumerate(lists) if k < len(x)]
        yield torch.as_tensor(rows, device=device), [lists[b][k] for b in rows]


def _render_backgrounds(ps: Sequence[dict], side: int, device) -> torch.Tensor:
    """float32 [B, 3, S, S]: the backgrounds of parameter sets `ps` (noise, stripes, blobs, strokes)."""
    y, x = _grid(side, device)
    img = _colours([p["base"] for p in ps], device).expand(len(ps), 3, side, side).clone()
    for level in range(len(ps[0]["noise"])):  # the noise scales depend on the side only
        low = _t(np.stack([p["noise"][level][0] for p in ps]), device)
        amp = _per_image([p["noise"][level][1] for p in ps], device)[:, None]
        img += amp * torch.nn.functional.interpolate(low, size=(side, side), mode="bilinear", align_corners=False)
    for rows, s in _kth([p["stripes"] for p in ps], device):
        u = x * _per_image([math.cos(e["angle"]) for e in s], device) + \
            y * _per_image([math.sin(e["angle"]) for e in s], device)
        on = torch.sin(u * _per_image([2 * math.pi / e["period"] for e in s], device) +
                       _per_image([e["phase"] for e in s], device)) > _per_image([e["duty"] for e in s], device)
        alpha = _per_image([e["alpha"] for e in s], device)[:, None]
        sub = img[rows]
        img[rows] = torch.where(on[:, None], (1 - alpha) * sub + alpha * _colours([e["colour"] for e in s], device), sub)
    for rows, b in _kth([p["blobs"] for p in ps], device):
        dy = y - _per_image([e["centre"][1] for e in b], device)
        dx = x - _per_image([e["centre"][0] for e in b], device)
        edge = _per_image([e["radius"] for e in b], device) * (
            1 + _per_image([e["wobble"] for e in b], device) *
            torch.sin(_per_image([e["lobes"] for e in b], device) * torch.atan2(dy, dx) +
                      _per_image([e["phase"] for e in b], device)))
        # Soft: a blob has no edge to learn.
        weight = (_per_image([e["alpha"] for e in b], device) * torch.exp(-(torch.hypot(dx, dy) / edge) ** 2 * 2))[:, None]
        img[rows] = (1 - weight) * img[rows] + weight * _colours([e["colour"] for e in b], device)
    for rows, s in _kth([p["strokes"] for p in ps], device):
        d = torch.full((len(s), side, side), math.inf, device=device)
        for seg_rows, seg in _kth([list(zip(e["points"][:-1], e["points"][1:])) for e in s], device):
            d[seg_rows] = torch.minimum(d[seg_rows], _segment_distance(y, x, seg, device))
        on = d <= _per_image([e["width"] / 2 for e in s], device)
        img[rows] = torch.where(on[:, None], _colours([e["colour"] for e in s], device), img[rows])
    return img


def _segment_distance(y, x, segments, device) -> torch.Tensor:
    """[B, S, S]: each pixel's distance to segment b (a, b)."""
    ax, ay = _per_image([a[0] for a, _ in segments], device), _per_image([a[1] for a, _ in segments], device)
    ab = [b - a for a, b in segments]
    abx, aby = _per_image([v[0] for v in ab], device), _per_image([v[1] for v in ab], device)
    inv = _per_image([1 / max(float(np.dot(v, v)), 1e-6) for v in ab], device)
    t = (((x - ax) * abx + (y - ay) * aby) * inv).clamp(0, 1)
    return torch.hypot(x - (ax + t * abx), y - (ay + t * aby))


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


def _offsets(centres: Sequence[np.ndarray], side: int, device) -> Tuple[torch.Tensor, torch.Tensor]:
    """dx, dy float32 [B, S, S]: each pixel's offset from image b's object centre."""
    y, x = _grid(side, device)
    return x - _per_image([c[0] for c in centres], device), y - _per_image([c[1] for c in centres], device)


def _by_value(keys: Sequence[str]):
    """(key, positions) for each distinct key, in first-seen order."""
    groups: dict = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    return groups.items()


def _frames(ps: Sequence[dict], centres: Sequence[np.ndarray], side: int, device, angle: str, unit):
    """(dx, dy, u, v) float32 [B, S, S]: each pixel's offset from object b's centre, and the same
    offset rotated by ps[b][angle] in units of unit(ps[b]) pixels."""
    dx, dy = _offsets(centres, side, device)
    c = _per_image([math.cos(p[angle]) for p in ps], device)
    s = _per_image([math.sin(p[angle]) for p in ps], device)
    inv = _per_image([1 / unit(p) for p in ps], device)
    return dx, dy, (dx * c + dy * s) * inv, (-dx * s + dy * c) * inv


def _insides(ps: Sequence[dict], centres: Sequence[np.ndarray], side: int, device) -> torch.Tensor:
    """bool [B, S, S]: the pixels inside object b (parameters ps[b], placed at centres[b])."""
    _, _, u, v = _frames(ps, centres, side, device, "angle", lambda p: p["size"] / 2)
    out = torch.empty(u.shape, dtype=torch.bool, device=device)
    for shape, rows in _by_value([CLASSES[p["cls"]].shape for p in ps]):
        idx = torch.as_tensor(rows, device=device)
        out[idx] = _inside(shape, u[idx], v[idx])
    return out


_MASK32 = 0xFFFFFFFF


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mix of int64 tensors holding values below 2**32 (multipliers below 2**31 keep
    the products inside int64 on every device)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x2C1B3C6D) & _MASK32
    return x ^ (x >> 16)


def _grain(seeds: Sequence[int], side: int, device) -> torch.Tensor:
    """float32 [B, 1, S, S] of zero mean and unit variance from (seed, pixel) alone: the sum of four
    8-bit uniforms of an integer hash, so every device computes the same bits."""
    pixel = torch.arange(side * side, device=device, dtype=torch.int64).view(1, side, side)
    h = _hash32(_hash32(torch.as_tensor(list(seeds), dtype=torch.int64, device=device).view(-1, 1, 1)) ^ pixel)
    total = sum((h >> (8 * k)) & 255 for k in range(4)).to(torch.float32)
    return ((total + 2) / 256 - 2)[:, None] * math.sqrt(3)


def _textures(ps: Sequence[dict], centres: Sequence[np.ndarray], side: int, device) -> torch.Tensor:
    """float32 [B, 3, S, S]: the textured colour of object b over the whole frame."""
    dx, dy, tu, tv = _frames(ps, centres, side, device, "tex_angle", lambda p: p["period"])
    inv_period = _per_image([1 / p["period"] for p in ps], device)
    ph0 = _per_image([p["tex_phase"][0] for p in ps], device)
    ph1 = _per_image([p["tex_phase"][1] for p in ps], device)
    on = torch.empty(dx.shape, dtype=torch.bool, device=device)
    for texture, rows in _by_value([CLASSES[p["cls"]].texture for p in ps]):
        i = torch.as_tensor(rows, device=device)
        if texture == "solid":
            on[i] = True
        elif texture == "stripes":
            on[i] = torch.remainder(tu[i] + ph0[i], 1.0) < 0.5
        elif texture == "checker":
            on[i] = (torch.floor(tu[i] + ph0[i]) + torch.floor(tv[i] + ph1[i])) % 2 == 0
        elif texture == "dots":
            on[i] = torch.hypot(torch.remainder(tu[i] + ph0[i], 1.0) - 0.5, torch.remainder(tv[i] + ph1[i], 1.0) - 0.5) > 0.3
        elif texture == "rings":
            on[i] = torch.remainder(torch.hypot(dx[i], dy[i]) * inv_period[i] + ph0[i], 1.0) < 0.5
        else:
            raise ValueError(f"study data: unknown texture '{texture}'")
    col = _colours([p["colour"] for p in ps], device)
    tex = torch.where(on[:, None], col, col * _per_image([p["dark"] for p in ps], device)[:, None])
    return tex + _per_image([p["grain"] for p in ps], device)[:, None] * _grain([p["grain_seed"] for p in ps], side,
                                                                                  device)


def _quantize(img: torch.Tensor) -> torch.Tensor:
    """float [..., 3, S, S] in [0, 1] -> uint8 [..., S, S, 3]."""
    return torch.round(img.clamp(0, 1) * 255).to(torch.uint8).movedim(-3, -1).contiguous()


def render_many(seed: int, indices: Sequence[int], side: int = REFERENCE_SIDE, device="cpu", layers: bool = False):
    """Images `indices` of split `seed`: (images uint8 [B, S, S, 3], instances int32 [B, S, S],
    classes: per image the class of each object in painting order). With layers=True also
    (backgrounds uint8 [B, S, S, 3], per image [(inside bool [S, S], texture uint8 [S, S, 3])] per
    painted object), from which tests check that the masks are exact.

    Objects are placed slot by slot over the whole batch: every image still draws its parameters
    from its own generator in the order of painting (object, then a centre per try), so an image
    does not depend on the batch it is rendered in."""
    if side % 28 or side < 56:
        raise ValueError(f"study data: image side {side} must be a multiple of 28 (patch 14, merge 2), at least 56")
    rngs = [_rng(seed, int(i)) for i in indices]
    backgrounds = [_background_params(rng, side) for rng in rngs]
    wanted = []
    for rng in rngs:
        n = int(rng.integers(1, MAX_OBJECTS + 1))
        wanted.append([int(c) for c in rng.integers(0, NUM_CLASSES, n)])
    count = len(rngs)
    img = _render_backgrounds(backgrounds, side, device)
    background = _quantize(img) if layers else None
    inst = torch.zeros((count, side, side), dtype=torch.int32, device=device)
    kept: List[List[int]] = [[] for _ in range(count)]
    areas: List[List[int]] = [[] for _ in range(count)]  # in-frame pixels of each kept object
    painted: List[list] = [[] for _ in range(count)]
    for slot in range(MAX_OBJECTS):
        params = {b: _object_params(rngs[b], side, wanted[b][slot]) for b in range(count) if slot < len(wanted[b])}
        pending, placed = list(params), {}
        for _ in range(PLACEMENT_TRIES):
            if not pending:
                break
            centres = [_centre(rngs[b], side, params[b]["size"]) for b in pending]
            inside = _insides([params[b] for b in pending], centres, side, device)
            after = torch.where(inside, _per_image([len(kept[b]) + 1 for b in pending], device).to(torch.int32),
                                inst[torch.as_tensor(pending, device=device)])
            counts = torch.stack([inside.sum((1, 2))] + [(after == k + 1).sum((1, 2)) for k in range(MAX_OBJECTS)],
                                 1).cpu().tolist()  # one transfer per try
            accepted, still = [], []
            for p, b in enumerate(pending):
                area, visible = counts[p][0], counts[p][1:]
                if area > 0 and all(visible[k] >= MIN_VISIBLE * tot for k, tot in enumerate(areas[b])):
                    placed[b] = (inside[p], centres[p], area)
                    accepted.append(p)
                else:
                    still.append(b)
            if accepted:
                inst[torch.as_tensor([pending[p] for p in accepted], device=device)] = after[
                    torch.as_tensor(accepted, device=device)]
            pending = still
        # An object that finds no placement keeping the earlier ones visible is left out: the image
        # then has one object fewer, and its labels say so.
        if not placed:
            continue
        done = sorted(placed)
        tex = _textures([params[b] for b in done], [placed[b][1] for b in done], side, device)
        inside = torch.stack([placed[b][0] for b in done])
        rows = torch.as_tensor(done, device=device)
        img[rows] = torch.where(inside[:, None], tex, img[rows])
        for j, b in enumerate(done):
            kept[b].append(wanted[b][slot])
            areas[b].append(placed[b][2])
            if layers:
                painted[b].append((inside[j], _quantize(tex[j])))
    for b in range(count):
        if not kept[b]:  # cannot happen for the first object (nothing to cover) unless it fell outside
            raise RuntimeError(f"study data: image (seed {seed}, index {indices[b]}) got no object")
    images = _quantize(img)
    if not layers:
        return images, inst, kept
    return images, inst, kept, background, painted


def render(seed: int, index: int, side: int = REFERENCE_SIDE, device="cpu", layers: bool = False):
    """One image: (image uint8 [S, S, 3], instances int32 [S, S], classes [object class per instance]);
    with layers=True also (background uint8 [S, S, 3], [(inside bool [S, S], texture uint8 [S, S, 3])]
    per painted object). The same bits as the image in any batch of render_many."""
    out = render_many(seed, [index], side, device, layers)
    first = (out[0][0], out[1][0], out[2][0])
    return first if not layers else first + (out[3][0], out[4][0])


def make_batch(seed: int, indices: Sequence[int], side: int = REFERENCE_SIDE, device="cpu") -> Batch:
    """Images `indices` of split `seed`, rendered together."""
    images, instances, object_classes = render_many(seed, [int(i) for i in indices], side, device)
    present = torch.zeros((len(indices), NUM_CLASSES), dtype=torch.float32, device=device)
    for b, classes in enumerate(object_classes):
        present[b, classes] = 1.0
    count = torch.tensor([len(c) for c in object_classes], dtype=torch.int64, device=device)
    return Batch(images, instances, present, count, object_classes)


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
    for first in range(0, count, 64):
        images, instances, kept = render_many(seed, range(first, min(count, first + 64)), side, device)
        for j, classes in enumerate(kept):
            name = f"s{seed}_{first + j:05d}"
            (folder / "images" / f"{name}.png").write_bytes(encode_png(images[j].cpu().numpy()))
            (folder / "masks" / f"{name}.png").write_bytes(encode_png(instances[j].cpu().numpy().astype(np.uint8)))
            records.append(dict(name=name, classes=classes, count=len(classes),
                                class_names=[CLASSES[c].name for c in classes]))
    (folder / "labels.json").write_text(json.dumps(dict(seed=seed, side=side, images=records), indent=1))
    return records
