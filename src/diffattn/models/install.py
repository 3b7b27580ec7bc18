"""Swap every ``DiffLlamaAttention`` of a Hugging Face model for our differential attention module.

Module instances are replaced in their parents (the PEFT way); no transformers class is patched. The new
module reuses the original's parameters under the same names, and :func:`remove_diff_attention` puts the
originals back. The ``DiffLlamaModel`` gets one forward pre-hook, which computes every layer's λ at once and hands
it to them (:func:`~diffattn.models.diff_llama.hand_layers_their_lambdas`); removing the attention removes it.

What ``save_pretrained`` writes follows the options (:func:`set_checkpoint_type`): with those plain ``DiffLlama``
computes, a ``diffllama`` checkpoint that plain transformers loads exactly; with any other, the config becomes a
:class:`~diffattn.models.diff_llama.DiffTransformerConfig` (``diffattn_diff``: refused by plain transformers, loaded
with its options and norm gains after ``import diffattn``).
"""

from __future__ import annotations

import logging

from torch import nn
from transformers import DiffLlamaConfig, DiffLlamaModel
from transformers.models.diffllama.modeling_diffllama import DiffLlamaAttention

from .attention_interface import dropout_not_applied
from .diff_llama import (
    MODEL_TYPE,
    DiffAttentionOptions,
    DiffLlamaDifferentialAttention,
    DiffTransformerConfig,
    hand_layers_their_lambdas,
)

logger = logging.getLogger(__name__)

_MASK_FORMATS_WE_READ = ("sdpa", "eager")
DIFF_MODEL_TYPES = ("diffllama", MODEL_TYPE)  # the model types our DIFF attention installs into


def recorded_options(config, backend: str = "auto") -> DiffAttentionOptions:
    """The options ``config.diffattn`` records (the defaults where it records none)."""
    recorded = dict(getattr(config, "diffattn", None) or {})
    unknown = sorted(set(recorded) - set(DiffAttentionOptions().to_config()))
    if unknown:  # a newer diffattn's option: its default here could give other logits without a word
        raise ValueError(
            f"this model's config.diffattn records option(s) {', '.join(unknown)} that this diffattn does not know "
            "(it was saved by a newer version): upgrade diffattn to load it"
        )
    return DiffAttentionOptions(
        backend=backend,
        lambda_init=recorded.get("lambda_init", "exponential"),
        norm=recorded.get("norm", "rms"),
    )


def set_checkpoint_type(config, options: DiffAttentionOptions | None) -> None:
    """Make ``config`` (a DiffLlama config, changed in place so every module holding it sees the change) save the
    checkpoint type that ``options`` needs: plain ``DiffLlamaConfig`` when plain DiffLlama computes them (or
    ``None``: no diffattn attention), else :class:`DiffTransformerConfig`. The two classes differ only in
    ``model_type``; a config of any other class is left alone."""
    if type(config) not in (DiffLlamaConfig, DiffTransformerConfig):
        return
    plain = options is None or options.computed_by_plain_diffllama
    config.__class__ = DiffLlamaConfig if plain else DiffTransformerConfig


def _attention_modules(model: nn.Module):
    for name, module in model.named_modules():
        if isinstance(module, (DiffLlamaAttention, DiffLlamaDifferentialAttention)):
            parent_name, _, child = name.rpartition(".")
            yield model.get_submodule(parent_name) if parent_name else model, child, module


#: the attribute of a ``DiffLlamaModel`` holding the handle of its λ hook (:func:`_hook_layer_lambdas`)
_LAMBDA_HOOK = "_diffattn_lambda_hook"


def _hook_layer_lambdas(model: nn.Module, on: bool) -> None:
    """Put (``on``) or take away the forward pre-hook that computes every layer's λ at once on each ``DiffLlamaModel``
    in ``model``: one at most each, whatever was installed before."""
    for module in model.modules():
        if isinstance(module, DiffLlamaModel):
            handle = module.__dict__.pop(_LAMBDA_HOOK, None)
            if handle is not None:
                handle.remove()
            if on:
                hook = module.register_forward_pre_hook(hand_layers_their_lambdas, with_kwargs=True)
                setattr(module, _LAMBDA_HOOK, hook)


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
        norm: ``"rms"`` (default; no gain), ``"rms_affine"`` (learnable gain: adds ``groupnorm.weight``
            parameters; re-installing with ``rms_affine`` again keeps the learnt gains) or ``"none"`` (ablation).
            ``None`` keeps ``config.diffattn``'s value, else the default. Any option but the defaults makes the
            model save a ``diffattn_diff`` checkpoint (module doc).

    Returns:
        The same model, modified in place.
    """
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    targets = list(_attention_modules(model))
    if model_type not in DIFF_MODEL_TYPES or not targets:
        raise ValueError(
            f"install_diff_attention needs a DiffLlama model (config.model_type 'diffllama'); got "
            f"{type(model).__name__} with model_type {model_type!r}. For a baseline, build attention='diff'; to "
            f"add differential attention to a pretrained model use the adapters (Dex, DAA, DiffLoRA)."
        )
    recorded = recorded_options(config, backend)
    options = DiffAttentionOptions(
        backend=backend,
        lambda_init=lambda_init if lambda_init is not None else recorded.lambda_init,
        norm=norm if norm is not None else recorded.norm,
    )
    if config._attn_implementation not in _MASK_FORMATS_WE_READ:
        logger.info(
            "switching attn_implementation %r -> 'sdpa' (mask format our module reads)", config._attn_implementation
        )
        model.set_attn_implementation("sdpa")
    for parent, child, module in targets:
        ours = isinstance(module, DiffLlamaDifferentialAttention)
        new = DiffLlamaDifferentialAttention(module.original if ours else module, options)
        if ours and module.options.norm == options.norm:
            new.groupnorm = module.groupnorm  # a re-install (another backend, λ_init) keeps the learnt norm gains
        setattr(parent, child, new)
    _hook_layer_lambdas(model, on=True)
    if dropout := dropout_not_applied(config):
        logger.warning(
            "DIFF attention computes through diffattn's op, without attention-probability dropout (%s): in training "
            "mode it drops no attention weights (docs/methods.md §7)",
            ", ".join(dropout),
        )
    config.diffattn = options.to_config()
    set_checkpoint_type(config, options)
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
    _hook_layer_lambdas(model, on=False)
    if getattr(model.config, "diffattn", None) is not None:
        del model.config.diffattn
    set_checkpoint_type(model.config, None)  # HF's own attention again: a plain diffllama checkpoint
    return model
