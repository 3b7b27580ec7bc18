"""The lm-evaluation-harness bridge (docs/evaluation.md §12).

:func:`evaluate_with_lm_eval` scores any model this library produces — a from-scratch baseline or DIFF model, a
model adapted with :func:`diffattn.adapt` (wrapped attention modules), a merged adapter, or a plain Hugging Face
model — with ``lm_eval`` through ``HFLM(pretrained=<model object>, tokenizer=<tokenizer object>)`` and
``lm_eval.simple_evaluate``. Tasks come from lm-eval's registry or from a user's own YAML files found through
``TaskManager(include_path=...)``, e.g. a local multiple-choice task over local JSON lines::

    task: my_mc
    dataset_path: json
    dataset_kwargs:
      data_files:
        test: /abs/path/items.jsonl     # relative paths are read from the working directory (datasets' rule)
    test_split: test
    output_type: multiple_choice
    doc_to_text: "{{question}}"
    doc_to_choice: "{{choices}}"
    doc_to_target: label
    metric_list:
      - metric: acc

Nothing is fetched from a hub: both objects are passed in (a model *name* would make lm-eval download a
tokenizer), the Hugging Face offline switches are on for the duration of the call (environment variables and the
``huggingface_hub`` / ``datasets`` constants already read at import, restored afterwards), and the only hub lookup
lm-eval makes for a model object (the model's commit sha for its report) is skipped.

lm-eval's run report skips ``torch.utils.collect_env`` (``pip list``, seconds per call) and ``git describe``,
which the trimmed results do not carry (patched for the duration of the call; not thread-safe).

The model is left as it was found: its device, its train/eval mode and the global Python/NumPy/torch random
states (``simple_evaluate`` reseeds all three) are restored; lm-eval works on a copy of the tokenizer, because it
sets a pad token on tokenizers without one.

Needs the ``eval`` extra: ``pip install 'diffattn[eval]'`` (``lm-eval>=0.4.9``).
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import importlib.metadata
import logging
import math
import os
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["build_hflm", "evaluate_with_lm_eval", "list_local_tasks"]

logger = logging.getLogger(__name__)

# Options of simple_evaluate this bridge sets itself; the rest may be passed through **simple_evaluate_kwargs.
_OWNED = frozenset(
    {"model", "model_args", "tasks", "task_manager", "limit", "batch_size", "num_fewshot", "device", "log_samples"}
)
_OFFLINE_ENV = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
# Keys of one logged lm-eval sample worth keeping (hashes and the doc's duplicated filter info are dropped).
_SAMPLE_KEYS = ("doc_id", "doc", "target", "arguments", "resps", "filtered_resps", "filter", "metrics")
# lm-eval warns about passing a model object, which is exactly what this bridge means to do.
_EXPECTED_WARNINGS = ("`pretrained` model kwarg is not of type `str`", "Passed an already-initialized model")


def _import_lm_eval():
    try:
        import lm_eval
        from lm_eval.models.huggingface import HFLM
        from lm_eval.tasks import TaskManager
    except ImportError as err:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "the lm-evaluation-harness bridge needs lm-eval: pip install 'diffattn[eval]' (or 'lm-eval>=0.4.9')"
        ) from err
    return lm_eval, HFLM, TaskManager


def _local_hflm_class():
    """``HFLM`` without its hub lookup of the model's commit sha (``HfApi().model_info(<model object>)``)."""
    _, HFLM, _ = _import_lm_eval()

    class LocalHFLM(HFLM):
        def get_model_info(self) -> dict:
            model = self._model
            return {
                "model_num_parameters": sum(p.numel() for p in model.parameters()),
                "model_dtype": str(getattr(model, "dtype", "")),
                "model_revision": None,
                "model_sha": "",
            }

    return LocalHFLM


def build_hflm(
    model: torch.nn.Module,
    tokenizer,
    *,
    batch_size: int | str = 1,
    max_length: int | None = None,
    **hflm_kwargs,
):
    """An lm-eval ``HFLM`` around ``model`` and ``tokenizer`` objects (never names), for direct use with lm-eval.

    The tokenizer is used as given (lm-eval may set its pad token); :func:`evaluate_with_lm_eval` passes a copy.
    ``hflm_kwargs`` go to ``HFLM`` (e.g. ``add_bos_token``, ``prefix_token_id``, ``truncation``).
    """
    _check_model_and_tokenizer(model, tokenizer)
    for key in ("pretrained", "tokenizer", "parallelize", "tp_plan", "peft", "delta", "gguf_file", "device"):
        if key in hflm_kwargs:
            raise ValueError(f"{key!r} cannot be passed to the bridge's HFLM (the model and tokenizer are objects)")
    with _quiet_expected_warnings():
        return _local_hflm_class()(
            pretrained=model, tokenizer=tokenizer, batch_size=batch_size, max_length=max_length, **hflm_kwargs
        )


def list_local_tasks(include_path: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """Names of the tasks, groups and tags defined by the YAML files under ``include_path`` (no built-ins)."""
    _, _, TaskManager = _import_lm_eval()
    return list(TaskManager(include_path=_include_paths(include_path), include_defaults=False).all_tasks)


def evaluate_with_lm_eval(
    model: torch.nn.Module,
    tokenizer,
    tasks: str | Sequence[str | dict],
    *,
    include_path: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
    include_defaults: bool | None = None,
    limit: int | float | None = None,
    batch_size: int | str = 1,
    num_fewshot: int | None = None,
    device: str | torch.device | None = None,
    max_length: int | None = None,
    log_samples: bool = False,
    hflm_kwargs: dict[str, Any] | None = None,
    **simple_evaluate_kwargs,
) -> dict:
    """Score ``model`` on lm-eval ``tasks`` offline and return JSON-serialisable results.

    Args:
        model: any causal LM ``PreTrainedModel`` (from-scratch, adapted, merged or plain Hugging Face).
        tokenizer: its tokenizer *object* (``PreTrainedTokenizer``/``PreTrainedTokenizerFast``).
        tasks: task, group or tag names (a list, or one string, comma-separated), paths to task YAML files, or
            inline task config dicts.
        include_path: a folder (or list of folders) of the user's task YAML files; ``dataset_path: json`` with
            ``dataset_kwargs: {data_files: ...}`` reads local JSON/JSON-lines files.
        include_defaults: also index lm-eval's ~15k built-in task configs (takes ~15 s). Default: only when no
            ``include_path`` is given and some task is a name (not a YAML path or a dict). Built-in tasks need
            their datasets in the local Hugging Face cache.
        limit: at most this many documents per task (an int >= 1), or this fraction of them (a float in (0, 1]).
        batch_size: an int, or ``"auto"``.
        num_fewshot: overrides the tasks' own few-shot counts (tasks that fix 0 keep 0).
        device: move the model there for the call (it is moved back afterwards); default: where it is.
        max_length: context length lm-eval truncates to; default: the length the model was trained at where its
            run recorded one (:func:`diffattn.eval.common.trained_length`: a model measured past it is out of
            distribution, as every suite's window), else lm-eval's, from the model config.
        log_samples: add each task's per-document records (arguments, log-likelihoods/responses, metrics) as
            ``results[task]["samples"]``.
        hflm_kwargs: extra ``HFLM`` options (``add_bos_token``, ``prefix_token_id``, ``truncation``, ...).
        **simple_evaluate_kwargs: passed to ``lm_eval.simple_evaluate`` (``bootstrap_iters``, ``gen_kwargs``,
            ``random_seed``, ``fewshot_random_seed``, ``apply_chat_template``, ...).

    Returns:
        ``{task_or_group: {metric: value, ...}, ..., "metadata": {...}}``. Metric keys are lm-eval's without the
        default filter suffix (``"acc"``, ``"acc_stderr"``, ``"acc_norm"``; another filter keeps its suffix, e.g.
        ``"exact_match,strict-match"``); NaN and "N/A" become ``None``. Each task entry also holds ``alias`` and
        ``n_samples``. ``metadata`` states the lm-eval/transformers versions, the tasks, limit, few-shot counts
        (requested and effective per task), batch size, device, max length, seeds, include paths, task versions
        and the model's class.
    """
    lm_eval, _, TaskManager = _import_lm_eval()
    _check_model_and_tokenizer(model, tokenizer)
    task_list = _task_list(tasks)
    _check_options(limit, num_fewshot, hflm_kwargs, simple_evaluate_kwargs)
    paths, include_defaults = _task_indexes(task_list, include_path, include_defaults)

    if max_length is None:
        from .common import trained_length

        max_length = trained_length(model)  # None: lm-eval reads the model config
    with _offline(), _preserved_state(model, device) as target_device:
        task_manager = TaskManager(include_path=paths or None, include_defaults=include_defaults)
        _check_tasks(task_list, task_manager, paths)
        lm = build_hflm(
            model, copy.deepcopy(tokenizer), batch_size=batch_size, max_length=max_length, **(hflm_kwargs or {})
        )
        # what the harness is asked for is what the result records
        asked = {
            "limit": limit,
            "num_fewshot": num_fewshot,
            "batch_size": batch_size,
            "device": str(target_device),
            "log_samples": log_samples,
        }
        with _quiet_expected_warnings(), _light_run_report():
            raw = lm_eval.simple_evaluate(
                model=lm, tasks=task_list, task_manager=task_manager, **asked, **simple_evaluate_kwargs
            )
        effective_max_length = int(lm.max_length)
    if raw is None:  # only a non-zero rank returns None; this bridge runs single-process
        raise RuntimeError("lm_eval.simple_evaluate returned no results")
    return _trim(
        raw,
        model=model,
        task_list=task_list,
        paths=paths,
        include_defaults=include_defaults,
        max_length=effective_max_length,
        version=_lm_eval_version(),
        **asked,
    )


def _check_options(limit, num_fewshot, hflm_kwargs: dict | None, simple_evaluate_kwargs: dict) -> None:
    """Refuses options given twice (an own argument repeated in a pass-through dict) and bad limits and shot counts."""
    bad = sorted(_OWNED & simple_evaluate_kwargs.keys())
    if bad:
        raise ValueError(f"{', '.join(bad)}: set by evaluate_with_lm_eval's own arguments, not simple_evaluate_kwargs")
    _check_limit(limit)
    clash = sorted({"batch_size", "max_length"} & (hflm_kwargs or {}).keys())
    if clash:
        raise ValueError(f"{', '.join(clash)}: give them as evaluate_with_lm_eval's own arguments, not in hflm_kwargs")
    if num_fewshot is not None and (
        not isinstance(num_fewshot, int) or isinstance(num_fewshot, bool) or num_fewshot < 0
    ):
        raise ValueError(f"num_fewshot must be a non-negative int or None, got {num_fewshot!r}")


def _task_indexes(task_list: list, include_path, include_defaults: bool | None) -> tuple[list[str], bool]:
    """The user's task folders, and whether lm-eval's own index is read too: by default only when no folder is
    given and a task is named (not a YAML path or a dict)."""
    paths = _include_paths(include_path) if include_path is not None else []
    by_name = [t for t in task_list if isinstance(t, str) and not _is_yaml_file(t)]
    if include_defaults is None:
        include_defaults = not paths and bool(by_name)
    if by_name and not paths and not include_defaults:
        raise ValueError("no tasks to choose from: give include_path, or include_defaults=True for lm-eval's own")
    return paths, include_defaults


# ----------------------------------------------------------------------------------------------- checks


def _check_model_and_tokenizer(model, tokenizer) -> None:
    from transformers import PreTrainedModel, PreTrainedTokenizer, PreTrainedTokenizerFast

    if not isinstance(model, PreTrainedModel):
        raise ValueError(
            f"model must be a transformers PreTrainedModel object (got {type(model).__name__}); "
            "load a folder or run with diffattn.load_pretrained / diffattn.load_adapted first"
        )
    if tokenizer is None or isinstance(tokenizer, str | os.PathLike):
        raise ValueError(
            "tokenizer must be a tokenizer object, not a name or path (lm-eval would fetch a name from the hub); "
            "load it with transformers.AutoTokenizer.from_pretrained(<local folder>)"
        )
    if not isinstance(tokenizer, PreTrainedTokenizer | PreTrainedTokenizerFast):
        raise ValueError(
            f"lm-eval's HFLM needs a PreTrainedTokenizer or PreTrainedTokenizerFast, got {type(tokenizer).__name__}"
        )


def _task_list(tasks) -> list[str | dict]:
    if isinstance(tasks, str):
        out = [t.strip() for t in tasks.split(",") if t.strip()]
    elif isinstance(tasks, dict):
        out = [tasks]
    elif isinstance(tasks, Sequence):
        out = list(tasks)
    else:
        raise ValueError(f"tasks must be a task name, a list of them or a task config dict, got {tasks!r}")
    if not out:
        raise ValueError("no tasks given")
    for t in out:
        if isinstance(t, dict):
            if "task" not in t and "group" not in t:
                raise ValueError(f"an inline task config needs a 'task' or 'group' key, got keys {sorted(t)}")
        elif not isinstance(t, str) or not t.strip():
            raise ValueError(f"task names must be non-empty strings or config dicts, got {t!r}")
    names = [t if isinstance(t, str) else t.get("task", t.get("group")) for t in out]
    if "metadata" in names:
        raise ValueError("a task named 'metadata' would collide with the results' metadata entry; rename it")
    return out


def _check_limit(limit) -> None:
    if limit is None:
        return
    if isinstance(limit, bool) or not isinstance(limit, int | float):
        raise ValueError(f"limit must be an int, a float fraction or None, got {limit!r}")
    if isinstance(limit, int) and limit < 1:
        raise ValueError(f"limit must be >= 1 documents, got {limit}")
    if isinstance(limit, float) and not 0.0 < limit <= 1.0:
        raise ValueError(f"a fractional limit must be in (0, 1], got {limit}")


def _include_paths(include_path) -> list[str]:
    raw = [include_path] if isinstance(include_path, str | os.PathLike) else list(include_path)
    if not raw:
        raise ValueError("include_path is an empty list")
    paths = []
    for p in raw:
        path = Path(p).expanduser()
        if not path.exists():
            raise ValueError(f"include_path {str(p)!r} does not exist; give a folder of lm-eval task YAML files")
        if not path.is_dir():
            raise ValueError(f"include_path {str(p)!r} is not a folder; give the folder holding the task YAML files")
        if not any(path.glob("**/*.yaml")):
            raise ValueError(f"include_path {str(p)!r} holds no .yaml task files")
        paths.append(str(path.resolve()))
    return paths


def _is_yaml_file(spec: str) -> bool:
    return spec.endswith((".yaml", ".yml")) and Path(spec).expanduser().is_file()


def _check_tasks(task_list, task_manager, paths: list[str]) -> None:
    known = set(task_manager.all_tasks)
    unknown = [t for t in task_list if isinstance(t, str) and t not in known and not _is_yaml_file(t)]
    if not unknown:
        return
    local = sorted(
        name
        for name, entry in task_manager.task_index.items()
        if entry.yaml_path is not None and any(Path(entry.yaml_path).resolve().is_relative_to(p) for p in paths)
    )
    pool = local or sorted(known)
    close = sorted({c for t in unknown for c in difflib.get_close_matches(t, pool, n=3, cutoff=0.6)})
    parts = [f"unknown lm-eval task{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}"]
    if close:
        parts.append(f"did you mean {', '.join(close)}?")
    if paths:
        shown = ", ".join(local[:10]) + (f", … ({len(local)} in all)" if len(local) > 10 else "")
        parts.append(f"tasks defined under include_path: {shown or 'none'}")
        if not local:
            parts.append("lm-eval skips YAML files it cannot parse or that lack a 'task' or 'group' key")
    else:
        parts.append(f"{len(known)} built-in tasks are indexed; give include_path for your own YAML tasks")
    raise ValueError("; ".join(parts))


# ----------------------------------------------------------------------------------------------- context


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """Hugging Face offline mode for the duration: environment variables and the constants read at import."""
    saved_env = {k: os.environ.get(k) for k in _OFFLINE_ENV}
    patched: list[tuple[Any, str, Any]] = []
    try:
        for k in _OFFLINE_ENV:
            os.environ[k] = "1"
        import datasets.config
        import huggingface_hub.constants

        for module, names in (
            (huggingface_hub.constants, ("HF_HUB_OFFLINE",)),
            (datasets.config, ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")),
        ):
            for name in names:
                if hasattr(module, name):
                    patched.append((module, name, getattr(module, name)))
                    setattr(module, name, True)
        yield
    finally:
        for module, name, value in reversed(patched):
            setattr(module, name, value)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _preserved_state(model: torch.nn.Module, device) -> Iterator[torch.device]:
    """Move ``model`` to ``device`` if asked; restore its device, train/eval mode and the global RNG states."""
    was_training = model.training
    old_device = next(model.parameters()).device
    target = torch.device(device) if device is not None else old_device
    py_state, np_state, torch_state = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    if target != old_device:
        model.to(target)
    try:
        yield target
    finally:
        if target != old_device:
            model.to(old_device)
        model.train(was_training)
        random.setstate(py_state)
        np.random.set_state(np_state)
        torch.set_rng_state(torch_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)


@contextlib.contextmanager
def _light_run_report() -> Iterator[None]:
    """Skip the parts of lm-eval's run report this bridge does not return and that cost seconds per call:
    ``torch.utils.collect_env`` (runs ``pip list`` twice) and ``git describe`` in the working directory."""
    import transformers
    from lm_eval import evaluator

    def add_env_info(storage: dict) -> None:
        storage.update(
            pretty_env_info="skipped by diffattn's lm-eval bridge",
            transformers_version=transformers.__version__,
            lm_eval_version=_lm_eval_version(),
            upper_git_hash=None,
        )

    patched = [
        (name, getattr(evaluator, name)) for name in ("add_env_info", "get_git_commit_hash") if hasattr(evaluator, name)
    ]
    replacements = {"add_env_info": add_env_info, "get_git_commit_hash": lambda: None}
    try:
        for name, _ in patched:
            setattr(evaluator, name, replacements[name])
        yield
    finally:
        for name, original in patched:
            setattr(evaluator, name, original)


def _lm_eval_version() -> str | None:
    try:
        return importlib.metadata.version("lm_eval")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover
        return None


class _DropExpected(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(message.startswith(m) for m in _EXPECTED_WARNINGS)


@contextlib.contextmanager
def _quiet_expected_warnings() -> Iterator[None]:
    hf_logger = logging.getLogger("lm_eval.models.huggingface")
    flt = _DropExpected()
    hf_logger.addFilter(flt)
    try:
        yield
    finally:
        hf_logger.removeFilter(flt)


# ----------------------------------------------------------------------------------------------- results


def _jsonable(x):
    """Plain JSON types: tuples → lists, NumPy/torch scalars and arrays → Python, NaN/inf → None."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple | set):
        return [_jsonable(v) for v in x]
    if isinstance(x, torch.Tensor):
        return _jsonable(x.tolist())
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if isinstance(x, np.generic):
        return _jsonable(x.item())
    if isinstance(x, bool) or x is None or isinstance(x, str | int):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    return str(x)


def _metric_key(key: str) -> str:
    metric, _, filt = key.partition(",")
    return metric if filt in ("", "none") else key


def _trim(raw: dict, *, model, task_list, paths, include_defaults, limit, num_fewshot, batch_size, device,
          max_length, log_samples, version) -> dict:  # fmt: skip
    out: dict[str, Any] = {}
    n_samples = raw.get("n-samples", {})
    for name, metrics in raw.get("results", {}).items():
        entry: dict[str, Any] = {}
        for key, value in metrics.items():
            if key in ("name", "sample_len"):
                continue
            if key == "alias":
                entry["alias"] = str(value).strip().lstrip("- ").strip() or name
                continue
            if value == "N/A":
                value = None
            entry[_metric_key(key)] = _jsonable(value)
        counts = n_samples.get(name, {})
        entry["n_samples"] = counts.get("effective", metrics.get("sample_len"))
        out[name] = entry
    for name, metrics in raw.get("groups", {}).items():  # group aggregates (also listed under results)
        if name not in out:
            out[name] = {_metric_key(k): _jsonable(None if v == "N/A" else v) for k, v in metrics.items()}
    if log_samples:
        for name, samples in (raw.get("samples") or {}).items():
            out.setdefault(name, {})["samples"] = [
                _jsonable({k: s[k] for k in _SAMPLE_KEYS if k in s} | {m: s[m] for m in s.get("metrics", []) if m in s})
                for s in samples
            ]
    config = raw.get("config", {})
    out["metadata"] = _jsonable(
        {
            "harness": "lm-evaluation-harness",
            "lm_eval_version": version,
            "transformers_version": raw.get("transformers_version"),
            "torch_version": torch.__version__,
            "tasks": [t if isinstance(t, str) else t.get("task", t.get("group")) for t in task_list],
            "task_versions": raw.get("versions", {}),
            "group_subtasks": raw.get("group_subtasks", {}),
            "limit": limit,
            "num_fewshot": num_fewshot,
            "num_fewshot_per_task": raw.get("n-shot", {}),
            "n_samples": n_samples,
            "higher_is_better": raw.get("higher_is_better", {}),
            "batch_size": batch_size,
            "device": device,
            "max_length": max_length,
            "include_path": paths,
            "include_defaults": include_defaults,
            "offline": True,
            "seeds": {k: config.get(k) for k in ("random_seed", "numpy_seed", "torch_seed", "fewshot_seed")},
            "bootstrap_iters": config.get("bootstrap_iters"),
            "model_class": type(model).__name__,
            "model_type": getattr(model.config, "model_type", None),
            "model_num_parameters": config.get("model_num_parameters"),
            "model_dtype": config.get("model_dtype"),
            "tokenizer": {k: raw.get(k) for k in ("tokenizer_bos_token", "tokenizer_eos_token", "tokenizer_pad_token")},
            "scoring": (
                "lm-eval: loglikelihood = sum of the continuation tokens' log-probabilities given the context "
                "(context's trailing whitespace moved to the continuation); multiple_choice acc = argmax of that "
                "sum, acc_norm = argmax of it divided by the choice's length in characters (acc_bytes: in bytes)"
            ),
        }
    )
    return out
