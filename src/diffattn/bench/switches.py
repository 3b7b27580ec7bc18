"""The route table's kernel switches (:data:`diffattn.ops.routes.TABLE_FLAGS`) decided from one GPU run's `small`
training step — the one home of that rule, so that a switch is on only where a step measured it faster.

The switches move the DIFF layer's element-wise work into Triton kernels: ``fused_head_norm`` the head norm into the
epilogue's kernel, ``fused_lambda`` λ into kernels of its own. What they save is host work and kernel launches, which
decide a small model's step (host-bound on the H200: the baseline's GPU busy 8.6 ms of its 40), not one attention call
at 16K tokens, so the step decides, not the route sweep. ``benchmarks/gpu_session.sh`` times the step with each
switch forced (``train.json``'s columns ``diffattn DIFF (<backend>+norm)``, ``…+norm+lambda``) beside the same
backend without it; here, per switch, every pair of those columns at every length the step ran:

* **on** where the switched column's median wall time is at most the other's and its GPU busy time at most
  :data:`GPU_SLACK` times the other's (where both were profiled), in every pair and row;
* **off** where a pair says otherwise (the first such pair is the reason);
* **undecided** (left as the table has it: absent, off) where a pair's column is missing or not a number.

Usage: ``python -m diffattn.bench.switches RUN_DIR [--write]`` prints each decision and why; ``--write`` sets the
decided switches in the newest entry of ``RUN_DIR/route_table.json`` (the run's own, which its sweep wrote), by a
temporary file and a rename.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from .train_step import forced_column

#: per switch, the (switched, plain) column pairs of train.json that decide it
PAIRS: dict[str, tuple[tuple[str, str], ...]] = {
    "fused_head_norm": (
        (forced_column("cudnn+epilogue+norm"), forced_column("cudnn+epilogue")),
        (forced_column("auto+norm"), forced_column("auto")),
    ),
    "fused_lambda": ((forced_column("auto+norm+lambda"), forced_column("auto+norm")),),
}
#: how much more GPU busy time a switched column may take and still count as no slower (one profiled step each: the
#: same kernels' times vary by about that between steps)
GPU_SLACK = 1.02


@dataclass(frozen=True)
class Decision:
    on: bool | None  # None: undecided
    why: str


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def decide(rows: list[dict]) -> dict[str, Decision]:
    """Each switch's decision from train.json's rows (module docstring)."""
    return {flag: _decide(rows, pairs) for flag, pairs in PAIRS.items()}


def _decide(rows: list[dict], pairs: tuple[tuple[str, str], ...]) -> Decision:
    if not rows:
        return Decision(None, "train.json has no rows")
    said = []
    for row in rows:
        at = f"{row.get('preset')} at {row.get('seq_len')} tokens"
        ms, gpu = row.get("ms", {}), row.get("gpu_ms", {})
        for switched, plain in pairs:
            if not (_finite(ms.get(switched)) and _finite(ms.get(plain))):
                return Decision(None, f"{at}: no time for {switched} or {plain}")
            ratio = ms[switched] / ms[plain]
            profiled = _finite(gpu.get(switched)) and _finite(gpu.get(plain))
            gpu_ratio = gpu[switched] / gpu[plain] if profiled else None
            line = f"{at}: {switched} {ratio:.3f}x {plain} by wall time" + (
                f", {gpu_ratio:.3f}x by GPU busy time" if profiled else ""
            )
            if ratio > 1 or (profiled and gpu_ratio > GPU_SLACK):
                return Decision(False, line)
            said.append(line)
    return Decision(True, "; ".join(said))


def write_switches(table_path: Path, decisions: dict[str, Decision]) -> dict:
    """The decided switches set in the newest entry of the table at ``table_path`` (rewritten through a temporary
    file); that entry returned. ValueError where the newest date is not one entry's alone."""
    from ..files import write_text_atomic
    from ..ops.routes import check_table
    from .route_sweep import finite_json

    data = json.loads(table_path.read_text())
    entries = check_table(data)
    if not entries:
        raise ValueError(f"{table_path} has no entry")
    newest = max(e["date"] for e in entries)
    mine = [e for e in entries if e["date"] == newest]
    if len(mine) != 1:
        raise ValueError(f"{table_path}: {len(mine)} entries of the newest date {newest}; which is this run's?")
    for flag, decision in decisions.items():
        if decision.on is not None:
            mine[0][flag] = decision.on
    check_table(data)
    write_text_atomic(table_path, json.dumps(finite_json(data), indent=1) + "\n")
    return mine[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a GPU run's directory (train.json, route_table.json)")
    parser.add_argument("--write", action="store_true", help="set the decided switches in the run's route table")
    args = parser.parse_args(argv)
    try:
        rows = json.loads((args.run / "train.json").read_text())["rows"]
    except (OSError, ValueError, KeyError) as err:
        print(f"switches: cannot read {args.run / 'train.json'}: {err}", file=sys.stderr)
        return 2
    decisions = decide(rows)
    for flag, decision in decisions.items():
        state = {True: "on", False: "off", None: "undecided"}[decision.on]
        print(f"{flag}: {state} — {decision.why}")
    if args.write:
        try:
            write_switches(args.run / "route_table.json", decisions)
        except (OSError, ValueError) as err:
            print(f"switches: not written: {err}", file=sys.stderr)
            return 2
        print(f"switches written to {args.run / 'route_table.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
