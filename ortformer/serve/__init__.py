"""`ortformer serve`: an HTTP embedding server, compatible with text-embeddings-inference and
OpenAI's embeddings API, over the torch-free runtime (needs the ``serve`` extra).

- ``create_app(models, options)``: the ASGI app (Starlette) for ServedModels;
- ``ServedModel(name, runtime)``: a Runtime behind the routes;
- ``ServeOptions``: batching, limits and auth, with TEI's defaults;
- ``run(app, host, port)``: serve with uvicorn until SIGTERM, then drain.

Layout: options (flags; the CPU count is ortformer/cpus.py's), model (requests -> token ids), batcher (one queue
and worker per model, Runtime.embed off the event loop), app and routes (HTTP), outputs
(normalise, sparse, scores, quantize), metrics (Prometheus, TEI's names), errors (TEI's codes).
"""
from ..errors import require

require("ortformer serve", "serve", "starlette", "uvicorn", "prometheus_client")

from .routes import create_app
from .model import ServedModel
from .options import ServeOptions, load_runtime, model_specs
from .server import run

__all__ = ["create_app", "ServedModel", "ServeOptions", "load_runtime", "model_specs", "run"]
