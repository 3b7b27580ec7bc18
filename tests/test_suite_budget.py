"""The default test command stays fast (issue 36 §14): every test that took SLOW_S or more when the suite was last
timed (tests/durations.json, written by tests/record_durations.py on an idle 2-core machine) is marked ``heavy``,
the default selection's recorded time stays within BUDGET_S, and every test it selects is in the record. Times are in
the first recording machine's seconds (the record's ``speed`` converts: record_durations.py); the check reads the
record, never the clock of the machine running it, so it passes or fails alike everywhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

BUDGET_S = 300.0  # 5 minutes on 2 cores (issue 36 §14)
SLOW_S = 10.0  # a test that takes this long goes to `make test-slow`, with a fast representative left behind
RECORD = Path(__file__).with_name("durations.json")


def _default_selection() -> str:
    """The marker expression of pyproject.toml's addopts: what `make test` runs."""
    import shlex
    import tomllib

    addopts = tomllib.loads(RECORD.parents[1].joinpath("pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    words = shlex.split(addopts["addopts"])
    return words[words.index("-m") + 1]


def _record() -> dict:
    if not RECORD.is_file():
        pytest.fail(f"{RECORD} is missing: run `make durations` on an idle machine and commit it")
    return json.loads(RECORD.read_text())


def _reference_seconds(record: dict) -> dict[str, float]:
    """Each recorded test's time in the first recording machine's seconds."""
    return {n: t / record.get("speed", 1.0) for n, t in record["durations_s"].items()}


def test_no_test_recorded_as_heavy_is_in_the_default_run(request):
    durations = _reference_seconds(_record())
    selected = {item.nodeid for item in request.session.items}
    heavy = sorted((round(durations[n]), n) for n in selected & set(durations) if durations[n] >= SLOW_S)
    assert not heavy, f"mark these @pytest.mark.heavy (seconds when recorded, node id): {heavy}"


def test_the_default_run_fits_the_budget_as_recorded(request):
    if request.config.getoption("markexpr") != _default_selection() or request.config.getoption("keyword"):
        pytest.skip("a selection other than the default test command's")
    record = _record()
    durations = _reference_seconds(record)
    selected = {item.nodeid for item in request.session.items}
    # a test added since the record is not free: the record must time it before the budget can be read
    unrecorded = sorted(selected - set(durations))
    assert not unrecorded, (
        f"{len(unrecorded)} tests of the default run are not in {RECORD.name} (run `make durations` on an idle "
        f"machine and commit it): {unrecorded[:5]}"
    )
    total = sum(durations[n] for n in selected)
    assert total <= BUDGET_S, (
        f"the default run took {total:.0f} s in the first record's seconds "
        f"({total * record.get('speed', 1.0):.0f} s "
        f"on {record['machine']}, {record['recorded']}): > {BUDGET_S}"
    )
