"""Training-step benchmark: DIFF vs baseline vs HF DiffLlama vs DIFF V2 at presets tiny/small, sequence 512/1024.

The options of `diffattn bench train-step`, and `--dtype` (bf16 / fp16: mixed precision as training runs on a GPU,
the default there; fp32, the default on CPU); see diffattn/bench/train_step.py for what is timed and how.
"""

import sys

from diffattn.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "train-step", *sys.argv[1:]]))  # one home for the options: the command line's parser
