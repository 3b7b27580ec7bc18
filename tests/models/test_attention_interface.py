"""Differential attention through transformers' attention interface (diffattn.models.attention_interface): every
implementation transformers can run here gives the logits of the float64 eager model within fp32 rounding, for the
modules whose two maps share K (DIFF V2; docs/methods.md §0.1), and our fused op is a registered implementation.

Tolerance (the rule of tests/ops/test_triton.py): an implementation's error against the float64 model is at most
twice that of plain PyTorch (transformers' eager attention in float32 on this machine) plus one float32 ulp.

Head width 32: torch 2.13's compiled CPU flex_attention is itself wrong (NaN, errors of order 1) at head width 16
and 24 tokens, for a plain transformers Qwen3 as much as for ours (seen on AVX2 machines, first compile in a
process). Before checking our integration, the flex test checks torch's kernel alone on the shapes our call gives
it, and skips with that reason where the kernel is wrong, so the check is of our code, not of torch's."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch

from diffattn import build_model
from diffattn.models.attention_interface import FUSED

from ..tiny_models import tiny

IMPLEMENTATIONS = ["eager", "sdpa", "flex_attention", "flash_attention_2", FUSED]


def _available(impl: str) -> str | None:
    """Why ``impl`` cannot run on this machine (None: it can)."""
    flash_here = torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None
    if impl.startswith("flash_attention") and not flash_here:
        return "flash_attention_2 needs CUDA and the flash-attn package"
    return None


HEAD_DIM = 32  # see the module docstring: torch's compiled CPU flex_attention is wrong at 16 here


def _v2_model():
    return build_model("debug", "diff-v2", seed=0, hidden_size=4 * HEAD_DIM)  # the debug preset's 4 heads


def _adapted(config_class, base_type="qwen3", **options):
    """A tiny ``base_type`` model adapted by the method, its new parameters (λ, W_DAA, W_D, gates) moved off their
    identity start so that both maps count."""

    def make():
        from diffattn import adapt

        model = tiny(base_type, head_dim=HEAD_DIM)
        base_names = {n for n, _ in model.named_parameters()}
        adapt(model, config_class(anneal=False, **options))
        generator = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name not in base_names:
                    p.add_(0.3 * torch.randn(p.shape, generator=generator))
        return model

    return make


def _method_configs():
    from diffattn import DAAConfig, DexConfig, DiffQConfig
    from diffattn.adapters import DiffV2Config

    return {"daa": (DAAConfig, {}), "diffq": (DiffQConfig, {}), "diff-v2 retrofit": (DiffV2Config, {}),
            "dex (one map)": (DexConfig, {"heads": "all"})}  # fmt: skip


MODELS = {"diff-v2": _v2_model, **{f"adapted {n}": _adapted(c, **o) for n, (c, o) in _method_configs().items()}}


def _vocab(model) -> int:
    return model.config.vocab_size


def _logits(model, impl, ids, attention_mask=None):
    model.set_attn_implementation(impl)
    with torch.no_grad():  # flex_attention has no backward on CPU
        return model(ids, attention_mask=attention_mask).logits


def _torch_flex_is_wrong_here(model, length: int) -> str | None:
    """Why torch's compiled flex_attention alone (no diffattn, causal, GQA as our calls use it) cannot be trusted on
    this machine at the shapes ``model``'s attention gives it — query heads H and 2H (a pair-interleaved call) over
    its key/value heads — or None where it agrees with sdpa to float32 rounding."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    config = model.config
    kv_heads, head_dim = config.num_key_value_heads, config.head_dim
    compiled = torch.compile(flex_attention, dynamic=False)
    block_mask = create_block_mask(lambda b, h, q, k: q >= k, None, None, length, length, device="cpu")
    generator = torch.Generator().manual_seed(4)
    for query_heads in (config.num_attention_heads, 2 * config.num_attention_heads):
        q = torch.randn(2, query_heads, length, head_dim, generator=generator)
        k, v = (torch.randn(2, kv_heads, length, head_dim, generator=generator) for _ in range(2))
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        err = (compiled(q, k, v, block_mask=block_mask, enable_gqa=True) - want).abs().max().item()
        if not err <= 1e-4:  # the failures seen are NaN or of order 1; float32 rounding here is ~1e-6
            return (
                f"torch's compiled CPU flex_attention alone is wrong here at {query_heads} query heads over "
                f"{kv_heads}, head width {head_dim}, {length} tokens (error {err:.3g} against sdpa): an upstream "
                f"bug, so our integration cannot be checked with it on this machine"
            )
    return None


def _assert_within_rounding(impl, got, gold, plain):
    err = (got.double() - gold).abs().max().item()
    err_plain = (plain.double() - gold).abs().max().item()
    ulp = torch.finfo(torch.float32).eps * gold.abs().max().item()
    assert err <= 2 * err_plain + ulp, f"{impl}: error {err:.3g} > 2 × eager fp32 {err_plain:.3g} + 1 ulp {ulp:.2g}"


#: FlexAttention compiles a kernel per model (7-47 s on 2 cores): one model in the default run, the rest in CI's heavy
#: one
FLEX_IN_DEFAULT_RUN = "diff-v2"


def _implementation_params():
    for name in sorted(MODELS):
        for impl in IMPLEMENTATIONS:
            heavy = impl == "flex_attention" and name != FLEX_IN_DEFAULT_RUN
            yield pytest.param(name, impl, id=f"{name}-{impl}", marks=pytest.mark.heavy if heavy else ())


@pytest.mark.parametrize(("name", "impl"), list(_implementation_params()))
def test_every_attention_implementation_gives_the_eager_logits(name, impl):
    if (why := _available(impl)) is not None:
        pytest.skip(why)
    model = MODELS[name]()
    if impl == "flex_attention" and (why := _torch_flex_is_wrong_here(model, 24)) is not None:
        pytest.skip(why)
    ids = torch.randint(0, _vocab(model), (2, 24), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    # right padding in the second row (with left padding, float64 eager turns the fully masked rows into NaN, which
    # its zero attention weights then carry into every row: finfo(float64).min plus a score overflows to -inf)
    mask[1, -5:] = 0
    plain = _logits(model, "eager", ids, mask)
    gold = _logits(model.double(), "eager", ids, mask)
    model.float()
    got = _logits(model, impl, ids, mask)
    valid = mask.bool()
    _assert_within_rounding(impl, got[valid], gold[valid], plain[valid])


@pytest.mark.parametrize("name", sorted(MODELS))
def test_generation_with_a_cache_is_the_same_through_each_implementation(name):
    model = MODELS[name]()
    ids = torch.randint(0, _vocab(model), (1, 8), generator=torch.Generator().manual_seed(1))
    tokens = {}
    for impl in ("eager", "sdpa", FUSED):
        model.set_attn_implementation(impl)
        tokens[impl] = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert all(torch.equal(t, tokens["eager"]) for t in tokens.values())


def test_eager_returns_both_maps_interleaved_like_the_fused_path():
    model = _v2_model()
    ids = torch.randint(0, model.config.vocab_size, (1, 10), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        model.set_attn_implementation("eager")
        eager = model(ids, output_attentions=True).attentions
        model.set_attn_implementation(FUSED)
        fused = model(ids, output_attentions=True).attentions
    heads = 2 * model.config.num_attention_heads
    assert eager[0].shape == (1, heads, 10, 10)
    for a, b in zip(eager, fused, strict=True):
        torch.testing.assert_close(a, b)  # both softmax maps in fp32: agree to fp32 rounding


def test_the_fused_implementation_is_the_default_of_a_loaded_v2_model_and_refused_by_ordinary_attention(tmp_path):
    from transformers import AutoModelForCausalLM

    _v2_model().save_pretrained(tmp_path / "v2")
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "v2").config._attn_implementation == FUSED
    baseline = build_model("debug", "standard", seed=0)
    baseline.set_attn_implementation(FUSED)
    with pytest.raises(ValueError, match=r"fused two-map kernel.*use 'sdpa'"):
        baseline(torch.zeros(1, 4, dtype=torch.long))


def test_import_diffattn_only_adds_its_own_implementation_name():
    code = (
        "from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS as A\n"
        "from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS as M\n"
        "before = (dict(A._global_mapping), dict(M._global_mapping))\n"
        "import diffattn, diffattn.models\n"
        "after = (dict(A._global_mapping), dict(M._global_mapping))\n"
        "for b, a in zip(before, after):\n"
        "    assert {k: v for k, v in a.items() if k != 'diffattn'} == b, set(a) ^ set(b)\n"
        "assert 'diffattn' in after[0] and 'diffattn' in after[1]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_plain_llama_is_untouched_by_the_registration():
    model = tiny("llama")
    assert model.config._attn_implementation == "sdpa"


def test_an_adapter_whose_maps_read_two_key_sets_uses_our_op_or_says_why():
    from diffattn import DiffKConfig

    model = _adapted(DiffKConfig)()
    ids = torch.randint(0, _vocab(model), (1, 12), generator=torch.Generator().manual_seed(4))
    fused = _logits(model, FUSED, ids)
    torch.testing.assert_close(_logits(model, "sdpa", ids), fused, rtol=0, atol=0)  # sdpa's tensor mask: our op
    with pytest.raises(ValueError, match=r"runs through diffattn's op, which needs a tensor attention mask"):
        _logits(model, "flex_attention", ids)


def test_adapting_selects_our_op_and_removing_the_adapter_restores_the_implementation():
    from diffattn import DAAConfig, adapt, remove_adapter

    model = tiny("llama")
    model.set_attn_implementation("eager")
    adapt(model, DAAConfig())
    assert model.config._attn_implementation == FUSED
    remove_adapter(model)
    assert model.config._attn_implementation == "eager"
    model(torch.zeros(1, 4, dtype=torch.long))  # the plain modules run again
