"""Two-map (differential) attention, the one primitive every method of this library reduces to.

    out = softmax(Q1 K1ᵀ·s + M) V − λ · softmax(Q2 K2ᵀ·s + M) V          (DIFF Transformer Eq. 1,
                                                                          methods.md §0)

Public entry points:

* :func:`diff_attention` — the op, with a ``backend`` switch: ``reference`` (fp32 math), ``sdpa`` (PyTorch's
  fused attention), ``chunked`` (query chunks with a shared-product backward; fastest on CPU), ``auto``;
  ``triton`` is registered and reports itself unavailable until its kernel lands.
* :func:`diff_attention_maps` — the same computation through ``reference``, also returning both maps and the
  signed map A1 − λA2 for analysis.
* :func:`backend_status` — which backends are usable here, and why not.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ._inputs import DiffAttentionInputs, validate
from .chunked import diff_attention_chunked
from .reference import DiffAttentionMaps, diff_attention_reference
from .sdpa import diff_attention_sdpa

__all__ = [
    "BACKENDS",
    "BackendStatus",
    "DiffAttentionMaps",
    "auto_backend",
    "backend_status",
    "diff_attention",
    "diff_attention_maps",
]

logger = logging.getLogger(__name__)

BACKENDS = ("auto", "reference", "sdpa", "chunked", "triton")


@dataclass(frozen=True)
class BackendStatus:
    name: str
    usable: bool
    reason: str


def _triton_status() -> BackendStatus:
    # The fused Triton kernel is the subject of a later issue; until it exists the switch reports why.
    return BackendStatus("triton", False, "the fused Triton kernel is not implemented yet (planned: issue 6)")


def backend_status(device: torch.device | str | None = None) -> list[BackendStatus]:
    """Usability of each concrete backend on ``device`` (default: CUDA if present, else CPU)."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    return [
        BackendStatus("reference", True, "fp32 math on any device; materialises both [T, S] maps"),
        BackendStatus("sdpa", True, f"torch.nn.functional.scaled_dot_product_attention on {device.type}"),
        BackendStatus("chunked", True, "query chunks in PyTorch ops, shared dO·Vᵀ backward; fastest on CPU"),
        _triton_status(),
    ]


_IMPLS: dict[str, Callable[[DiffAttentionInputs], torch.Tensor]] = {
    "reference": diff_attention_reference,
    "sdpa": diff_attention_sdpa,
    "chunked": diff_attention_chunked,
}


def auto_backend(device: torch.device) -> str:
    """What ``backend="auto"`` runs on ``device``: ``chunked`` on CPU (measured 1.28× a same-size baseline
    forward+backward at N = 2048 against 1.86–1.97× for ``sdpa``), ``sdpa`` elsewhere (fused flash kernels)."""
    return "chunked" if device.type == "cpu" else "sdpa"


def _resolve(backend: str, inp: DiffAttentionInputs) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
    if backend == "auto":
        return auto_backend(inp.q1.device)
    if backend not in _IMPLS:
        status = {s.name: s for s in backend_status(inp.q1.device)}[backend]
        raise ValueError(f"backend {backend!r} is not usable: {status.reason}")
    return backend


def diff_attention(
    q1: torch.Tensor,
    k1: torch.Tensor,
    q2: torch.Tensor,
    k2: torch.Tensor,
    v: torch.Tensor,
    lam: torch.Tensor | float,
    *,
    causal: bool = True,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Differential attention ``softmax(q1 k1ᵀ·s + M) v − lam · softmax(q2 k2ᵀ·s + M) v``.

    Args:
        q1, q2: queries of the two maps, ``[B, H, T, d]``.
        k1, k2: keys of the two maps, ``[B, Hkv, S, d]``; ``H % Hkv == 0`` (GQA).
        v: shared values ``[B, Hkv, S, dv]``; ``dv`` may differ from ``d``.
        lam: λ — a float, a scalar tensor, or one value per query head ``[H]``. Gradients flow into it.
        causal: causal mask, aligned bottom-right when ``T < S`` (decoding against a KV cache:
            query i sees keys ``j <= i + S − T``).
        attn_mask: optional extra mask, combined with ``causal``: 2-D ``[B, S]`` key padding (True/1 = real
            token) or 4-D broadcastable to ``[B, H, T, S]``; bool = may attend, float = additive.
        scale: logit scale ``s``; default ``1/sqrt(d)``.
        backend: ``"auto"`` (``chunked`` on CPU, ``sdpa`` on CUDA), ``"reference"``, ``"sdpa"``, ``"chunked"``
            or ``"triton"``.

    Returns:
        ``[B, H, T, dv]`` in the dtype of ``q1``. λ and the subtraction are computed in float32.

    Raises:
        ValueError: naming the argument, what was given and what is allowed.
    """
    inp = validate(q1, k1, q2, k2, v, lam, causal=causal, attn_mask=attn_mask, scale=scale)
    return _IMPLS[_resolve(backend, inp)](inp)


def diff_attention_maps(
    q1: torch.Tensor,
    k1: torch.Tensor,
    q2: torch.Tensor,
    k2: torch.Tensor,
    v: torch.Tensor,
    lam: torch.Tensor | float,
    *,
    causal: bool = True,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> DiffAttentionMaps:
    """:func:`diff_attention` through the ``reference`` backend, also returning ``attn1``, ``attn2`` and the
    signed map ``attn1 − λ·attn2`` (all float32 ``[B, H, T, S]``), for analysis and plots."""
    inp = validate(q1, k1, q2, k2, v, lam, causal=causal, attn_mask=attn_mask, scale=scale)
    return diff_attention_reference(inp, return_maps=True)
