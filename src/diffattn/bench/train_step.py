"""Training-step time, side by side: DIFF Transformer (our attention, ``auto`` backend) vs the same-size Llama
baseline, with Hugging Face's own ``DiffLlama`` attention as a third column and DIFF V2 (docs/methods.md §5: twice the
query heads, a per-token gate, the FFN narrowed to the same parameter count) as a fourth.

One step = forward + backward + AdamW update on a random batch, the three models built from the same preset
and fed identical batches, timed interleaved round-robin; the statistic is the median over repetitions.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch

from ..models.build import build_model

COLUMNS = {
    "baseline": ("standard", None),
    "diffattn DIFF (auto)": ("diff", "auto"),
    "HF DiffLlama": ("diff", None),
    "diffattn DIFF V2 (auto)": ("diff-v2", "auto"),
}


@dataclass
class StepRow:
    preset: str
    seq_len: int
    batch: int
    ms: dict[str, float]

    def ratio(self, column: str) -> float:
        return self.ms[column] / self.ms["baseline"]


def _step_fn(model, batch):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)

    def step():
        opt.zero_grad(set_to_none=True)
        model(input_ids=batch, labels=batch).loss.backward()
        opt.step()

    return step


def run_train_step_benchmark(
    presets=("tiny", "small"),
    seq_lens=(512, 1024),
    batch: int = 2,
    reps: int = 5,
    device: str | None = None,
    progress=None,
) -> list[StepRow]:
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    rows = []
    for preset in presets:
        for n in seq_lens:
            if progress:
                progress(f"{preset} seq {n}")
            steps = {}
            for name, (attention, backend) in COLUMNS.items():
                model = build_model(preset, attention, backend=backend, seed=0, max_position_embeddings=max(n, 1024))
                model.to(device).train()
                ids = torch.randint(0, model.config.vocab_size, (batch, n), generator=torch.Generator().manual_seed(0))
                steps[name] = _step_fn(model, ids.to(device))
            for fn in steps.values():  # warm-up
                fn()
            times = {name: [] for name in steps}
            for _ in range(reps):
                for name, fn in steps.items():
                    if device == "cuda":
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    fn()
                    if device == "cuda":
                        torch.cuda.synchronize()
                    times[name].append(time.perf_counter() - t0)
            rows.append(StepRow(preset, n, batch, {k: 1e3 * statistics.median(v) for k, v in times.items()}))
    return rows


def format_table(rows: list[StepRow]) -> str:
    names = list(COLUMNS)
    head = f"{'preset':<7} {'seq':>5} " + " ".join(f"{n + ' ms':>22}" for n in names)
    head += "   DIFF/base   HF/base   HF/DIFF   V2/base   V2/DIFF"
    lines = [head]
    for r in rows:
        cells = " ".join(f"{r.ms[n]:>22.1f}" for n in names)
        lines.append(
            f"{r.preset:<7} {r.seq_len:>5} {cells}   {r.ratio('diffattn DIFF (auto)'):>9.2f} "
            f"{r.ratio('HF DiffLlama'):>9.2f} {r.ms['HF DiffLlama'] / r.ms['diffattn DIFF (auto)']:>9.2f} "
            f"{r.ratio('diffattn DIFF V2 (auto)'):>9.2f} "
            f"{r.ms['diffattn DIFF V2 (auto)'] / r.ms['diffattn DIFF (auto)']:>9.2f}"
        )
    return "\n".join(lines)


def rows_as_dicts(rows: list[StepRow]) -> list[dict]:
    return [asdict(r) for r in rows]
