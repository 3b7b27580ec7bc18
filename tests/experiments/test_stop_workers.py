"""``diffattn run --jobs N``: a SIGTERM to the parent stops its spawned training workers too
(experiments.runner.workers_stopped_with_parent), instead of leaving them training as orphans."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

# The parent: a spawned pool of two workers sleeping "forever" (a part that would train for an hour), under the
# same guard as _train_in_parallel; it prints the workers' PIDs, then waits for its parts.
PARENT = textwrap.dedent(
    """
    import multiprocessing, sys, time
    from concurrent.futures import ProcessPoolExecutor, wait
    from diffattn.experiments.runner import workers_stopped_with_parent

    if __name__ == "__main__":
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=2, mp_context=context) as pool, workers_stopped_with_parent(pool):
            futures = [pool.submit(time.sleep, 600) for _ in range(2)]
            while len(pool._processes) < 2:
                time.sleep(0.05)
            try:  # the print too: the test signals as soon as it reads the line, maybe before print has returned
                print(*pool._processes, flush=True)
                wait(futures)
            except KeyboardInterrupt:
                print("interrupted", flush=True)
                raise
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its parent) counts as stopped
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_sigterm_to_the_parent_stops_its_workers(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    workers: list[int] = []
    try:
        workers += [int(pid) for pid in parent.stdout.readline().split()]
        assert len(workers) == 2 and all(_alive(pid) for pid in workers)
        parent.send_signal(signal.SIGTERM)
        out, err = parent.communicate(timeout=60)
        assert "interrupted" in out, err
        assert parent.returncode != 0  # the stop is reported, not swallowed
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in workers), "a worker outlived its parent's SIGTERM"
    finally:
        parent.kill()
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_the_previous_sigterm_handler_is_restored():
    from concurrent.futures import ThreadPoolExecutor

    from diffattn.experiments.runner import workers_stopped_with_parent

    before = signal.getsignal(signal.SIGTERM)
    with ThreadPoolExecutor(1) as pool, workers_stopped_with_parent(pool):
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before
