"""Every GPU number of the project from one command (``make gpu-report``, ``python benchmarks/gpu_report.py``): on a
CUDA machine, in at most ten minutes, one markdown file (tables ready to paste into ``benchmarks/RESULTS.md``) and one
JSON, both naming the device, written to ``--out`` (default ``benchmarks/gpu-report/``).

Sections, in order, each with a time budget (:data:`BUDGET_S`; time a section leaves unused passes to the later ones).
A part that would overrun its budget is recorded as skipped, never estimated; a part that raises is recorded with
its error and the report goes on:

1. **gpu tests** — ``pytest -m gpu`` in a subprocess, summarised as counts and the failing tests' names.
2. **op** — DIFF attention (DIFF Eq. 1, docs/methods.md §0) through :mod:`diffattn.bench.attention`: bf16, causal,
   d = 64 and 128, N = 1K–16K, forward and forward+backward, interleaved with the same-size baseline (SDPA, i.e.
   FlashAttention), transformers' two-call and the official four-call DIFF routes; decode there is one query against
   N cached keys. Shapes as FlashAttention-2's benchmarks: batch·N = 16K tokens, d_model 2048 (2048/d baseline heads,
   half as many DIFF heads, V of width 2d). The fused ``triton`` backend is the DIFF row the targets are checked on.
3. **train step** — :mod:`diffattn.bench.train_step` in bf16 mixed precision: baseline, DIFF V1, HF DiffLlama, DIFF V2
   (docs/methods.md §5).
4. **decode** — one token at a time against transformers' ``StaticCache``, the step compiled with
   ``torch.compile(mode="reduce-overhead", fullgraph=True)`` so it replays as a CUDA graph (and the same step eager),
   and eagerly against transformers' dynamic cache (what ``generate()`` decodes against by default), bf16 weights, per
   model of the train-step columns.
5. **FSDP2** — a 2-process ``fully_shard`` training step (NCCL, bf16 ``MixedPrecisionPolicy``) for the baseline and
   DIFF V1, only when a second GPU exists; on one GPU the row says "skipped: one GPU".

Peak memory per row: ``torch.cuda.max_memory_allocated`` after a reset — op and train step: beyond what was resident
before the call; decode: the model, its static cache and its peak while prefilling, compiling and decoding.

The targets of the kernel work, checked on every op row of ``diff triton`` and on the decode row of DIFF V1
(:data:`diffattn.bench.attention.TRITON_MAX_RATIO`, issue 37's, / ``TRITON_MIN_SPEEDUP``): forward ≤ 1.55×,
forward+backward ≤ 1.3×, decode ≤ 1.5× the baseline; forward+backward ≥ 1.4× faster than the four-call route and
≥ 1.15× faster than transformers' two calls. Each is printed and written as pass / FAIL (n/a where a number is missing).

Without CUDA: one line on stderr, exit code 2, nothing written.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..ops.routes import error_line
from .route_sweep import finite_json

# .attention and .train_step load transformers (4 s): the functions that use them import them, so that without CUDA
# main says so at once

TOTAL_S = 590.0  # ten minutes, less the writing
#: seconds per section; their sum is at most TOTAL_S
BUDGET_S = {"gpu tests": 120.0, "op d=64": 120.0, "op d=128": 120.0, "train step": 75.0, "decode": 120.0, "fsdp2": 30.0}
OP_SIZES = (1024, 2048, 4096, 8192, 16384)
OP_TOKENS, OP_D_MODEL = 16384, 2048
OP_REPS = 10
TRAIN_PRESET, TRAIN_SEQ_LENS, TRAIN_BATCH, TRAIN_REPS = "small", (1024, 4096), 4, 5
DECODE_PRESET, DECODE_PROMPT, DECODE_TOKENS, DECODE_REPS = "small", 2048, 32, 5
FSDP_PRESET, FSDP_SEQ_LEN, FSDP_BATCH, FSDP_STEPS = "small", 1024, 4, 5
FSDP_COLUMNS = ("baseline", "diffattn DIFF (auto)")
DIFF_V1 = "diffattn DIFF (auto)"  # the decode row the kernel targets apply to
TRITON = "diff triton"
DEFAULT_OUT = Path("benchmarks") / "gpu-report"
REPORT_NAME = "gpu-report"
#: a unit (one size, one model) is started only if the last one, times this, still fits
GROWTH = 2.5

clock: Callable[[], float] = time.monotonic


class Budget:
    """A section's deadline, and whether the next unit of work is expected to fit before it."""

    def __init__(self, deadline: float):
        self.deadline = deadline
        self.last_unit_s = 0.0

    def left(self) -> float:
        return self.deadline - clock()

    def fits_next(self) -> bool:
        return self.left() > 0 and self.last_unit_s * GROWTH <= self.left()

    def timed(self, fn: Callable[[], object]):
        start = clock()
        try:
            return fn()
        finally:
            self.last_unit_s = clock() - start


# ---- 1. the gpu-marked tests -------------------------------------------------------------------------------------


def _tests_dir() -> Path:
    """The checkout's tests (this file is src/diffattn/bench/gpu_report.py in it)."""
    return Path(__file__).resolve().parents[3] / "tests"


def _run_pytest(timeout_s: float) -> tuple[int | None, str]:
    """``pytest -m gpu`` on the checkout's tests: (exit code, output); exit code None when it timed out."""
    tests = _tests_dir()
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "-rfE", str(tests)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=max(timeout_s, 1.0), cwd=tests.parent)
    except subprocess.TimeoutExpired as err:
        out = err.stdout or b""
        return None, out.decode(errors="replace") if isinstance(out, bytes) else out
    return done.returncode, done.stdout + done.stderr


def summarise_pytest(returncode: int | None, output: str) -> dict:
    """Counts from pytest's last summary line and the names of the failing tests; after a timeout (no summary line),
    the counts of the progress characters printed so far (``.`` passed, ``F`` failed, ``E`` error, ``s`` skipped)."""
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0, "deselected": 0}
    summaries = [
        line for line in output.splitlines() if re.search(r"\d+ (passed|failed|skipped|error|deselected)", line)
    ]
    for number, word in re.findall(
        r"(\d+) (passed|failed|skipped|errors?|deselected)", summaries[-1] if summaries else ""
    ):
        counts["errors" if word.startswith("error") else word] = int(number)
    failing = re.findall(r"^(?:FAILED|ERROR) (\S+)", output, flags=re.MULTILINE)
    if not summaries:
        marks = "".join(re.findall(r"^([.FEsxX]+)\s*(?:\[\s*\d+%\])?\s*$", output, flags=re.MULTILINE))
        for mark, key in ((".", "passed"), ("F", "failed"), ("E", "errors"), ("s", "skipped")):
            counts[key] = marks.count(mark)
    if returncode is None:
        status = "timed out (counts: the tests finished by then)"
    elif not summaries:
        status = f"no summary (pytest exit code {returncode})"
    else:
        status = "ran"
    return {"status": status, **counts, "failing": failing}


def run_gpu_tests(budget: Budget, progress) -> dict:
    progress(f"gpu tests: pytest -m gpu (up to {budget.left():.0f} s)")
    tests_dir = _tests_dir()
    if not tests_dir.is_dir():
        return {"status": f"skipped: no tests folder at {tests_dir} (run from a checkout)"}
    summary = summarise_pytest(*_run_pytest(budget.left()))
    progress(
        f"gpu tests: {summary['status']}: {summary['passed']} passed, {summary['failed']} failed, "
        f"{summary['errors']} errors, {summary['skipped']} skipped"
    )
    return summary


# ---- 2. the op benchmark -----------------------------------------------------------------------------------------


def op_shape(n: int, head_dim: int) -> dict:
    """FlashAttention-2's benchmark shapes: batch·N = 16K tokens, d_model 2048; DIFF heads are half the baseline's."""
    return {"batch": max(1, OP_TOKENS // n), "heads": OP_D_MODEL // (2 * head_dim), "head_dim": head_dim}


def measure_op(n: int, head_dim: int) -> list[dict]:
    """One size of the op benchmark in bf16 (``diff triton`` and the other routes, interleaved), peak memory on."""
    from . import attention

    shape = op_shape(n, head_dim)
    rows = attention.run_attention_benchmark(
        [n],
        heads=shape["heads"],
        head_dim=head_dim,
        batch=shape["batch"],
        reps=OP_REPS,
        device="cuda",
        dtype=torch.bfloat16,
        levels=("op",),
        backends=["triton"],
        flex=False,
        memory=True,
    )
    torch.cuda.empty_cache()
    return [{**attention.rows_as_dicts([r])[0], **shape} for r in rows]


def _within_budget(items, budget: Budget, measure: Callable, label: Callable, progress, error_key: str):
    """``measure(item)`` for each item while the section's budget has time for the next one; a failing item is
    recorded with its error's first line and the lent minutes go on to the next. Returns what each item that ran
    measured, the items skipped, and the errors (``{error_key: item, "error": ...}``)."""
    measured, skipped, errors = {}, [], []
    for item in items:
        if not budget.fits_next():
            skipped.append(item)
            continue
        progress(f"{label(item)} ({budget.left():.0f} s left)")
        try:
            measured[item] = budget.timed(lambda item=item: measure(item))
        except Exception as err:
            errors.append({error_key: item, "error": error_line(err)})
            progress(f"{label(item)}: {errors[-1]['error']}")
    return measured, skipped, errors


def run_op_section(head_dim: int, budget: Budget, progress) -> dict:
    measured, skipped, errors = _within_budget(
        OP_SIZES, budget, lambda n: measure_op(n, head_dim), lambda n: f"op d={head_dim} N={n}", progress, "seq_len"
    )
    rows = [row for rows in measured.values() for row in rows]
    if skipped:
        progress(f"op d={head_dim}: budget spent, skipped N = {', '.join(map(str, skipped))}")
    return {"rows": rows, "skipped_sizes": skipped, "errors": errors}


# ---- 3. the training step ----------------------------------------------------------------------------------------


def measure_train_step(seq_len: int) -> list[dict]:
    from . import train_step

    rows = train_step.run_train_step_benchmark(
        (TRAIN_PRESET,), (seq_len,), batch=TRAIN_BATCH, reps=TRAIN_REPS, device="cuda", dtype="bf16", memory=True
    )
    torch.cuda.empty_cache()
    return train_step.rows_as_dicts(rows)


def run_train_section(budget: Budget, progress) -> dict:
    measured, skipped, errors = _within_budget(
        TRAIN_SEQ_LENS,
        budget,
        measure_train_step,
        lambda n: f"train step {TRAIN_PRESET} seq {n} bf16",
        progress,
        "seq_len",
    )
    rows = [row for rows in measured.values() for row in rows]
    return {"rows": rows, "skipped_seq_lens": skipped, "errors": errors}


# ---- 4. decoding per token ---------------------------------------------------------------------------------------


@dataclass
class PreparedDecode:
    """A model's decoding step, ready to time: ``eager()`` and ``graphed()`` each decode ``tokens`` tokens against a
    static cache, ``dynamic()`` (where given) eagerly against transformers' dynamic cache, what ``generate()`` makes by
    default (:func:`dynamic_decoding`); ``cuda_graphs`` False where inductor compiled the step but skipped CUDA graphs
    (it logs why)."""

    eager: Callable[[], None]
    graphed: Callable[[], None]
    tokens: int
    peak_mib: float
    cuda_graphs: bool = True
    dynamic: Callable[[], None] | None = None


def prepare_decode(column: str, *, preset: str, prompt_len: int, tokens: int) -> PreparedDecode:
    """Build ``column``'s model (bf16) with a static cache, prefill ``prompt_len`` tokens, and compile its one-token
    step with ``mode="reduce-overhead"`` (CUDA graphs); warm both runs up (autotuning, compilation, graph recording).
    Each run decodes ``tokens`` tokens at the same cache positions, so every run does the same work."""
    from torch._dynamo.utils import counters
    from transformers import StaticCache

    from ..models.build import build_model
    from . import train_step

    attention_kind, backend = train_step.COLUMNS[column]
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    length = prompt_len + tokens
    model = build_model(
        preset, attention_kind, backend=backend, seed=0, dtype=torch.bfloat16, max_position_embeddings=length
    )
    model = model.to("cuda").eval()
    cache = StaticCache(config=model.config, max_cache_len=length)
    ids = torch.randint(0, model.config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(0))
    step, eager, token, positions = decode_steps(model, cache, ids.to("cuda"), tokens)
    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)

    def graphed():
        rewind_static_cache(cache, prompt_len)
        with torch.no_grad():
            for position in positions:
                torch.compiler.cudagraph_mark_step_begin()
                compiled(token, position)

    eager()
    skips = counters["inductor"]["cudagraph_skips"]
    for _ in range(3):  # cudagraph trees record on the second or third call
        graphed()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - before) / 2**20
    dynamic = dynamic_decoding(model, ids.to("cuda"), tokens)  # after the peak: its cache is not the static one's
    dynamic()
    graphs = counters["inductor"]["cudagraph_skips"] == skips
    return PreparedDecode(eager, graphed, tokens, peak, graphs, dynamic)


def decode_steps(model, cache, ids: torch.Tensor, tokens: int):
    """Prefill ``ids`` into the static ``cache`` and return ``(step, eager, token, positions)``: ``step(token,
    position)`` decodes one token, ``eager()`` decodes ``tokens`` tokens at the same positions every time it runs
    (the cache rewound to the prompt first) and returns their logits."""
    from ..eval.common import cache_keyword

    keyword = cache_keyword(model)
    prompt_len = ids.shape[1]
    token = ids[:, -1:].clone()
    positions = [torch.tensor([prompt_len + i], device=ids.device) for i in range(tokens)]

    def step(tok, position):
        # position_ids, not cache_position: transformers 5.17 and 5.24 take no cache_position; the static cache writes
        # at its own counter, which rewind_static_cache sets back before each run
        return model(tok, use_cache=True, position_ids=position[None], **{keyword: cache}).logits

    def eager():
        rewind_static_cache(cache, prompt_len)
        with torch.no_grad():
            return [step(token, position) for position in positions]

    with torch.no_grad():
        model(ids, use_cache=True, **{keyword: cache})
    return step, eager, token, positions


def dynamic_decoding(model, ids: torch.Tensor, tokens: int) -> Callable[[], list[torch.Tensor]]:
    """Prefill ``ids`` into transformers' dynamic cache — what ``model.generate()`` decodes against by default: it grows
    by a key every token — and return ``run()``, which decodes ``tokens`` tokens after the prompt eagerly, the cache
    cropped back to the prompt first (``crop`` by a negative count of tokens: transformers 5.17 and 5.24), and returns
    their logits. One cache object across runs, as one generation's forwards share one (a memo kept per cache, such as
    DIFF's λ, is then worked out once per prefill, not once per run: one chain in ``tokens`` tokens' time)."""
    from transformers import DynamicCache

    from ..eval.common import cache_keyword

    keyword, cache = cache_keyword(model), DynamicCache(config=model.config)
    prompt_len = ids.shape[1]
    token = ids[:, -1:].clone()
    positions = [torch.tensor([[prompt_len + i]], device=ids.device) for i in range(tokens)]
    with torch.no_grad():
        model(ids, use_cache=True, **{keyword: cache})

    def run():
        cache.crop(prompt_len - cache.get_seq_length())
        with torch.no_grad():
            return [model(token, use_cache=True, position_ids=p, **{keyword: cache}).logits for p in positions]

    return run


def rewind_static_cache(cache, length: int) -> None:
    """Set a ``StaticCache`` back to ``length`` tokens, so the same positions can be decoded again. Its layers count
    the tokens written in a tensor, in place (transformers 5.17 and 5.24: ``cumulative_length``), and write each new
    token there; decoding past ``max_cache_len`` without this indexed out of bounds (the H200 report's
    ``0 <= tmp7 < 2080``; reproduced on CPU with inductor)."""
    for layer in cache.layers:
        counter = getattr(layer, "cumulative_length", None)
        if isinstance(counter, torch.Tensor):
            counter.fill_(length)
        elif counter is not None:
            layer.cumulative_length = length


def ms_per_token(run: Callable[[], None], tokens: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    run()
    torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - start) / tokens


def run_decode_section(budget: Budget, progress) -> dict:
    from . import train_step

    prepared, skipped, errors = _within_budget(
        train_step.COLUMNS,
        budget,
        lambda c: prepare_decode(c, preset=DECODE_PRESET, prompt_len=DECODE_PROMPT, tokens=DECODE_TOKENS),
        lambda c: f"decode {c} ({DECODE_PRESET}, prompt {DECODE_PROMPT}; compiling)",
        progress,
        "model",
    )
    rows = []
    times = {name: {"eager": [], "graph": [], "dynamic": []} for name in prepared}
    for _ in range(DECODE_REPS):  # interleaved round-robin, as the other benchmarks
        for name, p in prepared.items():
            times[name]["eager"].append(ms_per_token(p.eager, p.tokens))
            times[name]["graph"].append(ms_per_token(p.graphed, p.tokens))
            times[name]["dynamic"].append(ms_per_token(p.dynamic, p.tokens) if p.dynamic else math.nan)
    median = {name: {k: statistics.median(v) for k, v in t.items()} for name, t in times.items()}
    base = median.get("baseline", {"eager": math.nan, "graph": math.nan, "dynamic": math.nan})
    for name, m in median.items():
        rows.append(
            {
                "model": name,
                "preset": DECODE_PRESET,
                "cache_len": DECODE_PROMPT + DECODE_TOKENS,
                "eager_ms_per_token": m["eager"],
                "eager_ratio": m["eager"] / base["eager"],
                "graph_ms_per_token": m["graph"],
                "graph_ratio": m["graph"] / base["graph"],
                "dynamic_ms_per_token": m["dynamic"],
                "dynamic_ratio": m["dynamic"] / base["dynamic"],
                "peak_mib": prepared[name].peak_mib,
                "cuda_graphs": prepared[name].cuda_graphs,
            }
        )
    del prepared
    torch.cuda.empty_cache()
    return {"rows": rows, "skipped_models": skipped, "errors": errors}


# ---- 5. a 2-process FSDP2 step -----------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class FsdpStep:
    """What each rank of the 2-process step runs: ``device_type`` "cuda" (NCCL) or "cpu" (gloo)."""

    device_type: str = "cuda"
    preset: str = FSDP_PRESET
    seq_len: int = FSDP_SEQ_LEN
    batch: int = FSDP_BATCH
    steps: int = FSDP_STEPS


def _fsdp_time_column(column: str, run: FsdpStep, rank: int, device: torch.device) -> dict:
    """Shard ``column``'s model with ``fully_shard`` (each decoder layer, then the root; bf16 parameters, fp32 gradient
    reduction), warm up two steps, time ``run.steps``: median ms, last loss, peak memory."""
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from ..models.build import build_model
    from . import train_step

    cuda = device.type == "cuda"
    attention_kind, backend = train_step.COLUMNS[column]
    model = build_model(
        run.preset, attention_kind, backend=backend, seed=0, max_position_embeddings=max(run.seq_len, 1024)
    ).to(device)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(rank)  # each rank its own batch, as data parallelism has it
    ids = torch.randint(0, model.config.vocab_size, (run.batch, run.seq_len), generator=generator).to(device)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss  # no KV cache, as diffattn.train's Trainer
        loss.backward()
        opt.step()
        return loss.detach()

    for _ in range(2):
        step()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(run.steps):
        dist.barrier()
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        loss = step()
        if cuda:
            torch.cuda.synchronize()
        times.append(1e3 * (time.perf_counter() - start))
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else math.nan
    return {"ms": statistics.median(times), "loss": float(loss), "peak_mib": peak}


def fsdp_worker(rank: int, world: int, port: int, result_path: str, run: FsdpStep) -> None:
    """One rank of the 2-process step: every model of :data:`FSDP_COLUMNS` in turn; rank 0 writes the results."""
    import torch.distributed as dist

    from ..files import write_text_atomic

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cuda = run.device_type == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    try:
        results = {column: _fsdp_time_column(column, run, rank, device) for column in FSDP_COLUMNS}
        if rank == 0:
            write_text_atomic(result_path, json.dumps(results))
    finally:
        dist.destroy_process_group()


def run_fsdp_two_process(timeout_s: float, run: FsdpStep = FsdpStep()) -> dict:
    """Spawn two :func:`fsdp_worker` ranks: ``{"status": "ran", "results": ...}``, or a timeout (a rank that fails
    raises here)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "fsdp.json"
        context = mp.start_processes(
            fsdp_worker, args=(2, _free_port(), str(result), run), nprocs=2, join=False, start_method="spawn"
        )
        deadline = clock() + timeout_s
        while not context.join(timeout=1.0):
            if clock() > deadline:
                for process in context.processes:
                    process.terminate()
                return {"status": f"timed out after {timeout_s:.0f} s"}
        return {"status": "ran", "results": json.loads(result.read_text())}


def run_fsdp_section(budget: Budget, progress) -> dict:
    count = torch.cuda.device_count()
    if count < 2:
        progress("fsdp2: skipped: one GPU")
        return {"status": "skipped: one GPU", "rows": []}
    progress(f"fsdp2: 2 processes on {count} GPUs ({budget.left():.0f} s left)")
    try:
        done = run_fsdp_two_process(budget.left(), FsdpStep())
    except Exception as err:
        return {"status": f"error: {error_line(err)}", "rows": []}
    results = done.pop("results", {})
    base = results.get("baseline", {}).get("ms", math.nan)
    rows = [
        {"model": name, "preset": FSDP_PRESET, "seq_len": FSDP_SEQ_LEN, "batch_per_rank": FSDP_BATCH, **r,
         "ratio": r["ms"] / base}
        for name, r in results.items()
    ]  # fmt: skip
    return {**done, "rows": rows}


# ---- the targets -------------------------------------------------------------------------------------------------


def _verdict(value: float, ok: bool) -> str:
    return "n/a" if value is None or math.isnan(value) else ("pass" if ok else "FAIL")


def check_targets(report: dict) -> list[dict]:
    """The kernel targets on every ``diff triton`` op row (against the baseline and the other DIFF routes at the same
    size and d) and on DIFF V1's decode row."""
    from . import attention

    checks = []
    for section in ("op d=64", "op d=128"):
        rows = report["sections"].get(section, {}).get("rows", [])
        for key in sorted({(r["head_dim"], r["seq_len"]) for r in rows}):
            at = {r["impl"]: r for r in rows if (r["head_dim"], r["seq_len"]) == key}
            tri = at.get(TRITON)
            if tri is None:
                continue
            where = f"op d={key[0]} N={key[1]}"
            for field, limit in attention.TRITON_MAX_RATIO.items():
                value = tri[field]
                label = field.removesuffix("_ratio").replace("_", "+")
                checks.append(
                    {"where": where, "target": f"triton {label} <= {limit}x baseline", "value": value,
                     "result": _verdict(value, value <= limit)}
                )  # fmt: skip
            for route, need in attention.TRITON_MIN_SPEEDUP.items():
                other = at.get(route)
                value = other["fwd_bwd_ms"] / tri["fwd_bwd_ms"] if other is not None else math.nan
                checks.append(
                    {"where": where, "target": f"triton fwd+bwd >= {need}x faster than {route}", "value": value,
                     "result": _verdict(value, value >= need)}
                )  # fmt: skip
    limit = attention.TRITON_MAX_RATIO["decode_ratio"]
    for row in report["sections"].get("decode", {}).get("rows", []):
        if row["model"] == DIFF_V1:
            value = row["graph_ratio"]
            checks.append(
                {"where": f"decode {row['preset']} cache {row['cache_len']}",
                 "target": f"{DIFF_V1} per token (CUDA graphs) <= {limit}x baseline", "value": value,
                 "result": _verdict(value, value <= limit)}
            )  # fmt: skip
    return checks


# ---- writing -----------------------------------------------------------------------------------------------------


def _num(x, fmt: str) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _times(x) -> str:
    """A ratio or speedup as ``1.23×``; a dash where it is missing."""
    return _num(x, ".2f") + ("×" if _num(x, ".2f") != "—" else "")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def _op_markdown(part: dict) -> list[str]:
    return _table(
        ["N", "batch", "implementation", "fwd ms", "× base", "fwd+bwd ms", "× base", "decode ms", "× base",
         "TFLOP/s fwd", "TFLOP/s fwd+bwd", "fwd+bwd peak MiB"],
        [[str(r["seq_len"]), str(r["batch"]), r["impl"], _num(r["fwd_ms"], ".3f"), _num(r["fwd_ratio"], ".2f"),
          _num(r["fwd_bwd_ms"], ".3f"), _num(r["fwd_bwd_ratio"], ".2f"), _num(r["decode_ms"], ".4f"),
          _num(r["decode_ratio"], ".2f"), _num(r["fwd_tflops"], ".1f"), _num(r["fwd_bwd_tflops"], ".1f"),
          _num(r["fwd_bwd_peak_mib"], ".0f")] for r in part["rows"]],
    ) + _notes(part, "skipped_sizes", "N")  # fmt: skip


def _train_markdown(part: dict) -> list[str]:
    rows = [
        [str(r["seq_len"]), column, _num(ms, ".2f"), _num(ms / r["ms"]["baseline"], ".2f"),
         _num(r["peak_mib"].get(column, math.nan), ".0f")]
        for r in part["rows"] for column, ms in r["ms"].items()
    ]  # fmt: skip
    return _table(["seq", "model", "step ms", "× base", "step peak MiB"], rows) + _notes(
        part, "skipped_seq_lens", "seq"
    )


def _decode_markdown(part: dict) -> list[str]:
    return _table(
        ["cache", "model", "CUDA graph ms/token", "× base", "eager ms/token", "× base", "eager, dynamic cache",
         "× base", "peak MiB", "graphs replayed"],
        [[str(r["cache_len"]), r["model"], _num(r["graph_ms_per_token"], ".3f"), _num(r["graph_ratio"], ".2f"),
          _num(r["eager_ms_per_token"], ".3f"), _num(r["eager_ratio"], ".2f"),
          _num(r.get("dynamic_ms_per_token"), ".3f"), _num(r.get("dynamic_ratio"), ".2f"), _num(r["peak_mib"], ".0f"),
          "yes" if r["cuda_graphs"] else "no: compiled only (inductor skipped graphs)"] for r in part["rows"]],
    ) + _notes(part, "skipped_models", "model")  # fmt: skip


def _fsdp_markdown(part: dict) -> list[str]:
    return [*_table(
        ["model", "seq", "batch per rank", "step ms", "× base", "loss", "peak MiB (rank 0)"],
        [[r["model"], str(r["seq_len"]), str(r["batch_per_rank"]), _num(r["ms"], ".2f"), _num(r["ratio"], ".2f"),
          _num(r["loss"], ".4f"), _num(r["peak_mib"], ".0f")] for r in part["rows"]],
    ), ""]  # fmt: skip


def _tests_markdown(part: dict) -> list[str]:
    line = (
        f"{part['passed']} passed, {part['failed']} failed, {part['errors']} errors, {part['skipped']} skipped"
        if "passed" in part
        else ""
    )
    return [line, *(f"- failing: `{name}`" for name in part.get("failing", [])), ""]


def _headings() -> dict[str, tuple[str, Callable[[dict], list[str]]]]:
    op = f"op, bf16, causal, batch·N = {OP_TOKENS}, d_model {OP_D_MODEL}"
    return {
        "gpu tests": ("`pytest -m gpu`", _tests_markdown),
        "op d=64": (f"{op}, d = 64", _op_markdown),
        "op d=128": (f"{op}, d = 128", _op_markdown),
        "train step": (
            f"train step, bf16 mixed precision, preset {TRAIN_PRESET}, batch {TRAIN_BATCH}",
            _train_markdown,
        ),
        "decode": (
            f"decode per token, bf16 weights, static cache (and eagerly a dynamic one), preset {DECODE_PRESET}, "
            "batch 1",
            _decode_markdown,
        ),
        "fsdp2": (f"FSDP2 step, 2 processes, preset {FSDP_PRESET}, bf16 parameters, fp32 reduction", _fsdp_markdown),
    }


def to_markdown(report: dict) -> str:
    """The report as markdown: a heading naming the device, one table per section, then the targets."""
    dev = report["device"]
    plural = "s" if dev["count"] != 1 else ""
    out = [
        f"## gpu_report.py — {report['date']}, {dev['name']} (sm_{dev['capability'].replace('.', '')}, "
        f"{dev['count']} GPU{plural}), torch {dev['torch']}, triton {dev['triton']}, "
        f"transformers {dev['transformers']}, CUDA {dev['cuda']}",
        "",
        f"`make gpu-report`: {report['status']}, {report['wall_s']:.0f} s. Ratios are to the baseline measured in the "
        "same run; peak MiB from `torch.cuda.max_memory_allocated` (what each counts: diffattn/bench/gpu_report.py).",
        "",
    ]
    for name, (heading, render) in _headings().items():
        part = report["sections"][name]
        out += [f"### {heading}", ""]
        status = part.get("status", "ran")
        if status != "ran":
            out += [f"{status}", ""]
        if part.get("rows") or "passed" in part:
            out += render(part)
    out += ["### targets", ""]
    out += _table(
        ["where", "target", "measured", "result"],
        [[c["where"], c["target"], _times(c["value"]), c["result"]] for c in report["targets"]],
    )
    return "\n".join(out) + "\n"


def _notes(part: dict, skipped_key: str, what: str) -> list[str]:
    notes = [""]
    if part.get(skipped_key):
        notes.append(f"Skipped ({what}), the section's time budget spent: {', '.join(map(str, part[skipped_key]))}.")
    for e in part.get("errors", []):
        notes.append(f"Failed: {', '.join(f'{k} {v}' for k, v in e.items() if k != 'error')}: {e['error']}")
    if len(notes) > 1:
        notes.append("")
    return notes


def write_report(report: dict, out: Path) -> tuple[Path, Path]:
    """``gpu-report.md`` and ``gpu-report.json`` in ``out``, each through a temporary file and a rename."""
    from ..files import write_text_atomic

    out.mkdir(parents=True, exist_ok=True)
    md = write_text_atomic(out / f"{REPORT_NAME}.md", to_markdown(report))
    js = write_text_atomic(out / f"{REPORT_NAME}.json", json.dumps(finite_json(report), indent=2) + "\n")
    return md, js


def device_info() -> dict:
    import transformers

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    major, minor = torch.cuda.get_device_capability()
    return {
        "name": torch.cuda.get_device_name(),
        "capability": f"{major}.{minor}",
        "count": torch.cuda.device_count(),
        "torch": torch.__version__,
        "triton": triton_version,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
    }


SECTIONS: dict[str, Callable[[Budget, Callable[[str], None]], dict]] = {
    "gpu tests": run_gpu_tests,
    "op d=64": lambda budget, progress: run_op_section(64, budget, progress),
    "op d=128": lambda budget, progress: run_op_section(128, budget, progress),
    "train step": run_train_section,
    "decode": run_decode_section,
    "fsdp2": run_fsdp_section,
}


def run_report(out: Path, progress: Callable[[str], None], only: list[str] | None = None) -> dict:
    """Every section (or those of ``only``) within its budget; the files are rewritten after each one, so a machine
    taken back mid-run leaves the sections done so far."""
    start = clock()
    report = {
        "date": datetime.date.today().isoformat(),
        "device": device_info(),
        "budget_s": dict(BUDGET_S),
        "status": "partial",
        "wall_s": 0.0,
        "sections": {name: {"status": "not run yet"} for name in SECTIONS},
        "targets": [],
    }
    dev = report["device"]
    progress(f"GPU report on {dev['name']} (sm_{dev['capability'].replace('.', '')}); into {out}")
    names = [n for n in SECTIONS if only is None or n in only]
    for name in set(SECTIONS) - set(names):
        report["sections"][name] = {"status": "not asked for (--sections)"}
    for i, name in enumerate(names):
        later = sum(BUDGET_S[n] for n in names[i + 1 :])
        budget = Budget(start + TOTAL_S - later)
        section_start = clock()
        try:
            report["sections"][name] = SECTIONS[name](budget, progress)
        except Exception as err:  # one section's failure must not cost the others
            report["sections"][name] = {"status": f"error: {error_line(err)}", "rows": []}
            progress(f"{name}: {report['sections'][name]['status']}")
        report["sections"][name]["wall_s"] = clock() - section_start
        report["targets"] = check_targets(report)
        report["wall_s"] = clock() - start
        report["status"] = "complete" if i == len(names) - 1 else f"partial: {i + 1} of {len(names)} sections"
        write_report(report, out)
    for c in report["targets"]:
        progress(f"target {c['result']:>4}: {c['where']}: {c['target']}: {_times(c['value'])}")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    parser.add_argument("--sections", help=f"comma-separated subset of: {', '.join(SECTIONS)} (default: all)")
    args = parser.parse_args(argv)
    only = None
    if args.sections:
        only = [s.strip() for s in args.sections.split(",") if s.strip()]
        unknown = [s for s in only if s not in SECTIONS]
        if unknown:
            parser.error(f"--sections: unknown {', '.join(unknown)}; known: {', '.join(SECTIONS)}")
    if not torch.cuda.is_available():
        print(
            f"gpu-report: needs a CUDA device, and torch {torch.__version__} sees none here; nothing written",
            file=sys.stderr,
        )
        return 2

    def progress(message: str) -> None:
        print(f"[gpu-report {clock() - started:5.0f} s] {message}", file=sys.stderr, flush=True)

    started = clock()
    report = run_report(args.out, progress, only)
    print(to_markdown(report))
    results = [c["result"] for c in report["targets"]]
    print(
        f"gpu-report: targets {results.count('pass')} pass, {results.count('FAIL')} FAIL, {results.count('n/a')} n/a; "
        f"written to {args.out / REPORT_NAME}.md and .json"
    )
    return 0
