"""The SDPA routes hand SDPA's backward each call's gradient at strides fixed by the call (diffattn/ops/sdpa.py,
``_GradInOutputLayout``): PyTorch's cuDNN attention caches its backward graph under Q, K and V alone, with the
strides of the first gradient it got baked in, so calls with the same Q, K, V — the two maps of ``cudnn_maps``, or
one call in two steps — must never hand it gradients in two layouts. Checked here on this CPU's SDPA with the model's
Q and K, [B, T, H, d] memory seen as [B, H, T, d] (transformers' view and transpose), and the op's output gradient in
two layouts. The guard runs on CUDA only (``GUARDED_DEVICES``): here it is switched on for the CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from diffattn import ops
from diffattn.ops import sdpa

from .interpreter import import_kernels, keep_interpreting

import_kernels("diffattn.ops.triton.epilogue")  # the +epilogue routes' kernels: interpreted without CUDA


def test_the_gradient_is_handed_on_in_the_outputs_layout_and_only_copied_when_it_is_not():
    o = torch.randn(2, 5, 3, 4).transpose(1, 2).requires_grad_()  # [2, 3, 5, 4] laid out [2, 5, 3, 4]
    out = sdpa._GradInOutputLayout.apply(o)
    other = torch.randn(2, 3, 5, 4)  # contiguous: another layout
    (got,) = torch.autograd.grad(out, o, other)
    assert got.stride() == o.stride() and torch.equal(got, other)
    alike = torch.randn(2, 5, 3, 4).transpose(1, 2)
    (got,) = torch.autograd.grad(sdpa._GradInOutputLayout.apply(o), o, alike)
    assert got.data_ptr() == alike.data_ptr()  # already in the output's layout: no copy
    # a dimension of size 1 has no layout to keep: a gradient differing in its stride alone is not copied
    o = torch.randn(1, 4, 3).requires_grad_()
    one = torch.empty_strided((1, 4, 3), (999, 3, 1)).normal_()
    (got,) = torch.autograd.grad(sdpa._GradInOutputLayout.apply(o), o, one)
    assert got.data_ptr() == one.data_ptr()


def _model_layout(b, h, t, d, generator, dtype=torch.float32):
    """transformers' heads: a projection's [B, T, H·d] output viewed as [B, T, H, d] and transposed."""
    return torch.randn(b, t, h, d, generator=generator).to(dtype).transpose(1, 2).requires_grad_()


def _cudnn_route_on_the_cpu(monkeypatch) -> None:
    """The ``cudnn`` routes' code path on this CPU: the device check passed and the cuDNN-only dispatch left to the
    CPU's SDPA (as benchmarks/step_host_time.py does)."""
    import contextlib

    import torch.nn.attention

    monkeypatch.setattr(sdpa, "_cudnn_device_reason", lambda *a: None)
    monkeypatch.setattr(torch.nn.attention, "sdpa_kernel", lambda *a, **k: contextlib.nullcontext())


@pytest.mark.parametrize(
    "route, shared",
    [("sdpa", False), ("sdpa_split", False), ("sdpa_maps", False), ("sdpa_maps+epilogue", False),
     ("sdpa+epilogue", False), ("sdpa_split+epilogue", False), ("cudnn", False), ("cudnn+epilogue", False),
     ("sdpa", True), ("sdpa+epilogue", True)],
)  # fmt: skip
def test_each_sdpa_calls_gradient_layout_is_fixed_whatever_layout_the_ops_gradient_has(route, shared, monkeypatch):
    # what cuDNN's cache needs: the same call (same Q, K, V) gets its output gradient at the same strides every time —
    # here with the op's output gradient contiguous once and [B, T, H, dv]-ordered once (the one-call routes with the
    # epilogue without the guard: its backward writes the gradient in the output's layout itself)
    keep_interpreting(monkeypatch)
    _cudnn_route_on_the_cpu(monkeypatch)
    monkeypatch.setattr(sdpa, "GUARDED_DEVICES", frozenset({"cpu", "cuda"}))  # as on CUDA (only guarded there)
    seen = []
    real = F.scaled_dot_product_attention

    def recording(*args, **kwargs):
        out = real(*args, **kwargs)
        out.register_hook(
            lambda g, out=out: seen.append((tuple(out.shape), _strides_of_real_dims(g.stride(), out.shape)))
        )
        return out

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    g = torch.Generator().manual_seed(0)
    b, h, t, d = 2, 2, 7, 4
    dtype = torch.float32
    if route.startswith("cudnn"):  # what the cudnn routes take: 16-bit, widths multiples of 8
        d, dtype = 8, torch.bfloat16
    q1, q2, k1 = (_model_layout(b, h, t, d, g, dtype) for _ in range(3))
    k2 = k1 if shared else _model_layout(b, h, t, d, g, dtype)
    v = _model_layout(b, h, t, d if shared else 2 * d, g, dtype)
    lam = torch.tensor(0.3, requires_grad=True)
    cotangent = torch.randn(b, h, t, v.shape[-1], generator=g).to(dtype)  # contiguous [B, H, T, dv]
    per_layout = []
    for given in (cotangent, cotangent.transpose(1, 2).contiguous().transpose(1, 2)):
        seen.clear()
        ops.diff_attention(q1, k1, q2, k2, v, lam, backend=route).backward(given)
        per_layout.append(list(seen))
    assert per_layout[0], "no SDPA call recorded"
    assert per_layout[0] == per_layout[1]
    # and within one backward, calls of one shape (the two maps, V's slices) get one layout
    for shape in {shape for shape, _ in per_layout[0]}:
        assert len({tuple(strides) for at, strides in per_layout[0] if at == shape}) == 1


def _strides_of_real_dims(stride, shape):
    return [s for s, n in zip(stride, shape, strict=True) if n > 1]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("route", ["cudnn_maps", "cudnn_maps+epilogue", "cudnn", "cudnn+epilogue", "sdpa_maps", "sdpa"])
def test_the_same_call_twice_with_gradients_in_two_layouts_gives_the_same_gradients(route):
    # the hazard itself, on the GPU: the same Q, K, V (so the same cached cuDNN backward graph) and the same output
    # gradient, given contiguous the first time and laid out [B, T, H, dv] the second; a graph reading the second by
    # the first one's strides gives gradients off by O(1), not by bf16 rounding
    g = torch.Generator(device="cuda").manual_seed(0)
    b, h, t, d = 2, 3, 333, 64  # a shape no other test uses: the first call builds its graphs
    leaves = [torch.randn(b, t, h, w, device="cuda", generator=g, dtype=torch.bfloat16).transpose(1, 2)
              for w in (d, d, d, d, 2 * d)]  # fmt: skip
    leaves = [x.requires_grad_() for x in leaves]
    cot = torch.randn(b, h, t, 2 * d, device="cuda", generator=g, dtype=torch.bfloat16)
    grads = []
    for cotangent in (cot, cot.transpose(1, 2).contiguous().transpose(1, 2)):
        out = ops.diff_attention(*leaves, 0.4, backend=route)
        grads.append(torch.autograd.grad(out, leaves, cotangent))
    for first, second in zip(*grads, strict=True):
        assert ((second.float() - first.float()).norm() / first.float().norm()).item() < 2e-2


@pytest.mark.parametrize(
    "route, shared, guards",
    [("cudnn+epilogue", False, 0), ("sdpa_split+epilogue", False, 0), ("sdpa+epilogue", False, 0),
     ("sdpa+epilogue", True, 0), ("cudnn", False, 1), ("sdpa_split", False, 1), ("sdpa_maps+epilogue", False, 2)],
)  # fmt: skip
def test_the_guard_only_where_a_gradient_may_arrive_in_another_layout(route, shared, guards, monkeypatch):
    # a guard is an autograd Function a call (host time a small model's step is bound by): none where the epilogue's
    # backward writes the whole output's gradient itself (one call, or sdpa_split's two read unjoined); one where the
    # op's output gradient reaches the call (no epilogue), one a map where the epilogue hands O1 the gradient as given
    keep_interpreting(monkeypatch)
    _cudnn_route_on_the_cpu(monkeypatch)
    monkeypatch.setattr(sdpa, "GUARDED_DEVICES", frozenset({"cpu", "cuda"}))
    g = torch.Generator().manual_seed(0)
    dtype = torch.bfloat16 if route.startswith("cudnn") else torch.float32  # the cudnn routes take 16-bit only
    q1, q2, k1 = (_model_layout(1, 2, 5, 8, g, dtype) for _ in range(3))
    k2 = k1 if shared else _model_layout(1, 2, 5, 8, g, dtype)
    v = _model_layout(1, 2, 5, 8 if shared else 16, g, dtype)
    out = ops.diff_attention(q1, k1, q2, k2, v, 0.3, backend=route)
    assert sum("GradInOutputLayout" in type(fn).__name__ for fn in _graph_nodes(out.grad_fn)) == guards


def test_on_the_cpu_the_gradient_is_not_touched():
    # no cuDNN there: the guard's copies would only cost (a DIFF V2 model trains through `sdpa` on the CPU)
    q1, k1, q2, v = (torch.randn(1, 2, 5, 4, requires_grad=True) for _ in range(4))
    out = ops.diff_attention(q1, k1, q2, k1, v, 0.5, backend="sdpa")
    assert out.grad_fn is not None and "GradInOutputLayout" not in repr(_graph_nodes(out.grad_fn))


def _graph_nodes(fn, seen=None):
    seen = [] if seen is None else seen
    if fn is not None and fn not in seen:
        seen.append(fn)
        for next_fn, _ in fn.next_functions:
            _graph_nodes(next_fn, seen)
    return seen


@pytest.mark.parametrize(
    "key, route",
    [("v1 d16 dv32 fp32 causal none train", r) for r in ("sdpa", "sdpa_split", "sdpa_maps", "sdpa_maps+epilogue")]
    + [("shared_k d16 dv16 fp32 causal none train", r) for r in ("sdpa", "sdpa_maps")],
)  # (the one-call routes with the epilogue have no guard: test_the_guard_only_where_a_gradient_may_arrive_...)
def test_in_a_model_the_guard_copies_nothing_where_cuda_returns_outputs_in_qs_order(key, route, monkeypatch):
    # CUDA's attention kernels return a model's output [B, T, H, dv]-ordered (FlashAttention always, cuDNN following
    # Q), and the model's output gradient comes back in that order: each route cuts and joins its calls' outputs in
    # their own order, so the guard finds every gradient already in its output's layout. Cut in [B, H, T, dv] order
    # (two slices of a stacked output, an unbind of an interleaved one, V's slices joined contiguous) the join's
    # gradient came back contiguous and the guard copied it: one copy a call (sdpa), one a map (sdpa_maps, V1)
    from diffattn.bench import route_sweep as rs

    keep_interpreting(monkeypatch)
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: _tokens_outer(real(*a, **k)))
    monkeypatch.setattr(sdpa, "GUARDED_DEVICES", frozenset({"cpu"}))
    copies = []
    guard = sdpa._GradInOutputLayout.backward

    def counting(ctx, g):
        copies.append(not sdpa._same_layout(g, *ctx.layout))
        return guard(ctx, g)

    monkeypatch.setattr(sdpa._GradInOutputLayout, "backward", staticmethod(counting))
    cls = rs.CallClass.from_key(key)
    p = rs.make_problem(cls, batch=2, heads=2, t=16, s=16, device="cpu", dtype=torch.float32, seed=0)
    out = rs.route_fn(route, {})(p)
    grads = torch.autograd.grad(out, p.leaves, rs.model_cotangent(out.shape, out.device, out.dtype))
    assert copies and not any(copies), f"{route}: {sum(copies)} of {len(copies)} guarded gradients copied"
    assert all(g.abs().sum() > 0 for g in grads)


def _tokens_outer(o: torch.Tensor) -> torch.Tensor:
    """``o`` laid out [B, T, H, dv], as CUDA's kernels return a model's attention output."""
    return o.transpose(1, 2).contiguous().transpose(1, 2)


def _adapter_configs():
    from diffattn.adapters import DAAConfig, DexConfig, DiffV2Config, DiffVConfig

    return {
        # Dex's layers differ in what follows the call: one with selected heads (an index_add on the output), one
        # with none (the output as it is)
        "dex": DexConfig(heads=[[1, 2], []], anneal_steps=10),
        "daa": DAAConfig(anneal_steps=10),
        "diffv": DiffVConfig(anneal_steps=10),
        "diff_v2": DiffV2Config(anneal_steps=10),
    }


@pytest.mark.parametrize("implementation", ["diffattn", "sdpa"])
@pytest.mark.parametrize("method", ["dex", "daa", "diffv", "diff_v2"])
def test_an_adapted_models_sdpa_calls_of_one_signature_get_their_gradients_in_one_layout(method, implementation,
                                                                                         monkeypatch):  # fmt: skip
    # the adapters' SDPA calls outside this module's routes — a single map's call in the adapted layer, and
    # transformers' SDPA under attn_implementation "sdpa" — are not guarded (a guard is an autograd Function a layer,
    # host time a small model's step pays). What makes that safe is this property: the layers' calls that cuDNN's
    # graph cache cannot tell apart (same Q, K, V shapes and strides) get their output gradients in one layout, with
    # the outputs laid out as CUDA's kernels return them ([B, T, H, d]). A change that breaks it (a layer that treats
    # its output otherwise) must guard those calls (ops.sdpa._GradInOutputLayout)
    from diffattn.adapters import adapt, attention_modules, set_adapter_step

    from ..tiny_models import ids, tiny

    seen = {}
    real = F.scaled_dot_product_attention

    def recording(q, k, v, *args, **kwargs):
        out = _tokens_outer(real(q, k, v, *args, **kwargs))
        signature = tuple((tuple(x.shape), tuple(_strides_of_real_dims(x.stride(), x.shape))) for x in (q, k, v))
        if out.requires_grad:
            out.register_hook(
                lambda g: seen.setdefault(signature, set()).add(tuple(_strides_of_real_dims(g.stride(), g.shape)))
            )
        return out

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    model = adapt(tiny("llama"), _adapter_configs()[method])
    if implementation != "diffattn":
        model.set_attn_implementation(implementation)
    set_adapter_step(model, 10)
    with torch.no_grad():  # away from any identity initialisation, so that every path carries a gradient
        for p in (p for _, _, m in attention_modules(model) for p in m.method.parameters()):
            p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    model(ids()).logits.square().sum().backward()
    assert seen, "no SDPA call recorded"
    assert all(len(layouts) == 1 for layouts in seen.values()), seen


#: every route that reaches SDPA through F.scaled_dot_product_attention (the one-node routes call cuDNN's ATen op
#: directly, and the fused kernel calls none)
_SDPA_ROUTES = ("sdpa", "sdpa_split", "sdpa_maps", "cudnn", "cudnn_maps", "sdpa+epilogue", "sdpa_split+epilogue",
                "sdpa_maps+epilogue", "cudnn+epilogue", "cudnn_maps+epilogue")  # fmt: skip


@pytest.mark.parametrize("padded", [False, True])
def test_every_route_of_a_class_in_one_process_hands_each_sdpa_call_one_gradient_layout(padded, monkeypatch):
    # cuDNN's cache is per process and keyed by Q, K, V alone: two routes that make the same call must hand it the same
    # gradient strides, or the second reads its gradient by the first's (the H200 of 2026-11-29, test_gpu.py in one
    # process: sdpa_split+epilogue after sdpa_split wrong by ~1.2 in dQ, dK, dV — each route alone was right)
    keep_interpreting(monkeypatch)
    _cudnn_route_on_the_cpu(monkeypatch)
    monkeypatch.setattr(sdpa, "GUARDED_DEVICES", frozenset({"cpu", "cuda"}))  # as on CUDA (only guarded there)
    layouts: dict[tuple, set] = {}
    real = F.scaled_dot_product_attention

    def key_of(t: torch.Tensor) -> tuple:
        return tuple(t.shape), tuple(_strides_of_real_dims(t.stride(), t.shape)), t.dtype

    def recording(q, k, v, attn_mask=None, *args, **kwargs):
        out = real(q, k, v, attn_mask, *args, **kwargs)
        mask = None if attn_mask is None else key_of(attn_mask)
        key = (key_of(q), key_of(k), key_of(v), mask, bool(kwargs.get("is_causal", False)))
        out.register_hook(
            lambda g, route=route: layouts.setdefault(key, set()).add(
                (tuple(_strides_of_real_dims(g.stride(), g.shape)), route)
            )
        )
        return out

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    g = torch.Generator().manual_seed(0)
    b, h, t, d = 2, 2, 7, 8  # 16-bit, widths multiples of 8: what the cudnn routes take
    q1, q2, k1, k2 = (_model_layout(b, h, t, d, g, torch.bfloat16) for _ in range(4))
    v = _model_layout(b, h, t, 2 * d, g, torch.bfloat16)
    lam = torch.tensor(0.3, requires_grad=True)
    mask = None
    if padded:
        mask = torch.ones(b, t, dtype=torch.bool)
        mask[0, :2] = False  # the first row's first two keys are padding
    cotangent = torch.randn(b, h, t, 2 * d, generator=g).to(torch.bfloat16)
    for route in _SDPA_ROUTES:
        ops.diff_attention(q1, k1, q2, k2, v, lam, attn_mask=mask, backend=route).backward(cotangent)
    assert layouts, "no SDPA call recorded"
    for key, seen in layouts.items():
        strides = {s for s, _ in seen}
        assert len(strides) == 1, f"one call {key[:3]} handed gradients at {sorted(seen)}"
