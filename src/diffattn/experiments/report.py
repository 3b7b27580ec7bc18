"""The experiment report: ``report.md`` and ``results.json`` from the run folders of an experiment.

What it holds: the paper claims the experiment touches (the paper's figure, ours with 95% intervals, the
difference with its interval and a verdict — agrees, disagrees or inconclusive — and a paragraph on what this
scale can show; see :mod:`.claims`), a table of every model × metric (parameters, trainable parameters, steps,
validation loss, tokens/s, wall time, each evaluation's headline numbers), training loss and λ curves of all runs,
the evaluations side by side (NIAH heatmaps, attention-allocation bars with standard errors, negative mass and
per-layer values, ICL accuracy, outlier and quantization tables, head distances), and the exact config and
environment.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import socket
import tempfile
from pathlib import Path

from ..environment import REPRODUCING, environment
from ..eval.common import ema, figure, fmt, group_colors, jsonable, save_figure, seed_group
from ..files import contents, file_sha256, locked, new_id, overwrite_problem, write_text_atomic, writing
from ..models.architectures import ARCHITECTURES, MEAN_LAMBDA

logger = logging.getLogger(__name__)


def _metrics(run_dir: Path) -> list[dict]:
    f = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in f.read_text().splitlines()] if f.is_file() else []


def _method_settings(outcomes) -> list[str]:
    """One protocol line per adapter: the method's resolved settings from its summary.json (those its registry
    entry names: defaults that may change between versions, e.g. DAA's placement, so they are in every report)."""
    from ..adapters.registry import get_method, method_names

    lines = []
    for o in outcomes:
        if o.kind != "adapt":
            continue
        method, resolved = o.summary.get("method"), o.summary.get("method_config") or {}
        settings = get_method(method).report_settings if method in method_names() else ()
        shown = [f"{k} {resolved[k]}" for k in settings if k in resolved]
        grid = _lr_grid_record(o.path)
        if grid:
            shown.append(grid)
        if shown:
            lines.append(f"- {o.name} ({method}): " + ", ".join(shown))
    return lines


def _lr_grid_record(run_dir: Path) -> str | None:
    """ "lr X, chosen by validation loss from the grid (rate: loss, …)" of a part trained from a learning-rate
    grid (its run.yaml records the grid), else None."""
    from ..train.adapt_config import AdaptRunConfig

    try:
        train = AdaptRunConfig.load(run_dir / "run.yaml").train
    except (OSError, ValueError):
        return None
    if not train.lr_grid_val_loss:
        return None
    losses = ", ".join(
        f"{float(k):g}: {v:.4f}" for k, v in sorted(train.lr_grid_val_loss.items(), key=lambda kv: float(kv[0]))
    )
    return (
        f"lr {train.lr:g} (every trained parameter), chosen by final validation loss before any evaluation from "
        f"the grid ({losses})"
    )


def _protocol(config) -> list[str]:
    """What was trained on what and measured how, in words, from the experiment's config (the exact YAML is at the
    end of the report)."""
    from ..eval.suite import SUITE_TABLE, SuiteOptions
    from ..train import RunConfig
    from ..train.adapt_config import AdaptRunConfig

    lines = ["## Protocol", ""]
    if config.models:
        d = RunConfig.from_dict({"data": dict(config.data)}).data
        t = RunConfig.from_dict({"train": dict(config.train)}).train
        groups = config.seed_groups()
        seeds = ", ".join(f"{g} × {len(n)} seeds" for g, n in groups.items() if len(n) > 1) or "one seed each"
        lines.append(
            f"- From scratch: {', '.join(f'{m.name} ({m.preset}, {m.attention})' for m in config.models)}; {seeds}. "
            f"{t.max_steps} steps × {t.global_batch_size} sequences × {d.seq_len} tokens, lr {t.lr:g}, "
            f"{t.schedule} schedule" + _horizon_words(t) + "."
        )
        lines.append("- Data: " + _data_words(d, tokenizer=True))
    if config.adapters:
        common = config.adapter_data()  # the data of every entry without data of its own
        a = AdaptRunConfig.from_dict({"data": common})
        at = AdaptRunConfig.from_dict({"train": dict(config.adapt_train)}).train
        bases = sorted({x.base for x in config.adapters})
        lines.append(
            f"- Adapters on {', '.join(bases)}: {', '.join(x.name for x in config.adapters)}; {at.max_steps} steps × "
            f"{at.global_batch_size} × {a.data.seq_len} tokens, lr {at.lr:g}, {at.schedule}; "
            + "data: "
            + _data_words(a.data, tokenizer=False)
        )
        for x in config.adapters:  # an entry with data of its own (e.g. a text-only arm beside the practice mix)
            own = config.adapter_data(x)
            if own != common:
                words = _data_words(AdaptRunConfig.from_dict({"data": own}).data, tokenizer=False)
                lines.append(f"  - {x.name} adapts on data of its own: {words}")
    o = SuiteOptions(**{"seed": config.seed, **config.eval.options})
    sentences, others = [], []
    for name in config.eval.suites:  # a sentence of each suite that has one (shared sentences once), then the rest
        protocol = SUITE_TABLE[name].protocol
        if protocol is None:
            others.append(name)
        elif protocol not in sentences:
            sentences.append(protocol)
    lines += [f"- {protocol(o)}" for protocol in sentences]
    if others:
        window = o.window or "the training length of"
        lines.append(
            f"- Other suites: {', '.join(others)} over {o.tokens} tokens of {o.text} (test split), in windows of "
            f"{window} tokens."
        )
    return [*lines, ""]


def _horizon_words(t) -> str:
    """Where a run stops inside its schedule, when it stops before the schedule's end (``train.schedule_steps``)."""
    if t.resolved_schedule_steps == t.max_steps:
        return ""
    return (
        f", stopped at step {t.max_steps} of a {t.resolved_schedule_steps}-step schedule "
        f"({t.resolved_warmup_steps} warmup steps, then decay to {t.min_lr_ratio:g}·lr at its end)"
    )


def _data_words(d, *, tokenizer: bool) -> str:
    words = f"{d.source}"
    if d.retrieval_fraction > 0:
        scored = "the answer only" if d.needle_loss == "answer" else "every token"
        words += (
            f" plus {d.retrieval_fraction:.0%} retrieval practice rows ({1 - d.mqar_fraction:.0%} needle rows with 1–"
            f"{d.max_needles} needles and {d.needle_digits}-digit numbers, loss on {scored}; "
            f"{d.mqar_fraction:.0%} MQAR"
            + ("; haystack lengths uniform from none to the whole row" if d.varied_context else "")
            + (f"; up to {d.needle_questions} questions a row" if getattr(d, "needle_questions", 1) > 1 else "")
            + ")"
        )
    if tokenizer and hasattr(d, "vocab_size"):
        words += f"; BPE tokenizer of {d.vocab_size} tokens trained on the training text"
        if d.tokenizer_needle_words:
            words += " and the needle template (its words, keys and numbers are single tokens)"
    return words + "."


def _training_row(summary: dict, kind: str, *, parameters: str, trainable: str, val_loss: str) -> dict:
    """A training part's columns of the models × metrics table from its summary.json (the named keys differ
    between pretraining and adapting)."""
    return {
        "kind": kind,
        "parameters": summary.get(parameters),
        "trainable": summary.get(trainable),
        "steps": summary.get("steps"),
        "val_loss": summary.get(val_loss),
        "tokens_per_s": summary.get("tokens_per_s"),
        "train_seconds": summary.get("wall_seconds"),
    }


def _model_rows(config, outcomes) -> dict[str, dict]:
    """One row per model: pretrained ones, then every part's training columns and its suites' headline numbers."""
    from ..eval.suite import SUITE_TABLE

    rows: dict[str, dict] = {p.name: {"model": p.name, "kind": f"pretrained ({p.path})"} for p in config.pretrained}
    for o in outcomes:
        row = rows.setdefault(o.name, {"model": o.name})
        s = o.summary
        if o.kind == "pretrain":
            kind = f"from scratch ({s.get('attention')})"
            row.update(
                _training_row(s, kind, parameters="parameters", trainable="parameters", val_loss="final_val_loss")
            )
            from ..eval.measures import UNIGRAM_FLOOR

            # the data section's key is the column's name (train.data.prepare_data); runs before 2026-12-01 have none
            floor = (s.get("data") or {}).get(UNIGRAM_FLOOR)
            if floor is not None:
                row[UNIGRAM_FLOOR] = floor
        elif o.kind == "adapt":
            kind = f"{s.get('method')} on {Path(str(s.get('model'))).parent.name or s.get('model')}"
            row.update(
                _training_row(
                    s, kind, parameters="total_parameters", trainable="trainable_parameters", val_loss="val_loss_after"
                )
            )
        else:
            row.setdefault("parameters", s.get("metadata", {}).get("parameters"))
            for suite, r in s.get("suites", {}).items():
                if suite in SUITE_TABLE:
                    row.update(SUITE_TABLE[suite].headline(r))
    return rows


def write_report(config, out: Path, outcomes) -> Path:
    """Write ``out/report.md`` and ``out/results.json``; returns the report's path."""
    rows = _model_rows(config, outcomes)
    columns = ["model", "kind", "parameters", "trainable", "steps", "val_loss", "tokens_per_s", "train_seconds"]
    metrics = sorted({k for r in rows.values() for k in r} - set(columns))
    _cards_get_headlines(outcomes, rows, metrics)
    from .claims import claims_json

    evals = {o.name: o.summary.get("suites", {}) for o in outcomes if o.kind == "eval"}
    claim_lines, claims, scope = _claims_section(config, rows, evals)
    lines = [f"# Experiment `{config.name}`", "", "## Paper claims", "", *claim_lines]
    lines += [*_protocol(config)[:-1], *_method_settings(outcomes), ""]  # the adapters' settings end the list
    lines += ["## Models × metrics", "", "| " + " | ".join(c.replace("|", "\\|") for c in columns + metrics) + " |"]
    lines += ["|" + "---|" * (len(columns) + len(metrics))]
    for r in rows.values():
        lines.append("| " + " | ".join(fmt(r.get(c)) for c in columns + metrics) + " |")
    lines += [
        "",
        "Validation loss is on each run's own tokenizer and data: compare from-scratch models with each "
        "other and adapters with each other.",
        "",
    ]

    lines += _training_section(outcomes, out)
    lines += ["## Evaluations", ""]
    lines += _side_by_side(evals, out)
    lines += _pictures_section(outcomes, out)
    lines += ["## Config and environment", "", "```yaml", (out / "experiment.yaml").read_text().rstrip(), "```", ""]
    env = environment()
    lines.append(", ".join(f"{k} {v}" for k, v in env.items()))
    lines += _training_environments(outcomes, env)
    report = out / "report.md"
    text = "\n".join(lines) + "\n"
    check_report_writable(out, text)
    results = {
        "experiment": config.name,
        "report_sha256": hashlib.sha256(text.encode()).hexdigest(),  # an edit of report.md since is never overwritten
        "models": list(rows.values()),
        "parts": [{"kind": o.kind, "name": o.name, "state": o.state, "seconds": o.seconds} for o in outcomes],
        "claims": claims_json(claims),
        "claims_scope": scope,
        "evaluations": evals,
        "config": config.to_dict(),
        "environment": env,
    }
    write_text_atomic(out / "results.json", json.dumps(jsonable(results), indent=2))
    write_text_atomic(report, text)
    return report


def check_report_writable(out: Path, new_text: str | None = None) -> None:
    """Refuse to replace ``out/report.md`` unless it is the one diffattn wrote last (its SHA-256 is the
    ``report_sha256`` its results.json recorded) or already reads ``new_text``: the rule of
    :func:`diffattn.files.overwrite_problem`. Raises naming the file and what to do."""
    try:
        results = json.loads((out / "results.json").read_text())
        recorded = results.get("report_sha256")
        recorded = [recorded] if isinstance(recorded, str) else []  # results without one: an earlier version's
    except (OSError, ValueError, AttributeError):
        recorded = None
    new = hashlib.sha256(new_text.encode()).hexdigest() if new_text is not None else None
    why = overwrite_problem(out / "report.md", recorded, new_sha256=new)
    if why:
        raise ValueError(
            f"{out / 'report.md'} is {why}: diffattn does not overwrite it; move it aside (or delete it) and run "
            "again (finished parts are not redone)"
        )


def _claims_section(config, rows: dict[str, dict], evals: dict[str, dict]):
    """(the lines under "## Paper claims": the claim rows and the not-testable table, the claims, their scope)."""
    from .claim_list import PAPER_CLAIM_LIST, not_testable_markdown
    from .claims import claims_markdown, claims_scope, paper_claims

    claims = paper_claims(config, rows, evals, seed=config.seed)
    scope = claims_scope(config, rows, evals)
    touched = {e.paper for e in PAPER_CLAIM_LIST for c in claims if c.source.startswith(e.paper)}
    return [*claims_markdown(claims, scope), *not_testable_markdown(touched)], claims, scope


def refresh_report(folder: str | Path) -> Path:
    """Rewrite an exported report's verdicts (``diffattn export``'s ``results/NAME``) with this version's claims
    engine and suites, from its own ``results.json``: the "Paper claims" section, the side-by-side "Evaluations"
    tables and pictures, and results.json's ``claims``. Nothing is measured again: the models, their evaluations and
    every other section stay as they were, and the claims section says it was refreshed. Like an export it
    overwrites only files the export wrote and nobody changed since (and records the new ones) — except that a
    report.md annotated outside the sections a refresh rewrites (:data:`REFRESHED_SECTIONS`, whose contents the
    export's marker records) is refreshed with the notes kept, and stays the user's: the next export refuses to
    overwrite it."""
    folder = Path(folder)
    if folder.is_symlink() or not folder.is_dir():
        raise ValueError(f"{folder} is not a folder (diffattn refresh reads an exported report's folder)")
    with locked(folder, command="diffattn refresh"):  # an export or another refresh into it is refused meanwhile
        return _refresh_locked(folder)


def _refresh_locked(folder: Path) -> Path:
    from .. import __version__
    from .claims import claims_json
    from .config import ExperimentConfig

    report_path, results_path = folder / "report.md", folder / "results.json"
    owned = _exported_files(folder)
    if owned is None or not report_path.is_file() or not results_path.is_file():
        raise ValueError(
            f"{folder} is not an exported report (diffattn export writes report.md, results.json and "
            f"{EXPORT_MARKER}); a run folder's report is rewritten by `diffattn run` itself"
        )
    try:
        doc = json.loads(results_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{results_path} is not valid JSON ({e}): the folder is damaged; export it again") from e
    # what refresh reads of it, checked by hand: the full schema's check (experiments.schema) needs jsonschema, a test
    # dependency only
    missing = [key for key in ("config", "models", "evaluations") if key not in doc] if isinstance(doc, dict) else None
    if missing is None or missing:
        what = f"no {', '.join(missing)}" if missing else f"a {type(doc).__name__}, not a mapping"
        raise ValueError(f"{results_path} is not a results file ({what}): the folder is damaged; export it again")
    config = ExperimentConfig.from_dict(doc["config"])
    rows, evals = {m["model"]: m for m in doc["models"]}, doc["evaluations"]
    claim_lines, claims, scope = _claims_section(config, rows, evals)
    claim_lines += [
        f"Verdicts refreshed by diffattn {__version__} from results.json (the measurements are those of the run).",
        "",
    ]
    doc["claims"], doc["claims_scope"] = claims_json(claims), scope
    texts = {"results.json": json.dumps(jsonable(doc), indent=2)}
    with tempfile.TemporaryDirectory(dir=folder, prefix=".refresh-") as tmp:
        staged = Path(tmp)
        # the text and its checksum from one read: a save while the pictures are drawn then no longer matches
        data = report_path.read_bytes()
        report, had = data.decode(), hashlib.sha256(data).hexdigest()
        claims_at, evaluations_at = REFRESHED_SECTIONS
        lines = _replace_section(report.split("\n"), claims_at, claim_lines)
        evaluations = _side_by_side(evals, staged)  # pictures drawn aside, moved in once checked
        texts["report.md"] = "\n".join(_replace_section(lines, evaluations_at, evaluations))
        for name, text in texts.items():
            (staged / name).write_text(text)
        new = {f.name: file_sha256(f) for f in staged.iterdir()}
        licence = owned
        if had not in owned.get("report.md", []) and _refreshed_sha256(report) in _exported_sections(folder):
            # annotated outside what refresh rewrites, which is as the export (or a refresh) wrote it: notes kept
            licence = {**owned, "report.md": [*owned.get("report.md", []), had]}
        _check_export_destination(folder, new, licence, command="refresh")
        recorded = _record_after(folder, new, owned)
        for name in new:
            os.replace(staged / name, folder / name)
    marker = (folder / EXPORT_MARKER).read_text()
    source = json.loads(marker)["exported_from"] if owned else marker.removeprefix("exported from ").strip()
    _write_export_marker(folder, Path(source or folder), {**owned, **recorded}, [_refreshed_sha256(texts["report.md"])])
    return report_path


#: what ``diffattn refresh`` rewrites of a report.md: (header, the line start that ends the section; a "## " header
#: always does)
REFRESHED_SECTIONS = (("## Paper claims", "## "), ("## Evaluations", "### Every model"))


def _refreshed_sha256(text: str) -> str | None:
    """SHA-256 of what a refresh rewrites of a report's ``text`` (its :data:`REFRESHED_SECTIONS`' lines); None when
    a section is missing (not a report refresh can read)."""
    lines, parts = text.split("\n"), []
    for header, until in REFRESHED_SECTIONS:
        if header not in lines:
            return None
        start, end = _section_span(lines, header, until)
        parts.append("\n".join(lines[start:end]))
    return hashlib.sha256("\n\0\n".join(parts).encode()).hexdigest()


def _replace_section(lines: list[str], section: tuple[str, str], body: list[str]) -> list[str]:
    """``lines`` with what follows ``section``'s header up to the next line starting with its ``until`` (or a "## "
    header) replaced by ``["", *body]`` (a missing header: the report is not one this version can refresh)."""
    header, until = section
    if header not in lines:
        raise ValueError(f"the report has no {header!r} section")
    start, end = _section_span(lines, header, until)
    return [*lines[:start], "", *body, *lines[end:]]


def _section_span(lines: list[str], header: str, until: str) -> tuple[int, int]:
    """The lines after ``header`` up to the next starting with ``until`` or "## ", as a slice's (start, end)."""
    start = lines.index(header) + 1
    end = next(
        (i for i in range(start, len(lines)) if lines[i].startswith(until) or lines[i].startswith("## ")), len(lines)
    )
    return start, end


def _training_section(outcomes, out: Path) -> list[str]:
    """The loss and λ curves of every training part (pictures written into ``out``) and each one's final λ."""
    lines = []
    curves = _loss_curves(outcomes, out / "loss_curves.png")
    if curves:
        lines += ["## Training", "", f"![loss curves]({curves.name})", ""]
    lam_curves = _lambda_curves(outcomes, out / "lambda_curves.png")
    if lam_curves:
        lines += [f"![λ curves]({lam_curves.name})", ""]
    lams = [(o.name, o.summary.get("lambda")) for o in outcomes if o.kind in ("pretrain", "adapt")]
    lams = [(n, v) for n, v in lams if v]
    if lams:
        lines += ["λ per layer at the end of training:", ""]
        lines += [f"- {n}: " + ", ".join(f"{x:.3f}" for x in v) for n, v in lams]
        lines.append("")
    return lines


def _pictures_section(outcomes, out: Path) -> list[str]:
    """Every evaluated model's own pictures, linked relative to the report."""
    lines = ["### Every model's pictures", ""]
    for o in outcomes:
        if o.kind != "eval":
            continue
        pics = o.summary.get("pictures", {})
        if pics:
            lines.append(f"### {o.name}")
            lines += [f"![{k}]({Path(o.path, v).relative_to(out)})" for k, v in pics.items()]
            lines.append("")
    return lines


def _training_environments(outcomes, evaluated: dict) -> list[str]:
    """The report's lines on where the models were trained: each training part's recorded environment
    (:func:`diffattn.environment.environment`, in its summary.json since 2026-12-02), grouped, where it differs from
    the evaluation's in what decides the numbers (:data:`~diffattn.environment.REPRODUCING`): the same seed trains
    another model on another CPU kind."""
    groups: dict[tuple, list[str]] = {}
    for o in outcomes:
        env = (o.summary or {}).get("environment") if o.kind in ("pretrain", "adapt") else None
        if env:
            groups.setdefault(tuple(sorted(env.items())), []).append(o.name)
    if not groups:
        return []
    same = lambda env: all(env.get(k) == evaluated.get(k) for k in REPRODUCING)  # noqa: E731
    if len(groups) == 1 and same(dict(next(iter(groups)))):
        return ["", "Trained in the same environment."]
    lines = ["", "Trained in:"]
    for env, names in groups.items():
        lines.append(f"- {', '.join(names)}: " + ", ".join(f"{k} {v}" for k, v in env))
    return lines


def _cards_get_headlines(outcomes, rows: dict[str, dict], metrics: list[str]) -> None:
    """Each trained model's folders (final/, merged/, adapter/) get the report's headline numbers in their model cards
    (diffattn.cards; a card the user wrote is left alone)."""
    from ..cards import add_headline

    for o in outcomes:
        if o.kind not in ("pretrain", "adapt"):
            continue
        row = rows.get(o.name, {})
        headline = {k: row[k] for k in ["val_loss", *metrics] if isinstance(row.get(k), (int, float))}
        for form in ("final", "merged", "adapter"):
            if (Path(o.path) / form).is_dir():
                add_headline(Path(o.path) / form, headline)


def _loss_curves(outcomes, path: Path) -> Path | None:
    """Training loss of every run: the EMA trend drawn over the raw curve (faint), one colour per model group (the
    seeds of one architecture share it)."""
    series = []
    for o in outcomes:
        if o.kind in ("pretrain", "adapt"):
            points = [(e["step"], e["loss"]) for e in _metrics(o.path) if "loss" in e]
            if points:
                series.append((o.name, o.kind, points))
    if not series:
        return None
    plt = figure()
    colors = group_colors([o.name for o in outcomes if o.kind in ("pretrain", "adapt")])  # the same in every picture
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    labelled = set()
    for name, kind, points in series:
        steps, losses = zip(*points, strict=True)
        group = seed_group(name)
        ax.plot(steps, losses, color=colors[name], alpha=0.15, linewidth=0.8)
        label = None if group in labelled else f"{group} ({kind})"
        labelled.add(group)
        ax.plot(steps, ema(losses), color=colors[name], linewidth=1.4, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (EMA; raw faint)")
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def _lambda_curves(outcomes, path: Path) -> Path | None:
    """Mean λ over layers vs step for every run that logs λ (DIFF models, adapters); DIFF V2's value is its gate
    (the mean of sigmoid(x·w_λ) over tokens and heads), on its own axis and labelled so."""
    series = []
    for o in outcomes:
        if o.kind in ("pretrain", "adapt"):
            points = [(e["step"], sum(e["lambda"]) / len(e["lambda"])) for e in _metrics(o.path) if e.get("lambda")]
            if points:
                attention = (o.summary or {}).get("attention")  # adapters: none; their λ(t) reads as DIFF's
                readout = ARCHITECTURES[attention].lambda_readout if attention in ARCHITECTURES else None
                series.append((o.name, readout or MEAN_LAMBDA, points))
    if not series:
        return None
    plt = figure()
    colors = group_colors([o.name for o in outcomes if o.kind in ("pretrain", "adapt")])  # the same in every picture
    panels = list(dict.fromkeys(readout for _, readout, _ in series))  # one axis per meaning of λ
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 3.2), squeeze=False)
    for ax, title in zip(axes[0], panels, strict=True):
        labelled = set()
        for name, readout, points in series:
            if readout != title:
                continue
            group = seed_group(name)
            ax.plot(*zip(*points, strict=True), color=colors[name], label=None if group in labelled else group)
            labelled.add(group)
        ax.set_xlabel("step")
        ax.set_ylabel(title)
        ax.legend(fontsize=7)
    return save_figure(fig, path)


def _side_by_side(evals: dict[str, dict], out: Path) -> list[str]:
    """Pictures and tables that put every model's evaluation next to the others', suite by suite (each suite's
    ``compare`` in the suite table)."""
    from ..eval.suite import SUITE_TABLE

    lines: list[str] = []
    for name, suite in SUITE_TABLE.items():
        results = {n: s[name] for n, s in evals.items() if name in s}
        if results and suite.compare is not None:
            lines += suite.compare(results, out)
    return lines


EXPORT_MARKER = ".diffattn-export"  # marks a folder export_report made: JSON, what it wrote (see export_report)
EXPORT_STAGING = ".diffattn-export-staging"  # marks export_report's temporary copy beside the destination


def export_report(experiment_dir: str | Path, dest: str | Path) -> Path:
    """Copy an experiment's ``report.md``, ``results.json``, ``experiment.yaml`` and every picture the report links
    into ``dest`` (e.g. ``results/<experiment>/`` of a repository): the evidence without the checkpoints.

    ``dest`` must be new, empty or an earlier export (it holds :data:`EXPORT_MARKER`: JSON naming every file the
    export wrote with its SHA-256; an earlier version wrote ``exported from SRC``). Only the export's own files are
    written: a file of the previous export is replaced (or removed, once no longer exported) only while it is as
    that export wrote it; a changed one, or a file at an exported name that the previous export did not write, is
    refused, naming it; every other file (``notes.md``) is left as it is. Symbolic links in the experiment folder
    are not followed: a picture that is one is skipped with a warning; ``report.md`` or ``results.json`` being one
    is refused. The copy is made in ``.DEST.export-ID`` beside ``dest`` (marked :data:`EXPORT_STAGING`) and moved in
    file by file, the marker listing old and new contents meanwhile, so an interrupted export leaves files that the
    next one recognises; a temporary copy a killed export left is removed by the next export to ``dest``."""
    src, dest = Path(experiment_dir), Path(dest)
    report = src / "report.md"
    if not src.is_dir():
        raise ValueError(f"experiment folder {str(src)!r} does not exist")
    if not report.is_file() or not (src / "results.json").is_file():
        raise ValueError(f"{src} has no report.md and results.json: run the experiment (diffattn run) first")
    for required in ("report.md", "results.json"):
        if _link_on_the_way(src, required):
            raise ValueError(
                f"{src / required} is (or lies under) a symbolic link: export copies no links (one could point "
                "anywhere); put the file itself there"
            )
    if dest.is_symlink():
        raise ValueError(f"{dest} is a symbolic link: name the destination folder itself")
    if dest.exists() and not dest.is_dir():
        raise ValueError(f"{dest} is a file: choose a folder as the destination")
    with locked(dest, command="diffattn export"):  # a second export (or refresh) into dest is refused meanwhile
        return _export_locked(src, report, dest)


def _export_locked(src: Path, report: Path, dest: Path) -> Path:
    import re

    owned = _exported_files(dest)  # name -> the contents the previous export wrote; None: not an export's folder
    if owned is None and contents(dest):
        raise ValueError(f"{dest} exists and was not made by diffattn export: choose another destination")
    before, now = _experiment_name(dest / "results.json"), _experiment_name(src / "results.json")
    if owned is not None and before is not None and now is not None and before != now:
        # another experiment's evidence would be replaced without a word (a mistyped results/NAME; a review)
        raise ValueError(
            f"{dest} holds the export of experiment {before!r}, not {now!r}: choose another destination, or move "
            "that export away first"
        )
    text = report.read_text()
    pictures = sorted(set(re.findall(r"\]\(([^)\s]+\.png)\)", text)))
    for name in pictures:  # only pictures inside the experiment folder are copied, to the same place inside dest
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise ValueError(f"report.md links {name!r}, outside the experiment folder: not exported")
    names = []
    for name in ("report.md", "results.json", "experiment.yaml", *pictures):
        if _link_on_the_way(src, name):
            logger.warning("export: %s is (or lies under) a symbolic link: not followed, not exported", src / name)
        elif (src / name).is_file():
            names.append(name)
    _remove_left_copies(dest)
    staging = dest.parent / f".{dest.name}.export-{new_id()}"
    staging.mkdir(parents=True)
    try:
        info = {"dest": dest.name, "id": staging.name.rsplit("-", 1)[1], "pid": os.getpid()}
        (staging / EXPORT_STAGING).write_text(json.dumps({**info, "host": socket.gethostname()}) + "\n")
        new = {}
        with writing(dest, f"the export of {src}", f"{dest} is unchanged (the partial copy was removed): free space "
                     "and export again"):  # fmt: skip
            for name in names:
                (staging / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src / name, staging / name, follow_symlinks=False)
                new[name] = file_sha256(staging / name)
        _check_export_destination(dest, new, owned)
        stale = {n: h for n, h in (owned or {}).items() if n not in new and file_sha256(dest / n) in h}
        # while files move in, the marker accepts each file's old contents and its new ones
        current = {n: [new[n], file_sha256(dest / n)] for n in new}
        dest.mkdir(parents=True, exist_ok=True)
        sections = [_refreshed_sha256((staging / "report.md").read_text()), *_exported_sections(dest)]
        _write_export_marker(dest, src, {**stale, **{n: [h for h in hs if h] for n, hs in current.items()}}, sections)
        for name in names:
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging / name, dest / name)
        for name in stale:  # the previous export's files that this one no longer has, as it wrote them
            (dest / name).unlink()
            _remove_empty_parents(dest / name, dest)
        _write_export_marker(dest, src, {n: [h] for n, h in new.items()}, sections[:1])
        return dest
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # left only when the process was killed: removed next time


def _experiment_name(results_file: Path) -> str | None:
    """The experiment a results.json is of (None where there is none, or it names none)."""
    try:
        doc = json.loads(results_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    name = doc.get("experiment") if isinstance(doc, dict) else None
    return name if isinstance(name, str) else None


def _link_on_the_way(folder: Path, name: str) -> bool:
    """Whether ``folder/name`` or a folder between them is a symbolic link (``folder`` itself may be one)."""
    p = folder
    for part in Path(name).parts:
        p = p / part
        if p.is_symlink():
            return True
    return False


def _exported_files(dest: Path) -> dict[str, list[str]] | None:
    """What the previous export to ``dest`` wrote (name -> accepted SHA-256s); ``{}`` for an earlier version's
    export (which recorded nothing: it licenses nothing, so a file there that the new export would change is
    refused, as a user's annotation of it cannot be told from the export's own text); ``None`` when ``dest`` is not
    an export's folder. A marker diffattn export did not write is refused."""
    f = dest / EXPORT_MARKER
    if f.is_symlink() or not f.exists():
        return None
    try:
        text = f.read_text()
    except (OSError, UnicodeDecodeError):
        text = ""
    if text.startswith("exported from ") and text.count("\n") <= 1:
        return {}
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        doc = None
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, dict) or not all(
        isinstance(n, str) and isinstance(h, list) and all(isinstance(x, str) for x in h) for n, h in files.items()
    ):
        raise ValueError(
            f"{dest} has a {EXPORT_MARKER} file diffattn export did not write (empty or not its form), so nothing "
            "says which files there are the export's: choose another destination"
        )
    return files


def _exported_sections(dest: Path) -> list[str]:
    """The SHA-256s of report.md's :data:`REFRESHED_SECTIONS` that the marker in ``dest`` records as the export's (or a
    refresh's) own text; none for a marker from before 2026-12-01, or one without them."""
    try:
        doc = json.loads((dest / EXPORT_MARKER).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return []
    sections = doc.get("report_sections") if isinstance(doc, dict) else None
    return [h for h in sections if isinstance(h, str)] if isinstance(sections, list) else []


def _record_after(dest: Path, new: dict[str, str], owned: dict[str, list[str]] | None) -> dict[str, list[str]]:
    """What the marker records anew of the files ``new`` a refresh writes into ``dest``: the SHA-256 of each that was
    the export's own before (or absent). A report.md annotated outside the sections a refresh rewrites — reproduced
    verbatim, or with those sections rewritten around the notes (it reads the file it rewrites, where an export
    copies its source) — is left out, so its earlier record (``owned``'s, or none) stands: recording it would make
    the user's notes the export's own, and the next export would overwrite them (found by a review, 2026-11-30)."""
    return {
        name: [sha]
        for name, sha in new.items()
        if (had := file_sha256(dest / name)) is None or had in (owned or {}).get(name, [])
    }


def _check_export_destination(
    dest: Path, new: dict[str, str], owned: dict[str, list[str]] | None, command: str = "export"
) -> None:
    """Refuse, naming them, the files ``diffattn export`` (or ``refresh``) would overwrite without knowing them its own
    (the rule of :func:`diffattn.files.overwrite_problem`: a file the previous export did not write, one changed
    since, a link or a folder in the way), and a link or a file where the export puts a folder."""
    problems = []
    for name in new:
        p = dest
        for part in Path(name).parts[:-1]:
            p = p / part
            if p.is_symlink() or (p.exists() and not p.is_dir()):
                problems.append(f"{p.relative_to(dest)} (a link or a file where export puts a folder)")
        recorded = owned if owned in (None, {}) else owned.get(name)
        why = overwrite_problem(dest / name, recorded, new_sha256=new[name], writer="diffattn export")
        if why:
            problems.append(f"{name} ({why})")
    if problems:
        files = ", ".join(sorted(set(problems)))
        if command == "export":
            raise ValueError(
                f"export to {dest} would overwrite {files}: move them away (or delete them) and export again"
            )
        raise ValueError(  # refresh reads the files it rewrites: moved away, there is nothing to refresh
            f"refresh of {dest} would overwrite {files}: undo the edit, or export the run again into another folder "
            "and refresh that"
        )


def _write_export_marker(dest: Path, src: Path, files: dict[str, list[str]], sections: list[str | None]) -> None:
    """The marker: where the export came from, each file's accepted SHA-256s, and the SHA-256s of report.md's
    :data:`REFRESHED_SECTIONS` as the export (or a refresh) wrote them (``sections``; None entries dropped)."""
    doc = {
        "exported_from": str(src.resolve()),
        "files": dict(sorted(files.items())),
        "report_sections": [h for h in sections if h],
    }
    write_text_atomic(dest / EXPORT_MARKER, json.dumps(doc, indent=1) + "\n")


def _remove_empty_parents(path: Path, top: Path) -> None:
    for parent in path.parents:
        if parent == top or top not in parent.parents:
            return
        try:
            parent.rmdir()
        except OSError:  # not empty
            return


def _remove_left_copies(dest: Path) -> None:
    """Remove the temporary copies killed exports to ``dest`` left beside it: only a folder named as
    :func:`export_report` names them whose marker says so (and whose process is gone), and an earlier version's
    (``.DEST.new-*`` holding its export marker)."""
    import glob

    for p in sorted(dest.parent.glob(f".{glob.escape(dest.name)}.*")):
        if p.is_symlink() or not p.is_dir():
            continue
        kind, _, ident = p.name[len(dest.name) + 2 :].partition("-")
        if kind == "export":
            try:
                info = json.loads((p / EXPORT_STAGING).read_text())
            except (OSError, ValueError):
                continue
            if not isinstance(info, dict) or info.get("id") != ident or info.get("dest") != dest.name:
                continue
            if info.get("host") == socket.gethostname() and _alive(info.get("pid")):
                continue  # an export still running
        elif kind == "new" and len(ident) == 8:  # tempfile.mkdtemp's names, as an earlier version made them
            try:
                if not (p / EXPORT_MARKER).read_text().startswith("exported from "):
                    continue
            except (OSError, UnicodeDecodeError):
                continue
        else:
            continue
        logger.warning("export: removing %s, the temporary copy of an export that was killed", p)
        shutil.rmtree(p)


def _alive(pid) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid != os.getpid()  # this process is exporting nothing else now
