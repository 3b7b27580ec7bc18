"""diffattn.ops.diff_attention_pairs and diff_attention_stacked: Q and K handed over whole in the two layouts the DIFF
models have them — DIFF V2's query heads in interleaved pairs on one K and V (docs/methods.md §5), DIFF V1's maps
stacked along the heads, [Q1; Q2] over [K1; K2] (DiffLlama, §1). Each is the same function as diff_attention on the
views the layout's cut gives, its gradients go into Q and K themselves, and a one-call route reads Q and K as they are
instead of joining the views into copies again."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from diffattn import ops
from diffattn.ops import diff_attention, diff_attention_pairs, diff_attention_stacked, interleaved_pair

from .interpreter import import_kernels, keep_interpreting
from .rounding import assert_within_rounding

# "stacked": V handed over as DiffLlama has it, its halves stacked as heads; "stacked, v halves": as the pair of them
LAYOUTS = ["pairs", "stacked", "stacked, v halves"]
WHOLE = {"pairs": diff_attention_pairs, "stacked": diff_attention_stacked, "stacked, v halves": diff_attention_stacked}
# sdpa_split cuts V into slices of width d: only DIFF V1's V (2d wide) has more than one
ONE_CALL = [("pairs", "sdpa"), *((layout, r) for layout in LAYOUTS[1:] for r in ("sdpa", "sdpa_split"))]
# the routes here that read V whole (DiffLlama's halves joined: ops._inputs.v_from_halves)
V_JOINED_IN_ITS_ORDER = ("reference", "chunked")


def _leaves(layout: str, dtype=torch.float32, grad=True):
    """Q [B, T, 2H, d] (a projection, transposed by the callers); pairs: K and V [B, Hkv, S, d] (GQA 2), λ [B, H, T];
    stacked: K and V [B, S, 2Hkv, d] (projections too; V's two halves of heads: DIFF V1's V of width 2d), λ one per
    head."""
    g = torch.Generator().manual_seed(0)

    def r(*s):
        return torch.randn(*s, generator=g).to(dtype).requires_grad_(grad)

    q = r(2, 9, 8, 16)
    if layout == "pairs":
        k, v = r(2, 2, 9, 16), r(2, 2, 9, 16)
        lam = torch.rand(2, 4, 9, generator=g).to(dtype).requires_grad_(grad)
    else:
        k, v = r(2, 9, 4, 16), r(2, 9, 4, 16)
        lam = torch.rand(4, generator=g).to(dtype).requires_grad_(grad)
    return [q, k, v, lam]


def _heads(layout: str, leaves):
    """Q, K and V as the layout's model hands them to the op."""
    q, k, v, lam = leaves
    if layout == "pairs":
        return q.transpose(1, 2), k, v, lam
    v = v.transpose(1, 2)
    return q.transpose(1, 2), k.transpose(1, 2), v if layout == "stacked" else v.chunk(2, dim=1), lam


def _call(layout: str, whole: bool, leaves, backend):
    return _call_on(layout, whole, _heads(layout, leaves), backend)


def _call_on(layout: str, whole: bool, heads, backend):
    q, k, v, lam = heads
    if whole:
        return WHOLE[layout](q, k, v, lam, backend=backend)
    if layout == "pairs":
        q1, q2 = interleaved_pair(q, 1)
        return diff_attention(q1, k, q2, k, v, lam, backend=backend)
    (q1, q2), (k1, k2) = q.chunk(2, dim=1), k.chunk(2, dim=1)
    return diff_attention(q1, k1, q2, k2, v.chunk(2, dim=1) if layout == "stacked" else v, lam, backend=backend)


def test_interleaved_pair_is_the_strided_halves():
    x = torch.arange(2 * 6 * 3).reshape(2, 6, 3)
    first, second = interleaved_pair(x, 1)
    assert torch.equal(first, x[:, 0::2]) and torch.equal(second, x[:, 1::2])
    assert (first.stride(), second.storage_offset()) == (x[:, 0::2].stride(), x[:, 1::2].storage_offset())
    with pytest.raises(ValueError, match="counted from the front"):
        interleaved_pair(x, -2)


@pytest.mark.parametrize(
    ("layout", "backend"),
    [*ONE_CALL, *((layout, b) for layout in LAYOUTS for b in ("reference", "sdpa_maps", "chunked"))],
)
def test_whole_heads_compute_what_the_views_do_with_gradients_into_q_and_k(layout, backend):
    # the same function: bit for bit where the route reads the same values in the same layout either way; a
    # one-call route (sdpa, sdpa_split) reads Q and K themselves where diff_attention gives it copies joined from the
    # same values.
    # The routes that read V whole join DIFF V1's V from its stacked halves in V's own memory order, and from the pair
    # of halves the views give by a cat: the same values laid out otherwise, whose products a BLAS may sum in another
    # order (an AMD EPYC's did: chunked's dQ 4.8e-7 apart; an Intel Xeon's gave the same bits) — there the whole call
    # is held to the float64 result by the rule of tests/ops/rounding.py, plain PyTorch's two summation orders
    # (reference, sdpa_maps on the views) the yardsticks
    leaves = _leaves(layout)
    out = _call(layout, True, leaves, backend)
    cot = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, cot)
    if layout == "stacked" and backend in V_JOINED_IN_ITS_ORDER:
        _assert_against_float64(layout, backend, leaves, [out, *grads], cot)
        return
    same_leaves = [x.detach().requires_grad_() for x in leaves]
    same = _call(layout, False, same_leaves, backend)
    same_grads = torch.autograd.grad(same, same_leaves, cot)
    for name, got, want in zip(["out", "dq", "dk", "dv", "dlam"], [out, *grads], [same, *same_grads], strict=True):
        assert torch.equal(got, want), f"{layout} {backend} {name}: {(got - want).abs().max():.3g}"


@pytest.mark.parametrize(("layout", "backend"), [("pairs", "sdpa"), ("stacked", "sdpa_split")])
def test_whole_heads_on_a_one_call_route_against_float64(layout, backend):
    # DIFF V1 on sdpa_split, the one-call route that pads nothing: PyTorch's fused CPU kernel on Q and K zero-padded
    # to V's width (the sdpa route) gives dQ and dK up to 3x the rule's bound on this CPU (40 cotangents; unpadded,
    # under half of it) — that kernel's rounding, the same through diff_attention (bit for bit, above)
    leaves = _leaves(layout)
    out = _call(layout, True, leaves, backend)
    cot = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    grads = torch.autograd.grad(out, leaves, cot)
    _assert_against_float64(layout, backend, leaves, [out, *grads], cot)


def _assert_against_float64(layout: str, backend: str, leaves, results, cot) -> None:
    """``results`` (the whole-heads call's output and gradients for ``leaves`` and cotangent ``cot``) against the
    float64 reference by the rule of tests/ops/rounding.py. The yardsticks: plain PyTorch in float32 in two summation
    orders — the math (reference) and PyTorch's fused attention kernel, one call per map at width d (sdpa_maps), whose
    backward sums over query blocks as the padded call's does."""
    gold_leaves = [x.detach().double().requires_grad_() for x in leaves]
    gold = _call(layout, False, gold_leaves, "reference")
    golds = [gold, *torch.autograd.grad(gold, gold_leaves, cot.double())]
    yardsticks = []
    for plain_backend in ("reference", "sdpa_maps"):
        plain_leaves = [x.detach().requires_grad_() for x in leaves]
        plain = _call(layout, False, plain_leaves, plain_backend)
        yardsticks.append([plain, *torch.autograd.grad(plain, plain_leaves, cot)])
    for i, (name, got, want) in enumerate(zip(["out", "dq", "dk", "dv", "dlam"], results, golds, strict=True)):
        assert_within_rounding(f"{backend} {layout} {name}", got, want, [y[i] for y in yardsticks], torch.float32)


@pytest.mark.parametrize(("layout", "backend"), ONE_CALL)
def test_a_one_call_route_reads_q_and_k_as_they_are(monkeypatch, layout, backend):
    # where diff_attention joins the two maps' views into new [B, 2H, T, d] tensors (a copy each, and the gradients
    # joined back), the whole-heads call hands SDPA the caller's Q (and K) — DIFF V1's Q and K padded to V's width
    # on the sdpa route: one copy from the caller's tensor, not a copy of a joined copy; and DIFF V1's V for both
    # maps' heads, [V; V], made from V's stacked halves by one copy (ops._inputs.v_from_halves)
    calls, values = [], []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        calls.append((q, k))
        values.append(v)
        return real(q, k, v, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    heads = _heads(layout, _leaves(layout))
    q, k = heads[:2]
    _call_on(layout, True, heads, backend)
    padded = layout != "pairs" and backend == "sdpa"  # V is 2d wide: Q and K padded to it
    for got_q, got_k in calls:
        if padded:
            assert torch.equal(got_q[..., :16], q) and torch.equal(got_k[..., :16], k) and not got_q[..., 16:].any()
            # the padding is the only copy, made from q and k themselves in their own memory order ([B, T, 2H, d]:
            # the call's output then comes back in that order too, ops.sdpa._padded)
            assert _copies_between(got_q, q) == ["ConstantPadNdBackward0"] == _copies_between(got_k, k)
            assert got_q.stride(1) < got_q.stride(2)
        else:
            assert got_q is q and got_k is k
    if layout == "stacked":
        v = heads[2]
        va, vb = v.chunk(2, dim=1)
        twice = torch.cat([torch.cat([va, vb], dim=-1)] * 2, dim=1)
        for got_v in values:  # sdpa_split: the slices of [V; V] as wide as Q, views of it
            assert torch.equal(got_v, twice[..., : got_v.shape[-1]] if got_v.storage_offset() == 0 else got_v)
            assert _copies_between(got_v, v) == ["CloneBackward0"]
        assert torch.equal(values[0], twice if backend == "sdpa" else twice[..., :16])
    calls.clear()
    _call_on(layout, False, heads, backend)
    assert calls and all(got_q is not q and torch.equal(got_q[..., :16], q) for got_q, _ in calls)


#: autograd nodes of operations that copy their input forward (the rest on these paths are views)
COPIES = {"CloneBackward0", "CatBackward0", "StackBackward0", "ConstantPadNdBackward0", "CopyBackwards"}


def _copies_between(x: torch.Tensor, source: torch.Tensor) -> list[str]:
    """The autograd nodes of copies from ``x`` back to ``source`` (one path: each node's first input)."""
    names, fn = [], x.grad_fn
    while fn is not None and fn is not source.grad_fn:
        if type(fn).__name__ in COPIES:
            names.append(type(fn).__name__)
        fn = fn.next_functions[0][0]
    assert fn is source.grad_fn, "x is not made from source"
    return names


@pytest.mark.parametrize("layout", LAYOUTS)
def test_whole_heads_refuse_an_odd_number_of_heads(layout):
    q, k, v, lam = _heads(layout, _leaves(layout, grad=False))
    with pytest.raises(ValueError, match=r"q must be \[B, 2H, T, d\]"):
        WHOLE[layout](q[:, :7], k, v, lam)
    if layout == "stacked":
        with pytest.raises(ValueError, match=r"k must be \[B, 2Hkv, S, d\]"):
            WHOLE[layout](q, k[:, :3], v, lam)
        # V with neither Hkv heads (V) nor 2Hkv (its halves stacked): named with both forms
        with pytest.raises(ValueError, match=r"v must be V \[B, Hkv, S, dv\] .* or its two column halves"):
            WHOLE[layout](q, k, v[:, :3], lam)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_whole_heads_under_autocast_take_the_autocast_dtype(layout):
    q, k, v, lam = _heads(layout, _leaves(layout, grad=False))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = WHOLE[layout](q, k, v, lam, backend="reference")
    assert out.dtype == torch.bfloat16
    assert {"diff_attention_pairs", "diff_attention_stacked", "interleaved_pair"} <= set(ops.__all__)


@pytest.mark.parametrize(("layout", "route"), [*ONE_CALL, ("pairs", "sdpa_maps"), ("stacked", "sdpa_maps")])
def test_whole_heads_on_each_epilogue_route_are_its_route(layout, route, monkeypatch):
    # the outputs a one-call route cuts into the two maps in their own memory order ([B, T, 2H, dv] for the caller's
    # Q: ops.sdpa._maps_apart), and a sliced route's joins, reach the fused subtraction's kernel as such strided views
    import_kernels("diffattn.ops.triton.epilogue")  # without CUDA: interpreted
    keep_interpreting(monkeypatch)
    leaves = _leaves(layout)
    heads = _heads(layout, leaves)
    plain = _call_on(layout, True, heads, route)
    fused = _call_on(layout, True, heads, route + "+epilogue")
    gold_leaves = [x.detach().double().requires_grad_() for x in leaves]
    gold = _call(layout, False, gold_leaves, "reference")
    cot = torch.randn(plain.shape, generator=torch.Generator().manual_seed(1))
    assert_within_rounding(f"{route} {layout} out", fused, gold, [plain], torch.float32)
    got = torch.autograd.grad(fused, leaves, cot)
    yard = torch.autograd.grad(plain, leaves, cot)
    want = torch.autograd.grad(gold, gold_leaves, cot.double())
    for name, a, b, c in zip(["dq", "dk", "dv", "dlam"], got, yard, want, strict=True):
        assert_within_rounding(f"{route} {layout} {name}", a, c, [b], torch.float32)


@pytest.mark.parametrize(("layout", "route"), ONE_CALL)
def test_a_one_call_epilogue_route_hands_the_calls_output_to_the_kernel_uncut(layout, route, monkeypatch):
    # the fused epilogue takes the call's output whole (epilogue.subtract_pair; sdpa_split's two calls' outputs as
    # they are, epilogue.subtract_pair_parts) and its backward writes that output's gradient in one pass: between the
    # route's output and SDPA's there is no cut of the two maps (a chunk or unbind, whose backward is a cat of dO1 and
    # dO2: one more pass over the whole gradient)
    import_kernels("diffattn.ops.triton.epilogue")  # without CUDA: interpreted
    keep_interpreting(monkeypatch)
    outputs = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(
        F, "scaled_dot_product_attention", lambda *a, **kw: outputs.append(real(*a, **kw)) or outputs[-1]
    )
    out = _call_on(layout, True, _heads(layout, _leaves(layout)), route + "+epilogue")
    nodes, fn = [], out.grad_fn
    while fn is not None and fn is not outputs[0].grad_fn:
        nodes.append(type(fn).__name__)
        fn = fn.next_functions[0][0]
    assert fn is outputs[0].grad_fn, "the route's output is made from its (first) SDPA call's"
    cuts = [n for n in nodes if n.startswith(("Split", "Unbind", "Chunk"))]
    assert not cuts, f"the maps cut apart before the epilogue: {nodes}"
    if route == "sdpa_split":  # its two calls' outputs (one per slice of V) read unjoined: no cat either
        assert "_SubtractPartsBackward" in nodes and not [n for n in nodes if n.startswith("Cat")], nodes
    else:
        assert "_SubtractPairBackward" in nodes


@pytest.mark.parametrize("model_order", [True, False])
def test_v_whole_is_joined_from_the_stacked_halves_in_one_copy_in_their_order(model_order):
    # the routes that read V whole (cudnn_maps, reference, chunked) join DiffLlama's V from its halves stacked as heads
    # in one copy laid out as V was ([B, S, 2Hkv, d] from a projection: [B, Hkv, S, 2d] then [B, S, Hkv, 2d] in
    # memory), so that dV goes back to the projection through that one copy; concatenated, V was contiguous
    # [B, Hkv, S, 2d], and its gradient went back through the chunk's cat and the projection's reshape
    from diffattn.ops._inputs import heads_inside_tokens, validate

    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 4, 9, 16, generator=g).requires_grad_() for _ in range(2))
    shape = (2, 9, 4, 16) if model_order else (2, 4, 9, 16)
    projection = torch.randn(*shape, generator=g).requires_grad_()
    v = projection.transpose(1, 2) if model_order else projection.view(shape)  # a view of it, as in a model
    (q1, q2), (k1, k2) = q.chunk(2, dim=1), k.chunk(2, dim=1)
    inp = validate(q1, k1, q2, k2, tuple(v.chunk(2, dim=1)), 0.5, causal=True, attn_mask=None, scale=None,
                   qk_whole=(q, k), v_stacked=v)  # fmt: skip
    joined = inp.v
    assert torch.equal(joined, torch.cat(v.chunk(2, dim=1), dim=-1))
    assert _copies_between(joined, v) == ["CloneBackward0"]
    assert heads_inside_tokens(joined) == model_order
    (dv,) = torch.autograd.grad(joined, projection, torch.ones_like(joined))
    assert torch.equal(dv, torch.ones_like(projection))
