"""Pretraining of DIFF Transformers and their same-size baselines on Hugging Face ``Trainer``.

What ``Trainer`` already does well is used as is: the loop, AdamW, gradient
clipping and accumulation, bf16 autocast on GPU, DDP/FSDP under ``torchrun`` (through accelerate, so the
same command scales out), periodic evaluation, RNG/optimizer/scheduler state for exact resumption, and the
progress bar. What we add:

* **The schedule** (:func:`lr_factor`): linear warmup from the first step, then linear or cosine decay to
  ``min_lr_ratio``·peak (the paper's "linear decay to 4%"). Trainer's warmup-stable-decay warms up from
  ``min_lr_ratio``·peak instead, so a constant rate (``min_lr_ratio`` 1) had no warmup at all.
* **Atomic checkpoints.** ``Trainer`` writes ``checkpoint-N`` in place, so a crash mid-write leaves a folder
  that its own resume logic would pick. We let it write into ``.staging/`` and publish the finished folder
  with one ``os.replace`` into ``checkpoints/``; ``--resume`` also verifies a checkpoint before trusting it.
* **metrics.jsonl**: step, loss, lr, grad norm, tokens/s and λ of every DIFF layer (Eq. 2) per log; val
  loss and perplexity per evaluation.
* **A stop on a non-finite loss**, naming the step, before anything of that step is checkpointed.
* A final ``save_pretrained`` folder with the tokenizer and the resolved ``run.yaml``.
* **The vocabulary projection only where a label scores** (:func:`scored_positions_loss`), for batches that score at
  most half their positions (MQAR, answer-only needle rows): the model's own loss and gradients within float
  rounding, an MQAR step of a ``quick`` model in 0.60-0.67× the time on a CPU (``benchmarks/scored_loss.py``).
* **The micro-step as one CUDA graph** (``train.cuda_graphs``, ``--cuda-graphs``): after three eager micro-steps, each
  micro-batch's forward and backward is replayed from one captured graph (:class:`diffattn.cuda_graphs.
  GraphedMicroSteps`), Trainer's clipping, AdamW and zeroing eager around it. Batches run without their attention
  mask where every training row is padded at its end only, as packed data is (a causal model's scored positions are
  the same without it: SDPA's ``is_causal``); otherwise a padded batch runs eagerly. The loss is the model's own over
  every position (the scored-positions loss picks its positions on the host: the same loss, more FLOPs, on
  retrieval-heavy data). ``diffattn adapt --cuda-graphs`` too.

Output folder layout: ``run.yaml``, ``metrics.jsonl``, ``checkpoints/checkpoint-N/``, ``final/``,
``summary.json``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
from functools import partial
from pathlib import Path

import torch
from accelerate import PartialState
from accelerate.utils import broadcast_object_list
from safetensors import safe_open
from transformers import Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_callback import ProgressCallback

from ..cuda_graphs import GraphedMicroSteps, torch_compile_mode
from ..data.packing import FlatteningCollator
from ..environment import environment
from ..files import (
    RUN_CONFIG,
    NoSpaceError,
    check_removable,
    claim_id,
    contents,
    dangling_link,
    empty_folder,
    lock_folder,
    lock_holder,
    mark,
    publish_folder,
    release_folder,
    save_record,
    write_text_atomic,
    writing,
)
from ..lambdas import lambda_per_layer
from ..models.architectures import ARCHITECTURES
from ..models.build import build_model
from ..models.decay import decayed_parameter_names
from ..models.presets import get_preset
from ..models.pretrained import tensor_mismatch
from .config import (
    CHECKPOINTS,
    RunConfig,
    RunFolderError,
    checkpoint_dirs,
    checkpoint_step,
    resume_differences,
)
from .data import PackedDataset, prepare_data
from .tracking import lambda_logs, report_to, tracker_environment

logger = logging.getLogger(__name__)

STAGING = ".staging"
FINAL = "final"
METRICS = "metrics.jsonl"


# A batch scoring at most this share of its positions takes the scored-positions loss (scored_positions_loss); a
# text batch (every position scored) takes the model's own.
SCORED_POSITIONS_SHARE = 0.5


def _plain_causal_lm_forwards() -> frozenset:
    """The forwards that compute ``lm_head(self.model(...).last_hidden_state)`` and nothing else (transformers'
    Llama and DiffLlama, which our DIFF V1 and V2 models inherit): the scored-positions loss reproduces them."""
    from transformers import DiffLlamaForCausalLM, LlamaForCausalLM

    return frozenset({LlamaForCausalLM.forward, DiffLlamaForCausalLM.forward})


_PLAIN_CAUSAL_LM_FORWARDS = _plain_causal_lm_forwards()


def lr_factor(step: int, *, warmup_steps: int, decay_steps: int, decay: str, min_lr_ratio: float) -> float:
    """The learning rate of optimizer step ``step`` (from 0) as a fraction of the peak (``train.lr``): a linear warmup
    over the first ``warmup_steps`` steps (step s at (s+1)/warmup_steps, so the first step is not spent at rate 0),
    then ``decay`` (linear | cosine) over ``decay_steps`` to ``min_lr_ratio``, held there.

    transformers' ``warmup_stable_decay``, which this replaces, starts its warmup at ``min_lr_ratio``·peak: 4% at the
    default, and at ``min_lr_ratio`` 1 (a constant rate) no warmup at all, whatever ``train.warmup_steps`` said
    (found when a constant-rate MQAR pilot with warmup 50 and with warmup 200 trained identically)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, decay_steps))
    shape = 1.0 - progress if decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return min_lr_ratio + (1.0 - min_lr_ratio) * shape


def _row_average(per_token: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
    """``train.loss_average: row``: each row's mean over its scored positions, averaged over the rows that have
    any."""
    scored = scored.float()
    count = scored.sum(1)
    per_row = (per_token * scored).sum(1) / count.clamp(min=1)
    has_labels = (count > 0).float()
    return (per_row * has_labels).sum() / has_labels.sum().clamp(min=1)


def scored_positions_loss(model, inputs: dict, loss_average: str = "token", num_items_in_batch=None) -> torch.Tensor:
    """The loss a plain causal LM's own forward gives on ``inputs`` (its token average — over
    ``num_items_in_batch`` when given, as transformers' ForCausalLMLoss — or ``loss_average="row"``), with the
    vocabulary projection and softmax computed only at the scored positions: an MQAR batch scores about a tenth of
    them, and the projection onto 2,048 tokens is about a third of a ``quick`` model's FLOPs per position."""
    rest = {k: v for k, v in inputs.items() if k != "labels"}
    hidden = model.model(**rest).last_hidden_state[:, :-1]
    target = inputs["labels"][:, 1:]
    scored = target != -100
    logits = model.lm_head(hidden[scored]).float()
    per_token = torch.nn.functional.cross_entropy(logits, target[scored], reduction="none")
    if loss_average == "row":
        full = torch.zeros(target.shape, dtype=per_token.dtype, device=per_token.device)
        return _row_average(full.masked_scatter(scored, per_token), scored)
    if num_items_in_batch is not None:
        return per_token.sum() / num_items_in_batch
    return per_token.mean() if per_token.numel() else per_token.sum()


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite; nothing of that step was saved."""


def read_metrics(path: Path) -> list[dict]:
    """metrics.jsonl records; for a resumed run the last record of each (step, kind) wins."""
    if not path.is_file():
        return []
    latest: dict[tuple[int, str], dict] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            latest[(rec["step"], "eval" if "val_loss" in rec else "train")] = rec
    return [latest[k] for k in sorted(latest)]


class MetricsCallback(TrainerCallback):
    """Appends one JSON line per log/eval to ``metrics.jsonl`` and stops on a non-finite loss."""

    def __init__(self, path: Path, tokens_per_step: int, lambdas=lambda_per_layer):
        # lambdas: model -> λ per layer or None (DIFF layers by default; adapters pass adapter_lambdas)
        self.path, self.tokens_per_step, self.lambdas = path, tokens_per_step, lambdas
        self._train_seconds, self._steps_timed, self._t0 = 0.0, 0, None
        # every step this process took, timed without evaluation or saving: the summary's tokens_per_s
        self.total_seconds, self.total_steps = 0.0, 0

    def on_step_begin(self, args, state, control, **kwargs):
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if self._t0 is not None:
            seconds = time.perf_counter() - self._t0
            self._train_seconds += seconds
            self._steps_timed += 1
            self.total_seconds += seconds
            self.total_steps += 1

    def on_log(self, args, state, control, logs=None, model=None, **kwargs):
        logs = logs or {}
        entry: dict = {"step": state.global_step}
        if "loss" in logs:
            loss = float(logs["loss"])
            if not math.isfinite(loss):
                raise NonFiniteLossError(f"training loss became {loss} at step {state.global_step}")
            entry.update(loss=loss, lr=logs.get("learning_rate"), grad_norm=logs.get("grad_norm"))
            if self._steps_timed:
                entry["tokens_per_s"] = self.tokens_per_step * self._steps_timed / self._train_seconds
                self._train_seconds, self._steps_timed = 0.0, 0
            lam = self.lambdas(model) if model is not None else None
            if lam is not None:
                entry["lambda"] = lam
        if "eval_loss" in logs:
            entry.update(val_loss=float(logs["eval_loss"]), val_ppl=math.exp(min(float(logs["eval_loss"]), 50.0)))
        if len(entry) > 1 and state.is_world_process_zero:
            with self.path.open("a") as f:
                f.write(json.dumps(entry) + "\n")


class QuietProgressCallback(ProgressCallback):
    """transformers' progress bar without the dict it prints at every logging step (1,966 lines in one quickstart):
    the bar shows the last loss instead, and every logged value goes to the run's ``metrics.jsonl``
    (:class:`MetricsCallback`), its one home."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and self.training_bar is not None and logs and "loss" in logs:
            self.training_bar.set_postfix(loss=f"{float(logs['loss']):.3f}", refresh=False)


class DiffattnTrainer(Trainer):
    """``Trainer`` whose checkpoints appear atomically in ``checkpoints/`` (see the module docstring).

    ``loss_average="row"`` (``train.loss_average``) averages the training loss per sequence first, then over the
    sequences of the batch, instead of over all scored tokens: a retrieval row scores 2–4 answer tokens and a text row
    ~all of its tokens, so with token averaging the answers get a few percent of the gradient however many
    retrieval rows the mix holds; per-row averaging gives each row kind its share of rows. Validation loss is
    always the token average (the text rows are full, so it is the same number)."""

    def __init__(
        self,
        *args,
        run_dir: Path,
        keep_checkpoints: int,
        loss_average: str = "token",
        checkpoint_tokenizer=None,
        cuda_graphs: bool = False,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        # train.cuda_graphs: the micro-steps replayed from one graph (graphed_training_step), made at the first step
        self.cuda_graphs = cuda_graphs
        self.graphed: GraphedMicroSteps | None = None
        self._graphed_accumulation: int | None = None  # the accumulation steps the loss was divided by at capture
        # the training rows padded at their ends only (read once, on the host): a graphed batch needs no mask
        self._masks_droppable = (
            cuda_graphs
            and isinstance(self.train_dataset, PackedDataset)
            and right_padded(self.train_dataset.packed.attention_mask)
        )
        if self.pop_callback(ProgressCallback) is not None:  # its bar, without a dict per logging step
            self.add_callback(QuietProgressCallback)
        self.run_dir, self.keep_checkpoints = run_dir, keep_checkpoints
        # saved into every checkpoint with the run's run.yaml, so `diffattn eval RUN/checkpoints/checkpoint-N` reads a
        # checkpoint as it reads final/ (not Trainer's processing_class: that would also change its default collator)
        self.checkpoint_tokenizer = checkpoint_tokenizer
        self.loss_average = loss_average
        if loss_average == "row":
            # our loss is a mean per micro-batch, so Trainer must divide it by the accumulation steps: say so both
            # ways (loss_is_scaled_for_ga from transformers 5.19; model_accepts_loss_kwargs before it)
            self.loss_is_scaled_for_ga = False
            self.model_accepts_loss_kwargs = False

    def get_decay_parameter_names(self, model) -> list[str]:
        return decayed_parameter_names(model)  # Trainer's rule, with the norms it does not know (models.decay)

    def _issue_warnings_after_load(self, load_result) -> None:
        """A resumed run's checkpoint holds a tied ``lm_head.weight`` once, as the input embeddings; transformers 5.x
        Trainer skips its "missing keys" warning only for ``_keys_to_ignore_on_save``, so every resume of a tied model
        warned that ``lm_head.weight`` was missing. A key the model ties (``_tied_weights_keys``) to a parameter that is
        the same tensor was loaded with it: it is not reported; any other missing key still warns."""
        model = self.accelerator.unwrap_model(self.model)
        model = model.get_base_model() if hasattr(model, "get_base_model") else model
        tied = getattr(model, "_tied_weights_keys", None)
        if isinstance(tied, dict) and load_result.missing_keys:
            params = dict(model.named_parameters(remove_duplicate=False))

            def loaded_through_its_tie(key: str) -> bool:
                source = tied.get(key)
                return key in params and source in params and params[key] is params[source]

            missing = [k for k in load_result.missing_keys if not loaded_through_its_tie(k)]
            load_result = load_result._replace(missing_keys=missing)
        super()._issue_warnings_after_load(load_result)

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        """The run's schedule as :func:`lr_factor` computes it, from the warmup and decay that
        :func:`training_arguments` records in the arguments (any other scheduler type: Trainer's own)."""
        kwargs = self.args.lr_scheduler_kwargs or {}
        if self.lr_scheduler is None and self.args.lr_scheduler_type == "warmup_stable_decay" and kwargs:
            factor = partial(
                lr_factor,
                warmup_steps=self.args.get_warmup_steps(num_training_steps),
                decay_steps=kwargs["num_decay_steps"],
                decay=kwargs["decay_type"],
                min_lr_ratio=kwargs["min_lr_ratio"],
            )
            self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer or self.optimizer, factor)
            self._created_lr_scheduler = True
        return super().create_scheduler(num_training_steps, optimizer)

    def log(self, logs: dict, *args, **kwargs) -> None:
        """Trackers (--report-to) get λ per layer with the loss: the same read-out as metrics.jsonl."""
        if "loss" in logs:
            metrics = next((c for c in self.callback_handler.callbacks if isinstance(c, MetricsCallback)), None)
            if metrics is not None:
                model = self.accelerator.unwrap_model(self.model)
                logs = {**logs, **lambda_logs(metrics.lambdas(model), model)}
        super().log(logs, *args, **kwargs)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.training and not return_outputs and self._scores_few_positions(model, inputs):
            over = num_items_in_batch if self.model_accepts_loss_kwargs else None
            return scored_positions_loss(model, inputs, self.loss_average, over)
        if self.loss_average != "row" or not model.training:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        outputs = model(input_ids=inputs["input_ids"], attention_mask=inputs.get("attention_mask"))
        target = inputs["labels"][:, 1:]
        per_token = torch.nn.functional.cross_entropy(
            outputs.logits[:, :-1].float().transpose(1, 2), target, ignore_index=-100, reduction="none"
        )
        loss = _row_average(per_token, target != -100)
        return (loss, outputs) if return_outputs else loss

    def training_step(self, model, inputs, num_items_in_batch=None):
        if self.cuda_graphs:
            return self.graphed_training_step(model, inputs, num_items_in_batch)
        return super().training_step(model, inputs, num_items_in_batch)

    #: the name the loss's divisor (transformers' ``num_items_in_batch``) travels under among a graphed step's inputs
    NUM_ITEMS = "__num_items_in_batch"

    def graphed_training_step(self, model, inputs, num_items_in_batch=None):
        """Trainer's micro-step replayed from one CUDA graph (``train.cuda_graphs``; the module docstring), without
        the batch's attention mask and with the loss's divisor a tensor among the graph's inputs. The mask is left out
        where the training rows are padded only at their ends (:func:`right_padded`, read once on the host: a tail of
        padding changes no scored position of a causal model, and its positions score nothing); else a batch with any
        padding (read on the host, a sync a step) runs eagerly, as does every batch once the accumulation steps differ
        from the capture's (the loss is divided by them as a number)."""
        inputs = self._prepare_inputs(inputs)
        mask = inputs.get("attention_mask")
        padded = mask is not None and not self._masks_droppable and not bool(mask.all())
        changed = self._graphed_accumulation not in (None, self.current_gradient_accumulation_steps)
        if padded or changed:
            return super().training_step(model, inputs, num_items_in_batch)
        tensors = {k: v for k, v in inputs.items() if k != "attention_mask"}
        if num_items_in_batch is not None:
            tensors[self.NUM_ITEMS] = torch.as_tensor(num_items_in_batch, device=tensors["input_ids"].device)
        if self.graphed is None:
            self._graphed_accumulation = self.current_gradient_accumulation_steps

            def micro_step(given: dict) -> torch.Tensor:
                batch = {k: v for k, v in given.items() if k != self.NUM_ITEMS}
                return Trainer.training_step(self, model, batch, given.get(self.NUM_ITEMS))

            # no mask in any replayed batch: transformers' masks as in the eager warm-up (none: SDPA's is_causal)
            self.graphed = GraphedMicroSteps(micro_step, model.parameters(), masks_from_warm_up=True)
        return self.graphed(tensors)

    def _scores_few_positions(self, model, inputs) -> bool:
        """Whether this training batch takes the scored-positions loss: at most :data:`SCORED_POSITIONS_SHARE` of its
        positions scored (an MQAR or answer-only needle batch), one process, and a model whose forward is HF's
        ``lm_head(model(...).last_hidden_state)`` and nothing more (Llama's or DiffLlama's, as ours inherit; not
        wrapped by DDP, PEFT or torch.compile): anything else takes the model's own loss."""
        labels = inputs.get("labels")
        if labels is None or self.accelerator.num_processes != 1 or self.label_smoother is not None:
            return False
        if self.cuda_graphs:  # the positions are picked on the host, which a graph cannot do: the model's own loss
            return False
        if self.compute_loss_func is not None or self.accelerator.unwrap_model(model) is not model:
            return False
        if type(model).forward not in _PLAIN_CAUSAL_LM_FORWARDS:
            return False
        return float((labels[:, 1:] != -100).float().mean()) <= SCORED_POSITIONS_SHARE

    def _get_grad_norm(self, model, grad_norm=None):
        # remembered so a checkpoint taken after a non-finite gradient is never published (see _save_checkpoint)
        self.last_grad_norm = super()._get_grad_norm(model, grad_norm=grad_norm)
        return self.last_grad_norm

    def _save_checkpoint(self, model, trial):
        grad_norm = getattr(self, "last_grad_norm", None)
        grad_norm = float(grad_norm) if grad_norm is not None else None
        if grad_norm is not None and not math.isfinite(grad_norm):
            raise NonFiniteLossError(
                f"gradient norm became {grad_norm} at step {self.state.global_step}; its checkpoint was not saved"
            )
        name = f"checkpoint-{self.state.global_step}"
        staged = Path(self.args.output_dir) / name
        intact = "the checkpoints before it are kept (this one was removed); free space and continue with --resume"
        try:
            with writing(staged, f"the step-{self.state.global_step} checkpoint", intact):
                super()._save_checkpoint(model, trial)  # into args.output_dir = .staging/
                self.accelerator.wait_for_everyone()
                if self.args.should_save and self.checkpoint_tokenizer is not None and staged.is_dir():
                    self.checkpoint_tokenizer.save_pretrained(staged)
                    shutil.copyfile(self.run_dir / RUN_CONFIG, staged / RUN_CONFIG)
        except NoSpaceError:
            if self.args.should_save:
                shutil.rmtree(staged, ignore_errors=True)  # a partial checkpoint frees its space and is never read
            raise
        problem = None
        # FSDP checkpoints have accelerate's sharded layout (optimizer.bin, *_fsdp_* folders), which
        # checkpoint_problem does not know: they are published unchecked
        if self.args.should_save and not self.is_fsdp_enabled:
            problem = checkpoint_problem(staged)
        problem = broadcast_object_list([problem])[0]  # every process takes the main one's decision
        if problem is not None:  # e.g. NaN weights one step before the loss shows it: never published
            if self.args.should_save:
                shutil.rmtree(staged, ignore_errors=True)
            error = NonFiniteLossError if "non-finite" in problem else RuntimeError
            raise error(f"checkpoint at step {self.state.global_step} not saved: {problem}")
        if self.args.should_save:
            final = self.run_dir / CHECKPOINTS / name
            final.parent.mkdir(parents=True, exist_ok=True)
            publish_folder(staged, final)  # atomic: an earlier folder of that name is replaced only once this is in
            rotate_checkpoints(self.run_dir, self.keep_checkpoints, newest_complete=final)
        self.accelerator.wait_for_everyone()


def rotate_checkpoints(run_dir: Path, keep: int, *, newest_complete: Path | None = None) -> list[Path]:
    """Delete all but the ``keep`` newest checkpoints — never the newest *complete* one, even when newer folders
    are corrupt (``newest_complete``: one already known complete, e.g. just verified). Returns what was deleted."""
    ordered = sorted(_checkpoint_dirs(run_dir), key=_step, reverse=True)
    kept = ordered[:keep]
    if newest_complete is None or newest_complete not in kept:
        newest_complete = next((c for c in ordered if checkpoint_problem(c) is None), None)
    if newest_complete is not None and newest_complete not in kept:
        kept.append(newest_complete)
    deleted = [c for c in ordered if c not in kept]
    for old in deleted:
        shutil.rmtree(old, ignore_errors=True)
    return deleted


_step, _checkpoint_dirs = checkpoint_step, checkpoint_dirs  # home: .config, by the resume rule


RESUME_STATE = ("trainer_state.json", "optimizer.pt", "scheduler.pt")  # what Trainer needs to resume exactly


def checkpoint_problem(path: Path) -> str | None:
    """Why a checkpoint folder cannot be resumed from, or ``None`` if every file ``--resume`` loads is complete:
    the weights (readable and finite), the optimizer, scheduler and RNG states (whole archives: ``torch.save``
    writes zip files, whose checksums catch truncation) and the trainer state (valid JSON)."""
    import zipfile

    for required in RESUME_STATE:
        f = path / required
        if not f.is_file() or f.stat().st_size == 0:
            return f"{required} is missing or empty"
    weights = sorted(path.glob("*.safetensors"))
    if not weights:
        return "no *.safetensors weights"
    for w in weights:
        try:
            with safe_open(w, framework="pt") as f:
                for key in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    t = f.get_tensor(key)
                    if t.is_floating_point() and not torch.isfinite(t).all():
                        return f"{w.name} holds non-finite values ({key})"
        except Exception as e:  # truncated or corrupt file
            return f"{w.name} is unreadable ({type(e).__name__}: {e})"
    for state in ["optimizer.pt", "scheduler.pt", *sorted(p.name for p in path.glob("rng_state*.pth"))]:
        try:
            with zipfile.ZipFile(path / state) as z:
                bad = z.testzip()
            if bad is not None:
                return f"{state} is corrupt ({bad})"
        except (zipfile.BadZipFile, OSError, EOFError) as e:
            return f"{state} is unreadable ({type(e).__name__}: {e})"
    try:
        json.loads((path / "trainer_state.json").read_text())
    except json.JSONDecodeError as e:
        return f"trainer_state.json is not valid JSON ({e})"
    return None


def resume_problem(path: Path) -> str | None:
    """What :func:`checkpoint_problem` cannot see without loading: the optimizer and scheduler states must load as
    Trainer loads them (``torch.load``, weights only) and be states. ``None`` when they are (or are not there: an
    FSDP checkpoint's layout)."""
    for name in ("optimizer.pt", "scheduler.pt"):
        if not (path / name).is_file():
            continue
        try:
            state = torch.load(path / name, map_location="cpu", weights_only=True)
        except Exception as e:  # not an archive torch wrote, or one holding something else
            return f"{name} cannot be loaded ({type(e).__name__}: {' '.join(str(e).split())[:200]})"
        if not isinstance(state, dict):
            return f"{name} holds a {type(state).__name__}, not a saved state"
        if name == "optimizer.pt" and not (
            isinstance(state.get("state"), dict)
            and isinstance(state.get("param_groups"), list)
            and all(isinstance(g, dict) and "params" in g for g in state["param_groups"])
        ):
            return f"{name} is not an optimizer state (no state and param_groups)"
    return None


def checkpoint_mismatch(path: Path, model) -> str | None:
    """Why the checkpoint at ``path`` cannot be loaded into ``model`` as it is, found before anything is written (a
    resume that failed inside Trainer had rewritten run.yaml): a weight of another shape or dtype than the model's
    (a checkpoint cast to float16 would resume silently in float16 otherwise), or an RNG state that only loads by
    running pickled code (``weights_only`` refuses it). ``None`` when it fits."""
    found = tensor_mismatch(path, {k: (tuple(v.shape), v.dtype) for k, v in model.state_dict().items()})
    if found is not None:
        file, key, what, have, want = found
        if what == "shape":
            return f"{file}: {key} has shape {list(have)}, the model's is {list(want)}"
        return f"{file}: {key} is {have}, the run trains {want} (a cast checkpoint)"
    from transformers.trainer_pt_utils import safe_globals  # the numpy types Trainer allows, as it loads them

    for rng in sorted(path.glob("rng_state*.pth")):
        try:
            with safe_globals():
                torch.load(rng, map_location="cpu", weights_only=True)
        except Exception as e:  # a pickle that runs code, or not an archive at all
            return f"{rng.name} does not load as plain tensors ({type(e).__name__}: {' '.join(str(e).split())[:160]})"
    return None


def check_checkpoint_fits(run_dir: Path, checkpoint: Path | None, model) -> None:
    """Refuse a resume whose checkpoint does not fit the model (:func:`checkpoint_mismatch`), naming it; nothing has
    been written yet."""
    problem = checkpoint_mismatch(checkpoint, model) if checkpoint is not None else None
    if problem:
        raise RunFolderError(
            f"cannot resume {str(run_dir)!r} from {checkpoint.name}: {problem}; nothing was changed (move that "
            "checkpoint folder away to resume from the one before it)"
        )


def finished_summary(run_dir: Path, checkpoint: Path | None, max_steps: int) -> dict | None:
    """The saved summary of a finished run asked to resume to a budget it has already reached (its checkpoint at
    ``max_steps`` or beyond, and summary.json written): there is nothing to train, and nothing is changed."""
    summary_file = run_dir / "summary.json"
    if checkpoint is None or _step(checkpoint) < max_steps or not summary_file.is_file():
        return None
    try:
        summary = json.loads(summary_file.read_text())
    except (OSError, ValueError) as e:
        raise RunFolderError(
            f"{summary_file} cannot be read ({e}); the run is finished at step {_step(checkpoint)}"
        ) from None
    if not isinstance(summary, dict) or summary.get("steps") != _step(checkpoint):
        # (not the result of its newest checkpoint: a planned extension was stopped after it; the checkpoint is
        # loaded, evaluated and saved as the run's result by train_from. Stop 86's note: the older result was returned)
        return None
    logger.warning("%s is finished at step %d (max_steps %d): nothing to resume, nothing changed", run_dir,
                   _step(checkpoint), max_steps)  # fmt: skip
    return summary


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest checkpoint that passes :func:`checkpoint_problem`; corrupt ones are skipped with a warning."""
    for path in sorted(_checkpoint_dirs(run_dir), key=_step, reverse=True):
        problem = checkpoint_problem(path)
        if problem is None:
            return path
        logger.warning("skipping checkpoint %s: %s", path, problem)
    return None


def _precision(config: RunConfig) -> bool:
    """True for bf16 (GPU default), False for fp32 (CPU default: bf16 is ~30x slower there)."""
    if config.train.precision == "auto":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if config.train.precision == "bf16" and not torch.cuda.is_available():
        logger.warning("train.precision=bf16 on CPU is very slow; fp32 is recommended")
    return config.train.precision == "bf16"


def _world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def distribution(config) -> dict:
    """How the run was spread over processes, as it really ran (recorded in ``summary.json``)."""
    world = _world_size()
    strategy = "fsdp" if config.train.fsdp else ("ddp" if world > 1 else "single process")
    return {"strategy": strategy, "processes": world}


def training_arguments(config: RunConfig, run_dir: Path) -> TrainingArguments:
    t = config.train
    world = _world_size()
    if t.fsdp and not torch.cuda.is_available():
        # transformers' Trainer would fall back to DDP (or fail) without saying so, while run.yaml said fsdp
        raise ValueError(
            "train.fsdp (--fsdp) needs CUDA GPUs under torchrun (transformers' Trainer shards with FSDP2 through "
            "accelerate there); this machine has none: drop it (torchrun without it runs DDP, same losses), or "
            "shard on CPU processes with diffattn.train.sharded (FSDP2 over gloo, README 'Training on a cluster')"
        )
    per_device, rem = divmod(t.global_batch_size, world * t.grad_accum)
    if rem or per_device < 1:
        raise ValueError(
            f"train.global_batch_size={t.global_batch_size} must be divisible by processes ({world}) × "
            f"train.grad_accum ({t.grad_accum})"
        )
    return TrainingArguments(
        output_dir=str(run_dir / STAGING),
        max_steps=t.max_steps,
        per_device_train_batch_size=per_device,
        per_device_eval_batch_size=per_device,
        gradient_accumulation_steps=t.grad_accum,
        learning_rate=t.lr,
        weight_decay=t.weight_decay,
        adam_beta1=t.beta1,
        adam_beta2=t.beta2,
        max_grad_norm=t.grad_clip,
        lr_scheduler_type="warmup_stable_decay",
        # no stable phase: warmup, then decay straight to min_lr_ratio·lr at schedule_steps (a run with fewer
        # max_steps stops part-way); the rates themselves are lr_factor's (DiffattnTrainer.create_scheduler reads
        # these arguments; its warmup rises from the first step, not from min_lr_ratio·lr as transformers' does)
        lr_scheduler_kwargs={
            "num_decay_steps": t.resolved_schedule_steps - t.resolved_warmup_steps,
            "decay_type": t.schedule,
            "min_lr_ratio": t.min_lr_ratio,
        },
        warmup_steps=t.resolved_warmup_steps,
        logging_steps=t.log_every,
        logging_nan_inf_filter=False,  # a NaN must reach our callback, not be averaged away
        eval_strategy="steps",
        eval_steps=t.eval_every,
        save_strategy="steps",
        save_steps=t.save_every,
        save_total_limit=None,  # rotation happens in checkpoints/, after the atomic publish
        seed=t.seed,
        data_seed=t.seed,
        bf16=_precision(config),
        use_cpu=not torch.cuda.is_available(),
        report_to=report_to(),  # diffattn.train.tracking: --report-to
        dataloader_num_workers=0,
        remove_unused_columns=False,
        fsdp="full_shard auto_wrap" if t.fsdp else "",
        ddp_find_unused_parameters=False,
        disable_tqdm=False,
        # train.compile: Trainer compiles the model (accelerate's dynamo plugin)
        torch_compile=t.compile is not None,
        torch_compile_backend=t.compile_backend if t.compile is not None else None,
        torch_compile_mode=torch_compile_mode(t.compile),
    )


def check_run_dir(
    run_dir: Path, config: RunConfig, *, resume: bool, overwrite: bool, compared_elsewhere: tuple[str, ...] = ()
) -> Path | None:
    """Check the output folder against the request, changing nothing (every process runs it before any
    writes); returns the checkpoint to resume from, or None. ``compared_elsewhere``: dotted settings
    (``"method.options"``) the caller compares itself on resume, in resolved form."""
    if resume and overwrite:
        raise RunFolderError("--resume and --overwrite exclude each other")
    problem = dangling_link(run_dir, "output folder", "name a folder (new, empty, or a run's)")
    if problem:
        raise RunFolderError(problem)
    if run_dir.exists() and not run_dir.is_dir():
        raise RunFolderError(f"output folder {str(run_dir)!r} is a file: name a folder (new, empty, or a run's)")
    holder = lock_holder(run_dir)
    if holder:
        raise RunFolderError(
            f"output folder {str(run_dir)!r} is in use by {holder}: wait for it to finish, or choose another --out"
        )
    if overwrite:
        check_removable(run_dir, kind="run")
    saved = run_dir / RUN_CONFIG
    if resume:
        if not saved.is_file():
            raise RunFolderError(f"nothing to resume in {str(run_dir)!r}: it has no {RUN_CONFIG}")
        checkpoint = latest_checkpoint(run_dir)
        diff = resume_differences(
            type(config).load(saved),
            config,
            trained_steps=_step(checkpoint) if checkpoint is not None else 0,
            finished=(run_dir / "summary.json").is_file(),
            elsewhere=compared_elsewhere,
        )
        if diff:
            raise RunFolderError(f"--resume with settings that differ from the saved run ({'; '.join(diff)})")
        problem = resume_problem(checkpoint) if checkpoint is not None else None
        if problem:  # found now, before anything is written, not by Trainer after run.yaml was rewritten
            raise RunFolderError(
                f"cannot resume {str(run_dir)!r} from {checkpoint.name}: {problem}; nothing was changed (move that "
                "checkpoint folder away to resume from the one before it)"
            )
        return checkpoint
    if contents(run_dir) and not overwrite:
        raise RunFolderError(
            f"output folder {str(run_dir)!r} exists and is not empty: pass --resume to "
            f"continue that run or --overwrite to replace it"
        )
    return None


def start_run_folder(
    run_dir: Path, config, *, overwrite: bool, checkpoint: Path | None, command: str, resume: bool | None = None
) -> None:
    """The first writes of a run, once its inputs are known good (main process only): take the folder's lock (held
    to the end of the run: a second run into it is refused), empty the old folder (``--overwrite``; only a run
    diffattn provably made), mark the folder as a run's, save its settings with the run's identity, and on a resume
    drop ``metrics.jsonl`` lines after the resumed step (they are logged again). ``resume=False`` (a new run):
    refused if another process filled the folder since :func:`check_run_dir` saw it empty."""
    lock_folder(run_dir, command=f"diffattn {command}")
    if overwrite:
        empty_folder(run_dir, kind="run")
    elif resume is False and contents(run_dir):
        raise RunFolderError(
            f"output folder {str(run_dir)!r} was filled by another run after it was checked: choose another --out"
        )
    ident = claim_id(run_dir, "run")  # a resumed run keeps its identity; a marker without one gets one
    mark(run_dir, "run", ident=ident, command=command)
    save_record(config, run_dir / RUN_CONFIG, ident)
    metrics = run_dir / METRICS
    if metrics.is_file():
        resumed = _step(checkpoint) if checkpoint is not None else 0
        lines = [ln for ln in metrics.read_text().splitlines() if ln.strip()]
        kept = [ln for ln in lines if _logged_step(ln) <= resumed]
        if len(kept) != len(lines):
            write_text_atomic(metrics, "".join(ln + "\n" for ln in kept))


def _logged_step(line: str) -> float:
    try:
        return json.loads(line).get("step", 0)
    except json.JSONDecodeError:  # a line cut short by a crash: dropped
        return math.inf


def pretrain(
    config: RunConfig,
    run_dir: str | os.PathLike,
    *,
    resume: bool = False,
    overwrite: bool = False,
    callbacks: list[TrainerCallback] | None = None,
) -> dict:
    """Train one model (``config.model.attention`` is one architecture of the table); return its summary."""
    config.validate()
    if config.model.attention not in ARCHITECTURES:
        raise ValueError(
            f"pretrain trains one model: model.attention must be one of {', '.join(ARCHITECTURES)} "
            f"(use pretrain_paired for {config.model.attention!r})"
        )
    run_dir = Path(run_dir)
    args = training_arguments(config, run_dir)  # also sets up the process group under torchrun
    check_cuda_graphs(config, args)
    state = PartialState()
    checkpoint = check_run_dir(run_dir, config, resume=resume, overwrite=overwrite)
    done = finished_summary(run_dir, checkpoint, config.train.max_steps) if resume else None
    if done is not None:
        return done
    check_model_settings(config)
    with args.main_process_first(desc="tokenizer and data"):  # rank 0 trains/caches the tokenizer first
        data = prepare_data(config)
    tok = data.tokenizer
    model = _run_model(config, tok)
    check_checkpoint_fits(run_dir, checkpoint, model)
    # only now, with data, model and checkpoint known to be good, is anything written (a failed start leaves nothing)
    state.wait_for_everyone()  # every process has checked before the main one changes anything
    if state.is_main_process:
        start_run_folder(run_dir, config, overwrite=overwrite, checkpoint=checkpoint, command="pretrain", resume=resume)
    state.wait_for_everyone()
    n_params = sum(p.numel() for p in model.parameters())
    logger.info(
        "%s model: %s parameters; %d training sequences of %d tokens",
        config.model.attention,
        f"{n_params:,}",
        data.train.input_ids.shape[0],
        config.data.seq_len,
    )

    tokens_per_step = config.train.global_batch_size * config.data.seq_len
    metrics = MetricsCallback(run_dir / METRICS, tokens_per_step)
    with tracker_environment(run_dir):
        trainer = DiffattnTrainer(
            model=model,
            args=args,
            train_dataset=PackedDataset(data.train),
            eval_dataset=PackedDataset(data.val),
            data_collator=FlatteningCollator() if config.data.packing else None,  # data.packing: documents apart
            callbacks=[metrics, *(callbacks or [])],
            run_dir=run_dir,
            keep_checkpoints=config.train.keep_checkpoints,
            loss_average=config.train.loss_average,
            checkpoint_tokenizer=tok,
            cuda_graphs=config.train.cuda_graphs,
        )
    t0 = time.perf_counter()
    if resume and checkpoint is None:
        logger.warning("no valid checkpoint in %s: starting from step 0", run_dir)
    train_from(trainer, checkpoint, config.train.max_steps)
    wall = time.perf_counter() - t0
    final_eval = _final_eval(trainer)
    summary = {
        "attention": config.model.attention,
        "preset": config.model.preset,
        "parameters": n_params,
        "steps": trainer.state.global_step,
        "final_val_loss": final_eval["eval_loss"],
        "final_val_ppl": math.exp(min(final_eval["eval_loss"], 50.0)),
        "tokens_per_s": training_throughput(trainer, run_dir),
        "wall_seconds": wall,
        "lambda": lambda_per_layer(model),
        "distributed": distribution(config),
        "data": data.info,
        "model_type": model.config.model_type,
        "report_to": [r for r in report_to() if r != "none"],
        "environment": environment(),  # the same seed trains another model on another CPU kind
    }
    if trainer.args.should_save:
        _save_final(trainer, tok, config, run_dir, summary)
        write_text_atomic(run_dir / "summary.json", json.dumps(summary, indent=2))
        shutil.rmtree(run_dir / STAGING, ignore_errors=True)
    release_folder(run_dir)  # (a run that fails keeps it until its process ends, or resumes in this process)
    return summary


def check_cuda_graphs(config, args: TrainingArguments) -> None:
    """Why ``train.cuda_graphs`` (of a :class:`RunConfig` or an ``AdaptRunConfig``) cannot run with these training
    arguments (a ValueError), or nothing: it replays CUDA graphs on one GPU."""
    if not config.train.cuda_graphs:
        return
    if args.device.type != "cuda":
        raise ValueError(f"train.cuda_graphs replays CUDA graphs: this run's device is {args.device}")
    if _world_size() > 1:
        raise ValueError(
            f"train.cuda_graphs runs on one GPU: this run has {_world_size()} processes (DDP's and FSDP's "
            "communication inside a captured backward is not supported here)"
        )
    if args.n_gpu > 1:
        raise ValueError(
            f"train.cuda_graphs runs on one GPU: this process sees {args.n_gpu}, which Trainer would drive by "
            "nn.DataParallel (its replicas cannot be captured); choose one with CUDA_VISIBLE_DEVICES"
        )


def right_padded(attention_mask: torch.Tensor) -> bool:
    """Whether every row of a [rows, seq_len] 0/1 ``attention_mask`` is padded at its end only (ones, then zeros):
    then a causal model's positions before the padding are computed as without the mask."""
    mask = attention_mask.bool()
    return bool((mask == attention_mask).all()) and bool((mask[:, 1:] <= mask[:, :-1]).all())


def check_model_settings(config: RunConfig) -> None:
    """Every check that building the run's model makes, before any data is read or any model of a paired run is
    trained: the model built on the ``meta`` device (nothing allocated; its vocabulary comes later, from the
    tokenizer), and the sequence length against its positions. A DIFF arm's bad ``lambda_init`` or odd
    ``num_kv_heads`` was found after the corpus was tokenised, and after the whole baseline of a paired run had
    trained (a review, 2026-12-03)."""
    options = {"backend": None, **{k: getattr(config.model, k) for k in ARCHITECTURES[config.model.attention].options}}
    with torch.device("meta"):
        build_model(config.model.preset, config.model.attention, **options, **config.model.overrides)
    _check_seq_len(config)


def _check_seq_len(config: RunConfig) -> None:
    max_pos = get_preset(config.model.preset, **config.model.overrides).max_position_embeddings
    if config.data.seq_len > max_pos:
        raise ValueError(
            f"data.seq_len={config.data.seq_len} exceeds the model's maximum of {max_pos} positions "
            f"(preset {config.model.preset!r}); lower it (--seq-len {max_pos}, or data.seq_len in the config) or "
            "override max_position_embeddings"
        )


def _run_model(config: RunConfig, tokenizer) -> torch.nn.Module:
    """The run's model: its architecture's row built with the model.* settings the row takes, the vocabulary and
    special tokens of the run's tokenizer, and the run's seed."""
    options = {"backend": None, **{k: getattr(config.model, k) for k in ARCHITECTURES[config.model.attention].options}}
    model = build_model(
        config.model.preset,
        config.model.attention,
        **options,
        seed=config.train.seed,
        **{**config.model.overrides, "vocab_size": len(tokenizer)},
    )
    model.config.bos_token_id = model.config.eos_token_id = tokenizer.eos_token_id
    model.config.pad_token_id = tokenizer.pad_token_id
    return model


def train_from(trainer: Trainer, checkpoint: Path | None, max_steps: int) -> bool:
    """``trainer.train``, resumed from ``checkpoint``. A checkpoint already at ``max_steps`` — a run stopped after its
    last checkpoint but before its summary (a crash in the final evaluation or save) — is only loaded, weights and
    state: transformers' Trainer took one more step from it, and a 4-step run resumed so ended at step 5. Returns
    True when it only loaded."""
    if checkpoint is not None and _step(checkpoint) >= max_steps:
        from transformers.trainer_callback import TrainerState

        logger.warning("%s is at step %d of %d: loaded, not trained further", checkpoint, _step(checkpoint), max_steps)
        trainer._load_from_checkpoint(str(checkpoint))
        trainer.state = TrainerState.load_from_json(str(checkpoint / "trainer_state.json"))
        return True
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    return False


def training_throughput(trainer: Trainer, run_dir: Path) -> float | None:
    """The summary's ``tokens_per_s``: of the steps this process trained, timed as metrics.jsonl's rates are (the
    steps alone: evaluations and checkpoints left out, which on a short run made the baseline look 2× faster than
    DIFF against 3.4× in its steps; a review, 2026-12-03). A resume that only loaded a finished checkpoint
    (:func:`train_from`) trained none: the mean of the rates its earlier process logged stands in, None where none
    was logged. The summary said 0 tokens/s (stop 86's note)."""
    metrics = next(c for c in trainer.callback_handler.callbacks if isinstance(c, MetricsCallback))
    if metrics.total_steps > 0 and metrics.total_seconds > 0:
        return metrics.tokens_per_step * metrics.total_steps / metrics.total_seconds
    rates = [r["tokens_per_s"] for r in read_metrics(run_dir / METRICS) if "tokens_per_s" in r]
    return sum(rates) / len(rates) if rates else None


def _final_eval(trainer: Trainer) -> dict:
    """The evaluation at the last step: reused from the log when the schedule already ran it there."""
    for entry in reversed(trainer.state.log_history):
        if "eval_loss" in entry and entry.get("step") == trainer.state.global_step:
            return entry
    return trainer.evaluate()


def ready_for_inference(model, tokenizer) -> None:
    """What a saved model needs to behave like any Hugging Face model once loaded: the KV cache on
    (``use_cache: true``) and a ``generation_config.json`` whose eos/bos/pad are the tokenizer's, so that
    ``generate`` stops at the end of text (it reads them from there, not from ``config.json``)."""
    model.config.use_cache = True
    for key in ("eos_token_id", "bos_token_id", "pad_token_id"):
        value = getattr(tokenizer, key, None)
        if value is None:
            value = getattr(model.config, key, None)
        if value is not None:
            setattr(model.generation_config, key, value)
            if getattr(model.config, key, None) is None:
                setattr(model.config, key, value)


# what a full disk while writing a run's result leaves intact (the partial copy is removed)
FINAL_INTACT = "its checkpoints are kept; free space and run it again with --resume (it continues from the last one)"


def _save_final(trainer: Trainer, tokenizer, config: RunConfig, run_dir: Path, summary: dict) -> None:
    from ..cards import run_card_fields, write_model_card

    tmp, final = run_dir / (FINAL + ".tmp"), run_dir / FINAL
    shutil.rmtree(tmp, ignore_errors=True)
    model = trainer.accelerator.unwrap_model(trainer.model)
    ready_for_inference(model, tokenizer)
    try:
        with writing(tmp, "the trained model", FINAL_INTACT):
            model.save_pretrained(tmp, state_dict=trainer.accelerator.get_state_dict(trainer.model))
            tokenizer.save_pretrained(tmp)
            config.save(tmp / RUN_CONFIG)
            write_model_card(tmp, **run_card_fields(config, summary, form=FINAL))
    except NoSpaceError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    publish_folder(tmp, final)
