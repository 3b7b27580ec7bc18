"""Helpers shared by the training tests (plain functions, not fixtures)."""

from __future__ import annotations

from pathlib import Path

from diffattn.train import RunConfig, read_metrics
from diffattn.train.adapt import AdaptRunConfig


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
