"""TEI's gRPC services over the served models' operations (model.py), as TEI 1.9.3's
router/src/grpc/server.rs answers them:

- every RPC serves the app's default model (TEI serves one), with the app's limits: the same
  batcher (--max-concurrent-requests, admission before tokenization), --max-client-batch-size,
  messages of at most --payload-limit bytes, and at most --max-concurrent-requests RPCs open;
- the API key, when set, is required as metadata ``authorization: Bearer KEY`` on every RPC
  (UNAUTHENTICATED otherwise), compared as the HTTP header is;
- errors map as TEI maps its types: validation / empty -> INVALID_ARGUMENT, backend and
  tokenizer -> FAILED_PRECONDITION, overloaded -> RESOURCE_EXHAUSTED, unhealthy -> UNAVAILABLE;
- a streaming RPC answers each message in the order it came, working on up to
  STREAM_PARALLEL of them at once (their sequences join the batcher's rounds like any request);
  the first failing message ends the stream with its status. RerankStream gathers its
  (query, text) pairs and answers once, ranked, with the first message's raw_scores,
  return_text, truncate and truncation_direction;
- Metadata (chars, tokens, and where the time went, in nanoseconds) as TEI fills it, metrics as
  the HTTP routes count them, and spans (tracing.py) under the route's name when tracing is on.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from typing import AsyncIterator, Awaitable, Callable

import grpc
import numpy as np

from ..auth import bearer, matches
from ..errors import ServeError, validation
from ..model import Call, ClientGone, TextOptions
from . import tei_pb2 as pb
from . import tei_pb2_grpc as pb_grpc

STREAM_PARALLEL = 64
CODES = {"validation": grpc.StatusCode.INVALID_ARGUMENT, "empty": grpc.StatusCode.INVALID_ARGUMENT,
         "backend": grpc.StatusCode.FAILED_PRECONDITION, "tokenizer": grpc.StatusCode.FAILED_PRECONDITION,
         "overloaded": grpc.StatusCode.RESOURCE_EXHAUSTED, "unhealthy": grpc.StatusCode.UNAVAILABLE,
         "unauthorized": grpc.StatusCode.UNAUTHENTICATED}
DIRECTIONS = {pb.TRUNCATION_DIRECTION_RIGHT: "right", pb.TRUNCATION_DIRECTION_LEFT: "left"}
MODEL_TYPES = {"classifier": pb.MODEL_TYPE_CLASSIFIER, "reranker": pb.MODEL_TYPE_RERANKER}


class _Rpc(Call):
    """One RPC's (or one stream message's) bookkeeping: model.Call, plus its model."""

    def __init__(self, model):
        super().__init__(method="single")
        self.model = model


def _metadata(call: Call) -> pb.Metadata:
    ns = lambda s: int(s * 1e9)  # noqa: E731
    return pb.Metadata(compute_chars=call.chars, compute_tokens=call.tokens,
                       total_time_ns=ns(time.perf_counter() - call.start), tokenization_time_ns=ns(call.tokenization_s),
                       queue_time_ns=ns(call.queue_s), inference_time_ns=ns(call.inference_s))


def _options(request) -> TextOptions:
    """TextOptions of a request: its truncate (false: --auto-truncate decides), direction, prompt."""
    prompt = request.prompt_name if request.HasField("prompt_name") else None
    return TextOptions(truncate=True if request.truncate else None,
                       direction=DIRECTIONS.get(request.truncation_direction, "right"), prompt_name=prompt)


def _predictions(served, row: np.ndarray) -> list:
    order = np.argsort(-row, kind="stable")  # TEI: by score, highest first
    return [pb.Prediction(score=float(row[k]), label=served.labels[k]) for k in order]


class TeiService:
    """The five servicers' methods over one ServeApp (app.py): the app's default model, its
    options (limits, key), metrics and tracing."""

    def __init__(self, serve):
        self.serve = serve
        key = serve.options.api_key
        self.expected = None if key is None else bearer(key)

    # plumbing ---------------------------------------------------------------------------------

    def _authorized(self, context) -> bool:
        if self.expected is None:
            return True
        given = dict(context.invocation_metadata()).get("authorization", "")
        return matches(given.encode("utf-8"), self.expected)

    async def _answer(self, context, route: str, work: Callable[[_Rpc], Awaitable]):
        """work(rpc)'s message, counted and traced as an HTTP request to `route`; a ServeError
        aborts the RPC with TEI's status."""
        served = self.serve.default
        rpc = _Rpc(served)
        status, metrics = 200, self.serve.metrics
        try:
            if not self._authorized(context):
                raise ServeError("missing or wrong API key: send metadata \"authorization: Bearer KEY\"",
                                 "unauthorized")
            message = await work(rpc)
            metrics.count("te_request_success", served.name, method=rpc.method)
            metrics.duration("te_request_duration", served.name, time.perf_counter() - rpc.start)
            metrics.duration("te_request_tokenization_duration", served.name, rpc.tokenization_s)
            if rpc.ran:
                metrics.duration("te_request_queue_duration", served.name, rpc.queue_s)
                metrics.duration("te_request_inference_duration", served.name, rpc.inference_s)
            return message
        except ServeError as exc:
            status = exc.status
            metrics.failure(served.name, exc.failure)
            await context.abort(CODES.get(exc.error_type, grpc.StatusCode.INTERNAL), str(exc))
        except ClientGone:
            status = 499
            metrics.failure(served.name, "dropped")
            raise
        finally:
            if self.serve.tracing is not None:
                self.serve.tracing.record(route, rpc, dict(context.invocation_metadata() or ()), status)

    async def _stream(self, context, requests: AsyncIterator, answer: Callable) -> AsyncIterator:
        """answer(context, request) for each message, in order, up to STREAM_PARALLEL at once; a
        client that sends one message and waits for its answer is answered (reading and
        answering run side by side)."""
        slots = asyncio.Semaphore(STREAM_PARALLEL)
        started: asyncio.Queue = asyncio.Queue()

        async def read():
            try:
                async for request in requests:
                    await slots.acquire()
                    started.put_nowait(asyncio.ensure_future(answer(context, request)))
            finally:
                started.put_nowait(None)

        reader = asyncio.ensure_future(read())
        try:
            while (task := await started.get()) is not None:
                try:
                    yield await task
                finally:
                    slots.release()
            await reader  # a broken request stream ends the RPC with its error
        finally:
            reader.cancel()
            while not started.empty():
                task = started.get_nowait()
                if task is not None:
                    task.cancel()

    # Info -------------------------------------------------------------------------------------

    async def Info(self, request, context):
        async def work(rpc):
            served, options = rpc.model, self.serve.options
            from ..._version import __version__

            return pb.InfoResponse(
                version=__version__, model_id=served.name, model_dtype=served.dtype,
                model_type=MODEL_TYPES.get(served.kind, pb.MODEL_TYPE_EMBEDDING),
                max_concurrent_requests=options.max_concurrent_requests, max_input_length=served.max_input_length,
                max_batch_tokens=self.serve.batchers[served.name].max_batch_tokens,
                max_client_batch_size=options.max_client_batch_size, tokenization_workers=1)
        return await self._answer(context, "/info", work)

    # Embed ------------------------------------------------------------------------------------

    async def _embed(self, context, request):
        async def work(rpc):
            vectors = await rpc.model.embed([request.inputs], _options(request),
                                            normalize=request.normalize if request.HasField("normalize") else True,
                                            dimensions=request.dimensions if request.HasField("dimensions") else None,
                                            call=rpc)
            return pb.EmbedResponse(embeddings=vectors[0].tolist(), metadata=_metadata(rpc))
        return await self._answer(context, "/embed", work)

    async def _embed_sparse(self, context, request):
        async def work(rpc):
            rows = await rpc.model.embed_sparse([request.inputs], _options(request), call=rpc)
            values = [pb.SparseValue(index=int(v["index"]), value=float(v["value"])) for v in rows[0]]
            return pb.EmbedSparseResponse(sparse_embeddings=values, metadata=_metadata(rpc))
        return await self._answer(context, "/embed_sparse", work)

    async def _embed_all(self, context, request):
        async def work(rpc):
            tokens = await rpc.model.embed_all([request.inputs], _options(request), call=rpc)
            rows = [pb.TokenEmbedding(embeddings=row.tolist()) for row in np.asarray(tokens[0])]
            return pb.EmbedAllResponse(token_embeddings=rows, metadata=_metadata(rpc))
        return await self._answer(context, "/embed_all", work)

    async def Embed(self, request, context):
        return await self._embed(context, request)

    async def EmbedStream(self, requests, context):
        async for answer in self._stream(context, requests, self._embed):
            yield answer

    async def EmbedSparse(self, request, context):
        return await self._embed_sparse(context, request)

    async def EmbedSparseStream(self, requests, context):
        async for answer in self._stream(context, requests, self._embed_sparse):
            yield answer

    async def EmbedAll(self, request, context):
        return await self._embed_all(context, request)

    async def EmbedAllStream(self, requests, context):
        async for answer in self._stream(context, requests, self._embed_all):
            yield answer

    # Predict ----------------------------------------------------------------------------------

    async def _predict(self, context, request, pair: bool = False):
        async def work(rpc):
            texts = list(request.inputs) if pair else [request.inputs]
            if pair and len(texts) not in (1, 2):
                raise validation(f"`inputs` must have a single or two elements. Given: {len(texts)}")
            pairs = [texts[1]] if pair and len(texts) == 2 else None
            options = TextOptions(truncate=True if request.truncate else None,
                                  direction=DIRECTIONS.get(request.truncation_direction, "right"))
            values = await rpc.model.predict(texts[:1], options, pairs=pairs, raw_scores=request.raw_scores, call=rpc)
            return pb.PredictResponse(predictions=_predictions(rpc.model, values[0]), metadata=_metadata(rpc))
        return await self._answer(context, "/predict", work)

    async def Predict(self, request, context):
        return await self._predict(context, request)

    async def PredictPair(self, request, context):
        return await self._predict(context, request, pair=True)

    async def PredictStream(self, requests, context):
        async for answer in self._stream(context, requests, self._predict):
            yield answer

    async def PredictPairStream(self, requests, context):
        async for answer in self._stream(context, requests, lambda c, r: self._predict(c, r, pair=True)):
            yield answer

    # Rerank -----------------------------------------------------------------------------------

    async def Rerank(self, request, context):
        async def work(rpc):
            rpc.method = "batch"
            options = TextOptions(truncate=True if request.truncate else None,
                                  direction=DIRECTIONS.get(request.truncation_direction, "right"))
            values = await rpc.model.rerank(request.query, list(request.texts), options,
                                            raw_scores=request.raw_scores, call=rpc)
            return pb.RerankResponse(ranks=self._ranks(values, list(request.texts), request.return_text),
                                     metadata=_metadata(rpc))
        return await self._answer(context, "/rerank", work)

    async def RerankStream(self, requests, context):
        pairs = [request async for request in requests]

        async def work(rpc):
            rpc.method = "batch"
            if not pairs:
                raise validation("the stream sent no (query, text) pair to rank")
            first = pairs[0]
            options = TextOptions(truncate=True if first.truncate else None,
                                  direction=DIRECTIONS.get(first.truncation_direction, "right"))
            texts = [p.text for p in pairs]
            if len({p.query for p in pairs}) == 1:
                values = await rpc.model.rerank(first.query, texts, options, raw_scores=first.raw_scores, call=rpc)
            else:  # several queries: each pair scored as /predict scores a pair (the same head, one label)
                rpc.model.require("/rerank")
                values = (await rpc.model.predict([p.query for p in pairs], options, pairs=texts,
                                                  raw_scores=first.raw_scores, call=rpc))[:, 0]
                if np.isnan(values).any():
                    raise ServeError("a score is NaN", "backend")
            return pb.RerankResponse(ranks=self._ranks(values, texts, first.return_text), metadata=_metadata(rpc))
        return await self._answer(context, "/rerank", work)

    @staticmethod
    def _ranks(values: np.ndarray, texts: list[str], return_text: bool) -> list:
        order = np.argsort(-values, kind="stable")  # highest first; ties keep the texts' order
        return [pb.Rank(index=int(i), score=float(values[i]), **({"text": texts[i]} if return_text else {}))
                for i in order]

    # Tokenize ---------------------------------------------------------------------------------

    async def _tokenize(self, context, request):
        async def work(rpc):
            prompt = request.prompt_name if request.HasField("prompt_name") else None
            tokens = (await rpc.model.tokenize([request.inputs], add_special_tokens=request.add_special_tokens,
                                               prompt_name=prompt, call=rpc))[0]
            return pb.EncodeResponse(tokens=[pb.SimpleToken(
                id=t["id"], text=t["text"], special=t["special"],
                **({} if t["start"] is None else {"start": t["start"], "stop": t["stop"]})) for t in tokens])
        return await self._answer(context, "/tokenize", work)

    async def _decode(self, context, request):
        async def work(rpc):
            texts = await rpc.model.decode([np.asarray(request.ids, np.int64)],
                                           skip_special_tokens=request.skip_special_tokens, call=rpc)
            return pb.DecodeResponse(text=texts[0])
        return await self._answer(context, "/decode", work)

    async def Tokenize(self, request, context):
        return await self._tokenize(context, request)

    async def TokenizeStream(self, requests, context):
        async for answer in self._stream(context, requests, self._tokenize):
            yield answer

    async def Decode(self, request, context):
        return await self._decode(context, request)

    async def DecodeStream(self, requests, context):
        async for answer in self._stream(context, requests, self._decode):
            yield answer


SERVICERS = (pb_grpc.add_InfoServicer_to_server, pb_grpc.add_EmbedServicer_to_server,
             pb_grpc.add_PredictServicer_to_server, pb_grpc.add_RerankServicer_to_server,
             pb_grpc.add_TokenizeServicer_to_server)


def server(serve, reuse_port: bool = False) -> grpc.aio.Server:
    """An asyncio gRPC server of TEI's services over `serve` (a ServeApp), not yet bound;
    `reuse_port`: several processes may bind its port (--workers), else a taken port fails."""
    options = serve.options
    limits = [("grpc.max_receive_message_length", options.payload_limit),
              ("grpc.max_concurrent_streams", min(options.max_concurrent_requests, 1024)),
              ("grpc.so_reuseport", int(reuse_port))]
    aio = grpc.aio.server(options=limits, maximum_concurrent_rpcs=options.max_concurrent_requests)
    service = TeiService(serve)
    for add in SERVICERS:
        add(service, aio)
    return aio


def with_grpc(app, host: str, port: int, *, ready: Callable[[str, int], None] | None = None,
              grace_s: float | None = 30.0, reuse_port: bool = False):
    """The Starlette `app` (create_app's) also serving TEI's gRPC API on host:port (0: a free
    port, then ``app.state.grpc_port``), started by the app's lifespan once its batchers run
    and stopped before they stop: open RPCs get up to grace_s seconds to finish.
    ``ready(host, port)`` is called once it listens; `reuse_port` as in ``server``."""
    from ...core.errors import ListenError

    serve, original = app.state.serve, app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(starlette_app):
        async with original(starlette_app) as state:
            aio = server(serve, reuse_port)
            address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            try:
                bound = aio.add_insecure_port(address)
            except RuntimeError as exc:  # grpcio raises RuntimeError when it cannot bind
                raise ListenError(f"cannot serve gRPC on {address}: {exc}; choose another --grpc-port") from None
            if bound == 0:  # older grpcio answers 0 instead of raising
                raise ListenError(f"cannot serve gRPC on {address}; choose another --grpc-port")
            await aio.start()
            app.state.grpc_port = bound
            if ready is not None:
                ready(host, bound)
            try:
                yield state
            finally:
                await aio.stop(grace_s)

    app.router.lifespan_context = lifespan
    return app
