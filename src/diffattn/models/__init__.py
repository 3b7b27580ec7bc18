"""Models: named presets, from-scratch baseline/DIFF/DIFF V2 builders, and our DIFF attention installed into them."""

from .build import ATTENTIONS, build_model, count_parameters, describe_parameters, model_config
from .diff_llama import DiffAttentionOptions, DiffLlamaDifferentialAttention, lambda_init_value
from .diff_v2 import (
    DiffTransformerV2Config,
    DiffTransformerV2ForCausalLM,
    DiffTransformerV2Model,
    DiffV2Attention,
    set_v2_backend,
)
from .install import install_diff_attention, remove_diff_attention
from .presets import PRESETS, ModelPreset, get_preset
from .pretrained import PRETRAINED, load_pretrained

__all__ = [
    "ATTENTIONS",
    "PRESETS",
    "PRETRAINED",
    "DiffAttentionOptions",
    "DiffLlamaDifferentialAttention",
    "DiffTransformerV2Config",
    "DiffTransformerV2ForCausalLM",
    "DiffTransformerV2Model",
    "DiffV2Attention",
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
    "set_v2_backend",
]
