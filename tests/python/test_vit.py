"""The vision encoder through Python (ariadne.encode and friends) against the committed HF reference
pair in tests/data/vit (made by scripts/make_vit_reference.py with transformers' own Qwen2.5-VL
tower and image processor) and against the C++ CLI (`ariadne encode`, when a built one is found:
$ARIADNE_CLI or build/ariadne). CPU only; the CUDA backend test runs where a GPU and a CUDA build are.
"""

import json
import pathlib
import subprocess

import numpy as np
import pytest

import ariadne
from conftest import find_cli, rel_l2

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "vit"
IMAGES = [DATA / "image_0.png", DATA / "image_1.png"]


def read_safetensors(path):
    """The float32 tensors of a safetensors file, read with numpy alone (independent of ariadne's reader)."""
    raw = pathlib.Path(path).read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        assert e["dtype"] == "F32", (name, e["dtype"])
        a, b = e["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + a:8 + n + b], np.float32).reshape(e["shape"])
    return out


@pytest.fixture(scope="module")
def ref():
    return read_safetensors(DATA / "reference.safetensors")


@pytest.fixture(scope="module")
def weights():
    return ariadne.load_vit_weights(DATA / "weights.safetensors", "small")


def ref_grids(ref):
    thw = ref["grid_thw"].astype(int)
    assert (thw[:, 0] == 1).all()
    return [(int(h), int(w)) for _, h, w in thw]


def test_weights_load_with_sizes_from_the_file(weights):
    assert weights.prefix == "model.visual."
    assert not weights.random
    c = weights.config
    assert (c.depth, c.hidden, c.heads, c.intermediate, c.out_hidden) == (4, 32, 2, 64, 32)
    assert (c.head_dim, c.patch_dim, c.factor) == (16, 1176, 28)
    assert weights.depth == 4
    # The config is a copy: changing it does not change the weights.
    c.depth = 7
    assert weights.config.depth == 4


def test_preprocess_is_bit_exact_with_hf(ref):
    batch = ariadne.preprocess(IMAGES, "small")
    assert batch.grids == ref_grids(ref) == [(4, 6), (4, 4)]
    assert batch.values.shape == ref["pixel_values"].shape == (40, 1176)
    assert batch.values.dtype == np.float32 and not batch.values.flags.writeable
    assert np.array_equal(batch.values, ref["pixel_values"])
    # From decoded arrays and from bytes: the same rows.
    arrays = [ariadne.read_image(str(p)) for p in IMAGES]
    assert arrays[0].shape == (61, 90, 3) and arrays[0].dtype == np.uint8
    assert np.array_equal(ariadne.decode_image(IMAGES[1].read_bytes()), arrays[1])
    assert np.array_equal(ariadne.preprocess(arrays, "small").values, batch.values)
    # One image alone gives its rows of the batch.
    one = ariadne.preprocess(IMAGES[1], "small")
    assert one.grids == [(4, 4)] and np.array_equal(one.values, batch.values[24:])
    # Other options reach the library: a larger minimum size gives a larger grid (50x57 scaled by
    # sqrt(112^2 / (50 * 57)) and rounded up to multiples of 28: 112x140 px).
    assert ariadne.preprocess(IMAGES[1], "small", min_pixels=112 * 112).grids == [(8, 10)]
    shifted = ariadne.preprocess(IMAGES[1], "small", mean=(0.0, 0.0, 0.0))
    assert not np.array_equal(shifted.values, one.values)


def test_smart_resize_and_bicubic():
    # Expected values printed by transformers' smart_resize (tests/cpu/test_vit.cpp has more).
    assert ariadne.smart_resize(61, 90) == (56, 84)
    assert ariadne.smart_resize(1000, 3000) == (1008, 2996)
    assert ariadne.smart_resize(5000, 5000) == (3556, 3556)
    with pytest.raises(ariadne.Error, match="aspect"):
        ariadne.smart_resize(5000, 20)
    im = ariadne.read_image(str(IMAGES[0]))
    out = ariadne.resize_bicubic(im, 84, 56)
    assert out.shape == (56, 84, 3) and out.dtype == np.uint8
    assert np.array_equal(ariadne.resize_bicubic(im, 90, 61), im)  # no pass when the size is kept
    # A plain box average of the downsized image is close to the original's: colours survive.
    assert abs(float(out.mean()) - float(im.mean())) < 2.0


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_encoder_matches_hf(ref, weights, backend):
    grids = ref_grids(ref)
    px = ref["pixel_values"]
    r = ariadne.encode(weights, px, "chunk", grids, backend=backend)  # Qwen2.5-VL's own layout
    assert r.out.shape == ref["output"].shape == (10, 32)
    assert (r.units, r.tokens, r.out_hidden) == (10, 40, 32)
    assert r.attention_backend in ({"reference"} if backend == "reference" else {"cpu", "reference", "cpu+reference"})
    assert rel_l2(r.out, ref["output"]) <= 1e-5
    # HF with every layer full / every layer windowed: our `full` and `WWWW` schedules.
    assert rel_l2(ariadne.encode(weights, px, "full", grids, backend=backend).out, ref["output_all_full"]) <= 1e-5
    window = ariadne.encode(weights, px, ariadne.vit_schedule("WWWW", weights.config), grids, backend=backend)
    assert rel_l2(window.out, ref["output_all_window"]) <= 1e-5
    # A different schedule must not match (the comparison can fail).
    assert rel_l2(ariadne.encode(weights, px, "full", grids, backend=backend).out, ref["output"]) > 1e-4
    # End to end from our own preprocessing, the batch given as a PixelBatch.
    assert rel_l2(ariadne.encode(weights, ariadne.preprocess(IMAGES, "small"), "chunk", backend=backend).out,
                  ref["output"]) <= 1e-5
    assert set(r.times) >= {"attention", "mlp", "total"} and r.times["total"] > 0


def test_preprocess_video_matches_hf(weights):
    """HF's three-frame clip (padded to four, grid_thw [2, 4, 6]): the pixel rows (HF's video processor
    rescales and normalizes in one fused float step, so a few ulps apart: the C++ parity test's bound
    1e-6), and the encoder on them against HF's tower (video layers attend within a temporal patch)."""
    ref = read_safetensors(DATA / "video_reference.safetensors")
    frames = [DATA / f"video_frame_{i}.png" for i in range(3)]
    clip = ariadne.preprocess_video(frames, "small")
    assert clip.grids == [(4, 6), (4, 6)] and ref["grid_thw"].tolist() == [[2.0, 4.0, 6.0]]
    assert clip.values.shape == ref["pixel_values"].shape == (48, 1176)
    assert np.abs(clip.values - ref["pixel_values"]).max() <= 1e-6
    # The same frames as arrays, and the folder form, give the same rows.
    arrays = [ariadne.read_image(str(p)) for p in frames]
    assert np.array_equal(ariadne.preprocess_video(arrays, "small").values, clip.values)
    r = ariadne.encode(weights, clip, "chunk", backend="reference")
    assert rel_l2(r.out, ref["output"]) <= 1e-5
    # A still image is not a clip: the frames of one temporal patch differ in the t columns.
    still = ariadne.preprocess(frames[0], "small")
    assert not np.array_equal(still.values, clip.values[:24])
    with pytest.raises(ariadne.Error, match="not a folder"):
        ariadne.preprocess_video(str(frames[0]), "small")
    with pytest.raises(ariadne.Error):
        ariadne.preprocess_video([arrays[0], arrays[0][:30]], "small")  # two sizes are not one clip


@pytest.mark.parametrize("schedule,sink_init", [("R+R+C+F", 0.75), ("R+C+Q+W", -0.5)])
def test_encoder_matches_the_cli(tmp_path, weights, schedule, sink_init):
    """Schedules beyond the HF pair (token orders, sinks) against `ariadne encode` on the same files."""
    cli = find_cli()
    if cli is None:
        pytest.skip("no built ariadne CLI (set ARIADNE_CLI)")
    saved = tmp_path / "cli.safetensors"
    subprocess.run([cli, "encode", "--image", ",".join(map(str, IMAGES)), "--weights",
                    str(DATA / "weights.safetensors"), "--config", "small", "--schedule", schedule, "--window", "3",
                    "--sink-init", str(sink_init), "--backend", "reference", "--save-output", str(saved)],
                   check=True, capture_output=True)
    theirs = read_safetensors(saved)["output"]
    w = ariadne.load_vit_weights([DATA / "weights.safetensors"], "small", sink_init=sink_init)
    assert np.all(w.sinks(0) == np.float32(sink_init)) and not w.sinks_from_file(0)
    ours = ariadne.encode(w, ariadne.preprocess(IMAGES, w.config), schedule, window=3, backend="reference").out
    assert ours.shape == theirs.shape
    assert rel_l2(ours, theirs) <= 1e-6
    # The sink matters for these schedules: without it the output moves.
    plain = ariadne.load_vit_weights([DATA / "weights.safetensors"], "small", sink_init=float("-inf"))
    assert rel_l2(ariadne.encode(plain, ariadne.preprocess(IMAGES, w.config), schedule, window=3,
                                 backend="reference").out, theirs) > 1e-4


def test_multi_image_batch_equals_separate_runs_and_round_trip(tmp_path, rng):
    c = ariadne.VitConfig.named("small")
    w = ariadne.random_vit_weights(c, seed=int(rng.integers(1 << 30)), sink_init=0.25)
    assert w.random and "random" in w.source
    grids = [(4, 6), (6, 4), (2, 2)]
    tokens = [h * wd for h, wd in grids]
    px = rng.standard_normal((sum(tokens), c.patch_dim)).astype(np.float32)
    sched = ariadne.vit_schedule("R+C+Q+W", c, window=3)
    batch = ariadne.encode(w, px, sched, grids, backend="reference", keep_hidden=True)
    assert batch.hidden.shape == (sum(tokens), c.hidden)
    parts, t0 = [], 0
    for g, n in zip(grids, tokens):
        parts.append(ariadne.encode(w, px[t0:t0 + n], sched, [g], backend="reference").out)
        t0 += n
    assert rel_l2(batch.out, np.concatenate(parts)) <= 1e-6
    assert ariadne.encode(w, px, sched, grids, backend="reference").hidden is None
    # Save and load again (f32 keeps every bit; sinks travel when asked for).
    path = tmp_path / "w.safetensors"
    ariadne.save_vit_weights(str(path), w, dtype="f32", with_sinks=True)
    back = ariadne.load_vit_weights(path, "qwen2.5-vl")  # metadata overrides the preset's heads, window
    assert back.config.heads == 2 and back.sinks_from_file(1) and np.array_equal(back.sinks(1), w.sinks(1))
    assert np.array_equal(ariadne.encode(back, px, sched, grids, backend="reference").out, batch.out)
    # The layer plan says what each layer runs.
    plan = ariadne.vit_layer_plan(c, grids, sched)
    assert [p.kind for p in plan] == ["window", "window", "window", "chunk"]
    assert [p.order for p in plan] == ["block_row", "block_col", "qwen_window", "qwen_window"]
    assert [p.sink for p in plan] == [True, True, True, False] and plan[0].window == 3
    assert list(plan[0].cu_seqlens) == [0, 24, 48, 52]  # images; the chunk layer splits by windows
    assert len(plan[3].cu_seqlens) > 4 and plan[3].cu_seqlens[-1] == 52


def test_bad_inputs_raise_library_errors(weights, ref):
    px = ref["pixel_values"]
    grids = ref_grids(ref)
    with pytest.raises(ariadne.Error, match="patch_dim = 1176"):
        ariadne.encode(weights, px[:, :100].copy(), "chunk", grids)
    with pytest.raises(ariadne.Error, match="pixels hold 47040 values, expected tokens 48"):
        ariadne.encode(weights, px, "chunk", [(4, 6), (4, 6)])  # more tokens than rows
    with pytest.raises(ariadne.Error, match="grid 3x4"):
        ariadne.encode(weights, px[:12].copy(), "chunk", [(3, 4)])  # odd side
    with pytest.raises(ariadne.Error, match="bogus"):
        ariadne.encode(weights, px, "chunk", grids, backend="bogus")
    with pytest.raises(ariadne.Error, match="layers"):
        ariadne.encode(weights, px, ariadne.schedule("RRF"), grids)  # 3 layers for 4
    with pytest.raises(ariadne.Error, match="grids are required"):
        ariadne.encode(weights, px, "chunk")
    with pytest.raises(ariadne.Error, match="missing.safetensors"):
        ariadne.load_vit_weights(DATA / "missing.safetensors", "small")
    with pytest.raises(ariadne.Error, match="reference.safetensors"):
        ariadne.load_vit_weights(DATA / "reference.safetensors", "small")  # no tower in it
    with pytest.raises(ariadne.Error, match="unknown name 'tiny'"):
        ariadne.VitConfig.named("tiny")
    with pytest.raises(ariadne.Error, match="channels"):
        ariadne.preprocess(np.zeros((60, 60, 4), np.uint8), "small")
    with pytest.raises(ariadne.Error, match="nope.png"):
        ariadne.read_image(str(DATA / "nope.png"))
    odd = ariadne.VitConfig.named("small")
    odd.heads = 3
    with pytest.raises(ariadne.Error, match="heads 3"):
        odd.validate()
    if not ariadne.cuda_available():
        with pytest.raises(ariadne.Error):
            ariadne.encode(weights, px, "chunk", grids, backend="cuda")


def test_cuda_backend_matches_cpu(rng):
    """The encoder's CUDA backend (when the library has one) against the CPU encoder on the same
    random weights and pixels; head_dim 80 as in the real tower."""
    if not ariadne.cuda_available():
        pytest.skip("needs a CUDA build and a GPU")
    c = ariadne.VitConfig()
    c.depth, c.hidden, c.heads, c.intermediate, c.out_hidden = 4, 320, 4, 640, 64
    c.window_px, c.full_layers = 112, [1, 3]
    w = ariadne.random_vit_weights(c, seed=5, sink_init=0.5)
    grids = [(16, 20), (12, 8)]
    px = rng.standard_normal((sum(h * wd for h, wd in grids), c.patch_dim)).astype(np.float32)
    cpu = ariadne.encode(w, px, "R+C+Q+F", grids, backend="cpu")
    try:
        gpu = ariadne.encode(w, px, "R+C+Q+F", grids, backend="cuda")
    except ariadne.Error as e:
        if "not built yet" in str(e):
            pytest.skip(f"the library has no CUDA encoder yet: {e}")
        raise
    assert gpu.out.shape == cpu.out.shape
    err = rel_l2(gpu.out, cpu.out)
    print(f"vit cuda vs cpu: rel_l2 {err:.3g} (attention on {gpu.attention_backend})")
    assert err < 3e-2
