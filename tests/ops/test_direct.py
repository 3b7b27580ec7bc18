"""The ``cudnn_direct`` route (diffattn/ops/direct.py): ``cudnn+epilogue``'s computation — DIFF Eq. 1 through one
attention call over both maps' heads and the fused epilogue — as one autograd node.

Without a GPU the node runs with SDPA's CPU kernels in cuDNN's place (``direct.ATTENTION_OPS``: forward under no_grad,
backward by autograd through the same SDPA call), and the epilogue's kernels in Triton's interpreter; it must then
give, bit for bit, the output and every gradient of the same computation as a chain of autograd nodes (what
``cudnn+epilogue`` is), across V's layouts, λ's forms and the head norm; where it does not apply, the route is
``cudnn+epilogue``. On a GPU (``gpu``): the route against ``cudnn+epilogue`` and against the float64 reference."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from diffattn import ops
from diffattn.ops import HeadNorm, direct, routes
from diffattn.ops._inputs import v_from_halves, v_from_halves_grad, validate

from ..helpers import pairwise
from .interpreter import CUDA, import_kernels, keep_interpreting
from .rounding import assert_within_rounding

epilogue = import_kernels("diffattn.ops.triton.epilogue")  # interpreted without CUDA (tests/ops/interpreter.py)
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")


def _grouped(x, heads: int):
    """Key or value heads as cuDNN's grouped heads read them for ``heads`` query heads: query head i reads head
    i // (heads / x's heads) (each of x's heads repeated for its group; x itself where the counts agree)."""
    return x if x.shape[1] == heads else x.repeat_interleave(heads // x.shape[1], dim=1)


def _sdpa_call(q, k, v, causal, scale):
    return F.scaled_dot_product_attention(q, _grouped(k, q.shape[1]), _grouped(v, q.shape[1]), is_causal=causal,
                                          scale=scale)  # fmt: skip


def _sdpa_forward(q, k, v, causal, scale):
    with torch.no_grad():
        return _sdpa_call(q, k, v, causal, scale), (), ()


def _sdpa_backward(do, q, k, v, out, tensors, values, causal, scale):
    with torch.enable_grad():
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        return torch.autograd.grad(_sdpa_call(*leaves, causal, scale), leaves, do)


#: SDPA's own kernels in cuDNN's place, with cuDNN's grouped heads (GQA, K's and V's head counts each a divisor of Q's):
#: the node's arithmetic is then what the chains below compute
SDPA_OPS = direct.AttentionOps(_sdpa_forward, _sdpa_backward, lambda *a: True)


@pytest.fixture(autouse=True)
def _setup(monkeypatch, request):
    if "gpu" in request.keywords:
        return
    keep_interpreting(monkeypatch)
    monkeypatch.setattr(direct, "ATTENTION_OPS", SDPA_OPS)
    # the route's support check is cuDNN's (CUDA, 16-bit): waived here, where SDPA's CPU kernels stand in for cuDNN's
    real = ops.route_unsupported
    waived = routes.ONE_NODE_ROUTES
    monkeypatch.setattr(ops, "route_unsupported", lambda name, inp: None if name in waived else real(name, inp))


def _model_inputs(dtype, *, b=2, h=2, t=13, d=8, heads_inside=True, lam_form="scalar", seed=0, device="cpu"):
    """A DIFF V1 layer's Q [B, 2H, T, d], K [B, 2H, T, d] and V's halves stacked [B, 2H, T, d] (DiffLlama's: dv = 2d),
    laid out as projections' views ([B, T, heads, d] in memory) or contiguous, and λ."""
    g = torch.Generator().manual_seed(seed)

    def heads(n):
        x = torch.randn(b, t, n, d, generator=g) if heads_inside else torch.randn(b, n, t, d, generator=g)
        x = x.to(device, dtype)
        return (x.transpose(1, 2) if heads_inside else x).detach().requires_grad_()

    lam = {"scalar": torch.tensor(0.4), "per_head": torch.rand(h, generator=g) * 0.5,
           "per_token": torch.rand(b, h, t, generator=g) * 0.5}[lam_form]  # fmt: skip
    return heads(2 * h), heads(2 * h), heads(2 * h), lam.to(device).requires_grad_()


def _chain(q, k, v, lam, causal, norm):
    """``cudnn+epilogue``'s computation as autograd's chain of nodes, its SDPA call not forced to cuDNN."""
    inp = validate(*q.chunk(2, 1), *k.chunk(2, 1), tuple(v.chunk(2, 1)), lam, causal=causal, attn_mask=None,
                   scale=None, qk_whole=(q, k), v_stacked=v)  # fmt: skip
    o = F.scaled_dot_product_attention(q, k, v_from_halves(v, copies=2), is_causal=causal, scale=inp.scale)
    return epilogue.subtract_pair(o, inp.lam, "stacked", norm)


def _cudnn_epilogue_calls(monkeypatch) -> list[dict]:
    """The keyword arguments of each call handed to ``cudnn+epilogue`` (:func:`diffattn.ops.sdpa.diff_attention_cudnn`,
    recorded instead of run)."""
    import diffattn.ops.sdpa as sdpa

    calls = []
    monkeypatch.setattr(sdpa, "diff_attention_cudnn", lambda inp, **kw: calls.append(kw) or inp.q1.new_zeros(()))
    return calls


def _raising(monkeypatch, step: str, message: str) -> None:
    """cuDNN's ATen ``step`` ("forward" or "backward") raising ``message`` from now on, the other SDPA's stand-in, and
    no kind of call refused yet."""

    def raises(*args):
        raise RuntimeError(message)

    forward, backward = (raises, _sdpa_backward) if step == "forward" else (_sdpa_forward, raises)
    monkeypatch.setattr(direct, "ATTENTION_OPS", direct.AttentionOps(forward, backward, lambda *a: True))
    monkeypatch.setattr(direct, "_REFUSED", {})


POISONING = "CUDA error: an illegal memory access was encountered"


def _run(fn, tensors, seed=1):
    out = fn(*tensors)
    cot = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out.device, out.dtype)
    return [out.detach(), *torch.autograd.grad(out, tensors, cot)]


@pytest.mark.parametrize(
    ("with_norm", "lam_form", "heads_inside", "dtype"),
    pairwise(  # every pair of these in the default run, the whole product in CI's heavy run
        with_norm={"": False, "norm": True},
        lam_form=["scalar", "per_head", "per_token"],
        heads_inside={"projection-views": True, "contiguous": False},
        dtype={"fp32": torch.float32, "bf16": torch.bfloat16},
    ),
)
def test_the_one_node_is_the_chains_computation_bit_for_bit(dtype, heads_inside, lam_form, with_norm):
    # 7 tokens: rows of B·H·T = 28, not a multiple of the epilogue's interpreted 4-row programs, in a fraction of the
    # time 13 took over the grid's 24 cases (the default run's budget)
    tensors = _model_inputs(dtype, heads_inside=heads_inside, lam_form=lam_form, t=7)
    norm = (1e-5, 0.8) if with_norm else None
    head_norm = HeadNorm(*norm) if with_norm else None
    ran = []
    real = direct._OneNode.apply
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(direct._OneNode, "apply", lambda *a: ran.append(1) or real(*a))
        with ops.fused_head_norm(True):
            got = _run(lambda q, k, v, lam: ops.diff_attention_stacked(q, k, v, lam, backend=routes.DIRECT,
                                                                      head_norm=head_norm), tensors)  # fmt: skip
    assert ran, "the one node ran"
    want = _run(lambda q, k, v, lam: _chain(q, k, v, lam, True, norm), tensors)
    for name, a, w in zip(("out", "dq", "dk", "dv", "dlam"), got, want, strict=True):
        assert a.shape == w.shape and a.stride() == w.stride(), name
        assert torch.equal(a, w), name


def test_v_whole_and_maps_cut_apart_and_a_non_causal_call():
    # diff_attention with V whole [B, Hkv, S, dv] and the maps' Q, K as separate tensors: [V; V] by one cat, Q and K
    # joined before the node; without the causal mask
    g = torch.Generator().manual_seed(3)
    q1, q2, k1, k2 = (torch.randn(1, 2, 9, 8, generator=g).requires_grad_() for _ in range(4))
    v = torch.randn(1, 2, 9, 16, generator=g).requires_grad_()
    lam = torch.tensor(0.3, requires_grad=True)
    tensors = (q1, k1, q2, k2, v, lam)
    got = _run(lambda *x: ops.diff_attention(*x, causal=False, backend=routes.DIRECT), tensors)

    def chain(q1, k1, q2, k2, v, lam):
        o = F.scaled_dot_product_attention(torch.cat([q1, q2], 1), torch.cat([k1, k2], 1), torch.cat([v, v], 1))
        return epilogue.subtract_pair(o, lam, "stacked")

    for i, (a, w) in enumerate(zip(got, _run(chain, tensors), strict=True)):
        assert torch.equal(a, w), i
    # and against float64 by the rounding rule
    gold = ops.diff_attention(*(x.detach().double() for x in tensors), causal=False, backend="reference")
    yard = ops.diff_attention(*(x.detach() for x in tensors), causal=False, backend="reference")
    assert_within_rounding("out", got[0], gold, [yard], torch.float32)


def test_the_backward_is_one_node_from_the_output_to_the_layers_tensors():
    q, k, v, lam = _model_inputs(torch.float32)
    out = ops.diff_attention_stacked(q, k, v, lam, backend=routes.DIRECT)
    assert type(out.grad_fn).__name__ == "_OneNodeBackward"
    # its inputs: the layer's Q, K and V themselves (their views' nodes) and λ's broadcast — nothing in between
    assert len([f for f, _ in out.grad_fn.next_functions if f is not None]) == 4


@pytest.mark.parametrize(
    "why",
    ["no gradient", "K shared without a gradient", "key padding", "causal T < S", "cuDNN refuses"],
)
def test_where_the_one_node_does_not_apply_the_route_is_cudnn_epilogue(monkeypatch, why):
    monkeypatch.setattr(direct._OneNode, "apply", lambda *a: pytest.fail("the one node ran"))
    calls = _cudnn_epilogue_calls(monkeypatch)
    g = torch.Generator().manual_seed(0)
    q1, q2, k1, k2 = (torch.randn(1, 2, 6, 8, generator=g).requires_grad_() for _ in range(4))
    v = torch.randn(1, 2, 6, 16, generator=g).requires_grad_()
    kwargs = {}
    if why == "K shared without a gradient":  # (DIFF V2 trained: the node, below)
        k2 = k1
    if why == "key padding":
        kwargs["attn_mask"] = torch.tensor([[True] * 5 + [False]])
    if why == "causal T < S":
        q1, q2 = q1[:, :, :3], q2[:, :, :3]
    if why == "cuDNN refuses":
        monkeypatch.setattr(direct, "ATTENTION_OPS", direct.AttentionOps(_sdpa_forward, _sdpa_backward,
                                                                         lambda *a: False))  # fmt: skip
    inp = validate(q1, k1, q2, k2, v, 0.5, causal=True, scale=None, **{"attn_mask": None, **kwargs})
    with torch.set_grad_enabled(not why.endswith("no gradient") and not why.endswith("without a gradient")):
        direct.diff_attention_cudnn_direct(inp, norm=(1e-5, 0.8))
    assert calls == [{"fused_epilogue": True, "norm": (1e-5, 0.8)}]


def test_a_backward_that_raises_gives_sdpas_gradients_and_hands_calls_like_it_to_cudnn_epilogue(monkeypatch, caplog):
    # cuDNN's ATen backward is private API: where it raises (not an error that poisons the CUDA context) the step
    # goes on — this call's gradients by SDPA's own backward, the next call of the kind through cudnn+epilogue
    import logging

    _raising(monkeypatch, "backward", "cuDNN Frontend error: no valid engine configs for the backward\nmore")
    tensors = _model_inputs(torch.float32, lam_form="per_head")
    with caplog.at_level(logging.WARNING, logger="diffattn.ops.direct"):
        got = _run(lambda *x: ops.diff_attention_stacked(*x, backend=routes.DIRECT), tensors)
    want = _run(lambda q, k, v, lam: _chain(q, k, v, lam, True, None), tensors)
    for name, a, w in zip(("out", "dq", "dk", "dv", "dlam"), got, want, strict=True):
        assert torch.equal(a, w), name
    lines = [r.message for r in caplog.records]
    assert len(lines) == 1 and "no valid engine configs" in lines[0] and "cudnn+epilogue" in lines[0]
    calls = _cudnn_epilogue_calls(monkeypatch)
    ops.diff_attention_stacked(*tensors, backend=routes.DIRECT)
    assert calls, "a call of the same kind runs cudnn+epilogue"

    _raising(monkeypatch, "backward", POISONING)
    out = ops.diff_attention_stacked(*_model_inputs(torch.float32, seed=5), backend=routes.DIRECT)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        out.sum().backward()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_v_from_halves_grad_is_autograds_gradient_bit_for_bit(dtype):
    for heads_inside in (False, True):
        for copies in (1, 2, 3):
            for g_in_made_layout in (False, True):
                b, hkv, s, w = 2, 3, 5, 4
                v = torch.randn(b, s, 2 * hkv, w).transpose(1, 2) if heads_inside else torch.randn(b, 2 * hkv, s, w)
                v = v.to(dtype).requires_grad_()
                made = v_from_halves(v, copies)
                g = torch.randn(made.shape).to(dtype)
                if g_in_made_layout:  # as the attention call's gradient arrives: in its output's layout
                    g = torch.empty_like(made).copy_(g)
                (want,) = torch.autograd.grad(made, v, g)
                got = v_from_halves_grad(g, v, copies)
                case = (heads_inside, copies, g_in_made_layout)
                assert torch.equal(got, want) and got.stride() == want.stride(), case


def test_the_route_is_known_everywhere_a_route_is_named():
    for name in routes.ONE_NODE_ROUTES:
        assert name in routes.ROUTE_NAMES and name in ops.BACKENDS and routes.runs_epilogue(name), name
        assert not {s.name: s for s in ops.backend_status("cpu")}[name].usable, name
    from diffattn.bench.train_step import FUSED, columns_for

    assert FUSED["+pairs"] == "heads_in_pairs"
    assert {"diffattn DIFF (auto+pairs)", "diffattn DIFF (cudnn_shared_v+norm+pairs)"} <= set(
        columns_for(["auto+pairs", "cudnn_shared_v+norm+pairs"])
    )
    assert routes.DIRECT in routes.ROUTE_NAMES and routes.DIRECT in ops.BACKENDS
    assert routes.runs_epilogue(routes.DIRECT) and routes.runs_epilogue("cudnn+epilogue")
    assert not routes.runs_epilogue("cudnn")
    status = {s.name: s for s in ops.backend_status("cpu")}[routes.DIRECT]
    assert not status.usable and "CUDA" in status.reason
    from diffattn.bench.train_step import columns_for

    assert "diffattn DIFF (cudnn_direct+norm)" in columns_for(["cudnn_direct+norm"])
    with pytest.raises(ValueError, match="follows auto, cudnn_direct or a route ending in"):
        columns_for(["cudnn+norm"])


def test_the_cudnn_calls_as_pytorch_shapes_them_take_v_of_half_the_heads():
    # the route's wrappers of cuDNN attention's ATen ops (direct.CUDNN) on the meta device, where PyTorch's own shape
    # functions for those ops run (what torch.compile's fake tensors see; they mirror the CUDA kernels' allocations):
    # the arguments in the schema's order, and Q and K of 2H heads with V of H — whole, or a column slice of it —
    # give an output over Q's heads in Q's layout and V's gradient shaped like V (no check refuses two head counts)
    b, h, t, d = 2, 4, 64, 64

    def heads(n, width):  # a projection's view, [B, T, heads, width] in memory
        return torch.empty(b, t, n, width, device="meta", dtype=torch.bfloat16).transpose(1, 2)

    q, k, v = heads(2 * h, d), heads(2 * h, d), heads(h, 2 * d)
    calls = [(k, v_call) for v_call in (torch.cat([v, v], 1), v, *v.split(d, dim=-1))]  # [V; V], V once, V's slices
    calls.append((heads(h, d), heads(h, d)))  # DIFF V2's: K and V of H heads, read once by the pairs (keys_shared)
    for k_call, v_call in calls:
        out, tensors, values = direct.CUDNN.forward(q, k_call, v_call, True, d**-0.5)
        assert out.shape == (b, 2 * h, t, v_call.shape[-1]) and out.transpose(1, 2).is_contiguous()
        grads = direct.CUDNN.backward(out, q, k_call, v_call, out, tensors, values, True, d**-0.5)
        assert [g.shape for g in grads] == [q.shape, k_call.shape, v_call.shape]


# ---- cudnn_shared_v: DIFF V1 in interleaved pairs, V read once for both maps by cuDNN's grouped heads ----------------


def _pairs_inputs(dtype, *, b=2, h=2, t=13, d=8, kv=None, lam_form="scalar", seed=0, device="cpu"):
    """DIFF V1 in the official DIFF code's layout: Q [B, 2H, T, d] and K [B, 2Hkv, T, d] in interleaved pairs (map 1
    and map 2 of head j at 2j and 2j + 1) and V [B, Hkv, T, 2d], each a projection's view ([B, T, heads, width] in
    memory), and λ."""
    g = torch.Generator().manual_seed(seed)
    kv = kv or h

    def heads(n, width):
        return torch.randn(b, t, n, width, generator=g).to(device, dtype).transpose(1, 2).detach().requires_grad_()

    lam = {"scalar": torch.tensor(0.4), "per_head": torch.rand(h, generator=g) * 0.5,
           "per_token": torch.rand(b, h, t, generator=g) * 0.5}[lam_form]  # fmt: skip
    return heads(2 * h, d), heads(2 * kv, d), heads(kv, 2 * d), lam.to(device).requires_grad_()


def _pairs_chain(q, k, v, lam, causal, norm):
    """The same computation as autograd's chain: one SDPA call over the pairs with V's heads repeated for each pair
    (what cuDNN's grouped heads read), then the epilogue over interleaved pairs."""
    inp = validate(*ops.interleaved_pair(q, 1)[:1], *ops.interleaved_pair(k, 1)[:1], *ops.interleaved_pair(q, 1)[1:],
                   *ops.interleaved_pair(k, 1)[1:], v, lam, causal=causal, attn_mask=None, scale=None)  # fmt: skip
    o = F.scaled_dot_product_attention(q, k, v.repeat_interleave(2, dim=1), is_causal=causal, scale=inp.scale)
    return epilogue.subtract_pair(o, inp.lam, "interleaved", norm)


def _shared_v(*tensors, head_norm=None, causal=True, route=routes.SHARED_V):
    return ops.diff_attention_pairs(*tensors, causal=causal, backend=route, head_norm=head_norm)


def _pairs_split_chain(q, k, v, lam, causal, norm):
    """``cudnn_shared_v_split``'s computation as autograd's chain: one SDPA call per column slice of V (its heads
    repeated for each pair), the two outputs read by the epilogue's parts kernel."""
    scale = q.shape[-1] ** -0.5
    outs = [F.scaled_dot_product_attention(q, k, part.repeat_interleave(2, dim=1), is_causal=causal, scale=scale)
            for part in v.split(q.shape[-1], dim=-1)]  # fmt: skip
    return epilogue.subtract_pair_parts(tuple(outs), validate(*_maps(q, k), v, lam, causal=causal, attn_mask=None,
                                                              scale=None).lam, "interleaved", norm)  # fmt: skip


def _maps(q, k):
    (q1, q2), (k1, k2) = ops.interleaved_pair(q, 1), ops.interleaved_pair(k, 1)
    return q1, k1, q2, k2


@pytest.mark.parametrize(
    ("dtype", "lam_form", "with_norm"),
    [(torch.float32, "per_token", True), (torch.bfloat16, "scalar", False)],
    ids=["fp32-per_token-norm", "bf16-scalar"],
)
def test_shared_v_split_is_the_chains_computation_bit_for_bit_on_vs_own_slices(monkeypatch, dtype, lam_form, with_norm):
    # one call per column slice of V as wide as Q, each slice a view of V (no [va; va] made), its two gradients side by
    # side in V's; Q's and K's gradients the two calls' summed
    tensors = _pairs_inputs(dtype, lam_form=lam_form)
    norm = (1e-5, 0.8) if with_norm else None
    handed = []
    recording = direct.AttentionOps(
        lambda q, k, v, *a: handed.append(v) or _sdpa_forward(q, k, v, *a), _sdpa_backward, lambda *a: True
    )
    monkeypatch.setattr(direct, "ATTENTION_OPS", recording)
    with ops.fused_head_norm(True):
        got = _run(lambda *x: _shared_v(*x, head_norm=HeadNorm(*norm) if norm else None, route=routes.SHARED_V_SPLIT),
                   tensors)  # fmt: skip
    v = tensors[2]
    assert len(handed) == 2 and all(part._base is v for part in handed), "views of V"
    assert [part.storage_offset() - v.storage_offset() for part in handed] == [0, v.shape[-1] // 2]
    want = _run(lambda *x: _pairs_split_chain(*x, True, norm), tensors)
    for name, a, w in zip(("out", "dq", "dk", "dv", "dlam"), got, want, strict=True):
        assert a.shape == w.shape and a.stride() == w.stride(), name
        assert torch.equal(a, w), name
    # against float64, and where V is not twice as wide as Q the route is cudnn+epilogue
    gold = _run(lambda *x: ops.diff_attention_pairs(*x, backend="reference"),
                [x.detach().double().requires_grad_() for x in tensors])  # fmt: skip
    yard = _run(lambda *x: ops.diff_attention_pairs(*x, backend="sdpa_maps"), tensors)
    got = _run(lambda *x: _shared_v(*x, route=routes.SHARED_V_SPLIT), tensors)
    for name, a, w, y in zip(("out", "dq", "dk", "dv", "dlam"), got, gold, yard, strict=True):
        assert_within_rounding(name, a, w, [y], dtype)
    q, k, v, lam = tensors
    narrow = validate(*_maps(q, k), v[..., :8], lam, causal=True, attn_mask=None, scale=None, qk_pairs=(q, k))
    assert direct.one_node_operands(narrow, "shared_split") is None
    assert direct.one_node_operands(narrow, "shared") is not None


@pytest.mark.parametrize(
    ("dtype", "lam_form", "with_norm"),
    [
        (torch.float32, "scalar", False),
        (torch.float32, "per_token", True),
        (torch.bfloat16, "per_head", True),
        (torch.bfloat16, "per_token", False),
    ],
    ids=["fp32-scalar", "fp32-per_token-norm", "bf16-per_head-norm", "bf16-per_token"],
)
def test_shared_v_is_the_chains_computation_bit_for_bit_and_v_is_never_doubled(monkeypatch, dtype, lam_form, with_norm):
    tensors = _pairs_inputs(dtype, lam_form=lam_form)
    norm = (1e-5, 0.8) if with_norm else None
    handed = []  # what the attention call is handed: Q, K and V themselves, no [V; V]
    monkeypatch.setattr(
        direct,
        "ATTENTION_OPS",
        direct.AttentionOps(
            lambda q, k, v, *a: handed.append((q, k, v)) or _sdpa_forward(q, k, v, *a), _sdpa_backward, lambda *a: True
        ),
    )
    with ops.fused_head_norm(True):
        got = _run(lambda *x: _shared_v(*x, head_norm=HeadNorm(*norm) if norm else None), tensors)
    ((q, k, v),) = handed
    assert q is tensors[0] and k is tensors[1] and v is tensors[2]
    want = _run(lambda *x: _pairs_chain(*x, True, norm), tensors)
    for name, a, w in zip(("out", "dq", "dk", "dv", "dlam"), got, want, strict=True):
        assert a.shape == w.shape and a.stride() == w.stride(), name
        assert torch.equal(a, w), name


def test_shared_v_against_float64_and_its_call_class():
    tensors = _pairs_inputs(torch.float32, t=17, lam_form="per_head", seed=4)
    for causal in (True, False):
        got = _run(lambda *x, c=causal: _shared_v(*x, causal=c), tensors)
        gold = _run(lambda *x, c=causal: ops.diff_attention_pairs(*x, causal=c, backend="reference"),
                    [x.detach().double().requires_grad_() for x in tensors])  # fmt: skip
        yard = _run(lambda *x, c=causal: ops.diff_attention_pairs(*x, causal=c, backend="sdpa_maps"), tensors)
        for name, a, w, y in zip(("out", "dq", "dk", "dv", "dlam"), got, gold, yard, strict=True):
            assert_within_rounding(name, a, w, [y], torch.float32)
    q, k, v, lam = tensors
    inp = validate(*ops.interleaved_pair(q, 1)[:1], *ops.interleaved_pair(k, 1)[:1], *ops.interleaved_pair(q, 1)[1:],
                   *ops.interleaved_pair(k, 1)[1:], v, lam, causal=True, attn_mask=None, scale=None,
                   qk_pairs=(q, k))  # fmt: skip
    assert routes.call_class(inp) == "v1_pairs d8 dv16 fp32 causal none train small"
    assert routes.call_class(dataclasses.replace(inp, qk_pairs=None)).startswith("v1 d8 dv16 ")


def test_diff_attention_pairs_with_k_in_pairs_is_diff_attention_on_the_pairs_members():
    # the op's meaning does not depend on the layout: K in pairs is K1, K2 interleaved; K as many heads as V is DIFF
    # V2's K shared
    q, k, v, lam = (x.detach() for x in _pairs_inputs(torch.float64, seed=2))
    (q1, q2), (k1, k2) = ops.interleaved_pair(q, 1), ops.interleaved_pair(k, 1)
    want = ops.diff_attention(q1, k1, q2, k2, v, lam, backend="reference")
    assert torch.equal(ops.diff_attention_pairs(q, k, v, lam, backend="reference"), want)
    k_shared = k[:, ::2]
    want = ops.diff_attention(q1, k_shared, q2, k_shared, v, lam, backend="reference")
    assert torch.equal(ops.diff_attention_pairs(q, k_shared, v, lam, backend="reference"), want)


def test_shared_v_runs_without_a_gradient_too():
    tensors = [x.detach() for x in _pairs_inputs(torch.float32, seed=6)]
    ran = []
    real = direct._OneNode.apply
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(direct._OneNode, "apply", lambda *a: ran.append(1) or real(*a))
        with torch.no_grad():
            got = _shared_v(*tensors)
    assert ran and torch.equal(got, _pairs_chain(*tensors, True, None))


@pytest.mark.parametrize("why", ["stacked layout", "GQA pairs", "key padding", "causal T < S", "compiling"])
def test_where_shared_v_does_not_apply_the_route_is_cudnn_epilogue(monkeypatch, why):
    monkeypatch.setattr(direct._OneNode, "apply", lambda *a: pytest.fail("the one node ran"))
    calls = _cudnn_epilogue_calls(monkeypatch)
    q, k, v, lam = _pairs_inputs(torch.float32, h=4, kv=2 if why == "GQA pairs" else None)
    (q1, q2), (k1, k2) = ops.interleaved_pair(q, 1), ops.interleaved_pair(k, 1)
    kwargs = {"qk_pairs": None if why == "stacked layout" else (q, k)}
    if why == "key padding":
        kwargs["attn_mask"] = torch.ones(2, 13, dtype=torch.bool)
    if why == "causal T < S":
        q1, q2 = q1[:, :, :3], q2[:, :, :3]
        kwargs["qk_pairs"] = (q[:, :, :3], k)
    if why == "compiling":
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    inp = validate(q1, k1, q2, k2, v, lam, causal=True, scale=None, **{"attn_mask": None, **kwargs})
    direct.diff_attention_cudnn_shared_v(inp, norm=(1e-5, 0.8))
    assert calls == [{"fused_epilogue": True, "norm": (1e-5, 0.8)}]


def test_a_forward_cudnn_refuses_runs_cudnn_epilogue_and_so_do_calls_like_it(monkeypatch, caplog):
    # whether cuDNN's grouped heads take K and V of different head counts is known only when its ATen op runs: a
    # forward that raises is one log line, that call and the next of its kind by cudnn+epilogue
    import logging

    _raising(monkeypatch, "forward", "cuDNN Frontend error: For group-query attention, number of heads ...")
    calls = _cudnn_epilogue_calls(monkeypatch)
    tensors = _pairs_inputs(torch.float32)
    with caplog.at_level(logging.WARNING, logger="diffattn.ops.direct"):
        _shared_v(*tensors)
        _shared_v(*tensors)
    assert len(calls) == 2
    lines = [r.message for r in caplog.records]
    assert len(lines) == 1 and "cudnn_shared_v" in lines[0] and "group-query" in lines[0], lines

    _raising(monkeypatch, "forward", POISONING)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        _shared_v(*tensors)


# ---- cudnn_direct with K shared: DIFF V2's query pairs over K and V read once by cuDNN's grouped heads ---------------


def _v2_inputs(dtype, *, b=2, h=2, kv=None, t=13, d=8, lam_form="per_token", seed=0, device="cpu"):
    """DIFF V2's layer's call (docs/methods.md §5): Q [B, 2H, T, d] in interleaved pairs (map 1 and map 2 of head i at
    2i and 2i + 1), K and V [B, Hkv, T, d] shared by both maps, each a projection's view, and λ (DIFF V2's: one per
    head and token)."""
    g = torch.Generator().manual_seed(seed)
    kv = kv or h

    def heads(n):
        return torch.randn(b, t, n, d, generator=g).to(device, dtype).transpose(1, 2).detach().requires_grad_()

    lam = {"scalar": torch.tensor(0.4), "per_token": torch.rand(b, h, t, generator=g)}[lam_form]
    return heads(2 * h), heads(kv), heads(kv), lam.to(device).requires_grad_()


def _v2_chain(q, k, v, lam, causal):
    """``cudnn+epilogue``'s computation for DIFF V2's call as autograd's chain: one SDPA call over the interleaved
    pairs with K's and V's heads repeated for each query head of their group (what cuDNN's grouped heads read), then
    the epilogue over interleaved pairs."""
    q1, q2 = ops.interleaved_pair(q, 1)
    inp = validate(q1, k, q2, k, v, lam, causal=causal, attn_mask=None, scale=None)
    o = _sdpa_call(q, k, v, causal, inp.scale)
    return epilogue.subtract_pair(o, inp.lam, "interleaved", None)


@pytest.mark.parametrize(
    ("dtype", "lam_form", "kv"),
    [(torch.float32, "per_token", None), (torch.bfloat16, "per_token", None), (torch.float32, "scalar", 1)],
    ids=["fp32-per_token", "bf16-per_token", "fp32-scalar-GQA"],
)
def test_k_shared_is_one_node_reading_k_and_v_once_the_chains_computation_bit_for_bit(monkeypatch, dtype, lam_form, kv):
    # DIFF V2 trained through cudnn_direct: the attention call is handed the layer's Q, K and V themselves (no pairs
    # interleaved again, no K or V repeated: cuDNN's grouped heads read them), and every value is the chain's bit for
    # bit, strides included; under GQA (two query pairs over one K head) too
    tensors = _v2_inputs(dtype, lam_form=lam_form, kv=kv)
    handed = []
    monkeypatch.setattr(
        direct,
        "ATTENTION_OPS",
        direct.AttentionOps(
            lambda q, k, v, *a: handed.append((q, k, v)) or _sdpa_forward(q, k, v, *a), _sdpa_backward, lambda *a: True
        ),
    )
    got = _run(lambda *x: ops.diff_attention_pairs(*x, backend=routes.DIRECT), tensors)
    ((q, k, v),) = handed
    assert q is tensors[0] and k is tensors[1] and v is tensors[2]
    want = _run(lambda *x: _v2_chain(*x, True), tensors)
    for name, a, w in zip(("out", "dq", "dk", "dv", "dlam"), got, want, strict=True):
        assert a.shape == w.shape and a.stride() == w.stride(), name
        assert torch.equal(a, w), name


def test_k_shared_against_float64_from_each_maps_queries_and_its_call_class():
    # DIFF V2's maps handed over apart (diff_attention with K twice: the pairs interleaved for the node) and whole,
    # causal or not, output and every gradient against float64 by the rounding rule; its class is shared_k's
    q, k, v, lam = _v2_inputs(torch.float32, t=17, seed=4)
    q1, q2 = (x.detach().requires_grad_() for x in ops.interleaved_pair(q, 1))
    tensors = (q1, q2, k, v, lam)
    ran = []
    real = direct._OneNode.apply
    for causal in (True, False):

        def split(q1, q2, k, v, lam, backend, c=causal):
            return ops.diff_attention(q1, k, q2, k, v, lam, causal=c, backend=backend)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(direct._OneNode, "apply", lambda *a: ran.append(a[4]) or real(*a))
            got = _run(lambda *x: split(*x, routes.DIRECT), tensors)
        gold = _run(lambda *x: split(*x, "reference"), [x.detach().double().requires_grad_() for x in tensors])
        yard = _run(lambda *x: split(*x, "sdpa_maps"), tensors)
        for name, a, w, y in zip(("out", "dq1", "dq2", "dk", "dv", "dlam"), got, gold, yard, strict=True):
            assert_within_rounding(name, a, w, [y], torch.float32)
    assert ran == ["keys_shared", "keys_shared"], "the one node ran, with K and V read once"
    inp = validate(*ops.interleaved_pair(q, 1)[:1], k, *ops.interleaved_pair(q, 1)[1:], k, v, lam, causal=True,
                   attn_mask=None, scale=None, qk_whole=(q, k))  # fmt: skip
    assert routes.call_class(inp) == "shared_k d8 dv8 fp32 causal none train small"
    assert direct.one_node_operands(inp, "shared") is None, "cudnn_shared_v is DIFF V1's (K in pairs)"


def test_k_shared_asks_sdpas_check_about_grouped_heads_and_a_refused_backward_groups_them_too(monkeypatch, caplog):
    # cuDNN's acceptance is SDPA's own check of the call with enable_gqa (K and V of fewer heads than Q); where cuDNN's
    # backward raises, the gradients come from SDPA's own backward over the same grouped heads — the chain's, bit for
    # bit where no group sums, within rounding where one does — under GQA too (two query pairs over one K head)
    import logging

    asked = []

    class Params:
        def __init__(self, *args):
            asked.append(args[6])

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.backends.cuda, "SDPAParams", Params)
        patch.setattr(torch.backends.cuda, "can_use_cudnn_attention", lambda params: True)
        patch.setattr(direct, "_ACCEPTED", {})
        q, k, v, _ = _v2_inputs(torch.float32, kv=1)
        assert direct.CUDNN.accepts(("a",), q, k, v, "keys_shared", True) and asked == [True]
        qs, ks, vs, _ = _model_inputs(torch.float32)
        assert direct.CUDNN.accepts(("b",), qs, ks, vs, "halves", True) and asked == [True, False]

    _raising(monkeypatch, "backward", "cuDNN Frontend error: no valid engine configs for the backward")
    tensors = _v2_inputs(torch.float32, kv=1, seed=3)
    with caplog.at_level(logging.WARNING, logger="diffattn.ops.direct"):
        got = _run(lambda *x: ops.diff_attention_pairs(*x, backend=routes.DIRECT), tensors)
    want = _run(lambda *x: _v2_chain(*x, True), tensors)
    gold = _run(lambda *x: _v2_chain(*x, True), [x.detach().double().requires_grad_() for x in tensors])
    for name, a, w, g in zip(("out", "dq", "dk", "dv", "dlam"), got, want, gold, strict=True):
        if name in ("dk", "dv"):  # summed over the group's query heads inside SDPA (enable_gqa) or by autograd after
            # the chain's repeat: two summation orders, equal bit for bit on an Intel Xeon, not on an AMD EPYC
            assert_within_rounding(name, a, g, [w], torch.float32)
        else:
            assert torch.equal(a, w), name
    assert len(caplog.records) == 1 and "cudnn_direct" in caplog.records[0].message


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(("t", "d"), [(1024, 64), (2048, 128), (333, 64)])
def test_gpu_k_shared_matches_the_reference_through_cudnns_grouped_heads(t, d, caplog):
    # on the GPU, through cuDNN's ATen ops with Q of 2H heads over K and V of Hkv: run by the one node (no log line:
    # cuDNN took the call), the output and dλ bit for bit cudnn+epilogue's (the same forward kernels), and every value
    # within the rounding rule of float64 (sdpa_maps's own error the yardstick)
    import logging

    tensors = _v2_inputs(torch.bfloat16, b=2, h=4, t=t, d=d, device="cuda")  # (GQA: refused, as by cudnn+epilogue)
    ran = []
    real = direct._OneNode.apply
    with pytest.MonkeyPatch.context() as patch, caplog.at_level(logging.WARNING, logger="diffattn.ops.direct"):
        patch.setattr(direct._OneNode, "apply", lambda *a: ran.append(1) or real(*a))
        got = _run(lambda *x: ops.diff_attention_pairs(*x, backend=routes.DIRECT), tensors)
    assert ran and not caplog.records, [r.message for r in caplog.records]
    chain = _run(lambda *x: ops.diff_attention_pairs(*x, backend="cudnn+epilogue"), tensors)
    assert torch.equal(got[0], chain[0]) and torch.equal(got[-1], chain[-1])
    gold = _run(lambda *x: ops.diff_attention_pairs(*x, backend="reference"),
                [x.detach().double().requires_grad_() for x in tensors])  # fmt: skip
    yard = _run(lambda *x: ops.diff_attention_pairs(*x, backend="sdpa_maps"), tensors)
    for name, a, w, y in zip(("out", "dq", "dk", "dv", "dlam"), got, gold, yard, strict=True):
        assert_within_rounding(name, a, w, [y], torch.bfloat16)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(("t", "d"), [(1024, 64), (4096, 64), (2048, 128), (333, 64)])
def test_gpu_the_route_is_cudnn_epilogue_and_matches_the_reference(t, d):
    # on the GPU, through cuDNN's ATen ops: every value bit for bit the cudnn+epilogue route's (the same kernels on the
    # same inputs), and against float64 within the rounding rule (sdpa_maps's own error the yardstick)
    tensors = _model_inputs(torch.bfloat16, b=2, h=4, t=t, d=d, lam_form="per_head", device="cuda")
    norm = HeadNorm(1e-5, 0.8)
    with ops.fused_head_norm(True):
        got = _run(lambda *x: ops.diff_attention_stacked(*x, backend=routes.DIRECT, head_norm=norm), tensors)
        chain = _run(lambda *x: ops.diff_attention_stacked(*x, backend="cudnn+epilogue", head_norm=norm), tensors)
        again = _run(lambda *x: ops.diff_attention_stacked(*x, backend="cudnn+epilogue", head_norm=norm), tensors)
    # the output and dλ bit for bit (a deterministic forward, the epilogue's backward on it); dQ, dK, dV come from
    # cuDNN's attention backward, which need not repeat itself bit for bit (PyTorch refuses cuDNN attention under
    # torch.use_deterministic_algorithms; on the H200 of 2026-11-29 this failed at d = 128 only): within twice the
    # chain's own difference between two runs — bit for bit where the chain repeats itself
    for name, a, w, w2 in zip(("out", "dq", "dk", "dv", "dlam"), got, chain, again, strict=True):
        if name in ("out", "dlam"):
            assert torch.equal(a, w), name
            continue
        off, spread = (a.float() - w.float()).abs().max().item(), (w.float() - w2.float()).abs().max().item()
        assert off <= 2 * spread, f"{name}: {off:.3g} off the chain, whose two runs differ by {spread:.3g}"
    gold = _run(lambda *x: ops.diff_attention_stacked(*x, backend="reference", head_norm=norm),
                [x.detach().double().requires_grad_() for x in tensors])  # fmt: skip
    yard = _run(lambda *x: ops.diff_attention_stacked(*x, backend="sdpa_maps", head_norm=norm), tensors)
    for name, a, w, y in zip(("out", "dq", "dk", "dv", "dlam"), got, gold, yard, strict=True):
        assert_within_rounding(name, a, w, [y], torch.bfloat16)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("route", [routes.DIRECT, routes.SHARED_V, "v2"])
def test_gpu_a_planned_call_is_the_whole_paths_bit_for_bit(route):
    # on the GPU, through cuDNN's ATen ops (diffattn.ops.call_plans): the second call of a signature runs the node the
    # first one recorded, with nothing before it, and gives every value bit for bit as the first (the same kernels on
    # the same inputs) and as the same call with plans off
    from diffattn.ops import call_plans

    norm = HeadNorm(1e-5, 0.8)
    if route == routes.DIRECT:
        tensors = _model_inputs(torch.bfloat16, b=2, h=4, t=1024, d=64, device="cuda")
        entry = ops.diff_attention_stacked
    elif route == "v2":  # DIFF V2's call (no head norm): K and V read once, λ per head and token (viewed by the plan)
        tensors = _v2_inputs(torch.bfloat16, b=2, h=4, t=1024, d=64, device="cuda")
        entry, route, norm = ops.diff_attention_pairs, routes.DIRECT, None
    else:
        tensors = _pairs_inputs(torch.bfloat16, b=2, h=4, t=1024, d=64, device="cuda")
        entry = ops.diff_attention_pairs
    call_plans.forget()
    with ops.fused_head_norm(True):
        first = _run(lambda *x: entry(*x, backend=route, head_norm=norm), tensors)
        assert len(call_plans.PLANS) == 1, "the first call made a plan"
        planned = _run(lambda *x: entry(*x, backend=route, head_norm=norm), tensors)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(call_plans, "signature", lambda *a, **k: None)
            whole = _run(lambda *x: entry(*x, backend=route, head_norm=norm), tensors)
    for name, a, b, c in zip(("out", "dq", "dk", "dv", "dlam"), planned, first, whole, strict=True):
        assert torch.equal(a, b) and torch.equal(a, c), name


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("route", ["cudnn_shared_v", "cudnn_shared_v_split"])
@pytest.mark.parametrize(("t", "d"), [(1024, 64), (4096, 64), (2048, 128), (333, 64)])
def test_gpu_shared_v_matches_the_reference(t, d, route, caplog):
    # on the GPU, through cuDNN's ATen ops with K of 2H heads and V of H (whole, or per column slice): within the
    # rounding rule of float64 (the stacked cudnn+epilogue's own error the yardstick), and run by the one node — not
    # handed to cudnn+epilogue
    import logging

    tensors = _pairs_inputs(torch.bfloat16, b=2, h=4, t=t, d=d, lam_form="per_head", device="cuda")
    norm = HeadNorm(1e-5, 0.8)
    with ops.fused_head_norm(True), caplog.at_level(logging.WARNING, logger="diffattn.ops.direct"):
        got = _run(lambda *x: _shared_v(*x, head_norm=norm, route=route), tensors)
    assert not caplog.records, [r.message for r in caplog.records]
    gold = _run(lambda *x: ops.diff_attention_pairs(*x, backend="reference", head_norm=norm),
                [x.detach().double().requires_grad_() for x in tensors])  # fmt: skip
    with ops.fused_head_norm(True):
        yard = _run(lambda *x: ops.diff_attention_pairs(*x, backend="cudnn+epilogue", head_norm=norm), tensors)
    for name, a, w, y in zip(("out", "dq", "dk", "dv", "dlam"), got, gold, yard, strict=True):
        assert_within_rounding(name, a, w, [y], torch.bfloat16)
