"""Run the app with uvicorn until SIGTERM or Ctrl-C, then drain and return (exit status 0).

On the signal uvicorn stops accepting connections, closes idle ones, waits for every open
request to be answered, then runs the app's lifespan shutdown (each model's worker finishes
what is queued). uvicorn then raises the signal again for the handler it replaced, to end the
process "as the signal would"; the handlers set here for the run make that a no-op, so a
drained server returns normally instead of dying by the signal it was asked to stop on.
"""
from __future__ import annotations

import errno
import signal
import socket
import sys
import threading
from typing import Callable

import uvicorn

from ..errors import ListenError


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, ready: Callable[[str, int], None] | None):
        super().__init__(config)
        self._ready = ready

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started and self._ready is not None and self.servers:
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            self._ready(host, port)


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
        ready: Callable[[str, int], None] | None = None, sock: socket.socket | None = None) -> None:
    """Serve `app` on host:port until SIGTERM or SIGINT, then drain and return. Port 0 picks a
    free port; `ready(host, port)` is called once the app has started and the socket listens.
    ListenError when host:port cannot be bound. `sock`: a socket already bound (--workers
    shares one), used instead of host:port and closed here too."""
    sock = bind(host, port) if sock is None else sock
    config = uvicorn.Config(app, log_level=log_level, access_log=False, lifespan="on",
                            timeout_graceful_shutdown=None)
    server = _Server(config, ready)
    main = threading.current_thread() is threading.main_thread()  # signals are the main thread's alone
    quiet = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)} if main else {}
    try:
        server.run(sockets=[sock])
    finally:
        for sig, handler in quiet.items():
            signal.signal(sig, handler)
        sock.close()


def announce(models: list[str]) -> Callable[[str, int], None]:
    """A `ready` callback printing where the server listens, on stderr (the one line a
    script starting the server waits for)."""
    def ready(host: str, port: int) -> None:
        shown = f"[{host}]" if ":" in host else host
        print(f"ortformer serve: listening on http://{shown}:{port} (models: {', '.join(models)})",
              file=sys.stderr, flush=True)
    return ready
