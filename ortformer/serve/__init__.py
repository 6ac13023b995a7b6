"""`ortformer serve`: an HTTP embedding server, compatible with text-embeddings-inference and
OpenAI's embeddings API, over the torch-free runtime (needs the ``serve`` extra).

- ``create_app(models, options)``: the ASGI app (Starlette) for ServedModels;
- ``ServedModel(name, runtime)``: a Runtime behind the routes;
- ``ServeOptions``: batching, limits and auth, with TEI's defaults;
- ``run(app, host, port)``: serve with uvicorn until SIGTERM, then drain.

Layout: options (flags, CPU count in cpus), model (requests -> token ids), batcher (one queue
and worker per model, Runtime.embed off the event loop), app and routes (HTTP), outputs
(normalise, sparse, scores, quantize), metrics (Prometheus, TEI's names), errors (TEI's codes).
Beyond one process: workers (--workers N on one port), ray (the Ray Serve application
builder), grpc (TEI's tei.proto, --grpc-port), tracing (OpenTelemetry spans, --otlp-endpoint).
"""
from ..errors import MissingExtraError

try:
    import prometheus_client  # noqa: F401
    import starlette  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise MissingExtraError("ortformer serve", "serve", exc.name or "starlette") from exc

from .routes import create_app
from .model import ServedModel
from .options import ServeOptions, load_runtime, model_specs
from .server import run

__all__ = ["create_app", "ServedModel", "ServeOptions", "load_runtime", "model_specs", "run"]
