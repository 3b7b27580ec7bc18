"""Training-step benchmark: DIFF vs baseline vs HF DiffLlama at presets tiny/small, sequence 512/1024.

Same as `diffattn bench train-step`; see diffattn/bench/train_step.py for what is timed and how.
"""

import sys

from diffattn.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "train-step", *sys.argv[1:]]))
