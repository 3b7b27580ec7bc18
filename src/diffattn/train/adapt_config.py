"""The config of a ``diffattn adapt`` run (its ``run.yaml``): the base model, the method or control and its options,
the data and the training budget, on the shared config mechanism (:mod:`diffattn.config`), and how a method's
options are resolved (defaults filled in, T of Dex Eq. 4 from the run's length) and compared on resume."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..adapters.annealed import AnnealedOptions
from ..adapters.registry import get_method, method_names, specs
from ..config import from_dict, yaml_floats
from ..ops import BACKENDS
from .config import RetrievalMixFields, RunFolderError, SectionedConfig, TrainConfig, setting_differences


def __getattr__(name: str):
    # from the method registry on access, so a method registered after import is included
    if name == "ADAPT_METHODS":
        return method_names()
    if name == "CONTROLS":
        return method_names("control")
    if name == "METHODS":
        from ..adapters import METHODS

        return METHODS
    if name == "ANNEALED":  # the methods whose λ follows Dex Eq. 4
        return tuple(s.name for s in specs() if s.annealed)
    if name == "MERGEABLE":
        return tuple(s.name for s in specs() if s.mergeable)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def default_anneal_steps(max_steps: int) -> int:
    """T of Dex Eq. 4 when the run's options leave it unset: ``max(1, round(0.2·S), min(10, S // 2))``.

    20% of the S steps is what long runs get (docs/methods.md §2.2) (S ≥ 50). Short runs need a floor:
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
    merge: bool = False  # also write merged/ (the mergeable methods: `diffattn info` lists them)
    backend: str = "auto"  # of the two-map op of the adapted attention (diffattn.ops.diff_attention), as model.backend

    def validate(self) -> None:
        if self.name not in method_names():
            raise ValueError(f"method.name must be one of {', '.join(method_names())}; got {self.name!r}")
        if self.merge and not get_method(self.name).mergeable:
            mergeable = [s.name for s in specs() if s.mergeable]
            raise ValueError(
                f"--merge applies to {' and '.join(mergeable)} only; {self.name} cannot be folded into the base"
            )
        if self.backend not in BACKENDS:
            raise ValueError(f"method.backend must be one of {', '.join(BACKENDS)}; got {self.backend!r}")
        allowed = get_method(self.name).options
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


# The default learning rate of the differential parameters (train.lambda_lr unset; see AdaptTrainConfig), chosen by
# measurement. When the gradient pushes λ the same way every step, Adam moves it by the sum of the scheduled rates:
# over 40 steps (10% warm-up, cosine to 0, no gradient at t = 0) that is 20·lambda_lr, so 3e-3 reaches 0.06 and 1e-2
# reaches 0.2, enough margin for a gradient whose sign wavers. On a briefly pretrained 2-layer d-128 model (40 steps,
# batch 4 × 128 tokens, lr 1e-4, a quarter retrieval rows) the largest |λ| at the end was, for lambda_lr = 1e-4 (the
# shared rate) / 1e-3 / 3e-3 / 1e-2 / 3e-2: Dex 0.0013 / 0.011 / 0.016 / 0.10 / 0.30, DAA 0.0013 / 0.012 /
# 0.032 / 0.053 / 0.11, DiffV 0.0013 / 0.010 / 0.037 / 0.099 / 0.068; validation loss 4.752 before, after 1e-2
# within +0.001 (Dex), +0.005 (DAA), +0.010 (DiffV) of the shared-rate runs, after 3e-2 Dex's rose by +0.056. So
# 1e-2, and a fixed rate rather than a multiple of lr: lr × 100 would be 0.1 at the lr 1e-3 experiments use, past
# what was seen to be harmless, while at lr 1e-3 a fixed 1e-2 still moved |λ| to 0.026-0.034.
DEFAULT_LAMBDA_LR = 1e-2


@dataclass
class AdaptTrainConfig(TrainConfig):
    """The pretraining trainer's settings plus ``lambda_lr``: the learning rate of the λ(t) methods' differential
    parameters (every λ_learn, and Dex's W_D, DAA's W_DAA, DiffQ/K/V's W_D: ``adapters.differential_parameter_names``),
    an optimiser parameter group of its own that follows the same schedule (warm-up and decay scale both groups
    alike) and is never weight-decayed. Methods without a λ(t) term ignore it.

    Why a rate of its own: λ_learn starts at 0, and Adam moves a parameter by at most about the learning rate per
    step, so at the shared 1e-4 a 40-step run can move λ by ~4e-3 in all (with warm-up and cosine decay ~2e-3; the
    largest |λ| of the committed mini-adapters run was 1.4e-3): at the shared rate the λ(t) methods are attention
    fine-tunes by construction. ``None`` means :data:`DEFAULT_LAMBDA_LR`."""

    lambda_lr: float | None = None  # None: DEFAULT_LAMBDA_LR
    # A learning-rate grid (an experiment's adapter entry, resolved by `diffattn run`): one run per rate, every
    # trained parameter at that rate (lr and, for λ(t) methods, lambda_lr), and the rate with the lowest final
    # validation loss is the part's ``lr``, chosen before any evaluation is read. ``lr_grid_val_loss`` records each
    # rate's loss (keys: the rates as text), so run.yaml says how ``lr`` was chosen.
    lr_grid: list[float] | None = None
    lr_grid_val_loss: dict[str, float] | None = None

    def __post_init__(self):
        if isinstance(self.lambda_lr, str):  # `--set train.lambda_lr=1e-2`: YAML 1.1 reads 1e-2 (no dot) as a string
            with contextlib.suppress(ValueError):  # not a number: refused by validate, in its words
                self.lambda_lr = float(self.lambda_lr)

    @property
    def resolved_lambda_lr(self) -> float:
        return DEFAULT_LAMBDA_LR if self.lambda_lr is None else float(self.lambda_lr)

    def validate(self) -> None:
        super().validate()
        v = self.lambda_lr
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf")):
            raise ValueError(f"train.lambda_lr must be a learning rate > 0 (or null for the default), got {v!r}")
        self._validate_grid()

    def _validate_grid(self) -> None:
        grid, losses = self.lr_grid, self.lr_grid_val_loss
        if grid is None:
            if losses is not None:
                raise ValueError("train.lr_grid_val_loss records a train.lr_grid: set both or neither")
            return
        if (
            not isinstance(grid, list | tuple)
            or len(grid) < 2
            or any(isinstance(x, bool) or not isinstance(x, int | float) or not 0 < x < float("inf") for x in grid)
        ):
            raise ValueError(f"train.lr_grid must be a list of at least two learning rates > 0, got {grid!r}")
        if losses is None:
            raise ValueError(
                "train.lr_grid is resolved by `diffattn run` (an experiment's adapter entry: one run per rate, the "
                "lowest validation loss wins); for one run, set train.lr"
            )
        if sorted(losses) != sorted(grid_key(x) for x in grid):
            raise ValueError(f"train.lr_grid_val_loss must have one loss per rate of train.lr_grid {list(grid)}")
        if grid_key(self.lr) != best_rate(losses):
            raise ValueError(f"train.lr {self.lr} is not the grid's best rate {best_rate(losses)} (lowest loss)")


def grid_key(rate: float) -> str:
    """A grid rate as the key of ``lr_grid_val_loss`` (YAML keys are text): ``1e-3`` → ``"0.001"``."""
    return repr(float(rate))


def best_rate(losses: dict[str, float]) -> str:
    """The rate (a key of ``lr_grid_val_loss``) with the lowest loss; a tie goes to the smaller rate."""
    return min(losses, key=lambda k: (losses[k], float(k)))


def _adapt_train_defaults() -> AdaptTrainConfig:
    # lr 1e-4 (DiffLoRA; DAA on Llama), cosine to 0 (DAA); no weight decay (the papers are silent, and the
    # base weights the methods move should stay near the pretrained ones); 10% warmup.
    return AdaptTrainConfig(max_steps=200, lr=1e-4, schedule="cosine", min_lr_ratio=0.0, weight_decay=0.0)


@dataclass
class AdaptRunConfig(SectionedConfig):
    model: AdaptModelSection = field(default_factory=AdaptModelSection)
    method: AdaptMethodSection = field(default_factory=AdaptMethodSection)
    data: AdaptDataSection = field(default_factory=AdaptDataSection)
    train: AdaptTrainConfig = field(default_factory=_adapt_train_defaults)

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
        if section == "method" and key not in {f.name for f in dataclasses.fields(AdaptMethodSection)}:
            d["method"]["options"][key.removeprefix("options.")] = value
        else:
            super()._set(d, dotted, value)

    def with_base_folder_absolute(self) -> AdaptRunConfig:
        """This config with a base model named by a relative folder made absolute: run.yaml records it, and
        ``diffattn eval`` or :func:`~diffattn.adapters.runs.load_adapted` of the run reads the base from there, from
        whatever directory they run in (a relative name was read against theirs: a user's review, 2026-12-03); a
        rerun compares its config in this form too, so a relative ``--root`` is the same run (a review,
        2026-12-03: the second ``diffattn quickstart`` was refused)."""
        from ..models.pretrained import PRETRAINED

        name = self.model.name
        if name in PRETRAINED or Path(name).is_absolute() or not Path(name).is_dir():
            return self
        return self.with_overrides({"model.name": str(Path(name).resolve())})

    def method_config(self):
        """The method's config dataclass from ``method.options`` (anneal_steps: :func:`default_anneal_steps` of
        the steps the schedule is planned over, ``train.resolved_schedule_steps``, when unset). Raises ValueError for
        a config whose new parameters could never learn."""
        spec = get_method(self.method.name)
        options = yaml_floats(dict(self.method.options), spec.config)  # gate_init: 2e-2, as train.lr: 2e-2
        if spec.annealed and options.get("anneal_steps") is None:
            # over the steps the schedule is planned for, so a run stopped part-way (max_steps < schedule_steps)
            # anneals as the first max_steps steps of the longer run did, and may be resumed to its end
            options["anneal_steps"] = default_anneal_steps(self.train.resolved_schedule_steps)
        try:
            method_config = spec.config(**options)
        except TypeError as e:
            raise ValueError(f"bad options for method {self.method.name}: {e}") from e
        if isinstance(method_config, AnnealedOptions):  # T is known only here: a no-op config is refused now
            method_config.check_learnable()
        return method_config


RESOLVED_OPTIONS = "method_options.json"  # the method's options with every code default filled in


def resolved_method_options(config: AdaptRunConfig) -> dict:
    """The method's full config as the code resolves it now (defaults included), for comparison on resume: run.yaml
    holds only the options given, so a changed code default (DAA's placement, Dex's init) would pass unseen.
    A defaulted ``anneal_steps`` is left out: it follows the planned schedule, which
    :func:`~diffattn.train.config.resume_differences` compares."""
    resolved = _jsonable(config.method_config())
    if "anneal_steps" not in config.method.options:
        resolved.pop("anneal_steps", None)
    return json.loads(json.dumps(resolved, default=str))


def check_resolved_options(run_dir: Path, options: dict) -> None:
    """Refuse a resume whose method options resolve otherwise than the run's saved :data:`RESOLVED_OPTIONS`."""
    diff = setting_differences(json.loads((run_dir / RESOLVED_OPTIONS).read_text()), options)
    if diff:
        raise RunFolderError(
            f"--resume: the method's options now resolve differently from the saved run's ({'; '.join(diff)}), "
            "e.g. a default changed in this version; give the saved values with --set method.NAME=VALUE, or "
            "--overwrite to start again"
        )


def _jsonable(config) -> dict:
    return {k: v for k, v in dataclasses.asdict(config).items()} if dataclasses.is_dataclass(config) else {}
