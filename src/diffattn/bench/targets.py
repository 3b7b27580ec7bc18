"""The GPU targets of issues 34 (the default route) and 37 (the fused kernel), checked on what one GPU run wrote — the
one home of those numbers, so that "which targets are met, and by how much" is read off a run the same way every time.

A run directory is what ``benchmarks/gpu_session.sh`` writes (``benchmarks/gpu-runs/<gpu>-<date>/`` once committed):

* ``route_table.json`` — the newest entry's ``measurements``: per call class and route, the ratio to the same-size
  SDPA baseline (forward+backward for ``train`` classes, forward for ``infer``), status and correctness; for decode
  classes where measured, CUDA-graph times (``graph_ms``, ``base_graph_ms``);
* ``train.json`` — the `small` train step (``bench train-step``): per row, each column's median ms; read from
  ``train_decided.json`` instead where the run has it: the same step timed again after the step's own decisions were
  written into the table (:mod:`diffattn.bench.switches`), i.e. with what ``auto`` runs from then on;
* ``train_graphed.json`` — the same step with every column's whole step replayed from one CUDA graph
  (``bench train-step --cuda-graphs``): the step's GPU work without the host's launches, read by the step targets'
  rows marked "whole step one CUDA graph" beside the eager ones;
* ``report/gpu-report.json`` — decoding per token in the models (static cache, CUDA graphs).

A target whose number the run lacks is ``n/a`` with why, never a pass. Usage:
``python -m diffattn.bench.targets RUN_DIR`` prints the table; ``--write`` also writes it to ``RUN_DIR/targets.md``
(the GPU script does, for the run it writes; a committed run's ``targets.md`` is the record of its day, read with
that day's targets, and is not rewritten by reading the run again).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from ..ops.routes import known_route
from .attention import TRITON_MAX_RATIO  # issue 37's fused-kernel limits for DIFF V1 at d = 64
from .sweep_records import graph_ratio, is_current
from .train_step import forced_column

#: the fused kernel's routes in a sweep: ``triton`` and its forced tiles and variants (``triton[...]``)
KERNEL = "triton"
#: the train.json columns the step targets read
STEP_COLUMN = {"auto": forced_column("auto"), "hf": "HF DiffLlama", "kernel": forced_column(KERNEL)}
#: the targets that compare with transformers' DiffLlama (a ratio to its time, "below" / "never slower"), not a limit
AGAINST_HF = ("step_vs_hf", "decode_vs_hf")


#: where a step target reads its rows, the first file that has them: the eager step (the one timed again after the
#: step's own decisions first, where a run has both: module docstring), or the step replayed from one CUDA graph
STEP_FILES = ("train_decided.json", "train.json")
GRAPHED_STEP_FILES = ("train_graphed.json",)
#: or each micro-step's forward and backward one CUDA graph, AdamW eager: what ``diffattn pretrain --cuda-graphs`` runs
#: (``bench train-step --cuda-graphs micro``)
MICRO_GRAPHED_STEP_FILES = ("train_graphed_micro.json",)
#: or the step compiled (inductor, mode reduce-overhead: its forward and backward replayed as CUDA graphs, AdamW eager;
#: what ``diffattn pretrain --compile reduce-overhead`` runs)
COMPILED_STEP_FILES = ("train_compiled.json",)
#: the fused kernel's step: its own step's file (the GPU script's `kernelstep`: `triton` forced in a process of its
#: own), else any eager step that has a `triton` column
KERNEL_STEP_FILES = ("train_kernel.json", *STEP_FILES)


@dataclass(frozen=True)
class Target:
    issue: int
    what: str  # the quantity, in the issue's words; :attr:`text` adds the limit
    kind: str  # "route": the best correct route of ``where`` a table may list (routes.known_route: what auto can
    #            run, the fused kernel and its variants among them); "kernel": the best correct triton route of it,
    #            forced tiles included;
    #            "kernel_decode": the same, by CUDA-graph ratio; "step": a train.json column's ratio at every row;
    #            "step_vs_hf": the DIFF (auto) step's time against HF DiffLlama's; "decode_vs_hf": per token
    where: str  # a call class key, or a train.json column key of STEP_COLUMN
    limit: float
    step_files: tuple[str, ...] = STEP_FILES  # the step targets' rows: :data:`STEP_FILES`, :data:`GRAPHED_STEP_FILES`,
    #                                           :data:`MICRO_GRAPHED_STEP_FILES`, :data:`COMPILED_STEP_FILES`,
    #                                           :data:`KERNEL_STEP_FILES`

    @property
    def text(self) -> str:
        return self.what if self.kind in AGAINST_HF else f"{self.what} <= {self.limit}x"


TARGETS = (
    Target(34, "DIFF V1 fwd+bwd at d = 64", "route", "v1 d64 dv128 bf16 causal none train", 1.55),
    Target(34, "DIFF V1 fwd+bwd at d = 128", "route", "v1 d128 dv256 bf16 causal none train", 2.3),
    # DIFF V1 with its heads in interleaved pairs (the layer's layout where the table measured that class faster:
    # routes.pairs_faster): cudnn_shared_v's classes, the same limits
    Target(34, "DIFF V1 fwd+bwd at d = 64, heads in pairs", "route", "v1_pairs d64 dv128 bf16 causal none train",
           1.55),
    Target(34, "DIFF V1 fwd+bwd at d = 128, heads in pairs", "route", "v1_pairs d128 dv256 bf16 causal none train",
           2.3),
    Target(34, "DIFF V2 fwd+bwd at d = 64", "route", "shared_k d64 dv64 bf16 causal none train", 2.3),
    Target(34, "DIFF V2 fwd+bwd at d = 128", "route", "shared_k d128 dv128 bf16 causal none train", 2.3),
    Target(34, "`small` train step (bf16)", "step", "auto", 1.25),
    Target(34, "`small` train step below transformers' DiffLlama", "step_vs_hf", "auto", 1.0),
    # the same two, every column's whole step one CUDA graph (diffattn.cuda_graphs): the eager step is host-bound,
    # and these rows say what the GPU work alone gives; the eager rows above stay the issue's
    Target(34, "`small` train step (bf16), whole step one CUDA graph", "step", "auto", 1.25, GRAPHED_STEP_FILES),
    Target(34, "`small` train step below transformers' DiffLlama, whole step one CUDA graph", "step_vs_hf", "auto",
           1.0, GRAPHED_STEP_FILES),
    Target(34, "`small` train step (bf16), forward and backward one CUDA graph (pretrain --cuda-graphs)", "step",
           "auto", 1.25, MICRO_GRAPHED_STEP_FILES),
    Target(34, "`small` train step below transformers' DiffLlama, forward and backward one CUDA graph (pretrain "
           "--cuda-graphs)", "step_vs_hf", "auto", 1.0, MICRO_GRAPHED_STEP_FILES),
    Target(34, "`small` train step (bf16), compiled (inductor, reduce-overhead)", "step", "auto", 1.25,
           COMPILED_STEP_FILES),
    Target(34, "`small` train step below transformers' DiffLlama, compiled (inductor, reduce-overhead)", "step_vs_hf",
           "auto", 1.0, COMPILED_STEP_FILES),
    Target(34, "decode never slower than the two-call route (DiffLlama)", "decode_vs_hf", "auto", 1.0),
    Target(37, "fused kernel: DIFF V1 fwd at d = 64", "kernel", "v1 d64 dv128 bf16 causal none infer",
           TRITON_MAX_RATIO["fwd_ratio"]),
    Target(37, "fused kernel: DIFF V1 fwd+bwd at d = 64", "kernel", "v1 d64 dv128 bf16 causal none train",
           TRITON_MAX_RATIO["fwd_bwd_ratio"]),
    Target(37, "fused kernel: DIFF V1 fwd+bwd at d = 128", "kernel", "v1 d128 dv256 bf16 causal none train", 1.8),
    Target(37, "fused kernel: DIFF V2 fwd+bwd at d = 64", "kernel", "shared_k d64 dv64 bf16 causal none train", 2.2),
    Target(37, "fused kernel: DIFF V2 fwd+bwd at d = 128", "kernel", "shared_k d128 dv128 bf16 causal none train", 2.2),
    Target(37, "fused kernel: decode per token at an 8K cache", "kernel_decode", "v1 d64 dv128 bf16 causal none decode",
           TRITON_MAX_RATIO["decode_ratio"]),
    Target(37, "fused kernel: `small` train step (bf16) for DIFF V1", "step", "kernel", 1.15, KERNEL_STEP_FILES),
)  # fmt: skip


def _read(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def measurements(run: Path) -> list[dict]:
    """The newest route table entry's measurements in ``run`` (the entry the run's sweep wrote or extended)."""
    table = _read(run / "route_table.json")
    entries = table.get("entries", []) if isinstance(table, dict) else []
    return max(entries, key=lambda e: e.get("date", ""))["measurements"] if entries else []


def _correct(m: dict) -> bool:
    return m.get("status") == "ok" and m.get("correct") is True and math.isfinite(m.get("ratio", math.nan))


#: said beside a figure read from records timed otherwise than the sweep times today (sweep_records.is_current)
OLD_INPUTS = (
    "timed by an earlier protocol (before 2026-11-28 on separate contiguous tensors, not a model's inputs; on "
    "2026-11-28 one call a sample, the host's lead-in included)"
)


def _rows(ms: list[dict], where: str, pick) -> tuple[list[dict], str]:
    """The correct records of class ``where`` whose route ``pick`` takes: those timed as the sweep times today
    (:func:`~diffattn.bench.sweep_records.is_current`) where the run has any (a ratio is not compared across
    protocols), else the older ones, with :data:`OLD_INPUTS` to say so."""
    rows = [m for m in ms if m["class"] == where and pick(m["route"]) and _correct(m)]
    current = [m for m in rows if is_current(m)]
    return (current, "") if current or not rows else (rows, f", {OLD_INPUTS}")


def _best(ms: list[dict], where: str, pick) -> tuple[float, str]:
    rows, said = _rows(ms, where, pick)
    if not rows:
        return math.nan, "not measured in this run's table"
    best = min(rows, key=lambda m: m["ratio"])
    return best["ratio"], f"`{best['route']}`{said}"


def _best_graph(ms: list[dict], where: str) -> tuple[float, str]:
    """:func:`_best` of the kernel's routes by CUDA-graph ratio (:func:`~diffattn.bench.sweep_records.graph_ratio`)
    where measured, else by the eager ratio, said so."""
    rows, said = _rows(ms, where, lambda route: route.startswith(KERNEL))
    graphed = [(graph_ratio(m), m["route"]) for m in rows if graph_ratio(m) is not None]
    if graphed:
        value, route = min(graphed)
        return value, f"`{route}`, CUDA graph{said}"
    value, source = _best(ms, where, lambda r: r.startswith(KERNEL))
    return value, source if math.isnan(value) else f"{source}, eager (no graph time): host time mostly"


def _step_rows(run: Path, files: tuple[str, ...], *columns: str) -> list[dict]:
    """The `small` rows of the first of ``files`` whose rows have all of ``columns`` (the step timed again has the
    default columns only; a forced one is read from train.json)."""
    for name in files:
        data = _read(run / name)
        rows = [r for r in data.get("rows", []) if r.get("preset") == "small"] if isinstance(data, dict) else []
        if any(all(c in (r.get("ms") or {}) for c in columns) for r in rows):
            return rows
    return []


def _step(run: Path, column: str, files: tuple[str, ...] = STEP_FILES) -> tuple[float, str]:
    """The worst (largest) ratio to the baseline over the `small` rows, and each row's, with the ratio of the GPU's
    busy time beside it where the row has one: the eager step is host-bound on an H200 (the baseline's GPU busy 8.6
    of its 40 ms at 1,024 tokens, 2026-11-28), so the wall ratio the target reads is mostly host work"""
    return _step_ratios(run, files, column, "baseline", "x", "", f"no `{column}` column in {files[-1]}")


def _step_vs_hf(run: Path, files: tuple[str, ...] = STEP_FILES) -> tuple[float, str]:
    auto, hf = STEP_COLUMN["auto"], STEP_COLUMN["hf"]
    return _step_ratios(run, files, auto, hf, "", " of DiffLlama's time", f"no {files[-1]}")


def _step_ratios(
    run: Path, files: tuple[str, ...], num: str, den: str, unit: str, what: str, missing: str
) -> tuple[float, str]:
    """The worst ratio of column ``num`` to ``den`` over the `small` rows, and each row's wall ratio with its GPU-busy
    ratio beside it where the row has one (``1.42x at 1024 (GPU busy 1.17x)``); ``missing`` where no row has both."""

    def ratio(r: dict, times: str) -> float | None:  # times "ms": wall time; "gpu_ms": the GPU's busy time
        t = r.get(times) or {}
        return t[num] / t[den] if num in t and t.get(den) else None

    rows = [r for r in _step_rows(run, files, num, den) if ratio(r, "ms") is not None and math.isfinite(ratio(r, "ms"))]
    if not rows:
        return math.nan, missing

    def said(r: dict) -> str:
        busy = ratio(r, "gpu_ms")
        gpu = f" (GPU busy {busy:.2f}{unit})" if busy is not None else ""
        return f"{ratio(r, 'ms'):.2f}{unit}{what} at {r['seq_len']}{gpu}"

    return max(ratio(r, "ms") for r in rows), ", ".join(said(r) for r in rows)


def _decode_vs_hf(run: Path) -> tuple[float, str]:
    report = _read(run / "report" / "gpu-report.json")
    rows = report.get("sections", {}).get("decode", {}).get("rows", []) if isinstance(report, dict) else []
    per_token = {r["model"]: r.get("graph_ms_per_token") for r in rows}
    ours, theirs = per_token.get(STEP_COLUMN["auto"]), per_token.get(STEP_COLUMN["hf"])
    if not ours or not theirs:
        return math.nan, "no decode rows with CUDA-graph times"
    return ours / theirs, f"{ours:.3f} against {theirs:.3f} ms/token (CUDA graphs)"


def check(run: Path) -> list[dict]:
    """Every target of :data:`TARGETS` on the run in ``run``: value, how it was read, and pass / FAIL / n/a."""
    run = Path(run)
    ms = measurements(run)
    out = []
    for t in TARGETS:
        if t.kind == "route":
            value, source = _best(ms, t.where, known_route)  # what auto can run: a fused kernel's variant too
        elif t.kind == "kernel":
            value, source = _best(ms, t.where, lambda r: r.startswith(KERNEL))
        elif t.kind == "kernel_decode":
            value, source = _best_graph(ms, t.where)
        elif t.kind == "step":
            value, source = _step(run, STEP_COLUMN[t.where], t.step_files)
        elif t.kind == "step_vs_hf":
            value, source = _step_vs_hf(run, t.step_files)
        else:
            value, source = _decode_vs_hf(run)
        below = t.kind in AGAINST_HF  # "below" / "never slower": a ratio under (at most) 1
        ok = value < t.limit if t.kind == "step_vs_hf" else value <= t.limit
        result = "n/a" if math.isnan(value) else ("pass" if ok else "FAIL")
        margin = "" if math.isnan(value) or below else f"{value - t.limit:+.2f}x"
        out.append({"issue": t.issue, "target": t.text, "value": value, "limit": t.limit, "source": source,
                    "result": result, "margin": margin})  # fmt: skip
    return out


def to_markdown(checks: list[dict], run: Path) -> str:
    lines = [f"# Issues 34 and 37: targets on {Path(run).name}", "",
             "| issue | target | measured | read from | result |", "|---|---|---|---|---|"]  # fmt: skip
    for c in checks:
        value = (
            "—" if math.isnan(c["value"]) else f"{c['value']:.2f}" + ("" if not c["margin"] else f" ({c['margin']})")
        )
        lines.append(f"| {c['issue']} | {c['target']} | {value} | {c['source']} | {c['result']} |")
    results = [c["result"] for c in checks]
    lines += ["", f"{results.count('pass')} pass, {results.count('FAIL')} FAIL, {results.count('n/a')} n/a"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a GPU run's directory (what benchmarks/gpu_session.sh wrote)")
    parser.add_argument("--write", action="store_true", help="also write the table to RUN/targets.md")
    args = parser.parse_args(argv)
    if not args.run.is_dir():
        print(f"targets: {args.run} is not a directory", file=sys.stderr)
        return 2
    text = to_markdown(check(args.run), args.run)
    print(text, end="")
    if not args.write:
        return 0
    tmp = args.run / "targets.md.tmp"
    tmp.write_text(text)
    tmp.replace(args.run / "targets.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
