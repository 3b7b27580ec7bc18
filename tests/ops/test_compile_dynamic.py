"""diff_attention, the DIFF models and the adapted models under ``torch.compile(dynamic=True, fullgraph=True)``: sizes
traced as symbols, so that one graph serves every sequence length (what a training loop over variable-length batches,
or a compiled model asked to mark lengths dynamic, traces). Every PyTorch route, model and adapter path traces without
a graph break, computes what eager computes, and compiles once for two lengths — except ``chunked`` (the CPU's route
for two maps over separate K), whose Python loop over query chunks needs the length: once per length. Found at stop 54
(two reviews, then tracing each path by hand): SDPA got symbolic flags, ``chunked`` an autograd Function given one
tensor twice, validate a symbolic scale and formatted the sizes into an error text it had not raised (which fixed
them), and every adapted layer imported its RoPE function in forward."""

from __future__ import annotations

import pytest
import torch

from diffattn import ops

LENGTHS = (7, 12)  # two sequence lengths through one symbolic trace


def _counted():
    """A torch.compile backend that runs the graph eagerly and counts the graphs compiled (``.frame_count``)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    return CompileCounterWithBackend("eager")


def _compiles_expected(route_is_chunked: bool) -> int:
    return len(LENGTHS) if route_is_chunked else 1


def _inputs(shared: str, t: int, seed: int = 0):
    """DIFF V1's maps (``none``: two Q, two K, V of width 2d, GQA 2), DIFF V2's / DAA's (``k``: one K, V of width d)
    or DiffK's (``q``: one Q, two K); leaves without repeats, the op's arguments with them."""
    g = torch.Generator().manual_seed(seed)
    h, hkv, d = 4, 2, 8

    def r(*s):
        return torch.randn(*s, generator=g).requires_grad_()

    q1, k1 = r(2, h, t, d), r(2, hkv, t, d)
    q2 = q1 if shared == "q" else r(2, h, t, d)
    k2 = k1 if shared == "k" else r(2, hkv, t, d)
    v = r(2, hkv, t, d if shared == "k" else 2 * d)
    args = [q1, k1, q2, k2, v, torch.tensor(0.4, requires_grad=True)]
    return args, [x for i, x in enumerate(args) if not any(x is y for y in args[:i])]


def _route_params():
    # chunked compiles once per length (20 s for its two lengths on the 2-core AMD EPYC of 2026-12-01, over the
    # default run's 10 s a test): CI's heavy run
    for backend in ("sdpa", "sdpa_split", "sdpa_maps", "chunked", "reference"):
        for shared in ("none", "k", "q"):
            heavy = backend == "chunked"
            yield pytest.param(backend, shared, id=f"{shared}-{backend}", marks=pytest.mark.heavy if heavy else ())


@pytest.mark.parametrize(("backend", "shared"), list(_route_params()))
def test_a_dynamic_shape_trace_has_no_graph_break_and_computes_what_eager_does(backend, shared):
    # chunked with one K or one Q also failed under a static fullgraph trace: its autograd Function was handed the
    # same tensor twice, which dynamo cannot trace
    if backend == "sdpa_split" and shared == "k":
        pytest.skip("sdpa_split needs dv > d: not shared-K heads")
    torch._dynamo.reset()
    counter = _counted()
    compiled = torch.compile(
        lambda *a: ops.diff_attention(*a, backend=backend), dynamic=True, fullgraph=True, backend=counter
    )
    for t in LENGTHS:
        args, leaves = _inputs(shared, t)
        got = compiled(*args)
        want = ops.diff_attention(*args, backend=backend)
        assert torch.equal(got, want)
        cot = torch.randn(got.shape, generator=torch.Generator().manual_seed(t))
        for a, b in zip(torch.autograd.grad(got, leaves, cot), torch.autograd.grad(want, leaves, cot), strict=True):
            assert torch.equal(a, b)
    assert counter.frame_count == _compiles_expected(backend == "chunked")


@pytest.mark.parametrize(
    ("attention", "mask"),
    # DIFF V1 runs chunked on this CPU (once per length, 12-13 s on 2 cores): CI's heavy run; DIFF V2 in the default
    [pytest.param("diff", m, marks=pytest.mark.heavy) for m in ("none", "padding")] + [("diff-v2", "padding")],
)
def test_a_diff_model_traces_whole_with_symbolic_sizes(attention, mask):
    # the layer's own work around the op too (λ, the per-head norm, the whole-heads calls): one graph for two
    # lengths, the logits eager's. Its float scale arrives symbolic there, which math.isfinite in validate refused;
    # with key padding, the mask checks (`in` on symbolic sizes) and the value-dependent skips (no fully masked row,
    # a packed row's mask, the masks remembered by identity) ended the trace
    from diffattn.models import build_model

    model = build_model("debug", attention)
    torch._dynamo.reset()
    counter = _counted()
    compiled = torch.compile(model, dynamic=True, fullgraph=True, backend=counter)
    for t in LENGTHS:
        ids = torch.randint(0, model.config.vocab_size, (2, t), generator=torch.Generator().manual_seed(t))
        kwargs = {}
        if mask == "padding":  # row 1 left-padded by 3: its first query rows attend to nothing
            kwargs["attention_mask"] = torch.ones(2, t, dtype=torch.long)
            kwargs["attention_mask"][1, :3] = 0
        got = compiled(ids, **kwargs).logits
        assert torch.equal(got, model(ids, **kwargs).logits)
        got.square().mean().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    # on this CPU auto runs chunked for DIFF V1 (two maps over separate K), sdpa for DIFF V2
    assert counter.frame_count == _compiles_expected(attention == "diff")


def _adapter_config(method: str):
    from diffattn import adapters

    return {
        "dex": lambda: adapters.DexConfig(heads="all", anneal_steps=4),
        "daa": lambda: adapters.DAAConfig(anneal_steps=4),
        "diffk": lambda: adapters.DiffKConfig(anneal_steps=4),
    }[method]()


@pytest.mark.parametrize(
    ("method", "model_type", "implementation"),
    # a single map (Dex; DiffV alike), two maps on one K (DAA; DiffQ, the V2 retrofit alike), on two K (DiffK;
    # DiffLoRA alike), and a single map through transformers' SDPA; every method traced so by hand on this CPU
    [("dex", "llama", "diffattn"), ("daa", "qwen3", "diffattn"),
     pytest.param("diffk", "llama", "diffattn", marks=pytest.mark.heavy),  # chunked: once per length, 12 s
     ("dex", "llama", "sdpa")],
)  # fmt: skip
def test_an_adapted_model_traces_whole_with_symbolic_sizes(method, model_type, implementation):
    # every adapted layer imported its architecture's RoPE function in forward (a graph break a layer, an error
    # under fullgraph, static shapes too) and a single map's SDPA call got symbolic flags; now one graph. The step t
    # of λ(t) changes between the calls, as in training: it reaches the graph as a tensor (AdapterState), where as a
    # Python number it was a constant of the graph and every step compiled again
    from diffattn.adapters import adapt, set_adapter_step

    from ..tiny_models import ids, tiny

    model = adapt(tiny(model_type), _adapter_config(method))
    assert model._diffattn_adapter.state.anneal_steps > len(LENGTHS)  # λ(t) still annealing at the last call
    if implementation != "diffattn":
        model.set_attn_implementation(implementation)
    torch._dynamo.reset()
    counter = _counted()
    compiled = torch.compile(model, dynamic=True, fullgraph=True, backend=counter)
    for step, t in enumerate(LENGTHS, start=1):
        set_adapter_step(model, step)
        x = ids(t=t)
        got = compiled(x).logits
        assert torch.equal(got, model(x).logits)
        got.square().mean().backward()
    # DiffK's maps read two K: on this CPU auto runs chunked for them
    assert counter.frame_count == _compiles_expected(method == "diffk" and implementation == "diffattn")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("attention", ["diff", "diff-v2"])
def test_cuda_auto_traces_whole_with_symbolic_sizes(attention):
    # the CUDA half of the tests above, which this CPU cannot run: auto reads the call's class from symbolic sizes and
    # the route table at trace time (tests/ops/test_routes.py emulates the lookup on CPU tensors), then traces the
    # first route the table lists for the class (no fallback under compile: cudnn for DIFF V1 and sdpa_maps for DIFF
    # V2 by the H200's entry). Heads of d = 64 without GQA, the widths the shipped table lists (cuDNN's routes take
    # no GQA); both lengths are one size class: one graph
    from diffattn.models import build_model

    sizes = dict(hidden_size=256, num_heads=4, num_kv_heads=4, intermediate_size=512)
    model = build_model("debug", attention, dtype=torch.bfloat16, **sizes).cuda()
    torch._dynamo.reset()
    counter = _counted()
    compiled = torch.compile(model, dynamic=True, fullgraph=True, backend=counter)
    for t in LENGTHS:
        ids = torch.randint(0, model.config.vocab_size, (2, t), generator=torch.Generator().manual_seed(t)).cuda()
        got = compiled(ids).logits
        # the compiled graph runs eagerly (the counting backend): the same ATen calls on the same route as eager
        assert torch.equal(got, model(ids).logits)
        got.float().square().mean().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    assert counter.frame_count == 1
