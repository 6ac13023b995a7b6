"""What the serve tests share: tiny text models (one layer, BERT's vocabulary and the MiniLM
tokenizer), exported on first use, and a real server on a free loopback port, uvicorn in a
background thread. The fixture is in tests/serve/conftest.py."""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from ortformer.config import Classifier, preset  # noqa: E402
from support.text_models import minilm_tokenizer  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
VOCAB = 30522  # BERT's, the MiniLM tokenizer's ids
PROMPTS = {"query": "query: ", "passage": "passage: "}


def _export(folder: Path, name: str, **changes) -> Path:
    from ortformer.exporter import export

    extra = {key: changes.pop(key) for key in ("prompts", "text_max_length", "labels") if key in changes}
    path = folder / f"{name}.onnx"
    export(preset("tiny", vocab_size=VOCAB, num_layers=1, **changes), path, parity=False, tokenizer=minilm_tokenizer(),
           **extra)
    return path


# name -> what to export: the embedder (mean pooling, prompts, 24-token texts), a reranker
# (one label), a classifier (three named labels), a SPLADE model (max over the masked-LM head)
# and an embedder whose graph normalizes
MODELS = {
    "embedder": dict(pooling="mean", prompts=PROMPTS, text_max_length=24),
    "reranker": dict(classifier=Classifier(labels=1)),
    "classifier": dict(classifier=Classifier(labels=3), labels=["negative", "neutral", "positive"]),
    "splade": dict(pooling="splade_max", classifier=Classifier(labels=VOCAB, per_token=True)),
    # a pipeline that normalizes inside the graph (all-MiniLM-L6-v2's Normalize module)
    "normalizing": dict(pooling="weighted_mean", normalize_embeddings=True),
}


class Models(dict):
    """name -> Runtime of MODELS[name], exported on first use (a test file pays only for the
    models it serves). `folder` may be shared by the xdist workers of one run: the first to
    need a model exports it under a lock, the others wait and load it."""

    def __init__(self, folder: Path):
        super().__init__()
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.files: dict[str, Path] = {}

    def __missing__(self, name: str):
        import fcntl

        from ortformer.serve import ServeOptions, load_runtime

        path = self.folder / f"{name}.onnx"
        with open(self.folder / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if not path.exists():  # export writes the file whole, under this lock
                _export(self.folder, name, **dict(MODELS[name]))
        self.files[name] = path
        self[name] = load_runtime(path, ServeOptions(threads=2))
        return self[name]


def post(client, route: str, body: dict, status: int = 200):
    """The JSON answer of POST route, asserting its status (the answer's text when it differs)."""
    response = client.post(route, json=body)
    assert response.status_code == status, response.text
    return response.json()


class Running:
    """A server in a background thread: ``url``, ``app`` (the ServeApp) and ``stop()``."""

    def __init__(self, app, server, thread, url):
        self.app, self.server, self.thread, self.url = app, server, thread, url

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "the server did not stop"


@contextlib.contextmanager
def serving(runtimes: dict, names: list[str], limits=None, wrap=None, **options):
    """Serve ServedModels around `runtimes` (name -> Runtime; `names` picks them, the first the default)
    on 127.0.0.1 and a free port, with ServeOptions(**options), on the connections `ortformer serve`
    runs (LimitedProtocol, with `limits` or the defaults); `wrap(app)` (e.g. with_grpc) is what
    runs, and ``running.asgi`` the Starlette app."""
    import uvicorn

    from ortformer.serve import ServedModel, ServeOptions, create_app
    from ortformer.serve.limits import LimitedConfig, Limits
    from ortformer.serve.server import bind

    app = create_app([ServedModel(n, runtimes[n]) for n in names], ServeOptions(**{"threads": 2, **options}))
    app = wrap(app) if wrap is not None else app
    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(LimitedConfig(app, limits or Limits(), log_level="error", access_log=False,
                                          lifespan="on", ws="none"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    running = Running(app.state.serve, server, thread, f"http://127.0.0.1:{sock.getsockname()[1]}")
    running.asgi = app
    try:
        yield running
    finally:
        running.stop()
        sock.close()


def start_process(*args: str, env: dict | None = None) -> tuple[subprocess.Popen, str]:
    """`ortformer serve ARGS --port 0` in a process (its stdout, where uvicorn's access log goes,
    and stderr text pipes); (process, its URL) once it listens."""
    process = subprocess.Popen([sys.executable, "-m", "ortformer.cli", "serve", *args, "--port", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, **(env or {}), "PYTHONPATH": str(REPO)})
    seen = []
    for _ in range(100):  # the line it prints once listening; at --log-level info, uvicorn's before it
        seen.append(process.stderr.readline())
        match = re.search(r"listening on (http://\S+)", seen[-1])
        if match is not None or not seen[-1]:
            break
    if match is None:
        process.kill()
        pytest.fail(f"the server did not start: {''.join(seen)}{process.stderr.read()}")
    return process, match.group(1)


def count(url: str, name: str) -> float:
    """The sum of metric `name`'s series at url's /metrics."""
    import httpx

    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def sigterm_with_requests_open(process: subprocess.Popen, url: str, already: int = 0, timeout: float = 60,
                               headers: dict | None = None) -> tuple[list, float]:
    """16 clients each POST 128 texts to /embed; once all 16 requests are in the server (its
    te_request_count reaches already + 16), SIGTERM; returns (the 16 answers, te_request_success
    when the signal was sent) once the process has exited, asserting it exited 0."""
    import httpx

    texts = [" ".join(["word"] * 20) + f" {i}" for i in range(128)]
    answers: list = []
    clients = [threading.Thread(target=lambda: answers.append(
        httpx.post(f"{url}/embed", json={"inputs": texts}, headers=headers, timeout=timeout))) for _ in range(16)]
    for client in clients:
        client.start()
    deadline = time.monotonic() + timeout / 2
    while count(url, "te_request_count") < already + 16:  # every request is in the server
        assert time.monotonic() < deadline, "the requests did not arrive"
        time.sleep(0.005)
    answered_before = count(url, "te_request_success")
    process.send_signal(signal.SIGTERM)
    for client in clients:
        client.join(timeout)
    assert process.wait(timeout) == 0, process.stderr.read()
    return answers, answered_before
