"""`ortformer serve` with one process against `--workers 2` (and, with --ray, Ray Serve with 1 and
2 replicas), on the same model, texts, clients and total threads, in one run, loopback only.

    PYTHONPATH=. python benchmarks/serve_scale.py [--model my.onnx] [--clients 1,8,64] [--seconds 10]
                                                  [--threads 2] [--batch 1] [--ray] [--mixed 64]

Setups (T = --threads, the onnxruntime threads all processes share out):
- workers 1: `ortformer serve --threads T`;
- workers 2: `ortformer serve --workers 2 --threads T/2` (at least 1);
- ray xN (--ray): ortformer.serve.ray:build on a local Ray (num_cpus = T), N replicas of
  num_cpus T/N, Serve's proxy on 127.0.0.1.
Each setup is driven by ortformer.bench.load (closed loop: `clients` clients, each with one
request of --batch texts open) for --seconds per client count; rounds interleave the setups
(--repeat) and each ratio to workers 1 is taken within a round, the median over rounds
reported. Prints req/s, p50 and p99 per setup and client count. --mixed N first measures one
process under N clients sending one text each, lengths interleaved: p99 and worst latency per
input-length bucket (the batcher's bound on a request's wait, docs/serve.md, made visible). Without --model, the `small`
preset with random weights and the MiniLM tokenizer (as ray_vs_loop.py) is exported.
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ortformer.bench.load import LoadPlan, load
from ortformer.core.corpus import sentences

REPO = Path(__file__).resolve().parents[1]
PROXY: dict = {}


def start_serve(model: Path, workers: int, threads: int) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen([sys.executable, "-m", "ortformer.cli", "serve", str(model), "--port", "0",
                                "--workers", str(workers), "--threads", str(threads)],
                               stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    match = re.search(r"listening on (http://\S+)", process.stderr.readline())
    if match is None:
        process.kill()
        raise SystemExit(f"the server did not start: {process.stderr.read()}")
    return process, match.group(1)


def stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()


async def _mixed(url: str, texts: list[str], tokens: list[int], clients: int, seconds: float) -> dict:
    """Worst and p99 latency (ms) by input length under a mixed closed loop: `clients` clients
    each send one text at a time, request i the i-th text (lengths interleave), for `seconds`."""
    import asyncio

    import httpx
    import numpy as np

    seen: list[tuple[int, float]] = []
    state = {"next": 0}
    deadline = time.perf_counter() + seconds
    async with httpx.AsyncClient(timeout=120, trust_env=False,
                                 limits=httpx.Limits(max_connections=clients)) as client:
        async def one():
            while time.perf_counter() < deadline:
                i = state["next"] % len(texts)
                state["next"] += 1
                sent = time.perf_counter()
                response = await client.post(f"{url}/embed", json={"inputs": texts[i]})
                if response.status_code == 200:
                    seen.append((tokens[i], (time.perf_counter() - sent) * 1e3))

        await asyncio.gather(*(one() for _ in range(clients)))
    out = {}
    for low, high in ((0, 8), (8, 16), (16, 32), (32, 64), (64, 128), (128, 10 ** 6)):
        ms = [t for n, t in seen if low < n <= high]
        if ms:
            out[f"{low + 1}-{high if high < 10 ** 6 else ''} tokens"] = (len(ms), float(np.percentile(ms, 99)), max(ms))
    return out


def start_ray(model: Path, replicas: int, threads: int) -> str:
    import ray
    from ray import serve

    from ortformer.serve.ray import OrtformerServer, ongoing_requests, parse_args

    if not ray.is_initialized():
        ray.init(num_cpus=threads, include_dashboard=False, log_to_driver=False)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            PROXY["port"] = sock.getsockname()[1]
        # one proxy for the run: Serve keeps the first http_options it is started with
        serve.start(http_options={"host": "127.0.0.1", "port": PROXY["port"]})
    port = PROXY["port"]
    models, options = parse_args({"models": [str(model)]})
    # what build() makes, with the replica count and CPUs a config's deployments entry would set
    app = OrtformerServer.options(num_replicas=replicas, ray_actor_options={"num_cpus": max(1, threads // replicas)},
                                  max_ongoing_requests=ongoing_requests(options)).bind(models, options)
    serve.run(app, name="embed", route_prefix="/")
    return f"http://127.0.0.1:{port}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="an ortformer model that pools and names a tokenizer")
    parser.add_argument("--clients", default="1,8,64")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1, help="texts per request")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--ray", action="store_true", help="also Ray Serve with 1 and 2 replicas")
    parser.add_argument("--mixed", type=int, default=0, metavar="CLIENTS",
                        help="also the worst wait by input length with this many clients of mixed lengths "
                             "(one process only)")
    args = parser.parse_args(argv)
    clients = [int(c) for c in args.clients.split(",")]
    with tempfile.TemporaryDirectory() as folder:
        model = Path(args.model) if args.model else _make_model(Path(folder))
        from ortformer.runtime import Runtime
        from ortformer.config.text import TextEncoder

        runtime = Runtime(model, "cpu", threads=1)
        every = sentences(512)
        ids, _, _ = TextEncoder(runtime.tokenizer_path()).encode(every, max_length=100_000)
        # only texts the model takes whole: an over-long one would be refused, not timed
        kept = [(t, len(i)) for t, i in zip(every, ids) if len(i) <= runtime.text_max_length]
        texts, tokens = [t for t, _ in kept], [n for _, n in kept]
        dimension = runtime.config.sentence_size
        setups = [("workers 1", lambda: start_serve(model, 1, args.threads)),
                  ("workers 2", lambda: start_serve(model, 2, max(1, args.threads // 2)))]
        if args.ray:
            setups += [(f"ray x{n}", lambda n=n: (None, start_ray(model, n, args.threads))) for n in (1, 2)]
        results: dict = {}
        if args.mixed:
            import asyncio

            process, url = start_serve(model, 1, args.threads)
            try:
                waits = asyncio.run(_mixed(url, texts, tokens, args.mixed, args.seconds))
            finally:
                stop(process)
            print(f"worst wait by input length, one process, {args.mixed} clients, {args.seconds:g} s:")
            for bucket, (n, p99, worst) in waits.items():
                print(f"  {bucket:<14} {n:>6} requests  p99 {p99:8.1f} ms  worst {worst:8.1f} ms")
        for round_ in range(args.repeat):
            for name, starter in setups:
                process, url = starter()
                try:
                    for c in clients:
                        plan = LoadPlan(url, dimension, concurrency=c, batch=args.batch, max_requests=10 ** 6,
                                        max_seconds=args.seconds, route="/embed", protocol="tei")
                        results.setdefault((name, c), []).append(load(plan, texts, tokens))
                finally:
                    if process is not None:
                        stop(process)
                    else:
                        from ray import serve

                        serve.delete("embed")
    print(f"texts {len(texts)}, batch {args.batch}, threads {args.threads}, {args.seconds:g} s per point, "
          f"{args.repeat} round(s); load {os.getloadavg()[0]:.1f}")
    print(f"{'setup':<10} {'clients':>7} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'ratio':>6} errors")
    for (name, c), runs in results.items():
        base = results[("workers 1", c)]
        ratio = statistics.median(r["rps"] / b["rps"] for r, b in zip(runs, base) if b["rps"])
        last = runs[-1]
        print(f"{name:<10} {c:>7} {statistics.median(r['rps'] for r in runs):>8.1f} {last['p50_ms'] or 0:>8.1f} "
              f"{last['p99_ms'] or 0:>8.1f} {ratio:>6.2f} {sum(sum(r['errors'].values()) for r in runs)}")
    return 0


def _make_model(folder: Path) -> Path:
    sys.path.insert(0, str(Path(__file__).parent))
    from ray_vs_loop import make_model

    return make_model(folder, "small")


if __name__ == "__main__":
    sys.exit(main())
