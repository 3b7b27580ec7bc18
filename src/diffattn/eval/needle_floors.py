"""Floors of the needle-retrieval suites by simulation: what a model that never reads the question scores.

A floor is not a formula here. Heuristic "models" that ignore which key is asked (:data:`HEURISTICS`: copy the
first needles of the context, the last, random ones, the most frequent numbers) answer the suite's own prompts, and
the suite's own scorers score them; the floor a row prints is the best heuristic over the cells the row reads. The
formula it replaces, R/N per needle and 1/C(N, R) prompts solved, is what *random* needles score; on short
haystacks the placement and the depth protocol make some heuristics score more (in the heatmap, depth 0 puts the
queried needle first, ahead of any needle that shares its sentence start only at random: "copy the first needle"
solves most depth-0 prompts), so a model at the formula's level can
still be without the skill.

Random heuristics are scored exactly: the mean over every choice they could make (all R-subsets of the N needles),
not over draws, so a floor has no sampling noise of its own beyond the prompts'.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Callable, Sequence

from ..data.synthetic import NeedleSample, score_first_numbers, score_string_match_all

# the outputs a heuristic writes for one prompt: (output text, probability) over its possible choices
Outputs = list[tuple[str, float]]


def _numbers_asked(sample: NeedleSample) -> int:
    return len(sample.answers)


def _write(numbers: Sequence[str]) -> str:
    return " " + ", ".join(numbers)


def _first_needles(sample: NeedleSample) -> Outputs:
    return [(_write([n for _, n, _ in sample.needles[: _numbers_asked(sample)]]), 1.0)]


def _last_needles(sample: NeedleSample) -> Outputs:
    return [(_write([n for _, n, _ in sample.needles[-_numbers_asked(sample) :]]), 1.0)]


def _random_needles(sample: NeedleSample) -> Outputs:
    numbers = [n for _, n, _ in sample.needles]
    subsets = list(itertools.combinations(numbers, min(_numbers_asked(sample), len(numbers))))
    return [(_write(s), 1.0 / len(subsets)) for s in subsets]


def _most_frequent_numbers(sample: NeedleSample) -> Outputs:
    """The R numbers seen most often in the context (ties: the first seen), as a model that counts would write."""
    found = re.findall(r"\d+", sample.context)
    first_seen = {n: i for i, n in reversed(list(enumerate(found)))}
    ranked = sorted(Counter(found).items(), key=lambda kv: (-kv[1], first_seen[kv[0]]))
    return [(_write([n for n, _ in ranked[: _numbers_asked(sample)]]), 1.0)]


HEURISTICS: dict[str, Callable[[NeedleSample], Outputs]] = {
    "first needles": _first_needles,
    "last needles": _last_needles,
    "random needles": _random_needles,
    "most frequent numbers": _most_frequent_numbers,
}


def heuristic_scores(sample: NeedleSample) -> dict[str, dict[str, float]]:
    """Each heuristic's expected scores on one prompt with the suite's scorers: ``score`` (RULER string_match_all),
    ``strict`` (the first R numbers) and ``solved`` (strict = 1)."""
    out = {}
    for name, heuristic in HEURISTICS.items():
        outputs = heuristic(sample)
        strict = [(score_first_numbers(text, sample.answers), p) for text, p in outputs]
        out[name] = {
            "score": sum(score_string_match_all(text, sample.answers) * p for text, p in outputs),
            "strict": sum(s * p for s, p in strict),
            "solved": sum(p for s, p in strict if s == 1.0),
        }
    return out


def floor_of(per_prompt: Sequence[dict[str, dict[str, float]]], metric: str) -> tuple[float, str]:
    """The best heuristic's mean ``metric`` over the prompts (one strategy for all of them) and its name."""
    if not per_prompt:
        raise ValueError("no prompts to take a floor over")
    means = {name: sum(p[name][metric] for p in per_prompt) / len(per_prompt) for name in HEURISTICS}
    best = max(means, key=lambda n: (means[n], -list(HEURISTICS).index(n)))
    return means[best], best


def cell_floors(per_prompt: Sequence[dict[str, dict[str, float]]]) -> dict:
    """A cell's record: each heuristic's mean scores, and the floors (best heuristic) of credit and solved."""
    means = {
        name: {m: sum(p[name][m] for p in per_prompt) / len(per_prompt) for m in ("score", "strict", "solved")}
        for name in HEURISTICS
    }
    credit, by_credit = floor_of(per_prompt, "strict")
    solved, by_solved = floor_of(per_prompt, "solved")
    return {"heuristics": means, "floor": credit, "floor_by": by_credit, "floor_solved": solved,
            "floor_solved_by": by_solved, "floor_score": floor_of(per_prompt, "score")[0]}  # fmt: skip
