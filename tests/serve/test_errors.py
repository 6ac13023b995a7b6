"""Every error code of the server, with TEI 1.9's JSON body: 400 empty, 401 API key, 413 payload,
422 batch size, over-long input and a body that is not the request (TEI's "validation"),
424 a route the model cannot serve or a model failure, 429 a full queue, 503 unhealthy."""
from __future__ import annotations

import asyncio
import threading

import pytest

from support.serve import serving

httpx = pytest.importorskip("httpx")


@pytest.fixture(scope="module")
def server(runtimes):
    with serving(runtimes, ["embedder", "classifier"], max_client_batch_size=4, payload_limit=4000,
                 api_key="secret") as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=30, headers={"Authorization": "Bearer secret"}) as client:
        yield client


def error(response, status: int, error_type: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "error_type"} and body["error_type"] == error_type, body
    return body["error"]


def test_api_key_guards_every_route_but_health_and_metrics(server, client):
    with httpx.Client(base_url=server.url, timeout=30) as anonymous:
        assert "Bearer" in error(anonymous.post("/embed", json={"inputs": "x"}), 401, "unauthorized")
        wrong = anonymous.post("/embed", json={"inputs": "x"}, headers={"Authorization": "Bearer nope"})
        error(wrong, 401, "unauthorized")
        error(anonymous.get("/info"), 401, "unauthorized")
        assert anonymous.get("/health").status_code == 200
        assert "te_request_failure" in anonymous.get("/metrics").text
    assert client.post("/embed", json={"inputs": "x"}).status_code == 200


def test_limits_are_tei_19s_codes(client):
    assert "payload-limit 4000" in error(client.post("/embed", json={"inputs": ["x" * 5000]}), 413, "validation")
    message = error(client.post("/embed", json={"inputs": ["a"] * 5}), 422, "validation")
    assert message == "batch size 5 > maximum allowed batch size 4"
    long = " ".join(["word"] * 40)  # past the 24 tokens the embedder takes
    assert "truncate" in error(client.post("/embed", json={"inputs": [long]}), 422, "validation")
    assert client.post("/embed", json={"inputs": [long], "truncate": True}).status_code == 200
    assert "'query'" in error(client.post("/embed", json={"inputs": "x", "prompt_name": "nope"}), 422, "validation")
    # a task on a model without task adapters: the model's name, never its file's path
    message = error(client.post("/embed", json={"inputs": "x", "task": "retrieval.query"}), 422, "validation")
    assert "has none" in message and "'embedder'" in message and ".onnx" not in message
    assert "empty" in error(client.post("/embed", json={"inputs": ["a", ""]}), 400, "empty")


def test_auto_truncate_cuts_unless_the_request_says_not(runtimes):
    long = " ".join(["word"] * 40)
    with serving(runtimes, ["embedder"], auto_truncate=True) as running, httpx.Client(base_url=running.url) as c:
        assert c.post("/embed", json={"inputs": [long]}).status_code == 200
        error(c.post("/embed", json={"inputs": [long], "truncate": False}), 422, "validation")


def test_bodies_that_are_not_the_request_are_422(client):
    assert "JSON" in error(client.post("/embed", content=b"{not json", headers={"content-type": "application/json"}), 422, "validation")
    error(client.post("/embed", json={"input": "x"}), 422, "validation")  # the field is `inputs`
    error(client.post("/embed", json={"inputs": 3}), 422, "validation")
    error(client.post("/embed", json={"inputs": "x", "truncation_direction": "up"}), 422, "validation")
    error(client.post("/embed", json={"inputs": "x", "normalize": "yes"}), 422, "validation")
    assert "1 to 32" in error(client.post("/embed", json={"inputs": "x", "dimensions": 33}), 422, "validation")
    assert "[0, 30522)" in error(client.post("/embed", json={"inputs": [[5, 40000]]}), 422, "validation")
    assert "empty" in error(client.post("/embed", json={"inputs": []}), 400, "empty")


def test_openai_route_answers_errors_in_its_shape(server, client):
    response = client.post("/v1/embeddings", json={"input": "one", "encoding_format": "int8"})
    assert response.status_code == 422
    body = response.json()
    assert set(body) == {"message", "code", "type"} and body["code"] == 422 and "2 inputs" in body["message"]
    openai = pytest.importorskip("openai")
    sdk = openai.OpenAI(base_url=f"{server.url}/v1", api_key="secret", max_retries=0)
    with pytest.raises(openai.APIStatusError) as caught:
        sdk.embeddings.create(input=["a"] * 5, model="embedder")
    assert caught.value.status_code == 422
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0).embeddings.create(input="a",
                                                                                                    model="embedder")


def test_routes_a_model_cannot_serve_are_424(client):
    assert "re-ranker" in error(client.post("/rerank", json={"query": "q", "texts": ["a"]}), 424, "backend")
    assert "classifier" in error(client.post("/predict", json={"inputs": "a"}), 424, "backend")
    assert "SPLADE" in error(client.post("/embed_sparse", json={"inputs": "a"}), 424, "backend")
    for route in ("/embed", "/embed_all", "/v1/embeddings"):  # as TEI: a classifier is not an embedding model
        body = {"inputs": "a", "input": "a", "model": "classifier"}
        response = client.post(route, json=body)
        assert response.status_code == 424 and "not an embedding model" in response.text
    assert "served" in error(client.post("/embed", json={"inputs": "a", "model": "other"}), 422, "validation")


def test_a_model_failure_is_424_and_the_next_request_runs(server, client, monkeypatch):
    runtime = server.app.models["embedder"].runtime

    def broken(*args, **kwargs):
        raise RuntimeError("onnxruntime exploded")

    monkeypatch.setattr(runtime, "run_prepared", broken)
    assert "exploded" in error(client.post("/embed", json={"inputs": "a"}), 424, "backend")
    monkeypatch.undo()
    assert client.post("/embed", json={"inputs": "a"}).status_code == 200


def test_a_full_queue_is_429(runtimes, monkeypatch):
    runtime, release, entered = runtimes["embedder"], threading.Event(), threading.Event()
    real = runtime.run_prepared

    def held(*args, **kwargs):
        entered.set()
        release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(runtime, "run_prepared", held)
    with serving(runtimes, ["embedder"], max_concurrent_requests=1) as running:
        with httpx.Client(base_url=running.url, timeout=30) as first, \
                httpx.Client(base_url=running.url, timeout=30) as second:
            answer = {}
            thread = threading.Thread(target=lambda: answer.update(r=first.post("/embed", json={"inputs": "a"})))
            thread.start()
            assert entered.wait(10)
            assert "overloaded" in error(second.post("/embed", json={"inputs": "b"}), 429, "overloaded")
            release.set()
            thread.join(30)
            assert answer["r"].status_code == 200
            assert second.post("/embed", json={"inputs": "b"}).status_code == 200


def test_a_stopped_worker_makes_the_server_unhealthy(runtimes):
    with serving(runtimes, ["embedder"]) as running, httpx.Client(base_url=running.url) as client:
        batcher = running.app.batchers["embedder"]
        loop = running.server.servers[0].get_loop()
        asyncio.run_coroutine_threadsafe(_cancel(batcher), loop).result(10)
        assert error(client.get("/health"), 503, "unhealthy") == "unhealthy"
        assert "not serving" in error(client.post("/embed", json={"inputs": "a"}), 503, "unhealthy")


async def _cancel(batcher) -> None:
    batcher._task.cancel()
    await asyncio.gather(batcher._task, return_exceptions=True)
