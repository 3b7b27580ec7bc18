"""Adapter overhead, side by side: forward and training-step time of an adapted model as a ratio to its base.

Implemented methods so far: Dex, unmerged (the wrapper recomputes attention through the model-type table and
applies O − λ·f_D(O) on the selected heads) and merged (folded into W_O: the base graph itself). The base,
unmerged and merged models share weights values, receive identical batches, and are timed interleaved
round-robin; the statistic is the median over repetitions.
"""

from __future__ import annotations

import copy
import statistics
import time

import torch

from ..adapters import DexConfig, adapt, merge_adapter, set_adapter_step


def _fwd(model, x):
    def run():
        with torch.no_grad():
            model(x)

    return run


def _train_step(model, x):
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.0)

    def run():
        opt.zero_grad(set_to_none=True)
        model(x, labels=x).loss.backward()
        opt.step()

    return run


def _median_ms(fns: dict, reps: int) -> dict[str, float]:
    for fn in fns.values():
        fn()
    times = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: 1e3 * statistics.median(v) for k, v in times.items()}


def run_adapter_benchmark(base: torch.nn.Module, x: torch.Tensor, reps: int = 5) -> dict[str, dict[str, float]]:
    """Forward and train-step ms of base, Dex unmerged and Dex merged (half the heads, λ(t) past annealing)."""
    base = base.eval()
    dex = adapt(copy.deepcopy(base), DexConfig(heads="random", anneal_steps=1))
    set_adapter_step(dex, 1)
    merged = merge_adapter(adapt(copy.deepcopy(base), DexConfig(heads="random", anneal_steps=1)))
    models = {"base": base, "dex unmerged": dex, "dex merged": merged}
    forward = _median_ms({k: _fwd(m, x) for k, m in models.items()}, reps)
    for m in models.values():
        m.train()
    step = _median_ms({k: _train_step(m, x) for k, m in models.items()}, reps)
    return {k: {"forward_ms": forward[k], "train_step_ms": step[k]} for k in models}


def format_table(title: str, result: dict[str, dict[str, float]]) -> str:
    b = result["base"]
    lines = [f"[{title}]", f"{'model':<14} {'fwd ms':>9} {'x base':>7} {'step ms':>9} {'x base':>7}"]
    for k, r in result.items():
        lines.append(
            f"{k:<14} {r['forward_ms']:>9.1f} {r['forward_ms'] / b['forward_ms']:>7.3f} "
            f"{r['train_step_ms']:>9.1f} {r['train_step_ms'] / b['train_step_ms']:>7.3f}"
        )
    return "\n".join(lines)
