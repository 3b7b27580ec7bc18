"""The ``cudnn_direct`` route: DIFF V1's one cuDNN attention call and the fused epilogue (DIFF Transformer Eq. 1,
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

The same attention and epilogue kernels on the same inputs, and V's two gradients summed as autograd sums them: the
same numbers bit for bit (tests/ops/test_direct.py), about the same GPU time, less host time. Where its one node
does not apply — no gradient needed, under ``torch.compile``, K shared (DIFF V2), a mask or segments, causal with
T ≠ S (cuDNN's causal mask is aligned top-left, the op's bottom-right), or inputs cuDNN would refuse through SDPA
(``torch.backends.cuda.can_use_cudnn_attention``) — the route runs ``cudnn+epilogue`` itself, which takes every
call this route's support check admits. The ATen ops are private, so a backward that raises at run time does not end
the user's step (an error of the forward is ``auto``'s to hand over, as any route's): that call's gradients come from
SDPA's own backward (its forward recomputed under autograd), calls like it run ``cudnn+epilogue`` from then on, and
one log line says so — unless the error left the CUDA context unusable, where nothing could run after it.

Its speed is a prediction until a GPU times it (benchmarks/RESULTS.md, 2026-11-29): the route table lists it only
where the sweep measured it correct against float64 and fastest, and the `small` step's forced columns
(``cudnn_direct``, ``cudnn_direct+norm``) can put it first for the small class (:mod:`diffattn.bench.switches`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ._inputs import DiffAttentionInputs, v_from_halves, v_from_halves_grad
from .routes import poisons_cuda_context

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AttentionOps:
    """One attention call's forward and backward as the one node calls them: ``forward(q, k, v, causal, scale)`` →
    (output, tensors its backward needs, other values it needs); ``backward(do, q, k, v, out, tensors, values,
    causal, scale)`` → (dq, dk, dv); ``accepts(key, q, k, v, halves, causal)``: whether the call (of kind ``key``,
    :func:`_call_key`) can take Q, K and the [V; V] made from ``v`` (V's halves where ``halves``)."""

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


def _call_key(q, k, v, halves: bool, causal: bool) -> tuple:
    """A kind of call: the shapes and strides of Q, K and V, V's halves or not, dtype, device, causality."""
    return q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), halves, q.dtype, q.device, causal


#: kind of call (:func:`_call_key`) → whether cuDNN takes it
_ACCEPTED: dict[tuple, bool] = {}
#: kinds of call whose one-node backward raised in this process → the error: they run ``cudnn+epilogue`` from then on
_REFUSED: dict[tuple, str] = {}


def _cudnn_accepts(key: tuple, q, k, v, halves: bool, causal: bool) -> bool:
    """Whether ``F.scaled_dot_product_attention`` forced to cuDNN would run the call on Q, K and [V; V] made from ``v``
    (its own check, so that the ATen op is called only where SDPA would call it); asked once per kind of call (the
    [V; V] it is asked about, needing a gradient where V does, is made then only)."""
    if key not in _ACCEPTED:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        try:
            with torch.no_grad():
                v_both = _v_both(v, halves).requires_grad_(v.requires_grad)
            params = torch.backends.cuda.SDPAParams(q, k, v_both, None, 0.0, causal, False)
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
    """The whole call, forward and backward, as one autograd node (module docstring). ``v`` is DiffLlama's V halves
    stacked as heads [B, 2Hkv, S, dv/2] (``halves``) or V [B, Hkv, S, dv]."""

    @staticmethod
    def forward(ctx, q, k, v, lam, halves, causal, scale, norm_eps, norm_scale, ops):
        from .triton.epilogue import _subtract_pair_impl

        v_both = _v_both(v, halves)  # [V; V]: [B, 2Hkv, S, dv]
        o, tensors, values = ops.forward(q, k, v_both, causal, scale)
        out = _subtract_pair_impl(o, lam, False, norm_eps, norm_scale)
        ctx.save_for_backward(q, k, v, v_both, o, lam, *tensors)
        ctx.setup = (halves, causal, scale, norm_eps, norm_scale, ops, values)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable  # the kernels' gradients have no graph: a second derivative raises
    def backward(ctx, g):
        from .triton.epilogue import _lambda_grad, _subtract_pair_bwd_impl

        q, k, v, v_both, o, lam, *tensors = ctx.saved_tensors
        halves, causal, scale, norm_eps, norm_scale, ops, values = ctx.setup
        do, dlam_rows = _subtract_pair_bwd_impl(g, o, lam, False, norm_eps, norm_scale)  # do in o's layout
        try:
            dq, dk, dv_both = ops.backward(do, q, k, v_both, o, tensors, values, causal, scale)
        except RuntimeError as err:  # a backward that cannot run never ends the user's step (module docstring)
            dq, dk, dv_both = _backward_refused(err, (q, k, v, halves, causal), do, v_both, scale)
        if halves:
            dv = v_from_halves_grad(dv_both, v, copies=2)
        else:
            hkv = v.shape[1]
            dv = dv_both[:, :hkv] + dv_both[:, hkv:]
        return dq, dk, dv, _lambda_grad(dlam_rows, lam), None, None, None, None, None, None


def _backward_refused(err: RuntimeError, call: tuple, do, v_both, scale: float):
    """Q's, K's and [V; V]'s gradients by SDPA's own backward (its forward recomputed under autograd, default
    dispatch) where cuDNN's ATen backward raised — said in one line, and calls of that kind run ``cudnn+epilogue``
    from then on. An error that leaves the CUDA context unusable is raised: nothing after it could run."""
    text = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}"[:300]
    if poisons_cuda_context(text):
        raise err
    q, k, v, halves, causal = call
    _REFUSED[_call_key(q, k, v, halves, causal)] = text
    logger.warning(
        "cudnn_direct: cuDNN's backward raised (%s); this call's gradients by SDPA's own backward, and calls like it "
        "run cudnn+epilogue from now on",
        text,
    )
    with torch.enable_grad():
        leaves = [x.detach().requires_grad_() for x in (q, k, v_both)]
        out = F.scaled_dot_product_attention(*leaves, is_causal=causal, scale=scale)
        return torch.autograd.grad(out, leaves, do)


def one_node_operands(inp: DiffAttentionInputs):
    """(q, k, v, halves) the one node takes for ``inp``, or None where it does not apply (module docstring): Q and K
    over both maps' heads as the caller had them (else joined), V's halves as the caller stacked them (else V)."""
    leaves = (inp.q1, inp.k1, inp.q2, inp.k2, *inp.v_parts, inp.lam)
    if not (torch.is_grad_enabled() and any(x.requires_grad for x in leaves)) or torch.compiler.is_compiling():
        return None
    if inp.shares_keys or inp.attn_mask is not None or inp.segment_ids is not None:
        return None
    if inp.causal and inp.q_len != inp.kv_len:
        return None
    whole = inp.qk_whole
    q, k = whole if whole is not None else (torch.cat([inp.q1, inp.q2], dim=1), torch.cat([inp.k1, inp.k2], dim=1))
    halves = inp.v_stacked is not None
    return q, k, inp.v_stacked if halves else inp.v, halves


def _v_both(v: torch.Tensor, halves: bool) -> torch.Tensor:
    """[V; V] over both maps' heads, [B, 2Hkv, S, dv], from V's halves (one copy) or from V."""
    return v_from_halves(v, copies=2) if halves else torch.cat([v, v], dim=1)


def diff_attention_cudnn_direct(inp: DiffAttentionInputs, norm: tuple[float, float] | None = None) -> torch.Tensor:
    """The ``cudnn_direct`` route (module docstring): one autograd node where it applies, else ``cudnn+epilogue``.
    ``norm`` (eps, scale): the head's norm in the epilogue's kernel (:class:`diffattn.ops.HeadNorm`)."""
    from .sdpa import diff_attention_cudnn
    from .triton.epilogue import _norm_eps_scale

    operands = one_node_operands(inp)
    if operands is not None:
        q, k, v, halves = operands
        ops = ATTENTION_OPS
        causal = True if inp.causal else False  # noqa: SIM210 (a Python bool for the ATen op)
        key = _call_key(q, k, v, halves, causal)  # the kind of call, once: both checks below read it
        if key not in _REFUSED and ops.accepts(key, q, k, v, halves, causal):
            eps, scale = _norm_eps_scale(norm)
            return _OneNode.apply(q, k, v, inp.lam, halves, causal, inp.scale, eps, scale, ops)
    return diff_attention_cudnn(inp, fused_epilogue=True, norm=norm)
