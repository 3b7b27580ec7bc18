"""DIFF V1's [V; V] by one Triton kernel each way (diffattn/ops/triton/vcopies.py; docs/methods.md §0): the one-call
routes' values twice over, built from DiffLlama's two column halves, and the gradient of those halves.

Without CUDA the kernels run in Triton's CPU interpreter (tests/ops/interpreter.py). The forward is a copy: the same
values, bit for bit, in the layout PyTorch's copy gives (:func:`diffattn.ops._inputs.v_from_halves`). The backward
sums each half's two copies in float32 and rounds once, as PyTorch's sum does: float32 bit for bit, lower precisions
within one rounding of the float32 sum (the interpreter rounds toward zero where a GPU rounds to nearest). Out of
bounds: the input is cut from the middle of a NaN-poisoned buffer (a read outside it brings NaN into the result), and
the outputs are written into the middle of a buffer of a sentinel value that must be left as it was around them.
"""

from __future__ import annotations

import pytest
import torch

from diffattn import ops
from diffattn.ops import routes
from diffattn.ops._inputs import v_from_halves

from .interpreter import CUDA as _CUDA
from .interpreter import import_kernels, keep_interpreting

DEVICE = "cuda" if _CUDA else "cpu"
vcopies = import_kernels("diffattn.ops.triton.vcopies")
SENTINEL = 12345.0


@pytest.fixture(autouse=True)
def _interpreted(monkeypatch):
    keep_interpreting(monkeypatch)


def _poisoned_view(shape, strides_from, dtype, fill, gen=None):
    """A tensor of ``shape`` laid out as ``strides_from`` (a function of a dense buffer giving the view), cut from the
    middle of a larger buffer of ``fill`` — random values inside it where ``gen`` is given."""
    numel = torch.Size(shape).numel()
    pad = 97
    buffer = torch.full((pad + numel + pad,), fill, dtype=dtype, device=DEVICE)
    inside = buffer[pad : pad + numel]
    if gen is not None:
        inside.copy_(torch.randn(numel, generator=gen).to(dtype))
    return buffer, strides_from(inside)


def _halves(layout: str, dtype, b=2, hkv=3, s=7, w=24, seed=0):
    """DiffLlama's V [B, 2Hkv, S, w] as a model hands it over: a projection's view ([B, S, 2Hkv·w] in memory) or a
    cache's ([B, 2Hkv, S, w] contiguous), inside a NaN-poisoned buffer."""
    g = torch.Generator().manual_seed(seed)
    if layout == "projection":
        return _poisoned_view((b, s, 2 * hkv * w), lambda x: x.view(b, s, 2 * hkv, w).transpose(1, 2), dtype,
                              float("nan"), g)[1]  # fmt: skip
    return _poisoned_view((b, 2 * hkv, s, w), lambda x: x.view(b, 2 * hkv, s, w), dtype, float("nan"), g)[1]


def _untouched(buffer: torch.Tensor, inside: torch.Tensor) -> bool:
    start = inside.storage_offset()
    end = start + inside.numel()
    return bool((buffer[:start] == SENTINEL).all() and (buffer[end:] == SENTINEL).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["projection", "cache"])
@pytest.mark.parametrize("form", ["whole", "slices"])
def test_v_twice_is_pytorchs_copy_in_its_layout_and_writes_nothing_else(form, layout, dtype, monkeypatch):
    # whole: [V; V] as the one-call routes take it; slices: its two column halves as tensors of their own (sdpa_split)
    v = _halves(layout, dtype)
    want = v_from_halves(v, copies=2)
    buffers = []

    def into_sentinel(v, width):  # each output placed inside a buffer of the sentinel, in _like's layout
        like = empty_like(v, width)
        order = sorted(range(4), key=lambda i: -like.stride(i))  # the layout's dimensions, outermost first
        dense_shape = [like.shape[i] for i in order]
        buffer, dense = _poisoned_view(dense_shape, lambda x: x.view(dense_shape), v.dtype, SENTINEL)
        buffers.append((buffer, dense))
        return dense.permute(*[order.index(i) for i in range(4)])

    empty_like = vcopies._like
    monkeypatch.setattr(vcopies, "_like", into_sentinel)
    if form == "whole":
        got = vcopies.v_twice_from_halves(v)
        assert got.stride() == want.stride() and torch.equal(got, want)
    else:
        parts = vcopies.v_twice_slices(v)
        for got, wanted in zip(parts, want.split(v.shape[-1], dim=-1), strict=True):
            assert torch.equal(got, wanted) and got.stride() == empty_like(v, v.shape[-1]).stride()
    assert buffers and all(_untouched(*b) for b in buffers), "a write outside the outputs"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["projection", "cache"])
def test_the_gradient_sums_each_halfs_two_copies_once_rounded_in_vs_layout(layout, dtype):
    v = _halves(layout, dtype).detach().requires_grad_()
    g = _halves("cache", dtype, s=7, w=48, seed=1).reshape(2, 6, 7, 48)  # [B, 2Hkv, S, 2w], poisoned around
    (want,) = torch.autograd.grad(v_from_halves(v, copies=2), v, g.float())  # float32: the exact sums
    buffer, dv = _poisoned_view(v.shape, lambda x: x.view(v.shape), dtype, SENTINEL)
    got = vcopies._v_twice_bwd_impl(g[..., :24], g[..., 24:], dv)  # the copies of v_j's half, then of v_(j + Hkv)'s
    assert _untouched(buffer, dv), "a write outside V's gradient"
    err = (got.double() - want.double()).abs()
    if dtype == torch.float32:
        assert err.max() == 0
    else:
        bound = torch.finfo(dtype).eps * want.double().abs() + torch.finfo(dtype).tiny
        assert (err <= bound).all(), f"{err.max().item():.3g} beyond one rounding of {dtype}"
    # through autograd: V's gradient in V's own layout (dense in its dimension order), so the projection's needs no copy
    (through,) = torch.autograd.grad(vcopies.v_twice_from_halves(v), v, g)
    assert torch.equal(through, got) and through.stride() == torch.empty_like(v).stride()
    # the slices' two gradients as they come (no join): the same sums; a slice without a gradient counts as zeros
    (sliced,) = torch.autograd.grad(vcopies.v_twice_slices(v), v, (g[..., :24], g[..., 24:]))
    assert torch.equal(sliced, got) and sliced.stride() == through.stride()
    (one,) = torch.autograd.grad(vcopies.v_twice_slices(v)[0], v, g[..., :24].contiguous())
    (want_one,) = torch.autograd.grad(v_from_halves(v, copies=2)[..., :24], v, g[..., :24].float())
    assert torch.equal(one[:, 3:], torch.zeros_like(one[:, 3:])) and (one.double() - want_one.double()).abs().max() <= (
        torch.finfo(dtype).eps * want_one.double().abs().max()
    )
    with pytest.raises(RuntimeError):  # differentiable once: a second derivative is an error, not a silent zero
        (first,) = torch.autograd.grad(vcopies.v_twice_from_halves(v), v, g.clone().requires_grad_(), create_graph=True)
        torch.autograd.grad(first.sum(), v)


def _stacked_call(v_grad: bool = True):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 9, 16, generator=g).to(DEVICE).requires_grad_()  # both maps' 2 query heads each
    k = torch.randn(2, 4, 9, 16, generator=g).to(DEVICE).requires_grad_()
    v = torch.randn(2, 9, 4 * 16, generator=g).to(DEVICE).requires_grad_(v_grad)  # a projection: halves as heads
    return q, k, v


def _run(q, k, v, backend="sdpa"):
    heads = v.view(2, 9, 4, 16).transpose(1, 2)
    out = ops.diff_attention_stacked(q, k, heads, 0.3, causal=True, backend=backend)
    return out, torch.autograd.grad(out, (q, k, v), torch.ones_like(out))


@pytest.mark.parametrize("backend", ["sdpa", "sdpa_split"])
def test_a_one_call_route_takes_the_kernels_where_switched_on_above_the_small_size(backend, monkeypatch):
    launches = []
    launch = vcopies._launch
    monkeypatch.setattr(vcopies, "_launch", lambda *a: launches.append(a[0]) or launch(*a))
    q, k, v = _stacked_call()
    plain, plain_grads = _run(q, k, v, backend)
    with ops.fused_v_copies(True):
        small, _ = _run(q, k, v, backend)
        assert launches == [], "a small call keeps PyTorch's copy (its time is the host's)"
        monkeypatch.setattr(routes, "SMALL_WORK", 0)  # the same call above the small size
        out, grads = _run(q, k, v, backend)
    assert launches == [vcopies._v_twice_fwd_kernel, vcopies._v_twice_bwd_kernel]
    assert torch.equal(out, plain) and torch.equal(small, plain)
    for got, want in zip(grads, plain_grads, strict=True):  # float32: the same sums, bit for bit
        assert torch.equal(got, want)
    launches.clear()
    _run(q, k, v, backend)  # the switch ends with its block: off, as the table has it off CUDA
    with ops.fused_v_copies(True):  # float64 keeps PyTorch's copy: the kernel sums in float32
        _run(*(x.detach().double().requires_grad_() for x in (q, k, v)), backend)
    assert launches == []


def test_without_a_gradient_the_forward_kernel_alone(monkeypatch):
    launches = []
    launch = vcopies._launch
    monkeypatch.setattr(vcopies, "_launch", lambda *a: launches.append(a[0]) or launch(*a))
    monkeypatch.setattr(routes, "SMALL_WORK", 0)
    q, k, v = (x.detach() for x in _stacked_call(v_grad=False))
    heads = v.view(2, 9, 4, 16).transpose(1, 2)
    with ops.fused_v_copies(True), torch.no_grad():
        got = ops.diff_attention_stacked(q, k, heads, 0.3, causal=True, backend="sdpa")
    assert launches == [vcopies._v_twice_fwd_kernel]
    assert torch.equal(got, ops.diff_attention_stacked(q, k, heads, 0.3, causal=True, backend="sdpa"))


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1024, 16384])
def test_on_the_gpu_the_kernels_are_pytorchs_copy_and_sum(tokens, dtype):
    b, hkv, w = 4, 16, 64
    s = tokens // b
    v = torch.randn(b, s, 2 * hkv * w, device="cuda").to(dtype).view(b, s, 2 * hkv, w).transpose(1, 2)
    v.requires_grad_()
    g = torch.randn(b, s, 2 * hkv, 2 * w, device="cuda").to(dtype).transpose(1, 2)  # as cuDNN's backward writes it
    want = v_from_halves(v, copies=2)
    (want_grad,) = torch.autograd.grad(want, v, g.float())
    got = vcopies.v_twice_from_halves(v)
    (got_grad,) = torch.autograd.grad(got, v, g)
    assert torch.equal(got, want) and got.stride() == want.stride()
    bound = torch.finfo(dtype).eps / 2 * want_grad.double().abs() + torch.finfo(dtype).tiny  # round to nearest
    assert ((got_grad.double() - want_grad.double()).abs() <= bound).all()
