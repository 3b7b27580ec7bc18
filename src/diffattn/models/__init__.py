"""Models: named presets, from-scratch baseline/DIFF builders, and our DIFF attention installed into them."""

from .build import ATTENTIONS, build_model, count_parameters, describe_parameters, model_config
from .diff_llama import DiffAttentionOptions, DiffLlamaDifferentialAttention, lambda_init_value
from .install import install_diff_attention, remove_diff_attention
from .presets import PRESETS, ModelPreset, get_preset
from .pretrained import PRETRAINED, load_pretrained

__all__ = [
    "ATTENTIONS",
    "PRESETS",
    "PRETRAINED",
    "DiffAttentionOptions",
    "DiffLlamaDifferentialAttention",
    "ModelPreset",
    "build_model",
    "count_parameters",
    "describe_parameters",
    "get_preset",
    "install_diff_attention",
    "lambda_init_value",
    "load_pretrained",
    "model_config",
    "remove_diff_attention",
]
