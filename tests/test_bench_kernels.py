"""diffattn.bench.kernels: how a profile is read — kernel names, the kernel table, the busy time, the printed table."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import ClassVar

import pytest
import torch

from diffattn.bench import kernels


def test_busy_time_is_the_union_of_the_kernels_intervals():
    # overlapping kernels (or a copy beside a kernel) count once: the time the GPU had something running
    assert kernels.busy_ms([]) == 0.0
    assert kernels.busy_ms([(0, 1000)]) == 1.0
    assert kernels.busy_ms([(500, 1500), (0, 1000), (200, 300), (1500, 2000), (3000, 3500)]) == 2.5


def test_kernel_names_are_short_and_keep_the_functor():
    # PyTorch's element-wise kernels differ only in their template arguments; the parameter list repeats them
    name = (
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, "
        "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)"
    )
    assert kernels.short_kernel_name(name) == (
        "vectorized_elementwise_kernel<4, CUDAFunctor_add<BFloat16>, array<char*, 3ul> >"
    )
    assert kernels.short_kernel_name("_subtract_fwd_kernel") == "_subtract_fwd_kernel"
    anonymous = "void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, float>(float*, float const*, int)"
    assert kernels.short_kernel_name(anonymous) == "cunn_SoftMaxForward<8, float>"
    assert kernels.short_kernel_name("Memcpy HtoD (Pageable -> Device)") == "Memcpy HtoD (Pageable -> Device)"
    assert len(kernels.short_kernel_name("k<" + "x" * 300 + ">")) == 100


def test_a_steps_kernels_are_kept_longest_first_and_the_rest_summed(monkeypatch):
    from types import SimpleNamespace

    monkeypatch.setattr(kernels, "KERNELS_KEPT", 2)

    def event(name, us):
        return SimpleNamespace(name=name, time_range=SimpleNamespace(start=0, end=us))

    events = [event("a", 500), event("b", 3000), event("a", 500), event("c", 200), event("d", 100)]
    table = kernels.kernel_table(events)
    assert list(table) == ["b", "a", kernels.OTHER_KERNELS]
    assert table["b"] == [3.0, 1] and table["a"] == [1.0, 2] and table[kernels.OTHER_KERNELS] == [pytest.approx(0.3), 2]


def test_a_profile_of_several_calls_is_given_per_call():
    def event(name, us):
        return SimpleNamespace(name=name, time_range=SimpleNamespace(start=0, end=us))

    table = kernels.kernel_table([event("fwd", 400), event("bwd", 1000), event("fwd", 600), event("bwd", 1000)], per=2)
    assert table == {"bwd": [1.0, 1.0], "fwd": [0.5, 1.0]}
    odd = kernels.kernel_table([event("copy", 300)], per=2)  # one launch in two calls: half a launch a call
    assert odd == {"copy": [0.15, 0.5]}
    text = kernels.format_kernel_table("t", {"route": odd})
    assert text.splitlines()[2].split() == ["copy", "0.15", "(0.5)"]


def test_a_profile_without_sane_gpu_events_is_no_figure(monkeypatch):
    from torch.autograd import DeviceType

    def event(kind, start, end, name="k"):
        return SimpleNamespace(device_type=kind, time_range=SimpleNamespace(start=start, end=end), name=name)

    class FakeProfile:
        events_given: ClassVar[list] = []

        def __init__(self, activities):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def events(self):
            return self.events_given

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.profiler, "profile", FakeProfile)
    calls = []
    # the host's events are not the GPU's; two kernels overlapping: busy once, each kernel's own span in the table
    FakeProfile.events_given = [event(DeviceType.CPU, 0, 9000), event(DeviceType.CUDA, 100, 600),
                                event(DeviceType.CUDA, 400, 900)]  # fmt: skip
    busy, table = kernels.profile_gpu(lambda: calls.append(1) or time.sleep(0.002), calls=2)
    assert len(calls) == 2 and busy == pytest.approx(0.4) and table == {"k": [0.5, 1.0]}
    # no GPU event, broken times (a zero start lands far before the trace), or longer than the run itself: None
    for given in ([], [event(DeviceType.CUDA, -1.7e15, 600)], [event(DeviceType.CUDA, 0, 9e6)]):
        FakeProfile.events_given = given
        assert kernels.profile_gpu(lambda: None) is None


def test_host_rows_are_named_from_their_package_without_object_addresses():
    # a Python function's row names its file from the package on, whatever the install's prefix; a built-in method's
    # row is one row whatever object it was bound to
    assert kernels.host_name("/usr/lib/python3/site-packages/transformers/models/llama/m.py(40): forward") == (
        "transformers/models/llama/m.py(40): forward"
    )
    assert kernels.host_name("/work/main/src/diffattn/ops/direct.py(12): apply") == "diffattn/ops/direct.py(12): apply"
    a = "<built-in method run_backward of torch._C._EngineBase object at 0x7f8c4774f030>"
    b = "<built-in method run_backward of torch._C._EngineBase object at 0x7f00aa00bb10>"
    assert (
        kernels.host_name(a) == kernels.host_name(b) == "<built-in method run_backward of torch._C._EngineBase object>"
    )
    assert kernels.host_name("aten::mm") == "aten::mm"
    assert len(kernels.host_name("f" * 300)) == 100


def test_a_host_table_is_self_time_per_row(monkeypatch):
    monkeypatch.setattr(kernels, "HOST_KEPT", 2)
    rows = [("aten::mm", 300), ("cudaLaunchKernel", 40), ("aten::mm", 500), ("x.py(3): f", 100),
            ("cudaLaunchKernel", 40)]  # fmt: skip
    table = kernels.host_table(rows, per=2)
    # per call; the rows past HOST_KEPT summed, but a launch or a wait kept whatever its time (its calls are counted)
    assert table == {"aten::mm": [0.4, 1.0], "x.py(3): f": [0.05, 0.5], "cudaLaunchKernel": [0.04, 1.0]}
    rows.append(("aten::add", 1))
    assert kernels.host_table(rows)[kernels.OTHER_HOST] == [0.001, 1]
    assert kernels.calls_of(kernels.host_table(rows), kernels.LAUNCH_CALLS) == 2
    assert kernels.calls_of(kernels.host_table(rows), kernels.SYNC_CALLS) == 0


def test_self_time_is_an_events_duration_less_its_direct_childrens_on_its_thread():
    def x(name, ts, dur, tid=1, cat="cpu_op"):
        return {"ph": "X", "name": name, "ts": ts, "dur": dur, "tid": tid, "pid": 0, "cat": cat}

    events = [
        x("step", 0, 100, cat="python_function"),
        x("aten::linear", 10, 30),
        x("aten::mm", 15, 20),  # a grandchild: the linear's time, not the step's
        x("cudaLaunchKernel", 20, 5, cat="cuda_runtime"),
        x("aten::add", 50, 10),
        x("backward", 5, 50, tid=2),  # another thread: no child of anything on thread 1
        x("gemm", 10, 500, cat="kernel"),  # the GPU's: not the host's
        {"ph": "i", "name": "instant", "ts": 1},
    ]
    got = dict(kernels.host_self_times(events))
    assert got == {"step": 60, "aten::linear": 10, "aten::mm": 15, "cudaLaunchKernel": 5, "aten::add": 10,
                   "backward": 50}  # fmt: skip


def test_a_host_profile_takes_python_functions_and_ops_by_their_self_time():
    # a real profile on this CPU: the function called, its ATen ops, each as often as a call makes them
    x = torch.ones(1000)

    def summed_twice():
        return x.sum() + x.sum()

    wall, table = kernels.profile_host(summed_twice, calls=3)
    # (a sum over all elements is an aten::sum calling its own other overload: two rows' calls a sum)
    assert table["aten::add"][1] == pytest.approx(1) and table["aten::sum"][1] in (pytest.approx(2), pytest.approx(4))
    rows = [n for n in table if n.endswith("): summed_twice")]
    assert len(rows) == 1 and table[rows[0]][1] == pytest.approx(1)
    assert wall > 0 and table[rows[0]][0] > 0 and table["aten::sum"][0] > 0


def test_the_host_table_shows_what_a_column_has_beyond_the_first():
    tables = {
        "baseline": {"aten::mm": [5.0, 10], "aten::add": [1.0, 4]},
        "DIFF": {"aten::mm": [5.2, 10], "aten::add": [1.0, 4], "diffattn/ops/direct.py(9): forward": [0.8, 8]},
        "DiffLlama": {"aten::mm": [5.1, 10], "aten::add": [2.5, 8]},
    }
    lines = kernels.format_kernel_table("t", tables, shown=2, what="host", beyond_first=True).splitlines()
    # most beyond the baseline first: DiffLlama's add (+1.5), DIFF's own function (+0.8); not the longest (mm)
    assert [line.split()[0] for line in lines[2:4]] == ["aten::add", "diffattn/ops/direct.py(9):"]
    assert lines[1].split()[0] == "host" and lines[-1].split()[:2] == ["(all", "host)"]
    assert lines[-1].split()[2:4] == ["6.00", "(14)"]
    wide = kernels.format_kernel_table("t", {"a": {"x": [1234.56, 12345]}, "b": {"x": [1.0, 1]}}, what="host")
    assert wide.splitlines()[-1].split() == ["(all", "host)", "1234.56", "(12345)", "1.00", "(1)"]  # cells apart
    longest = kernels.format_kernel_table("t", tables, shown=1).splitlines()
    assert longest[2].split()[0] == "aten::mm" and longest[-1].split()[:2] == ["(all", "kernels)"]
