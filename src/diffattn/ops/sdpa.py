"""Two-map attention on PyTorch's fused ``scaled_dot_product_attention`` (docs/methods.md §0, DIFF Eq. 1).

Arrangement, chosen by measurement (see ``benchmarks/attention.py``):

* Both maps go through **one** SDPA call: the query heads of the two maps are stacked along the head axis
  ([Q1; Q2] over [K1; K2], V shared), so GQA grouping is preserved and the kernel launches once.
* PyTorch's fused CPU kernel (and FlashAttention on CUDA) needs the value width to equal the query/key
  width; with DIFF V1's V of width 2d the call silently drops to the unfused math kernel, which
  materialises the [T, S] score matrix. We therefore **zero-pad Q and K to the value width** (the scale
  stays 1/sqrt(d), passed explicitly), which leaves Q·Kᵀ unchanged and keeps the fused kernel. On a
  2-core CPU at N = 2048, d = 64, forward+backward: padded 1.86× the same-size baseline, the four-call
  route (one call per map and V half) 2.2×, the unfused math kernel 2.75×.
* When both maps read the **same keys** (DIFF V2, docs/methods.md §5: the query heads of a pair share K and V),
  the query heads are interleaved instead and K, V are passed once: GQA pairs each query head with its key
  head, so no K/V copy is made and the call is an ordinary attention over 2H query heads.
* λ (a scalar, one per head, or DIFF V2's one per head and token) and the subtraction ``O1 − λ·O2`` are done
  in float32 (docs/methods.md §0.2), gradients come from autograd through SDPA's fused backward.

No [T, S]-sized tensor is allocated for causal self-attention (T = S) without an extra mask. With a
padding mask, or a causal block with 1 < T < S, a boolean mask of [B, 1, T, S] / [T, S] is built, as
transformers itself does for SDPA.

Fully masked rows follow the rule of :mod:`diffattn.ops._inputs`: with an ``attn_mask``, one reduction over it
finds the query rows whose every key is masked and their output is set to 0 after the call, so they pass no
gradient either. SDPA's own answer is not relied on: its fused CPU kernel gives a row of ``-inf`` 0, but a row of
additive ``finfo.min`` a uniform softmax (the mean of V, and gradients to match).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._inputs import DiffAttentionInputs, causal_keep_mask, fully_masked_rows


def _sdpa_mask(inp: DiffAttentionInputs, head_layout: str = "stacked") -> tuple[torch.Tensor | None, bool]:
    """The (attn_mask, is_causal) pair for the call over both maps' query heads — ``stacked`` [map 1; map 2]
    or ``interleaved`` (map 1, map 2 of head 0, then of head 1 …): is_causal when it is exact, else a mask."""
    t, s = inp.q_len, inp.kv_len
    mask = inp.attn_mask
    if mask is not None and mask.shape[1] != 1:  # a per-head mask follows the query heads' layout
        mask = torch.cat([mask, mask], dim=1) if head_layout == "stacked" else mask.repeat_interleave(2, dim=1)
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
    b, t = inp.batch, inp.q_len
    if inp.shares_keys:
        # K1 is K2 (DIFF V2): 2H interleaved query heads against the Hkv key/value heads, K and V passed once;
        # query heads 2i and 2i+1 (map 1 and map 2 of head i) both belong to key head i // (H/Hkv) under GQA
        layout = "interleaved"
        q = torch.stack([inp.q1, inp.q2], dim=2).reshape(b, 2 * h, t, d)
        k, v = inp.k1, inp.v
    else:
        layout = "stacked"
        q = torch.cat([inp.q1, inp.q2], dim=1)  # [B, 2H, T, d]
        k = torch.cat([inp.k1, inp.k2], dim=1)  # [B, 2Hkv, S, d]
        v = inp.v
        v = torch.cat([v, v], dim=1)  # [B, 2Hkv, S, dv]
    width = max(d, dv)
    if d < width:
        q = F.pad(q, (0, width - d))
        k = F.pad(k, (0, width - d))
    elif dv < width:
        v = F.pad(v, (0, width - dv))
    mask, is_causal = _sdpa_mask(inp, head_layout=layout)
    o = F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=mask,
        is_causal=is_causal,
        scale=inp.scale,
        enable_gqa=q.shape[1] != k.shape[1],
    )[..., :dv]  # [B, 2H, T, dv]
    if layout == "interleaved":
        o1, o2 = o.view(b, h, 2, t, dv).unbind(2)
    else:
        o1, o2 = o[:, :h], o[:, h:]
    acc = torch.promote_types(o.dtype, torch.float32)  # fp32 subtraction; fp64 stays fp64
    out = o1.to(acc) - inp.lam.to(acc) * o2.to(acc)
    fully = fully_masked_rows(inp)  # [B|1, H|1, T, 1], or None without an attn_mask
    if fully is not None:
        out = out.masked_fill(fully, 0.0)  # the row attends to nothing: zero output, zero gradient through it
    return out.to(inp.q1.dtype)
