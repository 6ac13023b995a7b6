"""`ortformer serve`: a thin wrapper over ortformer.serve (imported when the verb runs, so the
CLI works without the 'serve' extra and names it when the verb is used)."""
from __future__ import annotations

import os

import click

from ..core.errors import InputError
from ..runtime.providers import PROVIDERS
from .common import quiet_onnxruntime, threads_option

API_KEY_ENV = "ORTFORMER_API_KEY"


def limit_options(command):
    """The connection limits and timeouts (ortformer.serve.limits.Limits; docs/serve.md says
    why each default)."""
    seconds = click.FloatRange(0, 86_400, min_open=True)
    for name, kind, default, text in reversed([
        ("--max-connections", click.IntRange(min=1), 1024, "Most open connections; one more is answered 503 and closed."),
        ("--max-header-bytes", click.IntRange(min=256), 32768, "Most bytes in a request line and its headers (more: 431)."),
        ("--max-headers", click.IntRange(min=1), 100, "Most header fields in a request (more: 431)."),
        ("--keep-alive-timeout", seconds, 5.0, "Seconds a connection may stay open with no request begun."),
        ("--header-timeout", seconds, 10.0, "Seconds from a request's first byte to its last header (then 408, closed)."),
        ("--body-timeout", seconds, 30.0, "Seconds from a request's headers to the end of its body (then 408, closed)."),
        ("--write-timeout", seconds, 30.0, "Seconds an answer may wait on a client that does not read it (then closed)."),
        ("--graceful-shutdown-timeout", seconds, 20.0,
         "Seconds SIGTERM waits for open requests before closing their connections (below Kubernetes' 30 s grace)."),
    ]):
        command = click.option(name, type=kind, default=default, show_default=True, help=text)(command)
    return command


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
              help="Most inputs in one request (more: 422).")
@click.option("--payload-limit", type=click.IntRange(min=1), default=2_000_000, show_default=True,
              help="Most bytes in one request body (more: 413).")
@click.option("--max-concurrent-requests", type=click.IntRange(min=1), default=512, show_default=True,
              help="Most requests queued or running per model (more: 429).")
@click.option("--auto-truncate", is_flag=True, help="Truncate over-long inputs unless the request says otherwise.")
@click.option("--api-key", envvar="ORTFORMER_API_KEY", default=None,
              help="Require 'Authorization: Bearer KEY' on every route but /health and /metrics "
                   "(or set ORTFORMER_API_KEY; --api-key-file keeps it out of the process list).")
@click.option("--api-key-file", type=click.Path(dir_okay=False), default=None,
              help="Read the API key from this file (one trailing newline is dropped).")
@threads_option("onnxruntime threads per model [default: the CPUs this process may use: affinity and cgroup quota].")
@click.option("--provider", type=click.Choice((*PROVIDERS, "tuned")), default="cpu", show_default=True,
              help="Execution provider; tuned: what `ortformer tune --write` recorded for this CPU.")
@click.option("--workers", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Processes answering on the one port, each with its own sessions and batcher "
                   "(--threads defaults to the CPUs / N); /metrics sums over them.")
@click.option("--grpc-port", type=click.IntRange(0, 65535), default=None,
              help="Also serve text-embeddings-inference's gRPC API (tei.proto) on this port, same host, "
                   "batcher, limits and key (metadata 'authorization: Bearer KEY'); 0 picks a free port.")
@click.option("--otlp-endpoint", envvar="OTLP_ENDPOINT", default=None, metavar="URL",
              help="Export OpenTelemetry spans per request (OTLP over gRPC) to URL, e.g. http://localhost:4317 "
                   "(or set OTLP_ENDPOINT, TEI's variable). Off by default.")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]), default="warning",
              show_default=True, help="uvicorn's log level ('info' logs each request).")
@limit_options
@click.pass_context
def serve_command(ctx, models, named, host, port, max_batch_tokens, max_wait_ms, max_client_batch_size,
                  payload_limit, max_concurrent_requests, auto_truncate, api_key, api_key_file, threads, provider,
                  workers, grpc_port, otlp_endpoint, log_level, **limits):
    """Serve MODELS over HTTP: text-embeddings-inference's routes and OpenAI's /v1/embeddings.

    Routes: POST /embed, /embed_sparse, /embed_all, /rerank, /predict, /tokenize,
    /v1/embeddings; GET /info, /health, /metrics. Concurrent requests are batched by
    length into model calls of at most --max-batch-tokens padded tokens. SIGTERM or
    Ctrl-C stops accepting connections, answers every open request (for at most
    --graceful-shutdown-timeout seconds, then closes what is left), and exits 0.

    \b
    Examples:
      ortformer serve minilm.onnx --port 8080
      ortformer serve --model minilm=minilm.onnx --model rerank=reranker.onnx --api-key secret
      ortformer serve minilm.onnx --workers 2
      ortformer serve minilm.onnx --grpc-port 50051 --otlp-endpoint http://localhost:4317
      curl -s localhost:8080/embed -H 'Content-Type: application/json' -d '{"inputs": "a text"}'
    """
    from ..serve import ServedModel, ServeOptions, create_app, load_runtime, model_specs, run
    from ..serve.auth import check_key, read_key_file
    from ..serve.limits import Limits
    from ..serve.server import announce
    from ..serve.tracing import traced

    quiet_onnxruntime(ctx)
    if api_key_file is not None:
        if api_key is not None:
            source = "--api-key" if ctx.get_parameter_source("api_key").name == "COMMANDLINE" else API_KEY_ENV
            raise click.UsageError(f"give the key once: --api-key-file or {source}, not both")
        api_key = read_key_file(api_key_file)
    elif api_key is None and os.environ.get(API_KEY_ENV) == "":
        # click reads an empty variable as unset: that would serve without a key, unannounced
        raise InputError(f"{API_KEY_ENV} is set but empty; give a key, or unset it to serve without one")
    elif api_key is not None:
        source = "--api-key" if ctx.get_parameter_source("api_key").name == "COMMANDLINE" else API_KEY_ENV
        check_key(api_key, source)
    transport = Limits(**limits)
    try:
        specs = model_specs(models, named)
    except InputError as exc:  # a malformed or repeated name is a usage mistake (exit 2)
        raise click.UsageError(str(exc)) from exc
    options = ServeOptions(max_batch_tokens=max_batch_tokens, max_wait_ms=max_wait_ms,
                           max_client_batch_size=max_client_batch_size, payload_limit=payload_limit,
                           max_concurrent_requests=max_concurrent_requests, auto_truncate=auto_truncate,
                           api_key=api_key, threads=threads, provider=provider)
    if workers > 1:  # each worker loads the models itself (serve/workers.py)
        from ..serve.workers import run_workers

        if grpc_port == 0:
            raise click.UsageError("--grpc-port 0 with --workers: give a port the workers can share")
        # each worker closes what is left at its own deadline; the parent kills a worker still
        # alive a few seconds after that (a worker stuck in a model call)
        return run_workers(specs, options, workers, host, port, log_level=log_level, ready=announce(list(specs)),
                           otlp_endpoint=otlp_endpoint, grpc_port=grpc_port, limits=transport,
                           graceful_timeout=transport.graceful_shutdown_timeout + 5)
    served = [ServedModel(name, load_runtime(path, options)) for name, path in specs.items()]
    app = create_app(served, options)
    tracing = app.state.serve.tracing = traced(otlp_endpoint)
    ready = announce(list(specs))
    if grpc_port is not None:
        from ..serve.grpc import with_grpc

        app = with_grpc(app, host, grpc_port)
        http_ready = ready

        def ready(host_, port_):  # the HTTP line first: scripts wait for it
            http_ready(host_, port_)
            shown = f"[{host}]" if ":" in host else host
            click.echo(f"ortformer serve: gRPC listening on {shown}:{app.state.grpc_port}", err=True)
    try:
        run(app, host, port, log_level=log_level, ready=ready, limits=transport)
    finally:
        if tracing is not None:
            tracing.shutdown()


COMMANDS = [serve_command]
