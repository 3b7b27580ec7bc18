"""Validation and normalisation of the inputs of two-map (differential) attention.

Every backend of :func:`diffattn.ops.diff_attention` receives a :class:`DiffAttentionInputs` whose shapes,
dtypes, λ and mask have already been checked here, so a bad argument fails with one ``ValueError`` that names
the argument, what was given and what is allowed — never deep inside a kernel.

Conventions (docs/methods.md §0.2):
    q1, q2  [B, H, T, d]      query heads of the first and second map
    k1, k2  [B, Hkv, S, d]    key heads (GQA: H % Hkv == 0, query head i reads key head i // (H // Hkv))
    v       [B, Hkv, S, dv]   shared values, dv may differ from d (DIFF V1 uses dv = 2d); or a pair of tensors
                              (va, vb), V = [va | vb] along the feature axis, which the triton backend reads in
                              place (DiffLlama's layer: its value heads' two halves, no per-step concatenation
                              of the KV cache) and the others concatenate
    lam     scalar, one per query head [H], or one per query head and token [B, H, T] (DIFF V2's gate,
            docs/methods.md §5)
    mask    causal (bottom-right aligned when T < S) and/or ``attn_mask``:
            2-D ``[B, S]`` key padding (True/1 = real token), or 4-D broadcastable to ``[B, H, T, S]``;
            bool masks mean "may attend", floating masks are added to the logits.
    segments ``segment_ids`` [B, S] integers, the document of each key (sequence packing): a key is masked for a
            query of another document; query i is the token of key i + S − T (bottom-right aligned, as causality),
            so it is never masked by its own segment and segments alone never mask a whole row. transformers'
            packed rows give them from position ids (:func:`segments_from_position_ids`). The triton backend
            compares them per tile, without a [T, S] mask; the other backends fold them into one
            (:func:`with_segment_mask`).

Masked keys and fully masked rows — the one rule every backend follows (``reference``, ``sdpa``, ``chunked``,
``triton``, hence ``auto`` and :func:`~diffattn.ops.diff_attention_maps`):

* A key is **masked** for a query when causality hides it, when a bool mask is False there, or when an additive
  mask's value there is at or below :func:`mask_floor` of the dtype the mask was given in,
  ``torch.finfo(dtype).min / 2`` (``-inf`` included). Transformers' eager masks put ``finfo(dtype).min`` there,
  sometimes plus other biases, which this threshold still catches. In a row that keeps some key, a masked key
  gets probability exactly 0 (as ``-inf`` would give it; ``finfo.min`` already did).
* A query row whose every key is masked **attends to nothing**: both maps' rows are 0, so its output is 0 and it
  passes no gradient to q1, k1, q2, k2, v or λ — what PyTorch's fused SDPA kernels do for a row of ``-inf``,
  and not the mean of V that a softmax over all-equal ``finfo.min`` scores would give.

Causality alone never masks a whole row (query i sees keys j <= i + S − T, and T <= S). An additive mask of
another dtype than q1's is cast to q1's dtype here, with every entry that was masked in its own dtype set to
``-inf``, so that the backends can read the rule off the cast mask with q1's dtype.
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def values_readable() -> bool:
    """Whether the op may decide by reading a tensor's values on the host (a mask's, a row's): not while torch.compile
    traces it (a traced graph cannot branch on values), nor while a CUDA stream captures a graph — a host read waits
    for the device, which a capture refuses ("operation not permitted when stream is capturing"), and under capture
    transformers hands every layer a [B, 1, T, T] mask where it passes none eagerly (its ``is_tracing`` counts a
    capture: the H200 run of 2026-11-29, every diffattn column of the whole-step graph, ``diffattn.cuda_graphs``).
    Where this is False the op takes the general path, which reads nothing: the same numbers."""
    return not torch.compiler.is_compiling() and not stream_capturing()


def stream_capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (False without CUDA)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def wants_grad(*tensors: torch.Tensor | None) -> bool:
    """Whether autograd is recording and one of ``tensors`` (None: none) requires a gradient."""
    return torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in tensors)


@dataclass(frozen=True)
class DiffAttentionInputs:
    q1: torch.Tensor
    k1: torch.Tensor
    q2: torch.Tensor
    k2: torch.Tensor
    v_parts: tuple[torch.Tensor, ...]  # V, or its two column halves (va, vb): V = [va | vb]
    lam: torch.Tensor  # 0-d, [1, H, 1, 1] for one λ per query head, or [B, H, T, 1] for one per head and token
    causal: bool
    attn_mask: torch.Tensor | None  # None, or 4-D [B|1, H|1, T, S] (bool "may attend" or additive float)
    scale: float
    segment_ids: torch.Tensor | None = None  # None, or [B, S] int32 contiguous: each key's document
    # (Q, K) over both maps' heads as the caller had them, q1, q2 and k1, k2 cut from them — a one-call route reads
    # them instead of joining the cuts again (a copy forward, one backward): DIFF V2's pairs (diff_attention_pairs:
    # [B, 2H, T, d], map 1 and map 2 of head i at 2i and 2i + 1, q1 and q2 their interleaved_pair; K shared, k1 is k2
    # is K) or DiffLlama's stacked maps (diff_attention_stacked: [Q1; Q2] over [K1; K2], each cut by one chunk)
    qk_whole: tuple[torch.Tensor, torch.Tensor] | None = None
    # DiffLlama's V as the caller had it, [B, 2Hkv, S, dv/2]: its column halves stacked as heads, v_parts its two chunks
    # (diff_attention_stacked); a one-call route builds V for both maps' heads from it in one copy
    v_stacked: torch.Tensor | None = None
    # DIFF V1's (Q, K) in interleaved pairs as the caller had them, the official DIFF code's layout
    # (diff_attention_pairs with K in pairs): map 1 and map 2 of query head i at 2i and 2i + 1, of key head j at 2j and
    # 2j + 1, q1, q2 and k1, k2 their interleaved_pair; V [B, Hkv, S, dv] once for both maps. Read by the
    # ``cudnn_shared_v`` route (one cuDNN call whose grouped heads read each V head for both maps: no [V; V]); the
    # others take q1, k1, q2, k2
    qk_pairs: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def v(self) -> torch.Tensor:
        """V as one [B, Hkv, S, dv] tensor: given halves are joined on each read, so a backend reads it once — from
        DiffLlama's V as the caller had it where there is one (:func:`v_from_halves`: in its memory order, so that dV
        reaches the projection without a second copy), else concatenated. (Not a cached_property: its lock stops
        torch.compile from tracing the backends.)"""
        if len(self.v_parts) == 1:
            return self.v_parts[0]
        return v_from_halves(self.v_stacked) if self.v_stacked is not None else torch.cat(self.v_parts, dim=-1)

    @property
    def wants_grad(self) -> bool:
        """Whether autograd records this call: grad mode is on and one of its inputs requires a gradient."""
        return wants_grad(self.q1, self.k1, self.q2, self.k2, *self.v_parts, self.lam)

    @property
    def shares_keys(self) -> bool:
        """Both maps read the very same K tensor (DIFF V2; DAA and DiffQ pass theirs twice). Identity, not equal
        storage: two different views of one tensor are two autograd paths, and each needs its own gradient."""
        return self.k1 is self.k2

    @property
    def batch(self) -> int:
        return self.q1.shape[0]

    @property
    def num_heads(self) -> int:
        return self.q1.shape[1]

    @property
    def num_kv_heads(self) -> int:
        return self.k1.shape[1]

    @property
    def q_len(self) -> int:
        return self.q1.shape[2]

    @property
    def kv_len(self) -> int:
        return self.k1.shape[2]

    @property
    def head_dim(self) -> int:
        return self.q1.shape[3]

    @property
    def v_dim(self) -> int:
        return sum(part.shape[3] for part in self.v_parts)


def heads_inside_tokens(x: torch.Tensor) -> bool:
    """Whether a [B, H, T, d] tensor is laid out [B, T, H, d] in memory: a model's Q (a projection's view), and so the
    output CUDA's attention kernels return for it (FlashAttention's always, cuDNN's following Q). Never for one token
    (decoding): the two orders are then one, and the views that would follow the order are dispatched for nothing."""
    return x.shape[2] > 1 and x.stride(1) < x.stride(2)


def v_from_halves(v: torch.Tensor, copies: int = 1) -> torch.Tensor:
    """V, [B, Hkv, S, 2w] — or ``copies`` of it stacked over the heads, [V; V] for a call over both maps' heads — from
    DiffLlama's V, [B, 2Hkv, S, w] whose heads j and j + Hkv are the column halves of V's head j: one expanded view made
    contiguous (one copy), in v's own memory order. Its backward sums the copies' gradients and leaves one copy to
    v's layout — where concatenating the halves (and the result with itself) writes [B, Hkv, S, 2w] contiguous, whose
    gradient the chunk's cat and then the projection's reshape copy once each."""
    b, two_hkv, s, w = v.shape
    hkv = two_hkv // 2
    if heads_inside_tokens(v):  # [B, S, 2Hkv, w] in memory (a projection's view): built as [B, S, copies·Hkv, 2w]
        halves = v.transpose(1, 2).unflatten(2, (2, hkv)).transpose(2, 3)  # [B, S, Hkv, 2 halves, w]
        whole = halves.unsqueeze(2).expand(b, s, copies, hkv, 2, w)
        return whole.reshape(b, s, copies * hkv, 2 * w).transpose(1, 2)
    halves = v.unflatten(1, (2, hkv)).permute(0, 2, 3, 1, 4)  # [B, Hkv, S, 2 halves, w]
    return halves.unsqueeze(1).expand(b, copies, hkv, s, 2, w).reshape(b, copies * hkv, s, 2 * w)


def v_from_halves_grad(g: torch.Tensor, v: torch.Tensor, copies: int = 1) -> torch.Tensor:
    """The gradient of ``v`` through :func:`v_from_halves` (``v`` DiffLlama's V [B, 2Hkv, S, w]) from ``g``, the
    gradient of its result [B, copies·Hkv, S, 2w]: the copies summed, each DIFF head's two column halves put back as
    heads j and j + Hkv, in v's own memory order — what autograd computes through the function's expand and reshape,
    written out for a backward that runs without autograd (:mod:`diffattn.ops.direct`) — as one kernel: the copies'
    sum (or the one copy) written straight into the halves' places, where a sum and then the reshape back to the
    halves were two (one launch a layer and step less, host time a small model's step is bound by)."""
    b, two_hkv, s, w = v.shape
    hkv = two_hkv // 2
    if heads_inside_tokens(v):  # g's [B, S, copies·Hkv, 2w] order, written to [B, S, 2 halves, Hkv, w] = v's order
        copies_of = g.transpose(1, 2).reshape(b, s, copies, hkv, 2, w).unbind(2)  # each [B, S, Hkv, 2 halves, w]
        out = g.new_empty(b, s, 2, hkv, w)
        _sum_into(copies_of, out.transpose(2, 3))
        return out.reshape(b, s, two_hkv, w).transpose(1, 2)
    copies_of = g.reshape(b, copies, hkv, s, 2, w).unbind(1)  # each [B, Hkv, S, 2 halves, w]
    out = g.new_empty(b, 2, hkv, s, w)  # [B, 2Hkv, S, w]
    _sum_into(copies_of, out.permute(0, 2, 3, 1, 4))
    return out.reshape(b, two_hkv, s, w)


def _sum_into(parts: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
    """``out`` (a view) = the sum of ``parts`` in one kernel: one copy, or two added (each element's sum as a reduction
    over the copies would round it: two terms, one rounding)."""
    if len(parts) == 1:
        out.copy_(parts[0])
    elif len(parts) == 2:
        torch.add(parts[0], parts[1], out=out)
    else:
        torch.sum(torch.stack(parts), dim=0, out=out)


def interleaved_pair(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The members of the pairs interleaved along ``dim`` (entries 2i and 2i + 1: map 1 and map 2 of head i, DIFF V2's
    query heads) as two views — the very views ``x`` sliced by ``0::2`` and ``1::2`` along ``dim`` are, cut by one
    ``unbind``: its backward joins the two gradients with one stack, where two strided slices cost a zero-filled
    tensor of x's size each, a copy each and their sum."""
    if dim < 0:
        raise ValueError(f"dim must be counted from the front, got {dim}")
    first, second = x.unflatten(dim, (-1, 2)).unbind(dim + 1)
    return first, second


def stacked_cut(q: torch.Tensor, k: torch.Tensor, v, halves_stacked: bool) -> tuple[tuple, dict]:
    """DIFF V1's stacked layout (:func:`diffattn.ops.diff_attention_stacked`) cut into the maps' views for
    :func:`validate`: ``((q1, k1, q2, k2, v), whole)`` — Q and K each by one chunk into map 1's heads and map 2's, V as
    given or, ``halves_stacked``, its column halves stacked as heads (DiffLlama's) chunked likewise; ``whole``: the
    caller's tensors they were cut from, validate's keywords. The one home of that cut: the entry's whole path and a
    decoding call's route plan (:func:`diffattn.ops.call_plans.plan_inputs`) both make it."""
    (q1, q2), (k1, k2) = q.chunk(2, dim=1), k.chunk(2, dim=1)
    if halves_stacked:
        return (q1, k1, q2, k2, tuple(v.chunk(2, dim=1))), {"qk_whole": (q, k), "v_stacked": v}
    return (q1, k1, q2, k2, v), {"qk_whole": (q, k)}


def pairs_cut(q: torch.Tensor, k: torch.Tensor, v, k_in_pairs: bool) -> tuple[tuple, dict]:
    """The pairs layout (:func:`diffattn.ops.diff_attention_pairs`) cut as :func:`stacked_cut` cuts the stacked one:
    Q's interleaved pairs into the maps' views, K likewise where ``k_in_pairs`` (DIFF V1's heads in pairs), else one K
    for both maps (DIFF V2's); V whole."""
    q1, q2 = interleaved_pair(q, 1)
    if k_in_pairs:
        k1, k2 = interleaved_pair(k, 1)
        return (q1, k1, q2, k2, v), {"qk_pairs": (q, k)}
    return (q1, k, q2, k, v), {"qk_whole": (q, k)}


def _shape(t: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def _check_rank(name: str, t: object, layout: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape {layout}, got {type(t).__name__}")
    if t.dim() != 4:
        raise ValueError(f"{name} must be 4-D {layout}, got {t.dim()}-D tensor of shape {_shape(t)}")
    if t.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"{name} must be a floating tensor (float16/bfloat16/float32/float64), got {t.dtype}")
    return t


@dataclasses.dataclass(frozen=True)
class HeadNorm:
    """DIFF Eq. 3's head after the subtraction, for an op to apply to its output: ``scale · y / sqrt(mean(y²) + eps)``
    over each head's dv values of y = O1 − λ·O2 (RMSNorm without a gain, then the multiplier 1 − λ_init). Handed to
    :func:`diffattn.ops.diff_attention_stacked`, the op applies it — by PyTorch's ``rms_norm`` after any route, or
    inside the ``<route>+epilogue`` routes' one kernel where that is switched on (:mod:`diffattn.ops.routes`:
    :func:`~diffattn.ops.routes.head_norm_in_epilogue`) — so the norm's passes and launches need not be the layer's
    own."""

    eps: float
    scale: float = 1.0

    def __post_init__(self):
        for name in ("eps", "scale"):
            value = getattr(self, name)
            # comparisons, not math.isfinite: under torch.compile(dynamic=True) a module's float may arrive symbolic,
            # which that cannot take (as validate's scale); NaN fails both
            if not (isinstance(value, (int, float)) and 0 <= value < math.inf):
                raise ValueError(f"HeadNorm {name} must be a finite float >= 0, got {value!r}")

    def apply(self, out: torch.Tensor) -> torch.Tensor:
        """The norm of ``out`` [B, H, T, dv] by PyTorch's ops, as the DIFF layer's norm module computes it (the op
        runs this under the caller's autocast, as the module ran: the same kernels and the same bits); after the
        transpose to [B, T, H, dv], where an SDPA route's output is dense (rms_norm would copy the [B, H, T, dv]
        view), and back."""
        x = out.transpose(1, 2)
        return (torch.nn.functional.rms_norm(x, (x.shape[-1],), eps=self.eps) * self.scale).transpose(1, 2)


def validate(
    q1: torch.Tensor,
    k1: torch.Tensor,
    q2: torch.Tensor,
    k2: torch.Tensor,
    v: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    lam: torch.Tensor | float,
    *,
    causal: bool,
    attn_mask: torch.Tensor | None,
    scale: float | None,
    segment_ids: torch.Tensor | None = None,
    qk_whole: tuple[torch.Tensor, torch.Tensor] | None = None,
    v_stacked: torch.Tensor | None = None,
    qk_pairs: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> DiffAttentionInputs:
    """Check every argument and return them in the one layout the backends accept. ``qk_whole``: the (Q, K) the
    caller cut q1, q2 and k1, k2 from, ``v_stacked`` the tensor v's two parts are the chunks of, ``qk_pairs`` DIFF
    V1's Q and K in interleaved pairs (:class:`DiffAttentionInputs`), kept for the one-call routes."""
    _check_rank("q1", q1, "[B, H, T, d]")
    _check_rank("q2", q2, "[B, H, T, d]")
    _check_rank("k1", k1, "[B, Hkv, S, d]")
    _check_rank("k2", k2, "[B, Hkv, S, d]")
    if isinstance(v, (tuple, list)):
        if len(v) != 2:
            raise ValueError(f"v given in parts must be two tensors (va, vb) with V = [va | vb], got {len(v)}")
        parts = (_check_rank("v[0]", v[0], "[B, Hkv, S, dv/2]"), _check_rank("v[1]", v[1], "[B, Hkv, S, dv/2]"))
        if parts[0].shape[:3] != parts[1].shape[:3]:
            raise ValueError(f"v's two parts must agree in [B, Hkv, S], got {_shape(parts[0])} and {_shape(parts[1])}")
    else:
        parts = (_check_rank("v", v, "[B, Hkv, S, dv]"),)
    v = parts[0]
    if q2.shape != q1.shape:
        raise ValueError(f"q2 must have the shape of q1 {_shape(q1)}, got {_shape(q2)}")
    if k2.shape != k1.shape:
        raise ValueError(f"k2 must have the shape of k1 {_shape(k1)}, got {_shape(k2)}")
    b, h, t, d = q1.shape
    bk, hkv, s, dk = k1.shape
    if bk != b:
        raise ValueError(f"k1 batch size must equal q1's ({b}), got k1 of shape {_shape(k1)}")
    if dk != d:
        raise ValueError(f"k1 head dim must equal q1's ({d}), got k1 of shape {_shape(k1)}")
    if hkv == 0 or h % hkv != 0:
        raise ValueError(
            f"the number of query heads must be a multiple of the number of key/value heads (GQA): "
            f"q1 has H={h}, k1 has Hkv={hkv}"
        )
    if v.shape[:3] != k1.shape[:3]:
        raise ValueError(f"v must be [B, Hkv, S, dv] = [{b}, {hkv}, {s}, dv] like k1, got {_shape(v)}")
    if t == 0 or s == 0 or d == 0 or any(part.shape[3] == 0 for part in parts):
        raise ValueError(f"empty dimension: q1 {_shape(q1)}, k1 {_shape(k1)}, v {_shape(v)}")
    for name, other in (("q2", q2), ("k1", k1), ("k2", k2), *((f"v part {i}", p) for i, p in enumerate(parts))):
        if other.dtype != q1.dtype:
            raise ValueError(f"{name} dtype must equal q1's ({q1.dtype}), got {other.dtype}")
        if other.device != q1.device:
            raise ValueError(f"{name} device must equal q1's ({q1.device}), got {other.device}")
    if causal and t > s:
        raise ValueError(
            f"causal attention needs the query length T <= the key length S (bottom-right alignment), got T={t}, S={s}"
        )

    lam_t = _normalise_lambda(lam, b, h, t, q1.device)
    mask = _normalise_mask(attn_mask, b, h, t, s, q1)
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    elif not (isinstance(scale, (int, float)) and 0 < scale < math.inf):  # NaN fails both; comparisons, not
        # math.isfinite: under torch.compile(dynamic=True) a module's float may arrive symbolic, which that cannot take
        raise ValueError(f"scale must be a positive finite float or None (1/sqrt(d)), got {scale!r}")
    segments = _normalise_segments(segment_ids, b, t, s, q1.device)
    return DiffAttentionInputs(
        q1, k1, q2, k2, parts, lam_t, bool(causal), mask, float(scale), segments, qk_whole, v_stacked, qk_pairs
    )


def _normalise_segments(segment_ids: torch.Tensor | None, b: int, t: int, s: int, device) -> torch.Tensor | None:
    if segment_ids is None:
        return None
    if not isinstance(segment_ids, torch.Tensor):
        raise ValueError(f"segment_ids must be a tensor [B, S] or None, got {type(segment_ids).__name__}")
    if segment_ids.dtype == torch.bool or segment_ids.is_floating_point() or segment_ids.is_complex():
        raise ValueError(f"segment_ids must be an integer tensor (each key's document), got {segment_ids.dtype}")
    if tuple(segment_ids.shape) != (b, s):
        raise ValueError(
            f"segment_ids must be [B, S] = [{b}, {s}] (one document id per key), got {_shape(segment_ids)}"
        )
    if segment_ids.device != device:
        raise ValueError(f"segment_ids device must equal q1's ({device}), got {segment_ids.device}")
    if t > s:
        raise ValueError(
            f"segment_ids need the query length T <= the key length S (query i is key i + S − T), got T={t}, S={s}"
        )
    return segment_ids.to(torch.int32).contiguous()


class LastMask:
    """What was derived from the last mask seen, remembered by identity and version counter: the model hands every
    layer, forward and backward, the same mask tensor, so a derivation runs once per mask, not per layer. An edit
    through ``mask.data`` is not seen; inference-mode tensors have no version counter, so theirs is derived anew
    every call; and what was derived under inference mode is an inference tensor, which a call with gradient may not
    save for its backward, so whether inference mode is on is part of the key. Holds the mask by weak reference
    only."""

    def __init__(self) -> None:
        self._last: tuple | None = None  # (weak reference to the mask, its version, what was derived)

    def get(self, mask: torch.Tensor, derive: Callable[[torch.Tensor], object], key: tuple = ()):
        """``derive(mask)``, or what it gave for the same mask, unchanged since, and the same ``key`` (what else the
        derivation reads)."""
        version = None if mask.is_inference() else (mask._version, torch.is_inference_mode_enabled(), *key)
        last = self._last
        if version is not None and last is not None and last[0]() is mask and last[1] == version:
            return last[2]
        result = derive(mask)
        if version is not None:
            self._last = (weakref.ref(mask), version, result)
        return result


_PACKED_MASK = LastMask()  # the last mask seen by packed_mask_segments and its segments (or None)


def packed_mask_segments(mask: torch.Tensor | None, position_ids: torch.Tensor | None) -> torch.Tensor | None:
    """The segment ids [B, S] of a packed row whose ``mask`` is exactly transformers' mask for it — a [B, 1, T, T]
    bool mask equal to causality ∧ same document, the documents starting where ``position_ids`` is 0 — else None
    (no mask, another mask: sliding windows, padding, a row of one document). A model hands the op these ids with
    ``causal=True`` instead of the mask, so the fused kernel reads no [T, S] mask. The comparison runs once per
    mask tensor (every layer of a forward gets the same one: :class:`LastMask`)."""
    if not isinstance(mask, torch.Tensor) or position_ids is None or mask.dtype != torch.bool or mask.dim() != 4:
        return None
    if not values_readable():  # whether a mask is a packed row's is a question of its values: the op reads the mask
        return None  # itself instead (the same result, by the mask's route)
    b, heads, t, s = mask.shape
    if heads != 1 or t != s or t == 1 or position_ids.shape[-1] != t:
        return None
    return _PACKED_MASK.get(mask, lambda m: _segments_if_packed(m, position_ids.expand(b, t)))


def with_packed_segments(arguments: dict, position_ids: torch.Tensor | None) -> dict:
    """The keyword arguments of :func:`diffattn.ops.diff_attention` with a packed row's mask (``attn_mask`` exactly
    transformers' mask for the documents of ``position_ids``: :func:`packed_mask_segments`) replaced by the segment
    ids and ``causal=True``; unchanged otherwise. What a model layer does before calling the op."""
    segments = packed_mask_segments(arguments.get("attn_mask"), position_ids)
    if segments is None:
        return arguments
    return {**arguments, "causal": True, "attn_mask": None, "segment_ids": segments}


def _segments_if_packed(mask: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor | None:
    segments = segments_from_position_ids(position_ids)
    if bool((segments[:, -1] <= 1).all()):  # one document per row: not packed
        return None
    t = mask.shape[-1]
    packed = causal_keep_mask(t, t, mask.device) & (segments[:, :, None] == segments[:, None, :])
    return segments.contiguous() if torch.equal(mask[:, 0], packed) else None


def segments_from_position_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """[B, T] int32 document ids of a packed row from its position ids (transformers' packed format: a document
    starts where its position is 0, as ``DataCollatorWithFlattening`` writes them): the number of document starts
    up to each token."""
    return (position_ids == 0).cumsum(-1, dtype=torch.int32)


def segment_keep_mask(inp: DiffAttentionInputs) -> torch.Tensor:
    """Bool [B, 1, T, S], True where a query and a key lie in the same segment (query i is key i + S − T)."""
    seg = inp.segment_ids
    return (seg[:, inp.kv_len - inp.q_len :, None] == seg[:, None, :]).unsqueeze(1)


def with_segment_mask(inp: DiffAttentionInputs) -> DiffAttentionInputs:
    """``inp`` with its segments folded into ``attn_mask`` (a [B, 1|H, T, S] mask), for the backends that take
    masks only; unchanged without segments."""
    if inp.segment_ids is None:
        return inp
    keep = segment_keep_mask(inp)
    mask = inp.attn_mask
    if mask is None:
        mask = keep
    elif mask.dtype == torch.bool:
        mask = mask & keep
    else:
        mask = mask.masked_fill(~keep, float("-inf"))
    return dataclasses.replace(inp, attn_mask=mask, segment_ids=None)


def check_lambda_finite(lam: torch.Tensor) -> None:
    """A λ tensor on the CPU that holds NaN or inf refused in one line (eager only); nothing elsewhere. Checked where it
    costs nothing: on an accelerator the check would wait for the device at every call, so there a NaN λ shows as NaN
    outputs (the training loop refuses a NaN loss)."""
    if lam.device.type != "cpu" or not values_readable():
        return
    if not bool(torch.isfinite(lam).all()):
        raise ValueError("lam must be finite: it holds NaN or inf (a NaN λ makes every output NaN)")


def _normalise_lambda(lam: torch.Tensor | float, b: int, num_heads: int, t: int, device: torch.device) -> torch.Tensor:
    def allowed() -> str:  # written only when raising: formatting symbolic sizes (torch.compile(dynamic=True)) would
        # fix them to this call's values, and every new length would compile again
        return f"a scalar, [{num_heads}] (one per query head) or [{b}, {num_heads}, {t}] (one per head and token)"

    if isinstance(lam, (int, float)):
        if not math.isfinite(lam):  # NaN or inf: every output would be NaN, with no error
            raise ValueError(f"lam must be finite, got {lam}")
        return torch.tensor(float(lam), device=device)
    if not isinstance(lam, torch.Tensor):
        raise ValueError(f"lam must be a float or a tensor: {allowed()}; got {type(lam).__name__}")
    if not lam.is_floating_point():
        raise ValueError(f"lam must be a floating tensor, got {lam.dtype}")
    if lam.device != device:
        raise ValueError(f"lam device must equal q1's ({device}), got {lam.device}")
    check_lambda_finite(lam)
    if lam.dim() == 0:  # as given: a view would add a node to every training step's graph (host time, no work)
        return lam
    if lam.numel() == 1 and lam.dim() == 1:
        return lam.reshape(())
    if lam.dim() == 1 and lam.numel() == num_heads:
        return lam.view(1, num_heads, 1, 1)
    if lam.dim() == 3 and tuple(lam.shape) == (b, num_heads, t):
        # [B, H, T, 1] by view, as a call's plan makes it again (diffattn.ops.call_plans: the same node in the graph)
        return lam.view(*lam.shape, 1)
    raise ValueError(f"lam must be {allowed()}; got shape [{', '.join(map(str, lam.shape))}]")


def _is_keep_mask(mask: torch.Tensor) -> bool:
    """A float mask of only 0s and 1s, with a 1: a keep-mask cast to float (no additive mask adds exactly 1)."""
    ones = mask == 1
    return bool(ones.any()) and bool((ones | (mask == 0)).all())


def _normalise_mask(
    attn_mask: torch.Tensor | None, b: int, h: int, t: int, s: int, q: torch.Tensor
) -> torch.Tensor | None:
    if attn_mask is None:
        return None
    if not isinstance(attn_mask, torch.Tensor):
        raise ValueError(f"attn_mask must be a tensor or None, got {type(attn_mask).__name__}")
    if attn_mask.device != q.device:
        raise ValueError(f"attn_mask device must equal q1's ({q.device}), got {attn_mask.device}")
    if attn_mask.dim() == 2:
        # key padding [B, S]: integer/bool 1 = real token; a float padding mask is taken as additive
        if tuple(attn_mask.shape) != (b, s):
            raise ValueError(
                f"a 2-D attn_mask is a key-padding mask of shape [B, S] = [{b}, {s}], got {_shape(attn_mask)}"
            )
        if not attn_mask.is_floating_point():
            attn_mask = attn_mask.bool()
        elif not torch.compiler.is_compiling() and _is_keep_mask(attn_mask):
            raise ValueError(
                "a float 2-D attn_mask is added to the logits, and this one holds only 0 and 1 (a 1 = real-token "
                "mask, e.g. attention_mask.float(): added, it would mask nothing); pass it as bool or integer "
                "(attention_mask.bool()), or as an additive mask (0 kept, -inf masked)"
            )
        attn_mask = attn_mask[:, None, None, :]  # [B, 1, 1, S]
    elif attn_mask.dim() == 4:
        allowed = (b, h, t, s)
        # comparisons, not `in`: under torch.compile(dynamic=True) the sizes are symbols, which `in` misjudges
        if any(g != 1 and g != a for g, a in zip(attn_mask.shape, allowed, strict=True)):
            raise ValueError(
                f"a 4-D attn_mask must broadcast to [B, H, T, S] = [{b}, {h}, {t}, {s}] "
                f"(each dim 1 or full), got {_shape(attn_mask)}"
            )
    else:
        raise ValueError(
            f"attn_mask must be 2-D key padding [B, S] or 4-D [B, H, T, S], "
            f"got {attn_mask.dim()}-D of shape {_shape(attn_mask)}"
        )
    if attn_mask.dtype == torch.bool:
        return attn_mask
    if attn_mask.is_floating_point():
        if attn_mask.dtype == q.dtype:
            return attn_mask
        # the rule reads a mask in the dtype it was given in: what it masked there stays masked in q1's dtype
        return attn_mask.to(q.dtype).masked_fill_(hidden_keys(attn_mask), float("-inf"))
    raise ValueError(f"attn_mask must be bool (True = may attend) or floating (additive), got {attn_mask.dtype}")


def causal_keep_mask(t: int, s: int, device: torch.device) -> torch.Tensor:
    """[T, S] bool, True where query i may see key j: j <= i + (S - T) (bottom-right aligned)."""
    return torch.ones(t, s, dtype=torch.bool, device=device).tril(diagonal=s - t)


def mask_floor(dtype: torch.dtype) -> float:
    """The threshold of the masking rule (module docstring): an additive mask value at or below this, in a mask
    of ``dtype``, masks its key. Half of ``finfo(dtype).min``: far below any real bias, and still met by
    ``finfo.min`` with a bias added to it."""
    return torch.finfo(dtype).min / 2


def hidden_keys(mask: torch.Tensor) -> torch.Tensor:
    """Bool, True where ``mask`` (a bool "may attend" or an additive mask) masks the key (module docstring)."""
    return ~mask if mask.dtype == torch.bool else mask <= mask_floor(mask.dtype)


def mask_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``mask`` as an additive bias in ``dtype`` with every masked key at ``-inf`` (0 elsewhere for a bool mask,
    the mask's value for an additive one). A softmax over a row of it gives a masked key exactly the 0 that
    ``finfo.min`` gives it in a row that keeps some key, and a fully masked row shows as all ``-inf``."""
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
    return mask.to(dtype).masked_fill(hidden_keys(mask), float("-inf"))


_FULLY_MASKED = LastMask()  # the last mask seen by fully_masked_rows and its empty rows


def fully_masked_rows(inp: DiffAttentionInputs) -> torch.Tensor | None:
    """Bool ``[B|1, H|1, T, 1]``, True for each query row whose every key is masked (module docstring), or None
    without an ``attn_mask`` (causality alone masks no whole row). One reduction over the mask; with causality,
    no [T, S] causal mask is built: a row is empty when its first kept key lies past its last visible one.

    Found once per mask tensor (:class:`LastMask`), not once per layer: a model hands every layer of a forward the same
    mask, and at decoding a layer's call is a few kernels, whose host work this was a tenth of (benchmarks/RESULTS.md,
    2026-11-30, "An eager decoding step's host work"). Not while a graph is traced or captured (a hit would hand the
    graph a tensor made outside it): found in the graph there, every call."""
    if inp.attn_mask is None:
        return None
    if not values_readable():
        return _fully_masked_rows(inp.attn_mask, inp.causal, inp.q_len, inp.kv_len)
    return _FULLY_MASKED.get(
        inp.attn_mask, lambda mask: _fully_masked_rows(mask, inp.causal, inp.q_len, inp.kv_len),
        key=(inp.causal, inp.q_len, inp.kv_len),
    )  # fmt: skip


def _fully_masked_rows(mask: torch.Tensor, causal: bool, t: int, s: int) -> torch.Tensor:
    keep = ~hidden_keys(mask)  # [B|1, H|1, T|1, S]
    empty = ~keep.any(dim=-1, keepdim=True)
    if not causal:
        return empty
    first = keep.view(torch.uint8).argmax(dim=-1, keepdim=True)  # the first kept key (0 for an empty row)
    last_visible = torch.arange(t, device=keep.device).unsqueeze(-1) + (s - t)  # [T, 1]: keys j <= i + S − T
    return empty | (first > last_visible)
