"""Adapters that give pretrained models differential attention (issue 4; methods.md §2–4).

Implemented so far: the model-type table (``model_types``), the shared wrapper and annealed λ(t)
(``base``), and Dex (``dex``), save/load (``io``). DAA, DiffQ/K/V, DiffLoRA and the training command are to come.
"""

from __future__ import annotations

from torch import nn

from .base import AdaptedAttention, remove_adapter, set_adapter_step
from .dex import DexConfig, adapt_dex, dex_trainable_parameters, dex_trained_names, head_entropy, merge_dex
from .io import load_adapter, save_adapter
from .model_types import MODEL_TYPES, ModelTypeSpec, attention_modules, get_spec, project_output, project_qkv

__all__ = [
    "MODEL_TYPES",
    "AdaptedAttention",
    "DexConfig",
    "ModelTypeSpec",
    "adapt",
    "attention_modules",
    "get_spec",
    "head_entropy",
    "load_adapter",
    "merge_adapter",
    "project_output",
    "project_qkv",
    "remove_adapter",
    "save_adapter",
    "set_adapter_step",
    "trainable_parameters",
    "trained_parameter_names",
]


def adapt(model: nn.Module, config, calibration=None) -> nn.Module:
    """Give ``model`` the method of ``config`` (a ``DexConfig`` so far); returns the same model, changed in place.
    ``calibration``: a list of input-id tensors, for data-driven head selection."""
    if isinstance(config, DexConfig):
        return adapt_dex(model, config, calibration)
    raise ValueError(f"unsupported adapter config {type(config).__name__}; implemented: DexConfig")


def trainable_parameters(model: nn.Module) -> list[str]:
    """Freeze what the method's paper froze; returns the names left trainable."""
    info = getattr(model, "_diffattn_adapter", None)
    if info is None:
        raise ValueError("trainable_parameters: this model has no diffattn adapter")
    return dex_trainable_parameters(model)


def trained_parameter_names(model: nn.Module) -> list[str]:
    """Names of the parameters the model's method trains (its own and the base weights it updates)."""
    if getattr(model, "_diffattn_adapter", None) is None:
        raise ValueError("trained_parameter_names: this model has no diffattn adapter")
    return dex_trained_names(model)


def merge_adapter(model: nn.Module) -> nn.Module:
    """Fold the adapter into the base weights (Dex: into W_O) and return a plain model of the base architecture."""
    info = getattr(model, "_diffattn_adapter", None)
    if info is None:
        raise ValueError("merge_adapter: this model has no diffattn adapter")
    return merge_dex(model)
