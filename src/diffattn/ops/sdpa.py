"""Two-map attention on PyTorch's fused ``scaled_dot_product_attention`` (docs/methods.md §0, DIFF Eq. 1): the routes
``sdpa``, ``cudnn``, ``sdpa_split``, ``sdpa_maps`` and ``cudnn_maps``. Which one runs on a GPU is measured, not argued
(:mod:`diffattn.ops.routes`); they differ in how the two maps meet SDPA's rule that V be as wide as Q and K
(FlashAttention's; cuDNN takes a wider V) and in what they copy per call.

The ``sdpa`` route's arrangement, chosen by measurement on CPU (see ``benchmarks/attention.py``):

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

On CUDA every SDPA call's output hands its gradient back in the output's own memory layout
(:class:`_GradInOutputLayout`). Why: PyTorch's cuDNN attention (2.5 on, with cuDNN 9.5.1 or newer) builds its backward
graph with the strides of the first output gradient it receives and caches it under Q, K and V alone — the gradient's
layout is not in the key — so a later call with the same Q, K, V but a gradient laid out otherwise reuses a graph that
reads that gradient by the first one's strides (aten/src/ATen/native/cudnn/MHA.cpp, ``run_cudnn_SDP_bprop``; read in
PyTorch's source, then measured by benchmarks/cudnn_grad_layout.py on the H200 of 2026-11-28, torch 2.11.0+cu130, cuDNN
9.19: the second layout's gradients 1.38 relative error off the math backend's against 2.8e-3 for a contiguous one,
benchmarks/gpu-runs/h200-2026-11-28/log.txt). The two maps of the ``cudnn_maps`` route are such a pair, and the fused
epilogue handed them gradients in two layouts (dO1 in the output gradient's, dO2 in O2's). The output's layout follows
Q's, which is in the key, so a gradient always in the output's layout is always the one the cached graph was built for.
Cost: a copy where the gradient arrives in another layout (FlashAttention's backward makes that copy itself). The rule
holds across routes, since one process may run two routes of one class (``auto``'s next route, a test, a benchmark):
calls two routes make alike get their gradients at one layout — ``sdpa_split`` guards V's two slices' join and hands
each call a half of it, and ``sdpa_split+epilogue``'s kernel writes the halves of a buffer of that layout (on the
H200 of 2026-11-29 it wrote each in its own output's layout, and after ``sdpa_split`` in one process its dQ, dK, dV
were wrong: ``tests/ops/test_sdpa_grad_layout.py`` now checks every route of a class in one process).

Fully masked rows follow the rule of :mod:`diffattn.ops._inputs`: with an ``attn_mask``, one reduction over it
finds the query rows whose every key is masked and their output is set to 0 after the call, so they pass no
gradient either. SDPA's own answer is not relied on: its fused CPU kernel gives a row of ``-inf`` 0, but a row of
additive ``finfo.min`` a uniform softmax (the mean of V, and gradients to match).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._inputs import (
    DiffAttentionInputs,
    causal_keep_mask,
    fully_masked_rows,
    heads_inside_tokens,
    interleaved_pair,
    v_from_halves,
)
from .routes import small_work, v_copies_in_kernel


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


def _one_call_operands(inp: DiffAttentionInputs):
    """Q, K, V of the one call over both maps' query heads, and their layout (module docstring)."""
    q, k, layout = _one_call_qk(inp)
    if inp.shares_keys:
        return q, k, inp.v, layout
    if inp.v_stacked is not None:
        return q, k, v_twice(inp), layout  # [V; V] in one copy
    v = inp.v
    return q, k, torch.cat([v, v], dim=1), layout  # V: [B, 2Hkv, S, dv]


def _one_call_qk(inp: DiffAttentionInputs):
    """Q and K of the one call over both maps' query heads, and their layout (module docstring)."""
    h, d = inp.num_heads, inp.head_dim
    b, t = inp.batch, inp.q_len
    # the caller's Q (and K) in the call's layout already (diff_attention_pairs, diff_attention_stacked): no copy
    whole = inp.qk_whole
    if inp.shares_keys:
        # K1 is K2 (DIFF V2): 2H interleaved query heads against the Hkv key/value heads, K and V passed once;
        # query heads 2i and 2i+1 (map 1 and map 2 of head i) both belong to key head i // (H/Hkv) under GQA
        q = whole[0] if whole is not None else torch.stack([inp.q1, inp.q2], dim=2).reshape(b, 2 * h, t, d)
        return q, inp.k1, "interleaved"
    # [B, 2H, T, d] over [B, 2Hkv, S, d]: map 1's heads, then map 2's
    q, k = whole if whole is not None else (torch.cat([inp.q1, inp.q2], dim=1), torch.cat([inp.k1, inp.k2], dim=1))
    return q, k, "stacked"


def _v_copies_by_kernel(inp: DiffAttentionInputs) -> bool:
    """Whether [V; V] is built from ``inp.v_stacked`` by the kernels of :mod:`diffattn.ops.triton.vcopies`: where the
    route table switches them on for the device (:func:`diffattn.ops.routes.v_copies_in_kernel`), for a call above
    :data:`~diffattn.ops.routes.SMALL_WORK`, in eager mode, where they can run (CUDA, or Triton's interpreter) and sum
    in float32 without loss (not float64)."""
    v = inp.v_stacked
    switched = v_copies_in_kernel(v.device.index if v.is_cuda else None) and not small_work(inp)
    return switched and v.dtype != torch.float64 and not torch.compiler.is_compiling() and (v.is_cuda or _interpreted())


def v_twice(inp: DiffAttentionInputs) -> torch.Tensor:
    """[V; V] from V's stacked halves (``inp.v_stacked``): by the kernels of :mod:`diffattn.ops.triton.vcopies` where
    :func:`_v_copies_by_kernel`, else by PyTorch's one copy (:func:`diffattn.ops._inputs.v_from_halves`). The same
    values and layout either way."""
    if _v_copies_by_kernel(inp):
        from .triton.vcopies import v_twice_from_halves

        return v_twice_from_halves(inp.v_stacked)
    return v_from_halves(inp.v_stacked, copies=2)


def v_twice_slices(inp: DiffAttentionInputs) -> tuple[torch.Tensor, ...]:
    """[V; V] cut into its two column halves, [va; va] and [vb; vb], where V's stacked halves are as wide as Q and K
    (DiffLlama's V at dv = 2d: the ``sdpa_split`` route's slices): by the kernels of
    :mod:`diffattn.ops.triton.vcopies` as two tensors of their own where :func:`_v_copies_by_kernel` — their gradients
    summed into V's as they come, no join of the two first — else views of PyTorch's [V; V]."""
    if _v_copies_by_kernel(inp):
        from .triton.vcopies import v_twice_slices as slices

        return slices(inp.v_stacked)
    return v_from_halves(inp.v_stacked, copies=2).split(inp.head_dim, dim=-1)


def _interpreted() -> bool:
    try:
        from .triton import tuning
    except ImportError:  # no triton: nothing to interpret
        return False
    return tuning.INTERPRETED


def _combine(
    inp: DiffAttentionInputs, o: torch.Tensor, layout: str, fused: bool = False, norm: tuple[float, float] | None = None
) -> torch.Tensor:
    """O1 − λ·O2 in float32 from the call's [B, 2H, T, dv] output, fully masked rows set to 0. ``fused``: by the
    one-kernel epilogue on ``o`` whole, whose backward writes ``o``'s gradient in one pass (no join of dO1 and dO2);
    ``norm`` (eps, scale), with ``fused`` only: the head's norm in that kernel too (:class:`diffattn.ops.HeadNorm`)."""
    if fused:
        from .triton.epilogue import subtract_pair

        return _zero_fully_masked(inp, subtract_pair(o.to(inp.q1.dtype), inp.lam, layout, norm))
    return _subtract(inp, *_maps_apart(o, layout))


def _maps_apart(o: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """O1 and O2, views of the one call's [B, 2H, T, dv] output (its query heads ``stacked`` or ``interleaved``), cut by
    one chunk or unbind in o's own memory order: autograd joins their gradients by one cat or stack, which writes
    contiguously in the order it cuts — o's, so the joined gradient is laid out as o and the guard (:func:`_guarded`)
    copies nothing (cut in [B, 2H, T, dv] from a [B, T, 2H, dv]-ordered o, the join would be copied once more). Two
    slices instead would cost a zero-filled tensor of o's size and a copy each, and their sum."""
    inside = heads_inside_tokens(o)
    x = o.transpose(1, 2) if inside else o  # o in its memory order: the heads at dim 2, or at dim 1
    heads = 2 if inside else 1
    o1, o2 = interleaved_pair(x, heads) if layout == "interleaved" else x.chunk(2, dim=heads)
    return (o1.transpose(1, 2), o2.transpose(1, 2)) if inside else (o1, o2)


def _subtract(
    inp: DiffAttentionInputs,
    o1: torch.Tensor,
    o2: torch.Tensor,
    fused: bool = False,
    norm: tuple[float, float] | None = None,
) -> torch.Tensor:
    """O1 − λ·O2 in float32 (docs/methods.md §0.2), fully masked rows set to 0, in the inputs' dtype. ``fused``: by
    the one-kernel epilogue of :mod:`diffattn.ops.triton.epilogue` (the routes ``<route>+epilogue``), the same
    arithmetic (float32, one rounding) in one pass instead of PyTorch's five; ``norm`` as :func:`_combine`'s."""
    if fused:
        from .triton.epilogue import subtract_maps

        return _zero_fully_masked(inp, subtract_maps(o1.to(inp.q1.dtype), o2.to(inp.q1.dtype), inp.lam, norm))
    acc = torch.promote_types(o1.dtype, torch.float32)  # fp32 subtraction; fp64 stays fp64
    return _zero_fully_masked(inp, o1.to(acc) - inp.lam.to(acc) * o2.to(acc)).to(inp.q1.dtype)


def _zero_fully_masked(inp: DiffAttentionInputs, out: torch.Tensor) -> torch.Tensor:
    """``out`` with the rows that attend to nothing set to 0: zero output, zero gradient through it (zero is exact in
    every dtype, so before or after the rounding gives the same output and gradient)."""
    fully = fully_masked_rows(inp)  # [B|1, H|1, T, 1], or None without an attn_mask
    return out if fully is None else out.masked_fill(fully, 0.0)


#: where SDPA's backward may be cuDNN's (the module docstring's graph cache): the devices :func:`_call` guards; the
#: CPU's kernels read a gradient by its own strides, and the guard's copies would only cost there
GUARDED_DEVICES = frozenset({"cuda"})


class _GradInOutputLayout(torch.autograd.Function):
    """The identity, whose backward hands the gradient on in the forward output's memory layout (copied where it
    arrives in another; dimensions of size 1 do not count). Why: the module docstring's cuDNN graph cache."""

    @staticmethod
    def forward(ctx, o):
        ctx.layout = (o.shape, o.stride())
        return o.view_as(o)

    @staticmethod
    def backward(ctx, g):
        shape, stride = ctx.layout
        if g is None or _same_layout(g, shape, stride):
            return g
        return torch.empty_strided(shape, stride, dtype=g.dtype, device=g.device).copy_(g)


def _same_layout(x: torch.Tensor, shape: torch.Size, stride: tuple[int, ...]) -> bool:
    return all(a == b for a, b, n in zip(x.stride(), stride, shape, strict=True) if n > 1)


def _guarded(out: torch.Tensor) -> torch.Tensor:
    """``out`` whose gradient is handed on in its own layout (:class:`_GradInOutputLayout`) where it needs to be."""
    return _GradInOutputLayout.apply(out) if out.requires_grad and out.device.type in GUARDED_DEVICES else out


def _call(inp: DiffAttentionInputs, q, k, v, mask: tuple[torch.Tensor | None, bool], guard: bool = True):
    """One SDPA call; ``mask`` the (attn_mask, is_causal) pair of :func:`_sdpa_mask` or :func:`_one_map_mask`. Its
    gradient reaches SDPA's backward in the output's layout (:func:`_guarded`), unless ``guard`` is off: the caller
    guards a tensor the output's gradient is a fixed slice of."""
    attn_mask, is_causal = mask
    out = sdpa_call(q, k, v, attn_mask, is_causal, inp.scale)
    return _guarded(out) if guard else out


def sdpa_call(q, k, v, attn_mask: torch.Tensor | None, is_causal, scale: float | None) -> torch.Tensor:
    """``F.scaled_dot_product_attention``, GQA where K has fewer heads than Q. Its flags are made Python bools by a
    branch: a comparison of sizes is a SymBool under ``torch.compile(dynamic=True)``, which SDPA refuses."""
    gqa = True if q.shape[1] != k.shape[1] else False  # noqa: SIM210
    causal = True if is_causal else False  # noqa: SIM210
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=causal, scale=scale, enable_gqa=gqa)


def _sliced_call(inp: DiffAttentionInputs, q, k, v_parts, mask) -> torch.Tensor:
    """One SDPA call per slice of V (each as wide as Q and K), outputs side by side. The joined output is what is
    guarded: each call's gradient is then a slice of it at fixed strides — one copy at most a map, not one a slice.
    Joined in the calls' own memory order (CUDA's kernels: [B, T, H, d] for a model's Q), which is the order the
    output's gradient comes back in from the model, so that the guard copies nothing there."""
    if len(v_parts) == 1:
        return _call(inp, q, k, v_parts[0], mask)
    return _guarded(_joined([_call(inp, q, k, part, mask, guard=False) for part in v_parts]))


def _joined(outs: list[torch.Tensor]) -> torch.Tensor:
    """Calls' outputs side by side along the columns, joined in their own memory order (module docstring)."""
    if heads_inside_tokens(outs[0]):
        return torch.cat([o.transpose(1, 2) for o in outs], dim=-1).transpose(1, 2)
    return torch.cat(outs, dim=-1)


def diff_attention_sdpa(
    inp: DiffAttentionInputs, fused_epilogue: bool = False, norm: tuple[float, float] | None = None
) -> torch.Tensor:
    """The ``sdpa`` route: one call, Q and K zero-padded to V's width where V is wider (module docstring).
    ``fused_epilogue`` (every route here has it): the subtraction by one kernel (:func:`_combine`)."""
    d, dv = inp.head_dim, inp.v_dim
    q, k, v, layout = _one_call_operands(inp)
    width = max(d, dv)
    if d < width:
        q, k = _padded(q, width - d), _padded(k, width - d)
    elif dv < width:
        v = _padded(v, width - dv)
    # the epilogue's backward writes the gradient of an output it reads whole in that output's layout: no guard
    o = _call(inp, q, k, v, _sdpa_mask(inp, head_layout=layout), guard=not (fused_epilogue and dv == width))
    return _combine(inp, o[..., :dv], layout, fused_epilogue, norm)


def _padded(x: torch.Tensor, n: int) -> torch.Tensor:
    """``x`` [B, H, N, w] zero-padded to width w + n in its own memory order: a model's Q (and K in training) is laid
    out [B, N, H, w], and so is then the call's output — which the DIFF layer normalises and joins into [B, N, H·dv]
    without a copy (diffattn.models.diff_llama) — and Q's and K's gradients, which reach the projections by a view."""
    if heads_inside_tokens(x):
        return F.pad(x.transpose(1, 2), (0, n)).transpose(1, 2)
    return F.pad(x, (0, n))


def _cudnn_device_reason(device_type: str, index: int | None) -> str | None:
    """Why the device cannot run cuDNN attention (None if it can)."""
    if device_type != "cuda":
        return f"device {device_type}: cuDNN attention runs on CUDA"
    if not torch.backends.cudnn.is_available():
        return "this torch has no cuDNN"
    if torch.cuda.get_device_capability(index)[0] < 8:
        return "cuDNN attention needs a GPU of compute capability >= 8.0"
    if (torch.backends.cudnn.version() or 0) < 90000:
        return f"cuDNN {torch.backends.cudnn.version()}: PyTorch's cuDNN attention needs cuDNN 9"
    return None


# asked in every layer of a compiled model: taken as a constant at trace time, its device queries never traced (as
# diffattn.ops.routes.listed_routes; the flag must sit on a plain function)
_cudnn_device_reason._dynamo_marked_constant = True  # type: ignore[attr-defined]


def cudnn_unsupported(inp: DiffAttentionInputs) -> str | None:
    """Why the ``cudnn`` route cannot take these inputs (None if it may: cuDNN itself has the last word, and a call
    it refuses raises "No available kernel", which ``auto`` answers with the next route)."""
    device_reason = _cudnn_device_reason(inp.q1.device.type, inp.q1.device.index)
    reasons = [device_reason] if device_reason else []
    if inp.q1.dtype not in (torch.float16, torch.bfloat16):
        reasons.append(f"dtype {inp.q1.dtype}: cuDNN attention takes float16 and bfloat16")
    if inp.head_dim > 128 or inp.v_dim > 256 or inp.head_dim % 8 or inp.v_dim % 8:
        reasons.append(
            f"head widths d={inp.head_dim}, dv={inp.v_dim}: taken here up to d = 128, dv = 256, multiples of 8"
        )
    if inp.num_heads != inp.num_kv_heads:
        reasons.append("GQA (fewer key heads than query heads): not measured through cuDNN")
    return "; ".join(reasons) or None


def diff_attention_cudnn(
    inp: DiffAttentionInputs, fused_epilogue: bool = False, norm: tuple[float, float] | None = None
) -> torch.Tensor:
    """The ``cudnn`` route: the same one call, forced to cuDNN attention, which takes V wider than Q and K — so no
    padding: DIFF V1's forward does its FLOP ideal (1.5x the baseline; measured on an H200 in
    ``../shared/gpu/h200-2026-11-26.md``: 1.55x forward, 1.50x forward+backward at d = 64)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v, layout = _one_call_operands(inp)
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        # the epilogue's backward writes the output's gradient whole in its layout: no guard needed (an autograd
        # Function less, host time a small model's step is bound by)
        o = _call(inp, q, k, v, _sdpa_mask(inp, head_layout=layout), guard=not fused_epilogue)
    return _combine(inp, o, layout, fused_epilogue, norm)


def split_unsupported(inp: DiffAttentionInputs) -> str | None:
    """Why the ``sdpa_split`` route cannot take these inputs (None if it can)."""
    d, dv = inp.head_dim, inp.v_dim
    if dv <= d or dv % d:
        return f"sdpa_split cuts V into slices of width d: needs dv a multiple of d above it, got d={d}, dv={dv}"
    return None


def diff_attention_sdpa_split(
    inp: DiffAttentionInputs, fused_epilogue: bool = False, norm: tuple[float, float] | None = None
) -> torch.Tensor:
    """The ``sdpa_split`` route: V cut into slices as wide as Q and K, one call over both maps per slice, so every call
    is FlashAttention-shaped with no padding (transformers' DiffLlama does this with two calls; QKᵀ is recomputed per
    slice, so its forward does 2x the QKᵀ FLOPs at dv = 2d, but it moves no padded copy of K: the route for
    decoding against a long cache, where padding copies the whole cache every token)."""
    if inp.v_stacked is not None and not inp.shares_keys and inp.v_stacked.shape[-1] == inp.head_dim:
        q, k, layout = _one_call_qk(inp)
        parts = v_twice_slices(inp)  # V's halves are the slices: [V; V] never joined whole
    else:
        q, k, v, layout = _one_call_operands(inp)
        parts = v.split(inp.head_dim, dim=-1)
    mask = _sdpa_mask(inp, head_layout=layout)
    if fused_epilogue and len(parts) == 2:
        from .triton.epilogue import parts_fit, subtract_pair_parts

        # each call's output read by the epilogue's kernel where it is, no join of the outputs forward; backward the
        # kernel writes the calls' gradients as the column halves of one buffer laid out as their join — the layout
        # the same calls get from sdpa_split's guarded join (one layout per cuDNN cache key, across routes). Outputs
        # it cannot read so are joined and guarded as sdpa_split's are
        outs = [_call(inp, q, k, part, mask, guard=False).to(inp.q1.dtype) for part in parts]
        if parts_fit(*outs):
            return _zero_fully_masked(inp, subtract_pair_parts(tuple(outs), inp.lam, layout, norm))
        return _combine(inp, _guarded(_joined(outs)), layout, fused_epilogue, norm)
    o = _sliced_call(inp, q, k, parts, mask)
    return _combine(inp, o, layout, fused_epilogue, norm)


def _one_map_mask(inp: DiffAttentionInputs) -> tuple[torch.Tensor | None, bool]:
    """The (attn_mask, is_causal) pair of a call over one map's H query heads."""
    mask, is_causal = _sdpa_mask(inp, head_layout="stacked")
    if mask is not None and mask.dim() == 4 and mask.shape[1] > 1:
        mask = mask[:, : inp.num_heads]  # a per-head mask was doubled for the stacked heads: one map's half
    return mask, is_causal


def diff_attention_sdpa_maps(
    inp: DiffAttentionInputs, fused_epilogue: bool = False, norm: tuple[float, float] | None = None
) -> torch.Tensor:
    """The ``sdpa_maps`` route: one SDPA call per map over its own K, nothing concatenated or padded; V used whole
    where it is as wide as Q (DIFF V2), else cut into slices of width d (the official DIFF code's four calls at
    dv = 2d). No copy of K or V is made per call: the route for decoding against a long cache, where the one-call
    routes copy the whole cache every token (H100, 2026-11-26: the official four calls decoded V1 at 2.49x the
    baseline, every one-call route at 4.5-7.8x; this backend is that computation, not yet measured as itself)."""
    mask = _one_map_mask(inp)
    parts = _value_slices(inp)
    o1 = _sliced_call(inp, inp.q1, inp.k1, parts, mask)
    return _subtract(inp, o1, _sliced_call(inp, inp.q2, inp.k2, parts, mask), fused_epilogue, norm)


def _value_slices(inp: DiffAttentionInputs) -> tuple[torch.Tensor, ...]:
    """V cut into slices as wide as Q and K (one slice where V is that wide). DiffLlama hands V over as its two halves,
    each d wide: those are the slices already, read in place — concatenating them to cut them again would copy the
    whole V (at decoding, the whole cache's V) every call, and its backward would split and copy it back."""
    if all(part.shape[-1] == inp.head_dim for part in inp.v_parts):
        return inp.v_parts
    return inp.v.split(inp.head_dim, dim=-1)


def maps_unsupported(inp: DiffAttentionInputs) -> str | None:
    """Why the ``sdpa_maps`` route cannot take these inputs (None if it can)."""
    d, dv = inp.head_dim, inp.v_dim
    if dv != d and dv % d:
        return f"sdpa_maps cuts V into slices of width d: needs dv = d or a multiple of it, got d={d}, dv={dv}"
    return None


def diff_attention_cudnn_maps(
    inp: DiffAttentionInputs, fused_epilogue: bool = False, norm: tuple[float, float] | None = None
) -> torch.Tensor:
    """The ``cudnn_maps`` route: one call per map forced to cuDNN attention with V whole (cuDNN takes V wider than Q):
    the two maps' FLOPs and nothing else — no concatenated Q, K or doubled V, whose copies and their backward the
    ``cudnn`` route pays (H100, 2026-11-26: ``cudnn`` 2.16x the baseline forward+backward at d = 64 against the bare
    call's 1.50x on an H200). Measured on an H200 (2026-11-27): 1.92x against `cudnn`'s 2.05x."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    mask = _one_map_mask(inp)
    v = inp.v  # once: given as halves, each read of inp.v concatenates them anew (a copy, and one more in backward)
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        o1 = _call(inp, inp.q1, inp.k1, v, mask)
        o2 = _call(inp, inp.q2, inp.k2, v, mask)
    return _subtract(inp, o1, o2, fused_epilogue, norm)
