"""Attention with low-bit logits, for the quantization analysis of DIFF Transformer (Table 5, Fig. 8).

Inside ``with quantized_logits(bits):`` the attention modules this library owns compute attention through
:func:`quantized_attention` instead of their fast backend: the scaled logits Q·Kᵀ·s of each map are quantized by
absmax per head and sample — ``scale = max|x| / (2^(b−1) − 1)`` over the entries the mask keeps, round, dequantize —
and then masked, softmaxed and combined as usual (A1 − λA2 for two maps). ``bits=None`` or 16 means no
quantization (the paper's 16-bit baseline); ``bits=0`` (:data:`UNIFORM_LOGITS`, ours) makes every logit equal, so
each map is uniform over the keys the mask keeps: what a model scores without its attention patterns, a reference for
what its logits are worth (not a floor: a coarse width can move a map further from the model's own than uniform).
Plain Hugging Face attention modules are handled by :class:`diffattn.eval.outliers.QuantizedLogits`, which reroutes
them through the same function.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from ._inputs import hidden_keys, validate
from .reference import _safe_softmax, additive_bias

_BITS: list[int] = []

#: the width with no logit information at all: every logit equal, each map uniform over the visible keys (1-bit
#: signed absmax has no level but 0, the same thing)
UNIFORM_LOGITS = 0


def logit_bits() -> int | None:
    """The active logit bit width, or None (the normal case: one list check)."""
    return _BITS[-1] if _BITS else None


@contextmanager
def quantized_logits(bits: int | None) -> Iterator[None]:
    """Quantize attention logits to ``bits`` in the block (None or 16: unchanged; 0: every logit equal)."""
    if bits is not None and not (isinstance(bits, int) and (2 <= bits <= 16 or bits == UNIFORM_LOGITS)):
        raise ValueError(f"bits must be an int in [2, 16], {UNIFORM_LOGITS} (uniform maps) or None, got {bits!r}")
    if bits is None or bits >= 16:
        yield
        return
    _BITS.append(bits)
    try:
        yield
    finally:
        _BITS.pop()


def quantize_absmax(x: torch.Tensor, bits: int, keep: torch.Tensor | None = None) -> torch.Tensor:
    """Absmax-quantize ``x`` [B, H, T, S] per (B, H) to signed ``bits`` and dequantize; ``keep`` limits the max;
    ``bits`` 0 (:data:`UNIFORM_LOGITS`) or 1 keeps no level but 0."""
    if bits <= 1:
        return torch.zeros_like(x)
    levels = 2 ** (bits - 1) - 1
    mag = x.abs() if keep is None else x.abs().masked_fill(~keep, 0)
    scale = mag.amax(dim=(-2, -1), keepdim=True).clamp_min(1e-12) / levels
    return torch.round(x / scale).clamp(-levels, levels) * scale


def quantized_attention(q1, k1, q2, k2, v, lam, *, causal, attn_mask, scale, bits) -> torch.Tensor:
    """softmax(Q(Q1K1ᵀ·s) + M) V − λ softmax(Q(Q2K2ᵀ·s) + M) V with Q the absmax quantizer; single map if q2 is None.

    Shapes as :func:`diffattn.ops.diff_attention`; returns ``[B, H, T, dv]`` in q1's dtype.
    """
    single = q2 is None
    inp = validate(
        q1,
        k1,
        q1 if single else q2,
        k1 if single else k2,
        v,
        0.0 if single else lam,
        causal=causal,
        attn_mask=attn_mask,
        scale=scale,
    )
    rep = inp.num_heads // inp.num_kv_heads
    bias = additive_bias(inp, torch.float32)
    keep = None if bias is None else ~hidden_keys(bias)  # the masking rule of diffattn.ops._inputs

    def probs(q, k):
        k = k if rep == 1 else k.repeat_interleave(rep, dim=1)
        s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * inp.scale
        s = quantize_absmax(s, bits, None if keep is None else keep.expand_as(s))
        return _safe_softmax(s if bias is None else s + bias)

    a = probs(inp.q1, inp.k1)
    if not single:
        a = a - inp.lam.float() * probs(inp.q2, inp.k2)
    vv = inp.v if rep == 1 else inp.v.repeat_interleave(rep, dim=1)
    return torch.matmul(a, vv.float()).to(q1.dtype)
