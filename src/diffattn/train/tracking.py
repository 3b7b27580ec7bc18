"""Experiment tracking: where training runs report (transformers' ``report_to`` integrations).

Every training command (``diffattn pretrain``, ``adapt``, ``run``, ``quickstart``) takes ``--report-to`` —
``tensorboard`` (the suggestion: a local event file, nothing sent), or any integration transformers' Trainer knows
that is installed (``trackio``, ``wandb`` in offline mode, ``mlflow``, …) — and logs loss, learning rate, gradient
norm and λ per layer (DIFF V2: its gate) there, beside ``metrics.jsonl``. It is where a run *reports*, not what it
computes, so it is not a setting of the run (``run.yaml``): a run resumed with another tracker is the same run.
The choice is made for a block of code with :func:`reporting` and read by the trainer (:func:`report_to`); an
integration that is not installed is refused before any training, naming the package to install.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.util

_REPORT_TO: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("diffattn_report_to", default=())

# the package that provides each integration (what `pip install` needs); the names are transformers' report_to names
PACKAGES = {
    "tensorboard": ("tensorboard", "tensorboardX"),
    "trackio": ("trackio",),
    "wandb": ("wandb",),
    "mlflow": ("mlflow",),
    "comet_ml": ("comet_ml",),
    "neptune": ("neptune",),
    "clearml": ("clearml",),
    "dvclive": ("dvclive",),
    "swanlab": ("swanlab",),
    "codecarbon": ("codecarbon",),
}


def parse_report_to(text: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    """``"tensorboard,wandb"`` → ``("tensorboard", "wandb")``; ``"none"`` / empty → ``()``. Unknown or uninstalled
    integrations are refused with one sentence naming what to install."""
    if text is None:
        return ()
    names = [n.strip() for n in text.split(",")] if isinstance(text, str) else [str(n).strip() for n in text]
    names = [n for n in names if n and n != "none"]
    for name in names:
        if name not in PACKAGES:
            raise ValueError(f"--report-to {name!r}: unknown integration; choose from none, {', '.join(PACKAGES)}")
        if not any(importlib.util.find_spec(p) is not None for p in PACKAGES[name]):
            raise ValueError(f"--report-to {name}: the integration is not installed (pip install {PACKAGES[name][0]})")
    return tuple(dict.fromkeys(names))


@contextlib.contextmanager
def reporting(text: str | list[str] | None):
    """Within the block, training runs report to these integrations (see the module doc)."""
    token = _REPORT_TO.set(parse_report_to(text))
    try:
        yield
    finally:
        _REPORT_TO.reset(token)


def report_to() -> list[str]:
    """What transformers' ``TrainingArguments.report_to`` should be for a run started now."""
    return list(_REPORT_TO.get()) or ["none"]


@contextlib.contextmanager
def tracker_environment(run_dir):
    """While a Trainer is built: TensorBoard writes into ``run_dir/tensorboard`` (transformers' callback reads the
    folder from ``TENSORBOARD_LOGGING_DIR`` when it is made; a folder the user set there is kept)."""
    import os
    from pathlib import Path

    key = "TENSORBOARD_LOGGING_DIR"
    before = os.environ.get(key)
    if "tensorboard" in _REPORT_TO.get() and before is None:
        os.environ[key] = str(Path(run_dir) / "tensorboard")
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)


def lambda_logs(values: list[float] | None, model) -> dict[str, float]:
    """λ per layer as scalars for the trackers: ``lambda/layer_i``, or ``gate/layer_i`` for DIFF V2, whose per-layer
    value is the mean of its gate sigmoid(x·w_λ) (docs/methods.md §5.1), not a λ."""
    if not values:
        return {}
    name = "gate" if getattr(getattr(model, "config", None), "model_type", "") == "diffattn_v2" else "lambda"
    return {f"{name}/layer_{i}": float(v) for i, v in enumerate(values)}
