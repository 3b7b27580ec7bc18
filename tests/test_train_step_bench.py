"""benchmarks/train_step.py (diffattn bench train-step, diffattn.bench.train_step): the precision it times — bf16
mixed precision by default on CUDA, as training runs there, fp32 on CPU, fp16 on request — and that it says which in
its output."""

from __future__ import annotations

import json

import pytest
import torch

import diffattn.ops
from diffattn.bench import kernels as kernels_mod
from diffattn.bench import train_step
from diffattn.cli import main

from .fake_cuda import fake_cuda_graphs


def test_default_dtype_is_what_training_runs_in():
    assert train_step.default_dtype("cuda") == "bf16" and train_step.default_dtype("cuda:1") == "bf16"
    assert train_step.default_dtype("cpu") == "fp32"


def test_a_bf16_step_runs_the_attention_in_bf16(monkeypatch):
    # the step's forward runs under autocast: every attention call of the DIFF models gets bf16 inputs
    seen = []
    validate = diffattn.ops.validate

    def recording(*args, **kwargs):
        inp = validate(*args, **kwargs)
        seen.append(inp.q1.dtype)
        return inp

    monkeypatch.setattr(diffattn.ops, "validate", recording)
    model = train_step.build_model("debug", "diff", backend="auto", seed=0, num_layers=1).train()
    ids = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(0))
    train_step._step_fn(model, ids, "bf16")()
    assert seen and set(seen) == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in model.parameters())  # float32 weights, as the trainer keeps
    seen.clear()
    train_step._step_fn(model, ids, "fp32")()
    assert set(seen) == {torch.float32}


def test_the_script_takes_dtype_and_prints_it(capsys, tmp_path):
    out = tmp_path / "rows.json"
    argv = ["--presets", "debug", "--seq-lens", "16", "--reps", "1", "--device", "cpu", "--dtype", "fp16"]
    assert main(["bench", "train-step", *argv, "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "dtype=fp16" in text
    header, row = text.strip().splitlines()[-2:]  # one repetition: no range line
    assert "dtype" in header.split() and row.split()[:3] == ["debug", "16", "fp16"]
    saved = json.loads(out.read_text())
    assert saved["dtype"] == "fp16" and saved["rows"][0]["dtype"] == "fp16"
    assert main(["bench", "train-step", *argv[:-2]]) == 0  # no --dtype on a CPU: fp32
    assert "dtype=fp32" in capsys.readouterr().out


def test_the_spread_and_the_gpus_busy_time_are_lines_of_their_own_where_measured():
    # every row carries the range of its repetitions; CUDA rows also the GPU's busy time in one profiled step (the
    # host's issuing time it replaces read within 0.1 ms of the step in every column of two H200 leases)
    names = list(train_step.COLUMNS)
    ms = dict.fromkeys(names, 10.0)
    row = train_step.StepRow("small", 1024, 4, ms, "bf16", {}, dict.fromkeys(names, 4.5), dict.fromkeys(names, 0.3))
    lines = train_step.format_table([row]).splitlines()
    assert lines[-2].split() == ["range", *["0.3"] * len(names)]
    assert lines[-1].split() == ["gpu", *["4.5"] * len(names)]
    assert lines[-3].split()[:3] == ["small", "1024", "bf16"]
    assert train_step.rows_as_dicts([row])[0]["gpu_ms"] == dict.fromkeys(names, 4.5)
    cpu = train_step.StepRow("small", 1024, 4, ms, "fp32", {}, {}, dict.fromkeys(names, 0.3))
    assert train_step.format_table([cpu]).splitlines()[-1].split()[0] == "range"  # no gpu line without one
    # said once under the table: what each extra line is (the range line was unlabelled)
    legend = train_step.table_legend([row]).splitlines()
    assert [line.split(":")[0] for line in legend] == ["range", "gpu"] and "slowest repetition less its" in legend[0]
    assert train_step.table_legend([cpu]).splitlines()[0].startswith("range: ")
    assert train_step.table_legend([train_step.StepRow("small", 1024, 4, ms)]) == ""  # one repetition: no range


@pytest.mark.heavy  # torch.compile of a whole step: ~8 s on 2 cores; the compile plumbing's fast test stays above
def test_a_compiled_step_trains_the_models_own_parameters_and_says_so(capsys):
    # --compile: the forward through torch.compile ("eager" here: the plumbing, not inductor's speed); the optimizer
    # steps the model's own parameters, and the row names the backend
    model = train_step.build_model("debug", "diff", backend="auto", seed=0, num_layers=1).train()
    ids = torch.randint(0, 100, (1, 16), generator=torch.Generator().manual_seed(0))
    before = [p.detach().clone() for p in model.parameters()]
    train_step._step_fn(model, ids, "fp32", compile_backend="eager")()
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
    argv = ["--presets", "debug", "--seq-lens", "16", "--reps", "1", "--device", "cpu", "--compile", "eager"]
    assert main(["bench", "train-step", *argv]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].endswith("(forward compiled: eager)")


def test_a_compile_mode_reaches_torch_compile_and_the_row_and_needs_a_backend(monkeypatch, capsys):
    # --compile-mode: torch.compile gets the mode ("default" is its None), the step marks each step's start for
    # inductor's CUDA graphs under reduce-overhead, and the row says backend:mode
    seen, marks = [], []

    def recording_compile(model, backend=None, mode=None):
        seen.append((backend, mode))
        return model

    monkeypatch.setattr(torch, "compile", recording_compile)
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    model = train_step.build_model("debug", "diff", backend="auto", seed=0, num_layers=1).train()
    ids = torch.randint(0, 100, (1, 16), generator=torch.Generator().manual_seed(0))
    train_step._step_fn(model, ids, "fp32", "eager", compile_mode="default")()
    assert seen == [("eager", None)] and marks == []
    step = train_step._step_fn(model, ids, "fp32", "eager", compile_mode="reduce-overhead")
    step()
    step()
    assert seen[-1] == ("eager", "reduce-overhead") and marks == [1, 1]
    argv = ["--presets", "debug", "--seq-lens", "16", "--reps", "1", "--device", "cpu", "--compile", "eager"]
    assert main(["bench", "train-step", *argv, "--compile-mode", "reduce-overhead"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].endswith("(forward compiled: eager:reduce-overhead)")
    for kwargs in ({"compile_mode": "reduce-overhead"}, {"compile_mode": "fast", "compile_backend": "eager"}):
        with pytest.raises(ValueError, match="compile_mode must be one of default, reduce-overhead"):
            train_step.run_train_step_benchmark(["debug"], [16], reps=1, device="cpu", **kwargs)


def test_a_graphed_step_captures_the_eager_step_with_its_switches_and_a_capturable_adamw(monkeypatch):
    # --cuda-graphs with CUDA's graph calls faked (a fake capture runs the step eagerly): the captured step is the
    # eager step's, in its dtype with the forced switches on in every warm-up forward and the capture's, and one
    # replay a call
    fake = fake_cuda_graphs(monkeypatch)
    model = train_step.build_model("debug", "diff", backend="auto", seed=0, num_layers=1).train()
    twin = train_step.build_model("debug", "diff", backend="auto", seed=0, num_layers=1).train()
    ids = torch.randint(0, 100, (1, 16), generator=torch.Generator().manual_seed(0))
    seen = []
    forward = model.forward

    def recording(*args, **kwargs):
        seen.append((diffattn.ops.routes.FORCED_FLAGS["heads_in_pairs"], torch.get_autocast_dtype("cpu")))
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", recording)
    step = train_step._graphed_step_fn(model, ids, "bf16", ("heads_in_pairs",))
    assert seen == [(True, torch.bfloat16)] * 4 and fake.events[-2:] == ["capture on side", "captured"]
    opt = train_step._optimizer(twin, capturable=True)  # the eager step, with the AdamW a graph needs
    train_step._loss_fn(twin, "cpu", "bf16", ("heads_in_pairs",))(ids).backward()
    opt.step()
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):  # the capture's one step is the eager one
        assert torch.equal(p, q)
    step()
    step()
    assert fake.replays == 2 and len(seen) == 4


def test_a_micro_graphed_step_is_pretrains_graphed_step_and_trains_as_the_eager_one(monkeypatch):
    # --cuda-graphs micro (what `diffattn pretrain --cuda-graphs` runs): forward and backward one graph after three
    # warm-up calls, AdamW eager — with captures replayed by running them again, every step's weights bit for bit an
    # eager twin's (fp32: no autocast); the row says its scope
    from .fake_cuda import replaying_captures

    fake = fake_cuda_graphs(monkeypatch)
    replaying_captures(monkeypatch, fake)
    model = train_step.build_model("debug", "diff", backend="auto", seed=0, num_layers=1).train()
    twin = train_step.build_model("debug", "diff", backend="auto", seed=0, num_layers=1).train()
    ids = torch.randint(0, 100, (1, 16), generator=torch.Generator().manual_seed(0))
    step = train_step._micro_graphed_step_fn(model, ids, "fp32")  # three warm-up steps, the capture's step
    assert fake.events[-2:] == ["capture on side", "captured"] and fake.replays == 1
    eager = train_step._step_fn(twin, ids, "fp32")
    for n in range(6):
        if n >= 4:
            step()
        eager()
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(p, q)
    assert fake.replays == 3
    names = list(train_step.COLUMNS)
    row = train_step.StepRow(
        "small", 1024, 4, dict.fromkeys(names, 10.0), "bf16", cuda_graphs=True, graph_scope="micro"
    )
    assert train_step.format_table([row]).splitlines()[-1].endswith("AdamW eager: pretrain --cuda-graphs)")
    with pytest.raises(ValueError, match="cuda_graphs must be one of whole, micro"):
        train_step.run_train_step_benchmark(["debug"], [16], reps=1, device="cuda", cuda_graphs="partial")


def test_graphs_are_refused_where_a_step_cannot_be_one(capsys):
    for kwargs, reason in (
        ({"device": "cpu"}, "device cpu is not CUDA"),
        ({"device": "cuda", "dtype": "fp16"}, "gradient scaler"),
        ({"device": "cuda", "dtype": "bf16", "compile_backend": "inductor"}, "reduce-overhead"),
    ):
        with pytest.raises(ValueError, match=reason):
            train_step.run_train_step_benchmark(["debug"], [16], reps=1, cuda_graphs=True, **kwargs)
    argv = ["--presets", "debug", "--seq-lens", "16", "--reps", "1", "--device", "cpu", "--cuda-graphs"]
    assert main(["bench", "train-step", *argv]) != 0
    assert "device cpu is not CUDA" in capsys.readouterr().err
    names = list(train_step.COLUMNS)
    row = train_step.StepRow("small", 1024, 4, dict.fromkeys(names, 10.0), "bf16", cuda_graphs=True)
    assert train_step.format_table([row]).splitlines()[-1].endswith("(whole step one CUDA graph)")


@pytest.mark.heavy  # over 10 s on 2 cores in the first recording machine's seconds (tests/durations.json); CI runs it
def test_every_row_of_a_compiled_run_is_compiled_past_dynamos_recompile_limit():
    # four models a row each recompile the same forward code; past dynamo's limit of 8 it would run them eager while
    # the rows still said "compiled": every row starts afresh, so all 12 models here are compiled
    compiled = []

    def counting(gm, example_inputs):
        compiled.append(gm)
        return gm.forward

    rows = train_step.run_train_step_benchmark(
        ["debug"], [8, 16, 24], batch=1, reps=1, device="cpu", compile_backend=counting
    )
    assert len(rows) == 3 and len(compiled) >= 12
    assert {row.compiled for row in rows} == {"counting"}  # a callable backend by its name


def test_forced_backends_are_columns_of_their_own_and_one_that_cannot_run_is_nan(capsys, tmp_path):
    # --backends: the DIFF model once more per backend, forced; cudnn_maps cannot run on a CPU: a NaN column and its
    # reason, the rest of the row measured
    out = tmp_path / "rows.json"
    argv = ["--presets", "debug", "--seq-lens", "16", "--reps", "1", "--device", "cpu", "--backends", "sdpa,cudnn_maps"]
    assert main(["bench", "train-step", *argv, "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "diffattn DIFF (cudnn_maps) failed: ValueError: backend 'cudnn_maps' is not usable" in text
    assert "diffattn DIFF (sdpa) " in text.strip().splitlines()[-1] and "diffattn DIFF (cudnn_maps) nan" in text
    ms = json.loads(out.read_text())["rows"][0]["ms"]
    assert ms["diffattn DIFF (sdpa)"] > 0 and ms["diffattn DIFF (cudnn_maps)"] != ms["diffattn DIFF (cudnn_maps)"]
    assert set(ms) == {*train_step.COLUMNS, "diffattn DIFF (sdpa)", "diffattn DIFF (cudnn_maps)"}
    with pytest.raises(ValueError, match="unknown backend"):
        train_step.columns_for(("cudnn_mapz",))


def test_a_v2_prefixed_backend_is_a_forced_column_of_diff_v2s_model(monkeypatch):
    # v2:BACKEND: DIFF V2's model with its op forced (its step is a column of its own, its backend reaching the layer),
    # named and labelled as DIFF V2's; no switch suffix (the switches are DIFF V1's layer's), no unknown route
    columns = train_step.columns_for(["v2:sdpa_maps", "cudnn_direct"])
    assert columns["diffattn DIFF V2 (sdpa_maps)"] == ("diff-v2", "sdpa_maps")
    assert columns["diffattn DIFF (cudnn_direct)"] == ("diff", "cudnn_direct")
    assert train_step.forced_column("v2:sdpa_maps") == "diffattn DIFF V2 (sdpa_maps)"
    assert train_step.column_label("diffattn DIFF V2 (cudnn_direct)") == "V2 cudnn_direct"
    with pytest.raises(ValueError, match="takes no switch suffix"):
        train_step.columns_for(["v2:auto+norm"])
    with pytest.raises(ValueError, match="unknown backend"):
        train_step.columns_for(["v2:cudnn_mapz"])
    from diffattn.models import diff_v2

    seen = []
    real = diff_v2.DiffV2Attention.forward
    monkeypatch.setattr(diff_v2.DiffV2Attention, "forward", lambda self, *a, **k: seen.append(self.backend) or real(
        self, *a, **k))  # fmt: skip
    (row,) = train_step.run_train_step_benchmark(["debug"], [16], batch=1, reps=1, device="cpu",
                                                 backends=("v2:sdpa_maps",))  # fmt: skip
    assert row.ms["diffattn DIFF V2 (sdpa_maps)"] > 0 and {"auto", "sdpa_maps"} <= set(seen)


def test_the_gpu_profile_is_per_column_and_a_failing_profiler_costs_the_figures_only(monkeypatch, capsys):
    # what a profile holds is diffattn.bench.kernels' (tests/test_bench_kernels.py); here: one per column, a column
    # without a usable one left out with a line (never 0.0 ms, which would read as an idle GPU), and a profiler that
    # raises costs the figures, not the benchmark
    profiles = {"baseline": (0.8, {"k": [1.0, 2]}), "diffattn DIFF (auto)": None}
    monkeypatch.setattr(train_step, "profile_gpu", lambda step: profiles[step()])
    steps = {name: (lambda name=name: name) for name in profiles}
    assert train_step.gpu_profile(steps) == ({"baseline": 0.8}, {"baseline": {"k": [1.0, 2]}})
    assert "not measured for diffattn DIFF (auto)" in capsys.readouterr().out

    def broken(step):
        raise RuntimeError("CUPTI unavailable")

    monkeypatch.setattr(train_step, "profile_gpu", broken)
    assert train_step.gpu_profile(steps) == ({}, {})
    assert "CUPTI unavailable" in capsys.readouterr().out


def test_columns_are_timed_in_a_rotating_order_with_the_garbage_collector_paused(monkeypatch):
    # a fixed round-robin puts each column after the same one every time, and a cyclic collection can fall on the same
    # column every round: the first column rotates per repetition and the collector is off while timing
    import gc

    calls, collector = [], []

    def fake_build(preset, attention, backend=None, **kw):
        model = torch.nn.Linear(1, 1)
        model.config = type("Config", (), {"vocab_size": 10})()
        model.tag = (attention, backend)
        return model

    def fake_step(model, batch, dtype, compile_backend=None, fused=(), compile_mode=None):
        return lambda: (calls.append(model.tag), collector.append(gc.isenabled()))

    monkeypatch.setattr(train_step, "build_model", fake_build)
    monkeypatch.setattr(train_step, "_step_fn", fake_step)
    rows = train_step.run_train_step_benchmark(("debug",), (8,), batch=1, reps=3, device="cpu", dtype="fp32")
    tags = [train_step.COLUMNS[n] for n in train_step.COLUMNS]
    timed = calls[len(tags) :]  # after one warm-up step each
    assert timed == tags + tags[1:] + tags[:1] + tags[2:] + tags[:2]
    assert collector[: len(tags)] == [True] * len(tags) and not any(collector[len(tags) :])
    assert gc.isenabled() and set(rows[0].range_ms) == set(train_step.COLUMNS)


def test_gc_paused_restores_the_collectors_state():
    import gc

    from diffattn.bench import gc_paused

    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # it was off before: left off
    finally:
        gc.enable()


def test_the_kernel_table_sets_the_columns_kernels_side_by_side():
    names = [*train_step.COLUMNS, "diffattn DIFF (cudnn_maps+epilogue)"]
    assert [train_step.column_label(n) for n in names] == ["baseline", "DIFF auto", "DiffLlama", "V2 auto",
                                                           "cudnn_maps+epi"]  # fmt: skip
    kernels = {
        "baseline": {"flash": [2.0, 8], "add": [0.5, 40]},
        "diffattn DIFF (cudnn_maps+epilogue)": {
            "cudnn": [3.0, 16],
            "_subtract_fwd_kernel": [0.25, 8],
            kernels_mod.OTHER_KERNELS: [0.5, 20],
        },
    }
    row = train_step.StepRow("small", 4096, 4, {}, "bf16", kernel_ms=kernels)
    lines = train_step.format_kernels([row], shown=3).splitlines()
    assert "small 4096 tokens x 4, bf16" in lines[0]
    assert lines[1].split() == ["kernel", "baseline", "cudnn_maps+epi"]
    assert [line.split()[0] for line in lines[2:5]] == ["cudnn", "flash", "add"]  # by the longest time in any column
    assert lines[2].split()[1:] == ["—", "3.00", "(16)"]
    assert lines[-2].split()[-2:] == ["0.75", "(28)"]  # the rest: the kernel not shown and the summed ones
    assert lines[-1].split()[2:] == ["2.50", "(48)", "3.75", "(44)"]  # every kernel
    assert train_step.format_kernels([train_step.StepRow("small", 4096, 4, {}, "fp32")]) == ""


def test_a_fused_column_runs_its_steps_with_its_switches_on():
    # "<backend>+norm" / "+lambda": the head norm in the epilogue's kernel, λ by its kernel
    # (diffattn.ops.fused_head_norm, fused_lambda) for that column's steps only, where the route table does not switch
    # them on yet; +norm follows auto or an epilogue route, +lambda any backend
    columns = train_step.columns_for(("sdpa+epilogue+norm", "auto+norm+lambda", "sdpa+lambda", "sdpa"))
    assert columns["diffattn DIFF (sdpa+epilogue+norm)"] == ("diff", "sdpa+epilogue+norm")
    assert train_step.split_fused("auto+norm+lambda") == ("auto", ("fused_head_norm", "fused_lambda"))
    assert train_step.split_fused("sdpa+epilogue") == ("sdpa+epilogue", ())
    # +perlayer: each layer's own λ, where the model computes them at once (a comparison, not a table switch)
    assert train_step.split_fused("auto+norm+perlayer") == ("auto", ("fused_head_norm", "lambda_per_layer"))
    with pytest.raises(ValueError, match=r"sdpa\+norm: \+norm \(the head norm in the epilogue's kernel\) follows"):
        train_step.columns_for(("sdpa+norm",))
    with pytest.raises(ValueError, match="unknown backend"):
        train_step.columns_for(("fastest+norm",))
    from diffattn.ops import routes

    seen = []
    model = train_step.build_model("debug", "diff", backend="sdpa", seed=0, num_layers=1).train()
    reads = (routes.head_norm_in_epilogue, routes.lambda_in_kernel, routes.v_copies_in_kernel)
    model.register_forward_hook(lambda *_: seen.append(tuple(read(None) for read in reads)))
    ids = torch.randint(0, 100, (1, 8), generator=torch.Generator().manual_seed(0))
    assert train_step.split_fused("cudnn+epilogue+vcopies") == ("cudnn+epilogue", ("fused_v_copies",))
    for fused in (("fused_head_norm",), ("fused_lambda",), ("fused_v_copies",), ()):
        train_step._step_fn(model, ids, "fp32", fused=fused)()
    want = [(True, False, False), (False, True, False), (False, False, True), (False, False, False)]
    assert seen == want, "forced in the column's step, the table's after"


def test_every_backend_the_gpu_script_forces_is_a_column_the_step_can_make():
    # a name the step refuses ("unknown backend", +norm after a route without the epilogue) would cost a lease the
    # whole train step: each --backends list of benchmarks/gpu_session.sh, checked here as the step checks it
    import re
    from pathlib import Path

    script = (Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_session.sh").read_text()
    lists = re.findall(r"--backends (\S+)", script)
    assert len(lists) >= 2, "the small step's and the paper-830m step's"
    for names in lists:
        columns = train_step.columns_for(names.split(","))
        assert all(train_step.forced_column(name) in columns for name in names.split(",")), names


@pytest.mark.gpu
def test_every_column_captures_as_one_graph_on_a_gpu():
    # the GPU script's graphed step, shorter: every default column and two forced ones captured and replayed, each
    # a finite time, the row marked as graphed (a column that cannot be captured is NaN with its reason printed)
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    backends = ("cudnn+epilogue+norm", "auto+pairs")
    (row,) = train_step.run_train_step_benchmark(
        ["small"], [256], batch=2, reps=2, device="cuda", dtype="bf16", backends=backends, cuda_graphs=True
    )
    assert row.cuda_graphs and set(row.ms) == set(train_step.columns_for(backends))
    assert all(ms == ms and ms > 0 for ms in row.ms.values()), row.ms


def test_the_host_profile_is_per_column_and_shows_what_diffs_step_has_beyond_the_baselines(capsys, tmp_path):
    # on request (--host-profile): one more step per column under the profiler's Python tracer, after the timing; the
    # DIFF columns' tables hold the op's Python the baseline's does not, and the printed table shows it
    out = tmp_path / "rows.json"
    argv = ["--presets", "debug", "--seq-lens", "16", "--reps", "1", "--device", "cpu", "--host-profile"]
    assert main(["bench", "train-step", *argv, "--json", str(out)]) == 0
    text = capsys.readouterr().out
    row = json.loads(out.read_text())["rows"][0]
    assert set(row["host_ms"]) == set(row["host_wall_ms"]) == set(train_step.COLUMNS)
    ours = {n for n in row["host_ms"]["diffattn DIFF (auto)"] if n.startswith("diffattn/ops/")}
    assert ours and not ours & set(row["host_ms"]["baseline"])
    assert all(w > 0 for w in row["host_wall_ms"].values())
    assert "host time of one profiled step" in text and "kernel launches (calls)" in text
    # not asked for: no profile, no table; a graphed step has no host work to profile (one launch)
    assert train_step.run_train_step_benchmark(("debug",), (16,), reps=1, device="cpu")[0].host_ms == {}
    with pytest.raises(ValueError, match="a graphed step's host work is one launch"):
        train_step.run_train_step_benchmark(("debug",), (16,), device="cuda", cuda_graphs=True, host_profile=True)


def test_a_failing_host_profiler_costs_the_figures_only(monkeypatch, capsys):
    monkeypatch.setattr(train_step, "profile_host", lambda step: (2.0, {"aten::mm": [1.0, step()]}))
    steps = {"baseline": lambda: 3, "diffattn DIFF (auto)": lambda: 4}
    walls, tables = train_step.host_profiles(steps)
    assert walls == {"baseline": 2.0, "diffattn DIFF (auto)": 2.0} and tables["diffattn DIFF (auto)"] == {
        "aten::mm": [1.0, 4]
    }

    def broken(step):
        raise RuntimeError("profiler busy")

    monkeypatch.setattr(train_step, "profile_host", broken)
    assert train_step.host_profiles(steps) == ({}, {})
    assert "host profile not taken: RuntimeError: profiler busy" in capsys.readouterr().out
    assert train_step.format_host([train_step.StepRow("small", 1024, 4, {}, "bf16")]) == ""
