"""tests.helpers.pairwise: a grid's default-run tests cover every pair of values of any two factors, the whole grid
is there (the rest marked heavy), with the ids stacked parametrize decorators give, the same every time."""

from __future__ import annotations

import itertools

import pytest
import torch

from .helpers import pairwise

FACTORS = dict(
    layout=["stacked", "interleaved", "apart"],
    memory={"contiguous": "c", "bthd": "b"},
    lam_form=["scalar", "per_head", "per_token"],
    dtype=[torch.float32, torch.bfloat16],
)


def _default(params):
    return [p for p in params if not p.marks]


def test_every_pair_of_values_meets_in_the_default_run_and_the_rest_is_heavy():
    params = pairwise(**FACTORS)
    levels = [list(v.values()) if isinstance(v, dict) else v for v in FACTORS.values()]
    assert sorted(map(str, (p.values for p in params))) == sorted(map(str, itertools.product(*levels)))
    default = _default(params)
    for a, b in itertools.combinations(range(len(levels)), 2):
        met = {(p.values[a], p.values[b]) for p in default}
        assert met == set(itertools.product(levels[a], levels[b])), (a, b)
    assert all(p.marks == (pytest.mark.heavy,) for p in params if p.marks)
    assert 9 <= len(default) < len(params) // 2  # 3 x 3 pairs at least; far fewer than the 36 combinations


def test_ids_are_those_of_stacked_decorators_and_the_choice_is_the_same_every_time():
    params = pairwise(**FACTORS)
    assert params[0].id == "stacked-contiguous-scalar-dtype0" and params[-1].id == "apart-bthd-per_token-dtype1"
    assert [p.id for p in _default(params)] == [p.id for p in _default(pairwise(**FACTORS))]
    assert [p.id for p in pairwise(flag=[False, True], n=[None, 3])] == ["False-None", "False-3", "True-None", "True-3"]
    # as pytest names other values (its _idval_from_value): a float, an enum member, a function, a non-ASCII string
    import enum

    class Colour(enum.Enum):
        RED = 1

    def scale():
        pass

    ids = [p.id for p in pairwise(x=[0.5], c=[Colour.RED], f=[scale], s=["λ"])]
    assert ids == ["0.5-Colour.RED-scale-\\u03bb"]


def test_one_factor_or_a_full_pair_grid_stays_whole_in_the_default_run():
    assert not any(p.marks for p in pairwise(layout=["stacked", "interleaved"]))
    assert not any(p.marks for p in pairwise(a=[1, 2], b=[3, 4, 5]))  # two factors: every pair is every combination
