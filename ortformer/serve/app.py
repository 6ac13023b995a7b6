"""The app's state and plumbing: ServeApp holds the models, their Batchers and the metrics,
and wraps each route (API key, errors as TEI's JSON, metrics); routes.py holds the handlers
and `create_app`. The lifespan starts one Batcher per model and, at shutdown, lets each
finish what is queued.
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .batcher import Batcher, Done
from .errors import ServeError, bad_request, validation
from .metrics import Metrics
from .model import Encoded, ServedModel
from .options import ServeOptions
from .requests import TextOptions, parse_json

logger = logging.getLogger("ortformer.serve")
# a request with more text than this is tokenized on a thread, off the event loop
INLINE_CHARS = 4096
PUBLIC = ("/health", "/metrics")


class ClientGone(Exception):
    """The client closed its connection before its answer was ready."""


class Handled:
    """One request's bookkeeping: its model, method, timings and TEI's response headers."""

    def __init__(self, app: "ServeApp", route: str):
        self.app, self.route = app, route
        self.start = time.perf_counter()
        self.model: ServedModel | None = None
        self.method: str | None = None
        self.tokenization_s = 0.0
        self.done: Done | None = None
        self.tokens = 0
        self.chars = 0

    def headers(self) -> dict[str, str]:
        ms = lambda s: str(int(s * 1000))  # noqa: E731
        done = self.done
        return {"x-compute-type": "cpu" if self.model is None or self.model.runtime.provider == "cpu" else "gpu",
                "x-compute-time": ms(time.perf_counter() - self.start), "x-total-time": ms(time.perf_counter() - self.start),
                "x-compute-characters": str(self.chars), "x-compute-tokens": str(self.tokens),
                "x-tokenization-time": ms(self.tokenization_s),
                "x-queue-time": ms(done.queue_s if done else 0), "x-inference-time": ms(done.inference_s if done else 0)}


class ServeApp:
    def __init__(self, models: list[ServedModel], options: ServeOptions):
        if not models:
            raise ValueError("serve needs at least one model")
        self.models = {m.name: m for m in models}
        self.default = models[0]
        self.options = options
        self.metrics = Metrics(list(self.models), max(m.max_input_length for m in models))
        self.batchers = {m.name: Batcher(m, self.metrics, max_batch_tokens=options.batch_tokens(m.runtime),
                                         max_wait_ms=options.max_wait_ms,
                                         max_concurrent_requests=options.max_concurrent_requests)
                         for m in models}

    @contextlib.asynccontextmanager
    async def lifespan(self, app):
        for batcher in self.batchers.values():
            batcher.start()
        try:
            yield
        finally:  # uvicorn has closed the socket and answered every open request by now
            await asyncio.gather(*(b.stop() for b in self.batchers.values()))

    # plumbing ------------------------------------------------------------------------------

    def model(self, name: str | None) -> ServedModel:
        if name is None or name in self.models:
            return self.models.get(name, self.default)
        if len(self.models) == 1:
            return self.default  # as TEI, which serves one model and ignores the name
        raise bad_request(f"model {name!r} is not served here; served: {', '.join(sorted(self.models))}")

    def authorized(self, request: Request) -> bool:
        key = self.options.api_key
        if key is None or request.url.path in PUBLIC:
            return True
        given = request.headers.get("authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {key}".encode())

    async def body(self, request: Request) -> dict:
        """The JSON body, refused (413) past --payload-limit bytes before it is all read."""
        limit = self.options.payload_limit
        too_big = validation(f"the request body is larger than --payload-limit {limit} bytes", failure="payload_limit")
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise too_big
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_big
            chunks.append(chunk)
        return parse_json(b"".join(chunks))

    def check_batch(self, count: int) -> None:
        if count > self.options.max_client_batch_size:
            raise validation(f"batch size {count} > maximum allowed batch size {self.options.max_client_batch_size}",
                             failure="batch_size")

    async def encode(self, handled: Handled, served: ServedModel, inputs: list, options: TextOptions,
                     pairs: list | None = None, late_kind: str | None = None) -> Encoded:
        """The inputs as validated token ids; with late_kind ("query" / "document"), as a
        late-interaction model reads them (served.encode_late)."""
        start = time.perf_counter()
        truncate = self.options.auto_truncate if options.truncate is None else options.truncate
        chars = sum(len(x) for x in inputs if isinstance(x, str)) + sum(len(p) for p in pairs or () if p)
        call = (lambda: served.encode_late(inputs, late_kind)) if late_kind is not None else (
            lambda: served.encode(inputs, truncate=truncate, direction=options.direction,
                                  prompt_name=options.prompt_name, pairs=pairs))
        encoded = call() if chars <= INLINE_CHARS else await asyncio.to_thread(call)
        handled.tokenization_s = time.perf_counter() - start
        handled.chars = chars
        handled.tokens = encoded.tokens
        self.metrics.input_lengths(served.name, (len(s) for s in encoded.ids))
        return encoded

    async def submit(self, request: Request, handled: Handled, served: ServedModel, output: str,
                     encoded: Encoded) -> list:
        """The outputs, one per input; ClientGone (the job dropped from the queue) when the
        client disconnects first."""
        job = asyncio.ensure_future(self.batchers[served.name].submit(output, encoded))
        watcher = asyncio.ensure_future(_disconnect(request))
        try:
            await asyncio.wait({job, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
        if not job.done():
            job.cancel()
            raise ClientGone
        handled.done = job.result()
        return handled.done.outputs

    def route(self, path: str, handler, methods=("POST",), openai: bool = False) -> Route:
        async def endpoint(request: Request) -> Response:
            handled = Handled(self, path)
            name = self.default.name
            try:
                if not self.authorized(request):
                    raise ServeError("missing or wrong API key: send \"Authorization: Bearer KEY\"", "unauthorized")
                response = await handler(request, handled)
                name = handled.model.name if handled.model else name
                if handled.method:
                    self.metrics.count("te_request_success", name, method=handled.method)
                    self.metrics.duration("te_request_duration", name, time.perf_counter() - handled.start)
                    self.metrics.duration("te_request_tokenization_duration", name, handled.tokenization_s)
                    if handled.done:
                        self.metrics.duration("te_request_queue_duration", name, handled.done.queue_s)
                        self.metrics.duration("te_request_inference_duration", name, handled.done.inference_s)
                return response
            except ServeError as exc:
                name = handled.model.name if handled.model else name
                self.metrics.failure(name, exc.failure)
                return JSONResponse(exc.openai_body() if openai else exc.body(), exc.status)
            except (ClientGone, ClientDisconnect):
                self.metrics.failure(handled.model.name if handled.model else name, "dropped")
                return Response(status_code=499)  # nobody reads it: nginx's "client closed request"
            except Exception as exc:  # a bug: say so in the usual shape rather than a bare 500 page
                logger.exception("%s failed", path)
                self.metrics.failure(handled.model.name if handled.model else name, "internal")
                body = {"error": f"internal error: {type(exc).__name__}: {exc}", "error_type": "backend"}
                return JSONResponse({"message": body["error"], "code": 500, "type": "backend"} if openai else body, 500)

        return Route(path, endpoint, methods=list(methods))

    def json(self, handled: Handled, content, status: int = 200) -> Response:
        return Response(json.dumps(content, separators=(",", ":")), status, handled.headers(),
                        media_type="application/json")


async def _disconnect(request: Request) -> None:
    """Returns when the client closes the connection (the body is read by then, so the next
    ASGI message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
