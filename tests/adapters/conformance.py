"""The conformance checks every registered adapter method must pass, whatever its equations: what the library's one
API promises of any entry of the method registry (:mod:`diffattn.adapters.registry`).

* **identity at init** (where the entry claims it, ``MethodSpec.identity_at_init``): the adapted model's logits
  equal its base's before any training (docs/methods.md §2.2: λ(0) = 0 for the λ(t) methods);
* **cache**: token-by-token decoding with a KV cache equals the full forward, with the method active (its
  parameters moved off their initial values, t past 0);
* **save/load**: :func:`diffattn.save_adapter` then :func:`diffattn.load_adapter` into a fresh base gives the same
  logits bit for bit;
* **merge or refuse**: a mergeable method folds into a plain model of the base architecture with the same logits;
  any other refuses with ``NotImplementedError`` saying why and leaves the model adapted.

Each check takes a method name and builds the method's options the way ``diffattn adapt`` does
(:meth:`diffattn.train.adapt_config.AdaptRunConfig.method_config`: defaults, T of Dex Eq. 4 from the run's length),
so a method is checked with the options a user gets. ``tests/adapters/test_conformance.py`` runs them over every
registered method; a test that registers a toy method runs them on it (``tests/adapters/test_toy_method.py``).
"""

from __future__ import annotations

import pytest
import torch
from transformers import StaticCache

from diffattn.adapters import (
    AdaptedAttention,
    adapt,
    attention_modules,
    get_method,
    load_adapter,
    merge_adapter,
    save_adapter,
    set_adapter_step,
    trainable_parameters,
)
from diffattn.train.adapt_config import AdaptMethodSection, AdaptRunConfig

from ..helpers import decode_token_by_token
from ..tiny_models import ids, tiny

ATOL = 1e-5
RUN_STEPS = 20  # the run length the options are resolved for (T of Dex Eq. 4 = 10)


def method_config(name: str):
    """The method's options as ``diffattn adapt --method NAME --max-steps 20`` resolves them."""
    config = AdaptRunConfig(method=AdaptMethodSection(name=name))
    config.train.max_steps = RUN_STEPS
    return config.validate().method_config()


def adapted(name: str, model_type: str) -> torch.nn.Module:
    """A tiny model of ``model_type`` with the method's default options (calibration batches if it needs them)."""
    config = method_config(name)
    calibration = [ids(b=2, t=16)] if get_method(name).needs_calibration(config) else None
    return adapt(tiny(model_type), config, calibration)


def activate(model: torch.nn.Module, step: int = 5, seed: int = 0, scale: float = 0.05) -> None:
    """Move every parameter the method added off its initial value (so no check passes because a new weight is zero
    or the identity) and t past 0 (λ(t) ≠ 0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".method." in n:
                p.add_(scale * torch.randn(p.shape, generator=g).to(p.dtype))
                if n.endswith("lambda_learn"):
                    p.fill_(0.3)
    set_adapter_step(model, step)


def check_identity_at_init(name: str, model_type: str) -> None:
    if not get_method(name).identity_at_init:
        pytest.skip(f"{name} does not claim the identity at init (MethodSpec.identity_at_init)")
    x = ids()
    with torch.no_grad():
        want = tiny(model_type)(x).logits
        got = adapted(name, model_type)(x).logits
    torch.testing.assert_close(got, want, atol=ATOL, rtol=ATOL)


def check_cache(name: str, model_type: str) -> None:
    model = adapted(name, model_type)
    activate(model)
    x = ids(t=9)
    with torch.no_grad():
        full = model(x).logits
        steps, _ = decode_token_by_token(model, x, prefill=4)
        # a static cache longer than the text: its empty slots must stay unseen at prefill (no mask comes with it)
        static = StaticCache(config=model.config, max_cache_len=x.shape[1] + 3)
        static_steps, _ = decode_token_by_token(model, x, prefill=4, cache=static)
        plain = tiny(model_type)(x).logits
    torch.testing.assert_close(steps, full, atol=ATOL, rtol=ATOL)
    torch.testing.assert_close(static_steps, full, atol=ATOL, rtol=ATOL)
    assert (full - plain).abs().max() > 1e-3  # the method really is active


def check_save_load(name: str, model_type: str, folder) -> None:
    model = adapted(name, model_type)
    trainable_parameters(model)
    activate(model, step=3, seed=2)
    with torch.no_grad():  # the base weights a method trains move too (DAA, DiffQ/K/V: W_Q…W_O; Dex: W_K, W_V, W_O)
        for n, p in model.named_parameters():
            if p.requires_grad and "base_attn" in n:
                p.mul_(1.1)
    save_adapter(model, folder)
    fresh = load_adapter(tiny(model_type), folder)
    x = ids()
    with torch.no_grad():
        torch.testing.assert_close(fresh(x).logits, model(x).logits, atol=0, rtol=0)


def check_merge_or_refuse(name: str, model_type: str) -> None:
    spec = get_method(name)
    base = tiny(model_type)
    keys = set(base.state_dict())
    classes = [type(m) for _, _, m in attention_modules(base)]
    config = method_config(name)
    calibration = [ids(b=2, t=16)] if spec.needs_calibration(config) else None
    model = adapt(base, config, calibration)
    activate(model, step=7, seed=3)
    x = ids()
    if not spec.mergeable:
        with pytest.raises(NotImplementedError, match=f"{name} cannot be merged: {spec.why_not_mergeable}"):
            merge_adapter(model)
        assert all(isinstance(m, AdaptedAttention) for _, _, m in attention_modules(model))
        return
    with torch.no_grad():
        unmerged = model(x).logits
        merged_model = merge_adapter(model)
        merged = merged_model(x).logits
    torch.testing.assert_close(merged, unmerged, atol=ATOL, rtol=ATOL)
    assert set(merged_model.state_dict()) == keys  # a plain model of the base architecture
    assert [type(m) for _, _, m in attention_modules(merged_model)] == classes


def run_every_check(name: str, model_type: str, tmp_path) -> None:
    """All four checks on one method and model type (a toy method's test calls this)."""
    if get_method(name).identity_at_init:
        check_identity_at_init(name, model_type)
    check_cache(name, model_type)
    check_save_load(name, model_type, tmp_path / f"{name}-{model_type}")
    check_merge_or_refuse(name, model_type)
