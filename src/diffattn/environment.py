"""What a result was computed on: the software and the processor, recorded with every training run (its
``summary.json``) and every experiment report (``results.json``'s ``environment``): the one home of that record.

The processor belongs in it because float rounding does: PyTorch picks its CPU kernels by the instruction set it finds
(``torch.backends.cpu.get_cpu_capability()``: AVX2, AVX512, …; oneDNN likewise), so the same seed, data and code can
train different models on two machines. On one AMD EPYC (family 25, model 17), 2026-12-02, the quickstart's
Transformer ended its 800 steps at validation loss 5.12738 with torch's AVX-512 kernels and at 5.0397005 with its AVX2
kernels (``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2``), the committed export's value to the last digit; its
data are identical across processes and across Python 3.11.2 and 3.11.7, and 1 or 2 torch threads give the same 800
steps bit for bit.
"""

from __future__ import annotations

import platform
import sys
from importlib import metadata
from pathlib import Path


def package_version(name: str) -> str:
    """An installed package's version without importing it where it is not imported yet (transformers takes 3 s to
    import, and ``diffattn info`` needs no more of it than this string); "not installed" where it is not."""
    module = sys.modules.get(name)
    if module is not None and getattr(module, "__version__", None):
        return module.__version__
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def processor() -> str:
    """The CPU's model name with its family and model numbers where Linux gives them ("AMD EPYC" alone names several
    generations, with and without AVX-512), else what :func:`platform.processor` says."""
    try:
        fields: dict[str, str] = {}
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("model name", "cpu family", "model") and key not in fields:
                fields[key] = value.strip()
            if not line.strip() and fields:  # the first processor's block is enough
                break
        if fields.get("model name"):
            numbers = [f"{k} {fields[k]}" for k in ("cpu family", "model") if k in fields]
            return fields["model name"] + (f" ({', '.join(numbers)})" if numbers else "")
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def environment() -> dict:
    """The software versions, the device, the torch threads, the CPU and the instruction set torch's CPU kernels use
    (and the GPU's name on CUDA)."""
    import torch

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": package_version("transformers"),
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "threads": torch.get_num_threads(),
        "cpu": processor(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
    return env


#: the keys two runs must share for the same seed to be sure of the same model (threads: a reduction's order may
#: depend on them, though the quickstart's 800 steps did not)
REPRODUCING = ("torch", "transformers", "device", "threads", "cpu", "cpu_capability", "gpu")
