"""What diffattn may delete, and how it replaces a finished result: the one home of the file-safety rules.

* Every folder diffattn makes for a run, an evaluation or an experiment holds a marker file, :data:`MARKER`,
  naming what made it (an export has its own: :func:`diffattn.experiments.report.export_report`).
  ``--overwrite`` deletes only such a folder, never a symbolic link, the working folder, one of its parents,
  the home folder or ``/`` (:func:`check_removable`). A folder without the marker is a user's, whatever it holds.
* A finished result is never deleted before its replacement exists: the new one is written under a temporary name
  beside it and renamed over it (:func:`publish_folder`, :func:`write_text_atomic`), so an exception at any
  point leaves the old result or the new one, complete. (A folder is replaced with two renames: a process killed
  between them leaves the old copy in ``.NAME.old-*/NAME`` beside it.)
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

RUN_CONFIG = "run.yaml"  # every run folder's config (pretrain and adapt runs)
MARKER = ".diffattn"  # JSON: {"kind": run | eval | experiment | export, ...}; its presence makes a folder ours


class UnsafeDeleteError(ValueError):
    """A folder diffattn was asked to delete or replace is not one it made, or is a folder no tool should delete."""


def mark(folder: str | os.PathLike, kind: str, **info) -> Path:
    """Create ``folder`` (and parents) if needed and record that diffattn made it, for what."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    write_text_atomic(folder / MARKER, json.dumps({"kind": kind, **info}) + "\n")
    return folder


def marker(folder: str | os.PathLike) -> dict | None:
    """The marker's contents, or ``None`` for a folder diffattn did not make (or that does not exist)."""
    f = Path(folder) / MARKER
    if not f.is_file():
        return None
    try:
        data = json.loads(f.read_text() or "{}")
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def why_protected(folder: str | os.PathLike) -> str | None:
    """Why no tool should delete ``folder`` whatever it holds, or ``None``."""
    resolved = Path(folder).resolve()
    cwd = Path.cwd().resolve()
    if resolved == Path(resolved.anchor):
        return "it is the file-system root"
    if resolved == Path.home().resolve():
        return "it is the home folder"
    if resolved == cwd or resolved in cwd.parents:
        return "it is the working folder or one of its parents"
    return None


def check_removable(folder: str | os.PathLike, *, what: str = "--overwrite") -> None:
    """Raise :class:`UnsafeDeleteError` unless ``folder`` may be deleted: it does not exist, is empty, or holds
    :data:`MARKER` — and is not a protected folder (root, home, the working folder or a parent of it)."""
    folder = Path(folder)
    if folder.is_symlink():
        raise UnsafeDeleteError(f"{what}: {str(folder)!r} is a symbolic link; name the folder itself, not a link to it")
    if not folder.exists():
        return
    if not folder.is_dir():
        raise UnsafeDeleteError(f"{what}: {str(folder)!r} is a file, not a folder diffattn made; choose another path")
    reason = why_protected(folder)
    if reason:
        raise UnsafeDeleteError(f"{what} refuses to delete {str(folder)!r}: {reason}; choose another folder")
    if marker(folder) is None and any(folder.iterdir()):
        raise UnsafeDeleteError(
            f"{what} refuses to delete {str(folder)!r}: diffattn did not make it (it has no {MARKER} file), so it "
            "may hold someone's files; choose another folder, or delete it yourself if you are sure"
        )


def remove_folder(folder: str | os.PathLike, *, what: str = "--overwrite") -> None:
    """Delete a folder diffattn made (checked by :func:`check_removable` first)."""
    check_removable(folder, what=what)
    if Path(folder).exists():
        shutil.rmtree(folder)


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename: a reader sees the old
    contents or the new, never a part."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # what a plain open() would give; mkstemp makes 0600
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def publish_folder(tmp: str | os.PathLike, final: str | os.PathLike) -> Path:
    """Move the finished folder ``tmp`` to ``final``, replacing an earlier ``final`` only once ``tmp`` is in place
    (the earlier one is renamed aside first and put back if the move fails)."""
    tmp, final = Path(tmp), Path(final)
    old = None
    if final.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=final.parent)) / final.name
        os.replace(final, old)
    try:
        os.replace(tmp, final)
    except BaseException:
        if old is not None:
            os.replace(old, final)
        raise
    if old is not None:
        shutil.rmtree(old.parent)
    return final


def is_inside(path: str | os.PathLike, folder: str | os.PathLike) -> bool:
    """True when ``path`` is ``folder`` or lies inside it (after resolving links)."""
    p, f = Path(path).resolve(), Path(folder).resolve()
    return p == f or f in p.parents


def read_yaml(path: str | os.PathLike, what: str = "file"):
    """A YAML file's contents, with one clear ``ValueError`` for a missing, binary or malformed file."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{what} {str(path)!r} does not exist" + (" (it is a folder)" if path.is_dir() else ""))
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"{what} {str(path)!r} is not text ({e.reason})") from e
    except yaml.YAMLError as e:
        raise ValueError(f"{what} {str(path)!r} is not valid YAML: {' '.join(str(e).split())}") from e
