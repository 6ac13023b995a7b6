"""The route handlers and `create_app`: TEI 1.9's request and response shapes
(router/src/http/types.rs), OpenAI's /v1/embeddings and the Cohere / Jina /v1/rerank. Each
handler parses its body (requests.py), calls the served model's operation (model.py, where
the model's rules live), and shapes the answer; nothing else.

Several models: a request names one with "model" (the OpenAI field, also read by the TEI
routes); without it, or with a name the server does not know while it serves one model
(as TEI, which ignores it), the first model answers."""
from __future__ import annotations

import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from .._version import __version__
from .app import Handled, ServeApp
from .model import ServedModel
from .options import ServeOptions
from .outputs import check_quantizable, encode_rows
from .requests import (decode_request, embed_request, openai_request, predict_request, rerank_request,
                       similarity_request, tokenize_request)


def _method(single: bool) -> str:
    return "single" if single else "batch"


def routes(app: ServeApp) -> list:
    async def embed(request: Request, handled: Handled) -> Response:
        req = await app.parse(request, embed_request)
        served = app.served(handled, req.options.model, _method(req.single))
        vectors = await served.embed(req.inputs, req.options, normalize=req.normalize, dimensions=req.dimensions,
                                     call=handled)
        return await app.json(handled, vectors)

    async def embed_sparse(request: Request, handled: Handled) -> Response:
        req = await app.parse(request, embed_request)
        served = app.served(handled, req.options.model, _method(req.single))
        return await app.json(handled, await served.embed_sparse(req.inputs, req.options, late_kind=req.kind,
                                                                 call=handled))

    async def embed_all(request: Request, handled: Handled) -> Response:
        req = await app.parse(request, embed_request)
        served = app.served(handled, req.options.model, _method(req.single))
        return await app.json(handled, await served.embed_all(req.inputs, req.options, late_kind=req.kind,
                                                              call=handled))

    async def openai_embeddings(request: Request, handled: Handled) -> Response:
        req = await app.parse(request, openai_request)
        served = app.served(handled, req.options.model, _method(req.single))
        check_quantizable(req.encoding_format, len(req.inputs))  # before the model runs
        vectors = await served.embed(req.inputs, req.options, normalize=True, dimensions=req.dimensions,
                                     call=handled, route="/v1/embeddings")
        rows = encode_rows(vectors, req.encoding_format)
        data = [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)]
        usage = {"prompt_tokens": handled.tokens, "total_tokens": handled.tokens}
        return await app.json(handled, {"object": "list", "data": data, "model": served.name, "usage": usage})

    async def predict(request: Request, handled: Handled) -> Response:
        req = await app.parse(request, predict_request)
        served = app.served(handled, req.options.model, _method(req.single))
        values = await served.predict(req.texts, req.options, pairs=req.pairs, raw_scores=req.raw_scores,
                                      call=handled)
        results = []
        for row in values:
            order = np.argsort(-row, kind="stable")  # TEI: by score, highest first
            results.append([{"score": float(row[k]), "label": served.labels[k]} for k in order])
        return await app.json(handled, results[0] if req.single else results)

    async def rerank(request: Request, handled: Handled) -> Response:
        """TEI's /rerank, or the Cohere / Jina shape when the body has `documents`."""
        req = await app.parse(request, rerank_request)
        served = app.served(handled, req.options.model)
        values = await served.rerank(req.query, req.texts, req.options, raw_scores=req.raw_scores, call=handled)
        order = np.argsort(-values, kind="stable")  # highest first; ties keep the texts' order
        if req.cohere:
            results = [{"index": int(i), "relevance_score": float(values[i]),
                        **({"document": {"text": req.texts[i]}} if req.return_text else {})}
                       for i in order[:req.top_n]]
            return await app.json(handled, {"id": handled.id, "model": served.name, "results": results,
                                            "usage": {"total_tokens": handled.tokens}})
        return await app.json(handled, [{"index": int(i), **({"text": req.texts[i]} if req.return_text else {}),
                                         "score": float(values[i])} for i in order])

    async def similarity(request: Request, handled: Handled) -> Response:
        req = await app.parse(request, similarity_request)
        served = app.served(handled, req.options.model)
        return await app.json(handled, await served.similarity(req.source, req.sentences, req.options, call=handled))

    async def tokenize(request: Request, handled: Handled) -> Response:
        req = await app.parse(request, tokenize_request)
        served = app.served(handled, req.options.model, _method(req.single))
        return await app.json(handled, await served.tokenize(req.texts, add_special_tokens=req.add_special_tokens,
                                                             prompt_name=req.options.prompt_name, call=handled))

    async def decode(request: Request, handled: Handled) -> Response:
        req = await app.parse(request, decode_request)
        served = app.served(handled, req.model, _method(req.single))
        return await app.json(handled, await served.decode(req.ids, skip_special_tokens=req.skip_special_tokens,
                                                           call=handled))

    async def root(request: Request, handled: Handled) -> Response:
        """TEI's POST / (and SageMaker's /invocations): the default model's own route, and
        /similarity for a body whose `inputs` is {source_sentence, sentences} (what the
        huggingface_hub InferenceClient's sentence_similarity sends to an endpoint's URL)."""
        served = app.default
        kind = served.kind
        if kind in ("classifier", "reranker"):
            return await (rerank if kind == "reranker" else predict)(request, handled)
        raw = await app.body(request)
        body = await app.parse_bytes(raw, lambda parsed: parsed)
        target = similarity if isinstance(body.get("inputs"), dict) else embed_sparse if kind == "sparse" else embed
        return await target(_replayed(request, raw), handled)

    async def info(request: Request, handled: Handled) -> Response:
        served = handled.model = app.model(request.query_params.get("model"))
        options = app.options
        return await app.json(handled, {
            "model_id": served.name, "model_sha": None, "model_dtype": served.dtype, "model_type": served.info_type(),
            "max_concurrent_requests": options.max_concurrent_requests, "max_input_length": served.max_input_length,
            "max_batch_tokens": app.batchers[served.name].max_batch_tokens, "max_batch_requests": None,
            "max_client_batch_size": options.max_client_batch_size, "auto_truncate": options.auto_truncate,
            "tokenization_workers": 1, "version": __version__, "sha": None, "docker_label": None,
            "models": sorted(app.models), "provider": served.runtime.provider, "threads": served.runtime.threads,
        })

    async def models(request: Request, handled: Handled) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": name, "object": "model", "created": 0, "owned_by": "ortformer"} for name in app.models]})

    async def health(request: Request, handled: Handled) -> Response:
        if all(b.healthy for b in app.batchers.values()):
            return Response(status_code=200)
        return JSONResponse({"error": "unhealthy", "error_type": "unhealthy"}, 503)

    async def metrics(request: Request, handled: Handled) -> Response:
        return PlainTextResponse(app.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return [
        app.route("/embed", embed), app.route("/embed_sparse", embed_sparse), app.route("/embed_all", embed_all),
        app.route("/v1/embeddings", openai_embeddings, openai=True),
        app.route("/embeddings", openai_embeddings, openai=True),  # TEI serves the OpenAI route here too
        app.route("/predict", predict), app.route("/rerank", rerank), app.route("/v1/rerank", rerank),
        app.route("/similarity", similarity), app.route("/tokenize", tokenize), app.route("/decode", decode),
        app.route("/", root), app.route("/invocations", root),
        app.route("/info", info, methods=("GET",)), app.route("/v1/models", models, methods=("GET",)),
        app.route("/health", health, methods=("GET",)), app.route("/metrics", metrics, methods=("GET",)),
        app.route("/ping", health, methods=("GET",)),  # SageMaker's health route, as TEI
    ]


def _replayed(request: Request, raw: bytes) -> Request:
    """A Request whose body is `raw` (already read), for a handler that reads it again."""
    async def receive():
        return {"type": "http.request", "body": raw, "more_body": False}

    replay = Request(request.scope, receive)
    replay._body = raw  # noqa: SLF001 - starlette reads a cached body from here
    return replay


async def _http_error(request: Request, exc: HTTPException) -> Response:
    """404 and 405 as TEI-shaped JSON (Starlette answers them in plain text)."""
    if exc.status_code == 405:
        message = f"method {request.method} is not allowed on {request.url.path[:80]}"
    elif exc.status_code == 404:
        message = f"no route {request.url.path[:80]}; see docs/serve.md for the routes"
    else:
        message = str(exc.detail)[:200]
    return JSONResponse({"error": message, "error_type": "validation"}, exc.status_code, exc.headers)


def create_app(models: list[ServedModel], options: ServeOptions | None = None) -> Starlette:
    """The ASGI app serving `models` (ServedModels, the first one the default); the ServeApp
    behind it is ``app.state.serve``."""
    serve = ServeApp(models, options or ServeOptions())
    app = Starlette(routes=routes(serve), lifespan=serve.lifespan, exception_handlers={HTTPException: _http_error})
    # no redirect from /embed/ to /embed: Starlette builds it from the Host header a client sends
    app.router.redirect_slashes = False
    app.state.serve = serve
    return app
