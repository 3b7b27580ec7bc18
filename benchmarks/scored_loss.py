"""Scored-positions loss vs the model's own, side by side: one training step (forward + backward) of the ``quick``
models on an MQAR batch as mqar-seeds trains on it (32 rows of 128 tokens, 2-32 pairs a row, about a tenth of the
positions scored), both losses on the same batch, interleaved; median over repetitions, one row per attention.

The scored-positions loss (diffattn.train.trainer.scored_positions_loss) projects onto the vocabulary only where a
label scores; training takes it for batches scoring at most half their positions. CPU numbers say what a CPU run
saves; a GPU's ratio is its own measurement.

    python benchmarks/scored_loss.py [--reps 10] [--threads 1]
"""

from __future__ import annotations

import argparse
import random

import torch

from diffattn.bench.attention import _interleaved_medians
from diffattn.data.synthetic import make_mqar_sample
from diffattn.models.build import build_model
from diffattn.train.trainer import scored_positions_loss

PAIRS = (2, 4, 8, 16, 32)  # mqar-seeds' data.mqar_pairs


def mqar_batch(rows: int = 32, seq_len: int = 128, vocab: int = 2048, seed: int = 0) -> dict:
    rng = random.Random(seed)
    samples = [
        make_mqar_sample(seed * 1000 + i, vocab_size=vocab - 300, seq_len=seq_len, num_pairs=rng.choice(PAIRS),
                         token_offset=300)
        for i in range(rows)
    ]  # fmt: skip
    ids = torch.tensor([s.input_ids for s in samples])
    labels = torch.tensor([s.labels for s in samples])
    return {"input_ids": ids, "labels": labels, "attention_mask": torch.ones_like(ids)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (mqar-seeds trains with 1 per run)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    batch = mqar_batch()
    share = float((batch["labels"][:, 1:] != -100).float().mean())
    print(f"quick preset, batch 32 × 128, {share:.3f} of positions scored, fp32, {args.threads} thread(s), "
          f"torch {torch.__version__}")  # fmt: skip
    print(f"{'attention':<10} {'own loss ms':>12} {'scored ms':>10} {'scored/own':>11}")
    for attention in ("standard", "diff", "diff-v2"):
        model = build_model("quick", attention, seed=0).train()

        def own(model=model):
            model(**batch).loss.backward()

        def scored(model=model):
            scored_positions_loss(model, batch).backward()

        ms = _interleaved_medians({"own": own, "scored": scored}, args.reps, warmup=2)
        print(f"{attention:<10} {ms['own']:>12.1f} {ms['scored']:>10.1f} {ms['scored'] / ms['own']:>11.2f}")


if __name__ == "__main__":
    main()
