"""CUDA's stream and graph calls faked on the CPU, for the tests of diffattn.cuda_graphs and of the steps built on it:
a fake capture runs its block eagerly (a real one only records it), seen as a capture by transformers and the op, and
refusing what a real one refuses of the host (a read of a tensor's value), and records the state it began in; a replay
is counted; an error inside a capture makes its end raise one of its own, as CUDA's does."""

from __future__ import annotations

import contextlib
import importlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from diffattn import cuda_graphs
from diffattn.ops import _inputs


class FakeCuda:
    """torch.cuda's stream and graph calls, recording what ran where: a capture runs its block eagerly and records
    the state it began in; a replay is counted."""

    def __init__(self):
        self.stream_now = "default"
        self.events: list[str] = []
        self.replays = 0
        self.at_capture: dict = {}
        self.on_capture = lambda: {}
        self.capturing = False

    def _stream(self, name: str):
        fake = self

        class Stream:
            def wait_stream(self, other):
                fake.events.append(f"{name} waits")

        stream = Stream()
        stream.name = name
        return stream

    def Stream(self):
        return self._stream("side")

    def current_stream(self):
        return self._stream("default")

    @contextlib.contextmanager
    def stream(self, s):
        self.stream_now = "side"
        try:
            yield
        finally:
            self.stream_now = "default"

    def CUDAGraph(self):
        fake = self

        class Graph:
            def replay(self):
                fake.replays += 1

        return Graph()

    @contextlib.contextmanager
    def graph(self, g, stream=None):
        self.at_capture = self.on_capture()
        self.events.append("capture" if stream is None else f"capture on {stream.name}")
        before, self.stream_now = self.stream_now, getattr(stream, "name", "capture")  # the capture's stream current
        try:
            with self.seen_as_capture(), HostReadsRefused():
                yield
        except Exception:  # as a real capture's end does after an error inside it
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture") from None
        finally:
            self.stream_now = before
        self.events.append("captured")

    @contextlib.contextmanager
    def seen_as_capture(self):
        """The block seen as a capture (transformers' masks, the op's reads) without refusing host reads: an eager
        step on the very inputs a capture's step gets."""
        self.capturing = True
        try:
            yield
        finally:
            self.capturing = False


class HostReadsRefused(TorchDispatchMode):
    """What a real capture refuses, refused: an op that reads a tensor's value on the host (``.item()``, ``bool()``,
    ``torch.equal``), which waits for the device ("operation not permitted when stream is capturing")."""

    REFUSED = ("aten._local_scalar_dense", "aten.equal", "aten.is_nonzero")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func).split(".default")[0] in self.REFUSED:
            raise RuntimeError(f"CUDA error: operation not permitted when stream is capturing ({func}: a host read)")
        return func(*args, **(kwargs or {}))


def fake_cuda_graphs(monkeypatch) -> FakeCuda:
    """torch.cuda's stream and graph calls replaced by a :class:`FakeCuda` (undone with ``monkeypatch``), CPU
    batches taken as CUDA ones, and Adam's capturable path allowed on CPU tensors."""
    fake = FakeCuda()
    for name in ("Stream", "current_stream", "stream", "CUDAGraph", "graph"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    # a capture seen as real ones are: by transformers (its masks: under capture a [B, 1, T, T] mask where it passes
    # none eagerly) and by the op (diffattn.ops._inputs.values_readable)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: fake.capturing)
    monkeypatch.setattr(_inputs, "stream_capturing", lambda: fake.capturing)
    monkeypatch.setattr(cuda_graphs, "_check_cuda_inputs", lambda inputs: None)  # the batch stays on the CPU
    # AdamW's capturable path (its step count a tensor) on the CPU tensors, as it runs on CUDA
    adam = importlib.import_module("torch.optim.adam")  # the module (torch.optim.adam is also a function's name)
    monkeypatch.setattr(adam, "_get_capturable_supported_devices", lambda *a, **k: ["cpu", "cuda"])
    return fake


def replaying_captures(monkeypatch, fake: FakeCuda) -> None:
    """Each fake capture's graph replays by running what it captured again, eagerly, and writing its result into the
    captured output (as a real replay rewrites the graph's static output): a graphed loop's numbers on the CPU, to
    hold against an eager loop's. (Without this a fake replay only counts.)"""
    original = cuda_graphs.capture

    def capture(graph, fn, stream=None):
        out = original(graph, fn, stream=stream)

        def replay():  # (not under no_grad: what was captured may run a backward)
            fake.replays += 1
            out.copy_(fn())

        graph.replay = replay
        return out

    monkeypatch.setattr(cuda_graphs, "capture", capture)


def graphed_training_on_the_cpu(monkeypatch) -> list:
    """``train.cuda_graphs`` runs of ``diffattn pretrain`` and ``diffattn adapt`` on the CPU: CUDA's graph calls faked
    with each capture replayed by running it again (:func:`replaying_captures`), the CPU taken as a GPU by the runs'
    device check, and every :class:`diffattn.cuda_graphs.GraphedMicroSteps` the trainer makes appended to the list
    returned (to read its calls, replays and eager calls)."""
    from diffattn.train import adapt, trainer

    replaying_captures(monkeypatch, fake_cuda_graphs(monkeypatch))
    for module in (trainer, adapt):
        monkeypatch.setattr(module, "check_cuda_graphs", lambda config, args: None)
    made = []

    class Recorded(cuda_graphs.GraphedMicroSteps):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(trainer, "GraphedMicroSteps", Recorded)
    return made
