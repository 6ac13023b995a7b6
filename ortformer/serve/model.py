"""One served model and its operations, whatever the transport (HTTP routes, gRPC, a Python
caller): embed, embed_sparse, embed_all, predict, rerank, similarity, tokenize, decode.

Each operation takes already-parsed arguments (texts or token-id arrays, TextOptions, flags),
applies the model's rules once (what output a kind of model gives, no normalize on SPLADE,
`dimensions`, prompts, truncation, --max-client-batch-size), is admitted against
--max-concurrent-requests before any tokenization, tokenizes and prepares its sequences on a
worker thread (never the event loop: the tokenizer's lock may be held for seconds by a 2 MB
text; ``Runtime.prepare`` validates each sequence there, once), queues the prepared batch with
the model's Batcher, and returns numpy arrays or plain values; a problem is a
ServeError with TEI's type. Transports parse, call, and format. The model's Batcher, metrics
and limits are attached by the app that serves it (``attach``).
"""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Awaitable, Callable

import numpy as np

from .. import contract
from ..core.errors import ModelFileError
from ..runtime import Runtime
from .encoding import Encoded, TextSide
from .errors import ServeError, bad_request, cannot_serve, validation
from .outputs import lexical_rows, pool_rows, scores, shape_embeddings, sparse_rows

__all__ = ["Call", "ClientGone", "Encoded", "LATE_KINDS", "ServedModel", "TextOptions"]

LATE_KINDS = ("query", "document")
# threads per model that tokenize and decode (off the event loop)
TOKENIZATION_THREADS = 2


@dataclass
class TextOptions:
    """What every tokenizing operation shares."""
    truncate: bool | None = None  # None: --auto-truncate decides
    direction: str | None = None  # "left" / "right"; None: the tokenizer's own side
    prompt_name: str | None = None
    model: str | None = None
    task: str | None = None  # a model with task adapters: the adapter (None: prompt_name's task, else the default)


class ClientGone(Exception):
    """The caller left (its connection closed) before its answer was ready."""


class Call:
    """One request as the operations record it: TEI's method label ("single" or "batch"), its
    characters and tokens, where its time went, and ``gone``, an awaitable factory that returns
    when the caller leaves (the job is then dropped from the queue; None: never watched)."""

    def __init__(self, method: str = "batch", gone: Callable[[], Awaitable] | None = None):
        self.method = method
        self.gone = gone
        self.chars = self.tokens = 0
        self.tokenization_s = self.queue_s = self.inference_s = 0.0
        self.ran = False  # the model ran for it (queue and inference times are its own)
        # for tracing: perf_counter() at its start and its first tokenization, and the batcher's Done
        self.start = time.perf_counter()
        self.tokenization_at: float | None = None
        self.done = None


def _kind(runtime: Runtime) -> str:
    """TEI's model_type, from the outputs: "sparse" (SPLADE), "classifier" / "reranker" (a
    per-sequence head with several labels / one), "embedding" (pools), else "tokens"."""
    cfg = runtime.config
    if cfg.sparse:
        return "sparse"
    if contract.LOGITS in runtime.output_names and not cfg.per_token_logits:
        return "reranker" if cfg.num_labels == 1 else "classifier"
    return "embedding" if runtime.pools else "tokens"


class ServedModel(TextSide):
    """A Runtime behind the transports. ``name`` is what requests and metrics call it."""

    def __init__(self, name: str, runtime: Runtime):
        if not runtime.config.takes_ids:
            raise ModelFileError(f"{runtime.path} takes float features (vocab_size=0); serve needs a token-id "
                                 "model with a tokenizer")
        super().__init__(name, runtime)
        self.kind = _kind(runtime)
        # ColBERT / bge-m3: per-token vectors or lexical weights, read through runtime/late.py
        self.late_interaction = bool({contract.TOKEN_EMBEDDINGS, contract.SPARSE} & set(runtime.output_names))
        self.labels = runtime.labels or [f"LABEL_{i}" for i in range(runtime.config.num_labels)]
        self.batcher = self.metrics = None
        # tokenization's own threads: the tokenizer's lock serializes most of it, and admitted
        # requests waiting for it must not hold the threads that parse bodies and encode answers
        self._tokenizing = ThreadPoolExecutor(TOKENIZATION_THREADS, thread_name_prefix=f"ortformer-tokenize-{name}")
        self.auto_truncate, self.max_client_batch_size = False, 32

    def attach(self, batcher, metrics, *, auto_truncate: bool, max_client_batch_size: int) -> None:
        """The Batcher that runs this model, the Metrics it counts in, and the server's limits."""
        self.batcher, self.metrics = batcher, metrics
        self.auto_truncate, self.max_client_batch_size = auto_truncate, max_client_batch_size

    # what each route needs of the model ------------------------------------------------------

    def require(self, route: str) -> str:
        """The output `route` reads, or 424 when this model has none to give."""
        kind = self.kind
        if kind in ("classifier", "reranker") and route.startswith(("/embed", "/v1/embeddings", "/similarity")):
            raise cannot_serve(self.name, route, f"it is a {kind}, not an embedding model; use /predict"
                               + (" or /rerank" if kind == "reranker" else ""))
        if route in ("/embed", "/similarity"):
            if not self.runtime.pools:
                raise cannot_serve(self.name, route, "it gives no pooled sentence_embedding; use /embed_all")
            return contract.SENTENCE_EMBEDDING
        if route == "/embed_sparse" and contract.SPARSE in self.runtime.output_names:
            return contract.SPARSE  # bge-m3's lexical weights
        if route == "/embed_all" and contract.TOKEN_EMBEDDINGS in self.runtime.output_names:
            return contract.TOKEN_EMBEDDINGS  # ColBERT's vectors: projected, normalised, skiplist applied
        if route == "/embed_sparse":
            if kind != "sparse":
                raise cannot_serve(self.name, route, "it is not an embedding model with SPLADE pooling")
            return contract.SENTENCE_EMBEDDING
        if route == "/embed_all":
            if kind == "sparse":  # as TEI: a SPLADE model's token states are not its output
                raise cannot_serve(self.name, route, "it is a SPLADE model; use /embed_sparse")
            return contract.LAST_HIDDEN_STATE
        if route == "/predict":
            if kind not in ("classifier", "reranker"):
                raise cannot_serve(self.name, route, "it is not a sequence classifier (no per-sequence logits)")
            return contract.LOGITS
        if route == "/rerank":
            if kind != "reranker":
                raise cannot_serve(self.name, route, "it is not a re-ranker (a classifier with one label)")
            return contract.LOGITS
        raise ValueError(route)

    def info_type(self) -> dict:
        """TEI's Info.model_type."""
        if self.kind in ("classifier", "reranker"):
            id2label = {str(i): label for i, label in enumerate(self.labels)}
            return {self.kind: {"id2label": id2label, "label2id": {v: int(k) for k, v in id2label.items()}}}
        return {"embedding": {"pooling": self.runtime.config.pooling}}

    @property
    def dtype(self) -> str:
        return "int8" if contract.META_INT8 in self.runtime.metadata else str(self.runtime.parity.get("dtype", "float32"))

    # the steps every operation shares ------------------------------------------------------------

    def _begin(self, call: Call, count: int) -> None:
        """Counts the request as TEI does (te_request_count by method) and checks
        --max-client-batch-size (422)."""
        self.metrics.count("te_request_count", self.name, method=call.method)
        if count > self.max_client_batch_size:
            raise validation(f"batch size {count} > maximum allowed batch size {self.max_client_batch_size}",
                             failure="batch_size")

    async def _off_loop(self, call: Call, work: Callable, *inputs) -> object:
        """work() on one of the model's tokenization threads (it may wait for the tokenizer's
        lock), timed."""
        start = time.perf_counter()
        call.tokenization_at = call.tokenization_at or start
        call.chars += sum(len(x) for group in inputs for x in group or () if isinstance(x, str))
        try:
            return await asyncio.get_running_loop().run_in_executor(self._tokenizing, work)
        finally:
            call.tokenization_s += time.perf_counter() - start

    async def _encode(self, call: Call, output: str, inputs: list, options: TextOptions, pairs: list | None = None,
                      late_kind: str | None = None) -> Encoded:
        """The inputs as token ids prepared for `output` (validated once, here: a bad input is this
        request's 422, never a failure of the model call it would share); with late_kind ("query" /
        "document"), as a late-interaction model reads them (encode_late)."""
        truncate = self.auto_truncate if options.truncate is None else options.truncate
        work = (lambda: self.encode_late(inputs, late_kind, output)) if late_kind is not None else (
            lambda: self.encode(inputs, output, truncate=truncate, direction=options.direction, task=options.task,
                                prompt_name=options.prompt_name, pairs=pairs))
        encoded = await self._off_loop(call, work, inputs, pairs)
        call.tokens += encoded.tokens
        self.metrics.input_lengths(self.name, (len(s) for s in encoded.ids))
        return encoded

    async def _run(self, call: Call, encoded: Encoded) -> list:
        """The outputs of the prepared batch, one per input; ClientGone (the job dropped from the
        queue) when the caller leaves first."""
        job = asyncio.ensure_future(self.batcher.submit(encoded.batch))
        if call.gone is not None:
            watcher = asyncio.ensure_future(call.gone())
            try:
                await asyncio.wait({job, watcher}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                watcher.cancel()
            if not job.done():
                job.cancel()
                raise ClientGone
        done = await job
        call.queue_s, call.inference_s, call.ran, call.done = done.queue_s, done.inference_s, True, done
        return done.outputs

    async def _outputs(self, call: Call, output: str, inputs: list, options: TextOptions, *, pairs=None,
                       late_kind: str | None = None, counter: str = "te_embed") -> tuple[Encoded, list]:
        """Admitted (429 past --max-concurrent-requests), tokenized, run: (encoded, outputs)."""
        with self.batcher.admit():
            encoded = await self._encode(call, output, inputs, options, pairs, late_kind)
            outputs = await self._run(call, encoded)
        self.metrics.count(f"{counter}_count", self.name, len(inputs))
        self.metrics.count(f"{counter}_success", self.name, len(inputs))
        self.metrics.duration(f"{counter}_duration", self.name, call.queue_s + call.inference_s)
        return encoded, outputs

    # operations ----------------------------------------------------------------------------------

    async def embed(self, inputs: list, options: TextOptions, *, normalize: bool = True,
                    dimensions: int | None = None, call: Call | None = None, route: str = "/embed") -> np.ndarray:
        """(n, dimensions or S) float32 pooled embeddings of texts or token-id arrays: the first
        `dimensions` features, then x / ||x|| when `normalize` (refused for SPLADE, as TEI).
        Without `normalize` it is the pooled vector before any normalization, also for a model
        whose graph normalizes (its file's sentence_embedding_unnormalized; an older file's pooled
        from its token states: outputs.pool_rows)."""
        call = call or Call()
        self._begin(call, len(inputs))
        output = self.require("/embed")
        if normalize and self.kind == "sparse":
            raise ServeError(f"`normalize` is not available for SPLADE models, and {route} normalizes: send "
                             "\"normalize\": false to /embed, or use /embed_sparse", "backend", failure="model_type")
        width = self.runtime.config.sentence_size
        if dimensions is not None and dimensions > width:
            raise bad_request(f"dimensions={dimensions} is more than model {self.name!r} gives ({width}); "
                              f"valid: 1 to {width}")
        cfg = self.runtime.config
        if normalize or not cfg.normalize_embeddings or cfg.sparse:
            _, vectors = await self._outputs(call, output, inputs, options)
            return shape_embeddings(np.stack(vectors), dimensions, normalize)
        # the graph normalizes inside: TEI's normalize=false is the vector before it, the file's own
        # output where it has one (contract.SENTENCE_EMBEDDING_UNNORMALIZED), else (a file written
        # before it) pooled here from the same token states (its unit vector is the graph's output)
        if contract.SENTENCE_EMBEDDING_UNNORMALIZED in self.runtime.output_names:
            _, vectors = await self._outputs(call, contract.SENTENCE_EMBEDDING_UNNORMALIZED, inputs, options)
            return shape_embeddings(np.stack(vectors), dimensions, False)
        if cfg.sentence_dense is not None:
            raise cannot_serve(self.name, route + " with normalize=false", "its file normalizes after a Dense "
                               f"head and, written before ortformer gave {contract.SENTENCE_EMBEDDING_UNNORMALIZED}, "
                               "has no vector from before the normalization; re-export the model with this "
                               "ortformer version, or send \"normalize\": true")
        _, states = await self._outputs(call, contract.LAST_HIDDEN_STATE, inputs, options)
        pooled = pool_rows(states, cfg.pooling)[:, :cfg.sentence_size]  # truncate_dim, as the graph's output
        return shape_embeddings(pooled, dimensions, False)

    async def embed_sparse(self, inputs: list, options: TextOptions, *, late_kind: str | None = None,
                           call: Call | None = None) -> list[list[dict]]:
        """Per input [{"index": token id, "value": weight}] for each non-zero weight, ids
        ascending: a SPLADE model's pooled weights, or a bge-m3 text's lexical weights."""
        call = call or Call()
        self._begin(call, len(inputs))
        output = self.require("/embed_sparse")
        if self.late_interaction:
            from ..contract.late import LateInteraction

            encoded, weights = await self._outputs(call, output, inputs, options, late_kind=late_kind or "document")
            skip = (self.runtime.late or LateInteraction()).sparse_skip
            return [lexical_rows(w, ids, skip) for w, ids in zip(weights, encoded.ids)]
        _, vectors = await self._outputs(call, output, inputs, options)
        return sparse_rows(np.stack(vectors))

    async def embed_all(self, inputs: list, options: TextOptions, *, late_kind: str | None = None,
                        call: Call | None = None) -> list[np.ndarray]:
        """Per input its (tokens, H) states: last_hidden_state of every kept token, or a
        late-interaction model's token_embeddings read as `late_kind` ("query" / "document")."""
        call = call or Call()
        self._begin(call, len(inputs))
        output = self.require("/embed_all")
        if self.late_interaction:
            encoded, tokens = await self._outputs(call, output, inputs, options, late_kind=late_kind or "document")
            return [t[keep] for t, keep in zip(tokens, encoded.keep)]
        if late_kind is not None:
            raise bad_request(f"`kind` applies to late-interaction models (ColBERT, bge-m3); model {self.name!r} "
                              "is not one: drop it")
        _, tokens = await self._outputs(call, output, inputs, options)
        return list(tokens)

    async def predict(self, texts: list[str], options: TextOptions, *, pairs: list[str | None] | None = None,
                      raw_scores: bool = False, call: Call | None = None) -> np.ndarray:
        """(n, L) float64 scores over ``labels``: softmax (sigmoid for one label), or the raw
        logits; a pair's second text joins its first by the tokenizer's pair template."""
        call = call or Call()
        self._begin(call, len(texts))
        output = self.require("/predict")
        _, logits = await self._outputs(call, output, texts, options, pairs=pairs, counter="te_predict")
        return scores(np.stack(logits), raw_scores)

    async def rerank(self, query: str, texts: list[str], options: TextOptions, *, raw_scores: bool = False,
                     call: Call | None = None) -> np.ndarray:
        """(n,) float64 scores of (query, text) pairs in the texts' order: sigmoid(logit), or the
        logit with raw_scores. Both rerank shapes (TEI's, Cohere's) answer from these."""
        call = call or Call()
        self._begin(call, len(texts))
        output = self.require("/rerank")
        _, logits = await self._outputs(call, output, [query] * len(texts), options, pairs=list(texts),
                                        counter="te_predict")
        values = scores(np.stack(logits), raw_scores)[:, 0]
        if np.isnan(values).any():  # as TEI: a NaN cannot be ranked
            raise ServeError("a score is NaN", "backend")
        return values

    async def similarity(self, source: str, sentences: list[str], options: TextOptions, *,
                         call: Call | None = None) -> np.ndarray:
        """(n,) float64 cosine similarity of each sentence's embedding to the source's, as TEI's
        /similarity: the pooled vectors unnormalized, a . b / (||a|| ||b||) (0 for a zero vector)."""
        call = call or Call()
        self._begin(call, len(sentences) + 1)
        output = self.require("/similarity")
        if self.kind == "sparse":
            raise cannot_serve(self.name, "/similarity", "it is a SPLADE model")
        _, vectors = await self._outputs(call, output, [source, *sentences], options)
        matrix = np.stack(vectors).astype(np.float64)
        norms = np.linalg.norm(matrix, axis=1)
        dots = matrix[1:] @ matrix[0]
        denominator = norms[1:] * norms[0]
        return np.where(denominator > 0, dots / np.where(denominator > 0, denominator, 1.0), 0.0)

    async def tokenize(self, texts: list[str], *, add_special_tokens: bool = True, prompt_name: str | None = None,
                       call: Call | None = None) -> list[list[dict]]:
        """TEI's tokens per text (TextSide.tokens), off the event loop."""
        call = call or Call()
        self._begin(call, len(texts))
        with self.batcher.admit():
            return await self._off_loop(call, lambda: self.tokens(texts, add_special_tokens, prompt_name), texts)

    async def decode(self, ids: list[np.ndarray], *, skip_special_tokens: bool = True,
                     call: Call | None = None) -> list[str]:
        """Each id list's text (TextSide.decode_ids), off the event loop."""
        call = call or Call()
        self._begin(call, len(ids))
        with self.batcher.admit():
            return await self._off_loop(call, lambda: self.decode_ids(ids, skip_special_tokens))
