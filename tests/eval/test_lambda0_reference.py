"""The λ = 0 reference of a model with an effective attention (Dex): the same projection A·V·V⁺ without the λ term,
recorded by the capture beside the effective attention and allocated in the same forward passes
(``run_allocation(...)["lambda0_reference"]``), so that Dex's allocation can be compared with its own projection
instead of the base model's plain attention."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

import diffattn.eval.allocation as allocation
from diffattn import DAAConfig, DexConfig, adapt, set_adapter_step
from diffattn.adapters import attention_modules
from diffattn.eval.allocation import BUCKETS, allocate_rows, run_allocation
from diffattn.eval.capture import AttentionCapture

from ..tiny_models import ids, tiny, tiny_config

SELECTED = [[0, 2], [1, 3]]  # Dex's heads per layer (4 heads, 2 KV heads: both GQA groups are exercised)
ALLOC = dict(haystack="filler", context_tokens=128, samples=3, progress=False)


def _tiny_llama(vocab: int, seed: int = 0):
    torch.manual_seed(seed)
    config = tiny_config("llama", vocab_size=vocab, max_position_embeddings=256)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()


def _dex(model):
    # anneal off: λ = λ_learn = 0 at init, so the adapted model is still the base model (W_K, W_V untrained)
    return adapt(model, DexConfig(heads=SELECTED, anneal=False))


def _set_lambda(model, lam: float, seed: int = 3, layers=None):
    with torch.no_grad():
        for layer, _, w in attention_modules(model):
            if layers is not None and layer not in layers:
                continue
            w.method.dex_lambda.lambda_learn.fill_(lam)
            w.method.dex_w_d.normal_(0, 0.3, generator=torch.Generator().manual_seed(seed))


def _projection(attn: torch.Tensor, v: torch.Tensor, dtype) -> torch.Tensor:
    """A·V·V⁺ per head by hand (V repeated over its query heads), in ``dtype``."""
    v = v.repeat_interleave(attn.shape[1] // v.shape[1], dim=1).to(dtype)
    return attn.to(dtype) @ v @ torch.linalg.pinv(v)


def _assert_is_base_projection(reference, base_attn, base_v, selected):
    """``reference`` equals the base model's A·V·V⁺ on the selected heads within a few times the float32 rounding
    of that computation (measured against float64), and is exactly A on the other heads."""
    want64 = _projection(base_attn, base_v, torch.float64)
    rounding = (_projection(base_attn, base_v, torch.float32).double() - want64)[:, selected].abs().max()
    error = (reference.double() - want64)[:, selected].abs().max()
    assert error <= 4 * rounding + 1e-12, (float(error), float(rounding))
    assert float(rounding) < 1e-5  # float32 rounding, not a different computation
    others = [h for h in range(base_attn.shape[1]) if h not in selected]
    assert torch.equal(reference[:, others], base_attn[:, others])
    assert not torch.allclose(reference[:, selected], base_attn[:, selected], atol=1e-3)  # the projection is not A


def test_the_dex_allocation_reference_at_lambda_0_equals_the_base_attention_through_the_same_projection(
    tokenizer, monkeypatch
):
    base = _tiny_llama(len(tokenizer))
    dex = _dex(_tiny_llama(len(tokenizer)))
    _set_lambda(dex, 0.0)  # W_D moved, λ = 0: Dex is still the base model (λ ≠ 0 would change later layers' A, V)
    captures: list[AttentionCapture] = []
    prompts: list[torch.Tensor] = []
    bucketed: list[list[str]] = []

    class Spy(AttentionCapture):  # the captures run_allocation makes, and what it bucketed
        def __enter__(self):
            captures.append(self)
            return super().__enter__()

    token_buckets = allocation.token_buckets
    monkeypatch.setattr(allocation, "AttentionCapture", Spy)
    monkeypatch.setattr(allocation, "token_buckets", lambda *a: bucketed.append(token_buckets(*a)) or bucketed[-1])
    hook = dex.register_forward_pre_hook(lambda m, args: prompts.append(args[0]))
    res = run_allocation(dex, tokenizer, **ALLOC)
    monkeypatch.undo()
    hook.remove()
    assert len(captures) == len(prompts) == len(bucketed) == 3 and all(c.reference for c in captures)
    ref = res["lambda0_reference"]
    assert set(ref) == set(res) - {"lambda0_reference"} and "λ forced to 0" in ref["metadata"]["what"]
    assert res["metadata"]["lambda0_reference"] == ref["metadata"]["what"]
    assert [(p["seed"], p["depth"]) for p in ref["per_sample"]] == [(p["seed"], p["depth"]) for p in res["per_sample"]]
    assert all(set(p) == set(q) for p, q in zip(ref["per_sample"], res["per_sample"], strict=True))
    for cap, prompt, buckets, sample in zip(captures, prompts, bucketed, ref["per_sample"], strict=True):
        records = cap.last()
        # the captured reference is the base model's attention on the same prompt through A·V·V⁺
        with AttentionCapture(base, rows="last") as base_cap, torch.no_grad():
            base(prompt)
        for layer, rec in records.items():
            b = base_cap.last()[layer]
            _assert_is_base_projection(rec.reference, b.attn1, b.v, SELECTED[layer])
        # and the reference's shares in the results are the shares of the captured reference
        per_layer = []
        for rec in records.values():
            shares, negative, valid = allocate_rows(rec.reference[0, :, 0], buckets)
            per_layer.append((shares[valid].mean(0), negative[valid].mean(0)))
        s = torch.stack([p[0] for p in per_layer]).mean(0)
        n = torch.stack([p[1] for p in per_layer]).mean(0)
        assert sample["answer"] == pytest.approx(float(s[BUCKETS.index("answer")]), abs=1e-12)
        assert sample["noise"] == pytest.approx(float(s[1] + s[3]), abs=1e-12)
        assert sample["negative_mass"] == pytest.approx(float(n.sum()), abs=1e-12)
        assert sample["answer_magnitude"] == pytest.approx(float(s[2] + 2 * n[2]), abs=1e-12)
        assert sample["allocation"] == pytest.approx({b: float(s[j]) for j, b in enumerate(BUCKETS)}, abs=1e-12)
    assert ref["negative_mass"] > 0  # the projection alone makes negative mass
    assert ref["attention_to_answer"] == pytest.approx(sum(p["answer"] for p in ref["per_sample"]) / 3)
    # at λ = 0 Dex's allocation is its projection's, and that is not the base model's plain attention's
    assert res["per_sample"] == ref["per_sample"]
    plain = run_allocation(base, tokenizer, **ALLOC)
    assert "lambda0_reference" not in plain and plain["negative_mass"] == 0
    assert abs(plain["attention_to_answer"] - ref["attention_to_answer"]) > 1e-4


def test_the_reference_does_not_move_with_lambda_and_the_effective_attention_does(tokenizer):
    dex = _dex(_tiny_llama(len(tokenizer)))
    x = ids(b=2, t=40) % len(tokenizer)
    with AttentionCapture(dex, reference=True) as cap, torch.no_grad():
        dex(x)
    at_zero = cap.last()
    for rec in at_zero.values():  # λ = 0 and W_D = I: the effective attention is its reference
        assert torch.equal(rec.effective, rec.reference)
    before = run_allocation(dex, tokenizer, **ALLOC)
    assert before["lambda0_reference"]["per_sample"] == before["per_sample"]

    # λ ≠ 0 in the last layer only: every layer's A and V stay as they were (an earlier layer's λ would change the
    # input of the later ones, and so their A and V and their reference with them)
    last = len(at_zero) - 1
    _set_lambda(dex, 0.4, layers=[last])
    with AttentionCapture(dex, reference=True) as cap, torch.no_grad():
        dex(x)
    for layer, rec in cap.last().items():
        sel = SELECTED[layer]
        assert torch.equal(rec.reference, at_zero[layer].reference)  # same A, V: the same reference
        changed = not torch.allclose(rec.effective[:, sel], rec.reference[:, sel], atol=1e-3)
        assert changed == (layer == last)
        method = attention_modules(dex)[layer][2].method
        assert torch.equal(method.effective_attention(rec.attn1, rec.v, lam=0.0), rec.reference)
        assert torch.equal(method.effective_attention(rec.attn1, rec.v), rec.effective)
    after = run_allocation(dex, tokenizer, **ALLOC)
    assert after["lambda0_reference"]["per_sample"] == before["lambda0_reference"]["per_sample"]
    assert after["per_sample"] != before["per_sample"]


def test_models_without_an_effective_attention_have_no_reference(tokenizer):
    base = _tiny_llama(len(tokenizer))
    assert "lambda0_reference" not in run_allocation(base, tokenizer, **ALLOC)
    daa = adapt(_tiny_llama(len(tokenizer)), DAAConfig(anneal_steps=2))
    set_adapter_step(daa, 1)
    res = run_allocation(daa, tokenizer, **ALLOC)
    assert "lambda0_reference" not in res and "lambda0_reference" not in res["metadata"]
    with AttentionCapture(tiny("llama"), reference=True) as cap, torch.no_grad():
        cap.model(ids())
    assert all(rec.reference is None for rec in cap.last().values())


def test_forced_lambda_zero_is_dex_without_its_lambda_term_and_niah_reads_it(tokenizer, tmp_path):
    """``forced_lambda(model, 0)``: Dex's output with λ = 0 is its base output (λ·W_D term gone), restored after;
    the niah suite of a Dex model also reads its grid at λ = 0 on the same prompts, and the Dex claim against
    λ = 0 compares the two (its reference: "dex at λ = 0")."""
    from types import SimpleNamespace

    from diffattn.adapters.base import forced_lambda, supports_forced_lambda
    from diffattn.eval.measures import Run
    from diffattn.eval.niah import MEASURES, SUITE

    base = _tiny_llama(len(tokenizer))
    dex = _dex(_tiny_llama(len(tokenizer)))
    _set_lambda(dex, 0.4)
    x = ids(len(tokenizer), 2, 16)
    with torch.no_grad():
        want, adapted = base(x).logits, dex(x).logits
        with forced_lambda(dex, 0.0):
            at_zero = dex(x).logits
        again = dex(x).logits
    assert supports_forced_lambda(dex) and not supports_forced_lambda(base)
    assert torch.allclose(at_zero, want, atol=1e-5) and not torch.allclose(adapted, want, atol=1e-3)
    assert torch.equal(again, adapted)  # restored
    with pytest.raises(ValueError, match="no adapted layer whose λ can be forced"), forced_lambda(base, 0.0):
        pass
    options = SimpleNamespace(niah_grid=((1, 1), (2, 1)), niah_needles=2, niah_heatmap_lengths=[],
                              niah_heatmap_samples=None, niah_multivalue=None, niah_grid_placement="depths",
                              needle_prompts=lambda: dict(haystack="filler", context_tokens=128, samples=2,
                                                          value_digits=2, progress=False))  # fmt: skip
    results, _ = SUITE.run(dex, tokenizer, options, tmp_path, "dex")
    own = results["lambda0_reference"]
    assert [(g["N"], g["R"]) for g in own["grid"]] == [(1, 1), (2, 1)] and "λ forced to 0" in own["metadata"]["what"]
    at0 = MEASURES["niah:r1"].at_lambda0(Run("dex", suites={"niah": results}))
    row = MEASURES["niah:r1"].compare(Run("dex at λ = 0", suites=at0), Run("dex", suites={"niah": results}), 0)
    assert row is not None and "exact McNemar" in row.kind  # the same prompts: paired


def test_the_heads_suite_reads_dex_against_its_projection_at_lambda_0(tokenizer):
    """The head statistics of Dex's effective attention at λ = 0 are its projection's, not the base's softmax maps:
    recorded as ``lambda0_reference`` in the same passes, equal to Dex's own at λ = 0, apart from them once λ moves;
    a model without an effective attention has none."""
    from diffattn.eval.heads import _at_lambda0, _compare, run_heads
    from diffattn.eval.measures import Run

    heads = dict(source="filler", tokens=80, seq_len=40, progress=False)
    base = run_heads(_tiny_llama(len(tokenizer)), tokenizer, **heads)
    assert "lambda0_reference" not in base
    dex = _dex(_tiny_llama(len(tokenizer)))
    _set_lambda(dex, 0.0)
    at_zero = run_heads(dex, tokenizer, **heads)
    ref = at_zero["lambda0_reference"]
    assert ref["summary"] == at_zero["summary"] and "λ forced to 0" in at_zero["metadata"]["lambda0_reference"]
    # the projection is not the base's maps: its negative entries and distances are the projection's own
    assert ref["layers"][0]["negative_share"] > 0 == base["layers"][0]["negative_share"]
    assert ref["summary"]["cosine_distance"] != pytest.approx(base["summary"]["cosine_distance"], abs=1e-4)
    last = len(ref["layers"]) - 1
    _set_lambda(dex, 0.4, layers=[last])
    moved = run_heads(dex, tokenizer, **heads)
    assert moved["lambda0_reference"]["layers"][last] == ref["layers"][last]  # λ does not move the reference
    assert moved["layers"][last]["cosine_distance"] != pytest.approx(ref["layers"][last]["cosine_distance"])
    # the claims engine's λ = 0 reading, and the side-by-side table's row
    assert _at_lambda0(Run("dex", {}, {"heads": moved}))["heads"]["summary"] == moved["lambda0_reference"]["summary"]
    assert any(line.startswith("| dex at λ = 0 |") for line in _compare({"base": base, "dex": moved}, None))


def test_the_heads_suite_reads_a_layer_without_dex_heads_once_for_both_its_rows(tokenizer, monkeypatch):
    """A layer without Dex heads has the same maps at λ = 0 (Dex returns them unchanged): its λ = 0 statistics are
    its own, computed once per window (the suite computed them twice, CKA over every head pair included)."""
    from diffattn.eval import heads as suite

    calls = []
    accumulate = suite._accumulate
    monkeypatch.setattr(
        suite, "_accumulate", lambda acc, layer, *a, **k: calls.append(layer) or accumulate(acc, layer, *a, **k)
    )
    dex = adapt(_tiny_llama(len(tokenizer)), DexConfig(heads=[SELECTED[0], []], anneal=False))
    _set_lambda(dex, 0.4, layers=[0])
    res = suite.run_heads(dex, tokenizer, source="filler", tokens=80, seq_len=40, progress=False)
    layers = sorted(res["layers"])
    windows = calls.count(layers[-1])
    assert len(layers) >= 2 and windows >= 2
    assert sorted(calls) == [0] * 2 * windows + [layer for layer in layers[1:] for _ in range(windows)]
    ref = res["lambda0_reference"]["layers"]
    assert all(ref[layer] == res["layers"][layer] for layer in layers[1:]) and ref[0] != res["layers"][0]
