"""Declarative experiments: ``diffattn run EXPERIMENT.yaml`` — pretrain, adapt, evaluate, report.

- :mod:`.config` — the YAML schema (:class:`ExperimentConfig`) and ``--set`` overrides.
- :mod:`.runner` — runs every part, skipping what is done and resuming what was interrupted.
- :mod:`.report` — ``report.md`` and ``results.json``.
"""

from .config import AdapterRun, EvalPlan, ExperimentConfig, PretrainedModel, ScratchModel
from .runner import PartOutcome, run_experiment

__all__ = [
    "AdapterRun",
    "EvalPlan",
    "ExperimentConfig",
    "PartOutcome",
    "PretrainedModel",
    "ScratchModel",
    "run_experiment",
]
