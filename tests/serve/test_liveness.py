"""The event loop only routes: /health answers while the server tokenizes a 1.9 MB text (with a
small request waiting for the tokenizer's lock), tokenizes one for /tokenize, or encodes a
large answer; requests are admitted against --max-concurrent-requests before tokenization;
/tokenize is bounded. "Answered while the big request is in flight" is checked by events the
big request sets, never by a timing bound."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait

import numpy as np
import pytest

from ortformer.serve import encoding
from support.serve import serving

httpx = pytest.importorskip("httpx")

BIG = "The quick brown fox jumps over the lazy dog. " * 42_000  # 1.89 MB, ~420,000 tokens


@pytest.fixture(scope="module")
def server(runtimes):
    with serving(runtimes, ["embedder"], payload_limit=2_000_000) as running:
        yield running


class Traced:
    """Wraps obj.name: `started` when a call begins, `finished` when it returns."""

    def __init__(self, monkeypatch, obj, name: str):
        self.started, self.finished = threading.Event(), threading.Event()
        real = getattr(obj, name)

        def traced(*args, **kwargs):
            self.started.set()
            try:
                return real(*args, **kwargs)
            finally:
                self.finished.set()

        monkeypatch.setattr(obj, name, traced)


def _in_background(url: str, route: str, body: dict) -> tuple[threading.Thread, dict]:
    answer: dict = {}

    def send():
        with httpx.Client(base_url=url, timeout=120) as client:
            answer["response"] = client.post(route, json=body)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread, answer


def _health_answers_while(server, traced: Traced, thread: threading.Thread, answer: dict, small=None) -> None:
    assert traced.started.wait(60), "the big request never started"
    with httpx.Client(base_url=server.url, timeout=60) as client:
        waiting = None
        if small is not None:  # a small request that needs the tokenizer's lock, held by the big one
            waiting = ThreadPoolExecutor(1).submit(lambda: client.post(small[0], json=small[1]))
        assert client.get("/health").status_code == 200
        assert not traced.finished.is_set(), "/health was answered only after the big request's work"
        thread.join(120)
        assert answer["response"].status_code in (200, 422), answer["response"].text[:200]
        if waiting is not None:
            assert waiting.result(60).status_code == 200


def test_health_answers_during_a_huge_tokenization(server, monkeypatch):
    served = server.app.models["embedder"]
    traced = Traced(monkeypatch, served.encoder, "encode_rows")
    thread, answer = _in_background(server.url, "/embed", {"inputs": BIG, "truncate": True})
    _health_answers_while(server, traced, thread, answer, small=("/embed", {"inputs": "small"}))
    assert answer["response"].status_code == 200


def test_health_answers_while_tokenize_reads_a_huge_text(server, monkeypatch):
    traced = Traced(monkeypatch, server.app.models["embedder"].encoder, "tokens")
    thread, answer = _in_background(server.url, "/tokenize", {"inputs": BIG})
    _health_answers_while(server, traced, thread, answer)
    error = answer["response"].json()["error"]  # past the bound of what /tokenize returns
    assert answer["response"].status_code == 422 and str(encoding.TOKENIZE_MAX_TOKENS) in error


def test_health_answers_while_a_huge_answer_is_encoded(server, monkeypatch):
    from ortformer.serve import app as app_module

    states = [np.random.default_rng(0).standard_normal((2000, 256)).astype(np.float32)] * 4  # ~40 MB of JSON

    async def embed_all(*args, **kwargs):
        return states

    monkeypatch.setattr(server.app.models["embedder"], "embed_all", embed_all)
    traced = Traced(monkeypatch, app_module, "json_bytes")
    thread, answer = _in_background(server.url, "/embed_all", {"inputs": "a"})
    _health_answers_while(server, traced, thread, answer)
    got = answer["response"].json()
    assert len(got) == 4 and np.array_equal(np.asarray(got[3], np.float32), states[3])


def test_requests_are_admitted_before_tokenization(runtimes, monkeypatch):
    """40 concurrent texts against --max-concurrent-requests 16, tokenization held: the 16
    admitted wait in tokenization, the other 24 get 429 at once."""
    release = threading.Event()
    with serving(runtimes, ["embedder"], max_concurrent_requests=16) as running:
        encoder = running.app.models["embedder"].encoder
        real = encoder.encode_rows

        def held(*args, **kwargs):
            release.wait(60)
            return real(*args, **kwargs)

        monkeypatch.setattr(encoder, "encode_rows", held)
        text = "word " * 20_000  # 100 KB each
        with httpx.Client(base_url=running.url, timeout=120, limits=httpx.Limits(max_connections=40)) as client, \
                ThreadPoolExecutor(40) as pool:
            futures = [pool.submit(client.post, "/embed", json={"inputs": text, "truncate": True}) for _ in range(40)]
            try:  # the 24 refusals come at admission, while the 16 admitted are held in tokenization
                deadline = time.monotonic() + 60
                while sum(f.done() for f in futures) < 24 and time.monotonic() < deadline:
                    time.sleep(0.02)
                early = [f.result().status_code for f in futures if f.done()]
            finally:
                release.set()
            codes = sorted(f.result().status_code for f in futures)
    assert early == [429] * 24 and codes.count(429) == 24 and codes.count(200) == 16, (early, codes)
    assert "max-concurrent-requests 16" in next(f.result() for f in futures if f.result().status_code == 429).text


def test_tokenize_obeys_the_limits(runtimes):
    with serving(runtimes, ["embedder"], max_client_batch_size=4, payload_limit=4000) as running, \
            httpx.Client(base_url=running.url, timeout=30) as client:
        assert client.post("/tokenize", json={"inputs": ["a"] * 5}).status_code == 422
        assert client.post("/tokenize", json={"inputs": "x" * 5000}).status_code == 413
        assert client.post("/decode", json={"ids": [[101]] * 5}).status_code == 422
        assert client.post("/tokenize", json={"inputs": ["a"] * 4}).status_code == 200
