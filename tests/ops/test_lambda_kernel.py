"""Tests of DIFF's λ (Eq. 2, docs/methods.md §1) by one Triton kernel each way (diffattn/ops/triton/reparam.py):
λ = exp(λq1·λk1) − exp(λq2·λk2) + λ_init and the four vectors' gradients, against float64 by the rule of
tests/ops/rounding.py (twice plain PyTorch's error in the same dtype, in two summation orders, plus one rounding).
Without CUDA the kernels run in Triton's CPU interpreter, as in test_epilogue.py."""

from __future__ import annotations

import pytest
import torch

from diffattn import ops
from diffattn.lambdas import reparameterized_lambda
from diffattn.ops import routes

from .interpreter import CUDA as _CUDA
from .interpreter import import_kernels, keep_interpreting
from .rounding import assert_within_rounding

DEVICE = "cuda" if _CUDA else "cpu"
reparam = import_kernels("diffattn.ops.triton.reparam")


@pytest.fixture(autouse=True)
def _interpreted(monkeypatch):
    keep_interpreting(monkeypatch)


def _vectors(d, dtype, seed=0, scale=0.3):
    g = torch.Generator().manual_seed(seed)
    return [(scale * torch.randn(d, generator=g)).to(DEVICE, dtype).requires_grad_() for _ in range(4)]


def _lambda_and_grads(fn, vectors, init):
    lam = fn(*vectors, init)
    return (lam, *torch.autograd.grad(lam, vectors))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d", [40, 64, 128])
def test_the_kernels_lambda_and_gradients_are_pytorchs_within_its_rounding(d, dtype):
    # d = 40 pads to 64 lanes (masked loads); bf16 vectors: a model cast to bf16 whole, the gradients in that dtype
    vectors = _vectors(d, dtype)
    got = _lambda_and_grads(reparam.reparameterized_lambda_kernel, vectors, 0.35)
    assert got[0].dtype == torch.float32 and got[0].dim() == 0
    assert all(g.dtype == dtype and g.shape == (d,) for g in got[1:])

    def computed(kind, order=None):
        cast = [v.detach().to(kind).requires_grad_() for v in vectors]
        ordered = cast if order is None else [c[order] for c in cast]  # the dots summed in another order
        lam = torch.exp((ordered[0] * ordered[1]).sum()) - torch.exp((ordered[2] * ordered[3]).sum()) + 0.35
        return (lam, *torch.autograd.grad(lam, cast))

    # λ is one number: one summation order's error is one draw, which may be luckily small — six orders
    orders = [None, torch.arange(d - 1, -1, -1)]
    orders += [torch.randperm(d, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    gold, plain = computed(torch.float64), [computed(torch.float32, order) for order in orders]
    # and the size of that draw as a floor (the route sweep's rule for a scalar λ's gradient): a float32 dot's rounding
    # error is about u·‖q ⊙ k‖, exp adds u·e, and it reaches every gradient through e — a sum whose order the
    # interpreter's reduction does not share with PyTorch's; a wrong term (a sign, λ_init, a factor) is far beyond
    u = torch.finfo(torch.float32).eps / 2
    v64 = [v.detach().double() for v in vectors]
    exps = [torch.exp(v64[0] @ v64[1]), torch.exp(v64[2] @ v64[3])]
    draws = [u * e * ((a * b).norm() + 1) for e, a, b in ((exps[0], v64[0], v64[1]), (exps[1], v64[2], v64[3]))]
    partner = [v64[1], v64[0], v64[3], v64[2]]  # dλq1 = dλ·e1·λk1, dλk1 = dλ·e1·λq1, dλq2 = −dλ·e2·λk2, …
    floors = [draws[0] + draws[1]] + [draws[i // 2] * partner[i].abs() for i in range(4)]
    for i, name in enumerate(("λ", "dλq1", "dλk1", "dλq2", "dλk2")):
        yardsticks = [p[i].to(got[i].dtype) for p in plain] + [gold[i] + floors[i]]
        assert_within_rounding(name, got[i], gold[i], yardsticks, got[i].dtype)


def test_without_a_gradient_it_is_one_launch_and_the_same_value():
    vectors = _vectors(64, torch.float32)
    with torch.no_grad():
        lam = reparam.reparameterized_lambda_kernel(*vectors, 0.2)
    assert lam.grad_fn is None
    assert torch.equal(lam, reparam.reparameterized_lambda_kernel(*vectors, 0.2).detach())


def test_a_second_derivative_is_one_clear_error_and_mismatched_vectors_are_refused():
    vectors = _vectors(16, torch.float32)
    lam = reparam.reparameterized_lambda_kernel(*vectors, 0.5)
    grads = torch.autograd.grad(lam.square(), vectors, create_graph=True)  # dλ² depends on λ: a graph to go back
    with pytest.raises(RuntimeError, match="differentiate twice"):
        grads[0].sum().backward()
    with pytest.raises(ValueError, match="the four λ vectors must be contiguous and of one shape and dtype"):
        reparam.reparameterized_lambda_kernel(*vectors[:3], torch.zeros(8, device=DEVICE), 0.5)


@pytest.mark.skipif(_CUDA, reason="off CUDA only")
def test_off_the_gpu_pytorch_computes_lambda_whatever_the_switch():
    # nothing is measured off CUDA (the kernel there is the interpreter's): PyTorch's ops, forced or not
    vectors = _vectors(16, torch.float32)
    with ops.fused_lambda(True):
        assert routes.lambda_in_kernel(None) is True
        lam = reparameterized_lambda(*vectors, 0.5)
    assert type(lam.grad_fn).__name__ == "AddBackward0"
    assert routes.lambda_in_kernel(None) is False, "the setting ends with its block"


@pytest.mark.gpu
@pytest.mark.skipif(not _CUDA, reason="needs CUDA")
def test_gpu_a_diff_layers_lambda_by_the_kernel_is_its_lambda():
    # the DIFF layer reads λ through diffattn.lambdas, which takes the kernel on CUDA where switched on
    from diffattn.models.build import build_model

    attn = build_model("debug", "diff", num_layers=1, seed=0).cuda().model.layers[0].self_attn
    plain = attn.lambda_full()
    with ops.fused_lambda(True):
        got = attn.lambda_full()
    assert type(got.grad_fn).__name__ == "_LambdaBackward"
    vectors = [getattr(attn, f"lambda_{n}").detach().double() for n in ("q1", "k1", "q2", "k2")]
    gold = torch.exp((vectors[0] * vectors[1]).sum()) - torch.exp((vectors[2] * vectors[3]).sum()) + attn.lambda_init
    assert_within_rounding("λ", got, gold, [plain], torch.float32)
