"""The route handlers and `create_app`: TEI's request and response shapes
(router/src/http/types.rs), and OpenAI's /v1/embeddings. Each parses its body, asks the model
for the output the route reads (a 424 when it has none), tokenizes, queues, and shapes the outputs.

Several models: a request names one with "model" (the OpenAI field, also read by the TEI
routes); without it, or with a name the server does not know while it serves one model
(as TEI, which ignores it), the first model answers."""
from __future__ import annotations

import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from .._version import __version__
from ..late import LateInteraction
from .app import Handled, ServeApp
from .errors import ServeError, bad_request
from .model import ServedModel
from .options import ServeOptions
from .outputs import check_quantizable, encode_rows, lexical_rows, scores, shape_embeddings, sparse_rows
from .requests import embed_request, openai_request, predict_request, rerank_request, tokenize_request


def _begin(app: ServeApp, handled: Handled, name: str | None, single: bool, count: int) -> ServedModel:
    """The request's model; counts it as TEI does (te_request_count by method) and checks
    --max-client-batch-size."""
    served = handled.model = app.model(name)
    handled.method = "single" if single else "batch"
    app.metrics.count("te_request_count", served.name, method=handled.method)
    app.check_batch(count)
    return served


def _dimensions(vectors: np.ndarray, dimensions: int | None, served: ServedModel) -> int | None:
    if dimensions is not None and dimensions > vectors.shape[1]:
        raise bad_request(f"dimensions={dimensions} is more than model {served.name!r} gives "
                          f"({vectors.shape[1]}); valid: 1 to {vectors.shape[1]}")
    return dimensions


def _count_inputs(app: ServeApp, served: ServedModel, name: str, count: int, seconds: float) -> None:
    prefix = "te_predict" if name == "predict" else "te_embed"
    app.metrics.count(f"{prefix}_count", served.name, count)
    app.metrics.count(f"{prefix}_success", served.name, count)
    app.metrics.duration(f"{prefix}_duration", served.name, seconds)


async def _pooled(app: ServeApp, request: Request, handled: Handled, route: str, req=None):
    """/embed and /embed_sparse: (n, S) pooled vectors of the request's inputs (req: the body
    already parsed)."""
    req = req or embed_request(await app.body(request))
    served = _begin(app, handled, req.options.model, req.single, len(req.inputs))
    output = served.require(route)
    if route == "/embed" and req.normalize and served.kind == "sparse":
        raise ServeError("`normalize` is not available for SPLADE models: send \"normalize\": false, or use "
                         "/embed_sparse", "backend", failure="model_type")
    encoded = await app.encode(handled, served, req.inputs, req.options)
    vectors = np.stack(await app.submit(request, handled, served, output, encoded))
    _count_inputs(app, served, "embed", len(req.inputs), handled.done.queue_s + handled.done.inference_s)
    return req, served, vectors


async def _late(app: ServeApp, request: Request, handled: Handled, route: str, req, served: ServedModel):
    """/embed_all and /embed_sparse of a late-interaction model: (encoded, the per-token output of
    each text), read as a query or a document (`kind`, default document)."""
    _begin(app, handled, req.options.model, req.single, len(req.inputs))
    output = served.require(route)
    encoded = await app.encode(handled, served, req.inputs, req.options, late_kind=req.kind or "document")
    rows = await app.submit(request, handled, served, output, encoded)
    _count_inputs(app, served, "embed", len(req.inputs), handled.done.queue_s + handled.done.inference_s)
    return encoded, rows


def routes(app: ServeApp) -> list:
    async def embed(request: Request, handled: Handled) -> Response:
        req, served, vectors = await _pooled(app, request, handled, "/embed")
        vectors = shape_embeddings(vectors, _dimensions(vectors, req.dimensions, served), req.normalize)
        return app.json(handled, vectors.tolist())

    async def embed_sparse(request: Request, handled: Handled) -> Response:
        req = embed_request(await app.body(request))
        served = app.model(req.options.model)
        if served.late_interaction:
            encoded, weights = await _late(app, request, handled, "/embed_sparse", req, served)
            skip = (served.runtime.late or LateInteraction()).sparse_skip
            return app.json(handled, [lexical_rows(w, ids, skip) for w, ids in zip(weights, encoded.ids)])
        _, _, vectors = await _pooled(app, request, handled, "/embed_sparse", req)
        return app.json(handled, sparse_rows(vectors))

    async def embed_all(request: Request, handled: Handled) -> Response:
        req = embed_request(await app.body(request))
        served = app.model(req.options.model)
        if served.late_interaction:
            encoded, tokens = await _late(app, request, handled, "/embed_all", req, served)
            return app.json(handled, [t[keep].tolist() for t, keep in zip(tokens, encoded.keep)])
        served = _begin(app, handled, req.options.model, req.single, len(req.inputs))
        output = served.require("/embed_all")
        if req.kind is not None:
            raise bad_request(f"`kind` applies to late-interaction models (ColBERT, bge-m3); model {served.name!r} "
                              "is not one: drop it")
        encoded = await app.encode(handled, served, req.inputs, req.options)
        tokens = await app.submit(request, handled, served, output, encoded)
        _count_inputs(app, served, "embed", len(req.inputs), handled.done.queue_s + handled.done.inference_s)
        return app.json(handled, [t.tolist() for t in tokens])

    async def openai_embeddings(request: Request, handled: Handled) -> Response:
        req = openai_request(await app.body(request))
        served = _begin(app, handled, req.options.model, req.single, len(req.inputs))
        output = served.require("/v1/embeddings")
        encoded = await app.encode(handled, served, req.inputs, req.options)
        check_quantizable(req.encoding_format, len(req.inputs))  # before the model runs
        vectors = np.stack(await app.submit(request, handled, served, output, encoded))
        _count_inputs(app, served, "embed", len(req.inputs), handled.done.queue_s + handled.done.inference_s)
        vectors = shape_embeddings(vectors, _dimensions(vectors, req.dimensions, served), True)
        rows = encode_rows(vectors, req.encoding_format)
        data = [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)]
        usage = {"prompt_tokens": encoded.tokens, "total_tokens": encoded.tokens}
        return app.json(handled, {"object": "list", "data": data, "model": served.name, "usage": usage})

    async def predict(request: Request, handled: Handled) -> Response:
        req = predict_request(await app.body(request))
        served = _begin(app, handled, req.options.model, req.single, len(req.texts))
        output = served.require("/predict")
        encoded = await app.encode(handled, served, req.texts, req.options, pairs=req.pairs)
        logits = np.stack(await app.submit(request, handled, served, output, encoded))
        _count_inputs(app, served, "predict", len(req.texts), handled.done.queue_s + handled.done.inference_s)
        results = []
        for row in scores(logits, req.raw_scores):
            order = np.argsort(-row, kind="stable")  # TEI: by score, highest first
            results.append([{"score": float(row[k]), "label": served.labels[k]} for k in order])
        return app.json(handled, results[0] if req.single else results)

    async def rerank(request: Request, handled: Handled) -> Response:
        req = rerank_request(await app.body(request))
        served = _begin(app, handled, req.options.model, False, len(req.texts))
        output = served.require("/rerank")
        queries = [req.query] * len(req.texts)
        encoded = await app.encode(handled, served, queries, req.options, pairs=list(req.texts))
        logits = np.stack(await app.submit(request, handled, served, output, encoded))
        _count_inputs(app, served, "predict", len(req.texts), handled.done.queue_s + handled.done.inference_s)
        values = scores(logits, req.raw_scores)[:, 0]
        ranks = [{"index": int(i), **({"text": req.texts[i]} if req.return_text else {}), "score": float(values[i])}
                 for i in np.argsort(-values, kind="stable")]
        return app.json(handled, ranks)

    async def tokenize(request: Request, handled: Handled) -> Response:
        req = tokenize_request(await app.body(request))
        served = handled.model = app.model(req.options.model)
        app.check_batch(len(req.texts))
        return app.json(handled, served.tokens(req.texts, req.add_special_tokens, req.options.prompt_name))

    async def info(request: Request, handled: Handled) -> Response:
        served = handled.model = app.model(request.query_params.get("model"))
        options = app.options
        return app.json(handled, {
            "model_id": served.name, "model_sha": None, "model_dtype": served.dtype, "model_type": served.info_type(),
            "max_concurrent_requests": options.max_concurrent_requests, "max_input_length": served.max_input_length,
            "max_batch_tokens": app.batchers[served.name].max_batch_tokens, "max_batch_requests": None,
            "max_client_batch_size": options.max_client_batch_size, "auto_truncate": options.auto_truncate,
            "tokenization_workers": 1, "version": __version__, "sha": None, "docker_label": None,
            "models": sorted(app.models), "provider": served.runtime.provider, "threads": served.runtime.threads,
        })

    async def models(request: Request, handled: Handled) -> Response:
        return app.json(handled, {"object": "list", "data": [
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
        app.route("/predict", predict), app.route("/rerank", rerank), app.route("/tokenize", tokenize),
        app.route("/info", info, methods=("GET",)), app.route("/v1/models", models, methods=("GET",)),
        app.route("/health", health, methods=("GET",)), app.route("/metrics", metrics, methods=("GET",)),
    ]


def create_app(models: list[ServedModel], options: ServeOptions | None = None) -> Starlette:
    """The ASGI app serving `models` (ServedModels, the first one the default); the ServeApp
    behind it is ``app.state.serve``."""
    serve = ServeApp(models, options or ServeOptions())
    app = Starlette(routes=routes(serve), lifespan=serve.lifespan)
    app.state.serve = serve
    return app
