"""diffattn — differential attention for language models.

Train DIFF Transformers from scratch against a same-size Llama baseline, retrofit pretrained models with
Dex, DAA, DiffQ/K/V and DiffLoRA (``diffattn.adapt``), then measure attention noise, retrieval, in-context learning
and outliers. Everything reduces to one primitive, :func:`diffattn.ops.diff_attention`.

The names below are imported on first use (PEP 562), so ``import diffattn`` and the ``diffattn`` command
start without loading torch and transformers.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "PRESETS": "diffattn.models",
    "DiffAttentionOptions": "diffattn.models",
    "build_model": "diffattn.models",
    "count_parameters": "diffattn.models",
    "describe_parameters": "diffattn.models",
    "install_diff_attention": "diffattn.models",
    "load_pretrained": "diffattn.models",
    "remove_diff_attention": "diffattn.models",
    "backend_status": "diffattn.ops",
    **{
        name: "diffattn.adapters"
        for name in (
            "METHODS",
            "DAAConfig",
            "DexConfig",
            "DiffKConfig",
            "DiffLoRAConfig",
            "DiffQConfig",
            "DiffVConfig",
            "DiffV2Config",
            "LoRAControlConfig",
            "adapt",
            "adapter_lambdas",
            "load_adapter",
            "merge_adapter",
            "differential_parameter_names",
            "no_decay_parameter_names",
            "parameter_groups",
            "remove_adapter",
            "save_adapter",
            "set_adapter_step",
            "trainable_parameters",
        )
    },
    "load_adapted": "diffattn.adapters",
    "diff_attention": "diffattn.ops",
    "diff_attention_maps": "diffattn.ops",
    "diff_attention_pairs": "diffattn.ops",
    "diff_attention_stacked": "diffattn.ops",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        if name != "METHODS":  # METHODS follows the registry (a method registered later is in it): never cached
            globals()[name] = value  # later lookups skip __getattr__
        return value
    if name.endswith("Config"):  # a registered method's options (one added later needs no line here)
        from .adapters.registry import specs

        for spec in specs():
            if spec.config.__name__ == name:
                return spec.config
    raise AttributeError(f"module 'diffattn' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)


# diffattn's checkpoints (DIFF V2, DIFF with non-default options) load through transformers' Auto classes after
# `import diffattn`: registered once transformers is imported (diffattn.hf_auto), so this import stays light. Last,
# because registering imports diffattn.models, which may read the names above.
from .hf_auto import register_when_transformers_loads as _register_when_transformers_loads  # noqa: E402

_register_when_transformers_loads()
