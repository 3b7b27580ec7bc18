"""diffattn.lambdas: each λ formula against the equation written out, and the one read-out over every kind of
module that has a λ (our DIFF attention, Hugging Face's DiffLlama, adapter wrappers) — none counted twice."""

from __future__ import annotations

import math

import pytest
import torch

import diffattn
from diffattn.lambdas import (
    annealed_lambda,
    check_annealing,
    check_lambda_init,
    lambda_init_schedule,
    lambda_per_layer,
    output_scale,
    reparameterized_lambda,
)

from .tiny_models import tiny


def test_schedule_is_the_papers_per_layer_formula():
    for layer in range(6):  # DIFF §2.1 with l = layer + 1: 0.8 − 0.6·exp(−0.3·(l − 1))
        assert lambda_init_schedule(layer, "exponential") == pytest.approx(0.8 - 0.6 * math.exp(-0.3 * layer))
    assert lambda_init_schedule(3, 0.25) == 0.25
    assert output_scale(0.2) == pytest.approx(0.8)


def test_eq2_in_float32_whatever_the_parameter_dtype():
    g = torch.Generator().manual_seed(0)
    q1, k1, q2, k2 = (torch.randn(8, generator=g).to(torch.bfloat16) for _ in range(4))
    lam = reparameterized_lambda(q1, k1, q2, k2, 0.3)
    expected = math.exp(float((q1.float() * k1.float()).sum())) - math.exp(float((q2.float() * k2.float()).sum()))
    assert lam.dtype == torch.float32 and lam.item() == pytest.approx(expected + 0.3, rel=1e-6)


@pytest.mark.parametrize("t", [0, 1, 5, 10, 25])
def test_dex_eq4(t):
    learn = torch.tensor(0.7)
    alpha = min(1.0, t / 10)
    expected = (1 - alpha) * (t / 10) * 0.4 + alpha * 0.7
    assert annealed_lambda(t, 10, 0.4, learn).item() == pytest.approx(expected)
    assert annealed_lambda(t, 10, 0.4, learn, anneal=False).item() == pytest.approx(0.7)  # the ablation


def test_eq4_needs_t_after_step_zero():
    assert annealed_lambda(0, None, 0.4, torch.tensor(0.7)).item() == 0.0
    with pytest.raises(ValueError, match="anneal_steps"):
        annealed_lambda(1, None, 0.4, torch.tensor(0.7))


@pytest.mark.parametrize(
    "value, kwargs, ok",
    [
        ("exponential", {}, True),
        ("linear", {}, False),
        (2.5, {}, True),
        (float("nan"), {}, False),
        (True, {}, False),
        (0.0, {"low": 0.0, "high": 1.0}, False),
        (0.0, {"low": 0.0, "high": 1.0, "low_open": False}, True),
        (1.0, {"low": 0.0, "high": 1.0, "low_open": False}, False),
    ],
)
def test_lambda_init_validation(value, kwargs, ok):
    if ok:
        check_lambda_init(value, "X.lambda_init", **kwargs)
    else:
        with pytest.raises(ValueError, match=r"X\.lambda_init must be 'exponential' or "):
            check_lambda_init(value, "X.lambda_init", **kwargs)
    with pytest.raises(ValueError, match=r"X\.anneal_steps must be >= 1 when anneal is on; got 0"):
        check_annealing(True, 0, "X")
    check_annealing(False, 0, "X")


def test_one_readout_for_diff_models_ours_and_hugging_faces():
    ours = diffattn.build_model("debug", "diff", seed=0)
    values = lambda_per_layer(ours)
    layers = ours.model.layers
    assert len(values) == len(layers)
    for layer, value in zip(layers, values, strict=True):
        a = layer.self_attn
        q1, k1, q2, k2 = (p.detach() for p in (a.lambda_q1, a.lambda_k1, a.lambda_q2, a.lambda_k2))
        eq2 = math.exp(float(q1 @ k1)) - math.exp(float(q2 @ k2))
        assert value == pytest.approx(eq2 + lambda_init_schedule(a.layer_idx, "exponential"), rel=1e-5)
    from transformers import DiffLlamaForCausalLM

    plain = DiffLlamaForCausalLM(ours.config)  # Hugging Face's own attention modules
    assert len(lambda_per_layer(plain)) == len(layers)
    assert lambda_per_layer(diffattn.build_model("debug", "standard")) is None


def test_one_readout_for_adapters_counts_each_layer_once():
    model = tiny("llama")
    diffattn.adapt(model, diffattn.DAAConfig(anneal_steps=4, lambda_init=0.3))
    diffattn.set_adapter_step(model, 2)
    expected = (1 - 0.5) * 0.5 * 0.3  # Eq. 4 at t/T = 1/2 with λ_learn = 0
    assert lambda_per_layer(model) == pytest.approx([expected] * model.config.num_hidden_layers)
    assert diffattn.adapter_lambdas(model) == lambda_per_layer(model)
