"""A zero-cost hook through which attention modules report the tensors of each call to analysis code.

The modules this library owns (the DIFF attention of from-scratch models, every adapter's ``AdaptedAttention``)
call :func:`report` with their post-RoPE queries/keys, values, λ, mask and scale just before attention runs.
While no observer is registered (the normal case) :func:`observing` is one list check and nothing is computed;
:class:`diffattn.eval.capture.AttentionCapture` registers one to record logits and maps on the side, so the
model's own computation — and its outputs — stay exactly as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from torch import nn

Observer = Callable[[nn.Module, dict], None]
_OBSERVERS: list[Observer] = []


def observing() -> bool:
    """True while some observer is registered (modules skip building the report otherwise)."""
    return bool(_OBSERVERS)


def report(module: nn.Module, **fields) -> None:
    """Hand ``fields`` (see :class:`diffattn.eval.capture.AttentionCapture`) to every registered observer."""
    for observer in list(_OBSERVERS):
        observer(module, fields)


@contextmanager
def observe(observer: Observer) -> Iterator[None]:
    """Register ``observer(module, fields)`` for the duration of the block."""
    _OBSERVERS.append(observer)
    try:
        yield
    finally:
        _OBSERVERS.remove(observer)
