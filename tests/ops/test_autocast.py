"""diff_attention under torch.autocast (mixed-precision training, the trainer's default on a GPU): a model's RoPE
leaves Q and K in float32 while its projections give V in the autocast dtype. The op is one of autocast's
lower-precision ops, like scaled_dot_product_attention: its inputs are cast to the autocast dtype and it runs as
it would on those outside autocast (before, the mixed dtypes were refused: "v part 0 dtype must equal q1's")."""

from __future__ import annotations

import pytest
import torch

import diffattn.ops
from diffattn.models import build_model
from diffattn.ops import diff_attention


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    q1, q2 = (torch.randn(2, 4, 9, 8, generator=g) for _ in range(2))
    k1, k2 = (torch.randn(2, 2, 9, 8, generator=g) for _ in range(2))
    v = torch.randn(2, 2, 9, 16, generator=g).bfloat16()  # from a projection under autocast
    return q1, k1, q2, k2, v, torch.rand(4, generator=g)


@pytest.mark.parametrize("backend", ["reference", "sdpa", "chunked"])
def test_autocast_casts_the_inputs_and_runs_as_outside(backend):
    q1, k1, q2, k2, v, lam = _inputs()
    leaves = [x.clone().requires_grad_(True) for x in (q1, k1, q2, k2, v)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = diff_attention(*leaves, lam, backend=backend)
    out.float().sum().backward()
    cast = [x.detach().bfloat16().requires_grad_(True) for x in (q1, k1, q2, k2, v)]
    want = diff_attention(*cast, lam, backend=backend)
    want.float().sum().backward()
    assert out.dtype == torch.bfloat16 and torch.equal(out, want)
    for leaf, ref in zip(leaves, cast, strict=True):  # gradients reach the float32 leaves in their own dtype
        assert leaf.grad.dtype == leaf.dtype and torch.equal(leaf.grad, ref.grad.to(leaf.dtype))


def test_autocast_keeps_a_shared_key_one_tensor(monkeypatch):
    # DIFF V2, DAA and DiffQ pass one K to both maps (read once, one dK): the cast keeps it one tensor
    seen = []
    validate = diffattn.ops.validate

    def recording(*args, **kwargs):
        inp = validate(*args, **kwargs)
        seen.append((inp.shares_keys, inp.q1.dtype, inp.v.dtype))
        return inp

    monkeypatch.setattr(diffattn.ops, "validate", recording)
    q1, k1, q2, _, v, lam = _inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        diff_attention(q1, k1, q2, k1, v, lam, backend="sdpa")
    diff_attention(q1, k1, q2, k1, v.float(), lam, backend="sdpa")  # no autocast: nothing is cast
    assert seen == [(True, torch.bfloat16, torch.bfloat16), (True, torch.float32, torch.float32)]


@pytest.mark.parametrize("attention", ["diff", "diff-v2"])
def test_a_training_step_under_autocast(attention):
    # what the trainer runs on a GPU (bf16 mixed precision), here with CPU autocast: forward and backward of a
    # DIFF model go through, every parameter gets a finite float32 gradient
    model = build_model("debug", attention, backend="auto", seed=0, num_layers=1).train()
    ids = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and all(g is not None and g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads)
