"""HTTP servers under test as child processes: a free loopback port, readiness by GET /health,
pause and resume between measurement rounds, and a stop that always reaps the process.

A paused server (SIGSTOP) takes no CPU while the other one is measured, so an idle poll
loop in either cannot tax its rival; the kernel keeps its sockets, and it resumes
(SIGCONT) where it was.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from ortformer.core.errors import OrtformerError
from .load import check_loopback

HOST = "127.0.0.1"


class ServerError(OrtformerError):
    """A server under test did not start, did not become healthy, or died."""


def free_port(host: str = HOST) -> int:
    """A port that nothing listens on right now (the kernel's pick for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


class ServerProcess:
    """``argv`` started with ``env`` (its output to ``log``), answering on ``url``."""

    def __init__(self, name: str, argv: list[str], url: str, log: Path, env: dict | None = None,
                 cwd: Path | None = None):
        self.name, self.url, self.log = name, check_loopback(url), log
        with open(log, "wb") as out:
            # a session of its own, so a stop reaches the workers a server may fork
            self.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                            start_new_session=True)

    def log_tail(self, chars: int = 800) -> str:
        try:
            return self.log.read_text(encoding="utf-8", errors="replace").strip()[-chars:] or "(empty)"
        except OSError:
            return "(unreadable)"

    def healthy(self) -> bool:
        try:
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy
            with opener.open(self.url.rstrip("/") + "/health", timeout=5) as answer:
                return answer.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait_healthy(self, timeout_s: float) -> None:
        """Poll /health until it answers 200; ServerError (with the log's tail) on exit or timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerError(f"{self.name} exited with code {self.process.returncode} before it was healthy; "
                                  f"its log ({self.log}): {self.log_tail()}")
            if self.healthy():
                return
            time.sleep(0.5)
        self.stop()
        raise ServerError(f"{self.name} was not healthy at {self.url}/health within {timeout_s:.0f} s; "
                          f"its log ({self.log}): {self.log_tail()}")

    def _signal(self, sig: int) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, sig)

    def pause(self) -> None:
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM (after a SIGCONT, as a stopped process cannot act on it), then SIGKILL after grace_s."""
        if self.process.poll() is None:
            self._signal(signal.SIGCONT)
            self._signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.process.wait()
        try:  # workers it forked that outlived it
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


__all__ = ["ServerProcess", "ServerError", "free_port", "HOST"]
