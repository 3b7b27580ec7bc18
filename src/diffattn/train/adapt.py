"""``diffattn adapt``: fine-tune a pretrained model with an adapter method, or with one of the controls.

Methods and controls are the entries of the method registry (:mod:`diffattn.adapters.registry`): each method
(methods.md §2–4) goes through :func:`diffattn.adapt` and :func:`diffattn.trainable_parameters`, which freeze
exactly what the method's paper froze; the controls users compare against (LoRA at DiffLoRA's parameter count,
attention-only and full fine-tuning) are described in :mod:`diffattn.adapters.controls`.

All run on the pretraining trainer (:class:`~diffattn.train.trainer.DiffattnTrainer`: atomic checkpoints,
resume, ``metrics.jsonl``, a stop on a non-finite loss). On top of it: λ(t) of Dex Eq. 4 follows the
optimiser step (a callback calls :func:`diffattn.set_adapter_step` before every step) and is logged per
layer; every λ (and GPT-2's fused ``c_attn`` under Dex, whose query part a gradient hook freezes) gets weight
decay 0; Dex's data-driven head selection runs on the first ``data.calibration_batches`` training batches and
the chosen heads are recorded in ``summary.json`` and the adapter.

Output folder: ``run.yaml``, ``metrics.jsonl``, ``checkpoints/``, ``summary.json`` (validation loss before and
after, trainable and total parameter counts, λ per layer, Dex heads, ``warnings``: e.g. a λ(t) method whose
|λ| ended below :data:`INACTIVE_LAMBDA` in every layer), and the result:
``adapter/`` (:func:`diffattn.save_adapter`; PEFT's own folder for ``lora``), ``merged/`` (``--merge``, Dex
and DiffV: a plain model of the base architecture) or ``final/`` (``attn-ft``, ``full-ft``), each with the
tokenizer. :func:`load_adapted` rebuilds the trained model from the folder.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from accelerate import PartialState
from transformers import TrainerCallback

from ..adapters import (
    adapt,
    adapter_lambdas,
    merge_adapter,
    no_decay_parameter_names,
    save_adapter,
    set_adapter_step,
    trainable_parameters,
)
from ..adapters.registry import ADAPTER, FINAL, MERGED, get_method, method_names, specs
from ..adapters.runs import load_adapted  # noqa: F401  (re-exported: it was defined here)
from ..config import from_dict
from ..data import load_corpus, tokenize_and_pack
from ..files import is_inside, publish_folder, write_text_atomic
from ..models.pretrained import load_pretrained
from .config import RetrievalMixFields, SectionedConfig, TrainConfig, setting_differences
from .data import PackedDataset, add_retrieval_mix, check_enough_text
from .trainer import (
    METRICS,
    STAGING,
    DiffattnTrainer,
    MetricsCallback,
    RunFolderError,
    _final_eval,
    _step,
    check_run_dir,
    distribution,
    ready_for_inference,
    start_run_folder,
    training_arguments,
)

logger = logging.getLogger(__name__)

INACTIVE_LAMBDA = 1e-3  # |λ| below this in every adapted layer at the end of a run: the method added nothing


def __getattr__(name: str):
    # from the method registry on access, so a method registered after import is included
    if name == "ADAPT_METHODS":
        return method_names()
    if name == "CONTROLS":
        return method_names("control")
    if name == "MERGEABLE":
        return tuple(s.name for s in specs() if s.mergeable)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def default_anneal_steps(max_steps: int) -> int:
    """T of Dex Eq. 4 when the run's options leave it unset: ``max(1, round(0.2·S), min(10, S // 2))``.

    20% of the S steps is methods.md §2's default and what long runs get (S ≥ 50). Short runs need a floor:
    20% of 6 steps is T = 1, a schedule with no annealing step at all (λ(0) = 0, then λ = λ_learn at once), so
    the λ_init ramp that gives the new weights their first gradient never happens. The floor gives the ramp up
    to 10 steps but never more than half the run, so λ_learn alone sets λ for at least the second half and the
    λ that is saved and merged is the learned one, not a point on the ramp (S = 6 → 3, 30 → 10, 200 → 40).
    """
    return max(1, round(0.2 * max_steps), min(10, max_steps // 2))


@dataclass
class AdaptModelSection:
    name: str = "smollm2-135m"  # a known offline name (see diffattn.models.PRETRAINED) or a local HF folder

    def validate(self) -> None:
        if not self.name:
            raise ValueError("model.name must be a known pretrained name or a local Hugging Face folder")


@dataclass
class AdaptMethodSection:
    name: str = "dex"
    options: dict = field(default_factory=dict)  # fields of the method's config dataclass
    merge: bool = False  # also write merged/ (dex, diffv)

    def validate(self) -> None:
        if self.name not in method_names():
            raise ValueError(f"method.name must be one of {', '.join(method_names())}; got {self.name!r}")
        if self.merge and not get_method(self.name).mergeable:
            mergeable = [s.name for s in specs() if s.mergeable]
            raise ValueError(
                f"--merge applies to {' and '.join(mergeable)} only; {self.name} cannot be folded into the base"
            )
        allowed = [f.name for f in dataclasses.fields(get_method(self.name).config) if f.name != "selected"]
        unknown = sorted(set(self.options) - set(allowed))
        if unknown:
            raise ValueError(
                f"unknown option(s) {', '.join(unknown)} for method {self.name}; "
                f"allowed: {', '.join(allowed) or 'none'}"
            )


@dataclass
class AdaptDataSection(RetrievalMixFields):
    source: str = "shakespeare"  # 'shakespeare', or a .txt/.jsonl/.json file or a directory of them
    seq_len: int = 256
    val_sequences: int = 16
    calibration_batches: int = 4  # training batches for Dex's entropy/importance head selection
    split_seed: int = 0

    def validate(self) -> None:
        for name in ("seq_len", "val_sequences", "calibration_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"data.{name} must be >= 1, got {getattr(self, name)}")
        self.validate_retrieval()


def _adapt_train_defaults() -> TrainConfig:
    # lr 1e-4 (DiffLoRA; DAA on Llama), cosine to 0 (DAA); no weight decay (the papers are silent, and the
    # base weights the methods move should stay near the pretrained ones); 10% warmup.
    return TrainConfig(max_steps=200, lr=1e-4, schedule="cosine", min_lr_ratio=0.0, weight_decay=0.0)


@dataclass
class AdaptRunConfig(SectionedConfig):
    model: AdaptModelSection = field(default_factory=AdaptModelSection)
    method: AdaptMethodSection = field(default_factory=AdaptMethodSection)
    data: AdaptDataSection = field(default_factory=AdaptDataSection)
    train: TrainConfig = field(default_factory=_adapt_train_defaults)

    @classmethod
    def from_dict(cls, d: dict) -> AdaptRunConfig:
        base = cls().to_dict()  # sections missing from a YAML file keep the adapt defaults, not TrainConfig's
        for section, values in (d or {}).items():
            if isinstance(values, dict) and isinstance(base.get(section), dict):
                base[section] = {**base[section], **values}
            else:
                base[section] = values
        return from_dict(cls, base)

    def _set(self, d: dict, dotted: str, value: object) -> None:
        # method.<field> is shorthand for method.options.<field>: --set method.rank=8
        section, _, key = dotted.partition(".")
        if section == "method" and key not in ("name", "options", "merge"):
            d["method"]["options"][key.removeprefix("options.")] = value
        else:
            super()._set(d, dotted, value)

    def method_config(self):
        """The method's config dataclass from ``method.options`` (anneal_steps: :func:`default_anneal_steps` of
        the run's steps when unset). Raises ValueError for a config whose new parameters could never learn."""
        cls = get_method(self.method.name).config
        options = dict(self.method.options)
        names = {f.name for f in dataclasses.fields(cls)}
        if "anneal_steps" in names and options.get("anneal_steps") is None:
            options["anneal_steps"] = default_anneal_steps(self.train.max_steps)
        try:
            method_config = cls(**options)
        except TypeError as e:
            raise ValueError(f"bad options for method {self.method.name}: {e}") from e
        check = getattr(method_config, "check_learnable", None)
        if check is not None:  # T is known only here: Dex with init='zero' and T = 1 is refused now, not at the end
            check()
        return method_config


class AdapterStepCallback(TrainerCallback):
    """λ(t) follows the optimiser: t = the number of steps already taken when a step begins (Dex Eq. 4)."""

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is not None:
            set_adapter_step(_unwrap(model), state.global_step)

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        if model is not None:
            set_adapter_step(_unwrap(model), state.global_step)


def _unwrap(model):
    return getattr(model, "module", model)


class AdapterTrainer(DiffattnTrainer):
    """Weight decay 0 for λ (and GPT-2's fused c_attn under Dex) on top of Trainer's bias/norm exclusions."""

    def __init__(self, *args, extra_no_decay: list[str], **kwargs):
        super().__init__(*args, **kwargs)
        self.extra_no_decay = set(extra_no_decay)

    def get_decay_parameter_names(self, model) -> list[str]:
        return [n for n in super().get_decay_parameter_names(model) if n not in self.extra_no_decay]


def _calibration(train_ids: torch.Tensor, batch: int, batches: int) -> list[torch.Tensor]:
    rows = train_ids[: batch * batches]
    return [rows[i : i + batch] for i in range(0, rows.shape[0], batch)]


def prepare_model(config: AdaptRunConfig, model, train_ids: torch.Tensor | None = None):
    """Give ``model`` the run's method (or control) and set what trains; returns ``(model, method_config)``."""
    options = config.method_config()
    spec = get_method(config.method.name)
    if spec.kind == "control":
        model = spec.adapt(model, options, None)
        spec.trainable_parameters(model)
        return model, options
    calibration = None
    if spec.needs_calibration(options):
        if train_ids is None:
            raise ValueError(f"{spec.display} with these options needs calibration batches from the training data")
        calibration = _calibration(train_ids, config.train.global_batch_size, config.data.calibration_batches)
    adapt(model, options, calibration)
    trainable_parameters(model)
    return model, options


def _count(model) -> tuple[int, int]:
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, sum(p.numel() for p in model.parameters())


def adapt_pretrained(
    config: AdaptRunConfig,
    run_dir: str | os.PathLike,
    *,
    resume: bool = False,
    overwrite: bool = False,
    callbacks: list[TrainerCallback] | None = None,
) -> dict:
    """Fine-tune ``config.model.name`` with ``config.method`` on ``config.data``; returns the summary."""
    config.validate()
    run_dir = Path(run_dir)
    args = training_arguments(config, run_dir)
    state = PartialState()
    base = Path(config.model.name)
    if base.exists() and (is_inside(run_dir, base) or is_inside(base, run_dir)):
        raise RunFolderError(
            f"output folder {str(run_dir)!r} and the base model {str(base)!r} overlap: an adapter run must not "
            "write into (or delete) its base; choose another --out"
        )
    options = resolved_method_options(config)  # bad options fail here, before the model is loaded
    # with a saved resolved form, the method's options are compared resolved (so giving a changed default's old
    # value explicitly resumes), not as written in run.yaml
    resolved_saved = resume and (run_dir / RESOLVED_OPTIONS).is_file()
    checkpoint = check_run_dir(
        run_dir,
        config,
        resume=resume,
        overwrite=overwrite,
        compared_elsewhere=("method.options",) if resolved_saved else (),
    )
    if resolved_saved:
        check_resolved_options(run_dir, options)
    model, tokenizer = load_pretrained(config.model.name)
    max_pos = getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", None)
    if max_pos is not None and config.data.seq_len > max_pos:
        raise ValueError(f"data.seq_len={config.data.seq_len} exceeds the model's maximum of {max_pos} positions")
    corpus = load_corpus(config.data.source, seed=config.data.split_seed)
    with args.main_process_first(desc="tokenize"):
        train = tokenize_and_pack(corpus.train, tokenizer, config.data.seq_len)
        check_enough_text(train, config.train.global_batch_size, config.data.source, config.data.seq_len)
        val = tokenize_and_pack(corpus.val, tokenizer, config.data.seq_len)
        # the retrieval practice mix as in pretraining (none by default), appended after the text rows, so Dex's
        # head selection still calibrates on the first text rows
        train, mix_rows = add_retrieval_mix(train, config.data, tokenizer, corpus.train, config.train.seed)
    val_rows = min(config.data.val_sequences, val.input_ids.shape[0])
    val = dataclasses.replace(
        val,
        input_ids=val.input_ids[:val_rows],
        labels=val.labels[:val_rows],
        attention_mask=val.attention_mask[:val_rows],
        num_tokens=int(val.attention_mask[:val_rows].sum()),
    )
    model, method_config = prepare_model(config, model, train.input_ids)
    trainable, total = _count(model)
    logger.info("%s on %s: %s of %s parameters trainable", config.method.name, config.model.name, trainable, total)

    state.wait_for_everyone()
    if state.is_main_process:
        start_run_folder(run_dir, config, overwrite=overwrite, checkpoint=checkpoint, command="adapt")
        write_text_atomic(run_dir / RESOLVED_OPTIONS, json.dumps(options, indent=2))
    state.wait_for_everyone()

    is_adapter = get_method(config.method.name).kind == "method"
    tokens_per_step = config.train.global_batch_size * config.data.seq_len
    metrics = MetricsCallback(run_dir / METRICS, tokens_per_step, lambdas=adapter_lambdas if is_adapter else _none)
    extra_no_decay = no_decay_parameter_names(model) if is_adapter else []
    trainer = AdapterTrainer(
        model=model,
        args=args,
        train_dataset=PackedDataset(train),
        eval_dataset=PackedDataset(val),
        callbacks=[metrics, *([AdapterStepCallback()] if is_adapter else []), *(callbacks or [])],
        run_dir=run_dir,
        keep_checkpoints=config.train.keep_checkpoints,
        loss_average=config.train.loss_average,
        extra_no_decay=extra_no_decay,
    )
    if is_adapter:
        set_adapter_step(model, 0)
    val_before = trainer.evaluate()["eval_loss"] if checkpoint is None else None
    t0 = time.perf_counter()
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    wall = time.perf_counter() - t0
    val_after = _final_eval(trainer)["eval_loss"]
    steps_run = trainer.state.global_step - (_step(checkpoint) if checkpoint else 0)
    summary = {
        "model": config.model.name,
        "model_type": model.config.model_type,
        "method": config.method.name,
        "method_config": _jsonable(method_config),
        "trainable_parameters": trainable,
        "total_parameters": total,
        "steps": trainer.state.global_step,
        "val_loss_before": val_before,
        "val_loss_after": val_after,
        "val_ppl_after": math.exp(min(val_after, 50.0)),
        "tokens_per_s": tokens_per_step * steps_run / wall if wall > 0 else None,
        "wall_seconds": wall,
        "lambda": adapter_lambdas(model) if is_adapter else None,
        "distributed": distribution(config),
        "warnings": [],
        "data": {
            "source": corpus.name,
            "split": corpus.split_info,
            "corpus_fingerprint": corpus.fingerprint,
            "seq_len": config.data.seq_len,
            "train_sequences": int(train.input_ids.shape[0]),
            "val_sequences": val_rows,
            "retrieval_mix_sequences": mix_rows,
        },
    }
    summary["warnings"] += _lambda_warnings(config.method.name, summary["lambda"])
    for warning in summary["warnings"]:
        logger.warning(warning)
    if trainer.args.should_save:
        _save_result(trainer, tokenizer, config, run_dir, summary)
        write_text_atomic(run_dir / "summary.json", json.dumps(summary, indent=2))
        shutil.rmtree(run_dir / STAGING, ignore_errors=True)
    return summary


RESOLVED_OPTIONS = "method_options.json"  # the method's options with every code default filled in


def resolved_method_options(config: AdaptRunConfig) -> dict:
    """The method's full config as the code resolves it now (defaults included), for comparison on resume: run.yaml
    holds only the options given, so a changed code default (DAA's placement, Dex's init) would pass unseen.
    A defaulted ``anneal_steps`` is left out: it follows ``max_steps``, which a resume may extend."""
    resolved = _jsonable(config.method_config())
    if "anneal_steps" not in config.method.options:
        resolved.pop("anneal_steps", None)
    return json.loads(json.dumps(resolved, default=str))


def check_resolved_options(run_dir: Path, options: dict) -> None:
    saved_file = run_dir / RESOLVED_OPTIONS
    if not saved_file.is_file():  # a run started before this file existed: nothing to compare
        return
    diff = setting_differences(json.loads(saved_file.read_text()), options)
    if diff:
        raise RunFolderError(
            f"--resume: the method's options now resolve differently from the saved run's ({'; '.join(diff)}), "
            "e.g. a default changed in this version; give the saved values with --set method.NAME=VALUE, or "
            "--overwrite to start again"
        )


def _lambda_warnings(method: str, lambdas: list[float] | None) -> list[str]:
    """Say so when a λ(t) method ended with |λ| < INACTIVE_LAMBDA in every adapted layer: its new term is
    (almost) absent from the trained model, which is then in effect an attention fine-tune of the base."""
    spec = get_method(method)
    if not spec.annealed or not lambdas or max(abs(v) for v in lambdas) >= INACTIVE_LAMBDA:
        return []
    largest = max(abs(v) for v in lambdas)
    name = spec.display
    return [
        f"{name} contributes nothing: |λ| < {INACTIVE_LAMBDA:g} in every adapted layer (largest {largest:.2g}), "
        "so the result is in effect an attention fine-tune of the base model; train longer, with a higher "
        "learning rate, or check the λ(t) settings (anneal_steps, lambda_init, init)"
    ]


def _none(model):
    return None


def _jsonable(config) -> dict:
    return {k: v for k, v in dataclasses.asdict(config).items()} if dataclasses.is_dataclass(config) else {}


def _save_result(trainer, tokenizer, config: AdaptRunConfig, run_dir: Path, summary: dict) -> None:
    """Write adapter/ (methods, LoRA), merged/ (--merge) or final/ (attn-ft, full-ft), each atomically."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    spec = get_method(config.method.name)
    if spec.result == ADAPTER:
        tmp = run_dir / (ADAPTER + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        if spec.kind == "control":
            model.save_pretrained(tmp)  # PEFT (the LoRA control): adapter_config.json + adapter_model.safetensors
        else:
            save_adapter(model, tmp)
        tokenizer.save_pretrained(tmp)
        publish_folder(tmp, run_dir / ADAPTER)
    if config.method.merge:
        tmp = run_dir / (MERGED + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        merged = merge_adapter(model)
        ready_for_inference(merged, tokenizer)
        merged.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        publish_folder(tmp, run_dir / MERGED)
        summary["merged"] = str(run_dir / MERGED)
    if spec.result == FINAL:
        tmp = run_dir / (FINAL + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        ready_for_inference(model, tokenizer)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        publish_folder(tmp, run_dir / FINAL)
