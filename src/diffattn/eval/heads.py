"""Head analysis: redundancy and shape of attention heads, per layer (Dex §2, App. B; docs/evaluation.md §11).

For every layer, over held-out text windows:

* mean pairwise **cosine distance** between heads' attention maps (each map flattened over its causal entries);
* mean pairwise **linear CKA** (Kornblith et al. 2019) between heads' outputs O_h = A_h V_h ([T, dv], centred);
* mean attention **entropy** per row (signed maps: |a| renormalised to sum 1, as docs/evaluation.md §11 says);
* **sparsity ratio**: the share of kept entries with |a| < ε, for ε = 1e-3 and 1e-2;
* share of **negative** attention entries and their mean magnitude (signed maps only; 0 for softmax maps);
* λ per layer (mean over heads) for models that have one.

Maps are the *signed* maps for two-map models (A1 − λA2) and Dex's effective attention (see :mod:`.capture`).
The per-layer head-distance matrices are kept for the heatmap picture.

The λ = 0 reference (``lambda0_reference``: ``layers`` and ``summary`` as above, for a model whose method has an
effective attention, Dex): its effective attention X = A·V·(I − λW_Dᵀ)·V⁺ is A·V·V⁺ at λ = 0, a dense, partly
negative projection of A, so its maps' distances, entropy, sparsity and negative share differ from the base's
softmax maps before λ moves (a ``debug`` model and Dex on all its heads at step 0, whose logits are the base's, over
256 Shakespeare tokens in 128-token windows: cosine distance 0.134 against 0.000, layer 0's negative share 0.135
against 0), where CKA between head outputs does not (X·V = A·V at λ = 0; 0.95 both there). The same statistics of
the effective attention with λ forced to 0, in the same forward passes, are what Dex's λ is read against
(:mod:`diffattn.eval.allocation` does the same for the attention shares; found by a helper's audit, 2026-12-01).
"""

from __future__ import annotations

import torch
from torch import nn
from tqdm.auto import tqdm

from .capture import AttentionCapture
from .common import Suite, figure, fmt, model_device, save_figure, window_preflight
from .measures import ONE_NUMBER, Comparison, Measure, Run, finite
from .outliers import _windows

EPSILONS = (1e-6, 1e-4, 1e-3, 1e-2)  # Dex Fig. 2: 1e-6 and 1e-4; ours: 1e-3 and 1e-2


def linear_cka(x: torch.Tensor, y: torch.Tensor) -> float:
    """Linear CKA of two representations ``[n, d1]``, ``[n, d2]`` of the same n items: 1 for x with itself."""
    x = x.double() - x.double().mean(0)
    y = y.double() - y.double().mean(0)
    num = (y.T @ x).pow(2).sum()
    den = (x.T @ x).pow(2).sum().sqrt() * (y.T @ y).pow(2).sum().sqrt()
    return float(num / den) if den > 0 else 0.0


def cosine_distance_matrix(maps: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``[H, H]`` cosine distances between heads' maps ``[H, T, S]`` over the kept entries ``[T, S]``."""
    flat = maps[:, keep].double()  # [H, kept]
    flat = flat / flat.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return (1 - flat @ flat.T).float()


def _entropy(maps: torch.Tensor, keep: torch.Tensor) -> float:
    a = maps.abs().masked_fill(~keep, 0)
    p = a / a.sum(-1, keepdim=True).clamp_min(1e-30)
    ent = -(p * torch.log(p.clamp_min(1e-30))).sum(-1)  # [H, T]
    return float(ent.mean())


@torch.no_grad()
def run_heads(
    model: nn.Module,
    tokenizer,
    *,
    source: str = "shakespeare",
    tokens: int = 1024,
    seq_len: int | None = None,
    progress: bool = True,
) -> dict:
    """Per-layer head statistics (see the module doc), averaged over the text windows."""
    windows, meta = _windows(model, tokenizer, source, tokens, seq_len)
    device = model_device(model)
    acc: dict[int, dict] = {}
    at_lambda0: dict[int, dict] = {}  # the same statistics of the effective attention at λ = 0 (module doc)
    # layers whose maps are the same at λ = 0 (no reference, or the maps themselves: a Dex layer without selected
    # heads): their statistics are read from ``acc``, not computed twice (CKA over every head pair is the cost)
    unreferenced: set[int] = set()
    for chunk in tqdm(windows, desc="head analysis", disable=not progress, leave=False):
        with AttentionCapture(model, reference=True) as cap:
            model(chunk[None].to(device))
        records = cap.last()
        for layer, rec in records.items():
            _accumulate(acc, layer, rec, rec.signed)
        if any(rec.reference is not None for rec in records.values()):
            for layer, rec in records.items():
                if rec.reference is None or rec.reference is rec.signed:
                    unreferenced.add(layer)
                else:
                    _accumulate(at_lambda0, layer, rec, rec.reference, lam=False)
    if at_lambda0:  # which layers have a reference is the model's structure: the same in every window
        at_lambda0 |= {layer: acc[layer] for layer in unreferenced}
    result = {
        **_averaged(acc),
        "metadata": {
            **meta,
            "maps": "signed maps (A1 − λA2) for two-map models, Dex effective attention, softmax maps otherwise",
            "entropy": "of |a| renormalised per row, nats",
            "cka": "linear CKA between head outputs A_h V_h, mean over head pairs",
        },
    }
    if at_lambda0:
        result["lambda0_reference"] = _averaged(at_lambda0)
        result["metadata"]["lambda0_reference"] = (
            "the same statistics of the effective attention with λ forced to 0 (Dex: A·V·V⁺, the projection alone), "
            "in the same forward passes"
        )
    return result


def _accumulate(acc: dict[int, dict], layer: int, rec, signed: torch.Tensor, lam: bool = True) -> None:
    """Add one window's statistics of ``layer``'s maps ``signed`` ``[1, H, T, S]`` (its record ``rec``: mask, V, and
    λ where ``lam``; the λ = 0 reference records none) to ``acc``."""
    keep = rec.keep.expand_as(signed)[0, 0]  # [T, S]
    maps = signed[0]  # [H, T, S]
    h = maps.shape[0]
    dist = cosine_distance_matrix(maps, keep)
    off = ~torch.eye(h, dtype=torch.bool)
    stats = acc.setdefault(
        layer,
        {
            "n": 0,
            "dist": torch.zeros(h, h),
            "cka": 0.0,
            "cos": 0.0,
            "entropy": 0.0,
            "neg_share": 0.0,
            "neg_mag": 0.0,
            "lam": None,
            **{f"sparsity@{e:g}": 0.0 for e in EPSILONS},
        },
    )
    stats["n"] += 1
    stats["dist"] += dist
    stats["cos"] += float(dist[off].mean()) if h > 1 else 0.0
    stats["entropy"] += _entropy(maps, keep)
    kept = maps[:, keep]
    for e in EPSILONS:
        stats[f"sparsity@{e:g}"] += float((kept.abs() < e).float().mean())
    neg = kept < 0
    stats["neg_share"] += float(neg.float().mean())
    stats["neg_mag"] += float(kept[neg].abs().mean()) if neg.any() else 0.0
    if lam and rec.lam is not None:
        stats["lam"] = float(rec.lam.mean())
    v = rec.v
    if v is not None and h > 1:  # O_h = A_h V_h, [T, dv] per head
        rep = h // v.shape[1]
        outs = maps @ (v[0] if rep == 1 else v[0].repeat_interleave(rep, dim=0))
        pairs = [(i, j) for i in range(h) for j in range(i + 1, h)]
        stats["cka"] += sum(linear_cka(outs[i], outs[j]) for i, j in pairs) / len(pairs)


def _averaged(acc: dict[int, dict]) -> dict:
    """``layers`` (each layer's statistics averaged over the windows) and ``summary`` (their mean over layers)."""
    layers = {}
    for layer, s in sorted(acc.items()):
        n = s["n"]
        layers[layer] = {
            "cosine_distance": s["cos"] / n,
            "cka": s["cka"] / n,
            "entropy": s["entropy"] / n,
            **{f"sparsity@{e:g}": s[f"sparsity@{e:g}"] / n for e in EPSILONS},
            "negative_share": s["neg_share"] / n,
            "negative_magnitude": s["neg_mag"] / n,
            "lambda": s["lam"],
            "distance_matrix": (s["dist"] / n).tolist(),
        }
    summary = {k: sum(v[k] for v in layers.values()) / len(layers) for k in ("cosine_distance", "cka", "entropy")}
    return {"layers": layers, "summary": summary}


def plot_heads(results: dict, path, layers: list[int] | None = None) -> object:
    """Heatmaps of the head-to-head cosine distance of a few layers (first, middle, last by default)."""
    plt = figure()
    all_layers = sorted(int(k) for k in results["layers"])
    layers = layers or sorted({all_layers[0], all_layers[len(all_layers) // 2], all_layers[-1]})
    fig, axes = plt.subplots(1, len(layers), figsize=(3.2 * len(layers), 3))
    axes = [axes] if len(layers) == 1 else list(axes)
    for ax, layer in zip(axes, layers, strict=True):
        entry = results["layers"].get(layer, results["layers"].get(str(layer)))
        im = ax.imshow(entry["distance_matrix"], vmin=0, vmax=max(1e-6, max(map(max, entry["distance_matrix"]))))
        ax.set_title(f"layer {layer}: mean {entry['cosine_distance']:.2f}", fontsize=9)
        ax.set_xlabel("head")
        ax.set_ylabel("head")
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.suptitle("cosine distance between heads' attention maps", fontsize=10)
    return save_figure(fig, path)


def _run_suite(model, tokenizer, o, folder, name):
    r = run_heads(model, tokenizer, source=o.text, tokens=min(o.tokens, 1024), seq_len=o.window)
    return r, {"heads": plot_heads(r, folder / "head_distance.png").name}


def _compare(heads: dict[str, dict], out) -> list[str]:
    lines = ["| model | head cosine distance | head CKA | entropy |", "|---|---|---|---|"]
    for n, r in heads.items():
        rows = [(n, r)] + ([(f"{n} at λ = 0", r["lambda0_reference"])] if "lambda0_reference" in r else [])
        lines += [
            "| " + " | ".join([name, *(fmt(x["summary"][k]) for k in ("cosine_distance", "cka", "entropy"))]) + " |"
            for name, x in rows
        ]
    return [*lines, ""]


# -- what claims read (diffattn.experiments.claims) ----------------------------------------------------------------
def _compare_summary(ref: Run, new: Run, seed: int, key: str) -> Comparison | None:
    """A head statistic (e.g. linear CKA between head outputs, Dex Fig. 11b): one number per model (an average
    over layers and text windows), so one run has no interval."""
    vr, vn = ref.results("heads", "summary", key), new.results("heads", "summary", key)
    if not finite(vr) or not finite(vn):
        return None
    # the paper says "in most layers" (Dex Fig. 11b): the layers' directions beside the mean, which the row reads
    lr, ln = ref.results("heads", "layers") or {}, new.results("heads", "layers") or {}
    shared = [layer for layer in lr if finite((lr[layer] or {}).get(key)) and finite((ln.get(layer) or {}).get(key))]
    lower = sum(ln[layer][key] < lr[layer][key] for layer in shared)
    return Comparison(
        f"head {key} (mean over layers)", ref_value=vr, new_value=vn,
        kind=ONE_NUMBER + " (mean over layers and windows)",
        note=f"{new.name} lower in {lower} of {len(shared)} layers" if shared else "",
    )  # fmt: skip


def _at_lambda0(run: Run) -> dict | None:
    """The model's own head statistics with λ forced to 0, as a model's results (the module doc)."""
    own = run.results("heads", "lambda0_reference")
    return None if own is None else {"heads": {**own, "metadata": run.results("heads", "metadata")}}


MEASURES = {
    f"heads:{key}": Measure(
        f"head {key} (mean over layers)", 3, per_run=lambda run, key=key: run.results("heads", "summary", key),
        compare=lambda ref, new, seed, key=key: _compare_summary(ref, new, seed, key),
        at_lambda0=_at_lambda0,
    )
    for key in ("cka", "cosine_distance")
}  # fmt: skip

SUITE = Suite(
    "heads",
    _run_suite,
    headline=lambda r: {"head cos dist": r["summary"]["cosine_distance"], "head CKA": r["summary"]["cka"]},
    compare=_compare,
    measures=MEASURES,
    preflight=window_preflight,
)
