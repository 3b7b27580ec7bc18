"""Differential attention through transformers' attention interface (``ALL_ATTENTION_FUNCTIONS``), docs/methods.md §0.

Where both maps of a pair read the same keys (DIFF V2, DAA, DiffQ; the table of docs/methods.md §0.1), the two maps
are one ordinary attention over 2H query heads laid out in pairs (head 2i is map 1 of output head i, head 2i + 1 its
map 2) against the H_kv key/value heads: grouped-query attention with twice the group size, so a pair always reads
the same key/value head. Such a module can therefore call whatever implementation transformers offers (eager, sdpa,
flex_attention, flash_attention_2/3, or one a user registers), once per layer and with the mask transformers
prepared for that implementation, and subtract the pairs afterwards (DIFF Eq. 1):

    O_i = O_{2i} − λ_i · O_{2i+1}        in float32, rounded to the model's dtype once (docs/methods.md §0.2)

Our fused two-map op (:func:`diffattn.ops.diff_attention`; backend ``auto``: the Triton kernel on CUDA) is registered
under the name :data:`FUSED` (``attn_implementation="diffattn"``) with sdpa's mask format, which is the format the op
reads. A differential module whose config names it calls the op itself (the subtraction inside the kernel); an
ordinary attention module cannot use it and says so. Registration (:func:`register_fused_attention`) runs with the
Auto-class registration (:mod:`diffattn.hf_auto`): it adds a name and changes nothing transformers already had.
"""

from __future__ import annotations

import torch
from torch import nn

from ..ops import interleaved_pair
from ..ops.observe import observing
from ..ops.quantized import logit_bits

FUSED = "diffattn"  # attn_implementation name of diffattn's fused two-map op
_registered = False


def visible_keys(q_len: int, attention_mask, *tensors):
    """K, V (tensors with keys on dim 2) cut to what transformers means them to be: with no mask and 1 < T < S it
    relies on SDPA's ``is_causal``, which aligns the causal block top-left (query i sees keys 0..i), so keys from T on
    are never attended — a static cache's empty slots at prefill. diffattn's op aligns a causal block bottom-right
    (decoding against a cache), so those keys are cut off here: views, no copy. (With a cache already holding
    tokens, transformers always passes a mask, and nothing is cut.)"""
    if attention_mask is None and 1 < q_len < tensors[0].shape[2]:
        return tuple(t[:, :, :q_len] if t is not None else None for t in tensors)
    return tensors


# the config fields of attention-probability dropout (Llama-likes, GPT-2): diffattn's two-map op has none
ATTENTION_DROPOUT = ("attention_dropout", "attn_pdrop")


def dropout_not_applied(config) -> list[str]:
    """``config.<field>=<p>`` for every attention-probability dropout ``config`` asks for (p > 0), which a module
    computing through diffattn's op does not apply (docs/methods.md §7): said once where such a module is built."""
    return [
        f"config.{k}={p}"
        for k in ATTENTION_DROPOUT
        if isinstance(p := getattr(config, k, 0), (int, float)) and not isinstance(p, bool) and p > 0
    ]


def _fused_is_for_differential_modules(module: nn.Module, *args, **kwargs):
    raise ValueError(
        f"attn_implementation={FUSED!r} is diffattn's fused two-map kernel, used by differential attention modules; "
        f"{type(module).__name__} computes ordinary attention: use 'sdpa' (or another implementation) for it"
    )


def register_fused_attention() -> None:
    """Make ``attn_implementation="diffattn"`` a name transformers accepts, with sdpa's mask (once)."""
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(FUSED, _fused_is_for_differential_modules)
    AttentionMaskInterface.register(FUSED, sdpa_mask)
    _registered = True


def uses_fused_op(config) -> bool:
    """Whether a differential module with this config computes through diffattn's own op (the fused kernel, and
    the analysis hooks of :mod:`diffattn.eval.capture` and :mod:`diffattn.ops.quantized`, which need both maps)."""
    return config._attn_implementation == FUSED or observing() or logit_bits() is not None


def _implementation(module: nn.Module):
    """The attention function ``module.config`` names, as transformers' own modules look it up (eager by default)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.models.llama.modeling_llama import eager_attention_forward

    return ALL_ATTENTION_FUNCTIONS.get_interface(module.config._attn_implementation, eager_attention_forward)


class _PairedHeads:
    """The module as the attention implementation sees it: itself, but with the GQA group size of the query heads
    it is called with — the 2H pair-interleaved heads of a two-map call, or a wrapped base's own heads
    (implementations repeat or group key/value heads by ``num_key_value_groups``)."""

    def __init__(self, module: nn.Module, groups: int):
        self._module = module
        self.num_key_value_groups = groups

    def __getattr__(self, name):
        return getattr(self._module, name)


def _per_output_head(lam: torch.Tensor, batch: int, heads: int, length: int) -> torch.Tensor:
    """λ as a float32 [B, T, H, 1] tensor (the layout the implementations return) from a scalar, [H] or [B, H, T]."""
    lam = lam.to(torch.float32)
    if lam.ndim == 0:
        return lam.expand(batch, length, heads).unsqueeze(-1)
    if lam.ndim == 1:
        return lam.view(1, 1, heads, 1).expand(batch, length, heads, 1)
    return lam.transpose(1, 2).unsqueeze(-1)  # [B, H, T] -> [B, T, H, 1]


def paired_attention(
    module: nn.Module,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lam: torch.Tensor,
    attention_mask,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Both maps in one call of the config's attention implementation: q [B, 2H, T, d] (pairs interleaved), k, v
    [B, Hkv, S, d], λ a scalar, [H] or [B, H, T] → (out [B, T, H, d] in q's dtype, the implementation's weights:
    [B, 2H, T, S] with the pairs interleaved when it returns them, as eager does)."""
    batch, two_heads, length = q.shape[:3]
    heads = two_heads // 2
    interface = _implementation(module)
    view = _PairedHeads(module, two_heads // k.shape[1])
    both, weights = interface(view, q, k, v, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    both = both.float()  # [B, T, 2H, d]
    o1, o2 = interleaved_pair(both, 2)
    out = o1 - _per_output_head(lam, batch, heads, length) * o2
    return out.to(q.dtype), weights


def interface_attention(module: nn.Module, maps: dict, scaling: float) -> torch.Tensor:
    """An adapted layer's attention (the keyword arguments of :func:`diffattn.ops.diff_attention`, ``maps``) through
    ``module.config``'s attention implementation → [B, H, T, d]: one map as it is, two maps that read the same K as
    one call over pair-interleaved heads (:func:`paired_attention`). Two maps over different keys (DiffK, DiffLoRA)
    are two attentions with one mask each and need our op."""
    q, k, v, mask = maps["q1"], maps["k1"], maps["v"], maps["attn_mask"]
    if maps["q2"] is None:
        view = _PairedHeads(module, q.shape[1] // k.shape[1])
        out, _ = _implementation(module)(view, q, k, v, mask, dropout=0.0, scaling=scaling)
        return out.transpose(1, 2)
    if maps["k2"] is not k:
        raise ValueError(
            f"this adapter's two maps read different keys, which attn_implementation="
            f"{module.config._attn_implementation!r} cannot "
            f"compute in one call: use attn_implementation {FUSED!r} (diffattn's op), 'sdpa' or 'eager'"
        )
    pairs = torch.stack([q, maps["q2"]], dim=2).flatten(1, 2)  # [B, 2H, T, d]: head 2i map 1, 2i + 1 map 2
    out, _ = paired_attention(module, pairs, k, v, maps["lam"], mask, scaling)
    return out.transpose(1, 2)
