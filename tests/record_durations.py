"""Record the default test suite's per-test durations into tests/durations.json (issue 36 §14), which
tests/test_suite_budget.py holds the default selection to: no test that took SLOW_S or more may be in it, and the
sum must stay within BUDGET_S on the machine that recorded it. Run on an otherwise idle machine:

    make durations        # = pytest --junitxml=build/durations.xml, then this script on the XML

A test's time is its call plus its setup and teardown (fixtures it pays for first), as junit records them."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "durations.json"
KEEP_S = 0.5  # tests faster than this are summed, not listed (the file stays small)


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
    times = {nodeid(c): float(c.get("time", 0)) for c in cases if c.find("skipped") is None}
    listed = {k: round(v, 2) for k, v in sorted(times.items()) if v >= KEEP_S}
    if OUT.is_file():  # tests this run did not run (the heavy ones, out of the default run) keep their last time
        earlier = json.loads(OUT.read_text()).get("durations_s", {})
        listed = dict(sorted({**{k: v for k, v in earlier.items() if k not in times}, **listed}.items()))
    doc = {
        "recorded": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "total_s": round(sum(times.values()), 1),  # of the tests this run ran
        "wall_s": float(run.get("time", 0)),  # the whole run, collection included
        "tests": len(times),
        "unlisted_s": round(sum(v for v in times.values() if v < KEEP_S), 1),
        "durations_s": listed,
    }
    tmp = OUT.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, OUT)
    print(f"{OUT}: {doc['tests']} tests, {doc['total_s']} s in all ({len(listed)} listed)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "build/durations.xml"))
