"""Token orders, block masks, schedules, the cost model and the receptive field from Python, each
against a numpy implementation written here from the headers' definitions (compared exactly)."""

import numpy as np
import pytest

import ariadne
from conftest import visible

GRIDS = [[(4, 6)], [(14, 16)], [(2, 2), (8, 4), (6, 10)], [(16, 20), (12, 8)]]


# ---- token orders ----

def order_numpy(kind, grids, merge=2, window=4):
    """(perm, cu_seqlens, cu_windows) from order.hpp's definitions."""
    perm, cu, cu_w = [], [0], [0] if kind == "qwen_window" else []
    for h, w in grids:
        base = cu[-1]
        H, W = h // merge, w // merge

        def unit(ur, uc):
            return [base + (ur * merge + i) * w + uc * merge + j for i in range(merge) for j in range(merge)]

        if kind == "raster":
            perm += [base + i for i in range(h * w)]
        elif kind == "block_row":
            for ur in range(H):
                for uc in range(W):
                    perm += unit(ur, uc)
        elif kind == "block_col":
            for uc in range(W):
                for ur in range(H):
                    perm += unit(ur, uc)
        elif kind == "qwen_window":
            for wr in range(-(-H // window)):
                for wc in range(-(-W // window)):
                    n = 0
                    for ur in range(wr * window, min(H, (wr + 1) * window)):
                        for uc in range(wc * window, min(W, (wc + 1) * window)):
                            perm += unit(ur, uc)
                            n += merge * merge
                    if n:
                        cu_w.append(cu_w[-1] + n)
        cu.append(base + h * w)
    return np.array(perm), np.array(cu), np.array(cu_w)


@pytest.mark.parametrize("grids", GRIDS, ids=str)
@pytest.mark.parametrize("kind", ["raster", "block_row", "block_col", "qwen_window"])
def test_orders_match_numpy(kind, grids):
    o = ariadne.order(grids, kind)
    perm, cu, cu_w = order_numpy(kind, grids)
    np.testing.assert_array_equal(o.perm, perm)
    np.testing.assert_array_equal(o.cu_seqlens, cu)
    np.testing.assert_array_equal(o.cu_windows, cu_w)
    np.testing.assert_array_equal(o.inverse[o.perm], np.arange(len(perm)))
    # coords: (row, col) of each position's patch inside its own image.
    for i, (h, w) in enumerate(grids):
        s = slice(cu[i], cu[i + 1])
        local = o.perm[s] - cu[i]
        np.testing.assert_array_equal(o.coords[s], np.stack([local // w, local % w], 1).astype(np.float32))
    assert o.kind == kind and o.tokens == len(perm) and o.images == len(grids) and o.grids == list(grids)


def test_qwen_window_example_from_the_header():
    np.testing.assert_array_equal(ariadne.order((14, 16), "qwen_window").cu_windows, [0, 64, 128, 176, 224])


def test_order_arrays_are_read_only_views():
    o = ariadne.order((4, 4), "block_col")
    with pytest.raises(ValueError):
        o.perm[0] = 3
    p = o.perm
    del o  # the array keeps its owner alive
    np.testing.assert_array_equal(np.sort(p), np.arange(16))


def test_order_conversion_and_permute_tokens(rng):
    grids = [(6, 8), (4, 4)]
    a, b = ariadne.order(grids, "block_row"), ariadne.order(grids, "block_col")
    idx = ariadne.order_conversion(a, b)
    # Values that name their spatial index, laid out in order a, land in order b.
    np.testing.assert_array_equal(a.perm[idx], b.perm)
    x = rng.standard_normal((a.tokens, 3, 5)).astype(np.float32)
    wide = np.zeros((a.tokens, 3, 9), np.float32)
    dst = wide[:, :, 2:7]  # a strided destination
    ariadne.permute_tokens(x, dst, a, b)
    np.testing.assert_array_equal(dst, x[idx])


@pytest.mark.parametrize("grid,merge,message", [((5, 4), 2, "multiples of the merge size"), ((0, 4), 2, "grid is 0x4, expected positive sides"), ((4, 4), 0, "merge size is 0")])
def test_order_errors(grid, merge, message):
    with pytest.raises(ValueError, match=message):
        ariadne.order(grid, "block_row", merge=merge)
    with pytest.raises(ValueError, match="raster"):
        ariadne.order((4, 4), "zigzag")


# ---- block masks ----

def test_block_mask_from_lists_round_trip():
    rows = [[0], [0, 1], [1, 2], [0], [], [2]]  # 1 sequence, 2 heads, 3 query blocks
    m = ariadne.BlockMask.from_lists(4, 2, [10], rows)
    assert (m.block, m.heads, m.rows, m.nnz) == (4, 2, 6, 7)
    np.testing.assert_array_equal(m.row_ptr, [0, 1, 3, 5, 6, 6, 7])
    d0 = m.to_dense(0, 0, 10, 12)
    np.testing.assert_array_equal(d0, [[1, 0, 0], [1, 1, 0], [0, 1, 1]])
    np.testing.assert_array_equal(m.to_dense(0, 1, 10, 12), [[1, 0, 0], [0, 0, 0], [0, 0, 1]])
    again = ariadne.BlockMask(4, 2, m.seq_block_base, m.row_ptr, m.col_idx)
    np.testing.assert_array_equal(again.col_idx, m.col_idx)
    with pytest.raises(ValueError, match="rows given"):
        ariadne.BlockMask.from_lists(4, 2, [10], rows[:5])


def test_random_block_mask_is_inside_all_visible(rng):
    pattern, cu = ariadne.Pattern.window(20, 0), [0, 50, 61]
    full = ariadne.BlockMask.all_visible(pattern, 8, 3, 61, 61, cu)
    some = ariadne.BlockMask.random(pattern, 8, 3, 61, 61, 0.4, int(rng.integers(1000)), True, cu)
    for s, (a, b) in enumerate(zip(cu[:-1], cu[1:])):
        lq = b - a
        allowed = visible(pattern, lq, lq)
        for h in range(3):
            f, r = full.to_dense(s, h, lq, lq).astype(bool), some.to_dense(s, h, lq, lq).astype(bool)
            assert not (r & ~f).any()
            # all_visible lists exactly the blocks the dense rule touches.
            nb = -(-lq // 8)
            touched = np.array([[allowed[i * 8:(i + 1) * 8, j * 8:(j + 1) * 8].any() for j in range(nb)]
                                for i in range(nb)])
            np.testing.assert_array_equal(f, touched)
            # keep_diagonal: the block of each query block's last position stays.
            for i in range(nb):
                assert r[i, (min(lq, (i + 1) * 8) - 1) // 8]


# ---- schedules ----

def test_schedule_presets_and_syntax():
    assert {"full", "chunk", "ariadne", "mimo"} <= set(ariadne.schedule_presets())
    s = ariadne.schedule("ariadne")
    assert len(s) == 32 and s.name == "ariadne"
    assert [i for i, l in enumerate(s.layers) if l.kind == "full"] == [7, 15, 23, 31]
    assert s.letters() == "R+R+R+R+C+C+C+F" * 4
    first = s.layers[0]
    assert (first.order, first.kind, first.window, first.sink, first.letter) == ("block_row", "window", 64, True, "R")
    custom = ariadne.schedule("2x(RRC F)", window=8)
    assert custom.letters() == "RRCFRRCF" and custom.layers[2].order == "block_col" and custom.layers[2].window == 8
    with pytest.raises(ValueError, match="position"):
        ariadne.schedule("RRX")


def test_layer_pattern_feeds_attention(rng):
    grids = [(8, 8), (4, 6)]
    order = ariadne.order(grids, "block_row")
    layer = ariadne.schedule("R", window=5).layers[0]
    pattern, cu = ariadne.layer_pattern(layer, order)
    assert pattern == ariadne.Pattern.window(5, 5)
    np.testing.assert_array_equal(cu, order.cu_seqlens)
    q = rng.standard_normal((order.tokens, 2, 8)).astype(np.float32)
    out, _ = ariadne.attention(q, q, q, pattern=pattern, cu_seqlens=cu, backend="reference")
    assert np.isfinite(out).all()
    chunk_layer = ariadne.schedule("W").layers[0]
    _, cu_w = ariadne.layer_pattern(chunk_layer, ariadne.order(grids, "qwen_window"))
    np.testing.assert_array_equal(cu_w, ariadne.order(grids, "qwen_window").cu_windows)
    with pytest.raises(ValueError, match="order"):
        ariadne.layer_pattern(chunk_layer, order)


# ---- cost model ----

PAIR_CASES = [
    (ariadne.Pattern.full(), [0, 100], None),
    (ariadne.Pattern.causal(), [0, 37, 37, 90], None),
    (ariadne.Pattern.window(6, 2), [0, 20, 65], None),
    (ariadne.Pattern.chunked(9), [0, 50], None),
    (ariadne.Pattern.causal(), [0, 10, 30], [0, 25, 31]),
]


@pytest.mark.parametrize("pattern,cu_q,cu_k", PAIR_CASES, ids=lambda x: repr(x))
def test_count_pairs_and_tiles_match_dense_masks(pattern, cu_q, cu_k):
    cu_k_ = cu_k or cu_q
    heads, tile = 3, (16, 8)
    pairs, full, partial = 0, 0, 0
    for s in range(len(cu_q) - 1):
        lq, lk = cu_q[s + 1] - cu_q[s], cu_k_[s + 1] - cu_k_[s]
        m = visible(pattern, lq, lk)
        pairs += int(m.sum())
        for i in range(0, lq, tile[0]):
            for j in range(0, lk, tile[1]):
                sub = m[i:i + tile[0], j:j + tile[1]]
                full += bool(sub.all())
                partial += bool(sub.any() and not sub.all())
    kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    assert ariadne.count_pairs(pattern, cu_q[-1], cu_k_[-1], heads, **kw) == heads * pairs
    t = ariadne.count_tiles(pattern, cu_q[-1], cu_k_[-1], heads, tile, **kw)
    assert (t.full, t.partial) == (heads * full, heads * partial)


def test_count_pairs_with_blocks():
    pattern = ariadne.Pattern.causal()
    mask = ariadne.BlockMask.random(pattern, 8, 2, 45, 45, 0.5, 7)
    expected = 0
    for h in range(2):
        lists = [mask.col_idx[mask.row_ptr[h * 6 + m]:mask.row_ptr[h * 6 + m + 1]] for m in range(6)]
        expected += int(visible(pattern, 45, 45, lists, 8).sum())
    assert ariadne.count_pairs(pattern, 45, 45, 2, blocks=mask) == expected


def test_whole_encoder_flops():
    assert ariadne.image_grid(896) == (64, 64)
    full = ariadne.flops("full", 896)
    n = 64 * 64
    assert full.flops == 4 * n * n * 1280 * 32  # 4 d per pair, 16 heads x 80 = 1280, 32 layers
    assert full.flops_paper == 4 * full.flops and round(full.flops_paper / 1e12, 1) == 11.0
    ari = ariadne.flops("ariadne", 896)
    assert round(ari.flops_paper / 1e12, 2) == 1.68  # the paper's 1.68T
    assert ari.layers == 32 and len(ari.layer_pairs) == 32 and int(ari.layer_pairs.sum()) == ari.pairs
    # The same from a grid list and from a Schedule object.
    assert ariadne.flops(ariadne.schedule("ariadne"), [(64, 64)]).flops == ari.flops
    two = ariadne.flops("full", [(64, 64), (32, 32)])
    assert two.pairs == 16 * 32 * (n * n + 1024 * 1024)
    assert 0 < ari.useful_fraction <= 1 and ari.tiles.visited > 0
    with pytest.raises(ValueError, match="multiple of 28"):
        ariadne.flops("full", 900)


# ---- receptive field ----

def spread_numpy(schedule, grid, start, merge=1):
    """Coverage after each layer, simulated with the orders' permutations (receptive_field.hpp)."""
    h, w = grid
    covered = np.zeros(h * w, bool)
    covered[start[0] * w + start[1]] = True
    coverage = []
    for layer in schedule.layers:
        o = ariadne.order(grid, layer.order, merge=merge)
        seq = covered[o.perm]
        if layer.kind == "full":
            seq[:] = seq.any()
        else:
            k = np.convolve(seq.astype(int), np.ones(2 * layer.window + 1, int), mode="same") > 0
            seq = seq | k
        covered = np.zeros_like(covered)
        covered[o.perm] = seq
        coverage.append(covered.mean())
    return np.array(coverage)


@pytest.mark.parametrize("spec", ["RRRRCCC", "RRRRRRR", "RCRF", "CCR"])
def test_receptive_field_matches_simulation(spec):
    s = ariadne.schedule(spec, window=4)
    rf = ariadne.receptive_field(s, (10, 14), start=(4, 6))
    np.testing.assert_allclose(rf.coverage, spread_numpy(s, (10, 14), (4, 6)), rtol=0, atol=1e-12)
    assert rf.reached.shape == (10, 14) and rf.reached[4, 6] == 0


def test_receptive_field_talk_example():
    # The talk: RRRR-CCC covers the whole 10x14 grid by layer 7; seven row layers about 41%.
    assert ariadne.receptive_field("RRRRCCC", (10, 14), window=4).coverage[-1] == 1.0
    assert abs(ariadne.receptive_field("RRRRRRR", (10, 14), window=4).coverage[-1] - 0.41) < 0.02
