"""Training-step benchmark: DIFF vs baseline vs HF DiffLlama vs DIFF V2 at presets tiny/small, sequence 512/1024.

The options of `diffattn bench train-step`, and `--dtype` (bf16 / fp16: mixed precision as training runs on a GPU,
the default there; fp32, the default on CPU); see diffattn/bench/train_step.py for what is timed and how.
"""

import sys

from diffattn.bench.train_step import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
