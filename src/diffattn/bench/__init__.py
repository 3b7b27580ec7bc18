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


def paired_ratio(new, old, *, seed: int = 0, n_boot: int = 2000, level: float = 0.95) -> tuple[float, float, float]:
    """The median of the per-repetition ratios ``new[i] / old[i]`` of two columns timed in the same interleaved
    repetitions (:func:`rotated`), with a percentile-bootstrap interval over the repetitions: ``(median, low, high)``.
    Paired, so that what moves both columns of a repetition alike (the host's load, the GPU's clock) cancels; the
    median, so that one disturbed repetition does not decide. Fewer than two pairs: an unbounded interval."""
    import numpy as np

    ratios = np.asarray(new, dtype=float) / np.asarray(old, dtype=float)
    if ratios.ndim != 1 or len(new) != len(old) or ratios.size == 0:
        raise ValueError(f"paired_ratio needs two equally long, non-empty series; got {len(new)} and {len(old)}")
    median = float(np.median(ratios))
    if ratios.size < 2:
        return median, -np.inf, np.inf
    rng = np.random.default_rng(seed)
    boot = np.median(ratios[rng.integers(0, ratios.size, (n_boot, ratios.size))], axis=1)
    low, high = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
    return median, float(low), float(high)
