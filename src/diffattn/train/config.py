"""Typed configuration of a pretraining run; ``run.yaml`` mirrors these dataclasses section by section.

Defaults follow DIFF Transformer's training recipe (docs/methods.md §1.6): AdamW β = (0.9, 0.95), weight decay
0.1, linear warmup then linear decay to 4% of the peak learning rate (cosine as an option), gradient
clipping 1.0. The paper's peak learning rates are for 830M–13B models (1.5e-3 … 3.2e-4); our CPU presets
default to 1e-3.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..config import YamlConfig, set_dotted
from ..cuda_graphs import COMPILE_MODES
from ..data.synthetic import CITY_KEYS, NEEDLE_LOSSES
from ..lambdas import check_lambda_init
from ..models.architectures import ARCHITECTURES
from ..models.presets import NORMS, PRESETS
from ..ops import BACKENDS


class _PairedRuns(Mapping):
    """Runs of several architectures on the same data, seed and budget (one folder each, then a comparison):
    ``both`` = the baseline and DIFF, ``all`` = every architecture of the table (read when asked, so a registered
    architecture is in it)."""

    def __getitem__(self, name: str) -> tuple[str, ...]:
        if name == "both":
            return ("standard", "diff")
        if name == "all":
            return tuple(ARCHITECTURES)
        raise KeyError(name)

    def __iter__(self):
        return iter(("both", "all"))

    def __len__(self) -> int:
        return 2


PAIRED = _PairedRuns()

PAIRING = "pairing.json"  # {"pairing": "all", "arms": [...]}: what a paired folder was started as


def recorded_pairing(out: Path) -> str | None:
    """The pairing (``both``, ``all``) a paired run folder was started as, from its :data:`PAIRING`; None where it
    records none (a folder from before it was written, or not a paired run's)."""
    try:
        record = json.loads((Path(out) / PAIRING).read_text())
    except (OSError, ValueError):
        return None
    pairing = record.get("pairing") if isinstance(record, dict) else None
    return pairing if pairing in PAIRED and record.get("arms") == list(PAIRED[pairing]) else None


@dataclass
class ModelConfig:
    preset: str = "tiny"
    attention: str = "diff"  # an architecture (models.architectures: standard, diff, diff-v2) | both | all
    backend: str = "auto"  # backend of the DIFF attention op
    lambda_init: str | float = "exponential"
    norm: str = "rms"
    overrides: dict = field(default_factory=dict)  # preset fields, e.g. {num_layers: 2}

    def validate(self) -> None:
        if self.preset not in PRESETS:
            raise ValueError(f"model.preset: unknown preset {self.preset!r}; allowed: {', '.join(PRESETS)}")
        if self.attention not in (*ARCHITECTURES, *PAIRED):
            raise ValueError(
                f"model.attention must be one of {', '.join((*ARCHITECTURES, *PAIRED))}; got {self.attention!r}"
            )
        if self.backend not in BACKENDS:
            raise ValueError(f"model.backend must be one of {', '.join(BACKENDS)}; got {self.backend!r}")
        if self.norm not in NORMS:
            raise ValueError(f"model.norm must be one of {', '.join(NORMS)}; got {self.norm!r}")
        check_lambda_init(self.lambda_init, "model.lambda_init", low=0.0, high=1.0)


@dataclass
class RetrievalMixFields:
    """The retrieval practice mix (:func:`diffattn.data.retrieval_mix`) of a training data section: pretraining's
    ``data`` and ``diffattn adapt``'s ``data`` share these fields, their defaults and their checks.

    ``max_text_sequences`` caps the text rows (a seeded sample of the packed corpus) before the mix is added, so a
    short run does not generate retrieval rows it will never see (``retrieval_fraction`` is of the capped total)."""

    retrieval_fraction: float = 0.0  # share of training sequences from the retrieval practice mix
    mqar_fraction: float = 0.5  # of those, the share that are MQAR (the rest multi-needle documents)
    max_needles: int = 4  # needle rows hold 1..max_needles needles
    needle_digits: int = 7  # length of the needle numbers (the papers: 7; 2 makes every number one token)
    needle_loss: str = "all"  # all | answer: which tokens of a needle row are scored
    max_text_sequences: int | None = None  # use at most this many text rows (seeded sample); the mix is sized on them
    varied_context: bool = False  # needle rows' haystack: a uniform fraction of the row (True) or the whole row
    mqar_pairs: list[int] | None = None  # MQAR rows' pair counts, one drawn per row (None: seq_len // 16)
    mqar_vocab: int | None = None  # MQAR keys and values from this many tokens (None: every ordinary token)
    needle_questions: int = 1  # questions a needle row asks (1: the papers' one; more: one more needle each)

    def validate_retrieval(self) -> None:
        if self.max_text_sequences is not None and (
            not isinstance(self.max_text_sequences, int) or self.max_text_sequences < 1
        ):
            raise ValueError(f"data.max_text_sequences must be None or an int >= 1, got {self.max_text_sequences!r}")
        if not 0.0 <= self.retrieval_fraction < 1.0:
            raise ValueError(f"data.retrieval_fraction must be in [0, 1), got {self.retrieval_fraction}")
        if not 0.0 <= self.mqar_fraction <= 1.0:
            raise ValueError(f"data.mqar_fraction must be in [0, 1], got {self.mqar_fraction}")
        if not isinstance(self.max_needles, int) or not 1 <= self.max_needles <= len(CITY_KEYS):
            raise ValueError(f"data.max_needles must be an int in [1, {len(CITY_KEYS)}], got {self.max_needles!r}")
        if not isinstance(self.needle_digits, int) or not 1 <= self.needle_digits <= 18:
            raise ValueError(f"data.needle_digits must be an int in [1, 18], got {self.needle_digits!r}")
        if self.mqar_pairs is not None and (
            not isinstance(self.mqar_pairs, list | tuple)
            or not self.mqar_pairs
            or any(isinstance(p, bool) or not isinstance(p, int) or p < 1 for p in self.mqar_pairs)
        ):
            raise ValueError(f"data.mqar_pairs must be None or a list of ints >= 1, got {self.mqar_pairs!r}")
        if self.mqar_vocab is not None and (
            isinstance(self.mqar_vocab, bool) or not isinstance(self.mqar_vocab, int) or self.mqar_vocab < 4
        ):
            raise ValueError(f"data.mqar_vocab must be None or an int >= 4, got {self.mqar_vocab!r}")
        if self.needle_loss not in NEEDLE_LOSSES:
            raise ValueError(f"data.needle_loss must be one of {', '.join(NEEDLE_LOSSES)}, got {self.needle_loss!r}")
        if (
            isinstance(self.needle_questions, bool)
            or not isinstance(self.needle_questions, int)
            or not 1 <= self.needle_questions <= self.max_needles
        ):
            raise ValueError(
                f"data.needle_questions must be an int in [1, max_needles={self.max_needles}], "
                f"got {self.needle_questions!r}"
            )


@dataclass
class DataConfig(RetrievalMixFields):
    source: str = "shakespeare"  # 'shakespeare', or a .txt/.jsonl/.json file or a directory of them
    vocab_size: int = 8192
    seq_len: int = 512
    tokenizer_needle_words: bool = False  # train the tokenizer on the needle template, keys and numbers too
    val_sequences: int = 64  # validation sequences evaluated at each eval (the first ones of the val split)
    split_seed: int = 0
    # documents kept apart: one flattened row per batch, position ids restarting per document, no attention across
    # documents (transformers' DataCollatorWithFlattening); False: concatenate-and-chunk (diffattn.data.packing)
    packing: bool = False

    def validate(self) -> None:
        if self.seq_len < 2:
            raise ValueError(f"data.seq_len must be >= 2, got {self.seq_len}")
        if self.mqar_pairs and isinstance(self.mqar_pairs, list | tuple) and 4 * max(self.mqar_pairs) > self.seq_len:
            raise ValueError(
                f"data.mqar_pairs {max(self.mqar_pairs)} does not fit data.seq_len {self.seq_len}: an MQAR row "
                f"holds the key-value block and a query-answer slot per pair (needs seq_len >= "
                f"{4 * max(self.mqar_pairs)})"
            )
        if self.val_sequences < 1:
            raise ValueError(f"data.val_sequences must be >= 1, got {self.val_sequences}")
        self.validate_retrieval()


@dataclass
class TrainConfig:
    max_steps: int = 200
    global_batch_size: int = 8  # sequences per optimiser step, over all processes and accumulation
    grad_accum: int = 1
    lr: float = 1e-3
    schedule: str = "linear"  # linear | cosine (both: warmup, then decay to min_lr_ratio·lr)
    min_lr_ratio: float = 0.04
    warmup_steps: int | None = None  # None: 10% of the schedule's steps (20 at the default 200)
    # the steps the schedule is planned over (None: max_steps): a run of max_steps < schedule_steps stops part-way
    # through its warmup and decay, so budgets read inside one schedule train as its first max_steps steps did
    schedule_steps: int | None = None
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    log_every: int = 1
    eval_every: int = 50
    save_every: int = 50
    keep_checkpoints: int = 2
    seed: int = 0
    precision: str = "auto"  # auto (fp32 on CPU, bf16 on GPU) | fp32 | bf16
    fsdp: bool = False  # under torchrun: FSDP full sharding instead of DDP
    loss_average: str = "token"  # token (Hugging Face's) | row: mean per sequence, then over sequences
    # the model through torch.compile (Trainer's torch_compile): None = eager, else a mode of COMPILE_MODES; with
    # compile_backend (inductor; aot_eager traces without generating code). How the step runs, not what it computes:
    # a resume may change both (RUN_TIME_SETTINGS)
    compile: str | None = None
    compile_backend: str = "inductor"
    # each micro-batch's forward and backward replayed from one CUDA graph (diffattn.cuda_graphs.GraphedMicroSteps,
    # diffattn pretrain/adapt --cuda-graphs): a small model's step on a GPU is host-bound, and a replay is one launch
    # for a thousand. One GPU, eager (not with compile, whose reduce-overhead mode graphs the step its own way),
    # data.packing false (a flattened batch's length changes from batch to batch); how the step runs, not what it
    # computes
    cuda_graphs: bool = False

    #: the settings a resume may change: how far the run goes and how its step runs, not what it computes
    RUN_TIME_SETTINGS = ("max_steps", "compile", "compile_backend", "cuda_graphs")
    #: the settings that plan the learning-rate schedule: a resume compares them resolved (:attr:`schedule_plan`),
    #: so a run of 400 steps may be resumed as ``max_steps: 200, schedule_steps: 400`` (the same schedule, stopped
    #: part-way) but not extended past the schedule its first steps followed (:func:`resume_differences`)
    SCHEDULE_SETTINGS = ("schedule_steps", "warmup_steps")

    @property
    def resolved_schedule_steps(self) -> int:
        return self.schedule_steps if self.schedule_steps is not None else self.max_steps

    @property
    def resolved_warmup_steps(self) -> int:
        return self.warmup_steps if self.warmup_steps is not None else round(0.1 * self.resolved_schedule_steps)

    @property
    def schedule_plan(self) -> str:
        """The learning-rate schedule as planned, in words (what a resume must keep once a step has been taken)."""
        return f"{self.resolved_schedule_steps} steps, warm-up {self.resolved_warmup_steps}"

    def validate(self) -> None:
        for name in ("max_steps", "global_batch_size", "grad_accum", "log_every", "eval_every", "save_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        if self.schedule not in ("linear", "cosine"):
            raise ValueError(f"train.schedule must be linear or cosine, got {self.schedule!r}")
        # the optimiser's settings, before anything is written (torch refused a beta only at the first step, after
        # run.yaml was saved; a negative decay or clip trained without a word: a review, 2026-12-03); written so NaN
        # fails too
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"train.{name} must be in [0, 1) (an Adam moment's decay), got {getattr(self, name)}")
        for name in ("weight_decay", "grad_clip"):
            if not 0.0 <= getattr(self, name) < float("inf"):
                raise ValueError(f"train.{name} must be >= 0 (0: none), got {getattr(self, name)}")
        if self.keep_checkpoints < 1:
            raise ValueError(f"train.keep_checkpoints must be >= 1 (a resume needs one), got {self.keep_checkpoints}")
        if self.loss_average not in ("token", "row"):
            raise ValueError(f"train.loss_average must be token or row, got {self.loss_average!r}")
        if self.compile is not None and self.compile not in COMPILE_MODES:
            raise ValueError(
                f"train.compile must be null (eager) or a torch.compile mode ({', '.join(COMPILE_MODES)}), "
                f"got {self.compile!r}"
            )
        if self.cuda_graphs and self.compile is not None:
            raise ValueError(
                "train.cuda_graphs with train.compile: choose one (compile's reduce-overhead mode replays the compiled "
                "step as CUDA graphs itself)"
            )
        if self.precision not in ("auto", "fp32", "bf16"):
            raise ValueError(f"train.precision must be auto, fp32 or bf16, got {self.precision!r}")
        if self.save_every % self.log_every:
            # the loss of a step is checked for NaN when it is logged, before any checkpoint of that step
            raise ValueError(
                f"train.save_every ({self.save_every}) must be a multiple of train.log_every "
                f"({self.log_every}) so a non-finite loss is caught before it is checkpointed"
            )
        if self.schedule_steps is not None and not (
            isinstance(self.schedule_steps, int) and self.schedule_steps >= self.max_steps
        ):
            raise ValueError(
                f"train.schedule_steps must be an integer >= max_steps={self.max_steps} (the run stops part-way "
                f"through the schedule), got {self.schedule_steps!r}"
            )
        if self.warmup_steps is not None and not (
            isinstance(self.warmup_steps, int) and 0 <= self.warmup_steps <= self.resolved_schedule_steps
        ):  # of the planned schedule: a run may stop inside the warm-up of a longer plan, as its implicit 10% may
            raise ValueError(
                f"train.warmup_steps must be in [0, {self.resolved_schedule_steps}] (the schedule's steps), "
                f"got {self.warmup_steps}"
            )
        if not 0.0 <= self.min_lr_ratio <= 1.0 or not 0 < self.lr < float("inf"):  # written so NaN fails too
            raise ValueError(
                f"train.lr must be > 0 and train.min_lr_ratio in [0, 1]; got {self.lr}, {self.min_lr_ratio}"
            )


def setting_differences(saved: dict, now: dict, prefix: str = "") -> list[str]:
    """``"a.b: old -> new"`` for every setting that differs between two nested dicts (keys on either side),
    sorted; the one wording of every "settings differ" refusal (resume, experiment parts, resolved options)."""
    out = []
    for key in sorted(set(saved) | set(now)):
        a, b = saved.get(key), now.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += setting_differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return out


class RunFolderError(ValueError):
    """The output folder cannot be used as asked (exists, or has nothing to resume)."""


CHECKPOINTS = "checkpoints"  # a run folder's checkpoints/checkpoint-<step>/


def checkpoint_dirs(run_dir: Path) -> list[Path]:
    """The ``checkpoint-<step>`` folders of a run folder, whole or not (the trainer's ``latest_checkpoint`` checks)."""
    root = run_dir / CHECKPOINTS
    if not root.is_dir():
        return []
    return [p for p in root.iterdir() if p.is_dir() and p.name.startswith("checkpoint-") and p.name[11:].isdigit()]


def checkpoint_step(path: Path) -> int:
    return int(path.name.rsplit("-", 1)[1])


def resume_differences(
    saved, now, *, trained_steps: int, finished: bool = False, elsewhere: tuple[str, ...] = ()
) -> list[str]:
    """What ``now`` changes of the run saved as ``saved`` (run configs) that a resume may not change, in
    :func:`setting_differences`' words; empty when the run may resume. ``trained_steps``: the step it resumes from
    (0: it starts again); ``finished``: its result is saved (summary.json). ``elsewhere``: dotted settings the
    caller compares itself (resolved method options).

    ``TrainConfig.RUN_TIME_SETTINGS`` may change. The schedule is compared as planned
    (:attr:`TrainConfig.schedule_plan`) once a step has been taken under it: a run extended past the schedule its
    steps followed would be neither run (the learning rate of an ended decay, then a new warm-up from mid-schedule;
    a user's review, 2026-12-03). A new ``max_steps`` alone may change the plan where no step is to come (the run
    is finished at or past it: its saved result stands; an unfinished one would take a step under the new plan), and
    any plan is whole where the run starts again from step 0."""
    previous, current = saved.to_dict(), now.to_dict()
    for key in (*now.train.RUN_TIME_SETTINGS, *now.train.SCHEDULE_SETTINGS):
        previous["train"].pop(key, None), current["train"].pop(key, None)
    for dotted in elsewhere:
        section, key = dotted.split(".", 1)
        previous.get(section, {}).pop(key, None), current.get(section, {}).pop(key, None)
    diff = setting_differences(previous, current)
    before, after = saved.train.schedule_plan, now.train.schedule_plan
    # the plan changed by a smaller max_steps alone, on a run already past it: nothing trains (the result stands)
    nothing_to_train = (
        finished
        and trained_steps >= now.train.max_steps
        and dataclasses.replace(now.train, max_steps=saved.train.max_steps).schedule_plan == before
    )
    if trained_steps > 0 and after != before and not nothing_to_train:
        diff.append(
            f"train schedule: {before} -> {after} (steps 1-{trained_steps} followed the first; plan a run you may "
            "extend with train.schedule_steps from its start: it resumes to any max_steps up to it)"
        )
    return diff


class SectionedConfig(YamlConfig):
    """A config made of section dataclasses (``run.yaml`` of ``diffattn pretrain`` and of ``diffattn adapt``):
    the shared YAML mechanism (:mod:`diffattn.config`), overrides only into existing sections, every section
    validated."""

    def validate(self):
        for f in dataclasses.fields(self):
            getattr(self, f.name).validate()
        return self

    def _set(self, d: dict, dotted: str, value: object) -> None:
        section, _, key = dotted.partition(".")
        if section not in d or not key:
            raise ValueError(f"unknown setting {dotted!r}; sections are {', '.join(d)}")
        set_dotted(d, dotted, value)


@dataclass
class RunConfig(SectionedConfig):
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def validate(self):
        super().validate()
        if self.train.cuda_graphs and self.data.packing:
            raise ValueError(
                "train.cuda_graphs with data.packing: a graph replays fixed shapes, and a batch of documents kept "
                "apart is flattened to a length of its own; use data.packing false (concatenate and chunk)"
            )
        return self


def training_identity(run_dir: str | Path) -> dict | None:
    """Which training a run folder's model is: its steps and a hash of its summary.json (None without one: a hub
    model, which does not change), so a model trained again with the same step count (``--overwrite``) is told from
    the earlier one: an evaluation of it (the experiment runner's ``evaluated_steps.json``) and an adapter of it
    (the adapter summary's ``base_training``) are then of another model."""
    import hashlib

    summary = Path(run_dir) / "summary.json"
    if not summary.is_file():
        return None
    text = summary.read_bytes()
    return {"steps": json.loads(text).get("steps"), "summary_sha1": hashlib.sha1(text).hexdigest()}
