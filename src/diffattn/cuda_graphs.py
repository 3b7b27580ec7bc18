"""A whole training step as one CUDA graph: forward, backward and the optimizer's update captured once and replayed
each step, so the host issues one graph launch a step instead of a thousand kernels.

Why: a small model's eager step is host-bound — on the H200 of 2026-11-28 the `small` preset's bf16 step at 1,024
tokens took 40.0 ms of wall time for 8.6 ms of GPU work (the baseline), and DIFF's extra layer work cost 17 ms of
host time for 1.5 ms of GPU time (``benchmarks/gpu-runs/h200-2026-11-28/train.json``). Replayed from a graph, a step
costs what its kernels cost, and a ratio between two models is a ratio of GPU work (``diffattn bench train-step
--cuda-graphs``).

This is PyTorch's whole-network capture (the CUDA semantics notes, "Whole-network capture"): warm-up steps on a side
stream (kernels compiled, autotuned, cuDNN plans built, the optimizer's state allocated), then one step captured with
the gradients unset so that backward allocates them in the graph's memory, which every replay rewrites. What this
module adds:

* the warm-up leaves no trace: the parameters and the optimizer's state are put back as they were before it (state
  the warm-up created is zeroed, as Adam's starts), so the graphed run follows the eager run's trajectory step for
  step from the first batch on, rather than training on the first batch a few extra times (the random stream a
  dropout draws from is not put back: with dropout the runs follow each other in distribution, not bit for bit);
* clear errors for what cannot be captured (a CPU device, an optimizer not built ``capturable=True``, a gradient
  scaler's host-side checks) and for a batch that does not fit the captured buffers, naming the model's line that did
  what a capture refuses;
* optionally, transformers' masks as in the eager step (``masks_from_warm_up``): under capture transformers makes a
  [B, 1, T, T] causal mask where eagerly it leaves causality to SDPA's flag — the same numbers by slower kernels.

What a graph freezes: everything the host decides in the step is decided once, at capture — the route each
attention call runs, a learning rate held as a Python float, anything annealed by a host-side counter (Dex's λ
schedule), a dropout mask's *shape*. The captured step reads its inputs from static buffers (each call copies the
batch in) and returns a static loss tensor that the next call overwrites: clone it to keep it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import torch

#: torch.compile's modes (``torch._inductor.list_mode_options``, and ``"default"``): the other way to take the host
#: out of a step. ``"reduce-overhead"`` replays the compiled forward and backward as CUDA graphs (inductor's cudagraph
#: trees; the optimizer's update stays eager); ``diffattn pretrain --compile MODE`` and ``diffattn bench train-step
#: --compile-mode MODE`` take one
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def torch_compile_mode(mode: str | None) -> str | None:
    """``torch.compile``'s ``mode`` for a name of :data:`COMPILE_MODES` (or None): ``"default"`` is its None."""
    return None if mode == "default" else mode


#: optimizers whose lazily created state starts at zeros (step count, first and second moments), so the state the
#: warm-up created can be put back to its start by zeroing it
ZERO_STATE_OPTIMIZERS = (torch.optim.Adam, torch.optim.AdamW)


def _check_optimizer(optimizer: torch.optim.Optimizer) -> None:
    if not isinstance(optimizer, ZERO_STATE_OPTIMIZERS):
        names = ", ".join(f"torch.optim.{c.__name__}" for c in ZERO_STATE_OPTIMIZERS)
        raise ValueError(f"a graphed train step takes {names}, got {type(optimizer).__name__}")
    off = [i for i, group in enumerate(optimizer.param_groups) if not group.get("capturable", False)]
    if off:
        raise ValueError(
            f"the optimizer's param group(s) {off} are not capturable: build it with capturable=True (its step count "
            "on the GPU, no host read of it in the step) to capture its update in a CUDA graph"
        )


def _check_cuda_inputs(inputs: Sequence[torch.Tensor]) -> None:
    bad = [i for i, x in enumerate(inputs) if not (torch.is_tensor(x) and x.is_cuda)]
    if bad:
        raise ValueError(f"a CUDA graph replays CUDA work: example input(s) {bad} are not CUDA tensors")


class OptimizerSnapshot:
    """The parameters' values and the optimizer's state tensors at one moment, to put back in place (the same tensors,
    so anything holding them — a captured graph, a module — sees the values restored)."""

    def __init__(self, params: Sequence[torch.Tensor], optimizer: torch.optim.Optimizer):
        self.params = list(params)
        self.optimizer = optimizer
        with torch.no_grad():
            self.values = [p.detach().clone() for p in self.params]
            self.state = {
                id(p): {key: value.clone() for key, value in optimizer.state[p].items() if torch.is_tensor(value)}
                for p in self.params
                if p in optimizer.state
            }

    def restore(self) -> None:
        """Parameters and state tensors copied back in place; state created since the snapshot zeroed (the start of
        :data:`ZERO_STATE_OPTIMIZERS`' state). Non-tensor state created since is dropped."""
        with torch.no_grad():
            for p, value in zip(self.params, self.values, strict=True):
                p.copy_(value)
            for p in self.params:
                if p not in self.optimizer.state:
                    continue
                before = self.state.get(id(p), {})
                state = self.optimizer.state[p]
                for key in list(state):
                    if key in before:
                        state[key].copy_(before[key])
                    elif torch.is_tensor(state[key]):
                        state[key].zero_()
                    else:
                        del state[key]


class _MasksFromWarmUp:
    """transformers' mask functions (``create_causal_mask`` as each loaded modeling module holds it) answering under
    capture as they did in the last warm-up step where that answer was "no mask" for a call without an attention mask
    or a cache. Why: transformers' ``is_tracing`` counts a CUDA stream's capture as tracing, so under capture its
    masks skip SDPA's ``is_causal`` and hand every layer a [B, 1, T, T] mask — the same numbers, other kernels: the
    baseline's `small` step at 4,096 tokens took 41.1 ms of GPU time as a graph against 29.6 eager (cuDNN's attention
    with a mask: backward 10.47 ms against 3.66; the H200 run of 2026-11-29). Right only where every batch the graph
    replays needs no mask, as the warm-up's did: no padding, no packed documents — whether a batch is packed is read
    from its position ids' values, which a graph cannot branch on — hence an option (``masks_from_warm_up``)."""

    NAME = "create_causal_mask"

    def __init__(self):
        self.answers: list[bool] = []  # per call of the last warm-up step: whether it returned None
        self.recording = False
        self.capturing = False
        self.calls = 0
        self._patched: list[tuple[object, object]] = []

    def __enter__(self):
        import sys

        for name, module in list(sys.modules.items()):
            # (the module's own names: an attribute of transformers' lazy modules would import what it names)
            original = getattr(module, "__dict__", {}).get(self.NAME) if name.startswith("transformers.") else None
            if callable(original):
                self._patched.append((module, original))
                setattr(module, self.NAME, self._wrap(original))
        return self

    def __exit__(self, *exc):
        for module, original in reversed(self._patched):
            setattr(module, self.NAME, original)
        self._patched.clear()

    def _wrap(self, original):
        def create_causal_mask(*args, **kwargs):
            plain = not args and all(kwargs.get(k) is None for k in ("attention_mask", "past_key_values", "cache"))
            if self.capturing:
                i, self.calls = self.calls, self.calls + 1
                if plain and i < len(self.answers) and self.answers[i]:
                    return None
                return original(*args, **kwargs)
            mask = original(*args, **kwargs)
            if self.recording:
                self.answers.append(plain and mask is None)
            return mask

        return create_causal_mask


def _raised_at(err: BaseException) -> str:
    """Where ``err`` was raised, as " at FILE:LINE (FUNCTION)": the innermost frame of the model's code (diffattn's,
    transformers') — the line that did what a capture refuses — else the innermost frame; "" without a traceback."""
    import traceback

    frames = traceback.extract_tb(err.__traceback__)
    if not frames:
        return ""

    def models_code(name: str) -> bool:  # diffattn's or transformers', not this module's (every error's caller)
        return ("/diffattn/" in name or "/transformers/" in name) and not name.endswith("/cuda_graphs.py")

    ours = [f for f in frames if models_code(f.filename)]
    frame = (ours or frames)[-1]
    return f" at {'/'.join(frame.filename.split('/')[-3:])}:{frame.lineno} ({frame.name})"


@contextlib.contextmanager
def on_side_stream(stream):
    """The block's work on ``stream`` (a warm-up's, and then its capture's), after what the current stream queued and
    before what it queues next: PyTorch's whole-network capture warms up on a side stream so."""
    stream.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(stream):
            yield
    finally:
        torch.cuda.current_stream().wait_stream(stream)


def capture(graph, fn: Callable[[], object], stream=None):
    """``fn()`` captured into ``graph`` on ``stream`` (the stream its warm-up ran on: cuBLAS and cuDNN keep their
    handles and workspaces per stream, and one first made under capture is made by capture-unsafe calls —
    pytorch#187745), and what it returned: the graph's static outputs. A capture that fails raises one error naming
    the first error inside it and the model's line that raised it (:func:`_raised_at`)."""
    raised: list[BaseException] = []
    try:
        with torch.cuda.graph(graph, stream=stream):
            try:
                return fn()
            except Exception as err:  # the capture's end raises its own error after it: this one says why
                raised.append(err)
                raise
    except Exception as err:
        from .ops.routes import error_line  # the one-line form of an error (here only, on failure: no import cost)

        first = raised[0] if raised else err
        raise RuntimeError(
            f"the train step could not be captured as a CUDA graph: {error_line(first)}{_raised_at(first)} (a "
            "host read of a GPU value, .item() or a sync, cannot be captured; nor work off the capturing stream)"
        ) from first


class GraphedTrainStep:
    """``step = GraphedTrainStep(loss_fn, optimizer, example_inputs)``, then ``loss = step(*inputs)`` per step: the
    same update as ``optimizer.zero_grad(); loss_fn(*inputs).backward(); optimizer.step()``, replayed from one CUDA
    graph (module docstring).

    Args:
        loss_fn: the forward, ``loss_fn(*inputs) -> loss`` (a scalar tensor), with whatever autocast it wants inside
            (``torch.autocast(..., cache_enabled=False)``: autocast's cache of cast weights does not outlive the
            capture's autocast block).
        optimizer: torch.optim.Adam or AdamW over every parameter the step trains, built ``capturable=True``.
        example_inputs: CUDA tensors shaped as every later call's inputs (the first batch, say): the warm-up and the
            capture run on copies of them, and the model ends as it began.
        warmup_steps: eager steps on a side stream before the capture (PyTorch's notes use 3; autotuning kernels
            need theirs here, not inside the capture).
        max_grad_norm: the gradients clipped to this total norm before each update
            (``torch.nn.utils.clip_grad_norm_``, which reads nothing back to the host), or None.
        masks_from_warm_up: transformers' causal masks under capture as in the warm-up where it needed none (no
            attention mask, no cache): SDPA's ``is_causal`` kernels, not a [B, 1, T, T] mask
            (:class:`_MasksFromWarmUp`). Only for steps whose every batch is unpadded and unpacked, as the warm-up's
            (diffattn's train-step benchmark); off, transformers builds its masks under capture as it decides.

    A learning rate that changes during training is a tensor the graph reads: build the optimizer with
    ``lr=torch.tensor(rate, device="cuda")`` and ``fill_`` it between calls (a float is frozen at capture).
    """

    def __init__(
        self,
        loss_fn: Callable[..., torch.Tensor],
        optimizer: torch.optim.Optimizer,
        example_inputs: Sequence[torch.Tensor],
        *,
        warmup_steps: int = 3,
        max_grad_norm: float | None = None,
        masks_from_warm_up: bool = False,
    ):
        _check_optimizer(optimizer)
        _check_cuda_inputs(example_inputs)
        if warmup_steps < 1:
            raise ValueError(f"warmup_steps must be >= 1 (the optimizer's state must exist before capture), got "
                             f"{warmup_steps}")  # fmt: skip
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.max_grad_norm = max_grad_norm
        self.static_inputs = [x.detach().clone() for x in example_inputs]
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        snapshot = OptimizerSnapshot(self.params, optimizer)
        masks = _MasksFromWarmUp() if masks_from_warm_up else None
        with masks or contextlib.nullcontext():
            side = torch.cuda.Stream()
            with on_side_stream(side):
                for i in range(warmup_steps):
                    if masks is not None:
                        masks.recording = i == warmup_steps - 1  # the last step's masks: what a capture repeats
                    self._eager_step()
            snapshot.restore()
            optimizer.zero_grad(set_to_none=True)  # backward allocates the gradients in the graph's own memory
            self.graph = torch.cuda.CUDAGraph()
            if masks is not None:
                masks.recording, masks.capturing = False, True
            self.static_loss = capture(self.graph, lambda: self._eager_step(zero_grad=False), stream=side)

    def _eager_step(self, zero_grad: bool = True) -> torch.Tensor:
        if zero_grad:
            self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss_fn(*self.static_inputs)
        loss.backward()
        if self.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
        self.optimizer.step()
        return loss.detach()

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        """One step on ``inputs`` (shaped as the example inputs); returns the loss, a tensor the next call
        overwrites."""
        if len(inputs) != len(self.static_inputs):
            raise ValueError(f"the step was captured with {len(self.static_inputs)} input(s), got {len(inputs)}")
        for i, (static, x) in enumerate(zip(self.static_inputs, inputs, strict=True)):
            if x.shape != static.shape or x.dtype != static.dtype:
                raise ValueError(
                    f"input {i} must be shaped as at capture, {tuple(static.shape)} {static.dtype}, got "
                    f"{tuple(x.shape)} {x.dtype} (a graph replays fixed shapes: capture one step per shape)"
                )
            if x is not static:
                static.copy_(x)
        self.graph.replay()
        return self.static_loss


class GraphedMicroSteps:
    """``micro = GraphedMicroSteps(body, params)``, then ``loss = micro(inputs)`` per micro-batch: ``body(inputs)`` —
    one micro-batch's forward and backward, its gradients added into the parameters' ``.grad``, returning the loss
    detached — run eagerly for the first ``warmup_steps`` calls (on a side stream, the capture's), then captured once
    as a CUDA graph and replayed by every later call. What a training loop that is not this module's can graph
    (transformers' Trainer: ``diffattn pretrain --cuda-graphs``): the clipping, the optimizer's update and the zeroing
    stay the loop's, eager, a few multi-tensor launches a step; the forward and backward, almost all of a small model's
    thousand launches, are one.

    Gradients: from the capture on, each parameter's ``.grad`` is one tensor that every replay adds into, as eager
    backward adds into an existing gradient, so accumulation over micro-batches works as eagerly (the parameters the
    warm-up calls gave a gradient: one the forward never uses keeps none, as eagerly). What the loop did to
    ``.grad`` between calls is honoured before a replay: set to None (``zero_grad()``'s default) — that tensor zeroed
    in place and put back; replaced by another (an eager call's) — copied in. The loss returned is the graph's static
    output, which the next call overwrites.

    A call whose inputs differ from the captured ones in keys, shapes or dtypes runs eagerly (a last, shorter batch);
    ``inputs`` are tensors by name (a number the body divides by, e.g. transformers' ``num_items_in_batch``, as a
    tensor: a Python number would be frozen at capture). What the body decides on the host is decided once, at
    capture, as in :class:`GraphedTrainStep`. ``masks_from_warm_up``: transformers' causal masks under capture as in
    the last warm-up call (:class:`_MasksFromWarmUp`), for bodies whose every batch is unpadded and unpacked.
    """

    def __init__(
        self,
        body: Callable[[dict[str, torch.Tensor]], torch.Tensor],
        params,
        *,
        warmup_steps: int = 3,
        masks_from_warm_up: bool = False,
    ):
        if warmup_steps < 1:
            raise ValueError(f"warmup_steps must be >= 1 (kernels are compiled, tuned and planned before capture), "
                             f"got {warmup_steps}")  # fmt: skip
        self.body = body
        self.params = [p for p in params if p.requires_grad]
        self.warmup_steps = warmup_steps
        self.masks = _MasksFromWarmUp() if masks_from_warm_up else None
        self.stream = None  # the warm-up's and the capture's side stream, made at the first call
        self.graph = None
        self.calls = 0  # calls so far (warm-up, capture, replays, eager ones)
        self.replays = 0
        self.eager_calls = 0  # after the capture: calls whose inputs did not match it
        self.static: dict[str, torch.Tensor] = {}
        self.static_loss: torch.Tensor | None = None
        self.grads: list[torch.Tensor] = []
        #: the parameters a warm-up call gave a gradient (by id): only theirs are the graph's, so a parameter the
        #: forward never uses keeps no gradient, as eagerly (AdamW skips it: no decay, no moments)
        self.receiving: set[int] = set()

    def __call__(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        self.calls += 1
        if self.graph is None and self.calls <= self.warmup_steps:
            recording = self.masks is not None and self.calls == self.warmup_steps
            if self.stream is None:
                self.stream = torch.cuda.Stream()
            with on_side_stream(self.stream), self.masks if recording else contextlib.nullcontext():
                if recording:
                    self.masks.recording = True
                try:
                    loss = self.body(inputs)
                finally:
                    if recording:
                        self.masks.recording = False
            self.receiving.update(id(p) for p in self.params if p.grad is not None)
            return loss
        if self.graph is None:
            self._capture(inputs)
        elif not self._matches(inputs):
            self.eager_calls += 1
            return self.body(inputs)
        for name, x in inputs.items():
            if x is not self.static[name]:
                self.static[name].copy_(x)
        self._gradients_in_place()
        self.graph.replay()
        self.replays += 1
        return self.static_loss

    def _matches(self, inputs: dict[str, torch.Tensor]) -> bool:
        return inputs.keys() == self.static.keys() and all(
            torch.is_tensor(x) and x.shape == self.static[k].shape and x.dtype == self.static[k].dtype
            for k, x in inputs.items()
        )

    def _capture(self, inputs: dict[str, torch.Tensor]) -> None:
        bad = [k for k, x in inputs.items() if not torch.is_tensor(x)]
        if bad:
            raise ValueError(f"a graphed micro-step takes tensors by name: {', '.join(bad)} not a tensor")
        self.static = {k: x.detach().clone() for k, x in inputs.items()}
        self.params = [p for p in self.params if id(p) in self.receiving]
        with torch.no_grad():
            for p in self.params:  # every gradient a tensor before the capture: backward adds into it, in place
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            before = [p.grad.clone() for p in self.params]
        graph = torch.cuda.CUDAGraph()
        if self.masks is not None:
            self.masks.capturing, self.masks.calls = True, 0
        try:
            with self.masks or contextlib.nullcontext():
                self.static_loss = capture(graph, lambda: self.body(self.static), stream=self.stream)
        finally:
            if self.masks is not None:
                self.masks.capturing = False
        with torch.no_grad():  # as before the capture (a real one runs nothing; a stack that ran its block, as the
            torch._foreach_copy_([p.grad for p in self.params], before)  # CPU tests' fake capture does, undone)
        self.graph, self.grads = graph, [p.grad for p in self.params]  # (a capture that failed leaves no graph)

    def _gradients_in_place(self) -> None:
        """Each parameter's ``.grad`` the captured tensor again, holding what the loop left there (module docstring)."""
        zeroed, copied_to, copied_from = [], [], []
        for p, g in zip(self.params, self.grads, strict=True):
            if p.grad is g:
                continue
            if p.grad is None:
                zeroed.append(g)
            else:
                copied_to.append(g)
                copied_from.append(p.grad)
            p.grad = g
        with torch.no_grad():
            if zeroed:
                torch._foreach_zero_(zeroed)
            if copied_to:
                torch._foreach_copy_(copied_to, copied_from)
