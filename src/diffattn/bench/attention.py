"""Attention speed, side by side: DIFF attention (DIFF Transformer Eq. 1, docs/methods.md §0; every usable backend,
the fused ``triton`` kernel included) vs a same-size baseline and the other ways people compute it.

Two tables, each printed as milliseconds and as a ratio to the baseline, measured in one run on the same
inputs with the implementations interleaved round-robin (so drift in machine load hits all of them alike):

* **op** — the attention core only. Baseline: ``scaled_dot_product_attention`` with 2h heads of width d,
  causal (FlashAttention on CUDA). DIFF: :func:`diffattn.ops.diff_attention` with h heads (Q1, Q2, K1, K2 of
  width d, V of width 2d) per backend. Same d_model, same FLOP budget of a parameter-matched model. On CUDA also:
  Hugging Face DiffLlama's route (two SDPA calls with 2h heads, one per V half, recomputing QKᵀ), the official
  code's four-call route (one SDPA call per map and V half, as with FlashAttention that cannot take V of width
  2d), and FlexAttention (one compiled call over the stacked maps) when it is available. Each row also times
  **decode**: one new token (T = 1) against a KV cache of N keys, forward only.
  **DIFF V2** rows (docs/methods.md §5) at the same d_model: 2h heads of width d, each with two query heads that share
  K and V (2h key heads of width d), λ per head and token: :func:`diffattn.ops.diff_attention` with K1 = K2, per
  backend (``sdpa`` takes its one-call path over the interleaved query heads). Its ideal is 2× the baseline's
  matmul FLOPs (twice the query heads), forward and backward.
* **module** — a whole attention layer (projections, RoPE, norm): transformers' ``LlamaAttention``
  (baseline), transformers' own ``DiffLlamaAttention``, ours installed with the ``auto`` backend, and our DIFF V2
  attention (``auto``).

Forward is timed under ``no_grad``; forward+backward back-propagates a random cotangent into every input
(op) or every parameter and the input (module). The statistic is the median over repetitions. An
implementation that runs out of memory at a size gets NaN in that row instead of stopping the run.

TFLOP/s (op level) use stated formulas, not each implementation's own work (:func:`attention_flops`): matmul
FLOPs over the visible (causal) query–key pairs, FlashAttention-2 accounting (the backward recomputes QKᵀ).
Baseline per head: forward 2·(d + dv), backward 2·(3d + 2dv) per pair. DIFF per head (two maps, one V):
forward 2·(2d + 2dv) (both QKᵀ and both P·V), backward 2·(6d + 2dv) (both QKᵀ recomputed, dV = (P1 − λP2)ᵀdO
and G = dO·Vᵀ once for both maps, dQ1, dK1, dQ2, dK2). With V of width 2d this is the ideal: forward
1.5×, backward 1×, forward+backward 8/7 = 1.14× the baseline.

On a GPU, the comparison to run: ``python benchmarks/attention.py --dtype bfloat16 --sizes
1024,2048,4096,8192,16384 --head-dim 64 --levels op`` (and ``--head-dim 128``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from ..ops import backend_status, diff_attention
from . import gc_paused

DEFAULT_SIZES = (512, 1024, 2048, 4096)
BASELINE = "baseline sdpa (2h heads, d)"
HF_TWO_CALLS = "HF DiffLlama (2 sdpa calls)"
OFFICIAL_FOUR_CALLS = "official (4 sdpa calls)"

#: the fused kernel's GPU targets: ratios to the baseline at most — issue 37's for DIFF V1 at d = 64 (forward,
#: forward+backward, decode per token), which :mod:`diffattn.bench.targets` checks a GPU run against too — and fwd+bwd
#: speedups over the other DIFF routes at least (the routes' names as keys)
TRITON_MAX_RATIO = {"fwd_ratio": 1.55, "fwd_bwd_ratio": 1.3, "decode_ratio": 1.5}
TRITON_MIN_SPEEDUP = {OFFICIAL_FOUR_CALLS: 1.4, HF_TWO_CALLS: 1.15}


@dataclass
class Row:
    level: str
    seq_len: int
    impl: str
    fwd_ms: float
    fwd_bwd_ms: float
    fwd_ratio: float = float("nan")
    fwd_bwd_ratio: float = float("nan")
    decode_ms: float = float("nan")  # one token against a cache of seq_len keys (op level)
    decode_ratio: float = float("nan")
    fwd_tflops: float = float("nan")  # from the stated formulas (attention_flops), op level
    fwd_bwd_tflops: float = float("nan")
    fwd_bwd_peak_mib: float = float("nan")  # CUDA, on request: see _fwd_bwd_peak_mib
    # (max − min) / median of the repetitions (_spread): this run's noise, beside the medians
    fwd_spread: float = float("nan")
    fwd_bwd_spread: float = float("nan")
    decode_spread: float = float("nan")
    # an ``auto`` row at op level: the route auto ran for these inputs, forward+backward and forward (under no_grad:
    # on CUDA another call class); the route's own row times it again
    runs: str = ""
    runs_fwd: str = ""


def visible_pairs(t: int, s: int, causal: bool) -> int:
    """Query–key pairs a causal (bottom-right aligned) or full mask lets through."""
    if not causal:
        return t * s
    # query i sees min(S, i + 1 + S − T) keys
    return sum(min(s, i + 1 + s - t) for i in range(t))


def attention_flops(b: int, h: int, t: int, s: int, d: int, dv: int, *, causal: bool, kind: str) -> dict:
    """Matmul FLOPs of one attention call: ``{"fwd", "bwd", "fwd_bwd"}``. ``kind="baseline"``: h heads of
    width d, values of width dv. ``kind="diff"``: h DIFF heads (two maps of width d, shared V of width dv)."""
    pairs = b * h * visible_pairs(t, s, causal)
    if kind == "baseline":
        fwd, bwd = 2 * (d + dv), 2 * (3 * d + 2 * dv)
    elif kind == "diff":
        fwd, bwd = 2 * (2 * d + 2 * dv), 2 * (6 * d + 2 * dv)
    else:
        raise ValueError(f"kind must be 'baseline' or 'diff', got {kind!r}")
    return {"fwd": pairs * fwd, "bwd": pairs * bwd, "fwd_bwd": pairs * (fwd + bwd)}


def _is_oom(err: BaseException) -> bool:
    return isinstance(err, torch.OutOfMemoryError) or "out of memory" in str(err).lower()


def _interleaved_medians(
    fns: dict[str, Callable[[], None]], reps: int, warmup: int = 1
) -> tuple[dict[str, float], dict[str, float]]:
    """Median milliseconds per implementation, and each one's spread: (max − min) / median of its repetitions (NaN
    with fewer than two); NaN for one that runs out of memory (it is then dropped)."""
    failed: set[str] = set()

    def call(name, fn):
        try:
            fn()
        except (RuntimeError, MemoryError) as err:
            if not _is_oom(err):
                raise
            failed.add(name)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()

    for name, fn in fns.items():
        for _ in range(warmup):
            if name not in failed:
                call(name, fn)
    times: dict[str, list[float]] = {name: [] for name in fns}
    with gc_paused():
        for _ in range(reps):
            for name, fn in fns.items():
                if name in failed:
                    continue
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                call(name, fn)
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                times[name].append(time.perf_counter() - t0)
    medians = {
        name: float("nan") if name in failed or not ts else 1e3 * statistics.median(ts) for name, ts in times.items()
    }
    spreads = {name: _spread(ts) if name not in failed else float("nan") for name, ts in times.items()}
    return medians, spreads


def _spread(times: list[float]) -> float:
    """(max − min) / median of a row's repetitions: how far one computation's timings fell apart in this run."""
    if len(times) < 2:
        return float("nan")
    return (max(times) - min(times)) / statistics.median(times)


def _fwd_bwd_peak_mib(fns: dict[str, Callable[[], None]], leaves: list[torch.Tensor]) -> dict[str, float]:
    """MiB each forward+backward allocates at its peak beyond what was allocated before it (its inputs, and every
    other implementation's, are resident throughout): ``torch.cuda.max_memory_allocated`` after a reset, with all
    gradients cleared first. NaN for one that runs out of memory."""
    out = {}
    for name, fn in fns.items():
        for x in leaves:
            x.grad = None
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        try:
            fn()
            torch.cuda.synchronize()
            out[name] = (torch.cuda.max_memory_allocated() - before) / 2**20
        except (RuntimeError, MemoryError) as err:
            if not _is_oom(err):
                raise
            out[name] = float("nan")
            torch.cuda.empty_cache()
    for x in leaves:
        x.grad = None
    return out


def _fwd_and_fwd_bwd(run: Callable[[], torch.Tensor], leaves: list[torch.Tensor]):
    def fwd():
        with torch.no_grad():
            run()

    def fwd_bwd():
        for x in leaves:
            x.grad = None
        out = run()
        out.backward(torch.ones_like(out))

    return fwd, fwd_bwd


def _stacked_two_map(q1, q2, k1, k2, v, lam, attention):
    """DIFF attention through one call over the stacked maps ([Q1; Q2] over [K1; K2], V shared), then O1 − λO2."""
    h = q1.shape[1]
    o = attention(torch.cat([q1, q2], 1), torch.cat([k1, k2], 1), torch.cat([v, v], 1))
    return o[:, :h] - lam * o[:, h:]


def _hf_two_calls(q, k, v_a, v_b, lam):
    """Hugging Face DiffLlama: queries and keys as 2h heads of width d, one SDPA call per half of V (QKᵀ and the
    softmax computed twice), outputs concatenated to width 2d, heads chunked into the two maps."""
    o = torch.cat(
        [
            F.scaled_dot_product_attention(q, k, v_a, is_causal=q.shape[2] > 1),
            F.scaled_dot_product_attention(q, k, v_b, is_causal=q.shape[2] > 1),
        ],
        dim=-1,
    )
    o1, o2 = o.chunk(2, dim=1)
    return o1 - lam * o2


def _official_four_calls(q1, q2, k1, k2, v, lam):
    """The official DIFF code with FlashAttention (which needs V as wide as Q): one call per map and V half."""
    causal = q1.shape[2] > 1
    v_a, v_b = v.chunk(2, dim=-1)

    def one(q, k):
        return torch.cat(
            [
                F.scaled_dot_product_attention(q, k, v_a, is_causal=causal),
                F.scaled_dot_product_attention(q, k, v_b, is_causal=causal),
            ],
            dim=-1,
        )

    return one(q1, k1) - lam * one(q2, k2)


def _flex_attention(t: int, s: int, device):
    """A compiled FlexAttention call with a bottom-right causal block mask, or None where it is unavailable."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return None
    shift = s - t
    block_mask = create_block_mask(lambda b, h, q, kv: kv <= q + shift, None, None, t, s, device=str(device))
    compiled = torch.compile(flex_attention, dynamic=False)
    return lambda q, k, v: compiled(q, k, v, block_mask=block_mask)


def _op_impls(
    n: int,
    heads: int,
    d: int,
    batch: int,
    device,
    dtype,
    backends: list[str],
    *,
    t: int | None = None,
    flex=True,
    auto_runs: dict[str, Callable[[], tuple[str, str]]] | None = None,
):
    """Implementations at one size: ``t`` queries (default n) against n keys, causal, bottom-right aligned
    (``flex=False`` leaves out FlexAttention, compiled once per size). Returns name → (run, leaves, flop kind);
    ``auto_runs``, when given, gets each ``auto`` row's name → a function saying the routes auto runs for its inputs
    (forward under no_grad, forward+backward): asked once the row has run, so that a route that failed at run time
    and handed over (CUDA: ``_run_auto``) is not the one named."""
    t = n if t is None else t
    g = torch.Generator(device="cpu").manual_seed(0)
    cuda = torch.device(device).type == "cuda"

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype).requires_grad_(True)

    q, k, v = rnd(batch, 2 * heads, t, d), rnd(batch, 2 * heads, n, d), rnd(batch, 2 * heads, n, d)
    q1, q2, k1, k2 = rnd(batch, heads, t, d), rnd(batch, heads, t, d), rnd(batch, heads, n, d), rnd(batch, heads, n, d)
    v2 = rnd(batch, heads, n, 2 * d)
    lam = torch.tensor(0.5, device=device, requires_grad=True)
    # DIFF V2 at the same d_model: 2h heads of width d, two query heads each, shared K and V, λ per head and token
    qa, qb, kv_k, kv_v = rnd(batch, 2 * heads, t, d), rnd(batch, 2 * heads, t, d), rnd(*k.shape), rnd(*v.shape)
    gate = torch.rand(batch, 2 * heads, t, generator=g).to(device=device).requires_grad_(True)
    # T = 1 sees every key (bottom-right alignment); SDPA's is_causal would align top-left, so drop it there
    causal = t > 1
    impls = {
        BASELINE: (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), [q, k, v], "baseline"),
    }
    for backend in backends:
        impls[f"diff {backend}"] = (
            lambda backend=backend: diff_attention(q1, k1, q2, k2, v2, lam, backend=backend),
            [q1, k1, q2, k2, v2, lam],
            "diff",
        )
    from ..ops import auto_backend, route_unsupported
    from ..ops._inputs import validate

    v2_inputs = validate(qa, kv_k, qb, kv_k, kv_v, gate, causal=True, attn_mask=None, scale=None)
    if auto_runs is not None and "auto" in backends:
        # per column: on CUDA the call class, and so the route, differs between the forward (timed under no_grad)
        # and forward+backward
        def routes(args):
            plain = {id(a): a.detach() for a in args}  # one tensor each: V2's shared K stays shared
            with torch.no_grad():
                fwd = validate(*(plain[id(a)] for a in args), causal=True, attn_mask=None, scale=None)
                fwd_route = auto_backend(fwd.q1.device, fwd)
            both = validate(*args, causal=True, attn_mask=None, scale=None)
            return fwd_route, auto_backend(both.q1.device, both)

        for name, args in (
            ("diff auto", (q1, k1, q2, k2, v2, lam)),
            ("diff-v2 auto", (qa, kv_k, qb, kv_k, kv_v, gate)),
        ):
            auto_runs[name] = lambda args=args: routes(args)
    for backend in backends:
        if backend != "auto" and route_unsupported(backend, v2_inputs):
            continue  # e.g. sdpa_split: V2's values are as wide as its keys, nothing to split
        impls[f"diff-v2 {backend}"] = (
            lambda backend=backend: diff_attention(qa, kv_k, qb, kv_k, kv_v, gate, backend=backend),
            [qa, kv_k, qb, kv_v, gate],
            "diff-v2",
        )
    if cuda:
        va, vb = rnd(batch, 2 * heads, n, d), rnd(batch, 2 * heads, n, d)
        impls[HF_TWO_CALLS] = (lambda: _hf_two_calls(q, k, va, vb, lam), [q, k, va, vb, lam], "diff")
        impls[OFFICIAL_FOUR_CALLS] = (
            lambda: _official_four_calls(q1, q2, k1, k2, v2, lam),
            [q1, k1, q2, k2, v2, lam],
            "diff",
        )
        flex = _flex_attention(t, n, device) if t > 1 and flex else None
        if flex is not None:
            impls["flex attention (stacked maps)"] = (
                lambda: _stacked_two_map(q1, q2, k1, k2, v2, lam, flex),
                [q1, k1, q2, k2, v2, lam],
                "diff",
            )
    return impls


def _module_impls(n: int, heads: int, d: int, batch: int, device, dtype):
    from transformers.models.diffllama.modeling_diffllama import DiffLlamaAttention, DiffLlamaRotaryEmbedding
    from transformers.models.llama.modeling_llama import LlamaAttention

    # imported here: the op level (and attention_flops) should not pay for importing the model stack
    from ..models.build import model_config
    from ..models.diff_llama import DiffAttentionOptions, DiffLlamaDifferentialAttention
    from ..models.presets import ModelPreset

    preset = ModelPreset("bench", 2 * heads * d, 1, 2 * heads, 2 * heads, 4 * heads * d, 256, max(n, 2))
    impls = {}
    torch.manual_seed(0)
    x = torch.randn(batch, n, 2 * heads * d, device=device, dtype=dtype, requires_grad=True)
    pos = torch.arange(n, device=device)[None]
    from ..models.diff_v2 import DiffV2Attention

    for name, attention in (
        ("llama attention (baseline)", "standard"),
        ("HF DiffLlamaAttention", "diff"),
        ("diffattn DIFF attention (auto)", "diff"),
        ("diffattn DIFF V2 attention (auto)", "diff-v2"),
    ):
        config = model_config(preset, attention)
        config._attn_implementation = "sdpa"
        cls = {"standard": LlamaAttention, "diff": DiffLlamaAttention, "diff-v2": DiffV2Attention}[attention]
        module = cls(config, layer_idx=0)
        if name.startswith("diffattn DIFF attention"):
            module = DiffLlamaDifferentialAttention(module, DiffAttentionOptions(backend="auto"))
        module = module.to(device=device, dtype=dtype)
        rope = DiffLlamaRotaryEmbedding(config).to(device)
        cos_sin = tuple(t.to(dtype) for t in rope(x, pos))
        impls[name] = (lambda m=module, cs=cos_sin: m(x, cs, attention_mask=None)[0], [x, *module.parameters()])
    return impls


def run_attention_benchmark(
    sizes=DEFAULT_SIZES,
    *,
    heads: int = 4,
    head_dim: int = 64,
    batch: int = 1,
    reps: int = 5,
    device: str | None = None,
    dtype: torch.dtype = torch.float32,
    levels=("op", "module"),
    backends: list[str] | None = None,
    decode: bool = True,
    progress: Callable[[str], None] | None = None,
    flex: bool = True,
    memory: bool = False,
) -> list[Row]:
    """Time every implementation at every sequence length; returns rows with ratios to the baseline.
    ``flex=False``: no FlexAttention row; ``memory=True`` (CUDA): each op row's ``fwd_bwd_peak_mib``."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if backends is None:
        backends = [s.name for s in backend_status(device) if s.usable] + ["auto"]
    rows: list[Row] = []
    for level in levels:
        for n in sizes:
            if progress:
                progress(f"{level} N={n}")
            auto_runs: dict[str, Callable[[], tuple[str, str]]] = {}
            if level == "op":
                impls = _op_impls(n, heads, head_dim, batch, device, dtype, backends, flex=flex, auto_runs=auto_runs)
            else:
                impls = {
                    name: (*v, None) for name, v in _module_impls(n, heads, head_dim, batch, device, dtype).items()
                }
            fns_f, fns_fb = {}, {}
            for name, (run, leaves, _) in impls.items():
                fns_f[name], fns_fb[name] = _fwd_and_fwd_bwd(run, leaves)
            f_ms, f_spread = _interleaved_medians(fns_f, reps)
            fb_ms, fb_spread = _interleaved_medians(fns_fb, reps)
            peak_mib: dict[str, float] = {}
            if memory and level == "op" and torch.device(device).type == "cuda":
                peak_mib = _fwd_bwd_peak_mib(
                    fns_fb, list({id(x): x for _, lv, _ in impls.values() for x in lv}.values())
                )
            dec_ms: dict[str, float] = {}
            dec_spread: dict[str, float] = {}
            if level == "op" and decode:
                dec = _op_impls(n, heads, head_dim, batch, device, dtype, backends, t=1, flex=flex)
                dec_ms, dec_spread = _interleaved_medians(
                    {name: _fwd_and_fwd_bwd(r, lv)[0] for name, (r, lv, _) in dec.items()}, reps
                )
            base = next(iter(impls))
            runs = {name: routes() for name, routes in auto_runs.items()}  # after the runs: failures known
            del impls, fns_f, fns_fb, auto_runs  # free this size's tensors before the next
            for name in f_ms:
                row = Row(level, n, name, f_ms[name], fb_ms[name], f_ms[name] / f_ms[base], fb_ms[name] / fb_ms[base])
                row.fwd_spread, row.fwd_bwd_spread = f_spread[name], fb_spread[name]
                row.decode_spread = dec_spread.get(name, float("nan"))
                row.runs_fwd, row.runs = runs.get(name, ("", ""))
                if level == "op":
                    kind = "baseline" if name == base else "diff"
                    h, dv = (2 * heads, head_dim) if kind == "baseline" else (heads, 2 * head_dim)
                    if name.startswith("diff-v2"):  # 2h pairs of query heads, V of width d
                        h, dv = 2 * heads, head_dim
                    flops = attention_flops(batch, h, n, n, head_dim, dv, causal=True, kind=kind)
                    row.fwd_tflops = flops["fwd"] / (f_ms[name] * 1e9)
                    row.fwd_bwd_tflops = flops["fwd_bwd"] / (fb_ms[name] * 1e9)
                    if name in dec_ms:
                        row.decode_ms, row.decode_ratio = dec_ms[name], dec_ms[name] / dec_ms[base]
                    row.fwd_bwd_peak_mib = peak_mib.get(name, float("nan"))
                rows.append(row)
    return rows


def format_table(rows: list[Row]) -> str:
    """Each level's rows (ms and ratio to the baseline; at op level decode and the stated FLOP rate, in GFLOP/s where
    no row reaches 1 TFLOP/s, a CPU's), then what the run's noise was: :func:`noise_lines`."""
    lines = []
    for level in dict.fromkeys(r.level for r in rows):
        level_rows = [r for r in rows if r.level == level]
        unit, scale = _flop_unit(level_rows)
        lines.append(f"\n[{level}]")
        header = f"{'N':>6}  {'implementation':<32} {'fwd ms':>9} {'x base':>7} {'fwd+bwd ms':>11} {'x base':>7}"
        if level == "op":
            header += f" {'decode ms':>10} {'x base':>7} {unit + ' fwd':>12} {'fwd+bwd':>8}"
        lines.append(header)
        for r in level_rows:
            line = (
                f"{r.seq_len:>6}  {r.impl:<32} {r.fwd_ms:>9.2f} {r.fwd_ratio:>7.2f} "
                f"{r.fwd_bwd_ms:>11.2f} {r.fwd_bwd_ratio:>7.2f}"
            )
            if level == "op":
                line += (
                    f" {r.decode_ms:>10.3f} {r.decode_ratio:>7.2f} {scale * r.fwd_tflops:>12.2f} "
                    f"{scale * r.fwd_bwd_tflops:>8.2f}"
                )
            lines.append(line)
        lines += noise_lines(level_rows)
    return "\n".join(lines)


def _flop_unit(rows: list[Row]) -> tuple[str, float]:
    """TFLOP/s, or GFLOP/s (×1000) where no row reaches 1 TFLOP/s: a CPU's rates printed as 0.02 said nothing."""
    rates = [r.fwd_tflops for r in rows if r.fwd_tflops == r.fwd_tflops] + [
        r.fwd_bwd_tflops for r in rows if r.fwd_bwd_tflops == r.fwd_bwd_tflops
    ]
    return ("TFLOP/s", 1.0) if not rates or max(rates) >= 1.0 else ("GFLOP/s", 1e3)


def noise_lines(rows: list[Row]) -> list[str]:
    """What the run's own noise was, under its table (a ratio is read against it; found when ``auto`` read 1.6×
    faster than the very route it ran, on a busy 2-core CPU). Per size where an ``auto`` row and the row of the route
    it ran were both timed: one computation timed twice, the ratio of its two medians. Then the spread of the
    repetitions, (max − min) / median: the rows' median and the largest."""
    out = []
    by_name = {(r.seq_len, r.impl): r for r in rows}
    for r in rows:
        family = r.impl.rsplit(" ", 1)[0]  # "diff auto" → "diff", "diff-v2 auto" → "diff-v2"
        parts, routes = [], []
        for what, route, mine, theirs in (("fwd", r.runs_fwd, "fwd_ms", "fwd_ms"),
                                          ("fwd+bwd", r.runs, "fwd_bwd_ms", "fwd_bwd_ms")):  # fmt: skip
            twin = by_name.get((r.seq_len, f"{family} {route}")) if route else None
            a, b = getattr(r, mine), getattr(twin, theirs) if twin is not None and twin is not r else float("nan")
            if a > 0 and b > 0:  # NaN (no such row, out of memory) fails both
                parts.append(f"{what} {a:.2f} vs {b:.2f} ms ({max(a, b) / min(a, b):.2f}x)")
                routes.append(f"{route} ({what})" if r.runs_fwd != r.runs else route)
        if parts:
            out.append(
                f"noise, N={r.seq_len}: {r.impl} ran {' and '.join(dict.fromkeys(routes))}, so one computation was "
                f"timed twice: {', '.join(parts)}; ratios nearer 1 than these are this run's noise"
            )
    for field, what in (("fwd_spread", "fwd"), ("fwd_bwd_spread", "fwd+bwd"), ("decode_spread", "decode")):
        spreads = sorted((getattr(r, field), r.impl, r.seq_len) for r in rows if getattr(r, field) == getattr(r, field))
        if spreads:
            top = spreads[-1]
            middle = statistics.median(s[0] for s in spreads)
            out.append(
                f"spread of the repetitions, (max - min) / median, {what}: {100 * middle:.0f}% for the median row, "
                f"up to {100 * top[0]:.0f}% ({top[1]}, N={top[2]})"
            )
    if not any(r.fwd_spread == r.fwd_spread for r in rows):
        out.append("spread: one repetition per row (--reps 1): this run measured nothing of its noise")
    return out


def target_lines(rows: list[Row], seq_len: int = 2048) -> list[str]:
    """The targets the op was built to, checked against the measured rows (never asserted in tests): the CPU
    targets for ``auto`` at ``seq_len``, and the fused kernel's GPU targets for ``triton`` at N = 4096."""
    out = []
    op = {r.impl: r for r in rows if r.level == "op" and r.seq_len == seq_len}
    auto, ref = op.get("diff auto"), op.get("diff reference")
    if auto is not None:
        out.append(
            f"target: auto DIFF fwd+bwd <= 1.9x baseline at N={seq_len}: {auto.fwd_bwd_ratio:.2f}x "
            f"({'met' if auto.fwd_bwd_ratio <= 1.9 else 'MISSED'})"
        )
        if ref is not None:
            speedup = ref.fwd_bwd_ms / auto.fwd_bwd_ms
            out.append(
                f"target: auto >= 1.5x faster than reference (fwd+bwd) at N={seq_len}: {speedup:.2f}x "
                f"({'met' if speedup >= 1.5 else 'MISSED'})"
            )
    gpu = {r.impl: r for r in rows if r.level == "op" and r.seq_len == 4096}
    tri = gpu.get("diff triton")
    if tri is not None:

        def check(label: str, value: float, ok: bool) -> str:
            return f"target: triton {label} at N=4096: {value:.2f}x ({'met' if ok else 'MISSED'})"

        limit = TRITON_MAX_RATIO
        fb, fw, dec = tri.fwd_bwd_ratio, tri.fwd_ratio, tri.decode_ratio
        out.append(
            check(f"fwd+bwd <= {limit['fwd_bwd_ratio']}x baseline (ideal 1.14x)", fb, fb <= limit["fwd_bwd_ratio"])
        )
        out.append(check(f"fwd <= {limit['fwd_ratio']}x baseline", fw, fw <= limit["fwd_ratio"]))
        out.append(check(f"decode <= {limit['decode_ratio']}x baseline per token", dec, dec <= limit["decode_ratio"]))
        for name, need in TRITON_MIN_SPEEDUP.items():
            other = gpu.get(name)
            if other is not None:
                speedup = other.fwd_bwd_ms / tri.fwd_bwd_ms
                out.append(check(f"fwd+bwd >= {need}x faster than {name}", speedup, speedup >= need))
    return out


def rows_as_dicts(rows: list[Row]) -> list[dict]:
    return [asdict(r) for r in rows]
