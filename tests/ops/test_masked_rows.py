"""Fully masked query rows: one answer from every backend, for every form of mask (issue 26 §1.5).

The rule (diffattn/ops/_inputs.py, module docstring): a key is masked by causality, a False in a bool mask, or an
additive value at or below ``finfo(dtype).min / 2`` of the mask's dtype (``-inf`` included; transformers' eager
masks put ``finfo.min`` there). A query row whose every key is masked attends to nothing: its output is exactly
0 and it passes no gradient to q1, k1, q2, k2, v or λ. Before the rule, a row of additive ``finfo.min`` was a
uniform softmax (the mean of V) on ``reference``, ``sdpa`` and ``chunked`` but 0 on ``triton``.

Tolerance (as in test_triton.py): a backend's error against the float64 reference is at most twice the error of
the float32 ``reference`` on the bool form of the same mask (the rounding of plain float32 math; largest over
reorderings of both reduction axes when non-causal — keys, which out, dq and dλ sum over, and queries, which dk and
dv sum over — as one order's error may be luckily small, and in FlashAttention's backward formulation, whose
D = rowsum(dO∘O) rounds differently from autograd's sum over keys and is what torch's CPU sdpa kernel computes)
plus one float32 ulp of the largest value.
"""

from __future__ import annotations

import pytest
import torch

from diffattn.ops import chunked, diff_attention, diff_attention_maps
from diffattn.ops._inputs import fully_masked_rows, hidden_keys, mask_floor, validate

from .interpreter import import_kernels, keep_interpreting

B, H, HKV, T, S, D, DV = 2, 4, 2, 7, 9, 8, 16  # GQA, T < S (causality bottom-right aligned)
NAMES = ["out", "dq1", "dk1", "dq2", "dk2", "dv", "dlam"]
FORMS = ["bool", "-inf", "finfo.min", "finfo.min+bias"]


def _causal_keep(t: int = T, s: int = S) -> torch.Tensor:
    return torch.ones(t, s, dtype=torch.bool).tril(s - t)


def _keep() -> torch.Tensor:
    """[B, 1, T, S] "may attend": random, every row keeping its own diagonal key i + S − T (visible with or without
    causality), except batch 0's query 2 (every key masked) and, in batch 1, a left padding of 4 keys that leaves
    queries 0 and 1 nothing under causality (they see keys 0..2 and 0..3)."""
    g = torch.Generator().manual_seed(5)
    keep = torch.rand(B, 1, T, S, generator=g) > 0.3
    rows = torch.arange(T)
    keep[:, :, rows, rows + S - T] = True
    keep[0, :, 2] = False
    keep[1, :, :, :4] = False
    return keep


def _empty_rows(keep: torch.Tensor, causal: bool) -> set[tuple[int, int]]:
    visible = keep & _causal_keep() if causal else keep
    return {(b, i) for b, i in (~visible.any(-1))[:, 0].nonzero().tolist()}


def _mask(form: str, keep: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """The mask ``keep`` in one of FORMS; "finfo.min+bias" adds a random bias everywhere (a masked entry stays
    at finfo.min: the bias is absorbed), as when transformers adds its mask to other biases."""
    if form == "bool":
        return keep
    value = float("-inf") if form == "-inf" else torch.finfo(dtype).min
    mask = torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, value)
    if form == "finfo.min+bias":
        mask = mask + torch.randn(keep.shape, generator=torch.Generator().manual_seed(7)).to(dtype)
    return mask


def _gold_mask(form: str, keep: torch.Tensor) -> torch.Tensor:
    """The same mask as bool, or (with the bias) as float64 with -inf: what it means, without the rule's threshold."""
    if form != "finfo.min+bias":
        return keep
    bias = torch.randn(keep.shape, generator=torch.Generator().manual_seed(7)).double()
    return bias.masked_fill(~keep, float("-inf"))


def _inputs(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    q1, q2 = (torch.randn(B, H, T, D, generator=g) for _ in range(2))
    k1, k2 = (torch.randn(B, HKV, S, D, generator=g) for _ in range(2))
    v = torch.randn(B, HKV, S, DV, generator=g)
    lam = torch.rand(B, H, T, generator=g)  # one λ per head and token: dλ of a masked row is its own entry
    return [x.to(dtype) for x in (q1, k1, q2, k2, v, lam)]


COT = torch.randn(B, H, T, DV, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


def _run(backend, args, mask, causal, *, perm=None, query_perm=None, cot=COT):
    """[out, dq1, dk1, dq2, dk2, dv, dλ] as float64; ``perm`` reorders the keys and ``query_perm`` the queries (both
    undone on the results: gradients land on the leaves in their own order, the output is put back)."""
    leaves = [x.clone().requires_grad_(True) for x in args]
    q1, k1, q2, k2, v, lam = leaves
    if (perm is not None or query_perm is not None) and causal:
        raise ValueError("a key or query order only for non-causal attention")
    if perm is not None:
        k1, k2, v = (x[:, :, perm] for x in (k1, k2, v))
        mask = mask[..., perm]
    if query_perm is not None:
        q1, q2, lam, cot = (x[:, :, query_perm] for x in (q1, q2, lam, cot))
        mask = mask[..., query_perm, :]
    out = diff_attention(q1, k1, q2, k2, v, lam, causal=causal, attn_mask=mask, backend=backend)
    (out * cot.to(out.dtype)).sum().backward()
    if query_perm is not None:
        out = out[:, :, torch.argsort(query_perm)]
    return [out.detach().double()] + [x.grad.double() for x in leaves]


def _yardstick(args, keep, form, causal):
    """The float32 reference on the bool form of the mask (-inf for the biased form): its error against the
    gold, in three key orders and three query orders when non-causal (the causal order is fixed; dk and dv sum
    over queries, so reordering keys alone leaves their rounding at one draw), and the float32 FlashAttention
    formulation (:func:`_flash_formulation`)."""
    mask = keep if form != "finfo.min+bias" else _gold_mask(form, keep).float()
    flash = _flash_formulation(args, keep, causal, bias=None if form != "finfo.min+bias" else mask)
    if causal:
        return [_run("reference", args, mask, causal), flash]
    key_orders = [None, *(torch.randperm(S, generator=torch.Generator().manual_seed(i)) for i in (1, 2))]
    query_orders = [torch.randperm(T, generator=torch.Generator().manual_seed(10 + i)) for i in (1, 2)]
    return (
        [_run("reference", args, mask, causal, perm=p) for p in key_orders]
        + [_run("reference", args, mask, causal, query_perm=p) for p in query_orders]
        + [flash]
    )


def _flash_formulation(args, keep, causal, bias=None, cot=COT):
    """[out, dq1, dk1, dq2, dk2, dv, dλ] in float32 as FlashAttention's backward forms them (dS = P∘(dP − D) with
    D = rowsum(dO∘O)), each map's keys repeated for GQA and their gradients summed back; ``bias`` (float, -inf where
    masked) is added to the scores; a row with no visible key has P = 0 (the rule under test)."""
    q1, k1, q2, k2, v, lam = args
    group = q1.shape[1] // k1.shape[1]
    k1, k2, v = (x.repeat_interleave(group, 1) for x in (k1, k2, v))
    visible = (keep & _causal_keep()) if causal else keep
    visible = visible.expand(-1, q1.shape[1], -1, -1)
    scale = q1.shape[-1] ** -0.5
    cot = cot.float()
    bias = torch.zeros(()) if bias is None else bias
    outs, grads = [], []
    for q, k, d_out in ((q1, k1, cot), (q2, k2, -lam.unsqueeze(-1) * cot)):
        scores = (q @ k.transpose(-1, -2) * scale + bias).masked_fill(~visible, float("-inf"))
        p = torch.softmax(scores, -1).nan_to_num(0.0)
        o = p @ v
        ds = p * (d_out @ v.transpose(-1, -2) - (d_out * o).sum(-1, keepdim=True))
        outs.append(o)
        grads.append((ds @ k * scale, ds.transpose(-1, -2) @ q * scale, p.transpose(-1, -2) @ d_out))
    (dq1, dk1, dv1), (dq2, dk2, dv2) = grads

    def fold(x):  # the query heads' gradients summed onto their key/value head
        return x.unflatten(1, (-1, group)).sum(2)

    out = outs[0] - lam.unsqueeze(-1) * outs[1]
    dlam = -(cot * outs[1]).sum(-1)
    return [x.double() for x in (out, dq1, fold(dk1), dq2, fold(dk2), fold(dv1 + dv2), dlam)]


def _assert_within_rounding(name, got, gold, yardsticks):
    err = (got - gold).abs().max().item()
    err_plain = max((y - gold).abs().max().item() for y in yardsticks)
    ulp = torch.finfo(torch.float32).eps * gold.abs().max().item()
    assert err <= 2 * err_plain + ulp, f"{name}: error {err:.3g} > 2 × float32 reference {err_plain:.3g} + {ulp:.2g}"


def _check(results, gold, yard, empty, backend):
    for i, (name, got, want) in enumerate(zip(NAMES, results, gold, strict=True)):
        assert torch.isfinite(got).all(), f"{backend} {name}"
        _assert_within_rounding(f"{backend} {name}", got, want, [y[i] for y in yard])
    out, dq1, _, dq2, _, _, dlam = results
    for b, i in empty:  # attends to nothing: output 0, no gradient into its query or its λ
        assert torch.all(out[b, :, i] == 0), f"{backend}: output of fully masked row ({b}, {i})"
        assert torch.all(dq1[b, :, i] == 0) and torch.all(dq2[b, :, i] == 0), f"{backend}: dq of row ({b}, {i})"
        assert torch.all(dlam[b, :, i] == 0), f"{backend}: dλ of row ({b}, {i})"


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(chunked, "DEFAULT_CHUNK", 4)  # several (and partial) chunks at T = 7


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("form", FORMS)
def test_every_backend_gives_fully_masked_rows_zero_output_and_gradient(form, causal, small_chunks):
    keep = _keep()
    empty = _empty_rows(keep, causal)
    assert {(0, 2)} <= empty and ((1, 0) in empty) == causal  # the rows the test is about
    args = _inputs()
    gold = _run("reference", [x.double() for x in args], _gold_mask(form, keep), causal)
    # the gold itself: a fully masked row's cotangent changes nothing (it contributes exactly nothing)
    cot = COT.clone()
    for b, i in empty:
        cot[b, :, i] = 0
    silent = _run("reference", [x.double() for x in args], _gold_mask(form, keep), causal, cot=cot)
    assert all(torch.equal(a, b) for a, b in zip(gold[1:], silent[1:], strict=True))
    yard = _yardstick(args, keep, form, causal)
    mask = _mask(form, keep)
    for backend in ("reference", "sdpa", "chunked", "auto"):
        _check(_run(backend, args, mask, causal), gold, yard, empty, backend)


@pytest.mark.parametrize("backend", ["reference", "sdpa", "chunked"])
@pytest.mark.parametrize("causal", [True, False])
def test_finfo_min_is_minus_infinity_bit_for_bit(backend, causal, small_chunks):
    """An additive finfo.min entry and -inf give the very same output and gradients, in a row that keeps some key
    (as before the rule: exp underflows to exactly 0) and in one that keeps none (0 by the rule)."""
    keep, args = _keep(), _inputs()
    minus_inf = _run(backend, args, _mask("-inf", keep), causal)
    finfo_min = _run(backend, args, _mask("finfo.min", keep), causal)
    for name, a, b in zip(NAMES, finfo_min, minus_inf, strict=True):
        assert torch.equal(a, b), f"{backend} {name}"


@pytest.mark.parametrize("form", FORMS)
def test_maps_of_a_fully_masked_row_are_zero(form):
    keep = _keep()
    maps = diff_attention_maps(*_inputs(), attn_mask=_mask(form, keep))
    for b, i in _empty_rows(keep, causal=True):
        for name in ("attn1", "attn2", "signed"):
            assert torch.all(getattr(maps, name)[b, :, i] == 0), f"{name} row ({b}, {i})"
        assert torch.all(maps.out[b, :, i] == 0)
    kept = torch.ones(B, T, dtype=torch.bool)
    for b, i in _empty_rows(keep, causal=True):
        kept[b, i] = False
    torch.testing.assert_close(maps.attn1.sum(-1).transpose(1, 2)[kept], torch.ones(int(kept.sum()), H))


@pytest.mark.parametrize("mask_dtype", [torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("backend", ["reference", "sdpa", "chunked"])
def test_the_threshold_is_that_of_the_dtype_the_mask_is_given_in(backend, mask_dtype, small_chunks):
    """A float16 mask's finfo.min (-65504) is far above float32's threshold: it still masks, because the rule reads
    a mask in its own dtype (validate turns what it masks into -inf when it casts it to q1's dtype)."""
    keep, args = _keep(), _inputs()
    mask = _mask("finfo.min", keep, mask_dtype)
    inp = validate(*args, causal=True, attn_mask=mask, scale=None)
    assert torch.equal(hidden_keys(inp.attn_mask), ~keep)
    got = _run(backend, args, mask, causal=True)
    want = _run(backend, args, _mask("-inf", keep), causal=True)
    for name, a, b in zip(NAMES, got, want, strict=True):
        assert torch.equal(a, b), f"{backend} {name}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_the_threshold_itself(dtype):
    floor = mask_floor(dtype)
    assert floor == torch.finfo(dtype).min / 2
    values = torch.tensor([float("-inf"), torch.finfo(dtype).min, floor, floor * 0.99, -1e4, 0.0], dtype=dtype)
    assert hidden_keys(values).tolist() == [True, True, True, False, False, False]
    assert hidden_keys(torch.tensor([True, False])).tolist() == [False, True]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("t", "s"), [(7, 9), (1, 5), (6, 6)])
@pytest.mark.parametrize("layout", ["padding", "4d", "per-head"])
def test_fully_masked_rows_finds_exactly_the_empty_rows(causal, t, s, layout):
    g = torch.Generator().manual_seed(t * s)
    shape = {"padding": (3, 1, 1, s), "4d": (3, 1, t, s), "per-head": (3, 2, t, s)}[layout]
    for _ in range(20):
        keep = torch.rand(shape, generator=g) > 0.6
        q = torch.zeros(3, 2, t, 4)
        k = torch.zeros(3, 1, s, 4)
        inp = validate(q, k, q, k, k, 0.5, causal=causal, attn_mask=_mask("finfo.min", keep), scale=None)
        visible = keep & _causal_keep(t, s) if causal else keep
        want = ~visible.any(-1, keepdim=True)
        got = fully_masked_rows(inp)
        assert torch.equal(got.expand_as(want), want.expand_as(got))


# --------------------------------------------------------------------------------------------------------------
# triton, under Triton's CPU interpreter without CUDA (set up as in test_triton.py)
# --------------------------------------------------------------------------------------------------------------


@pytest.fixture
def triton_kernels(monkeypatch):
    """The kernels, interpreted on CPU: TRITON_INTERPRET=1 must be set when they are first imported (triton.jit
    decides then) and while they run; it is restored after the import so other modules still see a CPU without
    Triton. Gives the module of their settings (diffattn.ops.triton.tuning)."""
    import_kernels()  # imports, and so decorates, every kernel (tests/ops/interpreter.py)
    from diffattn.ops.triton import tuning

    keep_interpreting(monkeypatch)
    monkeypatch.setattr(tuning, "BLOCK_OVERRIDE", (16, 16))
    return tuning


def _on(device, xs):
    return [x.to(device) if isinstance(x, torch.Tensor) else x for x in xs]


@pytest.mark.parametrize("causal", [True, False])
def test_triton_gives_fully_masked_rows_zero_output_and_gradient(triton_kernels, causal):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    keep = _keep()
    empty = _empty_rows(keep, causal)
    args = _inputs()
    for form in FORMS:
        gold = _run("reference", [x.double() for x in args], _gold_mask(form, keep), causal)
        yard = _yardstick(args, keep, form, causal)
        got = _run("triton", _on(device, args), _mask(form, keep).to(device), causal)
        _check([x.cpu() for x in got], gold, yard, empty, f"triton {form}")


def test_triton_float16_finfo_min_is_minus_infinity(triton_kernels):
    """float16's finfo.min (-65504) is a finite −94 500 in the kernel's log2 units: before the rule it left a fully
    masked row a softmax of its scores. Now it is -inf, output and gradients bit for bit those of a -inf mask."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    keep = _keep()
    args = _on(device, _inputs(torch.float16))
    finfo_min = _run("triton", args, _mask("finfo.min", keep, torch.float16).to(device), True)
    minus_inf = _run("triton", args, _mask("-inf", keep, torch.float16).to(device), True)
    for name, a, b in zip(NAMES, finfo_min, minus_inf, strict=True):
        assert torch.equal(a, b), name
    for b, i in _empty_rows(keep, causal=True):
        assert torch.all(finfo_min[0][b, :, i] == 0) and torch.all(finfo_min[1][b, :, i] == 0)


def test_fully_masked_rows_are_found_once_per_mask_until_it_changes(monkeypatch):
    """Every layer of a forward hands the op the same mask: its empty rows are found once (the same tensor returned),
    and again where the mask is edited in place, a call reads it with another causality or length, the mask is an
    inference tensor (no version counter), or a graph is traced or captured."""
    from diffattn.ops import _inputs

    found = []
    real = _inputs._fully_masked_rows
    monkeypatch.setattr(_inputs, "_fully_masked_rows", lambda *a: found.append(a[1:]) or real(*a))
    t, s = 3, 6
    keep = torch.rand(2, 1, t, s, generator=torch.Generator().manual_seed(0)) > 0.5
    keep[0, 0, 0] = False  # one empty row at least

    def rows(mask, causal=True):
        q_len = mask.shape[2]
        q, k = torch.zeros(2, 2, q_len, 4), torch.zeros(2, 1, s, 4)
        inp = validate(q, k, q, k, k, 0.5, causal=causal, attn_mask=mask, scale=None)
        want = real(inp.attn_mask, causal, q_len, s)
        got = fully_masked_rows(inp)
        assert torch.equal(got, want)
        return got

    first = rows(keep)
    assert rows(keep) is first and len(found) == 1
    keep[1, 0, 2, :] = False  # edited in place: its version counter moves
    assert rows(keep) is not first and len(found) == 2
    rows(keep, causal=False)
    assert len(found) == 3
    part = keep[:, :, :1]  # another tensor (a view): found for it
    rows(part)
    assert len(found) == 4
    with torch.inference_mode():
        frozen = keep.clone()
    rows(frozen)
    rows(frozen)
    assert len(found) == 6
    with torch.inference_mode():  # found under inference mode (an inference tensor): not handed to a later call out
        rows(keep)  # of it, which may save it for a backward
    assert not rows(keep).is_inference() and len(found) == 8
    # one mask of one value per key read by calls of two lengths (causality then differs by row): found for each
    per_key = keep[:, :, :1].clone()
    for q_len in (1, 3, 1):
        q, k = torch.zeros(2, 2, q_len, 4), torch.zeros(2, 1, s, 4)
        inp = validate(q, k, q, k, k, 0.5, causal=True, attn_mask=per_key, scale=None)
        assert torch.equal(fully_masked_rows(inp), real(per_key, True, q_len, s))
    assert len(found) == 11
    monkeypatch.setattr(_inputs, "values_readable", lambda: False)
    rows(keep)
    rows(keep)
    assert len(found) == 13
