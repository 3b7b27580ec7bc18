"""Run an experiment: pretrain the from-scratch models, adapt, evaluate, report — skipping what is done.

Layout of ``<root>/<name>/``::

    experiment.yaml          the resolved config of the last run
    (pretrained models are read where they are: a known offline name or a local folder)
    models/<name>/           diffattn pretrain run folders (run.yaml, metrics.jsonl, checkpoints/, final/, summary.json)
    adapters/<name>/         diffattn adapt run folders (… adapter/ or merged/ or final/, summary.json)
    eval/<name>/             diffattn eval outputs (results.json, PNGs)
    logs/                    with jobs > 1: each worker's output (<name>.log training, eval-<name>.log evaluating)

A part is *done* when its ``summary.json`` (training) or ``results.json`` (evaluation) exists and its saved settings
equal the requested ones (how its step runs, ``train.compile``, aside: ``TrainConfig.RUN_TIME_SETTINGS``); it is
*resumed* from its last checkpoint when it was started with the same settings (a larger ``max_steps`` also resumes,
up to the schedule the run planned: ``train.schedule_steps``; :func:`diffattn.train.config.resume_differences`);
a part whose saved settings differ is refused with the difference, unless ``overwrite`` names it (or is ``True``).
"""

from __future__ import annotations

import copy
import json
import logging
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..files import (
    LOCK,
    MARKER,
    RECORDS,
    RUN_CONFIG,
    claim_id,
    contents,
    locked,
    mark,
    marker,
    proof_problem,
    recorded_id,
    save_record,
    why_protected,
    write_text_atomic,
)
from ..models.architectures import ARCHITECTURES
from ..train.config import checkpoint_step, resume_differences, setting_differences, training_identity
from .config import ExperimentConfig

logger = logging.getLogger(__name__)

DONE, RESUME, FRESH = "done", "resume", "fresh"
# what `diffattn run` prints as each training part starts (one line per part: which is running, which is reused)
PART_STATES = {DONE: "done, read back", RESUME: "resuming from its last checkpoint", FRESH: "training"}


def _say(line: str) -> None:
    """One status line of the run (a part starting or reused), above any progress bar."""
    from tqdm.auto import tqdm

    tqdm.write(line)


@dataclass
class PartOutcome:
    kind: str  # pretrain | adapt | lr-grid (one rate of an adapter's learning-rate grid) | eval
    name: str
    path: Path
    state: str  # done (skipped), resume, fresh
    seconds: float = 0.0
    summary: dict = field(default_factory=dict)


def run_state(run_dir: Path, config, *, overwrite: bool) -> str:
    """done, resume or fresh for a training run folder with ``run.yaml``: fresh whenever ``overwrite`` names it;
    raises when its settings changed and it is not named, and when a fresh part's folder holds something that is
    not provably a run diffattn made (the trainer would have to delete it). Changes nothing on disk."""
    saved_file = run_dir / RUN_CONFIG
    if not saved_file.is_file() or overwrite:  # --overwrite NAME redoes the part, changed or not
        problem = proof_problem(run_dir, "run") if contents(run_dir) else None
        if problem:
            raise ValueError(
                f"{run_dir} cannot be redone: that would delete it, and {problem}; move it away or delete it "
                "yourself, then run again"
            )
        return FRESH
    saved = type(config).load(saved_file)
    if hasattr(config, "with_base_folder_absolute"):  # an adapter's base as its run.yaml records it
        config = config.with_base_folder_absolute()
    # what a run may change and stay the same run: how far it goes inside its schedule, how its step runs (the
    # trainer's rule, from the checkpoint it would resume: read only where the plan changed, as it reads weights)
    trained = 0
    if saved.train.schedule_plan != config.train.schedule_plan:
        from ..train.trainer import latest_checkpoint

        newest = latest_checkpoint(run_dir)
        trained = checkpoint_step(newest) if newest is not None else 0
    finished = (run_dir / "summary.json").is_file()
    other = resume_differences(saved, config, trained_steps=trained, finished=finished)
    if other:
        raise ValueError(
            f"{run_dir} was run with other settings ({'; '.join(other)}); pass --overwrite to redo it, "
            "or give the new variant another name"
        )
    trained_to = _summary_steps(run_dir) if finished else 0
    if trained_to != float("inf") and trained_to > config.train.max_steps:
        # the trainer would keep the longer run's result (nothing trains), and the report would give it the
        # experiment's budget: a 6-step model under a 3-step protocol (a review, 2026-12-03)
        raise ValueError(
            f"{run_dir} finished at step {trained_to:.0f} and the experiment now asks for max_steps "
            f"{config.train.max_steps}: its result would be reported under the smaller budget; pass --overwrite to "
            f"train it again to {config.train.max_steps}, or ask for {trained_to:.0f}"
        )
    steps_changed = saved.train.max_steps != config.train.max_steps
    if (run_dir / "summary.json").is_file() and not steps_changed and _summary_steps(run_dir) >= config.train.max_steps:
        return DONE
    # A summary of fewer steps than run.yaml asks for: a run extended (a larger max_steps rewrites run.yaml when it
    # starts) and stopped before its new end, whose summary is still the shorter run's: resume it, not "done".
    return RESUME


def _summary_steps(run_dir: Path) -> float:
    """The step count a run's summary.json records; +inf where it records none (older summaries: trust them)."""
    try:
        steps = json.loads((run_dir / "summary.json").read_text()).get("steps")
    except (OSError, ValueError, AttributeError):
        return math.inf  # a damaged summary is refused where it is read (_read_json), with the remedy
    return steps if isinstance(steps, int) and not isinstance(steps, bool) else math.inf


def check_experiment_folder(out: Path, name: str, source: str | None) -> None:
    """``root/NAME`` must be new, empty, or this experiment's: made by ``diffattn run`` from the same experiment
    file (its marker's ``source``), or an older diffattn experiment of that name (``experiment.yaml``, no marker).
    Another file with the same name is refused, whatever ``--overwrite`` says (redoing parts would not make the
    folder's other contents this file's)."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} is a file: the experiment {name!r} needs that path for its folder")
    if not contents(out):
        return
    reason = why_protected(out)
    if reason:
        raise ValueError(f"the experiment {name!r} cannot use {str(out)!r}: {reason}")
    made = marker(out)
    if made is None:
        try:
            earlier = ExperimentConfig.load(out / "experiment.yaml").name
        except ValueError:
            earlier = None
        if earlier != name:
            raise ValueError(
                f"{out} exists and was not made by diffattn run for experiment {name!r}: choose another --root or name"
            )
        return
    if not isinstance(made.get("kind"), str):
        raise ValueError(
            f"{out} has a {MARKER} file diffattn did not write (empty or not diffattn's form), so it is not an "
            "experiment's folder: choose another --root or name"
        )
    if made["kind"] != "experiment":
        raise ValueError(f"{out} is a diffattn {made['kind']} folder, not an experiment's: choose another --root")
    recorded = recorded_id(out / RECORDS["experiment"])
    if made.get("id") and recorded and recorded != made["id"]:
        raise ValueError(
            f"{out}'s {MARKER} file and its experiment.yaml do not name the same experiment (a copied marker?): "
            "choose another --root or name"
        )
    if made.get("source") != source:
        raise ValueError(
            f"{out} holds the experiment {name!r} from {made.get('source') or 'Python code'}; this one is from "
            f"{source or 'Python code'}: give it another name (--set name=...) or --root; if it is the same "
            f"experiment whose file moved, delete {out / MARKER} and run again"
        )


def _replace_old(run_dir: Path, state: str) -> bool:
    """For a fresh part over an old folder (an overwritten part): True, so that the trainer replaces it — only
    after its own checks of the data and settings passed, so a bad new setting never costs the finished old part.
    :func:`run_state` has made sure that the folder is provably a run diffattn made; nothing marks it as one here."""
    return state == FRESH and bool(contents(run_dir))


def _scratch_config(exp: ExperimentConfig, m):
    from ..train import RunConfig

    return RunConfig.from_dict(
        {
            "model": {"preset": m.preset, "attention": m.attention, **m.model},
            "data": dict(exp.data),
            "train": {"seed": exp.seed, **exp.train, **m.train},
        }
    ).validate()


def _adapt_config(exp: ExperimentConfig, a, root: Path):
    """The adapter part's run config; a learning-rate grid (``train.lr_grid``) is left out here and resolved by
    :func:`_resolve_lr_grid` when the part trains."""
    from ..train.adapt_config import AdaptRunConfig

    if a.base in exp.scratch_names():
        base = str(root / "models" / a.base / "final")
    else:
        base = exp.pretrained_path(a.base) or a.base
    data = exp.adapter_data(a)
    train = {"seed": exp.seed, **exp.adapt_train, **a.train}
    train.pop("lr_grid", None)
    return AdaptRunConfig.from_dict(
        {
            "model": {"name": base},
            "method": {"name": a.method, "options": dict(a.options), "merge": a.merge},
            "data": data,
            "train": train,
        }
    ).validate()


def _lr_grid(exp: ExperimentConfig, a) -> list[float] | None:
    """The adapter entry's learning-rate grid (its ``train.lr_grid`` or the experiment's ``adapt_train.lr_grid``)."""
    grid = {**exp.adapt_train, **a.train}.get("lr_grid")
    return None if grid is None else [float(x) for x in grid]


def _at_rate(run_config, method: str, rate: float, grid=None, losses=None):
    """``run_config`` with every trained parameter at ``rate``: ``lr`` and, for a method with a λ(t) term, its
    ``lambda_lr`` (so that every arm of a comparison gets the same grid), and the grid's record."""
    from ..adapters.registry import get_method

    spec = get_method(method)
    config = copy.deepcopy(run_config)
    config.train.lr = rate
    if spec.annealed or spec.differential_weights:
        config.train.lambda_lr = rate
    config.train.lr_grid, config.train.lr_grid_val_loss = grid, losses
    return config.validate()


def _grid_parts(out: Path, a, run_config, grid: list[float]) -> list[tuple[str, Path, object]]:
    """(name, folder, config) of each rate's run: ``adapters/NAME.lr-grid/lr-RATE``."""
    from ..train.adapt_config import grid_key

    root = out / "adapters" / f"{a.name}.lr-grid"
    return [(f"{a.name} lr {grid_key(r)}", root / f"lr-{grid_key(r)}", _at_rate(run_config, a.method, r)) for r in grid]


def _resolve_lr_grid(a, run_config, grid: list[float], parts, states, train) -> tuple[object, list[PartOutcome]]:
    """Train one run per rate of ``grid`` (finished ones are read back), then the part's config: the rate with
    the lowest final validation loss, and every rate's loss recorded (``train.lr_grid_val_loss``) — chosen before
    any evaluation is read."""
    from ..train.adapt_config import best_rate

    outcomes = [_train_part("lr-grid", train, name, path, states[name], config) for name, path, config in parts]
    losses = grid_losses(a.name, grid, [o.summary.get("val_loss_after") for o in outcomes])
    chosen = float(best_rate(losses))
    logger.info("%s: lr %s chosen from %s by validation loss", a.name, chosen, losses)
    return _at_rate(run_config, a.method, chosen, grid=list(grid), losses=losses), outcomes


def _reuse_grid_run(chosen: Path, path: Path, run_config) -> str:
    """The part at the chosen rate is the grid's run at that rate — the same config but for the grid's record, the
    same seed — so it is made from that run instead of trained again: copied under a temporary name, weight files
    hard-linked where the file system allows (they are only ever written whole, as new files; the logs, which a
    resumed run appends to, are copied, so neither folder can change the other), given its own run.yaml (with the
    grid's record), marker and summary paths, then renamed into place; on any error the temporary copy is removed.
    (``--overwrite NAME`` trains the part again instead.) Returns the part's state: done."""
    import os
    import shutil

    from ..files import new_id, writing

    def link_or_copy(src, dst):
        if Path(src).suffix in (".safetensors", ".bin", ".pt"):
            try:
                return os.link(src, dst)
            except OSError:
                pass
        return shutil.copy2(src, dst)

    ident = new_id()
    tmp = path.with_name(f".{path.name}.from-grid-{ident[:8]}")  # a name no part has: nothing of the user's there
    try:
        with writing(path, f"the grid's run at lr {run_config.train.lr:g}", "the grid's runs are intact"):
            shutil.copytree(chosen, tmp, symlinks=True, copy_function=link_or_copy, ignore=shutil.ignore_patterns(LOCK))
            summary_file = tmp / "summary.json"
            summary = json.loads(summary_file.read_text())
            moved = {  # paths into the grid run's folder (a merged model) name the part's own
                key: str(path / Path(value).relative_to(chosen))
                for key, value in summary.items()
                if isinstance(value, str) and value.startswith(str(chosen) + os.sep)
            }
            if moved:
                write_text_atomic(summary_file, json.dumps({**summary, **moved}, indent=2))  # as adapt writes it
            save_record(run_config, tmp / RUN_CONFIG, ident)
            made = marker(chosen) or {}
            mark(tmp, "run", ident=ident, **{k: v for k, v in made.items() if k not in ("kind", "id")})
            tmp.rename(path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # ours alone: made above under a fresh name
        raise
    logger.info("adapt %s: the grid's run at lr %g, reused (not trained again)", path.name, run_config.train.lr)
    return DONE


def grid_losses(name: str, grid: list[float], losses: list) -> dict[str, float]:
    """Each grid rate's final validation loss, keyed by :func:`grid_key`. A rate whose run diverged (a non-finite
    or missing loss: too high a rate for these weights is a result of the grid, not an error) is recorded as
    ``inf``, so it loses; only when no rate has a finite loss is there nothing to choose."""
    from ..train.adapt_config import grid_key

    finite = [isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) for x in losses]
    if not any(finite):
        raise ValueError(f"{name}: no rate of the grid {list(grid)} has a finite validation loss ({losses!r})")
    for rate, loss, ok in zip(grid, losses, finite, strict=True):
        if not ok:
            logger.warning("%s: the run at lr %s diverged (validation loss %r): it ranks last", name, rate, loss)
    return {grid_key(r): float(x) if ok else math.inf for r, x, ok in zip(grid, losses, finite, strict=True)}


def _wants(overwrite, name: str) -> bool:
    return overwrite is True or (isinstance(overwrite, (set, list, tuple)) and name in overwrite)


def run_experiment(
    config: ExperimentConfig,
    root: str | Path = "runs",
    *,
    overwrite: bool | set[str] = False,
    report: bool = True,
    evaluate: bool = True,
    source: str | Path | None = None,
    jobs: int = 1,
) -> list[PartOutcome]:
    """Run every part of ``config`` under ``root/config.name`` (see the module doc); returns what happened.
    ``evaluate=False`` stops after the training parts (no evaluation, no report): a later run evaluates them.
    ``source``: the experiment file (default: the one ``config`` was loaded from), recorded in the folder's
    marker so that another file with the same ``name`` is refused instead of replacing this one's report
    (:func:`check_experiment_folder`). ``jobs``: from-scratch parts trained, and models evaluated, at once, each in
    a process of its own with ``cores // jobs`` threads (:func:`_in_parallel`); 1 runs them one after the other.
    Adapters train one after the other either way, with every core (measured no faster in parallel: the loop in
    :func:`_run_locked`)."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be an int >= 1, got {jobs!r}")

    config.validate()
    _check_overwrite_names(config, overwrite)
    out = Path(root) / config.name

    # every config is built (and so checked) before any training starts
    scratch = [(m, _scratch_config(config, m)) for m in config.models]
    adapters = [(a, _adapt_config(config, a, out)) for a in config.adapters]
    _check_adapters(config, adapters)
    options = _suite_options_preflighted(config, scratch, adapters)

    source = str(Path(source).resolve()) if source is not None else config.source
    check_experiment_folder(out, config.name, source)
    with locked(out, command="diffattn run"):  # a second run of it is refused, naming this one, until this ends
        check_experiment_folder(out, config.name, source)  # again under the lock: another may have written meanwhile
        return _run_locked(config, out, source, scratch, adapters, options, overwrite, report, evaluate, jobs)


def _run_locked(config, out: Path, source, scratch, adapters, options, overwrite, report, evaluate, jobs):
    from ..train import pretrain
    from ..train.adapt import adapt_pretrained

    outcomes: list[PartOutcome] = []
    # every part's state is decided (and a changed part refused) before anything runs or is deleted
    states = {m.name: run_state(out / "models" / m.name, c, overwrite=_wants(overwrite, m.name)) for m, c in scratch}
    grids = {a.name: _grid_parts(out, a, c, _lr_grid(config, a)) for a, c in adapters if _lr_grid(config, a)}
    # a from-scratch base that trains in this run (--overwrite BASE, a longer budget) is another model: the adapters
    # trained on the earlier one are redone (they were reused: a review, 2026-12-03)
    redo = {a.name: _wants(overwrite, a.name) for a, _ in adapters}
    for a, c in adapters:
        path = out / "adapters" / a.name
        trained = path.exists() or any(grid_path.exists() for _, grid_path, _ in grids.get(a.name, []))
        if a.base in config.scratch_names() and states[a.base] != DONE and trained and not redo[a.name]:
            redo[a.name] = True
            _say(f"adapt {a.name}: its base {a.base} trains in this run, so it is trained again on it")
        for name, grid_path, grid_config in grids.get(a.name, []):
            states[name] = run_state(grid_path, grid_config, overwrite=redo[a.name])
        if a.name not in grids:  # a grid part's own config is known once its grid has run
            states[a.name] = run_state(path, c, overwrite=redo[a.name])
            if states[a.name] == DONE and a.base in config.scratch_names():
                _check_base_unchanged(path, a, out / "models" / a.base)
    if evaluate and report:  # before any training: a report the user edited is never replaced at the end
        from .report import check_report_writable

        check_report_writable(out)
    ident = claim_id(out, "experiment")  # the record first: a marker is never left naming an identity alone
    out.mkdir(parents=True, exist_ok=True)
    save_record(config, out / RECORDS["experiment"], ident)
    mark(out, "experiment", ident=ident, name=config.name, source=source)

    scratch_parts = [(m.name, out / "models" / m.name, states[m.name], c) for m, c in scratch]
    if jobs > 1 and sum(state != DONE for _, _, state, _ in scratch_parts) > 1:
        outcomes += _train_in_parallel(scratch_parts, jobs, out / "logs")
    else:
        outcomes += [_train_part("pretrain", pretrain, *part) for part in scratch_parts]
    # adapters one after the other, with every core: SmolLM2's trained no faster as two one-thread processes on two
    # cores (benchmarks/RESULTS.md, 2026-11-27: 138 and 167 s against 137 and 142 s)
    for a, run_config in adapters:
        path = out / "adapters" / a.name
        if a.name in grids:
            run_config, grid_outcomes = _resolve_lr_grid(
                a, run_config, _lr_grid(config, a), grids[a.name], states, adapt_pretrained
            )
            outcomes += grid_outcomes
            states[a.name] = run_state(path, run_config, overwrite=redo[a.name])
            if states[a.name] == FRESH and not path.exists():
                chosen = grids[a.name][list(_lr_grid(config, a)).index(run_config.train.lr)][1]
                states[a.name] = _reuse_grid_run(chosen, path, run_config)
        outcomes.append(_train_part("adapt", adapt_pretrained, a.name, path, states[a.name], run_config))

    if not evaluate:
        return outcomes
    names = list(config.eval.models or config.model_names())
    evaluations = {name: _evaluation_state(config, out, name, options, redo=_wants(overwrite, name)) for name in names}
    for name, (_, why) in evaluations.items():
        _say(f"eval {name}: {why or 'done (the same suites, options and training), results reused'}")
    done = {name: outcome for name, (outcome, _) in evaluations.items()}
    if jobs > 1 and sum(outcome is None for outcome in done.values()) > 1:
        outcomes += _evaluate_in_parallel(config, out, options, done, overwrite, jobs)
    else:
        outcomes += [done[n] or _evaluate_part(config, out, n, options, redo=_wants(overwrite, n)) for n in names]

    if report:
        from .report import write_report

        write_report(config, out, outcomes)
    return outcomes


def _check_base_unchanged(adapter_dir: Path, adapter, base_dir: Path) -> None:
    """Refuse a finished adapter whose from-scratch base was trained again after it (its summary records which
    training of the base it adapted: ``base_training``); summaries from before that record are not judged."""
    recorded = (_read_json(adapter_dir / "summary.json") or {}).get("base_training")
    if recorded is not None and recorded != training_identity(base_dir):
        raise ValueError(
            f"{adapter_dir} adapted an earlier training of its base {adapter.base!r}, which was trained again since; "
            f"pass --overwrite {adapter.name} to redo it on the base as it is now"
        )


def _check_overwrite_names(config: ExperimentConfig, overwrite) -> None:
    if isinstance(overwrite, (set, list, tuple)):
        unknown = sorted(set(overwrite) - set(config.model_names()))
        if unknown:
            raise ValueError(
                f"--overwrite names no part of experiment {config.name!r}: {', '.join(unknown)}; its parts: "
                f"{', '.join(config.model_names())}"
            )


def _check_adapters(config: ExperimentConfig, adapters) -> None:
    """The methods' option values too, not only their names, now rather than after pretraining; and no adapter
    on a from-scratch DIFF model (the adapters give a standard model differential attention)."""
    for a, c in adapters:
        try:
            c.method_config()
        except ValueError as e:
            raise ValueError(f"adapters[{a.name}]: {e}") from e
    for a, _ in adapters:
        if a.base in config.scratch_names():
            kind = next(m for m in config.models if m.name == a.base).attention
            if ARCHITECTURES[kind].differential:
                raise ValueError(
                    f"adapters[{a.name}]: the adapters give a standard model differential attention; "
                    f"{a.base!r} is already a DIFF model"
                )


def _suite_options_preflighted(config: ExperimentConfig, scratch, adapters=()):
    """The suites' options, validated, after every suite's preflight: a missing ICL data set (say Debian's
    WordNet) or needle prompts that do not fit the context fail now, not after hours of training."""
    from ..eval.suite import SuiteOptions, preflight_suites

    options = SuiteOptions(**{"seed": config.seed, **config.eval.options}).validate(
        config.eval.suites, style="experiment"
    )
    evaluated = set(config.eval.models or config.model_names())  # a model left out of eval.models is not checked
    targets = [t for t in _eval_targets(config, scratch, adapters) if t.name in evaluated]
    preflight_suites(config.eval.suites, options, targets, style="experiment")
    return options


def _train_part(kind: str, train, name: str, path: Path, state: str, run_config) -> PartOutcome:
    """One training part (``train``: pretrain or adapt_pretrained): read back when done, else resumed or started
    as its state says."""
    replace = _replace_old(path, state)
    t0 = time.perf_counter()
    _say(f"{kind} {name}: {PART_STATES[state] if not replace else 'training again (replaces its earlier run)'}")
    if state == DONE:
        summary = _read_json(path / "summary.json")
    else:
        summary = train(run_config, path, resume=state == RESUME, overwrite=replace)
    return PartOutcome(kind, name, path, state, time.perf_counter() - t0, summary)


@contextmanager
def _worker_output(log_file: Path, threads: int):
    """In a worker process: ``threads`` torch threads, and everything it prints (its progress bars, warnings, logs)
    into ``log_file``, so that parallel parts do not write over each other's lines."""
    import os
    import sys

    import torch

    torch.set_num_threads(threads)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("a") as log:
        sys.stdout.flush(), sys.stderr.flush()
        os.dup2(log.fileno(), 1), os.dup2(log.fileno(), 2)  # the worker is ours alone: C-level output too
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, force=True)
        yield


def _train_in_worker(
    name: str, path: Path, state: str, run_config, trackers: tuple, log_file: Path, threads: int
) -> PartOutcome:
    """One from-scratch part in a worker process (:func:`_worker_output`), reporting to ``trackers`` (the parent's
    ``--report-to``: a context variable, which a spawned process does not inherit)."""
    from ..train import pretrain
    from ..train.tracking import reporting

    with _worker_output(log_file, threads), reporting(list(trackers)):
        return _train_part("pretrain", pretrain, name, path, state, run_config)


def _evaluate_in_worker(config, out: Path, name: str, options, redo: bool, log_file: Path, threads: int):
    """One model's evaluation in a worker process (:func:`_worker_output`)."""
    with _worker_output(log_file, threads):
        return _evaluate_part(config, out, name, options, redo=redo)


@contextmanager
def workers_stopped_with_parent(pool):
    """Within the block, a SIGTERM to this process (``kill PID``, a scheduler's stop) or Ctrl-C stops ``pool``'s
    workers too, then raises :class:`KeyboardInterrupt` here.

    Without it, SIGTERM kills the parent alone and its spawned workers train on as orphans (Ctrl-C in a terminal
    reaches the whole process group, a ``kill`` does not), and an interrupted parent's pool shutdown would wait for
    every running part to finish. A worker stopped mid-part resumes from its last checkpoint on the next run, as
    after Ctrl-C. The previous SIGTERM handler is restored on exit; off the main thread (where Python cannot set
    handlers) only Ctrl-C is covered."""
    import signal
    import threading

    def interrupted(signum, frame):
        raise KeyboardInterrupt(f"stopped by signal {signum}")

    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, interrupted) if main_thread else None
    try:
        yield pool
    except KeyboardInterrupt:
        # ProcessPoolExecutor has no public way to stop running work before Python 3.14 (terminate_workers)
        for process in list(getattr(pool, "_processes", {}).values()):
            process.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


class PartFailed(RuntimeError):
    """A part that failed in a worker process (``--jobs``), named with where its output went; its cause is the
    worker's own exception (a bad input stays a bad input: ``diffattn.cli.failure_line`` reads the cause)."""


def _in_parallel(kind: str, todo: dict, worker, jobs: int, logs: Path) -> dict[str, PartOutcome]:
    """Run ``worker(*args, log_file, threads)`` for each ``name: args`` of ``todo``, ``jobs`` at a time in spawned
    worker processes, each with ``cores // jobs`` threads (on two cores SmolLM2's evaluations gained 2–10% that way,
    its adapters' training nothing: benchmarks/RESULTS.md); one progress bar over them here, each one's own output in
    ``logs/NAME.log`` (``logs/eval-NAME.log`` for evaluations). The first failure stops those not yet started (those
    running finish: a part stopped mid-save would have to be resumed) and is raised with the name and log
    (:class:`PartFailed`). Returns the outcomes by name."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from tqdm.auto import tqdm

    threads = max(1, (os.cpu_count() or 1) // jobs)
    prefix = "" if kind == "pretrain" else f"{kind}-"
    what = {"pretrain": "training {} parts", "eval": "evaluating {} models"}[kind].format(len(todo))
    print(f"{what}, {jobs} at a time ({threads} thread{'s' * (threads > 1)} each); "
          f"each one's output: {logs}/{prefix}NAME.log")  # fmt: skip

    def log_of(name: str) -> Path:
        return logs / f"{prefix}{name}.log"

    outcomes: dict[str, PartOutcome] = {}
    context = multiprocessing.get_context("spawn")  # no fork of a process holding torch's thread pools
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool, workers_stopped_with_parent(pool):
        futures = {pool.submit(worker, *args, log_of(name), threads): name for name, args in todo.items()}
        with tqdm(total=len(todo), desc="parts" if kind == "pretrain" else "models", unit="part") as bar:
            for future in as_completed(futures):
                name = futures[future]
                try:
                    outcomes[name] = future.result()
                except KeyboardInterrupt:  # a stop, not the part's failure: workers_stopped_with_parent
                    raise
                except BaseException as e:
                    for f in futures:
                        f.cancel()
                    raise PartFailed(f"{kind} {name} failed: {e} (its output: {log_of(name)})") from e
                bar.update(1)
                bar.set_postfix_str(f"{name} done", refresh=True)
    return outcomes


def _train_in_parallel(parts: list, jobs: int, logs: Path) -> list[PartOutcome]:
    """Train ``parts`` (name, folder, state, config) ``jobs`` at a time (:func:`_in_parallel`), seed 0 of every
    model first (a run cut short has every arm), each reporting where the parent does (``--report-to``); finished
    parts are read back without a worker. The outcomes in the parts' order."""
    from ..train import pretrain
    from ..train.tracking import report_to

    outcomes: dict[str, PartOutcome] = {}
    todo = []
    for name, path, state, config in parts:
        if state == DONE:
            outcomes[name] = _train_part("pretrain", pretrain, name, path, state, config)
        else:
            todo.append((name, path, state, config))
    todo.sort(key=lambda part: part[3].train.seed)
    trackers = tuple(report_to())
    outcomes |= _in_parallel("pretrain", {p[0]: (*p, trackers) for p in todo}, _train_in_worker, jobs, logs)
    return [outcomes[name] for name, *_ in parts]


def _evaluate_in_parallel(config, out: Path, options, done: dict, overwrite, jobs: int) -> list[PartOutcome]:
    """Evaluate the models ``done`` has no outcome for ``jobs`` at a time (:func:`_in_parallel`); the outcomes in
    ``done``'s order."""
    todo = {n: (config, out, n, options, _wants(overwrite, n)) for n, outcome in done.items() if outcome is None}
    ran = _in_parallel("eval", todo, _evaluate_in_worker, jobs, out / "logs")
    return [done[name] or ran[name] for name in done]


def _model_dir(config: ExperimentConfig, out: Path, name: str) -> Path:
    if config.pretrained_path(name) is not None:
        return Path(config.pretrained_path(name))
    return out / ("models" if name in config.scratch_names() else "adapters") / name


def _evaluated(config: ExperimentConfig, out: Path, name: str, options, *, redo: bool) -> PartOutcome | None:
    """The outcome of a model's evaluation already in ``out/eval/NAME`` when its results are of the same request
    (suites, options, results version), of the same training (a pretrained base: at its adapters' length,
    :func:`_base_length`) and not ``redo``; else None (it is to run: :func:`_evaluation_state` says why)."""
    return _evaluation_state(config, out, name, options, redo=redo)[0]


def _evaluation_state(config, out: Path, name: str, options, *, redo: bool) -> tuple[PartOutcome | None, str | None]:
    """(the reusable outcome, None) or (None, why it runs, in words): one home of :func:`_evaluated`'s rule."""
    from ..eval.suite import RESULTS, RESULTS_VERSION

    path = out / "eval" / name
    results_file = path / RESULTS
    wanted = {
        "suites": list(config.eval.suites),
        "options": _jsonable_options(options),
        "results_version": RESULTS_VERSION,
    }
    base_length = _base_length(config, name)
    doc = _read_json(results_file) if results_file.is_file() else None  # read once: per-sample results run to MBs
    if doc is None:
        return None, "not evaluated yet"
    if redo:
        return None, "evaluated again (--overwrite names it)"
    asked = _eval_request(doc)
    if asked != wanted:
        if asked["results_version"] != RESULTS_VERSION:
            return (
                None,
                f"its results are of results version {asked['results_version']}, this code writes {RESULTS_VERSION}",
            )
        changed = setting_differences(
            {k: asked[k] for k in ("suites", "options")}, {k: wanted[k] for k in ("suites", "options")}
        )
        return None, f"the evaluation asked for changed ({'; '.join(changed)})"
    if not _same_training(_evaluated_steps(path), training_identity(_model_dir(config, out, name))):
        return None, "its model was trained again since it was evaluated"
    if base_length is not None and doc.get("metadata", {}).get("trained_length") != base_length:
        return None, f"it is measured at its adapters' length now, {base_length} tokens"
    return PartOutcome("eval", name, path, DONE, 0.0, doc), None


def _evaluate_part(config: ExperimentConfig, out: Path, name: str, options, *, redo: bool) -> PartOutcome:
    """One model's suites into ``out/eval/NAME``, skipped when already there (:func:`_evaluated`)."""
    from ..eval.common import TRAINED_LENGTH, trained_length
    from ..eval.suite import claim_eval_id, load_for_eval, run_suites

    done = _evaluated(config, out, name, options, redo=redo)
    if done is not None:
        return done
    model_dir = _model_dir(config, out, name)
    path = out / "eval" / name
    trained = training_identity(model_dir)
    t0 = time.perf_counter()
    model, tokenizer, description = load_for_eval(model_dir)
    base_length = _base_length(config, name)
    if base_length is not None and trained_length(model) is None:  # measured where its adapters are
        setattr(model, TRAINED_LENGTH, base_length)
    # inside this experiment's folder: ours, whatever an older version left there
    mark(path, "eval", ident=claim_eval_id(path) if path.is_dir() else None)
    doc = run_suites(
        model,
        tokenizer,
        config.eval.suites,
        path,
        options=options,
        name=name,
        description=description,
        style="experiment",
    )
    if trained is not None:  # which training the results are of: a model trained further is evaluated again
        write_text_atomic(path / EVALUATED_STEPS, json.dumps(trained))
    return PartOutcome("eval", name, path, FRESH, time.perf_counter() - t0, doc)


def _base_length(config: ExperimentConfig, name: str) -> int | None:
    """The length a pretrained model of this experiment is measured at where adapters of it are trained here: theirs
    (the shortest, where they differ). A pretrained model records no training length, so the suites would measure it
    at its maximum context up to their caps and its adapters at their training length — different windows and
    prompts, whose rows then cannot pair (found by a helper's audit, 2026-12-01). None for a model that is no
    adapter's base here."""
    from ..train.adapt_config import AdaptRunConfig

    if config.pretrained_path(name) is None:
        return None
    adapters = [a for a in config.adapters if a.base == name]
    lengths = [AdaptRunConfig.from_dict({"data": config.adapter_data(a)}).data.seq_len for a in adapters]
    return min(lengths) if lengths else None


def _eval_targets(config: ExperimentConfig, scratch, adapters=()) -> list:
    """What the suites' preflights can know of the experiment's models before any is trained or loaded: each one's
    positions, training length and tokenizer (built on first use, once per source). A from-scratch model: its
    preset and data. A pretrained model: its folder's config.json and tokenizer, no weights (a known offline name is
    converted here, as the run would convert it), at its adapters' length (:func:`_base_length`). An adapter: its
    base's positions and tokenizer at its own training length — it was checked only once trained, so an evaluation
    that could not fit it failed after the training (a user's review, 2026-12-03). A base whose folder cannot be read
    here is checked when evaluated."""
    from functools import cache

    from ..eval.common import EvalTarget
    from ..models.presets import get_preset
    from ..train.data import data_tokenizer

    tokenizers = {}
    targets: dict[str, EvalTarget] = {}
    for m, run_config in scratch:
        preset = get_preset(run_config.model.preset, **run_config.model.overrides)
        key = repr(run_config.data)
        if key not in tokenizers:
            tokenizers[key] = cache(lambda data=run_config.data: data_tokenizer(data))
        targets[m.name] = EvalTarget(m.name, preset.max_position_embeddings, run_config.data.seq_len, tokenizers[key])
    for p in config.pretrained:
        found = _folder_target(p.name, p.path, _base_length(config, p.name))
        if found is not None:
            targets[p.name] = found
    for a, run_config in adapters:
        base = targets.get(a.base) or _folder_target(a.base, run_config.model.name, None)
        if base is not None:
            targets[a.name] = EvalTarget(a.name, base.positions, run_config.data.seq_len, base.tokenizer)
    return list(targets.values())


def _folder_target(name: str, path: str, trained_length: int | None):
    """The :class:`~diffattn.eval.common.EvalTarget` of a pretrained model by its config.json and tokenizer (loaded
    on first use), or None where there is no folder to read (a name the adapter part will refuse itself)."""
    from functools import cache

    from ..eval.common import EvalTarget, folder_training_length
    from ..models.pretrained import PRETRAINED, max_positions_of, pretrained_folder, refuse_remote_code

    # as load_pretrained reads it: a local folder first, then a known offline name
    folder = Path(path) if Path(path).is_dir() else pretrained_folder(path) if path in PRETRAINED else None
    positions = max_positions_of(folder) if folder is not None else None
    if positions is None:
        return None
    refuse_remote_code(folder, trust_remote_code=False)  # its tokenizer is never loaded with its own code
    # a diffattn run's final/ records the length it trained at: evaluation measures there (load_for_eval)
    trained_length = folder_training_length(folder) or trained_length

    @cache
    def tokenizer():
        from transformers import AutoTokenizer

        from ..models.auto import register_auto_classes

        register_auto_classes()
        return AutoTokenizer.from_pretrained(folder, trust_remote_code=False)

    return EvalTarget(name, positions, trained_length, tokenizer)


EVALUATED_STEPS = "evaluated_steps.json"  # beside results.json: the training steps of the model it evaluated


def _same_training(evaluated: dict | None, trained: dict | None) -> bool:
    """Were the results of this training? Files written before the summary hash was recorded hold the steps only,
    and are judged on the steps (as they were then)."""
    if evaluated is None or evaluated == trained:
        return True
    return trained is not None and set(evaluated) == {"steps"} and evaluated["steps"] == trained["steps"]


def _evaluated_steps(eval_dir: Path) -> dict | None:
    f = eval_dir / EVALUATED_STEPS
    return _read_json(f) if f.is_file() else None


def _jsonable_options(options) -> dict:
    from dataclasses import asdict

    from ..eval.common import jsonable

    return jsonable(asdict(options))


def _read_json(path: Path) -> dict:
    """A part's summary.json or results.json; a damaged one is refused naming the file and the remedy."""
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path} is not valid JSON ({e}): rerun with --overwrite naming its part") from e


def _eval_request(doc: dict) -> dict:
    """What a results.json ``doc`` was asked for: its suites, options and results version."""
    meta = doc.get("metadata", {})
    return {
        "suites": list(doc.get("suites", {})),
        "options": meta.get("options"),
        "results_version": meta.get("results_version"),
    }
