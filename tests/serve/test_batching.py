"""Concurrent clients share model calls yet each gets its own results in its order; a client
that leaves mid-request is dropped from the queue without breaking it; a bounded load of
mixed requests from 16 clients runs without an error and without memory growth."""
from __future__ import annotations

import asyncio
import re
import threading
import time

import numpy as np
import pytest

from support.serve import serving

httpx = pytest.importorskip("httpx")

WORDS = "the quick brown fox jumps over a lazy dog while seven wise owls watch from an old oak".split()


def texts_for(client: int, request: int) -> list[str]:
    """Distinct texts of varied lengths for each (client, request)."""
    rng = np.random.default_rng(client * 1000 + request)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 12)))) + f" {client}-{request}-{k}"
            for k in range(int(rng.integers(1, 5)))]


def metric(text: str, name: str) -> float:
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def test_concurrent_clients_get_their_own_results_in_order(runtimes, monkeypatch):
    runtime, release = runtimes["embedder"], threading.Event()
    real = runtime.run_prepared

    def held(*args, **kwargs):  # the first model call waits until every client has sent a request
        release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(runtime, "run_prepared", held)

    async def client(http, c):
        got = []
        for r in range(4):
            response = await http.post("/embed", json={"inputs": texts_for(c, r), "normalize": False})
            assert response.status_code == 200, response.text
            got.append((texts_for(c, r), np.array(response.json())))
        return got

    async def clients(url):
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            return await asyncio.gather(*(client(http, c) for c in range(16)))

    with serving(runtimes, ["embedder"], max_wait_ms=20) as running:
        answers = []
        thread = threading.Thread(target=lambda: answers.extend(asyncio.run(clients(running.url))))
        thread.start()
        deadline = time.monotonic() + 30
        while metric(httpx.get(f"{running.url}/metrics").text, "te_request_count") < 16:
            assert time.monotonic() < deadline, "the clients' requests did not arrive"
            time.sleep(0.01)
        release.set()
        thread.join(60)
        text = httpx.get(f"{running.url}/metrics").text
    monkeypatch.undo()
    assert len(answers) == 16
    for per_client in answers:
        for texts, got in per_client:
            np.testing.assert_allclose(got, runtime.embed_texts(texts), atol=1e-5, rtol=0)
    assert 'te_request_success{method="batch"} 64.0' in text  # one model: TEI's labels exactly, no model label
    # 64 requests, yet fewer model calls: the 15 requests queued behind the first ran together
    assert metric(text, "te_batch_next_size_count") < 64
    assert metric(text, "te_batch_next_size_sum") == sum(len(texts_for(c, r)) for c in range(16) for r in range(4))


def test_a_client_that_leaves_is_dropped_and_the_queue_goes_on(runtimes, monkeypatch):
    runtime, release, calls = runtimes["embedder"], threading.Event(), []
    real = runtime.run_prepared

    def held(sequences, *args, **kwargs):
        calls.append(len(sequences))
        release.wait(30)
        return real(sequences, *args, **kwargs)

    monkeypatch.setattr(runtime, "run_prepared", held)
    with serving(runtimes, ["embedder"], max_wait_ms=0) as running:
        with httpx.Client(base_url=running.url, timeout=30) as client:
            busy = threading.Thread(target=lambda: client.post("/embed", json={"inputs": "first"}))
            busy.start()  # holds the worker
            deadline = time.monotonic() + 10
            while not calls and time.monotonic() < deadline:
                time.sleep(0.01)
            with pytest.raises(httpx.ReadTimeout):  # queued behind it, then gone
                httpx.post(f"{running.url}/embed", json={"inputs": ["leaves"] * 3}, timeout=0.5)
            while metric(client.get("/metrics").text, 'te_request_failure{err="dropped"}') < 1:
                assert time.monotonic() < deadline + 20, "the server did not see the client leave"
                time.sleep(0.01)
            release.set()
            busy.join(30)
            after = client.post("/embed", json={"inputs": ["after", "the"], "normalize": False})
            assert after.status_code == 200
            np.testing.assert_allclose(after.json(), runtime.embed_texts(["after", "the"]), atol=1e-5, rtol=0)
            text = client.get("/metrics").text
    assert 3 not in calls  # the three inputs of the client that left never ran
    assert metric(text, 'te_request_failure{err="dropped"}') == 1


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/statm"), reason="reads RSS from /proc")
def test_mixed_load_from_16_clients_has_no_error_and_bounded_memory(runtimes):
    routes = [
        ("/embed", lambda c, r: {"inputs": texts_for(c, r)}),
        ("/v1/embeddings", lambda c, r: {"input": texts_for(c, r), "model": "embedder"}),
        ("/embed_all", lambda c, r: {"inputs": texts_for(c, r)[:1]}),
        ("/rerank", lambda c, r: {"query": "fox", "texts": texts_for(c, r), "model": "reranker"}),
        ("/embed", lambda c, r: {"inputs": " ".join(WORDS * 3), "truncate": True}),
    ]

    async def client(http, c, count, failures):
        for r in range(count):
            route, body = routes[(c + r) % len(routes)]
            response = await http.post(route, json=body(c, r))
            if response.status_code != 200:
                failures.append((route, response.status_code, response.text))

    async def load(url, per_client):
        failures = []
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            await asyncio.gather(*(client(http, c, per_client, failures) for c in range(16)))
        return failures

    with serving(runtimes, ["embedder", "reranker"]) as running:
        assert asyncio.run(load(running.url, 10)) == []  # warm: sessions, allocator, connections
        before, start = rss_bytes(), time.monotonic()
        failures = asyncio.run(load(running.url, 125))  # 16 x 125 = 2,000 requests
        seconds, grown = time.monotonic() - start, rss_bytes() - before
        text = httpx.get(f"{running.url}/metrics").text
    assert failures == []
    assert metric(text, "te_request_success") == 16 * 135
    assert seconds < 120, f"2,000 requests took {seconds:.0f} s"
    assert grown < 64 * 2**20, f"RSS grew by {grown / 2**20:.0f} MiB over 2,000 requests"


def test_a_long_request_under_a_stream_of_short_ones_waits_a_bounded_number_of_rounds(runtimes):
    """96 clients keep more short requests queued than a round takes; a long one sent into that
    stream is answered within ceil(tokens queued ahead / round tokens) + 1 rounds (batcher.py),
    while the stream still runs: a batcher that sorted its whole queue by length would keep it
    behind every short one until the stream ends (~50 rounds here)."""
    from ortformer import contract
    from ortformer.serve.batcher import ROUND_BATCHES, Batcher
    from ortformer.serve.metrics import Metrics
    from ortformer.serve.model import ServedModel

    served = ServedModel("m", runtimes["embedder"])
    budget, clients, total = 32, 96, 1600
    short = served.runtime.prepare([np.array([101, 2023, 2003, 102], np.int64)], contract.SENTENCE_EMBEDDING)
    long_ids = np.array([101, *range(2000, 2000 + served.max_input_length - 2), 102], np.int64)

    async def main():
        batcher = Batcher(served, Metrics(["m"], served.max_input_length), max_batch_tokens=budget,
                          max_wait_ms=0, max_concurrent_requests=512)
        batcher.start()
        state = {"sent": 0, "answered": 0}

        async def client():
            while state["sent"] < total:
                state["sent"] += 1
                await batcher.submit(short)
                state["answered"] += 1

        stream = [asyncio.ensure_future(client()) for _ in range(clients)]
        while state["answered"] < 200:  # the stream is flowing and the queue backlogged
            await asyncio.sleep(0.001)
        ahead = batcher._queue.qsize() * int(short.lengths.sum())  # tokens queued before the long request
        done = await batcher.submit(served.runtime.prepare([long_ids], contract.SENTENCE_EMBEDDING))
        answered_then = state["answered"]
        await asyncio.gather(*stream)
        await batcher.stop()
        return done, ahead, answered_then, batcher.rounds

    done, ahead, answered_then, rounds = asyncio.run(main())
    assert ahead > ROUND_BATCHES * budget  # more than one round was waiting ahead of it
    assert done.rounds <= -(-ahead // (ROUND_BATCHES * budget)) + 1, (done.rounds, ahead)
    assert answered_then < total - clients  # answered while short requests kept coming
    assert rounds > 4 * done.rounds  # the stream ran many more rounds than the long request waited
    np.testing.assert_allclose(done.outputs[0], runtimes["embedder"].embed([long_ids])[0], atol=1e-5, rtol=0)
