"""Ray Serve: ``ortformer.serve.ray:build``, the application builder a Serve config names.

    applications:
      - name: embed
        import_path: ortformer.serve.ray:build
        args: {models: ["minilm.onnx"], max_batch_tokens: 4096}

Each replica is the app ``ortformer serve`` runs (the same routes, limits, auth and metrics,
through ``serve.ingress``), built inside the replica once it has its CPUs: its onnxruntime
threads are the CPUs Ray assigned it (``ray_actor_options: {num_cpus: N}``), and it keeps
its own token-budget batcher. ``args``:

- ``models``: a list of model files (named by their stem) or a mapping name -> model; a
  model is a path every node can read, or ``hf://org/name/path/in/repo.onnx[@revision]``,
  fetched into the Hugging Face hub cache (that file and the others of its folder, so the
  tokenizer its metadata names comes with it);
- any ServeOptions field (``max_batch_tokens``, ``api_key``, ``max_concurrent_requests``...),
  checked as the CLI checks its flags;
- ``otlp_endpoint``: each replica exports OpenTelemetry spans there (tracing.py).

``max_ongoing_requests`` (Ray's per-replica admission, default 5) would starve the batcher:
a round wants many requests to sort and batch. It defaults to ``ongoing_requests`` below;
a ``deployments:`` entry in the config overrides it as it overrides every option.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
from pathlib import Path

from ..core.errors import HubError, InputError, require
from ..runtime.session import CPU_TOKENS_PER_THREAD
from .batcher import ROUND_BATCHES
from ..core.cpus import available_cpus
from .options import NAME, ServeOptions, load_runtime

serve = require("ortformer.serve.ray", "ray-serve", "ray.serve")

DEPLOYMENT = "OrtformerServer"
# the tokens of a short request (one sentence): what max_ongoing_requests is counted in
SHORT_REQUEST_TOKENS = 16
HUB = re.compile(r"^hf://(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)/(?P<file>[^@]+\.onnx)(?:@(?P<revision>[\w./-]+))?$")
OPTIONS = {f.name for f in dataclasses.fields(ServeOptions)}


def ongoing_requests(options: ServeOptions) -> int:
    """Requests one replica takes at once: two rounds' worth of short requests,
    2 x ROUND_BATCHES x max_batch_tokens / SHORT_REQUEST_TOKENS (the budget of one thread's
    batches when --max-batch-tokens is unset: the smallest a replica has), at most
    max_concurrent_requests (past which the batcher answers 429) and at least ROUND_BATCHES."""
    budget = options.max_batch_tokens or CPU_TOKENS_PER_THREAD
    wanted = 2 * ROUND_BATCHES * budget // SHORT_REQUEST_TOKENS
    return max(ROUND_BATCHES, min(options.max_concurrent_requests, wanted))


def parse_args(args) -> tuple[dict[str, str], ServeOptions]:
    """(name -> model, options) from the config's ``args`` (otlp_endpoint aside: ``build``
    reads it); InputError naming what is wrong."""
    if not isinstance(args, dict):
        raise InputError(f"ortformer.serve.ray:build takes a mapping of arguments, not {type(args).__name__}")
    unknown = sorted(set(args) - OPTIONS - {"models", "otlp_endpoint"})
    if unknown:
        raise InputError(f"unknown argument(s) {', '.join(unknown)} for ortformer.serve.ray:build; valid: models, "
                         "otlp_endpoint, " + ", ".join(sorted(OPTIONS)))
    if not isinstance(args.get("otlp_endpoint", ""), str):
        raise InputError(f"otlp_endpoint must be a URL string, e.g. http://collector:4317; got {args['otlp_endpoint']!r}")
    models = args.get("models")
    if isinstance(models, str):
        models = [models]
    if isinstance(models, list) and models and all(isinstance(m, str) and m for m in models):
        named = {_stem(m): m for m in models}
        if len(named) != len(models):
            raise InputError("two models have the same file name; name them apart: models: {NAME: PATH, ...}")
    elif isinstance(models, dict) and models and all(isinstance(v, str) and v for v in models.values()):
        named = dict(models)
    else:
        raise InputError("`models` must be a model path (or hf://org/name/file.onnx), a list of them, or a mapping "
                         f"NAME: PATH; got {models!r}")
    for name in named:
        if not isinstance(name, str) or not NAME.match(name):
            raise InputError(f"model name {name!r} is not valid: use letters, digits and . _ : / - (at most 128 "
                             "characters, starting with a letter or digit)")
    try:
        options = ServeOptions(**{k: v for k, v in args.items() if k not in ("models", "otlp_endpoint")})
    except TypeError as exc:
        raise InputError(f"ortformer.serve.ray:build: {exc}") from None
    return named, options


def _stem(model: str) -> str:
    match = HUB.match(model)
    return Path(match["file"] if match else model).stem


def resolve(model: str) -> Path:
    """A local model file as given, or an hf:// model fetched (or, offline, read) through the
    hub cache with its folder's other files; HubError when it cannot be."""
    match = HUB.match(model)
    if match is None:
        if model.startswith("hf://"):
            raise InputError(f"{model!r} is not a hub model; write hf://org/name/path/model.onnx[@revision]")
        return Path(model)
    snapshot_download = require("a hub model (hf://)", "ray-serve", "huggingface_hub").snapshot_download
    folder = str(Path(match["file"]).parent)
    patterns = ["*"] if folder == "." else [f"{folder}/*"]
    try:
        root = snapshot_download(match["repo"], revision=match["revision"], allow_patterns=patterns)
    except Exception as exc:  # huggingface_hub's errors (offline, gated, missing) share no narrower base
        raise HubError(f"cannot fetch {model}: {type(exc).__name__}: {exc}") from None
    path = Path(root) / match["file"]
    if not path.is_file():
        raise HubError(f"{match['repo']} has no file {match['file']!r} at revision {match['revision'] or 'main'}")
    return path


def replica_threads() -> int:
    """The CPUs Ray assigned this replica (whole ones, at least 1), at most those the process
    may use (cpus.py); outside a Ray worker, the latter."""
    import ray

    cpus = available_cpus()
    if not ray.is_initialized():
        return cpus
    assigned = ray.get_runtime_context().get_assigned_resources().get("CPU")
    return cpus if not assigned else max(1, min(cpus, math.floor(assigned)))


@serve.deployment(name=DEPLOYMENT)
@serve.ingress()
class OrtformerServer:
    """One replica: its models' Runtimes with the replica's threads, and the HTTP app over them
    (built by Serve after __init__, which runs the app's lifespan: the batchers start)."""

    def __init__(self, models: dict[str, str], options: ServeOptions, otlp_endpoint: str | None = None):
        from .model import ServedModel

        self.otlp_endpoint = otlp_endpoint
        self.options = options if options.threads else dataclasses.replace(options, threads=replica_threads())
        self.models = [ServedModel(name, load_runtime(resolve(model), self.options)) for name, model in models.items()]

    def __serve_build_asgi_app__(self):
        from .routes import create_app
        from .tracing import traced
        from .workers import with_pid_header

        app = create_app(self.models, self.options)
        app.state.serve.tracing = traced(self.otlp_endpoint)
        return with_pid_header(app)


def build(args: dict):
    """The Serve application for ``args`` (see the module's docstring); ``serve run`` and
    ``serve.run(build({...}))`` call it. A local model path is checked to be a file here,
    where the application is built: a typo fails the deploy, not every replica in turn."""
    models, options = parse_args(args)
    for name, model in models.items():
        if not model.startswith("hf://") and not os.path.isfile(model):
            raise InputError(f"model {name!r}: {model} is not a file (a path every Ray node can read, or "
                             "hf://org/name/file.onnx)")
    return OrtformerServer.options(max_ongoing_requests=ongoing_requests(options)).bind(
        models, options, args.get("otlp_endpoint") or None)
