"""The peers overlay: packages that cannot share the venv, installed beside it.

sentence-transformers' ONNX backend needs optimum-onnx, which needs transformers<4.58;
ortformer's own tests need transformers 5. So the pins in st_onnx_peer.txt go into a
folder of their own (``pip install --no-deps --target``), and only the bench's worker
process puts that folder in front of the venv (PYTHONPATH entries come before
site-packages). torch, numpy and onnxruntime still come from the venv. The pins of
cpu_engines_peer.txt (OpenVINO, NNCF, CTranslate2) go into the same folder.

The folder is ``<venv>/peers-overlay`` (sys.prefix), or $ORTFORMER_PEERS_OVERLAY.
A stamp file holds the SHA-256 of the pins files it was built from, so changed pins read
as "stale" instead of running the old versions.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ortformer.core.errors import OrtformerError

PINS_FILES = tuple(Path(__file__).with_name(name) for name in ("st_onnx_peer.txt", "cpu_engines_peer.txt"))
PINS = PINS_FILES[0]
ENV_VAR = "ORTFORMER_PEERS_OVERLAY"
STAMP = ".pins-sha256"
SETUP_COMMAND = "python -m benchmarks --setup-peers"


def overlay_dir() -> Path:
    return Path(os.environ.get(ENV_VAR) or Path(sys.prefix) / "peers-overlay")


def pins_digest() -> str:
    return hashlib.sha256(b"".join(path.read_bytes() for path in PINS_FILES)).hexdigest()


def overlay_problem(folder: Path | None = None) -> str | None:
    """Why the overlay cannot be used (with the command that fixes it), or None when it can."""
    folder = folder or overlay_dir()
    stamp = folder / STAMP
    if not stamp.exists():
        return (f"no peers overlay at {folder}: run `{SETUP_COMMAND}` (./dev bench-peers --setup-peers) to install "
                f"{', '.join(pinned())} there")
    if stamp.read_text().strip() != pins_digest():
        return f"the peers overlay at {folder} was built from other pins: rerun `{SETUP_COMMAND}`"
    return None


def pinned() -> list[str]:
    """The requirement lines of every pins file."""
    lines = (line.split("#")[0].strip() for path in PINS_FILES for line in path.read_text().splitlines())
    return [line for line in lines if line]


def build_staged(folder: Path, build, digest: str) -> Path:
    """``build(staging)`` into a temporary folder beside ``folder``, stamped with ``digest``; it
    replaces ``folder`` only once complete, so a failed or cut-short install leaves the old one."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        build(staging)
        (staging / STAMP).write_text(digest + "\n")
        old = folder.with_name(f".{folder.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        if folder.exists():
            folder.rename(old)
        staging.rename(folder)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def setup_overlay(folder: Path | None = None, log=print) -> Path:
    """Install the pins into ``folder`` (replacing an older overlay only once the new one is complete)."""
    folder = folder or overlay_dir()
    log(f"installing {', '.join(pinned())} into {folder} ...")

    def install(staging: Path) -> None:
        # --no-deps: the rest (torch, numpy, onnxruntime-gpu) must stay the venv's; the pins name every
        # package whose venv version the pinned ones refuse
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
                               "--target", str(staging), *(arg for path in PINS_FILES for arg in ("-r", str(path)))],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise OrtformerError(f"pip could not install the peers overlay (exit {done.returncode}): "
                                 f"{done.stderr.strip()[-1500:]}")

    return build_staged(folder, install, pins_digest())


__all__ = ["overlay_dir", "overlay_problem", "setup_overlay", "pinned", "SETUP_COMMAND", "ENV_VAR", "PINS", "PINS_FILES"]
