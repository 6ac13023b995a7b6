"""Hostile clients on raw sockets against the connection limits (ortformer.serve.limits):
oversized and too many headers (431), slow headers and bodies (408, closed), silent and
CR/LF-only connections, the connection cap, answers a client never reads; also 415 for a body
not declared JSON, and an API key beyond ASCII compared over its UTF-8 bytes.

Timeouts here are a fraction of a second; each wait on the server is a bounded poll whose
bound is many times the timeout, so a loaded machine slows a test but does not fail it."""
from __future__ import annotations

import json
import re
import socket
import time
from urllib.parse import urlsplit

import pytest

from ortformer.core.errors import InputError
from ortformer.serve.limits import Limits
from support.serve import serving

httpx = pytest.importorskip("httpx")

FAST = Limits(max_connections=64, max_header_bytes=2048, max_headers=20, keep_alive_timeout=0.5,
              header_timeout=0.5, body_timeout=0.5, write_timeout=0.5)
BOUND_S = 15.0  # the longest any wait below may take


@pytest.fixture(scope="module")
def server(runtimes):
    with serving(runtimes, ["embedder"], limits=FAST) as running:
        yield running


def connect(url: str, receive_buffer: int | None = None) -> socket.socket:
    parts = urlsplit(url)
    sock = socket.socket()
    if receive_buffer is not None:  # set before connecting, so the window is small from the start
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.settimeout(BOUND_S)
    sock.connect((parts.hostname, parts.port))
    return sock


def read_to_end(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a reset ends it too)."""
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


def connections(running) -> int:
    return len(running.server.server_state.connections)


def settles(condition) -> bool:
    deadline = time.monotonic() + BOUND_S
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def status(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    return int(answer[9:12])


def head(*lines: str) -> bytes:
    return ("\r\n".join(["POST /embed HTTP/1.1", "Host: x", *lines]) + "\r\n\r\n").encode()


def test_a_head_past_max_header_bytes_is_431(server):
    with connect(server.url) as sock:
        sock.sendall(head("X-Big: " + "a" * 3000))
        answer = read_to_end(sock)
    assert status(answer) == 431 and b"--max-header-bytes 2048" in answer


def test_a_header_that_never_ends_is_cut_at_the_limit(server):
    # one header value sent in pieces and never finished: llhttp would buffer it without end
    with connect(server.url) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nX-Big: ")
        sent, closed = 0, False
        while sent < 64 * 2048 and not closed:
            try:
                sock.sendall(b"a" * 1024)
                sent += 1024
            except (BrokenPipeError, ConnectionResetError):
                closed = True
            time.sleep(0.002)  # each piece its own read on the server
        answer = read_to_end(sock)
    assert closed or status(answer) == 431
    assert sent < 64 * 2048  # refused long before the client gave up


def test_more_than_max_headers_is_431(server):
    with connect(server.url) as sock:
        sock.sendall(head(*[f"X-{i}: v" for i in range(25)]))
        answer = read_to_end(sock)
    assert status(answer) == 431 and b"--max-headers 20" in answer


def test_a_head_within_the_limits_is_served(server):
    with connect(server.url) as sock:
        body = b'{"inputs": "a text"}'
        sock.sendall(head(*[f"X-{i}: v" for i in range(15)], "Content-Type: application/json",
                          f"Content-Length: {len(body)}", "Connection: close") + body)
        assert status(read_to_end(sock)) == 200


def test_a_slow_header_sender_is_answered_408_and_closed(server):
    with connect(server.url) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        for _ in range(200):  # 1 byte every 20 ms: far past --header-timeout 0.5 s
            try:
                sock.sendall(b"x")
            except (BrokenPipeError, ConnectionResetError):
                break
            time.sleep(0.02)
            sock.settimeout(0)
            try:
                answer = sock.recv(65536)
                break
            except BlockingIOError:
                pass
            finally:
                sock.settimeout(BOUND_S)
        else:
            pytest.fail("the server kept a slowloris connection open")
    assert status(answer) == 408 and b"--header-timeout" in answer


def test_a_stalled_body_is_answered_408_and_closed(server):
    with connect(server.url) as sock:
        sock.sendall(head("Content-Type: application/json", "Content-Length: 100") + b'{"inputs": ')
        answer = read_to_end(sock)  # the client sends nothing more
    assert status(answer) == 408 and b"--body-timeout" in answer
    assert settles(lambda: connections(server) == 0)


def test_silent_and_crlf_only_connections_are_closed(server):
    silent = [connect(server.url) for _ in range(5)]
    chatty = connect(server.url)
    try:
        for _ in range(200):  # CR/LF between requests is allowed, but it is no request
            try:
                chatty.sendall(b"\r\n")
            except (BrokenPipeError, ConnectionResetError):
                break
            time.sleep(0.02)
        # each read ends only when the server closes (the socket's timeout fails it otherwise)
        assert all(read_to_end(sock) == b"" for sock in [*silent, chatty])
        assert settles(lambda: connections(server) == 0)
    finally:
        for sock in [*silent, chatty]:
            sock.close()


def test_an_answer_the_client_never_reads_is_aborted(server):
    # pipelined requests whose answers fill a small receive window and the server's buffers
    sock = connect(server.url, receive_buffer=4096)
    try:
        # 32 texts x 22 tokens x 32 floats: about 0.4 MB of JSON per answer
        body = json.dumps({"inputs": [" ".join(["word"] * 20)] * 32}).encode()
        request = head("Content-Type: application/json", f"Content-Length: {len(body)}") + body
        request = request.replace(b"/embed ", b"/embed_all ")
        sock.sendall(request * 20)
        assert sock.recv(1, socket.MSG_PEEK)  # the server has the connection and answers (unread)
        assert settles(lambda: connections(server) == 0)  # after --write-timeout, not never
    finally:
        sock.close()


def test_a_connection_past_the_cap_is_answered_503(runtimes):
    capped = Limits(max_connections=4, keep_alive_timeout=60)
    with serving(runtimes, ["embedder"], limits=capped) as running:
        held = [connect(running.url) for _ in range(4)]
        try:
            assert settles(lambda: connections(running) == 4)
            with connect(running.url) as extra:
                answer = read_to_end(extra)
            assert status(answer) == 503 and b"too many open connections" in answer
            held.pop().close()
            assert settles(lambda: connections(running) == 3)
            assert httpx.get(running.url + "/health", timeout=BOUND_S).status_code == 200
        finally:
            for sock in held:
                sock.close()


def test_a_body_not_declared_json_is_415(server):
    with httpx.Client(base_url=server.url, timeout=BOUND_S) as client:
        body = b'{"inputs": "a text"}'
        for declared in (None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                         "application/jsonx", "text/json"):
            headers = {} if declared is None else {"content-type": declared}
            answer = client.post("/embed", content=body, headers=headers)
            assert answer.status_code == 415, (declared, answer.text)
            assert answer.json()["error_type"] == "validation" and "application/json" in answer.json()["error"]
        for declared in ("application/json", "Application/JSON; charset=UTF-8", "application/vnd.api+json"):
            assert client.post("/embed", content=body, headers={"content-type": declared}).status_code == 200
        assert client.get("/health").status_code == 200  # a route without a body needs no type


def test_a_key_beyond_ascii_matches_its_utf8_bytes(runtimes):
    key = "clé-ключ-🔑"
    with serving(runtimes, ["embedder"], api_key=key) as running, \
            httpx.Client(base_url=running.url, timeout=BOUND_S) as client:
        def embed(authorization: bytes) -> int:
            return client.post("/embed", json={"inputs": "x"}, headers={"authorization": authorization}).status_code

        assert embed(b"Bearer " + key.encode("utf-8")) == 200
        assert embed(b"Bearer " + key.encode("utf-8")[:-1]) == 401
        assert embed(b"Bearer " + key.upper().encode("utf-8")) == 401
        assert embed(b"Bearer cl\xe9-") == 401  # the latin-1 spelling is another key


@pytest.mark.parametrize("key, says", [("", "empty"), ("a\x00b", "U+0000"), ("line\nbreak", "U+000A"),
                                       ("tab\tinside", "U+0009"), ("\x7f", "U+007F"), (" padded", "whitespace"),
                                       ("\ud800", "U+D800")])
def test_a_key_no_client_can_send_is_refused(key, says):
    from ortformer.serve import ServeOptions

    with pytest.raises(InputError, match=re.escape(says)):
        ServeOptions(api_key=key)


def test_limits_are_checked():
    with pytest.raises(InputError, match="header_timeout"):
        Limits(header_timeout=0)
    with pytest.raises(InputError, match="max_connections"):
        Limits(max_connections=0)


def test_a_head_under_the_limit_sent_in_small_pieces_is_served(server):
    # 1,800 of the 2,048 bytes, a few bytes per read: no count may add a piece twice
    request = head(*[f"X-{i}: {'v' * 90}" for i in range(18)], "Connection: close").replace(b"POST /embed", b"GET /health")
    assert 1500 < len(request) < 2048
    with connect(server.url) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for start in range(0, len(request), 64):
            sock.sendall(request[start:start + 64])
            time.sleep(0.001)  # each piece its own read on the server
        assert status(read_to_end(sock)) == 200
