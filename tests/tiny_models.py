"""Tiny random models of every architecture in the adapter table (built from configs: no downloads)."""

from __future__ import annotations

import torch
from transformers import (
    AutoModelForCausalLM,
    Gemma3TextConfig,
    GPT2Config,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
    Qwen3Config,
)

VOCAB = 96
_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)

CONFIGS = {
    "llama": lambda **kw: LlamaConfig(**{**_COMMON, **kw}),
    "mistral": lambda **kw: MistralConfig(**{**_COMMON, "sliding_window": 32, **kw}),
    "qwen2": lambda **kw: Qwen2Config(**{**_COMMON, **kw}),
    "qwen3": lambda **kw: Qwen3Config(**{**_COMMON, "head_dim": 16, **kw}),
    "gemma3_text": lambda **kw: Gemma3TextConfig(
        **{**_COMMON, "head_dim": 16, "sliding_window": 32, "query_pre_attn_scalar": 24, **kw}
    ),
    "gpt2": lambda **kw: GPT2Config(
        **{"vocab_size": VOCAB, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 64, **kw}
    ),
}


def tiny_config(model_type: str, **overrides):
    """The tiny config of ``model_type`` (the one copy the tests use), with ``overrides`` (e.g. ``vocab_size``)."""
    return CONFIGS[model_type](**overrides)


def tiny(model_type: str, seed: int = 0, **overrides):
    """The tiny random ``model_type`` model (config overrides, e.g. ``head_dim``, as in :func:`tiny_config`)."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(model_type, **overrides), attn_implementation="sdpa").eval()
    with torch.no_grad():  # non-trivial norm gains, so the q/k norms are really exercised
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def ids(b: int = 2, t: int = 12, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (b, t), generator=torch.Generator().manual_seed(seed))
