"""From-scratch models: a Llama-style baseline, a DIFF Transformer or a DIFF V2 model of the same size, from a
named preset.

The baseline is Hugging Face ``LlamaForCausalLM`` (RMSNorm, SwiGLU, no bias, RoPE — the paper's
"Transformer"); the DIFF model is ``DiffLlamaForCausalLM`` with our attention installed; DIFF V2 is
:class:`diffattn.models.diff_v2.DiffTransformerV2ForCausalLM` (a Llama model with V2 attention, docs/methods.md §5).
V2 adds H·d·d_model query and d_model·H gate weights per layer; its FFN is narrowed by the width that pays for them,
so the three models of a preset have the same parameter count (within one FFN unit per layer).
"""

from __future__ import annotations

import logging

import torch
from transformers import DiffLlamaConfig, DiffLlamaForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedModel

from .diff_v2 import DiffTransformerV2Config, DiffTransformerV2ForCausalLM, set_v2_backend
from .install import install_diff_attention
from .presets import ModelPreset, get_preset

logger = logging.getLogger(__name__)

ATTENTIONS = ("standard", "diff", "diff-v2")


def _check_attention(attention: str) -> None:
    if attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {', '.join(ATTENTIONS)}; got {attention!r}")


def model_config(preset: str | ModelPreset, attention: str = "standard", **overrides):
    """The Hugging Face config (``LlamaConfig`` or ``DiffLlamaConfig``) of a preset."""
    _check_attention(attention)
    p = get_preset(preset, **overrides)
    p.validate(attention)
    common = dict(
        vocab_size=p.vocab_size,
        hidden_size=p.hidden_size,
        intermediate_size=p.intermediate_size,
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
    if attention == "diff":
        return DiffLlamaConfig(**common, lambda_std_dev=0.1)
    if attention == "diff-v2":
        common["intermediate_size"] = v2_intermediate_size(p)
        return DiffTransformerV2Config(**common, mlp_bias=False, use_diff_v2=True)
    return LlamaConfig(**common, mlp_bias=False)


def v2_intermediate_size(preset: ModelPreset) -> int:
    """FFN width of a preset's V2 model: the baseline's minus what pays for V2's extra weights per layer
    (H·d·d_model more query weights and d_model·H gate weights; a SwiGLU unit costs 3·d_model)."""
    extra = preset.num_heads * preset.head_dim * preset.hidden_size + preset.hidden_size * preset.num_heads
    return preset.intermediate_size - round(extra / (3 * preset.hidden_size))


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
    """Build a freshly initialised baseline (``attention="standard"``) or DIFF (``"diff"``) model.

    Args:
        preset: a name from :data:`diffattn.models.presets.PRESETS` or a :class:`ModelPreset`.
        attention: ``"standard"`` → ``LlamaForCausalLM``; ``"diff"`` → ``DiffLlamaForCausalLM``;
            ``"diff-v2"`` → ``DiffTransformerV2ForCausalLM`` (docs/methods.md §5).
        backend: for DIFF, the backend of our installed attention (``None`` keeps Hugging Face's own
            ``DiffLlamaAttention``); for DIFF V2 the backend of its op (``None`` = ``auto``).
        lambda_init, norm: DIFF options, see :func:`diffattn.install_diff_attention`.
        seed: seeds the weight initialisation.
        dtype: parameter dtype (default float32; use float32 on CPU).
        **overrides: preset fields, e.g. ``num_layers=3, max_position_embeddings=512``.
    """
    config = model_config(preset, attention, **overrides)
    cls = {"diff": DiffLlamaForCausalLM, "diff-v2": DiffTransformerV2ForCausalLM}.get(attention, LlamaForCausalLM)
    if seed is not None:
        torch.manual_seed(seed)
    model = cls._from_config(config, attn_implementation="sdpa", dtype=dtype or torch.float32)
    if attention == "diff-v2":
        if lambda_init is not None or norm is not None:
            raise ValueError("lambda_init and norm are DIFF V1 options; DIFF V2 has a per-token gate and no norm")
        set_v2_backend(model, backend or "auto")
    elif attention == "diff" and backend is not None:
        install_diff_attention(model, backend, lambda_init=lambda_init, norm=norm)
    elif attention != "diff" and (lambda_init is not None or norm is not None):
        raise ValueError("lambda_init and norm are DIFF options; they need attention='diff'")
    return model


def count_parameters(preset: str | ModelPreset, attention: str = "standard", **overrides) -> int:
    """Parameter count of a preset, without allocating it (built on the ``meta`` device)."""
    with torch.device("meta"):
        model = build_model(preset, attention, backend=None, **overrides)
    return sum(p.numel() for p in model.parameters())


def describe_parameters(preset: str | ModelPreset, **overrides) -> str:
    """One line comparing the baseline's, the DIFF model's and the DIFF V2 model's parameter counts."""
    p = get_preset(preset, **overrides)
    base = count_parameters(p, "standard")
    diff = count_parameters(p, "diff")
    line = (
        f"{p.name}: baseline {base:,} params ({p.num_heads} heads × d={p.head_dim}) | "
        f"DIFF {diff:,} params ({p.diff_heads} heads × d={p.head_dim}, V 2d; {100 * (diff - base) / base:+.3f}%)"
    )
    if p.num_heads % p.num_kv_heads == 0:
        v2 = count_parameters(p, "diff-v2")
        line += (
            f" | DIFF V2 {v2:,} params ({p.num_heads} pairs × d={p.head_dim}, FFN {v2_intermediate_size(p)}; "
            f"{100 * (v2 - base) / base:+.3f}%)"
        )
    return line
