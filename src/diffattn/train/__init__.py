"""Pretraining: DIFF and baseline Transformers from scratch on Hugging Face Trainer (one CPU to torchrun).

The names below are imported on first use (PEP 562): a run's config (:mod:`.config`) is read and validated without
the trainer's import of transformers, which takes seconds (``diffattn pretrain`` with a bad flag answered in 8 s)."""

from __future__ import annotations

import importlib

_HOMES = {
    "DataConfig": ".config",
    "ModelConfig": ".config",
    "RunConfig": ".config",
    "TrainConfig": ".config",
    "pretrain_paired": ".paired",
    "read_metrics": ".trainer",
    "NonFiniteLossError": ".trainer",
    "RunFolderError": ".config",
    "checkpoint_problem": ".trainer",
    "latest_checkpoint": ".trainer",
    "pretrain": ".trainer",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
