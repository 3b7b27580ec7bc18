"""Triton's own launch path timed on a machine without a GPU: a host-only stand-in for Triton's CUDA driver.

Why: the CPU proxy of a step's host time (``benchmarks/step_host_time.py``) stubbed every Triton launch, so Triton's
launcher — binding and specialising each argument, the compiled-kernel cache's key, the launch metadata, all in
Python before the generated C launcher calls ``cuLaunchKernel`` — was in none of its times, and each prediction for a
GPU added it at an assumed "tens of µs" a launch (benchmarks/RESULTS.md, 2026-11-29). With :func:`host_only_triton`
active, ``kernel[grid](...)`` runs ``triton.runtime.jit.JITFunction.run`` for real on CPU tensors: the first call of
each specialisation compiles it ahead of time for ``sm_<capability>`` (as ``benchmarks/kernel_report.py`` does), every
call binds, specialises and looks it up, and only the last step — the C launcher, whose own cost is a few µs of
argument parsing and the driver's launch — is a counted no-op. Nothing is computed: outputs stay as allocated.

The kernels must have been imported compiled, not for Triton's interpreter (``TRITON_INTERPRET`` unset when
:mod:`diffattn.ops.triton` is first imported), and the op's refusal of the Triton routes on a CPU lifted by the caller
(the proxy does both). Works with triton 3.6 (the lent GPUs' torch 2.11) and 3.9 (tested with both)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

#: what the stand-in driver reports of its GPU (an H100/H200: the lent machines), where a launch asks
_DEVICE_PROPERTIES = {
    "max_shared_mem": 232448,
    "multiprocessor_count": 132,
    "max_num_regs": 65536,
    "warpSize": 32,
    "sm_clock_rate": 1980000,
    "mem_clock_rate": 2619000,
    "mem_bus_width": 6144,
}


#: the device index the stand-in reports: Triton keeps compiled kernels per device, so those compiled here (their
#: launcher the stand-in's) stay apart from any real GPU's, and a real launch after the context compiles its own
HOST_ONLY_DEVICE = -1

_ACTIVE: list[LaunchCount] = []  # the counts of the contexts open now, innermost last


class LaunchCount:
    """How many launches reached the stand-in C launcher since :func:`host_only_triton` began (or :meth:`reset`)."""

    def __init__(self) -> None:
        self.launches = 0

    def reset(self) -> None:
        self.launches = 0


def _driver(capability: int):
    import torch
    from triton.backends.compiler import GPUTarget

    class Utils:
        def load_binary(self, name, kernel, shared, device):
            return 0, 0, 0, 0, 1024  # module, function, registers, spills, threads: no GPU loads the cubin

        def get_device_properties(self, device):
            return dict(_DEVICE_PROPERTIES)

    class Launcher:  # the generated C launcher's place: its attributes as Triton's CudaLauncher sets them
        global_scratch_size = global_scratch_align = 0
        profile_scratch_size = profile_scratch_align = 0
        launch_cooperative_grid = launch_cluster = launch_pdl = False

        def __init__(self, src, metadata) -> None:
            self.global_scratch_align = self.profile_scratch_align = 1

        def __call__(self, *args) -> None:
            if not _ACTIVE:  # unreachable through Triton (another device's cache): a kernel held and launched by hand
                raise RuntimeError("a kernel compiled under host_only_triton() was launched outside it")
            _ACTIVE[-1].launches += 1

    class HostOnlyDriver:
        utils = Utils()
        launcher_cls = Launcher

        def is_active(self) -> bool:
            return True

        def get_current_device(self) -> int:
            return HOST_ONLY_DEVICE

        def set_current_device(self, device) -> None:
            pass

        def get_current_stream(self, device=None) -> int:
            return 0

        def get_current_target(self):
            return GPUTarget("cuda", capability, 32)

        def get_active_torch_device(self):
            return torch.device("cpu")

        def get_device_interface(self):
            return torch.cuda

        def get_benchmarker(self):
            raise RuntimeError("the host-only Triton driver cannot time kernels: no autotuned launch runs under it")

    return HostOnlyDriver()


@contextlib.contextmanager
def host_only_triton(capability: int = 90) -> Iterator[LaunchCount]:
    """Triton's launches on this machine's CPU tensors, compiled for ``sm_<capability>``, launched nowhere; yields
    their count. Triton's own driver is active again afterwards, and the kernels compiled here are kept under
    :data:`HOST_ONLY_DEVICE`, not a GPU's index, so that none of them serves a real launch later in the process;
    a second context reuses them and counts its own launches."""
    from triton.runtime.driver import driver

    count = LaunchCount()
    previous = driver._active  # None until a launch looked one up: then Triton's lookup runs again on the next
    driver.set_active(_driver(capability))
    _ACTIVE.append(count)
    try:
        yield count
    finally:
        _ACTIVE.remove(count)
        driver.set_active(previous)
