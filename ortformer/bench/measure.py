"""Timing and memory primitives for side-by-side benchmarks.

Runs alternate between the contenders (A, B, A, B, ...) after a warm-up, so a
noisy neighbour slows both alike; figures are medians, and ratios are taken
between medians of the same run.
"""
from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable


def graph_session(graph, threads: int, opsets: dict[str, int] | None = None):
    """An onnxruntime CPU session, with Runtime's session options, for a hand-built onnx graph
    (MatMul ceilings, kernel micro-benchmarks); opsets: domain -> version, default {"": 18}."""
    import onnxruntime as ort
    from onnx import helper

    from ..runtime.providers import session_options

    imports = [helper.make_opsetid(domain, version) for domain, version in (opsets or {"": 18}).items()]
    # onnx 1.23 writes IR 14 by default, which onnxruntime 1.31 refuses
    proto = helper.make_model(graph, opset_imports=imports, ir_version=10)
    return ort.InferenceSession(proto.SerializeToString(), session_options(threads), providers=["CPUExecutionProvider"])


def side_by_side(runners: dict[str, Callable[[], object]], iterations: int, warmup: int = 2) -> dict[str, dict]:
    """Median and spread of each runner's wall time (seconds), interleaved."""
    for _ in range(warmup):
        for run in runners.values():
            run()
    times: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(iterations):
        for name, run in runners.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return {name: {"median_s": statistics.median(t), "min_s": min(t), "max_s": max(t), "runs": len(t)}
            for name, t in times.items()}


def peak_rss_mb() -> float:
    """This process's peak resident set size so far, in MB.

    VmHWM from /proc: ru_maxrss is inherited across fork and kept across exec on
    Linux, so a child started by a big parent would report the parent's peak.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_isolated(module: str, args: list[str], timeout: float) -> dict:
    """Run ``python -m module args`` and parse its last stdout line as JSON.

    Each long-sequence point gets its own process so its peak RSS is its own.
    A timeout or a killed process (out of memory) is reported, not raised.
    """
    try:
        done = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                              timeout=timeout, env=os.environ.copy())
    except subprocess.TimeoutExpired:
        return {"status": f"timeout after {timeout:.0f} s"}
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        reason = "killed (out of memory?)" if done.returncode < 0 else tail
        return {"status": f"failed: {reason}"}
    return {"status": "ok", **json.loads(done.stdout.strip().splitlines()[-1])}


def target(name: str, wanted: str, measured: float, met: bool, unit: str = "") -> dict:
    """One row of a scenario's targets: what was wanted, what was measured, whether it was met."""
    return {"name": name, "target": wanted, "measured": round(float(measured), 4), "unit": unit, "met": bool(met)}
