"""Models: named presets, the from-scratch architectures (baseline, DIFF, DIFF V2) and their builder, and our DIFF
attention installed into them.

The names below are imported on first use (PEP 562): the presets and the architecture table (what
``diffattn pretrain --help`` lists) load without transformers, whose import takes seconds. diffattn's model types
are registered with transformers' Auto classes as soon as transformers is imported (:mod:`diffattn.hf_auto`), and
again, idempotently, whenever a model is built or loaded (:mod:`.auto`).
"""

from __future__ import annotations

import importlib

_LAZY = {
    **dict.fromkeys(("ARCHITECTURES", "Architecture", "get_architecture", "register_architecture"), "architectures"),
    **dict.fromkeys(("PRESETS", "ModelPreset", "get_preset"), "presets"),
    **dict.fromkeys(("build_model", "count_parameters", "describe_parameters", "model_config"), "build"),
    **dict.fromkeys(
        ("DiffAttentionOptions", "DiffLlamaDifferentialAttention", "DiffTransformerConfig", "lambda_init_value"),
        "diff_llama",
    ),
    **dict.fromkeys(("DiffTransformerForCausalLM", "DiffTransformerModel"), "diff_model"),
    **dict.fromkeys(
        (
            "DiffTransformerV2Config",
            "DiffTransformerV2ForCausalLM",
            "DiffTransformerV2Model",
            "DiffV2Attention",
            "set_v2_backend",
        ),
        "diff_v2",
    ),
    **dict.fromkeys(("install_diff_attention", "remove_diff_attention"), "install"),
    **dict.fromkeys(("PRETRAINED", "load_pretrained"), "pretrained"),
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
