"""OpenTelemetry spans per request (``--otlp-endpoint``), named as text-embeddings-inference
names its own where it has the step (TEI 1.9.3: router/src/http/server.rs, core/src/tokenization.rs,
backends/src/lib.rs):

    embed | embed_sparse | embed_all | openai_embed | predict | rerank | tokenize | ...   (the route)
    ├── encode     tokenization                            (TEI's tokenization span)
    ├── queue      waiting for the request's round          (TEI records it as queue_time only)
    ├── embed | predict   its model calls, round start to last output  (TEI's backend spans)
    └── response   shaping the answer: outputs -> JSON

The route's span continues a W3C ``traceparent`` header when the request has one (as TEI's
trace_context_middleware) and carries TEI's fields total_time, tokenization_time, queue_time and
inference_time (milliseconds). Spans are recorded once the answer is ready, from the timestamps
the request's bookkeeping keeps anyway (app.Handled, batcher.Done): the request path pays
nothing for them but this one call, and nothing at all when tracing is off: opentelemetry is
imported only when a Tracing is made. Export is OTLP over gRPC in batches, as TEI's.
"""
from __future__ import annotations

import time
from typing import Mapping

from ..core.errors import require

SERVICE_NAME = "ortformer.serve"
# route -> TEI's span name (its handler's name); other routes use their path
ROUTE_SPANS = {"/embed": "embed", "/embed_sparse": "embed_sparse", "/embed_all": "embed_all",
               "/v1/embeddings": "openai_embed", "/embeddings": "openai_embed", "/predict": "predict",
               "/rerank": "rerank", "/tokenize": "tokenize", "/decode": "decode", "/similarity": "similarity",
               "/info": "get_model_info", "/health": "health"}
UNTRACED = ("/metrics",)  # scraped every few seconds; TEI serves it apart, untraced


class Tracing:
    """A tracer of its own (the process's global OpenTelemetry state is left alone).
    ``exporter``: a SpanExporter to use instead of OTLP (tests: the in-memory one), fed span
    by span; the OTLP exporter is fed in batches off the request path."""

    def __init__(self, endpoint: str | None = None, service_name: str = SERVICE_NAME, exporter=None):
        require("--otlp-endpoint", "otel", "opentelemetry.sdk.trace", "opentelemetry.trace.propagation.tracecontext")
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        self.trace = trace
        self.provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        if exporter is None:
            if not endpoint:
                raise ValueError("Tracing needs an OTLP endpoint or an exporter")
            OTLPSpanExporter = require("--otlp-endpoint", "otel",
                                       "opentelemetry.exporter.otlp.proto.grpc.trace_exporter").OTLPSpanExporter
            exporter = OTLPSpanExporter(endpoint=endpoint, insecure=endpoint.startswith("http://"))
            self.provider.add_span_processor(BatchSpanProcessor(exporter))
        else:
            self.provider.add_span_processor(SimpleSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("ortformer.serve")
        self.propagator = TraceContextTextMapPropagator()

    def record(self, route: str, handled, headers: Mapping[str, str], status: int) -> None:
        """The spans of one answered request: `handled` is its model.Call (start, tokenization,
        its batcher.Done; ``model`` when the transport names it), `headers` its request metadata
        (traceparent), `status` its HTTP status (gRPC: the HTTP status its error maps to)."""
        if route in UNTRACED:
            return
        now = time.perf_counter()
        epoch = time.time_ns() - int(now * 1e9)  # perf_counter seconds -> epoch nanoseconds

        def ns(t: float) -> int:
            return epoch + int(t * 1e9)

        parent = self.propagator.extract({"traceparent": headers["traceparent"]}) if "traceparent" in headers else None
        done, model = handled.done, getattr(handled, "model", None)
        attributes = {"http.route": route, "http.response.status_code": status,
                      "total_time": (now - handled.start) * 1e3, "tokenization_time": handled.tokenization_s * 1e3,
                      "queue_time": done.queue_s * 1e3 if done else 0.0,
                      "inference_time": done.inference_s * 1e3 if done else 0.0}
        if model is not None:
            attributes["model"] = model.name
        root = self.tracer.start_span(ROUTE_SPANS.get(route, route.strip("/")), context=parent,
                                      kind=self.trace.SpanKind.SERVER, start_time=ns(handled.start), attributes=attributes)
        if status >= 500:
            root.set_status(self.trace.Status(self.trace.StatusCode.ERROR))
        inside = self.trace.set_span_in_context(root)

        def child(name: str, start: float, end: float, **attrs) -> None:
            self.tracer.start_span(name, context=inside, start_time=ns(start), attributes=attrs).end(ns(end))

        if handled.tokenization_at is not None:
            child("encode", handled.tokenization_at, handled.tokenization_at + handled.tokenization_s,
                  tokens=handled.tokens, characters=handled.chars)
        if done is not None:
            child("queue", done.queued_at, done.started_at, rounds=done.rounds)
            model_call = "predict" if model is not None and model.kind in ("classifier", "reranker") else "embed"
            child(model_call, done.started_at, done.answered_at, inference_time=done.inference_s * 1e3)
            child("response", done.answered_at, now)
        root.end(ns(now))

    def shutdown(self) -> None:
        """Export what is pending, then stop."""
        self.provider.shutdown()


def traced(otlp_endpoint: str | None) -> Tracing | None:
    """A Tracing exporting to otlp_endpoint, or None (tracing off: nothing imported, nothing recorded)."""
    return Tracing(otlp_endpoint) if otlp_endpoint else None
