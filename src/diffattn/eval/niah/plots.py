"""The pictures of the niah suite: one model's grid and heatmap, every model's side by side."""

from __future__ import annotations

from pathlib import Path

import torch

from ..common import (
    figure,
    save_figure,
)
from ..stats import (
    wilson_interval,
)
from .sampling import needle_chance


def plot_niah(results: dict, path) -> object:
    """The length × depth heatmap (DIFF Fig. 5 style) beside the (N, R) grid bars with their 95% intervals."""
    plt = figure()
    heat = results["heatmap"]
    if heat["lengths"]:
        fig, (ax_heat, ax_grid) = plt.subplots(1, 2, figsize=(10, 3.6), gridspec_kw={"width_ratios": [3, 2]})
        im = ax_heat.imshow(torch.tensor(heat["accuracy"]).T.numpy(), vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
        ax_heat.set_xticks(range(len(heat["lengths"])), [str(x) for x in heat["lengths"]])
        ax_heat.set_yticks(range(len(heat["depths"])), [f"{int(100 * d)}%" for d in heat["depths"]])
        ax_heat.set_xlabel("context length (tokens)")
        ax_heat.set_ylabel("answer depth")
        ax_heat.set_title(f"N = {heat['N']}, R = 1")
        fig.colorbar(im, ax=ax_heat, fraction=0.046)
    else:
        fig, ax_grid = plt.subplots(figsize=(4.5, 3.6))
    grid = results["grid"]
    labels = [f"N={g['N']},R={g['R']}" for g in grid]
    acc = [g["accuracy"] for g in grid]
    errors = None
    if all("ci" in g for g in grid):
        errors = [  # clipped at 0: the interval's ends can miss the mean by float rounding
            [max(0.0, a - g["ci"][0]) for a, g in zip(acc, grid, strict=True)],
            [max(0.0, g["ci"][1] - a) for a, g in zip(acc, grid, strict=True)],
        ]
    ax_grid.bar(labels, acc, color="tab:green", yerr=errors, capsize=3)
    for x, a in enumerate(acc):
        ax_grid.text(x, min(a + 0.03, 0.95), f"{a:.2f}", ha="center", fontsize=8)
    _chance_marks(ax_grid, grid, 0.8)
    ax_grid.set_ylim(0, 1)
    ax_grid.set_ylabel("accuracy (string_match_all)")
    ax_grid.set_xlabel("cell (N needles, R queried)")
    ax_grid.tick_params(axis="x", labelsize=7)
    ax_grid.set_title(f"at {results['metadata']['context_tokens']} tokens (95% CI)")
    ax_grid.legend(fontsize=7, loc="upper right")  # the dashes: each cell's floor (they were unexplained)
    return save_figure(fig, path)


def _chance_marks(ax, grid: list[dict], width: float) -> None:
    """A black dash over each cell at its floor for the plotted string_match_all score (the best heuristic without
    the skill, simulated; older results: R/N, writing R needles' numbers at random), labelled once."""
    for x, g in enumerate(grid):
        level = g.get("floor_score", needle_chance(g["N"], g["R"])[0])
        ax.hlines(level, x - width / 2, x + width / 2, colors="black", linestyles="--", linewidth=1,
                  label="floor (best heuristic)" if x == 0 else None)  # fmt: skip


def plot_niah_grid_all(niah: dict[str, dict], path: Path) -> Path:
    """Grouped bars: accuracy per (N, R) cell for every model, with the 95% intervals."""
    import numpy as np

    plt = figure()
    names = list(niah)
    colors = _model_colors(names)
    cells = [f"N={g['N']},R={g['R']}" for g in niah[names[0]]["grid"]]
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(cells) * (1 + 0.25 * len(names))), 3.4))
    for k, name in enumerate(names):
        grid = niah[name]["grid"]
        per_needle = np.array([g.get("strict_accuracy", g["accuracy"]) for g in grid])
        x = np.arange(len(grid)) + (k - (len(names) - 1) / 2) * width
        errors = None
        if all(g.get("strict_scores") for g in grid):
            ci = [wilson_interval(sum(g["strict_scores"]), len(g["strict_scores"])) for g in grid]
            errors = np.clip([per_needle - [c[0] for c in ci], [c[1] for c in ci] - per_needle], 0, None)
        ax.bar(x, per_needle, width, yerr=errors, capsize=2, label=name, color=colors[name])
    _chance_marks(ax, niah[names[0]]["grid"], 0.8)
    ax.set_xticks(range(len(cells)), cells, fontsize=7)
    ax.set_ylim(0, 1)
    ax.set_xlabel("cell (N needles, R queried)")
    ax.set_ylabel("per-needle credit, strict (95% CI)")
    ax.set_title("multi-needle retrieval")
    ax.legend(fontsize=7, ncol=min(len(names), 5), loc="upper center", bbox_to_anchor=(0.5, -0.12))
    return save_figure(fig, path)


def plot_niah_heatmaps_all(niah: dict[str, dict], path: Path) -> Path:
    import numpy as np

    plt = figure()
    niah = {n: r for n, r in niah.items() if r["heatmap"]["lengths"]}
    # the colour bar in a column of its own: a bar taken from the panels' space overlaps the last one after
    # tight_layout
    fig, axes = plt.subplots(
        1, len(niah) + 1, figsize=(3.2 * len(niah) + 0.6, 3), squeeze=False,
        gridspec_kw={"width_ratios": [1] * len(niah) + [0.06]},
    )  # fmt: skip
    image = None
    for ax, (name, r) in zip(axes[0][:-1], niah.items(), strict=True):
        heat = r["heatmap"]
        image = ax.imshow(np.array(heat["accuracy"]).T, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
        ax.set_xticks(range(len(heat["lengths"])), [str(x) for x in heat["lengths"]], fontsize=7)
        ax.set_yticks(range(len(heat["depths"])), [f"{int(100 * d)}%" for d in heat["depths"]], fontsize=7)
        ax.set_xlabel("context length (tokens)", fontsize=8)
        ax.set_title(name, fontsize=9)
    axes[0][0].set_ylabel("answer depth", fontsize=8)
    fig.colorbar(image, cax=axes[0][-1], label=f"accuracy (chance {1 / first_n(niah):.2f})")
    first = next(iter(niah.values()))["heatmap"]
    fig.suptitle(f"needle retrieval, N = {first['N']}, R = 1: length × depth", fontsize=10)
    return save_figure(fig, path)


def _model_colors(names: list[str]) -> dict[str, object]:
    """One colour per model group: the replicate runs of one architecture (``NAME-sSEED``) share a colour."""
    from ..common import group_colors

    return group_colors(names)


def first_n(niah: dict[str, dict]) -> int:
    """N of the heatmap of the first model with one."""
    return next(r["heatmap"]["N"] for r in niah.values() if r["heatmap"]["lengths"])
