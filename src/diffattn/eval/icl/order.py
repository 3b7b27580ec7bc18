"""Order robustness (run_order_robustness, DIFF Fig. 7): one fixed demo set permuted in two arrangements, the
best − worst margin, and the order variance with the test items' noise removed (ours)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ..icl_data import Pair
from ..stats import rows_variance
from .many_shot import _base_metadata, _check_fit, _prepare, _test_set_scorer
from .prompts import PromptFormat

ARRANGEMENTS = ("random", "by_class")


def order_margin(accuracies: Sequence[float]) -> float:
    """Best − worst accuracy over permutations (DIFF Fig. 7's margin)."""
    values = [float(a) for a in accuracies]
    if not values:
        raise ValueError("order_margin needs at least one accuracy")
    return max(values) - min(values)


def arrangement_order(labels: Sequence[str], arrangement: str, seed: int) -> list[int]:
    """A seeded order (indices) of demos with these ``labels``: ``"random"`` or ``"by_class"``.

    ``"random"``: a uniform permutation. ``"by_class"``: rounds that each contain every class once; needs the same
    number of demos per class; the class order is drawn once and repeated in every round, and which example of a
    class goes into which round is drawn too.
    """
    if arrangement == "random":
        return [int(i) for i in np.random.default_rng([seed, 1]).permutation(len(labels))]
    if arrangement != "by_class":
        raise ValueError(f"arrangement must be one of {ARRANGEMENTS}, got {arrangement!r}")
    rng = np.random.default_rng([seed, 2])
    by_class: dict[str, list[int]] = {}
    for i, label in enumerate(labels):
        by_class.setdefault(label, []).append(i)
    counts = {len(v) for v in by_class.values()}
    if len(counts) > 1:
        raise ValueError(f"'by_class' needs the same number of demos per class, got {sorted(counts)}")
    classes = sorted(by_class)
    order = [classes[i] for i in rng.permutation(len(classes))]
    columns = {c: [by_class[c][i] for i in rng.permutation(len(by_class[c]))] for c in order}
    rounds = counts.pop() if counts else 0
    return [columns[c][r] for r in range(rounds) for c in order]


def arrange_demos(demos: Sequence[Pair], arrangement: str, seed: int) -> list[Pair]:
    """``demos`` in the seeded order of :func:`arrangement_order`."""
    return [demos[i] for i in arrangement_order([y for _, y in demos], arrangement, seed)]


def _order_demo_set(
    rounds: int | None, labels, pool: list[Pair], pool_demos, sep_len: int, budget: int, context: int, seed: int
) -> tuple[int, list[int]]:
    """The order-robustness demo set: ``rounds`` pool examples of every class (a seeded per-class shuffle; by
    default as many rounds as fit ``budget``), as pool indices in round order; returns the rounds and the indices."""
    rng = np.random.default_rng([seed, 3])
    per_class: dict[str, list[int]] = {c: [] for c in labels}
    for i, (_, y) in enumerate(pool):
        per_class[y].append(i)
    columns = {c: [idx[j] for j in rng.permutation(len(idx))] for c, idx in per_class.items()}
    available = min(len(v) for v in columns.values())
    if available < 1:
        missing = sorted(c for c, v in columns.items() if not v)
        raise ValueError(f"the demo pool has no example of {missing}; lower test_size or use more data")

    def chosen(r: int) -> list[int]:
        return [columns[c][j] for j in range(r) for c in labels]

    def cost(r: int) -> int:
        return sum(len(ids) + sep_len for ids in pool_demos[chosen(r)])

    if rounds is None:
        rounds = 0
        while rounds < available and cost(rounds + 1) <= budget:
            rounds += 1
        if rounds < 1:
            raise ValueError(
                f"one round of {len(labels)} classes does not fit the context of {context} tokens; "
                "lower the data set's max_classes or max_chars (--icl-max-classes, --icl-max-chars; eval options "
                "icl_max_classes, icl_max_chars)"
            )
    elif not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive integer, got {rounds!r}")
    elif rounds > available:
        raise ValueError(f"{rounds} rounds need {rounds} pool examples per class; the smallest class has {available}")
    elif cost(rounds) > budget:
        raise ValueError(f"{rounds} rounds of {len(labels)} classes do not fit the context of {context} tokens")
    return rounds, chosen(rounds)


def run_order_robustness(
    model,
    tokenizer,
    dataset: str | Sequence[Pair] = "wordnet",
    *,
    rounds: int | None = None,
    permutations: int = 10,
    arrangements: Sequence[str] = ARRANGEMENTS,
    test_size: int = 100,
    seed: int = 0,
    max_length: int | None = None,
    prompt: PromptFormat | None = None,
    dataset_options: Mapping | None = None,
    share_prefix: bool = True,
    progress: bool = True,
) -> dict:
    """Accuracy over permutations of one fixed demo set, and the margin best − worst (DIFF Fig. 7, App. F).

    The demo set holds ``rounds`` examples of every class (default: as many rounds as fit the context).
    Returns ``labels``, ``rounds``, ``shots`` (= rounds × classes) and, per arrangement, ``accuracies`` (one per
    permutation), ``hits`` (per permutation, each test item's 1 or 0), ``mean``, ``std``, ``best``, ``worst``,
    ``margin``, plus ``metadata``.
    """
    if not isinstance(permutations, int) or permutations < 1:
        raise ValueError(f"permutations must be a positive integer, got {permutations!r}")
    arrangements = list(arrangements)
    if not arrangements or any(a not in ARRANGEMENTS for a in arrangements):
        raise ValueError(f"arrangements must be a non-empty subset of {ARRANGEMENTS}, got {arrangements!r}")
    setup = _prepare(model, tokenizer, dataset, dataset_options, prompt, test_size, seed, max_length)
    _, name, _, labels, tokens, _, pool, context, _, test_queries, pool_demos, budget = setup
    rounds, demo_index = _order_demo_set(rounds, labels, pool, pool_demos, len(tokens.sep), budget, context, seed)
    demo_labels = [pool[i][1] for i in demo_index]

    results: dict[str, dict] = {}
    prefixes = len(arrangements) * permutations
    with _test_set_scorer(model, setup, share_prefix, prefixes, f"icl order {name}", progress) as score:
        for arrangement in arrangements:
            accs, hits = [], []
            for p in range(permutations):
                order = arrangement_order(demo_labels, arrangement, seed=seed * 1000 + p)
                prefix = tokens.prefix(pool_demos[[demo_index[i] for i in order]])
                _check_fit(len(prefix) + max(len(q) for q in test_queries), context, f"{rounds} rounds")
                hits.append(score(prefix))
                accs.append(float(np.mean(hits[-1])))
            results[arrangement] = {
                "accuracies": accs,
                "hits": hits,  # per permutation, per test item (the test set's order): 1 if solved
                "mean": float(np.mean(accs)),
                "std": float(np.std(accs)),
                "best": max(accs),
                "worst": min(accs),
                "margin": order_margin(accs),
                # the orders' true spread, the items' noise removed (unbiased; None: too few orders or items)
                "order_variance": rows_variance(hits)[0] if permutations >= 2 and len(test_queries) >= 2 else None,
            }

    metadata = _base_metadata(setup, dataset_options, seed, model)
    metadata.update(
        {
            "task": "ICL order robustness (DIFF Fig. 7, App. F)",
            "rounds": rounds,
            "shots": rounds * len(labels),
            "demo_set": (
                "rounds examples per class from the pool (seeded per-class shuffle, numpy default_rng([seed, 3])); "
                "by default as many rounds as fit the context"
            ),
            "permutations": permutations,
            "permutation_seeds": [seed * 1000 + p for p in range(permutations)],
            "arrangements": {
                "random": "uniform permutation of the demo set",
                "by_class": (
                    "rounds each containing every class once; one seeded class order repeated in every round; "
                    "seeded assignment of a class's examples to rounds"
                ),
            },
            "margin": "best - worst accuracy over the permutations (accuracy in [0, 1])",
            "order_variance": (
                "variance over orders of the accuracy each would have on the whole item population, the test items' "
                "noise removed: (MS_orders - MS_residual) / items of the permutations x items hits (accuracy², "
                "unbiased, so negative where the orders vary less than the items' noise alone would make them; "
                "diffattn.eval.stats.rows_variance)"
            ),
            "std": "population standard deviation (ddof=0) over permutations",
            "share_prefix": share_prefix,
        }
    )
    return {
        "labels": labels,
        "rounds": rounds,
        "shots": rounds * len(labels),
        "arrangements": results,
        "metadata": metadata,
    }


# ----------------------------------------------------------------------------------------------------------------
# plots
