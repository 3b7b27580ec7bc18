"""The route table (diffattn.ops.routes) and auto's choice from it (diffattn.ops.auto_routes / _run_auto): the chosen
route, a missing device, a missing class, a stale software version, a corrupt table, and a route that fails at run
time handing over to the next with one log line. The table's CUDA logic runs here on CPU tensors, the device's
identity faked; the routes named are ones that run on CPU."""

from __future__ import annotations

import json
import logging

import pytest
import torch

import diffattn.ops as ops
from diffattn.ops import _inputs as _inputs_module
from diffattn.ops import routes
from diffattn.ops._inputs import validate

from .rounding import assert_within_rounding

IDENTITY = {"device": "Stub GPU", "capability": "9.0", "torch": "2.11.0+cu130", "triton": "3.6.0", "cudnn": "91900"}


def _inputs(shared=False, grad=True, t=8, mask=None, segments=None):
    g = torch.Generator().manual_seed(0)

    def r(*s):
        return torch.randn(*s, generator=g).requires_grad_(grad)

    q1, q2, k1 = r(1, 2, t, 16), r(1, 2, t, 16), r(1, 2, 8, 16)
    k2 = k1 if shared else r(1, 2, 8, 16)
    v = r(1, 2, 8, 16 if shared else 32)
    return validate(q1, k1, q2, k2, v, 0.5, causal=True, attn_mask=mask, scale=None, segment_ids=segments)


def _same_values(inp, dtype):
    """``inp``'s values in ``dtype`` as new leaves, validated again: a shared K stays one tensor, V's parts stay its
    parts, each taking a gradient."""
    q1, k1, q2 = (x.detach().to(dtype) for x in (inp.q1, inp.k1, inp.q2))
    k2 = k1 if inp.shares_keys else inp.k2.detach().to(dtype)
    parts = tuple(part.detach().to(dtype).requires_grad_() for part in inp.v_parts)
    return validate(q1, k1, q2, k2, parts if len(parts) > 1 else parts[0], inp.lam.detach().to(dtype),
                    causal=inp.causal, attn_mask=inp.attn_mask, scale=inp.scale)  # fmt: skip


def _table(tmp_path, entries, name="table.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"format": 1, "entries": entries}))
    return path


def _entry(**over):
    routes_ = {"v1 d16 dv32 fp32 causal none train": ["sdpa_split", "chunked"]}
    return {**IDENTITY, "date": "2026-11-26", "routes": routes_,
            **over}  # fmt: skip


@pytest.fixture
def fake_device(monkeypatch):
    """This process's device identity faked; the table cache reset around the test."""
    monkeypatch.setattr(routes, "device_identity", lambda index=None: dict(IDENTITY))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    routes.reset()
    ops._FAILED_ROUTES.clear()
    yield
    routes.reset()
    ops._FAILED_ROUTES.clear()


def test_call_class_reads_pair_widths_dtype_mask_mode_and_size():
    # these inputs are small calls (far less work than SMALL_WORK); decoding has no size
    assert routes.call_class(_inputs()) == "v1 d16 dv32 fp32 causal none train small"
    assert routes.call_class(_inputs(shared=True, grad=False)) == "shared_k d16 dv16 fp32 causal none infer small"
    assert routes.call_class(_inputs(grad=False, t=1)) == "v1 d16 dv32 fp32 causal none decode"
    with torch.no_grad():  # grad mode off: no gradient will flow, whatever requires_grad says
        assert routes.call_class(_inputs()).endswith(" infer small")
    padding = torch.ones(1, 8, dtype=torch.bool)
    assert routes.call_class(_inputs(mask=padding)).split()[5] == "padding"
    assert routes.call_class(_inputs(mask=torch.ones(1, 1, 8, 8, dtype=torch.bool))).split()[5] == "mask4d"
    assert routes.call_class(_inputs(segments=torch.zeros(1, 8, dtype=torch.int32))).split()[5] == "segments"


def _meta_inputs(cls, shape):
    """Inputs of the sweep's ``shape`` for ``cls`` as meta tensors (shapes without memory), as make_problem lays them
    out: V1 ``heads`` DIFF heads (in pairs: Q and K handed over whole as such), DIFF V2 twice as many query heads over
    one K."""
    train = cls.mode == "train"

    def m(*s):
        return torch.empty(*s, device="meta", dtype=torch.bfloat16).requires_grad_(train)

    b, t, s = shape["batch"], shape["t"], shape["s"]
    v1 = cls.pair in ("v1", "v1_pairs")
    h = shape["heads"] * (1 if v1 else 2)
    q1, q2, k1 = m(b, h, t, cls.d), m(b, h, t, cls.d), m(b, h, s, cls.d)
    k2 = m(b, h, s, cls.d) if v1 else k1
    pairs = (m(b, 2 * h, t, cls.d), m(b, 2 * h, s, cls.d)) if cls.pair == "v1_pairs" else None
    segments = torch.zeros(b, s, dtype=torch.int32, device="meta") if cls.mask == "segments" else None
    mask = torch.ones(b, s, dtype=torch.bool, device="meta") if cls.mask == "padding" else None
    return validate(q1, k1, q2, k2, m(b, h, s, cls.dv), 0.5, causal=cls.causal, attn_mask=mask, scale=None,
                    segment_ids=segments, qk_pairs=pairs)  # fmt: skip


def test_the_sweeps_class_key_is_the_one_auto_reads():
    from diffattn.bench.route_sweep import CallClass, default_classes, shape_of

    assert CallClass("v1", 16, dtype="fp32", size="small").key == routes.call_class(_inputs())
    small_infer = CallClass("shared_k", 16, dtype="fp32", mode="infer", size="small")
    assert small_infer.key == routes.call_class(_inputs(True, False))
    # every class the sweep times, at the shape it times it: the key auto computes for such a call is the class's
    # own — the standard shape is not small, the `small` step's shape is, on both sides of SMALL_WORK
    classes = default_classes()
    assert {c.size for c in classes} == {"", "small"}
    for cls in classes:
        assert routes.call_class(_meta_inputs(cls, shape_of(cls))) == cls.key, cls


def test_a_decoding_call_with_a_static_caches_mask_reads_its_class_else_the_unmasked_one(fake_device, tmp_path,
                                                                                          monkeypatch):  # fmt: skip
    # transformers' static cache: one query row, the cache's empty slots masked ([B, 1, 1, S], causality in the mask,
    # causal=False): one value per key — the padding class, causal or not (one row sees every key either way)
    g = torch.Generator().manual_seed(0)
    q1, q2, k1, k2 = (torch.randn(1, 2, n, 16, generator=g) for n in (1, 1, 8, 8))
    v = torch.randn(1, 2, 8, 32, generator=g)
    keep = torch.ones(1, 1, 1, 8, dtype=torch.bool)
    keep[..., 6:] = False  # two empty slots
    with torch.no_grad():
        inp = validate(q1, k1, q2, k2, v, 0.5, causal=False, attn_mask=keep, scale=None)
        assert routes.call_class(inp) == "v1 d16 dv32 fp32 causal padding decode"
        unmasked = validate(q1, k1, q2, k2, v, 0.5, causal=True, attn_mask=None, scale=None)
        assert routes.call_class(unmasked) == "v1 d16 dv32 fp32 causal none decode"
        # the table measured decoding without the mask only: the call reads that class (before: nothing, sdpa)
        decode = {"v1 d16 dv32 fp32 causal none decode": ["sdpa_maps", "chunked"]}
        monkeypatch.setenv(routes.ROUTE_TABLE_ENV, str(_table(tmp_path, [_entry(routes=decode)])))
        assert ops.table_order(inp) == ["sdpa_maps", "chunked", "sdpa"]
        line = ops.route_choice_line(0, routes.call_class(inp), ops.table_order(inp))
        assert "read from the table's 'v1 d16 dv32 fp32 causal none decode'" in line
        # and its own class where the table has it
        own = {**decode, "v1 d16 dv32 fp32 causal padding decode": ["chunked", "sdpa_maps"]}
        monkeypatch.setenv(routes.ROUTE_TABLE_ENV, str(_table(tmp_path, [_entry(routes=own)], "own.json")))
        routes.reset()
        assert ops.table_order(inp) == ["chunked", "sdpa_maps", "sdpa"]
        # a mask of one value per key and row (a 4-D mask of T > 1) is not read as that
        q_rows = [torch.randn(1, 2, 3, 16, generator=g) for _ in range(2)]
        rows = validate(q_rows[0], k1, q_rows[1], k2, v, 0.5, causal=True,
                        attn_mask=torch.ones(1, 1, 3, 8, dtype=torch.bool), scale=None)  # fmt: skip
        assert routes.call_class(rows) == "v1 d16 dv32 fp32 causal mask4d infer small"
        assert routes.near_classes(routes.call_class(rows)) == ("v1 d16 dv32 fp32 causal mask4d infer",)


def test_a_decoding_call_run_eagerly_reads_its_classs_order_by_eager_time(fake_device, tmp_path, monkeypatch):
    # by graph time sdpa_maps first, by eager time (host time included) chunked: a decoding call run eagerly takes
    # the eager order, one traced or captured the graph order; other modes have no eager order
    dec = "v1 d16 dv32 fp32 causal none decode"
    entry = _entry(routes={dec: ["sdpa_maps", "chunked"], "v1 d16 dv32 fp32 causal none infer": ["sdpa_maps"]},
                   eager_routes={dec: ["chunked", "sdpa_maps"]})  # fmt: skip
    monkeypatch.setenv(routes.ROUTE_TABLE_ENV, str(_table(tmp_path, [entry])))
    with torch.no_grad():
        inp = _inputs(grad=False, t=1)
        assert routes.call_class(inp) == dec
        assert routes.decoding_eagerly(dec) and ops.table_order(inp) == ["chunked", "sdpa_maps", "sdpa"]
        line = ops.route_choice_line(0, dec, ops.table_order(inp), routes.decoding_eagerly(dec))
        assert line == f"{dec} runs chunked (route order by eager time: chunked, sdpa_maps, sdpa)"
        capturing = _inputs_module.stream_capturing
        monkeypatch.setattr(_inputs_module, "stream_capturing", lambda: True)  # captured into a CUDA graph
        assert ops.table_order(inp) == ["sdpa_maps", "chunked", "sdpa"]
        monkeypatch.setattr(_inputs_module, "stream_capturing", capturing)
        assert ops.table_order(_inputs(grad=False, t=2)) == ["sdpa_maps", "sdpa"]  # prefill: no eager order
    # a table whose eager order names a class it has no routes for, or is not a list of names, is refused
    for bad in ({"v1 d16 dv32 fp32 causal none train decode": ["sdpa"]}, {dec: "chunked"}, {dec: []}):
        with pytest.raises(ValueError, match="eager_routes"):
            routes.check_table({"format": 1, "entries": [{**entry, routes.EAGER_ROUTES: bad}]})


def test_a_small_call_reads_its_small_class_else_the_class_at_the_standard_size(fake_device, tmp_path, monkeypatch):
    # the `small` step is host-bound: the route measured fastest on its own calls, where the table has it
    entry = _entry(routes={"v1 d16 dv32 fp32 causal none train": ["sdpa_split", "chunked"],
                           "v1 d16 dv32 fp32 causal none train small": ["chunked", "sdpa_split"]})  # fmt: skip
    monkeypatch.setenv(routes.ROUTE_TABLE_ENV, str(_table(tmp_path, [entry])))
    assert ops.table_order(_inputs()) == ["chunked", "sdpa_split", "sdpa"]
    # a call of more than SMALL_WORK reads the standard class (its key without the size); one of exactly it is small
    work = 1 * 2 * 8 * 8 * 16  # B·H·T·S·d of _inputs()
    monkeypatch.setattr(routes, "SMALL_WORK", work)
    assert routes.call_class(_inputs()).endswith(" train small")
    monkeypatch.setattr(routes, "SMALL_WORK", work - 1)
    assert routes.call_class(_inputs()) == "v1 d16 dv32 fp32 causal none train"
    assert ops.table_order(_inputs()) == ["sdpa_split", "chunked", "sdpa"]


def test_the_route_the_small_step_put_first_runs_first_for_that_class_only(fake_device, tmp_path, monkeypatch):
    # diffattn.bench.switches records in the entry which route the `small` step measured fastest for its small calls
    # (the sweep's call leaves out the head norm the DIFF layer hands the op): auto reads it at the class's front, for
    # that class alone, and only a route the sweep checked for it or for it at the standard size
    small, standard = "v1 d16 dv32 fp32 causal none train small", "v1 d16 dv32 fp32 causal none train"
    for listed, first, want in (
        ({small: ["chunked", "sdpa_split"]}, "sdpa_split", ["sdpa_split", "chunked", "sdpa"]),
        ({standard: ["sdpa_split", "chunked"]}, "chunked", ["chunked", "sdpa_split", "sdpa"]),  # read off the standard
        ({small: ["chunked"], standard: ["sdpa_split", "chunked"]}, "sdpa_split", ["sdpa_split", "chunked", "sdpa"]),
        ({small: ["chunked", "sdpa_split"]}, "reference", ["chunked", "sdpa_split", "sdpa"]),  # never checked: no
    ):
        entry = _entry(routes=listed, step_first={small: first})
        monkeypatch.setenv(routes.ROUTE_TABLE_ENV, str(_table(tmp_path, [entry], name=f"{first}{len(listed)}.json")))
        routes.reset()
        assert ops.table_order(_inputs()) == want, (listed, first)
    monkeypatch.setattr(routes, "SMALL_WORK", 0)  # the same call at the standard size: the step's choice is not its
    routes.reset()
    entry = _entry(routes={standard: ["sdpa_split", "chunked"]}, step_first={small: "chunked"})
    monkeypatch.setenv(routes.ROUTE_TABLE_ENV, str(_table(tmp_path, [entry], name="standard.json")))
    assert ops.table_order(_inputs()) == ["sdpa_split", "chunked", "sdpa"]
    for bad in ({small: 3}, {small: "fastest"}, ["chunked"]):
        with pytest.raises(ValueError, match=r"'step_first' must map|unknown routes"):
            routes.check_table({"format": 1, "entries": [_entry(step_first=bad)]})


def test_the_train_steps_the_gpu_script_times_are_on_their_intended_side_of_the_size():
    # the `small` preset's step at 1,024 tokens is the small calls the sweep measures; at 4,096 tokens, the paper-830m
    # step at 2,048 (DIFF Table 7's size) and the sweep's standard shapes are GPU-bound calls, read at the standard size
    from diffattn.bench.route_sweep import CallClass
    from diffattn.models.presets import PRESETS

    def step_call(preset, batch, n, pair):
        p = PRESETS[preset]
        d = p.hidden_size // p.num_heads
        heads = p.hidden_size // (2 * d)  # DIFF heads: d_model / 2d, as the sweep lays them out (shape_of)
        cls = CallClass(pair, d)
        return routes.call_class(_meta_inputs(cls, {"batch": batch, "heads": heads, "t": n, "s": n}))

    for pair in ("v1", "shared_k"):
        assert step_call("small", 4, 1024, pair).endswith(" train small")
        assert step_call("small", 4, 4096, pair).endswith(" train")
        assert step_call("paper-830m", 2, 2048, pair).endswith(" train")


def test_a_failed_route_is_kept_per_class_whatever_the_size_and_the_log_names_the_class_read(
    fake_device, tmp_path, monkeypatch
):
    # a route that failed to compile or launch on a class fails at either size (widths, dtype, mask decide it), and a
    # small call's log line says which of the table's classes it read when the table has no small one
    monkeypatch.setenv(routes.ROUTE_TABLE_ENV, str(_table(tmp_path, [_entry()])))
    small = _inputs()
    ops._FAILED_ROUTES[("sdpa_split", routes.without_size(routes.call_class(small)))] = "failed at run time (x)"
    assert ops.table_order(small) == ["chunked", "sdpa"]
    monkeypatch.setattr(routes, "SMALL_WORK", 0)  # the same call at the standard size
    assert ops.table_order(_inputs()) == ["chunked", "sdpa"]
    line = ops.route_choice_line(0, "v1 d16 dv32 fp32 causal none train small", ["chunked", "sdpa"])
    assert line == ("v1 d16 dv32 fp32 causal none train small runs chunked (route order: chunked, sdpa; read from "
                    "the table's 'v1 d16 dv32 fp32 causal none train', which has no "
                    "'v1 d16 dv32 fp32 causal none train small')")  # fmt: skip
    assert ops.route_choice_line(0, "v1 d16 dv32 fp32 causal none train", ["sdpa_split", "chunked", "sdpa"]) == (
        "v1 d16 dv32 fp32 causal none train runs sdpa_split (route order: sdpa_split, chunked, sdpa)")  # fmt: skip


def test_the_table_chooses_its_fastest_usable_route(fake_device, tmp_path, monkeypatch):
    monkeypatch.setenv(routes.ROUTE_TABLE_ENV, str(_table(tmp_path, [_entry()])))
    assert ops.table_order(_inputs()) == ["sdpa_split", "chunked", "sdpa"]
    # a class the table does not list: the safe default
    assert ops.table_order(_inputs(shared=True)) == ["sdpa"]


def test_a_table_may_name_the_fused_kernels_variants_and_nothing_else(fake_device, tmp_path, monkeypatch, caplog):
    # triton[NAME] and triton[A+B] of routes.TRITON_VARIANTS are routes (the fused kernel with those switched on for
    # its own calls: tests/ops/test_tma.py runs them); a forced tile, an unknown variant or one named twice is not
    assert routes.triton_variants("triton[tma+btma]") == ("tma", "btma")
    assert routes.triton_variants("triton[bws]") == ("bws",)
    for name in ("triton", "triton[dkdv 16x64 w4 s1]", "triton[splits 20]", "triton[nope]", "triton[tma+tma]",
                 "triton[]", "cudnn", "triton[tma"):  # fmt: skip
        assert routes.triton_variants(name) is None, name
    assert routes.known_route("triton[tma+bws]") and not routes.known_route("triton[dk 16x128 w8 s3]")
    assert routes.variant_bits(("tma", "btma")) == routes.variant_bits(("btma", "tma")) != routes.variant_bits(("tma",))
    bad = _entry(routes={"v1 d16 dv32 fp32 causal none train": ["triton[dkdv 16x64 w4 s1]", "sdpa"]})
    with pytest.raises(ValueError, match=r"unknown routes \['triton\[dkdv 16x64 w4 s1\]'\]"):
        routes.check_table({"format": 1, "entries": [bad]})
    # a listed variant is checked as the fused kernel is: on a CPU without the interpreter it is skipped, said once
    listed = ["triton[tma+btma]", "chunked"]
    table = _table(tmp_path, [_entry(routes={"v1 d16 dv32 fp32 causal none train": listed})])
    monkeypatch.setenv(routes.ROUTE_TABLE_ENV, str(table))
    ops._LOGGED_FALLBACKS.clear()
    with caplog.at_level(logging.INFO, logger="diffattn.ops"):
        assert ops.table_order(_inputs()) == ["chunked", "sdpa"]
    assert any("triton[tma+btma] skipped" in r.message and "Triton kernel" in r.message for r in caplog.records)
    # an explicit backend by a variant's name is refused where the fused kernel is, in one line naming the route
    with pytest.raises(ValueError, match=r"backend 'triton\[tma\]' is not usable: device cpu"):
        ops.diff_attention(*(torch.randn(1, 2, 4, 16) for _ in range(4)), torch.randn(1, 2, 4, 32), 0.5,
                           backend="triton[tma]")  # fmt: skip
    with pytest.raises(ValueError, match=r"triton\[NAME\].*got 'triton\[nope\]'"):
        ops.diff_attention(*(torch.randn(1, 2, 4, 16) for _ in range(5)), 0.5, backend="triton[nope]")


def test_a_table_may_name_the_fused_kernels_decoding_routes(fake_device, tmp_path, monkeypatch, caplog):
    # issue 37: the sweep's decoding candidates and key splits are routes (routes.decoding_route), so the one it
    # measured correct and fastest on a decode class is what auto runs there, without an edit of code; their names
    # are parsed whole, and what the call carries is the name's (routes.decoding_of)
    cases = {
        "triton[splits 8]": (None, False, 8),
        "triton[decode 16x64 w4 s2]": ((64, 4, 2), False, None),
        "triton[decode vec x64 w4 s2]": ((64, 4, 2), True, None),
        "triton[decode vec x1023 w31 s15 splits 4095]": ((1023, 31, 15), True, 4095),  # each field's largest
    }
    for name, choice in cases.items():
        bits = routes.fused_route_bits(name)
        assert routes.known_route(name) and routes.is_triton_route(name), name
        assert routes.decoding_of(bits) == choice and bits & ((1 << routes.DECODING_SHIFT) - 1) == 0, name
    assert routes.decoding_of(routes.fused_route_bits("triton[tma+btma]")) == (None, False, None)
    for tile in ((1, 1, 1), (1023, 1, 15), (16, 31, 1)):  # each field's ends, read back alone
        for vector in (False, True):
            for splits in (None, 1, 4095):
                assert routes.decoding_of(routes.decoding_bits(tile, vector, splits)) == (tile, vector, splits)
    assert routes.decoding_of(routes.decoding_bits(splits=7)) == (None, False, 7)
    with pytest.raises(ValueError, match="warps must be below 32"):
        routes.decoding_bits((64, 32, 2))
    with pytest.raises(ValueError, match="splits must be below 4096"):
        routes.decoding_bits(splits=4096)
    for bad in ("triton[splits 0]", "triton[splits]", "triton[splits 8 9]", "triton[decode vec x64 s4 w2]",
                "triton[decode 32x64 w4 s2]", "triton[decode vec 16x64 w4 s2]", "triton[decode vec x64 w4 s2 8]",
                "triton[decode vec x64 w4 s2 splits 0]", "triton[decode vec x2048 w4 s2]", "triton[decode]",
                "triton[decode 16x64 w4]", "triton[splits 8", "triton[splits 4096]", "triton[decode vec x64 w32 s2]",
                "triton[splits 08]", "triton[splits \u0663]", "triton[decode  16x64 w4 s2]",
                "triton[decode 16x64 w4 s2 ]", "triton[decode vec x64 w4 s16]"):  # fmt: skip
        # one spelling a route: no leading zeros, other digits or spaces, so a table never names one route twice
        assert not routes.known_route(bad) and routes.fused_route_bits(bad) is None, bad
    listed = ["triton[decode vec x64 w4 s2 splits 8]", "chunked"]
    table = {"format": 1, "entries": [_entry(routes={"v1 d16 dv32 fp32 causal none decode": listed})]}
    assert routes.check_table(table)[0]["routes"]["v1 d16 dv32 fp32 causal none decode"] == listed
    # run by name, as the variants are: refused where the fused kernel is (here a CPU without the interpreter),
    # and a name the kernels have no candidate for is one clear error
    monkeypatch.setenv(routes.ROUTE_TABLE_ENV, str(_table(tmp_path, table["entries"])))
    ops._LOGGED_FALLBACKS.clear()
    with caplog.at_level(logging.INFO, logger="diffattn.ops"):
        assert ops.table_order(_inputs(grad=False, t=1)) == ["chunked", "sdpa"]
    assert any("triton[decode vec x64 w4 s2 splits 8] skipped" in r.message for r in caplog.records)
    with pytest.raises(ValueError, match=r"\(96, 4, 2\).*not a decoding candidate of tuning\.DECODE_VECTORS"):
        ops._impl("triton[decode vec x96 w4 s2]")
    # and auto skips such a route before it runs (under torch.compile nothing is handed over at run time): on a
    # machine where the fused kernel runs (faked here), that is the reason it gives; a candidate it has runs
    monkeypatch.setattr(ops, "triton_unsupported", lambda inp: None)
    decoding = _inputs(grad=False, t=1)
    assert "not a decoding candidate" in ops.route_unsupported("triton[decode vec x96 w4 s2]", decoding)
    assert ops.route_unsupported("triton[decode vec x64 w4 s2]", decoding) is None
    with pytest.raises(ValueError, match=r"\(96, 4, 2\).*not a decoding candidate of tuning\.DECODE_TILES"):
        ops._impl("triton[decode 16x96 w4 s2]")


def _routes_count(q1, k1, q2, k2, v):
    """q1 times the number of routes auto would try for these maps (λ 0.5, causal): a traced function of the lookup."""
    inp = validate(q1, k1, q2, k2, v, 0.5, causal=True, attn_mask=None, scale=None, segment_ids=None)
    return q1 * len(ops.table_order(inp))


def test_the_table_is_read_at_trace_time_of_a_fullgraph_compile(fake_device, tmp_path, monkeypatch):
    # a diffattn model under torch.compile(fullgraph=True) (the CUDA-graph decode step) asks the table in every layer:
    # the lookup must be a trace-time constant, not traced into (file reads, CUDA queries). On torch 2.11 it was
    # traced into: "torch.* op returned non-Tensor" ended every compiled decode step (H200 run of 2026-11-27)
    i = _inputs(grad=False)
    entry = _entry()
    entry["routes"] = {"v1 d16 dv32 fp32 causal none infer": ["cudnn", "sdpa_split", "chunked"]}
    monkeypatch.setenv(routes.ROUTE_TABLE_ENV, str(_table(tmp_path, [entry])))

    torch._dynamo.reset()
    out = torch.compile(_routes_count, backend="eager", fullgraph=True)(i.q1, i.k1, i.q2, i.k2, i.v_parts[0])
    torch._dynamo.reset()
    assert torch.equal(out, i.q1 * 3)  # sdpa_split, chunked, then the safe default (cudnn refuses CPU tensors)


def test_the_table_lookup_under_dynamic_shapes_compiles_once_per_size_class(fake_device, tmp_path, monkeypatch):
    # torch.compile(dynamic=True) over CUDA's auto: the call's class is read from symbolic sizes. The widths, dtype
    # and mask are fixed per model; the length enters the class only through the size test, so one graph serves
    # every length of a size class (a guard on B·H·T·S·d, not on T), and a length across SMALL_WORK reads its own
    # class's routes in a second graph — never one graph per length
    entry = _entry()
    entry["routes"] = {
        "v1 d16 dv32 fp32 causal none train small": ["sdpa_split"],
        "v1 d16 dv32 fp32 causal none train": ["sdpa_split", "chunked"],
    }
    monkeypatch.setenv(routes.ROUTE_TABLE_ENV, str(_table(tmp_path, [entry])))
    monkeypatch.setattr(routes, "SMALL_WORK", 2 * 11 * 11 * 16)  # B·H·T·S·d of T = S = 11 with B = 1, H = 2, d = 16

    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("eager")
    compiled = torch.compile(_routes_count, backend=counter, dynamic=True, fullgraph=True)
    torch._dynamo.reset()
    listed = {}
    for t in (8, 10, 12, 16, 24):
        g = torch.Generator().manual_seed(t)
        q1, k1, q2, k2 = (torch.randn(1, 2, t, 16, generator=g, requires_grad=True) for _ in range(4))
        v = torch.randn(1, 2, t, 32, generator=g, requires_grad=True)
        listed[t] = round(float((compiled(q1, k1, q2, k2, v) / q1).mean()))
    torch._dynamo.reset()
    # small: sdpa_split, then the safe default; standard size: sdpa_split, chunked, the safe default
    assert listed == {8: 2, 10: 2, 12: 3, 16: 3, 24: 3}
    assert counter.frame_count == 2


def test_a_route_that_cannot_take_the_inputs_is_skipped(fake_device, tmp_path, monkeypatch, caplog):
    entry = _entry(routes={"shared_k d16 dv16 fp32 causal none train": ["sdpa_split", "chunked"]})
    monkeypatch.setenv(routes.ROUTE_TABLE_ENV, str(_table(tmp_path, [entry])))
    with caplog.at_level(logging.INFO, logger="diffattn.ops"):
        assert ops.table_order(_inputs(shared=True)) == ["chunked", "sdpa"]  # sdpa_split needs dv > d
    assert any("sdpa_split skipped" in r.message for r in caplog.records)


def test_another_gpu_is_ignored_and_stale_software_said_once(fake_device, tmp_path, monkeypatch, caplog):
    other = _entry(device="Other GPU")
    stale = _entry(torch="2.10.0+cu128")
    monkeypatch.setenv(routes.ROUTE_TABLE_ENV, str(_table(tmp_path, [other, stale])))
    with caplog.at_level(logging.WARNING, logger="diffattn.ops.routes"):
        assert ops.table_order(_inputs()) == ["sdpa"]
        assert ops.table_order(_inputs()) == ["sdpa"]
    lines = [r.message for r in caplog.records]
    assert len(lines) == 1 and "torch 2.10.0+cu128" in lines[0] and "2.11.0+cu130" in lines[0]  # the other GPU: silent


def test_the_newest_matching_entry_wins(fake_device, tmp_path, monkeypatch):
    old = _entry(date="2026-01-01", routes={"v1 d16 dv32 fp32 causal none train": ["chunked"]})
    monkeypatch.setenv(routes.ROUTE_TABLE_ENV, str(_table(tmp_path, [_entry(), old])))
    assert ops.table_order(_inputs())[0] == "sdpa_split"


@pytest.mark.parametrize(("flag", "read", "force"), [
    ("fused_head_norm", routes.head_norm_in_epilogue, ops.fused_head_norm),
    ("fused_lambda", routes.lambda_in_kernel, ops.fused_lambda),
    ("fused_v_copies", routes.v_copies_in_kernel, ops.fused_v_copies)])  # fmt: skip
def test_a_kernel_switch_is_on_where_the_devices_entry_says_or_where_forced(
    fake_device, tmp_path, monkeypatch, flag, read, force
):
    # each of routes.TABLE_FLAGS is data of a measured entry, absent = false: nothing changes what runs before a GPU
    # timed it; off CUDA (index None) false unless forced
    for value, want in ((None, False), (False, False), (True, True)):
        entry = _entry() if value is None else _entry(**{flag: value})
        monkeypatch.setenv(routes.ROUTE_TABLE_ENV, str(_table(tmp_path, [entry], name=f"{value}.json")))
        routes.reset()
        assert read(0) is want
        assert read(None) is False, "off CUDA nothing is measured: PyTorch's ops"
        for forced in (True, False):
            with force(forced):
                assert read(0) is forced and read(None) is forced
        assert read(0) is want, "the setting ends with its block"
    with pytest.raises(ValueError, match=f"'{flag}' must be true or false"):
        routes.check_table({"format": 1, "entries": [_entry(**{flag: "yes"})]})


@pytest.mark.parametrize(
    "text, problem",
    [
        ("{not json", "Expecting property name"),
        (json.dumps({"format": 2, "entries": []}), "not a route table of format 1"),
        (json.dumps({"format": 1, "entries": [{**IDENTITY, "date": "x", "routes": {"c": ["fastest"]}}]}),
         "unknown routes ['fastest']"),
        (json.dumps({"format": 1, "entries": [{"device": "x"}]}), "entry 0 has no 'capability'"),
    ],
)  # fmt: skip
def test_a_corrupt_table_is_one_line_naming_the_file_and_the_safe_default(
    fake_device, tmp_path, monkeypatch, caplog, text, problem
):
    path = tmp_path / "edited.json"
    path.write_text(text)
    monkeypatch.setenv(routes.ROUTE_TABLE_ENV, str(path))
    with caplog.at_level(logging.WARNING, logger="diffattn.ops.routes"):
        assert ops.table_order(_inputs()) == ["sdpa"]
        assert ops.table_order(_inputs()) == ["sdpa"]
    assert len(caplog.records) == 1
    assert str(path) in caplog.records[0].message and problem in caplog.records[0].message


def test_the_order_is_worked_out_once_per_class_until_a_route_fails_or_the_tables_are_reset(
    fake_device, tmp_path, monkeypatch
):
    # every layer of every step asks table_order: its routes' checks run once per class (and device, GQA, a mask that
    # needs a gradient, the routes failed so far), not per call
    monkeypatch.setenv(routes.ROUTE_TABLE_ENV, str(_table(tmp_path, [_entry()])))
    checked = []
    real = ops.route_unsupported
    monkeypatch.setattr(ops, "route_unsupported", lambda name, inp: checked.append(name) or real(name, inp))
    inp = _inputs()
    first = ops.table_order(inp)
    assert first[0] == "sdpa_split" and checked == ["sdpa_split", "chunked", "sdpa"]
    assert ops.table_order(inp) == first and ops.table_order(_inputs()) == first
    assert len(checked) == 3, "the same class asked again: no route checked again"
    cls = routes.without_size(routes.call_class(inp))
    monkeypatch.setitem(ops._FAILED_ROUTES, ("sdpa_split", cls), "failed at run time (a test)")
    assert ops.table_order(inp)[0] == "chunked", "a failed route is left out from then on"
    monkeypatch.delitem(ops._FAILED_ROUTES, ("sdpa_split", cls))
    routes.reset()
    checked.clear()
    assert ops.table_order(inp) == first and checked == ["sdpa_split", "chunked", "sdpa"], "reset forgets the order"
    ops.table_order(_inputs(shared=True))
    assert len(checked) > 3, "another class is worked out on its own"


def test_a_route_failing_at_run_time_hands_over_to_the_next_with_one_line(monkeypatch, caplog):
    inp = _inputs()
    calls = []

    def broken(_inp):
        calls.append(1)
        raise RuntimeError("OutOfResources: shared memory, Required: 262144, Hardware limit: 232448")

    ops._FAILED_ROUTES.clear()
    monkeypatch.setitem(ops._IMPLS, "sdpa_split", broken)
    cls = routes.without_size(routes.call_class(inp))  # failures are kept per class whatever the size
    monkeypatch.setattr(
        ops, "auto_routes", lambda i, c=None: [n for n in ("sdpa_split", "sdpa") if (n, cls) not in ops._FAILED_ROUTES]
    )
    expected = ops.diff_attention_sdpa(inp)
    with caplog.at_level(logging.WARNING, logger="diffattn.ops"):
        first = ops._run_auto(inp)
        second = ops._run_auto(inp)
    torch.testing.assert_close(first, expected, rtol=0, atol=0)
    torch.testing.assert_close(second, expected, rtol=0, atol=0)
    assert len(calls) == 1  # not tried again for this class
    lines = [r.message for r in caplog.records if "failed" in r.message]
    assert len(lines) == 1 and "sdpa_split" in lines[0] and "OutOfResources" in lines[0] and "using sdpa" in lines[0]
    ops._FAILED_ROUTES.clear()


def test_an_error_that_poisons_the_cuda_context_is_not_caught(monkeypatch):
    def poisoned(_inp):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setitem(ops._IMPLS, "sdpa_split", poisoned)
    monkeypatch.setattr(ops, "auto_routes", lambda i, c=None: ["sdpa_split", "sdpa"])
    with pytest.raises(RuntimeError, match="illegal memory access"):
        ops._run_auto(_inputs())


def test_explicit_cudnn_off_cuda_is_one_clear_error():
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(ValueError, match="backend 'cudnn' is not usable: device cpu"):
        ops.diff_attention(q, q, q, q, torch.randn(1, 2, 8, 32), 0.5, backend="cudnn")


@pytest.mark.parametrize(
    ("backend", "shared"),
    [("sdpa_split", False), ("sdpa_maps", False), ("sdpa_maps", True), ("sdpa", False), ("sdpa", True)],
)  # sdpa_split needs dv > d: not DIFF V2's shared-K heads
def test_new_routes_match_the_reference(backend, shared):
    inp = _inputs(shared=shared)
    out = ops._IMPLS[backend](inp)
    # against float64, within the project's rounding rule (tests/ops/rounding.py): the reference op in fp32 is the
    # yardstick of what plain PyTorch's rounding costs on this machine
    gold = ops.diff_attention_reference(_same_values(inp, torch.float64))
    assert_within_rounding(backend, out, gold, [ops.diff_attention_reference(inp)], torch.float32)


def test_the_shipped_table_is_valid_and_names_its_measurements():
    from diffattn.bench.route_sweep import eager_order_key, order_key

    entries = routes.check_table(json.loads(routes.ROUTE_TABLE.read_text()))
    assert entries, "the repository ships at least one measured entry"
    for entry in entries:
        measured = {(m["class"], m["route"]) for m in entry["measurements"] if m["status"] == "ok" and m["correct"]}
        for cls, order in entry["routes"].items():
            assert all((cls, r) in measured for r in order), f"{cls}: a route without a correct measurement"
            keys = [order_key(next(m for m in entry["measurements"] if (m["class"], m["route"]) == (cls, r)))
                    for r in order]  # fmt: skip
            assert keys == sorted(keys), f"{cls}: not fastest first"  # by ratio; decoding by graph time first
        for cls, order in entry.get(routes.EAGER_ROUTES, {}).items():  # a decoding class's order by eager time
            assert cls.endswith(" decode") and sorted(order) == sorted(entry["routes"][cls]), cls
            keys = [eager_order_key(next(m for m in entry["measurements"] if (m["class"], m["route"]) == (cls, r)))
                    for r in order]  # fmt: skip
            assert keys == sorted(keys), f"{cls}: not fastest first by eager time"


def test_the_readme_speed_table_is_the_shipped_tables_measurements():
    from pathlib import Path

    from diffattn.bench.route_sweep import README_BEGIN, README_END, readme_table

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = readme[readme.index(README_BEGIN) : readme.index(README_END) + len(README_END)]
    entries = routes.check_table(json.loads(routes.ROUTE_TABLE.read_text()))
    assert block == readme_table(entries), (
        "README's route tables are stale: python -m diffattn.bench.route_sweep --write-readme README.md"
    )


def _value_halves_inputs():
    """DiffLlama's hand-over: V = [va | vb], its value heads j and j + Hkv of one tensor, each half as wide as Q."""
    g = torch.Generator().manual_seed(3)
    q1, q2, k1, k2 = (torch.randn(1, 2, 8, 16, generator=g).requires_grad_() for _ in range(4))
    v_heads = torch.randn(1, 4, 8, 16, generator=g).requires_grad_()
    return validate(q1, k1, q2, k2, tuple(v_heads.chunk(2, dim=1)), 0.5, causal=True, attn_mask=None, scale=None)


def test_sdpa_maps_reads_value_halves_in_place(monkeypatch):
    # a decoding step against a long cache: the halves are the d-wide slices this route calls with, so concatenating
    # them to cut them again would copy the cache's whole V every token (and split it back in the backward)
    inp = _value_halves_inputs()
    seen, call = [], ops.sdpa._call
    monkeypatch.setattr(
        ops.sdpa, "_call", lambda inp_, q, k, v, mask, **kw: (seen.append(v), call(inp_, q, k, v, mask, **kw))[1]
    )
    out = ops._IMPLS["sdpa_maps"](inp)
    assert len(seen) == 4 and {v.data_ptr() for v in seen} == {part.data_ptr() for part in inp.v_parts}
    grads = torch.autograd.grad(out.square().sum(), inp.v_parts)

    def reference(dtype):  # the output and V's gradients by the reference op, in ``dtype``, from the same values
        same = _same_values(inp, dtype)
        o = ops.diff_attention_reference(same)
        return o, torch.autograd.grad(o.square().sum(), same.v_parts)

    (gold, gold_grads), (plain, plain_grads) = reference(torch.float64), reference(torch.float32)
    assert_within_rounding("out", out, gold, [plain], torch.float32)
    for i, (got, want, yardstick) in enumerate(zip(grads, gold_grads, plain_grads, strict=True)):
        assert_within_rounding(f"dV half {i}", got, want, [yardstick], torch.float32)


def test_cudnn_maps_joins_value_halves_once(monkeypatch):
    # both maps' calls take the same V: reading inp.v per call would concatenate the halves twice (cuDNN itself
    # cannot run here, so the call is stubbed: what is checked is what the route hands it)
    inp = _value_halves_inputs()
    seen = []

    def stub(inp_, q, k, v, mask, **kw):
        seen.append(v)
        return q.new_zeros(*q.shape[:-1], v.shape[-1])

    monkeypatch.setattr(ops.sdpa, "_call", stub)
    ops.sdpa.diff_attention_cudnn_maps(inp)
    assert len(seen) == 2 and seen[0] is seen[1] and seen[0].shape[-1] == 32


def test_diff_v1s_layout_is_the_one_its_classes_measured_faster(fake_device, tmp_path, monkeypatch):
    # the layer hands its heads over in interleaved pairs where the device's entry measured the class's first route in
    # pairs (v1_pairs …) below its first route stacked (v1 …) by more than PAIRS_SLACK; anything missing: stacked
    stacked, pairs = "v1 d64 dv128 bf16 causal none train", "v1_pairs d64 dv128 bf16 causal none train"

    def entry(pairs_ratio, stacked_ratio=1.84, listed=True):
        def record(cls, route, ratio, correct=True):
            return {"class": cls, "route": route, "status": "ok", "correct": correct, "ratio": ratio}

        ms = [record(stacked, "cudnn+epilogue", stacked_ratio), record(stacked, "sdpa", 2.2)]
        if pairs_ratio is not None:  # and a faster record that failed its check, never read
            ms += [record(pairs, "cudnn_shared_v", pairs_ratio), record(pairs, "sdpa", pairs_ratio - 0.3, False)]
        routes_ = {stacked: ["cudnn+epilogue", "sdpa"], **({pairs: ["cudnn_shared_v", "sdpa"]} if listed else {})}
        return _entry(routes=routes_, measurements=ms)

    def faster(*args, **kw):
        monkeypatch.setenv(routes.ROUTE_TABLE_ENV, str(_table(tmp_path, [entry(*args, **kw)])))
        routes.reset()
        return routes.pairs_faster(0, stacked)

    assert faster(1.50) and not faster(1.82), "within the slack: stacked"
    assert not faster(1.90) and not faster(None) and not faster(1.5, listed=False)
    assert not faster(1.50, stacked_ratio=float("inf")), "the stacked class not measured: stacked"
    assert faster(1.50) and {(0, stacked): True} == routes.PAIRS_MEMO
    assert not routes.pairs_faster(None, stacked), "off CUDA nothing is measured"
