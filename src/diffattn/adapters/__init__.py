"""Adapters that give pretrained models differential attention (Dex, DAA, DiffQ/K/V, DiffLoRA; issue 4).

So far: the per-architecture table of where attention lives and how to reach Q/K/V/O (``model_types``).
"""

from .model_types import MODEL_TYPES, ModelTypeSpec, attention_modules, get_spec, project_output, project_qkv

__all__ = ["MODEL_TYPES", "ModelTypeSpec", "attention_modules", "get_spec", "project_output", "project_qkv"]
