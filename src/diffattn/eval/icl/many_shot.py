"""Many-shot accuracy (run_icl): test set and demo pool, the shot grid up to what fits the context, seeded draws."""

from __future__ import annotations

import math
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from tqdm.auto import tqdm

from ..common import trained_length
from ..icl_data import Pair, load_icl_dataset, validate_pairs
from .decoding import _context_length, _LazyDemos, _model_info, _Runner
from .prompts import PromptFormat, PromptTokens


def _dataset_pairs(dataset, dataset_options: Mapping | None, seed: int) -> tuple[list[Pair], str]:
    options = dict(dataset_options or {})
    options.setdefault("seed", seed)
    name = dataset if isinstance(dataset, str) else "custom"
    pairs = load_icl_dataset(dataset, **options)
    return validate_pairs(pairs, what=name), name


def _split(pairs: list[Pair], test_size: int, seed: int) -> tuple[list[Pair], list[Pair]]:
    if not isinstance(test_size, int) or test_size < 1:
        raise ValueError(f"test_size must be a positive integer, got {test_size!r}")
    if len(pairs) <= test_size:
        raise ValueError(f"the data set has {len(pairs)} examples: too few for {test_size} test items and a demo pool")
    order = np.random.default_rng([seed, 0]).permutation(len(pairs))
    return [pairs[i] for i in order[:test_size]], [pairs[i] for i in order[test_size:]]


def max_shots(demo_lengths: Sequence[int], budget: int, sep_len: int, pool_size: int | None = None) -> int:
    """The most demos that fit ``budget`` tokens: largest k with k·(mean + sep) + 3·sqrt(k)·std ≤ budget.

    ``demo_lengths`` may be a sample of the pool; k is capped at ``pool_size`` (default: the number of lengths).
    """
    lengths = np.asarray(demo_lengths, dtype=float)
    if lengths.size == 0:
        return 0
    cap = lengths.size if pool_size is None else pool_size
    mean, std = float(lengths.mean()) + sep_len, float(lengths.std())
    k = 0
    while k < cap and (k + 1) * mean + 3.0 * math.sqrt(k + 1) * std <= budget:
        k += 1
    return k


def default_shot_grid(k_max: int) -> list[int]:
    """1, 2, 4, … ≤ k_max, plus k_max."""
    grid = [2**i for i in range(int(math.log2(k_max)) + 1)] if k_max >= 1 else []
    if k_max >= 1 and grid[-1] != k_max:
        grid.append(k_max)
    return grid


class _Setup(NamedTuple):
    """What both ICL runs start from: the data, its split, the prompt's tokens and the context budget."""

    pairs: list[Pair]
    name: str
    fmt: PromptFormat
    labels: list[str]
    tokens: PromptTokens
    test: list[Pair]
    pool: list[Pair]
    context: int
    context_source: str
    test_queries: list
    pool_demos: _LazyDemos
    budget: int  # tokens left for the demonstrations


def _prepare(model, tokenizer, dataset, dataset_options, prompt, test_size, seed, max_length) -> _Setup:
    context = _context_length(model, max_length)
    return _prepare_at(context, tokenizer, dataset, dataset_options, prompt, test_size, seed)


def _prepare_at(context: tuple[int, str], tokenizer, dataset, dataset_options, prompt, test_size, seed) -> _Setup:
    """:func:`_prepare` at a known (context length, its source): no model needed (the suite's preflight)."""
    context, context_source = context
    pairs, name = _dataset_pairs(dataset, dataset_options, seed)
    fmt = prompt or PromptFormat()
    labels = sorted({y for _, y in pairs})
    tokens = PromptTokens(tokenizer, fmt, labels)
    test, pool = _split(pairs, test_size, seed)
    test_queries = tokens.queries([t for t, _ in test])
    pool_demos = _LazyDemos(tokens, pool)
    longest_label = max(len(s) for s in tokens.label_ids.values())
    budget = context - len(tokens.bos) - max(len(q) for q in test_queries) - longest_label
    return _Setup(
        pairs, name, fmt, labels, tokens, test, pool, context, context_source, test_queries, pool_demos, budget
    )


def _base_metadata(setup: _Setup, dataset_options, seed, model) -> dict:
    name, pairs, labels, fmt, tokens, test, pool = (
        setup.name,
        setup.pairs,
        setup.labels,
        setup.fmt,
        setup.tokens,
        setup.test,
        setup.pool,
    )
    round_trip = bool(tokens.round_trip(pool[:1], test[0][0], test[0][1]))
    if not round_trip:
        warnings.warn("the tokenised prompt does not decode back to the prompt string exactly", stacklevel=3)
    return {
        "dataset": name,
        "dataset_options": {k: str(v) if isinstance(v, Path) else v for k, v in dict(dataset_options or {}).items()},
        "num_examples": len(pairs),
        "num_classes": len(labels),
        "labels": labels,
        "test_size": len(test),
        "test_set": "a seeded uniform sample of the data set (numpy default_rng([seed, 0])), fixed for every run",
        "test_label_counts": {y: sum(t == y for _, t in test) for y in labels},  # unbalanced: the constant floor
        "demo_pool_size": len(pool),
        "prompt": {
            **asdict(fmt),
            "demo_template": "{x_prefix}{text}\\n{y_prefix}{label}",
            "layout": "demos joined by the separator, then the separator and the test item with an empty label",
        },
        "tokenization": (
            "piecewise (BOS, demos, separators, test item); label tokens = tokens(y_prefix + label) minus the "
            "longest prefix of tokens(y_prefix) they all share"
            + ("; each piece encoded after a newline whose tokens are dropped (dummy prefix)" if tokens.anchor else "")
        ),
        "tokenization_round_trip": round_trip,
        "label_tokens": {label: len(seq) for label, seq in tokens.label_ids.items()},
        "end_token": int(tokens.trie.end_token),
        "decoding": (
            "constrained greedy over a token trie of the labels (argmax over the allowed next tokens), stopping at "
            "the shortest unique prefix; one single-token forward on the KV cache per trie step; the separator's "
            "first token ends a label that is a token prefix of another"
        ),
        "accuracy": "exact label match, in [0, 1]",
        "context_length": setup.context,
        "context_source": setup.context_source,
        "trained_length": trained_length(model),  # None: not recorded (a pretrained model)
        "seed": seed,
        "model": _model_info(model),
    }


def _check_fit(n: int, context: int, what: str) -> None:
    if n > context:
        raise ValueError(f"{what} needs {n} tokens, more than the context of {context}")


@contextmanager
def _test_set_scorer(
    model, setup: _Setup, share_prefix: bool, prefixes: int, desc: str, progress: bool
) -> Iterator[Callable[[list[int]], list[int]]]:
    """Yields ``hits(prefix)``: per test item, in the test set's order, 1 if the model decodes its label after this
    demonstration prefix else 0 (in eval mode, without gradients, one progress bar over ``prefixes`` prefixes); the
    model's training mode is restored afterwards."""
    runner = _Runner(model, share_prefix)
    was_training = model.training
    model.eval()
    gold = [y for _, y in setup.test]
    bar = tqdm(total=prefixes * len(setup.test), desc=desc, disable=not progress)

    def hits(prefix: list[int]) -> list[int]:
        preds = runner.predict(setup.tokens.trie, prefix, setup.test_queries, bar)
        return [int(p == g) for p, g in zip(preds, gold, strict=True)]

    try:
        with torch.inference_mode():
            yield hits
    finally:
        bar.close()
        model.train(was_training)


def _shot_counts(setup: _Setup, shots: Sequence[int] | None, seed: int) -> tuple[int, list[int]]:
    """The most shots that fit the context and the shot counts :func:`run_icl` runs (:func:`_shot_grid`)."""
    tokens, pool = setup.tokens, setup.pool
    k_max = max_shots(setup.pool_demos.sample_lengths(seed), setup.budget, len(tokens.sep), pool_size=len(pool))
    if k_max < 1:
        raise ValueError(
            f"not even one demonstration fits the context of {setup.context} tokens; lower max_chars "
            "(--icl-max-chars; eval option icl_max_chars) or lengthen the context"
        )
    return k_max, _shot_grid(shots, k_max, setup.context)


def _shot_grid(shots: Sequence[int] | None, k_max: int, context: int) -> list[int]:
    """The shot counts to run: the given ones (checked against the most that fit), or the default grid."""
    if shots is None:
        return default_shot_grid(k_max)
    grid = sorted({int(k) for k in shots})
    if not grid or grid[0] < 1:
        raise ValueError(f"shots must be positive integers, got {list(shots)!r}")
    if grid[-1] > k_max:
        raise ValueError(f"{grid[-1]} shots do not fit the context of {context} tokens: at most {k_max}")
    return grid


def _draw_fitting(rng, pool_demos, pool_size: int, k: int, cost: Callable[[list[int]], int], budget: int):
    """``k`` demonstrations drawn without replacement whose tokens fit ``budget``, redrawn up to 100 times;
    returns them and the number of redraws."""
    for redraws in range(100):
        chosen = [int(i) for i in rng.choice(pool_size, size=k, replace=False)]
        if cost(chosen) <= budget:
            return chosen, redraws
    raise ValueError(f"could not draw {k} demonstrations that fit the context in 100 tries")


def run_icl(
    model,
    tokenizer,
    dataset: str | Sequence[Pair] = "wordnet",
    *,
    shots: Sequence[int] | None = None,
    draws: int = 10,
    test_size: int = 100,
    seed: int = 0,
    max_length: int | None = None,
    prompt: PromptFormat | None = None,
    dataset_options: Mapping | None = None,
    share_prefix: bool = True,
    progress: bool = True,
) -> dict:
    """Many-shot ICL accuracy vs number of demonstrations (DIFF Fig. 6; Dex Table 3).

    Args:
        dataset: ``"wordnet"``, ``"fortunes"``, ``"chatterbot"`` or a list of ``(text, label)`` pairs.
        shots: shot counts (default: 1, 2, 4, … up to the most that fit, plus that maximum); each ≤ the maximum.
        draws: demo sets drawn per shot count (docs/evaluation.md §7.3: 10).
        test_size: size of the fixed test set.
        max_length: context length in tokens (default: ``config.max_position_embeddings``).
        prompt: the :class:`PromptFormat`.
        dataset_options: options of the loader / :func:`~.icl_data.prepare_pairs` (``max_classes``,
            ``max_chars``, ``balanced``, ``per_class``, ``path``; ``seed`` defaults to ``seed``).
        share_prefix: reuse the demos' KV cache for all test items (same result as recomputing it).

    Returns a JSON-serialisable dict: ``shots``, ``accuracy`` (per shot count, one value per draw), ``mean``,
    ``std`` (over draws), ``labels``, ``metadata``.
    """
    if not isinstance(draws, int) or draws < 1:
        raise ValueError(f"draws must be a positive integer, got {draws!r}")
    setup = _prepare(model, tokenizer, dataset, dataset_options, prompt, test_size, seed, max_length)
    _, name, _, labels, tokens, _, pool, context, _, test_queries, pool_demos, budget = setup
    k_max, grid = _shot_counts(setup, shots, seed)

    def cost(chosen: list[int]) -> int:
        return sum(len(ids) + len(tokens.sep) for ids in pool_demos[chosen])

    accuracy: list[list[float]] = []
    item_hits: list[list[list[int]]] = []  # per shot count, per draw, per test item: 1 if solved
    heuristics: list[list[dict[str, float]]] = []  # per shot count, per draw: what each heuristic scores
    gold = [y for _, y in setup.test]
    redraws = 0
    longest = 0
    with _test_set_scorer(model, setup, share_prefix, len(grid) * draws, f"icl {name}", progress) as score:
        for k in grid:
            per_draw, per_draw_hits, per_draw_heuristics = [], [], []
            for d in range(draws):
                chosen, again = _draw_fitting(
                    np.random.default_rng([seed, k, d]), pool_demos, len(pool), k, cost, budget
                )
                redraws += again
                prefix = tokens.prefix(pool_demos[chosen])
                longest = max(longest, len(prefix) + max(len(q) for q in test_queries))
                _check_fit(longest, context, f"{k} shots")
                per_draw_hits.append(score(prefix))
                per_draw.append(float(np.mean(per_draw_hits[-1])))
                per_draw_heuristics.append(heuristic_scores(labels, gold, [pool[i][1] for i in chosen]))
            accuracy.append(per_draw)
            item_hits.append(per_draw_hits)
            heuristics.append(per_draw_heuristics)
    floors = {h: [float(np.mean([d[h] for d in per_k])) for per_k in heuristics] for h in HEURISTICS}

    metadata = _base_metadata(setup, dataset_options, seed, model)
    metadata.update(
        {
            "task": "many-shot in-context learning (DIFF Fig. 6; Dex Table 3; Bertsch et al. 2024)",
            "shots": grid,
            "shot_grid": "given" if shots is not None else "1, 2, 4, ... up to the maximum, plus the maximum",
            "max_shots": k_max,
            "max_shots_rule": (
                "largest k with BOS + k*(mean demo + separator) + 3*sqrt(k)*std(demo) + longest test item + "
                "longest label <= context, capped at the pool size; mean and std over the pool (a seeded sample of "
                f"{_LazyDemos.SAMPLE} demos if larger); overflowing draws are redrawn"
            ),
            "draws": draws,
            "demo_sampling": "uniform without replacement from the pool, numpy default_rng([seed, shots, draw])",
            "redraws": redraws,
            "max_prompt_tokens": longest,
            "std": "population standard deviation (ddof=0) over draws",
            "share_prefix": share_prefix,
            "floor": "per shot count, the best mean over the draws of the heuristics without the skill (HEURISTICS)",
        }
    )
    return {
        "shots": grid,
        "accuracy": accuracy,
        "hits": item_hits,  # per shot count, per draw, per test item (the test set's order): 1 if solved, else 0
        "mean": [float(np.mean(a)) for a in accuracy],
        "std": [float(np.std(a)) for a in accuracy],
        "labels": labels,
        "heuristics": floors,  # per heuristic, per shot count: its mean accuracy over the draws
        "floor": [max(floors[h][i] for h in HEURISTICS) for i in range(len(grid))],
        "metadata": metadata,
    }


#: what a model without in-context learning can score, the floor of the accuracy (the best of them, simulated on each
#: draw's own test set and demonstrations, as the needle and MQAR floors are): ``constant``, the test set's most
#: frequent label always (the best constant answer: the test set is a uniform sample of an unbalanced data set, so
#: it beats 1 / labels); ``demo_majority``, the most frequent label among the draw's demonstrations (ties: the first
#: in label order); ``last_demo``, the last demonstration's label
HEURISTICS = ("constant", "demo_majority", "last_demo")


def heuristic_scores(labels: Sequence[str], gold: Sequence[str], demo_labels: Sequence[str]) -> dict[str, float]:
    """What each of :data:`HEURISTICS` scores on a test set with labels ``gold``, after demonstrations labelled
    ``demo_labels`` (in prompt order)."""
    counts = Counter(demo_labels)
    majority = max(labels, key=lambda y: (counts[y], -labels.index(y)))

    def share(label: str) -> float:
        return sum(g == label for g in gold) / len(gold)

    return {
        "constant": max(share(y) for y in labels),
        "demo_majority": share(majority),
        "last_demo": share(demo_labels[-1]),
    }


# ----------------------------------------------------------------------------------------------------------------
# order robustness
