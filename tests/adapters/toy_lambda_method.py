"""A toy λ(t) method, written as a contributor would write a new method's module (the registry's "Adding a method"):
this one file, and its last statement registers it. ``tests/adapters/test_toy_method.py`` imports it (the one
registration line a real method adds to ``adapters/__init__.py``) and checks that it reaches everything.

    O' = O − λ(t)·g·O     per head output, g one learnable gain per layer (``toy_gain``, ``gain_init`` at init)

λ(t) is Dex Eq. 4 through :class:`~diffattn.adapters.annealed.AnnealedOptions`, so λ(0) = 0 (the identity at init)
and the λ(t) options, their checks, T's default and the no-op refusal are inherited: the only rule of its own is
that ``gain_init = 0`` never learns (g's gradient is ∝ λ, λ_learn's ∝ g·O).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from diffattn.adapters.annealed import AnnealedOptions, annealed_lambda_for, attention_module_names
from diffattn.adapters.base import AdapterMethod, AnnealedLambda, wrap_attention
from diffattn.adapters.registry import MethodSpec, register

NAME = "toy-lambda"


@dataclass
class ToyLambdaConfig(AnnealedOptions):
    gain_init: float = 1.0

    def never_learns(self) -> str | None:
        if self.gain_init == 0.0:
            return "with gain_init=0, g's gradient is ∝ λ = 0 and λ_learn's is ∝ g·O = 0"
        return None


class ToyLambdaGain(AdapterMethod):
    def __init__(self, gain_init: float, lam: AnnealedLambda, device):
        super().__init__()
        self.toy_gain = nn.Parameter(torch.tensor(gain_init, device=device))
        self.toy_lambda = lam

    def current_lambda(self) -> torch.Tensor:
        return self.toy_lambda()

    def transform_output(self, out: torch.Tensor) -> torch.Tensor:
        return out - (self.toy_lambda() * self.toy_gain * out).to(out.dtype)


def adapt_toy_lambda(model: nn.Module, config: ToyLambdaConfig, calibration=None) -> nn.Module:
    device = next(model.parameters()).device

    def make(layer_idx, attn, state):
        return ToyLambdaGain(config.gain_init, annealed_lambda_for(config, layer_idx, state, device), device)

    return wrap_attention(model, make, config, NAME, config.anneal_steps)


register(
    MethodSpec(
        name=NAME, display="Toy λ(t)", config=ToyLambdaConfig, adapt=adapt_toy_lambda,
        trained_names=lambda m: [n for n in attention_module_names(m) if ".method." in n],
        why_not_mergeable="a toy that does not fold", differential_weights=("toy_gain",),
        report_settings=("gain_init", "anneal_steps"),
    )
)  # fmt: skip
