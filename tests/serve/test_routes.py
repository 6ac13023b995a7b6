"""Every route of a real server on a loopback port answers what the Runtime computes for the
same texts, in TEI's (and OpenAI's) response shapes."""
from __future__ import annotations

import base64

import numpy as np
import pytest

from ortformer.config.text import TruncationWarning
from support.serve import PROMPTS, post, serving

httpx = pytest.importorskip("httpx")

TEXTS = ["A short text.", "a much longer text, with many more words in it than the first one has", "why?"]


@pytest.fixture(scope="module")
def server(runtimes):
    with serving(runtimes, ["embedder", "reranker", "classifier", "splade"]) as running:  # the first is the default
        yield running


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


def normalized(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_embed_equals_embed_texts(client, runtimes):
    runtime = runtimes["embedder"]
    raw = np.array(post(client, "/embed", {"inputs": TEXTS, "normalize": False}))
    np.testing.assert_allclose(raw, runtime.embed_texts(TEXTS), atol=1e-5, rtol=0)
    unit = np.array(post(client, "/embed", {"inputs": TEXTS}))  # TEI normalizes by default
    np.testing.assert_allclose(unit, normalized(runtime.embed_texts(TEXTS)), atol=1e-5, rtol=0)
    one = post(client, "/embed", {"inputs": TEXTS[2], "normalize": False})  # a single text: still a list of one
    np.testing.assert_allclose(one, runtime.embed_texts(TEXTS[2:]), atol=1e-5, rtol=0)


def test_embed_prompt_dimensions_and_token_ids(client, runtimes):
    runtime = runtimes["embedder"]
    prompted = np.array(post(client, "/embed", {"inputs": TEXTS, "prompt_name": "query", "normalize": False}))
    np.testing.assert_allclose(prompted, runtime.embed_texts(TEXTS, prompt_name="query"), atol=1e-5, rtol=0)
    assert not np.allclose(prompted, runtime.embed_texts(TEXTS), atol=1e-3)
    short = np.array(post(client, "/embed", {"inputs": TEXTS, "dimensions": 8}))  # Matryoshka: cut, then normalize
    np.testing.assert_allclose(short, normalized(runtime.embed_texts(TEXTS)[:, :8]), atol=1e-5, rtol=0)
    ids = [[101, 7592, 2088, 102], [101, 102]]  # token ids run as given
    got = np.array(post(client, "/embed", {"inputs": ids, "normalize": False}))
    np.testing.assert_allclose(got, runtime.embed(ids), atol=1e-5, rtol=0)
    single_ids = post(client, "/embed", {"inputs": ids[0], "normalize": False})  # a list of ints is ONE input
    np.testing.assert_allclose(single_ids, runtime.embed(ids[:1]), atol=1e-5, rtol=0)


def test_truncation_follows_the_request(client, runtimes):
    runtime = runtimes["embedder"]
    long = " ".join(["word"] * 60)  # past the model's 24-token text_max_length
    right = np.array(post(client, "/embed", {"inputs": [long + " end"], "truncate": True, "normalize": False}))
    left = np.array(post(client, "/embed", {"inputs": ["start " + long], "truncate": True,
                                            "truncation_direction": "Left", "normalize": False}))
    with pytest.warns(TruncationWarning):
        np.testing.assert_allclose(right, runtime.embed_texts([long + " end"]), atol=1e-5, rtol=0)
    with pytest.warns(TruncationWarning):
        np.testing.assert_allclose(left, runtime.embed_texts([long]), atol=1e-5, rtol=0)  # "start" was cut


def test_embed_all_is_every_token_state(client, runtimes):
    got = post(client, "/embed_all", {"inputs": TEXTS})
    want = runtimes["embedder"].embed_texts(TEXTS, output="last_hidden_state")
    assert [len(g) for g in got] == [len(w) for w in want]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-5, rtol=0)


def test_embed_sparse_is_the_nonzero_splade_weights(client, runtimes):
    rows = post(client, "/embed_sparse", {"inputs": TEXTS, "model": "splade"})
    want = runtimes["splade"].embed_texts(TEXTS)
    for row, dense in zip(rows, want):
        assert [e["index"] for e in row] == np.flatnonzero(dense).tolist()
        np.testing.assert_allclose([e["value"] for e in row], dense[dense != 0], atol=1e-5, rtol=0)
    dense = post(client, "/embed", {"inputs": TEXTS, "model": "splade", "normalize": False})  # as TEI: unnormalized
    np.testing.assert_allclose(dense, want, atol=1e-5, rtol=0)
    for route, body in (("/embed", {"inputs": "a"}), ("/v1/embeddings", {"input": "a"})):  # both would normalize
        assert "SPLADE" in post(client, route, {**body, "model": "splade"}, status=424)["error" if route == "/embed"
                                                                                       else "message"]


def test_rerank_scores_pairs_by_sigmoid_highest_first(client, runtimes):
    query = "what is a sparse vector"
    ranks = post(client, "/rerank", {"query": query, "texts": TEXTS, "model": "reranker", "return_text": True})
    logits = runtimes["reranker"].embed_texts([query] * len(TEXTS), output="logits", pairs=TEXTS)[:, 0]
    want = 1 / (1 + np.exp(-logits.astype(np.float64)))
    assert [r["index"] for r in ranks] == np.argsort(-want, kind="stable").tolist()
    for rank in ranks:
        assert rank["text"] == TEXTS[rank["index"]]
        assert rank["score"] == pytest.approx(want[rank["index"]], abs=1e-5)
    raw = post(client, "/rerank", {"query": query, "texts": TEXTS, "model": "reranker", "raw_scores": True})
    assert "text" not in raw[0]
    assert {r["index"]: r["score"] for r in raw} == pytest.approx(dict(enumerate(logits.tolist())), abs=1e-5)


def test_predict_labels_softmax_and_pairs(client, runtimes):
    runtime = runtimes["classifier"]
    got = post(client, "/predict", {"inputs": TEXTS[0], "model": "classifier"})  # one text: one list
    logits = runtime.embed_texts(TEXTS[:1], output="logits")[0].astype(np.float64)
    want = np.exp(logits) / np.exp(logits).sum()
    labels = ["negative", "neutral", "positive"]
    assert [p["label"] for p in got] == [labels[k] for k in np.argsort(-want)]
    assert {p["label"]: p["score"] for p in got} == pytest.approx(dict(zip(labels, want)), abs=1e-5)
    batch = post(client, "/predict", {"inputs": [[TEXTS[0], TEXTS[1]], [TEXTS[2]]], "model": "classifier",
                                      "raw_scores": True})
    pair = runtime.embed_texts(TEXTS[:1], output="logits", pairs=TEXTS[1:2])[0]
    assert {p["label"]: p["score"] for p in batch[0]} == pytest.approx(dict(zip(labels, pair.tolist())), abs=1e-5)
    alone = runtime.embed_texts(TEXTS[2:], output="logits")[0]
    assert {p["label"]: p["score"] for p in batch[1]} == pytest.approx(dict(zip(labels, alone.tolist())), abs=1e-5)


def test_tokenize_gives_ids_offsets_and_special_tokens(client, server):
    encoder = server.app.models["embedder"].encoder
    got = post(client, "/tokenize", {"inputs": ["Hello world"], "prompt_name": "query"})[0]
    text = PROMPTS["query"] + "Hello world"
    ids, _, _ = encoder.encode_rows([text], 64)
    assert [t["id"] for t in got] == ids[0]
    assert got[0] == {"id": 101, "text": "[CLS]", "special": True, "start": None, "stop": None}
    assert [t["text"] for t in got[1:-1]] == ["query", ":", "Hello", "world"]
    assert all(text[t["start"]:t["stop"]] == t["text"] for t in got[1:-1])
    plain = post(client, "/tokenize", {"inputs": "Hello world", "add_special_tokens": False})
    assert [t["id"] for t in plain[0]] == ids[0][3:-1]  # no [CLS] / [SEP], no prompt ("query", ":")


def test_openai_client_gets_the_normalized_embeddings(server, runtimes):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    want = normalized(runtimes["embedder"].embed_texts(TEXTS))
    answer = client.embeddings.create(input=TEXTS, model="embedder")  # the client asks for base64 and decodes it
    assert [d.index for d in answer.data] == [0, 1, 2] and answer.model == "embedder"
    np.testing.assert_allclose([d.embedding for d in answer.data], want, atol=1e-5, rtol=0)
    tokens = sum(len(ids) for ids in server.app.models["embedder"].encoder.encode_rows(TEXTS, 24)[0])
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == tokens
    floats = client.embeddings.create(input=TEXTS[0], model="embedder", encoding_format="float", dimensions=8)
    np.testing.assert_allclose([floats.data[0].embedding], normalized(want[:1, :8]), atol=1e-5, rtol=0)


def test_openai_quantized_formats_are_sentence_transformers(client, runtimes):
    quantization = pytest.importorskip("sentence_transformers.util.quantization")
    vectors = normalized(runtimes["embedder"].embed_texts(TEXTS)).astype(np.float32)
    for precision in ("int8", "uint8", "binary", "ubinary"):
        got = post(client, "/v1/embeddings", {"input": TEXTS, "encoding_format": precision})
        want = quantization.quantize_embeddings(vectors, precision=precision)
        assert [d["embedding"] for d in got["data"]] == want.tolist(), precision
    b64 = post(client, "/v1/embeddings", {"input": [[101, 7592, 102]], "encoding_format": "base64"})
    decoded = np.frombuffer(base64.b64decode(b64["data"][0]["embedding"]), "<f4")
    np.testing.assert_allclose(decoded, normalized(runtimes["embedder"].embed([[101, 7592, 102]]))[0], atol=1e-5)


def test_info_health_and_metrics(client):
    info = client.get("/info").json()
    assert info["model_id"] == info["served_model_name"] == "embedder"
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["max_input_length"] == 24 and info["max_client_batch_size"] == 32
    classifier = client.get("/info", params={"model": "classifier"}).json()
    assert classifier["model_type"]["classifier"]["id2label"] == {"0": "negative", "1": "neutral", "2": "positive"}
    assert client.get("/health").status_code == 200
    post(client, "/embed", {"inputs": "counted"})
    text = client.get("/metrics").text
    for name in ("te_request_count", "te_request_success", "te_embed_count", "te_request_duration_bucket",
                 "te_batch_next_size_bucket", "te_batch_next_tokens_bucket", "te_queue_size"):
        assert f"\n{name}{{" in text, name
    assert 'te_request_count{method="single",model="embedder"}' in text  # several models: a model label
    assert "_total" not in text and "_created" not in text  # TEI's names, not prometheus_client's suffixes
