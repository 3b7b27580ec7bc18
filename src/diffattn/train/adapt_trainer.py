"""Training pieces of ``diffattn adapt`` on top of the pretraining trainer: λ(t) of Dex Eq. 4 follows the optimiser
step, weight decay 0 for every λ and what a method asks (its registry entry's ``no_decay``), the differential
parameters (λ_learn, W_D) at their own learning rate (``train.lambda_lr``), and the end-of-run check that a λ(t)
method contributed something."""

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


LAMBDA_GROUP = "differential"  # the "group" key of the optimiser's parameter group of the differential parameters


def _plain_name(name: str) -> str:
    """A parameter's name without the wrappers' prefixes (DDP's ``module.``, FSDP's wrapped-module parts)."""
    for part in ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod."):
        name = name.replace(part, "")
    return name.removeprefix("module.")


class AdapterTrainer(DiffattnTrainer):
    """Weight decay 0 for λ (and GPT-2's fused c_attn under Dex) on top of Trainer's bias/norm exclusions, and the
    differential parameters (``differential``: names, :func:`diffattn.adapters.differential_parameter_names`) in a
    parameter group of their own at learning rate ``lambda_lr``, never decayed. The schedule scales every group's
    rate by the same factor (LambdaLR on each group's initial rate), so the λ group keeps its ratio to the rest."""

    def __init__(
        self, *args, extra_no_decay: list[str], differential: list[str] = (), lambda_lr: float | None = None, **kwargs
    ):
        super().__init__(*args, **kwargs)
        self.extra_no_decay = set(extra_no_decay)
        self.differential = set(differential)
        if self.differential and not (lambda_lr is not None and lambda_lr > 0):
            raise ValueError(f"AdapterTrainer: differential parameters need a lambda_lr > 0, got {lambda_lr!r}")
        self.lambda_lr = lambda_lr

    def get_decay_parameter_names(self, model) -> list[str]:
        return [n for n in super().get_decay_parameter_names(model) if n not in self.extra_no_decay]

    def create_optimizer(self, model=None):
        optimizer = super().create_optimizer(model)
        if not self.differential or any(g.get("group") == LAMBDA_GROUP for g in optimizer.param_groups):
            return optimizer
        opt_model = self.model if model is None else model
        wanted = {id(p) for n, p in opt_model.named_parameters() if _plain_name(n) in self.differential}
        moved = []
        for group in optimizer.param_groups:
            moved += [p for p in group["params"] if id(p) in wanted]
            group["params"] = [p for p in group["params"] if id(p) not in wanted]
        if len(moved) != len(self.differential):
            raise ValueError(
                f"AdapterTrainer: {len(moved)} of the {len(self.differential)} differential parameters were found "
                "among the optimiser's parameters; their learning rate (train.lambda_lr) cannot be applied"
            )
        optimizer.param_groups[:] = [g for g in optimizer.param_groups if g["params"]]
        optimizer.add_param_group({"params": moved, "lr": self.lambda_lr, "weight_decay": 0.0, "group": LAMBDA_GROUP})
        return optimizer


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
        "train.lambda_lr (λ's own learning rate), or check the λ(t) settings (anneal_steps, lambda_init, init)"
    ]
