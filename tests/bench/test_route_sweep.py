"""The route sweep (diffattn.bench.route_sweep) on this CPU at tiny shapes: each route in worker processes of its own,
a worker that dies (as after an illegal memory access) or reports a poisoned context costs one row and the rest goes
on, a wrong route is marked and never enters the table, the table entry lists correct routes fastest first and merges
into an existing table. Speed here means nothing; the GPU run is benchmarks/gpu_session.sh."""

from __future__ import annotations

import json

import pytest

from diffattn.bench import route_sweep as rs
from diffattn.ops import routes

IDENTITY = {"device": "cpu", "capability": "0.0", "torch": "x", "triton": "y", "cudnn": "z"}


@pytest.mark.heavy  # > 10 s on 2 cores (tests/durations.json): CI runs it after the default suite
def test_a_crashing_route_is_one_row_and_the_sweep_goes_on(tmp_path):
    classes = [rs.CallClass("v1", 16, dtype="fp32", mode=m) for m in ("train", "infer", "decode")]
    plan = [(r, c) for c in classes for r in ("sdpa", "dies_on_decode", "poisons_on_infer", "wrong")]
    result = rs.run(tmp_path, 240, plan=plan, device="cpu", scale="tiny", extra_module="tests.bench.fake_routes",
                    identity=IDENTITY, progress=lambda m: None)  # fmt: skip
    status = {(r["route"], r["class"].split()[-1]): r["status"] for r in result["records"]}
    assert status[("dies_on_decode", "decode")] == "crashed: killed by SIGABRT"
    assert status[("dies_on_decode", "train")] == status[("dies_on_decode", "infer")] == "ok"  # before the crash
    assert status[("poisons_on_infer", "infer")].startswith("crashed: RuntimeError: CUDA error: an illegal memory")
    assert status[("poisons_on_infer", "decode")] == "ok"  # a fresh worker took the rest
    wrong = [r for r in result["records"] if r["route"] == "wrong"]
    assert all(r["status"] == "ok" and not r["correct"] for r in wrong)  # 1% off: far beyond the yardstick
    assert all(r["correct"] for r in result["records"] if r["route"] == "sdpa")
    entry = result["entry"]
    assert entry["routes"] == {c.key: ["sdpa"] for c in classes}  # test-only and wrong routes never enter it
    table = json.loads((tmp_path / "route_table.json").read_text())
    assert routes.check_table(table)[-1]["routes"] == entry["routes"]
    md = (tmp_path / "routes.md").read_text()
    assert "crashed: killed by SIGABRT" in md and "WRONG" in md


def test_the_entry_orders_routes_by_ratio_and_replaces_its_own_device(tmp_path):
    records = [
        {"route": "sdpa", "class": "c", "status": "ok", "correct": True, "ms": 2.0, "ratio": 2.0},
        {"route": "cudnn", "class": "c", "status": "ok", "correct": True, "ms": 1.5, "ratio": 1.5},
        {"route": "triton", "class": "c", "status": "ok", "correct": False, "ms": 1.0, "ratio": 1.0},
        {"route": "sdpa_split", "class": "c", "status": "crashed: x"},
    ]
    entry = rs.table_entry(records, IDENTITY, "2026-11-26")
    assert entry["routes"] == {"c": ["cudnn", "sdpa"]}
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"format": 1, "entries": [
        {**IDENTITY, "date": "2026-01-01", "routes": {"c": ["sdpa"]}},
        {**IDENTITY, "device": "other", "date": "2026-01-01", "routes": {"c": ["sdpa"]}}]}))  # fmt: skip
    table = rs.merge_entry(old, entry, tmp_path / "new.json")
    assert [e["device"] for e in table["entries"]] == ["other", "cpu"] and table["entries"][1]["date"] == "2026-11-26"


def test_every_candidate_of_the_fused_kernel_is_a_route_of_its_own():
    from diffattn.ops.triton import tuning

    names = {r for r, _ in rs.candidate_routes()}
    for width, _pair in (("v1", "v1"), ("v2", "shared_k")):
        for kind in ("fwd", "dkdv_atomic"):
            for bm, bn, w, s in tuning._TUNING["none"][kind][width]:
                assert f"triton[{kind} {bm}x{bn} w{w} s{s}]" in names
