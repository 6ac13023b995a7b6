"""TEI 1.9's routes beyond 1.8 and the Cohere / Jina rerank, against what the Runtime computes:
/decode, /similarity, /v1/rerank (and /rerank given `documents`), POST / as TEI routes it, and
the huggingface_hub InferenceClient (a TEI client no one here wrote) pointed at the server."""
from __future__ import annotations

import numpy as np
import pytest

from support.serve import serving

httpx = pytest.importorskip("httpx")

TEXTS = ["A short text.", "a much longer text, with many more words in it than the first one has", "why?"]
QUERY = "what is a sparse vector"


@pytest.fixture(scope="module")
def server(runtimes):
    with serving(runtimes, ["embedder", "reranker"]) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


def post(client, route, body, status=200):
    answer = client.post(route, json=body)
    assert answer.status_code == status, answer.text
    return answer.json()


def test_decode_inverts_tokenize(client, server):
    encoder = server.app.models["embedder"].encoder
    ids, _, _ = encoder.encode_rows(TEXTS, 64)
    texts = post(client, "/decode", {"ids": ids})
    assert texts == encoder.decode(ids) and texts[2] == "why?"  # special tokens skipped by default
    with_special = post(client, "/decode", {"ids": ids[2], "skip_special_tokens": False})
    assert with_special == ["[CLS] why? [SEP]"]
    assert "30522" in post(client, "/decode", {"ids": [101, 40000]}, 422)["error"]
    assert post(client, "/decode", {"ids": []}, 400)["error_type"] == "empty"


def test_similarity_is_the_cosine_of_the_embeddings(client, runtimes):
    got = post(client, "/similarity", {"inputs": {"source_sentence": QUERY, "sentences": TEXTS},
                                       "parameters": {"prompt_name": "query", "truncation_direction": "right"}})
    vectors = runtimes["embedder"].embed_texts([QUERY, *TEXTS], prompt_name="query").astype(np.float64)
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    np.testing.assert_allclose(got, unit[1:] @ unit[0], atol=1e-6, rtol=0)
    assert post(client, "/similarity", {"inputs": {"source_sentence": "a", "sentences": []}}, 400)["error_type"] == "empty"
    too_many = {"inputs": {"source_sentence": "a", "sentences": ["b"] * 32}}  # 33 with the source
    assert "batch size 33" in post(client, "/similarity", too_many, 422)["error"]
    assert post(client, "/similarity", {**too_many, "model": "reranker"}, 422)  # the limit comes first
    assert "not an embedding model" in post(client, "/similarity", {"inputs": {"source_sentence": "a",
                                                                               "sentences": ["b"]},
                                                                    "model": "reranker"}, 424)["error"]


def test_cohere_rerank_has_the_scores_of_tei_rerank(client):
    tei = post(client, "/rerank", {"query": QUERY, "texts": TEXTS, "model": "reranker"})
    cohere = post(client, "/v1/rerank", {"query": QUERY, "documents": TEXTS, "model": "reranker"})
    assert [r["index"] for r in cohere["results"]] == [r["index"] for r in tei]
    assert [r["relevance_score"] for r in cohere["results"]] == [r["score"] for r in tei]  # identical floats
    assert all(r["document"] == {"text": TEXTS[r["index"]]} for r in cohere["results"])
    scores = [r["relevance_score"] for r in cohere["results"]]
    assert scores == sorted(scores, reverse=True) and cohere["model"] == "reranker"
    assert cohere["usage"]["total_tokens"] > 0
    top = post(client, "/v1/rerank", {"query": QUERY, "documents": [{"text": t} for t in TEXTS], "top_n": 2,
                                      "return_documents": False, "model": "reranker"})
    assert top["results"] == [{"index": r["index"], "relevance_score": r["relevance_score"]}
                              for r in cohere["results"][:2]]
    same_route = post(client, "/rerank", {"query": QUERY, "documents": TEXTS, "model": "reranker"})
    assert same_route["results"] == cohere["results"]
    assert post(client, "/v1/rerank", {"query": QUERY, "documents": TEXTS}, 424)["error_type"] == "backend"


def test_root_answers_as_tei_routes_it(client):
    embedded = post(client, "/", {"inputs": TEXTS})
    assert embedded == post(client, "/embed", {"inputs": TEXTS})
    similar = post(client, "/", {"inputs": {"source_sentence": QUERY, "sentences": TEXTS}})
    assert similar == post(client, "/similarity", {"inputs": {"source_sentence": QUERY, "sentences": TEXTS}})
    assert client.get("/ping").status_code == 200


def test_huggingface_hub_inference_client(server, client):
    hub = pytest.importorskip("huggingface_hub")
    inference = hub.InferenceClient(model=server.url, provider="hf-inference", token="unused")
    features = inference.feature_extraction(TEXTS[0], normalize=False, truncate=True)
    want = post(client, "/embed", {"inputs": TEXTS[0], "normalize": False})
    np.testing.assert_allclose(np.asarray(features).reshape(1, -1), want, atol=1e-6, rtol=0)
    similarity = inference.sentence_similarity(QUERY, TEXTS)
    np.testing.assert_allclose(similarity, post(client, "/similarity", {
        "inputs": {"source_sentence": QUERY, "sentences": TEXTS}}), atol=1e-6, rtol=0)
    assert inference.health_check(server.url) is True
    assert inference.get_endpoint_info(model=server.url)["model_id"] == "embedder"
    labels = hub.InferenceClient(model=f"{server.url}/predict", provider="hf-inference", token="unused")
    with pytest.raises(hub.errors.HfHubHTTPError) as caught:  # the embedder is no classifier: TEI's 424
        labels.text_classification("a")
    assert caught.value.response.status_code == 424
