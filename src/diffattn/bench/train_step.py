"""Training-step time, side by side: DIFF Transformer (our attention, ``auto`` backend) vs the same-size Llama
baseline, with Hugging Face's own ``DiffLlama`` attention as a third column and DIFF V2 (docs/methods.md §5: twice the
query heads, a per-token gate, the FFN narrowed to the same parameter count) as a fourth.

One step = forward + backward + AdamW update on a random batch, the three models built from the same preset
and fed identical batches, timed interleaved round-robin (the first column rotating each repetition, Python's
garbage collector paused: :func:`diffattn.bench.gc_paused`); the statistic is the median over repetitions, with
their range beside it.

Precision, as training runs (diffattn.train: ``train.precision`` "auto"): ``bf16`` by default on CUDA — float32
weights and optimizer, the forward under ``torch.autocast`` in bfloat16, so the attention kernels run in bf16 —
and ``fp32`` on CPU (bf16 is ~30x slower there). ``fp16`` on request: autocast in float16 with a gradient scaler.
On a GPU, timing float32 would time the fused kernels where they are not meant to run (float32 IEEE dots on half
tiles; the deterministic dQ kernel spills 1,392 bytes there, benchmarks/RESULTS.md). The dtype is in every row.

``compile`` (``--compile [BACKEND]``): every model's forward through ``torch.compile`` (inductor by default), the
backward and AdamW eager as before; compiling happens in the warm-up step, outside the timing. Why: the eager step of
a small model is host-bound (the H200 run of 2026-11-27: DIFF's extra 15.5 ms a step is the same at 1K and 4K
tokens, ~840 more dispatched ops than the baseline's 1,817), and a compiled forward fuses the element-wise ops of
λ, the subtraction and the norm into a few kernels — the ratio a user who compiles gets. The backend is in every row.
``compile_mode`` (``--compile-mode MODE``, :data:`diffattn.cuda_graphs.COMPILE_MODES`): torch.compile's mode;
``reduce-overhead`` replays the compiled forward and backward as CUDA graphs (inductor's cudagraph trees; AdamW stays
eager): what ``diffattn pretrain --compile reduce-overhead`` runs, beside this module's whole-step graph. The mode is
in the row's ``compiled`` (``inductor:reduce-overhead``).

``cuda_graphs`` (``--cuda-graphs [whole|micro]``, CUDA, bf16 or fp32): ``"whole"`` (``True``): every column's whole
step — forward, backward and AdamW (``capturable=True``) — captured once as one CUDA graph and replayed each repetition
(:class:`diffattn.cuda_graphs.GraphedTrainStep`; warm-up and capture outside the timing). Why: the eager step times
the host issuing a thousand kernels (the H200 of 2026-11-28: the baseline's 40.0 ms for 8.6 ms of GPU work; DIFF's
layer 17 ms more host time for 1.5 ms more GPU time); replayed, a column's time is its kernels' and a ratio is a ratio
of GPU work — what a user who graphs the step gets. Every route runs as at capture, decided once; transformers'
masks as in the eager step (``masks_from_warm_up``: none, where under capture it would make a [T, T] one).
``"micro"``: what ``diffattn pretrain --cuda-graphs`` runs — the forward and backward one graph
(:class:`diffattn.cuda_graphs.GraphedMicroSteps`, after its three warm-up calls), AdamW and the zeroing eager around
it (the row's ``graph_scope``). Not with ``compile`` (inductor's own graphs are its ``mode="reduce-overhead"``) nor
fp16 (the gradient scaler reads the host).

``backends`` (``--backends a,b``): one more DIFF column per backend, forced (``diffattn DIFF (a)``), beside ``auto``.
Why: the route table picks a class's route by its time at batch·N = 16K tokens, where the GPU is the limit; a small
model's step is host-bound, where a route's host cost decides — on the H200 (2026-11-27) ``auto`` (``cudnn_maps``,
two cuDNN calls a layer) stepped 49.3 ms against DiffLlama's 45.2 though it dispatches no more ops a layer (338
against 340, counted on this CPU with the cuDNN calls stubbed). A backend that cannot take the model's calls on the
device is a column of NaN with its error printed, not the end of the run.
A backend named with a :data:`FUSED` suffix after it runs with a piece of the DIFF layer's element-wise work in
Triton kernels where the route table does not switch it on yet: ``+norm`` the head's norm in the epilogue's kernel
(:func:`diffattn.ops.fused_head_norm`; after ``auto`` or an epilogue route: ``cudnn+epilogue+norm``), ``+lambda`` λ by
one kernel each way, each layer's (:func:`diffattn.ops.fused_lambda`; without it a model computes every layer's at
once, :func:`diffattn.models.diff_llama.layer_lambdas`; after any backend, after ``+norm`` too: ``auto+norm+lambda``),
``+pairs`` DIFF V1's heads handed to the op in interleaved pairs (:func:`diffattn.ops.pairs_layout`: ``auto+pairs``,
where ``cudnn_shared_v`` reads V once for both maps), ``+perlayer`` every layer computing its own λ by PyTorch's ops
where the model computes them at once (:func:`diffattn.ops.lambda_per_layer`: ``auto+norm+perlayer`` against
``auto+norm`` is what computing them at once saves).
The step a lease times before the table may switch them on (benchmarks/RESULTS.md, 2026-11-28, the layer's launches).

``host_profile`` (``--host-profile``): one more step per column under PyTorch's profiler with its Python tracer,
after the timing — the host's self time by ATen op, autograd node, CUDA
runtime call and Python function (:func:`diffattn.bench.kernels.profile_host`), printed as the rows by which some
column's host time exceeds the baseline's most, with each column's kernel launches and host waits on the GPU
(:func:`format_host`). Why: the eager `small` step is host-bound on the lent H200s, and the CPU proxy of its host time
(``benchmarks/step_host_time.py``) put DIFF's `cudnn_direct+norm` under DiffLlama where the H200 of 2026-11-29 put
it over: what the GPU machine's host does that the proxy does not is read here. Off by default: the tracer's events
take seconds a column to read, and a profiler that crashes the process would take the step's rows with it — so the
GPU script takes it in a step of its own (``make gpu-report``'s ``hostprof``: ``train_host.json``).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import asdict, dataclass, field

import torch

from ..cuda_graphs import COMPILE_MODES, torch_compile_mode
from ..models.build import build_model
from ..ops.routes import error_line
from . import gc_paused, rotated
from .kernels import KERNELS_SHOWN, LAUNCH_CALLS, SYNC_CALLS, calls_of, format_kernel_table, profile_gpu, profile_host

COLUMNS = {
    "baseline": ("standard", None),
    "diffattn DIFF (auto)": ("diff", "auto"),
    "HF DiffLlama": ("diff", None),
    "diffattn DIFF V2 (auto)": ("diff-v2", "auto"),
}

#: the suffixes of a forced column's backend that run it with a route-table switch on (module docstring), and which
#: (``+vcopies``: DIFF V1's [V; V] by its kernels, for calls above the small size — the step's at 4,096 tokens;
#: ``+pairs``: DIFF V1's heads in interleaved pairs, which the layer otherwise takes per class by the table's
#: measurements, :func:`diffattn.ops.routes.pairs_faster`; ``+perlayer``: each layer's own λ, a comparison only)
FUSED = {
    "+norm": "fused_head_norm",
    "+lambda": "fused_lambda",
    "+vcopies": "fused_v_copies",
    "+pairs": "heads_in_pairs",
    "+perlayer": "lambda_per_layer",
}


def switches_forced(fused: tuple[str, ...]) -> contextlib.ExitStack:
    """A context in which each route-table switch of ``fused`` (:data:`FUSED`'s values) is forced on, the others left
    as the table has them."""
    from .. import ops

    stack = contextlib.ExitStack()
    for flag in fused:
        stack.enter_context(ops._forced(flag, True))
    return stack


#: the precisions a step can run in: autocast dtype (None: plain float32)
DTYPES: dict[str, torch.dtype | None] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}


def default_dtype(device: str) -> str:
    """The precision training runs in on ``device``: bf16 (mixed precision) on CUDA, fp32 on CPU."""
    return "bf16" if str(device).startswith("cuda") else "fp32"


@dataclass
class StepRow:
    preset: str
    seq_len: int
    batch: int
    ms: dict[str, float]
    dtype: str = "fp32"
    #: CUDA, on request: MiB one step allocates at its peak beyond the weights and AdamW state resident before it
    #: (gradients, activations, temporaries), per column
    peak_mib: dict[str, float] = field(default_factory=dict)
    #: CUDA: milliseconds some kernel ran during one profiled step (the union of the kernels' intervals,
    #: :func:`gpu_profile`). Well below ``ms``: the step is host-bound (the GPU idles between launches), and a ratio
    #: between columns is a ratio of host work; close to it: the GPU is the limit. Replaces the host's issuing time
    #: (until the step's Python returned), which read within 0.1 ms of ``ms`` in every column of both H200 leases,
    #: the GPU-bound paper-830m step's too: a host that fills CUDA's launch queue waits for the GPU, so it says nothing
    gpu_ms: dict[str, float] = field(default_factory=dict)
    #: the slowest repetition's time less the fastest's, per column: the spread of the median's samples (none from
    #: one repetition)
    range_ms: dict[str, float] = field(default_factory=dict)
    #: the torch.compile backend every model's forward ran through ("": eager)
    compiled: str = ""
    #: CUDA: the profiled step's kernels, per column (:func:`diffattn.bench.kernels.kernel_table`: ``{name: [ms,
    #: launches]}``, the longest, the rest summed). What a column's extra time is made of: which kernels, how many
    #: launches (:func:`format_kernels`)
    kernel_ms: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    #: every repetition's ms per column, in repetition order: the same index is the same interleaved repetition in
    #: every column, so two columns compare pair by pair (:func:`diffattn.bench.paired_ratio`)
    samples_ms: dict[str, list[float]] = field(default_factory=dict)
    #: every column's step replayed from CUDA graphs (module docstring), ``graph_scope`` saying how
    cuda_graphs: bool = False
    #: on request (``host_profile``): where the host's time went in one more step per column, profiled with
    #: PyTorch's Python tracer (:func:`diffattn.bench.kernels.profile_host`: ``{row: [self ms, calls]}`` of ATen ops,
    #: autograd nodes, CUDA runtime calls and Python functions). Where the step is host-bound its wall time is this;
    #: the rows some DIFF column has beyond the baseline's are what its extra time is made of (:func:`format_host`)
    host_ms: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    #: the host-profiled step's host time until it returned, per column: longer than ``ms`` by the tracer's own cost
    #: (compare columns)
    host_wall_ms: dict[str, float] = field(default_factory=dict)
    #: with ``cuda_graphs``: "whole" (forward, backward and AdamW one graph) or "micro" (forward and backward one
    #: graph, AdamW eager: ``diffattn pretrain --cuda-graphs``); "" for an eager step
    graph_scope: str = ""

    def ratio(self, column: str) -> float:
        return self.ms[column] / self.ms["baseline"]


def _optimizer(model, capturable: bool = False) -> torch.optim.AdamW:
    """The step's AdamW over the model's float32 parameters (``capturable``: its step count on the GPU, for a graph)."""
    return torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, capturable=capturable)


def _loss_fn(forward, device_type: str, dtype: str, fused: tuple[str, ...], cache_enabled: bool = True):
    """``ids -> loss``: the forward under autocast in ``dtype`` (none for fp32) with the switches ``fused`` forced on
    (``cache_enabled``: autocast's cache of cast weights, off where the step is captured as a graph)."""
    amp = DTYPES[dtype]

    def loss_fn(ids):
        autocast = torch.autocast(device_type, dtype=amp, cache_enabled=cache_enabled) if amp is not None else None
        with autocast or contextlib.nullcontext(), switches_forced(fused):
            # no KV cache, as diffattn.train's Trainer runs (TrainingArguments.use_cache, default False): with the
            # config's default (True) every layer would copy its K and V into a DynamicCache each step
            return forward(input_ids=ids, labels=ids, use_cache=False).loss

    return loss_fn


def _step_fn(
    model,
    batch,
    dtype: str = "fp32",
    compile_backend: str | None = None,
    fused: tuple[str, ...] = (),
    compile_mode: str | None = None,
):
    """One training step in ``dtype`` (see the module docstring): float32 weights and AdamW; bf16/fp16 run the
    forward under autocast, fp16 with a gradient scaler. ``compile_backend``: the forward through ``torch.compile``
    with that backend (the same parameters: the optimizer steps the model's own), in ``compile_mode`` (None or
    "default": torch's default). ``fused``: the route-table switches (:data:`FUSED`'s values) forced on in the step
    (the rest as the table says)."""
    opt = _optimizer(model)
    device_type = batch.device.type
    scaler = torch.amp.GradScaler(device_type, enabled=dtype == "fp16")
    mode = torch_compile_mode(compile_mode)
    forward = torch.compile(model, backend=compile_backend, mode=mode) if compile_backend else model
    loss_fn = _loss_fn(forward, device_type, dtype, fused)

    def step():
        if mode == "reduce-overhead":  # a new step for inductor's CUDA graphs: the last step's outputs may be rewritten
            torch.compiler.cudagraph_mark_step_begin()
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss_fn(batch)).backward()
        scaler.step(opt)
        scaler.update()

    return step


def _graphed_step_fn(model, batch, dtype: str = "bf16", fused: tuple[str, ...] = ()):
    """:func:`_step_fn`'s step (bf16 or fp32), its AdamW built ``capturable=True``, as one CUDA graph
    (:class:`diffattn.cuda_graphs.GraphedTrainStep`: warmed up and captured here, replayed by each call). Autocast's
    cache of cast weights is off: it does not outlive the capture's autocast block (PyTorch's advice for graphs)."""
    from ..cuda_graphs import GraphedTrainStep

    loss_fn = _loss_fn(model, batch.device.type, dtype, fused, cache_enabled=False)
    # the batch is one unpadded, unpacked block of ids: the eager step's masks (none) hold for every replay
    graphed = GraphedTrainStep(loss_fn, _optimizer(model, capturable=True), (batch,), masks_from_warm_up=True)
    return lambda: graphed(batch)


#: what ``cuda_graphs`` may say: the whole step one graph, or each micro-step's forward and backward (AdamW eager)
GRAPH_SCOPES = ("whole", "micro")


def _micro_graphed_step_fn(model, batch, dtype: str = "bf16", fused: tuple[str, ...] = ()):
    """:func:`_step_fn`'s step (bf16 or fp32) as ``diffattn pretrain --cuda-graphs`` runs it: forward and backward one
    CUDA graph (:class:`diffattn.cuda_graphs.GraphedMicroSteps`, its warm-up calls and capture made here), AdamW and
    the zeroing eager after each replay."""
    from ..cuda_graphs import GraphedMicroSteps

    opt = _optimizer(model)
    loss_fn = _loss_fn(model, batch.device.type, dtype, fused, cache_enabled=False)

    def forward_backward(inputs):
        loss = loss_fn(inputs["ids"])
        loss.backward()
        return loss.detach()

    # the batch is one unpadded, unpacked block of ids: the eager step's masks (none) hold for every replay
    micro = GraphedMicroSteps(forward_backward, model.parameters(), masks_from_warm_up=True)

    def step():
        micro({"ids": batch})
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(micro.warmup_steps + 1):  # the warm-up calls, then the capture (and its replay)
        step()
    return step


def run_train_step_benchmark(
    presets=("tiny", "small"),
    seq_lens=(512, 1024),
    batch: int = 2,
    reps: int = 5,
    device: str | None = None,
    progress=None,
    dtype: str | None = None,
    memory: bool = False,
    compile_backend: str | None = None,
    backends: tuple[str, ...] = (),
    cuda_graphs: bool | str = False,
    compile_mode: str | None = None,
    host_profile: bool = False,
) -> list[StepRow]:
    """Median step time per column. ``dtype``: "bf16", "fp16" or "fp32" (default: :func:`default_dtype`).
    ``memory=True`` on CUDA also records each column's ``peak_mib`` (one more step per column, after the timing).
    ``compile_backend``: each model's forward through ``torch.compile`` with it, in ``compile_mode`` (a mode of
    :data:`~diffattn.cuda_graphs.COMPILE_MODES`; it needs a backend); ``backends``: a DIFF column per
    backend, forced; ``cuda_graphs``: each column's step replayed from CUDA graphs, ``True`` or ``"whole"`` the whole
    step, ``"micro"`` forward and backward with AdamW eager (module docstring);
    ``host_profile``: one more step per column profiled on the host (:attr:`StepRow.host_ms`; not for a graphed step,
    whose replay is one launch)."""
    columns = columns_for(backends)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = dtype or default_dtype(device)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    scope = "whole" if cuda_graphs is True else (cuda_graphs or "")
    if scope and scope not in GRAPH_SCOPES:
        raise ValueError(f"cuda_graphs must be one of {', '.join(GRAPH_SCOPES)} (or True: whole), got {cuda_graphs!r}")
    cuda_graphs = bool(scope)
    if cuda_graphs:
        check_graphable(device, dtype, compile_backend)
    if compile_mode is not None and (compile_mode not in COMPILE_MODES or not compile_backend):
        raise ValueError(
            f"compile_mode must be one of {', '.join(COMPILE_MODES)}, with a compile backend; got {compile_mode!r} "
            f"with {compile_backend!r}"
        )
    if host_profile and cuda_graphs:
        raise ValueError("host_profile: a graphed step's host work is one launch; profile the eager step")
    rows = []
    for preset in presets:
        for n in seq_lens:
            if progress:
                progress(f"{preset} seq {n} ({dtype})")
            if compile_backend:
                # each model recompiles the same forward code; dynamo stops compiling after its recompile limit (8)
                # and runs eager silently: a fresh start per row keeps every row's four compiles under it
                torch._dynamo.reset()
            inputs, models = {}, {}
            for name, (attention, backend) in columns.items():
                backend, fused = split_fused(backend)
                model = build_model(preset, attention, backend=backend, seed=0, max_position_embeddings=max(n, 1024))
                model.to(device).train()
                models[name] = model
                ids = torch.randint(0, model.config.vocab_size, (batch, n), generator=torch.Generator().manual_seed(0))
                inputs[name] = (ids.to(device), fused)
            steps, failed = {}, {}
            for name, (ids, fused) in inputs.items():  # warm-up (and the compiling, or the graph's capture)
                try:
                    if cuda_graphs:  # warmed up and captured as it is built
                        graphed = _graphed_step_fn if scope == "whole" else _micro_graphed_step_fn
                        step = graphed(models[name], ids, dtype, fused)
                    else:
                        step = _step_fn(models[name], ids, dtype, compile_backend, fused, compile_mode)
                        step()
                    steps[name] = step
                except Exception as err:  # a forced backend that cannot take these calls: NaN, and why
                    if name in COLUMNS and not cuda_graphs:  # a step that cannot be captured: NaN, and why, too
                        raise
                    failed[name] = error_line(err)
                    print(f"{preset} seq {n}: {name} failed: {failed[name]}", flush=True)
            times = {name: [] for name in steps}
            cuda = device.startswith("cuda")
            names = list(steps)
            with gc_paused():
                for rep in range(reps):
                    for name in rotated(names, rep):
                        if cuda:
                            torch.cuda.synchronize()
                        t0 = time.perf_counter()
                        steps[name]()
                        if cuda:
                            torch.cuda.synchronize()
                        times[name].append(time.perf_counter() - t0)
            peak = _step_peak_mib(steps, models) if memory and cuda and not cuda_graphs else {}
            busy, kernels = gpu_profile(steps) if cuda else ({}, {})
            host_wall, host = host_profiles(steps) if host_profile else ({}, {})
            ms = {k: 1e3 * statistics.median(v) for k, v in times.items()} | dict.fromkeys(failed, float("nan"))
            spread = {k: 1e3 * (max(v) - min(v)) for k, v in times.items()} if reps > 1 else {}
            samples = {k: [round(1e3 * x, 4) for x in v] for k, v in times.items()}
            compiled = _compiled_label(compile_backend, compile_mode)
            rows.append(
                StepRow(
                    preset,
                    n,
                    batch,
                    ms,
                    dtype,
                    peak,
                    busy,
                    spread,
                    compiled,
                    kernels,
                    samples,
                    cuda_graphs,
                    host,
                    host_wall,
                    scope,
                )
            )
    return rows


def _compiled_label(backend, mode: str | None) -> str:
    """A row's ``compiled``: the torch.compile backend by name (a callable backend by its function's name), with the
    mode where it is not the default (``inductor:reduce-overhead``); "" for an eager row."""
    if not backend:
        return ""
    name = backend if isinstance(backend, str) else getattr(backend, "__name__", type(backend).__name__)
    mode = torch_compile_mode(mode)
    return f"{name}:{mode}" if mode else name


def check_graphable(device: str, dtype: str, compile_backend: str | None = None) -> None:
    """Why a step on ``device`` in ``dtype`` cannot be one CUDA graph (a ValueError), or nothing."""
    if not str(device).startswith("cuda"):
        raise ValueError(f"cuda_graphs replays a CUDA graph: device {device} is not CUDA")
    if dtype == "fp16":
        raise ValueError("cuda_graphs: fp16 steps through a gradient scaler, whose checks read the host; use bf16")
    if compile_backend:
        raise ValueError("cuda_graphs with compile: inductor graphs a compiled step itself (mode='reduce-overhead')")


def split_fused(backend: str | None) -> tuple[str | None, tuple[str, ...]]:
    """A column's backend without its :data:`FUSED` suffixes, and the switches they name."""
    switches: list[str] = []
    while backend and any(backend.endswith(suffix) for suffix in FUSED):
        suffix = next(suffix for suffix in FUSED if backend.endswith(suffix))
        switches.insert(0, FUSED[suffix])
        backend = backend.removesuffix(suffix)
    return backend, tuple(switches)


#: the prefix of a forced column's backend that forces it in DIFF V2's model (``v2:cudnn_direct``), not DIFF V1's
V2_PREFIX = "v2:"
#: per model a backend can be forced in: the prefix its backend takes as asked for, and its columns' names
FORCED_MODELS = {"diff": ("", "diffattn DIFF ({})"), "diff-v2": (V2_PREFIX, "diffattn DIFF V2 ({})")}


def _forced_model(backend: str) -> tuple[str, str]:
    """(architecture, backend) of a forced column's backend as asked for: the model of :data:`FORCED_MODELS` whose
    prefix it has (DIFF V2's :data:`V2_PREFIX`), else DIFF V1's (no prefix)."""
    for arch, (prefix, _) in FORCED_MODELS.items():
        if prefix and backend.startswith(prefix):
            return arch, backend.removeprefix(prefix)
    return "diff", backend


def forced_backend(column: str) -> tuple[str, str] | None:
    """(architecture, backend with its switch suffixes) of a forced column's name — :func:`forced_column`'s inverse —
    or None where ``column`` is not one (``baseline``, ``HF DiffLlama``). The default DIFF columns read as forced
    ``auto``."""
    for arch, (_, name) in FORCED_MODELS.items():
        head, tail = name.split("{}")
        if column.startswith(head) and column.endswith(tail):
            return arch, column.removeprefix(head).removesuffix(tail)
    return None


def columns_for(backends=()) -> dict[str, tuple[str, str | None]]:
    """:data:`COLUMNS` and one ``diffattn DIFF (BACKEND)`` column per backend asked for (known backends only, with
    :data:`FUSED` suffixes where they apply), ``diffattn DIFF V2 (BACKEND)`` for ``v2:BACKEND`` (DIFF V2's model,
    without suffixes: the switches are DIFF V1's layer's)."""
    from ..ops import BACKENDS
    from ..ops.routes import DIRECT, EPILOGUE, runs_epilogue

    suffixed = [b for b in backends if b.startswith(V2_PREFIX) and split_fused(b)[1]]
    if suffixed:
        raise ValueError(f"{', '.join(suffixed)}: a DIFF V2 column ({V2_PREFIX}BACKEND) takes no switch suffix")
    unknown = [b for b in backends if split_fused(_forced_model(b)[1])[0] not in BACKENDS]
    if unknown:
        raise ValueError(f"unknown backend(s) {', '.join(unknown)}; choose from {', '.join(BACKENDS)}")
    unfusable = [b for b in backends if "fused_head_norm" in split_fused(b)[1]
                 and not (split_fused(b)[0] == "auto" or runs_epilogue(split_fused(b)[0]))]  # fmt: skip
    if unfusable:
        raise ValueError(
            f"{', '.join(unfusable)}: +norm (the head norm in the epilogue's kernel) follows auto, {DIRECT} or a "
            f"route ending in {EPILOGUE}"
        )
    return {**COLUMNS, **{forced_column(b): _forced_model(b) for b in backends}}


def forced_column(backend: str) -> str:
    """The name of the DIFF column with ``backend`` forced (``diffattn DIFF (auto)`` for ``auto``; ``diffattn DIFF V2
    (cudnn_direct)`` for ``v2:cudnn_direct``)."""
    arch, route = _forced_model(backend)
    return FORCED_MODELS[arch][1].format(route)


def gpu_profile(steps: dict) -> tuple[dict[str, float], dict[str, dict[str, list[float]]]]:
    """Per column, from one step under ``torch.profiler`` (:func:`diffattn.bench.kernels.profile_gpu`): the GPU's busy
    time (:attr:`StepRow.gpu_ms`) and its kernels (:attr:`StepRow.kernel_ms`). A column whose profile is unusable is
    left out with one line; a profiler that fails gives no figures (one line), not the end of the benchmark."""
    busy_by_column, kernels_by_column, unusable = {}, {}, []
    try:
        for name, step in steps.items():
            profiled = profile_gpu(step)
            if profiled is None:
                unusable.append(name)
            else:
                busy_by_column[name], kernels_by_column[name] = profiled
    except Exception as err:  # the figures are an aid to reading the times, not the times
        print(f"GPU busy time not measured: {error_line(err)}", flush=True)
        return {}, {}
    if unusable:
        print(f"GPU busy time not measured for {', '.join(unusable)}: no GPU event with a sane time", flush=True)
    return busy_by_column, kernels_by_column


def host_profiles(steps: dict) -> tuple[dict[str, float], dict[str, dict[str, list[float]]]]:
    """Per column, from one step under the host's profiler (:func:`diffattn.bench.kernels.profile_host`): its host
    time (:attr:`StepRow.host_wall_ms`) and where the host's time went (:attr:`StepRow.host_ms`). A profiler that
    fails gives no figures (one line), not the end of the benchmark."""
    walls, tables = {}, {}
    try:
        for name, step in steps.items():
            walls[name], tables[name] = profile_host(step)
    except Exception as err:  # an aid to reading the times, as the GPU's profile is
        print(f"host profile not taken: {error_line(err)}", flush=True)
        return {}, {}
    return walls, tables


def _step_peak_mib(steps: dict, models: dict) -> dict[str, float]:
    """Per column: ``torch.cuda.max_memory_allocated`` during one step, less what was allocated before it with that
    model's gradients freed (all four models' weights and AdamW state stay resident)."""
    out = {}
    for name, step in steps.items():
        models[name].zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        out[name] = (torch.cuda.max_memory_allocated() - before) / 2**20
    return out


def format_table(rows: list[StepRow]) -> str:
    """The rows as text: one line per row (times, ratios, forced backends), then a ``range`` line (max − min of the
    repetitions) and on CUDA a ``gpu`` line (:attr:`StepRow.gpu_ms`)."""
    nan = float("nan")
    names = list(COLUMNS)
    head = f"{'preset':<7} {'seq':>5} {'dtype':>5} " + " ".join(f"{n + ' ms':>22}" for n in names)
    head += "   DIFF/base   HF/base   HF/DIFF   V2/base   V2/DIFF"
    lines = [head]
    for r in rows:
        cells = " ".join(f"{r.ms[n]:>22.1f}" for n in names)
        lines.append(
            f"{r.preset:<7} {r.seq_len:>5} {r.dtype:>5} {cells}   {r.ratio('diffattn DIFF (auto)'):>9.2f} "
            f"{r.ratio('HF DiffLlama'):>9.2f} {r.ms['HF DiffLlama'] / r.ms['diffattn DIFF (auto)']:>9.2f} "
            f"{r.ratio('diffattn DIFF V2 (auto)'):>9.2f} "
            f"{r.ms['diffattn DIFF V2 (auto)'] / r.ms['diffattn DIFF (auto)']:>9.2f}"
        )
        extra = [n for n in r.ms if n not in COLUMNS]  # forced backends: their ms and ratio to the baseline
        if extra:
            lines[-1] += "   " + "  ".join(f"{n} {r.ms[n]:.1f} ({r.ratio(n):.2f}x)" for n in extra)
        if r.compiled:
            lines[-1] += f"   (forward compiled: {r.compiled})"
        if r.cuda_graphs:
            lines[-1] += ("   (forward and backward one CUDA graph, AdamW eager: pretrain --cuda-graphs)"
                          if r.graph_scope == "micro" else "   (whole step one CUDA graph)")  # fmt: skip
        for label, figures in (("range", r.range_ms), ("gpu", r.gpu_ms)):  # the samples' spread; the GPU's share
            if figures:
                lines.append(f"{'':<7} {'':>5} {label:>5} " + " ".join(f"{figures.get(n, nan):>22.1f}" for n in names))
                more = [f"{n} {figures[n]:.1f}" for n in extra if n in figures]
                lines[-1] += ("   " + "  ".join(more)) if more else ""
    return "\n".join(lines)


def table_legend(rows: list[StepRow]) -> str:
    """What the lines under each row of :func:`format_table` are, said once under the table (the ``range`` line was
    unlabelled: a user's review, 2026-12-03)."""
    parts = []
    if any(r.range_ms for r in rows):
        parts.append(
            "range: each column's slowest repetition less its fastest, ms (the median's spread; two columns whose "
            "difference is within their ranges are not told apart by this run)"
        )
    if any(r.gpu_ms for r in rows):
        parts.append(
            "gpu: ms some kernel ran during one profiled step (well below the step's ms: host-bound; close to it: the "
            "GPU is the limit)"
        )
    return "\n".join(parts)


def column_label(column: str) -> str:
    """A column's name, short enough for a kernel table's header: ``DIFF auto``, ``V2 auto``, a forced backend's
    name (``+epi`` for ``+epilogue``), ``DiffLlama``, ``baseline``."""
    forced = forced_backend(column)
    if forced is None:
        return column.removeprefix("HF ")
    arch, backend = forced
    backend = backend.replace("+epilogue", "+epi")
    return f"V2 {backend}" if arch == "diff-v2" else backend if backend != "auto" else "DIFF auto"


def format_kernels(rows: list[StepRow], shown: int = KERNELS_SHOWN) -> str:
    """Per row with a profile (:attr:`StepRow.kernel_ms`), :func:`diffattn.bench.kernels.format_kernel_table` of its
    columns: where the columns' times part, which kernels part them. Empty without profiles."""
    return "\n\n".join(
        format_kernel_table(
            f"kernels of one profiled step, ms (launches): {r.preset} {r.seq_len} tokens x {r.batch}, {r.dtype}",
            {column_label(c): table for c, table in r.kernel_ms.items()},
            shown,
        )
        for r in rows
        if r.kernel_ms
    )


def format_host(rows: list[StepRow], shown: int = KERNELS_SHOWN) -> str:
    """Per row with a host profile (:attr:`StepRow.host_ms`): the profiled step's host time, kernel launches and host
    waits on the GPU per column, then :func:`diffattn.bench.kernels.format_kernel_table` of the rows by which some
    column's host time exceeds the baseline's most. Empty without host profiles."""
    parts = []
    for r in rows:
        if not r.host_ms:
            continue
        labels = {c: column_label(c) for c in r.host_ms}
        width = max(14, *(len(v) + 1 for v in labels.values()))
        figures = {
            "profiled step, host ms": [r.host_wall_ms.get(c, float("nan")) for c in r.host_ms],
            "kernel launches (calls)": [calls_of(t, LAUNCH_CALLS) for t in r.host_ms.values()],
            "host waits on the GPU": [calls_of(t, SYNC_CALLS) for t in r.host_ms.values()],
        }
        summary = [f"{'':<28}" + "".join(f"{labels[c]:>{width}}" for c in r.host_ms)]
        for label, values in figures.items():
            digits = 2 if label.endswith("ms") else 0
            summary.append(f"{label:<28}" + "".join(f"{v:>{width}.{digits}f}" for v in values))
        table = format_kernel_table(
            f"host time of one profiled step, self ms (calls), rows by the most beyond the baseline: {r.preset} "
            f"{r.seq_len} tokens x {r.batch}, {r.dtype}",
            {labels[c]: t for c, t in r.host_ms.items()},
            shown,
            what="host",
            beyond_first=True,
        )
        parts.append("\n".join([*summary, "", table]))
    return "\n\n".join(parts)


def rows_as_dicts(rows: list[StepRow]) -> list[dict]:
    return [asdict(r) for r in rows]
