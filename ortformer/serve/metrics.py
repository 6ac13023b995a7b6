"""Prometheus metrics under text-embeddings-inference's names (router/src/http/server.rs,
core/src/infer.rs, core/src/queue.rs), counted with prometheus_client in a registry of the app's own.

TEI exposes its counters as ``te_request_count``, while prometheus_client's text format
appends ``_total`` to every counter; so counters are re-exposed under TEI's exact name,
typed ``untyped`` (rate() and sum() work on them as on TEI's), and no ``_created`` series
(TEI has none). Histograms use TEI's buckets.
With several models every metric gets a ``model`` label (TEI serves one model, and has none).
Under ``--workers N`` (PROMETHEUS_MULTIPROC_DIR set, workers.py) each worker writes its values
to that folder and renders the sum over every worker (prometheus_client's multiprocess mode).
"""
from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import Metric

# TEI's buckets: durations 1.5^k * 1e-5 s (35 of them), batch sizes 2^0..2^12, tokens 2^0..2^20
DURATION_BUCKETS = tuple(1e-5 * 1.5 ** k for k in range(1, 36))
BATCH_SIZE_BUCKETS = tuple(2.0 ** k for k in range(13))
BATCH_TOKENS_BUCKETS = tuple(2.0 ** k for k in range(21))

COUNTERS = {
    "te_request_count": ("Requests received, by method (single input or batch)", ["method"]),
    "te_request_success": ("Requests answered, by method", ["method"]),
    "te_request_failure": ("Requests failed, by cause (validation, batch_size, tokenization, overloaded, "
                           "model_type, inference, dropped, unauthorized, payload_limit)", ["err"]),
    "te_embed_count": ("Embedding inputs received", []),
    "te_embed_success": ("Embedding inputs answered", []),
    "te_predict_count": ("Classifier and re-ranker inputs received", []),
    "te_predict_success": ("Classifier and re-ranker inputs answered", []),
}
DURATIONS = {
    "te_request_duration": "Request time, seconds",
    "te_request_tokenization_duration": "Request tokenization time, seconds",
    "te_request_queue_duration": "Request time in the queue, seconds",
    "te_request_inference_duration": "Request time in the model, seconds",
    "te_embed_duration": "Embedding request time, seconds",
    "te_predict_duration": "Classifier and re-ranker request time, seconds",
}


class _TeiNames:
    """Collects the inner registry, counters under TEI's names (no _total, no _created)."""

    def __init__(self, inner: CollectorRegistry):
        self.inner = inner

    def collect(self):
        for family in self.inner.collect():
            counter = family.type == "counter"
            renamed = Metric(family.name, family.documentation, "unknown" if counter else family.type)
            for sample in family.samples:
                if sample.name.endswith("_created"):  # prometheus_client's creation times: TEI has none
                    continue
                renamed.add_sample(family.name if counter else sample.name, sample.labels, sample.value)
            yield renamed


class Metrics:
    """The app's metrics; ``model`` names which model a count belongs to (labelled only
    when several are served)."""

    def __init__(self, model_names: list[str], max_input_length: int):
        self.labelled = len(model_names) > 1
        extra = ["model"] if self.labelled else []
        self._inner = CollectorRegistry(auto_describe=True)
        self.registry = CollectorRegistry(auto_describe=False)
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):  # one view over the workers' files
            from prometheus_client.multiprocess import MultiProcessCollector

            shared = CollectorRegistry(auto_describe=False)
            MultiProcessCollector(shared)
            self.registry.register(_TeiNames(shared))
        else:
            self.registry.register(_TeiNames(self._inner))
        reg = self._inner
        self._counters = {name: Counter(name, doc, labels + extra, registry=reg)
                          for name, (doc, labels) in COUNTERS.items()}
        self._durations = {name: Histogram(name, doc, extra, buckets=DURATION_BUCKETS, registry=reg)
                           for name, doc in DURATIONS.items()}
        input_buckets = tuple(2.0 ** k for k in range(20) if 2 ** k <= max_input_length) or (1.0,)
        self._input_length = Histogram("te_request_input_length", "Tokens per input", extra,
                                       buckets=input_buckets, registry=reg)
        # livesum: the workers' queues added up, a dead worker's left out (multiprocess mode only)
        self._queue_size = Gauge("te_queue_size", "Requests waiting in the queue", extra, registry=reg,
                                 multiprocess_mode="livesum")
        self._batch_size = Histogram("te_batch_next_size", "Inputs per model call", extra,
                                     buckets=BATCH_SIZE_BUCKETS, registry=reg)
        self._batch_tokens = Histogram("te_batch_next_tokens", "Tokens per model call (without padding)", extra,
                                       buckets=BATCH_TOKENS_BUCKETS, registry=reg)

    def _child(self, metric, model: str, **labels: str):
        labels = {**labels, "model": model} if self.labelled else labels
        return metric.labels(**labels) if labels else metric  # a metric without labels is its own child

    def count(self, name: str, model: str, amount: float = 1, **labels: str) -> None:
        self._child(self._counters[name], model, **labels).inc(amount)

    def failure(self, model: str, err: str) -> None:
        self.count("te_request_failure", model, err=err)

    def duration(self, name: str, model: str, seconds: float) -> None:
        self._child(self._durations[name], model).observe(seconds)

    def input_lengths(self, model: str, lengths) -> None:
        child = self._child(self._input_length, model)
        for n in lengths:
            child.observe(n)

    def queue_size(self, model: str, size: int) -> None:
        self._child(self._queue_size, model).set(size)

    def batch(self, model: str, size: int, tokens: int) -> None:
        self._child(self._batch_size, model).observe(size)
        self._child(self._batch_tokens, model).observe(tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)
