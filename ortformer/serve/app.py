"""The app's state and plumbing: ServeApp holds the models, their Batchers and the metrics,
and wraps each route (API key, errors as TEI's JSON, metrics); routes.py holds the handlers
and `create_app`. The lifespan starts one Batcher per model and, at shutdown, lets each
finish what is queued.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .auth import bearer, matches
from .batcher import Batcher
from .errors import ServeError, bad_request, too_large
from .metrics import Metrics
from .model import Call, ClientGone, ServedModel
from .options import ServeOptions
from .outputs import json_bytes
from .requests import parse_json

logger = logging.getLogger("ortformer.serve")
# a body larger than this is parsed (and its ids checked) on a worker thread, off the event loop
INLINE_BODY = 65536
PUBLIC = ("/health", "/metrics")


class Handled(Call):
    """One HTTP request's bookkeeping: its model, its id (the x-request-id header, and the
    body of a 500), and TEI's response headers; the operation records the rest (model.Call)."""

    def __init__(self, app: "ServeApp", route: str, request: Request):
        super().__init__(gone=lambda: _disconnect(request))
        self.app, self.route = app, route
        self.start = time.perf_counter()
        self.model: ServedModel | None = None
        self.counted = False  # te_request_count was counted: success is counted too
        self.id = uuid.uuid4().hex

    def headers(self) -> dict[str, str]:
        ms = lambda s: str(int(s * 1000))  # noqa: E731
        return {"x-compute-type": "gpu" if self.model is not None and self.model.runtime.provider == "cuda" else "cpu",
                "x-compute-time": ms(time.perf_counter() - self.start), "x-total-time": ms(time.perf_counter() - self.start),
                "x-compute-characters": str(self.chars), "x-compute-tokens": str(self.tokens),
                "x-tokenization-time": ms(self.tokenization_s),
                "x-queue-time": ms(self.queue_s), "x-inference-time": ms(self.inference_s), "x-request-id": self.id}


class ServeApp:
    def __init__(self, models: list[ServedModel], options: ServeOptions):
        if not models:
            raise ValueError("serve needs at least one model")
        self.models = {m.name: m for m in models}
        self.default = models[0]
        self.options = options
        self.bearer = None if options.api_key is None else bearer(options.api_key)
        self.metrics = Metrics(list(self.models), max(m.max_input_length for m in models))
        self.batchers = {m.name: Batcher(m, self.metrics, max_batch_tokens=options.batch_tokens(m.runtime),
                                         max_wait_ms=options.max_wait_ms,
                                         max_concurrent_requests=options.max_concurrent_requests)
                         for m in models}
        for m in models:
            m.attach(self.batchers[m.name], self.metrics, auto_truncate=options.auto_truncate,
                     max_client_batch_size=options.max_client_batch_size)
        self.tracing = None  # a tracing.Tracing (--otlp-endpoint): spans per request; None costs nothing

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
        raise bad_request(f"model {name[:40]!r} is not served here; served: {', '.join(sorted(self.models))}")

    def authorized(self, request: Request) -> bool:
        if self.bearer is None or request.url.path in PUBLIC:
            return True
        # the header's raw bytes: a non-ASCII key arrives as its UTF-8 bytes
        sent = next((value for name, value in request.headers.raw if name == b"authorization"), b"")
        return matches(sent, self.bearer)

    async def body(self, request: Request) -> bytes:
        """The raw body, refused (413) past --payload-limit bytes before it is all read."""
        limit = self.options.payload_limit
        too_big = too_large(f"the request body is larger than --payload-limit {limit} bytes")
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise too_big
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_big
            chunks.append(chunk)
        return b"".join(chunks)

    async def parse(self, request: Request, parser):
        """The body read as `parser` reads a JSON object (requests.py), on a worker thread when
        it is large (checking 500,000 ids is tens of milliseconds)."""
        return await self.parse_bytes(await self.body(request), parser)

    async def parse_bytes(self, raw: bytes, parser):
        work = lambda: parser(parse_json(raw))  # noqa: E731
        return work() if len(raw) <= INLINE_BODY else await asyncio.to_thread(work)

    def served(self, handled: Handled, name: str | None, method: str = "batch") -> ServedModel:
        """The request's model (handled.model), its method label set for the operation."""
        handled.model = self.model(name)
        handled.method, handled.counted = method, True
        return handled.model

    def route(self, path: str, handler, methods=("POST",), openai: bool = False) -> Route:
        async def traced(request: Request) -> Response:
            handled = Handled(self, path, request)
            response = await endpoint(request, handled)
            if self.tracing is not None:
                self.tracing.record(path, handled, request.headers, response.status_code)
            return response

        async def endpoint(request: Request, handled: Handled) -> Response:
            name = self.default.name
            try:
                if not self.authorized(request):
                    raise ServeError("missing or wrong API key: send \"Authorization: Bearer KEY\"", "unauthorized")
                if request.method == "POST":
                    check_json(request.headers.get("content-type"))
                response = await handler(request, handled)
                name = handled.model.name if handled.model else name
                if handled.counted:
                    self.metrics.count("te_request_success", name, method=handled.method)
                    self.metrics.duration("te_request_duration", name, time.perf_counter() - handled.start)
                    self.metrics.duration("te_request_tokenization_duration", name, handled.tokenization_s)
                    if handled.ran:
                        self.metrics.duration("te_request_queue_duration", name, handled.queue_s)
                        self.metrics.duration("te_request_inference_duration", name, handled.inference_s)
                return response
            except ServeError as exc:
                name = handled.model.name if handled.model else name
                self.metrics.failure(name, exc.failure)
                return JSONResponse(exc.openai_body() if openai else exc.body(), exc.status,
                                    {"x-request-id": handled.id})
            except (ClientGone, ClientDisconnect):
                self.metrics.failure(handled.model.name if handled.model else name, "dropped")
                return Response(status_code=499)  # nobody reads it: nginx's "client closed request"
            except Exception:  # a bug: logged once under the request id the answer carries
                logger.exception("request %s to %s failed", handled.id, path)
                self.metrics.failure(handled.model.name if handled.model else name, "internal")
                message = f"internal error; the server's log names it by request id {handled.id}"
                body = ({"message": message, "code": 500, "type": "backend", "request_id": handled.id} if openai
                        else {"error": message, "error_type": "backend", "request_id": handled.id})
                return JSONResponse(body, 500, {"x-request-id": handled.id})

        return Route(path, traced, methods=list(methods))

    async def json(self, handled: Handled, content) -> Response:
        """`content` (numpy arrays allowed) as a JSON answer with TEI's headers, encoded on a
        worker thread in pieces (outputs.json_bytes), so a 60 MB answer never holds the loop."""
        body = await asyncio.to_thread(json_bytes, content)
        return Response(body, 200, handled.headers(), media_type="application/json")


def check_json(content_type: str | None) -> None:
    """415 unless the body is declared JSON: ``application/json`` or ``application/*+json``,
    any case, parameters (charset) ignored. A browser's cross-site form can only send
    form, multipart or text/plain bodies without a CORS preflight, so they are refused."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    kind, _, subtype = media.partition("/")
    if kind != "application" or not (subtype == "json" or subtype.endswith("+json")):
        shown = repr(content_type[:64]) if content_type else "none"
        raise ServeError(f"the body must be JSON: send Content-Type: application/json (got {shown})",
                         "validation", status=415)


async def _disconnect(request: Request) -> None:
    """Returns when the client closes the connection (the body is read by then, so the next
    ASGI message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
