"""The ``cudnn_direct`` route: one cuDNN attention call over both maps and the fused epilogue (DIFF Transformer Eq. 1,
docs/methods.md §0) as one autograd node — the host's share of a small model's training step, which is what a `small`
step on a GPU is bound by (issue 34: on the H200 of 2026-11-28 the baseline's GPU was busy 8.6 of its 40 ms a step).

The ``cudnn+epilogue`` route's kernels, called another way. There, a training call is a chain of autograd nodes —
[V; V]'s copy, SDPA's dispatch to cuDNN under ``sdpa_kernel``, the epilogue's autograd Function — each with its own
bookkeeping forward and its own Python or C++ node backward. Here one :class:`torch.autograd.Function` does the
whole call:

* forward: [V; V] from DiffLlama's V halves in one copy, cuDNN attention's ATen forward
  (``aten._scaled_dot_product_cudnn_attention``, exactly as ``F.scaled_dot_product_attention`` calls it for cuDNN:
  the same tensors, no mask, its log-sum-exp kept), then O1 − λ·O2 (and the head's norm, where given) by the epilogue's
  kernel;
* backward: the epilogue's backward kernel, which writes the gradient of the call's output whole in that output's
  layout (the layout cuDNN's backward graph is cached for: :mod:`diffattn.ops.sdpa`'s docstring), cuDNN attention's
  ATen backward (``aten._scaled_dot_product_cudnn_attention_backward``, with what autograd's formula for the forward
  passes it), and the two copies' gradients of V summed back into V's halves (:func:`._inputs.v_from_halves_grad`).

The same attention and epilogue kernels on the same inputs, and V's two gradients summed as autograd sums them: the same
numbers bit for bit (tests/ops/test_direct.py); on the H200 of 2026-11-29 1.66× the baseline against
``cudnn+epilogue``'s 1.82× (DIFF V1 at d = 64, 16K tokens). A layer's later calls of the same kind run the node with
nothing before it (:mod:`diffattn.ops.call_plans`).

Where both maps read the same K (DIFF V2, docs/methods.md §5; DAA and DiffQ pass theirs twice), the node takes the
query heads in interleaved pairs (map 1 and map 2 of head i at 2i and 2i + 1, as DIFF V2's layer hands them over) and K
and V once: cuDNN's grouped heads give query heads 2i and 2i + 1 key and value head i // (2H/Hkv), as the SDPA routes'
one call with ``enable_gqa`` does, and its backward sums each K and V head's shares itself — ``cudnn+epilogue``'s
computation for those inputs (V layout ``keys_shared``). The node would group fewer key heads too (GQA), but the route
takes what ``cudnn+epilogue`` takes, which refuses GQA (not measured through cuDNN:
:func:`diffattn.ops.sdpa.cudnn_unsupported`). Not yet timed on a GPU: the route sweep times it on DIFF V2's
training classes beside ``sdpa+epilogue`` and ``cudnn+epilogue`` (benchmarks/RESULTS.md, 2026-11-30).

Where its one node does not apply — no gradient needed, under ``torch.compile``, a mask or segments, causal with
T ≠ S (cuDNN's causal mask is aligned top-left, the op's bottom-right), or inputs cuDNN would refuse through SDPA
(``torch.backends.cuda.can_use_cudnn_attention``) — the route runs ``cudnn+epilogue`` itself, which takes every call
this route's support check admits. The ATen ops are private, so neither a forward nor a backward that raises at run time
ends the user's step: a forward's call runs ``cudnn+epilogue``; a backward's gradients come from SDPA's own backward
(its forward recomputed under autograd); calls like it run ``cudnn+epilogue`` from then on, and one log line says so —
unless the error left the CUDA context unusable, where nothing could run after it.

The ``cudnn_shared_v`` route is the same node for DIFF V1 handed over in interleaved pairs (the official DIFF code's
layout, :func:`diffattn.ops.diff_attention_pairs` with K in pairs): Q [B, 2H, T, d] and K [B, 2H, S, d] with map 1
and map 2 of head j at 2j and 2j + 1, V [B, H, S, 2d] once. cuDNN's grouped heads (GQA: query head i reads key head
i // (2H/h_k) and value head i // (2H/h_v), with h_k and h_v each dividing 2H — cuDNN frontend's rule, which lets
h_k and h_v differ) then read V's head j for both query heads of pair j: no [V; V] forward, no sum of its two
gradients backward — cuDNN's backward sums each V head's two shares itself — and the epilogue subtracts interleaved
pairs. ``F.scaled_dot_product_attention`` cannot express that call (its K and V have one head count), so whether
cuDNN takes it is known only when the ATen op runs: where it raises, the route runs ``cudnn+epilogue`` as above. On
the H200 of 2026-11-28 [V; V]'s copy and the sum of dV's halves were 0.44 ms of ``cudnn+epilogue``'s 4.0 ms GPU time
per call at 16K tokens (benchmarks/gpu-runs/h200-2026-11-28/kernels.json). ``cudnn_shared_v_split`` makes one such
call per column slice of V as wide as Q (views of V), as ``sdpa_split`` calls for DIFF V1's dv = 2d — every call's
value head as wide as its query head (cuDNN's dv = 256 calls were the slow ones at d = 128) — with the two outputs
read where they are by the epilogue's parts kernel; Q's and K's gradients are the two calls' summed, V's the two
slices' side by side.

Their speed is a prediction until a GPU times it (benchmarks/RESULTS.md, 2026-11-29): the route table lists them only
where the sweep measured them correct against float64 and fastest, and the `small` step's forced columns
(``cudnn_direct``, ``cudnn_direct+norm``) can put ``cudnn_direct`` first for the small class
(:mod:`diffattn.bench.switches`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import call_plans
from ._inputs import DiffAttentionInputs, v_from_halves, v_from_halves_grad
from .routes import DIRECT, SHARED_V, SHARED_V_SPLIT, error_line, poisons_cuda_context

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AttentionOps:
    """One attention call's forward and backward as the one node calls them: ``forward(q, k, v, causal, scale)`` →
    (output, tensors its backward needs, other values it needs); ``backward(do, q, k, v, out, tensors, values,
    causal, scale)`` → (dq, dk, dv); ``accepts(key, q, k, v, v_layout, causal)``: whether the call (of kind ``key``,
    :func:`_call_key`) can take Q, K and the V made from ``v`` as ``v_layout`` says (:data:`V_LAYOUTS`)."""

    forward: Callable[..., tuple]
    backward: Callable[..., tuple]
    accepts: Callable[..., bool]


def _cudnn_forward(q, k, v, causal: bool, scale: float):
    out, lse, cum_q, cum_k, max_q, max_k, seed, offset, _ = torch.ops.aten._scaled_dot_product_cudnn_attention(
        q, k, v, None, True, 0.0, causal, False, scale=scale
    )
    return out, (lse, cum_q, cum_k, seed, offset), (max_q, max_k)


def _cudnn_backward(do, q, k, v, out, tensors, values, causal: bool, scale: float):
    lse, cum_q, cum_k, seed, offset = tensors
    max_q, max_k = values
    return torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
        do, q, k, v, out, lse, seed, offset, None, cum_q, cum_k, max_q, max_k, 0.0, causal, scale=scale
    )


#: how the one node is handed V (:func:`_v_calls`): DiffLlama's V halves stacked as heads [B, 2Hkv, S, dv/2], V whole
#: [B, Hkv, S, dv] (both: [V; V] made for both maps' stacked heads), or V whole read once by both maps' query heads in
#: interleaved pairs through cuDNN's grouped heads — in one call (``cudnn_shared_v``) or one call per column slice of
#: V as wide as Q (``cudnn_shared_v_split``) — or, where both maps read the same K (DIFF V2), K and V whole, each read
#: once by both maps' query heads in interleaved pairs (``keys_shared``, the ``cudnn_direct`` route)
V_LAYOUTS = ("halves", "whole", "shared", "shared_split", "keys_shared")
#: the layouts whose V is read once with Q and K in interleaved pairs (DIFF V1: K in pairs too), and the route of each
SHARED_ROUTES = {"shared": SHARED_V, "shared_split": SHARED_V_SPLIT}
#: the layouts whose query heads come in interleaved pairs (the epilogue subtracts neighbouring heads)
PAIRED_LAYOUTS = (*SHARED_ROUTES, "keys_shared")


def _call_key(q, k, v, v_layout: str, causal: bool) -> tuple:
    """A kind of call: the shapes and strides of Q, K and V, how V is handed over, dtype, device, causality."""
    return q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), v_layout, q.dtype, q.device, causal


#: kind of call (:func:`_call_key`) → whether cuDNN takes it
_ACCEPTED: dict[tuple, bool] = {}
#: kinds of call whose one-node backward raised in this process → the error: they run ``cudnn+epilogue`` from then on
_REFUSED: dict[tuple, str] = {}


def _cudnn_accepts(key: tuple, q, k, v, v_layout: str, causal: bool) -> bool:
    """Whether ``F.scaled_dot_product_attention`` forced to cuDNN would run the call on Q, K and the (first) call's V
    made from ``v`` (its own check, so that the ATen op is called only where SDPA would call it; where V is read once
    and K is not (``shared``, ``shared_split``), the same call with V's heads repeated for each pair, which SDPA can be
    asked about — whether cuDNN's grouped heads take it is known when it runs: :func:`diff_attention_cudnn_direct`;
    where K and V are both read once (``keys_shared``), the call itself, with ``enable_gqa``); asked once per kind of
    call (the V it is asked about, needing a gradient where V does, is made then only)."""
    if key not in _ACCEPTED:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        try:
            with torch.no_grad():
                v_call = _sdpa_v(_v_calls(v, v_layout, q.shape[-1])[0], v_layout).requires_grad_(v.requires_grad)
            # enable_gqa where K has fewer heads than Q (keys_shared: DIFF V2's 2H query heads over K's Hkv; and any
            # call under GQA, which the route's support check refuses before it gets here)
            params = torch.backends.cuda.SDPAParams(q, k, v_call, None, 0.0, causal, _grouped(q, k))
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                _ACCEPTED[key] = bool(torch.backends.cuda.can_use_cudnn_attention(params))
        except (RuntimeError, TypeError, AttributeError):  # another torch's SDPAParams: the SDPA route instead
            _ACCEPTED[key] = False
    return _ACCEPTED[key]


#: cuDNN attention's ATen forward and backward: what the route calls on CUDA
CUDNN = AttentionOps(_cudnn_forward, _cudnn_backward, _cudnn_accepts)
#: the ops the one node calls (tests put a reference pair here to run it without a GPU)
ATTENTION_OPS = CUDNN


class _OneNode(torch.autograd.Function):
    """The whole call, forward and backward, as one autograd node (module docstring). ``v`` as ``v_layout`` says
    (:data:`V_LAYOUTS`); Q and K over both maps' heads stacked, or in interleaved pairs where V is read once
    (:data:`SHARED_ROUTES`), or Q in interleaved pairs over K and V read once (``keys_shared``: DIFF V2). One attention
    call per V of :func:`_v_calls` (two for V's column slices), their outputs read where they are by the epilogue's
    kernel."""

    @staticmethod
    def forward(ctx, q, k, v, lam, v_layout, causal, scale, norm_eps, norm_scale, ops):
        from .triton.epilogue import _subtract_pair_impl, _subtract_parts_impl

        v_calls = _v_calls(v, v_layout, q.shape[-1])
        calls = [ops.forward(q, k, v_call, causal, scale) for v_call in v_calls]
        outs = [o for o, _, _ in calls]
        interleaved = v_layout in PAIRED_LAYOUTS
        if len(outs) == 1:
            out = _subtract_pair_impl(outs[0], lam, interleaved, norm_eps, norm_scale)
        else:
            out = _subtract_parts_impl(*outs, lam, interleaved, norm_eps, norm_scale)
        ctx.save_for_backward(q, k, v, lam, *v_calls, *outs, *(t for _, tensors, _ in calls for t in tensors))
        ctx.setup = (v_layout, causal, scale, norm_eps, norm_scale, ops, [(len(t), values) for _, t, values in calls])
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable  # the kernels' gradients have no graph: a second derivative raises
    def backward(ctx, g):
        from .triton.epilogue import _lambda_grad, _subtract_pair_bwd_impl, _subtract_parts_bwd_impl

        q, k, v, lam, *rest = ctx.saved_tensors
        v_layout, causal, scale, norm_eps, norm_scale, ops, per_call = ctx.setup
        n = len(per_call)
        v_calls, outs, rest = rest[:n], rest[n : 2 * n], rest[2 * n :]
        interleaved = v_layout in PAIRED_LAYOUTS
        # one call's output gradient in its output's layout; two calls' (V's slices) the halves of their join's layout,
        # as sdpa_split hands the same calls theirs (one layout per cuDNN cache key, across routes)
        if n == 1:
            do, dlam_rows = _subtract_pair_bwd_impl(g, outs[0], lam, interleaved, norm_eps, norm_scale)
            dos = (do,)
        else:
            *dos, dlam_rows = _subtract_parts_bwd_impl(g, *outs, lam, interleaved, norm_eps, norm_scale)
        grads = []
        for do, v_call, o, (count, values) in zip(dos, v_calls, outs, per_call, strict=True):
            tensors, rest = rest[:count], rest[count:]
            try:
                grads.append(ops.backward(do, q, k, v_call, o, tensors, values, causal, scale))
            except RuntimeError as err:  # a backward that cannot run never ends the user's step (module docstring)
                grads.append(_backward_refused(err, (q, k, v, v_layout, causal), do, v_call, scale))
        dq, dk = grads[0][0], grads[0][1]
        for more in grads[1:]:  # the slices' calls each read all of Q and K
            dq, dk = dq + more[0], dk + more[1]
        dv = _v_grad([grad[2] for grad in grads], v, v_layout)
        return dq, dk, dv, _lambda_grad(dlam_rows, lam), None, None, None, None, None, None


def _v_grad(dv_calls: list[torch.Tensor], v: torch.Tensor, v_layout: str) -> torch.Tensor:
    """V's gradient from the gradients of the V of each call (:func:`_v_calls`), as autograd computes it through
    them: [V; V]'s two copies summed (back into V's halves where ``halves``: bit for bit autograd's, strides
    included); V's own where ``shared`` or ``keys_shared`` (cuDNN's grouped heads summed each V head's query heads'
    shares); the two column slices' side by side where ``shared_split``."""
    if v_layout == "halves":
        return v_from_halves_grad(dv_calls[0], v, copies=2)
    if v_layout == "whole":
        hkv = v.shape[1]
        return dv_calls[0][:, :hkv] + dv_calls[0][:, hkv:]
    return dv_calls[0] if len(dv_calls) == 1 else torch.cat(dv_calls, dim=-1)


def _backward_refused(err: RuntimeError, call: tuple, do, v_call, scale: float):
    """Q's, K's and the call's V's gradients by SDPA's own backward (its forward recomputed under autograd, default
    dispatch) where cuDNN's ATen backward raised — said in one line, and calls of that kind run ``cudnn+epilogue``
    from then on. An error that leaves the CUDA context unusable is raised: nothing after it could run."""
    q, k, v, v_layout, causal = call
    key = _call_key(q, k, v, v_layout, causal)
    _refuse(err, key, v_layout, "backward", "this call's gradients by SDPA's own backward")
    with torch.enable_grad():
        leaves = [x.detach().requires_grad_() for x in (q, k, v_call)]
        out = F.scaled_dot_product_attention(leaves[0], leaves[1], _sdpa_v(leaves[2], v_layout), is_causal=causal,
                                             scale=scale, enable_gqa=_grouped(q, k))  # fmt: skip
        return torch.autograd.grad(out, leaves, do)


def _refuse(err: RuntimeError, key: tuple, v_layout: str, step: str, now: str) -> None:
    """Calls of kind ``key`` run ``cudnn+epilogue`` from now on, said in one line — unless ``err`` left the CUDA
    context unusable, where nothing could run after it: raised."""
    text = error_line(err)
    if poisons_cuda_context(text):
        raise err
    said = key in _REFUSED  # the other slice's call of the same kind: said once
    _REFUSED[key] = text
    call_plans.forget()  # a plan may run this node for calls of this kind
    if said:
        return
    route = SHARED_ROUTES.get(v_layout, DIRECT)
    logger.warning("%s: cuDNN's %s raised (%s); %s, and calls like it run cudnn+epilogue from now on", route, step,
                   text, now)  # fmt: skip


def one_node_operands(inp: DiffAttentionInputs, v_shared: str | None = None):
    """(q, k, v, v_layout) the one node takes for ``inp``, or None where it does not apply (module docstring).
    ``cudnn_direct``, in training only: Q and K over both maps' heads as the caller had them (else joined), V's halves
    as the caller stacked them (else V); where both maps read the same K (DIFF V2), the query heads in interleaved pairs
    as the caller had them (else interleaved), K and V themselves (``keys_shared``: both query heads of a pair read
    one key head, under GQA too). ``v_shared`` (``"shared"``: ``cudnn_shared_v``; ``"shared_split"``:
    ``cudnn_shared_v_split``, V twice as wide as Q): Q and K in interleaved pairs as the caller had them
    (:attr:`DiffAttentionInputs.qk_pairs`; none: None) with one key head per query head (cuDNN's groups would give a
    query head of a pair another pair's keys under GQA), V whole, with or without a gradient."""
    if torch.compiler.is_compiling() or inp.attn_mask is not None or inp.segment_ids is not None:
        return None
    if inp.causal and inp.q_len != inp.kv_len:
        return None
    if inp.shares_keys:
        if v_shared is not None or not inp.wants_grad:
            return None
        from .sdpa import _one_call_qk

        q, k, _ = _one_call_qk(inp)  # the interleaved pairs over K itself
        return q, k, inp.v, "keys_shared"
    if v_shared is not None:
        if inp.qk_pairs is None or inp.num_kv_heads != inp.num_heads:
            return None
        if v_shared == "shared_split" and inp.v_dim != 2 * inp.head_dim:
            return None
        q, k = inp.qk_pairs
        return q, k, inp.v, v_shared
    if not inp.wants_grad:
        return None
    whole = inp.qk_whole
    q, k = whole if whole is not None else (torch.cat([inp.q1, inp.q2], dim=1), torch.cat([inp.k1, inp.k2], dim=1))
    halves = inp.v_stacked is not None
    return q, k, inp.v_stacked if halves else inp.v, "halves" if halves else "whole"


def _v_calls(v: torch.Tensor, v_layout: str, d: int) -> tuple[torch.Tensor, ...]:
    """The V of each attention call: [V; V] over both maps' stacked heads, [B, 2Hkv, S, dv], from V's halves (one
    copy) or from V; V itself where ``shared`` or ``keys_shared``; V's two column slices as wide as Q (``d``), views,
    where ``shared_split``."""
    if v_layout == "shared_split":
        return tuple(v.split(d, dim=-1))
    if v_layout in ("shared", "keys_shared"):
        return (v,)
    return (v_from_halves(v, copies=2) if v_layout == "halves" else torch.cat([v, v], dim=1),)


def _sdpa_v(v_call: torch.Tensor, v_layout: str) -> torch.Tensor:
    """The V an SDPA call over the same Q and K takes for a call's ``v_call``: V's heads repeated for each pair of
    query heads where V is read once and K is not (what cuDNN's grouped heads read: SDPA's K and V have one head
    count), else ``v_call`` itself (``keys_shared``: K and V have one head count, and SDPA groups both)."""
    return v_call.repeat_interleave(2, dim=1) if v_layout in SHARED_ROUTES else v_call


def _grouped(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether an SDPA call over ``q`` and ``k`` groups query heads over fewer key heads (its ``enable_gqa``)."""
    return q.shape[1] != k.shape[1]


def diff_attention_cudnn_direct(
    inp: DiffAttentionInputs, norm: tuple[float, float] | None = None, v_shared: str | None = None
) -> torch.Tensor:
    """The ``cudnn_direct`` route, or with ``v_shared`` a route that reads V once (:data:`SHARED_ROUTES`; module
    docstring): one autograd node where it applies, else ``cudnn+epilogue``. ``norm`` (eps, scale): the head's norm in
    the epilogue's kernel (:class:`diffattn.ops.HeadNorm`)."""
    from .sdpa import diff_attention_cudnn
    from .triton.epilogue import _norm_eps_scale

    operands = one_node_operands(inp, v_shared)
    if operands is not None:
        q, k, v, v_layout = operands
        ops = ATTENTION_OPS
        causal = True if inp.causal else False  # noqa: SIM210 (a Python bool for the ATen op)
        key = _call_key(q, k, v, v_layout, causal)  # the kind of call, once: both checks below read it
        if key not in _REFUSED and ops.accepts(key, q, k, v, v_layout, causal):
            eps, scale = _norm_eps_scale(norm)
            constants = (v_layout, causal, inp.scale, eps, scale, ops)
            try:
                out = _OneNode.apply(q, k, v, inp.lam, *constants)
            except RuntimeError as err:  # cuDNN's ATen forward refused (its grouped heads with V shared, say)
                _refuse(err, key, v_layout, "forward", "this call by cudnn+epilogue")
            else:  # calls like this one may skip what came before the node (diffattn.ops.call_plans)
                stale = lambda: ATTENTION_OPS is not ops  # noqa: E731 (the ops it was made with replaced)
                call_plans.saw_node(_OneNode.apply, (q, k, v, inp.lam), constants, stale, out)
                return out
    return diff_attention_cudnn(inp, fused_epilogue=True, norm=norm)


def diff_attention_cudnn_shared_v(inp: DiffAttentionInputs, norm: tuple[float, float] | None = None) -> torch.Tensor:
    """The ``cudnn_shared_v`` route (module docstring): DIFF V1 in interleaved pairs by one cuDNN call that reads each V
    head once for both maps, and the epilogue, as one autograd node; ``cudnn+epilogue`` where that does not apply."""
    return diff_attention_cudnn_direct(inp, norm, v_shared="shared")


def diff_attention_cudnn_shared_v_split(
    inp: DiffAttentionInputs, norm: tuple[float, float] | None = None
) -> torch.Tensor:
    """The ``cudnn_shared_v_split`` route (module docstring): ``cudnn_shared_v`` with one cuDNN call per column slice of
    V as wide as Q (DIFF V1's dv = 2d: every call's value head as wide as its query head, as ``sdpa_split``'s are, with
    no [va; va] or [vb; vb] made), the two outputs read where they are by the epilogue; ``cudnn+epilogue`` where that
    does not apply."""
    return diff_attention_cudnn_direct(inp, norm, v_shared="shared_split")
