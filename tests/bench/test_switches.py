"""diffattn.bench.switches: what a run's `small` step decides in the route table, from its per-repetition times
compared pair by pair — a kernel switch on only where its column was faster at some length and slower at none (GPU
busy time within the slack), off where slower, undecided where inconclusive or a column is missing; the small class's
first route where a forced route was faster than the class's first as it runs under the decided switches — and both
written into the run's own table entry, where a later sweep of the same device and software keeps them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from diffattn.bench import paired_ratio, switches
from diffattn.bench.route_sweep import merge_entry
from diffattn.bench.train_step import forced_column
from diffattn.ops import routes

NORM, EPI = forced_column("cudnn+epilogue+norm"), forced_column("cudnn+epilogue")
CUDNN, AUTO_NORM, LAM = forced_column("cudnn"), forced_column("auto+norm"), forced_column("auto+norm+lambda")
SMALL_CLASS, STANDARD_CLASS = "v1 d64 dv128 bf16 causal none train small", "v1 d64 dv128 bf16 causal none train"
V2_SMALL_CLASS = "shared_k d64 dv64 bf16 causal none train small"


def _times(scale: float, reps: int = 30, seed: int = 0) -> list[float]:
    """Step times of one column: a common per-repetition disturbance (the same in every column: seed 0), times
    ``scale``, with a little noise of the column's own (``seed``)."""
    common = 50 + 6 * np.random.default_rng(0).standard_normal(reps)
    own = 0.3 * np.random.default_rng(seed).standard_normal(reps)
    return list(scale * common + own)


def _row(seq_len=1024, gpu=None, **scales):
    columns = {NORM: "norm", EPI: "epi", CUDNN: "cudnn", AUTO_NORM: "auto_norm", LAM: "lam"}
    base = {"norm": 0.95, "epi": 1.0, "cudnn": 1.0, "auto_norm": 1.0, "lam": 0.97} | scales
    samples = {col: _times(base[key], seed=i + 1) for i, (col, key) in enumerate(columns.items()) if base[key]}
    return {"preset": "small", "seq_len": seq_len, "batch": 4, "dtype": "bf16", "samples_ms": samples,
            "ms": {k: float(np.median(v)) for k, v in samples.items()}, "gpu_ms": gpu or {}}  # fmt: skip


def test_paired_ratio_cancels_what_moves_both_columns_of_a_repetition():
    a, b = _times(0.97, seed=1), _times(1.0, seed=2)
    median, low, high = paired_ratio(a, b)
    assert low < median < high < 1, "a 3% gain under a ±12% common disturbance is resolved by pairing"
    assert abs(median - 0.97) < 0.01
    shuffled = list(np.random.default_rng(5).permutation(a))  # the pairing broken: the same values say nothing
    assert paired_ratio(shuffled, b)[2] > 1
    assert paired_ratio([1.0], [2.0]) == (0.5, -np.inf, np.inf)
    with pytest.raises(ValueError, match="equally long"):
        paired_ratio([1.0, 2.0], [1.0])


def test_a_switch_is_on_where_faster_at_some_length_and_slower_at_none():
    decided = switches.decide([_row(1024), _row(4096, norm=1.0, epi=1.0)])  # faster at 1024, the same at 4096
    assert decided["fused_head_norm"].on is True
    assert "small at 1024 tokens: diffattn DIFF (cudnn+epilogue+norm) 0.95" in decided["fused_head_norm"].why
    assert decided["fused_lambda"].on is True
    slower = switches.decide([_row(1024), _row(4096, norm=1.02)])["fused_head_norm"]
    assert slower.on is False and slower.why.startswith(
        "small at 4096 tokens: diffattn DIFF (cudnn+epilogue+norm) 1.02"
    )
    same = switches.decide([_row(1024, norm=1.0, lam=1.0)])
    assert same["fused_head_norm"].on is None and same["fused_head_norm"].why.startswith("inconclusive")
    assert same["fused_lambda"].on is None, "the same time is not faster: what runs by default is what measured faster"


def test_more_gpu_time_than_the_slack_is_slower_and_a_missing_column_or_run_without_samples_is_undecided():
    gpu = {NORM: 10.3, EPI: 10.0, AUTO_NORM: 10.0, LAM: 9.0}
    decided = switches.decide([_row(gpu=gpu)])
    assert decided["fused_head_norm"].on is False and "1.030x by GPU busy time" in decided["fused_head_norm"].why
    assert decided["fused_lambda"].on is True
    gpu[NORM] = 10.1  # within GPU_SLACK
    assert switches.decide([_row(gpu=gpu)])["fused_head_norm"].on is True
    missing = switches.decide([_row(lam=0)])["fused_lambda"]  # a forced column that could not run
    assert missing.on is None and "no times for both diffattn DIFF (auto+norm+lambda)" in missing.why
    old = {**_row(), "samples_ms": {}}  # a train.json from before the per-repetition times
    assert switches.decide([old])["fused_head_norm"] == switches.Decision(
        None, "small at 1024 tokens: no per-repetition times"
    )
    assert switches.decide([])["fused_head_norm"].on is None


def test_the_steps_call_class_is_the_one_the_diff_layer_hands_the_op(monkeypatch):
    # step_call_class builds the DIFF layer's inputs from the preset's config: the class of the real layer's calls
    import torch

    import diffattn.ops as ops
    from diffattn.models.build import build_model

    small = {"preset": "small", "seq_len": 1024, "batch": 4, "dtype": "bf16"}
    assert switches.step_call_class(small) == SMALL_CLASS
    assert switches.step_call_class(small, "diff-v2") == V2_SMALL_CLASS
    seen = []
    run = ops._run
    monkeypatch.setattr(
        ops, "_run", lambda backend, inp, norm=None: seen.append(routes.call_class(inp)) or run(backend, inp, norm)
    )
    for arch in ("diff", "diff-v2"):
        model = build_model("tiny", arch, seed=0)
        for seq_len, small_work in ((8, 2**32), (16, 1)):  # a small call, then the same model's call above SMALL_WORK
            monkeypatch.setattr(routes, "SMALL_WORK", small_work)
            seen.clear()
            ids = torch.zeros(2, seq_len, dtype=torch.long)
            model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
            row = {"preset": "tiny", "seq_len": seq_len, "batch": 2, "dtype": "fp32"}
            assert set(seen) == {switches.step_call_class(row, arch)}, (seen, row, arch)


def _entry(date, device="NVIDIA H200", **over):
    return {"device": device, "capability": "9.0", "torch": "2.11", "triton": "3.6.0", "cudnn": "91900", "date": date,
            "routes": {STANDARD_CLASS: ["cudnn+epilogue", "cudnn", "sdpa"], SMALL_CLASS: ["cudnn", "sdpa"]},
            **over}  # fmt: skip


def test_the_small_class_runs_first_the_route_the_step_measured_faster_under_the_decided_switches():
    rows = [
        _row(1024),
        _row(4096, cudnn=0.9),
    ]  # 4096 tokens is the standard class: the sweep's to order, not the step's
    firsts = switches.first_routes(rows, _entry("d"), norm_on=True)
    assert list(firsts) == [SMALL_CLASS, V2_SMALL_CLASS]  # cudnn+epilogue: checked at the standard size, faster with
    assert firsts[V2_SMALL_CLASS].on is None and "lists no routes" in firsts[V2_SMALL_CLASS].why  # the norm fused
    assert firsts[SMALL_CLASS].on and firsts[SMALL_CLASS].route == "cudnn+epilogue"
    assert "diffattn DIFF (cudnn+epilogue+norm) 0.95" in firsts[SMALL_CLASS].why
    # with the norm left to PyTorch, cudnn+epilogue runs as its plain column: no faster than cudnn
    assert switches.first_routes(rows, _entry("d"), norm_on=False)[SMALL_CLASS].on is None
    # a route the sweep never checked for the class is not taken, however fast
    unchecked = _entry("d", routes={SMALL_CLASS: ["cudnn", "sdpa"]})
    assert switches.first_routes(rows, unchecked, norm_on=True)[SMALL_CLASS].on is None
    # the class's first as auto runs it now (an earlier step's choice) is what a route must beat
    earlier = _entry("d", step_first={SMALL_CLASS: "cudnn+epilogue"})
    assert "faster than cudnn+epilogue" in switches.first_routes(rows, earlier, norm_on=True)[SMALL_CLASS].why
    no_first = switches.first_routes([_row(cudnn=0)], _entry("d"), norm_on=True)[SMALL_CLASS]
    assert no_first.on is None and "no column that runs cudnn" in no_first.why


def test_diff_v2s_small_class_runs_first_the_route_forced_faster_in_its_own_model():
    # DIFF V2's columns (--backends v2:ROUTE) decide DIFF V2's small class, with no switch; DIFF V1's forced columns of
    # the same route are not DIFF V2's evidence
    v2_auto, v2_direct = forced_column("v2:sdpa_maps"), forced_column("v2:cudnn_direct")
    row = _row(1024)
    for column, scale, seed in ((v2_auto, 1.0, 11), (v2_direct, 0.9, 12), (forced_column("sdpa"), 0.5, 13)):
        row["samples_ms"][column] = _times(scale, seed=seed)
    entry = _entry("d", routes={V2_SMALL_CLASS: ["sdpa_maps", "cudnn_direct", "sdpa"], SMALL_CLASS: ["cudnn"]})
    decided = switches.first_routes([row], entry, norm_on=True)[V2_SMALL_CLASS]
    assert decided.on and decided.route == "cudnn_direct" and "diffattn DIFF V2 (cudnn_direct) 0.9" in decided.why
    del row["samples_ms"][v2_direct]  # V1's sdpa column, twice as fast, is not V2's
    assert switches._forced_route(forced_column("sdpa"), "diff-v2") is None
    assert switches._forced_route(v2_direct, "diff") is None and switches._forced_route(v2_direct, "diff-v2") == (
        "cudnn_direct")  # fmt: skip
    assert switches.first_routes([row], entry, norm_on=True)[V2_SMALL_CLASS].on is None


def test_the_decisions_are_written_into_the_runs_own_entry_and_a_later_sweep_keeps_them(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "train.json").write_text(json.dumps({"rows": [_row(1024)]}))
    table = {"format": 1, "entries": [_entry("2026-11-26", "NVIDIA H100"), _entry("2026-11-29")]}
    (run / "route_table.json").write_text(json.dumps(table))
    assert switches.main([str(run), "--write"]) == 0
    out = capsys.readouterr().out
    assert "fused_head_norm: on" in out and f"{SMALL_CLASS}: moved: cudnn+epilogue first" in out
    entries = routes.check_table(json.loads((run / "route_table.json").read_text()))
    assert entries[1]["fused_head_norm"] is True and entries[1]["fused_lambda"] is True
    assert entries[1]["step_first"] == {SMALL_CLASS: "cudnn+epilogue"}
    assert entries[1]["routes"] == _entry("x")["routes"], "the sweep's order stays as it measured it"
    assert "fused_head_norm" not in entries[0] and "step_first" not in entries[0], "another run's entry is left alone"
    later = {**_entry("2026-11-30"), "routes": {SMALL_CLASS: ["sdpa"]}}  # a later sweep of the same device and software
    merged = merge_entry(run / "route_table.json", later, run / "route_table.json")["entries"][-1]
    assert merged["date"] == "2026-11-30" and merged["fused_head_norm"] is True
    assert merged["step_first"] == {SMALL_CLASS: "cudnn+epilogue"}


def test_a_table_whose_newest_date_is_two_entries_is_not_guessed_at(tmp_path):
    path = tmp_path / "route_table.json"
    path.write_text(json.dumps({"format": 1, "entries": [_entry("2026-11-29", "A"), _entry("2026-11-29", "B")]}))
    decided = {"fused_head_norm": switches.Decision(True, "")}
    with pytest.raises(ValueError, match="2 entries of the newest date 2026-11-29"):
        switches.write_decisions(path, decided, {})


def _kernels(switched_ms=4.0, switched_gpu=3.7, plain_ms=4.1, plain_gpu=4.0, wide=True):
    """kernels.json's results: V1 at d = 64 with the numbers given for cudnn+epilogue with and without [V; V] by its
    kernels, and (``wide``) V1 at d = 128 with both of its pairs 8% faster by GPU time."""

    def pair(route, switched, plain):
        return {
            route: {"ms": plain[0], "gpu_ms": plain[1]},
            f"{route}+vcopies": {"ms": switched[0], "gpu_ms": switched[1]},
        }

    d64 = pair("cudnn+epilogue", (switched_ms, switched_gpu), (plain_ms, plain_gpu))
    d128 = pair("sdpa_split+epilogue", (9.5, 9.2), (10.0, 10.0)) | pair("cudnn+epilogue", (11.0, 10.6), (11.5, 11.5))
    results = [{"class": "shared_k d64 dv64 bf16 causal none train", "columns": {}},
               {"class": STANDARD_CLASS, "columns": d64}]  # fmt: skip
    return results + ([{"class": "v1 d128 dv256 bf16 causal none train", "columns": d128}] if wide else [])


def test_the_v_copies_switch_is_decided_on_one_call_by_its_gpu_time():
    # [V; V] by its kernels saves the GPU's work at the sweep's shape (kernels.json), not the host's in the step: on
    # where faster in some pair (GPU busy time beyond the slack) and slower in none, by GPU or wall time
    on = switches.decide_calls(_kernels())["fused_v_copies"]
    assert on.on is True and "0.925x cudnn+epilogue by GPU busy time" in on.why and "sdpa_split+epilogue" in on.why
    assert switches.decide_calls(_kernels(switched_gpu=3.95))["fused_v_copies"].on is True, "faster at d = 128"
    assert switches.decide_calls(_kernels(switched_gpu=4.1))["fused_v_copies"].on is False
    assert switches.decide_calls(_kernels(switched_ms=4.3))["fused_v_copies"].on is False, "slower by wall time"
    missing = switches.decide_calls(_kernels(wide=False))["fused_v_copies"]
    assert missing.on is None and "no profiled times" in missing.why and "d128" in missing.why
    unprofiled = _kernels()
    del unprofiled[1]["columns"]["cudnn+epilogue"]["gpu_ms"]
    assert (
        "no profiled times for both cudnn+epilogue+vcopies" in switches.decide_calls(unprofiled)["fused_v_copies"].why
    )
    same = _kernels(switched_gpu=3.95)
    for column in same[2]["columns"].values():
        column["gpu_ms"] = 10.0
    assert switches.decide_calls(same)["fused_v_copies"].why.startswith("inconclusive")


def test_the_command_reads_the_kernels_step_where_the_run_has_it(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "train.json").write_text(json.dumps({"rows": [_row(1024)]}))
    (run / "route_table.json").write_text(json.dumps({"format": 1, "entries": [_entry("2026-11-29")]}))
    assert switches.main([str(run)]) == 0
    assert "fused_v_copies: undecided — no kernels.json" in capsys.readouterr().out
    (run / "kernels.json").write_text(json.dumps(_kernels()))
    assert switches.main([str(run), "--write"]) == 0
    assert "fused_v_copies: on — " in capsys.readouterr().out
    assert routes.check_table(json.loads((run / "route_table.json").read_text()))[0]["fused_v_copies"] is True
