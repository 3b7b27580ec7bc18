"""Every GPU number from one command: the gpu-marked tests, the op benchmark (bf16, d = 64 and 128, N = 1K–16K), the
bf16 training step, decoding per token with a static cache and CUDA graphs, peak memory, and a 2-process FSDP2 step
when a second GPU exists, in at most ten minutes, checked against the kernel targets. `make gpu-report` runs it.

Writes gpu-report.md and gpu-report.json (device named) to --out (default benchmarks/gpu-report/); without CUDA it
prints one line and writes nothing (exit code 2). See diffattn/bench/gpu_report.py for what is measured and how.
Usage: python benchmarks/gpu_report.py [--out DIR]
"""

import sys

from diffattn.bench.gpu_report import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
