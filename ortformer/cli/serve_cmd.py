"""`ortformer serve`: a thin wrapper over ortformer.serve (imported when the verb runs, so the
CLI works without the 'serve' extra and names it when the verb is used)."""
from __future__ import annotations

import click

from ..runtime.providers import PROVIDERS
from .common import quiet_onnxruntime, threads_option


@click.command("serve")
@click.argument("models", nargs=-1, type=click.Path(exists=True, dir_okay=False))
@click.option("--model", "named", multiple=True, metavar="NAME=PATH",
              help="A model under a name of your choosing (repeatable); MODELS are named by their file's stem.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: every interface).")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True, help="Port (0: a free one).")
@click.option("--max-batch-tokens", type=click.IntRange(min=1), default=None,
              help="Padded tokens (batch x its longest) per model call [default: 256 per thread on the CPU, 16384 on CUDA].")
@click.option("--max-wait-ms", type=click.FloatRange(0, 10_000), default=2.0, show_default=True,
              help="How long a worker waits for more requests to join a batch that is not full.")
@click.option("--max-client-batch-size", type=click.IntRange(min=1), default=32, show_default=True,
              help="Most inputs in one request (more: 413).")
@click.option("--payload-limit", type=click.IntRange(min=1), default=2_000_000, show_default=True,
              help="Most bytes in one request body (more: 413).")
@click.option("--max-concurrent-requests", type=click.IntRange(min=1), default=512, show_default=True,
              help="Most requests queued or running per model (more: 429).")
@click.option("--auto-truncate", is_flag=True, help="Truncate over-long inputs unless the request says otherwise.")
@click.option("--api-key", envvar="ORTFORMER_API_KEY", default=None,
              help="Require 'Authorization: Bearer KEY' on every route but /health and /metrics "
                   "(or set ORTFORMER_API_KEY).")
@threads_option("onnxruntime threads per model [default: the CPUs this process may use: affinity and cgroup quota].")
@click.option("--provider", type=click.Choice((*PROVIDERS, "tuned")), default="cpu", show_default=True,
              help="Execution provider; tuned: what `ortformer tune --write` recorded for this CPU.")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]), default="warning",
              show_default=True, help="uvicorn's log level ('info' logs each request).")
@click.pass_context
def serve_command(ctx, models, named, host, port, max_batch_tokens, max_wait_ms, max_client_batch_size,
                  payload_limit, max_concurrent_requests, auto_truncate, api_key, threads, provider, log_level):
    """Serve MODELS over HTTP: text-embeddings-inference's routes and OpenAI's /v1/embeddings.

    Routes: POST /embed, /embed_sparse, /embed_all, /rerank, /predict, /tokenize,
    /v1/embeddings; GET /info, /health, /metrics. Concurrent requests are batched by
    length into model calls of at most --max-batch-tokens padded tokens. SIGTERM or
    Ctrl-C stops accepting connections, answers every open request, and exits 0.

    \b
    Examples:
      ortformer serve minilm.onnx --port 8080
      ortformer serve --model minilm=minilm.onnx --model rerank=reranker.onnx --api-key secret
      curl -s localhost:8080/embed -H 'Content-Type: application/json' -d '{"inputs": "a text"}'
    """
    from ..serve import ServedModel, ServeOptions, create_app, load_runtime, model_specs, run
    from ..serve.server import announce

    quiet_onnxruntime(ctx)
    specs = model_specs(models, named)
    options = ServeOptions(max_batch_tokens=max_batch_tokens, max_wait_ms=max_wait_ms,
                           max_client_batch_size=max_client_batch_size, payload_limit=payload_limit,
                           max_concurrent_requests=max_concurrent_requests, auto_truncate=auto_truncate,
                           api_key=api_key, threads=threads, provider=provider)
    served = [ServedModel(name, load_runtime(path, options)) for name, path in specs.items()]
    run(create_app(served, options), host, port, log_level=log_level, ready=announce(list(specs)))


COMMANDS = [serve_command]
