"""The route sweep times each route on inputs laid out as the models hand them to the op (diffattn.bench.route_sweep
``make_problem``): which tensors are views of which, in which memory order, and in which order the output's gradient
comes back — a route's copies depend on all three, so a sweep on other layouts would rank routes by costs no model
pays. Checked against the DIFF V1 and DIFF V2 models themselves (the ``debug`` preset) in training (no KV cache, as
the library's Trainer and the train-step benchmark run), a no-grad prefill through the KV cache, and decoding."""

from __future__ import annotations

import pytest
import torch

import diffattn.models.diff_llama as diff_llama
import diffattn.models.diff_v2 as diff_v2
import diffattn.ops
from diffattn.bench import route_sweep as rs
from diffattn.bench import train_step
from diffattn.models.build import build_model
from diffattn.ops import interleaved_pair

ARCHITECTURE = {"v1": "diff", "shared_k": "diff-v2", "v1_pairs": "diff"}


def _order(t: torch.Tensor) -> tuple[int, ...]:
    """The dimensions of size > 1, outermost in memory first (a layout, whatever the sizes)."""
    dims = [i for i in range(t.dim()) if t.shape[i] > 1]
    return tuple(sorted(dims, key=lambda i: -t.stride(i)))


def _relation(a: torch.Tensor, b: torch.Tensor) -> str:
    """How a second tensor sits beside a first of the same shape: the same tensor, the next chunk of heads of one
    tensor, the odd heads beside the even ones (interleaved), or apart."""
    if a is b:
        return "same"
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return "apart"
    offset = b.storage_offset() - a.storage_offset()
    if offset == a.shape[1] * a.stride(1):
        return "chunk"
    if 2 * offset == a.stride(1):
        return "interleaved"
    return f"offset {offset}"


CUTS = {"SplitBackward0", "SplitWithSizesBackward0", "SliceBackward0", "UnbindBackward0", "SelectBackward0"}


def _made_by(t: torch.Tensor) -> str | None:
    """How a tensor was cut from another (a chunk's SplitBackward0, a strided slice's SliceBackward0 …), which is what
    the backward pays to join the gradients of the pieces (one cat; a zero-filled tensor per slice); "whole" for a
    tensor not cut from one (in a model RoPE's output, in the sweep a projection's view); None without gradient."""
    if not t.requires_grad:
        return None
    name = type(t.grad_fn).__name__ if t.grad_fn is not None else "a leaf"
    return name if name in CUTS else "whole"


def signature(kw: dict) -> dict:
    v = kw["v"]
    parts = v if isinstance(v, tuple) else (v,)
    return {
        "made by": [_made_by(kw[n]) for n in ("q1", "q2", "k1", "k2", "lam")] + [_made_by(x) for x in parts],
        "q1": _order(kw["q1"]),
        "q2": _relation(kw["q1"], kw["q2"]),
        "k1": _order(kw["k1"]),
        "k2": _relation(kw["k1"], kw["k2"]),
        "v": [_order(x) for x in parts],
        "v halves": _relation(*parts) if len(parts) == 2 else None,
        "q, k": _relation(kw["q1"], kw["k1"]),
        "lam": _order(kw["lam"]) if kw["lam"].dim() else (),
    }


def _pairs_as_maps(q, k, v, lam, **kw) -> dict:
    q1, q2 = interleaved_pair(q, 1)
    return {"q1": q1, "k1": k, "q2": q2, "k2": k, "v": v, "lam": lam}


def _both_in_pairs_as_maps(q, k, v, lam, **kw) -> dict:
    (q1, q2), (k1, k2) = interleaved_pair(q, 1), interleaved_pair(k, 1)
    return {"q1": q1, "k1": k1, "q2": q2, "k2": k2, "v": v, "lam": lam}


def _stacked_as_maps(q, k, v, lam, **kw) -> dict:
    (q1, q2), (k1, k2) = q.chunk(2, dim=1), k.chunk(2, dim=1)
    return {"q1": q1, "k1": k1, "q2": q2, "k2": k2, "v": v.chunk(2, dim=1), "lam": lam}


#: the op each layer calls on its Q and K whole, and the maps the op cuts from them
OPS = {"v1": ("diff_attention_stacked", diff_llama, _stacked_as_maps),
       "shared_k": ("diff_attention_pairs", diff_v2, _pairs_as_maps),
       "v1_pairs": ("diff_attention_pairs", diff_llama, _both_in_pairs_as_maps)}  # fmt: skip


def _captured(monkeypatch, pair: str, mode: str) -> tuple[dict, tuple[int, ...] | None]:
    """The op's inputs in one layer of the model and the layout of the gradient its output got back."""
    seen, grads = [], []

    def spy(real, as_maps):
        def call(*args, **kw):
            out = real(*args, **kw)
            seen.append(signature(as_maps(*args, **kw)))
            if out.requires_grad:
                out.register_hook(lambda g: grads.append(_order(g)))
            return out

        return call

    # each layer hands its Q and K whole (DIFF: both maps' heads stacked; DIFF V2: the pairs interleaved): the
    # signature is of what the op cuts from them
    name, module, as_maps = OPS[pair]
    monkeypatch.setattr(module, name, spy(getattr(module, name), as_maps))
    # 4 heads of width 16 (2 DIFF heads; 4 DIFF V2 pairs), no GQA: the sweep's head counts at ``heads=2``
    model = build_model("debug", attention=ARCHITECTURE[pair], backend="sdpa", num_layers=1, num_kv_heads=4, seed=0)
    ids = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(0))
    if pair == "v1_pairs" and mode == "train":  # DIFF V1's layer with its heads in pairs (a route-table switch)
        with diffattn.ops.pairs_layout(True):
            train_step._step_fn(model.train(), ids)()
    elif pair == "v1_pairs":  # and its forward alone, as an evaluation without a KV cache runs it (its only one)
        with diffattn.ops.pairs_layout(True), torch.no_grad():
            model.eval()(ids, use_cache=False)
    elif mode == "train":
        # the train-step benchmark's own step: the kwargs the model is called with there
        train_step._step_fn(model.train(), ids)()
    elif mode == "infer":
        with torch.no_grad():
            model.eval()(ids)
    else:
        with torch.no_grad():
            model.eval().generate(ids, max_new_tokens=2, do_sample=False)
    return seen[-1], grads[0] if grads else None


@pytest.mark.parametrize(
    ("pair", "mode"),
    [(pair, mode) for pair in ("v1", "shared_k") for mode in ("train", "infer", "decode")]
    + [("v1_pairs", "train"), ("v1_pairs", "infer")],
)
def test_the_sweeps_inputs_are_laid_out_as_the_models_hand_them_over(monkeypatch, pair, mode):
    model_inputs, model_grad = _captured(monkeypatch, pair, mode)
    d = 16
    cls = rs.CallClass(pair, d, dtype="fp32", mode=mode)
    t = 1 if mode == "decode" else 16
    p = rs.make_problem(cls, batch=2, heads=2, t=t, s=16, device="cpu", dtype=torch.float32, seed=0)
    assert signature(p.diff) == model_inputs
    if mode == "train":  # the output's gradient: the sweep's cotangent in the model's order
        out = rs.route_fn("sdpa", {})(p)
        assert _order(rs.model_cotangent(out.shape, out.device, out.dtype)) == model_grad
        # and the baseline's inputs as a Llama layer's without a cache (projections, transposed)
        assert all(_order(x) == model_inputs["q1"] for x in p.base)
    # and the sweep calls the op as the layer does: on Q and K whole
    import diffattn.ops

    calls = []
    monkeypatch.setattr(diffattn.ops, OPS[pair][0], lambda q, k, *args, **kw: calls.append((q, k)))
    rs.route_fn("sdpa", {})(p)
    assert len(calls) == 1 and calls[0][0] is p.heads[0] and calls[0][1] is p.heads[1]


def test_gradients_reach_the_models_projections_through_the_views():
    # the leaves are the projections' outputs: every gradient of the op arrives there, through the model's own views
    cls = rs.CallClass.from_key("v1 d64 dv128 fp32 causal none train")
    p = rs.make_problem(cls, **rs.shape_of(cls, "tiny"), device="cpu", dtype=torch.float32, seed=0)
    q, _, v, _ = p.leaves
    assert q.shape == (1, 64, 4 * 64) and v.shape == (1, 64, 4 * 64)  # [B, T, 2h·d]: V's 2h halves of heads d wide
    out = rs.route_fn("reference", {})(p)
    grads = torch.autograd.grad(out, p.leaves, rs.model_cotangent(out.shape, out.device, out.dtype))
    assert all(g.shape == x.shape and g.abs().sum() > 0 for g, x in zip(grads, p.leaves, strict=True))
