"""The side-by-side tables of the niah suite (``compare``): every cell's score, solved share and floor."""

from __future__ import annotations

from pathlib import Path

from ..stats import (
    wilson_interval,
)
from .claims import cell_floor, r1_chance
from .plots import plot_niah_grid_all, plot_niah_heatmaps_all


def _with_ci(value: float, ci) -> str:
    return f"{value:.2f}" if not ci else f"{value:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]"


def compare(niah: dict[str, dict], out: Path) -> list[str]:
    """Grid bars and heatmaps of every model, then the per-cell table with intervals and strict scores."""
    lines = [f"![needle retrieval]({plot_niah_grid_all(niah, out / 'niah_grid_all.png').name})", ""]
    if any(r["heatmap"]["lengths"] for r in niah.values()):
        lines += [f"![needle heatmaps]({plot_niah_heatmaps_all(niah, out / 'niah_all.png').name})", ""]
    first = next(iter(niah.values()))
    cells = [f"N={g['N']},R={g['R']}" for g in first["grid"]]
    samples = first["metadata"].get("samples_per_cell")
    lines += [
        f"Per (N needles, R queried) cell, {samples} samples each, the same prompts for every model: per-needle "
        "credit (strict: the queried numbers among the first R numbers of the output) with its Wilson 95% interval "
        "/ prompts solved (every queried needle found; at R = 1 the same); RULER's string_match_all below. The "
        "floor is what the best heuristic that ignores the question scores on the same prompts (copy the first, "
        "last, random or most frequent numbers; random needles alone would give R/N / 1/C(N, R)). The R = 1 mean "
        "compares like with like across N; its floor is one heuristic's over all those cells.",
        "",
        "| model | " + " | ".join(cells) + " | R = 1 mean solved |",
        "|---|" + "---|" * (len(cells) + 1),
        f"| {_floor_label(first['grid'])} | "
        + " | ".join(_chance_cell(g) for g in first["grid"])
        + f" | {_fmt(r1_chance(first))} |",
    ]
    for n, r in niah.items():
        row = [_credit_solved(g) for g in r["grid"]]
        row.append(_fmt(r.get("r1_solved")))
        lines.append(f"| {n} | " + " | ".join(row) + " |")
    lines += ["", "RULER string_match_all (any queried number anywhere in the output), 95% interval:", ""]
    lines += ["| model | " + " | ".join(cells) + " | mean |", "|---|" + "---|" * (len(cells) + 1)]
    for n, r in niah.items():
        row = [_with_ci(g["accuracy"], g.get("ci")) for g in r["grid"]]
        row.append(_with_ci(r["mean_accuracy"], r.get("mean_accuracy_ci")))
        lines.append(f"| {n} | " + " | ".join(row) + " |")
    return [*lines, "", *_multivalue_table(niah)]


def _multivalue_table(niah: dict[str, dict]) -> list[str]:
    """The multi-value cell of every model that has one (none: no lines)."""
    rows = {n: r["multivalue"] for n, r in niah.items() if r.get("multivalue")}
    if not rows:
        return []
    g = next(iter(rows.values()))
    lines = [
        f"Multi-value cell (one key's V = {g['V']} values among N = {g['N']} needles, all V asked; {g['samples']} "
        "prompts): per-needle credit (strict: the V numbers among the first V of the output) [95% CI] / prompts "
        "solved.",
        "",
        "| model | multi-value |",
        "|---|---|",
        f"| {_floor_label([g])} | {_chance_cell(g)} |",
    ]
    lines += [f"| {n} | {_credit_solved(row)} |" for n, row in rows.items()]
    return [*lines, ""]


def _floor_label(cells: list[dict]) -> str:
    """ "floor" where the cells carry simulated floors; "chance" (random needles' R/N) for older results."""
    return "floor" if all(g.get("floor") is not None for g in cells) else "chance"


def _chance_cell(g: dict) -> str:
    credit, solved = cell_floor(g), cell_floor(g, solved=True)
    return f"{credit:.2f}" if credit == solved else f"{credit:.2f} / {solved:.2f}"


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _credit_solved(g: dict) -> str:
    """ "per-needle credit [95% CI] / solved" of one grid cell (older results: string_match_all only)."""
    if "strict_scores" not in g:
        return _with_ci(g["accuracy"], g.get("ci"))
    credit = _with_ci(g["strict_accuracy"], wilson_interval(sum(g["strict_scores"]), len(g["strict_scores"])))
    solved = g.get("solved", sum(s == 1.0 for s in g["strict_scores"]) / len(g["strict_scores"]))
    return f"{credit} / {solved:.2f}"
