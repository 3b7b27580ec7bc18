"""Helpers shared by the tests (plain functions, not fixtures)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from diffattn.eval.common import cache_keyword
from diffattn.train import RunConfig, read_metrics
from diffattn.train.adapt import AdaptRunConfig


def frames_compiled(run, *args, **kwargs) -> int:
    """``run(*args, **kwargs)`` (a training run) from a fresh dynamo, its caches and counters cleared: the frames it
    compiled (0: nothing was)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    run(*args, **kwargs)
    return counters["frames"]["ok"]


def assert_follows_eager(got: dict, eager: dict, accum: dict, what) -> None:
    """A compiled run's losses within 4x the eager run's own difference from itself with two micro-batches (the same
    sums in another order: float32 rounding's yardstick), at least a few float32 epsilons of the loss."""
    assert sorted(got) == sorted(eager), what
    yardstick = max(abs(accum[s] - eager[s]) for s in eager)
    eps = torch.finfo(torch.float32).eps
    for step in eager:
        assert abs(got[step] - eager[step]) <= max(4 * yardstick, 8 * eps * abs(eager[step])), (what, step)


def record_backends(monkeypatch, module) -> list[str]:
    """Patch ``module.diff_attention`` (a module that calls the op by that name) to record each call's ``backend``
    and still compute; returns the list the calls append to."""
    used, op = [], module.diff_attention

    def recording(*args, backend, **kwargs):
        used.append(backend)
        return op(*args, backend=backend, **kwargs)

    monkeypatch.setattr(module, "diff_attention", recording)
    return used


def debug_config(corpus: Path, **train) -> RunConfig:
    cfg = RunConfig.from_dict(
        {
            "model": {"preset": "debug", "attention": "diff"},
            "data": {"source": str(corpus), "vocab_size": 512, "seq_len": 64, "val_sequences": 8},
            "train": {
                "max_steps": 12,
                "global_batch_size": 8,
                "lr": 3e-3,
                "warmup_steps": 2,
                "log_every": 1,
                "eval_every": 6,
                "save_every": 4,
                "seed": 0,
                **train,
            },
        }
    )
    return cfg.validate()


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir / "metrics.jsonl") if "loss" in r}


# ---------------------------------------------------------------- config


def adapt_config(base_dir, corpus_dir, method, steps=3, **sets):
    config = AdaptRunConfig().with_overrides(
        {
            "model.name": str(base_dir),
            "method.name": method,
            "data.source": str(corpus_dir),
            "data.seq_len": 32,
            "data.val_sequences": 4,
            "data.calibration_batches": 2,
            "train.max_steps": steps,
            "train.global_batch_size": 2,
            "train.lr": 1e-2,
            "train.eval_every": 100,
            "train.save_every": 100,
            **sets,
        }
    )
    return config.validate()


def decode_token_by_token(model, ids: torch.Tensor, prefill: int, cache=None) -> tuple[torch.Tensor, object]:
    """Logits of ``ids`` [B, T] computed with a KV cache: one forward over the first ``prefill`` tokens, then one
    token at a time (the cache passed under the keyword the model takes; ``cache``: one to start from, e.g. a
    ``StaticCache``, whose empty slots the prefill must not see). Returns (logits [B, T, V], the cache)."""
    keyword = cache_keyword(model)
    out = model(ids[:, :prefill], use_cache=True, **({keyword: cache} if cache is not None else {}))
    steps, cache = [out.logits], out.past_key_values
    for i in range(prefill, ids.shape[1]):
        out = model(ids[:, i : i + 1], use_cache=True, **{keyword: cache})
        steps.append(out.logits)
        cache = out.past_key_values
    return torch.cat(steps, 1), cache


def rows_without_masks(dataset_class):
    """``dataset_class`` (diffattn.train.data.PackedDataset) whose rows carry no attention mask: an eager run that
    computes what a graphed one does (``train.cuda_graphs`` leaves out a mask padded at the row's end), to hold the
    graphed run's bookkeeping to bit for bit. That leaving the mask out changes no scored position is tested on its
    own (tests/test_cuda_graphs.py)."""

    class WithoutMasks(dataset_class):
        def __getitem__(self, i):
            return {k: v for k, v in super().__getitem__(i).items() if k != "attention_mask"}

    return WithoutMasks


def pairwise(**factors) -> list:
    """Every combination of ``factors`` (name → values, or name → {id: value}) as pytest params for one
    ``parametrize`` over the names in that order, with the ids stacked decorators give (each value's as pytest names
    it, :func:`_param_id`, joined by "-"): those of a strength-2 covering set in the default
    run, the rest marked ``heavy``. Every pair of values of any two factors meets in a default test; CI's heavy run
    (and ``make test-heavy``) takes the whole product. The set is chosen greedily — the combination covering most pairs
    not yet covered, the first in product order on a tie — so the same factors always choose the same tests."""
    levels = [
        list(values.items()) if isinstance(values, dict) else [(_param_id(name, i, v), v) for i, v in enumerate(values)]
        for name, values in factors.items()
    ]
    cases = list(itertools.product(*(range(len(level)) for level in levels)))

    def pairs(case):
        return {(a, case[a], b, case[b]) for a, b in itertools.combinations(range(len(case)), 2)}

    uncovered = set().union(*map(pairs, cases))  # none with one factor: then every case is in the default run
    default = set(cases) if len(levels) < 2 else set()
    while uncovered:
        best = max(cases, key=lambda case: len(pairs(case) & uncovered))  # max keeps the first of equals
        default.add(best)
        uncovered -= pairs(best)
    return [
        pytest.param(
            *(levels[k][i][1] for k, i in enumerate(case)),
            id="-".join(levels[k][i][0] for k, i in enumerate(case)),
            marks=() if case in default else pytest.mark.heavy,
        )
        for case in cases
    ]


def _param_id(name: str, index: int, value) -> str:
    """pytest's own id of a parameter value (its ``_idval_from_value``): a plain value or an enum member as ``str``, a
    pattern as its pattern, a class or function as its name, anything else as the argument's name and index."""
    import enum
    import re

    if isinstance(value, str):
        return value.encode("unicode_escape").decode("ascii")  # pytest's ascii_escaped
    if value is None or isinstance(value, (int, float, complex, bool, enum.Enum)):
        return str(value)
    if isinstance(value, re.Pattern):
        return value.pattern
    if getattr(value, "__name__", None) and (isinstance(value, type) or callable(value)):
        return value.__name__
    return f"{name}{index}"
