"""What diffattn may delete, and how it replaces a finished result: the one home of the file-safety rules.

* Every folder diffattn makes for a run, an evaluation or an experiment holds a marker file, :data:`MARKER`
  (JSON: its kind and a random identity; an export has its own: :func:`diffattn.experiments.report.export_report`).
  A marker alone proves nothing — an empty or copied one is easy to come by — so a folder that is deleted must
  also repeat the marker's identity in its own record (:data:`RECORDS`: ``run.yaml`` of a run, ``experiment.yaml``
  of an experiment; :func:`save_record`). ``--overwrite`` deletes only a folder of the asked kind whose marker and
  record agree (:func:`proof_problem`), never a symbolic link, the working folder, one of its parents, the home
  folder or ``/`` (:func:`check_removable`). A folder whose marker records no identity may be resumed or
  skipped, but nothing proves what it holds: only a person deletes it.
* A run holds its folder's lock (:data:`LOCK`, ``flock``: released when the process ends, however it ends) from
  its first write to its end (:func:`lock_folder`), so a second run into the same folder is refused, naming the
  first, instead of replacing it.
* A finished result is never deleted before its replacement exists: the new one is written under a temporary name
  beside it and renamed over it (:func:`publish_folder`, :func:`write_text_atomic`), so an exception at any
  point leaves the old result or the new one, complete. (A folder is replaced with two renames: a process killed
  between them leaves the old copy in ``.NAME.old-*/NAME`` beside it.)
* A single **file** diffattn replaces in a folder it does not own whole (an export's ``report.md``, a run's
  ``report.md`` beside its parts) is replaced only while its SHA-256 is one diffattn recorded writing there, or it
  already holds the new text (:func:`overwrite_problem`): a note a user appended, a link, a folder, or a file no
  record names is refused by name; an earlier version's record without checksums licenses nothing.
* A write that fails because the device is full (however the writing library says so: ``ENOSPC``, torch's zip
  writer's ``[enforce fail at inline_container.cc]``, safetensors' ``os error 28``) is one :class:`NoSpaceError`
  naming what was being written and where, and what is intact (:func:`writing`).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import secrets
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: folders are not locked
    fcntl = None

logger = logging.getLogger(__name__)

RUN_CONFIG = "run.yaml"  # every run folder's config (pretrain and adapt runs)
MARKER = ".diffattn"  # JSON: {"kind": run | eval | experiment, "id": random hex, ...}; see the module doc
LOCK = ".diffattn.lock"  # held (flock) by the process writing into the folder; JSON: who holds it
BOOKKEEPING = frozenset({MARKER, LOCK})  # a folder holding only these holds nothing of anyone's
RECORDS = {"run": RUN_CONFIG, "experiment": "experiment.yaml"}  # the file of each kind that repeats the marker's id
ID_LINE = "# diffattn-id: "  # how a record (a YAML file) repeats its folder's identity: a comment, ignored on load


class UnsafeDeleteError(ValueError):
    """A folder diffattn was asked to delete or replace is not one it made, or is a folder no tool should delete."""


class FolderInUseError(ValueError):
    """Another process holds the folder's lock (a run is writing into it)."""


class NoSpaceError(OSError):
    """The device filled up while diffattn wrote something; its message names what, where, and what is intact."""


# how the libraries diffattn writes through report a write that failed: torch.save's zip writer
# (PytorchStreamWriter: "[enforce fail at inline_container.cc:NNN] . unexpected pos" / "file write failed"), the OS
# and safetensors' Rust writer ("No space left on device (os error 28)"), a quota ("Disk quota exceeded")
_SAYS_NO_SPACE = ("No space left on device", "os error 28", "Disk quota exceeded", "os error 122")
_SAYS_WRITE_FAILED = ("inline_container.cc", "file write failed", "PytorchStreamWriter failed")
_NEARLY_FULL_BYTES = 64 * 2**20  # a generic write failure with less free than this is taken as a full device


def _free_bytes(path: Path) -> int | None:
    for folder in (path, *path.parents):
        if folder.exists():
            try:
                return shutil.disk_usage(folder).free
            except OSError:
                return None
    return None


def out_of_space(error: BaseException, target: str | os.PathLike) -> bool:
    """Whether ``error`` (raised while writing under ``target``) means the device is full: ENOSPC / EDQUOT, a
    library's text for it, or a library's generic write failure with (almost) no space left where it wrote."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(error)
    if any(s in text for s in _SAYS_NO_SPACE):
        return True
    if any(s in text for s in _SAYS_WRITE_FAILED):
        free = _free_bytes(Path(target))
        return free is not None and free < _NEARLY_FULL_BYTES
    return False


@contextmanager
def writing(target: str | os.PathLike, what: str, intact: str) -> Iterator[None]:
    """Run a write of ``what`` under ``target``; if the device fills up, raise one :class:`NoSpaceError` that says
    so, names ``target`` and says what is ``intact`` (e.g. "the checkpoints before it are kept: free space and
    continue with --resume") instead of the writing library's own words. The caller removes its partial copy."""
    try:
        yield
    except NoSpaceError:
        raise
    except Exception as e:
        if not out_of_space(e, target):
            raise
        message = f"no space left on the device while writing {what} ({target}); nothing finished was lost: {intact}"
        raise NoSpaceError(errno.ENOSPC, message) from e


def file_sha256(path: str | os.PathLike) -> str | None:
    """A regular file's SHA-256; ``None`` for a missing file, a link or a folder."""
    import hashlib

    path = Path(path)
    if path.is_symlink() or not path.is_file():
        return None
    return hashlib.sha256(path.read_bytes()).hexdigest()


def overwrite_problem(
    path: str | os.PathLike, recorded, *, new_sha256: str | None = None, writer: str = "diffattn"
) -> str | None:
    """Why ``writer`` may not replace the file at ``path`` (a phrase), or None when it may: nothing is there, it
    already holds the new contents (``new_sha256``), or its SHA-256 is one of ``recorded`` — the checksums ``writer``
    recorded when it wrote there. ``recorded`` None: nothing says ``writer`` wrote it; empty: an earlier version's
    record, which kept no checksums, so an edit cannot be told and it licenses nothing."""
    path = Path(path)
    if not (path.exists() or path.is_symlink()):
        return None
    have = file_sha256(path)
    if have is None:
        return "a link or a folder"
    if have == new_sha256:
        return None  # the same contents: nothing is lost
    if recorded is None:
        return f"not written by {writer}"
    if not recorded:
        return f"written by an earlier {writer}, which recorded no checksum: an edit cannot be told"
    if have not in recorded:
        return f"changed since {writer} wrote it"
    return None


def dangling_link(path: str | os.PathLike, what: str, remedy: str) -> str | None:
    """The refusal for a destination ``path`` that is a symbolic link to nowhere (creating the folder would say only
    "File exists"), naming ``what`` it is and where the link points; None otherwise."""
    path = Path(path)
    if path.is_symlink() and not path.exists():
        return f"{what} {str(path)!r} is a symbolic link to {os.readlink(path)!r}, which does not exist: {remedy}"
    return None


def new_id() -> str:
    """A fresh random identity for a folder's marker and record."""
    return secrets.token_hex(16)


def mark(folder: str | os.PathLike, kind: str, *, ident: str | None = None, **info) -> Path:
    """Create ``folder`` (and parents) if needed and record that diffattn made it, for what, with identity
    ``ident`` (a new one by default). A kind with a record (:data:`RECORDS`) is provably ours only once that
    record repeats the identity (:func:`save_record`)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    write_text_atomic(folder / MARKER, json.dumps({"kind": kind, "id": ident or new_id(), **info}) + "\n")
    return folder


def marker(folder: str | os.PathLike) -> dict | None:
    """The marker's contents, or ``None`` for a folder diffattn did not make (or that does not exist); ``{}`` for
    a marker diffattn did not write (empty, not JSON, not a mapping)."""
    f = Path(folder) / MARKER
    if not f.is_file():
        return None
    try:
        data = json.loads(f.read_text() or "{}")
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def recorded_id(path: str | os.PathLike) -> str | None:
    """The identity a record file repeats (its last :data:`ID_LINE`), or ``None``."""
    path = Path(path)
    if path.is_symlink() or not path.is_file():
        return None
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    ids = [line[len(ID_LINE) :].strip() for line in lines if line.startswith(ID_LINE)]
    return ids[-1] if ids else None


def save_record(config, path: str | os.PathLike, ident: str) -> Path:
    """Save ``config`` (``config.save``) to ``path`` with the folder's identity as a trailing comment, atomically."""

    def write(tmp: Path) -> None:
        config.save(tmp)
        with open(tmp, "a", encoding="utf-8") as f:
            f.write(f"{ID_LINE}{ident}\n")

    return _replace_via_temp(path, write)


def proof_problem(folder: str | os.PathLike, kind: str) -> str | None:
    """Why nothing proves that diffattn made ``folder`` as a ``kind`` folder, or ``None`` when it does: its marker
    (of that kind, with an identity) and its record (:data:`RECORDS`) name the same identity."""
    folder = Path(folder)
    made = marker(folder)
    if made is None:
        return f"diffattn did not make it (it has no {MARKER} file), so it may hold someone's files"
    if not isinstance(made.get("kind"), str):
        return f"its {MARKER} file is not one diffattn wrote (empty or not diffattn's form)"
    if made["kind"] != kind:
        return f"it is a diffattn {made['kind']} folder, not a {kind} folder"
    ident = made.get("id")
    if not isinstance(ident, str) or not ident:
        return f"its {MARKER} file records no identity, so nothing proves the folder holds only what diffattn wrote"
    record = RECORDS.get(kind)
    if record is None:
        return f"diffattn never deletes a {kind} folder"
    if recorded_id(folder / record) != ident:
        return f"its {MARKER} file and its {record} do not name the same {kind} (a copied or hand-made marker?)"
    return None


def claim_id(folder: str | os.PathLike, kind: str) -> str:
    """The identity to keep writing a ``kind`` folder under: its own when its marker and record agree, else new."""
    made = marker(folder) or {}
    return made["id"] if proof_problem(folder, kind) is None else new_id()


def contents(folder: str | os.PathLike) -> list[Path]:
    """What ``folder`` holds besides diffattn's bookkeeping (marker, lock); ``[]`` when it does not exist."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return [p for p in folder.iterdir() if p.name not in BOOKKEEPING]


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


def check_removable(folder: str | os.PathLike, *, kind: str, what: str = "--overwrite") -> None:
    """Raise :class:`UnsafeDeleteError` unless ``folder`` may be emptied to hold a new ``kind`` folder: it does not
    exist, holds nothing but diffattn's bookkeeping, or is provably diffattn's ``kind`` folder
    (:func:`proof_problem`) — and is not a protected folder (root, home, the working folder or a parent of it)."""
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
    if not contents(folder):
        return
    problem = proof_problem(folder, kind)
    if problem:
        raise UnsafeDeleteError(
            f"{what} refuses to delete {str(folder)!r}: {problem}; choose another folder, or delete it yourself if "
            "you are sure"
        )


def empty_folder(folder: str | os.PathLike, *, kind: str, what: str = "--overwrite") -> None:
    """Delete what a ``kind`` folder diffattn made holds (checked by :func:`check_removable` first), keeping the
    folder and its lock file (held by the caller). The record and the marker go last, so a process killed midway
    leaves a folder that is still provably ours."""
    check_removable(folder, kind=kind, what=what)
    folder = Path(folder)
    last = [RECORDS.get(kind), MARKER]
    entries = sorted(contents(folder), key=lambda p: p.name in last)
    for p in [*entries, folder / MARKER]:
        if p.is_symlink() or p.is_file():
            p.unlink(missing_ok=True)
        elif p.is_dir():
            shutil.rmtree(p)


# ---------------------------------------------------------------- the lock a run holds on its folder

_HELD: dict[str, int] = {}  # resolved folder -> the open, locked file descriptor of its lock file


def _key(folder: Path) -> str:
    return str(folder.resolve())


def _describe(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        info = {}
    if not isinstance(info, dict) or "pid" not in info:
        return "another diffattn process (it has not said which yet)"
    what = f" ({info['command']})" if info.get("command") else ""
    return f"diffattn process {info['pid']} on {info.get('host', '?')}{what}, since {info.get('since', '?')}"


def lock_holder(folder: str | os.PathLike) -> str | None:
    """Who holds ``folder``'s lock (another process, or another lock in this one), or ``None`` when no one does.
    Creates nothing."""
    folder = Path(folder)
    f = folder / LOCK
    if fcntl is None or f.is_symlink() or not f.is_file() or _key(folder) in _HELD:
        return None
    try:
        fd = os.open(f, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return _describe(fd)
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def lock_folder(folder: str | os.PathLike, **info) -> None:
    """Create ``folder`` if needed and take its lock for this process (kept until :func:`release_folder` or the
    process's end, however it ends; taking it again in the same process is a no-op). Raises
    :class:`FolderInUseError`, naming the holder, when another process holds it."""
    folder = Path(folder)
    if fcntl is None or _key(folder) in _HELD:
        return
    folder.mkdir(parents=True, exist_ok=True)
    while True:
        try:
            fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o666)
        except OSError as e:
            raise FolderInUseError(
                f"cannot lock {str(folder)!r}: {folder / LOCK} cannot be opened ({e.strerror})"
            ) from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe(fd)
            os.close(fd)
            raise FolderInUseError(
                f"{str(folder)!r} is in use by {holder}: wait for it to finish, or choose another folder"
            ) from None
        if _still_the_lock_file(fd, folder / LOCK):
            break
        os.close(fd)  # its holder removed it (locked() does, on leaving) between our open and flock: take the new one
    since = time.strftime("%Y-%m-%d %H:%M:%S")
    text = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": since, **info}) + "\n"
    os.ftruncate(fd, 0)
    os.pwrite(fd, text.encode(), 0)
    _HELD[_key(folder)] = fd


def _still_the_lock_file(fd: int, path: Path) -> bool:
    try:
        here, there = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


@contextmanager
def locked(folder: str | os.PathLike, **info) -> Iterator[None]:
    """:func:`lock_folder` for the duration of a ``with`` block, released at its end (unless this process held the
    lock already: then the outer holder releases it). The lock file it made is removed on leaving (while still held;
    :func:`lock_folder` retries when the file it locked was removed meanwhile), and a folder it made that holds
    nothing else is removed too, so a refused or failed write leaves no trace and an exported folder no lock file.
    (pretrain, adapt and eval hold :func:`lock_folder` across their stages; run, export and refresh use this.)"""
    folder = Path(folder)
    made_folder = not folder.exists()
    made_file = made_folder or not (folder / LOCK).exists()
    held_before = fcntl is None or _key(folder) in _HELD
    lock_folder(folder, **info)
    try:
        yield
    finally:
        if not held_before:
            if made_file:
                (folder / LOCK).unlink(missing_ok=True)  # still held here: whoever opened it retries on the new one
            release_folder(folder)
            if made_folder and not any(folder.iterdir()):
                with suppress(OSError):  # something arrived meanwhile: it stays
                    folder.rmdir()


def release_folder(folder: str | os.PathLike) -> None:
    """Give up ``folder``'s lock if this process holds it (the lock file stays: removing it would let two
    processes lock two different files)."""
    fd = _HELD.pop(_key(Path(folder)), None)
    if fd is not None:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


# ---------------------------------------------------------------- atomic replacement


def _replace_via_temp(path: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Write ``path`` through a temporary file in the same folder (``write(tmp)``) and a rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        try:
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(fd, 0o666 & ~umask)  # what a plain open() would give; mkstemp makes 0600
        finally:
            os.close(fd)
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename: a reader sees the old
    contents or the new, never a part."""
    return _replace_via_temp(path, lambda tmp: tmp.write_text(text))


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
