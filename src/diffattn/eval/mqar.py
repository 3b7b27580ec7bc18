"""Associative recall: Zoology MQAR accuracy, and the AR-Hit vs Others loss split on real text (DIFF Table 6).

MQAR sequences come from the seeded generator :func:`diffattn.data.make_mqar_sample` (keys from the lower half of
a token range, values from the upper half, the key–value block first, every key queried once later); accuracy is
argmax-correct predictions at answer positions only. Configurations (seq, pairs): (64, 4), (128, 8), (256, 16) by
default. The token range is placed above the tokenizer's special and 256 byte tokens, as the training practice
mix does, so a model trained with that mix is evaluated on the same distribution.

AR-Hit (Arora et al. 2023, Zoology; DIFF Table 6): on real text, a token t is an *AR hit* when the bigram
(x[t−1], x[t]) already occurred earlier in the same sequence — predicting it is a recall of the earlier
occurrence; every other token is *Others*. The mean loss of each group is reported.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from ..data.packing import special_token_ids
from ..data.synthetic import make_mqar_sample
from .common import Suite, check_fits, evaluation_window, load_text, model_device, option

CONFIGS = ((64, 4), (128, 8), (256, 16))


def mqar_token_range(tokenizer) -> tuple[int, int]:
    """(token_offset, span) of MQAR tokens: above the specials and 256 byte tokens, below any later special."""
    sep_id, pad_id = special_token_ids(tokenizer)
    specials = {int(i) for i in tokenizer.all_special_ids} | {sep_id, pad_id}
    offset = len(specials) + 256
    span = min([i for i in specials if i >= offset], default=len(tokenizer)) - offset
    return offset, span


@torch.no_grad()
def mqar_accuracy(model: nn.Module, samples: list) -> float:
    device = model_device(model)
    ids = torch.tensor([s.input_ids for s in samples], device=device)
    labels = torch.tensor([s.labels for s in samples], device=device)
    pred = model(ids).logits[:, :-1].argmax(-1)
    target = labels[:, 1:]
    mask = target != -100
    return float((pred[mask] == target[mask]).float().mean())


def run_mqar(
    model: nn.Module,
    tokenizer,
    *,
    configs=CONFIGS,
    samples: int = 32,
    seed: int = 0,
    text_source: str | None = "shakespeare",
    text_tokens: int = 4096,
    seq_len: int | None = None,
    progress: bool = True,
) -> dict:
    """MQAR accuracy per (seq, pairs) configuration and, when ``text_source`` is given, the AR-Hit/Others split."""
    offset, span = mqar_token_range(tokenizer)
    rows = []
    for length, pairs in tqdm(configs, desc="MQAR", disable=not progress, leave=False):
        check_fits(model, length, f"MQAR at seq {length}")
        vocab = min(span, max(2 * pairs + 2, 8192))
        if vocab < 2 * pairs + 2:
            raise ValueError(f"the tokenizer has too few ordinary tokens ({span}) for {pairs} MQAR pairs")
        batch = [
            make_mqar_sample(
                seed * 1_000_003 + i, vocab_size=vocab, seq_len=length, num_pairs=pairs, token_offset=offset
            )
            for i in range(samples)
        ]
        rows.append({"seq_len": length, "pairs": pairs, "accuracy": mqar_accuracy(model, batch), "samples": samples})
    result = {
        "mqar": rows,
        "metadata": {
            "token_offset": offset,
            "token_span": span,
            "samples_per_config": samples,
            "scoring": "argmax accuracy at answer positions",
            "seed": seed,
        },
    }
    if text_source is not None:
        result["ar_hit"] = ar_hit_split(
            model, tokenizer, text_source, tokens=text_tokens, seq_len=evaluation_window(model, seq_len)
        )
    return result


def ar_hit_mask(ids: torch.Tensor) -> torch.Tensor:
    """Bool ``[T]``: True at t when the bigram (ids[t−1], ids[t]) occurred at some earlier t' < t."""
    seen: set[tuple[int, int]] = set()
    out = torch.zeros(ids.numel(), dtype=torch.bool)
    values = ids.tolist()
    for t in range(1, len(values)):
        bigram = (values[t - 1], values[t])
        out[t] = bigram in seen
        seen.add(bigram)
    return out


@torch.no_grad()
def ar_hit_split(model: nn.Module, tokenizer, source: str, *, tokens: int, seq_len: int) -> dict:
    """Mean next-token loss on AR-Hit tokens vs the others, over disjoint ``seq_len`` windows of ``source``."""
    text, description = load_text(source, "test")
    ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"][:tokens])
    device = model_device(model)
    sums = {"ar_hit": 0.0, "others": 0.0}
    counts = {"ar_hit": 0, "others": 0}
    for start in range(0, max(1, ids.numel() - 1), seq_len):
        chunk = ids[start : start + seq_len]
        if chunk.numel() < 2:
            break
        logits = model(chunk[None].to(device)).logits[0, :-1].float()
        loss = F.cross_entropy(logits, chunk[1:].to(device), reduction="none").cpu()
        hit = ar_hit_mask(chunk)[1:]
        for name, m in (("ar_hit", hit), ("others", ~hit)):
            sums[name] += float(loss[m].sum())
            counts[name] += int(m.sum())
    return {
        "ar_hit_loss": sums["ar_hit"] / counts["ar_hit"] if counts["ar_hit"] else None,
        "others_loss": sums["others"] / counts["others"] if counts["others"] else None,
        "ar_hit_tokens": counts["ar_hit"],
        "others_tokens": counts["others"],
        "metadata": {"text": description, "seq_len": seq_len, "tokens": int(ids.numel())},
    }


def _run_suite(model, tokenizer, o, folder, name):
    r = run_mqar(
        model,
        tokenizer,
        samples=o.mqar_samples,
        seed=o.seed,
        text_source=o.text,
        text_tokens=o.tokens,
        seq_len=o.window,
    )
    return r, {}


@dataclass
class MqarOptions:
    mqar_samples: int = option(32, "MQAR samples per (length, pairs) setting", minimum=1)


SUITE = Suite(
    "mqar",
    _run_suite,
    headline=lambda r: {f"MQAR {m['seq_len']}/{m['pairs']}": m["accuracy"] for m in r["mqar"]},
    options=MqarOptions,
)
