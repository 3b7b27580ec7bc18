"""How a claim row over seeds reads two groups of replicate runs scored on the same test items
(``stats.seeds_items_difference``; diffattn.experiments.claims, docs/evaluation.md §13.4), where the truth is known: the
numbers the function's docs and docs/evaluation.md §13.4 quote.

Each side's run r scores item i ``mu + s_r + u_i + e_ri``: seed effects s ~ N(0, seed_sd), item effects u ~ N(0, 1)
(the other model's v correlated ``rho`` with u, so the item × model interaction has variance 2(1 − rho)), residual e
~ N(0, resid_sd); or 0/1 hits of sigmoid(that sum). The truth is the difference of the two models' means over the
seed and item populations (0 here: both models alike, so every interval that excludes 0 is a false verdict). Printed
per case: how often the 95% interval holds the truth, and how often it excludes 0 on each side, for Welch over the
runs' means (what rows over seeds read before 2026-12-02) and for the seeds × items interval.

With ``--crossed``: runs × shot counts × draws × items arrays (many-shot ICL: each shot count's draws of
demonstrations crossed with the same test items, every run after the same draws). Run r's value after draw d of
shot count k on item i is ``s_r + w_kd + u_i + (wu)_kdi + (sw)_rkd + (su)_ri + e_rkdi``: the draw, item and
draw × item effects shared by the runs of a side, the other model's correlated ``rho`` with them (the model
interactions the runs' spread cannot see); the run × draw and run × item interactions are each run's own (in the
runs' spread, and in the table of differences too: what the interval must not count twice).

    python benchmarks/seeds_items_simulation.py [--draws 4000] [--seed 1] [--crossed]
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


# (label, runs a side, shot counts, draws each, items, seed_sd, draw_sd, item_sd, rho, run × draw and run × item sd,
#  resid_sd, binary hits)
CROSSED_CASES = [
    ("draws dominate", 3, 2, 5, 40, 0.05, 1.0, 0.3, 0.5, 0.05, 0.5, False),
    ("items dominate", 3, 2, 5, 40, 0.05, 0.1, 1.0, 0.5, 0.05, 0.5, False),
    ("seeds dominate", 3, 2, 5, 40, 0.5, 0.2, 0.2, 0.9, 0.05, 0.5, False),
    ("run × draw and × item", 3, 2, 5, 40, 0.05, 0.3, 0.3, 0.9, 0.5, 0.5, False),
    ("one shot count, 8 draws", 4, 1, 8, 30, 0.1, 0.5, 0.5, 0.5, 0.2, 0.5, False),
    ("hits, draws and items", 3, 2, 5, 40, 0.1, 0.7, 0.7, 0.6, 0.1, 0.0, True),
]


def crossed_tables(rng, runs, strata, draws, items, seed_sd, draw_sd, item_sd, rho, run_sd, resid_sd, binary):
    def pair(shape, sd):  # the two models' shared effects, correlated rho
        a = rng.normal(0, sd, shape)
        return a, rho * a + np.sqrt(1 - rho**2) * rng.normal(0, sd, shape)

    w, u, wu = pair((strata, draws, 1), draw_sd), pair((1, 1, items), item_sd), pair((strata, draws, items), 0.3)
    sides = []
    for k in range(2):
        x = (rng.normal(0, seed_sd, (runs, 1, 1, 1)) + (w[k] + u[k] + wu[k])[None]
             + rng.normal(0, run_sd, (runs, strata, draws, 1)) + rng.normal(0, run_sd, (runs, 1, 1, items))
             + rng.normal(0, resid_sd, (runs, strata, draws, items)))  # fmt: skip
        sides.append((rng.random(x.shape) < 1 / (1 + np.exp(-x))).astype(float) if binary else x)
    return sides


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--crossed", action="store_true", help="runs × shot counts × draws × items (many-shot ICL)")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    if args.crossed:
        return crossed(rng, args.draws)
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


def crossed(rng, n_draws: int) -> None:
    print(f"{n_draws} draws a case; truth 0 (both models alike); coverage, then false verdicts below / above 0")
    print(f"{'case':<32} {'Welch over runs':>24} {'seeds × draws × items':>24}")
    for label, *case in CROSSED_CASES:
        counts = np.zeros((2, 3))
        for _ in range(n_draws):
            a, b = crossed_tables(rng, *case)
            welch = unpaired_difference(a.mean(axis=(1, 2, 3)), b.mean(axis=(1, 2, 3)), method="welch").interval
            for k, (lo, hi) in enumerate((welch, seeds_items_difference(a, b).interval)):
                counts[k] += (lo <= 0 <= hi, hi < 0, lo > 0)
        rates = counts / n_draws * 100
        cells = [f"{r[0]:5.1f}% {r[1]:4.1f}/{r[2]:4.1f}%" for r in rates]
        print(f"{label:<32} {cells[0]:>24} {cells[1]:>24}")


if __name__ == "__main__":
    main()
