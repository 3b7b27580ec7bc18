"""Record the default test suite's per-test durations into tests/durations.json (issue 36 §14), which
tests/test_suite_budget.py holds the default selection to: no test that took SLOW_S or more may be in it, the sum must
stay within BUDGET_S, and every test it selects must be in the record. Run on an otherwise idle machine:

    make durations        # = pytest --junitxml=build/durations.xml, then this script on the XML

A test's time is its call plus its setup and teardown (fixtures it pays for first), as junit records them. Every test
is listed, the fast ones too, so that a test added since the record shows as unrecorded instead of as free (until
2026-11-28 tests under 0.5 s were one sum, and the ~340 tests added since the record of 2026-11-26 went uncounted).

Machines differ: the same tests took 1.8-1.9x as long on the AMD EPYC of 2026-11-28 as in the first record
(2026-11-26), and two runs on that machine differed by 9.5%. The budget is in the first record's seconds: each
record carries ``speed``, a test's time in this run relative to the first record's — the median over the tests both
this run and the previous record timed at 0.5 s or more of their ratio, times the previous record's own ``speed`` (a
record with fewer such tests than MIN_SHARED is refused: it cannot be compared). What it measures is the suite's
time, not the machine alone: the median discounts the few tests a change made slower, not a slowdown of most tests —
nor a machine that was busy while it recorded (record on an idle one) — and, chained record to record, the unit
drifts by each run's variation; the check divides by it."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "durations.json"
CALIBRATE_S = 0.5  # tests at least this long in both records measure the machines' speed ratio
MIN_SHARED = 20  # fewer such tests than this measure nothing (a record of another selection)


def _cpu() -> str:
    """The processor's model name (Linux), or "unknown cpu"."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown cpu"


def nodeid(case: ET.Element) -> str:
    """pytest's node id from junit's classname ("tests.eval.test_icl") and name ("test_x[param]")."""
    parts = case.get("classname", "").split(".")
    # the module is the longest prefix that is a file under tests/; the rest are classes
    for cut in range(len(parts), 0, -1):
        path = Path(*parts[:cut]).with_suffix(".py")
        if (HERE.parent / path).is_file():
            return "::".join([path.as_posix(), *parts[cut:], case.get("name", "")])
    return "::".join([*parts, case.get("name", "")])


def main(xml_path: str) -> int:
    root = ET.parse(xml_path).getroot()
    run = root if root.tag == "testsuite" else root.find("testsuite")  # pytest writes <testsuites><testsuite>
    cases = root.iter("testcase")
    # skipped tests too (a skip costs its setup): the budget test asks for every test the default run selects
    times = {nodeid(c): round(float(c.get("time", 0)), 2) for c in cases}
    earlier = json.loads(OUT.read_text()) if OUT.is_file() else {}
    before = earlier.get("durations_s", {})
    # tests this run did not run (the heavy ones, out of the default run) keep their last time, in this machine's
    # seconds by the speed ratio
    common = [k for k, v in times.items() if v >= CALIBRATE_S and before.get(k, 0) >= CALIBRATE_S]
    if before and len(common) < MIN_SHARED:
        raise SystemExit(
            f"{xml_path} shares {len(common)} tests of >= {CALIBRATE_S} s with {OUT.name}: not a default run?"
        )
    ratio = statistics.median(times[k] / before[k] for k in common) if before else 1.0
    kept = {k: round(v * ratio, 2) for k, v in before.items() if k not in times}
    doc = {
        "recorded": time.strftime("%Y-%m-%d"),
        "machine": f"{_cpu()}, {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        # this machine's time for a test relative to the first record's machine (module docstring)
        "speed": round(earlier.get("speed", 1.0) * ratio, 3),
        "speed_from_tests": len(common),
        "total_s": round(sum(times.values()), 1),  # of the tests this run ran
        "wall_s": float(run.get("time", 0)),  # the whole run, collection included
        "tests": len(times),
        "durations_s": dict(sorted({**kept, **times}.items())),
    }
    tmp = OUT.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, OUT)
    print(f"{OUT}: {doc['tests']} tests, {doc['total_s']} s in all; speed {doc['speed']} ({len(common)} tests)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "build/durations.xml"))
