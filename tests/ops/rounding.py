"""The one numeric tolerance rule of the tests that compare a float computation with its float64 reference: a
result's error may be at most twice the error plain PyTorch makes computing the same in that dtype on the running
machine (the yardsticks) plus one ulp of the largest value (the final rounding of a result). A sum to one number (a
scalar λ's gradient) is held to at least the error one rounding of each of its terms can put into it: its yardstick's
error is one draw, which spans orders of magnitude from one input to the next."""

from __future__ import annotations

import torch


def assert_within_rounding(name, got, gold, yardsticks, dtype, terms=None):
    """The rule: ``got``'s error against the float64 ``gold`` is at most twice the
    largest error of the ``yardsticks`` (plain PyTorch computing the same in ``dtype`` on this machine, in several
    summation orders: one order's error may be luckily small) plus one ulp of ``dtype`` at the largest value of
    ``gold`` (the final rounding of a result). ``terms`` (float64), where ``gold`` is their sum — a scalar λ's
    gradient, whose terms are the gradient of λ taken per token or per element: the yardsticks' error is taken to be
    at least u·Σ|terms| (u the unit roundoff of ``dtype``), the most that rounding each term once puts into the sum.
    Why: one number's yardstick error is one draw — on an Intel Xeon, DIFF V1's dλ through the epilogue's head norm
    erred 9.2e-6 where plain PyTorch's draw was 5.9e-7 (u·Σ|terms| 6.2e-6); on the H200 of 2026-11-29 9.5e-4 against
    2.1e-4 at 16K tokens — while a dλ wrong by a term of its own size errs by orders of magnitude more."""
    got, gold = got.double(), gold.double()
    assert torch.isfinite(got).all(), name
    err = (got - gold).abs().max().item()
    err_plain = max((y.double() - gold).abs().max().item() for y in yardsticks)
    if terms is not None:
        err_plain = max(err_plain, torch.finfo(dtype).eps / 2 * terms.double().abs().sum().item())
    ulp = torch.finfo(dtype).eps * gold.abs().max().item()
    assert err <= 2 * err_plain + ulp, f"{name}: error {err:.3g} > 2 × plain PyTorch {err_plain:.3g} + 1 ulp {ulp:.2g}"
