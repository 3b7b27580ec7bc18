"""The side-by-side tables of the niah suite (``compare``): every cell's score, solved share and floor."""

from __future__ import annotations

from pathlib import Path

from ..needle_floors import floor_of
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
    return [*lines, "", *depth_table(niah), *_multivalue_table(niah)]


def depth_table(niah: dict[str, dict]) -> list[str]:
    """The R = 1 cells' prompts solved by the depth of the queried needle (0, 25, 50, 75, 100%: the grid takes them
    in turn), each with its Wilson 95% interval, beside the floor of the same prompts at that depth (the best
    question-ignoring heuristic's: copying the first needle solves most depth-0 prompts) and where the needles went.
    No lines for results without depths (random placement) or without per-prompt floors (before 2026-12-03)."""
    cells = {n: [g for g in r["grid"] if g["R"] == 1] for n, r in niah.items()}
    if not all(
        rows and all(g.get("heuristics_solved") and None not in g.get("depths", [None]) for g in rows)
        for rows in cells.values()
    ):
        return []
    first = next(iter(cells.values()))
    depths = sorted({d for g in first for d in g["depths"]})

    def at(g: dict, values: list, depth: float) -> list:
        return [v for v, d in zip(values, g["depths"], strict=True) if d == depth]

    def floor(depth: float) -> float:  # the best heuristic over the depth's prompts (floor_of: one strategy for all)
        per_prompt = [
            {h: {"solved": v} for h, v in zip(g["heuristics_solved"], values, strict=True)}
            for g in first
            for values in at(g, list(zip(*g["heuristics_solved"].values(), strict=True)), depth)
        ]
        return floor_of(per_prompt, "solved")[0]

    def solved(rows: list[dict], depth: float) -> str:
        hits = [int(s == 1.0) for g in rows for s in at(g, g["strict_scores"], depth)]
        lo, hi = wilson_interval(sum(hits), len(hits))
        return f"{sum(hits) / len(hits):.2f} [{lo:.2f}, {hi:.2f}]"

    placed = [[p for g in first for p in at(g, g["placed_depths"], d)] for d in depths]
    samples = sum(1 for g in first for d in g["depths"] if d == depths[0])
    lines = [
        f"By depth of the queried needle, over the R = 1 cells (N = {', '.join(str(g['N']) for g in first)}; "
        f"{samples} prompts at each depth): prompts solved with the Wilson 95% interval. The floor is the best "
        "heuristic's on the same prompts at that depth; needles go in at sentence starts, so the row below it says "
        "where they went (the mean fraction of the haystack before them).",
        "",
        "| model | " + " | ".join(f"{100 * d:.0f}%" for d in depths) + " |",
        "|---|" + "---|" * len(depths),
        "| floor | " + " | ".join(f"{floor(d):.2f}" for d in depths) + " |",
        "| placed at | " + " | ".join(f"{sum(p) / len(p):.2f}" for p in placed) + " |",
    ]
    lines += [f"| {n} | " + " | ".join(solved(rows, d) for d in depths) + " |" for n, rows in cells.items()]
    return [*lines, ""]


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
