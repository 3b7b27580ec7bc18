"""The README's documented defaults are the code's: every "`field` = `value` (default" in a table row of a config
class (`| `XConfig` ...`) is that dataclass field's default (the README once said DAA's default was pre-RoPE while
the code said post-RoPE)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import diffattn

README = Path(__file__).resolve().parents[1] / "README.md"
ROW = re.compile(r"^\| `(\w+Config)`")
DEFAULT = re.compile(r"`(\w+)` = `([^`]+)` \(default")


def _documented() -> list[tuple[str, str, str]]:
    found = []
    for line in README.read_text().splitlines():
        row = ROW.match(line)
        if row:
            pairs = DEFAULT.findall(line)
            # a default stated any other way cannot be checked: the README must say which field it is
            assert line.count("(default") == len(pairs), f"unchecked default in the README row of {row.group(1)}"
            found += [(row.group(1), field, value) for field, value in pairs]
    return found


def test_every_documented_default_is_the_codes():
    documented = _documented()
    assert len(documented) >= 5, "the README's adapter table lost its documented defaults"
    for cls_name, field, value in documented:
        cls = getattr(diffattn, cls_name)
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        assert field in defaults, f"README documents {cls_name}.{field}, which does not exist"
        assert str(defaults[field]) == value, f"README: {cls_name}.{field} = {value}; code: {defaults[field]!r}"
