"""--grpc-port: a grpcio client built from the same tei.proto gets the HTTP routes' numbers from
every service, streaming RPCs answer in order, the API key is required as metadata, and errors
carry TEI's status codes. Servers listen on 127.0.0.1 and free ports."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")
httpx = pytest.importorskip("httpx")

from ortformer.serve.grpc import with_grpc  # noqa: E402
from ortformer.serve.grpc import tei_pb2 as pb  # noqa: E402
from ortformer.serve.grpc import tei_pb2_grpc as pb_grpc  # noqa: E402
from support.serve import serving  # noqa: E402

KEY = "grpc-secret"
AUTH = (("authorization", f"Bearer {KEY}"),)
HEADERS = {"authorization": f"Bearer {KEY}"}
TEXTS = [f"stream text {i} {'with more words ' * (i % 4)}" for i in range(20)]


@contextlib.contextmanager
def both(runtimes, model: str):
    """(http url, grpc channel) of one server of `model` with an API key."""
    with serving(runtimes, [model], wrap=lambda app: with_grpc(app, "127.0.0.1", 0), api_key=KEY) as running:
        with grpc.insecure_channel(f"127.0.0.1:{running.asgi.state.grpc_port}") as channel:
            yield running.url, channel


def http(url: str, route: str, body: dict):
    response = httpx.post(f"{url}{route}", json=body, headers=HEADERS, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def test_embedder_services_equal_the_http_routes(runtimes):
    with both(runtimes, "embedder") as (url, channel):
        embed, tokenize, info = pb_grpc.EmbedStub(channel), pb_grpc.TokenizeStub(channel), pb_grpc.InfoStub(channel)
        got = embed.Embed(pb.EmbedRequest(inputs=TEXTS[3]), metadata=AUTH)
        np.testing.assert_allclose(got.embeddings, http(url, "/embed", {"inputs": TEXTS[3]})[0], atol=1e-6, rtol=0)
        assert got.metadata.compute_tokens > 0 and got.metadata.total_time_ns > 0
        raw = embed.Embed(pb.EmbedRequest(inputs=TEXTS[3], normalize=False, dimensions=8), metadata=AUTH)
        np.testing.assert_allclose(raw.embeddings, http(url, "/embed", {"inputs": TEXTS[3], "normalize": False,
                                                                        "dimensions": 8})[0], atol=1e-6, rtol=0)
        prompted = embed.Embed(pb.EmbedRequest(inputs="q", prompt_name="query"), metadata=AUTH)
        np.testing.assert_allclose(prompted.embeddings, http(url, "/embed", {"inputs": "q", "prompt_name": "query"})[0],
                                   atol=1e-6, rtol=0)
        tokens = embed.EmbedAll(pb.EmbedAllRequest(inputs=TEXTS[5]), metadata=AUTH)
        np.testing.assert_allclose([t.embeddings for t in tokens.token_embeddings],
                                   http(url, "/embed_all", {"inputs": TEXTS[5]})[0], atol=1e-6, rtol=0)
        encoded = tokenize.Tokenize(pb.EncodeRequest(inputs="hello world", add_special_tokens=True), metadata=AUTH)
        expected = http(url, "/tokenize", {"inputs": "hello world"})[0]
        assert [(t.id, t.text, t.special, t.start if t.HasField("start") else None) for t in encoded.tokens] == [
            (t["id"], t["text"], t["special"], t["start"]) for t in expected]
        ids = [t.id for t in encoded.tokens]
        decoded = tokenize.Decode(pb.DecodeRequest(ids=ids, skip_special_tokens=True), metadata=AUTH)
        assert decoded.text == http(url, "/decode", {"ids": ids})[0] == "hello world"
        about = info.Info(pb.InfoRequest(), metadata=AUTH)
        expected = httpx.get(f"{url}/info", headers=HEADERS, timeout=10).json()
        assert (about.model_id, about.max_input_length, about.max_batch_tokens, about.model_type) == (
            expected["model_id"], expected["max_input_length"], expected["max_batch_tokens"], pb.MODEL_TYPE_EMBEDDING)
        metrics = httpx.get(f"{url}/metrics", timeout=10).text  # gRPC counts as the routes do
        assert 'te_request_success{method="single"}' in metrics


def test_streams_answer_in_order(runtimes):
    with both(runtimes, "embedder") as (url, channel):
        embed, tokenize = pb_grpc.EmbedStub(channel), pb_grpc.TokenizeStub(channel)
        answers = list(embed.EmbedStream(iter([pb.EmbedRequest(inputs=t, normalize=False) for t in TEXTS]),
                                         metadata=AUTH))
        expected = http(url, "/embed", {"inputs": TEXTS, "normalize": False})
        np.testing.assert_allclose([a.embeddings for a in answers], expected, atol=1e-5, rtol=0)
        lengths = [len(a.tokens) for a in tokenize.TokenizeStream(
            iter([pb.EncodeRequest(inputs=t, add_special_tokens=True) for t in TEXTS]), metadata=AUTH)]
        assert lengths == [len(t) for t in http(url, "/tokenize", {"inputs": TEXTS})]
        assert len(set(lengths)) > 1  # the texts differ in length, so an order mix-up would show


def test_the_api_key_is_required_and_errors_carry_tei_codes(runtimes):
    with both(runtimes, "embedder") as (url, channel):
        embed, info = pb_grpc.EmbedStub(channel), pb_grpc.InfoStub(channel)
        for metadata in ((), (("authorization", "Bearer wrong"),), (("authorization", KEY),)):
            with pytest.raises(grpc.RpcError) as refused:
                embed.Embed(pb.EmbedRequest(inputs="a"), metadata=metadata)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as refused:
            list(embed.EmbedStream(iter([pb.EmbedRequest(inputs="a")])))
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as refused:
            info.Info(pb.InfoRequest())
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as refused:  # longer than max_input_length, no truncate
            embed.Embed(pb.EmbedRequest(inputs="word " * 100), metadata=AUTH)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert embed.Embed(pb.EmbedRequest(inputs="word " * 100, truncate=True), metadata=AUTH).embeddings
        with pytest.raises(grpc.RpcError) as refused:  # an embedder cannot rank
            pb_grpc.RerankStub(channel).Rerank(pb.RerankRequest(query="q", texts=["a"]), metadata=AUTH)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_reranker_classifier_and_splade_equal_the_http_routes(runtimes):
    docs = ["a short text", "another text about things", "third one"]
    with both(runtimes, "reranker") as (url, channel):
        rerank = pb_grpc.RerankStub(channel)
        got = rerank.Rerank(pb.RerankRequest(query="which", texts=docs, return_text=True), metadata=AUTH)
        expected = http(url, "/rerank", {"query": "which", "texts": docs, "return_text": True})
        assert [(r.index, r.text) for r in got.ranks] == [(e["index"], e["text"]) for e in expected]
        np.testing.assert_allclose([r.score for r in got.ranks], [e["score"] for e in expected], atol=1e-6, rtol=0)
        streamed = rerank.RerankStream(iter([pb.RerankStreamRequest(query="which", text=d) for d in docs]),
                                       metadata=AUTH)
        assert [(r.index, round(r.score, 6)) for r in streamed.ranks] == [(r.index, round(r.score, 6))
                                                                          for r in got.ranks]
        pair = pb_grpc.PredictStub(channel).PredictPair(pb.PredictPairRequest(inputs=["which", docs[1]]),
                                                        metadata=AUTH)
        expected = http(url, "/predict", {"inputs": [["which", docs[1]]]})[0]
        np.testing.assert_allclose(pair.predictions[0].score, expected[0]["score"], atol=1e-6, rtol=0)
    with both(runtimes, "classifier") as (url, channel):
        predict = pb_grpc.PredictStub(channel)
        answers = list(predict.PredictStream(iter([pb.PredictRequest(inputs=t) for t in TEXTS[:6]]), metadata=AUTH))
        expected = http(url, "/predict", {"inputs": [[t] for t in TEXTS[:6]]})
        assert [[p.label for p in a.predictions] for a in answers] == [[p["label"] for p in e] for e in expected]
        np.testing.assert_allclose([[p.score for p in a.predictions] for a in answers],
                                   [[p["score"] for p in e] for e in expected], atol=1e-6, rtol=0)
    with both(runtimes, "splade") as (url, channel):
        got = pb_grpc.EmbedStub(channel).EmbedSparse(pb.EmbedSparseRequest(inputs=TEXTS[2]), metadata=AUTH)
        expected = http(url, "/embed_sparse", {"inputs": TEXTS[2]})[0]
        assert [v.index for v in got.sparse_embeddings] == [e["index"] for e in expected]
        np.testing.assert_allclose([v.value for v in got.sparse_embeddings], [e["value"] for e in expected],
                                   atol=1e-5, rtol=0)


def test_the_cli_serves_grpc_beside_http_and_drains_on_sigterm(runtimes):
    import re
    import signal

    from support.serve import start_process as start

    runtimes["embedder"]
    process, url = start(str(runtimes.files["embedder"]), "--grpc-port", "0", "--api-key", KEY)
    try:
        line = process.stderr.readline()  # after the HTTP line: where gRPC listens
        port = re.search(r"gRPC listening on 127\.0\.0\.1:(\d+)", line)
        assert port, line
        with grpc.insecure_channel(f"127.0.0.1:{port.group(1)}") as channel:
            got = pb_grpc.EmbedStub(channel).Embed(pb.EmbedRequest(inputs="a cli text"), metadata=AUTH, timeout=30)
        np.testing.assert_allclose(got.embeddings, http(url, "/embed", {"inputs": "a cli text"})[0], atol=1e-6, rtol=0)
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0, process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
