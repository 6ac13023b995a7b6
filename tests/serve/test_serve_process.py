"""`ortformer serve` as a process against clients that stall: SIGTERM exits 0 after
--graceful-shutdown-timeout however they behave; the API key from a file stays out of the
process list; --log-level info logs each request; keys no client could send, an empty
ORTFORMER_API_KEY and a CUDA request without CUDA are refused at start in one line."""
from __future__ import annotations

import json
import signal
import socket
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from click.testing import CliRunner

from ortformer.cli import cli
from support.serve import start_process

httpx = pytest.importorskip("httpx")
KEY = "s3cret-ключ"


def raw(url: str, receive_buffer: int | None = None) -> socket.socket:
    parts = urlsplit(url)
    sock = socket.socket()
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.settimeout(30)
    sock.connect((parts.hostname, parts.port))
    return sock


def test_sigterm_with_stalled_clients_exits_0_after_the_deadline(runtimes, tmp_path):
    runtimes["embedder"]
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    # the connection timeouts far past the deadline: only the shutdown can end these clients
    process, url = start_process(str(runtimes.files["embedder"]), "--threads", "1", "--api-key-file", str(key_file),
                                 "--graceful-shutdown-timeout", "1", "--header-timeout", "600", "--body-timeout", "600",
                                 "--write-timeout", "600", "--keep-alive-timeout", "600", "--log-level", "info")
    stalled = []
    try:
        assert KEY not in Path(f"/proc/{process.pid}/cmdline").read_bytes().decode(errors="replace")
        auth = {"authorization": b"Bearer " + KEY.encode()}
        assert httpx.post(url + "/embed", json={"inputs": "a text"}, headers=auth, timeout=30).status_code == 200
        assert httpx.post(url + "/embed", json={"inputs": "a text"}, timeout=30).status_code == 401
        half_body = raw(url)  # headers and half the body, then nothing
        half_body.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: 100\r\n\r\n{\"inputs\": ")
        half_head = raw(url)
        half_head.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        # answers it never reads: pipelined requests behind a small receive window
        # 32 texts x 22 tokens x 32 floats: about 0.4 MB of JSON per answer
        body = json.dumps({"inputs": [" ".join(["word"] * 20)] * 32}).encode()
        request = (b"POST /embed_all HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer "
                   + KEY.encode() + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        unread = raw(url, receive_buffer=4096)
        unread.sendall(request * 20)
        stalled = [half_body, half_head, unread]
        assert httpx.get(url + "/health", timeout=30).status_code == 200  # the stalled ones are in by now
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
    finally:
        if process.poll() is None:
            process.kill()
        for sock in stalled:
            sock.close()
    log, access = process.stderr.read(), process.stdout.read()
    assert "--graceful-shutdown-timeout 1 s passed" in log
    assert "Traceback" not in log
    assert '"GET /health HTTP/1.1" 200' in access and '"POST /embed HTTP/1.1" 401' in access


def fail(*args: str, env: dict | None = None, code: int = 1) -> str:
    result = CliRunner().invoke(cli, ["serve", *args], env=env)
    assert result.exit_code == code and "Traceback" not in result.output, result.output
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error: " if code == 1 else "Error: "), result.stderr
    return lines[-1]


def test_keys_no_client_can_send_are_refused_at_start(runtimes, tmp_path):
    runtimes["embedder"]
    path = str(runtimes.files["embedder"])
    assert "ORTFORMER_API_KEY is set but empty" in fail(path, env={"ORTFORMER_API_KEY": ""})
    assert "--api-key is empty" in fail(path, "--api-key", "")
    assert "ORTFORMER_API_KEY holds the character U+0007" in fail(path, env={"ORTFORMER_API_KEY": "a\x07b"})
    assert "whitespace" in fail(path, "--api-key", "key ")
    empty = tmp_path / "empty"
    empty.write_text("\n")
    assert "is empty" in fail(path, "--api-key-file", str(empty))
    assert "cannot read the API key file" in fail(path, "--api-key-file", str(tmp_path / "missing"))
    two_lines = tmp_path / "two"
    two_lines.write_text("key\n\n")
    assert "U+000A" in fail(path, "--api-key-file", str(two_lines))
    assert "not both" in fail(path, "--api-key", "a", "--api-key-file", str(two_lines), code=2)


def test_cuda_without_cuda_names_serves_own_options(runtimes):
    from ortformer.runtime import Runtime

    runtimes["embedder"]
    if Runtime(runtimes.files["embedder"], "auto", threads=1).provider == "cuda":
        pytest.skip("CUDA runs here")
    message = fail(str(runtimes.files["embedder"]), "--provider", "cuda")
    assert "--provider cpu" in message and "--provider auto" in message
    assert "allow_fallback" not in message and "provider=" not in message


def test_limit_flags_out_of_range_are_usage_errors(runtimes):
    runtimes["embedder"]
    path = str(runtimes.files["embedder"])
    assert "--header-timeout" in fail(path, "--header-timeout", "0", code=2)
    assert "--max-connections" in fail(path, "--max-connections", "0", code=2)
    assert "--graceful-shutdown-timeout" in fail(path, "--graceful-shutdown-timeout", "-1", code=2)
