"""diffattn.bench.triton_host: Triton's own launch path on a machine without a GPU — a kernel compiled for sm_90 on
its first call of each specialisation, every call bound and specialised by Triton and counted at the C launcher's
place, nothing written, and Triton's own driver lookup back afterwards."""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")


def test_a_launch_runs_tritons_own_path_compiles_each_specialisation_and_is_counted(monkeypatch):
    import torch
    import triton.language as tl
    from triton.runtime.driver import driver

    from diffattn.bench.triton_host import HOST_ONLY_DEVICE, host_only_triton

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # a compiled kernel, as a GPU's (decided when decorated)

    @triton.jit
    def double(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)

    before = driver._active
    x = torch.ones(64)
    with host_only_triton() as count:
        for n in (64, 64, 63):  # 63: not a multiple of 16, another specialisation of n, compiled too
            double[(1,)](x, n, BLOCK=64)
    compiled = list(double.device_caches[HOST_ONLY_DEVICE][0].values())
    assert count.launches == 3
    assert len(compiled) == 2 and all(k.metadata.target.arch == 90 for k in compiled)  # sm_90, once per specialisation
    assert "ld.global" in compiled[0].asm["ptx"]
    assert torch.equal(x, torch.ones(64)), "launched nowhere: nothing written"
    assert driver._active is before
    # kept apart from a GPU's kernels (Triton's cache is per device): none serves a real launch after the context
    assert set(double.device_caches) == {HOST_ONLY_DEVICE}
    with host_only_triton() as again:  # a second context reuses them and counts its own launches
        double[(1,)](x, 64, BLOCK=64)
    assert (count.launches, again.launches) == (3, 1)
    with pytest.raises(RuntimeError, match="launched outside it"):  # its stand-in launcher, called outside
        compiled[0].run()
