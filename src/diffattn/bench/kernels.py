"""What a piece of GPU work is made of: its kernels by name, with their time and launch count, from one profiled run
under ``torch.profiler`` — the one home of how the benchmarks read a profile (the train step's ``gpu`` line and
kernel table, :mod:`diffattn.bench.train_step`; one attention call's, :mod:`diffattn.bench.call_kernels`).

Why: two gaps the H200 leases measured could not be explained from times alone (``auto`` 9 ms off its own route
forced at 4,096 tokens; the fused epilogue faster per call and slower in the step), and a route's ratio to the
baseline says how much slower it is, not where: a table of kernels by column says which kernels part two columns.

The host's side of a step is read here too (:func:`profile_host`): where a step is host-bound — the `small` step on the
H200 of 2026-11-29, the baseline's GPU busy 8.6 of 35.7 ms — its wall time is the host's, and the CPU proxy
(``benchmarks/step_host_time.py``) had DIFF's `cudnn_direct+norm` 0.08 of the baseline's time under DiffLlama's
where the H200 put it 0.06 over (47.5 against 45.3 ms): the difference is in something the proxy stubs or does not
have (Triton's launcher, cuDNN's plan lookups, the CUDA runtime's calls, a host sync). A table of host time by op,
autograd node, CUDA runtime call and Python function, by column, says which.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

#: kernels kept per profile, the longest; the rest are summed under :data:`OTHER_KERNELS`
KERNELS_KEPT = 24
#: the name the kernels past :data:`KERNELS_KEPT` are summed under
OTHER_KERNELS = "(other kernels)"
#: kernels shown per table by :func:`format_kernel_table` (the JSON keeps :data:`KERNELS_KEPT`)
KERNELS_SHOWN = 16

#: rows kept per host profile (:func:`host_table`), those with the most self time; the rest summed under
#: :data:`OTHER_HOST`
HOST_KEPT = 60
#: the name the host rows past :data:`HOST_KEPT` are summed under
OTHER_HOST = "(other host)"
#: the CUDA runtime and driver calls that launch a kernel (PyTorch's ATen kernels: ``cudaLaunchKernel``; Triton's
#: launcher and cuDNN's engines: the driver's ``cuLaunchKernel``/``cuLaunchKernelEx``)
LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")
#: the calls by which the host waits for the GPU (a step that makes any is no longer only host-bound where it does)
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def short_kernel_name(name: str) -> str:
    """A CUDA kernel's profiler name as a table's row label: no ``void``, no parameter list (the template arguments
    name the functor, which tells PyTorch's element-wise kernels apart), no ``at::native::``/``c10::``/``std::``
    namespaces, at most 100 characters."""
    name = name.removeprefix("void ")
    for prefix in ("at::native::", "(anonymous namespace)::", "c10::", "std::", "at::"):
        name = name.replace(prefix, "")
    depth = 0
    for i, ch in enumerate(name):  # a C++ signature's parameter list: "(" right after the name, outside "<…>"
        depth += {"<": 1, ">": -1}.get(ch, 0)
        if ch == "(" and depth == 0 and i > 0 and not name[i - 1].isspace():
            name = name[:i]
            break
    name = " ".join(name.split())
    return name if len(name) <= 100 else name[:99] + "…"


def kernel_table(events, per: int = 1) -> dict[str, list[float]]:
    """``{short name: [ms, launches]}`` of profiled GPU events (each with ``name`` and ``time_range`` in µs), divided by
    ``per`` (the profile held that many calls), the :data:`KERNELS_KEPT` longest and the rest under
    :data:`OTHER_KERNELS`. A kernel's time is its own span: kernels that overlap count twice (unlike
    :func:`busy_ms`)."""
    table: dict[str, list[float]] = {}
    for e in events:
        entry = table.setdefault(short_kernel_name(e.name), [0.0, 0])
        entry[0] += (e.time_range.end - e.time_range.start) / 1e3 / per
        entry[1] += 1 / per
    ranked = sorted(table.items(), key=lambda kv: -kv[1][0])
    kept = dict(ranked[:KERNELS_KEPT])
    rest = ranked[KERNELS_KEPT:]
    if rest:
        kept[OTHER_KERNELS] = [sum(v[0] for _, v in rest), sum(v[1] for _, v in rest)]
    return kept


def busy_ms(intervals) -> float:
    """Milliseconds covered by the union of ``(start, end)`` intervals given in microseconds: the time at least one
    of them was running (kernels of one stream do not overlap; copies and other streams' kernels may)."""
    total, covered_to = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > covered_to:
            total += end - max(start, covered_to)
            covered_to = end
    return total / 1e3


def profile_gpu(fn: Callable[[], object], calls: int = 1) -> tuple[float, dict[str, list[float]]] | None:
    """``fn()`` run ``calls`` times under ``torch.profiler`` (CUDA activity): per call, :func:`busy_ms` of its GPU
    events and their :func:`kernel_table`. None where the profile has no GPU event with a sane time (CUPTI
    unavailable, records dropped, or zero timestamps: pytorch#192021, CUDA 12.6u2–13.0) or the busy time exceeds the
    profiled run's own wall time. A profiler that fails raises (the caller decides what that costs)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        wall_ms = 1e3 * (time.perf_counter() - t0)
    gpu_events = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    sane = [e for e in gpu_events if 0 <= e.time_range.start < e.time_range.end]
    busy = busy_ms([(e.time_range.start, e.time_range.end) for e in sane])
    if not sane or busy > wall_ms:
        return None
    return busy / calls, kernel_table(sane, per=calls)


def format_kernel_table(
    title: str,
    tables: dict[str, dict[str, list[float]]],
    shown: int = KERNELS_SHOWN,
    *,
    what: str = "kernel",
    beyond_first: bool = False,
) -> str:
    """One table of kernels by column (``tables``: column label → :func:`kernel_table`): ms and launches, the
    ``shown`` kernels that took longest in any column, then the rest summed, then every kernel's total.
    ``what``: the rows' noun (``"kernel"``; ``"host"`` for :func:`host_table`'s, whose counts are calls);
    ``beyond_first``: the rows shown are those by which some column exceeds the first one most (the baseline: what
    the others' extra time is made of), not the longest."""
    columns = list(tables)
    names = {n for table in tables.values() for n in table if n not in (OTHER_KERNELS, OTHER_HOST)}
    first = tables[columns[0]] if columns else {}

    def rank(n: str) -> float:
        longest = max(t.get(n, [0.0])[0] for t in tables.values())
        return longest - first.get(n, [0.0])[0] if beyond_first else longest

    top = sorted(names, key=lambda n: (-rank(n), n))[:shown]
    total = f"(all {what}s)" if what == "kernel" else f"(all {what})"
    wide = max(len(n) for n in [*top, total])  # whole names: cuDNN's name their engine at the end

    def cell(ms: float, launches: float) -> str:  # launches per call: whole, or a mean over calls
        return f"{ms:.2f} ({launches:.0f})" if float(launches).is_integer() else f"{ms:.2f} ({launches:.1f})"

    rows = [(n, [cell(*tables[c][n]) if n in tables[c] else "—" for c in columns]) for n in top]
    for label, shown_too in (("(the rest)", False), (total, True)):
        sums = [[sum(v[i] for n, v in tables[c].items() if shown_too or n not in top) for i in (0, 1)] for c in columns]
        rows.append((label, [cell(*x) for x in sums]))
    width = max(14, *(len(c) + 1 for c in columns), *(len(x) + 1 for _, cells in rows for x in cells))
    lines = [title, f"{what:<{wide}}" + "".join(f"{c:>{width}}" for c in columns)]
    lines += [f"{n:<{wide}}" + "".join(f"{x:>{width}}" for x in cells) for n, cells in rows]
    return "\n".join(lines)


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def host_name(name: str) -> str:
    """A host event's name as a table's row label: a Python function's file from its package on (``diffattn/ops/
    direct.py(40): forward``, whatever the install's prefix), a built-in's without its object's address (``<built-in
    method run_backward of torch._C._EngineBase object>``: the same method, one row), at most 100 characters."""
    name = _ADDRESS.sub("", name)
    for marker in ("site-packages/", "dist-packages/", "/src/"):
        if marker in name.split("(")[0]:
            name = name[name.index(marker) + len(marker) :]
    name = " ".join(name.split())
    return name if len(name) <= 100 else name[:99] + "…"


#: a profile's trace categories that are the GPU's (or no event at all), not the host's
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "ac2g", "Trace"})


def host_self_times(trace_events) -> list[tuple[str, float]]:
    """``(name, self µs)`` of every host event in a profile's Chrome trace events (``traceEvents``: complete events,
    ``"ph": "X"``, with ``ts`` and ``dur`` in µs and a ``tid``; the GPU's categories, :data:`DEVICE_CATEGORIES`,
    left out): each event's duration less its direct children's on its thread — ATen ops (``cpu_op``), Python
    functions (``python_function``), CUDA runtime and driver calls (``cuda_runtime``, ``cuda_driver``). Read from the
    trace, not ``prof.events()``: torch 2.11's (the lent GPUs') leaves the Python tracer's functions out of that."""
    threads: dict[tuple, list[dict]] = {}
    for e in trace_events:
        if e.get("ph") == "X" and e.get("cat") not in DEVICE_CATEGORIES and "dur" in e and "ts" in e:
            threads.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    out = []
    for events in threads.values():
        events.sort(key=lambda e: (float(e["ts"]), -float(e["dur"])))
        spans = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events]
        selves = [end - start for start, end in spans]
        stack: list[int] = []  # the open events' indices, outermost first
        for i, (start, end) in enumerate(spans):
            while stack and spans[stack[-1]][1] <= start:
                stack.pop()
            if stack:  # its time is its parent's no longer (a child running past its parent: the overlap only)
                selves[stack[-1]] -= min(end, spans[stack[-1]][1]) - start
            stack.append(i)
        out += [(e["name"], max(0.0, self_us)) for e, self_us in zip(events, selves, strict=True)]
    return out


def host_table(self_times, per: int = 1) -> dict[str, list[float]]:
    """``{row: [self ms, calls]}`` of host events' ``(name, self µs)`` (:func:`host_self_times`: ATen ops, autograd
    nodes, CUDA runtime calls, Python functions), divided by ``per``, the :data:`HOST_KEPT` with the most self time and
    every launch and host wait (:data:`LAUNCH_CALLS`, :data:`SYNC_CALLS`), the rest under :data:`OTHER_HOST`. Self
    time: an event's own, its children's not, so the rows add up to the host's time in the profile's events (each
    thread's)."""
    table: dict[str, list[float]] = {}
    for name, self_us in self_times:
        entry = table.setdefault(host_name(name), [0.0, 0])
        entry[0] += self_us / 1e3 / per
        entry[1] += 1 / per
    ranked = sorted(table.items(), key=lambda kv: (-kv[1][0], kv[0]))
    counted = (*LAUNCH_CALLS, *SYNC_CALLS)  # always kept, however cheap: :func:`calls_of` counts them
    kept = dict(ranked[:HOST_KEPT]) | {n: v for n, v in ranked[HOST_KEPT:] if n in counted}
    rest = [(n, v) for n, v in ranked[HOST_KEPT:] if n not in counted]
    if rest:
        kept[OTHER_HOST] = [sum(v[0] for _, v in rest), sum(v[1] for _, v in rest)]
    return kept


def calls_of(table: dict[str, list[float]], names) -> float:
    """How many of ``names``' calls a :func:`host_table` holds (e.g. :data:`LAUNCH_CALLS`, :data:`SYNC_CALLS`)."""
    return sum(v[1] for n, v in table.items() if n in names)


def profile_host(fn: Callable[[], object], calls: int = 1) -> tuple[float, dict[str, list[float]]]:
    """``fn()`` run ``calls`` times under ``torch.profiler`` with CPU activity and the Python tracer (``with_stack``;
    CUDA activity too where CUDA is available, for the runtime's calls): per call, the host's time in ms until ``fn``
    returned (its waits on the GPU included, the GPU's work after it not: the GPU is synchronised before and after,
    outside the profile, so the waits counted are the step's own) and the :func:`host_table` of its events. The
    tracer costs time of its own in every Python call (longer than an unprofiled step): compare columns, not a column
    with its timed step. A profiler that fails raises (the caller decides what that costs)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=activities, with_stack=True) as prof:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        host_ms = 1e3 * (time.perf_counter() - t0)
    if cuda:
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as folder:  # the trace holds the Python tracer's events on every torch
        trace = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text()).get("traceEvents", [])
    return host_ms / calls, host_table(host_self_times(events), per=calls)
