"""SHS-Index from Python: AUROC, patch labels, layer diagnostics and the index, each against a numpy
implementation of shs.hpp's definitions."""

import math

import numpy as np
import pytest

import ariadne
from conftest import reference


def auroc_numpy(pos, neg):
    pos, neg = np.asarray(pos, float)[:, None], np.asarray(neg, float)[None, :]
    return float(((pos > neg).sum() + 0.5 * (pos == neg).sum()) / (pos.size * neg.size))


def test_auroc_matches_pairwise_count(rng):
    for _ in range(5):
        pos = rng.integers(0, 6, rng.integers(1, 40)).astype(float)  # small integers: many ties
        neg = rng.integers(0, 6, rng.integers(1, 40)).astype(float)
        assert ariadne.auroc(pos.tolist(), neg.tolist()) == pytest.approx(auroc_numpy(pos, neg), abs=1e-12)
    with pytest.raises(ValueError):
        ariadne.auroc([], [1.0])


def test_read_label_map_npy(tmp_path, rng):
    ids = rng.integers(0, 5, (13, 17)).astype(np.int32)
    np.save(tmp_path / "m.npy", ids)
    np.testing.assert_array_equal(ariadne.read_label_map(str(tmp_path / "m.npy")), ids)
    with pytest.raises(ValueError, match="nope"):
        ariadne.read_label_map(str(tmp_path / "nope.png"))


def fractions_numpy(ids, grid, patch, background=(0,), ignore=(255, -1)):
    h, w = grid[0] * patch, grid[1] * patch
    ys = np.floor((np.arange(h) + 0.5) * ids.shape[0] / h).astype(int)
    xs = np.floor((np.arange(w) + 0.5) * ids.shape[1] / w).astype(int)
    r = ids[ys][:, xs]
    void = np.isin(r, ignore)
    bg = np.isin(r, background) & ~void
    fg = ~bg & ~void
    pool = lambda m: m.reshape(grid[0], patch, grid[1], patch).mean(axis=(1, 3))  # noqa: E731
    return pool(fg), pool(bg)


def test_patch_fractions_and_labels(rng):
    ids = np.zeros((90, 130), np.int32)
    ids[20:70, 30:100] = 7  # an object
    ids[18:22, 30:100] = 255  # a void band along its top border
    fg, bg = ariadne.patch_fractions(ids, (6, 9), patch=14)
    want_fg, want_bg = fractions_numpy(ids, (6, 9), 14)
    np.testing.assert_allclose(fg, want_fg, atol=1e-6)
    np.testing.assert_allclose(bg, want_bg, atol=1e-6)
    for purity in (1.0, 0.75, 0.5):
        labels = ariadne.label_patches(fg, bg, purity)
        want = np.full(fg.shape, -1, np.int8)
        want[(want_fg >= purity) & (want_fg > 0.5)] = 1
        want[(want_bg >= purity) & (want_bg > 0.5)] = 0
        np.testing.assert_array_equal(labels, want)
    assert (ariadne.label_patches(fg, bg, 1.0) == 1).any() and (ariadne.label_patches(fg, bg, 1.0) == 0).any()


@pytest.mark.parametrize("layer_spec", ["R", "C+", "W", "F+"])
def test_diagnose_layer_matches_numpy(rng, layer_spec):
    grid = (8, 12)
    layer = ariadne.schedule(layer_spec, window=6).layers[0]
    order = ariadne.order(grid, layer.order)
    pattern, cu = ariadne.layer_pattern(layer, order)
    n, heads, d = order.tokens, 3, 16
    q = rng.standard_normal((n, heads, d)).astype(np.float32)
    k = rng.standard_normal((n, heads, d)).astype(np.float32)
    sink = rng.uniform(-1, 2, heads).astype(np.float32) if layer.sink else None
    diag = ariadne.diagnose_layer(q, k, order, pattern, cu, sink=sink, backend="reference")
    assert (diag.heads, diag.tokens) == (heads, n)

    def stats(sink_mode):
        _, _, mats = reference(q, k, k, pattern, cu, None, None, sink, sink_mode)
        # One matrix per (sequence, head); stitch each head's block-diagonal matrix back together.
        seqs = len(cu) - 1
        a = np.zeros((heads, n, n))
        for s in range(seqs):
            for h in range(heads):
                a[h, cu[s]:cu[s + 1], cu[s]:cu[s + 1]] = mats[s * heads + h]
        return a

    a = stats("denominator" if layer.sink else "none")
    received = np.zeros((heads, n))
    received[:, order.perm] = a.sum(axis=1)  # back to spatial raster order
    np.testing.assert_allclose(diag.received, received, rtol=1e-4, atol=1e-6)
    ahat = a / a.sum(axis=2, keepdims=True)
    coords = order.coords.astype(np.float64)
    dist = np.linalg.norm(coords[:, None] - coords[None, :], axis=2)
    np.testing.assert_allclose(diag.distance, (ahat * dist).sum(axis=2).mean(axis=1), rtol=1e-4)
    with np.errstate(divide="ignore", invalid="ignore"):
        ent = -np.where(ahat > 0, ahat * np.log(ahat), 0).sum(axis=2).mean(axis=1)
    np.testing.assert_allclose(diag.entropy, ent, rtol=1e-4)
    if layer.sink:
        plain = np.zeros((heads, n))
        plain[:, order.perm] = stats("none").sum(axis=1)
        np.testing.assert_allclose(diag.received_no_sink, plain, rtol=1e-4, atol=1e-6)
    else:
        assert diag.received_no_sink.shape == (0, n)


def test_shs_index_matches_numpy(rng):
    layers, heads = 3, 4
    images = []
    expected = []
    for i, grid in enumerate([(6, 8), (4, 4), (5, 6)]):
        n = grid[0] * grid[1]
        labels = rng.choice(np.array([-1, 0, 1], np.int8), size=grid, p=[0.2, 0.5, 0.3])
        labels.flat[0], labels.flat[1] = 0, 1  # both classes present
        diags = []
        for _ in range(layers):
            rec = rng.gamma(2.0, 1.0, (heads, n)).astype(np.float32)
            diags.append(ariadne.LayerDiag(rec, distance=rng.uniform(1, 5, heads), entropy=rng.uniform(0, 3, heads)))
            for h in range(heads):
                a = auroc_numpy(rec[h][labels.ravel() == 1], rec[h][labels.ravel() == 0])
                expected.append(max(a, 1 - a))
        images.append((f"img{i}", labels, diags))
    summary = ariadne.shs_index(images)
    assert summary["images_scored"] == 3
    assert summary["shs_index"] == pytest.approx(np.mean(expected), abs=1e-9)
    assert np.array(summary["per_head"]).shape == (layers, heads)
    # An image without foreground is skipped, not scored.
    acc = ariadne.ShsAccumulator(layers, heads)
    none_fg = np.zeros((4, 4), np.int8)
    scores = acc.add("bg_only", (4, 4), none_fg, [ariadne.LayerDiag(np.ones((heads, 16), np.float32),
                                                                      distance=np.ones(heads), entropy=np.ones(heads))
                                                  for _ in range(layers)])
    assert not scores.scored and math.isnan(scores.heads[0].auroc)
    with pytest.raises(ValueError, match="layers of attention, expected 3"):
        acc.add("short", (4, 4), none_fg, [])
