"""CUDA checks at realistic shapes, for whoever has a GPU (`pytest -m gpu`); skipped elsewhere."""

from __future__ import annotations

import pytest
import torch

from diffattn.ops import diff_attention

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("backend", ["sdpa", "chunked", "auto"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("t", "s"), [(2048, 2048), (1, 4096), (100, 4096)])
def test_cuda_backends_match_reference(backend, dtype, t, s):
    g = torch.Generator(device="cuda").manual_seed(0)
    q1, q2 = (torch.randn(1, 8, t, 64, device="cuda", generator=g, dtype=dtype) for _ in range(2))
    k1, k2 = (torch.randn(1, 4, s, 64, device="cuda", generator=g, dtype=dtype) for _ in range(2))
    v = torch.randn(1, 4, s, 128, device="cuda", generator=g, dtype=dtype)
    lam = torch.full((8,), 0.6, device="cuda")
    leaves = [x.requires_grad_(True) for x in (q1, k1, q2, k2, v)]
    out = diff_attention(*leaves, lam, backend=backend)
    out.float().square().sum().backward()
    grads = [x.grad for x in leaves]
    for x in leaves:
        x.grad = None
    ref_in = [x.detach().double().requires_grad_(True) for x in leaves]
    ref = diff_attention(*ref_in, lam.double(), backend="reference")
    ref.square().sum().backward()
    # error of plain PyTorch in this dtype: the reference rounded to `dtype`
    tol = 2 * (ref.to(dtype).double() - ref).abs().max().item() + 1e-5
    assert (out.double() - ref).abs().max().item() <= tol
    for got, want in zip(grads, (x.grad for x in ref_in), strict=True):
        scale = want.abs().max().item()
        assert (got.double() - want).abs().max().item() <= 2e-2 * scale + 1e-4
