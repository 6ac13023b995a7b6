"""`ortformer serve`: an HTTP embedding server, compatible with text-embeddings-inference and
OpenAI's embeddings API, over the torch-free runtime (needs the ``serve`` extra).

- ``create_app(models, options)``: the ASGI app (Starlette) for ServedModels;
- ``ServedModel(name, runtime)``: a Runtime behind the routes;
- ``ServeOptions``: batching, limits and auth, with TEI's defaults;
- ``run(app, host, port, limits=...)``: serve with uvicorn until SIGTERM, then drain
  (within ``limits.Limits.graceful_shutdown_timeout``).

Layout: options (flags, the CPU count is ortformer/core/cpus.py's), model (a served model's operations, shared by every
transport: embed, rerank, similarity, ...), encoding (inputs -> token ids, tokens, decoding),
batcher (one queue and worker per model, Runtime.embed off the event loop, admission), requests
(strict parsing of the bodies), app and routes (HTTP: parse, call, format), outputs (normalise,
pool, sparse, scores, quantize, JSON in pieces), server and limits (uvicorn with a bound on
everything a connection holds; a bounded shutdown), auth (the API key), metrics (Prometheus,
TEI's names), errors (TEI's codes).
Beyond one process: workers (--workers N on one port), ray (the Ray Serve application
builder), grpc (TEI's tei.proto, --grpc-port), tracing (OpenTelemetry spans, --otlp-endpoint).
"""
from ..core.errors import require

require("ortformer serve", "serve", "starlette", "uvicorn", "httptools", "prometheus_client")

from .routes import create_app
from .model import ServedModel
from .options import ServeOptions, load_runtime, model_specs
from .server import run

__all__ = ["create_app", "ServedModel", "ServeOptions", "load_runtime", "model_specs", "run"]
