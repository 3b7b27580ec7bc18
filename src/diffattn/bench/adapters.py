"""Adapter overhead, side by side: forward and training-step time of every adapter method as a ratio to its base.

What is measured, per model (all deep copies of one base, so they share weight values, and all fed the same
batch ``x``):

* ``forward``: one ``model(x)`` under ``torch.no_grad()`` in eval mode.
* ``train step``: ``model(x, labels=x).loss.backward()`` then ``AdamW.step()`` (lr 1e-5, no weight decay)
  on the model's trainable parameters, in train mode. An adapted model trains what
  :func:`diffattn.adapters.trainable_parameters` leaves trainable (the method's paper setting: Dex W_K, W_V,
  W_O, W_D, λ_learn; DAA / DiffQ / DiffK / DiffV the whole attention modules with their new weights;
  DiffLoRA the low-rank adapters only). The base, and the merged models (which *are* the base graph),
  train an **attention fine-tune**: W_Q, W_K, W_V, W_O of every layer, everything else frozen. That is
  exactly what DAA / DiffQ / DiffK / DiffV update of the base, so their step ratios isolate the method.

Rows: base; Dex unmerged and merged (folded into W_O); DAA with W_DAA before and after RoPE; DiffQ; DiffK;
DiffV unmerged and merged (folded into W_V); DiffLoRA right term (rank 64) and both terms (rank 32 each).
Dex picks half the heads at random (no calibration data needed; which heads does not change the cost).
λ(t) is made non-zero, so every method is really active: the annealed methods get ``anneal_steps = T`` and
``set_adapter_step(model, T // 2)``, where λ = ¼·λ_init > 0 (past T, λ = λ_learn, which is 0 at init);
DiffLoRA's λ is the fixed 0.1. The merged models fold that non-zero λ.

Timing: one warm-up call per model, then ``reps`` repetitions, each running every model once, round-robin,
the starting model rotated by one each repetition (so no model is always timed first); the statistic is
the median over repetitions, and every ratio divides by the base's median of the same run.

The FLOP-ideal column is :func:`forward_flops` of the method over that of the base (see its docstring for the
formula), computed from the model config and the batch shape: what the ratio would be if time followed FLOPs.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ..adapters import adapt, adapter_lambdas, merge_adapter, set_adapter_step, trainable_parameters
from ..adapters.annealed import attention_module_names
from ..adapters.registry import specs
from . import gc_paused, rotated

ANNEAL_STEPS = 1000  # T of λ(t); the models are set to step T // 2, where λ(t) = ¼·λ_init > 0
SOFTMAX_FLOPS = 5  # per score element: max, subtract, exp, sum, divide
DEX_MERGE_TARGET = 1.05  # the target Dex was built to: unmerged forward <= 1.05x the base


@dataclass(frozen=True)
class ModelShape:
    """What the FLOP count needs of a Llama-style decoder (RMSNorm, SwiGLU MLP, GQA, RoPE) and its batch."""

    layers: int
    d_model: int
    heads: int
    kv_heads: int
    head_dim: int
    d_ff: int
    vocab: int
    batch: int
    seq: int

    @classmethod
    def of(cls, config, x: torch.Tensor) -> ModelShape:
        heads = config.num_attention_heads
        return cls(
            layers=config.num_hidden_layers,
            d_model=config.hidden_size,
            heads=heads,
            kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            d_ff=config.intermediate_size,
            vocab=config.vocab_size,
            batch=x.shape[0],
            seq=x.shape[1],
        )


@dataclass(frozen=True)
class Variant:
    """One row: ``build(base) -> model`` (a fresh copy, adapted, its trainable set chosen) and its extra FLOPs."""

    name: str
    build: Callable[[nn.Module], nn.Module]
    extra_flops: Callable[[ModelShape], float]  # forward FLOPs added per layer
    trains: str


def forward_flops(s: ModelShape, extra_per_layer: float = 0.0) -> float:
    """Forward FLOPs of the base model on a ``[batch, seq]`` batch, plus ``extra_per_layer`` in every layer.

    A matmul counts 2 FLOPs per multiply-add; a softmax ``SOFTMAX_FLOPS`` (5) per score element; norms, RoPE,
    SwiGLU's gate and residual adds (O(N·d_model) elementwise) and the embedding gather are not counted. With
    N = batch·seq tokens, P = batch·seq(seq+1)/2 causal (query, key) pairs, D = d_model, H / Hkv query / KV
    heads of width d, F = d_ff, V = vocab, L layers::

        base  = L·[2N·D·(H + 2·Hkv)·d + 2N·H·d·D       (Q, K, V, O projections)
                   + H·P·(2d + 5 + 2d)                 (Q·Kᵀ, softmax, A·V)
                   + 2N·3·D·F]                         (SwiGLU MLP)
                + 2N·D·V                               (lm_head)

    and per layer, what each method adds (:func:`second_map_flops` = H·P·(2d + 5 + 2): the second Q·Kᵀ, its
    softmax and the signed map A1 − λ·A2; the ideal multiplies V once, by the signed map)::

        Dex            2N·H_sel·d²                     (f_D on the H_sel selected heads' outputs)
        DAA            2N·H·d² + second map            (Q·W_DAA per head; the same before or after RoPE)
        DiffQ          2N·D² + 2N·D·H·d + second map   (X·W_D, then its query projection)
        DiffK          2N·D² + 2N·D·Hkv·d + second map (X·W_D, then its key projection)
        DiffV          2N·D²                           (X·W_D on the value input; one map)
        DiffLoRA       t·2N·r·(2D + H·d + Hkv·d) + second map   (t = 1 right term, 2 both: x·Aᵀ·Bᵀ for Q, K)
        merged         0                               (the base graph)
    """
    n = s.batch * s.seq
    pairs = s.batch * s.seq * (s.seq + 1) / 2
    d, h, hkv, dm = s.head_dim, s.heads, s.kv_heads, s.d_model
    proj = 2 * n * dm * (h + 2 * hkv) * d + 2 * n * h * d * dm
    attn = h * pairs * (2 * d + SOFTMAX_FLOPS + 2 * d)
    mlp = 2 * n * 3 * dm * s.d_ff
    return s.layers * (proj + attn + mlp + extra_per_layer) + 2 * n * dm * s.vocab


def second_map_flops(s: ModelShape) -> float:
    """The second map of the two-map methods, per layer: Q2·K2ᵀ, its softmax, A1 − λ·A2 (2 FLOPs/element)."""
    pairs = s.batch * s.seq * (s.seq + 1) / 2
    return s.heads * pairs * (2 * s.head_dim + SOFTMAX_FLOPS + 2)


def _train_attention(model: nn.Module) -> nn.Module:
    """The base's training set: W_Q, W_K, W_V, W_O (every attention-module parameter); the rest frozen."""
    names = set(attention_module_names(model))
    for n, p in model.named_parameters():
        p.requires_grad_(n in names)
    return model


def _adapted(config, merge: bool = False) -> Callable[[nn.Module], nn.Module]:
    def build(base: nn.Module) -> nn.Module:
        model = adapt(copy.deepcopy(base), config)
        set_adapter_step(model, ANNEAL_STEPS // 2)
        lams = adapter_lambdas(model)
        if not all(lam > 0 for lam in lams):
            raise RuntimeError(f"{type(config).__name__}: λ(t) should be > 0 for the benchmark; got {lams}")
        if merge:
            return _train_attention(merge_adapter(model))
        trainable_parameters(model)
        return model

    return build


ATTN_FT = "W_Q,K,V,O (attention fine-tune)"


def variants(shape: ModelShape) -> list[Variant]:
    """Every row of the benchmark, base first, then each registered method's rows (its registry entry's
    ``bench_variants``: the configs to time and the forward FLOPs each adds per layer)."""
    rows = [Variant("base", lambda b: _train_attention(copy.deepcopy(b)), lambda s: 0.0, ATTN_FT)]
    for spec in specs("method"):
        if spec.bench_variants is None:
            continue
        for name, config, merge, extra, trains in spec.bench_variants(shape, ANNEAL_STEPS, second_map_flops):
            rows.append(Variant(name, _adapted(config, merge), lambda s, e=extra: e, trains or ATTN_FT))
    return rows


def is_base_graph(base: nn.Module, model: nn.Module) -> bool:
    """Same module classes in the same order, same state-dict keys and shapes, and no adapter attached."""
    if getattr(model, "_diffattn_adapter", None) is not None:
        return False
    if [type(m) for m in base.modules()] != [type(m) for m in model.modules()]:
        return False
    a, b = base.state_dict(), model.state_dict()
    return list(a) == list(b) and all(a[k].shape == b[k].shape for k in a)


def _fwd(model: nn.Module, x: torch.Tensor) -> Callable[[], None]:
    def run():
        with torch.no_grad():
            model(x)

    return run


def _train_step(model: nn.Module, x: torch.Tensor) -> Callable[[], None]:
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.0)

    def run():
        opt.zero_grad(set_to_none=True)
        model(x, labels=x).loss.backward()
        opt.step()

    return run


def _median_ms(fns: dict[str, Callable[[], None]], reps: int) -> dict[str, float]:
    """One warm-up call each, then ``reps`` round-robin passes (start rotated per pass); medians in ms."""
    for fn in fns.values():
        fn()
    names = list(fns)
    times: dict[str, list[float]] = {k: [] for k in names}
    with gc_paused():
        for r in range(reps):
            for k in rotated(names, r):
                t0 = time.perf_counter()
                fns[k]()
                times[k].append(time.perf_counter() - t0)
    return {k: 1e3 * statistics.median(v) for k, v in times.items()}


@dataclass
class AdapterRow:
    name: str
    forward_ms: float
    train_step_ms: float
    ideal_forward: float  # FLOP-ideal forward ratio to the base (forward_flops)
    trainable: int  # trainable parameters in the step
    trains: str  # what they are


@dataclass
class AdapterResult:
    rows: list[AdapterRow]
    base_graph: dict[str, bool]  # merged model name -> is_base_graph


def run_adapter_benchmark(base: nn.Module, x: torch.Tensor, reps: int = 5) -> AdapterResult:
    """Forward and train-step ms of the base and every adapter variant (see the module docstring)."""
    base = base.eval()
    shape = ModelShape.of(base.config, x)
    vs = variants(shape)
    models = {v.name: v.build(base) for v in vs}
    base_graph = {k: is_base_graph(base, m) for k, m in models.items() if k.endswith(" merged")}
    for m in models.values():
        m.eval()
    forward = _median_ms({k: _fwd(m, x) for k, m in models.items()}, reps)
    for m in models.values():
        m.train()
    step = _median_ms({k: _train_step(m, x) for k, m in models.items()}, reps)
    base_flops = forward_flops(shape)
    rows = [
        AdapterRow(
            v.name,
            forward[v.name],
            step[v.name],
            forward_flops(shape, v.extra_flops(shape)) / base_flops,
            sum(p.numel() for p in models[v.name].parameters() if p.requires_grad),
            v.trains,
        )
        for v in vs
    ]
    return AdapterResult(rows, base_graph)


def format_table(title: str, result: AdapterResult) -> str:
    b = result.rows[0]
    lines = [
        f"[{title}]",
        f"{'model':<15} {'fwd ms':>9} {'x base':>7} {'ideal':>6} {'step ms':>9} {'x base':>7} {'trained':>9}  trains",
    ]
    for r in result.rows:
        lines.append(
            f"{r.name:<15} {r.forward_ms:>9.1f} {r.forward_ms / b.forward_ms:>7.3f} {r.ideal_forward:>6.3f} "
            f"{r.train_step_ms:>9.1f} {r.train_step_ms / b.train_step_ms:>7.3f} {r.trainable / 1e6:>8.2f}M  {r.trains}"
        )
    return "\n".join(lines)


def target_lines(result: AdapterResult) -> list[str]:
    """The Dex target (unmerged forward within 5% of the base) and the merged-is-the-base-graph check."""
    by_name = {r.name: r for r in result.rows}
    ratio = by_name["dex unmerged"].forward_ms / by_name["base"].forward_ms
    met = "met" if ratio <= DEX_MERGE_TARGET else "missed"
    merged = ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in result.base_graph.items())
    return [
        f"target: Dex unmerged <= {DEX_MERGE_TARGET:.2f}x base forward: {ratio:.3f}x ({met})",
        f"merged is the base graph: {merged}",
    ]
