"""diffattn.cuda_graphs: a whole training step captured as one CUDA graph. On the CPU with CUDA's stream and graph
calls faked (a fake capture runs the step's code eagerly, which a real capture only records): the warm-up leaves the
model and the optimizer as they were, the captured code is one eager step from there, each call copies its batch
into the captured buffers and replays once, and what cannot be captured is refused with its reason. On a GPU
(``gpu``): graphed steps against eager ones from the same start, for the baseline, DIFF and DIFF V2 — and steps
compiled by inductor in ``reduce-overhead`` mode (``diffattn pretrain --compile reduce-overhead``) against bf16's own
rounding."""

from __future__ import annotations

import pytest
import torch

from diffattn.cuda_graphs import GraphedMicroSteps, GraphedTrainStep, OptimizerSnapshot
from diffattn.models.build import build_model

from .fake_cuda import fake_cuda_graphs, replaying_captures


@pytest.fixture
def fake_cuda(monkeypatch):
    return fake_cuda_graphs(monkeypatch)


def _model_and_batch(attention="diff"):
    model = build_model("debug", attention, backend="auto", seed=0, num_layers=1).train()
    ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    return model, ids


def _loss_fn(model):
    def loss_fn(ids):
        return model(input_ids=ids, labels=ids, use_cache=False).loss

    return loss_fn


def _masks_seen(model) -> list:
    """The attention mask the model's first layer gets at each forward, in a list that grows as it runs."""
    seen = []
    model.model.layers[0].self_attn.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs.get("attention_mask")), with_kwargs=True
    )
    return seen


def _adamw(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, capturable=True)


def _state(model, opt):
    return (
        [p.detach().clone() for p in model.parameters()],
        [None if p.grad is None else p.grad.clone() for p in model.parameters()],
        [opt.state[p]["step"].clone() for p in model.parameters() if "step" in opt.state[p]],
    )


def test_the_warm_up_leaves_no_trace_and_the_capture_is_one_eager_step_from_the_start(fake_cuda):
    model, ids = _model_and_batch()
    start = [p.detach().clone() for p in model.parameters()]
    twin, _ = _model_and_batch()  # the same seed: the same start
    twin_opt = _adamw(twin)
    twin_opt.zero_grad(set_to_none=True)
    with fake_cuda.seen_as_capture():  # the same inputs as the capture's: transformers' mask made under capture
        _loss_fn(twin)(ids).backward()
    twin_opt.step()

    opt = _adamw(model)
    streams = []

    def loss_fn(ids):
        streams.append(fake_cuda.stream_now)
        return model(input_ids=ids, labels=ids, use_cache=False).loss

    fake_cuda.on_capture = lambda: _state(model, opt)
    step = GraphedTrainStep(loss_fn, opt, (ids,), warmup_steps=3)
    assert streams == ["side"] * 4  # three warm-up steps on the side stream, then the capture on it too
    assert fake_cuda.events == ["side waits", "default waits", "capture on side", "captured"]
    values, grads, steps = fake_cuda.at_capture
    # at capture: the parameters as they began, no gradient (backward allocates them in the graph), Adam's step 0
    for before, at in zip(start, values, strict=True):
        assert torch.equal(before, at)
    assert all(g is None for g in grads)
    assert len(steps) == len(start) and all(float(s) == 0 for s in steps)
    # the fake capture ran the captured code eagerly: it is exactly one eager step from the start
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(p, q)
    assert fake_cuda.replays == 0 and step.static_loss.shape == ()


@pytest.mark.parametrize("attention", ["diff", "diff-v2"])
def test_under_capture_the_differential_layers_read_no_value_on_the_host(fake_cuda, attention):
    # the H200 run of 2026-11-29: every diffattn column of the whole-step graph failed to capture. Under capture
    # transformers hands each layer a [B, 1, T, T] mask (its is_tracing counts a capture) and the layer asked whether
    # it was a packed row's by reading it (a host read: refused by a capture); now nothing is read, and the mask's
    # route gives the step (the fake capture refuses host reads as a real one does)
    model, ids = _model_and_batch(attention)
    seen = _masks_seen(model)
    step = GraphedTrainStep(_loss_fn(model), _adamw(model), (ids,), warmup_steps=1)
    assert seen[0] is None and isinstance(seen[-1], torch.Tensor)  # eager: no mask; captured: transformers' mask
    assert torch.isfinite(step.static_loss)


def test_masks_from_the_warm_up_capture_the_eager_steps_kernels(fake_cuda):
    # masks_from_warm_up (the train-step benchmark's): where the warm-up needed no mask, transformers' mask function
    # answers "none" under capture too — SDPA's causal kernels as eager, not a [B, 1, T, T] mask (the H200 run of
    # 2026-11-29: the baseline's graph at 4,096 tokens took 41.1 ms of GPU time against its eager step's 29.6) — and
    # the capture is the eager step bit for bit; a call with an attention mask is transformers' to answer, as ever
    model, ids = _model_and_batch()
    seen = _masks_seen(model)
    twin = _model_and_batch()[0]
    twin_opt = _adamw(twin)
    _loss_fn(twin)(ids).backward()  # eagerly, no capture: no mask
    twin_opt.step()
    GraphedTrainStep(_loss_fn(model), _adamw(model), (ids,), warmup_steps=2, masks_from_warm_up=True)
    assert seen == [None, None, None]  # two warm-up steps and the capture
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(p, q)
    import transformers.masking_utils as masking_utils
    from transformers.models.diffllama import modeling_diffllama

    assert modeling_diffllama.create_causal_mask is masking_utils.create_causal_mask  # put back

    padded = torch.ones_like(ids)
    padded[0, :3] = 0  # a padded row: transformers makes its mask, under capture too

    def masked_loss(ids):
        return model(input_ids=ids, attention_mask=padded, labels=ids, use_cache=False).loss

    seen.clear()
    GraphedTrainStep(masked_loss, _adamw(model), (ids,), warmup_steps=1, masks_from_warm_up=True)
    assert len(seen) == 2 and all(isinstance(m, torch.Tensor) for m in seen)


def test_the_captured_step_clips_the_gradients_as_the_eager_step_does(fake_cuda):
    # max_grad_norm: clip_grad_norm_ between backward and the update, inside the capture (a norm small enough that
    # it clips: the step differs from the unclipped one)
    ids = _model_and_batch("standard")[1]
    moved = {}
    for clip in (None, 1e-3):
        model = _model_and_batch("standard")[0]
        GraphedTrainStep(_loss_fn(model), _adamw(model), (ids,), warmup_steps=1, max_grad_norm=clip)
        twin = _model_and_batch("standard")[0]
        opt = _adamw(twin)
        _loss_fn(twin)(ids).backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(list(twin.parameters()), clip)
        opt.step()
        for p, q in zip(model.parameters(), twin.parameters(), strict=True):  # the capture's one step, eagerly
            assert torch.equal(p, q)
        moved[clip] = [p.detach().clone() for p in model.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(moved[None], moved[1e-3], strict=True))


def test_each_call_copies_its_batch_into_the_captured_buffer_and_replays_once(fake_cuda):
    model, ids = _model_and_batch("standard")
    step = GraphedTrainStep(_loss_fn(model), _adamw(model), (ids,), warmup_steps=1)
    other = (ids + 1) % model.config.vocab_size
    loss = step(other)
    assert fake_cuda.replays == 1 and loss is step.static_loss
    assert torch.equal(step.static_inputs[0], other) and step.static_inputs[0] is not other
    step(step.static_inputs[0])  # the captured buffer itself: no copy needed
    assert fake_cuda.replays == 2
    with pytest.raises(ValueError, match=r"shaped as at capture, \(2, 12\) torch.int64, got \(2, 11\)"):
        step(other[:, :11])
    with pytest.raises(ValueError, match="captured with 1 input"):
        step(other, other)
    assert fake_cuda.replays == 2


def test_what_cannot_be_captured_is_refused_with_its_reason(fake_cuda, monkeypatch):
    model, ids = _model_and_batch("standard")
    loss_fn = _loss_fn(model)
    with pytest.raises(ValueError, match=r"takes torch\.optim\.Adam, torch\.optim\.AdamW, got SGD"):
        GraphedTrainStep(loss_fn, torch.optim.SGD(model.parameters(), lr=0.1), (ids,))
    with pytest.raises(ValueError, match=r"param group\(s\) \[0\] are not capturable: build it with capturable=True"):
        GraphedTrainStep(loss_fn, torch.optim.AdamW(model.parameters()), (ids,))
    with pytest.raises(ValueError, match="warmup_steps must be >= 1"):
        GraphedTrainStep(loss_fn, _adamw(model), (ids,), warmup_steps=0)
    monkeypatch.undo()  # the real input check: a CPU batch cannot be replayed by a CUDA graph
    with pytest.raises(ValueError, match=r"example input\(s\) \[0\] are not CUDA tensors"):
        GraphedTrainStep(loss_fn, _adamw(model), (ids,))


def test_a_step_that_cannot_be_captured_says_what_raised_inside_the_capture(fake_cuda):
    # a real capture's end raises an error of its own after one inside it ("operation failed due to a previous
    # error during capture"): the message names the first one
    model, ids = _model_and_batch("standard")
    loss_fn = _loss_fn(model)
    in_capture = []

    def failing(ids):
        if in_capture:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore")
        return loss_fn(ids)

    def capture_begins():
        in_capture.append(True)
        return {}

    fake_cuda.on_capture = capture_begins
    with pytest.raises(RuntimeError, match=r"captured as a CUDA graph: RuntimeError: CUDA error: operation not permi"
                       r".* at \S*tests/test_cuda_graphs.py:\d+ \(failing\)"):  # fmt: skip
        GraphedTrainStep(failing, _adamw(model), (ids,))


def test_a_host_read_in_the_models_code_is_named_by_its_line(fake_cuda, monkeypatch):
    # where the capture refused a host read, the message names the model's line that made it (diffattn's or
    # transformers', not PyTorch's dispatch below it): here the op made to read its mask's values under capture
    from diffattn.ops import _inputs

    monkeypatch.setattr(_inputs, "values_readable", lambda: True)
    model, ids = _model_and_batch()
    with pytest.raises(RuntimeError, match=r"a host read\) at diffattn/ops/_inputs.py:\d+ \(_segments_if_packed\)"):
        GraphedTrainStep(_loss_fn(model), _adamw(model), (ids,), warmup_steps=1)


def test_a_snapshot_puts_the_parameters_and_adams_state_back_in_place():
    model, ids = _model_and_batch("standard")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def one_step():
        opt.zero_grad(set_to_none=True)
        _loss_fn(model)(ids).backward()
        opt.step()

    one_step()  # state that exists before the snapshot is copied back; state created after it is zeroed
    params = list(model.parameters())
    before = [p.detach().clone() for p in params]
    state_before = {i: {k: v.clone() for k, v in opt.state[p].items()} for i, p in enumerate(params)}
    held = [opt.state[p]["exp_avg"] for p in params]
    snapshot = OptimizerSnapshot(params, opt)
    one_step()
    one_step()
    snapshot.restore()
    for i, p in enumerate(params):
        assert torch.equal(p, before[i])
        for k, v in opt.state[p].items():
            assert torch.equal(v, state_before[i][k])
        assert opt.state[p]["exp_avg"] is held[i]  # the same tensors, as a captured graph holds them
    fresh_model, _ = _model_and_batch("standard")
    fresh = torch.optim.AdamW(fresh_model.parameters(), lr=1e-2)
    snapshot = OptimizerSnapshot(list(fresh_model.parameters()), fresh)  # before any state: state zeroed on restore
    fresh.zero_grad(set_to_none=True)
    _loss_fn(fresh_model)(ids).backward()
    fresh.step()
    snapshot.restore()
    assert all(float(v.abs().max()) == 0 for p in fresh_model.parameters() for v in fresh.state[p].values())


def _three_steps(attention: str, how: str):
    """Three AdamW steps of a 2-layer debug model from the same weights on the same batches, on CUDA: ``how`` "eager"
    (bf16 autocast), "graphed" (:class:`GraphedTrainStep`), "compiled" (inductor, ``mode="reduce-overhead"``: what
    ``diffattn pretrain --compile reduce-overhead`` runs) or "fp32" (eager, autocast off: the arithmetic the bf16 runs
    round). Returns (each step's loss, the starting parameters, the final ones), all float32."""
    torch._dynamo.reset()
    model = build_model("debug", attention, backend="auto", seed=0, num_layers=2).cuda().train()
    start = [p.detach().float().clone() for p in model.parameters()]
    generator = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, model.config.vocab_size, (2, 128), generator=generator).cuda() for _ in range(3)]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, eps=1.0, capturable=True)
    forward = torch.compile(model, mode="reduce-overhead") if how == "compiled" else model

    def loss_fn(ids):
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False, enabled=how != "fp32"):
            return forward(input_ids=ids, labels=ids, use_cache=False).loss

    if how == "graphed":
        step = GraphedTrainStep(loss_fn, opt, (batches[0],))
        losses = [float(step(b)) for b in batches]
    else:
        losses = []
        for b in batches:
            if how == "compiled":
                torch.compiler.cudagraph_mark_step_begin()
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(b)
            loss.backward()
            opt.step()
            losses.append(float(loss))
    return losses, start, [p.detach().float() for p in model.parameters()]


def _assert_within(run, reference, yardstick, factor: float, moved) -> None:
    """``run``'s parameters (:func:`_three_steps`' triples) at most ``factor`` times as far from ``reference``'s as
    ``yardstick``'s are, or within 1% of how far ``moved`` moved each from the reference's start (a few float32
    epsilons at least); its losses likewise, or within 1e-3 of the reference's, relatively."""
    losses, _, params = run
    for s, m, r, y, p in zip(reference[1], moved[2], reference[2], yardstick[2], params, strict=True):
        rounding, distance = float((y - r).abs().max()), float((m - s).abs().max())
        assert float((p - r).abs().max()) <= max(factor * rounding, 0.01 * distance, 4 * torch.finfo(torch.float32).eps)
    for r, y, got in zip(reference[0], yardstick[0], losses, strict=True):  # the loss of each step, on the same batch
        assert abs(got - r) <= max(factor * abs(y - r), 1e-3 * abs(r))


@pytest.mark.gpu
@pytest.mark.parametrize("attention", ["standard", "diff", "diff-v2"])
def test_graphed_steps_follow_eager_ones_from_the_same_start(attention):
    # three steps each way from the same weights on the same batches. The rule: the graph's parameters differ from
    # the eager run's by no more than two eager runs differ from each other (attention's backward may sum by atomics:
    # not bit-reproducible) or 1% of how far the eager run moved them — a replay that read a stale batch, kept a
    # gradient or skipped an update is off by the order of the move itself. Adam's eps is 1 here so that its update
    # is proportional to the gradient: with the default 1e-8 a gradient near zero moves its weight by ±lr whatever
    # its rounding, which would turn a reduction's nondeterminism into differences as large as a move
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    eager = _three_steps(attention, "eager")
    again = _three_steps(attention, "eager")
    graphed = _three_steps(attention, "graphed")
    assert any(float((e - s).abs().max()) > 0 for e, s in zip(eager[2], eager[1], strict=True))
    _assert_within(graphed, eager, again, 4, moved=eager)


@pytest.mark.gpu
@pytest.mark.parametrize("attention", ["standard", "diff", "diff-v2"])
def test_compiled_reduce_overhead_steps_train_like_eager_ones_and_replay_graphs(attention):
    # diffattn pretrain --compile reduce-overhead: inductor's kernels round bf16 otherwise than eager's (fused
    # element-wise work), so the yardstick is bf16's own rounding: each parameter of the compiled run is at most twice
    # as far from the float32 run's as the eager bf16 run's is (or 1% of the move), and each loss likewise; and
    # inductor replayed CUDA graphs (no "cudagraph skipped" counted: a custom op it cannot graph, a CPU tensor in the
    # graph or a mutated input would have been)
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from torch._dynamo.utils import counters

    reference = _three_steps(attention, "fp32")
    eager = _three_steps(attention, "eager")
    counters.clear()
    compiled = _three_steps(attention, "compiled")
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    _assert_within(compiled, reference, eager, 2, moved=eager)


def _micro_step(model):
    """One micro-batch's forward and backward (its gradients added into .grad), the loss returned detached."""

    def body(inputs):
        loss = model(input_ids=inputs["ids"], labels=inputs["ids"], use_cache=False).loss / inputs["divisor"]
        loss.backward()
        return loss.detach()

    return body


def _used(model) -> list:
    return [p for p in model.parameters() if p is not getattr(model, "unused", None)]


def test_graphed_micro_steps_add_into_the_gradients_as_eager_ones_whatever_the_loop_did_to_them(monkeypatch, fake_cuda):
    """``GraphedMicroSteps`` (``diffattn pretrain --cuda-graphs``): warm-up calls eager on the side stream, then one
    capture on it, then replays (here: what was captured run again, :func:`tests.fake_cuda.replaying_captures`), each
    call's gradients added into ``.grad`` as an eager twin's: accumulated over two micro-batches, after ``.grad`` was
    set to None (zeroed in place), after it was replaced by another tensor (copied in), and a batch of another shape
    run eagerly — the twin and the graphed model bit for bit through all of it."""
    replaying_captures(monkeypatch, fake_cuda)
    model, _ = _model_and_batch()
    twin, _ = _model_and_batch()
    for m in (model, twin):  # a parameter the forward never uses: no gradient, graphed or not (AdamW skips it)
        m.unused = torch.nn.Parameter(torch.ones(3))
    micro, eager = GraphedMicroSteps(_micro_step(model), model.parameters(), warmup_steps=2), _micro_step(twin)
    g = torch.Generator().manual_seed(1)

    def batch(n=12):
        return {"ids": torch.randint(0, model.config.vocab_size, (2, n), generator=g), "divisor": torch.tensor(2.0)}

    def both(inputs):
        loss = micro(inputs).clone()
        assert torch.equal(loss, eager(inputs))
        for p, q in zip(model.parameters(), twin.parameters(), strict=True):
            assert (p.grad is None) == (q.grad is None) and (p.grad is None or torch.equal(p.grad, q.grad))
        assert model.unused.grad is None

    def zero_grad():
        model.zero_grad(set_to_none=True)
        twin.zero_grad(set_to_none=True)

    both(batch())  # warm-up 1
    both(batch())  # warm-up 2: accumulated onto the first
    assert micro.graph is None and fake_cuda.events[-1] == "default waits"
    zero_grad()
    both(batch())  # captured (on the warm-up's stream), then replayed: the gradients from zero
    assert fake_cuda.events[-2:] == ["capture on side", "captured"] and micro.replays == fake_cuda.replays == 1
    captured = [p.grad for p in _used(model)]
    both(batch())  # accumulated onto it
    zero_grad()
    both(batch())
    assert all(p.grad is c for p, c in zip(_used(model), captured, strict=True))
    both(batch(n=8))  # another shape: eager, into the same gradients
    assert micro.eager_calls == 1 and micro.replays == 3
    for p, q in zip(_used(model), _used(twin), strict=True):  # the loop's own tensors (an out-of-place clip, say):
        p.grad, q.grad = p.grad * 0.5, q.grad * 0.5  # copied in, then added to
    both(batch())
    assert micro.replays == 4 and all(p.grad is c for p, c in zip(_used(model), captured, strict=True))
    zero_grad()
    both(batch(n=8))  # eager from None: new tensors, which the next replay copies into the captured ones
    both(batch())
    assert micro.eager_calls == 2 and micro.replays == 5
    with pytest.raises(ValueError, match="warmup_steps must be >= 1"):
        GraphedMicroSteps(_micro_step(model), model.parameters(), warmup_steps=0)


def test_a_graphed_micro_step_that_reads_the_host_is_refused_saying_so(fake_cuda):
    """What a capture refuses (a host read) fails the capture with one error saying what was refused."""
    model, ids = _model_and_batch()

    def reads(inputs):
        loss = model(input_ids=inputs["ids"], labels=inputs["ids"], use_cache=False).loss
        if float(loss.detach()) > 0:  # a host read: refused under capture
            loss.backward()
        return loss.detach()

    micro = GraphedMicroSteps(reads, model.parameters(), warmup_steps=1)
    micro({"ids": ids})
    with pytest.raises(
        RuntimeError, match=r"could not be captured as a CUDA graph: .*_local_scalar_dense.*a host read"
    ):
        micro({"ids": ids})
    assert micro.graph is None  # nothing half-captured is ever replayed


@pytest.mark.parametrize("attention", ["standard", "diff", "diff-v2"])
def test_a_row_padded_at_its_end_scores_as_without_its_mask(attention):
    """What ``train.cuda_graphs`` relies on to leave a batch's attention mask out (the packed data's last row is
    padded at its end, its pad positions labelled -100): a causal model's loss and every gradient are those of the
    masked batch, within float32 rounding of the masked batch's float64 values (tests/ops/rounding.py)."""
    import copy

    from .ops.rounding import assert_within_rounding

    model, ids = _model_and_batch(attention)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    labels = ids.masked_fill(mask == 0, -100)

    def run(dtype, with_mask):
        m = copy.deepcopy(model).to(dtype)
        loss = m(input_ids=ids, labels=labels, attention_mask=mask if with_mask else None, use_cache=False).loss
        loss.backward()
        return [loss.detach()] + [p.grad for p in m.parameters()]

    gold, plain, got = run(torch.float64, True), run(torch.float32, True), run(torch.float32, False)
    names = ["loss"] + [n for n, _ in model.named_parameters()]
    for name, g, p, x in zip(names, gold, plain, got, strict=True):
        assert_within_rounding(name, x, g, [p], torch.float32)
