"""Loading what a ``diffattn adapt`` run trained, from its folder: here, with the adapters, so that evaluation and
analysis load adapted models without importing the training code.

A run folder holds ``run.yaml`` (the run's config: ``model.name`` is the base, ``method.name`` the method or
control) and its result: ``adapter/`` (a diffattn adapter, or PEFT's folder for the LoRA control), ``merged/``
(the mergeable methods with ``--merge``) or ``final/`` (the fine-tuning controls) — which one is the method's
registry entry's ``result``.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ..files import RUN_CONFIG, read_yaml
from .io import load_adapter
from .registry import ADAPTER, FINAL, MERGED, get_method, method_names, specs


def load_adapted(run_dir: str | os.PathLike, *, merged: bool = False, dtype: torch.dtype = torch.float32):
    """Rebuild the model a ``diffattn adapt`` run trained: ``(model, tokenizer)``, in eval mode.

    ``merged=False`` (default): the base model with ``adapter/`` loaded, as trained (diffattn methods:
    :func:`diffattn.load_adapter`, which refuses another base; LoRA: PEFT); ``final/`` for the fine-tuning controls.
    ``merged=True``: the plain model in ``merged/`` (``--merge``, the mergeable methods: zero-overhead inference,
    equal to the unmerged one to float rounding); refused when the run has none.
    """
    from ..models.pretrained import load_pretrained  # transformers: imported when a model is loaded, so the
    # adapter registry (`diffattn adapt --help`, `diffattn info`) loads without it

    run_dir = Path(run_dir)
    if not (run_dir / RUN_CONFIG).is_file():
        raise ValueError(f"{str(run_dir)!r} is not a diffattn adapt run folder (no {RUN_CONFIG})")
    run = read_yaml(run_dir / RUN_CONFIG, "run config") or {}
    if merged:
        if not (run_dir / MERGED).is_dir():
            mergeable = ", ".join(s.name for s in specs() if s.mergeable)
            raise ValueError(
                f"run {str(run_dir)!r} has no {MERGED}/ (only {mergeable} runs with --merge write one); "
                "load it with merged=False"
            )
        return load_pretrained(run_dir / MERGED, dtype=dtype)
    if (run_dir / FINAL).is_dir():
        return load_pretrained(run_dir / FINAL, dtype=dtype)
    if not (run_dir / ADAPTER).is_dir():
        raise ValueError(f"run {str(run_dir)!r} has no {ADAPTER}/ or {FINAL}/: did it finish?")
    base = (run.get("model") or {}).get("name")
    method = (run.get("method") or {}).get("name")
    if not base or method not in method_names():
        raise ValueError(
            f"{run_dir / RUN_CONFIG} names no base model (model.name) or an unknown method ({method!r}); this "
            f"version loads: {', '.join(method_names())}"
        )
    model, tokenizer = load_pretrained(base, dtype=dtype)
    if get_method(method).kind == "control":  # the LoRA control: PEFT's own folder
        from peft import PeftModel

        from .controls import peft_wrapping

        with peft_wrapping():
            return PeftModel.from_pretrained(model, run_dir / ADAPTER).eval(), tokenizer
    return load_adapter(model, run_dir / ADAPTER).eval(), tokenizer
