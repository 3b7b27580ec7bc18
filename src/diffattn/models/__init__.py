"""Models: named presets, the from-scratch architectures (baseline, DIFF, DIFF V2) and their builder, and our DIFF
attention installed into them."""

from .architectures import ARCHITECTURES, Architecture, get_architecture, register_architecture
from .build import build_model, count_parameters, describe_parameters, model_config
from .diff_llama import DiffAttentionOptions, DiffLlamaDifferentialAttention, DiffTransformerConfig, lambda_init_value
from .diff_model import DiffTransformerForCausalLM, DiffTransformerModel
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
    "ARCHITECTURES",
    "PRESETS",
    "PRETRAINED",
    "Architecture",
    "DiffAttentionOptions",
    "DiffLlamaDifferentialAttention",
    "DiffTransformerConfig",
    "DiffTransformerForCausalLM",
    "DiffTransformerModel",
    "DiffTransformerV2Config",
    "DiffTransformerV2ForCausalLM",
    "DiffTransformerV2Model",
    "DiffV2Attention",
    "ModelPreset",
    "build_model",
    "count_parameters",
    "describe_parameters",
    "get_architecture",
    "get_preset",
    "install_diff_attention",
    "lambda_init_value",
    "load_pretrained",
    "model_config",
    "register_architecture",
    "remove_diff_attention",
    "set_v2_backend",
]

# importing the model classes registers their model types with transformers' Auto classes (a model built before any
# Auto class was imported loads back through them too; diffattn.models.auto)
from .auto import register_auto_classes

register_auto_classes()
