"""Presets, from-scratch models, and our DIFF attention installed into Hugging Face DiffLlama (DIFF Eq. 1–3).

Parity is against transformers' own ``DiffLlamaAttention`` on the same weights (litgpt-style), and against an
independent implementation of Eq. 1–3 written here from the raw weights.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM, DiffLlamaForCausalLM, LlamaForCausalLM, StaticCache

import diffattn
from diffattn.eval.common import cache_keyword
from diffattn.models import (
    PRESETS,
    DiffLlamaDifferentialAttention,
    build_model,
    count_parameters,
    get_preset,
    install_diff_attention,
    lambda_init_value,
    remove_diff_attention,
)
from diffattn.ops import chunked

from ..helpers import decode_token_by_token

BACKENDS = ["reference", "sdpa", "sdpa_split", "sdpa_maps", "chunked", "auto"]
ATOL = 1e-5


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    """`chunked` (and `auto` on CPU) take 4 queries per step here, so parity covers chunk boundaries."""
    monkeypatch.setattr(chunked, "DEFAULT_CHUNK", 4)


@pytest.fixture(scope="module")
def hf_diff():
    """A plain Hugging Face DiffLlama (GQA 4/2) with λ vectors large enough that λ varies by layer."""
    model = build_model("debug", "diff", backend=None, seed=0, num_layers=3).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
                getattr(layer.self_attn, name).normal_(0, 0.3)
    return model


def _ids(b=2, t=11, seed=0):
    return torch.randint(0, 256, (b, t), generator=torch.Generator().manual_seed(seed))


def _installed_copy(model, backend, **kw):
    copy = build_model("debug", "diff", backend=None, num_layers=3).eval()
    copy.load_state_dict(model.state_dict())
    return install_diff_attention(copy, backend, **kw)


@pytest.mark.parametrize("backend", BACKENDS)
def test_installed_attention_matches_hf_diffllama_logits(hf_diff, backend):
    ids = _ids()
    with torch.no_grad():
        want = hf_diff(ids).logits
        model = _installed_copy(hf_diff, backend)
        got = model(ids).logits
    assert all(isinstance(layer.self_attn, DiffLlamaDifferentialAttention) for layer in model.model.layers)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_installed_attention_matches_hf_with_left_padding(hf_diff, backend):
    ids = _ids(t=9)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    with torch.no_grad():
        want = hf_diff(ids, attention_mask=mask).logits
        got = _installed_copy(hf_diff, backend)(ids, attention_mask=mask).logits
    keep = mask.bool()  # padded positions' outputs are meaningless in both
    torch.testing.assert_close(got[keep], want[keep], atol=ATOL, rtol=1e-5)


def test_parameter_names_and_tensors_are_the_originals(hf_diff):
    model = _installed_copy(hf_diff, "auto")
    plain = build_model("debug", "diff", backend=None, num_layers=3)
    assert list(dict(model.named_parameters())) == list(dict(plain.named_parameters()))
    attn = model.model.layers[1].self_attn
    assert attn.q_proj is attn.original.q_proj and attn.lambda_q1 is attn.original.lambda_q1


def test_gradients_match_hf_diffllama(hf_diff):
    ids = _ids()
    plain = build_model("debug", "diff", backend=None, num_layers=3)
    plain.load_state_dict(hf_diff.state_dict())
    ours = _installed_copy(hf_diff, "sdpa").train()
    grads = []
    for model in (plain.train(), ours):
        model.zero_grad()
        model(ids, labels=ids).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, atol=1e-5, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")
    assert grads[1]["model.layers.0.self_attn.lambda_q1"].abs().sum() > 0


def paper_layer(attn, x, cos, sin):
    """DIFF Eq. 1–3 from the raw weights, written independently: one loop per differential head."""
    b, t, _ = x.shape
    d, h_all, hkv_all = attn.head_dim, attn.num_heads, attn.num_kv_heads
    h, hkv = h_all // 2, hkv_all // 2
    q = (x @ attn.q_proj.weight.T).view(b, t, h_all, d)
    k = (x @ attn.k_proj.weight.T).view(b, t, hkv_all, d)
    v = (x @ attn.v_proj.weight.T).view(b, t, hkv_all, d)

    def rope(z):  # rotate_half RoPE, cos/sin [B, T, d]
        z1, z2 = z[..., : d // 2], z[..., d // 2 :]
        return z * cos[:, :, None] + torch.cat([-z2, z1], -1) * sin[:, :, None]

    q, k = rope(q), rope(k)
    lam_init = 0.8 - 0.6 * math.exp(-0.3 * attn.layer_idx)
    lam = torch.exp(attn.lambda_q1 @ attn.lambda_k1) - torch.exp(attn.lambda_q2 @ attn.lambda_k2) + lam_init
    causal = torch.full((t, t), float("-inf")).triu(1)
    heads = []
    for i in range(h):
        j = i // (h // hkv)
        a1 = torch.softmax(q[:, :, i] @ k[:, :, j].transpose(1, 2) / math.sqrt(d) + causal, -1)
        a2 = torch.softmax(q[:, :, h + i] @ k[:, :, hkv + j].transpose(1, 2) / math.sqrt(d) + causal, -1)
        vv = torch.cat([v[:, :, j], v[:, :, hkv + j]], -1)  # [B, T, 2d]
        o = (a1 - lam * a2) @ vv  # Eq. 1
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + attn.config.rms_norm_eps)  # GroupNorm (RMS)
        heads.append((1 - lam_init) * o)  # Eq. 3
    return torch.cat(heads, -1) @ attn.o_proj.weight.T


@pytest.mark.parametrize("backend", ["reference", "sdpa", "chunked"])
def test_module_matches_independent_paper_equations(hf_diff, backend):
    model = _installed_copy(hf_diff, backend)
    x = torch.randn(2, 7, 64, generator=torch.Generator().manual_seed(5))
    pos = torch.arange(7)[None].expand(2, -1)
    cos, sin = model.model.rotary_emb(x, pos)
    for layer in model.model.layers:
        with torch.no_grad():
            got, _ = layer.self_attn(x, (cos, sin), attention_mask=None)
            want = paper_layer(layer.self_attn, x, cos, sin)
        torch.testing.assert_close(got, want, atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cached_token_by_token_decoding_equals_full_forward(hf_diff, backend):
    model = _installed_copy(hf_diff, backend)
    ids = _ids(b=2, t=10)
    with torch.no_grad():
        full = model(ids).logits
        steps, _ = decode_token_by_token(model, ids, prefill=4)  # a chunk (T == S), then one token at a time
        # a static cache longer than the text: no mask comes with the prefill, and its empty slots must stay unseen
        static, _ = decode_token_by_token(
            model, ids, prefill=4, cache=StaticCache(config=model.config, max_cache_len=16)
        )
        chunk = model(ids[:, :6], use_cache=True)  # a multi-token block against a cache: 1 < T < S
        block = model(ids[:, 6:], use_cache=True, **{cache_keyword(model): chunk.past_key_values}).logits
    torch.testing.assert_close(steps, full, atol=ATOL, rtol=1e-5)
    torch.testing.assert_close(static, full, atol=ATOL, rtol=1e-5)
    torch.testing.assert_close(block, full[:, 6:], atol=ATOL, rtol=1e-5)


def _decoding_call(plan, q, k, v, lam, options) -> tuple[bool, int, int]:
    return options["attn_mask"] is not None, q.shape[-2], k.shape[-2]


@pytest.mark.parametrize("backend", ["sdpa_maps", "auto"])
def test_decoding_by_route_plans_gives_the_whole_paths_logits_bit_for_bit(hf_diff, backend, monkeypatch):
    # a decoding call of a kind decided before runs its route without the whole path (diffattn.ops.call_plans: route
    # plans), on the static cache's mask as on a dynamic cache's none: the same logits, bit for bit
    from diffattn import ops
    from diffattn.ops import call_plans

    model = _installed_copy(hf_diff, backend)
    ids = _ids(b=1, t=10)
    by_plan_of = ops._by_route_plan

    def decode():
        with torch.no_grad():
            static, _ = decode_token_by_token(
                model, ids, prefill=4, cache=StaticCache(config=model.config, max_cache_len=16)
            )
            dynamic, _ = decode_token_by_token(model, ids, prefill=4)
        return static, dynamic

    by_plan = []  # (with a mask?, T, S) of each call a plan ran
    monkeypatch.setattr(ops, "_by_route_plan", lambda *a: by_plan.append(_decoding_call(*a)) or by_plan_of(*a))
    planned = decode()
    # the static cache's decoding calls keep their signature (its length is fixed; the layers' head norms differ, and
    # a plan applies the call's own): the plan made at the first token's second layer, run from its third on; the
    # dynamic cache's grow by a key every token, a signature each token that its layers share: the plan made at each
    # token's second layer, run from its third on
    layers, tokens = model.config.num_hidden_layers, ids.shape[1] - 4
    assert sum(masked for masked, _, _ in by_plan) == (layers - 2) + (tokens - 1) * layers
    assert sum(not masked and s > 4 for masked, _, s in by_plan) == tokens * (layers - 2)
    monkeypatch.setattr(call_plans, "route_signature", lambda *a, **k: None)
    call_plans.forget()
    whole = decode()
    assert all(torch.equal(a, b) for a, b in zip(planned, whole, strict=True))


def test_generate_matches_hf_greedy(hf_diff):
    ids = _ids(b=1, t=5)
    kw = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        want = hf_diff.generate(ids, **kw)
        got = _installed_copy(hf_diff, "auto").generate(ids, **kw)
    assert torch.equal(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_save_pretrained_reloads_in_plain_transformers(hf_diff, backend, tmp_path):
    model = _installed_copy(hf_diff, backend)
    ids = _ids()
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert isinstance(reloaded, DiffLlamaForCausalLM)
    assert not any(isinstance(m, DiffLlamaDifferentialAttention) for m in reloaded.modules())
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, model(ids).logits, atol=ATOL, rtol=1e-5)
    assert reloaded.config.diffattn == {"lambda_init": "exponential", "norm": "rms"}


def test_options_are_recorded_and_reinstalled(hf_diff, tmp_path):
    model = _installed_copy(hf_diff, "sdpa", lambda_init=0.5, norm="rms_affine")
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.groupnorm.weight.uniform_(0.5, 1.5)
    ids = _ids()
    model.save_pretrained(tmp_path)
    reloaded = install_diff_attention(AutoModelForCausalLM.from_pretrained(tmp_path).eval())
    # the gain is not a DiffLlama parameter: plain loading drops it, so set it back from the saved file
    from safetensors.torch import load_file

    state = load_file(tmp_path / "model.safetensors")
    reloaded.load_state_dict(state, strict=False)
    assert reloaded.model.layers[2].self_attn.lambda_init == 0.5
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, model(ids).logits, atol=ATOL, rtol=1e-5)


def test_norm_and_lambda_init_options_change_what_they_say(hf_diff):
    ids = _ids()
    base = _installed_copy(hf_diff, "sdpa")
    affine = _installed_copy(hf_diff, "sdpa", norm="rms_affine")
    none = _installed_copy(hf_diff, "sdpa", norm="none")
    names = {n for n, _ in affine.named_parameters()} - {n for n, _ in base.named_parameters()}
    assert names == {f"model.layers.{i}.self_attn.groupnorm.weight" for i in range(3)}
    with torch.no_grad():
        torch.testing.assert_close(affine(ids).logits, base(ids).logits)  # gain initialised at 1
        assert not torch.allclose(none(ids).logits, base(ids).logits)
    assert [layer.self_attn.lambda_init for layer in base.model.layers] == [
        pytest.approx(0.8 - 0.6 * math.exp(-0.3 * i)) for i in range(3)
    ]
    assert lambda_init_value(0, 0.8) == 0.8


def test_lambda_is_fp32_and_follows_eq2(hf_diff):
    attn = _installed_copy(hf_diff, "sdpa").model.layers[1].self_attn
    lam = attn.lambda_full()
    assert lam.dtype == torch.float32 and lam.dim() == 0
    want = (
        torch.exp((attn.lambda_q1 * attn.lambda_k1).sum())
        - torch.exp((attn.lambda_q2 * attn.lambda_k2).sum())
        + attn.lambda_init
    )
    torch.testing.assert_close(lam, want)


def test_remove_restores_hf_modules(hf_diff):
    model = remove_diff_attention(_installed_copy(hf_diff, "sdpa"))
    assert not any(isinstance(m, DiffLlamaDifferentialAttention) for m in model.modules())
    with pytest.raises(ValueError, match="no diffattn DIFF attention"):
        remove_diff_attention(model)


def test_build_model_classes_and_sizes():
    base = build_model("debug", "standard", seed=0)
    diff = build_model("debug", "diff", seed=0)
    assert isinstance(base, LlamaForCausalLM) and isinstance(diff, DiffLlamaForCausalLM)
    assert base.config.num_attention_heads == diff.config.num_attention_heads == 4
    assert isinstance(diff.model.layers[0].self_attn, DiffLlamaDifferentialAttention)
    a, b = build_model("debug", "diff", seed=3), build_model("debug", "diff", seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))


@pytest.mark.parametrize("preset", list(PRESETS))
def test_baseline_and_diff_parameter_counts_agree_within_1_percent(preset):
    base, diff = count_parameters(preset, "standard"), count_parameters(preset, "diff")
    assert abs(diff - base) / base < 0.01
    p = get_preset(preset)
    assert diff - base == 4 * p.head_dim * p.num_layers  # only the λ vectors differ


@pytest.mark.parametrize(
    ("preset", "size"),
    [
        ("paper-830m", 830e6),
        ("paper-1.4b", 1.4e9),
        ("paper-2.8b", 2.8e9),
        ("paper-6.8b", 6.8e9),
        ("paper-13.1b", 13.1e9),
    ],
)
def test_paper_presets_have_the_named_size(preset, size):
    assert abs(count_parameters(preset, "diff") - size) / size < 0.015


def test_public_api_exports():
    assert diffattn.build_model is build_model and callable(diffattn.diff_attention)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: build_model("huge"), "unknown preset 'huge'; allowed: debug"),
        (lambda: build_model("debug", "mamba"), "attention must be one of standard, diff"),
        (lambda: build_model("debug", "diff", num_kv_heads=1), "DIFF needs an even num_kv_heads"),
        (lambda: build_model("debug", "diff", num_heads=3, hidden_size=63, num_kv_heads=1), "even num_heads"),
        (lambda: build_model("debug", "standard", num_kv_heads=3), "not a multiple of num_kv_heads"),
        (lambda: build_model("debug", layers=3), "unknown preset override"),
        (lambda: build_model("debug", "diff", backend="magic"), "backend must be one of"),
        (lambda: build_model("debug", "diff", lambda_init=1.5), "lambda_init must be"),
        (lambda: build_model("debug", "diff", norm="layer"), "norm must be one of"),
        (lambda: build_model("debug", "standard", norm="rms"), "need attention='diff'"),
        (lambda: install_diff_attention(build_model("debug")), "needs a DiffLlama model"),
    ],
)
def test_bad_input_gives_clear_value_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_output_attentions_returns_the_maps_transformers_diffllama_eager_returns():
    """Per layer [B, H, T, S]: heads [0, H/2) map 1, [H/2, H) map 2, equal to plain DiffLlama's eager path; also
    under SDPA (where plain DiffLlama returns an empty tuple), and with a padded batch."""
    ours = build_model("debug", "diff", seed=0, vocab_size=100).eval()
    plain = DiffLlamaForCausalLM(ours.config).eval()
    plain.load_state_dict(ours.state_dict())
    plain.set_attn_implementation("eager")
    x = torch.randint(0, 100, (2, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(x)
    mask[1, :3] = 0  # left padding in the second row
    with torch.no_grad():
        got = ours(x, attention_mask=mask, output_attentions=True).attentions
        want = plain(x, attention_mask=mask, output_attentions=True).attentions
    assert len(got) == ours.config.num_hidden_layers and got[0].shape == (2, ours.config.num_attention_heads, 9, 9)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g[:, :, 3:], w[:, :, 3:], atol=1e-5, rtol=1e-5)  # rows of real tokens
    assert ours(x).attentions is None  # not computed unless asked


def test_lambda_is_initialised_however_the_model_is_built():
    """transformers initialises meta-device builds (and weights a checkpoint lacks) through _init_weights, which
    must know our attention: λ vectors ~ N(0, lambda_std_dev), never uninitialised memory."""
    with torch.device("meta"):
        model = build_model("debug", "diff", seed=0, vocab_size=100)
    model.to_empty(device="cpu")
    attn = model.model.layers[0].self_attn
    assert type(attn).__name__ == "DiffLlamaDifferentialAttention"
    for p in (attn.lambda_q1, attn.lambda_k1, attn.lambda_q2, attn.lambda_k2):
        p.data.fill_(float("nan"))
    model.init_weights()
    lam = torch.cat([attn.lambda_q1, attn.lambda_k1, attn.lambda_q2, attn.lambda_k2]).detach()
    assert torch.isfinite(lam).all() and 0.05 < lam.std().item() < 0.2


# -- the architecture table: a toy row reaches build, parameter matching, paired runs and the claims --------------


@pytest.fixture
def toy_architecture():
    from transformers import LlamaConfig

    from diffattn.models.architectures import Architecture, register_architecture, unregister_architecture

    row = register_architecture(
        Architecture(
            name="toy-arch", label="Toy Transformer", short_label="toy", config_class=LlamaConfig,
            model_class=LlamaForCausalLM,
            config_options={"mlp_bias": False}, shape=lambda p: f"{p.num_heads} toy heads", differential=True,
            extra_layer_weights=lambda p: 8 * 3 * p.hidden_size,  # pays eight SwiGLU units per layer
            claims_label="applied to the toy",
        )
    )  # fmt: skip
    yield row
    unregister_architecture(row.name)


def test_a_registered_architecture_builds_matches_parameters_pairs_and_labels_its_claims(toy_architecture, tmp_path):
    import json

    import numpy as np

    from diffattn.experiments import ExperimentConfig
    from diffattn.experiments.claims import paper_claims
    from diffattn.train.config import PAIRED, RunConfig
    from diffattn.train.paired import write_comparison

    p = get_preset("debug")
    model = build_model("debug", "toy-arch", seed=0)  # builds like the baseline, FFN narrowed by eight units
    assert isinstance(model, LlamaForCausalLM) and model.config.intermediate_size == p.intermediate_size - 8
    assert count_parameters(p, "standard") - count_parameters(p, "toy-arch") == p.num_layers * 8 * 3 * p.hidden_size
    toy = count_parameters(p, "toy-arch")
    assert f" | toy {toy:,} params (4 toy heads, FFN {p.intermediate_size - 8}; " in diffattn.describe_parameters(p)
    with pytest.raises(ValueError, match="norm: they need attention='diff'"):
        build_model("debug", "toy-arch", norm="rms")

    RunConfig().with_overrides({"model.attention": "toy-arch"}).validate()  # pretrain accepts it
    assert PAIRED["all"][-1] == "toy-arch"  # `--attention all` trains it beside the others
    summaries = {
        a: {"parameters": count_parameters(p, a), "steps": 1, "final_val_loss": 1.0, "final_val_ppl": 2.7,
            "tokens_per_s": 1.0}
        for a in ("standard", "toy-arch")
    }  # fmt: skip
    write_comparison(tmp_path, summaries)
    assert [r["model"] for r in json.loads((tmp_path / "comparison.json").read_text())] == [
        "Transformer (baseline)",
        "Toy Transformer",
    ]

    config = ExperimentConfig.from_dict(
        {
            "name": "toy",
            "models": [
                {"name": "baseline", "preset": "debug", "attention": "standard"},
                {"name": "toy", "preset": "debug", "attention": "toy-arch"},
            ],
            "eval": {"suites": ["alloc"]},
        }
    )
    rng = np.random.default_rng(0)
    answer, noise = rng.uniform(0.01, 0.03, 40), rng.uniform(0.4, 0.6, 40)

    def alloc(a):
        per_sample = [{"answer": x, "noise": n} for x, n in zip(a, noise, strict=True)]
        return {"alloc": {"attention_to_answer": float(np.mean(a)), "attention_noise": float(np.mean(noise)),
                          "per_sample": per_sample, "metadata": {"samples_sha1": "same"}}}  # fmt: skip

    claims = paper_claims(config, {}, {"baseline": alloc(answer), "toy": alloc(answer + 0.1)})
    claim = next(c for c in claims if c and c.claim == "more attention to the answer")
    assert (claim.ref, claim.new) == ("baseline", "toy")  # paired with the baseline of its preset
    assert claim.source == "DIFF Transformer Table 3 (applied to the toy)" and claim.verdict == "agrees"


def test_the_diff_layers_split_their_heads_without_slice_gradients():
    # DIFF: Q, K and V are halved by one split each; DIFF V2: the interleaved query heads' pairs by one unbind
    # (models.attention_interface.interleaved_pair). Autograd joins a split's gradients with one cat, an unbind's
    # with one stack, where two slices would each cost a zero-filled tensor and a copy, and an addition
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    def slice_gradients(attention, backend=None):
        model = build_model("debug", attention, backend=backend, num_layers=1)
        ids = torch.randint(0, 100, (1, 12), generator=torch.Generator().manual_seed(0))
        with Ops() as ops:
            model(input_ids=ids, labels=ids).loss.backward()
        assert all(p.grad is not None for n, p in model.named_parameters() if "proj" in n)
        return ops.names.count("slice_backward")

    # the baseline's come from RoPE's rotate_half and the shifted labels, which DIFF shares; none of its own — nor
    # of the op's: a one-call route cuts its output into the two maps by one chunk or unbind (ops.sdpa._maps_apart)
    baseline = slice_gradients("standard")
    assert baseline > 0
    for attention, backend in [("diff", "sdpa"), ("diff", "sdpa_split"), ("diff", "sdpa_maps"), ("diff-v2", "sdpa"),
                               ("diff-v2", "sdpa_maps")]:  # fmt: skip
        assert slice_gradients(attention, backend) == baseline, (attention, backend)


@pytest.mark.parametrize("backend", ["sdpa", "sdpa_split", "sdpa_maps"])
def test_the_diff_layers_output_reaches_o_proj_without_a_copy(backend, monkeypatch):
    # CUDA's attention kernels return a model's output [B, T, H, dv]-ordered, and the SDPA routes keep that order
    # through their cuts and joins (ops.sdpa); the layer norms its heads after the transpose to [B, T, h, 2d], so the
    # output is normed as it is and joined into [B, T, h·2d] by a view. Normed before the transpose, rms_norm made it
    # contiguous [B, h, T, 2d] and the reshape copied it back; joined in [B, h, T, dv] order, the norm copied it
    import torch.nn.functional as F
    from torch.utils._python_dispatch import TorchDispatchMode

    real = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        lambda *a, **k: real(*a, **k).transpose(1, 2).contiguous().transpose(1, 2))  # fmt: skip

    class Copies(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket.__name__ in ("clone", "copy_", "contiguous", "_to_copy"):
                self.names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    model = build_model("debug", "diff", backend=backend, num_layers=1, seed=0).eval()
    attn = model.model.layers[0].self_attn
    arguments = {}
    attn.register_forward_pre_hook(lambda m, a, k: arguments.update(k), with_kwargs=True)
    ids = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model(ids, use_cache=False)
        with Copies() as copies:
            attn(**arguments)
    assert copies.names == []


def test_the_diff_layer_hands_its_norm_to_the_op_unless_it_has_a_gain_or_a_hook():
    # norm="rms": the op applies Eq. 3's norm and 1 − λ_init (ops.HeadNorm: in an epilogue route's kernel where the
    # route table switches it on); the same logits bit for bit as the layer's own norm module, which a hook on it
    # (an analysis reading the heads before their norm) or a learnt gain still takes
    from diffattn.ops import HeadNorm

    model = build_model("debug", "diff", backend="sdpa", seed=0).eval()
    attn = model.model.layers[0].self_attn
    hn = attn.head_norm()
    assert isinstance(hn, HeadNorm) and (hn.eps, hn.scale) == (attn.groupnorm.eps, 1 - attn.lambda_init)
    ids = torch.randint(0, 100, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        by_op = model(ids).logits
        seen = []
        hooks = [layer.self_attn.groupnorm.register_forward_hook(lambda *a: seen.append(1))
                 for layer in model.model.layers]  # fmt: skip
        assert attn.head_norm() is None
        by_module = model(ids).logits
        for hook in hooks:
            hook.remove()
    assert len(seen) == len(model.model.layers) and torch.equal(by_op, by_module)
    for norm in ("rms_affine", "none"):
        layer = build_model("debug", "diff", seed=0, norm=norm).model.layers[0].self_attn
        assert layer.options.norm == norm and layer.head_norm() is None, norm


@pytest.mark.parametrize("num_kv_heads", [4, 2], ids=["mha", "gqa"])
def test_the_diff_layer_with_its_heads_in_pairs_is_the_same_model(num_kv_heads):
    # diffattn.ops.pairs_layout: Q and K in interleaved pairs and V once (the official DIFF code's layout, the
    # projections' weight rows reordered): the loss and every gradient those of the stacked layout, within the
    # rounding rule of float64 (the stacked layout's own float32 errors by three routes the yardsticks); under GQA the
    # pairs are cut apart by the op
    from diffattn import ops

    from ..ops.rounding import assert_within_rounding

    def run(dtype, pairs, backend="sdpa"):
        model = build_model("debug", "diff", backend=backend, num_layers=2, num_kv_heads=num_kv_heads, seed=0)
        model = model.to(dtype)
        ids = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(0))
        seen = []
        with ops.pairs_layout(pairs):
            model.model.layers[0].self_attn.register_forward_hook(lambda *a: seen.append(1))
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        assert seen
        return [loss.detach(), *(p.grad for p in model.parameters())]

    gold, got = run(torch.float64, False), run(torch.float32, True)
    yards = [run(torch.float32, False, backend) for backend in ("sdpa", "sdpa_maps", "chunked")]
    for i, (a, w, *y) in enumerate(zip(got, gold, *yards, strict=True)):
        assert_within_rounding(f"value {i}", a, w, y, torch.float32)


def test_the_diff_layer_takes_its_heads_in_pairs_only_where_it_may_and_the_table_measured_them_faster(monkeypatch):
    # where the route table measured the call's class faster in pairs than stacked (routes.pairs_faster, asked with
    # the stacked class's key): a call above SMALL_WORK (its gain is the GPU's work, its cost the host's) without a
    # mask, a KV cache or an analysis reading the maps, one key head per query head, plain projections; forced by
    # ops.pairs_layout: any call where it may
    import diffattn.models.diff_llama as diff_llama
    from diffattn import ops
    from diffattn.ops import routes

    model = build_model("debug", "diff", backend="sdpa", num_layers=1, num_kv_heads=4, seed=0)
    attn = model.model.layers[0].self_attn
    hidden = torch.zeros(2, 16, model.config.hidden_size)
    asked = []
    monkeypatch.setattr(diff_llama, "pairs_faster", lambda index, cls: asked.append((index, cls)) or True)
    work = 2 * (attn.num_heads // 2) * 16 * 16 * attn.head_dim  # B·h·T·S·d of the call
    monkeypatch.setattr(routes, "SMALL_WORK", work - 1)
    assert attn._heads_in_pairs(hidden, None, None, analysis=False)
    assert asked == [(None, f"v1 d{attn.head_dim} dv{2 * attn.head_dim} fp32 causal none train")]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        attn._heads_in_pairs(hidden, None, None, analysis=False)
    assert asked[-1][1] == f"v1 d{attn.head_dim} dv{2 * attn.head_dim} bf16 causal none infer"
    assert not attn._heads_in_pairs(hidden, object(), None, analysis=False), "a KV cache keeps DiffLlama's layout"
    assert not attn._heads_in_pairs(hidden, None, None, analysis=True)
    assert not attn._heads_in_pairs(hidden, None, torch.ones(2, 1, 16, 16, dtype=torch.bool), analysis=False)
    monkeypatch.setattr(diff_llama, "pairs_faster", lambda index, cls: False)
    assert not attn._heads_in_pairs(hidden, None, None, analysis=False), "not measured faster"
    with ops.pairs_layout(True):
        assert attn._heads_in_pairs(hidden, None, None, analysis=False)
    monkeypatch.setattr(diff_llama, "pairs_faster", lambda index, cls: True)
    monkeypatch.setattr(routes, "SMALL_WORK", work)
    assert not attn._heads_in_pairs(hidden, None, None, analysis=False), "a small call keeps it"
    monkeypatch.setattr(routes, "SMALL_WORK", work - 1)
    with ops.pairs_layout(False):
        assert not attn._heads_in_pairs(hidden, None, None, analysis=False)
    gqa = build_model("debug", "diff", backend="sdpa", num_layers=1, num_kv_heads=2, seed=0).model.layers[0].self_attn
    assert not gqa._heads_in_pairs(hidden, None, None, analysis=False), "cuDNN's groups would mix the pairs"

    class Adapted(torch.nn.Module):  # a projection wrapped by an adapter computes more than its weight
        def __init__(self, base):
            super().__init__()
            self.base = base

        def forward(self, x):
            return self.base(x)

    attn.q_proj = Adapted(attn.q_proj)
    with ops.pairs_layout(True):
        assert not attn._heads_in_pairs(hidden, None, None, analysis=False)


def test_pairs_projection_is_the_projection_with_its_heads_in_pairs():
    from diffattn.models.diff_llama import pairs_projection

    linear = torch.nn.Linear(6, 4 * 3, bias=True)
    x = torch.randn(2, 5, 6)
    got = pairs_projection(linear, x, 3).unflatten(-1, (2, 2, 3))  # [B, T, pair j, member m, width]
    heads = linear(x).unflatten(-1, (2, 2, 3))  # DiffLlama's [B, T, half m, head j, width]
    assert torch.allclose(got, heads.transpose(2, 3), rtol=0, atol=1e-6)


def test_installing_diff_attention_on_a_config_with_attention_dropout_says_it_is_not_applied(caplog):
    """transformers' DiffLlama drops attention probabilities in training; our op does not (docs/methods.md §7)."""
    model = build_model("debug", "diff", backend=None, num_layers=1)
    with caplog.at_level("WARNING", logger="diffattn.models.install"):
        install_diff_attention(model, "reference")
    assert "dropout" not in caplog.text
    model = build_model("debug", "diff", backend=None, num_layers=1)
    model.config.attention_dropout = 0.1
    with caplog.at_level("WARNING", logger="diffattn.models.install"):
        install_diff_attention(model, "reference")
    assert "without attention-probability dropout (config.attention_dropout=0.1)" in caplog.text
