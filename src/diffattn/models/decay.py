"""Which parameters weight decay applies to, for pretraining (:class:`~diffattn.train.trainer.DiffattnTrainer`), for
adapters (:class:`~diffattn.train.adapt_trainer.AdapterTrainer`) and for your own loop
(:func:`diffattn.parameter_groups`): one rule.

transformers' Trainer decays every weight but biases and norms, and knows a norm by its module (``nn.LayerNorm``)
or by its name (``norm``, ``_norm``, ``layernorm``, ``rmsnorm``). The per-head norm of a DIFF layer (DIFF Eq. 3's
GroupNorm) is neither: with ``model.norm: rms_affine`` its gain is an ``nn.RMSNorm`` named ``groupnorm``, and
DiffLoRA's ``group_norm_gain`` a parameter named ``norm_gain``; both were decayed toward 0 while every other gain of
the model was not (a review, 2026-12-03). λ parameters follow the general rule in pretraining (the DIFF paper is
silent; docs/methods.md §7); adapters exempt theirs (:func:`diffattn.adapters.no_decay_parameter_names`).
"""

from __future__ import annotations

from torch import nn

NORM_MODULES = (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm)  # norms known by their module
NORM_GAIN_NAMES = ("norm_gain",)  # gains that are a module's own parameter (DiffLoRA's per-head norm)


def decayed_parameter_names(model: nn.Module) -> list[str]:
    """The names of ``model``'s parameters that weight decay applies to (trainable or not: callers filter)."""
    from transformers import Trainer

    norms = {
        f"{module_name}.{name}" if module_name else name
        for module_name, module in model.named_modules()
        if isinstance(module, NORM_MODULES)
        for name, _ in module.named_parameters(recurse=False)
    }
    return [
        n
        for n in Trainer.get_decay_parameter_names(None, model)
        if n not in norms and n.rsplit(".", 1)[-1] not in NORM_GAIN_NAMES
    ]
