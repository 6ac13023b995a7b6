"""Per-operator profile of one model, from onnxruntime's own profiler (torch-free).

onnxruntime times every kernel it runs when a session is created with
`enable_profiling`; `end_profiling()` writes the events as Chrome-trace JSON. This
module runs synthetic inputs of a chosen shape, reads that trace and folds it into
time per op type (MatMul, MultiHeadAttention, ...) and the slowest nodes: where a
model's time goes *after* onnxruntime's fusions, which the ONNX file does not show.
The trace lives in a temporary folder that is always removed.
On CUDA, kernel times are launch/sync times as onnxruntime records them; the median
wall time per run is the number to trust there.
"""
from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ..contract import cost, parity
from ..core.checks import check_int
from ..core.errors import OrtformerError
from . import providers
from ..modelfile import read_model_file
from .optimize import optimized_for_cpu
from .session import Runtime

KERNEL_SUFFIX = "_kernel_time"
TOP_NODES = 10
DEFAULT_SEQUENCE = 128


def synthetic_feeds(runtime: Runtime, batch: int, sequence: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random (batch, sequence) inputs for `runtime`, unpadded: the parity grid's
    ``make_inputs`` with padding "none" (ids in [0, vocab_size) or standard-normal features)."""
    return parity.make_inputs(runtime.config, parity.Case(batch, sequence, "none"), np.random.default_rng(seed))


def summarize(events: list[dict], last_runs: int | None = None) -> tuple[int, list[dict], list[dict]]:
    """(profiled runs, per-op-type rows, per-node rows) from onnxruntime's trace events.

    Every run the session made is in the trace, warm-up included; with last_runs only
    node events inside the last ``last_runs`` `model_run` spans count (warm-up runs
    allocate and are slower). Times are milliseconds per counted run.
    """
    spans = sorted((e.get("ts", 0), e.get("ts", 0) + e.get("dur", 0)) for e in events
                   if e.get("cat") == "Session" and e.get("name") == "model_run")
    if not spans:
        raise OrtformerError("onnxruntime's profile holds no model_run events; this onnxruntime writes a trace format we cannot read")
    if last_runs is not None:
        spans = spans[-last_runs:]
    runs, first = len(spans), spans[0][0]
    starts = np.array([start for start, _ in spans])
    ends = np.array([end for _, end in spans])
    op_us, op_nodes, node_us, node_op = defaultdict(float), defaultdict(set), defaultdict(float), {}
    for e in events:
        name = e.get("name", "")
        if e.get("cat") != "Node" or not name.endswith(KERNEL_SUFFIX):
            continue
        ts = e.get("ts", 0)
        if ts < first:
            continue
        span = int(np.searchsorted(starts, ts, side="right")) - 1  # the model_run that began last before it
        if ts > ends[span]:
            continue  # between runs: belongs to none we count
        node, op = name[: -len(KERNEL_SUFFIX)], e.get("args", {}).get("op_name", "?")
        op_us[op] += e.get("dur", 0)
        op_nodes[op].add(node)
        node_us[node] += e.get("dur", 0)
        node_op[node] = op
    total = sum(op_us.values())
    ops = [{"op": op, "nodes": len(op_nodes[op]), "ms_per_run": us / runs / 1e3, "share": us / total if total else 0.0}
           for op, us in sorted(op_us.items(), key=lambda item: -item[1])]
    nodes = [{"node": node, "op": node_op[node], "ms_per_run": us / runs / 1e3}
             for node, us in sorted(node_us.items(), key=lambda item: -item[1])]
    return runs, ops, nodes


def profile_ops(path: str | os.PathLike, batch: int = 1, sequence: int | None = None, runs: int = 10, warmup: int = 2,
                threads: int | None = None, provider: str = "cpu") -> dict:
    """Run the model at (batch, sequence) `warmup` + `runs` times under onnxruntime's
    profiler; return a JSON-able report: median wall ms per timed run, kernel ms per
    run, time per op type (with its share of kernel time) and the TOP_NODES slowest nodes.
    The model is opened through Runtime, so every file check applies."""
    check_int("batch", batch)
    check_int("runs", runs)
    check_int("warmup", warmup, low=0)
    with tempfile.TemporaryDirectory(prefix="ortformer-profile-") as folder:
        options = providers.session_options(threads)
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(folder) / "ort")
        if provider == "cpu" and optimized_for_cpu(read_model_file(path)):
            # as Runtime does: profile the graph `ortformer optimize` wrote, not a re-rewrite
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        runtime = Runtime(path, provider, threads=threads, session_options=options)
        try:
            if sequence is None:  # 128 tokens, or the model's longest when that is shorter
                sequence = min(DEFAULT_SEQUENCE, runtime.config.max_sequence)
            check_int("sequence", sequence, high=runtime.config.max_sequence, why=" (max_positions: the longest sequence the model takes)")
            cost.check_fits(cost.activation_bytes(runtime.config, batch, sequence),
                            f"profiling at batch {batch} x sequence {sequence}", "choose a smaller --batch or --sequence")
            feeds = synthetic_feeds(runtime, batch, sequence)
            for _ in range(warmup):
                runtime.run(**feeds)
            times = []
            for _ in range(runs):
                start = time.perf_counter()
                runtime.run(**feeds)
                times.append((time.perf_counter() - start) * 1e3)
        finally:  # always write the trace here, inside the folder, never at garbage collection
            trace = runtime._session.end_profiling()
        profiled, ops, nodes = summarize(json.loads(Path(trace).read_text()), last_runs=runs)
    return {
        "model": str(path), "provider": runtime.provider, "threads": threads,
        "batch": batch, "sequence": sequence, "runs": runs, "profiled_runs": profiled,
        "median_run_ms": statistics.median(times),
        "kernel_ms_per_run": sum(op["ms_per_run"] for op in ops),
        "ops": ops, "top_nodes": nodes[:TOP_NODES],
    }
