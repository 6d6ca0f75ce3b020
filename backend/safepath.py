"""Where a file named by someone else may be written: under the directory the user chose, nowhere else.

A model's file names come from places rtui does not control: the ``rtui_model.json`` marker and the
listing of an S3 prefix (any UTF-8 key up to 1,024 bytes, ``..`` segments, a leading ``/`` and
backslashes included: Amazon S3 user guide, "Naming Amazon S3 objects"), or the listing a reader pod
prints from a volume the job writes to. Every writer of such a file asks ``plan_writes`` first, for
the whole listing at once (``checked_target``), so a bad entry stops the copy before its first byte,
and then writes each file through ``partial_file``: a new ``.part`` (``open_new``, which never follows
a symlink) in directories made one at a time (``make_parents``), renamed into place when complete.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from backend.errors import OperationError, UserError

SEGMENT_BYTES = 255  # NAME_MAX of Linux and macOS file systems: a longer segment cannot be made here


class UnsafeName(UserError):
    """A name from a remote listing that would not land as one plain file under the target dir."""


def shown(name: object) -> str:
    """A name as one printable line: JSON escapes control characters and NUL; long names are cut."""
    text = json.dumps(name, ensure_ascii=True) if isinstance(name, str) else repr(name)
    return text if len(text) <= 120 else text[:117] + "…"


def name_problem(name: object) -> str | None:
    """Why ``name`` is not a plain relative path of ``/``-separated segments, or None when it is."""
    if not isinstance(name, str):
        return "is not a string"
    if not name:
        return "is empty"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    if "\0" in name:
        return "holds a NUL character"
    if any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in name):
        return "holds a control character"
    if "\\" in name:
        return "holds a backslash (a path separator elsewhere)"
    if name.startswith("/"):
        return "is an absolute path"
    segments = name.split("/")
    if ".." in segments:
        return "has a '..' segment"
    if "." in segments:
        return "has a '.' segment"
    if "" in segments:
        return "has an empty segment ('//' or a trailing '/')"
    if any(len(s.encode("utf-8")) > SEGMENT_BYTES for s in segments):
        return f"has a segment longer than {SEGMENT_BYTES} bytes"
    return None


def _refuse(name: object, why: str, source: str, to: Path) -> UnsafeName:
    return UnsafeName(f"refused {source}: its file {shown(name)} {why}; nothing was written to {to}",
                      remedy=f"rtui wrote no such name: check who else writes to {source}")


def _inside(path: Path, root: str) -> bool:
    return os.path.commonpath([os.path.realpath(path), root]) == root


def plan_writes(to: Path, names: Iterable[object], *, source: str) -> dict[str, Path]:
    """Each name of a remote listing -> the path it is written to under ``to``, checked as a whole.

    Refused (``UnsafeName``, one line naming the first bad entry) when a name is not a plain relative
    path (see ``name_problem``), names both a file and a directory, or would be written through a
    symlink that is already under ``to`` (a file, or a directory on its way); and when its resolved
    path is not under ``to``'s. ``to`` itself may be a symlink: the user chose it."""
    listed = list(names)
    for name in listed:
        why = name_problem(name)
        if why is not None:
            raise _refuse(name, why, source, to)
    plain = [str(n) for n in listed]
    parents = {"/".join(n.split("/")[:i]) for n in plain for i in range(1, n.count("/") + 1)}
    for name in plain:
        if name in parents:
            raise _refuse(name, "is listed both as a file and as a directory", source, to)
    root = os.path.realpath(to)
    out: dict[str, Path] = {}
    for name in plain:
        path = to.joinpath(*name.split("/"))
        step = to
        for segment in name.split("/"):
            step = step / segment
            if step.is_symlink():
                raise _refuse(name, f"would be written through the symlink {step} already there", source, to)
        if not _inside(path, root):
            raise _refuse(name, f"resolves outside {to}", source, to)
        out[name] = path
    return out


def make_parents(to: Path, path: Path) -> None:
    """The directories between ``to`` and ``path``, made one at a time; one that is (or became) a
    symlink is refused, so nothing is written through a link made after ``plan_writes`` looked."""
    root = os.path.realpath(to)
    step = to
    for segment in path.relative_to(to).parts[:-1]:
        step = step / segment
        with contextlib.suppress(FileExistsError):
            step.mkdir()
        if step.is_symlink() or not step.is_dir() or not _inside(step, root):
            raise UnsafeName(f"refused to write {path}: {step} is not a directory of its own under {to}",
                             remedy=f"remove {step}, then run it again")


def open_new(path: Path) -> int:
    """A new file at ``path`` for writing (0644 before umask), a descriptor: never through a symlink
    (``O_NOFOLLOW``) and never an existing file (``O_EXCL``): a leftover is removed first, a link
    itself and not what it points to."""
    path.unlink(missing_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    return os.open(path, flags, 0o644)


def checked_target(to: Path, names: object, *, source: str) -> dict[str, Path]:
    """``--to`` made ready for a model's files (``prepare_target``), once every name of ``names`` (a
    marker's ``files``) is known to land under it (``safepath.plan_writes``): name -> its path.
    A bad name stops it before ``--to`` is even made."""
    if not isinstance(names, list):
        raise UnsafeName(f"refused {source}: its marker's file list is not a list; nothing was written to {to}",
                         remedy=f"rtui wrote no such marker: check who else writes to {source}")
    plan_writes(to, names, source=source)  # the names alone, before anything is made
    prepare_target(to)
    return plan_writes(to, names, source=source)  # and the symlinks, now that `to` exists


def already_there(path: Path, size: int) -> bool:
    """A regular file of ``size`` bytes at ``path`` itself (a symlink is never taken for one)."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_size == size


@contextlib.contextmanager
def partial_file(to: Path, name: str, *, doing: str = "writing") -> Iterator[BinaryIO]:
    """Where one file of a copy into ``to`` is written: a new ``.<name>.part`` beside it, opened for
    the block (``safepath.open_new``: never through a symlink), put in place as ``name`` only when the
    block ends cleanly and removed when it fails, so an interrupted copy never leaves a file that
    looks whole (the next copy keeps what is complete and starts this one again). ``name`` must be
    one ``plan_writes`` passed; a disk error becomes one line."""
    why = name_problem(name)
    if why is not None:  # every caller checked the listing first: this is the last guard, not the check
        raise UnsafeName(f"refused to write {shown(name)} under {to}: it {why}")
    final = to.joinpath(*name.split("/"))
    part = final.with_name(f".{final.name}.part")
    try:
        make_parents(to, final)
        fh = os.fdopen(open_new(part), "wb")
    except OSError as exc:
        raise OperationError(f"{doing} {name} to {to} failed: {exc.strerror or exc}",
                             remedy="check that you may write there (or pick another --to) and run it again; "
                                    "files already copied are kept") from None
    try:
        with fh:
            yield fh
    except OSError as exc:
        part.unlink(missing_ok=True)
        raise OperationError(f"{doing} {name} to {to} failed: {exc.strerror or exc}",
                             remedy="free some space there (or pick another --to) and run it again; "
                                    "files already copied are kept") from None
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    os.replace(part, final)  # a symlink that appeared at `final` meanwhile is replaced, never followed


def prepare_target(to: Path) -> None:
    """``--to`` must be a directory we can write (made if missing), and not another model's files."""
    if to.exists() and not to.is_dir():
        raise UserError(f"--to {to} is a file, not a directory", remedy="give a directory (it is made if missing)")
    try:
        to.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--to {to}: cannot make the directory ({exc.strerror or exc})",
                        remedy="pick a directory you can write") from None
    if not os.access(to, os.W_OK | os.X_OK):
        raise UserError(f"--to {to} is not writable by you", remedy="pick a directory you can write")
