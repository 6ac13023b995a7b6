"""Durable file replacement, shared by every writer (models, checkpoints, repositories, shards).

The pattern: write a temporary file in the destination's folder (same filesystem,
so the rename is atomic), fsync it, ``os.replace`` it over the destination, then
fsync the folder so the new name survives a power cut. Readers see the old file
or the complete new one. These helpers raise OSError; callers turn it into their
own typed error.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def temp_beside(dest: Path, suffix: str = ".tmp") -> Path:
    """An empty, uniquely named hidden file next to ``dest`` (``suffix`` for writers that
    choose a format by extension, e.g. matplotlib)."""
    fd, name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=suffix, dir=dest.parent)
    os.close(fd)
    return Path(name)


def fsync_file(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def fsync_dir(folder: Path) -> None:
    """Persist a folder's entries; a no-op where the filesystem refuses (data is already synced)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def replace_synced(tmp: Path, dest: Path) -> None:
    """fsync ``tmp``, rename it over ``dest``, fsync the folder."""
    fsync_file(tmp)
    os.replace(tmp, dest)
    fsync_dir(dest.parent)


@contextlib.contextmanager
def staged(dest: str | os.PathLike, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a temporary path beside ``dest`` to write; when the block ends without an
    exception, it replaces ``dest`` durably (replace_synced). The temporary file is
    removed on every path out."""
    dest = Path(dest)
    tmp = temp_beside(dest, suffix)
    try:
        yield tmp
        replace_synced(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(dest: str | os.PathLike, data: str | bytes) -> None:
    """Replace ``dest`` with ``data`` (text as UTF-8): readers see the old file or all of the new."""
    with staged(dest) as tmp:
        if isinstance(data, str):
            tmp.write_text(data, encoding="utf-8")
        else:
            tmp.write_bytes(data)


def copy_atomic(source: str | os.PathLike, dest: str | os.PathLike) -> None:
    """Replace ``dest`` with a copy of ``source``'s bytes, durably."""
    with staged(dest) as tmp:
        shutil.copyfile(source, tmp)
