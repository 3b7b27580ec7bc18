"""One way to reach attention, per architecture: where the attention modules are and how to get Q/K/V/O.

Every method that changes attention on a pretrained model (Dex, DAA, DiffQ/K/V, DiffLoRA; docs/methods.md §2–4)
needs the same few things from an attention module: its query/key/value projections (after the q/k norms
and RoPE the architecture applies), its logit scale, and its output projection. This table, keyed by
``config.model_type``, says where those are, in the manner of PEFT's target-module tables, so that adapters
never patch a transformers class and never special-case an architecture in their own code.

Supported: ``llama``, ``mistral``, ``qwen2``, ``qwen3``, ``gemma3_text`` (Llama layout; Qwen3 and Gemma3 add
per-head q/k RMSNorm before RoPE) and ``gpt2`` (fused ``c_attn`` Conv1D producing [Q | K | V], ``c_proj``,
learned absolute positions, so no RoPE).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class ModelTypeSpec:
    model_type: str
    layers: str  # dotted path from the *ForCausalLM model to the list of decoder layers
    attention: str  # attribute of a decoder layer holding its self-attention module
    q_proj: str | None  # separate projections (None where fused)
    k_proj: str | None
    v_proj: str | None
    fused_qkv: str | None  # one projection whose output is [Q | K | V] along the last dim (GPT-2)
    o_proj: str
    q_norm: str | None = None  # per-head norms applied to [B, T, H, d] before RoPE
    k_norm: str | None = None
    rope: bool = True  # RoPE applied to q and k from the layer's position_embeddings (cos, sin)
    output_dropout: str | None = None  # dropout after o_proj inside the attention module (GPT-2)
    call_style: str = "llama"  # llama: (hidden_states, position_embeddings, attention_mask, past_key_values)
    #                            gpt2:  (hidden_states, past_key_values, attention_mask)


_LLAMA_LIKE = dict(
    layers="model.layers",
    attention="self_attn",
    q_proj="q_proj",
    k_proj="k_proj",
    v_proj="v_proj",
    fused_qkv=None,
    o_proj="o_proj",
)

MODEL_TYPES: dict[str, ModelTypeSpec] = {
    "llama": ModelTypeSpec("llama", **_LLAMA_LIKE),
    "mistral": ModelTypeSpec("mistral", **_LLAMA_LIKE),
    "qwen2": ModelTypeSpec("qwen2", **_LLAMA_LIKE),
    "qwen3": ModelTypeSpec("qwen3", **_LLAMA_LIKE, q_norm="q_norm", k_norm="k_norm"),
    "gemma3_text": ModelTypeSpec("gemma3_text", **_LLAMA_LIKE, q_norm="q_norm", k_norm="k_norm"),
    "gpt2": ModelTypeSpec(
        "gpt2",
        layers="transformer.h",
        attention="attn",
        q_proj=None,
        k_proj=None,
        v_proj=None,
        fused_qkv="c_attn",
        o_proj="c_proj",
        rope=False,
        output_dropout="resid_dropout",
        call_style="gpt2",
    ),
}

# where each model type's own rotate-half RoPE function lives (we call the architecture's, never a copy)
_ROPE_MODULE = {
    "llama": "transformers.models.llama.modeling_llama",
    "mistral": "transformers.models.mistral.modeling_mistral",
    "qwen2": "transformers.models.qwen2.modeling_qwen2",
    "qwen3": "transformers.models.qwen3.modeling_qwen3",
    "gemma3_text": "transformers.models.gemma3.modeling_gemma3",
}


def get_spec(model_or_config) -> ModelTypeSpec:
    """The table entry of a model (or config); a clear error listing the supported types otherwise."""
    config = getattr(model_or_config, "config", model_or_config)
    model_type = getattr(config, "model_type", None)
    if model_type not in MODEL_TYPES:
        raise ValueError(f"unsupported model type {model_type!r}; supported: {', '.join(MODEL_TYPES)}")
    return MODEL_TYPES[model_type]


def attention_modules(model: nn.Module, spec: ModelTypeSpec | None = None) -> list[tuple[int, nn.Module, nn.Module]]:
    """``(layer_idx, decoder_layer, attention_module)`` for every layer, in order."""
    spec = spec or get_spec(model)
    layers = model.get_submodule(spec.layers)
    return [(i, layer, getattr(layer, spec.attention)) for i, layer in enumerate(layers)]


@dataclass(frozen=True)
class HeadLayout:
    num_heads: int
    num_kv_heads: int
    head_dim: int


def head_layout(attn: nn.Module) -> HeadLayout:
    config = attn.config
    h = config.num_attention_heads if hasattr(config, "num_attention_heads") else config.n_head
    hkv = getattr(config, "num_key_value_heads", None) or h
    return HeadLayout(h, hkv, attn.head_dim)


def logit_scale(attn: nn.Module) -> float:
    """The scale of Q·Kᵀ the architecture uses (1/sqrt(d), or Gemma3's query_pre_attn_scalar^-0.5)."""
    return float(attn.scaling)


def linear_part(spec: ModelTypeSpec, attn: nn.Module, x: torch.Tensor, part: str) -> torch.Tensor:
    """The raw linear output ``[B, T, heads·d]`` of one projection, ``part`` in ``q``, ``k``, ``v`` (for GPT-2's
    fused ``c_attn`` only that part's columns are computed)."""
    if spec.fused_qkv is None:
        return getattr(attn, {"q": spec.q_proj, "k": spec.k_proj, "v": spec.v_proj}[part])(x)
    conv = getattr(attn, spec.fused_qkv)  # Conv1D: y = x W + b, W [d_model, 3·H·d]
    width = head_layout(attn).num_heads * head_layout(attn).head_dim
    cols = slice("qkv".index(part) * width, ("qkv".index(part) + 1) * width)
    return torch.addmm(conv.bias[cols], x.reshape(-1, x.shape[-1]), conv.weight[:, cols]).view(*x.shape[:-1], width)


def projection_weights(spec: ModelTypeSpec, attn: nn.Module, part: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One projection's own parameters as ``(W [heads·d, d_model], b or None)``, ``part`` in ``q``, ``k``, ``v``:
    read, not probed (running the layer on an identity rounds W + b in the model's dtype: a bf16 copy of a biased
    query was off by |b|·2⁻⁹). Views of the base's parameters: copy before changing them."""
    if spec.fused_qkv is None:
        linear = getattr(attn, {"q": spec.q_proj, "k": spec.k_proj, "v": spec.v_proj}[part])
        return linear.weight, linear.bias
    conv = getattr(attn, spec.fused_qkv)  # Conv1D: W [d_model, 3·H·d]
    width = head_layout(attn).num_heads * head_layout(attn).head_dim
    cols = slice("qkv".index(part) * width, ("qkv".index(part) + 1) * width)
    return conv.weight[:, cols].T, None if conv.bias is None else conv.bias[cols]


def linear_qkv(
    spec: ModelTypeSpec, attn: nn.Module, x: torch.Tensor, value_x: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Raw linear outputs ``[B, T, ·]`` of Q, K and V (V from ``value_x`` when given: DiffV)."""
    if spec.fused_qkv is not None and value_x is None:  # one fused matmul, as the module does
        width = head_layout(attn).num_heads * head_layout(attn).head_dim
        q, k, v = getattr(attn, spec.fused_qkv)(x).split(width, dim=2)
        return q, k, v
    v = linear_part(spec, attn, x if value_x is None else value_x, "v")
    return linear_part(spec, attn, x, "q"), linear_part(spec, attn, x, "k"), v


def to_heads(spec: ModelTypeSpec, attn: nn.Module, raw: torch.Tensor, part: str) -> torch.Tensor:
    """``[B, T, heads·d]`` → ``[B, heads, T, d]`` with the architecture's per-head q/k norm (before RoPE)."""
    bsz, t = raw.shape[:2]
    heads = raw.view(bsz, t, -1, head_layout(attn).head_dim)
    norm = {"q": spec.q_norm, "k": spec.k_norm}.get(part)
    if norm is not None:
        heads = getattr(attn, norm)(heads)
    return heads.transpose(1, 2)


def rope(spec: ModelTypeSpec, q: torch.Tensor, k: torch.Tensor, position_embeddings) -> tuple[torch.Tensor, ...]:
    """RoPE on ``[B, heads, T, d]`` queries and keys (a no-op for GPT-2)."""
    if not spec.rope:
        return q, k
    if position_embeddings is None:
        raise ValueError(f"{spec.model_type} applies RoPE: position_embeddings (cos, sin) are required")
    cos, sin = position_embeddings
    return apply_rope(spec, q, k, cos, sin)


def project_qkv(
    spec: ModelTypeSpec,
    attn: nn.Module,
    hidden_states: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
    value_hidden: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q ``[B, H, T, d]``, K and V ``[B, Hkv, T, d]`` exactly as the module computes them (norms, RoPE),
    before any KV cache. ``value_hidden``: a different input for the value projection only (DiffV)."""
    q, k, v = linear_qkv(spec, attn, hidden_states, value_hidden)
    q, k = rope(spec, to_heads(spec, attn, q, "q"), to_heads(spec, attn, k, "k"), position_embeddings)
    return q, k, to_heads(spec, attn, v, "v")


#: model type → its ``apply_rotary_pos_emb``, imported once (:func:`rope_function`)
_ROPE_FUNCTIONS: dict[str, object] = {}


def rope_function(model_type: str):
    """The architecture's own ``apply_rotary_pos_emb``, imported on first use and kept. Why kept: torch.compile does
    not trace ``importlib.import_module`` (a graph break in every adapted layer, an error under ``fullgraph``), but
    reads a filled dict; the adapted layer asks once when it is built
    (:class:`diffattn.adapters.base.AdaptedAttention`), outside any trace."""
    fn = _ROPE_FUNCTIONS.get(model_type)
    if fn is None:
        fn = _ROPE_FUNCTIONS[model_type] = importlib.import_module(_ROPE_MODULE[model_type]).apply_rotary_pos_emb
    return fn


def apply_rope(spec: ModelTypeSpec, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """The architecture's own ``apply_rotary_pos_emb`` (q, k as ``[B, heads, T, d]``)."""
    return rope_function(spec.model_type)(q, k, cos, sin)


def project_output(spec: ModelTypeSpec, attn: nn.Module, out: torch.Tensor) -> torch.Tensor:
    """Heads ``[B, H, T, dv]`` → the module's output ``[B, T, d_model]`` (o_proj, and dropout where it has one)."""
    bsz, _, t, _ = out.shape
    merged = out.transpose(1, 2).reshape(bsz, t, -1)
    merged = getattr(attn, spec.o_proj)(merged)
    if spec.output_dropout is not None:
        merged = getattr(attn, spec.output_dropout)(merged)
    return merged


# -- inspection: what an attention module computed, for analysis hooks (diffattn.eval.capture, .outliers) ---------
def call_arguments(spec: ModelTypeSpec, args: tuple, kwargs: dict):
    """(position_embeddings, attention_mask, past_key_values) from whatever the decoder layer passed to the
    attention module (positional or keyword, per the architecture's call style). The KV cache's keyword is
    ``past_key_values`` up to transformers 5.23 and ``cache`` from 5.24."""
    if spec.call_style == "gpt2":
        names = ("past_key_values", "attention_mask")
        got = {**dict(zip(names, args, strict=False)), **kwargs}
        return None, got.get("attention_mask"), _cache_of(got)
    names = ("position_embeddings", "attention_mask", "past_key_values")
    got = {**dict(zip(names, args, strict=False)), **kwargs}
    return got.get("position_embeddings"), got.get("attention_mask"), _cache_of(got)


def _cache_of(got: dict):
    return got["cache"] if got.get("cache") is not None else got.get("past_key_values")


def self_attention_cache(cache):
    """The self-attention part of a KV cache (GPT-2 may hand an ``EncoderDecoderCache``)."""
    return getattr(cache, "self_attention_cache", cache)


@dataclass
class AttentionCall:
    """The inputs one call of a plain attention module attended with: Q ``[B, H, T, d]``, the full K and V
    ``[B, Hkv, S, d]`` (cached keys included), the mask (None: plain causality) and the logit scale."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    attn_mask: torch.Tensor | None
    scale: float

    @property
    def causal(self) -> bool:
        return self.attn_mask is None


def recompute_attention_call(spec: ModelTypeSpec, module: nn.Module, args: tuple, kwargs: dict) -> AttentionCall:
    """Recompute, in a forward hook (``register_forward_hook(..., with_kwargs=True)``) of a plain attention module,
    the Q, K, V it attended with. With a KV cache the forward already appended this call's keys, so the full keys
    and values are read back from the cache — except where the cache keeps fewer than the call attended: a sliding-
    window layer's cache keeps only its last window, while its first call (no keys before it) attended to all of its
    own, which are then the ones just projected."""
    hidden = args[0] if args else kwargs["hidden_states"]
    position_embeddings, mask, cache = call_arguments(spec, args[1:], kwargs)
    q, k, v = project_qkv(spec, module, hidden, position_embeddings)
    if cache is not None:
        entry = self_attention_cache(cache).layers[module.layer_idx]
        attended = mask.shape[-1] if isinstance(mask, torch.Tensor) and mask.dim() == 4 else None
        kept = entry.keys.shape[-2]
        if attended is None and kept < q.shape[2]:  # plain causality over this call alone: its own keys
            attended = k.shape[-2]
        if attended is None or kept == attended:
            k, v = entry.keys, entry.values
        elif k.shape[-2] != attended:
            raise ValueError(
                f"cannot recompute layer {module.layer_idx}'s attention: it attended to {attended} keys, its cache "
                f"keeps {kept} and this call projected {k.shape[-2]}"
            )
    return AttentionCall(q, k, v, mask, logit_scale(module))
