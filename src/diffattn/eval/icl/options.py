"""The icl suite's options, their check and the preflight that loads the data set."""

from __future__ import annotations

from dataclasses import dataclass

from ..common import (
    int_list,
    option,
)
from ..icl_data import DATASETS, load_icl_dataset


@dataclass
class IclOptions:
    """Many-shot ICL and order robustness (docs/evaluation.md §7)."""

    icl_dataset: str = option("fortunes", f"ICL data set: {', '.join(DATASETS)}")
    icl_draws: int = option(3, "draws of demonstrations per shot count", minimum=1)
    icl_test_size: int = option(30, "test items per draw", minimum=1)
    icl_shots: tuple[int, ...] | None = option(
        None, "comma-separated shot counts (default: a grid up to what fits the context)", parse=int_list
    )
    icl_permutations: int = option(10, "orders of the order-robustness set", minimum=1)
    # longer texts are cut (the papers are silent; keeps many shots in context: docs/evaluation.md §7.1)
    icl_max_chars: int = option(300, "cut longer ICL texts", minimum=1)
    icl_max_classes: int | None = option(None, "keep the most frequent classes", minimum=2)
    # the order-robustness demo set fills it, so on a model with 8,192 positions every permutation is an
    # 8k-token prefill: this is the suite's cost knob
    icl_context_tokens: int | None = option(
        None,
        "ICL prompt length in tokens (default: the length the model was trained at, else its maximum; the "
        "order-robustness set fills it)",
        minimum=8,
    )


def _dataset_options(o) -> dict:
    return {"max_chars": o.icl_max_chars, "max_classes": o.icl_max_classes}


def _check(o, name) -> None:
    if o.icl_dataset not in DATASETS:
        raise ValueError(
            f"{name('icl_dataset')}: unknown ICL dataset {o.icl_dataset!r}; choose one of {', '.join(DATASETS)}"
        )


def _preflight(o, targets, name) -> None:
    """The data set is loaded now: a missing one (say Debian's WordNet) fails before hours of training, and both
    protocols' demonstrations must fit each target's ICL context with its tokenizer (the same test set, pool and
    budget the runs compute): a shot grid, or one round of every class for the order set, that does not fit fails
    before the model trains or, in ``diffattn eval``, before the first suite runs (found by a user's review: an ICL
    that could not fit, run last, discarded the finished suites)."""
    from .decoding import context_length
    from .many_shot import _prepare_at, _shot_counts
    from .order import _order_demo_set

    if not targets:  # else each target's setup loads it
        load_icl_dataset(o.icl_dataset, **_dataset_options(o))
    seen = set()
    for t in targets:
        try:
            context = context_length(o.icl_context_tokens, t.trained_length, t.positions)
        except ValueError as e:
            raise ValueError(f"{name('icl_context_tokens')} for {t.name}: {e}") from e
        if (t.tokenizer, context) in seen:
            continue
        seen.add((t.tokenizer, context))
        try:
            setup = _prepare_at(
                context, t.tokenizer(), o.icl_dataset, _dataset_options(o), None, o.icl_test_size, o.seed
            )
            _shot_counts(setup, o.icl_shots, o.seed)
            _order_demo_set(
                None, setup.labels, setup.pool, setup.pool_demos, len(setup.tokens.sep), setup.budget,
                setup.context, o.seed,
            )  # fmt: skip
        except ValueError as e:
            raise ValueError(f"icl for {t.name} at {context[0]} tokens ({context[1]}): {e}") from e
