"""The one numeric tolerance rule of the tests that compare a float computation with its float64 reference: a
result's error may be at most twice the error plain PyTorch makes computing the same in that dtype on the running
machine (the yardsticks) plus one ulp of the largest value (the final rounding of a result)."""

from __future__ import annotations

import torch


def assert_within_rounding(name, got, gold, yardsticks, dtype):
    """The rule: ``got``'s error against the float64 ``gold`` is at most twice the
    largest error of the ``yardsticks`` (plain PyTorch computing the same in ``dtype`` on this machine, in several
    summation orders: one order's error may be luckily small) plus one ulp of ``dtype`` at the largest value of
    ``gold`` (the final rounding of a result)."""
    got, gold = got.double(), gold.double()
    assert torch.isfinite(got).all(), name
    err = (got - gold).abs().max().item()
    err_plain = max((y.double() - gold).abs().max().item() for y in yardsticks)
    ulp = torch.finfo(dtype).eps * gold.abs().max().item()
    assert err <= 2 * err_plain + ulp, f"{name}: error {err:.3g} > 2 × plain PyTorch {err_plain:.3g} + 1 ulp {ulp:.2g}"
