"""Reference two-map attention: the plain fp32 math of DIFF Transformer Eq. 1 (docs/methods.md §0).

    A1 = softmax(Q1 K1ᵀ·s + M),  A2 = softmax(Q2 K2ᵀ·s + M),  out = (A1 − λ·A2) V

Everything is computed in float32 (float64 stays float64, for gradcheck) and materialises the two
[B, H, T, S] maps, so it is slow and memory-hungry at long sequences: it is the ground truth the fast
backends are tested against, and the only backend that can hand the maps to analysis code
(:func:`diffattn.ops.diff_attention_maps`).

Which keys are masked, and what a row with every key masked gives, is the one rule stated in
:mod:`diffattn.ops._inputs` (its docstring) and followed by every backend: such a row (e.g. a left-padding query)
attends to nothing — both maps' rows, its output and the gradients it passes are 0, not NaN and not the mean of
V — matching PyTorch's fused SDPA kernels. Here the mask becomes one additive bias with every masked key at
``-inf`` (:func:`~diffattn.ops._inputs.mask_bias`), so such a row is all ``-inf``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ._inputs import DiffAttentionInputs, causal_keep_mask, mask_bias


class DiffAttentionMaps(NamedTuple):
    """Output of :func:`diffattn.ops.diff_attention_maps`; maps are float32 ``[B, H, T, S]``."""

    out: torch.Tensor  # [B, H, T, dv], in the input dtype
    attn1: torch.Tensor  # softmax(Q1 K1ᵀ·s + M)
    attn2: torch.Tensor  # softmax(Q2 K2ᵀ·s + M)
    signed: torch.Tensor  # attn1 − λ·attn2, the differential map that multiplies V
    lam: torch.Tensor  # λ as used: 0-d or [1, H, 1, 1]


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    # [B, Hkv, S, d] -> [B, Hkv * n_rep, S, d]; query head i reads key head i // n_rep
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


def additive_bias(inp: DiffAttentionInputs, dtype: torch.dtype) -> torch.Tensor | None:
    """The mask (causal and/or attn_mask) as one additive bias broadcastable to [B, H, T, S], every masked key
    (the rule of :mod:`diffattn.ops._inputs`) at ``-inf``: a fully masked row is a row of ``-inf``."""
    keep = causal_keep_mask(inp.q_len, inp.kv_len, inp.q1.device) if inp.causal else None
    bias = None
    if inp.attn_mask is not None:
        if inp.attn_mask.dtype == torch.bool:
            keep = inp.attn_mask if keep is None else keep & inp.attn_mask
        else:
            bias = mask_bias(inp.attn_mask, dtype)
    if keep is not None:
        keep_bias = mask_bias(keep, dtype)
        bias = keep_bias if bias is None else bias + keep_bias
    return bias


def _safe_softmax(scores: torch.Tensor) -> torch.Tensor:
    # A fully masked row is all -inf (additive_bias puts every masked key there): softmax would give NaN (and NaN
    # gradients). Define it as attending to nothing: neutral scores in, zeros out, so its gradient is zero too.
    fully_masked = torch.isneginf(scores).all(dim=-1, keepdim=True)
    probs = torch.softmax(scores.masked_fill(fully_masked, 0.0), dim=-1)
    return probs.masked_fill(fully_masked, 0.0)


def diff_attention_reference(inp: DiffAttentionInputs, *, return_maps: bool = False):
    compute = torch.promote_types(inp.q1.dtype, torch.float32)
    n_rep = inp.num_heads // inp.num_kv_heads
    q1, q2 = inp.q1.to(compute), inp.q2.to(compute)
    k1 = _repeat_kv(inp.k1.to(compute), n_rep)
    k2 = _repeat_kv(inp.k2.to(compute), n_rep)
    v = _repeat_kv(inp.v.to(compute), n_rep)
    lam = inp.lam.to(compute)
    bias = additive_bias(inp, compute)

    s1 = torch.matmul(q1, k1.transpose(-1, -2)) * inp.scale  # [B, H, T, S]
    s2 = torch.matmul(q2, k2.transpose(-1, -2)) * inp.scale
    if bias is not None:
        s1, s2 = s1 + bias, s2 + bias
    a1, a2 = _safe_softmax(s1), _safe_softmax(s2)
    signed = a1 - lam * a2
    out = torch.matmul(signed, v).to(inp.q1.dtype)  # [B, H, T, dv]
    if return_maps:
        return DiffAttentionMaps(out, a1, a2, signed, lam)
    return out


def output_through_maps(attn1: torch.Tensor, attn2: torch.Tensor, lam: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``(attn1 − λ·attn2)·V`` from the given map tensors ([B, H, T, S] each; ``lam`` as
    :class:`DiffAttentionMaps` holds it; v [B, Hkv, S, dv]) → [B, H, T, dv] in v's dtype. A layer that returns its
    maps (transformers' ``output_attentions``) computes its output through this from the very tensors it returns,
    so they are on the output's gradient path as eager attention's are (``retain_grad`` on them works)."""
    compute = torch.promote_types(v.dtype, torch.float32)
    values = _repeat_kv(v.to(compute), attn1.shape[1] // v.shape[1])
    signed = attn1.to(compute) - lam.to(compute) * attn2.to(compute)
    return torch.matmul(signed, values).to(v.dtype)
