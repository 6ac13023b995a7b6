"""The serve bench's load generator against a stand-in server on loopback: what it sends,
what it counts, its percentiles, its bounds, and the addresses it refuses."""
from collections import Counter

import numpy as np
import pytest
from support.standin_server import start

from benchmarks.peers.load import LoadPlan, check_loopback, load, request_texts, summarize
from benchmarks.peers.servers import free_port
from benchmarks.peers.load import LoadTargetError

TEXTS = [f"text number {i}" + "!" * i for i in range(7)]
TOKENS = [3 + i for i in range(7)]


@pytest.fixture
def server():
    running = start(dim=4)
    yield running
    running.shutdown()
    running.server_close()


def plan_for(server, **fields) -> LoadPlan:
    return LoadPlan(f"http://127.0.0.1:{server.server_address[1]}", 4, **fields)


@pytest.mark.parametrize("protocol, route", [("openai", "/v1/embeddings"), ("tei", "/embed")])
def test_every_request_is_sent_once_answered_and_counted(server, protocol, route):
    result = load(plan_for(server, concurrency=3, batch=3, max_requests=20, max_seconds=60, protocol=protocol,
                           route=route), TEXTS, TOKENS)
    expected = [[TEXTS[k] for k in request_texts(i, TEXTS, 3)] for i in range(20)]
    # which client sent which request is up to the scheduler; the requests themselves are fixed
    assert Counter(map(tuple, server.seen)) == Counter(map(tuple, expected))
    assert (result["sent"], result["ok"], result["errors"], result["stopped_by"]) == (20, 20, {}, "count")
    tokens = sum(TOKENS[k] for i in range(20) for k in request_texts(i, TEXTS, 3))
    assert result["tokens_per_s"] * result["wall_s"] == pytest.approx(tokens)
    assert result["texts_per_s"] * result["wall_s"] == pytest.approx(60)
    assert result["rps"] * result["wall_s"] == pytest.approx(20)
    assert len(result["latencies_ms"]) == 20 and result["p50_ms"] <= result["p99_ms"]


def test_request_texts_wrap_around_the_corpus():
    assert request_texts(0, TEXTS, 3) == [0, 1, 2]
    assert request_texts(2, TEXTS, 3) == [6, 0, 1]
    assert request_texts(7, TEXTS, 1) == [0]


def test_percentiles_are_numpys_linear_ones_over_ok_requests():
    plan = LoadPlan("http://127.0.0.1:1", 4)
    result = summarize([i / 1000 for i in range(1, 101)], 500, 2.0, 103, {"http 500": 3}, {}, plan, "count")
    assert result["p50_ms"] == pytest.approx(50.5) and result["p99_ms"] == pytest.approx(99.01)
    assert (result["ok"], result["sent"], result["rps"], result["tokens_per_s"]) == (100, 103, 50.0, 250.0)
    empty = summarize([], 0, 1.0, 4, {"timeout": 4}, {}, plan, "time")
    assert empty["p50_ms"] is None and empty["p99_ms"] is None and empty["rps"] == 0.0


def test_latency_includes_the_servers_time(server):
    server.delay = 0.05
    result = load(plan_for(server, concurrency=2, batch=1, max_requests=8), TEXTS, TOKENS)
    assert result["ok"] == 8 and min(result["latencies_ms"]) >= 50 and result["p50_ms"] >= 50


def test_bad_answers_are_counted_by_kind_never_as_ok(server):
    texts = ["fine", "boom", "short", "dim"]
    result = load(plan_for(server, concurrency=2, batch=1, max_requests=8), texts, [1] * 4)
    assert result["errors"] == {"http 500": 2, "wrong count": 2, "wrong dimension": 2}
    assert result["ok"] == 2 and result["sent"] == 8 and len(result["latencies_ms"]) == 2
    assert result["first_errors"]["wrong dimension"] == "a vector of 5, expected 4 floats"
    assert result["first_errors"]["wrong count"] == "0 vectors for 1 texts"


def test_wall_time_bound_stops_new_requests(server):
    server.delay = 0.2
    result = load(plan_for(server, concurrency=2, batch=1, max_requests=1000, max_seconds=0.5), TEXTS, TOKENS)
    assert result["stopped_by"] == "time" and result["errors"] == {}
    # no request starts after 0.5 s, and each takes about 0.2 s; 1 s of slack for a busy machine
    assert result["wall_s"] < 0.5 + 0.2 + 1.0 and 2 <= result["sent"] <= 2 * (0.5 / 0.2 + 1) and result["ok"] == result["sent"]


def test_a_request_past_its_timeout_is_cut_off_and_counted(server):
    result = load(plan_for(server, concurrency=2, batch=1, max_requests=100, max_seconds=0.2, request_timeout_s=0.3),
                  ["sleep 3"], [1])
    assert result["ok"] == 0 and result["errors"] == {"timeout": result["sent"]} and result["sent"] >= 2
    assert result["wall_s"] < 0.2 + 0.3 + 1.0 and result["p99_ms"] is None


def test_nothing_listening_is_a_transport_error():
    result = load(LoadPlan(f"http://127.0.0.1:{free_port()}", 4, max_requests=3), TEXTS, TOKENS)
    assert result["ok"] == 0 and result["errors"] == {"transport: ConnectError": 3}


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080", "http://127.9.8.7:1", "http://[::1]:8080", "http://localhost:80"])
def test_loopback_addresses_are_accepted(url):
    assert check_loopback(url) == url


@pytest.mark.parametrize("url, why", [
    ("http://10.0.0.1:8080", "10.0.0.1 is not this machine's loopback"),
    ("http://example.com", "example.com is not this machine's loopback"),
    ("http://0.0.0.0:8080", "0.0.0.0 is not this machine's loopback"),
    ("http://[::2]:8080", ":2 is not this machine's loopback"),
    ("https://127.0.0.1:8080", "only http:// on loopback is allowed"),
    ("127.0.0.1:8080", "only http:// on loopback is allowed"),
])
def test_other_addresses_are_refused_before_any_request(url, why):
    with pytest.raises(LoadTargetError, match=why.replace("(", r"\(")):
        load(LoadPlan(url, 4), TEXTS, TOKENS)


@pytest.mark.parametrize("fields, why", [
    ({"concurrency": 0}, "concurrency must be at least 1"),
    ({"max_requests": 0}, "max_requests must be at least 1"),
    ({"max_seconds": float("inf")}, "max_seconds must be in"),
    ({"request_timeout_s": 0}, "request_timeout_s must be in"),
    ({"protocol": "grpc"}, "protocol 'grpc'; choose from openai, tei"),
])
def test_plans_that_cannot_run_or_stop_are_refused(fields, why):
    with pytest.raises(LoadTargetError, match=why):
        load(LoadPlan("http://127.0.0.1:1", 4, **fields), TEXTS, TOKENS)


def test_token_counts_must_match_the_texts():
    with pytest.raises(LoadTargetError, match="2 texts with 1 token counts"):
        load(LoadPlan("http://127.0.0.1:1", 4), TEXTS[:2], TOKENS[:1])


def test_latencies_are_returned_for_pooling(server):
    result = load(plan_for(server, max_requests=5), TEXTS, TOKENS)
    assert np.isclose(np.percentile(result["latencies_ms"], 99), result["p99_ms"])


def test_a_probe_route_is_timed_alongside_the_load(server):
    server.delay = 0.02  # the load lasts a few probe intervals
    result = load(plan_for(server, concurrency=2, max_requests=30, probe_route="/health"), TEXTS, TOKENS)
    assert result["ok"] == 30 and result["probe_errors"] == 0 and result["probe_ok"] >= 1
    assert len(result["probe_latencies_ms"]) == result["probe_ok"]
    assert np.isclose(np.percentile(result["probe_latencies_ms"], 99), result["probe_p99_ms"])
    missing = load(plan_for(server, max_requests=10, probe_route="/nope"), TEXTS, TOKENS)
    assert missing["probe_ok"] == 0 and missing["probe_errors"] >= 1 and missing["probe_p99_ms"] is None
    assert "probe_p99_ms" not in load(plan_for(server, max_requests=2), TEXTS, TOKENS)
