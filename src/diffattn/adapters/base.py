"""The adapter machinery shared by every method: the annealed λ(t), the attention wrapper, adapt/remove.

λ(t) is Dex Eq. 4 (methods.md §2, also used by DAA and DiffQ/K/V):

    λ(t) = (1 − α)·(t/T)·λ_init + α·λ_learn,      α = min(1, t/T)

so λ(0) = 0 (every such adapter starts as the identity), the annealed λ_init gives the new parameters a
learning signal while 0 < t < T, and the learnable λ_learn (one scalar per layer, initialised at 0) takes
over from t = T. ``set_adapter_step(model, t)`` moves t; the trainer's callback calls it every step.

The wrapper replaces an attention module *instance* (PEFT-style; no transformers class is patched), keeps
the original as ``base_attn``, reaches Q/K/V/O through the model-type table, and hands the per-head
attention output to the method. ``remove_adapter`` puts the original module back.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .model_types import ModelTypeSpec, attention_modules, get_spec, logit_scale, project_output, project_qkv

logger = logging.getLogger(__name__)


def lambda_init_for_layer(layer_idx: int, schedule: str | float) -> float:
    """The DIFF λ_init schedule 0.8 − 0.6·exp(−0.3·layer_idx), or a constant."""
    if schedule == "exponential":
        return 0.8 - 0.6 * math.exp(-0.3 * layer_idx)
    return float(schedule)


class AdapterState:
    """The training step t, shared by every wrapper of one model."""

    def __init__(self, anneal_steps: int | None):
        self.step = 0
        self.anneal_steps = anneal_steps


class AnnealedLambda(nn.Module):
    """λ(t) of Dex Eq. 4 for one layer: fixed λ_init, learnable ``lambda_learn`` (float32, init 0)."""

    def __init__(self, lambda_init: float, state: AdapterState, anneal: bool = True):
        super().__init__()
        self.lambda_init = lambda_init
        self.state = state
        self.anneal = anneal
        self.lambda_learn = nn.Parameter(torch.zeros((), dtype=torch.float32))

    def forward(self) -> torch.Tensor:
        if not self.anneal:  # ablation: λ = λ_learn from the start
            return self.lambda_learn
        t, total = self.state.step, self.state.anneal_steps
        if total is None:
            if t == 0:  # λ(0) = 0 whatever T is
                return self.lambda_learn * 0.0
            raise ValueError("the adapter's anneal_steps (T of Dex Eq. 4) is not set; give it in the config")
        alpha = min(1.0, t / total)
        return (1.0 - alpha) * (t / total) * self.lambda_init + alpha * self.lambda_learn


def _call_args(spec: ModelTypeSpec, args: tuple, kwargs: dict):
    """(position_embeddings, attention_mask, past_key_values) from whatever the decoder layer passed."""
    if spec.call_style == "gpt2":
        names = ("past_key_values", "attention_mask")
        got = {**dict(zip(names, args, strict=False)), **kwargs}
        return None, got.get("attention_mask"), got.get("past_key_values")
    names = ("position_embeddings", "attention_mask", "past_key_values")
    got = {**dict(zip(names, args, strict=False)), **kwargs}
    return got.get("position_embeddings"), got.get("attention_mask"), got.get("past_key_values")


def _self_attention_cache(cache):
    return getattr(cache, "self_attention_cache", cache)  # GPT-2 may hand an EncoderDecoderCache


class AdaptedAttention(nn.Module):
    """Wraps one attention module; ``method`` turns per-head outputs O [B, H, T, d] into O' (e.g. Dex)."""

    def __init__(self, base_attn: nn.Module, spec: ModelTypeSpec, layer_idx: int, method: nn.Module):
        super().__init__()
        self.base_attn = base_attn
        self.spec = spec
        self.layer_idx = layer_idx
        self.method = method

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs):
        spec, base = self.spec, self.base_attn
        position_embeddings, mask, cache = _call_args(spec, args, kwargs)
        q, k, v = project_qkv(spec, base, hidden_states, position_embeddings)  # [B, H|Hkv, T, d]
        if cache is not None:
            k, v = _self_attention_cache(cache).update(k, v, self.layer_idx)
        if mask is not None and not isinstance(mask, torch.Tensor):
            raise ValueError(
                f"adapters need a tensor attention mask (attn_implementation 'sdpa' or 'eager'); got "
                f"{type(mask).__name__}"
            )
        t = q.shape[2]
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=mask is None and t > 1 and t == k.shape[2],
            scale=logit_scale(base),
            enable_gqa=q.shape[1] != k.shape[1],
        )  # [B, H, T, d]; with a cache and T > 1, transformers always passes a mask
        out = self.method(out)
        return project_output(spec, base, out), None


@dataclass
class AdapterInfo:
    method: str
    config: object
    state: AdapterState
    fingerprint: str  # of the base model when the adapter was created (see io.base_fingerprint)


def wrap_attention(model: nn.Module, make_method, config, method_name: str, anneal_steps: int | None):
    """Replace every attention module with an :class:`AdaptedAttention` built by ``make_method(layer_idx, attn)``."""
    spec = get_spec(model)
    if getattr(model, "_diffattn_adapter", None) is not None:
        raise ValueError("this model already has an adapter; remove_adapter(model) first")
    if getattr(model.config, "attn_logit_softcapping", None):
        raise ValueError(
            "attention logit soft-capping (config.attn_logit_softcapping) is not supported by the "
            "adapters yet; the recomputed attention would silently differ from the model's"
        )
    if model.config._attn_implementation not in ("sdpa", "eager"):
        model.set_attn_implementation("sdpa")
    from .io import base_fingerprint

    fingerprint = base_fingerprint(model)
    state = AdapterState(anneal_steps)
    for layer_idx, layer, attn in attention_modules(model, spec):
        method = make_method(layer_idx, attn, state)
        setattr(layer, spec.attention, AdaptedAttention(attn, spec, layer_idx, method))
    model._diffattn_adapter = AdapterInfo(method_name, config, state, fingerprint)
    return model


def set_adapter_step(model: nn.Module, step: int) -> None:
    """Set the training step t of λ(t) (Dex Eq. 4) for every adapted layer."""
    info = getattr(model, "_diffattn_adapter", None)
    if info is None:
        raise ValueError("set_adapter_step: this model has no diffattn adapter")
    info.state.step = int(step)


def remove_adapter(model: nn.Module) -> nn.Module:
    """Put the original attention modules back (adapter parameters are dropped; base weights the method
    trained, e.g. Dex's W_K/W_V/W_O, keep their trained values)."""
    info = getattr(model, "_diffattn_adapter", None)
    if info is None:
        raise ValueError("remove_adapter: this model has no diffattn adapter")
    spec = get_spec(model)
    for _, layer, attn in attention_modules(model, spec):
        if isinstance(attn, AdaptedAttention):
            setattr(layer, spec.attention, attn.base_attn)
    model._diffattn_adapter = None
    return model
