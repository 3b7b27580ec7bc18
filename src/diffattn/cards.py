"""Model cards: a ``README.md`` in the Hub's format for every model folder diffattn writes (``final/``, ``merged/``,
``adapter/``), so that transformers' ``push_to_hub`` would publish a usable page. Nothing is fetched or sent.

The card is YAML metadata (``huggingface_hub.ModelCardData``: base model, library, tags, the base's license, the
data sets) followed by text: what the model is (method and options), the data and the budget it was trained with,
how to load it, and the report's headline numbers when an experiment evaluated it. A field that is not known is left
out, never written empty. A card the user wrote is never replaced: ours carry :data:`CARD_MARK`.
"""

from __future__ import annotations

import os
from pathlib import Path

CARD = "README.md"
CARD_MARK = "<!-- model card written by diffattn -->"

# Licenses of the bases diffattn loads by name (the card of a model adapted from one carries its base's license).
BASE_LICENSES = {"smollm2-135m": "apache-2.0", "HuggingFaceTB/SmolLM2-135M": "apache-2.0"}


def is_ours(folder: str | os.PathLike) -> bool:
    """Whether ``folder``'s README.md is absent or one diffattn wrote (so it may be replaced)."""
    path = Path(folder) / CARD
    return not path.exists() or CARD_MARK in path.read_text(errors="replace")


def write_model_card(
    folder: str | os.PathLike,
    *,
    title: str,
    summary: str,
    base_model: str | None = None,
    method: str | None = None,
    options: dict | None = None,
    data: str | None = None,
    budget: str | None = None,
    headline: dict[str, float] | None = None,
    loading: str | None = None,
    tags: list[str] | None = None,
    datasets: list[str] | None = None,
) -> Path | None:
    """Write ``folder/README.md`` (see the module doc); returns its path, or None when a card the user wrote is
    there (left as it is). Every argument but the title and summary may be None: its part is left out."""
    from huggingface_hub import ModelCard, ModelCardData

    folder = Path(folder)
    if not is_ours(folder):
        return None
    license_ = BASE_LICENSES.get(base_model) if base_model else None
    hub_base = base_model if base_model and "/" in base_model and not Path(base_model).exists() else None
    data_card = ModelCardData(
        library_name="transformers",
        base_model="HuggingFaceTB/SmolLM2-135M" if base_model == "smollm2-135m" else hub_base,
        license=license_,
        tags=["diffattn", "differential-attention", *([method] if method else []), *(tags or [])],
        datasets=datasets or None,
        pipeline_tag="text-generation",
    )
    parts = [summary]
    if method or options:
        rows = [f"- method: `{method}`"] if method else []
        rows += [f"- `{k}`: `{v}`" for k, v in (options or {}).items() if v is not None]
        parts.append("## Method\n\n" + "\n".join(rows))
    if base_model:
        parts.append(f"## Base model\n\n`{base_model}`" + (f" (license {license_})" if license_ else ""))
    if data or budget:
        parts.append("## Training\n\n" + "\n".join(f"- {x}" for x in (data, budget) if x))
    evaluation = _evaluation_section(headline)
    if evaluation:
        parts.append(evaluation)
    parts.append("## Loading\n\n" + (loading or _plain_loading()))
    template = "---\n{{ card_data }}\n---\n\n" + CARD_MARK + "\n\n# {{ title }}\n\n{{ body }}\n"
    card = ModelCard.from_template(data_card, template_str=template, title=title, body="\n\n".join(parts))
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / (CARD + ".tmp")
    tmp.write_text(card.content)
    os.replace(tmp, folder / CARD)
    return folder / CARD


def _evaluation_section(headline: dict | None) -> str:
    rows = [f"| {k} | {v:.4g} |" for k, v in (headline or {}).items() if isinstance(v, (int, float))]
    return (
        "## Evaluation (the experiment's report)\n\n| metric | value |\n|---|---|\n" + "\n".join(rows) if rows else ""
    )


def add_headline(folder: str | os.PathLike, headline: dict[str, float]) -> bool:
    """Put an experiment's headline numbers into the card of ``folder`` (ours only; its evaluation section is
    replaced, or added before the loading section). Returns whether the card was updated."""
    import re

    path = Path(folder) / CARD
    section = _evaluation_section(headline)
    if not path.is_file() or not section or not is_ours(folder):
        return False
    text = path.read_text()
    text = re.sub(r"## Evaluation \(the experiment's report\)\n.*?(?=\n## )", "", text, flags=re.S)
    text = text.replace("## Loading", section + "\n\n## Loading", 1)
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return True


def run_card_fields(config, summary: dict, *, form: str) -> dict:
    """The card of a folder a ``diffattn pretrain`` or ``diffattn adapt`` run wrote (``form``: final, merged or
    adapter), from the run's config and summary."""
    data = summary.get("data") or {}
    d, t = config.data, config.train
    rows = data.get("train_sequences")
    mix = data.get("retrieval_mix_sequences")
    data_text = f"data: {data.get('source', d.source)}" + (f", {rows:,} training sequences" if rows else "")
    data_text += f" of {d.seq_len} tokens" + (f" ({mix:,} from the retrieval practice mix)" if mix else "")
    passes = data.get("passes_over_data")
    data_text += f", each read {passes:g} times" if passes else ""
    budget = f"budget: {summary.get('steps', t.max_steps)} steps × {t.global_batch_size} sequences, lr {t.lr:g}"
    method = getattr(config, "method", None)
    if method is None:  # pretraining from scratch
        attention = summary.get("attention") or config.model.attention
        loading = diffattn_loading(summary["model_type"]) if summary.get("model_type") in OUR_TYPES else None
        return {
            "title": f"{config.model.preset} {attention} model (diffattn, from scratch)",
            "summary": f"A `{config.model.preset}` model with `{attention}` attention trained from scratch by "
            f"`diffattn pretrain` ({summary.get('parameters', 0):,} parameters).",
            "method": attention, "options": {"preset": config.model.preset}, "data": data_text, "budget": budget,
            "loading": loading,
        }  # fmt: skip
    name = method.name
    loading = {"adapter": adapter_loading() if name != "lora" else _peft_loading()}.get(form)
    what = {"adapter": "the adapter", "merged": "merged into the base's weights", "final": "the fine-tuned model"}
    return {
        "title": f"{name} on {Path(str(config.model.name)).name} ({form})",
        "summary": f"`{name}` trained by `diffattn adapt` on `{config.model.name}`: {what.get(form, form)}.",
        "base_model": str(config.model.name), "method": name, "options": summary.get("method_config") or {},
        "data": data_text, "budget": budget, "loading": loading,
    }  # fmt: skip


OUR_TYPES = ("diffattn_v2", "diffattn_diff")  # model types transformers learns from `import diffattn`


def _peft_loading() -> str:
    return (
        "A PEFT LoRA adapter:\n\n```python\nfrom peft import PeftModel\n\n"
        'model = PeftModel.from_pretrained(base_model, "<this folder>")\n```'
    )


def _plain_loading() -> str:
    return (
        "```python\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
        'model = AutoModelForCausalLM.from_pretrained("<this folder>")\n'
        'tokenizer = AutoTokenizer.from_pretrained("<this folder>")\n```'
    )


def diffattn_loading(model_type: str) -> str:
    """How to load a checkpoint of a model type that diffattn registers (transformers alone does not know it)."""
    return (
        f"`model_type: {model_type}` is registered by the `diffattn` library, not by transformers:\n\n"
        "```python\nimport diffattn  # registers its model types with the Auto classes\n"
        "from transformers import AutoModelForCausalLM\n\n"
        'model = AutoModelForCausalLM.from_pretrained("<this folder>")\n```'
    )


def adapter_loading() -> str:
    return (
        "A diffattn adapter: load it onto the same base model (its fingerprint is checked):\n\n"
        "```python\nimport diffattn\n\n"
        'model, tokenizer = diffattn.load_pretrained("<base model>")\n'
        'model = diffattn.load_adapter(model, "<this folder>")\n```'
    )


def save_readme(folder, model_type: str, title: str) -> None:
    """A model card that says how to load a checkpoint of one of our model types (transformers' own error for an
    unknown model type suggests upgrading transformers, which does not help)."""
    # never replaces a card the user wrote; a run's fuller card replaces this one later (diffattn.cards)
    write_model_card(
        folder, title=f"{title} (diffattn)", summary=f"A `{model_type}` checkpoint written by diffattn.",
        loading=diffattn_loading(model_type),
    )  # fmt: skip
