"""Attention capture: leaves outputs unchanged, and what it records is the model's attention —
checked against transformers' own eager attention maps, against the DIFF module's pre-norm output (signed map ·
V), and against Dex's extended head output (effective attention · V)."""

from __future__ import annotations

import pytest
import torch

from diffattn import DAAConfig, DexConfig, adapt, build_model, set_adapter_step
from diffattn.adapters import attention_modules
from diffattn.eval.capture import AttentionCapture, capture_attention
from diffattn.eval.common import cache_keyword

from ..tiny_models import CONFIGS, ids, tiny


def _models():
    dex = adapt(tiny("llama"), DexConfig(heads=[[0, 2], [1]], init="identity", anneal=False, lambda_init=0.3))
    daa = adapt(tiny("qwen3"), DAAConfig(anneal_steps=2))
    set_adapter_step(daa, 1)
    return {
        "baseline": build_model("debug", "standard", seed=0).eval(),
        "diff": build_model("debug", "diff", seed=0).eval(),
        "dex": dex,
        "daa": daa,
        "gpt2": tiny("gpt2"),
    }


@pytest.mark.parametrize("name", ["baseline", "diff", "dex", "daa", "gpt2"])
def test_capture_leaves_logits_unchanged_and_records_every_layer(name):
    model = _models()[name]
    vocab = model.config.vocab_size
    x = torch.randint(0, min(vocab, 96), (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(x).logits
        with AttentionCapture(model) as cap:
            got = model(x).logits
    assert torch.equal(got, want)
    records = cap.last()
    assert sorted(records) == list(range(model.config.num_hidden_layers))
    for rec in records.values():
        assert rec.attn1.shape[-2:] == (10, 10)
        rows = rec.attn1.sum(-1)
        torch.testing.assert_close(rows, torch.ones_like(rows))  # every row is a distribution
        assert (rec.attn1.masked_select(~rec.keep.expand_as(rec.attn1)) == 0).all()  # nothing above the diagonal
        if name in ("diff", "daa"):
            assert rec.kind == "diff" and rec.attn2 is not None
            signed_rows = rec.signed.sum(-1)
            torch.testing.assert_close(signed_rows, (1 - rec.lam)[None, :, None].expand_as(signed_rows))


@pytest.mark.parametrize("model_type", list(CONFIGS))
def test_plain_model_maps_equal_transformers_eager_attentions(model_type):
    model = tiny(model_type)
    model.config._attn_implementation = "eager"
    x = ids(t=12)
    mask = torch.ones_like(x)
    mask[1, :3] = 0  # left padding on row 1
    with torch.no_grad():
        eager = model(x, attention_mask=mask, output_attentions=True).attentions
    records = capture_attention(model, x, attention_mask=mask)
    for layer, rec in records.items():
        real = mask.bool()[:, None, :, None] & mask.bool()[:, None, None, :]  # padded query rows are undefined
        want = eager[layer].masked_fill(~real, 0)
        torch.testing.assert_close(rec.attn1.masked_fill(~real, 0), want, atol=1e-5, rtol=1e-5)


def test_diff_signed_map_times_v_is_the_module_output_before_its_norm():
    model = build_model("debug", "diff", seed=0).eval()
    attn = model.model.layers[1].self_attn
    seen = {}
    attn.groupnorm.register_forward_pre_hook(lambda m, a: seen.__setitem__("pre_norm", a[0]))
    attn.register_forward_pre_hook(lambda m, a, k: seen.__setitem__("hidden", k["hidden_states"]), with_kwargs=True)
    x = ids(t=9)
    records = capture_attention(model, x)
    hidden = seen["hidden"]
    b, t = hidden.shape[:2]
    v = attn.v_proj(hidden).view(b, t, -1, attn.head_dim).transpose(1, 2)
    hkv = v.shape[1] // 2
    v_pair = torch.cat([v[:, :hkv], v[:, hkv:]], dim=-1)
    rep = records[1].num_heads // hkv
    out = records[1].signed @ v_pair.repeat_interleave(rep, dim=1)
    # the layer norms its heads after the transpose to [B, T, h, 2d] (models.diff_llama)
    torch.testing.assert_close(out, seen["pre_norm"].transpose(1, 2), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rows", [None, "last"])
def test_diff_v2_signed_map_with_per_token_lambda_times_v_is_the_module_output(rows):
    """DIFF V2 (docs/methods.md §5): the record's signed map is A1 − λ_t·A2 with each row's own gate, so signed · V
    is the head output that enters o_proj."""
    model = build_model("debug", "diff-v2", seed=0).eval()
    attn = model.model.layers[1].self_attn
    seen = {}
    attn.o_proj.register_forward_pre_hook(lambda m, a: seen.__setitem__("heads", a[0]))
    attn.register_forward_pre_hook(lambda m, a, k: seen.__setitem__("hidden", k["hidden_states"]), with_kwargs=True)
    x = ids(t=9)
    with torch.no_grad():
        want = model(x).logits
        with AttentionCapture(model, rows=rows) as cap:
            got = model(x).logits
    assert torch.equal(got, want)
    rec = cap.last()[1]
    hidden = seen["hidden"]
    b, t = hidden.shape[:2]
    v = attn.v_proj(hidden).view(b, t, -1, attn.head_dim).transpose(1, 2)
    out = rec.signed @ v.repeat_interleave(rec.num_heads // v.shape[1], dim=1)  # [B, H, rows, d]
    heads = seen["heads"].view(b, t, rec.num_heads, attn.head_dim).transpose(1, 2)
    torch.testing.assert_close(out, heads if rows is None else heads[:, :, -1:], atol=1e-5, rtol=1e-5)
    gate = torch.sigmoid(attn.lambda_proj(hidden)).transpose(1, 2)  # [B, H, T]
    torch.testing.assert_close(rec.lam, (gate if rows is None else gate[:, :, -1:]).mean(dim=(0, 2)))


def test_dex_effective_attention_times_v_is_the_extended_head_output():
    model = adapt(tiny("llama"), DexConfig(heads=[[0, 2], [1]], init="zero", anneal=False, lambda_init=0.5))
    with torch.no_grad():
        for _, _, w in attention_modules(model):
            w.method.dex_w_d.normal_(0, 0.3, generator=torch.Generator().manual_seed(3))
    x = ids(t=24)  # S = 24 > d = 16: V has full column rank, so V⁺V = I and X·V reproduces O' exactly
    seen = {}
    wrapper = attention_modules(model)[0][2]
    wrapper.base_attn.o_proj.register_forward_pre_hook(lambda m, a: seen.__setitem__("o", a[0]))
    with AttentionCapture(model, layers=[0]) as cap, torch.no_grad():
        model(x)
    rec = cap.last()[0]
    assert rec.effective is not None and sorted(cap.last()) == [0]
    from diffattn.adapters.model_types import get_spec, project_qkv

    spec = get_spec(model)
    hidden = model.model.embed_tokens(x)
    hidden = model.model.layers[0].input_layernorm(hidden)
    pos = model.model.rotary_emb(hidden, torch.arange(24)[None])
    _, _, v = project_qkv(spec, wrapper.base_attn, hidden, pos)
    v = v.repeat_interleave(2, dim=1)
    o = seen["o"].view(2, 24, 4, 16).transpose(1, 2)  # O' per head as it enters W_O
    torch.testing.assert_close(rec.signed @ v, o, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(rec.effective[:, 0], rec.attn1[:, 0])  # selected head: X ≠ A
    assert torch.equal(rec.effective[:, 1], rec.attn1[:, 1])  # unselected head: A


def test_last_row_and_cached_decoding_records_match_the_full_forward():
    model = tiny("mistral")
    x = ids(t=10)
    full = capture_attention(model, x)
    last = capture_attention(model, x, rows="last")
    torch.testing.assert_close(last[1].attn1, full[1].attn1[:, :, -1:])
    with AttentionCapture(model, rows="last") as cap, torch.no_grad():
        out = model(x[:, :9], use_cache=True)
        model(x[:, 9:], use_cache=True, **{cache_keyword(model): out.past_key_values})
    torch.testing.assert_close(cap.records[1][-1].attn1, full[1].attn1[:, :, -1:], atol=1e-6, rtol=1e-5)


def test_callback_without_storing_and_bad_rows():
    model = tiny("llama")
    seen = []
    with AttentionCapture(model, callback=lambda r: seen.append(r.layer), store=False) as cap, torch.no_grad():
        model(ids())
    assert seen == [0, 1] and cap.records == {}
    with pytest.raises(ValueError, match="rows must be"):
        AttentionCapture(model, rows="first")


def test_peft_lora_control_maps_include_the_adapter():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny("llama"), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj"]))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    model.eval()
    model.get_base_model().config._attn_implementation = "eager"
    x = ids(t=10)
    with torch.no_grad():
        eager = model(input_ids=x, output_attentions=True).attentions
    records = capture_attention(model, x)
    for layer, rec in records.items():
        torch.testing.assert_close(rec.attn1, eager[layer], atol=1e-5, rtol=1e-5)
