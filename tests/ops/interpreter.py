"""How the Triton tests run the kernels without a GPU: in Triton's CPU interpreter, which ``triton.jit`` chooses when a
kernel is *decorated* — when its module is first imported — so ``TRITON_INTERPRET=1`` must be set then, and while the
kernels run. It is restored after the import, so that the other test modules still see a CPU on which the ``triton``
backend is not usable. With CUDA the kernels are compiled and nothing is set."""

from __future__ import annotations

import contextlib
import importlib
import os

import pytest
import torch

CUDA = torch.cuda.is_available()


@contextlib.contextmanager
def interpreted_import():
    """``TRITON_INTERPRET=1`` around the first import of kernels on a machine without CUDA (restored after)."""
    saved = os.environ.get("TRITON_INTERPRET")
    if not CUDA:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved


def import_kernels(name: str = "diffattn.ops.triton.launch"):
    """The kernel module ``name``, imported (and so its kernels decorated) interpreted where there is no CUDA; skips
    the test where triton is not installed."""
    pytest.importorskip("triton", reason="triton is not installed (it is in the `test` extra: pip install -e .[test])")
    with interpreted_import():
        return importlib.import_module(name)


def keep_interpreting(monkeypatch) -> None:
    """In a test without CUDA: the interpreter for the kernels while they run — or a skip, where they were compiled
    (imported before any test module set ``TRITON_INTERPRET``)."""
    if CUDA:
        return
    if not importlib.import_module("diffattn.ops.triton.tuning").INTERPRETED:
        pytest.skip("the Triton kernels were compiled (not interpreted) before this module set TRITON_INTERPRET=1")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the interpreter reads it while running, too
