"""DIFF V2 models (docs/methods.md §5): the layer against an independent implementation of the reference semantics
written here from the raw weights, cached decoding, the Auto-class round trip, parameter counts, bad input."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaForCausalLM, StaticCache

import diffattn  # noqa: F401  (registers the V2 classes with the Auto classes)
from diffattn.models import (
    DiffTransformerV2Config,
    DiffTransformerV2ForCausalLM,
    DiffV2Attention,
    build_model,
    count_parameters,
)
from diffattn.models.architectures import (
    FFN_WIDTH_MULTIPLE,
    _v2_extra_weights,
    get_architecture,
    matched_intermediate_size,
)
from diffattn.models.diff_v2 import convert_interleaved_rope_state_dict
from diffattn.models.presets import PRESETS, get_preset

from ..helpers import decode_token_by_token


def small_config(**kw) -> DiffTransformerV2Config:
    base = dict(
        vocab_size=97, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=12, max_position_embeddings=64, rope_parameters={"rope_type": "default",
        "rope_theta": 10000.0}, bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    return DiffTransformerV2Config(**{**base, **kw})


def reference_v2_layer(
    attn: DiffV2Attention,
    x: torch.Tensor,
    theta: float = 10000.0,
    *,
    weights=None,
    biases=None,
    rope_kind="rotate-half",
) -> torch.Tensor:
    """The reference semantics from the raw weights, in float64, one head and one token at a time: 2H query heads
    (pairs interleaved), RoPE (``rotate-half`` as Hugging Face, or ``interleaved`` pairs as the reference code),
    causal softmax per map, out_h = A1 V − sigmoid(x·w_λ,h)·A2 V, o_proj. ``biases``: {name: bias} of the
    projections that have one (``attention_bias``), added before RoPE."""
    x = x.double()
    bias = {n: b.double() for n, b in (biases or {}).items()}
    names = ("q_proj", "k_proj", "v_proj", "o_proj", "lambda_proj")
    weights = weights or {n: getattr(attn, n).weight for n in names}
    wq, wk, wv, wo, wl = (weights[n].double() for n in names)
    b, t, _ = x.shape
    d = attn.head_dim
    h = wl.shape[0]
    hkv = wk.shape[0] // d
    q = (x @ wq.T + bias.get("q_proj", 0)).view(b, t, 2 * h, d)
    k = (x @ wk.T + bias.get("k_proj", 0)).view(b, t, hkv, d)
    v = (x @ wv.T + bias.get("v_proj", 0)).view(b, t, hkv, d)
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.arange(t, dtype=torch.float64)[:, None] * inv[None, :]  # [T, d/2]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)

    def rope(z):  # z [B, T, heads, d]
        if rope_kind == "interleaved":  # pairs (z_2i, z_2i+1) rotated by the angle of frequency i
            c, s_ = ang.cos()[None, :, None], ang.sin()[None, :, None]
            even, odd = z[..., 0::2], z[..., 1::2]
            return torch.stack([even * c - odd * s_, even * s_ + odd * c], -1).flatten(-2)
        half = torch.cat([-z[..., d // 2 :], z[..., : d // 2]], -1)
        return z * cos[None, :, None] + half * sin[None, :, None]

    q, k = rope(q), rope(k)
    gate = torch.sigmoid(x @ wl.T)  # [B, T, H]
    out = torch.zeros(b, t, h, d, dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            kv = hi // (h // hkv)
            for i in range(t):
                keys = k[bi, : i + 1, kv]
                a1 = torch.softmax(keys @ q[bi, i, 2 * hi] / d**0.5, 0)
                a2 = torch.softmax(keys @ q[bi, i, 2 * hi + 1] / d**0.5, 0)
                out[bi, i, hi] = (a1 - gate[bi, i, hi] * a2) @ v[bi, : i + 1, kv]
    return out.reshape(b, t, h * d) @ wo.T + bias.get("o_proj", 0)


@pytest.mark.parametrize("backend", ["reference", "sdpa", "chunked"])
def test_layer_matches_an_independent_implementation_outputs_and_gradients(backend):
    torch.manual_seed(0)
    model = DiffTransformerV2ForCausalLM(small_config()).eval()
    attn = model.model.layers[0].self_attn
    attn.backend = backend
    x = torch.randn(2, 7, 48, requires_grad=True)
    pos = torch.arange(7)[None].expand(2, -1)
    got, _ = attn(x, model.model.rotary_emb(x, pos), attention_mask=None)
    want = reference_v2_layer(attn, x)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    cot = torch.randn(got.shape, generator=torch.Generator().manual_seed(1))
    params = [x, *(getattr(attn, n).weight for n in ("q_proj", "k_proj", "v_proj", "o_proj", "lambda_proj"))]
    g_got = torch.autograd.grad((got * cot).sum(), params)
    g_want = torch.autograd.grad((want * cot.double()).sum(), params)
    for name, a, r in zip(["x", "q", "k", "v", "o", "lambda"], g_got, g_want, strict=True):
        torch.testing.assert_close(a.double(), r.double(), atol=1e-5, rtol=1e-4, msg=lambda m, n=name: f"grad {n}: {m}")


@pytest.mark.parametrize("attention_bias", [pytest.param(False, id="no-bias"), pytest.param(True, id="q-k-biases")])
def test_a_checkpoint_written_for_interleaved_rope_loads_after_the_row_permutation(attention_bias):
    """The reference code rotates interleaved pairs; its weights, with q/k rows permuted per head, give the same
    layer in our (rotate-half) model. A bias is added before RoPE: its entries move with their rows."""
    torch.manual_seed(0)
    cfg = small_config(num_hidden_layers=1, attention_bias=attention_bias)
    model = DiffTransformerV2ForCausalLM(cfg).eval()
    attn = model.model.layers[0].self_attn
    g = torch.Generator().manual_seed(3)
    reference = {n: torch.randn(getattr(attn, n).weight.shape, generator=g) * 0.2 for n in
                 ("q_proj", "k_proj", "v_proj", "o_proj", "lambda_proj")}  # fmt: skip
    biases = {
        n: torch.randn(getattr(attn, n).bias.shape, generator=g) for n in ("q_proj", "k_proj", "v_proj", "o_proj")
    } if attention_bias else {}  # fmt: skip
    x = torch.randn(2, 7, 48, generator=g)
    want = reference_v2_layer(attn, x, weights=reference, biases=biases, rope_kind="interleaved")
    state = {f"model.layers.0.self_attn.{n}.weight": w for n, w in reference.items()}
    state |= {f"model.layers.0.self_attn.{n}.bias": b for n, b in biases.items()}
    converted = convert_interleaved_rope_state_dict(state, cfg)
    model.load_state_dict(converted, strict=False)
    got, _ = attn(x, model.model.rotary_emb(x, torch.arange(7)[None].expand(2, -1)), attention_mask=None)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    model.load_state_dict(state, strict=False)  # without the permutation the layer differs
    unconverted, _ = attn(x, model.model.rotary_emb(x, torch.arange(7)[None].expand(2, -1)), attention_mask=None)
    assert (unconverted.double() - want).abs().max() > 1e-3
    if attention_bias:  # the weights permuted but not the biases: still another layer
        model.load_state_dict(converted | {k: v for k, v in state.items() if k.endswith(".bias")}, strict=False)
        half, _ = attn(x, model.model.rotary_emb(x, torch.arange(7)[None].expand(2, -1)), attention_mask=None)
        assert (half.double() - want).abs().max() > 1e-3


def test_layout_and_parameter_counts():
    cfg = small_config()
    model = DiffTransformerV2ForCausalLM(cfg)
    attn = model.model.layers[0].self_attn
    h, d, dm = 4, 12, 48
    assert attn.q_proj.weight.shape == (2 * h * d, dm)
    assert attn.k_proj.weight.shape == (2 * d, dm) and attn.v_proj.weight.shape == (2 * d, dm)
    assert attn.o_proj.weight.shape == (dm, h * d) and attn.lambda_proj.weight.shape == (h, dm)
    assert attn.lambda_proj.bias is None
    baseline = DiffTransformerV2ForCausalLM(small_config(use_diff_v2=False))
    extra = sum(p.numel() for p in model.parameters()) - sum(p.numel() for p in baseline.parameters())
    assert extra == cfg.num_hidden_layers * (h * d * dm + dm * h)  # the statement of what V2 adds
    # presets: the V2 model pays for its extra weights with a narrower FFN of a width cuBLAS's fast GEMMs take (a
    # multiple of 8), matching the baseline within half a unit of rounding plus half that multiple in FFN units
    # (3·d_model parameters each) per layer
    for name in PRESETS:
        p = get_preset(name)
        width = matched_intermediate_size(p, get_architecture("diff-v2"))
        assert width < p.intermediate_size and width % FFN_WIDTH_MULTIPLE == 0, (name, width)
        exact = p.intermediate_size - _v2_extra_weights(p) / (3 * p.hidden_size)
        assert abs(width - exact) <= (FFN_WIDTH_MULTIPLE + 1) / 2, (name, width, exact)
        # an architecture that adds no weights keeps the preset's width, a multiple of 8 or not
        assert matched_intermediate_size(dataclasses.replace(p, intermediate_size=100), get_architecture("diff")) == 100
        if name in ("debug", "quick", "tiny", "small"):
            base, v2 = count_parameters(p, "standard"), count_parameters(p, "diff-v2")
            assert abs(v2 - base) <= p.num_layers * 3 * p.hidden_size * (FFN_WIDTH_MULTIPLE + 1) / 2, name


def test_use_diff_v2_false_is_the_llama_baseline():
    torch.manual_seed(0)
    cfg = small_config(use_diff_v2=False)
    ours = DiffTransformerV2ForCausalLM(cfg).eval()
    llama = LlamaForCausalLM(cfg).eval()
    llama.load_state_dict(ours.state_dict())
    ids = torch.randint(0, 97, (2, 9))
    torch.testing.assert_close(ours(ids).logits, llama(ids).logits)


def test_cached_decoding_equals_the_full_forward():
    torch.manual_seed(0)
    model = build_model("debug", "diff-v2", seed=0).eval()
    ids = torch.randint(0, 256, (2, 12))
    full = model(ids).logits
    logits, cache = decode_token_by_token(model, ids, prefill=8)
    torch.testing.assert_close(logits, full, atol=1e-5, rtol=1e-5)
    # a static cache longer than the text: its empty slots stay unseen at prefill (transformers passes no mask)
    static = StaticCache(config=model.config, max_cache_len=16)
    static_logits, _ = decode_token_by_token(model, ids, prefill=8, cache=static)
    torch.testing.assert_close(static_logits, full, atol=1e-5, rtol=1e-5)
    # the KV cache holds the baseline's Hkv heads of width d (V2's second query heads need no keys)
    k = cache.layers[0].keys
    assert k.shape == (2, model.config.num_key_value_heads, 12, model.config.head_dim)
    gen = model.generate(ids[:, :5], max_new_tokens=4, do_sample=False)
    assert gen.shape == (2, 9)


@pytest.mark.parametrize("backend", ["sdpa", "auto"])
def test_decoding_by_route_plans_gives_the_whole_paths_logits_bit_for_bit(backend, monkeypatch):
    # DIFF V2's layers hand the op their query pairs, one K and λ per head and token (diffattn.ops.call_plans: route
    # plans, the pairs entry): the static cache's decoding calls by their plan give the whole path's logits exactly
    from diffattn.ops import call_plans

    model = build_model("debug", "diff-v2", backend=backend, seed=0).eval()
    ids = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(0))

    def decode():
        with torch.no_grad():
            cache = StaticCache(config=model.config, max_cache_len=16)
            return decode_token_by_token(model, ids, prefill=6, cache=cache)[0]

    planned = decode()
    assert call_plans.ROUTE_PLANS and {p.entry for p in call_plans.ROUTE_PLANS.values()} == {"pairs"}
    monkeypatch.setattr(call_plans, "route_signature", lambda *a, **k: None)
    call_plans.forget()
    assert torch.equal(planned, decode())


def test_save_and_plain_from_pretrained_after_import_diffattn(tmp_path):
    model = build_model("debug", "diff-v2", seed=0).eval()
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "diffattn_v2"
    assert "import diffattn" in (tmp_path / "README.md").read_text()  # the card says how to load it
    ids = torch.randint(0, 256, (1, 6))
    want = model(ids).logits
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, DiffTransformerV2ForCausalLM)
    torch.testing.assert_close(loaded(ids).logits, want)
    # every import order in fresh interpreters, and the refusal without diffattn: tests/models/test_hf_interop.py


def test_heads_that_cannot_pair_are_refused():
    with pytest.raises(ValueError, match="DIFF V2 pairs its 2H query heads"):
        build_model("debug", "diff-v2", num_heads=4, num_kv_heads=3)
    with pytest.raises(ValueError, match="must be a multiple of num_key_value_heads"):
        small_config(num_attention_heads=4, num_key_value_heads=3)
    with pytest.raises(ValueError, match="lambda_init: they need attention='diff'"):
        build_model("debug", "diff-v2", lambda_init=0.5)


def test_attention_dropout_is_applied_by_transformers_implementations_and_said_to_be_absent_from_ours(caplog):
    """The fused route (the default) drops no attention probabilities, and says so when the model is built; 'sdpa'
    and 'eager' apply config.attention_dropout in training mode, as Llama's modules do."""
    x = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(0))
    with caplog.at_level("WARNING", logger="diffattn.models.diff_v2"):
        model = DiffTransformerV2ForCausalLM(small_config(attention_dropout=0.5)).train()
    assert "computes without attention-probability dropout (config.attention_dropout=0.5)" in caplog.text
    with torch.no_grad():
        assert torch.equal(model(x).logits, model(x).logits)
    for implementation in ("sdpa", "eager"):
        caplog.clear()
        with caplog.at_level("WARNING", logger="diffattn.models.diff_v2"):
            model = DiffTransformerV2ForCausalLM(
                small_config(attention_dropout=0.5, attn_implementation=implementation)
            ).train()
        assert "dropout" not in caplog.text, implementation
        with torch.no_grad():
            assert not torch.equal(model(x).logits, model(x).logits), implementation
    caplog.clear()
    with caplog.at_level("WARNING", logger="diffattn.models.diff_v2"):
        DiffTransformerV2ForCausalLM(small_config())
    assert "dropout" not in caplog.text
