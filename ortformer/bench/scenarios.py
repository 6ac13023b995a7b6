"""The benchmark scenarios of `ortformer bench`. Each returns
{"rows": [...], "targets": [{"name", "target", "measured", "met"}], "notes": [...]}.

Eager PyTorch and onnxruntime run in this process, alternating, with the same
thread count; long sequences run one point per subprocess for an honest peak RSS.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..config import preset
from ..contract.cost import total_flops
from ..exporter import export
from ..models import build_encoder
from ..contract.parity import Case, make_inputs
from ..runtime import Runtime
from ..runtime.profile import profile_ops
from .measure import run_isolated, target
from .peers import bert_peers, matmul_seconds
from .point import SESSIONS


def _token_feeds(cfg, batch: int, n: int) -> dict[str, np.ndarray]:
    """Unpadded random inputs, as the parity grid makes them."""
    return make_inputs(cfg, Case(batch, n, "none"), np.random.default_rng(0))


def _exported(workdir: Path, model, name: str, **options) -> Path:
    """Export once per bench run; scenarios that bench the same artifact share it."""
    path = workdir / f"{name}.onnx"
    if not path.exists():
        export(model, path, parity=False, **options)
    return path


def _eager(model, feeds):
    args = [torch.from_numpy(feeds[k]) for k in ("input_ids", "attention_mask", "token_type_ids") if k in feeds]

    def run():
        with torch.inference_mode():
            model(*args)
    return run


def _ort(runtime: Runtime, feeds):
    return lambda: runtime.run(**feeds)


def _where_time_goes(path: Path, batch: int, n: int, threads: int, top: int = 6) -> dict:
    """onnxruntime's profiler on the same shape: the heaviest op types, ms per run and share."""
    report = profile_ops(path, batch, n, runs=5, threads=threads)
    return {"median_run_ms": report["median_run_ms"],
            "ops": [{k: op[k] for k in ("op", "nodes", "ms_per_run", "share")} for op in report["ops"][:top]]}


def latency(workdir: Path, threads: int, quick: bool, iterations: int) -> dict:
    """bert-base shape, batch 1, sequence 128: eager vs fused float32, unfused float32, int8;
    per-op profiles of float32 and int8; session settings compared in separate processes."""
    cfg, n = (preset("tiny"), 16) if quick else (preset("bert-base"), 128)
    model = build_encoder(cfg, seed=0)
    variants = {"ort_float32": {}, "ort_float32_unfused": {"fused_ops": False}, "ort_int8": {"quantize": "int8"}}
    runtimes = {name: Runtime(_exported(workdir, model, f"{cfg.name}_{name}", **options), "cpu", threads=threads)
                for name, options in variants.items()}
    feeds = _token_feeds(cfg, 1, n)
    # one interleaved run with the peers: every figure of the report was measured beside the others
    peers = bert_peers(workdir, cfg, 1, n, threads, iterations,
                       also={"eager": _eager(model, feeds), **{k: _ort(r, feeds) for k, r in runtimes.items()}})
    stats = peers["same_run"]
    eager = stats["eager"]["median_s"]
    rows = [{"contender": k, "median_ms": v["median_s"] * 1e3, "speedup_vs_eager": eager / v["median_s"]}
            for k, v in stats.items()]
    speed = {r["contender"]: r["speedup_vs_eager"] for r in rows}
    profiles = {name: _where_time_goes(runtimes[name].path, 1, n, threads) for name in ("ort_float32", "ort_int8")}
    # Runtime's session settings against onnxruntime's own defaults, each alone in a fresh
    # process: a spinning session in this process would slow every other contender
    sessions = {name: run_isolated("ortformer.bench.point", [str(runtimes["ort_float32"].path), str(n), str(threads),
                                                              str(iterations), name], timeout=600)
                for name in SESSIONS}
    return {"model": cfg.name, "batch": 1, "sequence": n, "rows": rows, "profiles": profiles,
            # each {"status", "seconds", "peak_rss_mb"} as the isolated run reported it (a failure keeps its reason)
            "float32_session_settings": sessions, "peers": peers,
            # against what a user would pick instead and against the hardware, not against our own eager
            "targets": _peer_targets(peers, cfg.name) + [
        target(f"int8 vs ortformer float32, {cfg.name}, batch 1, seq {n}", ">= 1.6x", speed["ort_int8"] / speed["ort_float32"],
                speed["ort_int8"] / speed["ort_float32"] >= 1.6, "x"),
    ]}


def _peer_targets(peers: dict, name: str) -> list[dict]:
    row = {r["contender"]: r for r in peers["rows"]}["ortformer_float32"]
    where = f"{name}, batch {peers['batch']}, seq {peers['sequence']}"
    return [target(f"float32 vs best peer ({peers['best_peer']}), {where}", ">= 1.0x", row["vs_best_peer"],
                    row["vs_best_peer"] >= 1.0, "x"),
            target(f"float32 share of onnxruntime MatMul ceiling, {where}", ">= 80%", 100 * row["share_of_ceiling"],
                    row["share_of_ceiling"] >= 0.8, "%")]


def matmul_ceiling(threads: int, m: int, k: int, n: int, iterations: int) -> float:
    """GFLOP/s of onnxruntime's own MatMul on an (m, k) x (k, n) product with constant weights."""
    return 2 * m * k * n / matmul_seconds({"batch": 1, "m": m, "k": k, "n": n}, threads, iterations) / 1e9


def throughput(workdir: Path, threads: int, quick: bool, iterations: int) -> dict:
    """bert-base shape, batch 8, sequence 128: achieved GFLOP/s against the MatMul ceiling."""
    cfg, batch, n = (preset("tiny"), 2, 16) if quick else (preset("bert-base"), 8, 128)
    model = build_encoder(cfg, seed=0)
    runtime = Runtime(_exported(workdir, model, f"{cfg.name}_ort_float32"), "cpu", threads=threads)
    feeds = _token_feeds(cfg, batch, n)
    peers = bert_peers(workdir, cfg, batch, n, threads, iterations,
                       also={"eager": _eager(model, feeds), "ort_float32": _ort(runtime, feeds)})
    stats = peers["same_run"]
    flops = total_flops(cfg, n) * batch
    ceiling = matmul_ceiling(threads, batch * n, cfg.hidden_size, cfg.ffn_size, iterations)
    rows = [{"contender": k, "median_ms": v["median_s"] * 1e3, "gflops": flops / v["median_s"] / 1e9,
             "fraction_of_matmul_ceiling": flops / v["median_s"] / 1e9 / ceiling} for k, v in stats.items()]
    ort_fraction = rows[1]["fraction_of_matmul_ceiling"]
    return {"model": cfg.name, "batch": batch, "sequence": n, "matmul_ceiling_gflops": ceiling, "rows": rows,
            # the ceiling target is the peers' one, at every GEMM shape of the model (not the FFN's alone)
            "single_shape_fraction_of_ceiling": ort_fraction, "peers": peers, "targets": _peer_targets(peers, cfg.name)}


POINT_BUDGET_S = 30


def long_sequences(workdir: Path, threads: int, quick: bool, iterations: int) -> dict:
    """4 layers, hidden 256, 4 heads, batch 1: latency and peak RSS against N, per kind."""
    lengths = [64, 256] if quick else [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
    # linear runs chunk by chunk beyond 8,192 tokens (runtime/chunked.py), on to a million
    linear_lengths = lengths if quick else lengths + [262144, 524288, 1048576]
    kinds = ["linear", "softmax"] if quick else ["linear", "efficient", "cosine", "softmax"]
    cfg = preset("small").replace(num_layers=4, hidden_size=256, num_heads=4, ffn_size=1024, vocab_size=1000,
                                  positions="none", max_positions=max(linear_lengths), pooling="none", name="long")
    rows = []
    for kind in kinds:
        path = workdir / f"long_{kind}.onnx"
        export(cfg.replace(attention=kind), path, parity=False, force=True)
        ns = linear_lengths if kind == "linear" else lengths
        for n in ns:
            point = run_isolated("ortformer.bench.point", [str(path), str(n), str(threads)],
                                 timeout=60 if quick else max(300, n // 500))
            rows.append({"attention": kind, "sequence": n, **point})
            if point["status"] != "ok":
                break  # longer sequences will not fit either
            if point["seconds"] > POINT_BUDGET_S and n != ns[-1] and kind != "linear":
                # doubling N at least doubles the time (4x for softmax): past the budget, stop
                rows.append({"attention": kind, "sequence": 2 * n,
                             "status": f"not run: {n} took {point['seconds']:.0f} s (> {POINT_BUDGET_S} s budget per point)"})
                break
    # the same linear points with the CPU arena kept between calls: what Runtime's
    # bounded-memory default (fresh pages from the OS on every call) costs at length
    arena_rows = [{"attention": "linear", "sequence": n, "session": "arena",
                   **run_isolated("ortformer.bench.point", [str(workdir / "long_linear.onnx"), str(n), str(threads), "3", "arena"],
                                  timeout=60 if quick else 300)}
                  for n in ((lengths[0], lengths[-1]) if quick else (1024, 16384))]
    ok = {(r["attention"], r["sequence"]): r for r in rows if r["status"] == "ok"}
    targets, crossover = [], None
    soft = {n: r["seconds"] for (k, n), r in ok.items() if k == "softmax"}
    lin = {n: r["seconds"] for (k, n), r in ok.items() if k == "linear"}
    for n in sorted(lin):
        if n not in soft or lin[n] < soft[n]:
            crossover = n
            break
    if not quick:
        r16, r1, r131 = ok.get(("linear", 16384)), ok.get(("linear", 1024)), ok.get(("linear", 131072))
        r1m = ok.get(("linear", 1048576))
        targets = [
            target("linear, seq 16,384: peak RSS", "<= 1024 MB", r16["peak_rss_mb"] if r16 else float("nan"),
                    bool(r16) and r16["peak_rss_mb"] <= 1024, "MB"),
            target("linear, time(16,384) / time(1,024)", "<= 20", r16["seconds"] / r1["seconds"] if r16 and r1 else float("nan"),
                    bool(r16 and r1) and r16["seconds"] / r1["seconds"] <= 20, "x"),
            target("linear, seq 131,072 completes: peak RSS", "< 8192 MB", r131["peak_rss_mb"] if r131 else float("nan"),
                    bool(r131) and r131["peak_rss_mb"] < 8192, "MB"),
            target("linear (chunked), seq 1,048,576: peak RSS", "< 2048 MB", r1m["peak_rss_mb"] if r1m else float("nan"),
                    bool(r1m) and r1m["peak_rss_mb"] < 2048, "MB"),
            target("linear (chunked), time(1,048,576) / time(131,072)", "<= 9",
                    r1m["seconds"] / r131["seconds"] if r1m and r131 else float("nan"),
                    bool(r1m and r131) and r1m["seconds"] / r131["seconds"] <= 9, "x"),
        ]
    return {"model": "4 layers x 256, 4 heads, batch 1", "rows": rows, "linear_faster_from_sequence": crossover,
            "arena_rows": arena_rows, "targets": targets}


SCENARIOS = {"latency": latency, "throughput": throughput, "long": long_sequences}
