"""diffattn — differential attention for language models.

Train DIFF Transformers from scratch against a same-size Llama baseline, and (later issues) retrofit
pretrained models with Dex, DiffLoRA and DAA, then measure attention noise, retrieval, in-context learning
and outliers. Everything reduces to one primitive, :func:`diffattn.ops.diff_attention`.
"""

from .models import (
    PRESETS,
    DiffAttentionOptions,
    build_model,
    count_parameters,
    describe_parameters,
    install_diff_attention,
    load_pretrained,
    remove_diff_attention,
)
from .ops import backend_status, diff_attention, diff_attention_maps

__version__ = "0.1.0"

__all__ = [
    "PRESETS",
    "DiffAttentionOptions",
    "__version__",
    "backend_status",
    "build_model",
    "count_parameters",
    "describe_parameters",
    "diff_attention",
    "diff_attention_maps",
    "install_diff_attention",
    "load_pretrained",
    "remove_diff_attention",
]
