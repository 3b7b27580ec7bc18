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

import json
import platform
from pathlib import Path

from ..eval.common import figure, fmt, jsonable, save_figure
from ..files import publish_folder


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
        if shown:
            lines.append(f"- {o.name} ({method}): " + ", ".join(shown))
    return lines


def _protocol(config) -> list[str]:
    """What was trained on what and measured how, in words, from the experiment's config (the exact YAML is at the
    end of the report)."""
    from ..eval.suite import SuiteOptions
    from ..train import RunConfig
    from ..train.adapt import AdaptRunConfig

    lines = ["## Protocol", ""]
    if config.models:
        d = RunConfig.from_dict({"data": dict(config.data)}).data
        t = RunConfig.from_dict({"train": dict(config.train)}).train
        groups = config.seed_groups()
        seeds = ", ".join(f"{g} × {len(n)} seeds" for g, n in groups.items() if len(n) > 1) or "one seed each"
        lines.append(
            f"- From scratch: {', '.join(f'{m.name} ({m.preset}, {m.attention})' for m in config.models)}; {seeds}. "
            f"{t.max_steps} steps × {t.global_batch_size} sequences × {d.seq_len} tokens, lr {t.lr:g}, "
            f"{t.schedule} schedule."
        )
        lines.append("- Data: " + _data_words(d, tokenizer=True))
    if config.adapters:
        a = AdaptRunConfig.from_dict(
            {"data": {"source": config.data.get("source", "shakespeare"), **config.adapt_data}}
        )
        at = AdaptRunConfig.from_dict({"train": dict(config.adapt_train)}).train
        bases = sorted({x.base for x in config.adapters})
        lines.append(
            f"- Adapters on {', '.join(bases)}: {', '.join(x.name for x in config.adapters)}; {at.max_steps} steps × "
            f"{at.global_batch_size} × {a.data.seq_len} tokens, lr {at.lr:g}, {at.schedule}; "
            + "data: "
            + _data_words(a.data, tokenizer=False)
        )
    o = SuiteOptions(**{"seed": config.seed, **config.eval.options})
    suites = config.eval.suites
    if "niah" in suites or "alloc" in suites:
        grid = ", ".join(f"({n}, {r})" for n, r in o.niah_grid)
        lines.append(
            "- Retrieval evaluation: needles "
            f'"The special magic {{city}} number is: {{{o.niah_digits}-digit number}}." '
            f"in a {o.haystack} haystack (test split) of {o.context_tokens or 'the model maximum of'} tokens; "
            f"(N needles, R queried) cells {grid}, {o.samples} samples each, greedy decoding, RULER string_match_all; "
            f"allocation over {o.samples} single-needle prompts at depths 0–100%. Every model sees the same prompts "
            "(seeded), so comparisons are paired."
        )
    others = [s for s in suites if s not in ("niah", "alloc")]
    if others:
        lines.append(f"- Other suites: {', '.join(others)} over {o.tokens} tokens of {o.text} (test split).")
    return [*lines, ""]


def _data_words(d, *, tokenizer: bool) -> str:
    words = f"{d.source}"
    if d.retrieval_fraction > 0:
        scored = "the answer only" if d.needle_loss == "answer" else "every token"
        words += (
            f" plus {d.retrieval_fraction:.0%} retrieval practice rows ({1 - d.mqar_fraction:.0%} needle rows with 1–"
            f"{d.max_needles} needles and {d.needle_digits}-digit numbers, loss on {scored}; "
            f"{d.mqar_fraction:.0%} MQAR"
            + ("; haystack lengths uniform from none to the whole row" if d.varied_context else "")
            + ")"
        )
    if tokenizer and hasattr(d, "vocab_size"):
        words += f"; BPE tokenizer of {d.vocab_size} tokens trained on the training text"
        if d.tokenizer_needle_words:
            words += " and the needle template (its words, keys and numbers are single tokens)"
    return words + "."


def write_report(config, out: Path, outcomes) -> Path:
    """Write ``out/report.md`` and ``out/results.json``; returns the report's path."""
    rows: dict[str, dict] = {p.name: {"model": p.name, "kind": f"pretrained ({p.path})"} for p in config.pretrained}
    for o in outcomes:
        row = rows.setdefault(o.name, {"model": o.name})
        if o.kind == "pretrain":
            s = o.summary
            row.update(
                kind=f"from scratch ({s.get('attention')})",
                parameters=s.get("parameters"),
                trainable=s.get("parameters"),
                steps=s.get("steps"),
                val_loss=s.get("final_val_loss"),
                tokens_per_s=s.get("tokens_per_s"),
                train_seconds=s.get("wall_seconds"),
            )
        elif o.kind == "adapt":
            s = o.summary
            row.update(
                kind=f"{s.get('method')} on {Path(str(s.get('model'))).parent.name or s.get('model')}",
                parameters=s.get("total_parameters"),
                trainable=s.get("trainable_parameters"),
                steps=s.get("steps"),
                val_loss=s.get("val_loss_after"),
                tokens_per_s=s.get("tokens_per_s"),
                train_seconds=s.get("wall_seconds"),
            )
        else:
            from ..eval.suite import SUITE_TABLE

            row.setdefault("parameters", o.summary.get("metadata", {}).get("parameters"))
            for suite, r in o.summary.get("suites", {}).items():
                if suite in SUITE_TABLE:
                    row.update(SUITE_TABLE[suite].headline(r))
    columns = ["model", "kind", "parameters", "trainable", "steps", "val_loss", "tokens_per_s", "train_seconds"]
    metrics = sorted({k for r in rows.values() for k in r} - set(columns))
    from .claims import claims_json, claims_markdown, claims_scope, paper_claims

    evals = {o.name: o.summary.get("suites", {}) for o in outcomes if o.kind == "eval"}
    claims = paper_claims(config, rows, evals, seed=config.seed)
    scope = claims_scope(config, rows, evals)
    lines = [f"# Experiment `{config.name}`", "", "## Paper claims", ""]
    lines += claims_markdown(claims, scope)
    lines += [*_protocol(config)[:-1], *_method_settings(outcomes), ""]  # the adapters' settings end the list
    lines += ["## Models × metrics", "", "| " + " | ".join(columns + metrics) + " |"]
    lines += ["|" + "---|" * (len(columns) + len(metrics))]
    for r in rows.values():
        lines.append("| " + " | ".join(fmt(r.get(c)) for c in columns + metrics) + " |")
    lines += [
        "",
        "Validation loss is on each run's own tokenizer and data: compare from-scratch models with each "
        "other and adapters with each other.",
        "",
    ]

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

    lines += ["## Evaluations", ""]
    lines += _side_by_side(evals, out)
    lines += ["### Every model's pictures", ""]
    for o in outcomes:
        if o.kind != "eval":
            continue
        pics = o.summary.get("pictures", {})
        if pics:
            lines.append(f"### {o.name}")
            lines += [f"![{k}]({Path(o.path, v).relative_to(out)})" for k, v in pics.items()]
            lines.append("")
    lines += ["## Config and environment", "", "```yaml", (out / "experiment.yaml").read_text().rstrip(), "```", ""]
    import torch
    import transformers

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "threads": torch.get_num_threads(),
    }
    lines.append(", ".join(f"{k} {v}" for k, v in env.items()))
    report = out / "report.md"
    report.write_text("\n".join(lines) + "\n")
    results = {
        "experiment": config.name,
        "models": list(rows.values()),
        "parts": [{"kind": o.kind, "name": o.name, "state": o.state, "seconds": o.seconds} for o in outcomes],
        "claims": claims_json(claims),
        "claims_scope": scope,
        "evaluations": evals,
        "config": config.to_dict(),
        "environment": env,
    }
    (out / "results.json").write_text(json.dumps(jsonable(results), indent=2))
    return report


def _loss_curves(outcomes, path: Path) -> Path | None:
    series = []
    for o in outcomes:
        if o.kind in ("pretrain", "adapt"):
            points = [(e["step"], e["loss"]) for e in _metrics(o.path) if "loss" in e]
            if points:
                series.append((f"{o.name} ({o.kind})", points))
    if not series:
        return None
    plt = figure()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for label, points in series:
        ax.plot(*zip(*points, strict=True), label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def _lambda_curves(outcomes, path: Path) -> Path | None:
    """Mean λ over layers vs step for every run that logs λ (DIFF models, adapters)."""
    series = []
    for o in outcomes:
        if o.kind in ("pretrain", "adapt"):
            points = [(e["step"], sum(e["lambda"]) / len(e["lambda"])) for e in _metrics(o.path) if e.get("lambda")]
            if points:
                series.append((o.name, points))
    if not series:
        return None
    plt = figure()
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for label, points in series:
        ax.plot(*zip(*points, strict=True), label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("mean λ over layers")
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


EXPORT_MARKER = ".diffattn-export"  # marks a folder export_report made (and may replace)


def export_report(experiment_dir: str | Path, dest: str | Path) -> Path:
    """Copy an experiment's ``report.md``, ``results.json``, ``experiment.yaml`` and every picture the report links
    into ``dest`` (e.g. ``results/<experiment>/`` of a repository): the evidence without the checkpoints.

    ``dest`` must not exist or be an earlier export (it holds :data:`EXPORT_MARKER`); the copy is made in a temporary
    folder beside it and renamed into place, so an interrupted export leaves the earlier one intact."""
    import re
    import shutil
    import tempfile

    src, dest = Path(experiment_dir), Path(dest)
    report = src / "report.md"
    if not report.is_file() or not (src / "results.json").is_file():
        raise ValueError(f"{src} has no report.md and results.json: run the experiment (diffattn run) first")
    if dest.exists() and not (dest / EXPORT_MARKER).is_file():
        raise ValueError(f"{dest} exists and was not made by diffattn export: choose another destination")
    text = report.read_text()
    pictures = sorted(set(re.findall(r"\]\(([^)\s]+\.png)\)", text)))
    for name in pictures:  # only pictures inside the experiment folder are copied, to the same place inside dest
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise ValueError(f"report.md links {name!r}, outside the experiment folder: not exported")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.new-", dir=dest.parent))
    try:
        for name in ("report.md", "results.json", "experiment.yaml", *pictures):
            if (src / name).is_file():
                (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src / name, tmp / name)
        (tmp / EXPORT_MARKER).write_text(f"exported from {src.resolve()}\n")
        return publish_folder(tmp, dest)  # the earlier export is replaced only once this one is in place
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # left only when the copy or the move failed
