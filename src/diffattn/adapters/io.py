"""Saving and loading adapters: ``adapter_config.json`` + ``adapter.safetensors`` (PEFT's layout).

The safetensors file holds every parameter the method trained — its own (``dex_*``) and the base attention
weights it updates (Dex: W_K, W_V, W_O) — under the adapted model's parameter names. The JSON holds the
method, its config (with the heads that were selected), the step t of λ(t), and a fingerprint of the base
model taken when the adapter was created (architecture sizes + a hash of every tensor of the base), so loading
into another base model is refused, and (format 2) a fingerprint of the adapter itself: one hash over what decides
its computation as saved (method, config with the selected heads, step) and one over every saved tensor's name,
dtype, shape and bytes, so an ``adapter_config.json`` edited by hand or weights cast to another dtype are refused
by name instead of loading another model. Loading checks everything (method, both fingerprints, that the tensors
read completely) before the model is touched, and undoes the wrapping if the names or shapes do not fit: a bad
adapter folder leaves the model unchanged.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import warnings
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from .base import (
    FINGERPRINT_VERSION,
    adapted_model,
    base_fingerprint,
    hash_tensors,
    refuse_adapted,
    remove_adapter,
    weights_dtype,
)
from .registry import get_method, method_names

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter.safetensors"
FORMAT_VERSION = 2  # 2: adapter_fingerprint (config and weights as saved); 1 had none


PEFT_SAVE = (
    "save the diffattn adapter before wrapping (save_adapter(model, path), then get_peft_model) and PEFT's with "
    "peft_model.save_pretrained(path2), or fold the PEFT adapter in first (model = model.merge_and_unload())"
)


def _peft_layer_prefixes(model: nn.Module) -> list[str]:
    """``name.`` of every PEFT tuner layer (LoRA's wrappers of a Linear, …) inside ``model``; none without PEFT."""
    try:
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError:  # PEFT is not installed: nothing can be wrapped by it
        return []
    return [f"{n}." for n, m in model.named_modules() if isinstance(m, BaseTunerLayer)]


def adapter_fingerprint(meta: dict, tensors: dict[str, torch.Tensor]) -> dict[str, str]:
    """Two sha256 hex digests: ``config`` over the method, its options and the step of λ(t) (what decides the
    computation besides the tensors; the key order of the JSON does not matter) and ``weights`` over every tensor's
    name, dtype, shape and bytes in name order. Kept apart so a refusal names the file that changed."""
    decisive = {k: meta.get(k) for k in ("method", "config", "step")}
    config = hashlib.sha256(json.dumps(decisive, sort_keys=True).encode()).hexdigest()
    h = hashlib.sha256()
    hash_tensors(h, tensors)
    return {"config": config, "weights": h.hexdigest()}


def _check_adapter_fingerprint(path: Path, meta: dict, tensors: dict[str, torch.Tensor]) -> None:
    """Refuse a folder whose config or weights changed after save_adapter wrote them (format 2), naming the file;
    a format-1 folder has nothing to check against: a warning says so and how to get the check."""
    recorded = meta.get("adapter_fingerprint")
    if meta.get("format_version", 1) < 2:
        warnings.warn(
            f"{path} was saved by an older diffattn (adapter format 1, no adapter fingerprint): an edit of its "
            f"{CONFIG_NAME} or weights cannot be detected; save it again (load, then save_adapter) to record one",
            stacklevel=3,
        )
        return
    if not isinstance(recorded, dict):
        raise ValueError(f"{path / CONFIG_NAME} has no adapter_fingerprint (format 2 records one): it was edited")
    now = adapter_fingerprint(meta, tensors)
    if recorded.get("config") != now["config"]:
        raise ValueError(
            f"{path / CONFIG_NAME} was edited after the adapter was saved (its method, options or step no longer "
            "match the adapter fingerprint recorded with them), so it would load another model than the one trained; "
            "restore the file, or adapt a fresh model with the options you want and train it"
        )
    if recorded.get("weights") != now["weights"]:
        raise ValueError(
            f"{path / WEIGHTS_NAME} was changed after the adapter was saved (a tensor's values, dtype or shape no "
            "longer match the adapter fingerprint): restore it from the run that saved it"
        )


def save_adapter(model: nn.Module, path: str | os.PathLike) -> Path:
    model = adapted_model(model, "save_adapter")
    info = model._diffattn_adapter
    names = set(get_method(info.method).trained_names(model))
    inside_peft = sorted(n for n in names if any(n.startswith(p) for p in _peft_layer_prefixes(model)))
    if inside_peft:  # PEFT wraps weights the method trains: no load_adapter could place base_layer / lora_* tensors
        raise ValueError(
            f"save_adapter: PEFT layers wrap weights the adapter trains (first: {inside_peft[0]}); {PEFT_SAVE}"
        )
    tensors = {n: p.detach().cpu().contiguous() for n, p in model.named_parameters() if n in names}
    missing = sorted(names - set(tensors))
    if missing:  # e.g. PEFT layers wrapped around weights the method trains: their names changed
        raise ValueError(
            f"save_adapter: {len(missing)} trained parameter(s) are not where the adapter put them (first: "
            f"{missing[0]}); if PEFT wraps this model, fold it in first (model = model.merge_and_unload())"
        )
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    meta = {
        "format_version": FORMAT_VERSION,
        "method": info.method,
        "config": dataclasses.asdict(info.config),
        "step": info.state.step,
        "base_fingerprint": info.fingerprint,
        "base_fingerprint_version": FINGERPRINT_VERSION,
        "base_model_type": model.config.model_type,
        "base_dtype": info.base_dtype,
    }
    meta["adapter_fingerprint"] = adapter_fingerprint(meta, tensors)
    tmp = path / (WEIGHTS_NAME + ".tmp")
    save_file(tensors, str(tmp))
    os.replace(tmp, path / WEIGHTS_NAME)
    (path / CONFIG_NAME).write_text(json.dumps(meta, indent=2))
    return path


def _read(path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    cfg_file, weights = path / CONFIG_NAME, path / WEIGHTS_NAME
    if not cfg_file.is_file() or not weights.is_file():
        raise ValueError(f"{str(path)!r} is not an adapter folder: it needs {CONFIG_NAME} and {WEIGHTS_NAME}")
    try:
        meta = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{cfg_file} is not valid JSON ({e})") from e
    if not isinstance(meta, dict) or not isinstance(meta.get("config", {}), dict):
        raise ValueError(
            f"{cfg_file} is not an adapter config (a JSON object with 'method', 'config', 'base_fingerprint'): "
            "it was edited or is another library's file"
        )
    try:
        with safe_open(str(weights), framework="pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    except Exception as e:
        raise ValueError(f"{weights} is truncated or corrupt ({type(e).__name__}: {e})") from e
    return meta, tensors


def _refuse_newer(path, format_version, saved_options: dict, config_class) -> None:
    """A folder written by a newer diffattn (a newer format, or options this version has no field for) is refused
    in one line: guessing the unknown options' defaults would load a different model without a word."""
    if not isinstance(format_version, int) or format_version > FORMAT_VERSION:
        raise ValueError(
            f"{path} has adapter format {format_version!r}, newer than this diffattn reads ({FORMAT_VERSION}): "
            "upgrade diffattn to load it"
        )
    known = {f.name for f in dataclasses.fields(config_class)} if dataclasses.is_dataclass(config_class) else None
    unknown = sorted(set(saved_options) - known) if known is not None else []
    if unknown:
        raise ValueError(
            f"{path} records option(s) {', '.join(unknown)} that this diffattn does not know (it was saved by a "
            "newer version): upgrade diffattn to load it"
        )


def load_adapter(model: nn.Module, path: str | os.PathLike, method: str | None = None) -> nn.Module:
    """Adapt a fresh base ``model`` as the saved adapter was, and load its trained parameters (every one of
    them: a folder missing any is refused). ``method``: refuse a folder holding another method's adapter."""
    meta, tensors = _read(Path(path))
    refuse_adapted(model, "load_adapter", "load it into a fresh base model")
    saved = meta.get("method")
    if saved not in method_names("method"):
        known = ", ".join(method_names("method"))
        raise ValueError(f"unsupported adapter method {saved!r} in {path}; this version loads: {known}")
    if method is not None and saved != method:
        raise ValueError(f"{path} holds a {saved!r} adapter, not the {method!r} adapter asked for")
    recorded = meta.get("base_fingerprint_version")
    if recorded != FINGERPRINT_VERSION:  # another hash of the base: comparing it with ours would prove nothing
        raise ValueError(
            f"{path} records a base fingerprint of version {recorded!r}, not the one this diffattn checks "
            f"({FINGERPRINT_VERSION}: every tensor of the base); save the adapter with this diffattn"
        )
    fingerprint = base_fingerprint(model)
    if meta.get("base_fingerprint") != fingerprint:
        saved_dtype, dtype = meta.get("base_dtype"), weights_dtype(model)
        cast = (
            f"; it was adapted from a base in {saved_dtype} and this one is in {dtype}: if it is the same model (a "
            f"cast base hashes as another), load the adapter into it in {saved_dtype}, then cast the adapted model "
            f"(model.to(torch.{dtype}))"
            if saved_dtype and dtype and saved_dtype != dtype
            else ""
        )
        raise ValueError(
            f"the adapter in {path} was trained on a different base model "
            f"({meta.get('base_model_type')!r}, fingerprint {str(meta.get('base_fingerprint'))[:12]}…) "
            f"than this one ({model.config.model_type!r}, {fingerprint[:12]}…){cast}"
        )
    spec = get_method(saved)
    saved_options = dict(meta["config"])
    _refuse_newer(path, meta.get("format_version", 1), saved_options, spec.config)
    _check_adapter_fingerprint(Path(path), meta, tensors)
    config = spec.load_config(saved_options)  # Dex: exactly the heads that were chosen
    spec.adapt(model, config, None)
    params = dict(model.named_parameters())
    problems = [n for n, t in tensors.items() if n not in params or params[n].shape != t.shape]
    problems += sorted(set(spec.trained_names(model)) - set(tensors))
    if problems:
        remove_adapter(model)
        raise ValueError(f"{path} does not fit this model: parameter(s) {problems[:5]} missing or of another shape")
    with torch.no_grad():
        for n, t in tensors.items():
            params[n].copy_(t.to(params[n].dtype))
    model._diffattn_adapter.state.step = int(meta.get("step", 0))
    return model
