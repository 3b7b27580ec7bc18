"""``diffattn adapt``: fine-tune a pretrained model with an adapter method, or with one of the controls.

Methods and controls are the entries of the method registry (:mod:`diffattn.adapters.registry`): each method
(docs/methods.md §2–5; their training: docs/methods.md §6.3) goes through :func:`diffattn.adapt` and
:func:`diffattn.trainable_parameters`, which freeze exactly what the method's paper froze; the controls users compare
against (LoRA at DiffLoRA's parameter count, attention-only and full fine-tuning) are described in
:mod:`diffattn.adapters.controls`.

This module runs the fine-tune and publishes its result; the run's config (``run.yaml``, a method's resolved
options) is :mod:`.adapt_config`, the trainer's additions (λ(t) callback, weight-decay exclusions, the "contributes
nothing" check) are :mod:`.adapt_trainer`, and loading a finished run is :func:`diffattn.adapters.runs.load_adapted`.

All run on the pretraining trainer (:class:`~diffattn.train.trainer.DiffattnTrainer`: atomic checkpoints,
resume, ``metrics.jsonl``, a stop on a non-finite loss). On top of it: λ(t) of Dex Eq. 4 follows the
optimiser step (a callback calls :func:`diffattn.set_adapter_step` before every step) and is logged per
layer; every λ (and GPT-2's fused ``c_attn`` under Dex, whose query part a gradient hook freezes) gets weight
decay 0; the differential parameters of the λ(t) methods (λ_learn and W_D, W_DAA) train at ``train.lambda_lr`` in
an optimiser group of their own, never decayed (recorded in ``summary.json`` as ``lambda_lr``); Dex's data-driven
head selection runs on the first ``data.calibration_batches`` training batches and the chosen heads are recorded
in ``summary.json`` and the adapter.

Output folder: ``run.yaml``, ``metrics.jsonl``, ``checkpoints/``, ``summary.json`` (validation loss before and
after, trainable and total parameter counts, λ per layer, Dex heads, ``warnings``: e.g. a λ(t) method whose
|λ| ended below :data:`~diffattn.train.adapt_trainer.INACTIVE_LAMBDA` in every layer), and the result:
``adapter/`` (:func:`diffattn.save_adapter`; PEFT's own folder for ``lora``), ``merged/`` (``--merge``, Dex
and DiffV: a plain model of the base architecture) or ``final/`` (``attn-ft``, ``full-ft``), each with the
tokenizer. :func:`diffattn.adapters.runs.load_adapted` rebuilds the trained model from the folder.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import shutil
import time
from pathlib import Path

import torch
from accelerate import PartialState
from transformers import TrainerCallback, set_seed

from ..adapters import (
    adapt,
    adapter_lambdas,
    differential_parameter_names,
    merge_adapter,
    no_decay_parameter_names,
    save_adapter,
    set_adapter_step,
    trainable_parameters,
)
from ..adapters.base import set_adapter_backend
from ..adapters.registry import ADAPTER, FINAL, MERGED, get_method, method_names
from ..cards import run_card_fields, write_model_card
from ..data import load_corpus, tokenize_and_pack
from ..environment import environment
from ..files import (
    NoSpaceError,
    is_inside,
    publish_folder,
    release_folder,
    write_text_atomic,
    writing,
)
from ..models.pretrained import config_positions, load_pretrained
from .adapt_config import (
    RESOLVED_OPTIONS,
    AdaptRunConfig,
    _jsonable,
    check_resolved_options,
    resolved_method_options,
)
from .adapt_trainer import AdapterStepCallback, AdapterTrainer, _lambda_warnings
from .config import training_identity
from .data import PackedDataset, add_retrieval_mix, check_enough_text, warn_if_repeated
from .tracking import report_to, tracker_environment
from .trainer import (
    FINAL_INTACT,
    METRICS,
    STAGING,
    MetricsCallback,
    RunFolderError,
    _final_eval,
    check_checkpoint_fits,
    check_cuda_graphs,
    check_run_dir,
    distribution,
    finished_summary,
    read_metrics,
    ready_for_inference,
    start_run_folder,
    train_from,
    training_arguments,
    training_throughput,
)

logger = logging.getLogger(__name__)


def _calibration(train_ids: torch.Tensor, batch: int, batches: int) -> list[torch.Tensor]:
    rows = train_ids[: batch * batches]
    return [rows[i : i + batch] for i in range(0, rows.shape[0], batch)]


def apply_control(model: torch.nn.Module, method: str, options) -> torch.nn.Module:
    """Set up a control (its registry entry's adapt): LoRA through PEFT, or what attention/full fine-tuning trains."""
    spec = get_method(method) if method in method_names() else None
    if spec is None or spec.kind != "control":
        raise ValueError(f"unknown control {method!r}; controls: {', '.join(method_names('control'))}")
    return spec.adapt(model, options, None)


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
    set_adapter_backend(model, config.method.backend)
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
    config = config.validate().with_base_folder_absolute()
    run_dir = Path(run_dir)
    args = training_arguments(config, run_dir)
    check_cuda_graphs(config, args)
    state = PartialState()
    options, checkpoint = _check_run_folder(config, run_dir, resume=resume, overwrite=overwrite)
    done = finished_summary(run_dir, checkpoint, config.train.max_steps) if resume else None
    if done is not None:
        return done
    model, tokenizer = load_pretrained(config.model.name)
    max_pos = config_positions(model.config)
    if max_pos is not None and config.data.seq_len > max_pos:
        raise ValueError(f"data.seq_len={config.data.seq_len} exceeds the model's maximum of {max_pos} positions")
    beyond = _beyond_base_length(config)
    if beyond:
        logger.warning(beyond)
    corpus = load_corpus(config.data.source, seed=config.data.split_seed)
    with args.main_process_first(desc="tokenize"):
        train, val, mix_rows = _packed_data(config, corpus, tokenizer)
    # the method's new weights (LoRA's A, DIFF V2's second query and gate, …) drawn from the run's seed: not from
    # whatever the process drew before (the Trainer seeds only later), so a part's result does not depend on which
    # parts its process trained first (in one `diffattn run`, a LoRA part after others started from other weights)
    set_seed(config.train.seed)
    model, method_config = prepare_model(config, model, train.input_ids)
    check_checkpoint_fits(run_dir, checkpoint, model)
    trainable, total = _count(model)
    logger.info("%s on %s: %s of %s parameters trainable", config.method.name, config.model.name, trainable, total)

    state.wait_for_everyone()
    if state.is_main_process:
        start_run_folder(run_dir, config, overwrite=overwrite, checkpoint=checkpoint, command="adapt", resume=resume)
        write_text_atomic(run_dir / RESOLVED_OPTIONS, json.dumps(options, indent=2))
    state.wait_for_everyone()

    is_adapter = get_method(config.method.name).kind == "method"
    trainer = _adapter_trainer(config, model, args, run_dir, train, val, callbacks, is_adapter)
    if is_adapter:
        set_adapter_step(model, 0)
    val_before = trainer.evaluate()["eval_loss"] if checkpoint is None else _logged_val_loss_before(run_dir)
    t0 = time.perf_counter()
    if train_from(trainer, checkpoint, config.train.max_steps) and is_adapter:
        # λ(t) where the last step left it (its callback sets t = steps taken as each step begins)
        set_adapter_step(model, max(0, trainer.state.global_step - 1))
    wall = time.perf_counter() - t0
    val_after = _final_eval(trainer)["eval_loss"]
    lambdas = adapter_lambdas(model) if is_adapter else None
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
        "tokens_per_s": training_throughput(trainer, run_dir),
        # which training of a from-scratch base (a run's final/) this adapted: a base trained again since is another
        "base_training": training_identity(Path(config.model.name).parent)
        if Path(config.model.name).name == "final"
        else None,
        "wall_seconds": wall,
        "lambda": lambdas,
        # the learning rate of the differential parameters (their own optimiser group; None: the method has none)
        "lambda_lr": trainer.lambda_lr,
        "lambda_lr_parameters": sum(p.numel() for n, p in model.named_parameters() if n in trainer.differential),
        "distributed": distribution(config),
        "report_to": [r for r in report_to() if r != "none"],
        "environment": environment(),  # the same seed trains another model on another CPU kind
        "warnings": [
            *([beyond] if beyond else []),
            *_ramp_warnings(config, method_config),
            *_lambda_warnings(config.method.name, lambdas),
        ],
        "data": _data_summary(config, corpus, train, val, mix_rows),
    }
    for warning in summary["warnings"]:
        logger.warning(warning)
    if trainer.args.should_save:
        _save_result(trainer, tokenizer, config, run_dir, summary)
        write_text_atomic(run_dir / "summary.json", json.dumps(summary, indent=2))
        shutil.rmtree(run_dir / STAGING, ignore_errors=True)
    release_folder(run_dir)  # the run's lock on its folder (a failed run keeps it until its process ends)
    return summary


def base_training_length(name: str) -> int | None:
    """The sequence length a diffattn-pretrained base was trained at: ``data.seq_len`` of the ``run.yaml`` its
    ``final/`` (or checkpoint) folder holds; None for any other model (a hub model's training length is not
    recorded in its folder)."""
    from ..eval.common import folder_training_length

    return folder_training_length(name, pretrained_only=True)


def _beyond_base_length(config: AdaptRunConfig) -> str | None:
    """A warning when the run trains at more positions than its base ever saw: positions past the base's training
    length are new to it (rotary angles it never attended at, or learned position rows barely trained), so the
    adapter learns a length extension along with its method, and a comparison with its base measured at the base's
    length is not like for like (a user's review, 2026-12-03). A warning, not a refusal: extending is a use."""
    base = base_training_length(config.model.name)
    if base is None or config.data.seq_len <= base:
        return None
    return (
        f"data.seq_len={config.data.seq_len} is longer than the {base} tokens its base {config.model.name} was "
        f"trained at: positions {base}-{config.data.seq_len - 1} are new to it, so the run also learns a longer "
        f"context; give data.seq_len <= {base} to adapt only the attention"
    )


def _logged_val_loss_before(run_dir: Path) -> float | None:
    """A resumed run's validation loss before training: the step-0 evaluation its first start logged to
    metrics.jsonl (kept there on resume); None where it is not there (a run from before it was logged). A resumed
    run's summary said ``null`` (a user's review, 2026-12-03)."""
    return next((r["val_loss"] for r in read_metrics(run_dir / METRICS) if r["step"] == 0 and "val_loss" in r), None)


def _ramp_warnings(config: AdaptRunConfig, method_config) -> list[str]:
    """A run stopped part-way through a longer plan (``train.schedule_steps``) while λ(t) still ramps: its default
    T is the plan's, so past the run's middle λ is not λ_learn alone (the promise of
    :func:`~diffattn.train.adapt_config.default_anneal_steps` for a whole run), and the λ saved and merged is a point
    on the ramp."""
    from ..adapters.annealed import AnnealedOptions

    if not isinstance(method_config, AnnealedOptions) or not method_config.anneal:
        return []
    t, steps = method_config.anneal_steps, config.train.max_steps
    if "anneal_steps" in config.method.options or t is None or t <= steps // 2:
        return []
    return [
        f"λ(t) anneals over {t} steps of the {config.train.resolved_schedule_steps}-step schedule and this run stops "
        f"at step {steps}: the λ it saves is a point on the ramp, not λ_learn alone; resume it toward the schedule's "
        "end, or give method.anneal_steps"
    ]


def _check_run_folder(config: AdaptRunConfig, run_dir: Path, *, resume: bool, overwrite: bool):
    """Check the output folder against the request before the model loads: it must not overlap the base, and a
    resume must match the saved run. Returns the method's resolved options and the checkpoint to resume from."""
    base = Path(config.model.name)
    if base.exists() and (is_inside(run_dir, base) or is_inside(base, run_dir)):
        raise RunFolderError(
            f"output folder {str(run_dir)!r} and the base model {str(base)!r} overlap: an adapter run must not "
            "write into (or delete) its base; choose another --out"
        )
    options = resolved_method_options(config)  # bad options fail here, before the model is loaded
    # where the run saved its options resolved, they are compared resolved, not as written in run.yaml (so a run
    # whose code default has changed resumes when given the saved value explicitly)
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
    return options, checkpoint


def _packed_data(config: AdaptRunConfig, corpus, tokenizer):
    """The run's packed training rows (text, then any retrieval practice mix) and its first ``val_sequences``
    validation rows; returns ``(train, val, mix_rows)``."""
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
    return train, val, mix_rows


def _data_summary(config: AdaptRunConfig, corpus, train, val, mix_rows: int) -> dict:
    """What the run trained and validated on (``summary.json``'s ``data``)."""
    rows = int(train.input_ids.shape[0])
    passes = warn_if_repeated(rows, mix_rows, config.train.max_steps, config.train.global_batch_size)
    return {
        "source": corpus.name,
        "split": corpus.split_info,
        "corpus_fingerprint": corpus.fingerprint,
        "seq_len": config.data.seq_len,
        "train_sequences": rows,
        "val_sequences": int(val.input_ids.shape[0]),
        "retrieval_mix_sequences": mix_rows,
        "passes_over_data": round(passes, 2),
    }


def _adapter_trainer(config: AdaptRunConfig, model, args, run_dir: Path, train, val, callbacks, is_adapter: bool):
    """The pretraining trainer with the adapter's additions: λ(t) stepped and logged, every λ (and what the method
    names) never decayed, the differential parameters (λ_learn, W_D) in their own group at ``train.lambda_lr``."""
    tokens_per_step = config.train.global_batch_size * config.data.seq_len
    metrics = MetricsCallback(run_dir / METRICS, tokens_per_step, lambdas=adapter_lambdas if is_adapter else _none)
    extra_no_decay = no_decay_parameter_names(model) if is_adapter else []
    differential = differential_parameter_names(model) if is_adapter else []
    lambda_lr = config.train.resolved_lambda_lr if differential else None
    if config.train.lambda_lr is not None and not differential:
        logger.warning("train.lambda_lr is ignored: %s has no λ(t) term", config.method.name)
    with tracker_environment(run_dir):
        return AdapterTrainer(
            model=model,
            args=args,
            train_dataset=PackedDataset(train),
            eval_dataset=PackedDataset(val),
            callbacks=[metrics, *([AdapterStepCallback()] if is_adapter else []), *(callbacks or [])],
            run_dir=run_dir,
            keep_checkpoints=config.train.keep_checkpoints,
            loss_average=config.train.loss_average,
            extra_no_decay=extra_no_decay,
            differential=differential,
            lambda_lr=lambda_lr,
            cuda_graphs=config.train.cuda_graphs,
        )


def _none(model):
    return None


def _save_result(trainer, tokenizer, config: AdaptRunConfig, run_dir: Path, summary: dict) -> None:
    """Write adapter/ (methods, LoRA), merged/ (--merge) or final/ (attn-ft, full-ft), each atomically; a full
    device is one line naming the run folder (the partial copy is removed, published results stay)."""
    try:
        with writing(run_dir, "the adapted model", FINAL_INTACT):
            _write_result(trainer, tokenizer, config, run_dir, summary)
    except NoSpaceError:
        for name in (ADAPTER, MERGED, FINAL):
            shutil.rmtree(run_dir / (name + ".tmp"), ignore_errors=True)
        raise


def _write_result(trainer, tokenizer, config: AdaptRunConfig, run_dir: Path, summary: dict) -> None:
    model = trainer.accelerator.unwrap_model(trainer.model)
    spec = get_method(config.method.name)
    if spec.result == ADAPTER:
        tmp = run_dir / (ADAPTER + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        if spec.kind == "control":
            model.save_pretrained(tmp)  # PEFT (the LoRA control): adapter_config.json + adapter_model.safetensors
            (tmp / "README.md").unlink(missing_ok=True)  # PEFT's blank template card: ours below says what ran
        else:
            save_adapter(model, tmp)
        tokenizer.save_pretrained(tmp)
        write_model_card(tmp, **run_card_fields(config, summary, form=ADAPTER))
        publish_folder(tmp, run_dir / ADAPTER)
    if config.method.merge:
        tmp = run_dir / (MERGED + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        merged = merge_adapter(model)
        ready_for_inference(merged, tokenizer)
        merged.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        write_model_card(tmp, **run_card_fields(config, summary, form=MERGED))
        publish_folder(tmp, run_dir / MERGED)
        summary["merged"] = str(run_dir / MERGED)
    if spec.result == FINAL:
        tmp = run_dir / (FINAL + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        ready_for_inference(model, tokenizer)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        write_model_card(tmp, **run_card_fields(config, summary, form=FINAL))
        publish_folder(tmp, run_dir / FINAL)
