"""Tests of the two-map attention primitive (DIFF Transformer Eq. 1; docs/methods.md §0).

`reference` is checked against an independent, deliberately naive per-(batch, head, query) loop written
here; `sdpa` is checked against `reference` for outputs and every gradient (q1, k1, q2, k2, v, λ).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from diffattn.ops import BACKENDS, auto_backend, backend_status, chunked, diff_attention, diff_attention_maps
from diffattn.ops._inputs import validate

ATOL = 1e-5


def naive_diff_attention(q1, k1, q2, k2, v, lam, *, causal, key_padding=None, scale=None):
    """Eq. 1 written out row by row in float64: no broadcasting tricks shared with the library."""
    b, h, t, d = q1.shape
    hkv, s = k1.shape[1], k1.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    lam = torch.as_tensor(lam, dtype=torch.float64)
    out = torch.zeros(b, h, t, v.shape[-1], dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            kv = hi // (h // hkv)
            for i in range(t):
                lam_h = lam if lam.dim() == 0 else lam[hi] if lam.dim() == 1 else lam[bi, hi, i]
                allowed = [
                    j
                    for j in range(s)
                    if (not causal or j <= i + s - t) and (key_padding is None or bool(key_padding[bi, j]))
                ]
                if not allowed:
                    continue  # fully masked row attends to nothing
                idx = torch.tensor(allowed)
                l1 = (k1[bi, kv, idx].double() @ q1[bi, hi, i].double()) * scale
                l2 = (k2[bi, kv, idx].double() @ q2[bi, hi, i].double()) * scale
                a = torch.softmax(l1, 0) - lam_h * torch.softmax(l2, 0)
                out[bi, hi, i] = a @ v[bi, kv, idx].double()
    return out


def make_inputs(b=2, h=4, hkv=2, t=5, s=5, d=8, dv=16, lam_kind="scalar", dtype=torch.float32, seed=0):
    """lam_kind: "scalar", "head" (one per query head [H]) or "token" (DIFF V2's gate, [B, H, T])."""
    g = torch.Generator().manual_seed(seed)
    q1, q2 = (torch.randn(b, h, t, d, generator=g, dtype=dtype) for _ in range(2))
    k1, k2 = (torch.randn(b, hkv, s, d, generator=g, dtype=dtype) for _ in range(2))
    v = torch.randn(b, hkv, s, dv, generator=g, dtype=dtype)
    lam_shape = {"scalar": (), "head": (h,), "token": (b, h, t)}[lam_kind]
    lam = torch.rand(lam_shape, generator=g).to(dtype)
    return q1, k1, q2, k2, v, lam


CASES = {
    "mha-square": dict(h=2, hkv=2, t=7, s=7),
    "gqa": dict(h=4, hkv=2, t=7, s=7),
    "gqa-4to1": dict(h=4, hkv=1, t=6, s=6),
    "t<s": dict(t=3, s=9),
    "t=1": dict(t=1, s=6),
    "t-not-mult-16": dict(t=19, s=19, d=4, dv=8),
    "dv=d": dict(d=8, dv=8),
    "dv<d": dict(d=8, dv=4),
    "per-head-lam": dict(lam_kind="head"),
    "per-token-lam": dict(lam_kind="token", t=7, s=7),
    "per-token-lam-t<s": dict(lam_kind="token", t=3, s=9),
    "per-token-lam-t=1": dict(lam_kind="token", t=1, s=6),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("causal", [True, False])
def test_reference_matches_naive(case, causal):
    q1, k1, q2, k2, v, lam = make_inputs(**CASES[case])
    got = diff_attention(q1, k1, q2, k2, v, lam, causal=causal, backend="reference")
    want = naive_diff_attention(q1, k1, q2, k2, v, lam, causal=causal)
    torch.testing.assert_close(got.double(), want, atol=ATOL, rtol=1e-5)


def test_reference_matches_naive_with_padding():
    q1, k1, q2, k2, v, lam = make_inputs(t=6, s=6)
    pad = torch.ones(2, 6, dtype=torch.bool)
    pad[0, :2] = False  # left padding: rows 0 and 1 of batch 0 are fully masked under causality
    got = diff_attention(q1, k1, q2, k2, v, lam, attn_mask=pad, backend="reference")
    want = naive_diff_attention(q1, k1, q2, k2, v, lam, causal=True, key_padding=pad)
    torch.testing.assert_close(got.double(), want, atol=ATOL, rtol=1e-5)
    assert torch.all(got[0, :, :2] == 0)


def _grads(fn, tensors):
    for x in tensors:
        x.grad = None
    out = fn()
    # a fixed random cotangent exercises every output element, not just their sum
    cot = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    (out * cot).sum().backward()
    return out.detach(), [x.grad.clone() for x in tensors]


def _masks(b, h, t, s):
    pad = torch.ones(b, s, dtype=torch.bool)
    pad[0, : s // 3] = False
    g = torch.Generator().manual_seed(3)
    return {
        "none": None,
        "key-padding-2d": pad,
        "bool-4d-per-head": torch.rand(b, h, t, s, generator=g) > 0.3,
        "additive-4d": torch.randn(b, 1, t, s, generator=g),
    }


@pytest.fixture
def small_chunks(monkeypatch):
    """Make `chunked` take 4 queries per step, so the tiny test shapes span several (and partial) chunks."""
    monkeypatch.setattr(chunked, "DEFAULT_CHUNK", 4)


@pytest.mark.parametrize("backend", ["sdpa", "chunked"])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("mask_kind", ["none", "key-padding-2d", "bool-4d-per-head", "additive-4d"])
@pytest.mark.parametrize("causal", [True, False])
def test_fast_backends_match_reference_outputs_and_grads(backend, case, mask_kind, causal, small_chunks):
    args = make_inputs(**CASES[case])
    b, h, t, _ = args[0].shape
    s = args[1].shape[2]
    mask = _masks(b, h, t, s)[mask_kind]
    leaves = [x.clone().requires_grad_(True) for x in args]

    def run(backend):
        return lambda: diff_attention(*leaves, causal=causal, attn_mask=mask, backend=backend)

    out_ref, g_ref = _grads(run("reference"), leaves)
    out_fast, g_fast = _grads(run(backend), leaves)
    torch.testing.assert_close(out_fast, out_ref, atol=ATOL, rtol=1e-5)
    for name, a, r in zip(["q1", "k1", "q2", "k2", "v", "lam"], g_fast, g_ref, strict=True):
        torch.testing.assert_close(a, r, atol=ATOL, rtol=1e-5, msg=lambda m, n=name: f"grad {n}: {m}")


@pytest.mark.parametrize("backend", ["sdpa", "chunked"])
@pytest.mark.parametrize("mask_kind", ["none", "key-padding-2d", "bool-4d-per-head"])
@pytest.mark.parametrize(("t", "s"), [(7, 7), (3, 9), (1, 6)])
def test_shared_keys_with_per_token_lambda_match_reference(backend, mask_kind, t, s, small_chunks):
    """DIFF V2's case (docs/methods.md §5): both maps read the same K tensor (the sdpa backend's one-call path over
    interleaved query heads), λ per head and token; the gradient of the shared K sums both maps'."""
    q1, k, q2, _, v, lam = make_inputs(b=2, h=4, hkv=2, t=t, s=s, lam_kind="token")
    mask = _masks(2, 4, t, s)[mask_kind]
    leaves = [x.clone().requires_grad_(True) for x in (q1, k, q2, v, lam)]

    def run(backend):
        a, kk, b_, vv, lm = leaves
        return lambda: diff_attention(a, kk, b_, kk, vv, lm, attn_mask=mask, backend=backend)

    out_ref, g_ref = _grads(run("reference"), leaves)
    out_fast, g_fast = _grads(run(backend), leaves)
    naive = naive_diff_attention(
        q1, k, q2, k, v, lam, causal=True, key_padding=mask if mask_kind != "bool-4d-per-head" else None
    )
    if mask_kind != "bool-4d-per-head":
        torch.testing.assert_close(out_ref.double(), naive, atol=ATOL, rtol=1e-5)
    torch.testing.assert_close(out_fast, out_ref, atol=ATOL, rtol=1e-5)
    for name, a, r in zip(["q1", "k", "q2", "v", "lam"], g_fast, g_ref, strict=True):
        torch.testing.assert_close(a, r, atol=ATOL, rtol=1e-5, msg=lambda m, n=name: f"grad {n}: {m}")


@pytest.mark.parametrize("backend", ["sdpa", "chunked"])
def test_two_views_of_one_key_tensor_are_two_gradient_paths(backend):
    """Only the very same K tensor takes the shared-key path: two views of one storage are separate autograd paths
    (reading one of them twice would drop the other's gradient)."""
    q1, k, q2, _, v, lam = make_inputs(lam_kind="head")
    base = k.clone().requires_grad_(True)

    def grad_of(backend):
        base.grad = None
        out = diff_attention(q1, base.view_as(base), q2, base.view_as(base), v, lam, backend=backend)
        (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(1))).sum().backward()
        return base.grad.clone()

    assert not validate(q1, base.view_as(base), q2, base.view_as(base), v, lam, causal=True, attn_mask=None,
                        scale=None).shares_keys  # fmt: skip
    torch.testing.assert_close(grad_of(backend), grad_of("reference"), atol=ATOL, rtol=1e-5)


def test_auto_on_cpu_is_sdpa_when_both_maps_share_the_keys():
    q1, k, q2, _, v, lam = make_inputs(lam_kind="token")
    inp = validate(q1, k, q2, k, v, lam, causal=True, attn_mask=None, scale=None)
    assert auto_backend(torch.device("cpu"), inp) == "sdpa"
    separate = validate(*make_inputs(), causal=True, attn_mask=None, scale=None)
    assert auto_backend(torch.device("cpu"), separate) == "chunked"


def test_auto_is_chunked_on_cpu_and_matches():
    assert auto_backend(torch.device("cpu")) == "chunked"
    assert auto_backend(torch.device("cuda")) == "sdpa"
    args = make_inputs()
    torch.testing.assert_close(
        diff_attention(*args, backend="auto"), diff_attention(*args, backend="chunked"), atol=0, rtol=0
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_chunked_low_precision_computes_in_fp32(dtype, small_chunks):
    args = [x.to(dtype).requires_grad_(True) for x in make_inputs(t=9, s=9)]
    out = diff_attention(*args, backend="chunked")
    out.sum().backward()
    assert out.dtype == dtype and all(x.grad.dtype == dtype for x in args)
    ref = diff_attention(*(x.detach().float() for x in args), backend="reference")
    # fp32 inside: only the final rounding to `dtype` separates it from the fp32 reference
    torch.testing.assert_close(out.float(), ref, atol=2 * torch.finfo(dtype).eps * ref.abs().max().item(), rtol=0)


@pytest.mark.parametrize("lam_kind", ["head", "token"])
def test_chunked_gradcheck_fp64(lam_kind, small_chunks):
    args = make_inputs(b=1, h=2, hkv=1, t=6, s=7, d=3, dv=5, lam_kind=lam_kind, dtype=torch.float64)
    pad = torch.tensor([[False, True, True, True, True, True, True]])
    leaves = tuple(x.requires_grad_(True) for x in args)
    assert torch.autograd.gradcheck(
        lambda *a: diff_attention(*a, attn_mask=pad, backend="chunked"), leaves, eps=1e-6, atol=1e-7
    )


@pytest.mark.parametrize("causal", [True, False])
def test_reference_gradcheck_fp64(causal):
    args = make_inputs(b=1, h=2, hkv=1, t=3, s=4, d=3, dv=5, lam_kind="head", dtype=torch.float64)
    leaves = tuple(x.requires_grad_(True) for x in args)
    assert torch.autograd.gradcheck(
        lambda *a: diff_attention(*a, causal=causal, backend="reference"), leaves, eps=1e-6, atol=1e-7
    )


def test_scalar_lambda_as_float_and_zero_lambda_is_plain_attention():
    q1, k1, q2, k2, v, _ = make_inputs(h=2, hkv=2)
    out = diff_attention(q1, k1, q2, k2, v, 0.0)
    plain = torch.nn.functional.scaled_dot_product_attention(q1, k1, v, is_causal=True)
    torch.testing.assert_close(out, plain, atol=ATOL, rtol=1e-5)


def test_maps_are_softmax_rows_and_signed_map_reproduces_output():
    q1, k1, q2, k2, v, lam = make_inputs(t=4, s=6)
    maps = diff_attention_maps(q1, k1, q2, k2, v, lam)
    torch.testing.assert_close(maps.attn1.sum(-1), torch.ones(2, 4, 4))
    torch.testing.assert_close(maps.signed, maps.attn1 - lam * maps.attn2)
    assert torch.all(maps.attn1[..., 0, 4:] == 0)  # bottom-right causal: query 0 sees keys 0..2
    assert torch.all(maps.attn1[..., 0, :3] > 0)
    torch.testing.assert_close(maps.out, diff_attention(q1, k1, q2, k2, v, lam), atol=ATOL, rtol=1e-5)


def _largest_allocation(fn) -> int:
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return max(e.cpu_memory_usage for e in prof.events())


@pytest.mark.parametrize("backend", ["sdpa", "chunked"])
def test_fast_backends_allocate_no_score_matrix(backend):
    # [T, S] float32 for a single head is 16 MiB here. PyTorch's fused kernel allocates per-thread block
    # buffers of at most a few MiB whatever N is (plain SDPA peaks at 2-3 MiB for N = 1K..4K).
    n = 2048
    args = [x.requires_grad_(True) for x in make_inputs(b=1, h=1, hkv=1, t=n, s=n, d=8, dv=16)]
    one_map = n * n * 4

    def fwd_bwd(backend):
        return lambda: diff_attention(*args, backend=backend).sum().backward()

    assert _largest_allocation(fwd_bwd("reference")) >= one_map  # the check can fail
    assert _largest_allocation(fwd_bwd(backend)) < one_map / 4


def test_backend_status_lists_every_backend_with_reason():
    names = {s.name: s for s in backend_status("cpu")}
    plain = {"reference", "sdpa", "cudnn", "sdpa_split", "sdpa_maps", "cudnn_maps", "chunked", "triton"}
    epilogue = {"cudnn_maps+epilogue", "cudnn+epilogue", "sdpa+epilogue", "sdpa_split+epilogue", "sdpa_maps+epilogue",
                "cudnn_direct", "cudnn_shared_v", "cudnn_shared_v_split"}  # fmt: skip
    assert set(names) == plain | epilogue == set(BACKENDS) - {"auto"}
    # their routes' reason, whatever Triton can do here
    assert not names["cudnn_maps+epilogue"].usable and not names["cudnn+epilogue"].usable
    assert not any(names[n].usable for n in ("cudnn_direct", "cudnn_shared_v", "cudnn_shared_v_split"))
    assert not names["cudnn"].usable and not names["cudnn_maps"].usable  # cuDNN attention runs on CUDA only
    assert names["sdpa_split"].usable and names["sdpa_maps"].usable
    assert names["sdpa"].usable and names["reference"].usable and names["chunked"].usable
    assert all(s.reason for s in names.values())


BAD = {
    "q1 rank": (lambda a: (a[0][0], *a[1:]), {}, "q1 must be 4-D"),
    "q2 shape": (lambda a: (a[0], a[1], a[2][:, :2], *a[3:]), {}, "q2 must have the shape of q1"),
    "gqa": (
        lambda a: (
            a[0],
            a[1][:, :1].expand(-1, 3, -1, -1).contiguous(),
            a[2],
            a[3][:, :1].expand(-1, 3, -1, -1).contiguous(),
            a[4][:, :1].expand(-1, 3, -1, -1),
        ),
        {},
        "multiple of the number of key/value heads",
    ),
    "v shape": (lambda a: (*a[:4], a[4][:, :, :3]), {}, "v must be"),
    "v parts": (lambda a: (*a[:4], (a[4], a[4], a[4])), {}, r"two tensors \(va, vb\)"),
    "v parts shape": (lambda a: (*a[:4], (a[4], a[4][:, :, :3])), {}, "must agree in"),
    "head dim": (lambda a: (a[0], a[1][..., :4], a[2], a[3][..., :4], a[4]), {}, "head dim"),
    "dtype": (lambda a: (a[0], a[1].double(), *a[2:]), {}, "k1 dtype"),
    "lam shape": (lambda a: a, {"lam": torch.ones(3)}, r"lam must be a scalar, \[4\] .* or \[2, 4, 5\]"),
    "lam per token shape": (lambda a: a, {"lam": torch.ones(2, 4, 4)}, r"got shape \[2, 4, 4\]"),
    "lam nan": (lambda a: a, {"lam": float("nan")}, "lam must be finite, got nan"),
    "lam inf tensor": (lambda a: a, {"lam": torch.tensor([0.5, float("inf"), 0.5, 0.5])}, "lam must be finite"),
    "mask shape": (lambda a: a, {"attn_mask": torch.ones(2, 4)}, "key-padding mask of shape"),
    "mask rank": (lambda a: a, {"attn_mask": torch.ones(5, 5, dtype=torch.bool)[None]}, "attn_mask must be 2-D"),
    # a keep-mask cast to float (attention_mask.float()): added to the logits it masked nothing, silently
    "mask float 0/1": (lambda a: a, {"attn_mask": torch.tensor([[1.0] * 5, [1.0] * 3 + [0.0] * 2])}, "only 0 and 1"),
    "mask 4d": (lambda a: a, {"attn_mask": torch.ones(2, 3, 5, 5, dtype=torch.bool)}, "must broadcast"),
    "backend": (lambda a: a, {"backend": "cuda-magic"}, "backend must be one of"),
    "triton": (lambda a: a, {"backend": "triton"}, "not usable"),
    "causal t>s": (lambda a: (a[0], a[1][:, :, :3], a[2], a[3][:, :, :3], a[4][:, :, :3]), {}, "T <= the key"),
    "scale": (lambda a: a, {"scale": -1.0}, "scale must be"),
    "scale nan": (lambda a: a, {"scale": float("nan")}, "scale must be a positive finite float"),
    "scale inf": (lambda a: a, {"scale": float("inf")}, "scale must be a positive finite float"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_raises_value_error_naming_the_argument(case, monkeypatch):
    transform, kwargs, message = BAD[case]
    if case == "triton":  # the CPU refuses the kernel unless the user's environment asks for the interpreter
        monkeypatch.setenv("TRITON_INTERPRET", "0")
    q1, k1, q2, k2, v, lam = make_inputs(t=5, s=5)
    args = transform((q1, k1, q2, k2, v))
    lam = kwargs.pop("lam", lam)
    with pytest.raises(ValueError, match=message):
        diff_attention(*args, lam, **kwargs)


def test_a_float_key_padding_mask_is_additive():
    """A float [B, S] mask is added to the logits (0 kept, -inf masked), all-zero included; a 0/1 one is refused."""
    q1, k1, q2, k2, v, lam = make_inputs(t=5, s=5)
    keep = torch.tensor([[1] * 5, [1] * 3 + [0] * 2])
    additive = torch.zeros(2, 5).masked_fill(keep == 0, float("-inf"))
    want = diff_attention(q1, k1, q2, k2, v, lam, attn_mask=keep, backend="reference")
    torch.testing.assert_close(diff_attention(q1, k1, q2, k2, v, lam, attn_mask=additive, backend="reference"), want)
    plain = diff_attention(q1, k1, q2, k2, v, lam, backend="reference")
    torch.testing.assert_close(diff_attention(q1, k1, q2, k2, v, lam, attn_mask=torch.zeros(2, 5), backend="reference"),
                               plain)  # fmt: skip


@pytest.mark.parametrize("backend", ["reference", "sdpa", "chunked"])
def test_values_given_as_two_halves_are_their_concatenation(backend):
    # V = [va | vb] (DiffLlama's value heads j and j + Hkv): the same output and gradients as the one tensor
    q1, k1, q2, k2, _, lam = make_inputs(t=5, s=7)
    va, vb = (torch.randn(2, 2, 7, 3, generator=torch.Generator().manual_seed(i)).requires_grad_() for i in (1, 2))
    out = diff_attention(q1, k1, q2, k2, (va, vb), lam, backend=backend)
    v = torch.cat([va, vb], -1).detach().requires_grad_()
    ref = diff_attention(q1, k1, q2, k2, v, lam, backend=backend)
    torch.testing.assert_close(out, ref)
    out.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(torch.cat([va.grad, vb.grad], -1), v.grad)


@pytest.mark.parametrize("backend", ["auto", "sdpa", "chunked", "reference"])
def test_the_op_runs_on_the_meta_device(backend):
    # the paper-size presets are meant to be built on the meta device to count parameters and FLOPs
    # (torch.utils.flop_counter); asking autocast about the meta device raises, so the op must not ask there
    q = torch.empty(1, 2, 8, 16, device="meta", requires_grad=True)
    v = torch.empty(1, 2, 8, 32, device="meta", requires_grad=True)
    out = diff_attention(q, q, q, q, v, 0.5, backend=backend)
    assert out.device.type == "meta" and out.shape == (1, 2, 8, 32)
    out.sum().backward()
    assert q.grad.shape == q.shape
