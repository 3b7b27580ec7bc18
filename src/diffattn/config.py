"""One config mechanism for every YAML file the library reads and writes — ``run.yaml`` of ``diffattn pretrain`` and
``diffattn adapt`` (:mod:`diffattn.train.config`, :mod:`diffattn.train.adapt`) and experiment files
(:mod:`diffattn.experiments.config`): dataclasses built from mappings by :func:`from_dict`, with one error format
for every file, and :class:`YamlConfig` for the YAML round trip and ``--set a.b=value`` overrides.

Error format (each a one-line ``ValueError`` naming the place in the file):

* ``{where} must be a mapping, got {type}``
* ``unknown key(s) {keys} in {where} ({dotted keys}); allowed in {where}: {fields}``
* ``{where} is missing {fields}``
* ``{where}.{field} must be an integer / a number / true or false / a string / a mapping, got {value}``
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path

import yaml

from .files import read_yaml


def from_dict(cls, d, where: str = ""):
    """Build dataclass ``cls`` from mapping ``d``: unknown keys refused, missing required fields named, nested
    dataclass fields (and lists of them) built recursively, scalars checked against their type (ints for int
    fields, floats accept ints); unions and other types are left to the dataclass's own validation."""
    label = where or "the top level"
    if not isinstance(d, dict):
        raise ValueError(f"{where or 'config'} must be a mapping, got {type(d).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(d) - set(fields))
    if unknown:
        dotted = [_join(where, k) for k in unknown]
        shown = f" ({', '.join(dotted)})" if dotted != unknown else ""
        raise ValueError(
            f"unknown key(s) {', '.join(unknown)} in {label}{shown}; allowed in {label}: {', '.join(fields)}"
        )
    missing = [
        n
        for n, f in fields.items()
        if n not in d and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ValueError(f"{where or 'the config'} is missing {', '.join(missing)}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, value in d.items():
        kwargs[name] = _build(value, hints[name], _join(where, name))
    return cls(**kwargs)


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _build(value, hint, name: str):
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value or {}, name)
    item = _list_item_type(hint)
    if item is not None and dataclasses.is_dataclass(item):
        value = [] if value is None else value
        if not isinstance(value, list):
            raise ValueError(f"{name} must be a list, got {value!r}")
        return [from_dict(item, v, f"{name}[{i}]") for i, v in enumerate(value)]
    return coerce(value, hint, name)


def _list_item_type(hint):
    if typing.get_origin(hint) is list:
        args = typing.get_args(hint)
        return args[0] if args else None
    return None


_DECIMAL = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def coerce(value, hint, name: str):
    """A YAML/CLI value checked against the field's type: ints for int fields, floats accept ints, clear errors."""
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ValueError(f"{name} must be true or false, got {value!r}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        number = _yaml_float(value, hint)
        if isinstance(number, float):
            return number
        raise ValueError(f"{name} must be a number, got {value!r}")
    if hint is str:
        if isinstance(value, str):
            return value
        raise ValueError(f"{name} must be a string, got {value!r}")
    if hint is dict:
        if isinstance(value, dict):
            return value
        raise ValueError(f"{name} must be a mapping, got {value!r}")
    return _yaml_float(value, hint)  # unions such as str | float: 1e-2 a number here too, the rest as given, and
    # validated by the dataclass


def _yaml_float(value, hint):
    """``value`` as a float where it is a string YAML 1.1 left unread — it reads 1e-2 (an exponent without a dot) as
    a string, in a config file as after ``--set`` — and the field ``hint`` takes a float (``float``, ``str | float``,
    ``float | None``); else ``value`` as given."""
    takes_float = hint is float or (
        typing.get_origin(hint) in (typing.Union, types.UnionType) and float in typing.get_args(hint)
    )
    if takes_float and isinstance(value, str) and _DECIMAL.fullmatch(value.strip()):
        return float(value)
    return value


def yaml_floats(options: dict, cls) -> dict:
    """``options`` for the dataclass ``cls`` (a method's config), each string a field that takes a float would have
    read as a number had YAML 1.1 known the form (``gate_init: 2e-2``) turned into that number; the rest as given,
    for the dataclass to check."""
    hints = typing.get_type_hints(cls)
    return {key: _yaml_float(value, hints.get(key)) for key, value in options.items()}


def check_keys(d: dict, cls, where: str) -> None:
    """Refuse keys of ``d`` that are not fields of ``cls`` (for option mappings checked against a dataclass that is
    built later, e.g. an experiment's eval options), in the same words as :func:`from_dict`."""
    allowed = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(d) - set(allowed))
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(unknown)} in {where}; allowed in {where}: {', '.join(allowed)}")


def set_dotted(d: dict, dotted: str, value) -> None:
    """Set ``a.b.c = value`` in a nested mapping; list items by index (``models.0.preset``); missing mappings are
    made."""
    keys = dotted.split(".")
    node = d
    for depth, key in enumerate(keys[:-1]):
        if isinstance(node, list):
            if not key.isdigit() or int(key) >= len(node):
                raise ValueError(f"--set {dotted}: {'.'.join(keys[: depth + 1])} is not an item of the list")
            node = node[int(key)]
        elif isinstance(node, dict):
            node = node.setdefault(key, {})
        else:
            raise ValueError(f"--set {dotted}: {'.'.join(keys[:depth])} is not a section")
    if isinstance(node, list):
        raise ValueError(f"--set {dotted}: cannot set a key inside a list; give an index")
    if not isinstance(node, dict):
        raise ValueError(f"--set {dotted}: {'.'.join(keys[:-1])} is a value ({node!r}), not a section")
    node[keys[-1]] = value


class YamlConfig:
    """YAML round trip and dotted overrides for a config dataclass; ``from_dict`` builds it (:func:`from_dict` by
    default, which a subclass may extend)."""

    WHAT = "config file"  # how errors name the file

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict):
        return from_dict(cls, d)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))

    @classmethod
    def load(cls, path: str | Path):
        data = read_yaml(path, cls.WHAT) or {}
        if not isinstance(data, dict):
            sections = ", ".join(f.name for f in dataclasses.fields(cls))
            raise ValueError(
                f"{cls.WHAT} {str(path)!r} must be a mapping: it must hold a mapping with sections {sections}, "
                f"not a {type(data).__name__}"
            )
        return cls.from_dict(data)

    def with_overrides(self, overrides: dict[str, object]):
        """Apply dotted overrides such as ``{"train.max_steps": 10}`` (checked like YAML values)."""
        d = self.to_dict()
        for dotted, value in overrides.items():
            self._set(d, dotted, value)
        return type(self).from_dict(d)

    def _set(self, d: dict, dotted: str, value: object) -> None:
        set_dotted(d, dotted, value)
