"""`ortformer serve --workers N`: N processes answering on one port.

One Python process caps short-input throughput (the event loop, tokenization and JSON run
under one interpreter lock); N processes each with their own sessions and batcher do not
share it. The parent binds the socket, starts N workers (multiprocessing's spawn: a fresh
interpreter each, no forked onnxruntime state) that all accept on it, and waits:

- **threads**: each worker's onnxruntime threads default to max(1, CPUs // N) (cpus.py: the
  affinity mask and the cgroup quota), so N workers do not oversubscribe the cores;
- **metrics**: prometheus_client's multiprocess mode, in a private temporary folder
  (PROMETHEUS_MULTIPROC_DIR) removed when the parent exits; any worker's /metrics shows the
  sum over all of them (metrics.py reads the folder);
- **SIGTERM / SIGINT** to the parent: each worker gets one SIGTERM and drains as one server
  does (server.run); the parent returns once every worker has exited, or kills those left
  after ``graceful_timeout`` seconds. Workers run in their own process group (a terminal's
  Ctrl-C reaches the parent alone, which then signals each worker once: a second signal
  would make uvicorn skip the drain), and end themselves if the parent dies;
- a worker that dies while serving is replaced; one that fails before it listens (an
  unreadable model) stops the start-up with its error.

Every answer carries ``x-ortformer-pid``, the id of the worker process that made it.
"""
from __future__ import annotations

import dataclasses
import multiprocessing
import os
import queue as queues
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from ..core import errors
from ..core.cpus import available_cpus
from .options import ServeOptions

PID_HEADER = b"x-ortformer-pid"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


class _PidHeader:
    """ASGI middleware: every HTTP answer carries this process's id (x-ortformer-pid), so a
    client or a load balancer's log can tell the workers or replicas apart."""

    def __init__(self, app):
        self.app = app
        self.pid = str(os.getpid()).encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def sending(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), (PID_HEADER, self.pid)]}
            await send(message)

        await self.app(scope, receive, sending)


def with_pid_header(app):
    """The Starlette `app`, its answers carrying x-ortformer-pid (the app stays itself:
    its state and lifespan are unchanged)."""
    app.add_middleware(_PidHeader)
    return app


def worker_threads(options: ServeOptions, workers: int) -> int:
    """onnxruntime threads per worker: --threads, else max(1, available CPUs // workers)."""
    return options.threads or max(1, available_cpus() // workers)


def _watch_parent(parent: int) -> None:
    """End this worker (as SIGTERM would: draining) once its parent is gone."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)


def _worker(sock, specs: dict[str, Path], options: ServeOptions, run_kwargs: dict, messages, parent: int,
            otlp_endpoint: str | None, grpc_port: int | None) -> None:
    """One worker process: load the models, serve the app on the shared socket until SIGTERM."""
    os.setpgrp()  # the terminal's Ctrl-C goes to the parent alone, which signals each worker once
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    try:
        from .model import ServedModel
        from .options import load_runtime
        from .routes import create_app
        from .server import run
        from .tracing import traced

        served = [ServedModel(name, load_runtime(path, options)) for name, path in specs.items()]
        app = with_pid_header(create_app(served, options))
        tracing = app.state.serve.tracing = traced(otlp_endpoint)
        if grpc_port is not None:  # every worker binds the one gRPC port (SO_REUSEPORT)
            from .grpc import with_grpc

            app = with_grpc(app, sock.getsockname()[0], grpc_port, reuse_port=True)
    except Exception as exc:  # reported to the parent, which stops the start-up with it
        messages.put(("error", type(exc).__name__, str(exc)))
        return
    try:
        run(app, sock=sock, ready=lambda host, port: messages.put(("ready", os.getpid())), **run_kwargs)
    finally:
        if tracing is not None:
            tracing.shutdown()


def _error(name: str, message: str) -> Exception:
    """The worker's error as the parent raises it: the same ortformer error class when it
    takes a message alone, else OrtformerError."""
    cls = getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, errors.OrtformerError):
        try:
            return cls(message)
        except TypeError:
            pass
    return errors.OrtformerError(f"a worker failed to start: {name}: {message}")


def run_workers(specs: dict[str, Path], options: ServeOptions, workers: int, host: str = "127.0.0.1",
                port: int = 8080, *, ready: Callable[[str, int], None] | None = None,
                graceful_timeout: float | None = None, otlp_endpoint: str | None = None,
                grpc_port: int | None = None, **run_kwargs) -> None:
    """Serve `specs` (name -> model file) with `workers` processes on host:port until SIGTERM
    or SIGINT, then drain them all and return. `run_kwargs` go to each worker's server.run
    (log_level...); otlp_endpoint: each worker exports its spans there; grpc_port: each also
    serves gRPC there (the kernel spreads connections, as for HTTP). ListenError when host:port cannot be bound; a worker's start-up error
    (ModelFileError...) is raised here."""
    from prometheus_client import multiprocess

    from .server import bind

    sock = bind(host, port)
    options = dataclasses.replace(options, threads=worker_threads(options, workers))
    folder = tempfile.mkdtemp(prefix="ortformer-serve-metrics-")
    previous = os.environ.get(MULTIPROC_ENV)
    os.environ[MULTIPROC_ENV] = folder  # the spawned workers inherit it before prometheus_client loads
    context = multiprocessing.get_context("spawn")
    messages = context.Queue()
    stop = threading.Event()
    main = threading.current_thread() is threading.main_thread()
    handlers = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)} if main else {}
    procs: list = []

    def start():
        proc = context.Process(target=_worker, name="ortformer-serve-worker", daemon=False,
                               args=(sock, specs, options, run_kwargs, messages, os.getpid(), otlp_endpoint,
                                     grpc_port))
        proc.start()
        return proc

    try:
        procs.extend(start() for _ in range(workers))
        listening = 0
        while listening < workers:
            if stop.is_set():
                return
            try:
                message = messages.get(timeout=0.2)
            except queues.Empty:
                if any(p.exitcode is not None for p in procs):
                    raise errors.OrtformerError("a worker exited before it could serve; run with --workers 1 "
                                                "to see why")
                continue
            if message[0] == "error":
                raise _error(message[1], message[2])
            listening += 1
        if ready is not None:
            host_, port_ = sock.getsockname()[:2]
            ready(host_, port_)
        while not stop.wait(0.5):
            for i, proc in enumerate(procs):
                if proc.exitcode is not None:  # died while serving: replace it
                    multiprocess.mark_process_dead(proc.pid, folder)
                    procs[i] = start()
    finally:
        _stop_all(procs, graceful_timeout)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        sock.close()
        messages.close()
        if previous is None:
            os.environ.pop(MULTIPROC_ENV, None)
        else:
            os.environ[MULTIPROC_ENV] = previous
        shutil.rmtree(folder, ignore_errors=True)


def _stop_all(procs: list, graceful_timeout: float | None) -> None:
    """One SIGTERM to each live worker; wait for all (at most graceful_timeout seconds), then
    kill any left."""
    for proc in procs:
        if proc.exitcode is None and proc.pid is not None:
            try:
                os.kill(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = None if graceful_timeout is None else time.monotonic() + graceful_timeout
    for proc in procs:
        proc.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.exitcode is None:
            proc.kill()
            proc.join()
