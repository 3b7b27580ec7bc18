"""diffattn.ops.diff_attention_pairs: DIFF V2's layout handed over whole (query heads in interleaved pairs on one K
and V, docs/methods.md §5) — the same function as diff_attention on the pairs' views (interleaved_pair), its
gradients into Q itself, and the one-call route reading Q as it is instead of stacking the views into it again."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from diffattn import ops
from diffattn.ops import diff_attention, diff_attention_pairs, interleaved_pair

from .rounding import assert_within_rounding


def _pairs(dtype=torch.float32, grad=True):
    """Q [B, T, 2H, d] (a projection, transposed by the callers), K and V [B, Hkv, S, d] (GQA 2), λ [B, H, T]."""
    g = torch.Generator().manual_seed(0)

    def r(*s):
        return torch.randn(*s, generator=g).to(dtype).requires_grad_(grad)

    q = r(2, 9, 8, 16)
    k, v = r(2, 2, 9, 16), r(2, 2, 9, 16)
    lam = torch.rand(2, 4, 9, generator=g).to(dtype).requires_grad_(grad)
    return [q, k, v, lam]


def _call(fn, leaves, backend):
    q, k, v, lam = leaves
    q = q.transpose(1, 2)
    if fn is diff_attention_pairs:
        return fn(q, k, v, lam, backend=backend)
    q1, q2 = interleaved_pair(q, 1)
    return fn(q1, k, q2, k, v, lam, backend=backend)


def test_interleaved_pair_is_the_strided_halves():
    x = torch.arange(2 * 6 * 3).reshape(2, 6, 3)
    first, second = interleaved_pair(x, 1)
    assert torch.equal(first, x[:, 0::2]) and torch.equal(second, x[:, 1::2])
    assert (first.stride(), second.storage_offset()) == (x[:, 0::2].stride(), x[:, 1::2].storage_offset())
    with pytest.raises(ValueError, match="counted from the front"):
        interleaved_pair(x, -2)


@pytest.mark.parametrize("backend", ["reference", "sdpa", "sdpa_maps", "chunked"])
def test_pairs_compute_what_the_maps_views_do_with_gradients_into_q(backend):
    # the same function: bit for bit where the route reads the views either way; the one-call route (sdpa) reads Q
    # itself where diff_attention gives it a stacked copy of the same values
    leaves = _pairs()
    out = _call(diff_attention_pairs, leaves, backend)
    cot = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, cot)
    same_leaves = [x.detach().requires_grad_() for x in leaves]
    same = _call(diff_attention, same_leaves, backend)
    same_grads = torch.autograd.grad(same, same_leaves, cot)
    for name, got, want in zip(["out", "dq", "dk", "dv", "dlam"], [out, *grads], [same, *same_grads], strict=True):
        assert torch.equal(got, want), f"{backend} {name}: {(got - want).abs().max():.3g}"


def test_pairs_on_the_one_call_route_against_float64():
    leaves = _pairs()
    out = _call(diff_attention_pairs, leaves, "sdpa")
    cot = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, cot)
    gold_leaves = [x.detach().double().requires_grad_() for x in leaves]
    gold = _call(diff_attention, gold_leaves, "reference")
    gold_grads = torch.autograd.grad(gold, gold_leaves, cot.double())
    plain_leaves = [x.detach().requires_grad_() for x in leaves]
    plain = _call(diff_attention, plain_leaves, "reference")  # the yardstick: plain PyTorch in float32
    plain_grads = torch.autograd.grad(plain, plain_leaves, cot)
    for name, got, want, yard in zip(["out", "dq", "dk", "dv", "dlam"], [out, *grads], [gold, *gold_grads],
                                     [plain, *plain_grads], strict=True):  # fmt: skip
        assert_within_rounding(f"sdpa {name}", got, want, [yard], torch.float32)


def test_the_one_call_route_reads_q_as_it_is(monkeypatch):
    # where diff_attention stacks the two maps' views into a new [B, 2H, T, d] tensor (a copy, and a stack of the
    # gradients back), the pairs' call hands SDPA the caller's Q itself
    queries = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        queries.append(q)
        return real(q, k, v, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    leaves = _pairs()
    q = leaves[0].transpose(1, 2)
    diff_attention_pairs(q, *leaves[1:], backend="sdpa")
    assert len(queries) == 1 and queries[0] is q
    _call(diff_attention, leaves, "sdpa")
    assert queries[1] is not q and torch.equal(queries[1], q)


def test_pairs_refuse_an_odd_number_of_query_heads():
    q, k, v, lam = _pairs(grad=False)
    with pytest.raises(ValueError, match=r"q must be \[B, 2H, T, d\]"):
        diff_attention_pairs(q.transpose(1, 2)[:, :7], k, v, lam)


def test_pairs_under_autocast_take_the_autocast_dtype():
    leaves = _pairs(grad=False)
    q, k, v, lam = leaves
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = diff_attention_pairs(q.transpose(1, 2), k, v, lam, backend="reference")
    assert out.dtype == torch.bfloat16
    assert "diff_attention_pairs" in ops.__all__ and "interleaved_pair" in ops.__all__
