"""Attention speed, side by side: DIFF attention (every usable backend) vs a same-size baseline.

Two tables, each printed as milliseconds and as a ratio to the baseline, measured in one run on the same
inputs with the implementations interleaved round-robin (so drift in machine load hits all of them alike):

* **op** — the attention core only. Baseline: ``scaled_dot_product_attention`` with 2h heads of width d,
  causal. DIFF: :func:`diffattn.ops.diff_attention` with h heads (Q1, Q2, K1, K2 of width d, V of width 2d)
  per backend. Same d_model, same FLOP budget of a parameter-matched model.
* **module** — a whole attention layer (projections, RoPE, norm): transformers' ``LlamaAttention``
  (baseline), transformers' own ``DiffLlamaAttention``, and ours installed with the ``auto`` backend.

Forward is timed under ``no_grad``; forward+backward back-propagates a random cotangent into every input
(op) or every parameter and the input (module). The statistic is the median over repetitions.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from ..models.build import model_config
from ..models.diff_llama import DiffAttentionOptions, DiffLlamaDifferentialAttention
from ..models.presets import ModelPreset
from ..ops import backend_status, diff_attention

DEFAULT_SIZES = (512, 1024, 2048, 4096)


@dataclass
class Row:
    level: str
    seq_len: int
    impl: str
    fwd_ms: float
    fwd_bwd_ms: float
    fwd_ratio: float = float("nan")
    fwd_bwd_ratio: float = float("nan")


def _interleaved_medians(fns: dict[str, Callable[[], None]], reps: int, warmup: int = 1) -> dict[str, float]:
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - t0)
    return {name: 1e3 * statistics.median(ts) for name, ts in times.items()}


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


def _op_impls(n: int, heads: int, d: int, batch: int, device, dtype, backends: list[str]):
    g = torch.Generator(device="cpu").manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype).requires_grad_(True)

    q, k, v = rnd(batch, 2 * heads, n, d), rnd(batch, 2 * heads, n, d), rnd(batch, 2 * heads, n, d)
    q1, q2, k1, k2 = (rnd(batch, heads, n, d) for _ in range(4))
    v2 = rnd(batch, heads, n, 2 * d)
    lam = torch.tensor(0.5, device=device, requires_grad=True)
    impls = {
        "baseline sdpa (2h heads, d)": (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), [q, k, v])
    }
    for backend in backends:
        impls[f"diff {backend}"] = (
            lambda backend=backend: diff_attention(q1, k1, q2, k2, v2, lam, backend=backend),
            [q1, k1, q2, k2, v2, lam],
        )
    return impls


def _module_impls(n: int, heads: int, d: int, batch: int, device, dtype):
    from transformers.models.diffllama.modeling_diffllama import DiffLlamaAttention, DiffLlamaRotaryEmbedding
    from transformers.models.llama.modeling_llama import LlamaAttention

    preset = ModelPreset("bench", 2 * heads * d, 1, 2 * heads, 2 * heads, 4 * heads * d, 256, max(n, 2))
    impls = {}
    torch.manual_seed(0)
    x = torch.randn(batch, n, 2 * heads * d, device=device, dtype=dtype, requires_grad=True)
    pos = torch.arange(n, device=device)[None]
    for name, attention in (
        ("llama attention (baseline)", "standard"),
        ("HF DiffLlamaAttention", "diff"),
        ("diffattn DIFF attention (auto)", "diff"),
    ):
        config = model_config(preset, attention)
        config._attn_implementation = "sdpa"
        module = (LlamaAttention if attention == "standard" else DiffLlamaAttention)(config, layer_idx=0)
        if name.startswith("diffattn"):
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
    progress: Callable[[str], None] | None = None,
) -> list[Row]:
    """Time every implementation at every sequence length; returns rows with ratios to the baseline."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if backends is None:
        backends = [s.name for s in backend_status(device) if s.usable] + ["auto"]
    rows: list[Row] = []
    for level in levels:
        for n in sizes:
            if progress:
                progress(f"{level} N={n}")
            if level == "op":
                impls = _op_impls(n, heads, head_dim, batch, device, dtype, backends)
            else:
                impls = _module_impls(n, heads, head_dim, batch, device, dtype)
            fns_f, fns_fb = {}, {}
            for name, (run, leaves) in impls.items():
                fns_f[name], fns_fb[name] = _fwd_and_fwd_bwd(run, leaves)
            f_ms = _interleaved_medians(fns_f, reps)
            fb_ms = _interleaved_medians(fns_fb, reps)
            base = next(iter(impls))
            for name in impls:
                rows.append(
                    Row(level, n, name, f_ms[name], fb_ms[name], f_ms[name] / f_ms[base], fb_ms[name] / fb_ms[base])
                )
    return rows


def format_table(rows: list[Row]) -> str:
    lines = []
    for level in dict.fromkeys(r.level for r in rows):
        lines.append(f"\n[{level}]")
        lines.append(f"{'N':>6}  {'implementation':<32} {'fwd ms':>9} {'x base':>7} {'fwd+bwd ms':>11} {'x base':>7}")
        for r in (r for r in rows if r.level == level):
            lines.append(
                f"{r.seq_len:>6}  {r.impl:<32} {r.fwd_ms:>9.2f} {r.fwd_ratio:>7.2f} "
                f"{r.fwd_bwd_ms:>11.2f} {r.fwd_bwd_ratio:>7.2f}"
            )
    return "\n".join(lines)


def target_lines(rows: list[Row], seq_len: int = 2048) -> list[str]:
    """The foundation issue's CPU targets, checked against the measured rows (never asserted in tests)."""
    op = {r.impl: r for r in rows if r.level == "op" and r.seq_len == seq_len}
    auto, ref = op.get("diff auto"), op.get("diff reference")
    if auto is None:
        return []
    out = [
        f"target: auto DIFF fwd+bwd <= 1.9x baseline at N={seq_len}: {auto.fwd_bwd_ratio:.2f}x "
        f"({'met' if auto.fwd_bwd_ratio <= 1.9 else 'MISSED'})"
    ]
    if ref is not None:
        speedup = ref.fwd_bwd_ms / auto.fwd_bwd_ms
        out.append(
            f"target: auto >= 1.5x faster than reference (fwd+bwd) at N={seq_len}: {speedup:.2f}x "
            f"({'met' if speedup >= 1.5 else 'MISSED'})"
        )
    return out


def rows_as_dicts(rows: list[Row]) -> list[dict]:
    return [asdict(r) for r in rows]
