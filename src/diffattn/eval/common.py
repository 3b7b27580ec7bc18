"""Helpers every evaluation shares: the suite entry (:class:`Suite`: how a suite runs, its options, checks, protocol
sentence and claim measures), the options every suite shares (:class:`CommonOptions`), the model's context limit,
texts to evaluate on, JSON-safe results, plots."""

from __future__ import annotations

import argparse
import inspect
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

# RULER's repeated-noise haystack (the "noise" filler of Kamradt's needle test and RULER)
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "


def model_max_length(model: nn.Module) -> int:
    """The most positions the model accepts (:func:`diffattn.models.pretrained.config_positions`)."""
    from ..models.pretrained import config_positions

    value = config_positions(getattr(model, "config", None))
    if value is None:
        raise ValueError("cannot tell the model's maximum context: its config has no max_position_embeddings")
    return value


def check_fits(model: nn.Module, tokens: int, what: str) -> None:
    """Refuse a request for more positions than the model has, saying what was asked and what fits."""
    check_positions(model_max_length(model), tokens, what)


def check_positions(limit: int, tokens: int, what: str, whose: str = "the model's") -> None:
    """:func:`check_fits` on a number of positions (a suite's preflight knows the model by its
    :class:`EvalTarget`)."""
    if tokens > limit:
        raise ValueError(f"{what} needs {tokens} tokens but {whose} maximum context is {limit} positions")


# Where :func:`diffattn.eval.suite.load_for_eval` records the sequence length a diffattn run trained the model at
# (``data.seq_len`` of the run's ``run.yaml``): a plain attribute of the loaded model, not saved with it.
TRAINED_LENGTH = "diffattn_trained_length"


def recorded_length(run: object) -> int | None:
    """The sequence length a run folder's ``run.yaml`` (read as YAML) trained at, ``data.seq_len``; None when it
    records none."""
    length = ((run.get("data") or {}) if isinstance(run, dict) else {}).get("seq_len")
    return length if isinstance(length, int) and not isinstance(length, bool) and length > 0 else None


def folder_training_length(folder: str | os.PathLike, *, pretrained_only: bool = False) -> int | None:
    """:func:`recorded_length` of the ``run.yaml`` a model folder holds (a diffattn run's ``final/`` or checkpoint);
    None where it holds none or it does not read. ``pretrained_only``: None for an adapter run's folder too (its
    length is the adaptation's, not the base's pretraining)."""
    import yaml

    from ..files import RUN_CONFIG

    try:
        run = yaml.safe_load((Path(folder) / RUN_CONFIG).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    if pretrained_only and isinstance(run, dict) and "method" in run:
        return None
    return recorded_length(run)


def trained_length(model: nn.Module) -> int | None:
    """The sequence length ``model`` was trained at, when its run recorded it (:data:`TRAINED_LENGTH`)."""
    value = getattr(model, TRAINED_LENGTH, None)
    return value if isinstance(value, int) and value > 0 else None


#: the needle suites' context (niah, alloc: one option, the same prompts' family) for a model without a training
#: length, up to the model's maximum: room for N = 8 needles and the heatmap's lengths in a pretrained model's window
NEEDLE_CONTEXT_CAP = 2048


def evaluation_window(model: nn.Module, requested: int | None, *, cap: int = 1024) -> int:
    """The window a suite measures in: ``requested`` (the evaluation's ``window``) when given, else the length the
    model was trained at (a model measured beyond it is out of distribution: a ``quick`` model trained on 128
    tokens has perplexity 246 at 512 against 104 at 128), else the model's maximum context up to ``cap``."""
    return default_window(requested, trained_length(model), lambda: model_max_length(model), cap)


def default_window(requested: int | None, trained: int | None, positions: int | Callable[[], int], cap: int) -> int:
    """:func:`evaluation_window`'s rule on numbers (one home: the suites' runs and their preflights read it).
    ``positions`` may be a function, called only when neither a window nor a training length is given (a model
    whose config names no maximum context measures at a window it is given)."""
    return requested or trained or min(positions() if callable(positions) else positions, cap)


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def forward_parameters(model: nn.Module) -> Mapping[str, inspect.Parameter]:
    """The keyword parameters of the model's forward (of the model under a PEFT wrapper)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return inspect.signature(base.forward).parameters


def cache_keyword(model: nn.Module) -> str:
    """The name under which this model's forward takes the KV cache: transformers 5.24 renamed
    ``past_key_values`` to ``cache`` (the old name warns there and is gone in 5.40)."""
    return "cache" if "cache" in forward_parameters(model) else "past_key_values"


def load_text(source: str, split: str = "test") -> tuple[str, str]:
    """``(text, description)`` of an evaluation text: ``"shakespeare"`` (a split of the built-in corpus, by play),
    ``"filler"`` (RULER's repeated sentences), or a path to a .txt/.jsonl/.json file or folder."""
    if source == "filler":
        return FILLER * 400, "filler: RULER's repeated noise sentences"
    from ..data import load_corpus

    corpus = load_corpus(source)
    docs = getattr(corpus, split)
    if not docs:
        raise ValueError(f"the {split} split of {source!r} is empty")
    return "\n\n".join(docs), f"{corpus.name}, {split} split ({corpus.split_info})"


def jsonable(x):
    """Results as plain JSON types (tensors, numpy scalars and NaN handled)."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, torch.Tensor):
        return jsonable(x.tolist())
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):
        return jsonable(x.item())
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def option(default, help: str, *, minimum: int | None = None, maximum: int | None = None, parse=None):
    """A suite option: a dataclass field whose metadata gives its ``diffattn eval`` flag's help, its bounds (checked
    by :meth:`diffattn.eval.suite.OptionsBase.validate`; ``None`` passes when the default is ``None``) and, for a
    value that is not a plain ``int`` or ``str``, the function that parses the flag's text."""
    return field(default=default, metadata={"help": help, "minimum": minimum, "maximum": maximum, "parse": parse})


def int_list(text: str) -> tuple[int, ...]:
    """A flag's comma-separated positive ints; ``none`` for the empty list."""
    if text.strip().lower() == "none":
        return ()
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        values = ()
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"want comma-separated positive ints or 'none', got {text!r}")
    return values


@dataclass
class CommonOptions:
    """The options several suites read (defaults: minutes on a CPU for a 135M model)."""

    text: str = option("shakespeare", "evaluation text: shakespeare, filler or a path")
    haystack: str = option("shakespeare", "NIAH/allocation haystack: shakespeare or filler")
    # default: the length the model was trained at, else min(model max, NEEDLE_CONTEXT_CAP)
    context_tokens: int | None = option(None, "NIAH/allocation context length", minimum=8)
    samples: int = option(5, "NIAH samples per cell / allocation samples", minimum=1)
    niah_digits: int = option(7, "needle number length in niah and alloc (the papers: 7)", minimum=1, maximum=12)
    # DIFF Fig. 5 and Table 3, Dex Fig. 10 and Table 2: one needle queried among distractors, N = 8
    niah_needles: int = option(
        8, "needles N (one queried) of the NIAH heatmap and of each allocation prompt", minimum=1
    )
    tokens: int = option(4096, "token budget of ppl/outliers/quant/heads", minimum=1)
    # the window of ppl (stride = window / 2), outliers, quant, heads and AR-Hit (default: the length the model was
    # trained at, recorded in its run; else min(model max, 1024)): a model measured beyond it is out of distribution
    window: int | None = option(None, "perplexity window (stride = window / 2)", minimum=2)
    seed: int = option(0, "seed of every sampled prompt and draw")

    def needle_prompts(self) -> dict:
        """The options the needle suites (niah, alloc) share: haystack, context, samples, digits and seed (each suite
        draws its own prompts from them)."""
        return {
            "haystack": self.haystack, "context_tokens": self.context_tokens, "samples": self.samples,
            "value_digits": self.niah_digits, "seed": self.seed,
        }  # fmt: skip


@dataclass(frozen=True)
class EvalTarget:
    """A model a suite's preflight checks the options against: one an experiment will train (known before it is
    trained), or a loaded one (:meth:`of_model`, before its first suite runs)."""

    name: str
    positions: int  # the most positions the model will accept
    trained_length: int | None  # the sequence length it is trained at (the suites' default context); None: unknown
    tokenizer: Callable[[], object]  # its data's tokenizer, built on the first call

    @classmethod
    def of_model(cls, model: nn.Module, tokenizer, name: str) -> EvalTarget:
        """The target of a loaded model: its positions and the training length its run recorded."""
        return cls(name, model_max_length(model), trained_length(model), lambda: tokenizer)

    def window(self, requested: int | None, cap: int = 1024) -> int:
        """The window a suite measures this model in (:func:`evaluation_window`)."""
        return default_window(requested, self.trained_length, self.positions, cap)

    def check_fits(self, tokens: int, what: str) -> None:
        """:func:`check_fits` before the model is loaded or trained."""
        check_positions(self.positions, tokens, what, whose=f"{self.name}'s")


def option_name(field: str, style: str = "field") -> str:
    """An option as the user wrote it: ``"flag"`` (``--samples``), ``"experiment"`` (``eval.options.samples``) or
    ``"field"`` (``samples``): how the suites' checks and preflights name a bad value."""
    return {"flag": f"--{field.replace('_', '-')}", "experiment": f"eval.options.{field}"}.get(style, field)


def window_preflight(options, targets, name) -> None:
    """The preflight of the suites that measure in the shared ``window`` (ppl, outliers, quant, heads, MQAR's
    AR-Hit): it must fit every target's positions (the default, the training length or the maximum up to 1,024,
    always does)."""
    for t in targets:
        source = "the length it was trained at" if t.trained_length else "the model's maximum up to 1,024"
        t.check_fits(t.window(options.window), name("window") if options.window else f"the default window ({source})")


@dataclass(frozen=True)
class Suite:
    """One evaluation suite's entry in the suite table (:data:`diffattn.eval.suite.SUITE_TABLE`): everything the
    library knows about the suite, so that the CLI, experiments, reports and claims read it from here.

    ``run(model, tokenizer, options, folder, name) -> (results, {picture key: file name})``: runs it with the
    :class:`~diffattn.eval.suite.SuiteOptions` and writes its pictures into ``folder``. ``headline(results) ->
    {column: number}``: the numbers of the report's model × metric table, which ``diffattn eval`` also prints.
    ``compare({model: results}, folder) -> report lines``: pictures and tables that put the models side by side.
    ``options``: a dataclass of the suite's own options (fields made with :func:`option`; their names are the
    ``diffattn eval`` flags and the ``eval.options`` keys of an experiment). ``check(options, name)``: refuses bad
    values when the suite is asked for (``name(field)`` spells a field as the user wrote it).
    ``preflight(options, [EvalTarget], name)``: refuses what cannot run on the models an experiment will train
    (before any training) or on the model ``diffattn eval`` loaded (before any suite runs). ``protocol(options) ->
    sentence``: the report's protocol line (suites sharing the function share the line; a suite without one is
    listed with the others). ``measures``: what claims can read of its results
    (:class:`~diffattn.eval.measures.Measure` by name). ``default``: part of ``diffattn eval``'s default suites."""

    name: str
    run: Callable
    headline: Callable
    compare: Callable | None = None
    options: type | None = None
    check: Callable | None = None
    preflight: Callable | None = None
    protocol: Callable | None = None
    measures: Mapping[str, object] = field(default_factory=dict)
    default: bool = True
    # the DIFF Transformer claims its measures check (PaperClaim, reference "baseline"): a new suite brings its own
    # claims with it; diffattn.experiments.claims.claim_table reads them from the suite table
    claims: tuple = ()


def fmt(x) -> str:
    """A number as the report prints it (4 significant digits; – for missing)."""
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:,.4g}" if abs(x) < 1e5 else f"{x:,.0f}"
    return f"{x:,}" if isinstance(x, int) else str(x)


def figure():
    """A matplotlib (Agg) pyplot module, importable on a headless machine."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def seed_group(name: str) -> str:
    """The model a replicate run belongs to: ``NAME-sSEED`` → ``NAME`` (the experiments' naming of seeds)."""
    import re

    return re.sub(r"-s\d+$", "", name)


def group_colors(names) -> dict[str, object]:
    """One colour per model group in every picture: the replicate runs of one architecture share a colour."""
    plt = figure()
    palette = plt.get_cmap("tab10").colors
    groups = list(dict.fromkeys(seed_group(n) for n in names))
    return {n: palette[groups.index(seed_group(n)) % len(palette)] for n in names}


def ema(values, alpha: float = 0.05) -> list[float]:
    """Exponential moving average (bias-corrected, as TensorBoard's smoothing): the trend of a noisy curve."""
    out, avg, weight = [], 0.0, 0.0
    for v in values:
        avg = (1 - alpha) * avg + alpha * v
        weight = (1 - alpha) * weight + alpha
        out.append(avg / weight)
    return out


def save_figure(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    figure().close(fig)
    return path
