"""Attention benchmark: DIFF attention per backend vs the same-size baseline and HF DiffLlama, side by side.

Same as `diffattn bench attention`; see diffattn/bench/attention.py for what is timed and how.
Usage: python benchmarks/attention.py [--sizes 512,1024,2048,4096] [--reps 5] [--json out.json]
"""

import sys

from diffattn.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "attention", *sys.argv[1:]]))
