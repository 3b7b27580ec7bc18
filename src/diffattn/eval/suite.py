"""``diffattn eval``: run evaluation suites on one model and write ``results.json`` plus the pictures.

A model is named by any of: a ``diffattn adapt`` run folder (the trained adapter on its base, or ``merged/``), a
``diffattn pretrain`` run folder (its ``final/``), a Hugging Face folder, or a known offline name
(``smollm2-135m``). DIFF Transformer checkpoints (``diffllama``, ``diffattn_diff``) get our attention installed on
load.

Suites (``--suite``, comma-separated): ``ppl`` (perplexity), ``niah`` (multi-needle retrieval), ``alloc``
(attention allocation), ``icl`` (many-shot ICL + order robustness), ``mqar`` (associative recall + AR-Hit),
``outliers`` (activation outliers), ``quant`` (low-bit attention logits), ``heads`` (head analysis) — the entries of
:data:`SUITE_TABLE`, each defined in its own module (:class:`~diffattn.eval.common.Suite`: how it runs, its headline
numbers, its side-by-side report section, its options, checks, protocol sentence and claim measures). Sizes are set
by :data:`SuiteOptions`, made of the shared options and every suite's own (the defaults are CPU-friendly; papers used
more samples — raise them for real runs).

Nothing is left behind as if complete, and nothing finished is lost: ``results.json`` is replaced once, atomically,
after every suite succeeded (a failing rerun leaves the earlier results as they were); pictures go to
``<out>/.partial/`` first and move into place with it. ``--out`` must be new, empty or an evaluation's folder (a rerun
there replaces its results, and removes the earlier pictures the new results do not list). Every
suite's preflight checks the options against the loaded model before the first suite runs, so a suite that cannot run
on it (an ICL set that overflows its context) fails before the others spend their time.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import os
import platform
import shutil
import time
import typing
from dataclasses import asdict, dataclass, fields, make_dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..files import (
    LOCK,
    MARKER,
    RUN_CONFIG,
    dangling_link,
    lock_folder,
    mark,
    marker,
    release_folder,
    write_text_atomic,
)
from . import allocation, heads, icl, mqar, niah, outliers, perplexity
from .common import (
    TRAINED_LENGTH,
    CommonOptions,
    EvalTarget,
    Suite,
    jsonable,
    option_name,
    recorded_length,
    trained_length,
)

# The suite table: a new suite is a module with its `Suite` entry and one name here (or `register_suite(entry)`).
SUITE_TABLE: dict[str, Suite] = {
    entry.name: entry
    for entry in (
        perplexity.SUITE,
        niah.SUITE,
        allocation.SUITE,
        icl.SUITE,
        mqar.SUITE,
        outliers.OUTLIERS_SUITE,
        outliers.QUANT_SUITE,
        heads.SUITE,
    )
}
SUITES = tuple(SUITE_TABLE)
RESULTS = "results.json"
# Bumped when a suite's outputs change meaning or gain fields the report needs (2: per-sample values, strict needle
# scores, |attention| shares; 3: hidden-state outliers of every layer's raw output, the last before the final norm;
# 4: every suite measured at the model's training length by default, NIAH R = 1 cells across N with chance levels;
# 5: floors by simulation in NIAH and MQAR, needles at one sentence start in random order, MQAR per-sample scores;
# 6: the ICL floor by simulation and the test set's label counts; 7: the ICL prompts at the training length too,
# which filled the model's maximum context; 8: every NIAH cell's prompts from seeds of its own, allocation prompts of
# niah_needles needles, one queried, where they had one, ICL per-item hits; 9: the order suite's per-item hits, which
# a margin's analysis could read, how many values each outlier top-k is over, and alloc at niah's context, 2048,
# for a model without a training length; 10: the needle grid's first queried needle at the five depths in turn,
# not at a random depth; 11: the needle answer's 4 tokens of slack stop at the model's last position (a model
# evaluated at its full context generated past it: GPT-2 crashed), the grid rows' per-prompt floors for the table
# by depth, the ICL context source in words), so experiments re-evaluate results written by older code instead of
# reusing them.
RESULTS_VERSION = 11


def register_suite(entry: Suite) -> Suite:
    """Add a suite to the table (its options join :data:`SuiteOptions`, its flags ``diffattn eval``'s)."""
    if entry.name in SUITE_TABLE:
        raise ValueError(f"a suite named {entry.name!r} is already registered")
    SUITE_TABLE[entry.name] = entry
    try:
        options_class()  # its option names must not clash with another suite's
    except ValueError:
        del SUITE_TABLE[entry.name]
        raise
    return entry


@dataclass(frozen=True)
class OptionSpec:
    """One option as the CLI and experiments see it: its field, the suite that owns it (None: shared), its type."""

    name: str
    owner: str | None
    default: object
    kind: object  # the resolved annotation
    help: str
    minimum: int | None
    maximum: int | None
    parse: object

    @property
    def flag(self) -> str:
        return f"--{self.name.replace('_', '-')}"


def option_specs() -> list[OptionSpec]:
    """Every option of :class:`~diffattn.eval.common.CommonOptions` and of each suite in the table, in order."""
    owners = [(None, CommonOptions)] + [(s.name, s.options) for s in SUITE_TABLE.values() if s.options is not None]
    specs: dict[str, OptionSpec] = {}
    for owner, cls in owners:
        hints = typing.get_type_hints(cls)
        for f in fields(cls):
            if f.name in specs:
                if cls is CommonOptions or specs[f.name].owner == owner:
                    continue
                holder = specs[f.name].owner or "the shared options"
                raise ValueError(f"suite {owner!r} declares option {f.name!r}, which {holder} already has")
            meta = f.metadata
            specs[f.name] = OptionSpec(
                f.name, owner, f.default, hints[f.name], meta.get("help", ""), meta.get("minimum"), meta.get("maximum"),
                meta.get("parse"),
            )  # fmt: skip
    return list(specs.values())


class OptionsBase(CommonOptions):
    """What :data:`SuiteOptions` adds to the shared options: the check of every value."""

    def validate(self, suites=None, *, style: str = "field"):
        """Refuse bad values before any model is loaded: every option's bounds, the shared checks, and the checks
        of the suites asked for (``suites``; default every suite). ``style`` names values as the user wrote them:
        ``"flag"`` (``--samples``), ``"experiment"`` (``eval.options.samples``) or ``"field"`` (``samples``)."""

        name = functools.partial(option_name, style=style)

        for spec in option_specs():
            value = getattr(self, spec.name)
            low, high = spec.minimum, spec.maximum
            if (low is None and high is None) or (value is None and spec.default is None):
                continue
            bad = not isinstance(value, int) or isinstance(value, bool)
            if high is not None:
                if bad or not low <= value <= high:
                    raise ValueError(f"{name(spec.name)} must be between {low} and {high}, got {value!r}")
            elif bad or value < low:
                raise ValueError(f"{name(spec.name)} must be >= {low}, got {value!r}")
        for field in ("text", "haystack"):
            source = getattr(self, field)
            if source not in ("shakespeare", "filler") and not Path(source).exists():
                raise ValueError(f"{name(field)} {source!r} does not exist: give shakespeare, filler or a text path")
        for suite in SUITE_TABLE if suites is None else suites:
            if SUITE_TABLE[suite].check is not None:
                SUITE_TABLE[suite].check(self, name)
        return self


@functools.cache
def _compose(entries: tuple) -> type:
    del entries  # the cache key: the table's suites and their option classes
    made = []
    for spec in option_specs():
        if spec.owner is not None:
            own = next(f for f in fields(SUITE_TABLE[spec.owner].options) if f.name == spec.name)
            copy = dataclasses.field(default=own.default, default_factory=own.default_factory, metadata=own.metadata)
            made.append((spec.name, spec.kind, copy))
    return make_dataclass("SuiteOptions", made, bases=(OptionsBase,), namespace={"__module__": __name__})


def options_class() -> type:
    """The dataclass of every suite's options: :class:`~diffattn.eval.common.CommonOptions` and each suite's own
    ``options`` fields, flat (``options.samples``, ``options.niah_grid``), as the table holds them now."""
    return _compose(tuple((s.name, s.options) for s in SUITE_TABLE.values()))


def __getattr__(name: str):
    if name == "SuiteOptions":  # the table's options now (a suite registered later adds its fields)
        return options_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _read_yaml(path: Path) -> dict:
    from ..files import read_yaml

    return read_yaml(path, "config") or {}


def load_for_eval(name_or_path: str | os.PathLike, *, trust_remote_code: bool = False):
    """``(model, tokenizer, description)`` for any model the library produces or loads (see the module doc).

    A folder that cannot be loaded — a JSON file that does not parse, a config value of the wrong type, a tensor of
    the wrong shape — is refused with one ``ValueError`` naming the folder (and the file, for JSON)."""
    from ..models.pretrained import check_json_files, unloadable

    path = Path(name_or_path)
    for folder in (path, path / "final", path / "merged", path / "adapter"):
        check_json_files(folder)
    try:
        return _load_for_eval(name_or_path, trust_remote_code)
    except (ValueError, OSError):
        raise  # already a sentence (OSError: a file-system problem, reported with its path)
    except Exception as e:
        raise unloadable(path, e) from e


def _load_for_eval(name_or_path: str | os.PathLike, trust_remote_code: bool):
    from ..models.pretrained import PRETRAINED, load_pretrained

    path = Path(name_or_path)
    if path.is_dir() and (path / RUN_CONFIG).is_file():
        run = _read_yaml(path / RUN_CONFIG)
        length = recorded_length(run)
        if "method" in run:  # diffattn adapt
            from ..adapters.registry import ADAPTER, MERGED, get_method
            from ..adapters.runs import load_adapted

            spec = get_method(run["method"].get("name"))
            # the zero-overhead form when the run wrote one (equal outputs), unless it hides the method's attention
            # and the adapter is there to read instead
            has_merged, has_adapter = (path / MERGED).is_dir(), (path / ADAPTER).is_dir()
            merged = has_merged and not (spec.merged_hides_attention and has_adapter)
            model, tok = load_adapted(path, merged=merged)
            # the form read, said where the CLI and the report print the description
            if not merged:
                form = " adapter/ (its merged/ attends with the base's maps)" if has_merged else ""
            elif spec.merged_hides_attention:
                form = " merged/ (no adapter/: the attention suites read the base's maps, not the method's)"
            else:
                form = " merged/"
            what = f"{run['method'].get('name')} on {run['model'].get('name')}"
            return _trained_at(model.eval(), length), tok, f"adapt run {path} ({what}){form}"
        if (path / "final").is_dir():
            model, tok = load_pretrained(path / "final", trust_remote_code=trust_remote_code)
            return _trained_at(_install(model), length), tok, f"pretrain run {path} (final/)"
        if (path / "config.json").is_file():  # a pretraining run's final/ or checkpoint (each holds its run.yaml)
            model, tok = load_pretrained(path, trust_remote_code=trust_remote_code)
            what = f"checkpoint of pretrain run {path.parent.parent}" if path.parent.name == "checkpoints" else "model"
            return _trained_at(_install(model), length), tok, f"pretrained {what} {path}"
        raise ValueError(f"run folder {str(path)!r} has no final/ model: did the run finish?")
    if path.is_dir() and not (path / "config.json").is_file():
        from ..models.architectures import ARCHITECTURES

        subs = [p for p in ARCHITECTURES if (path / p / RUN_CONFIG).is_file()]
        if subs:
            options = " or ".join(str(path / s) for s in subs)
            raise ValueError(f"{str(path)!r} is a paired pretraining run: evaluate {options}")
        raise ValueError(f"{str(path)!r} is neither a diffattn run folder nor a Hugging Face model folder")
    if not path.is_dir() and str(name_or_path) not in PRETRAINED:
        raise ValueError(
            f"model {str(name_or_path)!r} does not exist: give a run folder, a Hugging Face folder or one of "
            f"{', '.join(PRETRAINED)}"
        )
    model, tok = load_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    return _install(model), tok, str(name_or_path)


def _trained_at(model, length):
    """Record the sequence length the run trained at: the suites measure there by default
    (:func:`diffattn.eval.common.evaluation_window`)."""
    if isinstance(length, int) and length > 0:
        setattr(model, TRAINED_LENGTH, length)
    return model


def _install(model):
    from ..models.install import DIFF_MODEL_TYPES, install_diff_attention

    if model.config.model_type in DIFF_MODEL_TYPES:  # our attention (options from config.diffattn), not HF's
        install_diff_attention(model)
    return model.eval()


def parse_suites(text: str | list[str]) -> list[str]:
    names = [s.strip() for s in text.split(",")] if isinstance(text, str) else list(text)
    names = [n for n in names if n]
    unknown = [n for n in names if n not in SUITE_TABLE]
    if unknown or not names:
        known = ", ".join(SUITE_TABLE)
        raise ValueError(f"unknown suite(s) {', '.join(unknown) or '(none given)'}; choose from {known}")
    return list(dict.fromkeys(names))


def run_suites(
    model,
    tokenizer,
    suites: list[str],
    out: str | os.PathLike,
    *,
    options=None,
    name: str = "model",
    description: str = "",
    style: str = "field",
) -> dict:
    """Run ``suites`` on ``model``; write ``<out>/results.json`` and one PNG per picture. Returns the results.
    ``style``: how an error names a bad option (``"flag"``: ``diffattn eval``'s; ``"experiment"``: a config's)."""
    suites = parse_suites(suites)
    o = (options or options_class()()).validate(suites, style=style)
    out = Path(out)
    check_eval_folder(out)
    # every suite's preflight on this model before the first runs: results.json is written when all succeed, so a
    # suite that cannot run (an ICL set that does not fit the context) must fail now, not after the others ran
    if any(SUITE_TABLE[s].preflight is not None for s in suites):  # (a custom suite may need no positions)
        preflight_suites(suites, o, [EvalTarget.of_model(model, tokenizer, name)], style=style)
    lock_folder(out, command="diffattn eval")  # a second evaluation into the folder is refused, naming this one
    try:
        check_eval_folder(out)  # again under the lock: another process may have written there meanwhile
        ident = claim_eval_id(out)
        mark(out, "eval", ident=ident)
        partial = out / ".partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        try:
            return _run(model, tokenizer, suites, out, partial, o, name, description)
        finally:
            shutil.rmtree(partial, ignore_errors=True)  # on failure: no half-made pictures either
    finally:
        release_folder(out)


def preflight_suites(suites: list[str], options, targets, *, style: str = "field") -> None:
    """Each suite's preflight (:attr:`Suite.preflight`) against the models ``targets`` (:class:`EvalTarget`): what
    cannot run on them is refused before any suite runs (or, in an experiment, before any training), naming the
    options in ``style`` (:func:`~diffattn.eval.common.option_name`)."""
    name = functools.partial(option_name, style=style)
    for suite in suites:
        preflight = SUITE_TABLE[suite].preflight
        if preflight is None:
            continue
        try:  # a suite written before preflights took ``name`` (2026-12-03) takes (options, targets)
            two = len(inspect.signature(preflight).parameters) == 2
        except (TypeError, ValueError):
            two = False
        preflight(options, targets) if two else preflight(options, targets, name)


def claim_eval_id(out: Path) -> str:
    """The identity an evaluation folder's marker and results.json share: its own once proven, else a new one."""
    from ..files import new_id

    made = marker(out) or {}
    try:
        meta = json.loads((out / RESULTS).read_text()).get("metadata", {})
    except (OSError, ValueError, AttributeError):
        meta = {}
    same = made.get("id") and isinstance(meta, dict) and meta.get("diffattn_id") == made.get("id")
    return made["id"] if same else new_id()


def check_eval_folder(out: Path) -> None:
    """``out`` must be new, empty, or an evaluation's folder (ours: it has the marker, or an earlier diffattn
    ``results.json``), since its results and pictures are replaced there; refused with the reason otherwise."""
    problem = dangling_link(out, "--out", "name a folder for results.json and the pictures")
    if problem:
        raise ValueError(problem)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {str(out)!r} is a file: name a folder for results.json and the pictures")
    if not out.exists() or {p.name for p in out.iterdir()} <= {LOCK}:
        return
    made = marker(out) or {}
    try:
        earlier = json.loads((out / RESULTS).read_text())
        meta = earlier.get("metadata", {})
    except (OSError, ValueError, AttributeError):
        earlier, meta = None, {}
    meta = meta if isinstance(meta, dict) else {}
    if "results_version" in meta and "diffattn_id" not in meta:
        # an earlier version's evaluation, or any results.json without an identity: it licenses nothing (the
        # pictures beside it may be the user's); the user moves it aside
        raise ValueError(
            f"--out {str(out)!r} holds a results.json that records no diffattn identity (an earlier version's "
            "evaluation, or not diffattn's): nothing proves its other files are the evaluation's; move the folder "
            "aside or choose a new --out"
        )
    if made.get("kind") == "eval":
        # the marker proves the folder ours only with the results that repeat its identity (a planted marker does
        # not), or when it is all there is (an evaluation that failed before writing results)
        if made.get("id") and meta.get("diffattn_id") == made.get("id"):
            return
        if {p.name for p in out.iterdir()} <= {MARKER, LOCK, ".partial"}:
            return
    raise ValueError(
        f"--out {str(out)!r} holds files diffattn eval did not write: choose a new or empty folder (its results "
        "and pictures would replace files of the same names there)"
    )


def _run(model, tokenizer, suites, out: Path, partial: Path, o, name: str, description: str) -> dict:
    results: dict = {}
    pictures: dict[str, str] = {}
    timings: dict[str, float] = {}
    for suite in tqdm(suites, desc=f"eval {name}", leave=True):
        t0 = time.perf_counter()
        results[suite], made = SUITE_TABLE[suite].run(model, tokenizer, o, partial, name)
        pictures.update(made)
        timings[suite] = time.perf_counter() - t0
    document = {
        "model": name,
        "description": description,
        "suites": results,
        "pictures": pictures,
        "metadata": {
            "results_version": RESULTS_VERSION,
            "diffattn_id": (marker(out) or {}).get("id"),  # repeats the folder marker's: the proof it is ours
            "options": asdict(o),
            "seconds": timings,
            "parameters": sum(p.numel() for p in model.parameters()),
            "trained_length": trained_length(model),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "device": str(next(model.parameters()).device),
        },
    }
    earlier = _earlier_pictures(out)
    for f in partial.iterdir():  # every suite succeeded: publish the pictures, then the results
        os.replace(f, out / f.name)
    write_text_atomic(out / RESULTS, json.dumps(jsonable(document), indent=2))
    for stale in earlier - set(pictures.values()):  # an earlier evaluation's picture these results do not have
        (out / stale).unlink(missing_ok=True)
    return document


def _earlier_pictures(out: Path) -> set[str]:
    """The pictures the evaluation already in ``out`` listed (the folder is ours: :func:`check_eval_folder`), so that
    a rerun with other suites removes those it does not make again: an old ``allocation.png`` stayed beside results
    without alloc (a user's review, 2026-12-03). Plain file names only."""
    try:
        listed = json.loads((out / RESULTS).read_text()).get("pictures") or {}
    except (OSError, ValueError, AttributeError):
        return set()
    names = listed.values() if isinstance(listed, dict) else ()
    return {n for n in names if isinstance(n, str) and n == Path(n).name and n.endswith(".png")}
