"""A call's plan: the op's per-call host work skipped where a call of the same kind went straight to one autograd node
before (DIFF Transformer Eq. 1 by the ``cudnn_direct`` and ``cudnn_shared_v`` routes, :mod:`diffattn.ops.direct`);
and a route plan (:class:`RoutePlan`, the second half of this module): a decoding call's checks and route resolution
skipped where a call of the same kind without gradient was decided before, its route then run as it is.

Why: a `small` model's training step on a GPU is bound by its host (issue 34; on the H200 of 2026-11-28 the baseline's
GPU was busy 8.6 of its 40 ms a step, and DIFF's step was 1.03–1.06× DiffLlama's wall time at 0.87–0.94× its GPU time).
Of the op's host time in that step, about a third came before its one node ran (benchmarks/RESULTS.md, 2026-11-29, "A
call's plan"): the entry's checks of its arguments' layout, the caller's tensors cut into each map's views and checked
(:func:`diffattn.ops._inputs.validate`), autocast's handling, the route's resolution (a support check for an explicit
backend, the call class and the route table for ``auto``), the route's own checks of whether its one node applies
(:func:`diffattn.ops.direct.one_node_operands`, cuDNN's acceptance) — each a few µs, none of which depends on anything
but the call's metadata.

How: the entries that hand the op both maps' Q and K whole (:func:`diffattn.ops.diff_attention_stacked` and
:func:`diffattn.ops.diff_attention_pairs`, the DIFF V1 and V2 layers') key each call by :func:`signature` — what the
op's decision reads of the call and of the switches a user sets: the backend asked for, the tensors' shapes, strides,
dtypes, devices and whether they require a gradient, λ's, causality, the scale, the head norm, grad mode, autocast's
state, the forced switches of :data:`diffattn.ops.routes.FORCED_FLAGS`, the route tables'
:data:`~diffattn.ops.routes.TABLE_GENERATION` — and run the op's whole path the first time, recording what it called.
Where that was exactly one node on the caller's own Q, K, V and λ (no copy, nothing else; under autocast the casts the
whole path makes, which the entry then makes first; λ as given or the view of it the path's check makes — one per head
[1, H, 1, 1], DIFF V2's one per head and token [B, H, T, 1] — which the plan makes again), later calls of the same
signature call that node with the same constants and nothing before it: the same autograd Function on the same tensors,
so the same numbers and the same graph. A plan is never made under ``torch.compile`` (which traces the path once
anyway), for a mask or segments (their values decide the rows masked), for λ that is not a tensor, on the meta device;
λ's finiteness, a value, is still checked on the CPU (:func:`diffattn.ops._inputs.check_lambda_finite`).

What could change the path's answer for the same signature forgets the plans (:func:`forget`) — a route that failed at
run time (``auto``'s next route), cuDNN refusing a node's forward or backward (its calls then run ``cudnn+epilogue``),
the node's attention ops replaced (tests) — or is in the signature: a route table read again
(:func:`diffattn.ops.routes.reset`), a switch forced. A plan whose node raises runs the whole path again. Bounded:
:data:`MAX_PLANS` signatures, then all forgotten (a run whose sequence length changes every batch makes a new signature
each time).
"""

from __future__ import annotations

import contextvars
import dataclasses
import operator
from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import _inputs, routes
from ._inputs import HeadNorm

#: how many signatures are remembered before all are forgotten
MAX_PLANS = 1024


@dataclass(frozen=True)
class NodePlan:
    """What a call of one signature ran: ``apply(q, k, v, lam, *constants)`` (an autograd Function's apply), with
    autocast off on ``autocast_off`` (the device type whose autocast the op turns off inside, else None); ``stale()``:
    whether what the node was made with has been replaced since (its attention ops, which tests replace);
    ``lam_shape``: the shape of the view of the caller's λ the node took (None: λ itself)."""

    apply: Callable[..., torch.Tensor]
    constants: tuple
    stale: Callable[[], bool]
    autocast_off: str | None
    lam_shape: torch.Size | None = None


#: signature → its plan
PLANS: dict[tuple, NodePlan] = {}
#: the nodes the call being planned ran, (apply, (q, k, v, lam), constants, stale, output) each; None: no call planned
_SEEN: contextvars.ContextVar[list | None] = contextvars.ContextVar("diffattn_call_plan_seen", default=None)


#: how many times the plans were forgotten: a plan recorded across a :func:`forget` is not kept
_FORGOTTEN = [0]
#: where a signature holds the head norm, and autocast's dtype (None: autocast off)
_HEAD_NORM, _AUTOCAST = 4, 6


def _layout(x: torch.Tensor) -> tuple:
    return x.shape, x.stride(), x.dtype, x.device, x.requires_grad


def signature(entry: str, backend: str, q, k, v, lam, causal, attn_mask, scale, segment_ids, head_norm) -> tuple | None:
    """The key of a call of ``entry`` (the op's entry function's name) with these arguments — what the op's decision
    for the call reads of it and of the switches a user sets (module docstring) — or None where no plan is made or
    used: besides the cases of the module docstring, arguments the whole path refuses (a backend not a string, a scale
    not a number, a head norm not a :class:`HeadNorm`: its error is the whole path's to give), tensors of a subclass or
    under a ``__torch_function__`` mode (which may act on the ops a plan skips)."""
    if attn_mask is not None or segment_ids is not None or torch.compiler.is_compiling():
        return None
    if not all(type(x) is torch.Tensor for x in (q, k, v, lam)):
        return None
    if not isinstance(backend, str) or not (scale is None or type(scale) in (float, int)):
        return None
    if head_norm is not None and not isinstance(head_norm, HeadNorm):
        return None
    if torch._C._is_torch_function_mode_enabled():
        return None
    device = q.device.type
    if device == "meta":  # no autocast state to ask for there
        return None
    autocast = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
    flags = tuple(routes.FORCED_FLAGS.values())
    # a decoding call captured into a CUDA graph reads another order than one run eagerly (routes.EAGER_ROUTES)
    captured = q.shape[-2] == 1 and _inputs.stream_capturing()
    return (entry, backend, bool(causal), scale, head_norm, torch.is_grad_enabled(), autocast,  # autocast at _AUTOCAST
            flags, routes.TABLE_GENERATION, captured, _layout(q), _layout(k), _layout(v), _layout(lam))  # fmt: skip


def under_autocast(key: tuple) -> bool:
    """Whether a call of signature ``key`` runs under autocast: the entry casts its Q, K and V to autocast's dtype as
    the whole path would (:func:`diffattn.ops._autocast_inputs`), so that a plan's node and the recorded one take the
    same tensors."""
    return key[_AUTOCAST] is not None


def run(key: tuple, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lam: torch.Tensor) -> torch.Tensor | None:
    """The call by its plan, or None where ``key`` has none (or its plan is stale, or its node raised: forgotten, and
    the caller runs the whole path, which answers a refusal as it always does)."""
    plan = PLANS.get(key)
    if plan is None:
        return None
    if plan.stale():
        forget()
        return None
    _inputs.check_lambda_finite(lam)  # (through its module: the one name a benchmark replaces)
    if plan.lam_shape is not None:
        lam = lam.view(plan.lam_shape)  # the view the whole path's check made (a node in the graph, as there)
    try:
        if plan.autocast_off is None:
            return plan.apply(q, k, v, lam, *plan.constants)
        with torch.autocast(plan.autocast_off, enabled=False):
            return plan.apply(q, k, v, lam, *plan.constants)
    except torch.OutOfMemoryError:  # the caller's to see, as on the whole path (diffattn.ops._run_auto)
        raise
    except Exception:  # a refusal, a kernel that does not build: the whole path answers it as it always does
        forget()
        return None


def planned(key: tuple | None, tensors: tuple[torch.Tensor, ...], whole: Callable[[], torch.Tensor]) -> torch.Tensor:
    """``whole()`` — the op's whole path for a call of signature ``key`` (None: not planned, nothing recorded) — and,
    where it ran exactly one node, on ``tensors`` themselves (q, k, v, λ: no cast, no copy; λ or a view of it,
    :func:`_lam_view`), whose output is the call's (nothing after it, such as the head's norm by PyTorch), that node
    made the plan for ``key``."""
    if key is None:
        return whole()
    out, seen, forgotten = _recording(_SEEN, whole)
    if len(seen) == 1:
        apply, operands, constants, stale, node_out = seen[0]
        same = len(operands) == len(tensors) == 4 and all(map(operator.is_, operands[:3], tensors[:3]))
        lam_shape = _lam_view(operands[3], tensors[3]) if same else False
        # (and no plan forgotten meanwhile, by another thread's refusal say: what was recorded may be stale)
        if lam_shape is not False and node_out is out and not forgotten:
            if len(PLANS) >= MAX_PLANS:
                PLANS.clear()
            autocast_off = tensors[0].device.type if key[_AUTOCAST] is not None else None
            PLANS[key] = NodePlan(apply, constants, stale, autocast_off, lam_shape)
    return out


def _recording(seen_var: contextvars.ContextVar, whole: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, list, bool]:
    """``whole()``, what it recorded into ``seen_var`` meanwhile (:func:`saw_node`, :func:`saw_route`), and whether the
    plans were forgotten meanwhile (by another thread's refusal, say: what was recorded may be stale)."""
    forgotten_before = _FORGOTTEN[0]
    seen: list = []
    token = seen_var.set(seen)
    try:
        out = whole()
    finally:
        seen_var.reset(token)
    return out, seen, _FORGOTTEN[0] != forgotten_before


def _lam_view(taken: torch.Tensor, lam: torch.Tensor) -> torch.Size | bool | None:
    """How the node took the caller's ``lam``: None where ``taken`` is ``lam`` itself; the shape where ``taken`` is the
    view ``lam.view(shape)`` makes again (the same memory, shape and strides, and a view of ``lam`` in autograd's graph:
    the path's check makes its views of λ by ``view``, so the plan's is the same node); False where it is neither (a
    copy or a cast: no plan)."""
    if taken is lam:
        return None
    if taken._base is not (lam if lam._base is None else lam._base) or taken.data_ptr() != lam.data_ptr():
        return False
    try:
        again = lam.view(taken.shape)
    except RuntimeError:
        return False
    return taken.shape if again.stride() == taken.stride() else False


def saw_node(apply: Callable[..., torch.Tensor], operands: tuple, constants: tuple, stale: Callable[[], bool],
             out: torch.Tensor) -> None:  # fmt: skip
    """Record a node the call being planned ran and its output (:func:`planned`; :class:`NodePlan` for the other
    arguments); nothing when no call is planned."""
    seen = _SEEN.get()
    if seen is not None:
        seen.append((apply, operands, constants, stale, out))


def forget() -> None:
    """Forget every plan, route plans too (module docstring: what makes them stale)."""
    PLANS.clear()
    ROUTE_PLANS.clear()
    _SIGHTED.clear()
    _FORGOTTEN[0] += 1


# --------------------------------------------------------------------------------------------------------------------
# Route plans: a call without gradient whose route is several nodes (decoding)
# --------------------------------------------------------------------------------------------------------------------
#
# Why: an eager decoding token is all host time (the H200, 2026-11-29: `small` 7.0 ms a token eagerly against 0.40 in a
# CUDA graph), and the op's part of it is its whole path every call: the entry's checks, validate's, the route's
# resolution (auto's call class and table order, or an explicit backend's support check) — then the route (SDPA calls,
# the epilogue), which is the work. A decoding call of one signature resolves to the same route every token, so the
# second call's route is remembered with what validate made of the arguments (not the first's: a cache that grows every
# token makes a new signature every token, which that token's layers then share), and later calls of that signature cut
# the caller's tensors the same way and run that route (benchmarks/RESULTS.md, 2026-11-30, "An eager decoding step's
# host work"). Only where the whole path is the same computation: the entries taking Q and K whole (DiffLlama's layers,
# DIFF V2's), no gradient (training calls' one-node plans are above), no autocast, no segments, a mask taken as it is
# (a bool mask, or an additive one in Q's dtype: validate's is then the caller's own tensor), and where cutting the
# tensors again gives validate's inputs exactly (:func:`_same_inputs`, checked when the plan is made). λ's finiteness,
# a value, is still checked (on the CPU). The head norm is the call's own: the key says only whether one comes.


@dataclass(frozen=True)
class RoutePlan:
    """What a call without gradient of one signature ran: ``route`` on the caller's tensors cut as its entry cuts them
    (:func:`plan_inputs`) with the cut's flag ``split`` — the stacked entry's V halves stacked as heads
    (:func:`~diffattn.ops._inputs.stacked_cut`), the pairs entry's K in pairs (:func:`~diffattn.ops._inputs.pairs_cut`)
    —, λ as given or by the view of ``lam_shape``, ``causal`` and ``scale`` as validate made them."""

    entry: str
    route: str
    split: bool
    lam_shape: torch.Size | None
    causal: bool
    scale: float


#: route signature → its plan
ROUTE_PLANS: dict[tuple, RoutePlan] = {}
#: the route signatures called once so far (a plan is made at the second call)
_SIGHTED: set[tuple] = set()
#: the routes the call being planned ran, (route, inputs) each; None: no call planned
_ROUTES_SEEN: contextvars.ContextVar[list | None] = contextvars.ContextVar("diffattn_route_plan_seen", default=None)


def route_signature(key: tuple | None, entry: str, backend: str, q, k, v, lam, causal, attn_mask, scale, segment_ids,
                    head_norm) -> tuple | None:  # fmt: skip
    """The key of a route plan for this call (``key``: its :func:`signature`, None with a mask), or None where none is
    made or used (the cases of the comment above; what :func:`signature` refuses)."""
    if entry not in ("stacked", "pairs") or segment_ids is not None:
        return None
    if attn_mask is not None:
        if type(attn_mask) is not torch.Tensor:
            return None
        if _inputs.wants_grad(*(x for x in (q, k, v, lam, attn_mask) if isinstance(x, torch.Tensor))):
            return None  # a training call with a mask: no route plan, and no second signature worked out for one
        key = signature(entry, backend, q, k, v, lam, causal, None, scale, None, head_norm)
        mask = _layout(attn_mask)
    else:
        mask = None
    if key is None or key[_AUTOCAST] is not None or _inputs.wants_grad(q, k, v, lam, attn_mask):
        return None
    # whether a head norm comes, not its numbers: a plan applies the call's own (DIFF's differ by layer, λ_init's
    # depth), so one token's layers share a signature — a cache that grows every token makes a new one each token, its
    # plan made at the token's second layer and run from the third on
    return (*key[:_HEAD_NORM], head_norm is not None, *key[_HEAD_NORM + 1 :], mask)


def route_plan(key: tuple | None) -> RoutePlan | None:
    return None if key is None else ROUTE_PLANS.get(key)


def plan_inputs(plan: RoutePlan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lam: torch.Tensor,
                attn_mask: torch.Tensor | None) -> _inputs.DiffAttentionInputs:  # fmt: skip
    """The inputs validate made for the call ``plan`` was made of, made again from these tensors by the cut the plan's
    entry makes (:func:`~diffattn.ops._inputs.stacked_cut`, :func:`~diffattn.ops._inputs.pairs_cut`: the one home of
    each), without validate's checks."""
    cut = _inputs.pairs_cut if plan.entry == "pairs" else _inputs.stacked_cut
    (q1, k1, q2, k2, v_in), whole = cut(q, k, v, plan.split)
    lam_t = lam if plan.lam_shape is None else lam.view(plan.lam_shape)
    parts = v_in if isinstance(v_in, tuple) else (v_in,)
    return _inputs.DiffAttentionInputs(q1, k1, q2, k2, parts, lam_t, plan.causal, attn_mask, plan.scale, **whole)


def planned_route(key: tuple | None, tensors: tuple, attn_mask: torch.Tensor | None,
                  whole: Callable[[], torch.Tensor]) -> torch.Tensor:  # fmt: skip
    """``whole()`` — the op's path for a call of route signature ``key`` (None: nothing recorded) — and, where it ran
    exactly one route on inputs that cutting ``tensors`` (q, k, v, λ) again gives exactly (:func:`_same_inputs`), the
    plan for ``key``."""
    if key is None:
        return whole()
    if key not in _SIGHTED:  # made from a signature's second call: a cache that grows every token (transformers'
        if len(_SIGHTED) >= MAX_PLANS:  # dynamic cache) makes a new signature each token, which its first layer's
            _SIGHTED.clear()  # call would record for nothing if its model had one layer
        _SIGHTED.add(key)
        return whole()
    out, seen, forgotten = _recording(_ROUTES_SEEN, whole)
    if len(seen) != 1 or forgotten:
        return out
    route, inp = seen[0]
    q, k, v, lam = tensors
    lam_shape = _lam_view(inp.lam, lam)
    if lam_shape is False or inp.attn_mask is not attn_mask:
        return out
    split = inp.qk_pairs is not None if key[0] == "pairs" else len(inp.v_parts) == 2
    plan = RoutePlan(key[0], route, split, lam_shape, inp.causal, inp.scale)
    if _same_inputs(plan_inputs(plan, q, k, v, lam, attn_mask), inp):
        if len(ROUTE_PLANS) >= MAX_PLANS:
            ROUTE_PLANS.clear()
        ROUTE_PLANS[key] = plan
    return out


def saw_route(route: str, inp) -> None:
    """Record that the call being planned ran ``route`` on ``inp`` (:func:`planned_route`); nothing when none is, as
    under torch.compile (which plans nothing, and cannot trace a context variable's read)."""
    if torch.compiler.is_compiling():
        return
    seen = _ROUTES_SEEN.get()
    if seen is not None:
        seen.append((route, inp))


def _same_inputs(a, b) -> bool:
    """Whether two :class:`~diffattn.ops._inputs.DiffAttentionInputs` are the same inputs: each tensor the same view of
    the same memory (shape, strides, dtype, address), the same tensors in the tuples, the same flags and numbers."""

    def same(x, y) -> bool:
        if isinstance(x, tuple) or isinstance(y, tuple):
            return isinstance(x, tuple) and isinstance(y, tuple) and len(x) == len(y) and all(map(same, x, y))
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            return (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.shape == y.shape
                    and x.stride() == y.stride() and x.dtype == y.dtype and x.data_ptr() == y.data_ptr())  # fmt: skip
        return x == y and type(x) is type(y)

    return all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
