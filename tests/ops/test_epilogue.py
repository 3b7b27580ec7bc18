"""Tests of the fused epilogue, ``O1 − λ·O2`` in float32 as one Triton kernel and its backward in one more
(DIFF Transformer Eq. 1, docs/methods.md §0.2; diffattn/ops/triton/epilogue.py), and of the routes ``<route>+epilogue``
that use it.

Without CUDA the kernels run in Triton's CPU interpreter (``TRITON_INTERPRET=1``, set around the first import of the
kernels as in test_triton.py). Accuracy contract: the kernel does PyTorch's arithmetic (float32, one rounding to the
output dtype), so it is held to that arithmetic within one rounding of the output dtype — the interpreter rounds
float32 to bfloat16 toward zero where a GPU rounds to nearest, both within one ulp of the float32 value — and dλ, a
float32 sum in another order, within the textbook bound of reordered summation (n·eps·Σ|terms|).
"""

from __future__ import annotations

import pytest
import torch

from diffattn import ops
from diffattn.ops import routes, sdpa
from diffattn.ops._inputs import validate

from ..helpers import pairwise
from .interpreter import CUDA as _CUDA
from .interpreter import import_kernels, keep_interpreting
from .rounding import assert_within_rounding

DEVICE = "cuda" if _CUDA else "cpu"
epilogue = import_kernels("diffattn.ops.triton.epilogue")


@pytest.fixture(autouse=True)
def _interpreted(monkeypatch):
    keep_interpreting(monkeypatch)


def _within_one_rounding(name, got, want, dtype, product=None):
    """``got`` (in ``dtype``) is ``want`` rounded once to ``dtype``: within one ulp of it. ``product``: the |λ·O2| the
    value was computed with, whose float32 rounding (a GPU may fuse the multiply into the subtraction, or not) may
    differ by one float32 ulp of it — what remains where O1 and λ·O2 nearly cancel."""
    finfo = torch.finfo(dtype)
    err = (got.double() - want.double()).abs()
    bound = finfo.eps * want.double().abs() + finfo.tiny
    if product is not None:
        bound = bound + torch.finfo(torch.float32).eps * product.double().abs()
    assert (err <= bound).all(), f"{name}: {err.max().item():.3g} beyond one rounding of {dtype}"


def _operands(layout, dtype, lam_form, b=2, h=3, t=7, dv=24, seed=0):
    """O1, O2 [B, H, T, dv] as the routes hand them over (views of one output, in ``dtype``), and λ in one of
    validate's forms; gradients are taken with respect to the views themselves."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(DEVICE, dtype).requires_grad_()

    if layout == "stacked":  # slices of one [B, 2H, T, dv] output (sdpa, cudnn, sdpa_split)
        o = rnd(b, 2 * h, t, dv)
        o1, o2 = o[:, :h], o[:, h:]
    elif layout == "interleaved":  # views of [B, H, 2, T, dv] (DIFF V2's one call)
        o1, o2 = rnd(b, h, 2, t, dv).unbind(2)
    elif layout == "stacked_bthd":  # the same, laid out as SDPA's kernels write on a GPU: [B, T, 2H, dv] in memory
        o = rnd(b, t, 2 * h, dv).transpose(1, 2)
        o1, o2 = o[:, :h], o[:, h:]
    elif layout == "apart_bthd":
        o1, o2 = rnd(b, t, h, dv).transpose(1, 2), rnd(b, t, h, dv).transpose(1, 2)
    else:  # two calls' own outputs (sdpa_maps, cudnn_maps)
        o1, o2 = rnd(b, h, t, dv), rnd(b, h, t, dv)
    lam = {
        "scalar": lambda: torch.tensor(0.37),
        "per_head": lambda: torch.rand(1, h, 1, 1, generator=g),
        "per_token": lambda: torch.rand(b, h, t, 1, generator=g),
    }[lam_form]()
    assert layout == "apart" or not o1.is_contiguous(), "the layout under test reaches the kernel"
    return o1, o2, lam.to(DEVICE).requires_grad_()


@pytest.mark.parametrize(
    ("layout", "lam_form", "dtype"),
    pairwise(  # every pair of these in the default run, the whole product in CI's heavy run
        layout=["stacked", "interleaved", "apart", "stacked_bthd", "apart_bthd"],
        lam_form=["scalar", "per_head", "per_token"],
        dtype=[torch.float32, torch.bfloat16, torch.float16],
    ),
)
def test_the_kernel_does_pytorchs_float32_arithmetic_forward_and_backward(dtype, lam_form, layout):
    o1, o2, lam = _operands(layout, dtype, lam_form)
    out = epilogue.subtract_maps(o1, o2, lam)
    product = lam * o2.float()
    assert out.dtype == dtype and out.shape == o1.shape
    _assert_laid_out_like(out, o1)
    _within_one_rounding("out", out, o1.float() - product, dtype, product)

    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE, dtype)
    d_o1, d_o2, d_lam = torch.autograd.grad(out, (o1, o2, lam), g)
    assert torch.equal(d_o1, g), "dO1 is the output's gradient itself"
    _assert_laid_out_like(d_o2, o2)
    _within_one_rounding("dO2", d_o2, -lam.detach() * g.float(), dtype)
    terms = (g.float() * o2.detach().float()).unsqueeze(0)  # dλ = −Σ g·O2 over what λ was broadcast along
    want_lam = -(g.float() * o2.detach().float()).sum_to_size(lam.shape)
    n = g.numel() // lam.numel()
    bound = n * torch.finfo(torch.float32).eps * terms.abs().squeeze(0).sum_to_size(lam.shape)
    assert d_lam.shape == lam.shape and d_lam.dtype == lam.dtype
    assert ((d_lam - want_lam).abs() <= bound).all(), "dλ beyond reordered float32 summation"


def _assert_laid_out_like(got, like):
    # dense, in ``like``'s dimension order (by stride, ties in logical order), as PyTorch's element-wise ops lay out
    # their outputs: the model's transpose to [B, T, H·dv] after the attention is then free for an output of SDPA's
    # [B, T, H, dv] layout (a contiguous [B, H, T, dv] one cost a copy there, and a layout change in cuDNN's backward)
    order = sorted(range(like.dim()), key=lambda i: (-like.stride(i), i))
    assert got.permute(*order).is_contiguous(), f"strides {got.stride()} not in the order of {like.stride()}"


def _one_call_output(memory, dtype, b=2, h=3, t=7, dv=24, seed=0):
    """One call's [B, 2H, T, dv] output: ``contiguous``, ``bthd`` (laid out [B, T, 2H, dv], as SDPA's CUDA kernels
    write it for a model's Q) or ``dv_outer`` (the last stride not 1: no SDPA output, a caller's tensor)."""
    g = torch.Generator().manual_seed(seed)
    if memory == "bthd":
        return torch.randn(b, t, 2 * h, dv, generator=g).to(DEVICE, dtype).transpose(1, 2).requires_grad_()
    if memory == "dv_outer":
        return torch.randn(b, 2 * h, dv, t, generator=g).to(DEVICE, dtype).transpose(2, 3).requires_grad_()
    return torch.randn(b, 2 * h, t, dv, generator=g).to(DEVICE, dtype).requires_grad_()


def _cut(o, layout):
    return o.unflatten(1, (-1, 2)).unbind(2) if layout == "interleaved" else o.chunk(2, dim=1)


@pytest.mark.parametrize(
    ("layout", "memory", "lam_form", "dtype"),
    pairwise(
        layout=["stacked", "interleaved"],
        memory=["contiguous", "bthd", "dv_outer"],
        lam_form=["scalar", "per_head", "per_token"],
        dtype=[torch.float32, torch.bfloat16],
    ),
)
def test_subtract_pair_is_subtract_maps_on_the_halves_with_the_whole_gradient_from_one_kernel(
    layout, memory, lam_form, dtype, monkeypatch
):
    # the same kernels' numbers bit for bit — the output, dλ, and the gradient of the whole output that autograd
    # joined from dO1 and dO2 by a cat — where the backward is one launch and writes that gradient laid out as the
    # output (the guard of ops.sdpa then hands it to SDPA's backward without a copy), with no cut for autograd to join
    o = _one_call_output(memory, dtype)
    h = o.shape[1] // 2
    lam = (
        {
            "scalar": lambda: torch.tensor(0.37),
            "per_head": lambda: torch.rand(1, h, 1, 1, generator=torch.Generator().manual_seed(4)),
            "per_token": lambda: torch.rand(2, h, 7, 1, generator=torch.Generator().manual_seed(4)),
        }[lam_form]()
        .to(DEVICE)
        .requires_grad_()
    )
    launches = []
    real = epilogue._launch_subtract
    monkeypatch.setattr(epilogue, "_launch_subtract", lambda kernel, *a, **kw: launches.append(kernel) or real(
        kernel, *a, **kw))  # fmt: skip
    out = epilogue.subtract_pair(o, lam, layout)
    want = epilogue.subtract_maps(*_cut(o, layout), lam)
    assert torch.equal(out, want)
    assert out.grad_fn.next_functions[0][0] is None or type(out.grad_fn.next_functions[0][0]).__name__ == (
        "AccumulateGrad"
    ), "o reaches the epilogue whole: nothing for autograd to join"
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE, dtype)
    launches.clear()
    d_o, d_lam = torch.autograd.grad(out, (o, lam), g)
    assert launches == [epilogue._subtract_bwd_kernel], "the whole gradient from the one backward kernel"
    want_o, want_lam = torch.autograd.grad(want, (o, lam), g)
    assert torch.equal(d_o, want_o) and torch.equal(d_lam, want_lam)
    if memory == "dv_outer":  # the kernels write rows with the last stride 1
        assert d_o.is_contiguous()
    else:
        assert d_o.stride() == o.stride(), "the gradient laid out as the output"


@pytest.mark.parametrize(
    ("layout", "memory", "normed", "dtype"),
    pairwise(
        layout=["stacked", "interleaved"],
        memory=["contiguous", "bthd"],
        normed=[False, True],
        dtype=[torch.float32, torch.bfloat16],
    ),
)
def test_two_calls_outputs_read_where_they_are_are_their_join_bit_for_bit(layout, memory, normed, dtype, monkeypatch):
    # subtract_pair_parts: the sdpa_split route's two calls' outputs (one per slice of V) read by the kernels as the
    # one output they would be joined into, and their gradients written each whole in its own layout by the one
    # backward kernel — the same kernels' numbers as subtract_pair on the join, bit for bit, forward and every gradient
    oa = _one_call_output(memory, dtype, dv=12, seed=0)
    ob = _one_call_output(memory, dtype, dv=12, seed=1)
    lam = torch.rand(2, 3, 7, 1, generator=torch.Generator().manual_seed(4)).to(DEVICE).requires_grad_()
    norm = (1e-5, 0.7) if normed else None
    launches = []
    real = epilogue._launch_subtract
    monkeypatch.setattr(epilogue, "_launch_subtract", lambda kernel, *a, **kw: launches.append(kernel) or real(
        kernel, *a, **kw))  # fmt: skip
    out = epilogue.subtract_pair_parts((oa, ob), lam, layout, norm)
    want = epilogue.subtract_pair(torch.cat([oa, ob], dim=-1), lam, layout, norm)
    assert torch.equal(out, want)
    _assert_laid_out_like(out, oa)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE, dtype)
    launches.clear()
    got = torch.autograd.grad(out, (oa, ob, lam), g)
    assert launches == [epilogue._subtract_bwd_kernel], "both calls' gradients from the one backward kernel"
    wanted = torch.autograd.grad(want, (oa, ob, lam), g)
    for name, a, b in zip(("d_oa", "d_ob", "d_lam"), got, wanted, strict=True):
        assert torch.equal(a, b), name
    # the gradients: the halves of one buffer laid out as the join sdpa_split guards — the strides the same SDPA calls
    # get from that route (cuDNN's cache: one layout per call, across routes)
    half = sdpa._joined([oa, ob])[..., : oa.shape[-1]].stride()
    assert got[0].stride() == half and got[1].stride() == half, "the halves of the join's layout, as sdpa_split's"


def test_two_outputs_of_different_layouts_are_refused_and_the_route_joins_them():
    oa, ob = _one_call_output("bthd", torch.float32), _one_call_output("contiguous", torch.float32, seed=1)
    assert not epilogue.parts_fit(oa, ob) and epilogue.parts_fit(oa, _one_call_output("bthd", torch.float32, seed=2))
    with pytest.raises(ValueError, match="two \\[B, 2H, T, d\\] tensors of one layout"):
        epilogue.subtract_pair_parts((oa, ob), torch.tensor(0.5), "stacked")


def test_sdpa_split_with_its_epilogue_reads_its_two_calls_outputs_unjoined(monkeypatch):
    # the route at dv = 2d: two calls (one per slice of V), their outputs into the epilogue's kernel as they are (its
    # numbers against float64: test_each_epilogue_route_is_its_route_forward_and_backward)
    from diffattn.ops import sdpa

    took = []
    monkeypatch.setattr(epilogue, "subtract_pair_parts", _recording(epilogue.subtract_pair_parts, took, "parts"))
    monkeypatch.setattr(sdpa, "_joined", _recording(sdpa._joined, took, "joined"))
    inputs = _diff_inputs(False, torch.float32)
    ops.diff_attention(**inputs, backend="sdpa_split+epilogue")
    assert took == ["parts"]


def _normed(o1, o2, lam, eps, scale, flip=False):
    """scale · y / sqrt(mean(y²) + eps), y = O1 − λ·O2: PyTorch's unfused ops in the inputs' float type (float64 for
    the gold, float32 for a yardstick); ``flip``: the columns summed in the other order (one order's error may be
    luckily small)."""
    y = o1 - lam * o2
    y = y.flip(-1) if flip else y
    out = torch.nn.functional.rms_norm(y, (y.shape[-1],), eps=eps) * scale
    return out.flip(-1) if flip else out


@pytest.mark.parametrize(
    ("layout", "lam_form", "dtype"),
    pairwise(
        layout=["stacked", "interleaved", "apart", "stacked_bthd", "pair", "pair_bthd"],
        lam_form=["scalar", "per_head", "per_token"],
        dtype=[torch.float32, torch.bfloat16],
    ),
)
def test_the_head_norm_in_the_kernel_is_pytorchs_norm_within_its_rounding(layout, lam_form, dtype):
    # DIFF Eq. 3's head, scale · RMSNorm(O1 − λ·O2) without a gain, in the subtraction's kernel (norm=(eps, scale)):
    # the output and every gradient against float64, within the rule of tests/ops/rounding.py (twice plain PyTorch's
    # float32 error in two summation orders, plus one rounding of the dtype). dv = 40: padded columns in the sums
    eps, scale = 1e-5, 0.7
    if layout.startswith("pair"):
        o = _one_call_output("bthd" if layout == "pair_bthd" else "contiguous", dtype, dv=40, t=5)
        o1, o2 = o.chunk(2, dim=1)
        lam = _operands("apart", dtype, lam_form, t=5, dv=40)[2]
        out = epilogue.subtract_pair(o, lam, "stacked", norm=(eps, scale))
        wrt = (o, lam)
    else:
        o1, o2, lam = _operands(layout, dtype, lam_form, t=5, dv=40)
        out = epilogue.subtract_maps(o1, o2, lam, norm=(eps, scale))
        wrt = (o1, o2, lam)
    assert out.dtype == dtype and out.shape == o1.shape
    _assert_laid_out_like(out, o1)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE, dtype)
    got = (out, *torch.autograd.grad(out, wrt, g))

    def computed(kind, flip=False):  # the output and the gradients by PyTorch's ops in float64 or float32
        cast = [x.detach().to(kind).requires_grad_() for x in wrt]
        if len(cast) == 2:
            a, b = cast[0].chunk(2, dim=1)
            y = _normed(a, b, cast[1], eps, scale, flip)
        else:
            y = _normed(*cast, eps, scale, flip)
        return (y, *torch.autograd.grad(y, cast, g.to(kind)))

    gold = computed(torch.float64)
    plain = [computed(torch.float32), computed(torch.float32, flip=True)]
    for i, name in enumerate(["out"] + [f"d{n}" for n in ("o", "lam")] if len(wrt) == 2 else
                             ["out", "dO1", "dO2", "dlam"]):  # fmt: skip
        # a yardstick's output is float32 rounded to the dtype, as the kernel's is
        yardsticks = [p[i].to(got[i].dtype) for p in plain]
        assert_within_rounding(name, got[i], gold[i], yardsticks, got[i].dtype)


def test_subtract_pair_refuses_what_is_not_one_calls_output():
    o = torch.zeros(1, 3, 2, 8, device=DEVICE)
    with pytest.raises(ValueError, match=r"o must be \[B, 2H, T, dv\]"):
        epilogue.subtract_pair(o, torch.tensor(0.5), "stacked")
    with pytest.raises(ValueError, match="layout must be 'stacked' or 'interleaved'"):
        epilogue.subtract_pair(torch.zeros(1, 2, 2, 8, device=DEVICE), torch.tensor(0.5), "pairs")


def test_a_row_of_width_not_a_power_of_two_and_a_partial_last_program():
    # dv = 40 pads to 64 columns; 2·3·5 = 30 rows over 4-row programs leave the last one half full
    o1, o2, lam = _operands("apart", torch.float32, "per_token", t=5, dv=40)
    out = epilogue.subtract_maps(o1, o2, lam)
    _within_one_rounding("out", out, o1 - lam * o2, torch.float32, lam * o2)


def test_a_second_derivative_is_one_clear_error_not_a_partial_one():
    # the backward kernel's dO2 and dλ carry no graph: a gradient penalty through them (create_graph=True) would
    # take them as constants and give a wrong second derivative with no word; it must refuse instead
    o1, o2, lam = _operands("apart", torch.float32, "scalar")
    grads = torch.autograd.grad(epilogue.subtract_maps(o1, o2, lam).square().sum(), (o1, o2, lam), create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        (grads[0].square().sum() + grads[1].square().sum()).backward()


def test_empty_inputs_give_empty_outputs():
    o1 = torch.zeros(1, 2, 0, 16, device=DEVICE, requires_grad=True)  # no rows: no launch
    lam = torch.tensor(0.5, device=DEVICE, requires_grad=True)
    out = epilogue.subtract_maps(o1, o1.detach().clone().requires_grad_(), lam)
    assert out.shape == (1, 2, 0, 16)
    out.sum().backward()
    assert lam.grad is not None and lam.grad.item() == 0.0


def _diff_inputs(shared: bool, dtype, mask: bool = False, lam_form: str = "scalar", dv_factor: int = 2, seed=0,
                 model_layout: bool = False):  # fmt: skip
    """``model_layout``: Q, K, V laid out [B, T, H, d] as a model's projections hand them over: the per-map routes'
    outputs are then [B, T, H, dv]-ordered and joined in that order (ops.sdpa._sliced_call). The one-call routes
    concatenate the separate maps' Q here, so their outputs stay contiguous: the cut of an output laid out
    [B, T, 2H, dv] (ops.sdpa._maps_apart) is tested through the whole-heads calls, tests/ops/test_whole_heads.py."""
    g = torch.Generator().manual_seed(seed)
    b, h, t, d = 2, 2, 9, 16

    def rnd(b, h, t, w):
        if model_layout:
            return torch.randn(b, t, h, w, generator=g).to(DEVICE, dtype).transpose(1, 2).requires_grad_()
        return torch.randn(b, h, t, w, generator=g).to(DEVICE, dtype).requires_grad_()

    q1, q2, k1 = rnd(b, h, t, d), rnd(b, h, t, d), rnd(b, h, t, d)
    k2 = k1 if shared else rnd(b, h, t, d)
    v = rnd(b, h, t, d if shared else dv_factor * d)
    lam = {"scalar": torch.tensor(0.4), "per_token": torch.rand(b, h, t, generator=g)}[lam_form]
    lam = lam.to(DEVICE).requires_grad_()
    attn_mask = None
    if mask:  # a 4-D mask hiding keys 0-2 from batch 1 and every key from its first query row (fully masked)
        keep = torch.ones(b, 1, t, t, dtype=torch.bool)
        keep[1, :, :, :3] = False
        keep[1, :, 0] = False
        attn_mask = keep.to(DEVICE)
    return dict(q1=q1, k1=k1, q2=q2, k2=k2, v=v, lam=lam, causal=not mask, attn_mask=attn_mask)


@pytest.mark.parametrize("route", [r for r in routes.EPILOGUE_ROUTES if not r.startswith("cudnn")])
@pytest.mark.parametrize(("shared", "mask", "lam_form", "model_layout"), [
    (False, False, "scalar", False), (True, False, "per_token", False), (False, True, "scalar", False),
    (False, False, "scalar", True), (True, False, "per_token", True)])  # fmt: skip
def test_each_epilogue_route_is_its_route_forward_and_backward(route, shared, mask, lam_form, model_layout):
    if route == "sdpa_split" and shared:
        pytest.skip("sdpa_split needs dv > d: not DIFF V2's shared-K heads")
    inputs = _diff_inputs(shared, torch.float32, mask, lam_form, model_layout=model_layout)
    leaves = [inputs["q1"], inputs["k1"], inputs["q2"], inputs["v"], inputs["lam"]]
    if not shared:
        leaves.append(inputs["k2"])
    plain = ops.diff_attention(**inputs, backend=route)
    fused = ops.diff_attention(**inputs, backend=route + routes.EPILOGUE)
    gold_leaves = [x.detach().double().requires_grad_() for x in leaves]
    gold_inputs = {**inputs, **dict(zip(("q1", "k1", "q2", "v", "lam", "k2"), gold_leaves, strict=False))}
    if shared:
        gold_inputs["k2"] = gold_inputs["k1"]
    gold = ops.diff_attention(**gold_inputs, backend="reference")
    g = torch.randn(plain.shape, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    # the project's one rule (tests/ops/rounding.py): within twice the plain route's own error against float64,
    # plus one ulp — the plain route being the same SDPA calls with PyTorch's subtraction
    assert_within_rounding("out", fused, gold, [plain], torch.float32)
    if mask:
        assert (fused[1, :, 0] == 0).all(), "the fully masked row is 0"
    names = ("dq1", "dk1", "dq2", "dv", "dλ", "dk2")[: len(leaves)]
    for name, a, b, c in zip(
        names,
        torch.autograd.grad(fused, leaves, g),
        torch.autograd.grad(plain, leaves, g),
        torch.autograd.grad(gold, gold_leaves, g.double()),
        strict=True,
    ):
        assert_within_rounding(name, a, c, [b], torch.float32)


@pytest.mark.parametrize("route", [r for r in routes.EPILOGUE_ROUTES if not r.startswith("cudnn")])
@pytest.mark.parametrize(("mask", "model_layout"), [(False, False), (True, False), (False, True)])
def test_a_head_norm_is_one_output_through_every_route_fused_or_not(route, mask, model_layout, monkeypatch):
    # ops.HeadNorm (DIFF Eq. 3: RMSNorm without a gain, then 1 − λ_init) handed to the op: by PyTorch after the plain
    # route and after an epilogue route where the fusion is off — the route's output normed, bit for bit — and in the
    # epilogue's kernel where it is on; the output and every gradient against float64, by the rule of
    # tests/ops/rounding.py with the plain route and PyTorch's norm as the yardstick. Fully masked rows stay 0
    inputs = _diff_inputs(False, torch.float32, mask, model_layout=model_layout)
    norm = ops.HeadNorm(1e-5, 0.65)
    leaves = [inputs[k] for k in ("q1", "k1", "q2", "k2", "v", "lam")]
    plain = ops.diff_attention(**inputs, backend=route, head_norm=norm)
    launched = []
    real_launch = epilogue._launch_subtract
    monkeypatch.setattr(
        epilogue, "_launch_subtract", lambda *a, **k: launched.append(k["NORM"]) or real_launch(*a, **k)
    )
    with ops.fused_head_norm(False):
        unfused = ops.diff_attention(**inputs, backend=route + routes.EPILOGUE, head_norm=norm)
        assert torch.equal(unfused, norm.apply(ops.diff_attention(**inputs, backend=route + routes.EPILOGUE)))
    assert launched and not any(launched), "the kernel did not norm"
    with ops.fused_head_norm(True):
        fused = ops.diff_attention(**inputs, backend=route + routes.EPILOGUE, head_norm=norm)
    assert launched[-1] is True, "the kernel normed"
    gold_leaves = [x.detach().double().requires_grad_() for x in leaves]
    gold_inputs = {**inputs, **dict(zip(("q1", "k1", "q2", "k2", "v", "lam"), gold_leaves, strict=True))}
    gold = ops.diff_attention(**gold_inputs, backend="reference", head_norm=norm)
    assert_within_rounding("out", fused, gold, [plain], torch.float32)
    if mask:
        assert (fused[1, :, 0] == 0).all() and (plain[1, :, 0] == 0).all(), "the fully masked row is 0"
    g = torch.randn(plain.shape, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    with ops.fused_head_norm(True):
        fused_grads = torch.autograd.grad(fused, leaves, g)
    # a scalar λ's gradient is a sum: its terms, the gradient of λ given per token (the finest λ the op takes)
    b, h, t = inputs["q1"].shape[:3]
    per_token = gold_leaves[-1].detach().expand(b, h, t).clone().requires_grad_()
    gold_per_token = ops.diff_attention(**{**gold_inputs, "lam": per_token}, backend="reference", head_norm=norm)
    lam_terms = torch.autograd.grad(gold_per_token, per_token, g.double())[0]
    for name, a, b, c in zip(
        ("dq1", "dk1", "dq2", "dk2", "dv", "dλ"),
        fused_grads,
        torch.autograd.grad(plain, leaves, g),
        torch.autograd.grad(gold, gold_leaves, g.double()),
        strict=True,
    ):
        terms = lam_terms if name == "dλ" and leaves[-1].dim() == 0 else None
        assert_within_rounding(name, a, c, [b], torch.float32, terms=terms)


def test_a_head_norm_must_be_one():
    with pytest.raises(ValueError, match=r"head_norm must be a diffattn\.ops\.HeadNorm or None, got tuple"):
        ops.diff_attention(**_diff_inputs(False, torch.float32), backend="sdpa", head_norm=(1e-5, 0.8))
    for bad in (dict(eps=float("nan")), dict(eps=1e-5, scale=-1.0), dict(eps="1e-5")):
        with pytest.raises(ValueError, match=r"HeadNorm (eps|scale) must be a finite float >= 0"):
            ops.HeadNorm(**bad)


def test_an_epilogue_route_refuses_what_its_kernel_cannot_take():
    inp = validate(**_diff_inputs(False, torch.float64), scale=0.25)
    assert "fused epilogue: dtype torch.float64 is not supported" in ops.route_unsupported("sdpa+epilogue", inp)
    assert ops.route_unsupported("sdpa", inp) is None
    if not _CUDA:  # the base route's reason and the kernel's both said
        fp32 = validate(**_diff_inputs(False, torch.float32), scale=0.25)
        reason = ops.route_unsupported("cudnn_maps+epilogue", fp32)
        assert "cuDNN attention runs on CUDA" in reason
    refused = r"backend 'sdpa\+epilogue' is not usable: fused epilogue: dtype torch.float64"
    with pytest.raises(ValueError, match=refused):
        ops.diff_attention(**_diff_inputs(False, torch.float64), backend="sdpa+epilogue")


def test_every_epilogue_route_is_a_backend_and_a_table_route():
    for route in routes.EPILOGUE_ROUTES:
        assert route in ops.BACKENDS and route + routes.EPILOGUE in ops.BACKENDS
        assert route + routes.EPILOGUE in routes.ROUTE_NAMES
    names = {s.name for s in ops.backend_status(DEVICE)}
    assert {r + routes.EPILOGUE for r in routes.EPILOGUE_ROUTES} <= names


@pytest.mark.parametrize(
    ("route", "op", "function"),
    [("sdpa", "_subtract_pair_op", "_SubtractPair"), ("sdpa_maps", "_subtract_op", "_SubtractMaps")],
)
@pytest.mark.parametrize("normed", [False, True])
def test_an_epilogue_route_under_a_fullgraph_compile_is_one_opaque_op(monkeypatch, route, op, function, normed):
    # under torch.compile the kernels are custom ops with fake implementations (the tracer goes through the route
    # without a break, autograd through their registered formula); eager training takes the autograd Function: the
    # same kernels, so the same numbers, forward and every gradient. A one-call route (sdpa) hands the epilogue its
    # call's output whole (subtract_pair), a route of one call per map (sdpa_maps) the two maps' outputs. ``normed``:
    # with the head's norm in the kernel (its arguments through the custom op's schema too)
    inputs = _diff_inputs(True, torch.float32, lam_form="per_token")
    leaves = [inputs[k] for k in ("q1", "k1", "q2", "v", "lam")]
    took = []
    monkeypatch.setattr(epilogue, op, _recording(getattr(epilogue, op), took, "custom op"))
    fn_class = getattr(epilogue, function)
    monkeypatch.setattr(fn_class, "apply", _recording(fn_class.apply, took, "Function"))
    backend = route + "+epilogue"
    norm = ops.HeadNorm(1e-5, 0.7) if normed else None
    with ops.fused_head_norm(True):
        fn = torch.compile(lambda kw: ops.diff_attention(**kw, backend=backend, head_norm=norm), fullgraph=True,
                           backend="eager")  # fmt: skip
        compiled = fn(inputs)
        eager = ops.diff_attention(**inputs, backend=backend, head_norm=norm)
    assert took == ["custom op", "Function"]
    assert torch.equal(compiled, eager)
    g = torch.randn(eager.shape, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    for a, b in zip(torch.autograd.grad(compiled, leaves, g), torch.autograd.grad(eager, leaves, g), strict=True):
        assert torch.equal(a, b)


def _recording(fn, took: list, name: str):
    def call(*args, **kwargs):
        took.append(name)
        return fn(*args, **kwargs)

    return call


def _gpu_operands(n: int, lam_form: str, bthd: bool = False):
    """A generator, one call's bf16 output [1, 32, n, 128] (laid out [1, n, 32, 128] with ``bthd``, as CUDA's
    kernels write it) and λ for its 16 heads, scalar or per token, all requiring grad."""
    g = torch.Generator(device="cuda").manual_seed(n)
    shape = (1, n, 32, 128) if bthd else (1, 32, n, 128)
    o = torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g)
    o = (o.transpose(1, 2) if bthd else o).requires_grad_()
    lam = torch.tensor(0.37, device="cuda") if lam_form == "scalar" else torch.rand(1, 16, n, 1, device="cuda")
    return g, o, lam.requires_grad_()


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
@pytest.mark.parametrize("n", [1024, 16384])
@pytest.mark.parametrize("lam_form", ["scalar", "per_token"])
def test_gpu_kernel_at_real_lengths_against_float64(n, lam_form):
    # compiled, bf16, the routes' shapes at 1K and 16K tokens: the output and dO2 within one bf16 rounding of the
    # float64 value, dλ within reordered float32 summation of its float64 value
    g, o, lam = _gpu_operands(n, lam_form)
    o1, o2 = o[:, :16], o[:, 16:]
    out = epilogue.subtract_maps(o1, o2, lam)
    product = lam.double() * o2.double()
    _within_one_rounding("out", out, o1.double() - product, torch.bfloat16, product)
    grad = torch.randn(out.shape, device="cuda", dtype=torch.bfloat16, generator=g)
    d_o1, d_o2, d_lam = torch.autograd.grad(out, (o1, o2, lam), grad)
    assert torch.equal(d_o1, grad)
    _within_one_rounding("dO2", d_o2, -lam.detach().double() * grad.double(), torch.bfloat16)
    terms = grad.double() * o2.detach().double()
    want_lam = -terms.sum_to_size(lam.shape)
    bound = (terms.numel() // lam.numel()) * torch.finfo(torch.float32).eps * terms.abs().sum_to_size(lam.shape)
    assert ((d_lam.double() - want_lam).abs() <= bound).all()


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
@pytest.mark.parametrize("n", [1024, 16384])
@pytest.mark.parametrize("lam_form", ["scalar", "per_token"])
def test_gpu_head_norm_in_the_kernel_at_real_lengths_against_float64(n, lam_form):
    # compiled, bf16, one call's [B, T, 2H, dv]-laid-out output at 1K and 16K tokens through subtract_pair with the
    # head norm: the output and the gradients of the output and λ, by the rule of tests/ops/rounding.py against float64
    # with PyTorch's float32 norm in two summation orders as the yardstick
    g, o, lam = _gpu_operands(n, lam_form, bthd=True)
    eps, scale = 1e-5, 0.7
    out = epilogue.subtract_pair(o, lam, "stacked", norm=(eps, scale))
    grad = torch.randn(out.shape, device="cuda", dtype=torch.bfloat16, generator=g)
    got = (out, *torch.autograd.grad(out, (o, lam), grad))

    def computed(kind, flip=False, per_element=False):
        oo, ll = o.detach().to(kind).requires_grad_(), lam.detach().to(kind)
        if per_element:  # λ given to each element: its gradient is the terms a scalar λ's gradient sums
            ll = ll.expand_as(oo.chunk(2, dim=1)[1]).clone()
        ll.requires_grad_()
        y = _normed(*oo.chunk(2, dim=1), ll, eps, scale, flip)
        return (y, *torch.autograd.grad(y, (oo, ll), grad.to(kind)))

    gold, plain = computed(torch.float64), [computed(torch.float32), computed(torch.float32, flip=True)]
    terms = computed(torch.float64, per_element=True)[2] if lam.dim() == 0 else None
    for i, name in enumerate(("out", "do", "dlam")):
        assert_within_rounding(name, got[i], gold[i], [p[i].to(got[i].dtype) for p in plain], got[i].dtype,
                               terms=terms if name == "dlam" else None)  # fmt: skip


def test_an_epilogue_kernel_that_does_not_launch_is_one_clear_error(monkeypatch):
    import triton

    def out_of_resources(*args, **kwargs):
        raise triton.runtime.errors.OutOfResources(300000, 232448, "shared memory")

    monkeypatch.setattr(epilogue, "_launch_subtract", out_of_resources)
    with pytest.raises(RuntimeError, match=r"backend 'sdpa\+epilogue': the fused epilogue .* did not compile"):
        ops.diff_attention(**_diff_inputs(False, torch.float32), backend="sdpa+epilogue")


def test_a_diff_models_head_norm_in_the_kernel_is_its_norm_within_rounding(monkeypatch):
    # the DIFF layer hands its gainless norm and 1 − λ_init to the op (DiffLlamaDifferentialAttention.head_norm): in
    # an epilogue route's kernel where switched on, by PyTorch otherwise; the loss and every gradient of a 2-layer
    # model against the float64 model (reference route), by the rounding rule with the plain route as yardstick
    from diffattn.models.build import build_model

    launched = []
    real_launch = epilogue._launch_subtract
    monkeypatch.setattr(
        epilogue, "_launch_subtract", lambda *a, **k: launched.append(k["NORM"]) or real_launch(*a, **k)
    )
    ids = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(0)).to(DEVICE)

    def run(backend, dtype=torch.float32, fused=False):
        model = build_model("debug", "diff", backend=backend, num_layers=2, seed=0).to(DEVICE, dtype)
        with ops.fused_head_norm(fused):
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
        return [loss.detach()] + [p.grad for _, p in sorted(model.named_parameters()) if p.grad is not None]

    fused, plain, gold = run("sdpa+epilogue", fused=True), run("sdpa"), run("reference", torch.float64)
    assert launched == [True] * 4, "two layers' forward and backward kernels normed"
    assert len(fused) == len(plain) == len(gold) > 10
    for i, (a, b, c) in enumerate(zip(fused, plain, gold, strict=True)):
        assert_within_rounding(f"value {i}", a, c, [b], torch.float32)


def test_the_norm_by_pytorch_runs_under_the_callers_autocast_as_the_layers_module_did(monkeypatch):
    # a route without the fused norm: the op's PyTorch norm runs under the caller's autocast (the op itself runs with
    # autocast off inside), so a DIFF layer under mixed precision computes its heads' norm as its own norm module did
    # (on CUDA autocast decides the norm's precision; on this CPU the output is the same bits either way)
    inputs = _diff_inputs(False, torch.float32, model_layout=True)
    norm = ops.HeadNorm(1e-5, 0.7)
    seen = []
    real = torch.nn.functional.rms_norm

    def recording(*args, **kwargs):
        seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "rms_norm", recording)
    module = torch.nn.RMSNorm(inputs["v"].shape[-1], eps=1e-5, elementwise_affine=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        by_op = ops.diff_attention(**inputs, backend="sdpa", head_norm=norm)
        by_layer = (module(ops.diff_attention(**inputs, backend="sdpa").transpose(1, 2)) * 0.7).transpose(1, 2)
    assert seen == [(True, torch.bfloat16)] * 2, "the op's norm and the module's, both under the caller's autocast"
    assert by_op.dtype == by_layer.dtype and torch.equal(by_op, by_layer)
    seen.clear()
    ops.diff_attention(**inputs, backend="sdpa", head_norm=norm)
    assert seen == [(False, torch.bfloat16)], "without autocast, none"
