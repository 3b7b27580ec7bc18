"""λ of differential attention: every formula about it, written once (docs/methods.md §1–2).

* :func:`lambda_init_schedule` — DIFF §2.1's per-layer λ_init = 0.8 − 0.6·exp(−0.3·(l − 1)) with l = layer_idx + 1
  (``"exponential"``), or a constant; :func:`check_lambda_init` validates either form.
* :func:`reparameterized_lambda` — DIFF Eq. 2: λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init, in float32; for one
  layer's vectors, or for every layer's stacked as rows (one λ a row: a model's layers at once).
* :func:`output_scale` — DIFF Eq. 3's (1 − λ_init) factor after the per-head norm.
* :func:`annealed_lambda` — Dex Eq. 4: λ(t) = (1 − α)·(t/T)·λ_init + α·λ_learn with α = min(1, t/T)
  (:func:`annealing_ramp`), so λ(0) = 0 (DAA and DiffQ/K/V use the same schedule, the DIFF V2 retrofit its ramp).
* :func:`v2_gate` — DIFF V2's λ of every head and token, sigmoid(x·w_λ) (docs/methods.md §5), for the V2 model and
  the V2 retrofit alike.
* :func:`lambda_per_layer` — the one read-out of a model's λ, for logging, reports, capture and the CLI.

**The read-out convention.** An attention module that has a λ — our DIFF attention, Hugging Face's
``DiffLlamaAttention``, an adapter's wrapper — is a :class:`HasLambda` and exposes it as ``current_lambda()`` (a 0-d
float32 tensor, the value the next forward uses). :func:`lambda_per_layer` reads exactly those modules, in module
order (= layer order), so a new kind of module with a λ only has to subclass :class:`HasLambda`.

This module imports only torch: every package may use it.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import nn

from .ops.routes import lambda_in_kernel

EXPONENTIAL = "exponential"


class HasLambda:
    """Mixin of an attention module whose ``current_lambda()`` is its layer's λ. Only these are read out, so an
    adapter method nested inside its wrapper (which also has a ``current_lambda``) is not counted twice."""

    def current_lambda(self) -> torch.Tensor:
        raise NotImplementedError


def lambda_init_schedule(layer_idx: int, schedule: str | float) -> float:
    """λ_init of layer ``layer_idx`` (0-based): DIFF's 0.8 − 0.6·exp(−0.3·layer_idx) for ``"exponential"``, else
    the constant ``schedule``."""
    if schedule == EXPONENTIAL:
        return 0.8 - 0.6 * math.exp(-0.3 * layer_idx)
    return float(schedule)


def check_lambda_init(
    value: object,
    owner: str,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = True,
    message: str | None = None,
) -> None:
    """Refuse a λ_init that is neither ``"exponential"`` nor a number in the owner's range.

    ``low``/``high`` bound a constant (``high`` exclusive, ``low`` exclusive unless ``low_open=False``; None: no
    bound). ``message`` replaces the range's wording after ``"{owner} must be "``."""
    what = message or _range_words(low, high, low_open)
    if isinstance(value, str):
        ok = value == EXPONENTIAL
    elif isinstance(value, bool) or not isinstance(value, numbers.Real):  # numpy scalars are Real too
        ok = False
    else:
        v = float(value)
        ok = math.isfinite(v)
        if low is not None:
            ok = ok and (v > low if low_open else v >= low)
        if high is not None:
            ok = ok and v < high
    if not ok:
        raise ValueError(f"{owner} must be {what}; got {value!r}")


def check_annealing(anneal: bool, anneal_steps: int | None, owner: str) -> None:
    """T of Dex Eq. 4 must be >= 1 when annealing is on (None: to be set before training)."""
    if anneal and anneal_steps is not None and anneal_steps < 1:
        raise ValueError(f"{owner}.anneal_steps must be >= 1 when anneal is on; got {anneal_steps}")


def _range_words(low, high, low_open) -> str:
    if low is None and high is None:
        return "'exponential' or a number"
    left = "(" if low_open else "["
    return f"'exponential' or a float in {left}{low:g}, {high:g})"


def reparameterized_lambda(
    lambda_q1: torch.Tensor, lambda_k1: torch.Tensor, lambda_q2: torch.Tensor, lambda_k2: torch.Tensor, lambda_init
) -> torch.Tensor:
    """DIFF Eq. 2 in float32: exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init — a 0-d tensor for one layer's vectors [d]
    and λ_init a float; one λ a row for several layers' vectors stacked as rows [L, d] and λ_init a float32 tensor
    [L] (:func:`diffattn.models.diff_llama.layer_lambdas`). One layer's on CUDA by one Triton kernel each way where the
    route table switches that on (:func:`diffattn.ops.routes.lambda_in_kernel`), in eager mode."""
    if (
        lambda_q1.dim() == 1
        and lambda_q1.is_cuda
        and lambda_in_kernel(lambda_q1.device.index)
        and not torch.compiler.is_compiling()
    ):
        from .ops.triton.reparam import reparameterized_lambda_kernel

        return reparameterized_lambda_kernel(lambda_q1, lambda_k1, lambda_q2, lambda_k2, lambda_init)
    lam1 = torch.exp(torch.sum(lambda_q1.float() * lambda_k1.float(), dim=-1))
    lam2 = torch.exp(torch.sum(lambda_q2.float() * lambda_k2.float(), dim=-1))
    return lam1 - lam2 + lambda_init


def output_scale(lambda_init: float) -> float:
    """DIFF Eq. 3's multiplier of the normalised head output: 1 − λ_init (aligns its gradient flow with a
    Transformer's)."""
    return 1.0 - lambda_init


def _step_ratio(step: int | torch.Tensor, anneal_steps: int | None, dtype: torch.dtype) -> float | torch.Tensor:
    """t/T of Dex Eq. 4: a float for an int step, a 0-d tensor of ``dtype`` for a step held in a tensor. T unset: only
    t = 0 is valid (its ratio 0); a later step needs T."""
    if anneal_steps is None:
        if isinstance(step, int) and step == 0:
            return 0.0
        raise ValueError("the adapter's anneal_steps (T of Dex Eq. 4) is not set; give it in the config")
    if isinstance(step, torch.Tensor):
        return step.to(dtype) / anneal_steps
    return step / anneal_steps


def _capped(ratio: float | torch.Tensor) -> float | torch.Tensor:
    """min(1, t/T): α of Dex Eq. 4 from :func:`_step_ratio`'s t/T."""
    return ratio.clamp(max=1.0) if isinstance(ratio, torch.Tensor) else min(1.0, ratio)


def annealing_ramp(
    step: int | torch.Tensor, anneal_steps: int | None, dtype: torch.dtype = torch.float32
) -> float | torch.Tensor:
    """α = min(1, t/T) of Dex Eq. 4 at step ``step`` with T = ``anneal_steps``: a float for an int step; a 0-d tensor
    of ``dtype`` (the dtype of what α multiplies, float32 or wider) for a step held in a tensor (an adapter's
    ``adapter_step``, which a compiled forward reads as an input where it would guard on a number and compile again
    at every step). α(0) = 0 whatever T is; a later step needs T."""
    return _capped(_step_ratio(step, anneal_steps, dtype))


def annealed_lambda(
    step: int | torch.Tensor,
    anneal_steps: int | None,
    lambda_init: float,
    lambda_learn: torch.Tensor,
    anneal: bool = True,
) -> torch.Tensor:
    """Dex Eq. 4 at step ``step`` (an int, or a 0-d tensor holding it: :func:`annealing_ramp`) with T =
    ``anneal_steps``: (1 − α)(t/T)·λ_init + α·λ_learn, α = min(1, t/T).

    ``anneal=False`` is the ablation λ = λ_learn from the start. λ(0) = 0 whatever T is; a later step needs T."""
    if not anneal:
        return lambda_learn
    ratio = _step_ratio(step, anneal_steps, torch.promote_types(lambda_learn.dtype, torch.float32))
    if anneal_steps is None:  # step 0 (_step_ratio refused any other): λ(0) = 0
        return lambda_learn * 0.0
    alpha = _capped(ratio)
    return (1.0 - alpha) * ratio * lambda_init + alpha * lambda_learn


def v2_gate(lambda_proj: nn.Linear, hidden_states: torch.Tensor) -> torch.Tensor:
    """DIFF V2's λ of every head and token, sigmoid(x·w_λ) in float32: [B, T, d_model] → [B, H, T]."""
    return torch.sigmoid(lambda_proj(hidden_states).float()).transpose(1, 2)


def lambda_per_layer(model: nn.Module) -> list[float] | None:
    """λ of every attention module that has one, in layer order; ``None`` for a model without any.

    Reads our DIFF attention, Hugging Face's own ``DiffLlamaAttention`` (Eq. 2 on its parameters) and every
    adapter wrapper (its method's current λ(t)) — see the module doc's convention."""
    from transformers.models.diffllama.modeling_diffllama import DiffLlamaAttention

    values = []
    for module in model.modules():
        if isinstance(module, HasLambda):
            values.append(float(module.current_lambda().detach()))
        elif isinstance(module, DiffLlamaAttention):  # Hugging Face's own module: the same Eq. 2
            values.append(
                float(
                    reparameterized_lambda(
                        module.lambda_q1, module.lambda_k1, module.lambda_q2, module.lambda_k2, module.lambda_init
                    ).detach()
                )
            )
    return values or None
