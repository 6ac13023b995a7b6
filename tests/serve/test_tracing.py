"""--otlp-endpoint's spans, collected in-process by opentelemetry-sdk's in-memory exporter: TEI's
names, one tree per request under the caller's traceparent, times in order; and no
opentelemetry import at all when tracing is off."""
from __future__ import annotations

import pytest

from support.serve import serving
from support.torch_free import run_python

pytest.importorskip("opentelemetry.sdk")
httpx = pytest.importorskip("httpx")

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from ortformer.serve.tracing import Tracing  # noqa: E402

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


def tree(spans) -> dict:
    """name -> span of one request's spans, with the root under 'root'."""
    (root,) = [s for s in spans if s.kind.name == "SERVER"]
    children = {s.name: s for s in spans if s is not root}
    assert len(children) == len(spans) - 1, [s.name for s in spans]  # no name twice among the children
    return {"root": root, **children}


def test_embed_spans_have_tei_names_and_parents(runtimes):
    exporter = InMemorySpanExporter()
    with serving(runtimes, ["embedder", "reranker"]) as running:
        running.app.tracing = Tracing(exporter=exporter)
        traceparent = f"00-{TRACE_ID}-{PARENT_ID}-01"
        response = httpx.post(f"{running.url}/embed", json={"inputs": ["a traced text"]},
                              headers={"traceparent": traceparent}, timeout=30)
        assert response.status_code == 200
        spans = tree(exporter.get_finished_spans())
        exporter.clear()
        response = httpx.post(f"{running.url}/rerank", json={"model": "reranker", "query": "q", "texts": ["a", "b"]},
                              timeout=30)
        assert response.status_code == 200
        rerank = tree(exporter.get_finished_spans())
        exporter.clear()
        assert httpx.get(f"{running.url}/metrics", timeout=10).status_code == 200
        refused = httpx.post(f"{running.url}/embed", json={"inputs": ""}, timeout=10).status_code
        assert refused >= 400
        failed = exporter.get_finished_spans()
        running.app.tracing.shutdown()

    root = spans["root"]
    assert root.name == "embed" and set(spans) == {"root", "encode", "queue", "embed", "response"}
    # the request's trace continues the caller's: same trace id, the caller's span as parent
    assert format(root.context.trace_id, "032x") == TRACE_ID
    assert format(root.parent.span_id, "016x") == PARENT_ID and root.parent.is_remote
    for name in ("encode", "queue", "embed", "response"):
        assert spans[name].parent.span_id == root.context.span_id
        assert spans[name].context.trace_id == root.context.trace_id
    # tokenization, then the queue, the model and the answer, all inside the request
    order = [spans[n] for n in ("encode", "queue", "embed", "response")]
    assert root.start_time <= order[0].start_time
    for before, after in zip(order, order[1:]):
        assert before.end_time <= after.start_time + 1000  # ns: one clock reading may round across
    assert order[-1].end_time <= root.end_time
    assert root.attributes["http.response.status_code"] == 200 and root.attributes["model"] == "embedder"
    assert {"total_time", "tokenization_time", "queue_time", "inference_time"} <= set(root.attributes)
    assert spans["encode"].attributes["tokens"] > 0

    # a re-ranker's model call is TEI's predict; a request without traceparent starts its own trace
    assert rerank["root"].name == "rerank" and "predict" in rerank and "embed" not in rerank
    assert rerank["root"].parent is None
    # /metrics is not traced; a refused request has its status and never reached the queue
    assert [(s.name, s.attributes["http.response.status_code"]) for s in failed if s.kind.name == "SERVER"] == [
        ("embed", refused)]
    assert {s.name for s in failed} <= {"embed", "encode"}


def test_no_opentelemetry_import_when_tracing_is_off(runtimes):
    runtimes["embedder"]
    done = run_python(
        "import sys\n"
        "from starlette.testclient import TestClient\n"
        "from ortformer.serve import ServedModel, ServeOptions, create_app, load_runtime\n"
        f"model = ServedModel('m', load_runtime({str(runtimes.files['embedder'])!r}, ServeOptions(threads=1)))\n"
        "with TestClient(create_app([model])) as client:\n"
        "    assert client.post('/embed', json={'inputs': 'a text'}).status_code == 200\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')], 'opentelemetry was imported'\n")
    assert done.returncode == 0, done.stderr
