"""Paired runs: the baseline Transformer and the DIFF Transformer trained on identical data in identical
order from the same seed (the paper's comparison at equal parameters), then a loss-curve picture and a
comparison table.

Layout: ``OUT/standard/`` and ``OUT/diff/`` (each a full run folder), ``OUT/pairing.json`` (the pairing, written
as the run starts: a resume reads it), ``OUT/comparison.md``, ``OUT/comparison.json``, ``OUT/loss_curves.png``.
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

from ..files import RUN_CONFIG, write_text_atomic
from ..models.architectures import ARCHITECTURES
from .config import PAIRED, PAIRING, RunConfig, recorded_pairing
from .trainer import METRICS, RunFolderError, check_model_settings, pretrain, read_metrics

logger = logging.getLogger(__name__)


def _label(attention: str) -> str:
    return ARCHITECTURES[attention].label


def _record_pairing(out: Path, pairing: str) -> None:
    path = out / PAIRING
    if path.exists() and recorded_pairing(out) is None:  # a file of the same name that is not this record: kept
        logger.warning("%s is not a paired run's record: kept, and the pairing is not recorded", path)
        return
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps({"pairing": pairing, "arms": list(PAIRED[pairing])}) + "\n")


def rate_text(tokens_per_s: float | None) -> str:
    """A summary's ``tokens_per_s`` as printed; "-" where none was recorded (a resume that trained no step)."""
    return "-" if tokens_per_s is None else f"{tokens_per_s:.0f}"


def pretrain_paired(
    config: RunConfig, out: str | Path, *, resume: bool = False, overwrite: bool = False, callbacks=None
) -> dict:
    out = Path(out)
    if (out / RUN_CONFIG).is_file():
        raise RunFolderError(
            f"{str(out)!r} holds a single run (its own {RUN_CONFIG}): a paired run writes standard/ and diff/ into "
            "a folder of its own; choose another --out"
        )
    summaries = {}
    # "all": standard, diff and diff-v2; "both" (or a config naming one architecture): standard and diff
    pairing = config.model.attention if config.model.attention in PAIRED else "both"
    arms = {}
    for attention in PAIRED[pairing]:  # every arm checked before the first trains
        arms[attention] = cfg = copy.deepcopy(config)
        cfg.model.attention = attention
        check_model_settings(cfg.validate())
    _record_pairing(out, pairing)
    for attention, cfg in arms.items():
        logger.info("paired run: %s", _label(attention))
        # an arm the interrupted run never started has nothing to resume: it starts
        arm_resume = resume and (out / attention / RUN_CONFIG).is_file()
        summaries[attention] = pretrain(
            cfg, out / attention, resume=arm_resume, overwrite=overwrite, callbacks=callbacks
        )
    write_comparison(out, summaries)
    return summaries


def write_comparison(out: Path, summaries: dict[str, dict]) -> None:
    rows = []
    for attention, s in summaries.items():
        rows.append(
            {
                "model": _label(attention),
                "parameters": s["parameters"],
                "steps": s["steps"],
                "final_val_loss": s["final_val_loss"],
                "final_val_ppl": s["final_val_ppl"],
                "tokens_per_s": s["tokens_per_s"],
            }
        )
    (out / "comparison.json").write_text(json.dumps(rows, indent=2))
    lines = [
        "| model | parameters | steps | final val loss | final val PPL | tokens/s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['parameters']:,} | {r['steps']} | {r['final_val_loss']:.4f} | "
            f"{r['final_val_ppl']:.2f} | {rate_text(r['tokens_per_s'])} |"
        )
    (out / "comparison.md").write_text("\n".join(lines) + "\n")
    plot_loss_curves({a: out / a / METRICS for a in summaries}, out / "loss_curves.png")


def plot_loss_curves(metric_files: dict[str, Path], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_lam) = plt.subplots(1, 2, figsize=(11, 4))
    for attention, f in metric_files.items():
        recs = read_metrics(f)
        train = [r for r in recs if "loss" in r]
        val = [r for r in recs if "val_loss" in r]
        (line,) = ax_loss.plot(
            [r["step"] for r in train], [r["loss"] for r in train], alpha=0.8, label=f"{_label(attention)} train"
        )
        if val:
            ax_loss.plot(
                [r["step"] for r in val],
                [r["val_loss"] for r in val],
                "o--",
                color=line.get_color(),
                label=f"{_label(attention)} val",
            )
        lam = [r for r in train if r.get("lambda")]
        if lam:
            for layer in range(len(lam[0]["lambda"])):
                ax_lam.plot([r["step"] for r in lam], [r["lambda"][layer] for r in lam], label=f"layer {layer}")
    ax_loss.set(xlabel="step", ylabel="loss", title="Loss at equal parameters")
    ax_loss.legend(fontsize=8)
    ax_lam.set(xlabel="step", ylabel="λ", title="DIFF λ per layer (Eq. 2)")
    if ax_lam.lines:
        ax_lam.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
