"""`ortformer serve` as a process: SIGTERM answers every open request, then exits 0; the
verb's one-line errors; the CPU count from affinity and the cgroup quota."""
from __future__ import annotations

import sys

import pytest
from click.testing import CliRunner

from ortformer.cli import cli
from support.serve import sigterm_with_requests_open, start_process as start
from support.torch_free import run_python

httpx = pytest.importorskip("httpx")


def test_sigterm_answers_open_requests_then_exits_0(runtimes):
    runtimes["embedder"]  # exported
    path = runtimes.files["embedder"]
    # one thread and one input per model call: 16 requests of 128 inputs take a while to answer
    process, url = start(str(path), "--threads", "1", "--max-batch-tokens", "1", "--max-wait-ms", "0",
                         "--max-client-batch-size", "128")
    try:
        answers, answered_before = sigterm_with_requests_open(process, url)
    finally:
        if process.poll() is None:
            process.kill()
    assert answered_before < 16  # the signal came while requests were still open
    assert [a.status_code for a in answers] == [200] * 16
    assert all(len(a.json()) == 128 for a in answers)
    assert "Traceback" not in process.stderr.read()
    with pytest.raises(httpx.ConnectError):  # no longer listening
        httpx.get(f"{url}/health", timeout=5)


def fail(*args: str) -> str:
    result = CliRunner().invoke(cli, ["serve", *args])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error: "), result.stderr
    return lines[-1]


def test_cli_errors_are_one_line(runtimes, tmp_path):
    runtimes["embedder"]
    path = str(runtimes.files["embedder"])
    for args, words in (([path, "--model", f"embedder={path}"], "two models are named 'embedder'"),
                        (["--model", path], "NAME=PATH"), ([], "no model to serve")):
        result = CliRunner().invoke(cli, ["serve", *args])  # a usage error (exit 2), as click's own
        assert result.exit_code == 2 and words in result.stderr, result.output
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        message = fail(path, "--port", str(taken.getsockname()[1]))
    finally:
        taken.close()
    assert "cannot listen on 127.0.0.1" in message and "--port" in message


def test_without_the_extra_the_verb_names_it(monkeypatch):
    for name in [m for m in sys.modules if m == "ortformer.serve" or m.startswith("ortformer.serve.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "starlette", None)  # import starlette now fails
    assert "the 'serve' extra" in fail("--model", "x=y.onnx")


def test_the_server_runs_without_torch(runtimes):
    runtimes["embedder"]
    done = run_python(
        "from starlette.testclient import TestClient\n"
        "from ortformer.serve import ServedModel, ServeOptions, create_app, load_runtime\n"
        f"model = ServedModel('m', load_runtime({str(runtimes.files['embedder'])!r}, ServeOptions(threads=1)))\n"
        "with TestClient(create_app([model])) as client:\n"
        "    assert client.post('/embed', json={'inputs': 'a text'}).status_code == 200\n")
    assert done.returncode == 0, done.stderr
