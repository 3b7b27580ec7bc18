"""The ``diffattn`` console script (pyproject.toml) and ``python -m diffattn``: the command line (:mod:`diffattn.cli`)
imported under a Ctrl-C guard, so an interrupt while it loads is one line and exit status 130, as everywhere after
(issue 36 §9). Only the import of the light package ``diffattn`` itself and of this module comes before the guard."""

from __future__ import annotations

import sys


def main() -> int:
    try:
        from .cli import main as command_line
    except KeyboardInterrupt:
        print("diffattn: interrupted", file=sys.stderr)
        return 130
    return command_line()
