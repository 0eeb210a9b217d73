"""ariadne as an HF transformers attention backend, against transformers' own backends.

Needs torch and transformers (skipped without them, as in CI). Written for the GPU machine: on CUDA
it runs ariadne's CUDA backend in bf16; without a GPU it runs on the CPU in float32 with the best
CPU backend the build supports (the reference until the fast one lands). ARIADNE_HF_DEVICE=cpu|cuda
forces a device, ARIADNE_HF_DTYPE=bf16|f16|f32 a dtype. Models are small and random (no download):
a Llama, a sliding-window Mistral, a GPT-OSS with sinks, and a Qwen2.5-VL vision tower (window
layers + full layers); the tower and the GPT-OSS also train (gradients against the reference's).
"""

import copy
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import ariadne  # noqa: E402
import ariadne.hf  # noqa: E402


def _device():
    forced = os.environ.get("ARIADNE_HF_DEVICE")
    if forced:
        return forced
    return "cuda" if torch.cuda.is_available() and ariadne.cuda_available() else "cpu"


DEVICE = _device()
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32
if os.environ.get("ARIADNE_HF_DTYPE"):
    DTYPE = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[os.environ["ARIADNE_HF_DTYPE"]]


def _cpu_backend():
    q = np.zeros((4, 2, 16), np.float32)
    ok, _ = ariadne.backend_supports("cpu", q, q, q, pattern=ariadne.Pattern.causal())
    return "cpu" if ok else "reference"


BACKEND = "cuda" if DEVICE == "cuda" else _cpu_backend()
# Relative L2 error allowed between ariadne and transformers' backend on the same model: the
# model's own numerics dominate (bf16 activations on CUDA; float32 on the CPU).
TOL = {torch.bfloat16: 3e-2, torch.float16: 5e-3}.get(DTYPE, 2e-4)


CALLS = {"n": 0}


def _counting(*args, **kwargs):
    CALLS["n"] += 1
    return ariadne.hf.attention_forward(*args, **kwargs)


@pytest.fixture(scope="module", autouse=True)
def _registered():
    from transformers import AttentionInterface

    ariadne.hf.register("ariadne", backend=BACKEND)
    # Counted, so that each test can check the model really ran through ariadne.
    AttentionInterface.register("ariadne", _counting)


def ours_ran(layers):
    """Whether ariadne served at least `layers` attention calls since the last check."""
    n, CALLS["n"] = CALLS["n"], 0
    return n >= layers


def rel_l2(a, b):
    a, b = a.float(), b.float()
    err = float((a - b).norm() / b.norm())
    # Printed for the device log (pytest -s): the measured error, not only the verdict.
    print(f"[{os.environ.get('PYTEST_CURRENT_TEST', '?').split(' ')[0]}] rel_l2 {err:.3g} (tol {TOL:g}, {DEVICE}, {DTYPE})")
    return err


def _pair(model_cls, config, reference_impl):
    """The same random weights under transformers' `reference_impl` and under ariadne. Each model
    gets its own copy of the config: set_attn_implementation writes into the config object, so two
    models built on one config would both run the implementation set last."""
    torch.manual_seed(0)
    ref = model_cls(copy.deepcopy(config)).to(DEVICE, DTYPE).eval()
    ref.set_attn_implementation(reference_impl)
    ours = model_cls(copy.deepcopy(config)).to(DEVICE, DTYPE).eval()
    ours.load_state_dict(ref.state_dict())
    ours.set_attn_implementation("ariadne")
    assert ref.config._attn_implementation == reference_impl and ours.config._attn_implementation == "ariadne"
    return ref, ours


def ref_alone():
    """The reference model ran without calling ariadne (since the last ours_ran())."""
    return CALLS["n"] == 0


def _llama_config(**extra):
    from transformers import LlamaConfig

    # head_dim 64: a size the CUDA kernels are built for (64, 80, 96, 128).
    return LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, **extra)


@pytest.mark.parametrize("batch,length", [(1, 37), (2, 130)])
def test_llama_matches_sdpa(batch, length):
    from transformers import LlamaForCausalLM

    ref, ours = _pair(LlamaForCausalLM, _llama_config(), "sdpa")
    ids = torch.randint(0, 256, (batch, length), device=DEVICE)
    with torch.no_grad():
        CALLS["n"] = 0
        a = ours(input_ids=ids).logits
        assert ours_ran(2)
        b = ref(input_ids=ids).logits
        assert ref_alone()
    assert rel_l2(a, b) < TOL


def test_llama_left_padding_matches_sdpa():
    from transformers import LlamaForCausalLM

    ref, ours = _pair(LlamaForCausalLM, _llama_config(), "sdpa")
    ids = torch.randint(0, 256, (2, 40), device=DEVICE)
    mask = torch.ones_like(ids)
    mask[1, :9] = 0  # row 1 is left-padded by 9 tokens
    with torch.no_grad():
        CALLS["n"] = 0
        a = ours(input_ids=ids, attention_mask=mask).logits
        assert ours_ran(2)
        b = ref(input_ids=ids, attention_mask=mask).logits
        assert ref_alone()
    # Padded positions are garbage in both; compare the real tokens only.
    real = mask.bool()
    assert rel_l2(a[real], b[real]) < TOL


def _same_generation(a, b, prompt):
    """Step by step: the logits agree while the tokens do; in bf16 greedy decoding may then part at
    a near tie of the two best tokens, which the rounding of either backend can tip."""
    assert len(a.logits) == len(b.logits)
    for step, (la, lb) in enumerate(zip(a.logits, b.logits)):
        assert rel_l2(la, lb) < TOL, step
        ta, tb = a.sequences[:, prompt + step], b.sequences[:, prompt + step]
        if not torch.equal(ta, tb):
            top2 = lb.float().topk(2, dim=-1).values
            gap = (top2[:, 0] - top2[:, 1])[ta != tb]
            assert DTYPE != torch.float32 and bool((gap < 0.05 * lb.float().abs().max()).all()), step
            break


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_llama_generate_with_cache_matches_sdpa(cache):
    from transformers import LlamaForCausalLM

    ref, ours = _pair(LlamaForCausalLM, _llama_config(), "sdpa")
    ids = torch.randint(0, 256, (2, 20), device=DEVICE)
    mask = torch.ones_like(ids)
    mask[0, :5] = 0  # left padding: the cached keys of row 0 start later
    # disable_compile: on GPUs transformers compiles static-cache generation by default; this test
    # is about the attention (test_llama_static_cache_generate_compiled covers the compiled path).
    kw = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, cache_implementation=cache,
              output_logits=True, return_dict_in_generate=True, disable_compile=True)
    with torch.no_grad():
        CALLS["n"] = 0
        a = ours.generate(ids, **kw)
        assert ours_ran(2 * 8)
        b = ref.generate(ids, **kw)
        assert ref_alone()
    _same_generation(a, b, 20)


def test_llama_static_cache_generate_compiled():
    """Static-cache generation with the decoding forward under torch.compile, as transformers runs
    it by default on GPUs (inductor, CUDA graphs); elsewhere forced with dynamo's eager backend. The
    attention function is opaque to dynamo (torch.compiler.disable): it runs eagerly in between."""
    from transformers import LlamaForCausalLM
    from transformers.generation import CompileConfig

    ref, ours = _pair(LlamaForCausalLM, _llama_config(), "sdpa")
    ids = torch.randint(0, 256, (2, 20), device=DEVICE)
    kw = dict(max_new_tokens=8, do_sample=False, cache_implementation="static", output_logits=True,
              return_dict_in_generate=True)
    compiled = dict(kw)
    if DEVICE != "cuda":
        config = CompileConfig(backend="eager", mode=None)
        config._compile_all_devices = True
        compiled["compile_config"] = config
    torch._dynamo.reset()
    with torch.no_grad():
        CALLS["n"] = 0
        a = ours.generate(ids, **compiled)
        assert ours_ran(2)  # the prefill at least (decoding steps may replay a CUDA graph)
        b = ref.generate(ids, **kw, disable_compile=True)
        assert ref_alone()
    _same_generation(a, b, 20)


def test_llama_packed_sequences_match_separate_runs():
    """Three sequences packed in one row, told apart by position ids restarting at 0: each one's
    logits are those of the sequence run alone (attention never crosses sequences)."""
    from transformers import LlamaForCausalLM

    ref, ours = _pair(LlamaForCausalLM, _llama_config(), "sdpa")
    lengths = [10, 25, 7]
    ids = torch.randint(0, 256, (1, sum(lengths)), device=DEVICE)
    pos = torch.cat([torch.arange(n, device=DEVICE) for n in lengths])[None]
    with torch.no_grad():
        CALLS["n"] = 0
        a = ours(input_ids=ids, position_ids=pos).logits
        assert ours_ran(2)
        start = 0
        for n in lengths:
            alone = ref(input_ids=ids[:, start:start + n]).logits
            assert ref_alone()
            assert rel_l2(a[:, start:start + n], alone) < TOL
            start += n
        # Run as one sequence, the packed row gives other logits: the check above can fail.
        whole = ref(input_ids=ids).logits
    assert rel_l2(a[:, 10:], whole[:, 10:]) > 10 * TOL


def test_mistral_sliding_window_matches_sdpa():
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, sliding_window=16,
                           max_position_embeddings=512)
    ref, ours = _pair(MistralForCausalLM, config, "sdpa")
    ids = torch.randint(0, 256, (1, 100), device=DEVICE)
    with torch.no_grad():
        CALLS["n"] = 0
        a = ours(input_ids=ids).logits
        assert ours_ran(2)
        b = ref(input_ids=ids).logits
        assert ref_alone()
    assert rel_l2(a, b) < TOL
    # The window matters at this length: full causal attention gives a different answer.
    ours.config.sliding_window = None
    for layer in ours.model.layers:
        layer.self_attn.sliding_window = None
    with torch.no_grad():
        c = ours(input_ids=ids).logits
    assert rel_l2(c, b) > 10 * TOL


def _gpt_oss_config():
    from transformers import GptOssConfig

    return GptOssConfig(vocab_size=256, hidden_size=128, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_local_experts=4,
                        num_experts_per_tok=2, sliding_window=16, max_position_embeddings=512,
                        layer_types=["sliding_attention", "full_attention"])


def test_gpt_oss_sinks_match_eager():
    from transformers import GptOssForCausalLM

    ref, ours = _pair(GptOssForCausalLM, _gpt_oss_config(), "eager")
    with torch.no_grad():
        for layer in list(ref.model.layers) + list(ours.model.layers):
            layer.self_attn.sinks.copy_(torch.linspace(-2, 3, layer.self_attn.sinks.numel()))
    ids = torch.randint(0, 256, (1, 70), device=DEVICE)
    with torch.no_grad():
        CALLS["n"] = 0
        a = ours(input_ids=ids).logits
        assert ours_ran(2)
        b = ref(input_ids=ids).logits
        assert ref_alone()
    assert rel_l2(a, b) < TOL


def test_qwen2_5_vl_vision_tower_matches_sdpa():
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    # head_dim 80, as in the real tower.
    config = Qwen2_5_VLVisionConfig(depth=4, hidden_size=320, num_heads=4, intermediate_size=640,
                                    out_hidden_size=64, fullatt_block_indexes=[1, 3], window_size=112,
                                    patch_size=14, spatial_merge_size=2, temporal_patch_size=2, in_channels=3)
    ref, ours = _pair(Qwen2_5_VisionTransformerPretrainedModel, config, "sdpa")
    # Two images: 16x20 and 12x8 patches (edge windows smaller than 8x8).
    grid_thw = torch.tensor([[1, 16, 20], [1, 12, 8]], device=DEVICE)
    tokens = int((grid_thw[:, 1] * grid_thw[:, 2]).sum())
    pixels = torch.randn(tokens, 3 * 2 * 14 * 14, device=DEVICE, dtype=DTYPE)
    with torch.no_grad():
        CALLS["n"] = 0
        a = ours(pixels, grid_thw=grid_thw)
        assert ours_ran(4)
        b = ref(pixels, grid_thw=grid_thw)
        assert ref_alone()
    a = getattr(a, "pooler_output", a)
    b = getattr(b, "pooler_output", b)
    assert rel_l2(a, b) < TOL


def test_qwen2_5_vl_vision_tower_trains_like_sdpa():
    """Gradients of every parameter of a small random Qwen2.5-VL tower (window and full layers, two
    images) under ariadne equal those under sdpa; then a few optimizer steps lower the loss."""
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    config = Qwen2_5_VLVisionConfig(depth=2, hidden_size=320, num_heads=4, intermediate_size=640,
                                    out_hidden_size=64, fullatt_block_indexes=[1], window_size=112,
                                    patch_size=14, spatial_merge_size=2, temporal_patch_size=2, in_channels=3)
    ref, ours = _pair(Qwen2_5_VisionTransformerPretrainedModel, config, "sdpa")
    grid_thw = torch.tensor([[1, 8, 12], [1, 4, 8]], device=DEVICE)
    tokens = int((grid_thw[:, 1] * grid_thw[:, 2]).sum())
    g = torch.Generator().manual_seed(3)
    pixels = torch.randn(tokens, 3 * 2 * 14 * 14, generator=g).to(DEVICE, DTYPE)
    target = torch.randn(tokens // 4, 64, generator=g).to(DEVICE, DTYPE)

    def loss_of(model):
        out = model(pixels, grid_thw=grid_thw)
        out = getattr(out, "pooler_output", out)
        return ((out.float() - target.float()) ** 2).mean()

    for model in (ref, ours):
        model.train()
        model.zero_grad()
    CALLS["n"] = 0
    loss_of(ours).backward()
    assert ours_ran(2)
    loss_of(ref).backward()
    named = dict(ref.named_parameters())
    for name, p in ours.named_parameters():
        assert p.grad is not None, f"{name}: no gradient"
        assert rel_l2(p.grad, named[name].grad) < 4 * TOL, f"{name}: gradient differs from sdpa's"

    opt = torch.optim.SGD(ours.parameters(), lr=0.05)
    losses = []
    for _ in range(4):
        opt.zero_grad()
        loss = loss_of(ours)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < losses[0], losses


def test_gpt_oss_learnable_sinks_get_eager_gradients():
    """GPT-OSS keeps its sinks as parameters: their gradients (and every other) under ariadne equal
    those of transformers' eager attention, which implements sinks."""
    from transformers import GptOssForCausalLM

    ref, ours = _pair(GptOssForCausalLM, _gpt_oss_config(), "eager")
    with torch.no_grad():
        for layer in list(ref.model.layers) + list(ours.model.layers):
            layer.self_attn.sinks.copy_(torch.linspace(-2, 3, layer.self_attn.sinks.numel()))
    ids = torch.randint(0, 256, (1, 40), device=DEVICE)
    for model in (ref, ours):
        model.train()
        model.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
    named = dict(ref.named_parameters())
    sinks = [name for name, _ in ours.named_parameters() if name.endswith("sinks")]
    assert sinks, "the model has no sink parameters"
    for name, p in ours.named_parameters():
        if named[name].grad is None:
            continue
        assert rel_l2(p.grad, named[name].grad) < 4 * TOL, f"{name}: gradient differs from eager's"
