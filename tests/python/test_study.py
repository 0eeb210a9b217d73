"""The training study's CPU parts (ariadne.study, docs/study.md): the procedural data and its exact
masks, the PyTorch ViT on ariadne's op against the C++ encoder, a tiny training run whose loss must
fall below what the labels' base rates allow, and checkpoints read back by ariadne (Python binding
and, when a built CLI is found, `ariadne encode` / `ariadne shs --weights`). About 15 s on 2 cores."""

import json
import math
import subprocess

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ariadne  # noqa: E402
from ariadne.study import checkpoint, data, train  # noqa: E402
from ariadne.study.model import StudyViT, pixel_rows, study_config, study_schedule  # noqa: E402
from conftest import find_cli, rel_l2  # noqa: E402

# The encoder on the CPU against HF's fp32 tower: tol 1e-5 (docs/numerics.md); the same tower here.
ENCODER_TOL = 1e-5


@pytest.fixture(autouse=True)
def _one_thread():
    # The tensors here are tiny, and on a machine shared with other jobs a second thread mostly
    # waits at barriers for a core that is busy elsewhere (50x slower on CI's 2 cores): one thread.
    before = torch.get_num_threads(), ariadne.cpu_threads()
    torch.set_num_threads(1)
    ariadne.set_cpu_threads(1)
    yield
    torch.set_num_threads(before[0])
    ariadne.set_cpu_threads(before[1])


def test_generator_is_deterministic_per_seed_and_differs_across_seeds():
    a = data.make_batch(7, [0, 1, 2], side=112)
    b = data.make_batch(7, [0, 1, 2], side=112)
    assert torch.equal(a.images, b.images) and torch.equal(a.instances, b.instances)
    assert a.object_classes == b.object_classes
    # An image depends on (seed, index) only, not on what was rendered before it.
    # A batch draws every image's elements on the rows that have them: an image is the same bits
    # alone and beside images with more or fewer objects, stripes, blobs and strokes.
    alone = data.render(7, 2, side=112)
    assert torch.equal(alone[0], a.images[2]) and torch.equal(alone[1], a.instances[2])
    wide = data.make_batch(7, [9, 2, 5, 0, 1], side=112)
    assert len({len(c) for c in wide.object_classes}) > 1
    for j, i in ((1, 2), (3, 0), (4, 1)):
        assert torch.equal(wide.images[j], a.images[i]) and torch.equal(wide.instances[j], a.instances[i])
        assert wide.object_classes[j] == a.object_classes[i]
    other = data.make_batch(8, [0, 1, 2], side=112)
    for i in range(3):
        assert not torch.equal(other.images[i], a.images[i])
    assert not torch.equal(a.images[0], a.images[1])
    assert a.images.dtype == torch.uint8 and a.images.shape == (3, 112, 112, 3)
    with pytest.raises(ValueError, match="multiple of 28"):
        data.render(0, 0, side=100)


@pytest.mark.parametrize("seed", [0, 3])
def test_masks_are_exact_and_labels_follow_them(seed):
    side = 224
    for index in range(4):
        image, inst, classes, background, layers = data.render(seed, index, side, layers=True)
        # Painting the layers again gives the image and the mask, pixel for pixel.
        expect_img, expect_ids = background.clone(), torch.zeros_like(inst)
        for k, (inside, texture) in enumerate(layers):
            expect_img[inside] = texture[inside]
            expect_ids[inside] = k + 1
        assert torch.equal(image, expect_img) and torch.equal(inst, expect_ids)
        # Mask pixels are exactly the object's drawn pixels: its texture there, the background elsewhere.
        for k, (inside, texture) in enumerate(layers):
            own = inst == k + 1
            assert torch.equal(image[own], texture[own])
            covered = inside & ~own  # drawn, then painted over by later objects only
            assert bool((inst[covered] > k + 1).all())
            assert own.sum() >= data.MIN_VISIBLE * inside.sum() > 0
        assert torch.equal(image[inst == 0], background[inst == 0])
        # Labels: one class per instance id present, the count the number of ids.
        ids = sorted(int(i) for i in inst.unique() if i > 0)
        assert ids == list(range(1, len(classes) + 1)) and 1 <= len(classes) <= data.MAX_OBJECTS
    batch = data.make_batch(seed, range(4), side)
    for b, classes in enumerate(batch.object_classes):
        assert int(batch.count[b]) == len(classes) == int(batch.instances[b].max())
        assert set(np.flatnonzero(batch.present[b].numpy())) == set(classes)


def test_split_files_are_what_ariadne_reads(tmp_path):
    records = data.write_split(tmp_path, seed=5, count=2, side=112)
    labels = json.loads((tmp_path / "labels.json").read_text())
    assert [r["name"] for r in labels["images"]] == [r["name"] for r in records]
    for i, r in enumerate(records):
        image, inst, classes = data.render(5, i, 112)
        assert np.array_equal(ariadne.read_image(str(tmp_path / "images" / f"{r['name']}.png")), image.numpy())
        assert np.array_equal(ariadne.read_label_map(str(tmp_path / "masks" / f"{r['name']}.png")), inst.numpy())
        assert r["classes"] == classes and r["count"] == len(classes)


def test_pixel_rows_equal_ariadne_preprocess():
    c = study_config(8, 32, 2)
    images = data.make_batch(1, [0, 1], side=224).images
    rows, grids = pixel_rows(images, c)
    ref = ariadne.preprocess([im.numpy() for im in images], c)
    assert grids == ref.grids == [(16, 16), (16, 16)]
    assert np.array_equal(rows.numpy(), ref.values)


def _random_sinks(model, gen):
    with torch.no_grad():
        for block in model.blocks:
            if block.attn.sinks is not None:
                block.attn.sinks.copy_(torch.rand(block.attn.sinks.shape, generator=gen) * 4 - 2)


@pytest.mark.parametrize("name", ["ariadne", "chunk+sink", "swa2d"])
def test_checkpoint_round_trips_through_ariadne(tmp_path, name):
    # Window 16 on a 16x16 grid: every local layer sees a part of the image only, so schedules differ.
    c = study_config(8, 32, 2)
    schedule = study_schedule(name, c, window=16)
    torch.manual_seed(3)
    model = StudyViT(c, schedule, data.NUM_CLASSES, data.MAX_OBJECTS, window=16)
    _random_sinks(model, torch.Generator().manual_seed(4))
    path = tmp_path / "model.safetensors"
    checkpoint.save(path, model, dict(classes=data.NUM_CLASSES, max_count=data.MAX_OBJECTS))
    images = data.make_batch(2, [0, 1], side=224).images
    rows, grids = pixel_rows(images, c)
    with torch.no_grad():
        ours = model.encode(rows, grids).numpy()
    w = ariadne.load_vit_weights(path, "qwen2.5-vl")  # the file's metadata overrides the preset
    assert (w.config.depth, w.config.hidden, w.config.heads, list(w.config.full_layers)) == (8, 32, 2, [7])
    for layer, spec in enumerate(schedule.layers):
        assert w.sinks_from_file(layer) == spec.sink
        if spec.sink:
            assert np.array_equal(w.sinks(layer), model.blocks[layer].attn.sinks.detach().numpy())
    theirs = ariadne.encode(w, rows.numpy(), schedule, grids, backend="reference").out
    assert rel_l2(ours, theirs) <= ENCODER_TOL
    # The comparison can fail: another schedule on the same weights is far off.
    assert rel_l2(ariadne.encode(w, rows.numpy(), "full", grids, backend="reference").out, theirs) > 1e-3
    # Back into PyTorch: the same tensors, so the same outputs and predictions.
    again, record = checkpoint.load(path)
    assert record["schedule"] == schedule.letters() and record["window"] == 16
    for (n1, p1), (n2, p2) in zip(model.state_dict().items(), again.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2), n1
    with torch.no_grad():
        assert torch.equal(again.encode(rows, grids), torch.from_numpy(ours))
        assert all(torch.equal(a, b) for a, b in zip(again(rows, grids), model(rows, grids)))
    # bf16 files keep the layout; values are rounded to bf16 (8 bits of mantissa).
    checkpoint.save(tmp_path / "bf16.safetensors", model, dict(classes=10, max_count=4), dtype="BF16")
    half = ariadne.load_vit_weights(tmp_path / "bf16.safetensors", "qwen2.5-vl")
    assert rel_l2(ariadne.encode(half, rows.numpy(), schedule, grids, backend="reference").out, theirs) < 5e-2


def test_checkpoint_errors_name_the_file_and_tensor(tmp_path):
    path = tmp_path / "short.safetensors"
    path.write_bytes(b"\x01")
    with pytest.raises(ValueError, match="short.safetensors"):
        checkpoint.read_safetensors(path)
    c = study_config(8, 32, 2)
    model = StudyViT(c, study_schedule("chunk", c, 16), 10, 4, 16)
    tensors = checkpoint.checkpoint_tensors(model)
    del tensors["visual.blocks.3.mlp.up_proj.bias"]
    meta = {"vision_config": json.dumps(checkpoint.vision_config(c)),
            "study": json.dumps(dict(schedule="chunk", window=16, classes=10, max_count=4))}
    checkpoint.write_safetensors(path, tensors, meta)
    with pytest.raises(ValueError, match="no tensor 'visual.blocks.3.mlp.up_proj.bias'"):
        checkpoint.load(path)


@pytest.mark.parametrize("name", ["ariadne", "chunk+sink"])
def test_every_parameter_gets_a_gradient(name):
    """The only path from the loss to the layers below the last is through ariadne's backward."""
    c = study_config(8, 32, 2)
    torch.manual_seed(1)
    model = StudyViT(c, study_schedule(name, c, 16), data.NUM_CLASSES, data.MAX_OBJECTS, 16)
    b = data.make_batch(4, [0, 1], side=224)
    rows, grids = pixel_rows(b.images, c)
    train.loss_of(*model(rows, grids), b.present, b.count).backward()
    for n, p in model.named_parameters():
        assert p.grad is not None and bool(torch.isfinite(p.grad).all()) and float(p.grad.abs().max()) > 0, n
    assert sum(1 for n, _ in model.named_parameters() if n.endswith("attn.sinks")) == 7


@pytest.mark.parametrize("name", ["ariadne", "chunk+sink", "swa2d"])
def test_ariadne_path_equals_the_sdpa_path_with_gradients(name):
    """The same model through torch's SDPA with dense masks built from the orders: outputs and every
    parameter's gradient agree (fp32; tolerance of docs/numerics.md's gradient rule, 2 * 2e-5)."""
    c = study_config(8, 32, 2)
    torch.manual_seed(2)
    ours = StudyViT(c, study_schedule(name, c, 16), data.NUM_CLASSES, data.MAX_OBJECTS, 16)
    _random_sinks(ours, torch.Generator().manual_seed(3))
    ref = StudyViT(c, ours.schedule, data.NUM_CLASSES, data.MAX_OBJECTS, 16, attention="sdpa")
    ref.load_state_dict(ours.state_dict())
    b = data.make_batch(6, [0, 1], side=224)
    rows, grids = pixel_rows(b.images, c)
    for m in (ours, ref):
        train.loss_of(*m(rows, grids), b.present, b.count).backward()
    with torch.no_grad():
        assert rel_l2(ours.encode(rows, grids).numpy(), ref.encode(rows, grids).numpy()) <= ENCODER_TOL
    grads = dict(ref.named_parameters())
    for n, p in ours.named_parameters():
        assert rel_l2(p.grad.numpy(), grads[n].grad.numpy()) <= 4e-5, n


def _prior_loss(present, count):
    """The loss of the best input-blind prediction on these labels: each class at its frequency and
    the count at its empirical distribution. Beating it needs the pixels."""
    p = present.mean(0).clamp(1e-6, 1 - 1e-6)
    bce = float(-(present * p.log() + (1 - present) * (1 - p).log()).mean())
    freq = torch.bincount(count - 1, minlength=data.MAX_OBJECTS).float() / len(count)
    ce = float(-(freq[count - 1]).log().mean())
    return bce + ce


def test_tiny_model_trains_on_the_cpu(tmp_path):
    argv = ["--schedules", "ariadne", "--seeds", "0", "--steps", "40", "--batch", "8", "--size", "112",
            "--device", "cpu", "--depth", "8", "--hidden", "32", "--heads", "2", "--train-images", "16",
            "--eval-images", "8", "--shs-images", "2", "--lr", "3e-3", "--log-every", "0", "--out", str(tmp_path)]
    assert train.main(argv) == 0
    run = json.loads((tmp_path / "runs" / "ariadne" / "seed0" / "metrics.json").read_text())
    losses = run["losses"]
    assert len(losses) == 40 and all(math.isfinite(x) for x in losses)
    split = train.render_split(0, 16, 112, "cpu")
    prior = _prior_loss(split.present, split.count)
    # Falling below the input-blind optimum on the training images takes gradients through the
    # encoder (ariadne's backward); the head's biases alone stop at `prior`.
    assert sum(losses[-5:]) / 5 < 0.7 * prior < losses[0]
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["summary"]) == {"ariadne"} and results["summary"]["ariadne"]["exact"]["n"] == 1
    # The sinks and the first layer were trained (their gradients come from the op's backward).
    model, record = checkpoint.load(tmp_path / "runs" / "ariadne" / "seed0" / "model.safetensors")
    assert record["steps"] == 40 and record["schedule"] == "R+R+R+R+C+C+C+F"
    assert float(model.blocks[0].attn.sinks.detach().abs().max()) > 1e-3
    torch.manual_seed(0)
    fresh = StudyViT(model.config, model.schedule, data.NUM_CLASSES, data.MAX_OBJECTS, model.window)
    assert not torch.equal(fresh.blocks[0].attn.qkv.weight, model.blocks[0].attn.qkv.weight)
    # Same seed and options: a run repeats bit for bit on one device (short runs: the check is the same).
    short = [x if x != "40" else "6" for x in argv[:-1]]
    runs = []
    for name in ("a", "b"):
        assert train.main(short + [str(tmp_path / name)]) == 0
        runs.append(json.loads((tmp_path / name / "runs" / "ariadne" / "seed0" / "metrics.json").read_text()))
    assert len(runs[0]["losses"]) == 6 and runs[0]["losses"] == runs[1]["losses"]
    assert runs[0]["heldout"] == runs[1]["heldout"]
    # A later call into the same folder with the same settings joins the summary; other settings do not.
    joined = [x if x != "ariadne" else "chunk" for x in short] + [str(tmp_path / "a")]
    assert train.main(joined) == 0
    assert set(json.loads((tmp_path / "a" / "results.json").read_text())["summary"]) == {"ariadne", "chunk"}
    other = [x if x != "6" else "5" for x in joined]
    assert train.main(other) == 0
    assert set(json.loads((tmp_path / "a" / "results.json").read_text())["summary"]) == {"chunk"}


def test_cli_reads_a_study_checkpoint(tmp_path):
    cli = find_cli()
    if cli is None:
        pytest.skip("no built ariadne CLI (set ARIADNE_CLI)")
    c = study_config(8, 32, 2)
    schedule = study_schedule("ariadne", c, window=16)
    torch.manual_seed(5)
    model = StudyViT(c, schedule, data.NUM_CLASSES, data.MAX_OBJECTS, window=16)
    _random_sinks(model, torch.Generator().manual_seed(6))
    weights = tmp_path / "model.safetensors"
    checkpoint.save(weights, model, dict(classes=data.NUM_CLASSES, max_count=data.MAX_OBJECTS))
    records = data.write_split(tmp_path / "heldout", seed=9, count=2, side=224)
    image = tmp_path / "heldout" / "images" / f"{records[0]['name']}.png"
    saved = tmp_path / "out.safetensors"
    # The schedule has the checkpoint's 8 layers, not the preset's 32: the CLI takes the file's depth.
    subprocess.run([cli, "encode", "--image", str(image), "--weights", str(weights), "--schedule", schedule.letters(),
                    "--window", "16", "--backend", "reference", "--save-output", str(saved)],
                   check=True, capture_output=True)
    theirs = checkpoint.read_safetensors(saved)[0]["output"].numpy()
    rows, grids = pixel_rows(torch.from_numpy(ariadne.read_image(str(image)))[None], c)
    with torch.no_grad():
        assert rel_l2(model.encode(rows, grids).numpy(), theirs) <= ENCODER_TOL
    r = subprocess.run([cli, "shs", "--weights", str(weights), "--schedule", schedule.letters(), "--window", "16",
                        "--image", str(tmp_path / "heldout" / "images"), "--masks", str(tmp_path / "heldout" / "masks"),
                        "--backend", "reference", "--json", "yes"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    summary = json.loads(r.stdout)
    assert summary["random_weights"] is False
    assert 0.5 <= summary["shs_index"] <= 1.0


def test_macro_auroc_against_pair_counting():
    """macro_auroc against the definition: the share of (positive, negative) pairs ordered right, ties
    half; constant classes left out."""
    rng = np.random.default_rng(5)
    scores = rng.integers(0, 6, size=(40, 4)).astype(np.float32)  # few values: many ties
    present = (rng.random((40, 4)) < 0.4).astype(np.float32)
    present[:, 3] = 1.0  # present everywhere: no AUC
    want = []
    for c in range(3):
        pos, neg = scores[present[:, c] == 1, c], scores[present[:, c] == 0, c]
        pairs = [(1.0 if p > n else 0.5 if p == n else 0.0) for p in pos for n in neg]
        want.append(sum(pairs) / len(pairs))
    got = train.macro_auroc(torch.from_numpy(scores), torch.from_numpy(present))
    assert got == pytest.approx(sum(want) / 3, abs=1e-12)
    assert train.macro_auroc(torch.arange(4.0).reshape(4, 1), torch.tensor([[0.], [0.], [1.], [1.]])) == 1.0
    assert math.isnan(train.macro_auroc(torch.zeros(3, 1), torch.ones(3, 1)))


def test_report_table_and_pearson():
    from ariadne.study import report

    assert report.pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert report.pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert report.pearson([1, 2], [1, 2]) is None and report.pearson([1, 1, 1], [1, 2, 3]) is None
    stat = lambda m: dict(mean=m, std=0.01, n=3)  # noqa: E731
    summary = {name: dict(exact=stat(a), count=stat(c), shs_index=stat(s)) for name, a, c, s in
               [("full", 0.8, 0.5, 0.70), ("chunk", 0.6, 0.4, 0.62), ("ariadne", 0.75, 0.2, 0.69)]}
    text = report.render(dict(summary=summary, args=dict(steps=10), runs=[dict(device="cpu")]))
    assert "| chunk | 3 | 0.600 ± 0.010 | 0.400 ± 0.010 | 0.620 ± 0.010 |" in text
    r = report.pearson([0.70, 0.62, 0.69], [0.8, 0.6, 0.75])
    assert f"(SHS-Index vs exact accuracy) over 3 configurations: {r:.3f}" in text
    r = report.pearson([0.70, 0.62, 0.69], [0.5, 0.4, 0.2])
    assert f"(SHS-Index vs count accuracy) over 3 configurations: {r:.3f}" in text
    assert "class AUROC)" not in text  # no run has it


CUDA = torch.cuda.is_available() and ariadne.cuda_available()


def _bf16_step_against_fp32_and_sdpa(name, config, side, device):
    """One training step as the GPU run takes it (bf16 autocast, q/k/v in bf16 on ariadne's kernels)
    against the fp32 model on the CPU, and against the SDPA path in bf16 on the same device: encoder
    outputs within the whole-network bf16 bound of docs/numerics.md (2e-2); all gradients together
    within 3e-2 of SDPA's; each parameter's gradient within 1e-1 of the fp32 model's (SDPA path, on
    the CPU), or no further from it than twice bf16 SDPA's own distance. A small gradient (a layer's
    two sink logits) carries bf16 noise of that size on both paths, in different directions, so two
    bf16 gradients are compared through the fp32 one, not with each other."""
    schedule = study_schedule(name, config)
    torch.manual_seed(0)
    cpu = StudyViT(config, schedule, data.NUM_CLASSES, data.MAX_OBJECTS)
    _random_sinks(cpu, torch.Generator().manual_seed(1))
    b = data.make_batch(11, [0, 1], side=side)
    rows, grids = pixel_rows(b.images, config)
    with torch.no_grad():
        ref = cpu.encode(rows, grids).numpy()
    exact = StudyViT(config, schedule, data.NUM_CLASSES, data.MAX_OBJECTS, attention="sdpa")
    exact.load_state_dict(cpu.state_dict())
    train.loss_of(*exact(rows, grids), b.present, b.count).backward()
    fp32 = {n: p.grad.numpy() for n, p in exact.named_parameters()}
    grads = {}
    # FlexAttention has no backward on the CPU: its path is checked with gradients on the GPU only.
    attentions = ("ariadne", "sdpa") + (("flex",) if device == "cuda" else ())
    for attention in attentions:
        model = StudyViT(config, schedule, data.NUM_CLASSES, data.MAX_OBJECTS, attention_dtype=torch.bfloat16,
                         attention=attention).to(device)
        model.load_state_dict(cpu.state_dict())
        x = rows.to(device)
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            with torch.no_grad():
                out = model.encode(x, grids).float().cpu().numpy()
            loss = train.loss_of(*model(x, grids), b.present.to(device), b.count.to(device))
        loss.backward()
        assert rel_l2(out, ref) <= 2e-2, attention
        grads[attention] = {n: p.grad.float().cpu().numpy() for n, p in model.named_parameters()}
    names = sorted(grads["ariadne"])
    for other in attentions[:1] + attentions[2:]:  # ariadne's and flex's against sdpa's
        flat = [np.concatenate([grads[a][n].ravel() for n in names]) for a in (other, "sdpa")]
        assert rel_l2(flat[0], flat[1]) <= 3e-2, other
        for n in names:
            error, anchor = rel_l2(grads[other][n], fp32[n]), rel_l2(grads["sdpa"][n], fp32[n])
            assert error <= max(1e-1, 2 * anchor), (other, n, error, anchor)


@pytest.mark.parametrize("name", ["ariadne", "chunk+sink", "swa2d"])
def test_flex_path_equals_the_sdpa_path_forward(name):
    """The FlexAttention path (block masks of the same dense masks, the sink as a score_mod on an
    extra key) gives the SDPA path's encoder output (fp32, CPU, forward only)."""
    c = study_config(8, 32, 2)
    torch.manual_seed(4)
    flex = StudyViT(c, study_schedule(name, c, 16), data.NUM_CLASSES, data.MAX_OBJECTS, 16, attention="flex")
    _random_sinks(flex, torch.Generator().manual_seed(5))
    ref = StudyViT(c, flex.schedule, data.NUM_CLASSES, data.MAX_OBJECTS, 16, attention="sdpa")
    ref.load_state_dict(flex.state_dict())
    rows, grids = pixel_rows(data.make_batch(6, [0, 1], side=224).images, c)
    with torch.no_grad():
        assert rel_l2(flex.encode(rows, grids).numpy(), ref.encode(rows, grids).numpy()) <= ENCODER_TOL


@pytest.mark.parametrize("name", ["ariadne", "chunk+sink"])
def test_bf16_step_on_the_cpu(name):
    _bf16_step_against_fp32_and_sdpa(name, study_config(8, 64, 2), 224, "cpu")


@pytest.mark.skipif(not CUDA, reason="needs a CUDA build and a GPU")
@pytest.mark.parametrize("name", ["ariadne", "chunk+sink", "full"])
def test_bf16_step_on_the_gpu_at_the_study_size(name):
    _bf16_step_against_fp32_and_sdpa(name, study_config(), 448, "cuda")


def test_report_pictures(tmp_path):
    import xml.dom.minidom

    from ariadne.study import report

    stat = lambda m: dict(mean=m, std=0.0, n=1)  # noqa: E731
    summary = {"full": dict(exact=stat(0.8), shs_index=stat(0.7), shs_per_layer=[0.6, 0.7, 0.8]),
               "chunk": dict(exact=stat(0.6), shs_index=stat(0.62), shs_per_layer=[0.6, 0.62, 0.64])}
    written = report.write_pictures(dict(summary=summary), tmp_path)
    assert [p.name for p in written] == ["shs_per_layer.svg", "accuracy_vs_shs.svg"]
    lines = xml.dom.minidom.parse(str(written[0])).getElementsByTagName("polyline")
    assert len(lines) == 2 and len(lines[0].getAttribute("points").split()) == 3
    assert len(xml.dom.minidom.parse(str(written[1])).getElementsByTagName("circle")) == 2
    # Without SHS figures there is nothing to draw.
    assert report.write_pictures(dict(summary={"full": dict(exact=stat(0.5))}), tmp_path / "none") == []


@pytest.mark.parametrize("letters,window", [("R+R+R+R+C+C+C+C+", 3), ("RRRRRRRR", 3), ("QQQQWWWW", 2)])
def test_gradient_reach_equals_the_schedules_receptive_field(letters, window):
    """Where a token's last hidden state has a non-zero gradient in the pixels is fixed by the
    patterns: ariadne.receptive_field run through the layers in reverse (it spreads forward from a
    token; a gradient gathers backward) gives the same patches, exactly. Schedules without a full
    layer, so that the reach is partial; two start patches."""
    from ariadne.study import measure

    c = study_config(8, 32, 2)
    schedule = study_schedule(letters, c, window)
    torch.manual_seed(0)
    model = StudyViT(c, schedule, data.NUM_CLASSES, data.MAX_OBJECTS, window)
    image = data.make_batch(0, [0], side=224).images[0]
    backward = ariadne.schedule("".join(s.letter + ("+" if s.sink else "") for s in reversed(schedule.layers)), window)
    for row, col in [(8, 8), (3, 12)]:
        g = measure.input_gradient_map(model, image, row, col)
        rf = ariadne.receptive_field(backward, g.shape, (row, col), window=window, merge=2)
        reached = np.asarray(rf.reached).reshape(g.shape) >= 0
        assert 0 < reached.mean() < 1
        assert np.array_equal(g > 0, reached)
    r = measure.receptive_field(model, data.make_batch(0, [0, 1], side=224).images)
    assert 0 < r["erf"] <= r["reach"] < 1 and r["distance_px"] > 0


def test_report_merges_study_parts_and_refuses_mixed_or_repeated_runs(tmp_path):
    import json

    from ariadne.study import report

    def write(folder, run, seed, exact, steps=10):
        d = tmp_path / folder / "runs" / run / f"seed{seed}"
        d.mkdir(parents=True)
        record = dict(run=run, seed=seed, device="cpu", settings=dict(steps=steps, batch=4), loss_last=1.0 - exact,
                      losses=[2.0, 1.0], heldout=dict(exact=exact, set=exact, count=exact))
        (d / "metrics.json").write_text(json.dumps(record))

    write("a", "full", 0, 0.5)
    write("a", "chunk", 0, 0.25)
    write("b", "full", 1, 0.75)
    results = report.merge([tmp_path / "a", tmp_path / "b"], tmp_path / "out")
    assert [(r["run"], r["seed"]) for r in results["runs"]] == [("chunk", 0), ("full", 0), ("full", 1)]
    assert results["summary"]["full"]["exact"] == dict(mean=0.625, std=pytest.approx(0.1767767), n=2)
    assert "losses" not in results["runs"][0]
    assert json.loads((tmp_path / "out" / "results.json").read_text())["summary"] == results["summary"]
    assert "| full | 2 |" in (tmp_path / "out" / "results.md").read_text()
    with pytest.raises(ValueError, match="run chunk seed 0 is in both"):
        report.merge([tmp_path / "a", tmp_path / "a"], tmp_path / "out2")
    write("c", "full", 2, 0.5, steps=20)
    with pytest.raises(ValueError, match="2 different settings"):
        report.merge([tmp_path / "a", tmp_path / "c"], tmp_path / "out3")
    with pytest.raises(ValueError, match="no runs"):
        report.merge([tmp_path / "empty"], tmp_path / "out4")
    assert report.main(["--merge", str(tmp_path / "out5"), str(tmp_path / "a"), str(tmp_path / "c")]) == 1
