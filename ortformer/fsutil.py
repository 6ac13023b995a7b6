"""Durable file replacement, shared by every writer (models, checkpoints, repositories, shards).

The pattern: write a temporary file in the destination's folder (same filesystem,
so the rename is atomic), fsync it, ``os.replace`` it over the destination, then
fsync the folder so the new name survives a power cut. Readers see the old file
or the complete new one. These helpers raise OSError; callers turn it into their
own typed error.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


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
    """fsync ``tmp``, rename it over ``dest``, fsync the folder."""
    fsync_file(tmp)
    os.replace(tmp, dest)
    fsync_dir(dest.parent)
