"""Training pieces of ``diffattn adapt`` on top of the pretraining trainer: λ(t) of Dex Eq. 4 follows the optimiser
step, weight decay 0 for every λ and what a method asks (its registry entry's ``no_decay``), and the end-of-run
check that a λ(t) method contributed something."""

from __future__ import annotations

from transformers import TrainerCallback

from ..adapters import set_adapter_step
from ..adapters.registry import get_method
from .trainer import DiffattnTrainer

INACTIVE_LAMBDA = 1e-3  # |λ| below this in every adapted layer at the end of a run: the method added nothing


class AdapterStepCallback(TrainerCallback):
    """λ(t) follows the optimiser: t = the number of steps already taken when a step begins (Dex Eq. 4)."""

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is not None:
            set_adapter_step(_unwrap(model), state.global_step)

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        if model is not None:
            set_adapter_step(_unwrap(model), state.global_step)


def _unwrap(model):
    return getattr(model, "module", model)


class AdapterTrainer(DiffattnTrainer):
    """Weight decay 0 for λ (and GPT-2's fused c_attn under Dex) on top of Trainer's bias/norm exclusions."""

    def __init__(self, *args, extra_no_decay: list[str], **kwargs):
        super().__init__(*args, **kwargs)
        self.extra_no_decay = set(extra_no_decay)

    def get_decay_parameter_names(self, model) -> list[str]:
        return [n for n in super().get_decay_parameter_names(model) if n not in self.extra_no_decay]


def _lambda_warnings(method: str, lambdas: list[float] | None) -> list[str]:
    """Say so when a λ(t) method ended with |λ| < INACTIVE_LAMBDA in every adapted layer: its new term is
    (almost) absent from the trained model, which is then in effect an attention fine-tune of the base."""
    spec = get_method(method)
    if not spec.annealed or not lambdas or max(abs(v) for v in lambdas) >= INACTIVE_LAMBDA:
        return []
    largest = max(abs(v) for v in lambdas)
    name = spec.display
    return [
        f"{name} contributes nothing: |λ| < {INACTIVE_LAMBDA:g} in every adapted layer (largest {largest:.2g}), "
        "so the result is in effect an attention fine-tune of the base model; train longer, with a higher "
        "learning rate, or check the λ(t) settings (anneal_steps, lambda_init, init)"
    ]
