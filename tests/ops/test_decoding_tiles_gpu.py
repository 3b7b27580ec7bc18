"""Issue 37's decoding tiles on a GPU (``pytest -m gpu``): each candidate launch of the fused kernel's decoding forward
(:data:`diffattn.ops.triton.tuning.DECODE_TILES`, and by vector products
:data:`~diffattn.ops.triton.tuning.DECODE_VECTORS`; each runs where the route table lists its route,
``triton[decode …]``, for a decode class) forced for every call and by its route, against the float32 reference at 1K
and 16K cached keys, as ``tests/ops/test_triton.py`` judges the default kernels: within twice the
``sdpa`` backend's own error in bf16 plus half an ulp. Under the interpreter each candidate runs with its own tile at
boundary shapes, bounds-checked: ``tests/ops/test_tuning_candidates.py``. A file of its own, so that the GPU script
can run it alone (``TEST_FILES``) where ``test_triton.py``'s many GPU tests would not fit a file's time."""

from __future__ import annotations

import math

import pytest
import torch

from diffattn.ops import diff_attention

from .interpreter import import_kernels
from .test_triton import _gpu_inputs, needs_cuda

launch = import_kernels()  # interpreted without CUDA (tests/ops/interpreter.py), as every kernel test file
from diffattn.ops.triton import tuning  # noqa: E402

WIDTHS = {"v1": (64, 128), "v2": (64, 64), "wide": (128, 256)}


def _decoding_case(d, dv, s, hkv):
    """One token of 4 sequences × 16 query heads on ``hkv`` KV heads (DIFF V2's heads, dv == d: one K for both maps),
    the second sequence's first half padded: the inputs, the mask, and each way the decoding call takes them — V
    whole, and for DIFF V1's heads (dv == 2d) V as DiffLlama's two halves of heads in one tensor, read in place."""
    args = _gpu_inputs(4, 16, hkv, 1, s, d, dv, torch.bfloat16, seed=s)
    if dv == d:
        args = (*args[:3], args[1], *args[4:])
    pad = torch.ones(4, s, dtype=torch.bool, device="cuda")
    pad[1, : s // 2] = False
    q1, k1, q2, k2, v, lam = args
    runs = [args]
    if dv == 2 * d:
        v_heads = torch.cat([v[..., :d], v[..., d:]], dim=1)  # [B, 2·Hkv, S, d]
        runs.append((q1, k1, q2, k2, (v_heads[:, :hkv], v_heads[:, hkv:]), lam))
    return args, pad, runs


def _assert_as_near_as_sdpa(got, args, pad):
    """Each output within twice the ``sdpa`` backend's own error against the float32 reference, plus half an ulp of
    bf16 at the output's scale (``tests/ops/test_triton.py``'s rule for the default kernels)."""
    with torch.no_grad():
        want = diff_attention(*(x.float() for x in args), attn_mask=pad, backend="reference")
        plain = diff_attention(*args, attn_mask=pad, backend="sdpa").float()
    err_plain = (plain - want).abs().max().item()
    atol = 0.5 * torch.finfo(torch.bfloat16).eps * want.abs().max().item() + 1e-5
    for out in got:
        err = (out - want).abs().max().item()
        assert err <= 2 * err_plain + atol, f"{err:.3g} vs sdpa {err_plain:.3g}"


def _recorded(kernel, ran: list, only_split: bool = False):
    """A stand-in for ``kernel[grid](*args, **consts, **options)`` that records (BLOCK_N, warps, stages, grid) of each
    launch (of each split launch, ``only_split``) and runs it."""
    real = kernel

    class Recording:
        fn = getattr(real, "fn", real)

        def __getitem__(self, grid):
            def call(*args, **kw):
                if kw.get("SPLIT") or not only_split:
                    ran.append((kw["BLOCK_N"], kw["num_warps"], kw["num_stages"], grid))
                return real[grid](*args, **kw)

            return call

    return Recording()


def _candidates():
    return [pytest.param(tile, *WIDTHS[w], id=f"{w}-16x{tile[0]}-w{tile[1]}s{tile[2]}")
            for w, tiles in tuning.DECODE_TILES.items() for tile in tiles]  # fmt: skip


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("s", [1024, 16384])
@pytest.mark.parametrize(("tile", "d", "dv"), _candidates())
def test_gpu_decoding_candidates_match_reference(monkeypatch, tile, d, dv, s):
    # one token of 4 sequences (GQA: 4 query heads a KV head; one sequence's first half padded) on the heuristic's
    # splits, the candidate forced for every call, and by its route on 4 splits (triton[decode 16xBN wW sS splits 4]:
    # what auto runs where the table lists it); DIFF V1's heads also with DiffLlama's V halves read in place, as its
    # decoding runs — every launch of the split forward checked to have taken the candidate's tile, warps and stages
    route = f"triton[decode 16x{tile[0]} w{tile[1]} s{tile[2]} splits 4]"
    monkeypatch.setattr(launch, "_LAUNCH_CACHE", {})  # (a launch remembered from another test's tile)
    ran: list[tuple] = []
    monkeypatch.setattr(launch, "_fwd_kernel", _recorded(launch._fwd_kernel, ran, only_split=True))
    args, pad, runs = _decoding_case(d, dv, s, hkv=4)
    got = []
    with torch.no_grad():
        for forced, backend in ((tile, "triton"), (None, route)):
            monkeypatch.setattr(tuning, "DECODE_TILE", forced)
            got += [diff_attention(*run, attn_mask=pad, backend=backend).float() for run in runs]
    assert len(ran) == len(got) and all(r[:3] == tile for r in ran), ran
    _assert_as_near_as_sdpa(got, args, pad)


def _vector_candidates():
    return [pytest.param(tile, *WIDTHS[w], id=f"{w}-vec{tile[0]}-w{tile[1]}s{tile[2]}")
            for w, tiles in tuning.DECODE_VECTORS.items() for tile in tiles]  # fmt: skip


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("s", [1024, 16384])
@pytest.mark.parametrize(("tile", "d", "dv"), _vector_candidates())
def test_gpu_decoding_vector_candidates_match_reference(monkeypatch, tile, d, dv, s):
    # one token of 4 sequences × 16 heads, one query head a KV head (every preset's decoding), one sequence's first
    # half padded, the candidate forced for every call on the heuristic's splits and by its route on 16 (triton[decode
    # vec xBN wW sS splits 16]: what auto runs where the table lists it); DIFF V1's heads also with DiffLlama's V
    # halves read in place — every launch checked to have run _decode_vector_kernel on the candidate's tile, warps
    # and stages
    route = f"triton[decode vec x{tile[0]} w{tile[1]} s{tile[2]} splits 16]"
    ran: list[tuple] = []
    monkeypatch.setattr(launch, "_decode_vector_kernel", _recorded(launch._decode_vector_kernel, ran))
    args, pad, runs = _decoding_case(d, dv, s, hkv=16)
    got = []
    with torch.no_grad():
        for forced, backend in ((tile, "triton"), (None, route)):
            monkeypatch.setattr(tuning, "DECODE_VECTOR", forced)
            got += [diff_attention(*run, attn_mask=pad, backend=backend).float() for run in runs]
    assert len(ran) == len(got) and all(r[:3] == tile for r in ran), ran
    split_len = math.ceil(math.ceil(s / 16) / tile[0]) * tile[0]  # the route's 16, in whole tiles of the candidate's
    assert [r[3][1] for r in ran[len(runs) :]] == [math.ceil(s / split_len)] * len(runs), ran
    _assert_as_near_as_sdpa(got, args, pad)
