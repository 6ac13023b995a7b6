"""The server's settings (the flags of `ortformer serve`) and the models it loads."""
from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

from ..core.checks import check_int
from ..core.errors import InputError, ModelFileError, ProviderError
from ..runtime import Runtime
from ..runtime.session import CPU_TOKENS_PER_THREAD
from ..core.cpus import available_cpus
from .auth import check_key

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")
# without a per-thread cache budget to follow (CUDA), TEI's default padded-token budget
DEVICE_BATCH_TOKENS = 16384


@dataclass
class ServeOptions:
    """Defaults follow text-embeddings-inference where it has the setting."""
    # padded tokens (batch x its longest) per model call; None: CPU_TOKENS_PER_THREAD per
    # thread on the CPU (the cache-sized batches Runtime.embed uses), 16384 on CUDA
    max_batch_tokens: int | None = None
    # how long a worker waits for more requests to join a round that is not full
    max_wait_ms: float = 2.0
    # most inputs in one request (TEI: 32; more is a 422)
    max_client_batch_size: int = 32
    # most bytes in one request body (TEI: 2,000,000; more is a 413)
    payload_limit: int = 2_000_000
    # most requests queued or running per model (TEI: 512; more is a 429)
    max_concurrent_requests: int = 512
    # truncate over-long inputs when the request does not say (TEI's --auto-truncate)
    auto_truncate: bool = False
    # required as "Authorization: Bearer KEY" on every route but /health and /metrics
    api_key: str | None = None
    # onnxruntime intra-op threads per model; None: the CPUs this process may use (ortformer/core/cpus.py)
    threads: int | None = None
    provider: str = "cpu"

    def __post_init__(self):
        if self.max_batch_tokens is not None:
            check_int("max_batch_tokens", self.max_batch_tokens)
        check_int("max_client_batch_size", self.max_client_batch_size)
        check_int("payload_limit", self.payload_limit)
        check_int("max_concurrent_requests", self.max_concurrent_requests)
        if self.threads is not None:
            check_int("threads", self.threads)
        if not (isinstance(self.max_wait_ms, (int, float)) and 0 <= self.max_wait_ms <= 10_000):
            raise InputError(f"max_wait_ms={self.max_wait_ms!r} must be a number of milliseconds in [0, 10000]")
        if self.api_key is not None:
            check_key(self.api_key)

    def resolved_threads(self) -> int:
        return self.threads or available_cpus()

    def batch_tokens(self, runtime: Runtime) -> int:
        if self.max_batch_tokens is not None:
            return self.max_batch_tokens
        return DEVICE_BATCH_TOKENS if runtime.provider == "cuda" else CPU_TOKENS_PER_THREAD * runtime.threads


def model_specs(paths: tuple[str, ...], named: tuple[str, ...]) -> dict[str, Path]:
    """name -> path: MODEL arguments are named by their file's stem, --model NAME=PATH by NAME.
    InputError for a malformed or repeated name, or no model at all."""
    specs: dict[str, Path] = {}

    def add(name: str, path: str) -> None:
        if not NAME.match(name):
            raise InputError(f"model name {name!r} is not valid: use letters, digits and . _ : / - "
                             "(at most 128 characters, starting with a letter or digit)")
        if name in specs:
            raise InputError(f"two models are named {name!r}; name them apart with --model NAME=PATH")
        specs[name] = Path(path)

    for path in paths:
        add(Path(path).stem, path)
    for spec in named:
        name, sep, path = spec.partition("=")
        if not sep or not path:
            raise InputError(f"--model {spec!r} must be NAME=PATH, e.g. --model minilm=minilm.onnx")
        add(name, path)
    if not specs:
        raise InputError("no model to serve: give MODEL paths or --model NAME=PATH")
    return specs


def load_runtime(path: str | os.PathLike, options: ServeOptions) -> Runtime:
    """The model's Runtime with the server's threads; a tokenizer problem becomes an error
    (a server of text routes that cannot read text would fail every request), as does
    --provider cuda where CUDA cannot run (ProviderError naming serve's own options)."""
    from ..runtime.session import ProviderFallbackWarning, TextUnavailableWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("ignore", TextUnavailableWarning)
        warnings.simplefilter("always", ProviderFallbackWarning)
        runtime = Runtime(path, options.provider, threads=options.resolved_threads(),
                          allow_fallback=options.provider == "cuda")
    fallback = next((w for w in caught if issubclass(w.category, ProviderFallbackWarning)), None)
    if fallback is not None:
        reason = str(fallback.message).removesuffix("; running on CPU")
        raise ProviderError(f"--provider cuda: {reason}; serve on the CPU with --provider cpu, or with --provider "
                            "auto (the GPU when CUDA is usable, else the CPU)")
    for other in caught:
        if not issubclass(other.category, (ProviderFallbackWarning, TextUnavailableWarning)):
            warnings.warn_explicit(other.message, other.category, other.filename, other.lineno)
    if runtime.text_problem is not None:
        raise ModelFileError(f"{path}: text input is unavailable: {runtime.text_problem}")
    return runtime
