"""Sampling and scoring of the needle grid, the heatmap and the multi-value cell (run_niah): the protocol in
:mod:`diffattn.eval.niah`'s docstring."""

from __future__ import annotations

import hashlib
import logging
import math
from functools import partial
from typing import NamedTuple

import torch
from torch import nn
from tqdm.auto import tqdm

from ...data.synthetic import (
    NeedleSample,
    make_needle_sample,
    needle_answer_text,
    score_first_numbers,
    score_string_match_all,
)
from ..common import (
    NEEDLE_CONTEXT_CAP,
    check_fits,
    evaluation_window,
    load_text,
    model_device,
    model_max_length,
)
from ..needle_floors import cell_floors, heuristic_scores
from ..stats import (
    wilson_interval,
)

logger = logging.getLogger(__name__)
_WARNED_UNEVEN: set[tuple[int, int]] = set()  # (samples, depths) whose uneven grid was already warned of

GRID = ((1, 1), (2, 1), (4, 1), (6, 1), (8, 1), (2, 2), (4, 2), (6, 2))
# DIFF Table 2's cells that can tell retrieval from copying (its N = 1, R = 1 cell has floor 1: one needle to copy)
TABLE2_CELLS = ((2, 2), (4, 2), (6, 2))
DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
# where a grid cell's first queried needle goes: sample i at depths_in_turn (the protocol's five depths,
# docs/evaluation.md §5; Dex §4.2: "0%, 25%, 50%, 75%, and 100%"), or "random" (results before version 10: a uniform
# random depth)
GRID_PLACEMENTS = ("depths", "random")


def depths_in_turn(depths, samples: int) -> list[float]:
    """Sample ``i``'s depth of the first queried needle: ``depths[i % len(depths)]``, the depths in turn, so that a
    cell of ``samples`` samples holds every depth equally often (up to one) and averages over them (the needle
    grid and the allocation prompts)."""
    if len(depths) == 0:  # len, not truth: a NumPy array of depths is accepted
        raise ValueError("depths must name at least one depth in [0, 1]")
    return [float(depths[i % len(depths)]) for i in range(samples)]


def grid_depths(placement: str, samples: int, depths=DEPTHS) -> list[float | None]:
    """The grid cells' per-sample depths for a placement of :data:`GRID_PLACEMENTS`: ``depths`` in turn, or None
    (random) for every sample."""
    if placement not in GRID_PLACEMENTS:
        raise ValueError(f"unknown needle grid placement {placement!r}; choose one of {', '.join(GRID_PLACEMENTS)}")
    return depths_in_turn(depths, samples) if placement == "depths" else [None] * samples


def fit_sample(tokenizer, haystack: str, context_tokens: int, seed: int, **kwargs):
    """A needle sample whose prompt plus answer is at most ``context_tokens`` tokens (and close to it)."""
    ratio = max(1.0, len(haystack[:20000]) / max(1, len(tokenizer(haystack[:20000])["input_ids"])))
    chars = int(context_tokens * ratio)
    for _ in range(40):
        sample = make_needle_sample(seed, haystack, context_chars=max(0, chars), **kwargs)
        need = len(tokenizer(sample.prompt + needle_answer_text(sample))["input_ids"])
        if need <= context_tokens:
            return sample
        chars = int(chars * min(0.97, context_tokens / need))
    raise ValueError(
        f"could not fit a needle sample into {context_tokens} tokens (the needles, question and answer alone take "
        f"{need}); ask for a longer context or fewer needles"
    )


@torch.no_grad()
def greedy_answer(model: nn.Module, tokenizer, prompt: str, max_new_tokens: int) -> str:
    """Greedy continuation of ``prompt`` (batch of one: no padding to get wrong), up to ``max_new_tokens`` tokens and
    never past the model's last position: the suite's prompts leave room for the answer (:func:`fit_sample`) but not
    for its 4 tokens of slack, which past the positions crashed a model with learned positions (GPT-2's embedding
    lookup: IndexError) and made transformers warn for every other model evaluated at its full context."""
    enc = tokenizer(prompt, return_tensors="pt")
    ids = enc["input_ids"].to(model_device(model))
    # the last token generated is never fed back: k new tokens take the positions up to len(prompt) + k - 2
    max_new_tokens = min(max_new_tokens, model_max_length(model) - ids.shape[1] + 1)
    if max_new_tokens < 1:  # a prompt longer than the positions
        return ""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=pad,
    )
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def _score(model, tokenizer, sample) -> tuple[float, str, list[int], float]:
    """(RULER string_match_all score, the output, 1/0 per queried number found, strict first-R-numbers score)."""
    budget = len(tokenizer(needle_answer_text(sample), add_special_tokens=False)["input_ids"]) + 4
    output = greedy_answer(model, tokenizer, sample.prompt, budget)
    hits = [int(str(a).lower() in output.lower()) for a in sample.answers]
    return score_string_match_all(output, sample.answers), output, hits, score_first_numbers(output, sample.answers)


class _Scored(NamedTuple):
    sample: NeedleSample
    score: float  # RULER string_match_all
    output: str
    hits: list[int]  # 1/0 per queried number found anywhere in the output
    strict: float  # the first R numbers of the output
    heuristics: dict  # what each heuristic without the skill scores on this prompt (needle_floors)


def _score_cell(
    model, tokenizer, text: str, digest, bar, length: int, seeds: list[int], depths=None, **needles
) -> list[_Scored]:
    """One cell: a needle sample of ``length`` tokens per seed (``needles``: :func:`fit_sample`'s options; ``depths``:
    per seed, its first queried needle's depth, None random), its prompt added to ``digest`` (the record that
    paired models saw the same samples), greedily answered and scored."""
    cell = []
    for s, depth in zip(seeds, [None] * len(seeds) if depths is None else depths, strict=True):
        sample = fit_sample(tokenizer, text, length, s, depth=depth, **needles)
        digest.update(sample.prompt.encode() + b"\0")
        cell.append(_Scored(sample, *_score(model, tokenizer, sample), heuristic_scores(sample)))
        bar.update()
    return cell


def needle_chance(n: int, r: int) -> tuple[float, float]:
    """(per-needle credit, prompts solved) of a model without the skill, which writes R distinct needle numbers of
    the N at random: each queried number is among them with probability R/N, all R with 1/C(N, R). At R = 1 both
    are 1/N. (Copying a single needle scores 1/N per needle at any R, less than R/N: R/N is the floor.)"""
    return r / n, 1 / math.comb(n, r)


def _grid_row(n: int, r: int, cell: list[_Scored], depths: list[float | None]) -> dict:
    scores, strict = [c.score for c in cell], [c.strict for c in cell]
    return {
        "N": n,
        "R": r,
        "depths": depths,  # per sample, its first queried needle's asked-for depth (None: random)
        # per sample, where it went: the fraction of the haystack before it. Needles go in at sentence starts, so a
        # short haystack moves them (at 256 tokens and N = 8 an asked 25% can land at 0)
        "placed_depths": [c.sample.depth for c in cell],
        "accuracy": sum(scores) / len(scores),
        "samples": len(cell),
        "scores": scores,
        "hits": [c.hits for c in cell],  # per sample, 1/0 per queried number found anywhere in the output
        "strict_scores": strict,  # per sample, the strict score (first R numbers of the output)
        "strict_accuracy": sum(strict) / len(strict),
        "solved": sum(s == 1.0 for s in strict) / len(strict),
        "chance": needle_chance(n, r)[0],
        "chance_solved": needle_chance(n, r)[1],
        **cell_floors([c.heuristics for c in cell]),  # floor, floor_solved: the best heuristic, simulated
        # per heuristic, per sample: the share of its outputs that solve the prompt (the floors of any subset of the
        # samples, such as those of one depth: tables.depth_table)
        "heuristics_solved": {h: [c.heuristics[h]["solved"] for c in cell] for h in cell[0].heuristics},
        "ci": list(wilson_interval(sum(scores), len(scores))),
    }


# metadata["prompt_seeds"] of results whose cells draw their prompts from seeds of their own (:func:`cell_seeds`);
# older results drew sample i of every cell from one seed, so one prompt's keys, numbers and depths repeated across
# lengths and needle counts, and a test pooling cells counted each such near copy as another prompt (niah.claims
# reads them by seed instead)
PER_CELL_SEEDS = "per cell"


def cell_seeds(seed: int, cell: str, samples: int) -> list[int]:
    """The seeds of one cell's samples, from ``seed`` and the cell's name (e.g. ``grid N=4 R=1``, ``heatmap
    length=96 depth=0.25``): the same for every model evaluated with the same seed (paired comparisons), and no two
    cells alike, so every prompt of a grid or heatmap is a draw of its own."""
    return [int.from_bytes(hashlib.sha256(f"{seed}/{cell}/{i}".encode()).digest()[:8], "big") for i in range(samples)]


def _grid_seeds(seed: int, n: int, r: int, samples: int) -> list[int]:
    return cell_seeds(seed, f"grid N={n} R={r}", samples)


def _heatmap_seeds(seed: int, length: int, depth: float, samples: int) -> list[int]:
    return cell_seeds(seed, f"heatmap length={length} depth={float(depth)}", samples)


def _heatmap(score_cell, lengths: list[int], depths, samples: int, needles: int, seed: int) -> dict:
    """The length × depth heatmap: per cell, ``samples`` samples of ``needles`` needles, one queried, the first at
    the depth, from the cell's own seeds (:func:`cell_seeds`)."""
    heat, heat_scores, heat_ci, heat_strict, heat_floors = [], [], [], [], []
    for length in lengths:
        row, row_scores, row_ci, row_strict, row_floors = [], [], [], [], []
        for depth in depths:
            seeds = _heatmap_seeds(seed, length, depth, samples)
            cell = score_cell(length, seeds, depths=[depth] * samples, num_needles=needles, num_queries=1)
            scores, strict = [c.score for c in cell], [c.strict for c in cell]
            row.append(sum(scores) / len(scores))
            row_scores.append(scores)
            row_strict.append(strict)
            row_ci.append(list(wilson_interval(sum(scores), len(scores))))
            row_floors.append(cell_floors([c.heuristics for c in cell])["heuristics"])
        heat.append(row)
        heat_floors.append(row_floors)
        heat_scores.append(row_scores)
        heat_ci.append(row_ci)
        heat_strict.append(row_strict)
    return {
        "lengths": lengths,
        "depths": list(depths),
        "accuracy": heat,
        "scores": heat_scores,
        "strict_scores": heat_strict,
        "ci": heat_ci,
        "heuristics": heat_floors,  # per cell: each heuristic's mean scores (needle_floors)
        "N": needles,
        "R": 1,
    }


def _fitting_grid(tokenizer, text: str, context_tokens: int, seed: int, value_digits: int, depths: list):
    """The cells of :data:`GRID` whose every sample (one per entry of ``depths``) fits the context, and the others
    with the reason."""
    fits, left_out = [], []
    for n, r in GRID:
        try:
            for s, depth in zip(_grid_seeds(seed, n, r, len(depths)), depths, strict=True):
                fit_sample(tokenizer, text, context_tokens, s, num_needles=n, num_queries=r, value_digits=value_digits,
                           depth=depth)  # fmt: skip
            fits.append((n, r))
        except ValueError as e:
            left_out.append({"N": n, "R": r, "why": str(e)})
    if not fits:
        raise ValueError(f"no needle cell fits {context_tokens} tokens: {left_out[0]['why']}")
    return fits, left_out


def default_heatmap_lengths(
    tokenizer, text: str, context_tokens: int, needles: int, value_digits: int, seed: int, depths, samples: int
) -> tuple[list[int], list[dict]]:
    """The heatmap's default lengths — half, three quarters and all of ``context_tokens`` — where every sample of
    ``needles`` needles it will draw fits (each depth's seeds, the first needle at the depth), and the others with
    the reason (as the default grid leaves out cells that do not fit: at a short context the needles alone may
    outgrow half of it)."""
    fits, left_out = [], []
    for length in sorted({context_tokens // 2, 3 * context_tokens // 4, context_tokens} - {0}):
        try:
            for depth in depths:
                for s in _heatmap_seeds(seed, length, depth, samples):
                    fit_sample(tokenizer, text, length, s, num_needles=needles, value_digits=value_digits, depth=depth)
            fits.append(length)
        except ValueError as e:
            left_out.append({"length": length, "why": str(e)})
    return fits, left_out


def run_niah(
    model: nn.Module,
    tokenizer,
    *,
    haystack: str = "shakespeare",
    context_tokens: int | None = None,
    grid: tuple[tuple[int, int], ...] | None = None,
    samples: int = 10,
    heatmap_lengths: list[int] | None = None,
    depths=DEPTHS,
    grid_placement: str = "depths",
    heatmap_needles: int = 8,
    heatmap_samples: int | None = None,
    value_digits: int = 7,
    multivalue: tuple[int, int] | None = None,
    seed: int = 0,
    progress: bool = True,
) -> dict:
    """The (N, R) grid at ``context_tokens`` and the N = 8, R = 1 length × depth heatmap; see the module doc.

    ``grid``: (N, R) cells; None = :data:`GRID` where it fits the context.
    ``heatmap_lengths``: None = half, three quarters and all of ``context_tokens``, where the heatmap's needles fit
    (the others named in ``metadata["heatmap_lengths_left_out"]``); ``[]`` = no heatmap.
    ``heatmap_samples``: samples per heatmap cell (default ``samples``). ``value_digits``: the needle numbers'
    length (the papers: 7). ``multivalue``: (N, V) of the multi-value cell (None: none). ``grid_placement``: where
    a grid cell's first queried needle goes (:data:`GRID_PLACEMENTS`): ``"depths"``, sample i at ``depths`` (the
    heatmap's; default :data:`DEPTHS`) in turn (:func:`depths_in_turn`), or ``"random"``; the multi-value cell's
    needles are at random depths (RULER's)."""
    context_tokens = evaluation_window(model, context_tokens, cap=NEEDLE_CONTEXT_CAP)
    check_fits(model, context_tokens, f"needle retrieval at context_tokens={context_tokens}")
    heatmap_samples = samples if heatmap_samples is None else heatmap_samples
    if samples < 1 or heatmap_samples < 1:
        raise ValueError(f"samples and heatmap_samples must be >= 1, got {samples} and {heatmap_samples}")
    cell_depths = grid_depths(grid_placement, samples, depths)
    if grid_placement == "depths" and samples % len(depths) and (samples, len(depths)) not in _WARNED_UNEVEN:
        _WARNED_UNEVEN.add((samples, len(depths)))  # once per process: an experiment evaluates many models alike
        logger.warning(
            "needle grid: %d samples a cell do not hold the %d depths equally often (the first %d take one more); "
            "a multiple of %d, such as %d, holds each as often",
            samples, len(depths), samples % len(depths), len(depths), len(depths) * -(-samples // len(depths)),
        )  # fmt: skip
    text, description = load_text(haystack, "test") if haystack in ("shakespeare", "filler") else (haystack, "given")
    lengths_left_out = []
    if heatmap_lengths is None:
        heatmap_lengths, lengths_left_out = default_heatmap_lengths(
            tokenizer, text, context_tokens, heatmap_needles, value_digits, seed, depths, heatmap_samples
        )
        for dropped in lengths_left_out:
            logger.info("needle heatmap: length %d left out: %s", dropped["length"], dropped["why"])
    heatmap_lengths = list(heatmap_lengths)
    for length in heatmap_lengths:
        check_fits(model, length, f"the needle heatmap at length {length}")
    if grid is None:
        grid, left_out = _fitting_grid(tokenizer, text, context_tokens, seed, value_digits, cell_depths)
    else:
        left_out = []
    grid_rows = []
    total = (len(grid) + (multivalue is not None)) * samples + len(heatmap_lengths) * len(depths) * heatmap_samples
    bar = tqdm(total=total, desc="needle retrieval", disable=not progress, leave=False)
    examples = []
    digest = hashlib.sha1()
    score_cell = partial(_score_cell, model, tokenizer, text, digest, bar, value_digits=value_digits)
    for n, r in grid:
        seeds = _grid_seeds(seed, n, r, samples)
        cell = score_cell(context_tokens, seeds, depths=cell_depths, num_needles=n, num_queries=r)
        examples.append({"N": n, "R": r, "answers": list(cell[0].sample.answers), "output": cell[0].output})
        grid_rows.append(_grid_row(n, r, cell, cell_depths))
    multivalue_row = None
    if multivalue is not None:
        n, v = multivalue
        seeds = cell_seeds(seed, f"multivalue N={n} V={v}", samples)
        cell = score_cell(context_tokens, seeds, num_needles=n, num_queries=1, values_per_key=v)
        examples.append({"N": n, "V": v, "answers": list(cell[0].sample.answers), "output": cell[0].output})
        multivalue_row = {**_grid_row(n, v, cell, [None] * samples), "R": 1, "V": v}  # chance V/N: V numbers of N
    heatmap = _heatmap(score_cell, heatmap_lengths, depths, heatmap_samples, heatmap_needles, seed)
    bar.close()
    pooled = [s for g in grid_rows for s in g["scores"]]
    mean_ci = wilson_interval(sum(pooled), len(pooled))
    r1 = [g for g in grid_rows if g["R"] == 1]
    return {
        "grid": grid_rows,
        "multivalue": multivalue_row,
        "heatmap": heatmap,
        "mean_accuracy": sum(r["accuracy"] for r in grid_rows) / len(grid_rows),
        "mean_strict_accuracy": sum(r["strict_accuracy"] for r in grid_rows) / len(grid_rows),
        "r1_solved": sum(g["solved"] for g in r1) / len(r1) if r1 else None,
        "r1_cells": [g["N"] for g in r1],
        "mean_accuracy_ci": list(mean_ci),
        "examples": examples,
        "metadata": {
            "haystack": description,
            "context_tokens": context_tokens,
            "samples_per_cell": samples,
            "heatmap_samples_per_cell": heatmap_samples,
            "value_digits": value_digits,
            "decoding": "greedy; max_new_tokens = answer tokens + 4, up to the model's last position",
            "scoring": (
                "accuracy: RULER string_match_all (a queried number anywhere in the output); strict_accuracy: the "
                "queried numbers among the first R numbers of the output (no credit for listing extra numbers)"
            ),
            "placement": (
                "first queried needle at the heatmap cell's depth; in the grid "
                + (
                    f"at the depths {', '.join(f'{100 * d:g}%' for d in depths)} in turn (the grid rows' depths)"
                    if grid_placement == "depths"
                    else "at a random depth"
                )
                + "; in the multi-value cell random; the other needles random; sentence starts"
            ),
            "grid_placement": grid_placement,
            "seed": seed,
            "intervals": "cells: Wilson 95% score interval (fractional scores of R > 1 as partial successes); "
            "mean_accuracy_ci: Wilson 95% interval on the pooled grid samples (equal samples per cell)",
            "pairing": "sample i of a cell uses the seed sha256('{seed}/{cell}/{i}') takes (its first 8 bytes): models "
            "evaluated with the same options see the same samples (same samples_sha1): paired comparisons are valid",
            "prompt_seeds": PER_CELL_SEEDS,  # every cell's prompts are draws of their own (none repeats across cells)
            "samples_sha1": digest.hexdigest(),
            "chance": "writing R of the N needles' numbers at random: R/N per-needle credit, 1/C(N, R) solved",
            "floor": "per cell and per claim: the best heuristic without the skill (needle_floors.HEURISTICS: the "
            "first, last, random or most frequent numbers), scored on the same prompts with the same scorers",
            "cells_left_out": left_out,
            "heatmap_lengths_left_out": lengths_left_out,
            "multivalue": None
            if multivalue is None
            else "one key's V values among N needles (the others distractor keys), all V asked; scored as V queried "
            "numbers (strict: among the first V numbers of the output)",
        },
    }
