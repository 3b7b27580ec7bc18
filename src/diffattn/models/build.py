"""From-scratch models of a named preset, one builder for every architecture of the table
(:mod:`diffattn.models.architectures`: the Llama-style baseline, the DIFF Transformer, DIFF V2, docs/methods.md §1,
§5): the Hugging Face config from the preset's sizes, the model, the architecture's own options installed.

Every architecture of a preset has the baseline's parameter count (within 4½ FFN units per layer): an architecture
that adds weights to a layer gets its FFN narrowed by the width that pays for them, rounded to a width fast GEMMs
take (:func:`~diffattn.models.architectures.matched_intermediate_size`).
"""

from __future__ import annotations

import logging

import torch
from transformers import PreTrainedModel

from .architectures import ARCHITECTURES, get_architecture, matched_intermediate_size
from .auto import register_auto_classes
from .presets import ModelPreset, get_preset

logger = logging.getLogger(__name__)


def model_config(preset: str | ModelPreset, attention: str = "standard", **overrides):
    """The Hugging Face config of a preset for the architecture ``attention`` (a name of the architecture table)."""
    architecture = get_architecture(attention)
    p = get_preset(preset, **overrides)
    p.validate(attention, architecture.preset_problems)
    common = dict(
        vocab_size=p.vocab_size,
        hidden_size=p.hidden_size,
        intermediate_size=matched_intermediate_size(p, architecture),
        num_hidden_layers=p.num_layers,
        num_attention_heads=p.num_heads,
        num_key_value_heads=p.num_kv_heads,
        head_dim=p.head_dim,
        max_position_embeddings=p.max_position_embeddings,
        rms_norm_eps=p.rms_norm_eps,
        tie_word_embeddings=p.tie_word_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": p.rope_theta},
        attention_bias=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    return architecture.make_config(**common)


def build_model(
    preset: str | ModelPreset,
    attention: str = "standard",
    *,
    backend: str | None = "auto",
    lambda_init: str | float | None = None,
    norm: str | None = None,
    seed: int | None = None,
    dtype: torch.dtype | None = None,
    **overrides,
) -> PreTrainedModel:
    """Build a freshly initialised model of the architecture ``attention`` (``"standard"``, the baseline;
    ``"diff"``; ``"diff-v2"``; any name of :data:`~diffattn.models.architectures.ARCHITECTURES`).

    Args:
        preset: a name from :data:`diffattn.models.presets.PRESETS` or a :class:`ModelPreset`.
        attention: the architecture (its row says what builds it).
        backend: for the architectures with our attention op, its backend (DIFF: ``None`` keeps Hugging Face's own
            ``DiffLlamaAttention``; DIFF V2: ``None`` = ``auto``); the baseline has none and ignores it.
        lambda_init, norm: DIFF options, see :func:`diffattn.install_diff_attention`; refused by an architecture
            without them.
        seed: seeds the weight initialisation.
        dtype: parameter dtype (default float32; use float32 on CPU).
        **overrides: preset fields, e.g. ``num_layers=3, max_position_embeddings=512``.
    """
    architecture = get_architecture(attention)
    config = model_config(preset, attention, **overrides)
    given = {"lambda_init": lambda_init, "norm": norm}
    refused = [k for k, v in given.items() if v is not None and k not in architecture.options]
    if refused:
        takers = " or ".join(repr(a.name) for a in ARCHITECTURES.values() if set(refused) <= set(a.options))
        raise ValueError(
            f"{' and '.join(refused)}: they need attention={takers or 'none'} (attention={attention!r} takes "
            f"{', '.join(architecture.options) or 'no option'})"
        )
    if seed is not None:
        torch.manual_seed(seed)
    register_auto_classes()  # a model built before any Auto class was imported loads back through them too
    # each class's default attention implementation: sdpa for Llama and DiffLlama, our fused op for DIFF V2
    model = architecture.make_model(config, dtype=dtype or torch.float32)
    if architecture.install is not None:
        options = {"backend": backend, **given}
        architecture.install(model, **{k: options[k] for k in architecture.options})
    return model


def count_parameters(preset: str | ModelPreset, attention: str = "standard", **overrides) -> int:
    """Parameter count of a preset, without allocating it (built on the ``meta`` device)."""
    with torch.device("meta"):
        model = build_model(preset, attention, backend=None, **overrides)
    return sum(p.numel() for p in model.parameters())


def describe_parameters(preset: str | ModelPreset, **overrides) -> str:
    """One line comparing the parameter counts of every architecture the preset can build (the baseline first)."""
    p = get_preset(preset, **overrides)
    baseline = next(a for a in ARCHITECTURES.values() if not a.differential)
    base = count_parameters(p, baseline.name)
    parts = [f"{baseline.short_label} {base:,} params ({baseline.shape(p)})"]
    for a in ARCHITECTURES.values():
        if a is baseline or a.preset_problems(p):
            continue
        n = count_parameters(p, a.name)
        ffn = matched_intermediate_size(p, a)
        width = f", FFN {ffn}" if ffn != p.intermediate_size else ""
        parts.append(f"{a.short_label} {n:,} params ({a.shape(p)}{width}; {100 * (n - base) / base:+.3f}%)")
    return f"{p.name}: " + " | ".join(parts)
