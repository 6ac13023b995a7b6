"""sentence-transformers' ONNX backend (plain, O3, dynamic int8) as contenders of the bench.

The backend runs in a worker process (st_onnx_worker.py) started with the peers overlay
in front of the venv (overlay.py). Each contender here is a callable that sends
`encode NAME` and waits for the reply, so measure.side_by_side interleaves it with the
in-process contenders exactly like them; the pipe round trip is well under a millisecond
against hundreds of milliseconds of encoding. The worker is blocked on its stdin while
the others run, so it takes none of their CPU.
"""
from __future__ import annotations

import importlib.util
import json
import os
import select
import subprocess
import sys
from pathlib import Path

import numpy as np

from ortformer.core.errors import OrtformerError
from .overlay import SETUP_COMMAND, overlay_dir, overlay_problem

# the first start exports three models (torch.onnx, optimum's O3 optimizer, int8 quantization)
READY_TIMEOUT_S = 900.0
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the folder that holds ortformer/ and benchmarks/


class WorkerError(OrtformerError):
    """The worker did not start, died, or answered `error ...`."""


class StOnnxWorker:
    """A running worker: ``names`` are its models; ``encode(name)`` times one pass over the texts."""

    def __init__(self, argv: list[str], env: dict, log: Path, ready_timeout: float = READY_TIMEOUT_S):
        self.log = log
        with open(log, "wb") as err:
            self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env)
        try:
            first = self._read(ready_timeout)
            if not first.startswith("ready "):
                raise WorkerError(f"the worker did not start: {first}")
            self.names = first.split()[1:]
        except BaseException:
            self.close()
            raise

    def _read(self, timeout: float | None = None) -> str:
        out = self.process.stdout
        if timeout is not None and not select.select([out], [], [], timeout)[0]:
            raise WorkerError(f"no answer from the worker in {timeout:.0f} s; its log: {self.log_tail()}")
        line = out.readline().decode("utf-8")
        if not line:
            self.process.wait(timeout=10)
            raise WorkerError(f"the worker exited (code {self.process.returncode}); its log: {self.log_tail()}")
        return line.rstrip("\n")

    def log_tail(self, chars: int = 600) -> str:
        try:
            return self.log.read_text(encoding="utf-8", errors="replace").strip()[-chars:] or "(empty)"
        except OSError:
            return "(unreadable)"

    def request(self, line: str) -> str:
        """Send one command line; the reply after `ok ` (WorkerError on `error ...`)."""
        self.process.stdin.write(line.encode("utf-8") + b"\n")
        self.process.stdin.flush()
        reply = self._read()
        if not reply.startswith("ok"):
            raise WorkerError(f"{line!r}: {reply}")
        return reply[3:]

    def encode(self, name: str) -> float:
        """The worker's own seconds for one encode of all its texts."""
        return float(self.request(f"encode {name}"))

    def embeddings(self, name: str, path: Path) -> np.ndarray:
        self.request(f"embeddings {name} {path}")
        return np.load(path, allow_pickle=False)

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.process.stdin.write(b"quit\n")
                self.process.stdin.close()
                self.process.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe and not pipe.closed:
                pipe.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def worker_env(overlay: Path | None) -> dict:
    """This environment with the overlay (if any) and ortformer's own folder first on PYTHONPATH."""
    env = os.environ.copy()
    paths = ([str(overlay)] if overlay else []) + [PACKAGE_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def start_st_onnx(workdir: Path, folder: Path, texts: list[str], threads: int) -> tuple[StOnnxWorker | None, str | None]:
    """A worker serving sentence-transformers' ONNX backend on ``folder``, or why there is none.

    The overlay is used when it is set up; without it the worker runs on the venv alone
    only where optimum is installed there (an environment with transformers<4.58).
    """
    problem = overlay_problem()
    overlay = None if problem else overlay_dir()
    if problem and importlib.util.find_spec("optimum") is None:
        return None, problem
    texts_file = workdir / "st-onnx-texts.json"
    texts_file.write_text(json.dumps(texts), encoding="utf-8")
    argv = [sys.executable, "-m", "benchmarks.peers.st_onnx_worker", "--folder", str(folder),
            "--workdir", str(workdir), "--threads", str(threads), "--texts", str(texts_file)]
    try:
        return StOnnxWorker(argv, worker_env(overlay), workdir / "st-onnx-worker.log"), None
    except WorkerError as error:
        hint = "" if overlay else f"; `{SETUP_COMMAND}` installs the versions it needs beside the venv"
        return None, f"{str(error)[:700]}{hint}"


def st_onnx_runners(worker: StOnnxWorker | None) -> dict:
    """{name: encode-all-texts-once} for side_by_side; empty without a worker."""
    return {name: (lambda n=name: worker.encode(n)) for name in worker.names} if worker else {}


__all__ = ["StOnnxWorker", "WorkerError", "start_st_onnx", "st_onnx_runners", "worker_env"]
