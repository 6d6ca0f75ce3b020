"""Ray's working-dir and py_modules package format (Ray 2.58's ``_private/runtime_env/packaging.py``),
reimplemented so Ray need not be installed where rtui runs: the zip and its ``gcs://_ray_pkg_<hash>.zip``
name, the same for the same content, so a package Ray's own SDK uploaded is found and not sent again.
``backend.jobsapi`` uploads it."""

from __future__ import annotations

import contextlib
import hashlib
import io
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath

# Ray 2.58's RAY_RUNTIME_ENV_DEFAULT_EXCLUDES: the same set gives the same package hash, so a
# package Ray's own SDK uploaded is found and not sent again.
DEFAULT_EXCLUDES = (".git", ".venv", "venv", "__pycache__")


def _excluded(rel: PurePosixPath, excludes: Sequence[str]) -> bool:
    """Ray matches gitignore-style patterns; a bare name (all of Ray's defaults) matches that
    name at any depth, a pattern with a slash matches the path from the package root.
    Ray also reads .gitignore/.rayignore files; this does not."""
    for pattern in excludes:
        if "/" in pattern.rstrip("/"):
            if fnmatch(str(rel), pattern.strip("/")):
                return True
        elif fnmatch(rel.name, pattern.rstrip("/")):
            return True
    return False


def _walk(root: Path, excludes: Sequence[str]) -> Iterator[Path]:
    """The root and every path under it that is not excluded, parents before children."""
    stack = [root]
    while stack:
        path = stack.pop()
        if path != root and _excluded(PurePosixPath(path.relative_to(root).as_posix()), excludes):
            continue  # an excluded directory hides everything under it
        yield path
        if path.is_dir():
            stack.extend(path.iterdir())


def _path_hash(path: Path, root: Path) -> bytes:
    digest = hashlib.sha1(str(path.relative_to(root)).encode())  # noqa: S324 - Ray's naming, not security
    if not path.is_dir():
        with contextlib.suppress(OSError), path.open("rb") as f:
            while data := f.read(4 * 1024 * 1024):
                digest.update(data)
    return digest.digest()


def _xor(left: bytes, right: bytes) -> bytes:
    return bytes(a ^ b for a, b in zip(left, right, strict=False))


def package_uri(root: Path, excludes: Sequence[str] = DEFAULT_EXCLUDES,
                extra: Mapping[str, bytes] | None = None) -> str:
    """``gcs://_ray_pkg_<hash>.zip``, the hash as Ray computes it: the XOR of the SHA-1 of each
    path's name (and a file's content), folded into 8 bytes that start as ``b"0" * 8``; ``extra``:
    files added at the package root (name -> content), hashed the same way."""
    root = root.absolute()
    acc = b"0" * 8
    for path in _walk(root, excludes):
        acc = _xor(acc, _path_hash(path, root))
    for name, content in (extra or {}).items():
        acc = _xor(acc, hashlib.sha1(name.encode() + content).digest())  # noqa: S324 - Ray's naming
    return f"gcs://_ray_pkg_{acc.hex()}.zip"


def zip_package(root: Path, excludes: Sequence[str] = DEFAULT_EXCLUDES, include_parent_dir: bool = False,
                extra: Mapping[str, bytes] | None = None) -> bytes:
    """The zip Ray builds: every file and empty directory, named from the package root
    (under the root's own name for a py_module); ``extra`` files at that root."""
    root = root.absolute()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED, strict_timestamps=False) as archive:
        for path in _walk(root, excludes):
            if path.is_file() or (path.is_dir() and next(path.iterdir(), None) is None):
                name = path.relative_to(root)
                archive.write(path, str(Path(root.name) / name if include_parent_dir else name))
        for extra_name, content in (extra or {}).items():
            archive.writestr(str(Path(root.name) / extra_name if include_parent_dir else extra_name), content)
    return buffer.getvalue()
