"""Swap every ``DiffLlamaAttention`` of a Hugging Face model for our differential attention module.

Module instances are replaced in their parents (the PEFT way); no transformers class is patched. The new
module reuses the original's parameters under the same names, so ``save_pretrained`` output still loads in
plain transformers, and :func:`remove_diff_attention` puts the originals back.
"""

from __future__ import annotations

import logging

from torch import nn
from transformers.models.diffllama.modeling_diffllama import DiffLlamaAttention

from .diff_llama import DiffAttentionOptions, DiffLlamaDifferentialAttention

logger = logging.getLogger(__name__)

_MASK_FORMATS_WE_READ = ("sdpa", "eager")


def _attention_modules(model: nn.Module):
    for name, module in model.named_modules():
        if isinstance(module, (DiffLlamaAttention, DiffLlamaDifferentialAttention)):
            parent_name, _, child = name.rpartition(".")
            yield model.get_submodule(parent_name) if parent_name else model, child, module


def install_diff_attention(
    model: nn.Module,
    backend: str = "auto",
    *,
    lambda_init: str | float | None = None,
    norm: str | None = None,
) -> nn.Module:
    """Install our DIFF attention (built on :func:`diffattn.ops.diff_attention`) into a ``DiffLlama`` model.

    Args:
        model: a ``DiffLlamaForCausalLM`` / ``DiffLlamaModel`` (from :func:`diffattn.build_model` or
            ``from_pretrained``). Re-installing on an installed model changes its options.
        backend: backend of the two-map op (``auto``, ``reference``, ``sdpa``, ``triton``).
        lambda_init: ``"exponential"`` (default) or a constant in (0, 1); ``None`` keeps what
            ``config.diffattn`` recorded, else the default.
        norm: ``"rms"`` (default; no gain, loadable by plain transformers), ``"rms_affine"`` (learnable
            gain: adds ``groupnorm.weight`` parameters that plain ``DiffLlama`` drops on loading, so such a
            checkpoint reloads exactly only through diffattn) or ``"none"`` (ablation). ``None`` keeps
            ``config.diffattn``'s value, else the default.

    Returns:
        The same model, modified in place.
    """
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    targets = list(_attention_modules(model))
    if model_type != "diffllama" or not targets:
        raise ValueError(
            f"install_diff_attention needs a DiffLlama model (config.model_type 'diffllama'); got "
            f"{type(model).__name__} with model_type {model_type!r}. For a baseline, build attention='diff'; to "
            f"add differential attention to a pretrained model use the adapters (Dex, DAA, DiffLoRA)."
        )
    recorded = dict(getattr(config, "diffattn", None) or {})
    options = DiffAttentionOptions(
        backend=backend,
        lambda_init=lambda_init if lambda_init is not None else recorded.get("lambda_init", "exponential"),
        norm=norm if norm is not None else recorded.get("norm", "rms"),
    )
    if config._attn_implementation not in _MASK_FORMATS_WE_READ:
        logger.info(
            "switching attn_implementation %r -> 'sdpa' (mask format our module reads)", config._attn_implementation
        )
        model.set_attn_implementation("sdpa")
    for parent, child, module in targets:
        original = module.original if isinstance(module, DiffLlamaDifferentialAttention) else module
        setattr(parent, child, DiffLlamaDifferentialAttention(original, options))
    config.diffattn = options.to_config()
    logger.info("installed diffattn DIFF attention in %d layers (%s)", len(targets), options)
    return model


def remove_diff_attention(model: nn.Module) -> nn.Module:
    """Put the original ``DiffLlamaAttention`` modules back (a learnable norm gain, if any, is dropped)."""
    restored = 0
    for parent, child, module in _attention_modules(model):
        if isinstance(module, DiffLlamaDifferentialAttention):
            setattr(parent, child, module.original)
            restored += 1
    if restored == 0:
        raise ValueError("remove_diff_attention: this model has no diffattn DIFF attention installed")
    if getattr(model.config, "diffattn", None) is not None:
        del model.config.diffattn
    return model
