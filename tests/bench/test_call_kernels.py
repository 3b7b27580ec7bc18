"""diffattn.bench.call_kernels on this CPU at tiny shapes: the columns it times (baseline, the stacked cuDNN floor,
each route), a route that cannot run is a line and no column, and what it prints. The kernels themselves need a GPU
(benchmarks/gpu_session.sh, step ``kernels``); how a profile is read is tested in tests/test_bench_kernels.py."""

from __future__ import annotations

import contextlib

import pytest
import torch

from diffattn.bench import call_kernels as ck
from diffattn.bench import route_sweep as rs


def test_a_tiny_run_times_each_column_and_a_route_that_cannot_run_is_a_line():
    said = []
    result = ck.run(ck.DEFAULT_CLASSES[0], ("sdpa", "sdpa_maps", "cudnn_maps"), device="cpu", scale="tiny",
                    progress=said.append)  # fmt: skip
    assert list(result["columns"]) == ["baseline", "sdpa", "sdpa_maps"]
    assert result["columns"]["baseline"]["ratio"] == 1.0
    assert all(c["ms"] > 0 and "kernels" not in c for c in result["columns"].values())  # nothing profiled off CUDA
    assert set(result["failed"]) == {ck.FLOOR, "cudnn_maps"}  # cuDNN runs on CUDA only
    assert "cuDNN attention runs on CUDA" in result["failed"]["cudnn_maps"]
    assert len(said) == 2
    text = ck.format_result(result).splitlines()
    assert text[0].startswith(f"one call of {ck.DEFAULT_CLASSES[0]} at ")
    assert [line.split()[0] for line in text[1:4]] == ["baseline", "sdpa", "sdpa_maps"]
    assert "failed:" in text[-1]


def test_each_pair_has_its_routes_and_only_v1_has_the_floor():
    # the one never run on a GPU: last (a crash there ends the process after the others' rows)
    assert ck.DEFAULT_ROUTES["v1"][-3:] == ("cudnn_maps+epilogue", "cudnn+epilogue", "cudnn+epilogue+vcopies")
    cls = rs.CallClass.from_key(next(c for c in ck.DEFAULT_CLASSES if c.startswith("shared_k")))
    p = rs.make_problem(cls, **rs.shape_of(cls, "tiny"), device="cpu", dtype=torch.float32, seed=1)
    assert list(ck.columns_for(cls, p, ("sdpa",))) == ["baseline", "sdpa"]
    # DIFF V1 in pairs: cudnn_shared_v beside the stacked layout's fastest route, and its own floor
    assert ck.DEFAULT_ROUTES["v1_pairs"] == ("cudnn+epilogue", "cudnn_shared_v", "cudnn_shared_v_split")


def test_the_floor_in_pairs_is_one_cudnn_call_reading_v_once(monkeypatch):
    # V1 in interleaved pairs: cuDNN's ATen op on the model's Q and K in pairs and V of half their heads, as they are
    # (SDPA's API cannot give K and V two head counts); on this CPU an SDPA call with cuDNN's grouped heads stands in
    cls = rs.CallClass.from_key("v1_pairs d64 dv128 fp32 causal none train")
    p = rs.make_problem(cls, **rs.shape_of(cls, "tiny"), device="cpu", dtype=torch.float32, seed=1)
    seen = []

    def cudnn(q, k, v, bias, lse, dropout, causal, debug):
        seen.append((q.shape, k.shape, v.shape, lse, causal))
        grouped = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        return (torch.nn.functional.scaled_dot_product_attention(q, k, grouped, is_causal=causal),)

    monkeypatch.setattr(torch.ops.aten, "_scaled_dot_product_cudnn_attention", cudnn)
    ck.columns_for(cls, p, ())[ck.FLOOR]()
    q, k, v = p.heads
    assert seen == [(q.shape, k.shape, v.shape, True, True)] and k.shape[1] == 2 * v.shape[1]
    assert all(x.grad is None for x in p.leaves)


def test_the_floor_is_one_call_over_both_maps_stacked_and_its_gradients(monkeypatch):
    # the cuDNN context let through on this CPU: the floor's one call is O1 and O2 side by side over [K1; K2] and V
    # twice, with gradients into its own stacked leaves (not the route's inputs)
    import torch.nn.attention as attention

    monkeypatch.setattr(attention, "sdpa_kernel", lambda backends: contextlib.nullcontext())
    cls = rs.CallClass.from_key(ck.DEFAULT_CLASSES[0])
    p = rs.make_problem(cls, **rs.shape_of(cls, "tiny"), device="cpu", dtype=torch.float32, seed=1)
    seen = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        seen.append((q.shape, k.shape, v.shape, q.requires_grad))
        return real(q, k, v, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    ck.columns_for(cls, p, ())[ck.FLOOR]()
    b, h, t, d = p.diff["q1"].shape
    assert seen == [((b, 2 * h, t, d), (b, 2 * h, t, d), (b, 2 * h, t, 2 * d), True)]
    assert all(x.grad is None for x in p.leaves)


def test_call_classes_read_back_from_their_keys():
    for cls in rs.default_classes():
        assert rs.CallClass.from_key(cls.key) == cls
    for bad in ("v1 d64 dv64 bf16 causal none train", "v1 dx dv128 bf16 causal none train", "v1 d64"):
        with pytest.raises(ValueError, match="not a call class key"):
            rs.CallClass.from_key(bad)


def test_without_cuda_it_says_so_and_exits_2(capsys):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here")
    assert ck.main([]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


def test_the_decoding_class_profiles_the_fused_kernel_beside_the_tables_routes():
    # issue 37's "what is in 0.30 ms": the fused kernel's key-split forward and combine, kernel by kernel, beside the
    # routes the H200's table runs for that call; on this CPU only the routes that run here have columns
    key = next(c for c in ck.DEFAULT_CLASSES if c.endswith(" decode"))
    assert rs.CallClass.from_key(key).mode == "decode" and "triton" in ck.DECODE_ROUTES
    result = ck.run(key, calls=1, device="cpu", scale="tiny", progress=lambda _: None)
    # every column is there or one line of why not (cuDNN and the epilogue need CUDA; the fused kernel runs here only
    # where the interpreter is on, as the kernel tests' collection turns it on)
    assert set(result["columns"]) | set(result["failed"]) == {"baseline", ck.FLOOR, *ck.DECODE_ROUTES}
    assert {"baseline", "sdpa_maps"} <= set(result["columns"]) and "cudnn_maps" in result["failed"]
    # and where each column's host time goes (an eager decoding call is host-bound on a GPU): per call, by op
    for name, column in result["columns"].items():
        assert column["host_ms"] > 0 and column["host"], name
    assert any("scaled_dot_product_attention" in row for row in result["columns"]["sdpa_maps"]["host"])
    text = ck.format_result(result)
    assert "host per call under the profiler" in text and "host time per call, self ms" in text


def test_on_a_gpu_the_decoding_class_also_profiles_the_tables_first_route(monkeypatch):
    # after a decode sweep the table's first route for the class may be a decoding candidate of the fused kernel
    # (routes.decoding_route): its kernels are profiled beside the fixed columns; a route already among them, or the
    # safe default of a class the table lacks, adds nothing; off CUDA the fixed ones
    from diffattn.ops import routes

    key = next(c for c in ck.DEFAULT_CLASSES if c.endswith(" decode"))
    listed = ["triton[decode vec x64 w4 s2 splits 16]"]
    asked = []
    monkeypatch.setattr(routes, "listed_routes", lambda index, cls: asked.append((index, cls)) or (*listed, "sdpa"))
    assert ck.decode_routes(key, "cuda") == (*ck.DECODE_ROUTES, "triton[decode vec x64 w4 s2 splits 16]")
    assert asked == [(0, key)]
    for first in ("sdpa_maps+epilogue", routes.SAFE_DEFAULT):
        listed[0] = first
        assert ck.decode_routes(key, "cuda:0") == ck.DECODE_ROUTES
    assert ck.decode_routes(key, "cpu") == ck.DECODE_ROUTES and len(asked) == 3


def test_a_route_with_a_switchs_suffix_runs_with_that_switch_forced_on(monkeypatch):
    # "cudnn+epilogue+vcopies": the route with [V; V] by its kernels (diffattn.ops.fused_v_copies), beside its plain
    # twin, from whose GPU busy times diffattn.bench.switches decides the switch
    from diffattn.ops import routes, sdpa

    seen = []
    plain = sdpa.v_twice
    monkeypatch.setattr(sdpa, "v_twice", lambda inp: seen.append(routes.v_copies_in_kernel(None)) or plain(inp))
    result = ck.run(ck.DEFAULT_CLASSES[0], ("sdpa", "sdpa+vcopies"), device="cpu", scale="tiny", progress=print)
    assert list(result["columns"]) == ["baseline", "sdpa", "sdpa+vcopies"]
    assert True in seen and False in seen and not routes.v_copies_in_kernel(None), "forced in its column only"


def test_v1_at_d128_times_its_own_routes_with_and_without_v_twice_by_kernels():
    # issue 34's d = 128 target: the table's route (sdpa_split+epilogue) and cuDNN's one call, each with [V; V] by its
    # kernels beside it (diffattn.bench.switches decides fused_v_copies from these pairs too)
    key = "v1 d128 dv256 bf16 causal none train"
    assert key == "v1 d128 dv256 bf16 causal none train"
    result = ck.run(key, device="cpu", scale="tiny", progress=lambda m: None)
    assert set(result["columns"]) | set(result["failed"]) == {"baseline", ck.FLOOR, *ck.CLASS_ROUTES[key]}
