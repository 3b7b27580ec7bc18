"""Pretraining: DIFF and baseline Transformers from scratch on Hugging Face Trainer (one CPU to torchrun)."""

from .config import DataConfig, ModelConfig, RunConfig, TrainConfig
from .paired import pretrain_paired, read_metrics
from .trainer import NonFiniteLossError, RunFolderError, checkpoint_problem, latest_checkpoint, pretrain

__all__ = [
    "DataConfig",
    "ModelConfig",
    "NonFiniteLossError",
    "RunConfig",
    "RunFolderError",
    "TrainConfig",
    "checkpoint_problem",
    "latest_checkpoint",
    "pretrain",
    "pretrain_paired",
    "read_metrics",
]
