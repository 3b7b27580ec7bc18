"""Attention capture: per layer and head, the attention logits and maps of any model this library builds or adapts.

What is recorded for each attention call (:class:`AttentionRecord`, float32, ``[B, H, T, S]``):

* ``logits1`` — the scaled pre-softmax scores Q1 K1ᵀ·s of the (first) map, ``keep`` the mask of entries the
  model may attend to (causal, sliding window, padding); ``attn1 = softmax(logits1 + mask)``;
* two-map models (DIFF Transformer, DAA, DiffQ/K, DiffLoRA; DIFF Eq. 1): ``logits2``, ``attn2``, λ per head and
  the **signed** map ``A1 − λ·A2`` — what multiplies V, and what ``output_attentions`` cannot give;
* Dex (Kong et al. App. F.3): the **effective attention** ``X = A V (I − λ W_Dᵀ) V⁺`` of each selected head (the
  map that, applied to the same V, gives the extended output O' = O − λ O W_Dᵀ; V⁺ the pseudo-inverse), and A
  for the other heads; ``signed`` is X for Dex models, A1 for single-map ones. With ``reference=True`` also
  ``reference``: the same effective attention with λ forced to 0 (Dex: ``A V V⁺``, the projection alone), from the
  same A and V, so that what the λ term does can be told from what the projection does.

How: the modules this library owns report their post-RoPE tensors through :mod:`diffattn.ops.observe`; the
attention modules of plain Hugging Face models (baselines, pretrained bases of the adapter table) get a forward
hook that recomputes Q and K with :func:`diffattn.adapters.project_qkv` from the module's input (keys come from
the KV cache when one is used). The maps are computed on the side, in float32, from the same tensors: the
model's outputs do not change (tested to be bit-identical).

Memory: a full record is ``O(L·H·T·S)``; pass ``rows="last"`` to keep only the last query row (attention
allocation), ``layers=`` to keep some layers, or ``callback=`` with ``store=False`` to reduce each record as it
arrives (outlier statistics).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn

from ..ops import causal_keep_mask, hidden_keys
from ..ops.observe import observe

__all__ = ["AttentionCapture", "AttentionRecord", "capture_attention"]


@dataclass
class AttentionRecord:
    """One attention call of one layer (float32 tensors, ``[B, H, T, S]`` unless stated; T = recorded rows)."""

    layer: int
    kind: str  # "single" (one softmax map) or "diff" (two maps, DIFF Eq. 1)
    keep: torch.Tensor  # bool, broadcastable to [B, H, T, S]: entries the model may attend to
    logits1: torch.Tensor
    attn1: torch.Tensor
    signed: torch.Tensor  # A1 − λ·A2 (two maps), Dex's effective attention, or A1
    logits2: torch.Tensor | None = None
    attn2: torch.Tensor | None = None
    lam: torch.Tensor | None = None  # [H]; for DIFF V2's per-token gate, its mean over the batch and recorded rows
    effective: torch.Tensor | None = None  # Dex only: the effective attention (also in ``signed``)
    reference: torch.Tensor | None = None  # with reference=True: the effective attention at λ = 0 (Dex: A V V⁺)
    v: torch.Tensor | None = None  # the values the maps multiply, [B, Hkv, S, dv] (head outputs = signed · V)

    @property
    def num_heads(self) -> int:
        return self.logits1.shape[1]

    def kept_logits(self) -> list[torch.Tensor]:
        """The logits of every map at the entries the model may attend to, flattened (outlier statistics)."""
        keep = self.keep.expand_as(self.logits1)
        return [x[keep] for x in (self.logits1, self.logits2) if x is not None]


def _safe_softmax(scores: torch.Tensor) -> torch.Tensor:
    fully_masked = torch.isneginf(scores).all(dim=-1, keepdim=True)
    return torch.softmax(scores.masked_fill(fully_masked, 0.0), dim=-1).masked_fill(fully_masked, 0.0)


def _keep_mask(q_len: int, kv_len: int, causal: bool, attn_mask: torch.Tensor | None, device) -> torch.Tensor:
    keep = torch.ones(1, 1, q_len, kv_len, dtype=torch.bool, device=device)
    if causal:
        keep = keep & causal_keep_mask(q_len, kv_len, device)
    if attn_mask is not None:
        if attn_mask.dim() == 2:  # [B, S] key padding, 1 = real token
            m = attn_mask.bool()[:, None, None, :]
        elif attn_mask.dtype == torch.bool:
            m = attn_mask
        else:  # additive float mask: transformers marks blocked entries with finfo.min (or -inf)
            m = ~hidden_keys(attn_mask)  # the masking rule of diffattn.ops._inputs
        keep = keep & m[..., -q_len:, -kv_len:]
    return keep


def _scores(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    rep = q.shape[1] // k.shape[1]
    k = k if rep == 1 else k.repeat_interleave(rep, dim=1)
    return torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale


def reporting_and_plain_attention(model: nn.Module) -> tuple[list[tuple[int, nn.Module]], list[tuple[int, nn.Module]]]:
    """The attention modules of ``model`` as (layer, module) pairs, split into those that report their call through
    :mod:`diffattn.ops.observe` (our DIFF attention, adapter wrappers) and plain Hugging Face modules, which an
    analysis has to hook (:func:`diffattn.adapters.model_types.recompute_attention_call`)."""
    from ..adapters import attention_modules
    from ..adapters.base import AdaptedAttention
    from ..models.diff_llama import DiffLlamaDifferentialAttention
    from ..models.diff_v2 import DiffV2Attention

    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT
    ours = (AdaptedAttention, DiffLlamaDifferentialAttention, DiffV2Attention)
    own = [(m.layer_idx, m) for m in base.modules() if isinstance(m, ours)]
    if own and len(own) == getattr(base.config, "num_hidden_layers", len(own)):
        return own, []
    try:
        modules = attention_modules(base)  # raises naming the supported model types
    except ValueError as e:
        raise ValueError(f"cannot capture attention of this model: {e}") from e
    owned = {id(m) for _, m in own}
    return own, [(i, a) for i, _, a in modules if id(a) not in owned]


class AttentionCapture:
    """Records an :class:`AttentionRecord` per attention layer and call while the ``with`` block runs.

    Args:
        model: a from-scratch model (``diffattn.build_model``), a pretrained model of the adapter table (plain
            or adapted with any method; PEFT-wrapped models too).
        layers: layer indices to record (default: all).
        rows: ``None`` (all query rows), ``"last"`` (the last row only) or an ``int`` row index.
        callback: called with each record as it is made.
        store: keep the records in :attr:`records` (turn off with a callback, to bound memory).
        reference: for a method with an effective attention (Dex), also record it with λ forced to 0
            (:meth:`~diffattn.adapters.base.AdapterMethod.projection_reference`) as ``reference``; off by default
            (one more map per layer).

    After the block, ``records[layer]`` is the list of that layer's records, one per forward call, and
    :meth:`last` the latest of each layer.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        layers: Iterable[int] | None = None,
        rows: str | int | None = None,
        callback: Callable[[AttentionRecord], None] | None = None,
        store: bool = True,
        reference: bool = False,
    ):
        if rows not in (None, "last") and not isinstance(rows, int):
            raise ValueError(f"rows must be None, 'last' or a row index; got {rows!r}")
        self.model, self.rows, self.callback, self.store = model, rows, callback, store
        self.reference = reference
        self.layers = None if layers is None else set(layers)
        self.records: dict[int, list[AttentionRecord]] = {}
        self._hooks: list = []
        self._observer = None
        self._layer_of: dict[int, int] = {}

    # -- which modules, and how they report -------------------------------------------------------------------
    def __enter__(self) -> AttentionCapture:
        own, plain = reporting_and_plain_attention(self.model)
        self._layer_of = {id(m): i for i, m in own}
        for i, attn in plain:
            self._hooks.append(attn.register_forward_hook(self._plain_hook(i), with_kwargs=True))
        self._observer = observe(self._on_report)
        self._observer.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        if self._observer is not None:
            self._observer.__exit__(*exc)
            self._observer = None

    def last(self) -> dict[int, AttentionRecord]:
        """The latest record of every recorded layer."""
        return {layer: recs[-1] for layer, recs in sorted(self.records.items()) if recs}

    # -- recording --------------------------------------------------------------------------------------------
    def _on_report(self, module: nn.Module, f: dict) -> None:
        layer = self._layer_of.get(id(module))
        if layer is None:  # a module of another model reporting while this capture is active
            return
        self._record(layer, **f)

    def _plain_hook(self, layer: int):
        from ..adapters.model_types import get_spec, recompute_attention_call

        base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        spec = get_spec(base)

        def hook(module, args, kwargs, output):
            call = recompute_attention_call(spec, module, args, kwargs)
            self._record(
                layer,
                kind="single",
                q1=call.q,
                k1=call.k,
                q2=None,
                k2=None,
                v=call.v,
                lam=None,
                causal=call.causal,
                attn_mask=call.attn_mask,
                scale=call.scale,
            )

        return hook

    @torch.no_grad()
    def _record(self, layer, *, kind, q1, k1, q2, k2, v, lam, causal, attn_mask, scale, method=None) -> None:
        if self.layers is not None and layer not in self.layers:
            return
        t, s = q1.shape[2], k1.shape[2]
        keep = _keep_mask(t, s, causal, attn_mask, q1.device)
        lam = None if lam is None else torch.as_tensor(lam).detach().float()
        per_token = lam is not None and lam.dim() == 3  # DIFF V2's gate [B, H, T]
        if self.rows is not None:
            idx = t - 1 if self.rows == "last" else self.rows
            q1 = q1[:, :, idx : idx + 1]
            q2 = None if q2 is None else q2[:, :, idx : idx + 1]
            keep = keep[..., idx : idx + 1, :]
            lam = lam[:, :, idx : idx + 1] if per_token else lam
        neg = torch.tensor(float("-inf"), device=q1.device)
        logits1 = _scores(q1, k1, scale)
        attn1 = _safe_softmax(torch.where(keep, logits1, neg))
        rec = AttentionRecord(layer, kind, keep, logits1, attn1, attn1, v=v.detach().float())
        if kind == "diff":
            rec.logits2 = _scores(q2, k2, scale)
            rec.attn2 = _safe_softmax(torch.where(keep, rec.logits2, neg))
            if per_token:  # λ of each row: A1 − λ_t·A2 row by row
                rec.lam = lam.mean(dim=(0, 2))
                rec.signed = attn1 - lam[..., None] * rec.attn2
            else:
                lam_h = lam.reshape(-1)
                rec.lam = lam_h.expand(q1.shape[1]).clone() if lam_h.numel() == 1 else lam_h
                rec.signed = attn1 - rec.lam[None, :, None, None] * rec.attn2
        elif method is not None and (effective := method.effective_attention(attn1, v)) is not None:
            rec.effective = rec.signed = effective  # a single-map method that changes what attention does (Dex)
            rec.lam = torch.full((q1.shape[1],), float(method.current_lambda().detach()))
            if self.reference:
                rec.reference = method.projection_reference(attn1, v)
        if self.callback is not None:
            self.callback(rec)
        if self.store:
            self.records.setdefault(layer, []).append(rec)


def capture_attention(model: nn.Module, input_ids: torch.Tensor, **kwargs) -> dict[int, AttentionRecord]:
    """One forward of ``model`` on ``input_ids`` under :class:`AttentionCapture`; the record of every layer.

    ``kwargs`` go to :class:`AttentionCapture` except ``attention_mask``, which goes to the model."""
    mask = kwargs.pop("attention_mask", None)
    with AttentionCapture(model, **kwargs) as cap:
        model(input_ids, attention_mask=mask)
    return cap.last()
