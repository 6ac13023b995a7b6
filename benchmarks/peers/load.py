"""A closed-loop HTTP load generator for embedding servers, loopback only.

``concurrency`` clients each send one request, wait for its answer, and send the next, so
the server always has ``concurrency`` requests open. Request i carries the ``batch`` texts
that start at ``(i * batch) mod len(texts)``, whichever client sends it, so two servers
driven with the same plan get the same requests. A run stops when ``max_requests`` have
been sent or ``max_seconds`` have passed, whichever comes first; no request is started
after that, and each one is cut off ``request_timeout_s`` after it started, so a run
lasts at most ``max_seconds + request_timeout_s``.

Every answer is checked (HTTP status, JSON shape, one vector per text, each of
``dimension`` floats); a failure is counted under its kind and its first message kept,
never dropped. Figures count answered-and-valid requests only:
rps = ok / wall, tokens/s = sum(tokens of ok requests) / wall, where wall runs from
the first request to the last answer, and p50/p99 are numpy's linearly interpolated
percentiles of the ok requests' latencies (all of them are returned too, in ms).

With ``probe_route`` (e.g. "/health"), one more client on its own connection GETs it
every PROBE_INTERVAL_S while the load runs: probe_p50_ms / probe_p99_ms over its 200s
(probe_latencies_ms, all of them), probe_errors for the rest. A liveness probe that waits
behind model work shows up here.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import time
from urllib.parse import urlsplit

import numpy as np

from ortformer.core.errors import InputError

PROTOCOLS = ("openai", "tei")
MAX_SECONDS = 3600.0
PROBE_INTERVAL_S = 0.05  # between a probe's answer and the next probe: it adds no real load


class LoadTargetError(InputError):
    """A load test was pointed somewhere it may not go: an address that is not this machine's
    loopback (127.0.0.0/8, ::1, localhost), or bounds that would never stop it."""


@dataclasses.dataclass(frozen=True)
class LoadPlan:
    """One load run. ``protocol``: "openai" posts {"input": [...], "model": model} and reads
    {"data": [{"embedding": [...]}, ...]}; "tei" posts {"inputs": [...]} and reads [[...], ...]."""

    url: str                         # base address, e.g. http://127.0.0.1:8080
    dimension: int                   # floats per returned vector
    concurrency: int = 1             # clients, each with one request open at a time
    batch: int = 8                   # texts per request
    max_requests: int = 1000         # stop after sending this many ...
    max_seconds: float = 30.0        # ... or after this long, whichever comes first
    route: str = "/v1/embeddings"
    protocol: str = "openai"
    model: str = ""
    request_timeout_s: float = 60.0  # one request's limit, connection to last byte
    probe_route: str | None = None   # GET this (e.g. /health) alongside the load, timing it

    def replace(self, **changes) -> "LoadPlan":
        return dataclasses.replace(self, **changes)


def check_loopback(url: str) -> str:
    """``url`` when it is http to 127.0.0.0/8, ::1 or localhost; LoadTargetError otherwise."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.scheme != "http":
        raise LoadTargetError(f"load target {url!r}: only http:// on loopback is allowed (127.0.0.0/8, ::1, localhost)")
    if host != "localhost":
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise LoadTargetError(f"load target {url!r}: {host or 'no host'} is not this machine's loopback; "
                                  "only 127.0.0.0/8, ::1 and localhost may be load-tested")
    return url


def check_plan(plan: LoadPlan, texts: list[str], tokens: list[int]) -> None:
    """Refuse a plan that could not run or would never stop (LoadTargetError naming the field)."""
    check_loopback(plan.url)
    for name in ("concurrency", "batch", "max_requests", "dimension"):
        if getattr(plan, name) < 1:
            raise LoadTargetError(f"load plan: {name} must be at least 1, got {getattr(plan, name)}")
    for name in ("max_seconds", "request_timeout_s"):
        value = getattr(plan, name)
        if not 0 < value <= MAX_SECONDS:
            raise LoadTargetError(f"load plan: {name} must be in (0, {MAX_SECONDS:.0f}] seconds, got {value}")
    if plan.protocol not in PROTOCOLS:
        raise LoadTargetError(f"load plan: protocol {plan.protocol!r}; choose from {', '.join(PROTOCOLS)}")
    if not texts or len(tokens) != len(texts):
        raise LoadTargetError(f"load plan: {len(texts)} texts with {len(tokens)} token counts; "
                              "need at least one text and one count per text")


def request_texts(i: int, texts: list[str], batch: int) -> list[int]:
    """Indices of request i's texts: ``batch`` of them from (i * batch) mod n, wrapping."""
    n = len(texts)
    return [(i * batch + j) % n for j in range(batch)]


def body_for(plan: LoadPlan, batch_texts: list[str]) -> dict:
    if plan.protocol == "openai":
        return {"input": batch_texts, "model": plan.model}
    return {"inputs": batch_texts}


def answer_problem(plan: LoadPlan, body, count: int) -> tuple[str, str] | None:
    """(kind, message) of what is wrong with a decoded answer to ``count`` texts, or None."""
    if plan.protocol == "openai":
        data = body.get("data") if isinstance(body, dict) else None
        vectors = [item.get("embedding") if isinstance(item, dict) else None for item in data] if isinstance(data, list) else None
    else:
        vectors = body if isinstance(body, list) else None
    if vectors is None:
        return "bad body", f"not an embeddings answer: {str(body)[:200]}"
    if len(vectors) != count:
        return "wrong count", f"{len(vectors)} vectors for {count} texts"
    for v in vectors:
        if not isinstance(v, list) or len(v) != plan.dimension:
            got = len(v) if isinstance(v, list) else type(v).__name__
            return "wrong dimension", f"a vector of {got}, expected {plan.dimension} floats"
    return None


def summarize(latencies_s: list[float], ok_tokens: int, wall_s: float, sent: int, errors: dict[str, int],
              first_errors: dict[str, str], plan: LoadPlan, stopped_by: str,
              probes_s: list[float] | None = None, probe_errors: int = 0) -> dict:
    """The run's figures (see the module docstring for the formulas)."""
    ok = len(latencies_s)
    lat = np.asarray(latencies_s, dtype=np.float64) * 1e3
    pct = (lambda q: float(np.percentile(lat, q))) if ok else (lambda q: None)
    probe = {}
    if probes_s is not None:
        probe_ms = np.asarray(probes_s, dtype=np.float64) * 1e3
        at = (lambda q: float(np.percentile(probe_ms, q))) if probe_ms.size else (lambda q: None)
        probe = {"probe_route": plan.probe_route, "probe_ok": int(probe_ms.size), "probe_errors": probe_errors,
                 "probe_p50_ms": at(50), "probe_p99_ms": at(99), "probe_latencies_ms": probe_ms.tolist()}
    return {**probe, "concurrency": plan.concurrency, "batch": plan.batch, "sent": sent, "ok": ok,
            "errors": dict(errors), "first_errors": dict(first_errors), "stopped_by": stopped_by,
            "wall_s": wall_s, "rps": ok / wall_s if wall_s > 0 else 0.0,
            "texts_per_s": ok * plan.batch / wall_s if wall_s > 0 else 0.0,
            "tokens_per_s": ok_tokens / wall_s if wall_s > 0 else 0.0,
            "p50_ms": pct(50), "p99_ms": pct(99), "mean_ms": float(lat.mean()) if ok else None,
            "latencies_ms": lat.tolist()}  # in completion order, for pooling runs


async def run_load(plan: LoadPlan, texts: list[str], tokens: list[int]) -> dict:
    """Drive the server at ``plan.url`` as the plan says; the figures of summarize()."""
    import httpx

    check_plan(plan, texts, tokens)
    url = plan.url.rstrip("/") + plan.route
    latencies: list[float] = []
    errors: dict[str, int] = {}
    first_errors: dict[str, str] = {}
    state = {"next": 0, "ok_tokens": 0, "stopped_by": "count"}

    def failed(kind: str, message: str) -> None:
        errors[kind] = errors.get(kind, 0) + 1
        first_errors.setdefault(kind, message[:300])

    limits = httpx.Limits(max_connections=plan.concurrency, max_keepalive_connections=plan.concurrency)
    # trust_env=False: no proxy from the environment may route loopback traffic elsewhere
    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(
            httpx.AsyncClient(limits=limits, timeout=plan.request_timeout_s, trust_env=False))
        # the probe's own client (its own connection), made before the clock starts: making
        # one takes long enough on a loaded machine to eat a short run
        probe_client = await stack.enter_async_context(
            httpx.AsyncClient(timeout=plan.request_timeout_s, trust_env=False)) if plan.probe_route else None
        start = time.perf_counter()
        deadline = start + plan.max_seconds

        async def one_client() -> None:
            while True:
                if state["next"] >= plan.max_requests:
                    return
                if time.perf_counter() >= deadline:
                    state["stopped_by"] = "time"
                    return
                i = state["next"]
                state["next"] += 1
                picked = request_texts(i, texts, plan.batch)
                sent_at = time.perf_counter()
                try:
                    response = await asyncio.wait_for(
                        client.post(url, json=body_for(plan, [texts[k] for k in picked])), plan.request_timeout_s)
                except (asyncio.TimeoutError, httpx.TimeoutException):
                    failed("timeout", f"no answer in {plan.request_timeout_s:g} s")
                    continue
                except httpx.HTTPError as error:
                    failed(f"transport: {type(error).__name__}", str(error) or type(error).__name__)
                    continue
                took = time.perf_counter() - sent_at
                if response.status_code != 200:
                    failed(f"http {response.status_code}", response.text)
                    continue
                try:
                    problem = answer_problem(plan, response.json(), len(picked))
                except ValueError as error:
                    problem = ("bad body", f"not JSON: {error}")
                if problem:
                    failed(*problem)
                    continue
                latencies.append(took)
                state["ok_tokens"] += sum(tokens[k] for k in picked)

        done = asyncio.Event()
        probes: list[float] = []
        prober = asyncio.ensure_future(_probe(plan, probe_client, done, probes, state)) if probe_client else None
        await asyncio.gather(*(one_client() for _ in range(plan.concurrency)))
        wall = time.perf_counter() - start
        done.set()
        if prober is not None:
            await prober
    return summarize(latencies, state["ok_tokens"], wall, state["next"], errors, first_errors, plan, state["stopped_by"],
                     probes if prober is not None else None, state.get("probe_errors", 0))


async def _probe(plan: LoadPlan, client, done: asyncio.Event, probes: list[float], state: dict) -> None:
    """GETs plan.probe_route with `client` until `done`, one at a time, each bounded by
    request_timeout_s; appends each 200's latency (s) and counts the rest."""
    import httpx

    url = plan.url.rstrip("/") + plan.probe_route
    while not done.is_set():
        sent_at = time.perf_counter()
        try:
            response = await asyncio.wait_for(client.get(url), plan.request_timeout_s)
            ok = response.status_code == 200
        except (asyncio.TimeoutError, httpx.HTTPError):
            ok = False
        if ok:
            probes.append(time.perf_counter() - sent_at)
        else:
            state["probe_errors"] = state.get("probe_errors", 0) + 1
        try:
            await asyncio.wait_for(done.wait(), PROBE_INTERVAL_S)
        except asyncio.TimeoutError:
            pass


def load(plan: LoadPlan, texts: list[str], tokens: list[int]) -> dict:
    """run_load in a fresh event loop (for callers that are not async)."""
    return asyncio.run(run_load(plan, texts, tokens))


__all__ = ["LoadPlan", "load", "run_load", "check_loopback", "check_plan", "request_texts", "summarize", "PROTOCOLS"]
