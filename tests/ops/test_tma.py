"""The fused kernel by TMA tiles (diffattn/ops/triton/forward_tma.py and backward_tma.py; tuning.FWD_TMA, BWD_TMA,
and BWD_WS with the dK/dV kernel warp-specialised): under Triton's interpreter, the default kernels' numbers bit for
bit where both see the same rows (one query head per KV head), the float64 reference's to the rounding rule otherwise
(GQA), forward and every gradient; and the default kernels wherever the TMA ones do not apply. Their GPU tiles at
boundary shapes, with every access checked: tests/ops/test_tuning_candidates.py ("tma", "btma", "bws" cases);
compiled for sm_90: benchmarks/kernel_report.py (kinds fwd_tma, dkdv_tma, dq_tma, dkdv_ws)."""

from __future__ import annotations

import contextvars
from types import SimpleNamespace

import pytest
import torch

from diffattn.ops import diff_attention
from diffattn.ops.routes import TRITON_VARIANTS

from ..helpers import pairwise
from .interpreter import import_kernels, keep_interpreting
from .test_triton import (
    _assert_like_sdpa,
    _gpu_inputs,
    _grads_of,
    _left_padding,
    _record_kinds,
    check_against_reference,
    make_inputs,
    needs_cuda,
)

launch = import_kernels()  # interpreted without CUDA (tests/ops/interpreter.py)
from diffattn.ops.triton import tuning  # noqa: E402

# each variant's tuning flag and launch kinds: the table of them (routes.TRITON_VARIANTS)
FLAGS = {name: TRITON_VARIANTS[name][0] for name in ("tma",)}
KINDS = {name: TRITON_VARIANTS[name][1][0] for name in FLAGS}
BWD_FLAGS = {name: TRITON_VARIANTS[name][0] for name in ("btma", "bws")}
BWD_KINDS = {name: list(TRITON_VARIANTS[name][1]) for name in BWD_FLAGS}


@pytest.fixture(autouse=True)
def _interpreted(monkeypatch, request):
    if "gpu" in request.keywords:  # compiled, on the GPU's own tiles
        return
    keep_interpreting(monkeypatch)
    monkeypatch.setattr(tuning, "BLOCK_OVERRIDE", (16, 16))  # tiny shapes still span several tiles


def _forward(args, *, causal, share_k, save_parts, dtype):
    q1, k1, q2, k2, v = (x.to(dtype) for x in args[:5])
    lam = args[5]
    b, h, t = q1.shape[:3]
    lam_rows = lam.reshape(1, h, 1).expand(b, h, t).contiguous() if lam.dim() == 1 else lam
    return launch._fwd_impl(q1, k1, q2, None if share_k else k2, v, lam_rows, None, causal, 0.3, save_parts)


@pytest.mark.parametrize(
    ("save_parts", "case", "dtype", "variant"),
    pairwise(  # every pair of these in the default run, the whole product in CI's heavy run
        save_parts={"train": True, "infer": False},
        case={  # (shape, causal, K shared)
            "causal-t<s": (dict(h=2, hkv=2, t=37, s=45, d=16, dv=32), True, False),  # T < S, partial tiles, V 2d wide
            "noncausal": (dict(h=2, hkv=2, t=37, s=45, d=16, dv=32), False, False),  # keys past S hidden by the bound
            "shared-k-batch2": (dict(b=2, h=2, hkv=2, t=21, s=21, d=16, dv=16), True, True),  # DIFF V2, batch 2
            "t5-s40": (dict(h=1, hkv=1, t=5, s=40, d=16, dv=32), True, False),  # a short block of rows, many keys
        },
        dtype={"fp32": torch.float32, "bf16": torch.bfloat16},
        variant=["tma"],
    ),
)
def test_the_default_forward_bit_for_bit(monkeypatch, save_parts, case, dtype, variant):
    shape, causal, share_k = case
    # the same tiles, the same order of every sum: output, saved per-map outputs and log-sum-exps identical to the
    # default forward's (one query head per KV head, so both kernels see the same rows in each program)
    args = make_inputs(**shape, lam_kind="head")
    kinds = _record_kinds(monkeypatch)
    default = _forward(args, causal=causal, share_k=share_k, save_parts=save_parts, dtype=dtype)
    monkeypatch.setattr(tuning, FLAGS[variant], True)
    by_tma = _forward(args, causal=causal, share_k=share_k, save_parts=save_parts, dtype=dtype)
    assert kinds == ["fwd", KINDS[variant]]
    for name, a, b in zip(("out", "o1", "o2", "lse1", "lse2"), default, by_tma, strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("variant", ["tma"])
def test_matches_the_reference_with_gqa(monkeypatch, variant):
    # GQA: a program takes one query head's rows (the default forward packs the group's), so the sums of a tile run in
    # another order: output and every gradient against float64 by the rounding rule; λ per head and token
    monkeypatch.setattr(tuning, FLAGS[variant], True)
    kinds = _record_kinds(monkeypatch)
    check_against_reference(make_inputs(b=2, h=4, hkv=2, t=19, s=23, d=16, dv=32, lam_kind="token"))
    assert kinds == [KINDS[variant], "dkdv", "dq"]


@pytest.mark.parametrize(
    ("why", "shape", "kwargs"),
    [
        ("key padding", dict(b=2, h=2, hkv=2, t=19, s=23, d=16, dv=32), dict(attn_mask=_left_padding(2, 23, 7))),
        (
            "segments",
            dict(b=1, h=2, hkv=2, t=20, s=20, d=16, dv=32),
            dict(segment_ids=torch.tensor([[0] * 9 + [1] * 11])),
        ),
        ("q shared (DiffK)", dict(h=2, hkv=2, t=19, s=23, d=16, dv=32), dict(share_q=True)),
        ("d not a power of two", dict(h=2, hkv=2, t=19, s=23, d=24, dv=32), dict()),
        ("strides not 16-byte aligned", dict(h=2, hkv=2, t=19, s=23, d=16, dv=32), dict(misaligned=True)),
    ],
    ids=lambda x: x if isinstance(x, str) else "",
)
def test_the_default_forward_where_tma_tiles_do_not_apply(monkeypatch, why, shape, kwargs):
    monkeypatch.setattr(tuning, "FWD_TMA", True)
    kinds = _record_kinds(monkeypatch)
    q1, k1, q2, k2, v, lam = make_inputs(**shape)
    if kwargs.pop("share_q", False):
        q2 = q1
    if kwargs.pop("misaligned", False):  # Q's rows 17 floats apart (68 bytes): no descriptor can step them
        q1 = torch.cat([q1, q1[..., :1]], dim=-1)[..., :16]
    with torch.no_grad():
        out = diff_attention(q1, k1, q2, k2, v, lam, backend="triton", **kwargs)
        ref = diff_attention(q1, k1, q2, k2, v, lam, backend="reference", **kwargs)
    torch.testing.assert_close(out, ref)
    assert kinds == ["fwd"], why


def test_the_default_forward_with_key_splits(monkeypatch):
    # decoding splits the keys over programs (flash-decoding): the TMA forward has no splits, so the default runs
    monkeypatch.setattr(tuning, "FWD_TMA", True)
    monkeypatch.setattr(tuning, "SPLIT_OVERRIDE", 3)
    kinds = _record_kinds(monkeypatch)
    q1, k1, q2, k2, v, lam = make_inputs(h=2, hkv=2, t=1, s=50, d=16, dv=32)
    with torch.no_grad():
        diff_attention(q1, k1, q2, k2, v, lam, backend="triton")
    assert kinds == ["fwd"]


def test_which_heads_take_tma_tiles_on_a_gpu(monkeypatch):
    # DIFF V1 (d = 64, dv = 128) and V2 (64, 64) heads without a mask, once a flag is on; never wide heads or a mask
    monkeypatch.setattr(tuning, "INTERPRETED", False)
    monkeypatch.setattr(tuning, "BLOCK_OVERRIDE", None)
    assert not tuning._fwd_tma(64, 128)
    for flag in FLAGS.values():
        monkeypatch.setattr(tuning, flag, True)
        assert tuning._fwd_tma(64, 128) and tuning._fwd_tma(64, 64)
        assert not tuning._fwd_tma(128, 256) and not tuning._fwd_tma(64, 128, "keys")
        assert not tuning._fwd_tma(64, 128, "segments") and not tuning._fwd_tma(48, 96)
        monkeypatch.setattr(tuning, flag, False)
    assert tuning._blocks("fwd_tma", 64, 128, 4096)[2] == 8


def test_layouts_a_descriptor_can_read():
    def fake(element_size, strides, ptr=0, cuda=True):
        def stride(dim=None):
            return strides if dim is None else strides[dim]

        return SimpleNamespace(is_cuda=cuda, element_size=lambda: element_size, stride=stride, data_ptr=lambda: ptr)

    assert launch._tma_fits(fake(2, (4096, 64, 128, 1)), None)  # a projection's bf16 view; a shared operand
    assert not launch._tma_fits(fake(4, (4096, 64, 128, 1)))  # float32 on a GPU: not this kernel's tiles
    assert launch._tma_fits(fake(4, (4096, 64, 128, 1), cuda=False))  # the interpreter takes any float dtype
    assert not launch._tma_fits(fake(2, (4096, 64, 1, 128)))  # the last dimension strided
    assert not launch._tma_fits(fake(2, (4100, 60, 132, 1)))  # a stride of 4 elements (8 bytes)
    assert not launch._tma_fits(fake(2, (4096, 64, 128, 1), ptr=8))  # a base 8 bytes off 16


def test_an_allocator_for_the_descriptors_only_where_none_is_set():
    import triton
    from triton.runtime import _allocation

    def run():
        launch._ensure_allocator()
        ours = _allocation._allocator.get()
        assert ours is launch._scratch

        def users(size, alignment, stream):
            return torch.empty(size, dtype=torch.int8)

        triton.set_allocator(users)
        launch._ensure_allocator()
        assert _allocation._allocator.get() is users  # a user's allocator is kept

    contextvars.copy_context().run(run)  # the process's own allocator is left as it was


def _gradients(args, *, causal, share_k, dtype, backend="triton"):
    q1, k1, q2, k2, v = (x.to(dtype).requires_grad_() for x in args[:5])
    lam = args[5].clone().requires_grad_()
    k2 = k1 if share_k else k2
    out = diff_attention(q1, k1, q2, k2, v, lam, causal=causal, backend=backend)
    cot = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(dtype)
    leaves = [q1, k1, q2, v, lam, *([] if share_k else [k2])]
    return [out.detach(), *torch.autograd.grad(out, leaves, cot)]


@pytest.mark.parametrize(
    ("case", "dtype", "variant"),
    pairwise(  # every pair of these in the default run, the whole product in CI's heavy run
        case={  # (shape, causal, K shared)
            "causal-t<s": (dict(h=2, hkv=2, t=37, s=45, d=16, dv=32), True, False),  # T < S, partial blocks, V 2d wide
            "noncausal": (dict(h=2, hkv=2, t=37, s=45, d=16, dv=32), False, False),  # a partial key block, no mask
            "shared-k-batch2": (dict(b=2, h=2, hkv=2, t=21, s=21, d=16, dv=16), True, True),  # DIFF V2, batch 2
            "t5-s40": (dict(h=1, hkv=1, t=5, s=40, d=16, dv=32), True, False),  # few query rows, many key blocks
        },
        dtype={"fp32": torch.float32, "bf16": torch.bfloat16},
        variant=["btma", "bws"],
    ),
)
def test_the_default_backward_bit_for_bit(monkeypatch, case, dtype, variant):
    # the two-kernel backward's own tiles and order of every sum: every gradient identical to the default's
    shape, causal, share_k = case
    args = make_inputs(**shape, lam_kind="head")
    kinds = _record_kinds(monkeypatch)
    default = _gradients(args, causal=causal, share_k=share_k, dtype=dtype)
    monkeypatch.setattr(tuning, BWD_FLAGS[variant], True)
    by_tma = _gradients(args, causal=causal, share_k=share_k, dtype=dtype)
    assert kinds == ["fwd", "dkdv", "dq", "fwd", *BWD_KINDS[variant]]
    for i, (a, b) in enumerate(zip(default, by_tma, strict=True)):
        assert torch.equal(a, b), i


@pytest.mark.parametrize(("fwd", "bwd"), [("tma", "btma"), ("tma", "bws")])
def test_forward_and_backward_by_tma_tiles_match_the_reference(monkeypatch, fwd, bwd):
    # both halves together, as the sweep's triton[tma+btma] and triton[tma+bws] run them: output and every gradient
    # against float64 by the rounding rule, λ per head and token
    monkeypatch.setattr(tuning, FLAGS[fwd], True)
    monkeypatch.setattr(tuning, BWD_FLAGS[bwd], True)
    kinds = _record_kinds(monkeypatch)
    check_against_reference(make_inputs(b=2, h=2, hkv=2, t=19, s=23, d=16, dv=32, lam_kind="token"))
    assert kinds == [KINDS[fwd], *BWD_KINDS[bwd]]


@pytest.mark.parametrize(
    ("route", "launched"),
    [
        ("triton[tma+btma]", ["fwd_tma", "dkdv_tma", "dq_tma"]),
        ("triton[bws]", ["fwd", "dkdv_ws", "dq_tma"]),
        # the forward's variant alone: the two above take the switch's paths (a backward chosen from its forward's
        # variants, and without one); CI's heavy run (the default run's budget, 2026-12-01)
        pytest.param("triton[tma]", ["fwd_tma", "dkdv", "dq"], marks=pytest.mark.heavy),
    ],
)
def test_a_variant_route_switches_its_variants_on_for_its_own_calls_only(monkeypatch, route, launched):
    # what auto runs where the route table names triton[NAME]: that call's forward and backward on the variants'
    # kernels (the backward chosen when it runs, from what its forward was asked), bit for bit the numbers of the
    # same variants switched on for every call — and nothing switched on for any other call
    from diffattn.ops.routes import triton_variants

    args = make_inputs(h=2, hkv=2, t=37, s=45, d=16, dv=32, lam_kind="head")
    kinds = _record_kinds(monkeypatch)
    by_route = _gradients(args, causal=True, share_k=False, dtype=torch.bfloat16, backend=route)
    assert kinds == launched
    assert not any(getattr(tuning, flag) for flag, _ in TRITON_VARIANTS.values()), "a switch was left on"
    kinds.clear()
    _gradients(args, causal=True, share_k=False, dtype=torch.bfloat16)
    assert kinds == ["fwd", "dkdv", "dq"], "the next plain call runs the default kernels"
    for name in triton_variants(route):
        monkeypatch.setattr(tuning, TRITON_VARIANTS[name][0], True)
    for_every_call = _gradients(args, causal=True, share_k=False, dtype=torch.bfloat16)
    for i, (a, b) in enumerate(zip(by_route, for_every_call, strict=True)):
        assert torch.equal(a, b), i


@pytest.mark.parametrize(
    ("why", "shape", "flag"),
    [
        ("GQA", dict(b=2, h=4, hkv=2, t=19, s=23, d=16, dv=32), None),
        ("the single-pass backward", dict(h=2, hkv=2, t=19, s=23, d=16, dv=32), "ATOMIC_DQ"),
        ("the split backward", dict(h=2, hkv=2, t=19, s=23, d=16, dv=32), "SPLIT_DKDV"),
    ],
    ids=lambda x: x if isinstance(x, str) else "",
)
def test_the_default_backward_where_tma_tiles_do_not_apply(monkeypatch, why, shape, flag):
    monkeypatch.setattr(tuning, "BWD_TMA", True)
    if flag:
        monkeypatch.setattr(tuning, flag, True)
    kinds = _record_kinds(monkeypatch)
    check_against_reference(make_inputs(**shape))
    assert not {"dkdv_tma", "dq_tma"} & set(kinds), why


def test_which_heads_take_the_backward_by_tma_tiles_on_a_gpu(monkeypatch):
    monkeypatch.setattr(tuning, "INTERPRETED", False)
    monkeypatch.setattr(tuning, "BLOCK_OVERRIDE", None)
    assert not tuning._bwd_tma(64, 128)
    for flag in BWD_FLAGS.values():
        monkeypatch.setattr(tuning, flag, True)
        assert tuning._bwd_tma(64, 128) and tuning._bwd_tma(64, 64)
        assert not tuning._bwd_tma(128, 256) and not tuning._bwd_tma(64, 128, "rows")
        monkeypatch.setattr(tuning, flag, False)
    # warp specialisation is built from a launch on one warp group (on 8 warps Triton leaves it out)
    assert tuning._blocks("dkdv_ws", 64, 128, 4096)[2] == 4 and tuning._blocks("dkdv_tma", 64, 128, 4096)[2] == 8


@pytest.mark.parametrize(
    ("dtype", "t", "s"),
    [(torch.bfloat16, 2048, 2048), (torch.float16, 2048, 2048), (torch.bfloat16, 1000, 3001),
     (torch.bfloat16, 16384, 16384)],
)  # fmt: skip
@pytest.mark.parametrize(("d", "dv"), [(64, 128), (64, 64)])
@pytest.mark.parametrize("variants", [("tma",), ("btma",), ("bws",), ("tma", "btma"), ("tma", "bws")])
@pytest.mark.gpu
@needs_cuda
def test_gpu_tma_kernels_match_reference(monkeypatch, variants, d, dv, dtype, t, s):
    # on a GPU against the fp32 reference as test_triton.py judges the default kernels (2x sdpa's own error in the
    # dtype), at 1K-16K tokens, one query head per KV head (the backward's only heads; the forward's too here); each
    # run checked to have launched the variants' kernels. In a file of its own: the GPU script runs each file in a
    # process of its own, and a warp-specialised build that aborts takes only this file's rows
    kinds = [kind for name in variants for kind in TRITON_VARIANTS[name][1]]
    for name in variants:
        monkeypatch.setattr(tuning, TRITON_VARIANTS[name][0], True)
    heads = 2 if t > 4096 else 8  # 16K tokens: fewer heads, the reference's [T, S] maps in fp32 must fit
    args = _gpu_inputs(1, heads, heads, t, s, d, dv, dtype)
    ran = _record_kinds(monkeypatch)
    got = _grads_of("triton", args)
    assert set(kinds) <= set(ran), f"{variants}: {kinds} did not all run: {ran}"
    _assert_like_sdpa(got, args, dtype, f"{'+'.join(variants)} ")
