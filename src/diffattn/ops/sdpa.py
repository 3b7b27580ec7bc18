"""Two-map attention on PyTorch's fused ``scaled_dot_product_attention`` (methods.md §0, DIFF Eq. 1).

Arrangement, chosen by measurement (see ``benchmarks/attention.py``):

* Both maps go through **one** SDPA call: the query heads of the two maps are stacked along the head axis
  ([Q1; Q2] over [K1; K2], V shared), so GQA grouping is preserved and the kernel launches once.
* PyTorch's fused CPU kernel (and FlashAttention on CUDA) needs the value width to equal the query/key
  width; with DIFF V1's V of width 2d the call silently drops to the unfused math kernel, which
  materialises the [T, S] score matrix. We therefore **zero-pad Q and K to the value width** (the scale
  stays 1/sqrt(d), passed explicitly), which leaves Q·Kᵀ unchanged and keeps the fused kernel. On a
  2-core CPU at N = 2048, d = 64, forward+backward: padded 1.86× the same-size baseline, the four-call
  route (one call per map and V half) 2.2×, the unfused math kernel 2.75×.
* λ and the subtraction ``O1 − λ·O2`` are done in float32 (methods.md), gradients come from autograd
  through SDPA's fused backward.

No [T, S]-sized tensor is allocated for causal self-attention (T = S) without an extra mask. With a
padding mask, or a causal block with 1 < T < S, a boolean mask of [B, 1, T, S] / [T, S] is built, as
transformers itself does for SDPA.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._inputs import DiffAttentionInputs, causal_keep_mask


def _sdpa_mask(inp: DiffAttentionInputs) -> tuple[torch.Tensor | None, bool]:
    """The (attn_mask, is_causal) pair for the stacked call: is_causal when it is exact, else a mask."""
    t, s = inp.q_len, inp.kv_len
    mask = inp.attn_mask
    if mask is not None and mask.shape[1] != 1:
        mask = torch.cat([mask, mask], dim=1)  # per-head mask follows the stacked [map 1; map 2] heads
    if not inp.causal or t == 1:
        # T == 1 with bottom-right alignment sees every key: no causal mask needed
        return mask, False
    if mask is None and t == s:
        return None, True
    keep = causal_keep_mask(t, s, inp.q1.device)
    if mask is None:
        return keep, False
    if mask.dtype == torch.bool:
        return mask & keep, False
    return mask.masked_fill(~keep, float("-inf")), False


def diff_attention_sdpa(inp: DiffAttentionInputs) -> torch.Tensor:
    h, d, dv = inp.num_heads, inp.head_dim, inp.v_dim
    width = max(d, dv)
    q = torch.cat([inp.q1, inp.q2], dim=1)  # [B, 2H, T, d]
    k = torch.cat([inp.k1, inp.k2], dim=1)  # [B, 2Hkv, S, d]
    v = torch.cat([inp.v, inp.v], dim=1)  # [B, 2Hkv, S, dv]
    if d < width:
        q = F.pad(q, (0, width - d))
        k = F.pad(k, (0, width - d))
    elif dv < width:
        v = F.pad(v, (0, width - dv))
    mask, is_causal = _sdpa_mask(inp)
    o = F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=mask,
        is_causal=is_causal,
        scale=inp.scale,
        enable_gqa=inp.num_heads != inp.num_kv_heads,
    )  # [B, 2H, T, width]
    if dv < width:
        o = o[..., :dv]
    o1, o2 = o[:, :h], o[:, h:]
    acc = torch.promote_types(o.dtype, torch.float32)  # fp32 subtraction; fp64 stays fp64
    out = o1.to(acc) - inp.lam.to(acc) * o2.to(acc)
    return out.to(inp.q1.dtype)
