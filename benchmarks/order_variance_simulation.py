"""How the order-variance row (DIFF Fig. 7; diffattn.eval.icl.claims, docs/evaluation.md §7.4) behaves on simulated
hits, where the truth is known: the numbers docs/evaluation.md §7.4 quotes.

Each model's hits: ``orders × items`` draws of Bernoulli(sigmoid(mu + b_i + a_p)), item difficulties b_i ~ N(0, 1)
shared by both models, order effects a_p ~ N(0, sd). The truth is the variance over orders of the accuracy on the item
population. Single run: coverage of the true difference by ``stats.rows_variance_difference`` and how often its
interval lies below / above 0. Over seeds (3 vs 3): each order's effect shared by a model's seeds (``shared``), per
seed (``own``), or both; the row's comparison of the seeds' mean tables against Welch over the runs' estimates (whose
estimand, each run's own order variance, is not the mean tables': only its verdict rates are printed).

    python benchmarks/order_variance_simulation.py [--draws 2000] [--seed 1]
"""

from __future__ import annotations

import argparse

import numpy as np

from diffattn.eval.stats import rows_variance, rows_variance_difference, unpaired_difference


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def hits(rng, mu, items_b, order_effects):
    p = sigmoid(mu + items_b[None, :] + order_effects[:, None])
    return (rng.random(p.shape) < p).astype(float)


def true_variance(rng, mu, shared_sd, own_sd=0.0, seeds=1):
    """The variance over orders of the (seeds' mean) accuracy on the item population."""
    orders, items = rng.normal(0, 1, (3000, 1)), rng.normal(0, 1, (1, 2000))
    logits = [mu + items + orders * shared_sd + rng.normal(0, own_sd, (3000, 1)) for _ in range(seeds)]
    acc = [sigmoid(x).mean(axis=1) for x in logits]
    return float(np.var(np.mean(acc, axis=0), ddof=1))


def single_run(rng, draws):
    print("single run: ref (mu, order sd) vs new, orders × items: truth, coverage, interval below 0, above 0")
    cases = [
        ((0.0, 0.0), (2.2, 0.0), 10, 30), ((0.0, 0.0), (3.5, 0.0), 10, 30), ((0.0, 0.5), (0.0, 0.1), 10, 30),
        ((0.0, 0.5), (3.5, 0.5), 10, 30), ((0.0, 0.5), (3.5, 0.5), 10, 100), ((0.0, 1.0), (0.0, 0.2), 10, 200),
        ((0.0, 0.0), (2.2, 0.0), 2, 30), ((0.0, 0.0), (2.2, 0.0), 3, 30),
    ]  # fmt: skip
    for (mr, sr), (mn, sn), orders, items in cases:
        truth = 0.0 if sr == sn == 0 else true_variance(rng, mn, sn) - true_variance(rng, mr, sr)
        cover = below = above = 0
        for _ in range(draws):
            b = rng.normal(0, 1, items)
            d = rows_variance_difference(
                hits(rng, mr, b, rng.normal(0, sr, orders)), hits(rng, mn, b, rng.normal(0, sn, orders))
            )
            lo, hi = d.interval
            cover += lo <= truth <= hi
            below += hi < 0
            above += lo > 0
        print(f"  ({mr}, {sr}) vs ({mn}, {sn}), {orders} × {items}: truth {1e4 * truth:+7.1f} points², coverage "
              f"{cover / draws:.3f}, below {below / draws:.3f}, above {above / draws:.3f}")  # fmt: skip


def over_seeds(rng, draws, seeds=3, orders=10, items=100):
    print(f"over seeds ({seeds} vs {seeds}, {orders} × {items}): order sd shared / own per seed; the row's mean "
          "tables vs Welch over the runs: coverage, below 0, above 0")  # fmt: skip
    cases = {
        "no difference, shared": ((0.5, 0.0), (0.5, 0.0)),
        "no difference, mixed": ((0.4, 0.3), (0.4, 0.3)),
        "no difference, own": ((0.0, 0.5), (0.0, 0.5)),
        "new more robust": ((0.6, 0.2), (0.1, 0.1)),
    }
    for name, ((shr, own_r), (shn, own_n)) in cases.items():
        same = (shr, own_r) == (shn, own_n)  # no difference by construction: the truth is 0, not a Monte Carlo's
        truth = 0.0 if same else true_variance(rng, 0.0, shn, own_n, seeds) - true_variance(rng, 0.0, shr, own_r, seeds)
        row, welch = np.zeros(3), np.zeros(3)
        for _ in range(draws):
            b = rng.normal(0, 1, items)
            cr, cn = rng.normal(0, 1, orders), rng.normal(0, 1, orders)
            ref = [hits(rng, 0.0, b, cr * shr + rng.normal(0, own_r, orders)) for _ in range(seeds)]
            new = [hits(rng, 0.0, b, cn * shn + rng.normal(0, own_n, orders)) for _ in range(seeds)]
            lo, hi = rows_variance_difference(np.mean(ref, axis=0), np.mean(new, axis=0)).interval
            row += (lo <= truth <= hi, hi < 0, lo > 0)
            estimates = [[rows_variance(t)[0] for t in side] for side in (ref, new)]
            lo, hi = unpaired_difference(*estimates).interval
            welch += (0, hi < 0, lo > 0)  # its estimand is the runs' own variance: no coverage of this truth
        r, w = row / draws, welch / draws
        print(f"  {name:22s} truth {1e4 * truth:+6.1f}: row {r[0]:.3f} {r[1]:.3f} {r[2]:.3f} | Welch – "
              f"{w[1]:.3f} {w[2]:.3f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=2000, help="simulated pairs per case (over seeds: a quarter)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    single_run(rng, args.draws)
    over_seeds(rng, max(args.draws // 4, 50))


if __name__ == "__main__":
    main()
