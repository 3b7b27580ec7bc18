"""Model cards: Hub-format README.md (YAML metadata + text) for the folders diffattn writes; a missing field is left
out, and a card the user wrote is never replaced."""

from __future__ import annotations

import yaml

from diffattn.cards import CARD_MARK, adapter_loading, write_model_card


def _front_matter(path) -> dict:
    text = path.read_text()
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n")[1])


def test_a_card_has_the_hubs_metadata_and_the_runs_facts(tmp_path):
    path = write_model_card(
        tmp_path, title="Dex on SmolLM2-135M", summary="Differential extension (Dex).", base_model="smollm2-135m",
        method="dex", options={"heads": "entropy", "k": None}, data="shakespeare + 25% needle rows",
        budget="40 steps x 4 x 256 tokens", headline={"PPL": 21.5, "NIAH R=1 solved": 0.61}, loading=adapter_loading(),
    )  # fmt: skip
    meta = _front_matter(path)
    assert meta["base_model"] == "HuggingFaceTB/SmolLM2-135M" and meta["license"] == "apache-2.0"
    assert meta["library_name"] == "transformers" and {"diffattn", "dex"} <= set(meta["tags"])
    text = path.read_text()
    assert CARD_MARK in text and "`heads`: `entropy`" in text and "`k`" not in text  # None: left out
    assert "| NIAH R=1 solved | 0.61 |" in text and "load_adapter" in text


def test_missing_fields_are_left_out_and_a_users_card_is_kept(tmp_path):
    path = write_model_card(tmp_path / "a", title="quick Transformer", summary="From scratch.")
    meta = _front_matter(path)
    assert "base_model" not in meta and "license" not in meta and "datasets" not in meta
    text = path.read_text()
    assert "## Training" not in text and "## Evaluation" not in text and "from_pretrained" in text
    write_model_card(tmp_path / "a", title="again", summary="ours is replaced")
    assert "ours is replaced" in path.read_text()
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "README.md").write_text("my notes")
    assert write_model_card(tmp_path / "b", title="t", summary="s") is None
    assert (tmp_path / "b" / "README.md").read_text() == "my notes"
