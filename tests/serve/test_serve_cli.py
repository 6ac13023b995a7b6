"""`ortformer serve` as a process: SIGTERM answers every open request, then exits 0; the
verb's one-line errors; the CPU count from affinity and the cgroup quota."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from ortformer.cli import cli
from ortformer.serve import cpus
from support.torch_free import run_python

httpx = pytest.importorskip("httpx")
REPO = Path(__file__).resolve().parents[2]


def start(*args: str) -> tuple[subprocess.Popen, str]:
    """`ortformer serve ARGS --port 0` in a process; (process, its URL) once it listens."""
    process = subprocess.Popen([sys.executable, "-m", "ortformer.cli", "serve", *args, "--port", "0"],
                               stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    line = process.stderr.readline()  # the one line it prints once listening
    match = re.search(r"listening on (http://\S+)", line)
    if match is None:
        process.kill()
        pytest.fail(f"the server did not start: {line}{process.stderr.read()}")
    return process, match.group(1)


def count(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def test_sigterm_answers_open_requests_then_exits_0(runtimes):
    runtimes["embedder"]  # exported
    path = runtimes.files["embedder"]
    # one thread and one input per model call: 16 requests of 128 inputs take a while to answer
    process, url = start(str(path), "--threads", "1", "--max-batch-tokens", "1", "--max-wait-ms", "0",
                         "--max-client-batch-size", "128")
    try:
        texts = [" ".join(["word"] * 20) + f" {i}" for i in range(128)]
        answers: list = []
        clients = [threading.Thread(target=lambda: answers.append(
            httpx.post(f"{url}/embed", json={"inputs": texts}, timeout=60))) for _ in range(16)]
        for client in clients:
            client.start()
        deadline = time.monotonic() + 30
        while count(url, "te_request_count") < 16:  # every request is in the server
            assert time.monotonic() < deadline, "the requests did not arrive"
            time.sleep(0.005)
        answered_before = count(url, "te_request_success")
        process.send_signal(signal.SIGTERM)
        for client in clients:
            client.join(60)
        assert process.wait(60) == 0, process.stderr.read()
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
    assert "two models are named 'embedder'" in fail(path, "--model", f"embedder={path}")
    assert "NAME=PATH" in fail("--model", path)
    assert "no model to serve" in fail()
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


def test_threads_follow_the_cgroup_quota_not_the_host(tmp_path, monkeypatch):
    monkeypatch.setattr(cpus, "usable_cores", lambda: 8)  # the affinity mask: 8 cores
    proc = tmp_path / "cgroup"
    # cgroup v2: a half-CPU quota on the parent of the process's cgroup
    (tmp_path / "v2" / "pod" / "app").mkdir(parents=True)
    (tmp_path / "v2" / "pod" / "cpu.max").write_text("50000 100000\n")
    (tmp_path / "v2" / "pod" / "app" / "cpu.max").write_text("max 100000\n")
    proc.write_text("0::/pod/app\n")
    assert cpus.cgroup_cpu_quota(tmp_path / "v2", proc) == 0.5
    assert cpus.available_cpus(tmp_path / "v2", proc) == 1
    # cgroup v1: 2.5 CPUs of quota rounds up to 3
    (tmp_path / "v1" / "cpu,cpuacct" / "docker").mkdir(parents=True)
    (tmp_path / "v1" / "cpu,cpuacct" / "docker" / "cpu.cfs_quota_us").write_text("250000\n")
    (tmp_path / "v1" / "cpu,cpuacct" / "docker" / "cpu.cfs_period_us").write_text("100000\n")
    proc.write_text("5:cpu,cpuacct:/docker\n4:memory:/docker\n")
    assert cpus.available_cpus(tmp_path / "v1", proc) == 3
    # no quota (v1's -1, or no cgroup files): the affinity mask
    (tmp_path / "v1" / "cpu,cpuacct" / "docker" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cpus.cgroup_cpu_quota(tmp_path / "v1", proc) is None
    assert cpus.available_cpus(tmp_path / "v1", proc) == 8
    assert cpus.available_cpus(tmp_path / "none", tmp_path / "missing") == 8


def test_the_server_runs_without_torch(runtimes):
    runtimes["embedder"]
    done = run_python(
        "from starlette.testclient import TestClient\n"
        "from ortformer.serve import ServedModel, ServeOptions, create_app, load_runtime\n"
        f"model = ServedModel('m', load_runtime({str(runtimes.files['embedder'])!r}, ServeOptions(threads=1)))\n"
        "with TestClient(create_app([model])) as client:\n"
        "    assert client.post('/embed', json={'inputs': 'a text'}).status_code == 200\n")
    assert done.returncode == 0, done.stderr
