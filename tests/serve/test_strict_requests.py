"""Hostile bodies on every route: each wrong type at each field is a 422 (400 for an empty list)
naming the field, never a 500; duplicate keys, booleans as numbers, NaN and lone surrogates are
refused; errors echo a short prefix of what was sent; a bug answers 500 with the request id the
log names; unknown routes and methods answer JSON, and nothing redirects to the Host header."""
from __future__ import annotations

import json
import logging

import pytest

from support.serve import serving

httpx = pytest.importorskip("httpx")


@pytest.fixture(scope="module")
def server(runtimes):
    with serving(runtimes, ["embedder", "reranker", "classifier"]) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


# values of every JSON type, plus lists that hide a wrong item
VALUES = [1, 1.5, True, "x", [], [1], [True], ["x", 1], {}, {"a": 1}]
TEXT, BOOL = ("x",), (True,)
# route -> (a valid body, {field: the VALUES it accepts}); a dotted field sits in an object
ROUTES = {
    "/embed": ({"inputs": "a"}, {"inputs": ("x", [1]), "truncate": BOOL, "truncation_direction": (),
                                 "prompt_name": (), "normalize": BOOL, "dimensions": (1,), "kind": (), "model": TEXT}),
    "/embed_all": ({"inputs": "a"}, {"inputs": ("x", [1]), "truncate": BOOL, "truncation_direction": (),
                                     "prompt_name": (), "kind": (), "model": ()}),
    "/v1/embeddings": ({"input": "a"}, {"input": ("x", [1]), "encoding_format": (), "dimensions": (1,),
                                        "user": TEXT, "model": TEXT}),
    "/predict": ({"inputs": "a", "model": "classifier"}, {"inputs": ("x",), "truncate": BOOL,
                                                          "truncation_direction": (), "raw_scores": BOOL,
                                                          "model": ()}),
    "/rerank": ({"query": "q", "texts": ["a"], "model": "reranker"},
                {"query": TEXT, "texts": (), "truncate": BOOL, "truncation_direction": (), "raw_scores": BOOL,
                 "return_text": BOOL}),
    "/v1/rerank": ({"query": "q", "documents": ["a"], "model": "reranker"},
                   {"query": TEXT, "documents": (), "top_n": (1,), "return_documents": BOOL, "truncate": BOOL,
                    "truncation_direction": ()}),
    "/similarity": ({"inputs": {"source_sentence": "a", "sentences": ["b"]}},
                    {"inputs": ({}, ), "inputs.source_sentence": TEXT, "inputs.sentences": (),
                     "parameters": ({}, {"a": 1}), "parameters.truncate": BOOL,
                     "parameters.truncation_direction": (), "parameters.prompt_name": (), "model": TEXT}),
    "/tokenize": ({"inputs": "a"}, {"inputs": TEXT, "add_special_tokens": BOOL, "prompt_name": (), "model": TEXT}),
    "/decode": ({"ids": [101, 102]}, {"ids": ([1],), "skip_special_tokens": BOOL, "model": TEXT}),
}


def _with(body: dict, field: str, value) -> dict:
    body = json.loads(json.dumps(body))
    *outer, name = field.split(".")
    target = body
    for key in outer:
        target = target.setdefault(key, {})
    target[name] = value
    return body


def _cases():
    for route, (body, fields) in ROUTES.items():
        for field, accepted in fields.items():
            for value in VALUES:
                if json.dumps(value) not in {json.dumps(a) for a in accepted}:  # True == 1 in Python, not here
                    yield route, body, field, value


def test_every_wrong_type_at_every_field_is_a_4xx_naming_it(client):
    failures = []
    for route, body, field, value in _cases():
        sent = _with(body, field, value)
        if field == "inputs" and route == "/similarity" and value == {}:
            continue  # an object, but without its fields: checked below
        answer = client.post(route, json=sent)
        error = answer.json().get("error") or answer.json().get("message", "")
        empty_list = value == [] and answer.status_code == 400
        if not (answer.status_code == 422 or empty_list) or field.split(".")[-1] not in error:
            failures.append((route, field, value, answer.status_code, error[:120]))
    assert not failures, failures
    answer = client.post("/similarity", json={"inputs": {}})
    assert answer.status_code == 422 and "inputs.source_sentence" in answer.json()["error"]


def test_the_valid_bodies_of_the_table_are_answered(client):
    for route, (body, _) in ROUTES.items():
        answer = client.post(route, json=body)
        assert answer.status_code == 200, (route, answer.text)


def test_booleans_are_no_numbers(client):
    for route, body in (("/embed", {"inputs": [101, True]}), ("/embed", {"inputs": [[101, 102], [True]]}),
                        ("/embed", {"inputs": "a", "dimensions": True}), ("/decode", {"ids": [101, False]}),
                        ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": True, "model": "reranker"})):
        answer = client.post(route, json=body)
        assert answer.status_code == 422, (route, body, answer.text)


def test_duplicate_keys_nan_and_lone_surrogates_are_422(client):
    bodies = [("/embed", b'{"inputs": "a", "inputs": "b"}', "twice"),
              ("/similarity", b'{"inputs": {"source_sentence": "a", "source_sentence": "b", "sentences": ["c"]}}',
               "twice"),
              ("/embed", b'{"inputs": "a", "dimensions": NaN}', "JSON"),
              ("/tokenize", b'{"inputs": "a\\ud800b"}', "surrogate"),
              ("/embed", b'{"inputs": ["ok", "\\udfff"]}', "inputs[1]"),
              ("/embed", b'{"inputs": "a", "truncation_direction": ["left"]}', "truncation_direction")]
    for route, raw, match in bodies:
        answer = client.post(route, content=raw, headers={"content-type": "application/json"})
        assert answer.status_code == 422 and match in answer.json()["error"], (route, raw, answer.text)


def test_errors_echo_a_short_prefix_and_the_routes_own_fields(client):
    huge = "y" * 100_000
    for route, body in (("/embed", {"inputs": {"a": huge}}), ("/embed", {"inputs": "a", "prompt_name": huge}),
                        ("/embed", {"inputs": "a", "truncation_direction": huge}),
                        ("/embed", {"inputs": "a", "model": huge})):
        answer = client.post(route, json=body)
        assert answer.status_code == 422 and len(answer.text) < 400, answer.text[:400]
    openai = client.post("/v1/embeddings", json={"input": 3}).json()["message"]
    assert "`input`" in openai and "inputs" not in openai
    assert "`input`" in client.post("/v1/embeddings", json={}).json()["message"]


def test_truncation_direction_in_any_case(client):
    long = " ".join(["word"] * 40) + " end"
    answers = [client.post("/embed", json={"inputs": long, "truncate": True, "truncation_direction": d}).json()
               for d in ("left", "Left", "LEFT")]
    assert answers[0] == answers[1] == answers[2]
    right = client.post("/embed", json={"inputs": long, "truncate": True, "truncation_direction": "RIGHT"}).json()
    assert right != answers[0]


def test_a_bug_answers_500_with_the_request_id_the_log_names(server, client, monkeypatch, caplog):
    async def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(server.app.models["embedder"], "embed", broken)
    with caplog.at_level(logging.ERROR, logger="ortformer.serve"):
        answer = client.post("/embed", json={"inputs": "a"})
    assert answer.status_code == 500
    request_id = answer.headers["x-request-id"]
    assert answer.json()["request_id"] == request_id and request_id in answer.json()["error"]
    assert "a bug" not in answer.text  # the traceback stays in the log
    logged = [r for r in caplog.records if request_id in r.getMessage()]
    assert len(logged) == 1 and "a bug" in logged[0].exc_text


def test_unknown_routes_and_methods_answer_json_and_nothing_redirects(client):
    missing = client.post("/nope", json={})
    assert missing.status_code == 404 and missing.json()["error_type"] == "validation"
    wrong = client.get("/embed")
    assert wrong.status_code == 405 and "POST" in wrong.headers["allow"] and "GET" in wrong.json()["error"]
    slash = client.post("/embed/", json={"inputs": "a"}, headers={"host": "evil.example"})
    assert slash.status_code == 404 and "location" not in slash.headers
