"""Benchmarks shipped with the package, so `diffattn bench ...` and `benchmarks/*.py` run the same code."""

import contextlib
import gc


@contextlib.contextmanager
def gc_paused():
    """Python's cyclic garbage collector off while a benchmark times (as ``timeit`` does). Why: a collection inside
    a sample costs it milliseconds with a model's autograd graphs alive, and in a fixed round-robin it can fall on the
    same column round after round — a suspect for the 9 ms the second H200 lease measured between ``auto`` and its
    own route forced (benchmarks/gpu-runs/h200-2026-11-27b). No collection first: what is due runs after, outside
    the timing, and a full one costs ~0.1 s with torch loaded (the route sweep times two or three times a job)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def rotated(names: list, rep: int) -> list:
    """``names`` starting at position ``rep`` (mod its length): the order of interleaved repetition ``rep``, so that no
    column is always timed right after the same one."""
    shift = rep % len(names)
    return names[shift:] + names[:shift]
