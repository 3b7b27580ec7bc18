"""The model-type table: for every supported architecture (tiny random configs built here), attention recomputed
through the table and the two-map primitive with λ = 0 reproduces each attention module's own output."""

from __future__ import annotations

import pytest
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

from diffattn.adapters.model_types import (
    MODEL_TYPES,
    attention_modules,
    get_spec,
    head_layout,
    logit_scale,
    project_output,
    project_qkv,
)
from diffattn.ops import diff_attention

_COMMON = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)

CONFIGS = {
    "llama": lambda: LlamaConfig(**_COMMON),
    "mistral": lambda: MistralConfig(**_COMMON, sliding_window=32),
    "qwen2": lambda: Qwen2Config(**_COMMON),
    "qwen3": lambda: Qwen3Config(**_COMMON, head_dim=16),
    "gemma3_text": lambda: Gemma3TextConfig(**_COMMON, head_dim=16, sliding_window=32, query_pre_attn_scalar=24),
    "gpt2": lambda: GPT2Config(vocab_size=96, n_embd=64, n_layer=2, n_head=4, n_positions=64),
}


def test_every_table_entry_has_a_test_config():
    assert set(CONFIGS) == set(MODEL_TYPES)


def tiny(model_type: str):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(CONFIGS[model_type](), attn_implementation="sdpa").eval()
    with torch.no_grad():  # non-trivial norm gains, so the q/k norms are really exercised
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


@pytest.mark.parametrize("model_type", list(CONFIGS))
def test_table_recomputes_every_attention_module_exactly(model_type):
    model = tiny(model_type)
    spec = get_spec(model)
    modules = attention_modules(model)
    assert len(modules) == 2
    calls = {}

    def capture(idx):
        def hook(module, args, kwargs, output):
            calls[idx] = (args, kwargs, output[0])

        return hook

    handles = [m.register_forward_hook(capture(i), with_kwargs=True) for i, _, m in modules]
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model(ids)
    for h in handles:
        h.remove()
    for idx, _, attn in modules:
        args, kwargs, want = calls[idx]
        hidden = args[0] if args else kwargs["hidden_states"]
        pos = kwargs.get("position_embeddings") if spec.rope else None
        with torch.no_grad():
            q, k, v = project_qkv(spec, attn, hidden, pos)
            layout = head_layout(attn)
            assert q.shape[1] == layout.num_heads and k.shape[1] == layout.num_kv_heads
            # plain attention = the two-map op with λ = 0 (the identity every adapter starts from)
            out = diff_attention(q, k, q, k, v, 0.0, scale=logit_scale(attn))
            got = project_output(spec, attn, out)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_unsupported_model_type_lists_the_supported_ones():
    with pytest.raises(ValueError, match="unsupported model type 'bert'; supported: llama, mistral, qwen2, qwen3"):
        get_spec(type("Cfg", (), {"model_type": "bert"})())
