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
import tempfile
from pathlib import Path
from typing import Iterator


def temp_beside(dest: Path) -> Path:
    """An empty, uniquely named hidden file next to ``dest``."""
    fd, name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
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


def write_atomic(dest: Path, data: bytes | str) -> None:
    """Write ``data`` to ``dest`` through a synced temporary file beside it (mode per umask)."""
    dest = Path(dest)
    tmp = temp_beside(dest)
    try:
        with open(tmp, "wb") as handle:
            handle.write(data.encode() if isinstance(data, str) else data)
        replace_synced(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_path(dest: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``dest``; on a clean exit it replaces ``dest`` (synced,
    mode per umask), on an exception it is removed and ``dest`` stays as it was."""
    dest = Path(dest)
    tmp = temp_beside(dest)
    try:
        yield tmp
        replace_synced(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
