"""How a claim row over seeds reads two groups of replicate runs scored on the same test items
(``stats.seeds_items_difference``; diffattn.experiments.claims, docs/evaluation.md §13.4), where the truth is known: the
numbers the function's docs and docs/evaluation.md §13.4 quote.

Each side's run r scores item i ``mu + s_r + u_i + e_ri``: seed effects s ~ N(0, seed_sd), item effects u ~ N(0, 1)
(the other model's v correlated ``rho`` with u, so the item × model interaction has variance 2(1 − rho)), residual e
~ N(0, resid_sd); or 0/1 hits of sigmoid(that sum). The truth is the difference of the two models' means over the
seed and item populations (0 here: both models alike, so every interval that excludes 0 is a false verdict). Printed
per case: how often the 95% interval holds the truth, and how often it excludes 0 on each side, for Welch over the
runs' means (what rows over seeds read before 2026-12-02) and for the seeds × items interval.

    python benchmarks/seeds_items_simulation.py [--draws 4000] [--seed 1]
"""

from __future__ import annotations

import argparse

import numpy as np

from diffattn.eval.stats import seeds_items_difference, unpaired_difference

# (label, runs a side, items, seed_sd, rho between the models' item effects, resid_sd, binary hits)
CASES = [
    ("seeds dominate", 3, 100, 0.3, 0.9, 0.5, False),
    ("items dominate", 3, 100, 0.02, 0.5, 0.5, False),
    ("residual dominates", 3, 100, 0.02, 0.98, 3.0, False),
    ("nothing but seeds and residual", 3, 100, 0.1, 1.0, 1.0, False),
    ("items dominate, 30 items", 3, 30, 0.02, 0.5, 0.5, False),
    ("items dominate, 5 runs", 5, 100, 0.02, 0.5, 0.5, False),
    ("all alike, 16 items", 3, 16, 0.5, 0.5, 2.0, False),
    ("seeds and residual, 16 items", 3, 16, 0.5, 0.9, 3.0, False),
    ("hits, items dominate", 3, 50, 0.05, 0.5, 0.0, True),
    ("hits, seeds and items", 3, 50, 0.3, 0.7, 0.0, True),
]


def tables(rng, runs, items, seed_sd, rho, resid_sd, binary):
    u = rng.normal(0, 1, items)
    v = rho * u + np.sqrt(1 - rho**2) * rng.normal(0, 1, items)
    sides = []
    for effects in (u, v):
        x = rng.normal(0, seed_sd, (runs, 1)) + effects[None, :] + rng.normal(0, resid_sd, (runs, items))
        sides.append((rng.random(x.shape) < 1 / (1 + np.exp(-x))).astype(float) if binary else x)
    return sides


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    print(f"{args.draws} draws a case; truth 0 (both models alike); coverage, then false verdicts below / above 0")
    print(f"{'case':<32} {'Welch over runs':>24} {'seeds × items':>24}")
    for label, runs, items, seed_sd, rho, resid_sd, binary in CASES:
        counts = np.zeros((2, 3))
        for _ in range(args.draws):
            a, b = tables(rng, runs, items, seed_sd, rho, resid_sd, binary)
            welch = unpaired_difference(a.mean(axis=1), b.mean(axis=1), method="welch").interval
            for k, (lo, hi) in enumerate((welch, seeds_items_difference(a, b).interval)):
                counts[k] += (lo <= 0 <= hi, hi < 0, lo > 0)
        rates = counts / args.draws * 100
        cells = [f"{r[0]:5.1f}% {r[1]:4.1f}/{r[2]:4.1f}%" for r in rates]
        print(f"{label:<32} {cells[0]:>24} {cells[1]:>24}")


if __name__ == "__main__":
    main()
