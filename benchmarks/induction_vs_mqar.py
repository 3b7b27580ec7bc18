"""How fast does a ``quick`` model learn retrieval on this stack? Two tasks, one training loop (AdamW, lr 3e-3,
warm-up then linear decay, batch 32, the scored-positions loss), accuracy on 256 fresh rows every 250 steps:

* ``copy``: 24 random tokens, 0-16 filler tokens, the same 24 again (loss and accuracy on the copy after its first
  token). The copy's offset varies per row, so a head must find each token's earlier occurrence by content: an
  induction head.
* ``mqar``: Zoology MQAR rows from the suite's own generator (64 tokens, 4, 8 or 16 pairs, keys and values from 1,740
  tokens), loss and accuracy at the answers: the same "find the earlier occurrence, copy what follows" skill, with
  every query at its own offset and no neighbouring token to confirm the match.

Written for issue 35, to tell whether MQAR's slowness (configs/mqar-pilot-*.yaml) is the pipeline's or the task's.

    python benchmarks/induction_vs_mqar.py --task copy --attention standard [--steps 3000]
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from diffattn.data.synthetic import make_mqar_sample
from diffattn.models.build import build_model
from diffattn.train.trainer import scored_positions_loss

FILLER, FIRST, END = 258, 300, 2040  # ordinary tokens of the quick preset's 2,048-token vocabulary


def copy_batch(g: torch.Generator, n: int, half: int = 24, max_gap: int = 16) -> dict:
    ids = torch.full((n, 2 * half + max_gap), FILLER)
    labels = torch.full_like(ids, -100)
    x = torch.randint(FIRST, END, (n, half), generator=g)
    gaps = torch.randint(0, max_gap + 1, (n,), generator=g)
    for i in range(n):
        start = half + int(gaps[i])
        ids[i, :half] = x[i]
        ids[i, start : start + half] = x[i]
        labels[i, start + 1 : start + half] = x[i, 1:]
    return {"input_ids": ids, "labels": labels, "attention_mask": torch.ones_like(ids)}


def mqar_batch(rng: random.Random, n: int) -> dict:
    rows = [
        make_mqar_sample(rng.randrange(2**31), vocab_size=END - FIRST, seq_len=64, num_pairs=rng.choice([4, 8, 16]),
                         token_offset=FIRST)
        for _ in range(n)
    ]  # fmt: skip
    ids = torch.tensor([r.input_ids for r in rows])
    return {"input_ids": ids, "labels": torch.tensor([r.labels for r in rows]), "attention_mask": torch.ones_like(ids)}


def accuracy(model, b: dict) -> float:
    model.eval()
    with torch.no_grad():
        pred = model(input_ids=b["input_ids"]).logits[:, :-1].argmax(-1)
    model.train()
    target = b["labels"][:, 1:]
    scored = target != -100
    return (pred[scored] == target[scored]).float().mean().item()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", choices=["copy", "mqar"], default="copy")
    ap.add_argument("--attention", default="standard", help="standard | diff | diff-v2")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    g, rng = torch.Generator().manual_seed(args.seed + 1), random.Random(args.seed + 1)
    batch = (lambda n: copy_batch(g, n)) if args.task == "copy" else (lambda n: mqar_batch(rng, n))
    model = build_model("quick", args.attention, seed=args.seed).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    warm = max(1, args.steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1, (s + 1) / warm) * max(0.0, 1 - s / args.steps))
    t0 = time.time()
    for step in range(1, args.steps + 1):
        loss = scored_positions_loss(model, batch(32))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        schedule.step()
        if step % 250 == 0:
            acc = accuracy(model, batch(256))
            print(f"{args.task} {args.attention} step {step}: loss {loss.item():.3f}, accuracy {acc:.3f} "
                  f"({time.time() - t0:.0f} s)", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
