"""The niah suite's options, their parsing, the preflight that every requested cell fits, and the protocol line."""

from __future__ import annotations

import argparse
import functools
from dataclasses import dataclass

from ..common import (
    NEEDLE_CONTEXT_CAP,
    int_list,
    load_text,
    option,
    option_name,
)
from .sampling import GRID, GRID_PLACEMENTS, fit_sample


def parse_grid(text: str) -> tuple[tuple[int, int], ...]:
    """``--niah-grid``'s ``NxR`` cells, comma-separated (``1x1,4x2``)."""
    try:
        cells = tuple(tuple(int(x) for x in cell.lower().split("x")) for cell in text.split(","))
    except ValueError:
        cells = ()
    if not cells or any(len(c) != 2 or not 1 <= c[1] <= c[0] for c in cells):
        raise argparse.ArgumentTypeError(f"--niah-grid wants NxR cells with 1 <= R <= N, e.g. 1x1,4x2; got {text!r}")
    return cells


def parse_multivalue(text: str) -> tuple[int, int]:
    """``--niah-multivalue``'s one ``NxV`` cell (``8x4``), V >= 2."""
    try:
        cells = parse_grid(text)
    except argparse.ArgumentTypeError:
        cells = ()
    if len(cells) != 1 or cells[0][1] < 2:
        raise argparse.ArgumentTypeError(
            f"--niah-multivalue wants one NxV cell with 2 <= V <= N, e.g. 8x4; got {text!r}"
        )
    return cells[0]


@dataclass
class NiahOptions:
    """The retrieval grid and heatmap (the shared prompt options are :class:`~diffattn.eval.common.CommonOptions`)."""

    # (N needles, R queried) cells; None: GRID where they fit the context
    niah_grid: tuple[tuple[int, int], ...] | None = option(
        None,
        "NxR cells of the retrieval grid (default: 1x1,2x1,4x1,6x1,8x1,2x2,4x2,6x2 where they fit the context)",
        parse=parse_grid,
    )
    niah_grid_placement: str = option(
        "depths",
        "where a grid cell's first queried needle goes: depths (sample i at 0/25/50/75/100%% in turn, the papers' "
        "five depths) or random (a uniform random depth: results before version 10)",
    )
    niah_heatmap_lengths: tuple[int, ...] | None = option(
        None,
        "comma-separated heatmap context lengths; 'none' for no heatmap (default: 1/2, 3/4, all of the context, "
        "those where its needles fit)",
        parse=int_list,
    )
    niah_heatmap_samples: int | None = option(None, "samples per heatmap cell (default: --samples)", minimum=1)
    niah_multivalue: tuple[int, int] | None = option(
        None,
        "NxV: a multi-value cell, one key with V values among N needles, all V asked (DiffLoRA Fig. 3 MV; e.g. 8x4)",
        parse=parse_multivalue,
    )


def check_needle_cells(
    options, targets, cells, heatmap_needles: int | None = None, values_per_key: int = 1, name=None
) -> None:
    """The needle prompts of ``cells`` (and of the heatmap with ``heatmap_needles`` at its lengths) must fit the
    context the evaluation asks for, with the tokenizer each target model will be trained with: refused before any
    training with the reason (the preflight of niah and alloc). ``values_per_key`` > 1: ``cells`` are (N, V)
    multi-value cells, asked as one key. ``name(field)`` spells an option as the user wrote it (default: as an
    experiment config does)."""
    name = name or functools.partial(option_name, style="experiment")
    from ...data.synthetic import CITY_KEYS

    heatmap = [(heatmap_needles, 1)] if heatmap_needles is not None else []
    for n, r in [*cells, *heatmap]:
        if not 1 <= r <= n <= len(CITY_KEYS):
            raise ValueError(f"a needle cell needs 1 <= R <= N <= {len(CITY_KEYS)} (keys), got N={n}, R={r}")
        if 9 * 10 ** (options.niah_digits - 1) < n:
            raise ValueError(f"{name('niah_digits')}={options.niah_digits} gives fewer distinct numbers than N={n}")
    if not targets:
        return
    haystack = options.haystack
    text = load_text(haystack, "test")[0] if haystack in ("shakespeare", "filler") else haystack
    seen = set()
    for t in targets:
        context = t.window(options.context_tokens, cap=NEEDLE_CONTEXT_CAP)  # the suites' default context
        if context > t.positions:
            raise ValueError(f"{name('context_tokens')}={context} exceeds {t.name}'s {t.positions} positions")
        if (t.tokenizer, context, t.positions) in seen:
            continue
        seen.add((t.tokenizer, context, t.positions))
        checks = [(n, r, context) for n, r in cells]
        if heatmap and options.niah_heatmap_lengths is not None:  # the heatmap's needles at every length asked
            # for (the default lengths, 1/2, 3/4 and all of the context, are those where they fit: run_niah)
            checks += [(heatmap_needles, 1, length) for length in options.niah_heatmap_lengths]
        for n, r, length in checks:
            if length > t.positions:
                raise ValueError(
                    f"{name('niah_heatmap_lengths')}: a heatmap length {length} exceeds {t.name}'s {t.positions} "
                    "positions"
                )
            try:
                fit_sample(
                    t.tokenizer(), text, length, 0, num_needles=n, value_digits=options.niah_digits,
                    **({"num_queries": r} if values_per_key == 1 else {"num_queries": 1, "values_per_key": r}),
                )  # fmt: skip
            except ValueError as e:
                raise ValueError(f"the needle prompts (niah/alloc) for {t.name}: {e}") from e


def _check(o, name) -> None:
    if o.niah_grid_placement not in GRID_PLACEMENTS:
        raise ValueError(
            f"{name('niah_grid_placement')}: unknown placement {o.niah_grid_placement!r}; choose one of "
            + ", ".join(GRID_PLACEMENTS)
        )


def _preflight(options, targets, name) -> None:
    # the default grid is used where it fits: its N = 1 cell must
    cells = [tuple(c) for c in options.niah_grid] if options.niah_grid is not None else [(1, 1)]
    check_needle_cells(options, targets, cells, heatmap_needles=options.niah_needles, name=name)
    if options.niah_multivalue is not None:
        mv = tuple(options.niah_multivalue)
        if len(mv) != 2 or not all(isinstance(x, int) for x in mv) or not 2 <= mv[1] <= mv[0]:
            raise ValueError(f"{name('niah_multivalue')} wants [N, V] with 2 <= V <= N, got {options.niah_multivalue}")
        check_needle_cells(options, targets, [mv], values_per_key=mv[1], name=name)


def _alloc_needles(o) -> str:
    """How many needles allocation's prompts carry, in words (alloc.AllocOptions)."""
    asked = getattr(o, "alloc_needles", None)
    if asked is not None:
        return f"{asked} needles"
    most = getattr(o, "niah_needles", None)
    return f"up to {most} needles (the most that fit)" if most else "needles"


def needle_protocol(o) -> str:
    """The report's protocol sentence of the needle suites (niah and alloc share it: the same prompts)."""
    grid = ", ".join(f"({n}, {r})" for n, r in o.niah_grid or GRID) + ("" if o.niah_grid else " where they fit")
    multivalue = getattr(o, "niah_multivalue", None)  # alloc's options have no multi-value cell
    return (
        "Retrieval evaluation: needles "
        f'"The special magic {{city}} number is: {{{o.niah_digits}-digit number}}." '
        f"in a {o.haystack} haystack (test split) of {o.context_tokens or 'the training length of'} tokens; "
        f"(N needles, R queried) cells {grid}, {o.samples} samples each, "
        + (
            "the first queried needle at 0/25/50/75/100% in turn, "
            if getattr(o, "niah_grid_placement", "depths") == "depths"
            else "the first queried needle at a random depth, "
        )
        + "greedy decoding, RULER string_match_all; "
        + (
            ""
            if multivalue is None
            else f"a multi-value cell (one key's V = {multivalue[1]} values among N = {multivalue[0]} "
            f"needles, all V asked), {o.samples} samples; "
        )
        + f"allocation over {o.samples} prompts of {_alloc_needles(o)}, one queried, at depths 0–100%. Every "
        "model sees the same prompts (seeded), so comparisons are paired."
    )


# -- what claims read (diffattn.experiments.claims) ----------------------------------------------------------------
