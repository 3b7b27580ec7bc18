"""What a GPU run's `small` training step (and its kernels step) decides in the route table — the one home of those
rules: the kernel switches (:data:`diffattn.ops.routes.TABLE_FLAGS`) and the first route of the class the step's
attention calls are in where that class is a small one (:data:`diffattn.ops.routes.SMALL_WORK`).

Why the step, not the route sweep: two of the switches move the DIFF layer's element-wise work into Triton kernels
(``fused_head_norm`` the head norm into the epilogue's kernel, ``fused_lambda`` each layer's λ by kernels of its own,
against every layer's at once by PyTorch's ops), and a small call's route differs from another mostly in host work
and launches. Those decide a small model's step, which is
host-bound on the H200 (2026-11-28: the baseline's GPU busy 8.6 ms of its 40) — and the sweep times a route's call
without the head norm the DIFF layer hands the op with it, which an epilogue route takes into its kernel where the
switch is on. ``benchmarks/gpu_session.sh`` times the step with routes and switches forced beside ``auto``
(``train.json``'s columns ``diffattn DIFF (<backend>)``, ``…+norm``, ``…+norm+lambda``), every column in the same
interleaved repetitions.

The evidence, per row (length) and pair of columns: the median of the per-repetition ratios with its 95% bootstrap
interval (:func:`diffattn.bench.paired_ratio` of :attr:`~diffattn.bench.train_step.StepRow.samples_ms`) — *faster*
where the interval lies wholly below 1, *slower* where wholly above — and the GPU busy time of one profiled step,
which may be at most :data:`GPU_SLACK` times the other's.

* **A switch whose gain is the GPU's work** (:data:`CALL_PAIRS`: ``fused_v_copies``, [V; V] by its kernels) is
  decided on one call at the sweep's standard shape instead, from ``kernels.json`` (:func:`decide_calls`). (DIFF V1's
  heads in interleaved pairs change the call's class: the layer reads the sweep's two classes itself,
  :func:`diffattn.ops.routes.pairs_faster`.)
* **A switch** (:data:`PAIRS`: the switched column against its plain twin) is **on** where it was faster at some
  length and slower at none, within the GPU slack everywhere; **off** where it was slower at some length or over the
  slack; **undecided** otherwise — inconclusive, a column missing, or a run without per-repetition times — and left
  as the table has it (absent: off). Inconclusive is not on: what runs by default is what measured faster.
* **The small class's first route** (:func:`first_routes`): at each row whose DIFF calls are a small class, every
  route forced as a column against the class's first route in the run's entry, each as it runs under the decided
  switches (an epilogue route's ``+norm`` column where ``fused_head_norm`` is on, its plain one otherwise); of those
  faster than it within the GPU slack, the fastest goes first. Only a route the sweep checked correct for the class
  (listed for it, or for the class at the standard size) is taken. The same for DIFF V2's calls (``shared_k``), from
  the columns forced in its model (``diffattn DIFF V2 (<route>)``: ``--backends v2:<route>``), which take no switch.

Usage: ``python -m diffattn.bench.switches RUN_DIR [--write]`` prints each decision and why; ``--write`` puts them into
the newest entry of ``RUN_DIR/route_table.json`` (the run's own, which its sweep wrote), by a temporary file and a
rename.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from . import paired_ratio
from .train_step import FORCED_MODELS, forced_backend, forced_column, split_fused

#: per switch, the (switched, plain) column pairs of train.json that decide it
PAIRS: dict[str, tuple[tuple[str, str], ...]] = {
    "fused_head_norm": ((forced_column("cudnn+epilogue+norm"), forced_column("cudnn+epilogue")),),
    "fused_lambda": ((forced_column("auto+norm+lambda"), forced_column("auto+norm")),),
}
#: how much more GPU busy time a column may take and still count as no slower (one profiled step each: the same
#: kernels' times vary by about that between steps)
GPU_SLACK = 1.02
#: per switch decided on one call rather than the step, its (call class, switched route, plain route) of kernels.json
#: (:mod:`diffattn.bench.call_kernels`): a switch whose gain is the GPU's work at the sweep's standard shape — [V; V]
#: under the table's routes of DIFF V1 at d = 64 and d = 128
CALL_PAIRS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "fused_v_copies": (
        ("v1 d64 dv128 bf16 causal none train", "cudnn+epilogue+vcopies", "cudnn+epilogue"),
        ("v1 d128 dv256 bf16 causal none train", "sdpa_split+epilogue+vcopies", "sdpa_split+epilogue"),
        ("v1 d128 dv256 bf16 causal none train", "cudnn+epilogue+vcopies", "cudnn+epilogue"),
    ),
}


@dataclass(frozen=True)
class Decision:
    on: bool | None  # None: undecided
    why: str
    route: str | None = None  # a first-route decision that is on: the route it puts first


@dataclass(frozen=True)
class Comparison:
    """Column ``new`` against column ``old`` in one row: the paired ratio of wall times with its interval, and the
    ratio of GPU busy times (None where either was not profiled)."""

    at: str
    new: str
    old: str
    ratio: float
    low: float
    high: float
    gpu_ratio: float | None

    @property
    def faster(self) -> bool:
        return self.high < 1 and not self.over_slack

    @property
    def slower(self) -> bool:
        return self.low > 1 or self.over_slack

    @property
    def over_slack(self) -> bool:
        return self.gpu_ratio is not None and self.gpu_ratio > GPU_SLACK

    def line(self) -> str:
        gpu = f", {self.gpu_ratio:.3f}x by GPU busy time" if self.gpu_ratio is not None else ""
        return f"{self.at}: {self.new} {self.ratio:.3f}x [{self.low:.3f}, {self.high:.3f}] {self.old} by wall time{gpu}"


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def compare(row: dict, new: str, old: str) -> Comparison | str:
    """Column ``new`` against ``old`` in a train.json row, or why they cannot be compared."""
    at = f"{row.get('preset')} at {row.get('seq_len')} tokens"
    samples = row.get("samples_ms") or {}
    a, b = samples.get(new), samples.get(old)
    if not (a and b and len(a) == len(b) and all(_finite(x) and x > 0 for x in (*a, *b))):
        what = "no per-repetition times" if not samples else f"no times for both {new} and {old}"
        return f"{at}: {what}"
    gpu = row.get("gpu_ms") or {}
    profiled = _finite(gpu.get(new)) and _finite(gpu.get(old)) and gpu[old] > 0
    return Comparison(at, new, old, *paired_ratio(a, b), gpu[new] / gpu[old] if profiled else None)


def decide(rows: list[dict]) -> dict[str, Decision]:
    """Each switch's decision from train.json's rows (module docstring)."""
    return {flag: _decide(rows, pairs) for flag, pairs in PAIRS.items()}


def _decide(rows: list[dict], pairs: tuple[tuple[str, str], ...]) -> Decision:
    if not rows:
        return Decision(None, "train.json has no rows")
    said, faster = [], False
    for row in rows:
        for switched, plain in pairs:
            found = compare(row, switched, plain)
            if isinstance(found, str):
                return Decision(None, found)
            if found.slower:
                return Decision(False, found.line())
            faster = faster or found.faster
            said.append(found.line())
    if not faster:
        return Decision(None, "inconclusive (faster at no length): " + "; ".join(said))
    return Decision(True, "; ".join(said))


def decide_calls(results: list[dict]) -> dict[str, Decision]:
    """Each switch of :data:`CALL_PAIRS` from kernels.json's results, pair by pair: a pair is *faster* where the
    switched route's GPU busy time per call (the mean of the profiled calls: steady to about 1%) is below the plain
    route's by more than :data:`GPU_SLACK` and its wall time (median of interleaved rounds) at most that much above;
    *slower* where either is above by more than that. **On** where some pair was faster and none slower; **off** where
    one was slower; undecided otherwise — inconclusive, or a pair's columns missing (a class the run did not reach)."""
    out = {}
    for flag, pairs in CALL_PAIRS.items():
        said, faster, slower, missing = [], False, None, []
        for cls, switched, plain in pairs:
            columns = next((r.get("columns", {}) for r in results if r.get("class") == cls), {})
            a, b = columns.get(switched, {}), columns.get(plain, {})
            if not all(_finite(c.get(k)) and c[k] > 0 for c in (a, b) for k in ("ms", "gpu_ms")):
                missing.append(f"no profiled times for both {switched} and {plain} in {cls}")
                continue
            wall, gpu = a["ms"] / b["ms"], a["gpu_ms"] / b["gpu_ms"]
            line = f"{cls}: {switched} {gpu:.3f}x {plain} by GPU busy time, {wall:.3f}x by wall time"
            if gpu > GPU_SLACK or wall > GPU_SLACK:
                slower = slower or line
            faster = faster or gpu * GPU_SLACK < 1
            said.append(line)
        if slower:
            out[flag] = Decision(False, slower)
        elif missing:
            out[flag] = Decision(None, "kernels.json: " + "; ".join(missing))
        elif faster:
            out[flag] = Decision(True, "; ".join(said))
        else:
            out[flag] = Decision(None, "inconclusive: " + "; ".join(said))
    return out


def step_call_class(row: dict, arch: str = "diff") -> str:
    """The route table's class of a DIFF model's attention calls in a train.json row (its preset, length, batch and
    dtype): :func:`diffattn.ops.routes.call_class` of the inputs the layer hands the op, built on the meta device —
    DIFF V1's (``arch`` "diff"): both maps' query heads stacked, ``num_attention_heads`` of them, V twice as wide as Q
    (:mod:`diffattn.models.diff_llama`); DIFF V2's ("diff-v2"): ``num_attention_heads`` query heads per map over one K
    and V as wide as Q (:mod:`diffattn.models.diff_v2`)."""
    import torch

    from ..models.build import model_config
    from ..ops import routes, validate
    from .train_step import DTYPES

    config = model_config(row["preset"], arch)
    b, n, d = row["batch"], row["seq_len"], config.head_dim
    v2 = arch == "diff-v2"
    h, hkv = (config.num_attention_heads, config.num_key_value_heads) if v2 else (
        config.num_attention_heads // 2, config.num_key_value_heads // 2)  # fmt: skip
    dtype = DTYPES[row.get("dtype", "bf16")] or torch.float32
    q1, q2 = (torch.empty(b, h, n, d, device="meta", dtype=dtype) for _ in range(2))
    k1 = torch.empty(b, hkv, n, d, device="meta", dtype=dtype)
    k2 = k1 if v2 else torch.empty(b, hkv, n, d, device="meta", dtype=dtype)  # DIFF V2's maps share K; V1's do not
    v = torch.empty(b, hkv, n, d if v2 else 2 * d, device="meta", dtype=dtype)
    inp = validate(q1, k1, q2, k2, v, 0.5, causal=True, attn_mask=None, scale=None)
    return routes.call_class(inp, grad=True)


def _column_of(route: str, norm_on: bool, columns: set[str], arch: str = "diff") -> str | None:
    """The forced column that shows how ``route`` runs under the decided norm switch, where the step has it (DIFF V2's
    model takes no switch)."""
    from ..ops.routes import runs_epilogue

    if arch != "diff":
        name = forced_column(FORCED_MODELS[arch][0] + route)
    else:
        name = forced_column(route + "+norm") if norm_on and runs_epilogue(route) else forced_column(route)
    return name if name in columns else None


def _forced_route(column: str, arch: str) -> str | None:
    """The route a forced column of ``arch``'s model runs (its switch suffixes left off), or None: not one."""
    forced = forced_backend(column)
    return split_fused(forced[1])[0] if forced is not None and forced[0] == arch else None


def first_routes(rows: list[dict], entry: dict, norm_on: bool) -> dict[str, Decision]:
    """Per small class the step's rows fall into, the route to put first in ``entry`` (``on``: move it; None: leave
    the class as it is, with why) — module docstring. ``norm_on``: the ``fused_head_norm`` switch as decided."""
    from ..ops.routes import SMALL, checked_routes, step_first_order, without_size

    out: dict[str, Decision] = {}
    for row, arch in ((row, arch) for row in rows for arch in FORCED_MODELS):
        try:
            cls = step_call_class(row, arch)
        except (KeyError, ValueError) as err:
            out[f"{row.get('preset')} at {row.get('seq_len')} ({arch})"] = Decision(None, f"no call class: {err}")
            continue
        if not cls.endswith(SMALL) or cls in out:
            continue
        listed = entry.get("routes", {})
        order = listed.get(cls) or listed.get(without_size(cls))
        if not order:
            out[cls] = Decision(None, f"the entry lists no routes for {cls}")
            continue
        order = step_first_order(entry, cls, order)  # what auto runs first for the class now
        columns = set(row.get("samples_ms") or {})
        first = _column_of(order[0], norm_on, columns, arch)
        if first is None:
            out[cls] = Decision(None, f"the step forced no column that runs {order[0]}, the class's first route")
            continue
        checked = checked_routes(entry, cls)
        candidates = []
        for column in sorted(columns):
            route = _forced_route(column, arch)
            # a forced route as it runs under the decided switches (λ's kernel forced too is λ's switch, not the route)
            if route in checked and route != order[0] and _column_of(route, norm_on, columns, arch) == column:
                found = compare(row, column, first)
                if isinstance(found, Comparison) and found.faster:
                    candidates.append((found.ratio, route, found))
        if not candidates:
            out[cls] = Decision(None, f"no route forced in the step was faster than {order[0]}")
            continue
        _, route, found = min(candidates)
        out[cls] = Decision(True, f"{route} first: {found.line()}", route)
    return out


def write_decisions(table_path: Path, decisions: dict[str, Decision], firsts: dict[str, Decision]) -> dict:
    """The decided switches and first routes (:data:`diffattn.ops.routes.STEP_FIRST`) put into the newest entry of the
    table at ``table_path`` (rewritten through a temporary file); that entry returned. ValueError where the newest
    date is not one entry's alone."""
    from ..files import write_text_atomic
    from ..ops.routes import STEP_FIRST, check_table
    from .route_sweep import finite_json

    data = json.loads(table_path.read_text())
    mine = _runs_entry(check_table(data), table_path)
    for flag, decision in decisions.items():
        if decision.on is not None:
            mine[flag] = decision.on
    chosen = {cls: decision.route for cls, decision in firsts.items() if decision.on}
    if chosen:
        mine[STEP_FIRST] = {**mine.get(STEP_FIRST, {}), **chosen}
    check_table(data)
    write_text_atomic(table_path, json.dumps(finite_json(data), indent=1) + "\n")
    return mine


def _runs_entry(entries: list[dict], table_path: Path) -> dict:
    if not entries:
        raise ValueError(f"{table_path} has no entry")
    newest = max(e["date"] for e in entries)
    mine = [e for e in entries if e["date"] == newest]
    if len(mine) != 1:
        raise ValueError(f"{table_path}: {len(mine)} entries of the newest date {newest}; which is this run's?")
    return mine[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a GPU run's directory (train.json, route_table.json)")
    parser.add_argument("--write", action="store_true", help="put the decisions into the run's route table")
    args = parser.parse_args(argv)
    try:
        rows = json.loads((args.run / "train.json").read_text())["rows"]
    except (OSError, ValueError, KeyError) as err:
        print(f"switches: cannot read {args.run / 'train.json'}: {err}", file=sys.stderr)
        return 2
    decisions = decide(rows)
    try:  # the switches decided on one call: from the kernels step, where the run has it
        decisions |= decide_calls(json.loads((args.run / "kernels.json").read_text()))
    except (OSError, ValueError) as err:
        decisions |= {flag: Decision(None, f"no kernels.json: {err}") for flag in CALL_PAIRS}
    for flag, decision in decisions.items():
        state = {True: "on", False: "off", None: "undecided"}[decision.on]
        print(f"{flag}: {state} — {decision.why}")
    table_path = args.run / "route_table.json"
    try:
        from ..ops.routes import check_table

        entry = _runs_entry(check_table(json.loads(table_path.read_text())), table_path)
    except (OSError, ValueError) as err:
        print(f"switches: no route table entry to order: {err}", file=sys.stderr)
        return 2 if args.write else 0
    firsts = first_routes(rows, entry, decisions["fused_head_norm"].on is True)
    for cls, decision in firsts.items():
        print(f"{cls}: {'moved: ' if decision.on else 'as it is — '}{decision.why}")
    if args.write:
        try:
            write_decisions(table_path, decisions, firsts)
        except (OSError, ValueError) as err:
            print(f"switches: not written: {err}", file=sys.stderr)
            return 2
        print(f"decisions written to {table_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
