"""benchmarks/gpu_report.py (diffattn.bench.gpu_report) end to end on a fake device: CUDA reported available, the
measurements (op, train step, decode, the FSDP2 ranks, the pytest subprocess) replaced by stubs that return chosen
timings and advance a fake clock, so every section, the time budget, the skip and error paths, the target checks and
both written files run on a CPU. The refusal without CUDA runs for real. The FSDP2 ranks run for real on two CPU
processes (gloo) in a slow test."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from diffattn.bench import attention, gpu_report, train_step
from diffattn.bench.attention import BASELINE, HF_TWO_CALLS, OFFICIAL_FOUR_CALLS, Row
from diffattn.bench.train_step import StepRow

REPO = Path(__file__).resolve().parents[1]

# ratios of the fused kernel to the baseline, and the other routes' fwd+bwd as multiples of the kernel's
PASSING = {"fwd": 1.5, "fwd_bwd": 1.2, "decode": 1.05, "official": 1.5, "hf": 1.2, "decode_model": 1.08}
FAILING = {"fwd": 1.7, "fwd_bwd": 1.35, "decode": 1.6, "official": 1.3, "hf": 1.1, "decode_model": 1.6}


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def op_rows(n: int, t: dict, *, with_hf: bool = True) -> list[Row]:
    """Rows as run_attention_benchmark makes them at one size: baseline 1 ms forward, 3 ms forward+backward."""
    base_f, base_fb, base_dec = 1.0, 3.0, 0.01
    tri_fb = base_fb * t["fwd_bwd"]
    ms = {
        BASELINE: (base_f, base_fb, base_dec),
        "diff triton": (base_f * t["fwd"], tri_fb, base_dec * t["decode"]),
        "diff-v2 triton": (2.0, 6.0, 0.02),
        OFFICIAL_FOUR_CALLS: (2.5, tri_fb * t["official"], 0.04),
    }
    if with_hf:
        ms[HF_TWO_CALLS] = (2.0, tri_fb * t["hf"], 0.02)
    return [
        Row("op", n, name, f, fb, f / base_f, fb / base_fb, dec, dec / base_dec, 100.0, 90.0, 64.0 * n / 1024)
        for name, (f, fb, dec) in ms.items()
    ]


@pytest.fixture
def fake_gpu(monkeypatch):
    """CUDA "available" (one GPU), and stubs for everything that would run on it; returns what they were asked."""
    clock = FakeClock()
    asked: dict[str, list] = {"op": [], "train": [], "decode": [], "fsdp": [], "pytest": []}
    state = {"timings": PASSING, "gpus": 1}
    monkeypatch.setattr(gpu_report, "clock", clock)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: state["gpus"])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Stub GPU (a CPU pretending)")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)

    def run_pytest(timeout_s):
        asked["pytest"].append(timeout_s)
        clock.now += 30
        out = (
            "..F.s\nFAILED tests/ops/test_gpu.py::test_x[bf16] - AssertionError\n1 failed, 3 passed, 1 skipped in 30.0s"
        )
        return 1, out

    def run_attention_benchmark(sizes, **kw):
        asked["op"].append((list(sizes), kw))
        (n,) = sizes
        clock.now += 10 * n / 1024  # 16K never fits its section: skipped
        return op_rows(n, state["timings"], with_hf=n != 2048)

    def run_train_step_benchmark(presets, seq_lens, **kw):
        asked["train"].append((presets, seq_lens, kw))
        clock.now += 20
        (n,) = seq_lens
        if n == 4096:
            raise RuntimeError("CUDA error: stub failure\nmore lines")
        ms = {"baseline": 10.0, "diffattn DIFF (auto)": 11.0, "HF DiffLlama": 14.0, "diffattn DIFF V2 (auto)": 12.0}
        return [StepRow(presets[0], n, kw["batch"], ms, kw["dtype"], {k: 100 * v for k, v in ms.items()})]

    per_token: dict[object, float] = {}

    def prepare_decode(column, *, preset, prompt_len, tokens):
        asked["decode"].append(column)
        clock.now += 15
        if column == "HF DiffLlama":
            raise RuntimeError("torch._dynamo: stub graph break")
        factor = state["timings"]["decode_model"] if column == gpu_report.DIFF_V1 else 1.0

        def eager():
            pass

        def graphed():
            pass

        def dynamic():
            pass

        per_token[eager], per_token[graphed], per_token[dynamic] = 0.5 * factor, 0.2 * factor, 0.6 * factor
        graphs = column != "diffattn DIFF V2 (auto)"
        return gpu_report.PreparedDecode(eager, graphed, tokens, 300.0, cuda_graphs=graphs, dynamic=dynamic)

    def run_fsdp_two_process(timeout_s, run):
        asked["fsdp"].append((timeout_s, run))
        clock.now += 20
        results = {"baseline": {"ms": 40.0, "loss": 5.5, "peak_mib": 900.0}}
        results["diffattn DIFF (auto)"] = {"ms": 44.0, "loss": 5.6, "peak_mib": 950.0}
        return {"status": "ran", "results": results}

    monkeypatch.setattr(gpu_report, "_run_pytest", run_pytest)
    monkeypatch.setattr(attention, "run_attention_benchmark", run_attention_benchmark)
    monkeypatch.setattr(train_step, "run_train_step_benchmark", run_train_step_benchmark)
    monkeypatch.setattr(gpu_report, "prepare_decode", prepare_decode)
    monkeypatch.setattr(gpu_report, "ms_per_token", lambda run, tokens: per_token[run])
    monkeypatch.setattr(gpu_report, "run_fsdp_two_process", run_fsdp_two_process)
    return state, asked, clock


def run_main(tmp_path, capsys):
    out = tmp_path / "report"
    assert gpu_report.main(["--out", str(out)]) == 0
    captured = capsys.readouterr()
    md = (out / "gpu-report.md").read_text()
    saved = json.loads((out / "gpu-report.json").read_text())
    assert sorted(p.name for p in out.iterdir()) == ["gpu-report.json", "gpu-report.md"]  # no temporary left
    return captured, md, saved


def results_by_target(saved) -> dict[tuple[str, str], str]:
    return {(c["where"], c["target"].split(" than ")[-1]): c["result"] for c in saved["targets"]}


def test_every_section_on_a_fake_gpu_within_the_budget(fake_gpu, tmp_path, capsys):
    _, asked, clock = fake_gpu
    start = clock.now
    captured, md, saved = run_main(tmp_path, capsys)
    sections = saved["sections"]
    assert saved["status"] == "complete" and set(sections) == set(gpu_report.BUDGET_S)
    assert saved["device"]["name"] == "Stub GPU (a CPU pretending)" and saved["device"]["capability"] == "9.0"
    assert saved["device"]["torch"] == torch.__version__ and saved["device"]["triton"]
    assert clock.now - start <= gpu_report.TOTAL_S and saved["wall_s"] == clock.now - start

    # the gpu tests: one subprocess within the first section's budget, its counts and failing test
    later = sum(s for name, s in gpu_report.BUDGET_S.items() if name != "gpu tests")
    assert sum(gpu_report.BUDGET_S.values()) <= gpu_report.TOTAL_S <= 600
    assert asked["pytest"] == [gpu_report.TOTAL_S - later]
    tests = sections["gpu tests"]
    assert (tests["passed"], tests["failed"], tests["skipped"]) == (3, 1, 1)
    assert tests["failing"] == ["tests/ops/test_gpu.py::test_x[bf16]"]

    # the op benchmark: bf16, the fused kernel, the four- and two-call routes, peak memory, FlashAttention-2 shapes;
    # N = 16K does not fit after 8K (10 s per 1K tokens) and is recorded as skipped, not run
    for sizes, kw in asked["op"]:
        assert (
            kw["dtype"] == torch.bfloat16 and kw["backends"] == ["triton"] and kw["memory"] and kw["device"] == "cuda"
        )
        assert kw["levels"] == ("op",) and kw["batch"] * sizes[0] == 16384 and kw["heads"] * 2 * kw["head_dim"] == 2048
    assert [(s[0], kw["head_dim"]) for s, kw in asked["op"]] == [
        (n, d) for d in (64, 128) for n in (1024, 2048, 4096, 8192)
    ]
    for d in (64, 128):
        part = sections[f"op d={d}"]
        assert part["skipped_sizes"] == [16384] and {r["head_dim"] for r in part["rows"]} == {d}
        assert all(r["fwd_bwd_peak_mib"] > 0 for r in part["rows"])
    assert "Skipped (N), the section's time budget spent: 16384." in md

    # the train step: bf16 with memory; the failing length is reported with its error's first line
    assert [(p, n, kw["dtype"], kw["memory"]) for p, n, kw in asked["train"]] == [
        (("small",), (1024,), "bf16", True),
        (("small",), (4096,), "bf16", True),
    ]
    train = sections["train step"]
    assert [r["seq_len"] for r in train["rows"]] == [1024]
    assert train["errors"] == [{"seq_len": 4096, "error": "RuntimeError: CUDA error: stub failure"}]
    assert "| 1024 | HF DiffLlama | 14.00 | 1.40 | 1400 |" in md

    # decoding: every model prepared, HF DiffLlama's failure recorded, the others timed against the baseline
    assert asked["decode"] == list(train_step.COLUMNS)
    decode = {r["model"]: r for r in sections["decode"]["rows"]}
    assert set(decode) == {"baseline", "diffattn DIFF (auto)", "diffattn DIFF V2 (auto)"}
    assert decode["diffattn DIFF (auto)"]["graph_ratio"] == pytest.approx(PASSING["decode_model"])
    assert decode["baseline"]["graph_ms_per_token"] == 0.2 and decode["baseline"]["eager_ms_per_token"] == 0.5
    assert sections["decode"]["errors"][0]["model"] == "HF DiffLlama"
    assert decode["baseline"]["cuda_graphs"] and not decode["diffattn DIFF V2 (auto)"]["cuda_graphs"]
    assert decode["baseline"]["dynamic_ms_per_token"] == 0.6 and decode["diffattn DIFF V2 (auto)"]["dynamic_ratio"] == 1
    row = "| 2080 | diffattn DIFF V2 (auto) | 0.200 | 1.00 | 0.500 | 1.00 | 0.600 | 1.00 | 300 | no: compiled only"
    assert row in md

    # one GPU: no FSDP2 step run, and the report says so
    assert asked["fsdp"] == [] and sections["fsdp2"]["status"] == "skipped: one GPU"
    assert "skipped: one GPU" in md and "fsdp2: skipped: one GPU" in captured.err

    # the markdown on stdout is the file's; progress on stderr; the JSON holds no NaN (n/a is null)
    assert md in captured.out and "[gpu-report" in captured.err and "op d=64 N=8192" in captured.err
    assert md.startswith("## gpu_report.py — ") and "Stub GPU (a CPU pretending) (sm_90, 1 GPU)" in md
    assert "NaN" not in (tmp_path / "report" / "gpu-report.json").read_text()


def test_targets_pass_and_fail_per_row(fake_gpu, tmp_path, capsys):
    state, _, _ = fake_gpu
    _, md, saved = run_main(tmp_path / "passing", capsys)
    got = results_by_target(saved)
    where = "op d=128 N=4096"
    assert got[(where, "triton fwd <= 1.55x baseline")] == "pass"
    assert got[(where, "triton fwd+bwd <= 1.3x baseline")] == "pass"
    assert got[(where, "triton decode <= 1.5x baseline")] == "pass"
    assert got[(where, OFFICIAL_FOUR_CALLS)] == "pass" and got[(where, HF_TWO_CALLS)] == "pass"
    assert got[("decode small cache 2080", "diffattn DIFF (auto) per token (CUDA graphs) <= 1.5x baseline")] == "pass"
    # at N = 2048 the two-call route is missing: n/a, neither pass nor fail
    assert got[("op d=64 N=2048", HF_TWO_CALLS)] == "n/a" and got[("op d=64 N=2048", OFFICIAL_FOUR_CALLS)] == "pass"
    # every size run and every d has its five checks, plus the decode one
    assert len(saved["targets"]) == 2 * 4 * 5 + 1
    assert {c["result"] for c in saved["targets"]} == {"pass", "n/a"}
    assert "| op d=64 N=1024 | triton fwd <= 1.55x baseline | 1.50× | pass |" in md
    assert f"| op d=64 N=2048 | triton fwd+bwd >= 1.15x faster than {HF_TWO_CALLS} | — | n/a |" in md

    state["timings"] = FAILING
    captured, md, saved = run_main(tmp_path / "failing", capsys)
    missing_route = [c for c in saved["targets"] if c["where"].endswith("N=2048") and HF_TWO_CALLS in c["target"]]
    assert len(missing_route) == 2 and {c["result"] for c in missing_route} == {"n/a"}
    assert {c["result"] for c in saved["targets"] if c not in missing_route} == {"FAIL"}
    by_value = {c["target"]: c["value"] for c in saved["targets"] if c["where"] == "op d=64 N=4096"}
    assert by_value["triton fwd+bwd <= 1.3x baseline"] == pytest.approx(1.35)
    assert by_value[f"triton fwd+bwd >= 1.4x faster than {OFFICIAL_FOUR_CALLS}"] == pytest.approx(1.3)
    assert "target FAIL: op d=64 N=4096: triton fwd <= 1.55x baseline: 1.70×" in captured.err
    assert "gpu-report: targets 0 pass, 39 FAIL, 2 n/a; written to" in captured.out
    assert "| 1.70× | FAIL |" in md


def test_two_gpus_run_the_fsdp2_step(fake_gpu, tmp_path, capsys):
    state, asked, _ = fake_gpu
    state["gpus"] = 2
    _, md, saved = run_main(tmp_path, capsys)
    ((timeout_s, run),) = asked["fsdp"]
    assert run == gpu_report.FsdpStep() and run.device_type == "cuda" and timeout_s > 0
    rows = {r["model"]: r for r in saved["sections"]["fsdp2"]["rows"]}
    assert rows["diffattn DIFF (auto)"]["ratio"] == pytest.approx(1.1) and rows["baseline"]["loss"] == 5.5
    assert (
        "Stub GPU (a CPU pretending) (sm_90, 2 GPUs)" in md
        and "| diffattn DIFF (auto) | 1024 | 4 | 44.00 | 1.10 |" in md
    )


def test_a_section_that_raises_is_recorded_and_the_rest_still_run(fake_gpu, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(gpu_report, "_run_pytest", lambda timeout_s: 1 / 0)
    _, md, saved = run_main(tmp_path, capsys)
    assert saved["sections"]["gpu tests"]["status"] == "error: ZeroDivisionError: division by zero"
    assert saved["status"] == "complete" and saved["sections"]["op d=64"]["rows"]
    assert "error: ZeroDivisionError: division by zero" in md


def test_pytest_summary_read_from_real_pytest_output(tmp_path):
    # the parser against this pytest's own output: a passing, a failing, an erroring and a skipped test
    (tmp_path / "test_sample.py").write_text(
        "import pytest\n"
        "@pytest.fixture\ndef broken():\n    raise RuntimeError\n"
        "def test_ok():\n    pass\n"
        "def test_bad():\n    assert 0\n"
        "def test_err(broken):\n    pass\n"
        "@pytest.mark.skip\ndef test_skip():\n    pass\n"
    )
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    summary = gpu_report.summarise_pytest(done.returncode, done.stdout)
    assert (summary["status"], summary["passed"], summary["failed"], summary["errors"], summary["skipped"]) == (
        "ran", 1, 1, 1, 1,
    )  # fmt: skip
    assert [name.split("::")[-1] for name in summary["failing"]] == ["test_bad", "test_err"]
    # cut off before its summary (the budget's timeout): what the progress line says so far
    progress_only = done.stdout.splitlines()[0]
    timed_out = gpu_report.summarise_pytest(None, progress_only)
    assert timed_out["status"].startswith("timed out") and (timed_out["passed"], timed_out["failed"]) == (1, 1)


def test_without_cuda_one_line_exit_2_nothing_written(tmp_path):
    # the script itself, on this machine's CPU-only torch
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = tmp_path / "report"
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_report.py"), "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and "needs a CUDA device" in done.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_make_gpu_report_runs_the_script():
    done = subprocess.run(["make", "-n", "gpu-report", "OUT=somewhere"], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0 and "OUT=somewhere bash benchmarks/gpu_session.sh" in done.stdout


@pytest.mark.slow
def test_fsdp2_step_on_two_cpu_processes():
    # the ranks' own code, for real, on gloo: both models sharded, a finite step time and loss from rank 0
    run = gpu_report.FsdpStep(device_type="cpu", preset="debug", seq_len=32, batch=2, steps=2)
    done = gpu_report.run_fsdp_two_process(300, run)
    assert done["status"] == "ran" and set(done["results"]) == set(gpu_report.FSDP_COLUMNS)
    for result in done["results"].values():
        assert result["ms"] > 0 and math.isfinite(result["loss"])


def test_op_peak_memory_is_each_calls_own_beyond_what_was_resident(monkeypatch):
    # CUDA's allocator counters stubbed: each call's peak less what was allocated before it, gradients cleared first;
    # out of memory gives NaN, any other error propagates
    mib = 2**20
    memory = {"allocated": 1000 * mib, "peak": 0}
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: memory["allocated"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: memory["peak"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: memory.update(peak=memory["allocated"]))
    leaf = torch.ones(2, requires_grad=True)
    leaf.grad = torch.ones(2)

    def uses_64_mib():
        assert leaf.grad is None
        memory["peak"] = max(memory["peak"], memory["allocated"] + 64 * mib)

    def out_of_memory():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    got = attention._fwd_bwd_peak_mib({"a": uses_64_mib, "oom": out_of_memory, "b": lambda: None}, [leaf])
    assert got["a"] == 64 and math.isnan(got["oom"]) and got["b"] == 0 and leaf.grad is None
    with pytest.raises(RuntimeError, match="shape"):
        attention._fwd_bwd_peak_mib({"bad": lambda: (_ for _ in ()).throw(RuntimeError("shape mismatch"))}, [leaf])


def test_train_step_peak_memory_per_column(monkeypatch):
    # the same counters stubbed: each column's step measured on its own, its model's gradients freed before it
    mib = 2**20
    memory = {"allocated": 500 * mib, "peak": 0}
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: memory["allocated"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: memory["peak"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: memory.update(peak=memory["allocated"]))
    models = {"baseline": torch.nn.Linear(2, 2), "diff": torch.nn.Linear(2, 2)}
    for model in models.values():
        model.weight.grad = torch.ones(2, 2)

    def step_using(name, extra_mib):
        def step():
            assert models[name].weight.grad is None
            memory["peak"] = max(memory["peak"], memory["allocated"] + extra_mib * mib)

        return step

    steps = {"baseline": step_using("baseline", 100), "diff": step_using("diff", 130)}
    assert train_step._step_peak_mib(steps, models) == {"baseline": 100, "diff": 130}


@pytest.mark.parametrize("column", list(train_step.COLUMNS))
def test_decode_steps_run_the_same_positions_again_for_every_model(column):
    # the GPU report's decode loop on this CPU: each run rewinds the static cache to the prompt and decodes the same
    # positions; without the rewind the second run wrote past max_cache_len (the H200's `0 <= tmp7 < 2080`)
    from transformers import StaticCache

    from diffattn.models.build import build_model

    kind, backend = train_step.COLUMNS[column]
    prompt, tokens = 12, 4
    model = build_model("debug", kind, backend=backend, seed=0, max_position_embeddings=prompt + tokens).eval()
    cache = StaticCache(config=model.config, max_cache_len=prompt + tokens)
    ids = torch.randint(0, model.config.vocab_size, (1, prompt), generator=torch.Generator().manual_seed(0))
    _, eager, _, _ = gpu_report.decode_steps(model, cache, ids, tokens)
    first, second = eager(), eager()
    assert len(first) == tokens
    for a, b in zip(first, second, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # and each step is what a model without a cache computes for that prefix and token
    with torch.no_grad():
        full = model(torch.cat([ids, ids[:, -1:]], dim=1)).logits[:, -1]
    torch.testing.assert_close(first[0][:, -1], full, rtol=1e-4, atol=1e-4)
    # against a dynamic cache (generate()'s default) likewise: cropped back to the prompt, the same positions each run,
    # the static cache's logits
    dynamic = gpu_report.dynamic_decoding(model, ids, tokens)
    grown, again = dynamic(), dynamic()
    for a, b, c in zip(grown, again, first, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-4)


def test_sections_runs_only_those_asked_for(fake_gpu, tmp_path, capsys):
    _, asked, _ = fake_gpu
    out = tmp_path / "report"
    assert gpu_report.main(["--out", str(out), "--sections", "decode"]) == 0
    saved = json.loads((out / "gpu-report.json").read_text())
    assert saved["status"] == "complete" and saved["sections"]["decode"]["rows"]
    assert saved["sections"]["op d=64"]["status"] == "not asked for (--sections)"
    assert asked["op"] == [] and asked["pytest"] == []
    with pytest.raises(SystemExit):
        gpu_report.main(["--out", str(out), "--sections", "decode,warp"])
    assert "unknown warp" in capsys.readouterr().err
