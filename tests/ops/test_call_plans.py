"""A call's plan (diffattn/ops/call_plans.py): where a call of the op went straight to one autograd node, later calls of
the same signature call that node with nothing before it.

Without a GPU the node runs as tests/ops/test_direct.py runs it (SDPA's CPU kernels in cuDNN's place, the epilogue's
kernels interpreted). A plan must give, bit for bit, what the whole path gives (output, every gradient, the graph);
be made only where the whole path was exactly that node on the caller's own tensors and its output the call's; be keyed
by everything the path's decision reads; and be forgotten where that decision may change."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from diffattn import ops
from diffattn.ops import HeadNorm, call_plans, direct, routes, sdpa

from .interpreter import keep_interpreting
from .test_direct import SDPA_OPS, _model_inputs, _run, _sdpa_backward, _sdpa_forward

NORM = HeadNorm(1e-5, 0.8)


def _inputs(**kwargs):
    """A DIFF V1 layer's Q, K, V halves and λ (test_direct.py's), small: each call interprets the epilogue's kernels."""
    return _model_inputs(torch.float32, **{"b": 1, "t": 6, **kwargs})


@pytest.fixture(autouse=True)
def _setup(monkeypatch):
    keep_interpreting(monkeypatch)
    monkeypatch.setattr(direct, "ATTENTION_OPS", SDPA_OPS)
    # where the one node does not apply its route runs cudnn+epilogue, which forces cuDNN's kernel: the sdpa route's
    # computation stands in for it here (the same maps, Q and K padded)
    monkeypatch.setattr(sdpa, "diff_attention_cudnn", sdpa.diff_attention_sdpa)
    real = ops.route_unsupported  # cuDNN's support check waived, as in test_direct.py
    monkeypatch.setattr(ops, "route_unsupported",
                        lambda name, inp: None if name in routes.ONE_NODE_ROUTES else real(name, inp))  # fmt: skip


@pytest.fixture
def whole_runs(monkeypatch) -> list[str]:
    """The entries whose whole path ran, one name a call."""
    ran = []
    for name in ("_stacked_whole", "_pairs_whole"):
        real = getattr(ops, name)
        monkeypatch.setattr(ops, name, lambda *a, _real=real, _name=name, **k: ran.append(_name) or _real(*a, **k))
    return ran


def stacked(backend=routes.DIRECT, head_norm=NORM, **kwargs):
    def call(q, k, v, lam):
        with ops.fused_head_norm(True):
            return ops.diff_attention_stacked(q, k, v, lam, backend=backend, head_norm=head_norm, **kwargs)

    return call


def test_a_second_call_of_the_same_kind_runs_the_recorded_node_and_gives_the_same_bits(whole_runs):
    tensors = _inputs()
    first = _run(stacked(), tensors)
    assert whole_runs == ["_stacked_whole"] and len(call_plans.PLANS) == 1
    second = _run(stacked(), tensors)
    assert whole_runs == ["_stacked_whole"], "the plan ran, not the whole path"
    for name, a, b in zip(("out", "dq", "dk", "dv", "dlam"), first, second, strict=True):
        assert a.shape == b.shape and a.stride() == b.stride() and torch.equal(a, b), name
    out = stacked()(*tensors)
    assert type(out.grad_fn).__name__ == "_OneNodeBackward"  # the same graph: one node to the caller's tensors
    assert len([f for f, _ in out.grad_fn.next_functions if f is not None]) == 4


def test_under_autocast_the_entry_casts_as_the_whole_path_does(whole_runs):
    # Q and K in float32 (RoPE's output under autocast), V in bf16: the whole path casts Q and K to bf16 first
    q, k, v, lam = _inputs()
    v = v.detach().to(torch.bfloat16).requires_grad_()
    tensors = (q, k, v, lam)

    def call(*x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return stacked()(*x)

    first, second = _run(call, tensors), _run(call, tensors)
    assert whole_runs == ["_stacked_whole"] and len(call_plans.PLANS) == 1
    assert first[0].dtype == torch.bfloat16
    for name, a, b in zip(("out", "dq", "dk", "dv", "dlam"), first, second, strict=True):
        assert torch.equal(a, b), name
    # and the same call with the plans off (no signature): the same bits
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(call_plans, "signature", lambda *a, **k: None)
        for name, a, b in zip(("out", "dq", "dk", "dv", "dlam"), first, _run(call, tensors), strict=True):
            assert torch.equal(a, b), name


def test_the_pairs_entry_with_v_read_once_is_planned_too(whole_runs):
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 4, 7, 8, generator=g).requires_grad_()
    k = torch.randn(1, 4, 7, 8, generator=g).requires_grad_()
    v = torch.randn(1, 2, 7, 16, generator=g).requires_grad_()
    lam = torch.tensor(0.3, requires_grad=True)

    def call(*x):
        with ops.fused_head_norm(True):
            return ops.diff_attention_pairs(*x, backend=routes.SHARED_V, head_norm=NORM)

    first, second = _run(call, (q, k, v, lam)), _run(call, (q, k, v, lam))
    assert whole_runs == ["_pairs_whole"] and len(call_plans.PLANS) == 1
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


def _v2_call(q, k, v, lam):
    return ops.diff_attention_pairs(q, k, v, lam, backend=routes.DIRECT)


@pytest.mark.parametrize("form", ["V1, λ per head", "DIFF V2, λ per head and token", "DIFF V2, λ a transposed view"])
def test_a_lambda_the_path_views_is_viewed_again_by_the_plan_with_the_same_bits_and_graph(whole_runs, form):
    # λ per head [H] and DIFF V2's per head and token [B, H, T] reach the node as the path's check views them ([1, H,
    # 1, 1], [B, H, T, 1]): the plan makes that view again — output and every gradient bit for bit the whole path's
    # with plans off, and the node's input a view of the caller's λ, as there
    from .test_direct import _v2_inputs

    if form.startswith("V1"):
        tensors, call, entry = _inputs(lam_form="per_head"), stacked(), "_stacked_whole"
    else:
        q, k, v, lam = _v2_inputs(torch.float32, b=1, t=6)
        if form.endswith("transposed view"):  # as DIFF V2's gate hands it over: [B, T, H] transposed
            lam = lam.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()
        tensors, call, entry = (q, k, v, lam), _v2_call, "_pairs_whole"
    first = _run(call, tensors)
    assert whole_runs == [entry] and len(call_plans.PLANS) == 1
    planned = _run(call, tensors)
    assert whole_runs == [entry], "the plan ran"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(call_plans, "signature", lambda *a, **k: None)
        whole = _run(call, tensors)
    for name, a, b, c in zip(("out", "dq", "dk", "dv", "dlam"), planned, first, whole, strict=True):
        assert a.shape == c.shape and a.stride() == c.stride(), name
        assert torch.equal(a, b) and torch.equal(a, c), name
    out = call(*tensors)
    (lam_node,) = [f for f, _ in out.grad_fn.next_functions if f is not None and "View" in type(f).__name__]
    assert lam_node.next_functions[0][0].variable is tensors[3]
    with pytest.MonkeyPatch.context() as patch:  # the whole path's graph: the same view node
        patch.setattr(call_plans, "signature", lambda *a, **k: None)
        out = call(*tensors)
    assert [type(f).__name__ for f, _ in out.grad_fn.next_functions if f is not None and "View" in type(f).__name__
            ] == [type(lam_node).__name__]  # fmt: skip


def test_a_lambda_the_node_took_as_a_copy_makes_no_plan():
    lam = torch.rand(2, 3, 4)
    assert call_plans._lam_view(lam, lam) is None
    assert call_plans._lam_view(lam.view(2, 3, 4, 1), lam) == (2, 3, 4, 1)
    assert call_plans._lam_view(lam.transpose(1, 2).unsqueeze(-1), lam) is False  # another layout of its memory
    assert call_plans._lam_view(lam.unsqueeze(-1).clone(), lam) is False  # a copy
    assert call_plans._lam_view(lam.double().unsqueeze(-1), lam) is False  # a cast
    assert call_plans._lam_view(lam[:, :, 1:].unsqueeze(-1), lam) is False  # a part of it
    assert call_plans._lam_view(lam.detach().view(2, 3, 4, 1), lam) is False  # a view of another tensor (its memory)
    assert call_plans._lam_view(lam.view(torch.int32).view(2, 3, 4, 1), lam) is False  # its memory as another dtype
    base = torch.rand(2, 3, 4)
    assert call_plans._lam_view(base[1].view(3, 4, 1), base[0]) is False  # its neighbour in the same memory
    assert call_plans._lam_view(base[0].view(3, 4, 1), base[0]) == (3, 4, 1)


@pytest.mark.parametrize("why", ["mask", "segments", "λ a float", "norm after the node", "no gradient",
                                 "another route"])  # fmt: skip
def test_no_plan_where_the_whole_path_was_not_one_node_on_the_callers_tensors(whole_runs, why):
    q, k, v, lam = _inputs()
    kwargs, call = {}, stacked()
    if why == "mask":
        kwargs = dict(attn_mask=torch.ones(1, 6, dtype=torch.bool), causal=False)
    if why == "segments":
        kwargs = dict(segment_ids=torch.zeros(1, 6, dtype=torch.long))
    if why == "λ a float":
        lam = 0.4
    if why in ("mask", "segments", "λ a float"):
        call = stacked(**kwargs)
    if why == "norm after the node":  # the node, then PyTorch's norm: the node's output is not the call's

        def call(*x):
            with ops.fused_head_norm(False):
                return ops.diff_attention_stacked(*x, backend=routes.DIRECT, head_norm=NORM)

    if why == "another route":
        call = stacked(backend="sdpa")
    for _ in range(2):
        with torch.set_grad_enabled(why != "no gradient"):
            call(q, k, v, lam)
    if why == "no gradient":  # no node plan, but a route plan (decoding's), made at the second call
        assert whole_runs == ["_stacked_whole"] * 2 and len(call_plans.ROUTE_PLANS) == 1
    else:
        assert whole_runs == ["_stacked_whole"] * 2 and not call_plans.ROUTE_PLANS
    assert not call_plans.PLANS


@pytest.mark.parametrize("change", ["requires_grad", "grad mode", "layout", "dtype", "switch", "backend", "norm"])
def test_a_call_of_another_signature_runs_the_whole_path(whole_runs, change):
    q, k, v, lam = _inputs()
    stacked()(q, k, v, lam)
    call = stacked()
    if change == "requires_grad":
        q = q.detach()
    if change == "layout":
        q = q.detach().contiguous().requires_grad_()
    if change == "dtype":
        q, k, v = (x.detach().double().requires_grad_() for x in (q, k, v))
    if change == "backend":
        call = stacked(backend=routes.SHARED_V)  # which runs cudnn+epilogue on stacked heads: not one node
    if change == "norm":
        call = stacked(head_norm=HeadNorm(1e-6, 0.8))
    if change == "switch":
        with ops.pairs_layout(False):
            call(q, k, v, lam)
    elif change == "grad mode":
        with torch.no_grad():
            call(q, k, v, lam)
    else:
        call(q, k, v, lam)
    assert whole_runs == ["_stacked_whole"] * 2


def test_what_may_change_the_paths_decision_forgets_the_plans(whole_runs, monkeypatch):
    tensors = _inputs()
    call = stacked()
    call(*tensors)
    routes.reset()  # a route table read again
    call(*tensors)
    assert whole_runs == ["_stacked_whole"] * 2
    # the node's attention ops replaced: the plan made with the others is stale
    monkeypatch.setattr(direct, "ATTENTION_OPS", direct.AttentionOps(_sdpa_forward, _sdpa_backward, lambda *a: True))
    call(*tensors)
    assert whole_runs == ["_stacked_whole"] * 3 and len(call_plans.PLANS) == 1

    # cuDNN refusing a node's backward: its calls run cudnn+epilogue from then on, so no plan may run the node
    def raises(*args):
        raise RuntimeError("cuDNN Frontend error: no valid engine configs")

    monkeypatch.setattr(direct, "ATTENTION_OPS", direct.AttentionOps(_sdpa_forward, raises, lambda *a: True))
    monkeypatch.setattr(direct, "_REFUSED", {})
    call(*tensors)  # whole path (the ops replaced), a new plan
    assert len(call_plans.PLANS) == 1
    call(*tensors).sum().backward()  # the plan's node; its backward refused: forgotten
    assert not call_plans.PLANS
    call(*tensors)
    assert not call_plans.PLANS, "the refused kind runs cudnn+epilogue: no node, no plan"


def test_a_route_that_fails_at_run_time_forgets_the_plans(monkeypatch, caplog):
    tensors = _inputs()
    stacked()(*tensors)
    assert call_plans.PLANS
    # auto's first route raising (ops._run_auto): recorded as failed for its class, and the plans forgotten with it
    monkeypatch.setattr(ops, "auto_routes", lambda inp, cls=None: ["sdpa_split", "sdpa"])
    monkeypatch.setattr(ops, "_FAILED_ROUTES", {})
    real = ops._impl

    def fail(*args, **kwargs):
        raise RuntimeError("out of resources: shared memory")

    monkeypatch.setattr(ops, "_impl", lambda name: fail if name == "sdpa_split" else real(name))
    stacked(backend="auto")(*tensors)
    assert ops._FAILED_ROUTES and not call_plans.PLANS


class _OutOfResources(Exception):
    """As Triton's errors are: not a RuntimeError (triton.runtime.errors.OutOfResources, CompilationError)."""


@pytest.mark.parametrize("error", [RuntimeError, _OutOfResources], ids=["RuntimeError", "triton's kind"])
def test_a_plan_whose_node_raises_runs_the_whole_path(whole_runs, error):
    tensors = _inputs()
    want = _run(stacked(), tensors)
    ((key, plan),) = call_plans.PLANS.items()

    def raises(*args):
        raise error("CUDNN_STATUS_EXECUTION_FAILED / out of resource: shared memory")

    call_plans.PLANS[key] = call_plans.NodePlan(raises, plan.constants, plan.stale, plan.autocast_off)
    got = _run(stacked(), tensors)
    assert whole_runs == ["_stacked_whole"] * 2
    for a, b in zip(want, got, strict=True):
        assert torch.equal(a, b)


def test_out_of_memory_in_a_planned_node_is_the_callers_to_see():
    tensors = _inputs()
    stacked()(*tensors)
    ((key, plan),) = call_plans.PLANS.items()

    def raises(*args):
        raise torch.OutOfMemoryError("CUDA out of memory")

    call_plans.PLANS[key] = call_plans.NodePlan(raises, plan.constants, plan.stale, plan.autocast_off)
    with pytest.raises(torch.OutOfMemoryError):
        stacked()(*tensors)


def test_no_plan_is_kept_that_was_recorded_across_a_forget():
    # another thread's refusal (direct._refuse) forgetting the plans while this call's whole path runs
    tensors = _inputs()
    key = call_plans.signature("stacked", routes.DIRECT, *tensors, True, None, None, None, NORM)

    def whole():
        out = stacked()(*tensors)
        call_plans.forget()
        return out

    call_plans.PLANS.clear()
    with pytest.MonkeyPatch.context() as patch:
        real = call_plans.signature
        patch.setattr(call_plans, "signature", lambda *a, **k: None)  # the inner call plans nothing itself
        call_plans.planned(key, tensors, whole)
        patch.setattr(call_plans, "signature", real)
    assert not call_plans.PLANS


def test_arguments_the_whole_path_refuses_get_its_error_not_the_plans():
    q, k, v, lam = _inputs()
    with pytest.raises(ValueError, match="scale"):
        stacked(scale=[0.3])(q, k, v, lam)
    with pytest.raises(ValueError, match="backend"):
        stacked(backend=["auto"])(q, k, v, lam)


class _Tagged(torch.Tensor):
    """A tensor subclass (its torch functions pass through): what FSDP's or a profiler's tensors are to the op."""


def test_no_plan_for_a_tensor_subclass_or_under_a_torch_function_mode(whole_runs):
    from torch.overrides import TorchFunctionMode

    q, k, v, lam = _inputs()
    for _ in range(2):
        stacked()(q.as_subclass(_Tagged), k, v, lam)
    assert whole_runs == ["_stacked_whole"] * 2 and not call_plans.PLANS

    class PassThrough(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    for _ in range(2):
        with PassThrough():
            stacked()(q, k, v, lam)
    assert whole_runs == ["_stacked_whole"] * 4 and not call_plans.PLANS


def test_a_nan_lambda_is_still_refused_on_the_cpu_by_a_plan():
    q, k, v, lam = _inputs()
    stacked()(q, k, v, lam)
    assert call_plans.PLANS
    with pytest.raises(ValueError, match="lam must be finite"):
        stacked()(q, k, v, torch.tensor(float("nan"), requires_grad=True))


def test_the_plans_are_bounded(monkeypatch):
    monkeypatch.setattr(call_plans, "MAX_PLANS", 2)
    for t in (5, 6, 7):
        stacked()(*_inputs(t=t))
        assert 1 <= len(call_plans.PLANS) <= 2


def test_a_models_steps_run_each_layers_plan_from_the_second_on_with_the_same_loss_and_gradients():
    # each layer's call has a signature of its own (its head norm's multiplier follows the layer's λ_init): the first
    # step makes each layer's plan, the second runs them
    from diffattn.models.build import build_model

    def two_steps(plans: bool):
        call_plans.forget()
        model = build_model("debug", "diff", backend=routes.DIRECT, seed=0)
        ids = torch.randint(0, model.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))
        steps = []
        with pytest.MonkeyPatch.context() as patch, ops.fused_head_norm(True):
            if not plans:
                patch.setattr(call_plans, "signature", lambda *a, **k: None)
            ran = []
            real = ops._stacked_whole
            patch.setattr(ops, "_stacked_whole", lambda *a, **k: ran.append(1) or real(*a, **k))
            for _ in range(2):
                model.zero_grad(set_to_none=True)
                loss = model(input_ids=ids, labels=ids, use_cache=False).loss
                loss.backward()
                grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
                steps.append((loss.detach(), grads, len(ran), model.config.num_hidden_layers))
                ran.clear()
        return steps

    planned, whole = two_steps(True), two_steps(False)
    layers = planned[0][3]
    assert [n for _, _, n, _ in planned] == [layers, 0] and [n for _, _, n, _ in whole] == [layers, layers]
    for (loss, grads, _, _), (loss_off, grads_off, _, _) in zip(planned, whole, strict=True):
        assert torch.equal(loss, loss_off)
        assert grads.keys() == grads_off.keys() and len(grads) > 0
        for name in grads:
            assert torch.equal(grads[name], grads_off[name]), name


def test_a_decoding_calls_plan_is_not_used_under_a_cuda_graphs_capture(monkeypatch):
    # a decoding call run eagerly and one captured read different orders (routes.EAGER_ROUTES): their signatures
    # differ, so a plan recorded eagerly is not replayed in a capture; other calls' signatures are the same
    from diffattn.ops import _inputs as inputs_module

    def signatures(tensors):
        eager = call_plans.signature("stacked", routes.DIRECT, *tensors, True, None, None, None, NORM)
        with monkeypatch.context() as patch:
            patch.setattr(inputs_module, "stream_capturing", lambda: True)
            captured = call_plans.signature("stacked", routes.DIRECT, *tensors, True, None, None, None, NORM)
        return eager, captured

    eager, captured = signatures(_inputs(t=1))
    assert eager is not None and captured is not None and eager != captured
    eager, captured = signatures(_inputs(t=6))
    assert eager is not None and eager == captured


# --------------------------------------------------------------------------------------------------------------------
# route plans: a call without gradient whose route is several nodes (decoding against a static cache's mask)
# --------------------------------------------------------------------------------------------------------------------


def _decoding(seed=0, s=9):
    """One decoding step's Q [1, 2H, 1, d], K and V's halves stacked [1, 2H, S, d] (DiffLlama's), λ, and transformers'
    static-cache mask [1, 1, 1, S] (the last two slots empty)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 4, n, 8, generator=g) for n in (1, s, s))
    keep = torch.ones(1, 1, 1, s, dtype=torch.bool)
    keep[..., -2:] = False
    return q, k, v, torch.tensor(0.3), keep


@pytest.mark.parametrize("backend", ["sdpa_maps", "sdpa_maps+epilogue", "auto"])
def test_a_decoding_call_of_a_decided_kind_runs_its_route_without_the_whole_path(whole_runs, backend):
    q, k, v, lam, keep = _decoding()

    def call(q, k, v, lam, keep):
        with torch.no_grad():
            return ops.diff_attention_stacked(q, k, v, lam, causal=False, attn_mask=keep, backend=backend,
                                              head_norm=NORM)  # fmt: skip

    first = call(q, k, v, lam, keep)
    assert whole_runs == ["_stacked_whole"] and not call_plans.ROUTE_PLANS  # made at a signature's second call
    assert torch.equal(call(q, k, v, lam, keep), first)
    assert whole_runs == ["_stacked_whole"] * 2 and len(call_plans.ROUTE_PLANS) == 1
    again = call(q, k, v, lam, keep)
    assert whole_runs == ["_stacked_whole"] * 2, "the route plan ran, not the whole path"
    assert torch.equal(first, again)
    # another token: new values, the same layout — the plan's answer is the whole path's, bit for bit
    token = _decoding(seed=1)
    token[4][..., 3] = False  # another slot masked: the mask's values are read by the route, not the plan
    planned = call(*token)
    assert whole_runs == ["_stacked_whole"] * 2
    call_plans.forget()
    assert torch.equal(planned, call(*token)) and whole_runs == ["_stacked_whole"] * 3
    # another layout (a longer cache: one call of each, as a growing cache makes them), a gradient, a mask validate
    # does not take as it is: no plan of any
    runs = len(whole_runs)
    call(*_decoding(s=11))
    call(*_decoding(s=12))
    ops.diff_attention_stacked(q, k, v, lam.requires_grad_(), causal=False, attn_mask=keep, backend=backend)
    ops.diff_attention_stacked(q, k, v, lam, causal=False, attn_mask=keep, backend=backend)
    call(q, k, v, lam.detach(), keep.reshape(1, 9))  # a key-padding mask [B, S]: validate makes a view of it
    call(q, k, v, lam.detach(), keep.reshape(1, 9))
    call(q, k, v, lam.detach(), keep.reshape(1, 9))
    assert len(whole_runs) == runs + 7 and not call_plans.ROUTE_PLANS
    # a plan's call still refuses a NaN λ (a value: checked every call), and a mask of another dtype in the same
    # shape is another signature (validate casts an additive mask to Q's dtype: the plan would hand it on as it is)
    call(q, k, v, lam.detach(), keep)
    call(q, k, v, lam.detach(), keep)
    assert len(call_plans.ROUTE_PLANS) == 1
    with pytest.raises(ValueError, match="lam must be finite"):
        call(q, k, v, torch.tensor(float("nan")), keep)
    runs = len(whole_runs)
    additive = torch.zeros(1, 1, 1, 9, dtype=torch.float64).masked_fill(~keep, float("-inf"))
    got = call(q, k, v, lam.detach(), additive)
    assert len(whole_runs) == runs + 1 and torch.equal(got, call(q, k, v, lam.detach(), keep))


def test_the_layers_of_one_token_share_a_route_plan_each_call_normed_by_its_own_head_norm(whole_runs, monkeypatch):
    # DIFF's layers differ in their head norm's multiplier (1 - λ_init by depth): the plan's key says whether a norm
    # comes, the call hands its own — so a cache that grows every token has its calls planned from each token's third
    # layer on (its second makes the plan)
    q, k, v, lam, keep = _decoding()
    norms = (HeadNorm(1e-5, 0.8), HeadNorm(1e-6, 0.55), None, HeadNorm(1e-5, 0.3))

    def layers():
        with torch.no_grad():
            return [ops.diff_attention_stacked(q, k, v, lam, causal=False, attn_mask=keep, backend="sdpa_maps",
                                               head_norm=norm) for norm in norms]  # fmt: skip

    planned = layers()
    # the first layer sights the signature, the second makes its plan, the fourth's call runs it; no norm: another key
    assert whole_runs == ["_stacked_whole"] * 3 and len(call_plans.ROUTE_PLANS) == 1
    monkeypatch.setattr(call_plans, "route_signature", lambda *a, **k: None)  # the whole path every call
    whole = layers()
    assert whole_runs == ["_stacked_whole"] * 7
    assert all(torch.equal(a, b) for a, b in zip(planned, whole, strict=True))
    assert not torch.equal(planned[0], planned[1]) and not torch.equal(planned[0], planned[3])


@pytest.mark.parametrize("k_in_pairs", [True, False], ids=["v1-pairs", "v2-shared-k"])
def test_the_pairs_entry_decoding_runs_its_route_plan_with_k_in_pairs_or_whole(whole_runs, k_in_pairs):
    # DIFF V1 in interleaved pairs (K in pairs too) and DIFF V2 (one K for both maps): a decoding call of a decided kind
    # runs its route plan, on inputs cut again as pairs_cut cuts them — validate's exactly, or no plan is made
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 4, 1, 8, generator=g)
    k = torch.randn(1, 4 if k_in_pairs else 2, 9, 8, generator=g)
    v = torch.randn(1, 2, 9, 16 if k_in_pairs else 8, generator=g)
    lam = torch.tensor(0.3)

    def call(*tensors):
        with torch.no_grad():
            return ops.diff_attention_pairs(*tensors, causal=True, backend="sdpa_maps")

    first, second = call(q, k, v, lam), call(q, k, v, lam)
    assert whole_runs == ["_pairs_whole"] * 2 and len(call_plans.ROUTE_PLANS) == 1
    later = (torch.randn_like(q), torch.randn_like(k), torch.randn_like(v), torch.tensor(0.6))
    planned = call(*later)
    assert whole_runs == ["_pairs_whole"] * 2, "the route plan ran, not the whole path"
    call_plans.forget()
    assert torch.equal(first, second) and torch.equal(planned, call(*later))


def test_a_route_that_raises_on_its_plan_is_answered_by_the_whole_path(whole_runs, monkeypatch):
    q, k, v, lam, keep = _decoding()

    def call():
        with torch.no_grad():
            return ops.diff_attention_stacked(q, k, v, lam, causal=False, attn_mask=keep, backend="sdpa_maps")

    call()
    call()
    assert len(call_plans.ROUTE_PLANS) == 1

    def refuses(*args, **kwargs):
        raise RuntimeError("the route refuses now")

    monkeypatch.setitem(ops._IMPLS, "sdpa_maps", refuses)
    with pytest.raises(RuntimeError, match="the route refuses now"):
        call()
    assert whole_runs == ["_stacked_whole"] * 3 and not call_plans.ROUTE_PLANS  # forgotten, then the whole path's error


def test_the_inputs_a_plan_makes_again_are_validates_exactly():
    q, k, v, lam, keep = _decoding()
    (q1, q2), (k1, k2) = q.chunk(2, dim=1), k.chunk(2, dim=1)
    inp = ops.validate(q1, k1, q2, k2, tuple(v.chunk(2, dim=1)), lam, causal=False, attn_mask=keep, scale=None,
                       qk_whole=(q, k), v_stacked=v)  # fmt: skip
    plan = call_plans.RoutePlan("stacked", "sdpa_maps", True, None, False, inp.scale)
    assert call_plans._same_inputs(call_plans.plan_inputs(plan, q, k, v, lam, keep), inp)
    for other in ({"split": False}, {"causal": True}, {"scale": inp.scale * 2}, {"entry": "pairs"}):
        other = dataclasses.replace(plan, **other)
        assert not call_plans._same_inputs(call_plans.plan_inputs(other, q, k, v, lam, keep), inp), other
    assert not call_plans._same_inputs(call_plans.plan_inputs(plan, q, k, v.clone(), lam, keep), inp)  # other memory
