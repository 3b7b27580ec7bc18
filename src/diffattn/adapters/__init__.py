"""Adapters that give pretrained models differential attention (issue 4; methods.md §2–4).

The model-type table (``model_types``), the shared wrapper, method hooks and annealed λ(t) (``base``), the
methods Dex (``dex``), DAA, DiffQ, DiffK (``daa``), DiffV (``input_diff``), DiffLoRA (``difflora``), and
save/load (``io``). One API for all: :func:`adapt`, :func:`set_adapter_step`, :func:`trainable_parameters`,
:func:`save_adapter` / :func:`load_adapter`, :func:`merge_adapter` (Dex, DiffV), :func:`remove_adapter`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from ..lambdas import lambda_per_layer
from .base import AdaptedAttention, adapted_model, remove_adapter, set_adapter_step
from .daa import DAAConfig, DiffKConfig, DiffQConfig, adapt_daa, adapt_input_diff, attention_module_names
from .dex import (
    DexConfig,
    adapt_dex,
    dex_trainable_parameters,
    dex_trained_names,
    head_entropy,
    head_importance,
    merge_dex,
)
from .difflora import DiffLoRAConfig, adapt_difflora, difflora_trained_names
from .input_diff import DiffVConfig, adapt_diffv, merge_diffv
from .io import load_adapter, save_adapter
from .model_types import MODEL_TYPES, ModelTypeSpec, attention_modules, get_spec, project_output, project_qkv

__all__ = [
    "METHODS",
    "MODEL_TYPES",
    "AdaptedAttention",
    "DAAConfig",
    "DexConfig",
    "DiffKConfig",
    "DiffLoRAConfig",
    "DiffQConfig",
    "DiffVConfig",
    "ModelTypeSpec",
    "adapt",
    "adapter_lambdas",
    "attention_modules",
    "get_spec",
    "head_entropy",
    "head_importance",
    "load_adapter",
    "merge_adapter",
    "no_decay_parameter_names",
    "project_output",
    "project_qkv",
    "remove_adapter",
    "save_adapter",
    "set_adapter_step",
    "trainable_parameters",
    "trained_parameter_names",
]


@dataclass(frozen=True)
class _Method:
    config: type
    adapt: Callable  # (model, config, calibration) -> model
    trained_names: Callable  # model -> names of every parameter the method trains
    merge: Callable | None  # model -> plain model; None: not mergeable
    why_not_mergeable: str = ""


_TWO_MAPS = "its second softmax map cannot be folded into a linear weight"
_REGISTRY: dict[str, _Method] = {
    "dex": _Method(DexConfig, adapt_dex, dex_trained_names, merge_dex),
    "diffv": _Method(
        DiffVConfig,
        lambda m, c, cal: adapt_diffv(m, c),
        lambda m: attention_module_names(m, m._diffattn_adapter.config.train_lm_head),
        merge_diffv,
    ),
    "daa": _Method(
        DAAConfig,
        lambda m, c, cal: adapt_daa(m, c),
        lambda m: attention_module_names(m, m._diffattn_adapter.config.train_lm_head),
        None,
        _TWO_MAPS,
    ),
    "diffq": _Method(
        DiffQConfig,
        lambda m, c, cal: adapt_input_diff(m, c),
        lambda m: attention_module_names(m, m._diffattn_adapter.config.train_lm_head),
        None,
        _TWO_MAPS,
    ),
    "diffk": _Method(
        DiffKConfig,
        lambda m, c, cal: adapt_input_diff(m, c),
        lambda m: attention_module_names(m, m._diffattn_adapter.config.train_lm_head),
        None,
        _TWO_MAPS,
    ),
    "difflora": _Method(
        DiffLoRAConfig, lambda m, c, cal: adapt_difflora(m, c), difflora_trained_names, None, _TWO_MAPS
    ),
}

METHODS: dict[str, type] = {name: entry.config for name, entry in _REGISTRY.items()}
"""Adapter method name → its config dataclass (what ``diffattn adapt --method`` accepts besides the controls)."""


def _info(model: nn.Module, caller: str):
    return adapted_model(model, caller)._diffattn_adapter


def adapter_lambdas(model: nn.Module) -> list[float]:
    """The current λ of every adapted layer, in layer order (what the trainer logs as λ(t))."""
    return lambda_per_layer(adapted_model(model, "adapter_lambdas")) or []


def no_decay_parameter_names(model: nn.Module) -> list[str]:
    """Trainable parameters that must get weight_decay=0: GPT-2's fused ``c_attn`` when the method keeps its
    query part frozen by a gradient hook (AdamW's decoupled decay would still shrink W_Q), and every λ."""
    info = _info(model, "no_decay_parameter_names")
    spec = get_spec(model)
    names = [n for n, p in model.named_parameters() if p.requires_grad and "lambda" in n.rsplit(".", 1)[-1]]
    if info.method == "dex" and spec.fused_qkv is not None:
        names += [n for n, p in model.named_parameters() if p.requires_grad and f".base_attn.{spec.fused_qkv}." in n]
    return names


def adapt(model: nn.Module, config, calibration=None) -> nn.Module:
    """Give ``model`` the method of ``config`` (one of the :data:`METHODS` configs); returns the same model,
    changed in place. ``calibration``: a list of input-id tensors, for Dex's data-driven head selection."""
    for entry in _REGISTRY.values():
        if type(config) is entry.config:
            return entry.adapt(model, config, calibration)
    names = ", ".join(c.__name__ for c in METHODS.values())
    raise ValueError(f"unsupported adapter config {type(config).__name__}; implemented: {names}")


def trainable_parameters(model: nn.Module) -> list[str]:
    """Freeze what the method's paper froze; returns the names left trainable."""
    info = _info(model, "trainable_parameters")
    if info.method == "dex":
        return dex_trainable_parameters(model)
    names = set(trained_parameter_names(model))
    for n, p in model.named_parameters():
        p.requires_grad_(n in names)
    return [n for n, p in model.named_parameters() if p.requires_grad]


def trained_parameter_names(model: nn.Module) -> list[str]:
    """Names of the parameters the model's method trains (its own and the base weights it updates)."""
    return _REGISTRY[_info(model, "trained_parameter_names").method].trained_names(model)


def merge_adapter(model: nn.Module) -> nn.Module:
    """Fold the adapter into the base weights (Dex: W_O; DiffV: W_V) and return a plain model of the base
    architecture with zero overhead. The two-map methods raise ``NotImplementedError`` saying why."""
    model = adapted_model(model, "merge_adapter", allow_peft=False)
    info = model._diffattn_adapter
    entry = _REGISTRY[info.method]
    if entry.merge is None:
        raise NotImplementedError(f"{info.method} cannot be merged: {entry.why_not_mergeable}")
    return entry.merge(model)
