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


def test_a_variant_of_the_fused_kernel_enters_the_entry_where_it_measured_correct_and_fastest():
    # issue 37: a variant the kernel plan timed faster than every route of a class, and correct, leads that class;
    # one that was wrong never enters, and a forced training tile is a row, not a route. A decoding route (key
    # splits, a decoding candidate) is a route: auto runs it by its name for the class it measured fastest on
    records = [
        {"route": "cudnn", "class": "c", "status": "ok", "correct": True, "ms": 1.5, "ratio": 1.5},
        {"route": "triton", "class": "c", "status": "ok", "correct": True, "ms": 2.5, "ratio": 2.5},
        {"route": "triton[tma+btma]", "class": "c", "status": "ok", "correct": True, "ms": 1.2, "ratio": 1.2},
        {"route": "triton[bws]", "class": "c", "status": "ok", "correct": True, "ms": 2.0, "ratio": 2.0},
        {"route": "triton[tma+bws]", "class": "c", "status": "ok", "correct": False, "ms": 1.0, "ratio": 1.0},
        {"route": "triton[dkdv 16x64 w8 s1]", "class": "c", "status": "ok", "correct": True, "ms": 0.9, "ratio": 0.9},
        {"route": "triton[splits 20]", "class": "d", "status": "ok", "correct": True, "ms": 0.1, "ratio": 0.9},
        {"route": "sdpa_maps", "class": "d", "status": "ok", "correct": True, "ms": 0.1, "ratio": 2.1},
        {"route": "triton[decode vec x64 w4 s2 splits 8]", "class": "d", "status": "ok", "correct": True, "ms": 0.1,
         "ratio": 0.8},
        {"route": "triton[decode vec x32 w4 s2]", "class": "d", "status": "ok", "correct": False, "ms": 0.1,
         "ratio": 0.7},
    ]  # fmt: skip
    entry = rs.table_entry(records, IDENTITY, "2026-11-29")
    assert entry["routes"] == {
        "c": ["triton[tma+btma]", "cudnn", "triton[bws]", "triton"],
        "d": ["triton[decode vec x64 w4 s2 splits 8]", "triton[splits 20]", "sdpa_maps"],
    }
    assert routes.check_table({"format": 1, "entries": [entry]})[0]["routes"] == entry["routes"]


def test_every_candidate_of_the_fused_kernel_is_a_route_of_its_own():
    from diffattn.ops.triton import tuning

    names = {r for r, _ in rs.candidate_routes()}
    for width, configs_by_kind in ((w, {k: v.get(w, []) for k, v in tuning._TUNING["none"].items()})
                                   for w in ("v1", "v2", "wide")):  # fmt: skip
        for kind, configs in configs_by_kind.items():
            for bm, bn, w, s in configs:
                assert f"triton[{kind} {bm}x{bn} w{w} s{s}]" in names, (width, kind)


def test_the_split_kernels_of_wide_heads_are_measured_as_routes_of_their_own(monkeypatch):
    # issue 37: the wide heads' dK/dV kernel split into a dV and a dK launch, and their forward by column blocks, are
    # timed in the sweep on their default tiles (triton[split], triton[cols]: variant routes, which a table lists
    # where they measured fastest) and on each candidate tile (rows only, read to choose tuning's defaults)
    from diffattn.ops.triton import tuning

    for name in ("SPLIT_DKDV", "FWD_COLUMNS", "AUTOTUNE", "ATOMIC_DQ", "_candidates"):
        monkeypatch.setattr(tuning, name, getattr(tuning, name))
    monkeypatch.setattr(tuning, "INTERPRETED", False)  # a GPU's tiles, whichever way the kernels were imported
    monkeypatch.setattr(tuning, "BLOCK_OVERRIDE", None)
    wide = rs.CallClass("v1", 128)
    assert ("triton[split]", wide) in rs.candidate_routes()
    assert [c for r, c in rs.candidate_routes() if r == "triton[cols]"] == [wide]
    assert [c for r, c in rs.candidate_routes() if r == "triton[split]"] == [rs.CallClass("v1", 64), wide]
    rs.force_candidate("triton[split]")  # a variant route: the op switches it on for its own calls (route_fn)
    assert not tuning.SPLIT_DKDV and not tuning.ATOMIC_DQ
    rs.force_candidate("triton[dk 16x128 w8 s3]")
    assert tuning.SPLIT_DKDV and tuning.AUTOTUNE
    assert tuning._candidates("dk", 128, 256, 4096) == [(16, 128, 8, 3)]
    assert tuning._candidates("dv", 128, 256, 4096) == [(32, 128, 8, 2)]  # the other launch: its default tile
    assert "triton[split]" not in rs.SWEEP_ORDER  # a candidate, not a table route
    rs.force_candidate("triton[cols]")
    assert not tuning.FWD_COLUMNS and tuning._fwd_columns(128, 256, variants=routes.variant_bits(("cols",))) == 128
    rs.force_candidate("triton[fwd_cols 128x16 w8 s2]")
    assert tuning.FWD_COLUMNS and tuning._candidates("fwd_cols", 128, 256, 4096) == [(128, 16, 8, 2)]


def test_the_kernel_plan_is_the_fused_kernel_and_every_candidate_on_the_train_classes(monkeypatch):
    from diffattn.ops.triton import tuning

    plan = rs.kernel_plan()
    assert plan[:3] == [("triton", rs.CallClass(p, d)) for p, d in (("v1", 64), ("shared_k", 64), ("v1", 128))]
    decoding = [rs.CallClass(p, 64, mode="decode") for p in ("v1", "shared_k")]
    wide_decoding = rs.CallClass("v1", 128, mode="decode")
    forwards = [("triton", rs.CallClass(p, 64, mode="infer")) for p in ("v1", "shared_k")]
    assert plan[3:6] == [("triton", c) for c in (*decoding, wide_decoding)]
    assert set(plan[6:]) == set(rs.candidate_routes()) | set(forwards)
    assert len(plan[6:]) == len(rs.candidate_routes()) + len(forwards)
    # the decoding forward on each candidate tile (tuning.DECODE_TILES) and by vector products on each candidate
    # (tuning.DECODE_VECTORS), then on more key splits than its heuristic takes, first (seconds a job); then the
    # default forward alone, and the forward by TMA tiles alone and trained, on DIFF V1's and V2's heads (issue 37's
    # forward target is read on the forward alone); every other candidate on a train class
    # (class by class, V1 at d = 64 first: issue 37's decode target)
    tiles = []
    for width, c in zip(("v1", "v2", "wide"), (*decoding, wide_decoding), strict=True):
        tile_names = [f"16x{bn} w{w} s{st}" for bn, w, st in tuning.DECODE_TILES[width]]
        vector_names = [f"vec x{bn} w{w} s{st}" for bn, w, st in tuning.DECODE_VECTORS[width]]
        tiles += [(f"triton[decode {t}]", c) for t in tile_names + vector_names]
        tiles += [(f"triton[decode {t} splits {n}]", c) for n in rs.DECODE_TILE_SPLITS for t in tile_names]
        tiles += [(f"triton[decode {t} splits {n}]", c) for n in rs.DECODE_VECTOR_SPLITS for t in vector_names]
    splits = [(f"triton[splits {n}]", c) for c in decoding for n in rs.DECODE_SPLITS]
    assert plan[6 : 6 + len(tiles) + len(splits)] == tiles + splits
    rest = plan[6 + len(tiles) + len(splits) :]
    assert rest[:2] == forwards
    tma = [("triton[tma]", rs.CallClass(p, 64, mode=m)) for p in ("v1", "shared_k") for m in ("infer", "train")]
    assert [job for job in rest if job[0] == "triton[tma]"] == tma
    assert all(c.mode == "train" for r, c in rest[2:] if r != "triton[tma]")
    # the backward by TMA tiles, alone and with the forward's, on the same heads' training classes
    backward = [(f"triton[{v}]", rs.CallClass(p, 64)) for p in ("v1", "shared_k")
                for v in ("btma", "tma+btma", "bws", "tma+bws")]  # fmt: skip
    assert [job for job in rest if "btma" in job[0] or "bws" in job[0]] == backward
    # each runs by its own name, as auto runs a variant route the table names (nothing switched on for every call)
    backends = []
    monkeypatch.setattr(rs, "op_call", lambda p, backend: backends.append(backend))
    for route in ("triton[bws]", "triton[tma+btma]"):
        rs.force_candidate(route)
    assert not any(getattr(tuning, flag) for flag, _ in routes.TRITON_VARIANTS.values())
    for route in ("triton[bws]", "triton[tma+btma]", "triton[dkdv 16x64 w8 s1]", "triton"):
        rs.route_fn(route, {})(None)
    assert backends == ["triton[bws]", "triton[tma+btma]", "triton", "triton"]  # a forced tile runs as triton


def test_the_decode_plan_is_the_kernel_plans_decoding_jobs():
    plan = rs.decode_plan()
    kernel = rs.kernel_plan()
    assert plan == kernel[3 : 3 + len(plan)] and {c.mode for _, c in plan} == {"decode"}
    assert set(rs.decode_tile_routes()) | set(rs.split_routes()) < set(plan)


def test_a_key_split_route_runs_its_splits_for_its_own_calls(monkeypatch):
    # triton[splits N] runs by its name (route_fn), as auto runs it where a table lists it: its calls carry N
    # (routes.decoding_bits), nothing is set for every call
    import torch

    from diffattn.ops.triton import tuning

    monkeypatch.setattr(tuning, "SPLIT_OVERRIDE", None)
    monkeypatch.setattr(tuning, "_sm_count", lambda index: 132)
    rs.force_candidate("triton[splits 20]")
    assert tuning.SPLIT_OVERRIDE is None
    gpu, bits = torch.device("cuda", 0), routes.fused_route_bits("triton[splits 20]")
    assert tuning._num_splits(gpu, 64, 8192, 32, bits) == 20
    assert tuning._num_splits(gpu, 64, 8192, 32) == 5  # another call: the heuristic's (2 x 132 SMs / 64 programs)
    # where the programs fill the GPU unsplit (a large batch's decoding), none, as the heuristic has it: the route's
    # count was measured on an under-filled GPU
    assert tuning._num_splits(gpu, 132, 8192, 32, bits) == tuning._num_splits(gpu, 132, 8192, 32) == 1
    monkeypatch.setattr(tuning, "SPLIT_OVERRIDE", 3)  # forced for every call (tests, the kernel report): that
    assert tuning._num_splits(gpu, 64, 8192, 32, bits) == 3
    backends = []
    monkeypatch.setattr(rs, "op_call", lambda p, backend: backends.append(backend))
    rs.route_fn("triton[splits 20]", {})(None)
    assert backends == ["triton[splits 20]"]


def test_a_decoding_tile_route_forces_its_tile_on_decoding_launches_only(monkeypatch):
    # issue 37's decode: triton[decode 16xBN wW sS] runs every decoding launch (a split forward of at most
    # DECODE_ROWS rows, 16-bit inputs) on that candidate tile, warps and stages, and nothing else
    from diffattn.ops.triton import tuning

    monkeypatch.setattr(tuning, "DECODE_TILE", None)
    monkeypatch.setattr(tuning, "INTERPRETED", False)  # a GPU's tiles, whichever way the kernels were imported
    monkeypatch.setattr(tuning, "BLOCK_OVERRIDE", None)
    v1, v2 = (64, 128), (64, 64)  # DIFF V1's and V2's heads (d, dv)
    default = tuning._blocks("fwd", *v1, 2, False, "none", split=True)
    assert default == (16, 32, 8) and tuning._launch_options("fwd", *v1, 2, False, True)["num_stages"] == 2
    # the route runs by its name: its calls carry the tile (routes.decoding_bits), nothing is set for every call
    rs.force_candidate("triton[decode 16x64 w4 s2]")  # (DIFF V1's heads' candidate)
    assert tuning.DECODE_TILE is None
    tile = routes.fused_route_bits("triton[decode 16x64 w4 s2]")
    assert tuning._blocks("fwd", *v1, 2, False, "none", split=True, variants=tile) == (16, 64, 4)
    assert tuning._launch_options("fwd", *v1, 2, False, True, tile) == {"num_stages": 2, "maxnreg": 255}
    assert tuning._blocks("fwd", *v1, 2, False, "none", split=True) == default  # another call: the default
    # not a training or prefill launch, not float32's, not more rows than one tile
    assert tuning._blocks("fwd", *v1, 2, False, "none", split=False, variants=tile) == (*default[:2], 8)
    assert tuning._blocks("fwd", *v1, 2, True, "none", split=True, variants=tile) == (16, 16, 8)
    assert tuning._blocks("fwd", *v1, 17, False, "none", split=True, variants=tile)[1:] == (32, 8)
    # and only on heads of its own width class: DIFF V2's 16 x 128 is not V1's (it spills there)
    wide_tile = routes.fused_route_bits("triton[decode 16x128 w4 s2]")
    assert tuning._blocks("fwd", *v2, 2, False, "none", split=True, variants=wide_tile) == (16, 128, 4)
    assert tuning._blocks("fwd", *v1, 2, False, "none", split=True, variants=wide_tile) == default
    # a tile forced for every call (tests, the kernel report) goes before the call's
    monkeypatch.setattr(tuning, "DECODE_TILE", (32, 4, 2))
    assert tuning._blocks("fwd", *v1, 2, False, "none", split=True, variants=tile) == (16, 32, 4)
    monkeypatch.setattr(tuning, "DECODE_TILE", None)
    # a tile's own stages reach the launch's options, and the autotuner-free launch's one candidate
    monkeypatch.setitem(tuning.DECODE_TILES, "v2", [*tuning.DECODE_TILES["v2"], (128, 4, 3)])
    monkeypatch.setattr(tuning, "DECODE_TILE", (128, 4, 3))
    assert tuning._launch_options("fwd", *v2, 2, False, True)["num_stages"] == 3
    assert tuning._candidates("fwd", *v2, 2, split=True) == [(16, 128, 4, 3)]
    assert tuning._launch_options("fwd", *v2, 17, False, True)["num_stages"] == 2
    with pytest.raises(ValueError, match="not a decoding candidate"):
        rs.force_candidate("triton[decode 16x256 w4 s2]")
    # and on the key splits asked for
    monkeypatch.setattr(tuning, "SPLIT_OVERRIDE", None)
    rs.force_candidate("triton[decode 16x64 w4 s2 splits 4]")
    assert tuning.SPLIT_OVERRIDE is None
    assert routes.decoding_of(routes.fused_route_bits("triton[decode 16x64 w4 s2 splits 4]")) == ((64, 4, 2), False, 4)
    with pytest.raises(ValueError, match="splits N"):
        rs.force_candidate("triton[decode 16x64 w4 s2 4]")
    # every candidate is a route of the kernel plan, on its head widths' decoding class, on the heuristic's splits
    # and on each of DECODE_TILE_SPLITS (the vector candidates' routes: the test below)
    names = {r for r, _ in rs.decode_tile_routes() if "vec" not in r}
    tiles = {f"16x{bn} w{w} s{st}" for t in tuning.DECODE_TILES.values() for bn, w, st in t}
    assert names == {f"triton[decode {t}]" for t in tiles} | {
        f"triton[decode {t} splits {n}]" for t in tiles for n in rs.DECODE_TILE_SPLITS
    }


def test_a_decoding_vector_route_runs_one_row_decoding_launches_by_vector_products(monkeypatch):
    # issue 37's decode: triton[decode vec xBN wW sS] runs every decoding launch of one query row a KV head (split,
    # no segments) by _decode_vector_kernel on that candidate, of its own head-width class only; "… splits N" too
    from diffattn.ops.triton import tuning

    monkeypatch.setattr(tuning, "DECODE_VECTOR", None)
    monkeypatch.setattr(tuning, "DECODE_TILE", None)
    monkeypatch.setattr(tuning, "SPLIT_OVERRIDE", None)
    monkeypatch.setattr(tuning, "INTERPRETED", False)
    monkeypatch.setattr(tuning, "BLOCK_OVERRIDE", None)
    v1, v2 = (64, 128), (64, 64)
    # the route runs by its name: its calls carry the candidate (routes.decoding_bits), nothing is set for every call
    rs.force_candidate("triton[decode vec x64 w4 s2]")
    assert tuning.DECODE_VECTOR is None and tuning.DECODE_TILE is None and tuning.SPLIT_OVERRIDE is None
    vec = routes.fused_route_bits("triton[decode vec x64 w4 s2]")
    assert tuning._decode_vector(*v1, 1, True, False, vec) == (64, 4, 2)
    assert tuning._decode_vector(*v1, 1, True, False) is None  # another call: none
    assert tuning._decode_vector(*v1, 1, False, False, vec) is None  # not split: not a decoding launch
    assert tuning._decode_vector(*v1, 2, True, False, vec) is None  # rows packed into a tile (GQA, or T > 1)
    assert tuning._decode_vector(*v1, 1, True, True, vec) is None  # segment ids
    assert tuning._decode_tile("fwd", *v1, 1, False, True, vec) is None  # a vector candidate is no tile
    tile = routes.fused_route_bits("triton[decode 16x64 w4 s2]")
    assert tuning._decode_vector(*v1, 1, True, False, tile) is None  # nor a tile a vector candidate
    wide = routes.fused_route_bits("triton[decode vec x64 w8 s2]")  # V1's only: not DIFF V2's
    assert tuning._decode_vector(*v1, 1, True, False, wide) == (64, 8, 2)
    assert tuning._decode_vector(*v2, 1, True, False, wide) is None
    monkeypatch.setattr(tuning, "DECODE_VECTOR", (32, 4, 2))  # forced for every call: before the call's
    assert tuning._decode_vector(*v1, 1, True, False, vec) == (32, 4, 2)
    monkeypatch.setattr(tuning, "DECODE_VECTOR", None)
    rs.force_candidate("triton[decode vec x32 w4 s2 splits 16]")
    bits = routes.fused_route_bits("triton[decode vec x32 w4 s2 splits 16]")
    assert routes.decoding_of(bits) == ((32, 4, 2), True, 16) and tuning.SPLIT_OVERRIDE is None
    with pytest.raises(ValueError, match=r"not a decoding candidate of tuning\.DECODE_VECTORS"):
        rs.force_candidate("triton[decode vec x256 w4 s2]")
    with pytest.raises(ValueError, match="splits N"):
        rs.force_candidate("triton[decode vec x64 w4 s2 16]")
    # every candidate a route of the kernel plan on its head widths' decoding class, on the heuristic's splits and on
    # each of DECODE_VECTOR_SPLITS; within a class on the heuristic's right after the tiles' (ahead of the key-split
    # rows)
    decoding = rs.decode_tile_routes()
    for cls in rs.DECODE_CLASSES:
        vecs = {f"vec x{bn} w{w} s{st}" for bn, w, st in tuning.DECODE_VECTORS[tuning._width_class(cls.d, cls.dv)]}
        got = {r for r, c in decoding if c == cls and "vec" in r}
        assert got == {f"triton[decode {t}]" for t in vecs} | {
            f"triton[decode {t} splits {n}]" for t in vecs for n in rs.DECODE_VECTOR_SPLITS
        }
    # class by class, V1 at d = 64 (issue 37's decode target) first
    assert [c for _, c in decoding] == sorted((c for _, c in decoding), key=rs.DECODE_CLASSES.index)
    assert decoding[0][1] == rs.CallClass("v1", 64, mode="decode")
    for cls in rs.DECODE_CLASSES:
        names = [r for r, c in decoding if c == cls]
        unsplit = len(tuning.DECODE_TILES[tuning._width_class(cls.d, cls.dv)]) + len(
            tuning.DECODE_VECTORS[tuning._width_class(cls.d, cls.dv)]
        )
        assert not any("splits" in r for r in names[:unsplit]) and all("splits" in r for r in names[unsplit:])
    # malformed names are refused whole, not half-applied
    for bad in ("triton[decode ]", "triton[decode vec x64 s4 w2]", "triton[decode vec x64 w4 s2 splits 0]",
                "triton[decode vec x64 w4 s2 splits -3]", "triton[decode vec 64 w4 s2]",
                "triton[decode vec 16x64 w4 s2]"):  # fmt: skip
        with pytest.raises(ValueError, match="not triton"):
            rs.force_candidate(bad)
    assert len(set(decoding)) == len(decoding)  # no job twice
    assert set(rs.decode_plan()) >= set(decoding)


def test_a_second_lease_measures_what_the_entry_lacks_first_and_keeps_what_it_skips(tmp_path):
    a, b = rs.CallClass("v1", 64), rs.CallClass("v1", 64, mode="infer")
    ok = {"status": "ok", "correct": True, "ms": 1.0, "base_ms": 0.5, "ratio": 2.0, **rs.CURRENT}
    earlier = {**IDENTITY, "date": "2026-11-27", "routes": {a.key: ["cudnn"], b.key: ["cudnn"]}, "measurements": [
        {"route": "cudnn", "class": a.key, **ok}, {"route": "cudnn", "class": b.key, **ok},
        {"route": "triton", "class": a.key, "status": "skipped: budget spent"}]}  # fmt: skip
    table = tmp_path / "table.json"
    table.write_text(json.dumps({"format": 1, "entries": [earlier]}))
    assert routes.entry_for(IDENTITY, str(table))["date"] == "2026-11-27"  # what run() extends
    assert routes.entry_for({**IDENTITY, "torch": "other"}, str(table)) is None
    plan = [("cudnn", a), ("cudnn", b), ("triton", a), ("triton", b)]
    assert rs.unmeasured_first(plan, earlier) == [("triton", a), ("triton", b), ("cudnn", a), ("cudnn", b)]
    assert rs.unmeasured_first(plan, None) == plan
    # this lease measured triton on a and ran out before the rest: cudnn on a is kept from the earlier entry, with
    # its date; triton on b stays a skipped row (nothing earlier to keep)
    now = [{"route": "triton", "class": a.key, **ok, "ratio": 1.5},
           {"route": "triton", "class": b.key, "status": "skipped: budget spent"},
           {"route": "cudnn", "class": a.key, "status": "skipped: budget spent"}]  # fmt: skip
    merged = rs.with_earlier_measurements(now, earlier)
    by = {(r["route"], r["class"]): r for r in merged}
    assert by[("cudnn", a.key)]["ratio"] == 2.0 and by[("cudnn", a.key)]["measured"] == "2026-11-27"
    assert by[("cudnn", b.key)]["measured"] == "2026-11-27"  # not planned this time: kept too
    assert by[("triton", b.key)]["status"] == "skipped: budget spent" and "measured" not in by[("triton", a.key)]
    entry = rs.table_entry(merged, IDENTITY, "2026-11-28")
    assert entry["routes"] == {a.key: ["triton", "cudnn"], b.key: ["cudnn"]}
    assert {m["route"]: m.get("measured") for m in entry["measurements"] if m["class"] == a.key} == {
        "triton": None, "cudnn": "2026-11-27"}  # fmt: skip
    assert "ok (2026-11-27)" in rs.to_markdown(merged, entry, None)


def _shipped_h200_entry(without=lambda route, cls: False) -> dict:
    """The shipped H200 entry less the measurements ``without(route, class)`` names, every one as if timed on the
    sweep's present inputs (``inputs``: what the planning tests ask about is the rest): the state a lease meets,
    built from the shipped data whatever later leases have added to it."""
    entry = next(e for e in routes.check_table(json.loads(routes.ROUTE_TABLE.read_text())) if "H200" in e["device"])
    kept = [{**m, **rs.CURRENT} for m in entry["measurements"] if not without(m["route"], m["class"])]
    listed = {cls: [r for r in order if not without(r, cls)] for cls, order in entry["routes"].items()}
    return {**entry, "measurements": kept, "routes": {cls: order for cls, order in listed.items() if order}}


def test_the_next_lease_of_a_shipped_device_times_the_fused_epilogue_beside_its_routes_first():
    # an H200 entry with cudnn_maps, sdpa and sdpa_split measured on most classes and no fused-epilogue variant (the
    # shipped one before its second lease): a sweep extending it times the fused-epilogue variants of the routes that
    # won (V1 d = 64, DIFF V2, V1 d = 128) next to what their routes lack, before sdpa_maps and triton
    entry = _shipped_h200_entry(without=lambda route, cls: "+epilogue" in route or route in ("sdpa_maps", "triton"))
    plan = rs.unmeasured_first(rs.default_plan(), entry)  # (the classes new to it, in pairs, lead: their own test)
    order = list(dict.fromkeys(route for route, cls in plan if cls.pair != "v1_pairs"))
    epilogue = [order.index(r) for r in ("cudnn_maps+epilogue", "sdpa+epilogue", "sdpa_split+epilogue")]
    assert epilogue == sorted(epilogue) and max(epilogue) < order.index("sdpa_maps") < order.index("triton")
    v1, v2 = rs.routes_for(rs.CallClass("v1", 64)), rs.routes_for(rs.CallClass("shared_k", 64))
    assert "cudnn_maps+epilogue" in v1 and "sdpa_split+epilogue" in v1 and "sdpa+epilogue" not in v1
    assert v1.index("cudnn+epilogue") == v1.index("cudnn") + 1 and "cudnn+epilogue" in v2
    assert "sdpa+epilogue" in v2 and "sdpa_split" not in v2
    # cudnn_direct on both pairs' training classes without a mask (DIFF V2's: K and V read once, keys_shared), beside
    # the route whose kernels it runs
    for listed in (v1, v2):
        assert listed.index("cudnn_direct") == listed.index("cudnn+epilogue") + 1
    assert "cudnn_direct" in rs.routes_for(rs.CallClass("shared_k", 64, size="small"))
    assert "cudnn_direct" not in rs.routes_for(rs.CallClass("shared_k", 64, mode="infer"))
    assert "cudnn_direct" not in rs.routes_for(rs.CallClass("shared_k", 64, mask="padding"))
    # DIFF V1 in pairs: the routes that read V once, beside the stacked layout's fastest — for the forward alone the
    # stacked forward's first (cudnn_maps+epilogue) too, and never the other pairs' one node
    pairs_train, pairs_infer = (rs.routes_for(rs.CallClass("v1_pairs", 64, mode=m)) for m in ("train", "infer"))
    assert {"cudnn_shared_v", "cudnn_shared_v_split"} <= set(pairs_train) & set(pairs_infer)
    assert set(pairs_infer) - set(pairs_train) == {"cudnn_maps+epilogue"}
    assert "cudnn_direct" not in pairs_train + pairs_infer


def test_classes_new_to_the_entry_are_measured_on_every_route_in_a_round_before_the_rest():
    # an H200 entry without the `small` step's classes (and paper-830m's d = 96), as shipped before its second lease:
    # each table route times them in a first round of workers, before any worker times what a route lacks on a class
    # the entry has measured
    entry = _shipped_h200_entry(without=lambda route, cls: cls.endswith(" small") or " d96 " in cls)
    plan = rs.unmeasured_first(rs.default_plan(), entry)
    first = rs.new_classes(plan, entry)
    small = {c.key for c in rs.default_classes() if c.size == "small"}
    assert small <= first and not any(k in first for k in entry["routes"])
    again = frozenset(rs._measured_fully(entry))  # what the entry measured: timed again only after everything else
    batches = rs.worker_batches(plan, first, again)

    def round_of(route, cls):
        return 0 if cls.key in first else 2 if (route, cls.key) in again else 1

    rounds = [{round_of(route, c) for c in classes} for route, classes in batches]
    assert all(len(r) == 1 for r in rounds)  # never two rounds in one worker
    assert [min(r) for r in rounds] == sorted(min(r) for r in rounds) and {min(r) for r in rounds} == {0, 1, 2}
    first_round = [route for (route, _), r in zip(batches, rounds, strict=True) if r == {0}]
    assert set(rs.routes_for(rs.CallClass("v1", 64, size="small"))) <= set(first_round)
    # the second H200 lease's sweep ran cudnn_maps on 24 classes, 20 of them measured before, ahead of every other
    # route's missing jobs: a route's missing jobs and its remeasurements are workers of different rounds
    second = [route for (route, _), r in zip(batches, rounds, strict=True) if r == {1}]
    assert "triton" in second and "cudnn_maps" in [
        route for (route, _), r in zip(batches, rounds, strict=True) if r == {2}
    ]
    assert sorted((r, c.key) for r, cs in batches for c in cs) == sorted((r, c.key) for r, c in plan)  # every job once
    # no earlier entry: one round, one worker per route
    fresh = rs.unmeasured_first(rs.default_plan(), None)
    assert rs.new_classes(fresh, None) == frozenset()
    routes_in_order = [r for r, _ in rs.worker_batches(fresh)]
    assert len(routes_in_order) == len(set(routes_in_order))


@pytest.mark.heavy  # worker processes: > 10 s on 2 cores
def test_a_route_in_two_rounds_keeps_each_workers_rows_apart(tmp_path):
    # the first round's worker of a route wrote records the second round's worker of that route must not read as its
    # own: a crash in each round is one row there, and the classes after it go to a fresh worker
    old, new = [rs.CallClass("v1", 16, dtype="fp32", mode=m) for m in ("train", "infer", "decode")], rs.CallClass(
        "v1", 16, dtype="fp32", size="small")  # fmt: skip
    plan = [(r, c) for c in (new, *old) for r in ("sdpa", "dies_on_decode", "poisons_on_infer")]
    records = rs.sweep(plan, tmp_path, device="cpu", scale="tiny", budget_s=240, extra_module="tests.bench.fake_routes",
                       progress=lambda m: None, first=frozenset({new.key}))  # fmt: skip
    status = {(r["route"], r["class"]): r["status"] for r in records}
    assert len(records) == len(plan) and set(status) == {(r, c.key) for r, c in plan}
    assert status[("dies_on_decode", old[2].key)] == "crashed: killed by SIGABRT"
    assert status[("poisons_on_infer", old[1].key)].startswith("crashed: RuntimeError: CUDA error")
    ok = [(r, c.key) for r, c in plan if (r, c) not in (("dies_on_decode", old[2]), ("poisons_on_infer", old[1]))]
    assert all(status[job] == "ok" for job in ok)


def test_only_the_triton_jobs_the_budget_reaches_are_compiled_ahead():
    # the second H200 lease compiled 56 Triton pairs in 78 s of its 300-s sweep and ran 4: compile what comes first
    entry = _shipped_h200_entry(without=lambda route, cls: cls.endswith(" small") or " d96 " in cls)
    plan = rs.unmeasured_first(rs.default_plan(), entry)
    batches = rs.worker_batches(plan, rs.new_classes(plan, entry), frozenset(rs._measured_fully(entry)))
    jobs = [(route, c.key) for route, classes in batches for c in classes]
    # a budget that reaches ten Triton jobs past the first (the plan's new classes come first: how many depends on it)
    reach = next(i for i, job in enumerate(jobs) if job[0].startswith("triton")) + 10
    warm = [(route, c.key) for route, c in rs.warm_work(batches, reach)]
    assert warm and all(jobs.index(job) < reach and job[0].startswith("triton") for job in warm)
    assert warm == [job for job in jobs[:reach] if job[0].startswith("triton")]
    kernel = rs.worker_batches(rs.kernel_plan())  # the kernel plan: Triton jobs first, warmed as far as reached
    assert len(rs.warm_work(kernel, 10)) == 10 and len(rs.warm_work(kernel, 10**6)) == len(rs.kernel_plan())


@pytest.mark.heavy  # worker processes: > 10 s on 2 cores
def test_a_job_cut_by_the_sweeps_deadline_is_skipped_not_timed_out(tmp_path):
    # the second H200 lease's sweep recorded "timed out" for a job its own budget ended (cudnn_maps on shared_k d64
    # infer), which barred a route measured correct before from its class; a job over its own timeout still is one
    train, infer = (rs.CallClass("v1", 16, dtype="fp32", mode=m) for m in ("train", "infer"))
    plan = [("hangs_on_train", infer), ("hangs_on_train", train)]
    kw = dict(device="cpu", scale="tiny", extra_module="tests.bench.fake_routes", progress=lambda m: None)
    cut = rs.sweep(plan, tmp_path / "cut", budget_s=40, job_timeout_s=300, **kw)
    assert {r["class"]: r["status"] for r in cut} == {infer.key: "ok", train.key: "skipped: budget spent"}
    overran = rs.sweep(plan, tmp_path / "overran", budget_s=300, job_timeout_s=10, **kw)
    assert {r["class"]: r["status"] for r in overran} == {infer.key: "ok", train.key: "timed out"}


def test_a_class_knows_its_size():
    assert rs.CallClass("v1", 64, size="small").key == "v1 d64 dv128 bf16 causal none train small"
    for bad in ({"size": "large"}, {"size": "small", "mode": "decode"}):
        with pytest.raises(ValueError, match="size must be"):
            rs.CallClass("v1", 64, **bad)


def test_decode_rows_carry_their_cuda_graph_time_where_one_was_measured():
    # issue 37's "what is in 0.30 ms": a decode call's time replayed as a CUDA graph (GPU time alone) beside its eager
    # time; off CUDA there is none, and the cell is the eager time alone
    assert rs.graphed_ms(lambda: None, "cpu") is None
    row = {"ms": 0.3612, "graph_ms": 0.0451, "base_graph_ms": 0.0204}
    assert rs._ms_cell(row) == "0.361 (graph 0.045, base 0.020)"
    assert rs._ms_cell({"ms": 0.3612, "graph_ms": None}) == rs._ms_cell({"ms": 0.3612}) == "0.361"
    # every row beside the baseline it was timed with: rows compare by their ratios (a host-bound call's baseline
    # moves by tens of percent between rows)
    assert rs._ms_cell({**row, "base_ms": 0.0712}) == "0.361 (base 0.071) (graph 0.045, base 0.020)"
    assert rs._ms_cell({"ms": 1.1712, "base_ms": 0.2731}) == "1.171 (base 0.273)"


def test_a_decode_class_is_ordered_by_cuda_graph_time_where_measured():
    # eager decode times are host time (the same call 2.2x apart between two H200 leases): a route with a graph time
    # comes before routes timed eagerly only, and graph times order among themselves; other modes keep their ratios
    dec, train = rs.CallClass("v1", 64, mode="decode").key, rs.CallClass("v1", 64).key

    def rec(route, cls, ratio, graph=None):
        r = {"route": route, "class": cls, "status": "ok", "correct": True, "ms": ratio, "base_ms": 1.0, "ratio": ratio}
        return r | ({"graph_ms": graph, "base_graph_ms": 0.1} if graph else {})

    records = [rec("cudnn", dec, 4.9), rec("cudnn_maps", dec, 6.4, graph=0.16), rec("sdpa_maps", dec, 9.0, graph=0.14),
               rec("sdpa", train, 2.2, graph=0.01), rec("cudnn_maps", train, 1.9)]  # fmt: skip
    entry = rs.table_entry(records, IDENTITY, "2026-11-28")
    assert entry["routes"][dec] == ["sdpa_maps", "cudnn_maps", "cudnn"]
    assert entry["routes"][train] == ["sdpa", "cudnn_maps"]  # a graph time only where one was measured: any mode
    # and a decoding class's order by eager time beside it, for the calls run eagerly (routes.EAGER_ROUTES)
    assert entry[rs.EAGER_ROUTES] == {dec: ["cudnn", "cudnn_maps", "sdpa_maps"]}
    kept = {m["route"]: m for m in entry["measurements"] if m["class"] == dec}
    assert kept["cudnn_maps"]["graph_ms"] == 0.16 and "graph_ms" not in kept["cudnn"]  # kept for the next merge
    assert "(graph 1.40×)" in rs.readme_table([{**entry, "capability": "9.0"}])


def test_a_decoding_record_without_a_graph_time_is_timed_again_as_missing():
    # the shipped H200 entry's decode rows of the first lease have eager times only; the order needs graph times
    entry = _shipped_h200_entry()
    plan = rs.unmeasured_first(rs.default_plan(), entry)
    fully = rs._measured_fully(entry)
    eager_only = [
        k for k, m in rs._measured_ok(entry).items() if k[1].endswith(" decode") and rs.graph_ratio(m) is None
    ]
    assert eager_only and not any(k in fully for k in eager_only)
    position = {(r, c.key): i for i, (r, c) in enumerate(plan)}
    first_known = min(position[k] for k in fully if k in position)
    assert all(position[k] < first_known for k in eager_only if k in position)  # among the missing, before the rest


def test_a_decoding_record_whose_capture_failed_is_not_timed_again_for_it():
    # graph_ms None: the capture was tried and failed, and would fail again; only records from before graph times
    # existed (no key at all) are missing one
    dec = rs.CallClass("v1", 64, mode="decode").key
    ok = {"status": "ok", "correct": True, "ratio": 5.0, "ms": 0.4, "base_ms": 0.08, **rs.CURRENT}
    entry = {"date": "2026-11-27", "measurements": [
        {"route": "cudnn", "class": dec, **ok},
        {"route": "sdpa", "class": dec, **ok, "graph_ms": None, "base_graph_ms": 0.07},
        {"route": "cudnn_maps", "class": dec, **ok, "graph_ms": 0.12, "base_graph_ms": 0.07}]}  # fmt: skip
    assert set(rs._measured_fully(entry)) == {("sdpa", dec), ("cudnn_maps", dec)}


def test_records_timed_on_other_inputs_than_a_models_are_timed_again_as_missing():
    # the leases before 2026-11-28 timed every route on separate contiguous tensors, not on the views a model hands
    # over: a sweep times those records again as missing (before what the entry has on the models' inputs); until
    # then a class's order ranks them by their best case among the new ones (a route timed again first must not
    # displace a faster one not yet timed again)
    cls, dec = rs.CallClass("v1", 64), rs.CallClass("v1", 64, mode="decode")
    ok = {"status": "ok", "correct": True, "ms": 1.0, "base_ms": 0.5}
    old = [{"route": "cudnn_maps", "class": cls.key, **ok, "ratio": 1.9},
           {"route": "cudnn", "class": dec.key, **ok, "ratio": 3.0, "graph_ms": 0.1, "base_graph_ms": 0.1}]  # fmt: skip
    new = [{"route": "sdpa", "class": cls.key, **ok, "ratio": 2.2, **rs.CURRENT},
           {"route": "sdpa_maps", "class": dec.key, **ok, "ratio": 9.0, "graph_ms": 0.2, "base_graph_ms": 0.1,
            **rs.CURRENT}]  # fmt: skip
    entry = rs.table_entry(old + new, IDENTITY, "2026-11-28")
    assert entry["routes"] == {cls.key: ["cudnn_maps", "sdpa"], dec.key: ["cudnn", "sdpa_maps"]}
    assert {m["route"]: m.get("inputs") for m in entry["measurements"]}["sdpa"] == rs.INPUTS  # kept in the table
    assert set(rs._measured_fully(entry)) == {("sdpa", cls.key), ("sdpa_maps", dec.key)}
    plan = [("sdpa", cls), ("cudnn_maps", cls), ("sdpa_maps", dec), ("cudnn", dec)]
    assert rs.unmeasured_first(plan, entry) == [("cudnn_maps", cls), ("cudnn", dec), ("sdpa", cls), ("sdpa_maps", dec)]


def test_after_the_inputs_changed_a_lease_times_the_target_classes_table_routes_first():
    # the shipped H200 entry, timed before the sweep's inputs were the models' (no `inputs`): every job is missing
    # again, and the first round is the table routes on the classes issues 34's and 37's targets are read on — DIFF
    # V2's, d = 128's and the fused kernel among them, which route by route over every class a five-minute sweep
    # would not reach
    from diffattn.bench.targets import TARGETS

    entry = _shipped_h200_entry()
    # as it was then: no `inputs` in any record, and no class of DIFF V1 in interleaved pairs (new since)
    entry = {**entry, "measurements": [{k: v for k, v in m.items() if k != "inputs"} for m in entry["measurements"]
                                       if not m["class"].startswith("v1_pairs")]}  # fmt: skip
    plan = rs.unmeasured_first(rs.default_plan(), entry)
    first = rs.first_round(plan, entry)
    targets = {t.where for t in TARGETS if t.kind in ("route", "kernel", "kernel_decode")}
    # V1 (stacked, and in pairs) and DIFF V2 training at d = 64 and 128, V1's forward and its decoding at d = 64
    assert len(targets) == 8
    batches = rs.worker_batches(plan, first, frozenset(rs._measured_fully(entry)))
    jobs = [(route, cls.key) for route, classes in batches for cls in classes]
    # and the classes new to the entry, every route of them: DIFF V1 in interleaved pairs (cudnn_shared_v's) and the
    # decoding calls with a static cache's mask
    new = {c.key for c in rs.default_classes() if c.pair == "v1_pairs" or (c.mask, c.mode) == ("padding", "decode")}
    assert len(new) == 8 and rs.new_classes(plan, entry) == new
    assert {rs.CallClass.from_key(c).mode for c in new} == {"train", "infer", "decode"}
    first_jobs = {(route, cls) for route, cls in jobs if (route, cls) in first or cls in first}
    opening = jobs[: len(first_jobs)]
    assert {cls for _, cls in opening} == targets | new and set(opening) == first_jobs
    assert {route for route, cls in opening if cls.startswith("shared_k")} >= {"sdpa", "sdpa+epilogue", "cudnn_maps"}
    assert ("triton", "v1 d64 dv128 bf16 causal none decode") in opening
    assert all(route in rs.routes_for(rs.CallClass.from_key(cls)) for route, cls in opening)  # table routes only
    # measured on the models' inputs, only what the entry still lacks there is first
    now = {**entry, "measurements": [{**m, **rs.CURRENT} for m in entry["measurements"]]}
    first_now = rs.first_round(rs.unmeasured_first(rs.default_plan(), now), now)
    assert len(first_now) < len(first) and not first_now & set(rs._measured_fully(now))


def test_a_record_timed_one_call_a_sample_is_timed_again():
    # the records of 2026-11-28 were timed on the models' inputs, one call a sample: not current, so a sweep times
    # them again as missing (first, on the target classes) and the targets prefer current records
    cls = rs.CallClass("v1", 64)
    ok = {"status": "ok", "correct": True, "ms": 1.0, "base_ms": 0.5, "ratio": 2.0}
    entry = {"measurements": [{"route": "cudnn", "class": cls.key, **ok, "inputs": rs.INPUTS},
                              {"route": "sdpa", "class": cls.key, **ok, **rs.CURRENT}]}  # fmt: skip
    assert set(rs._measured_fully(entry)) == {("sdpa", cls.key)}
    assert ("cudnn", cls.key) in rs.first_round([("cudnn", cls), ("sdpa", cls)], entry)


def test_a_class_timed_again_in_part_ranks_an_older_record_by_its_best_case():
    # a current record reads lower than an older one of the same route (one call a sample held the host's lead-in, up
    # to EARLIER_EXCESS): a route timed again early passes an older one only where it is faster even by the older
    # one's best case; an older route that was slow stays behind the current ones (the H200 entry of 2026-11-29 before
    # this rule: sdpa_maps and triton, left untimed at 2.79x and 2.89x, ranked ahead of cudnn_direct's 1.66x)
    cls = rs.CallClass("v1", 64)
    ok = {"status": "ok", "correct": True, "ms": 1.0, "base_ms": 0.5}
    close = 1.6 + rs.EARLIER_EXCESS - 0.05  # may be faster than 1.6 when timed again: stays ahead
    partly = [{"route": "cudnn_maps", "class": cls.key, **ok, "ratio": close, "inputs": rs.INPUTS},
              {"route": "sdpa", "class": cls.key, **ok, "ratio": 1.6, **rs.CURRENT}]  # fmt: skip
    assert rs.table_entry(partly, IDENTITY, "2026-11-29")["routes"][cls.key] == ["cudnn_maps", "sdpa"]
    slow = [partly[0] | {"ratio": 1.6 + rs.EARLIER_EXCESS + 0.05}, partly[1]]  # slower even at its best: behind
    assert rs.table_entry(slow, IDENTITY, "2026-11-29")["routes"][cls.key] == ["sdpa", "cudnn_maps"]
    fully = [partly[0] | {"ratio": 1.7, **rs.CURRENT}, partly[1]]  # timed again in full: by ratio alone
    assert rs.table_entry(fully, IDENTITY, "2026-11-29")["routes"][cls.key] == ["sdpa", "cudnn_maps"]


def test_each_timed_sample_is_several_calls_back_to_back(monkeypatch):
    # one call between two synchronisations times the host's lead-in too, which a model's layers overlap (the H200
    # run of 2026-11-28: 0.32-0.96 ms a call for the DIFF routes): every sample holds min_calls calls or more
    # between synchronisations, however long one call takes
    calls, syncs = [], []
    monkeypatch.setattr(rs, "_sync", lambda device: syncs.append(len(calls)))
    clock = iter(range(0, 10**9, 5))  # each perf_counter reading 5 s on: a "call" looks far longer than a sample
    monkeypatch.setattr(rs.time, "perf_counter", lambda: next(clock))
    rs.interleaved_ms({"slow": lambda: calls.append(1)}, "cuda", rounds=3, min_calls=4)
    timed = [b - a for a, b in zip(syncs[-6::2], syncs[-5::2], strict=True)]  # the three samples' synchronised spans
    assert timed == [4, 4, 4], timed


def test_a_scalar_lambdas_gradient_is_held_to_the_scale_of_its_rounding_not_to_one_draw():
    # DIFF V1's λ is one number, and the yardstick's error on it one draw that spans two orders of magnitude between
    # inputs: transformers' own two calls failed a 4x-the-draw rule on 2 of 12 inputs on a CPU, the fused kernel on
    # an H200 (2026-11-28). Held to the draw's scale (u·‖dO ⊙ O2‖), an independent route passes input after input,
    # and a dλ that is wrong by a term of its own size still fails
    import torch

    cls = rs.CallClass("v1", 64, mode="train")
    for seed in range(6):
        record = rs.check("hf_two_calls", rs.route_fn("hf_two_calls", {}), cls, "cpu", torch.bfloat16, seed=seed)
        assert record["correct"], (seed, record)

    def dlam_off_by_sum_of_dO_times_O(p):  # the official route, and λ's gradient also given Σ dO·O (value unchanged)
        out = rs.official_four_calls(p)
        lam = p.diff["lam"]
        return out + (lam - lam.detach()) * out.detach()

    record = rs.check("wrong", dlam_off_by_sum_of_dO_times_O, cls, "cpu", torch.bfloat16, seed=0)
    # (by 10.5x the floor on seed 0, where the floor is 7.9e-6 of ‖dO‖·‖O‖: the bound is 4x)
    assert not record["correct"] and record["errors"]["dlam"] > 2 * rs.TOLERANCE * record["yardsticks"]["dlam"]


def test_the_checks_gradient_is_not_its_inputs_values():
    # drawn from the inputs' own seed, the cotangent repeated Q's random numbers (V1: value for value, in matching
    # strides), and a route reading Q where dO belongs would have passed
    import torch

    cls = rs.CallClass("v1", 64, mode="train")
    p = rs.make_problem(
        cls, batch=2, heads=4, t=rs.CHECK_LEN, s=rs.CHECK_LEN, device="cpu", dtype=torch.float32, seed=3
    )
    cot = rs.model_cotangent((2, 4, rs.CHECK_LEN, cls.dv), "cpu", torch.float32,
                             torch.Generator().manual_seed(3 + rs.COTANGENT_SEED_OFFSET))  # fmt: skip
    first = cot.transpose(1, 2).reshape(-1)[:1000]
    assert not any(torch.equal(first, x.detach().reshape(-1)[:1000]) for x in p.leaves if x.is_floating_point())


def test_a_second_sweep_in_the_same_folder_extends_the_first_and_loses_nothing(tmp_path, monkeypatch):
    # a lease's second call (e.g. SWEEP_PLAN=kernel STEPS=sweep after the whole first call) sweeps into the same
    # folder: it extends that call's entry, not the shipped one — its measurements kept where not timed again, what
    # the step decided in it kept — and the first call's routes.md and routes.jsonl are set aside, not overwritten
    a, b = rs.CallClass("v1", 16, dtype="fp32"), rs.CallClass("v1", 16, dtype="fp32", mode="infer")
    ok = {"status": "ok", "correct": True, "base_ms": 0.5, **rs.CURRENT}
    shipped = tmp_path / "shipped.json"
    shipped.write_text(json.dumps({"format": 1, "entries": []}))
    monkeypatch.setattr(routes, "ROUTE_TABLE", shipped)
    calls = iter([
        [{"route": "sdpa", "class": a.key, **ok, "ms": 1.0, "ratio": 2.0},
         {"route": "sdpa", "class": b.key, **ok, "ms": 1.0, "ratio": 2.0}],
        [{"route": "chunked", "class": a.key, **ok, "ms": 0.9, "ratio": 1.8}],
    ])  # fmt: skip

    monkeypatch.setattr(rs, "sweep", lambda plan, out, **kw: next(calls))
    out = tmp_path / "run"
    out.mkdir()
    rs.run(out, 60, plan=[("sdpa", a), ("sdpa", b)], device="cpu", identity=IDENTITY, progress=lambda m: None)
    first = routes.check_table(json.loads((out / "route_table.json").read_text()))
    first[0]["fused_v_copies"] = True  # what diffattn.bench.switches decided after the first call's step
    first[0]["step_first"] = {b.key: "sdpa"}
    (out / "route_table.json").write_text(json.dumps({"format": 1, "entries": first}))
    rs.run(out, 60, plan=[("chunked", a)], device="cpu", identity=IDENTITY, progress=lambda m: None)
    entry = routes.check_table(json.loads((out / "route_table.json").read_text()))[-1]
    assert entry["routes"] == {a.key: ["chunked", "sdpa"], b.key: ["sdpa"]}, "the first call's sdpa rows kept"
    assert entry["fused_v_copies"] is True and entry["step_first"] == {b.key: "sdpa"}
    assert (out / "routes-1.md").exists() and "chunked" not in (out / "routes-1.md").read_text()
    assert "chunked" in (out / "routes.md").read_text()


def test_setting_aside_takes_the_first_free_number_and_a_sweep_sets_its_raw_rows_aside(tmp_path):
    assert rs.set_aside(tmp_path / "routes.jsonl") is None
    (tmp_path / "routes.jsonl").write_text("1")
    assert rs.set_aside(tmp_path / "routes.jsonl") == tmp_path / "routes-1.jsonl"
    (tmp_path / "routes.jsonl").write_text("2")  # an earlier sweep's raw rows
    assert rs.sweep([], tmp_path, device="cpu", budget_s=1, progress=lambda m: None) == []
    assert (tmp_path / "routes-1.jsonl").read_text() == "1" and (tmp_path / "routes-2.jsonl").read_text() == "2"


def test_the_v_copies_plan_times_v1s_one_call_routes_again_and_a_record_names_the_switches_on():
    # after the kernels step turned fused_v_copies on in a run's table, the lease times the routes that build [V; V]
    # again on V1's training classes, and each record says which switches were on while it was timed
    from diffattn import ops

    plan = rs.v_copies_plan()  # (that these routes take the switch: tests/ops/test_vcopies.py)
    assert {cls.key for _, cls in plan} == {
        "v1 d64 dv128 bf16 causal none train",
        "v1 d128 dv256 bf16 causal none train",
    }
    assert {route for route, _ in plan} == set(rs.V_TWICE_ROUTES)
    assert all(route.removesuffix("+epilogue") in ("cudnn", "sdpa", "sdpa_split") for route in rs.V_TWICE_ROUTES)
    assert rs.switches_on("cpu") == {}
    with ops.fused_v_copies(True):
        assert rs.switches_on("cpu") == {"switches": ["fused_v_copies"]}
    record = {"status": "ok", "correct": True, "measured": "2026-11-28", "switches": ["fused_v_copies"]}
    assert rs._status_cell(record) == "ok (2026-11-28, fused_v_copies)"
    assert rs._status_cell({"status": "ok", "correct": True}) == "ok"
