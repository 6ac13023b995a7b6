"""Run the app with uvicorn until SIGTERM or Ctrl-C, then drain and return (exit status 0).

The connections run `limits.LimitedProtocol` (uvicorn's httptools protocol with bounds on
headers, slow senders, idle and unread connections, and their count). On the signal the
server stops accepting connections, closes idle ones and waits for every open request to be
answered, for at most `Limits.graceful_shutdown_timeout` seconds; then it aborts the
connections still open (their requests see a disconnect and end) and runs the app's lifespan
shutdown (each model's worker finishes what is queued). uvicorn then raises the signal again
for the handler it replaced, to end the process "as the signal would"; the handlers set here
for the run make that a no-op, so a drained server returns normally instead of dying by the
signal it was asked to stop on.
"""
from __future__ import annotations

import asyncio
import errno
import logging
import resource
import signal
import socket
import sys
import threading
from typing import Callable

import uvicorn

from ..core.errors import ListenError
from .limits import LimitedConfig, Limits

logger = logging.getLogger("ortformer.serve")
# after the deadline, how long aborted requests get to notice and end before they are cancelled
ABORT_GRACE_S = 2.0


class _Server(uvicorn.Server):
    def __init__(self, config: LimitedConfig, ready: Callable[[str, int], None] | None):
        super().__init__(config)
        self._ready = ready
        self._deadline = config.limits.graceful_shutdown_timeout

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started and self._ready is not None and self.servers:
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            self._ready(host, port)

    async def shutdown(self, sockets=None) -> None:
        """uvicorn's graceful shutdown, but bounded: what is still open after the deadline is
        aborted, so a client that stalls its body or its reading cannot hold the process."""
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        state = self.server_state
        for connection in list(state.connections):
            connection.shutdown()  # idle: closed now; busy: closed after its answer
        if not await self._settle(self._deadline):
            logger.warning("--graceful-shutdown-timeout %g s passed: closing %d open connection(s)",
                           self._deadline, len(state.connections))
            for connection in list(state.connections):
                # LimitedProtocol.abort also tells the request; any other protocol: the transport
                getattr(connection, "abort", connection.transport.abort)()
            if not await self._settle(ABORT_GRACE_S):
                for task in state.tasks:
                    task.cancel()
        if not self.force_exit:
            await self.lifespan.shutdown()

    async def _settle(self, seconds: float) -> bool:
        """Waits up to `seconds` for every connection to close and every request to end."""
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        state = self.server_state
        while (state.connections or state.tasks) and not self.force_exit:
            if loop.time() >= end:
                return False
            await asyncio.sleep(0.05)
        return True


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to host:port (port 0: a free one), or ListenError saying why not."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
    except (OSError, UnicodeError) as exc:
        raise ListenError(f"cannot listen on {host}:{port}: {exc}; give an address of this machine "
                          "(--host 127.0.0.1, or 0.0.0.0 for every interface)") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        hint = "choose another --port (0 picks a free one)" if exc.errno == errno.EADDRINUSE else "check --host and --port"
        raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; {hint}") from None
    sock.set_inheritable(True)
    return sock


def run(app, host: str = "127.0.0.1", port: int = 8080, *, log_level: str = "warning",
        ready: Callable[[str, int], None] | None = None, limits: Limits | None = None,
        sock: socket.socket | None = None) -> None:
    """Serve `app` on host:port until SIGTERM or SIGINT, then drain (within
    limits.graceful_shutdown_timeout) and return. Port 0 picks a free port; `ready(host, port)`
    is called once the app has started and the socket listens; `limits` bound what each
    connection may spend (Limits() when None). At log level info or debug each request is
    logged (uvicorn's access log). ListenError when host:port cannot be bound. `sock`: a socket
    already bound (--workers shares one), used instead of host:port and closed here too."""
    limits = limits or Limits()
    sock = bind(host, port) if sock is None else sock
    raise_open_files(limits.max_connections)
    config = LimitedConfig(app, limits, log_level=log_level, access_log=log_level in ("info", "debug"),
                           lifespan="on", ws="none")
    server = _Server(config, ready)
    main = threading.current_thread() is threading.main_thread()  # signals are the main thread's alone
    quiet = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)} if main else {}
    try:
        server.run(sockets=[sock])
    finally:
        for sig, handler in quiet.items():
            signal.signal(sig, handler)
        sock.close()


def raise_open_files(connections: int) -> None:
    """Lifts the soft open-file limit toward the hard one so that `connections` sockets fit
    beside the model files (a soft limit of 1024 is common); past it, accept() would fail."""
    want = connections + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < want:
        target = want if hard == resource.RLIM_INFINITY else min(want, hard)
        if target > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def announce(models: list[str]) -> Callable[[str, int], None]:
    """A `ready` callback printing where the server listens, on stderr (the one line a
    script starting the server waits for)."""
    def ready(host: str, port: int) -> None:
        shown = f"[{host}]" if ":" in host else host
        print(f"ortformer serve: listening on http://{shown}:{port} (models: {', '.join(models)})",
              file=sys.stderr, flush=True)
    return ready
