"""Measurements of a trained study model that need its weights and gradients (docs/study.md).

Receptive field on the trained model: the gradient of one token's last hidden state (before the
merger) with respect to the pixel rows, per patch. Its non-zero set is where information can come
from at all (fixed by the schedule's patterns; equal to ariadne.receptive_field run through the
layers in reverse, tested); how the gradient mass spreads over it is what training made of it.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np
import torch

import ariadne

from .model import StudyViT, pixel_rows


def native_index(grid: Tuple[int, int], row: int, col: int, merge: int) -> int:
    """Position of patch (row, col) in the block_row order of one image."""
    h, w = grid
    if not (0 <= row < h and 0 <= col < w):
        raise ValueError(f"native_index: patch ({row}, {col}) is outside the grid {h}x{w}")
    unit = (row // merge) * (w // merge) + col // merge
    return unit * merge * merge + (row % merge) * merge + col % merge


def input_gradient_map(model: StudyViT, image: torch.Tensor, row: Optional[int] = None, col: Optional[int] = None,
                       seed: int = 0) -> np.ndarray:
    """float64 [h, w]: the norm of d(p · hidden[token]) / d(pixel row) per patch, raster order, for
    the token at patch (row, col) (default: the centre) of one uint8 image [H, W, 3]; p is a fixed
    random unit vector (`seed`), so no feature is favoured."""
    c = model.config
    rows, grids = pixel_rows(image[None], c)
    grid = grids[0]
    row = grid[0] // 2 if row is None else row
    col = grid[1] // 2 if col is None else col
    rows = rows.detach().requires_grad_(True)
    hidden = model.hidden(rows, grids)
    gen = torch.Generator().manual_seed(seed)
    p = torch.randn(c.hidden, generator=gen, dtype=torch.float64)
    p = (p / p.norm()).to(device=hidden.device, dtype=hidden.dtype)
    # autograd.grad, not backward(): the parameters' .grad stay as they are.
    (grad,) = torch.autograd.grad((hidden[native_index(grid, row, col, c.merge)] * p).sum(), rows)
    g = grad.double().norm(dim=1).cpu().numpy()
    out = np.zeros(grid[0] * grid[1])
    out[np.asarray(ariadne.order([grid], "block_row", c.merge, c.window_units).perm)] = g  # sequence -> raster
    return out.reshape(grid)


def receptive_field(model: StudyViT, images: torch.Tensor, mass: float = 0.9) -> Dict[str, float]:
    """Over uint8 images [B, H, W, 3], for each image's centre token: `reach` the share of patches
    with a non-zero gradient, `erf` the share of patches that hold `mass` of the gradient norm
    (the largest first), `distance_px` the gradient-weighted mean distance from the centre patch in
    pixels. Means over the images."""
    was_training = model.training
    model.eval()
    reach, erf, dist = [], [], []
    for image in images:
        g = input_gradient_map(model, image)
        h, w = g.shape
        flat = np.sort(g.ravel())[::-1]
        total = flat.sum()
        reach.append(float((g > 0).mean()))
        erf.append(float((np.searchsorted(np.cumsum(flat), mass * total) + 1) / flat.size) if total > 0 else 0.0)
        yy, xx = np.mgrid[0:h, 0:w]
        d = np.hypot(yy - h // 2, xx - w // 2) * model.config.patch
        dist.append(float((g * d).sum() / total) if total > 0 else 0.0)
    model.train(was_training)
    return dict(reach=float(np.mean(reach)), erf=float(np.mean(erf)), distance_px=float(np.mean(dist)))
