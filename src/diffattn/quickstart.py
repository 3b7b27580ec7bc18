"""The main job, ``diffattn quickstart``: first a check of seconds — build the ``debug`` baseline and DIFF
models, check every usable backend of the two-map op (and of the installed DIFF attention) against
``reference``, generate a few tokens with each model — then the embedded quickstart experiment
(:func:`quickstart_config_path`: pretraining, adapters, evaluation, report) through ``diffattn run``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch

from .models import build_model, describe_parameters, install_diff_attention
from .ops import backend_status, diff_attention

logger = logging.getLogger(__name__)


def quickstart_config_path():
    """The packaged ``configs/quickstart.yaml``."""
    from pathlib import Path

    return Path(__file__).parent / "configs" / "quickstart.yaml"


TOLERANCE = 1e-5  # fp32, as in the test suite


@dataclass
class Check:
    what: str
    max_error: float

    @property
    def ok(self) -> bool:
        return self.max_error <= TOLERANCE


@dataclass
class QuickstartResult:
    parameters: str
    checks: list[Check] = field(default_factory=list)
    generations: dict[str, list[int]] = field(default_factory=dict)
    skipped_backends: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


def _op_check(backend: str) -> Check:
    """Output and every gradient of one backend vs ``reference`` on a GQA, T < S, padded input."""
    g = torch.Generator().manual_seed(0)
    shapes = [(2, 4, 5, 16), (2, 2, 9, 16), (2, 4, 5, 16), (2, 2, 9, 16), (2, 2, 9, 32)]
    leaves = [torch.randn(*s, generator=g).requires_grad_(True) for s in shapes]
    lam = torch.rand(4, generator=g).requires_grad_(True)
    pad = torch.ones(2, 9, dtype=torch.bool)
    pad[1, :2] = False
    cot = torch.randn(2, 4, 5, 32, generator=g)
    results = []
    for be in ("reference", backend):
        for x in [*leaves, lam]:
            x.grad = None
        out = diff_attention(*leaves, lam, attn_mask=pad, backend=be)
        (out * cot).sum().backward()
        results.append([out.detach(), *(x.grad.clone() for x in [*leaves, lam])])
    err = max((a - b).abs().max().item() for a, b in zip(*results, strict=True))
    return Check(f"op '{backend}' vs reference (output + 6 gradients)", err)


def run_quickstart(new_tokens: int = 8, seed: int = 0) -> QuickstartResult:
    t0 = time.perf_counter()
    result = QuickstartResult(parameters=describe_parameters("debug"))
    usable = []
    for status in backend_status():
        if status.name == "reference":
            continue
        if status.usable:
            usable.append(status.name)
        else:
            result.skipped_backends[status.name] = status.reason
    usable.append("auto")

    for backend in usable:
        result.checks.append(_op_check(backend))

    baseline = build_model("debug", "standard", seed=seed).eval()
    diff = build_model("debug", "diff", backend="reference", seed=seed).eval()
    ids = torch.randint(0, baseline.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        want = diff(ids).logits
        for backend in usable:
            install_diff_attention(diff, backend)
            err = (diff(ids).logits - want).abs().max().item()
            result.checks.append(Check(f"DIFF model logits, '{backend}' vs reference", err))

        prompt = ids[:1, :6]
        kw = dict(max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
        result.generations["baseline (LlamaForCausalLM)"] = baseline.generate(prompt, **kw)[0, 6:].tolist()
        install_diff_attention(diff, "auto")
        result.generations["DIFF (DiffLlamaForCausalLM + diffattn)"] = diff.generate(prompt, **kw)[0, 6:].tolist()
    result.seconds = time.perf_counter() - t0
    return result


def format_quickstart(result: QuickstartResult) -> str:
    lines = ["diffattn quickstart — debug models, random weights", "", "parameters", "  " + result.parameters, ""]
    lines.append(f"backend checks (max abs error, fp32 tolerance {TOLERANCE:g})")
    for c in result.checks:
        lines.append(f"  [{'ok' if c.ok else 'FAIL'}] {c.what}: {c.max_error:.2e}")
    for name, reason in result.skipped_backends.items():
        lines.append(f"  [skip] {name}: {reason}")
    lines += ["", f"greedy generation ({len(next(iter(result.generations.values())))} tokens from a 6-token prompt)"]
    for name, toks in result.generations.items():
        lines.append(f"  {name}: {toks}")
    lines += ["", f"{'all checks passed' if result.ok else 'SOME CHECKS FAILED'} in {result.seconds:.1f}s"]
    return "\n".join(lines)
