"""Infinity (`infinity-emb`) as the serve scenario's peer, in a virtualenv of its own.

infinity-emb 0.0.78 pins numpy<2, click<8.2, typer 0.12 and uvicorn 0.32, and its engines
want transformers<5 and sentence-transformers<4: nothing of it can share ortformer's venv,
and a --target overlay (overlay.py) is not enough since torch and numpy must be its own. So
the pins in infinity_peer.txt go into ``<venv>/peers-infinity`` (sys.prefix), or
$ORTFORMER_INFINITY_VENV, made with ``python -m venv``; a stamp file holds the SHA-256 of
the pins it was built from, so changed pins read as "stale".

Engines: "optimum" (onnxruntime; what Infinity recommends on CPU) and "torch"
(sentence-transformers on PyTorch, Infinity's default). The optimum engine reads an ONNX
file from the model folder, so optimum's exporter writes one first (as the model's hub
repository ships it), in the peer's own venv, with the graph optimization Infinity applies.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from ortformer.core.errors import OrtformerError
from .overlay import SETUP_COMMAND, STAMP, build_staged

PINS = Path(__file__).with_name("infinity_peer.txt")
LAUNCHER = Path(__file__).with_name("infinity_launch.py")
PREPARE = Path(__file__).with_name("infinity_prepare.py")
ENV_VAR = "ORTFORMER_INFINITY_VENV"
ENGINES = ("optimum", "torch")


def venv_dir() -> Path:
    return Path(os.environ.get(ENV_VAR) or Path(sys.prefix) / "peers-infinity")


def venv_python(folder: Path | None = None) -> Path:
    return (folder or venv_dir()) / "bin" / "python"


def pins_digest() -> str:
    return hashlib.sha256(PINS.read_bytes()).hexdigest()


def pinned() -> list[str]:
    """The requirement lines of infinity_peer.txt."""
    lines = (line.split("#")[0].strip() for line in PINS.read_text().splitlines())
    return [line for line in lines if line]


def infinity_problem(folder: Path | None = None) -> str | None:
    """Why the Infinity venv cannot be used (with the command that fixes it), or None when it can."""
    folder = folder or venv_dir()
    stamp = folder / STAMP
    if not stamp.exists() or not venv_python(folder).exists():
        return (f"no Infinity venv at {folder}: run `{SETUP_COMMAND}` (./dev bench-peers --setup-peers) to install "
                f"{pinned()[0]} there")
    if stamp.read_text().strip() != pins_digest():
        return f"the Infinity venv at {folder} was built from other pins: rerun `{SETUP_COMMAND}`"
    return None


def setup_infinity(folder: Path | None = None, log=print) -> Path:
    """A fresh venv with the pins at ``folder`` (an older one is replaced only once the new one works)."""
    folder = folder or venv_dir()
    log(f"installing {', '.join(pinned())} into a venv at {folder} (a few minutes) ...")

    def install(staging: Path) -> None:
        # the venv only runs through bin/python (a link to the base interpreter) with `-m` or a
        # script path, never through its console scripts, whose first lines name the staging path
        steps = [[sys.executable, "-m", "venv", "--clear", str(staging)],
                 [str(venv_python(staging)), "-m", "pip", "install", "--quiet", "--no-compile", "-r", str(PINS)],
                 [str(venv_python(staging)), "-c", "import infinity_emb.cli, optimum.onnxruntime, onnxruntime, torch"]]
        for argv in steps:
            done = subprocess.run(argv, capture_output=True, text=True)
            if done.returncode != 0:
                raise OrtformerError(f"the Infinity venv could not be set up (`{' '.join(argv[-3:])}` exited "
                                     f"{done.returncode}): {done.stderr.strip()[-1500:]}")

    return build_staged(folder, install, pins_digest())


def peer_env(workdir: Path) -> dict:
    """The peer's environment: offline, no telemetry, caches under ``workdir``, none of ortformer's paths."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME=str(workdir / "infinity-hf"),
               DO_NOT_TRACK="1", INFINITY_ANONYMOUS_USAGE_STATS="0", TOKENIZERS_PARALLELISM="false")
    return env


def prepare_optimum_model(folder: Path, workdir: Path, timeout_s: float = 900) -> Path:
    """A folder Infinity's optimum engine serves: optimum's ONNX export of ``folder`` and, in
    Infinity's cache under ``workdir``, the optimized graph Infinity would make (infinity_prepare.py)."""
    out = workdir / "infinity-onnx"
    if (out / "model.onnx").exists():
        return out
    cache = Path(peer_env(workdir)["HF_HOME"]) / "hub" / "infinity_onnx" / "CPUExecutionProvider"
    argv = [str(venv_python()), str(PREPARE), str(folder), str(out), str(cache)]
    done = subprocess.run(argv, capture_output=True, text=True, env=peer_env(workdir), timeout=timeout_s)
    if done.returncode != 0 or not (out / "model.onnx").exists():
        raise OrtformerError(f"optimum could not export {folder} to ONNX for Infinity (exit {done.returncode}): "
                             f"{done.stderr.strip()[-800:]}")
    return out


def infinity_command(engine: str, model_folder: Path, name: str, port: int, threads: int,
                     host: str = "127.0.0.1") -> tuple[list[str], Path]:
    """(argv, cwd) that serve ``model_folder`` as ``name`` on /v1/embeddings with ``engine``.

    --pooling-method mean: the optimum engine's "auto" means CLS pooling, not the model's own
    mean pooling. The optimum engine gets the folder as "." from inside it: Infinity lists a
    local folder's ONNX files by absolute path, which optimum-onnx's loader refuses as a file name.
    """
    if engine not in ENGINES:
        raise OrtformerError(f"unknown Infinity engine {engine!r}; choose from {', '.join(ENGINES)}")
    model_id, cwd = (".", model_folder) if engine == "optimum" else (str(model_folder), model_folder.parent)
    argv = [str(venv_python()), str(LAUNCHER), str(threads), "--model-id", model_id, "--served-model-name", name,
            "--engine", engine, "--device", "cpu", "--pooling-method", "mean", "--host", host, "--port", str(port),
            "--url-prefix", "/v1", "--no-vector-disk-cache", "--log-level", "warning"]
    return argv, cwd


__all__ = ["venv_dir", "infinity_problem", "setup_infinity", "prepare_optimum_model", "infinity_command", "peer_env",
           "ENGINES", "PINS", "ENV_VAR"]
