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
