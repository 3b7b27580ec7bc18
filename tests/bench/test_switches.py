"""diffattn.bench.switches: the route table's kernel switches decided from a run's `small` step — on only where every
switched column was no slower than its plain twin (wall time, and GPU busy time within the slack) at every length,
off where one was slower, undecided where a column is missing — and written into the run's own table entry."""

from __future__ import annotations

import json

import pytest

from diffattn.bench import switches
from diffattn.bench.route_sweep import merge_entry
from diffattn.bench.train_step import forced_column
from diffattn.ops import routes

NORM, EPI = forced_column("cudnn+epilogue+norm"), forced_column("cudnn+epilogue")
AUTO_NORM, AUTO, LAM = forced_column("auto+norm"), forced_column("auto"), forced_column("auto+norm+lambda")


def _row(seq_len, ms, gpu=None):
    return {"preset": "small", "seq_len": seq_len, "ms": ms, "gpu_ms": gpu or {}}


def _ms(norm=50.0, epi=52.0, auto_norm=51.0, auto=53.0, lam=51.5):
    return {NORM: norm, EPI: epi, AUTO_NORM: auto_norm, AUTO: auto, LAM: lam}


def test_a_switch_is_on_only_where_every_pair_at_every_length_was_no_slower():
    rows = [_row(1024, _ms()), _row(4096, _ms(norm=60.0, epi=60.0))]  # equal counts as no slower
    decided = switches.decide(rows)
    assert decided["fused_head_norm"].on is True
    assert "small at 4096 tokens" in decided["fused_head_norm"].why
    assert decided["fused_lambda"].on is False and "1.010x" in decided["fused_lambda"].why  # 51.5 against 51.0
    slower = switches.decide([_row(1024, _ms()), _row(4096, _ms(auto_norm=54.0))])["fused_head_norm"]
    assert slower.on is False and slower.why.startswith("small at 4096 tokens: diffattn DIFF (auto+norm) 1.019x")


def test_more_gpu_time_than_the_slack_is_slower_and_a_missing_column_is_undecided():
    gpu = {NORM: 10.3, EPI: 10.0, AUTO_NORM: 10.0, AUTO: 10.0, LAM: 9.0}
    decided = switches.decide([_row(1024, _ms(), gpu)])
    assert decided["fused_head_norm"].on is False and "1.030x by GPU busy time" in decided["fused_head_norm"].why
    assert decided["fused_lambda"].on is False  # faster on the GPU, slower by wall time
    gpu[NORM] = 10.1  # within GPU_SLACK
    assert switches.decide([_row(1024, _ms(), gpu)])["fused_head_norm"].on is True
    missing = _ms()
    missing[LAM] = float("nan")  # a forced column that could not run
    decided = switches.decide([_row(1024, missing)])
    assert (
        decided["fused_lambda"].on is None
        and "no time for diffattn DIFF (auto+norm+lambda)" in decided["fused_lambda"].why
    )
    assert switches.decide([])["fused_head_norm"].on is None


def _entry(date, device="NVIDIA H200"):
    return {"device": device, "capability": "9.0", "torch": "2.11", "triton": "3.6.0", "cudnn": "91900", "date": date,
            "routes": {"v1 d64 dv128 bf16 causal none train": ["cudnn+epilogue", "sdpa"]}}  # fmt: skip


def test_the_decisions_are_written_into_the_runs_own_entry(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "train.json").write_text(json.dumps({"rows": [_row(1024, _ms())]}))
    table = {"format": 1, "entries": [_entry("2026-11-26", "NVIDIA H100"), _entry("2026-11-29")]}
    (run / "route_table.json").write_text(json.dumps(table))
    assert switches.main([str(run), "--write"]) == 0
    assert "fused_head_norm: on" in capsys.readouterr().out
    entries = routes.check_table(json.loads((run / "route_table.json").read_text()))
    assert entries[1]["fused_head_norm"] is True and entries[1]["fused_lambda"] is False
    assert "fused_head_norm" not in entries[0], "another run's entry is left as it was"
    # a later sweep of the same device and software keeps what the step decided
    later = {**_entry("2026-11-30"), "routes": {"c": ["sdpa"]}}
    merged = merge_entry(run / "route_table.json", later, run / "route_table.json")
    assert merged["entries"][-1]["fused_head_norm"] is True and merged["entries"][-1]["date"] == "2026-11-30"


def test_a_table_whose_newest_date_is_two_entries_is_not_guessed_at(tmp_path):
    path = tmp_path / "route_table.json"
    path.write_text(json.dumps({"format": 1, "entries": [_entry("2026-11-29", "A"), _entry("2026-11-29", "B")]}))
    decided = {"fused_head_norm": switches.Decision(True, "")}
    with pytest.raises(ValueError, match="2 entries of the newest date 2026-11-29"):
        switches.write_switches(path, decided)
