"""Adapter methods in their option variants × every model type of the table: DAA (pre-/post-RoPE), DiffQ, DiffK,
DiffV, DiffLoRA (right term / both terms; fixed / learnable λ), Dex (all heads / a subset) and the DIFF V2 retrofit
(copied / noise second query), through the one API.

What every registered method must do with its default options (save/load, identity at init, cached decoding,
merge-or-refuse) is checked over the registry in ``test_conformance.py``; here the same properties run on the option
settings whose code paths the defaults do not reach, with what is specific to each method: (1 − λ)·base attention
output for fixed λ with an identity second map, the exact trainable set (counted from the method's equations, not
from our code), a few optimiser steps lower the loss, the methods' own refusals.
"""

from __future__ import annotations

import dataclasses
import functools
import json

import pytest
import torch

from diffattn.adapters import (
    AdaptedAttention,
    DAAConfig,
    DexConfig,
    DiffKConfig,
    DiffLoRAConfig,
    DiffQConfig,
    DiffV2Config,
    DiffVConfig,
    adapt,
    adapter_lambdas,
    attention_modules,
    load_adapter,
    merge_adapter,
    no_decay_parameter_names,
    save_adapter,
    set_adapter_step,
    trainable_parameters,
)

from ..helpers import decode_token_by_token
from ..tiny_models import CONFIGS, ids, tiny

ATOL = 1e-5

# option variants: name -> config factory (at init: the identity, except difflora-learned). Not the list of methods:
# the registry is (test_conformance.py); these are the settings whose code paths a method's defaults leave untried
OPTION_VARIANTS = {
    "daa-pre": lambda: DAAConfig(anneal_steps=10, position="pre-rope"),
    "daa-post": lambda: DAAConfig(anneal_steps=10, position="post-rope"),
    "diffq": lambda: DiffQConfig(anneal_steps=10),
    "diffk": lambda: DiffKConfig(anneal_steps=10),
    "diffv": lambda: DiffVConfig(anneal_steps=10),
    "difflora-right": lambda: DiffLoRAConfig(lambda_init=0.0, rank=4),
    "difflora-both": lambda: DiffLoRAConfig(terms="both", lambda_init=0.0, rank=2),
    "difflora-learned": lambda: DiffLoRAConfig(learn_lambda=True, rank=4),
    "dex": lambda: DexConfig(heads="all", init="identity", anneal_steps=10),
    "dex-k2": lambda: DexConfig(heads="random", k=2, anneal_steps=10),  # a subset of heads: the others untouched
    "diff-v2": lambda: DiffV2Config(anneal_steps=10),
    "diff-v2-noise": lambda: DiffV2Config(anneal_steps=10, second_query="noise"),
}


def _active_config(variant):
    """The variant's config with the method in play once trained: a fixed λ of 0 (DiffLoRA's identity case)
    leaves nothing active to test and no gradient to the adapters, so use DiffLoRA's default λ there."""
    config = OPTION_VARIANTS[variant]()
    if variant in ("difflora-right", "difflora-both"):
        config = dataclasses.replace(config, lambda_init=0.1)
    return config


def _perturb(model, seed=0, scale=0.05):
    """Move every adapter parameter off its initial value, so no test passes because A2 = A1 or B = 0."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".method." in n:
                p.add_(scale * torch.randn(p.shape, generator=g))
                if n.endswith("lambda_learn"):
                    p.fill_(0.3)


@pytest.mark.parametrize("model_type", list(CONFIGS))
@pytest.mark.parametrize("variant", [v for v in OPTION_VARIANTS if v != "difflora-learned"])
def test_identity_at_init(variant, model_type):
    base = tiny(model_type)
    x = ids()
    with torch.no_grad():
        want = base(x).logits
        got = adapt(base, OPTION_VARIANTS[variant]())(x).logits
    torch.testing.assert_close(got, want, atol=ATOL, rtol=ATOL)


def _first_attention_output(model, x):
    """The per-head attention output of layer 0 as it enters W_O, [B, T, H·d]."""
    spec_o = {"gpt2": "c_proj"}.get(model.config.model_type, "o_proj")
    attn = attention_modules(model)[0][2]
    attn = attn.base_attn if isinstance(attn, AdaptedAttention) else attn
    seen = []
    hook = getattr(attn, spec_o).register_forward_pre_hook(lambda m, a: seen.append(a[0]))
    with torch.no_grad():
        model(x)
    hook.remove()
    return seen[0]


FIXED_LAMBDA = {
    "daa-pre": lambda: DAAConfig(anneal=False, position="pre-rope"),
    "daa-post": lambda: DAAConfig(anneal=False, position="post-rope"),
    "diffq": lambda: DiffQConfig(anneal=False),
    "diffk": lambda: DiffKConfig(anneal=False),
    "diffv": lambda: DiffVConfig(anneal=False),
    "difflora": lambda: DiffLoRAConfig(lambda_init=0.3, rank=4),
    "dex": lambda: DexConfig(heads="all", init="identity", anneal=False),
}


@pytest.mark.parametrize("model_type", list(CONFIGS))
@pytest.mark.parametrize("variant", list(FIXED_LAMBDA))
def test_fixed_lambda_scales_the_base_attention_output_by_one_minus_lambda(variant, model_type):
    base = tiny(model_type)
    if variant == "diffv":  # the V' of docs/methods.md §4.3 leaves a value bias unscaled: take it out
        with torch.no_grad():
            for n, p in base.named_parameters():
                if n.endswith("v_proj.bias"):
                    p.zero_()
                if n.endswith("c_attn.bias"):
                    p[128:].zero_()
    x = ids()
    want = _first_attention_output(base, x)
    model = adapt(base, FIXED_LAMBDA[variant]())
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("lambda_learn"):
                p.fill_(0.3)
    got = _first_attention_output(model, x)
    torch.testing.assert_close(got, 0.7 * want, atol=ATOL, rtol=ATOL)
    assert adapter_lambdas(model) == pytest.approx([0.3, 0.3])


@pytest.mark.parametrize("model_type", list(CONFIGS))
@pytest.mark.parametrize("variant", list(OPTION_VARIANTS))
def test_cached_decoding_equals_full_forward_with_the_method_active(variant, model_type):
    model = adapt(tiny(model_type), _active_config(variant))
    _perturb(model)
    set_adapter_step(model, 5)
    x = ids(t=9)
    with torch.no_grad():
        full = model(x).logits
        steps, _ = decode_token_by_token(model, x, prefill=4)
        with torch.no_grad():
            plain = tiny(model_type)(x).logits
    torch.testing.assert_close(steps, full, atol=ATOL, rtol=ATOL)
    assert (full - plain).abs().max() > 1e-3  # the method really is active


def test_padded_batch_matches_unpadded_rows():
    model = adapt(tiny("llama"), DiffKConfig(anneal_steps=4))
    _perturb(model)
    set_adapter_step(model, 2)
    x = ids(b=2, t=8)
    mask = torch.ones_like(x)
    mask[0, :3] = 0  # left padding on row 0
    with torch.no_grad():
        padded = model(x, attention_mask=mask).logits
        alone = model(x[:1, 3:]).logits
    torch.testing.assert_close(padded[0, 3:], alone[0], atol=ATOL, rtol=ATOL)


# -- the trainable set, counted from each method's equations --------------------------------------------------
L, H, HKV, D, DM = 2, 4, 2, 16, 64  # the tiny models: layers, heads, KV heads, head dim, d_model


def _attention_params(model_type) -> int:
    base = tiny(model_type)
    return sum(p.numel() for _, _, a in attention_modules(base) for p in a.parameters())


def _expected_count(variant, model_type) -> int:
    h, hkv, d = (H, H, DM // H) if model_type == "gpt2" else (H, HKV, D)
    attn = _attention_params(model_type)
    if variant.startswith("daa"):
        return attn + L * (h * d * d + 1)  # W_DAA per head + λ_learn per layer
    if variant in ("diffq", "diffk", "diffv"):
        return attn + L * (DM * DM + 1)  # W_D (d_model²) + λ_learn per layer
    if variant.startswith("diff-v2"):  # a second query projection (with the base's query bias, if any) + the gate
        q_bias = h * d if model_type == "gpt2" else 0
        return attn + L * (DM * h * d + q_bias + DM * h + h)
    assert variant.startswith("difflora"), "Dex's set is counted in test_dex.py"
    r = 4 if variant != "difflora-both" else 2
    per_pair = r * DM + h * d * r + r * DM + hkv * d * r  # A, B on Q and on K
    n = L * per_pair * (2 if variant == "difflora-both" else 1)
    return n + (L * 4 * d if variant == "difflora-learned" else 0)


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "gpt2"])
@pytest.mark.parametrize("variant", [v for v in OPTION_VARIANTS if not v.startswith("dex")])
def test_trainable_set_is_the_method_s_and_a_few_steps_lower_the_loss(variant, model_type):
    model = adapt(tiny(model_type), _active_config(variant))
    names = trainable_parameters(model)
    params = dict(model.named_parameters())
    assert sum(params[n].numel() for n in names) == _expected_count(variant, model_type)
    assert all(not p.requires_grad for n, p in params.items() if n not in names)
    if variant.startswith("difflora"):
        assert all(".method." in n for n in names)  # only adapters and λ
    no_decay = set(no_decay_parameter_names(model))
    assert all("lambda" in n for n in no_decay)
    groups = [
        {"params": [params[n] for n in names if n not in no_decay]},
        {"params": [params[n] for n in names if n in no_decay], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=1e-2)
    x = ids(b=4, t=16)
    losses = []
    for step in range(6):
        set_adapter_step(model, step + 1)  # λ(t) > 0: the second map is in play
        loss = model(x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_train_lm_head_adds_the_output_embedding():
    plain = adapt(tiny("llama"), DAAConfig(anneal_steps=4))
    with_head = adapt(tiny("llama"), DAAConfig(anneal_steps=4, train_lm_head=True))
    extra = set(trainable_parameters(with_head)) - set(trainable_parameters(plain))
    assert extra == {"lm_head.weight"}


# -- save / load, merge ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "gpt2"])
@pytest.mark.parametrize("variant", [v for v in OPTION_VARIANTS if not v.startswith("dex")])
def test_save_then_load_into_a_fresh_base_gives_identical_logits(variant, model_type, tmp_path):
    model = adapt(tiny(model_type), OPTION_VARIANTS[variant]())
    trainable_parameters(model)
    _perturb(model, seed=2)
    with torch.no_grad():  # the base weights the method trains move too (DAA, DiffQ/K/V train W_Q…W_O)
        for n, p in model.named_parameters():
            if p.requires_grad and "base_attn" in n:
                p.mul_(1.1)
    set_adapter_step(model, 3)
    save_adapter(model, tmp_path / "adapter")
    fresh = load_adapter(tiny(model_type), tmp_path / "adapter")
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(fresh(x).logits, model(x).logits, atol=0, rtol=0)


def test_an_adapted_model_keeps_the_config_it_was_adapted_with(tmp_path):
    """One config reused for a second model, or a field changed after adapting: the first model's saved adapter
    recorded the second model's Dex heads (or the changed field) and loaded as another model (a user's review,
    2026-12-03). The model keeps its own copy; the heads chosen are still written back to the caller's config."""
    config = DexConfig(heads="random", k=2, seed=0, anneal_steps=4)
    first = adapt(tiny("llama"), config)
    heads = config.selected
    assert heads is not None and first._diffattn_adapter.config.selected == heads
    _perturb(first, seed=3)
    set_adapter_step(first, 2)
    config.seed, config.anneal_steps = 5, 8
    second = adapt(tiny("llama"), config)  # the second model's heads land in config, not in the first's record
    assert first._diffattn_adapter.config.selected == heads and first._diffattn_adapter.config.anneal_steps == 4
    assert config.selected == second._diffattn_adapter.config.selected is not config.selected  # a copy each
    fresh = load_adapter(tiny("llama"), save_adapter(first, tmp_path / "adapter"))
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(fresh(x).logits, first(x).logits, atol=0, rtol=0)


def test_loading_an_adapter_of_another_method_is_refused(tmp_path):
    save_adapter(adapt(tiny("llama"), DAAConfig(anneal_steps=4)), tmp_path / "adapter")
    base = tiny("llama")
    with pytest.raises(ValueError, match="holds a 'daa' adapter, not the 'dex'"):
        load_adapter(base, tmp_path / "adapter", method="dex")
    assert not any(isinstance(m, AdaptedAttention) for _, _, m in attention_modules(base))


def test_an_adapter_folder_missing_a_trained_tensor_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    from diffattn.adapters.io import adapter_fingerprint

    folder = save_adapter(adapt(tiny("llama"), DiffQConfig(anneal_steps=4)), tmp_path / "adapter")
    tensors = load_file(folder / "adapter.safetensors")
    tensors.pop(next(iter(tensors)))
    save_file(tensors, folder / "adapter.safetensors")
    # as a buggy writer would leave it: the fingerprint agrees with the (incomplete) weights, the names check catches it
    meta = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(
        json.dumps({**meta, "adapter_fingerprint": adapter_fingerprint(meta, tensors)})
    )
    base = tiny("llama")
    with pytest.raises(ValueError, match="does not fit this model"):
        load_adapter(base, folder)
    assert not any(isinstance(m, AdaptedAttention) for _, _, m in attention_modules(base))


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: DAAConfig(position="middle"), "pre-rope or post-rope"),
        (lambda: DiffQConfig(anneal_steps=0), "anneal_steps must be >= 1"),
        (lambda: DiffVConfig(lambda_init="linear"), "exponential' or a number"),
        (lambda: DiffLoRAConfig(terms="left"), "right or both"),
        (lambda: DiffLoRAConfig(rank=0), "rank must be >= 1"),
        (lambda: DiffLoRAConfig(lambda_init=1.5), r"lambda_init must be in \[0, 1\)"),
    ],
)
def test_bad_configs_are_one_clear_error(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize(
    "config", [DAAConfig, functools.partial(DexConfig, heads="all"), DiffV2Config], ids=["DAA", "Dex", "DiffV2"]
)
def test_a_step_past_0_without_anneal_steps_is_refused_when_set_not_at_the_next_forward(config):
    """The configs' default T is None (``diffattn adapt`` fills in 20% of the run's steps): λ(t) is then defined at
    step 0 only, so the step that needs T is refused where it is set, naming the option; without annealing, or
    with T given, any step is fine."""
    model = adapt(tiny("llama"), config())
    set_adapter_step(model, 0)
    name = getattr(config, "func", config).__name__
    with pytest.raises(ValueError, match=rf"{name}\.anneal_steps \(T of Dex Eq\. 4\) is not set"):
        set_adapter_step(model, 1)
    model(ids())  # still at step 0
    for options in ({"anneal": False}, {"anneal_steps": 4}):
        model = adapt(tiny("llama"), config(**options))
        set_adapter_step(model, 7)
        model(ids())


@pytest.mark.parametrize("variant", ["daa-pre", "diffq", "diffk", "diffv"])
@pytest.mark.parametrize("options", [{"anneal": False}, {"anneal_steps": 1}, {"lambda_init": 0.0}])
def test_the_annealed_methods_have_no_configuration_that_cannot_learn(variant, options):
    # unlike a zero-init Dex: W_DAA / W_D start at the identity, so the second term is non-zero and λ_learn
    # gets a gradient as soon as α > 0 (anneal=False: from step 0), with any T or λ_init; nothing is refused
    config = dataclasses.replace(OPTION_VARIANTS[variant](), **options)
    assert config.never_learns() is None
    model = adapt(tiny("llama"), config)
    trainable_parameters(model)
    set_adapter_step(model, 0 if options.get("anneal") is False else 1)
    x = ids()
    model(x, labels=x).loss.backward()
    for _, _, w in attention_modules(model):
        lam = next(p for n, p in w.method.named_parameters() if n.endswith("lambda_learn"))
        assert lam.grad is not None and lam.grad.abs() > 0


@pytest.mark.parametrize("model_type", list(CONFIGS))
def test_diff_v2_retrofit_gate_scales_the_base_output_and_learns_per_token(model_type):
    """With the second query copied from the first (A2 = A1) and the gate's weights at 0, the head output is
    (1 − gate_init)·O; after one step the gate depends on the token (its weights got a gradient)."""
    base = tiny(model_type)
    x = ids()
    want = _first_attention_output(base, x)
    model = adapt(base, DiffV2Config(anneal=False, gate_init=0.3))
    torch.testing.assert_close(_first_attention_output(model, x), 0.7 * want, atol=ATOL, rtol=ATOL)
    trainable_parameters(model)
    model(x, labels=x).loss.backward()
    gates = [w.method.diffv2_gate for _, _, w in attention_modules(model)]
    assert all(g.weight.grad.abs().max() > 0 and g.bias.grad.abs().max() > 0 for g in gates)
    # the KV cache keeps the base's size: K2 = K1, nothing is added to it
    with torch.no_grad():
        cache = model(x, use_cache=True).past_key_values
        base_cache = tiny(model_type)(x, use_cache=True).past_key_values
    assert cache.layers[0].keys.shape == base_cache.layers[0].keys.shape


@pytest.mark.parametrize("model_type", [pytest.param("qwen2", id="qwen2"), pytest.param("gpt2", id="gpt2-fused")])
def test_diff_v2_retrofit_copies_a_biased_query_exactly_in_bf16(model_type):
    """second_query="copy" is W_Q2 = W_Q, b_Q2 = b_Q bit for bit: the copy was once probed through the layer on an
    identity, which rounds W + b in bf16 (off by |b|·2⁻⁹; 37% of the largest weight with biases of std 5)."""
    base = tiny(model_type).to(torch.bfloat16)
    with torch.no_grad():
        for name, p in base.named_parameters():
            if name.endswith(("q_proj.bias", "c_attn.bias")):
                p.normal_(0.0, 5.0)
    model = adapt(base, DiffV2Config(anneal_steps=10))
    for _, _, wrapper in attention_modules(model):
        attn, second = wrapper.base_attn, wrapper.method.diffv2_q
        if model_type == "gpt2":  # Conv1D: y = x W + b, W [d_model, 3·H·d], the query's columns first
            weight, bias = attn.c_attn.weight[:, : second.out_features].T, attn.c_attn.bias[: second.out_features]
        else:
            weight, bias = attn.q_proj.weight, attn.q_proj.bias
        assert second.weight.dtype == torch.bfloat16
        assert torch.equal(second.weight, weight) and torch.equal(second.bias, bias)


def test_diff_v2_retrofit_refuses_a_gate_that_cannot_open():
    with pytest.raises(ValueError, match=r"would \(almost\) never open"):
        adapt(tiny("llama"), DiffV2Config(gate_init=1e-5))
    with pytest.raises(ValueError, match="second_query must be one of copy, noise"):
        DiffV2Config(second_query="zeros")


def test_a_peft_wrapped_adapted_model_is_accepted_or_refused_with_the_remedy(tmp_path):
    """Users stack PEFT on top (e.g. LoRA on the MLP of a Dex model): the adapter functions find our adapter inside
    the wrapper; merging, whose plain-model result would drop the PEFT layers, is refused with the remedy."""
    from peft import LoraConfig, get_peft_model

    model = adapt(tiny("llama"), DexConfig(heads="all", anneal_steps=4))
    wrapped = get_peft_model(model, LoraConfig(r=2, target_modules=["gate_proj"]))
    set_adapter_step(wrapped, 2)
    assert adapter_lambdas(wrapped) == adapter_lambdas(model) and adapter_lambdas(model)[0] != 0.0
    folder = save_adapter(wrapped, tmp_path / "adapter")
    fresh = load_adapter(tiny("llama"), folder)
    assert adapter_lambdas(fresh) == adapter_lambdas(model)
    with pytest.raises(ValueError, match=r"wrapped by PEFT.*merge_and_unload\(\)"):
        merge_adapter(wrapped)
    with pytest.raises(ValueError, match="has no diffattn adapter"):
        adapter_lambdas(tiny("llama"))

    # PEFT on a weight the method trains (Dex: W_V): its base_layer / lora_* tensors could never be loaded back, so
    # saving is refused with the remedy (they used to be written, and load_adapter then refused the folder)
    inside = get_peft_model(adapt(tiny("llama"), DexConfig(heads="all")), LoraConfig(r=2, target_modules=["v_proj"]))
    with pytest.raises(ValueError, match=r"PEFT layers wrap weights the adapter trains.*save_adapter\(model, path\)"):
        save_adapter(inside, tmp_path / "inside")
    assert not (tmp_path / "inside").exists()
    with pytest.raises(ValueError, match=r"wrapped by PEFT; PEFT decides what trains.*before get_peft_model"):
        trainable_parameters(wrapped)  # used to raise AttributeError


def _layer0_inputs(model, x):
    """Layer 0's attention input X, RoPE (cos, sin), and the per-head output as it enters W_O."""
    attn = attention_modules(model)[0][2]
    base = attn.base_attn if isinstance(attn, AdaptedAttention) else attn
    seen = {}

    def grab(module, args, kwargs):
        seen["x"] = args[0] if args else kwargs["hidden_states"]
        seen["rope"] = kwargs["position_embeddings"]

    hooks = [
        attn.register_forward_pre_hook(grab, with_kwargs=True),
        base.o_proj.register_forward_pre_hook(lambda m, a: seen.setdefault("out", a[0])),
    ]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return base, seen


def _heads(t, n):  # [B, T, n·d] -> [B, n, T, d]
    return t.view(t.shape[0], t.shape[1], n, -1).transpose(1, 2)


def _two_map_output(q1, k1, q2, k2, v, lam, scale):
    """(softmax(Q1 K1ᵀ s) − λ softmax(Q2 K2ᵀ s)) V, causal, GQA: DIFF Eq. 1 written out."""
    rep = q1.shape[1] // k1.shape[1]
    k1, k2, v = (t.repeat_interleave(rep, dim=1) for t in (k1, k2, v))
    mask = torch.ones(q1.shape[2], k1.shape[2], dtype=torch.bool).tril()

    def sm(q, k):
        return torch.softmax((q @ k.transpose(-1, -2) * scale).masked_fill(~mask, float("-inf")), dim=-1)

    out = (sm(q1, k1) - lam * sm(q2, k2)) @ v
    return out.transpose(1, 2).reshape(out.shape[0], out.shape[2], -1)


@pytest.mark.parametrize("position", ["post-rope", "pre-rope"])
def test_daa_default_places_w_daa_on_the_rotated_query_as_the_paper_s_eq_5(position):
    """Default post-RoPE: Q2 = RoPE(X W_Q) W_DAA, the query that enters QKᵀ (DAA Eq. 5; its Llama runs);
    pre-RoPE: Q2 = RoPE(X W_Q W_DAA). A random W_DAA and a fixed λ = 0.3 make the two differ."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    config = DAAConfig(anneal=False) if position == "post-rope" else DAAConfig(anneal=False, position=position)
    assert config.position == position
    model = adapt(tiny("llama"), config)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("lambda_learn"):
                p.fill_(0.3)
            if n.endswith("daa_w"):
                p.add_(0.3 * torch.randn_like(p))
    base, seen = _layer0_inputs(model, ids())
    w = next(p for n, p in model.named_parameters() if n.endswith("daa_w") and ".0." in n)
    x, (cos, sin) = seen["x"], seen["rope"]
    h, hkv = model.config.num_attention_heads, model.config.num_key_value_heads
    with torch.no_grad():
        q, k, v = _heads(base.q_proj(x), h), _heads(base.k_proj(x), hkv), _heads(base.v_proj(x), hkv)
        q_rot, k_rot = apply_rotary_pos_emb(q, k, cos, sin)
        if position == "post-rope":
            q2 = torch.einsum("bhtd,hde->bhte", q_rot, w)
        else:
            q2, _ = apply_rotary_pos_emb(torch.einsum("bhtd,hde->bhte", q, w), k, cos, sin)
        want = _two_map_output(q_rot, k_rot, q2, k_rot, v, 0.3, base.scaling)
    torch.testing.assert_close(seen["out"], want, atol=ATOL, rtol=ATOL)


def test_difflora_lora_only_is_the_paper_s_formula_q2_equals_x_b2_a2():
    """second_term="lora-only": Q2 = X·B_Q2 A_Q2 and K2 = X·B_K2 A_K2 (α/r scaling), no W_Q/W_K (DiffLoRA Sec. 2),
    B non-zero at init; the default keeps W_Q + B2A2 (the authors' code). λ fixed at 0.1."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    model = adapt(tiny("llama"), DiffLoRAConfig(rank=4, second_term="lora-only"))
    base, seen = _layer0_inputs(model, ids())
    method = attention_modules(model)[0][2].method
    assert method.lora_q2.lora_B.abs().sum() > 0  # B starts non-zero, or the second map is uniform
    x, (cos, sin) = seen["x"], seen["rope"]
    h, hkv = model.config.num_attention_heads, model.config.num_key_value_heads

    def low_rank(m, x):
        return x @ m.lora_A.T @ m.lora_B.T * m.scaling

    with torch.no_grad():
        q, k, v = _heads(base.q_proj(x), h), _heads(base.k_proj(x), hkv), _heads(base.v_proj(x), hkv)
        q2, k2 = _heads(low_rank(method.lora_q2, x), h), _heads(low_rank(method.lora_k2, x), hkv)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        q2, k2 = apply_rotary_pos_emb(q2, k2, cos, sin)
        want = _two_map_output(q, k, q2, k2, v, 0.1, base.scaling)
    torch.testing.assert_close(seen["out"], want, atol=ATOL, rtol=ATOL)
    with pytest.raises(ValueError, match="base\\+lora or lora-only"):
        DiffLoRAConfig(second_term="paper")


def test_difflora_exponential_lambda_init_and_norm_gain():
    """lambda_init="exponential": DIFF's 0.8 − 0.6·exp(−0.3·l) per layer, as a fixed λ and as λ_init of the learnable
    one; group_norm_gain: a trainable gain (ones at init) on the per-head norm."""
    import math

    fixed = adapt(tiny("llama"), DiffLoRAConfig(rank=4, lambda_init="exponential"))
    assert adapter_lambdas(fixed) == pytest.approx([0.8 - 0.6 * math.exp(-0.3 * layer) for layer in range(2)])
    gained = adapt(tiny("llama"), DiffLoRAConfig(rank=4, group_norm=True, group_norm_gain=True))
    gains = [n for n, p in gained.named_parameters() if n.endswith("norm_gain")]
    assert len(gains) == 2 and all(n in trainable_parameters(gained) for n in gains)
    plain = adapt(tiny("llama"), DiffLoRAConfig(rank=4, group_norm=True))
    x = ids()
    with torch.no_grad():  # gain = 1 at init: the same outputs as the norm without a gain
        torch.testing.assert_close(gained(x).logits, plain(x).logits, atol=ATOL, rtol=ATOL)
        for n, p in gained.named_parameters():
            if n.endswith("norm_gain"):
                p.mul_(1.5)
        assert not torch.allclose(gained(x).logits, plain(x).logits, atol=1e-3)
    with pytest.raises(ValueError, match="group_norm_gain needs group_norm"):
        DiffLoRAConfig(group_norm_gain=True)


def test_an_adapter_refuses_a_base_changed_anywhere_and_a_fingerprint_it_does_not_check(tmp_path):
    """The base fingerprint covers every tensor the adapter's output depends on: scaling one MLP weight of the base
    is another base (a fingerprint of the embeddings alone would let it through). A folder recording another
    fingerprint version (none, or 1: the embeddings only) is refused in one line, the model left unchanged."""
    import json

    model = adapt(tiny("llama"), DexConfig(heads="all", anneal_steps=4))
    folder = save_adapter(model, tmp_path / "adapter")
    assert load_adapter(tiny("llama"), folder) is not None
    changed = tiny("llama")
    with torch.no_grad():
        changed.model.layers[0].mlp.up_proj.weight.mul_(1.01)
    with pytest.raises(ValueError, match="was trained on a different base model"):
        load_adapter(changed, folder)
    meta = json.loads((folder / "adapter_config.json").read_text())
    for version in (1, None):
        meta["base_fingerprint_version"] = version
        (folder / "adapter_config.json").write_text(json.dumps(meta))
        base = tiny("llama")
        with pytest.raises(ValueError, match=rf"base fingerprint of version {version}, not the one .* checks \(2"):
            load_adapter(base, folder)
        assert getattr(base, "_diffattn_adapter", None) is None


def _dex_with_some_heads(tmp_path):
    """A Dex adapter on a subset of heads (what a hand edit of ``selected`` would change), saved."""
    model = adapt(tiny("llama"), DexConfig(heads="all", anneal_steps=4))
    folder = save_adapter(model, tmp_path / "adapter")
    meta = json.loads((folder / "adapter_config.json").read_text())
    assert meta["format_version"] == 2 and set(meta["adapter_fingerprint"]) == {"config", "weights"}
    return folder, meta


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: m["config"].update(selected=[[0, 0]]),  # another set of Dex heads
        lambda m: m.update(step=m["step"] + 1),  # another λ(t)
        lambda m: m["config"].update(anneal_steps=m["config"]["anneal_steps"] * 2),
    ],
    ids=["heads", "step", "anneal"],
)
def test_an_adapter_config_edited_after_saving_is_refused_by_name(edit, tmp_path):
    """issue 36 §7: a tampered adapter_config.json loaded and evaluated another model with rc 0."""
    folder, meta = _dex_with_some_heads(tmp_path)
    edit(meta)
    (folder / "adapter_config.json").write_text(json.dumps(meta))
    base = tiny("llama")
    with pytest.raises(ValueError, match=r"adapter_config.json was edited after the adapter was saved"):
        load_adapter(base, folder)
    assert getattr(base, "_diffattn_adapter", None) is None


def test_adapter_weights_cast_or_changed_after_saving_are_refused_by_name(tmp_path):
    from safetensors.torch import load_file, save_file

    folder, _ = _dex_with_some_heads(tmp_path)
    weights = folder / "adapter.safetensors"
    original = weights.read_bytes()
    tensors = load_file(weights)
    for change in (lambda t: t.half(), lambda t: t + 1e-3):
        save_file({k: change(v) for k, v in tensors.items()}, weights)
        base = tiny("llama")
        with pytest.raises(ValueError, match=r"adapter.safetensors was changed after the adapter was saved"):
            load_adapter(base, folder)
        assert getattr(base, "_diffattn_adapter", None) is None
    weights.write_bytes(original)
    reordered = json.loads((folder / "adapter_config.json").read_text())  # key order is not an edit
    (folder / "adapter_config.json").write_text(json.dumps(dict(reversed(list(reordered.items())))))
    assert load_adapter(tiny("llama"), folder) is not None


def test_a_format_1_adapter_loads_with_a_warning_that_edits_cannot_be_detected(tmp_path):
    folder, meta = _dex_with_some_heads(tmp_path)
    del meta["adapter_fingerprint"]
    (folder / "adapter_config.json").write_text(json.dumps({**meta, "format_version": 1}))
    with pytest.warns(UserWarning, match="adapter format 1, no adapter fingerprint.*save it again"):
        assert load_adapter(tiny("llama"), folder) is not None
    (folder / "adapter_config.json").write_text(json.dumps({**meta, "format_version": 2}))
    with pytest.raises(ValueError, match="has no adapter_fingerprint"):
        load_adapter(tiny("llama"), folder)


def test_the_lora_control_wraps_without_transformers_deprecation_warning():
    # PEFT reads transformers' deprecated is_gradient_checkpointing as it wraps: a FutureWarning on the user's console
    # at every LoRA control (twice a quickstart) about code not theirs, silenced there only
    import warnings

    from diffattn.adapters.controls import LoRAControlConfig, apply_lora, peft_wrapping

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        apply_lora(tiny("llama"), LoRAControlConfig())
    assert not [w for w in caught if "is_gradient_checkpointing" in str(w.message)]
    with warnings.catch_warnings(record=True) as caught:  # only that warning: others still reach the user
        warnings.simplefilter("always")
        with peft_wrapping():
            warnings.warn("something else", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["something else"]


@pytest.mark.parametrize("variant", ["dex", "diff-v2"])
def test_the_step_is_a_number_eagerly_and_the_buffers_tensor_where_a_graph_is_made(variant, monkeypatch):
    """t of λ(t): setting the step fills every module's ``adapter_step`` buffer; an eager forward reads the number
    (λ(t) two kernels a layer), a forward being compiled or captured as a CUDA graph the buffer (a number would be
    a constant of the graph: compiled again at every step, or frozen at capture), and both give λ(t) within float32's
    rounding of the number's."""
    from diffattn.adapters import base

    model = adapt(tiny("llama"), OPTION_VARIANTS[variant]())
    set_adapter_step(model, 3)
    state = model._diffattn_adapter.state
    followers = [m for m in model.modules() if hasattr(m, "adapter_step")]
    assert followers and all(int(m.adapter_step) == 3 and m.adapter_step.dtype == torch.int64 for m in followers)
    assert all(state.step_of(m) == 3 and isinstance(state.step_of(m), int) for m in followers)
    eager = adapter_lambdas(model)
    monkeypatch.setattr(base, "_capturing_cuda_graph", lambda: True)
    assert all(state.step_of(m) is m.adapter_step for m in followers)
    for got, want in zip(adapter_lambdas(model), eager, strict=True):
        assert abs(got - want) <= 4 * torch.finfo(torch.float32).eps * max(abs(want), 1.0)
    assert sum(k.endswith("adapter_step") for k in model.state_dict()) == len(followers)  # a state dict carries t


# ---------------------------------------------------------------- your own training loop (a user's review, 2026-12-03)


@pytest.mark.parametrize("make", [OPTION_VARIANTS["dex"], OPTION_VARIANTS["daa-post"], OPTION_VARIANTS["diff-v2"]],
                         ids=["Dex", "DAA", "DiffV2"])  # fmt: skip
def test_a_training_forward_before_any_step_is_set_says_so_once(make, caplog):
    """Without set_adapter_step, t stays 0, λ(t) = 0 and the differential term gets no gradient: a plain attention
    fine-tune, silently. The first training forward with a gradient says so; an evaluation forward, or one after
    the step is set, does not."""
    from diffattn.adapters.base import STEP_NEVER_SET

    model = adapt(tiny("llama"), make())
    with caplog.at_level("WARNING", logger="diffattn.adapters.base"):
        model(ids())  # eval mode: nothing to say
        model.train()
        model(ids())
        model(ids())
    assert [r.getMessage() for r in caplog.records].count(STEP_NEVER_SET) == 1
    caplog.clear()
    model = adapt(tiny("llama"), make())
    set_adapter_step(model, 0)
    with caplog.at_level("WARNING", logger="diffattn.adapters.base"):
        model.train()(ids())
    assert STEP_NEVER_SET not in caplog.text


def test_parameter_groups_train_lambda_at_its_own_rate_without_decay():
    """diffattn.parameter_groups: the optimiser groups diffattn adapt trains with, for a loop of one's own."""
    import diffattn
    from diffattn import differential_parameter_names, parameter_groups

    # the names a loop of one's own needs are public, and listed (tab completion, import *)
    assert {"parameter_groups", "differential_parameter_names", "DiffV2Config", "LoRAControlConfig"} <= set(
        dir(diffattn)
    )

    model = adapt(tiny("gpt2"), DexConfig(heads="all", anneal_steps=4))
    trainable_parameters(model)
    groups = {g["name"]: g for g in parameter_groups(model, lr=1e-4, lambda_lr=1e-2, weight_decay=0.1)}
    names = {id(p): n for n, p in model.named_parameters()}
    grouped = {g: {names[id(p)] for p in groups[g]["params"]} for g in groups}
    assert sorted(n for g in grouped.values() for n in g) == sorted(
        n for n, p in model.named_parameters() if p.requires_grad
    )  # every trainable parameter once
    assert grouped["differential"] == set(differential_parameter_names(model)) != set()
    assert (groups["differential"]["lr"], groups["differential"]["weight_decay"]) == (1e-2, 0.0)
    assert set(no_decay_parameter_names(model)) <= grouped["no_decay"] | grouped["differential"]
    assert any("c_attn" in n for n in grouped["no_decay"])  # Dex on GPT-2: the fused c_attn is never decayed
    assert groups["decay"]["weight_decay"] == 0.1 and not any("lambda" in n for n in grouped["decay"])
    optimizer = torch.optim.AdamW(parameter_groups(model, lr=1e-3, lambda_lr=1e-2))
    x = ids()
    model.train()
    for step in range(3):  # λ moves: the term trains
        set_adapter_step(model, step)
        model(x, labels=x).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert max(abs(v) for v in adapter_lambdas(model)) > 1e-3


@pytest.mark.parametrize(
    ("calibration", "message"),
    [
        (lambda x: x, r"calibration must be a list of \[batch, tokens\] input-id tensors.*got a Tensor"),
        (lambda x: [x[0]], r"calibration\[0\] is a 1-D int64 tensor of shape \(12,\).*row.unsqueeze\(0\)"),
        (lambda x: [{"input_ids": x}], r"calibration\[0\] is a dict, not a tensor"),
        (lambda x: [x.float()], r"calibration\[0\] is a 2-D float32 tensor"),
    ],
    ids=["tensor", "1-D", "dict", "float"],
)
def test_dex_calibration_of_the_wrong_kind_is_one_clear_error(calibration, message):
    with pytest.raises(ValueError, match=message):
        adapt(tiny("llama"), DexConfig(heads="entropy", anneal_steps=4), calibration=calibration(ids()))


def test_an_adapter_loaded_into_its_base_cast_to_another_dtype_says_so(tmp_path):
    folder = save_adapter(adapt(tiny("llama"), DAAConfig(anneal_steps=4)), tmp_path / "adapter")
    with pytest.raises(ValueError, match=r"adapted from a base in float32 and this one is in bfloat16: if it is"):
        load_adapter(tiny("llama").to(torch.bfloat16), folder)
    with pytest.raises(ValueError, match=r"different base model \('llama', .*…\)$"):  # another base: no dtype hint
        load_adapter(tiny("llama", seed=1), folder)


def test_adapting_a_base_with_attention_dropout_says_it_is_not_applied(caplog):
    with caplog.at_level("WARNING", logger="diffattn.adapters.base"):
        adapt(tiny("gpt2", attn_pdrop=0.1), DAAConfig(anneal_steps=4))
    assert "without attention-probability dropout (config.attn_pdrop=0.1)" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="diffattn.adapters.base"):
        adapt(tiny("llama"), DAAConfig(anneal_steps=4))
    assert "dropout" not in caplog.text


def test_a_folder_save_pretrained_wrote_from_an_adapted_model_is_refused_by_the_loaders(tmp_path):
    """model.save_pretrained on an adapted model names its weights as the adapter wraps them (self_attn.base_attn.*):
    loaded as its architecture every attention weight is missing and random. diffattn's loaders (eval, adapt's
    base) refuse such a folder naming the two ways to save; a merged model's folder loads."""
    from diffattn.models.pretrained import check_model_folder, load_pretrained

    model = adapt(tiny("llama"), DexConfig(heads="all", anneal_steps=4))
    model.save_pretrained(tmp_path / "wrapped")
    (tmp_path / "wrapped" / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"written by save_pretrained from a model diffattn had adapted .*base_attn"):
        load_pretrained(tmp_path / "wrapped")
    merge_adapter(model).save_pretrained(tmp_path / "merged")
    (tmp_path / "merged" / "tokenizer_config.json").write_text("{}")
    check_model_folder(tmp_path / "merged")


@pytest.mark.parametrize("variant", ["dex", "daa-post", "diff-v2"])
def test_a_state_dict_round_trip_keeps_the_step(variant):
    """t is in the state dict (each λ module's adapter_step buffer) and loading one sets it: a plain PyTorch
    checkpoint of an adapted model reloaded λ(t) at t = 0 (a user's review: logits off by 0.14)."""
    model = adapt(tiny("llama"), OPTION_VARIANTS[variant]())
    _perturb(model, seed=4)
    set_adapter_step(model, 5)
    state = model.state_dict()
    assert any(k.endswith("adapter_step") for k in state)
    fresh = adapt(tiny("llama"), OPTION_VARIANTS[variant]())
    fresh.load_state_dict(state)
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(fresh(x).logits, model(x).logits, atol=0, rtol=0)
    assert fresh._diffattn_adapter.state.step == 5
    # a state dict from before the step was kept (no adapter_step): loads, and t stays where it was
    older = {k: v for k, v in state.items() if not k.endswith("adapter_step")}
    again = adapt(tiny("llama"), OPTION_VARIANTS[variant]())
    set_adapter_step(again, 2)
    assert not again.load_state_dict(older, strict=False).unexpected_keys
    assert again._diffattn_adapter.state.step == 2
