"""Adapters that give pretrained models differential attention (docs/methods.md §2–5).

The model-type table (``model_types``), the shared wrapper, method hooks and annealed λ(t) (``base``), the
method registry (``registry``: every fact about a method, in its entry), the methods Dex (``dex``), DAA, DiffQ,
DiffK (``daa``), DiffV (``input_diff``), DiffLoRA (``difflora``), the fine-tuning controls LoRA, attention-only and
full fine-tuning (``controls``), and save/load (``io``). One API for all: :func:`adapt`,
:func:`set_adapter_step`, :func:`trainable_parameters`, :func:`save_adapter` / :func:`load_adapter`,
:func:`merge_adapter` (the mergeable methods), :func:`remove_adapter`.
"""

from __future__ import annotations

import dataclasses

from torch import nn

from ..lambdas import lambda_per_layer

# isort: off
# The method modules register themselves (registry.register) when imported, in this order (the order of
# `diffattn adapt --help` and of the reports). A new method: one more name here.
from . import dex, input_diff, daa, difflora, diff_v2, controls  # noqa: F401  (imported to register)

# isort: on
from .base import AdaptedAttention, AnnealedLambda, adapted_model, refuse_adapted, remove_adapter, set_adapter_step

# the public API (__all__): every method's options as users pass them to adapt (the README's method table), and
# Dex's head scores
from .controls import LoRAControlConfig
from .daa import DAAConfig, DiffKConfig, DiffQConfig
from .dex import DexConfig, head_entropy, head_importance
from .diff_v2 import DiffV2Config
from .difflora import DiffLoRAConfig
from .input_diff import DiffVConfig
from .io import load_adapter, save_adapter
from .model_types import MODEL_TYPES, ModelTypeSpec, attention_modules, get_spec, project_output, project_qkv
from .registry import MethodSpec, get_method, method_names, spec_for_config, specs
from .runs import load_adapted

__all__ = [
    "CONTROLS",
    "METHODS",
    "MODEL_TYPES",
    "AdaptedAttention",
    "DAAConfig",
    "DexConfig",
    "DiffKConfig",
    "DiffLoRAConfig",
    "DiffQConfig",
    "DiffV2Config",
    "DiffVConfig",
    "LoRAControlConfig",
    "MethodSpec",
    "ModelTypeSpec",
    "adapt",
    "adapter_lambdas",
    "attention_modules",
    "differential_parameter_names",
    "get_method",
    "get_spec",
    "head_entropy",
    "head_importance",
    "load_adapted",
    "load_adapter",
    "merge_adapter",
    "no_decay_parameter_names",
    "parameter_groups",
    "project_output",
    "project_qkv",
    "remove_adapter",
    "save_adapter",
    "set_adapter_step",
    "trainable_parameters",
    "trained_parameter_names",
]


def __getattr__(name: str):
    # METHODS / CONTROLS are computed on access, so a method registered later (a plug-in, a test's toy) is in them
    if name == "METHODS":
        return {spec.name: spec.config for spec in specs("method")}
    if name == "CONTROLS":
        return method_names("control")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _info(model: nn.Module, caller: str):
    return adapted_model(model, caller)._diffattn_adapter


def adapter_lambdas(model: nn.Module) -> list[float]:
    """The current λ of every adapted layer, in layer order (what the trainer logs as λ(t))."""
    return lambda_per_layer(adapted_model(model, "adapter_lambdas")) or []


def no_decay_parameter_names(model: nn.Module) -> list[str]:
    """Trainable parameters that must get weight_decay=0: every λ, and what the method adds (Dex on GPT-2: the
    fused ``c_attn``, whose query part a gradient hook keeps frozen; AdamW's decoupled decay would still shrink
    W_Q)."""
    spec = get_method(_info(model, "no_decay_parameter_names").method)
    names = [n for n, p in model.named_parameters() if p.requires_grad and "lambda" in n.rsplit(".", 1)[-1]]
    return names + (spec.no_decay(model) if spec.no_decay is not None else [])


def parameter_groups(model: nn.Module, *, lr: float, lambda_lr: float, weight_decay: float = 0.0) -> list[dict]:
    """The optimiser's parameter groups for your own training loop, as ``diffattn adapt`` trains (its
    :class:`~diffattn.train.adapt_trainer.AdapterTrainer`): the trainable parameters at ``lr``, with
    ``weight_decay`` except for biases and norms (:func:`diffattn.models.decay.decayed_parameter_names`) and
    :func:`no_decay_parameter_names`;
    the λ(t) term (:func:`differential_parameter_names`) at its own ``lambda_lr`` without decay (at the base's lr λ
    barely moves and the method is an attention fine-tune by construction: docs/methods.md §7). Call
    :func:`trainable_parameters` first. ``torch.optim.AdamW(diffattn.parameter_groups(model, lr=1e-4,
    lambda_lr=1e-2))``; then ``diffattn.set_adapter_step(model, step)`` before every step. Groups without
    parameters are left out."""
    from ..models.decay import decayed_parameter_names

    inner = adapted_model(model, "parameter_groups", allow_peft=False)
    differential = set(differential_parameter_names(inner))
    no_decay = set(no_decay_parameter_names(inner))
    decayed = set(decayed_parameter_names(inner)) - no_decay - differential
    groups: dict[str, dict] = {
        "decay": {"params": [], "lr": lr, "weight_decay": weight_decay},
        "no_decay": {"params": [], "lr": lr, "weight_decay": 0.0},
        "differential": {"params": [], "lr": lambda_lr, "weight_decay": 0.0},
    }
    for name, param in inner.named_parameters():
        if param.requires_grad:
            kind = "differential" if name in differential else "decay" if name in decayed else "no_decay"
            groups[kind]["params"].append(param)
    return [{"name": kind, **g} for kind, g in groups.items() if g["params"]]


def differential_parameter_names(model: nn.Module) -> list[str]:
    """The trainable parameters of the model's λ(t) term, by name: every λ_learn (Dex Eq. 4) and the weights its
    registry entry names (:attr:`MethodSpec.differential_weights`: Dex's W_D, DAA's W_DAA, DiffQ/K/V's W_D).
    ``diffattn adapt`` trains them at their own learning rate (``train.lambda_lr``), without weight decay. Empty for
    a method without such a term (DiffLoRA, DIFF V2, the controls)."""
    inner = adapted_model(model, "differential_parameter_names")
    spec = get_method(inner._diffattn_adapter.method)
    wanted = set()
    for module in inner.modules():
        if isinstance(module, AdaptedAttention):
            wanted |= {id(m.lambda_learn) for m in module.method.modules() if isinstance(m, AnnealedLambda)}
            wanted |= {id(getattr(module.method, attr)) for attr in spec.differential_weights}
    return [n for n, p in model.named_parameters() if id(p) in wanted and p.requires_grad]


def adapt(model: nn.Module, config, calibration=None) -> nn.Module:
    """Give ``model`` the method of ``config`` (one of the :data:`METHODS` configs); returns the same model,
    changed in place. ``calibration``: a list of input-id tensors, for Dex's data-driven head selection. A model
    that has an adapter already is refused (adapting it again would wrap the wrapped attention).

    The model keeps a copy of ``config``: what it was adapted with is what :func:`save_adapter` records, whatever
    happens to ``config`` later (one config reused for a second model, or a field changed after adapting: the first
    model's saved adapter recorded the second's Dex heads, or the changed field, and loaded as another model; a
    user's review, 2026-12-03). What the method resolves is written back to ``config`` as well, for reading (Dex:
    ``config.selected``, the heads chosen)."""
    import copy

    spec = spec_for_config(config)
    refuse_adapted(model, "adapt")
    own = copy.deepcopy(config)
    model = spec.adapt(model, own, calibration)
    for field in dataclasses.fields(own):
        setattr(config, field.name, copy.deepcopy(getattr(own, field.name)))
    return model


def trainable_parameters(model: nn.Module) -> list[str]:
    """Freeze what the method's paper froze; returns the names left trainable. A PEFT-wrapped model is refused
    with the remedy: PEFT decides what trains inside its wrapper (call this before ``get_peft_model``)."""
    inner = adapted_model(model, "trainable_parameters", allow_peft=False, peft_remedy=PEFT_TRAINABLE)
    return get_method(inner._diffattn_adapter.method).trainable_parameters(inner)


PEFT_TRAINABLE = (
    "PEFT decides what trains inside its wrapper: call diffattn.trainable_parameters(model) before get_peft_model, "
    "or fold the PEFT adapter in first (model = model.merge_and_unload())"
)


def trained_parameter_names(model: nn.Module) -> list[str]:
    """Names of the parameters the model's method trains (its own and the base weights it updates), as the adapted
    model names them. A PEFT-wrapped model is refused with the remedy: inside PEFT's wrapper the names change."""
    inner = adapted_model(model, "trained_parameter_names", allow_peft=False, peft_remedy=PEFT_NAMES)
    return get_method(inner._diffattn_adapter.method).trained_names(inner)


PEFT_NAMES = (
    "inside PEFT's wrapper the parameters have other names (base_model.model.…, LoRA's base_layer): call "
    "diffattn.adapters.trained_parameter_names(model) before get_peft_model, or fold the PEFT adapter in first "
    "(model = model.merge_and_unload())"
)


def merge_adapter(model: nn.Module) -> nn.Module:
    """Fold the adapter into the base weights (Dex: W_O; DiffV: W_V) and return a plain model of the base
    architecture with zero overhead. The two-map methods raise ``NotImplementedError`` saying why."""
    model = adapted_model(model, "merge_adapter", allow_peft=False)
    info = model._diffattn_adapter
    spec = get_method(info.method)
    if spec.merge is None:
        raise NotImplementedError(f"{info.method} cannot be merged: {spec.why_not_mergeable}")
    return spec.merge(model)
