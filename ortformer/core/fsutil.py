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
from pathlib import Path
from typing import Iterator


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
    """fsync ``tmp``, give it the usual mode (umask), rename it over ``dest``, fsync the folder."""
    usual_mode(tmp)
    fsync_file(tmp)
    os.replace(tmp, dest)
    fsync_dir(dest.parent)


def reserve(path: Path) -> None:
    """Allocate every block of ``path`` at its current size. A file that a memmap fills is
    created sparse; on a full disk its first unbacked page write kills the process with
    SIGBUS. Reserving first turns that into an OSError (ENOSPC) here, before any work."""
    with open(path, "r+b") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size and hasattr(os, "posix_fallocate"):
            os.posix_fallocate(handle.fileno(), 0, size)


def current_umask() -> int:
    """The process umask, read without changing it where /proc allows (Linux)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # elsewhere: the classic swap (not thread-safe, but brief)
    os.umask(mask)
    return mask


def usual_mode(path: Path) -> None:
    """Give ``path`` the mode a plain ``open(..., "w")`` would: 0666 & ~umask.

    mkstemp creates files 0600, which would make every atomically written file private."""
    os.chmod(path, 0o666 & ~current_umask())


@contextlib.contextmanager
def staged(dest: str | os.PathLike, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a temporary path beside ``dest`` to write; when the block ends without an
    exception, it replaces ``dest`` durably (replace_synced, mode per umask). The temporary
    file is removed on every path out, so ``dest`` stays as it was after an exception."""
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
