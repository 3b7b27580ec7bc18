"""JSON Schema of an experiment's ``results.json`` (what :func:`diffattn.experiments.report.write_report` writes).

Tools reading results across experiments can rely on these keys; :func:`validate_results` checks a document
(needs the ``jsonschema`` package, installed with the test extra).
"""

from __future__ import annotations

NUMBER_OR_NULL = {"type": ["number", "null"]}
INTERVAL_OR_NULL = {
    "oneOf": [{"type": "null"}, {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2}]
}

RESULTS_SCHEMA: dict = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "diffattn experiment results",
    "type": "object",
    "required": ["experiment", "models", "parts", "claims", "evaluations", "config", "environment"],
    "properties": {
        "experiment": {"type": "string", "minLength": 1},
        "models": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["model"],
                "properties": {
                    "model": {"type": "string"},
                    "kind": {"type": "string"},
                    "parameters": {"type": ["integer", "null"]},
                    "trainable": {"type": ["integer", "null"]},
                    "steps": {"type": ["integer", "null"]},
                    "val_loss": NUMBER_OR_NULL,
                    "tokens_per_s": NUMBER_OR_NULL,
                    "train_seconds": NUMBER_OR_NULL,
                },
                "additionalProperties": {"type": ["number", "string", "null"]},
            },
        },
        "parts": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["kind", "name", "state", "seconds"],
                "properties": {
                    "kind": {"enum": ["pretrain", "adapt", "lr-grid", "eval"]},
                    "name": {"type": "string"},
                    "state": {"enum": ["done", "resume", "fresh"]},
                    "seconds": {"type": "number", "minimum": 0},
                },
            },
        },
        "claims": {
            "type": "array",
            "items": {
                "type": "object",
                "required": [
                    "source",
                    "claim",
                    "paper",
                    "ours",
                    "difference",
                    "interval",
                    "verdict",
                    "claimed",
                    "ref",
                    "new",
                    "metric",
                ],
                "properties": {
                    "source": {"type": "string"},
                    "claim": {"type": "string"},
                    "paper": {"type": "string"},
                    "ours": {"type": "string"},  # "ref → new: metric value [95% CI] → value [95% CI]"
                    "difference": {"type": "string"},  # new − ref with its 95% CI, or "–"
                    "interval": {"type": "string"},  # what kind of interval (or why there is none)
                    "verdict": {"enum": ["agrees", "disagrees", "inconclusive"]},
                    "claimed": {"enum": ["higher", "lower"]},
                    "ref": {"type": "string"},
                    "new": {"type": "string"},
                    "metric": {"type": "string"},
                    "ref_value": NUMBER_OR_NULL,
                    "new_value": NUMBER_OR_NULL,
                    "diff_value": NUMBER_OR_NULL,
                    "ref_ci": INTERVAL_OR_NULL,
                    "new_ci": INTERVAL_OR_NULL,
                    "diff_ci": INTERVAL_OR_NULL,
                    "note": {"type": "string"},
                },
            },
        },
        "claims_scope": {"type": "string"},
        "evaluations": {"type": "object", "additionalProperties": {"type": "object"}},
        "config": {"type": "object", "required": ["name", "models", "adapters", "eval"]},
        "environment": {"type": "object", "required": ["python", "torch", "transformers", "device"]},
    },
}


def validate_results(doc: dict) -> None:
    """Raise ``jsonschema.ValidationError`` if ``doc`` does not follow :data:`RESULTS_SCHEMA`."""
    import jsonschema

    jsonschema.validate(doc, RESULTS_SCHEMA)
