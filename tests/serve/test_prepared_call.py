"""Serve validates each sequence once, when its request arrives (Runtime.prepare on the model's
tokenization thread): a bad input is that request's own 422, and the queue joins the prepared
requests (PreparedBatch.concat) into model calls that run as cut, checking nothing again."""
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")

from ortformer.runtime import PreparedBatch, batching  # noqa: E402
from ortformer.serve.batcher import Batcher  # noqa: E402
from support.serve import serving  # noqa: E402


@pytest.fixture
def checks(monkeypatch):
    """Each sequence the input validator checks (prepare checks one sequence per call)."""
    calls = []
    real = batching.check_inputs
    monkeypatch.setattr(batching, "check_inputs", lambda spec, given: calls.append(1) or real(spec, given))
    return calls


def test_a_queue_call_runs_prepared_parts_as_cut_without_checking_them(runtimes, checks, monkeypatch):
    runtime = runtimes["embedder"]
    fed = []
    real_execute = runtime._execute
    monkeypatch.setattr(runtime, "_execute", lambda feeds, **kw: fed.append(feeds) or real_execute(feeds, **kw))
    sequences = [np.array([101, 7592, 2088, 102]), np.array([101, 102]), np.array([101, 7592, 102])]
    parts = [runtime.prepare(sequences[:2], "sentence_embedding"), runtime.prepare(sequences[2:], "sentence_embedding")]
    assert len(checks) == len(sequences)
    queue = type("Queue", (), {"model": type("Model", (), {"runtime": runtime})})
    got = Batcher._call(queue, PreparedBatch.concat(parts))
    assert len(checks) == len(sequences) and len(fed) == 1  # joined and run: no second check
    assert fed[0]["attention_mask"].sum(axis=1).tolist() == [4, 2, 3]
    for sequence, row in zip(sequences, got):
        np.testing.assert_allclose(row, runtime.run(input_ids=sequence[None])["sentence_embedding"][0],
                                   atol=1e-5, rtol=0)


def test_the_serve_path_validates_each_sequence_once(runtimes, checks):
    """HTTP /embed from concurrent clients (texts and token ids, sharing the queue's model calls)
    and gRPC's Embed: as many checks as sequences, none in the queue or the model call."""
    grpc = pytest.importorskip("grpc")
    from ortformer.serve.grpc import tei_pb2 as pb
    from ortformer.serve.grpc import tei_pb2_grpc as pb_grpc
    from ortformer.serve.grpc import with_grpc

    bodies = [{"inputs": [f"text {c} number {k}" for k in range(c + 1)]} for c in range(6)]
    bodies += [{"inputs": [[101, 7592 + c, 2088, 102], [101, 102]]} for c in range(3)]
    sequences = sum(len(body["inputs"]) for body in bodies)
    with serving(runtimes, ["embedder"], wrap=lambda app: with_grpc(app, "127.0.0.1", 0), max_wait_ms=20) as running:
        before = len(checks)
        with httpx.Client(base_url=running.url, timeout=60) as client, ThreadPoolExecutor(len(bodies)) as pool:
            answers = list(pool.map(lambda body: client.post("/embed", json=body), bodies))
        assert [a.status_code for a in answers] == [200] * len(bodies), [a.text for a in answers]
        assert len(checks) - before == sequences
        with grpc.insecure_channel(f"127.0.0.1:{running.asgi.state.grpc_port}") as channel:
            got = pb_grpc.EmbedStub(channel).Embed(pb.EmbedRequest(inputs="one more text"), timeout=60)
        assert len(got.embeddings) > 0 and len(checks) - before == sequences + 1
    assert [len(a.json()) for a in answers] == [len(body["inputs"]) for body in bodies]


def test_a_bad_id_is_its_own_requests_422_while_its_round_runs_the_others(runtimes, monkeypatch):
    """A request with an id outside the vocabulary is answered 422 at once, even while the queue
    holds the other clients' requests for a shared model call; they are answered 200."""
    runtime = runtimes["embedder"]
    started, release = threading.Event(), threading.Event()
    real = runtime.run_prepared

    def held(batch):  # the first model call waits until the bad request has been answered
        started.set()
        release.wait(30)
        return real(batch)

    monkeypatch.setattr(runtime, "run_prepared", held)
    good = [{"inputs": [[101, 2000 + c, 2001 + c, 102]]} for c in range(3)]
    try:
        with serving(runtimes, ["embedder"], max_wait_ms=20) as running, \
                httpx.Client(base_url=running.url, timeout=60) as client, ThreadPoolExecutor(3) as pool:
            first = pool.submit(client.post, "/embed", json=good[0])
            assert started.wait(30), "the first model call did not start"
            others = [pool.submit(client.post, "/embed", json=body) for body in good[1:]]
            bad = client.post("/embed", json={"inputs": [[101, 102], [5, 40000]]})
            assert bad.status_code == 422, bad.text
            message = bad.json()["error"]
            assert bad.json()["error_type"] == "validation"
            assert "input 1" in message and "[0, 30522)" in message and "'embedder'" in message
            assert not any(f.done() for f in [first, *others])  # still held in the queue's model call
            release.set()
            answers = [f.result(60) for f in [first, *others]]
    finally:
        release.set()
    for body, answer in zip(good, answers):
        assert answer.status_code == 200, answer.text
        want = real(runtime.prepare(body["inputs"], "sentence_embedding"))["sentence_embedding"]
        np.testing.assert_allclose(answer.json(), want / np.linalg.norm(want, axis=1, keepdims=True),
                                   atol=1e-5, rtol=0)


def test_a_text_the_tokenizer_gives_an_unknown_id_is_a_tokenizer_422(runtimes, monkeypatch):
    """An added token the model never learned: the request's own 422 "tokenizer", naming the input."""
    with serving(runtimes, ["embedder"]) as running, httpx.Client(base_url=running.url, timeout=60) as client:
        encoder = running.app.models["embedder"].encoder
        real = encoder.encode_rows

        def past_the_vocabulary(texts, *args, **kwargs):
            rows, types, cut = real(texts, *args, **kwargs)
            return [list(row[:-1]) + [30522] if "added" in text else row for text, row in zip(texts, rows)], types, cut

        monkeypatch.setattr(encoder, "encode_rows", past_the_vocabulary)
        answer = client.post("/embed", json={"inputs": ["plain", "an added token"]})
        assert answer.status_code == 422 and answer.json()["error_type"] == "tokenizer", answer.text
        assert "input 1" in answer.json()["error"] and "[0, 30522)" in answer.json()["error"]
        assert client.post("/embed", json={"inputs": ["plain"]}).status_code == 200
