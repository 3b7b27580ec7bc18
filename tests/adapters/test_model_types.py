"""The model-type table: for every supported architecture (tiny random configs built here), attention recomputed
through the table and the two-map primitive with λ = 0 reproduces each attention module's own output."""

from __future__ import annotations

import pytest
import torch

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

from ..tiny_models import CONFIGS, tiny


def test_every_table_entry_has_a_test_config():
    assert set(CONFIGS) == set(MODEL_TYPES)


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
