"""The pictures and the side-by-side table (``compare``) of the icl suite."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ..common import (
    figure,
    group_colors,
    save_figure,
)


def _series(results: Mapping) -> dict[str, Mapping]:
    if "metadata" in results:
        return {str(results["metadata"].get("model", {}).get("name_or_path") or "model"): results}
    return dict(results)


def plot_icl(results: Mapping, path: str | Path) -> Path:
    """Accuracy vs number of demonstrations, mean ± std over draws (DIFF Fig. 6).

    ``results``: one :func:`run_icl` result, or a mapping ``{name: result}`` to compare models on one plot.
    """
    plt = figure()
    series = _series(results)
    if not series:
        raise ValueError("plot_icl needs at least one result")
    fig, ax = plt.subplots(figsize=(6, 4))
    colors = group_colors(list(series))
    for name, res in series.items():
        for key in ("shots", "mean", "std"):
            if key not in res:
                raise ValueError(f"result {name!r} lacks {key!r}: not a run_icl result")
        x, mean, std = np.asarray(res["shots"]), np.asarray(res["mean"]), np.asarray(res["std"])
        ax.plot(x, mean, marker="o", label=name, color=colors[name])
        ax.fill_between(x, np.clip(mean - std, 0, 1), np.clip(mean + std, 0, 1), alpha=0.2, color=colors[name])
    labels = next(iter(series.values())).get("labels")
    if labels:  # constrained decoding to one of the K labels: a guess is right 1/K of the time
        ax.axhline(1 / len(labels), color="black", linestyle="--", linewidth=1, label=f"chance (1/{len(labels)})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("number of demonstrations")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1)
    dataset = next(iter(series.values())).get("metadata", {}).get("dataset", "")
    ax.set_title(f"many-shot ICL {dataset}".strip())
    ax.grid(alpha=0.3)
    ax.legend()
    return save_figure(fig, path)


def plot_order_robustness(results: Mapping, path: str | Path) -> Path:
    """Accuracy of every permutation per arrangement, with the margin (and the order variance in points², where the
    results have it) in the labels (DIFF Fig. 7)."""
    plt = figure()
    series = _series(results)
    if not series:
        raise ValueError("plot_order_robustness needs at least one result")
    fig, ax = plt.subplots(figsize=(6, 4))
    ticks, names = [], []
    pos = 0
    for name, res in series.items():
        if "arrangements" not in res:
            raise ValueError(f"result {name!r} lacks 'arrangements': not a run_order_robustness result")
        for arrangement, r in res["arrangements"].items():
            accs = r["accuracies"]
            ax.scatter([pos] * len(accs), accs, alpha=0.7)
            ax.vlines(pos, r["worst"], r["best"])
            ticks.append(pos)
            variance = r.get("order_variance")  # results from before 2026-12-02 have none
            spread = "" if variance is None else f"\norder var {1e4 * variance:.1f} pt²"
            names.append(f"{name}\n{arrangement}\nmargin {100 * r['margin']:.1f}{spread}")
            pos += 1
    ax.set_xticks(ticks, names, fontsize=7)
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1)
    labels = next(iter(series.values())).get("labels") or next(iter(series.values())).get("metadata", {}).get("labels")
    if labels:
        ax.axhline(1 / len(labels), color="black", linestyle="--", linewidth=1, label=f"chance (1/{len(labels)})")
        ax.legend(fontsize=7)
    ax.set_title("ICL order robustness")
    ax.grid(alpha=0.3, axis="y")
    return save_figure(fig, path)


def compare(icl: dict[str, dict], out: Path) -> list[str]:
    """Many-shot accuracy of every model in one picture, and the order margins."""
    from ..common import fmt

    many = {n: r["many_shot"] for n, r in icl.items()}
    lines = [f"![ICL accuracy]({plot_icl(many, out / 'icl_all.png').name})", ""]
    lines += [
        "| model | order margin (random) | order margin (by class) | order variance (random, points², items' noise "
        "removed) |",
        "|---|---|---|---|",
    ]
    for n, r in icl.items():
        arr = r["order_robustness"]["arrangements"]
        cells = [fmt(arr.get(k, {}).get("margin")) for k in ("random", "by_class")]
        variance = arr.get("random", {}).get("order_variance")
        cells.append("–" if variance is None else f"{1e4 * variance:.1f}")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return [*lines, ""]
