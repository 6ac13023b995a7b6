"""One measurement in a fresh process:
`python -m ortformer.bench.point MODEL N THREADS [RUNS] [SESSION]`.

Prints {"seconds": median of RUNS runs (default 3; 1 above 16,384 tokens),
"peak_rss_mb": peak RSS of this process}. SESSION picks the onnxruntime settings:
"runtime" (Runtime's defaults), "arena" (those, with the CPU arena kept between
calls) or "onnxruntime" (onnxruntime's own defaults: arena, memory patterns,
spinning workers). One process per point keeps the peak RSS its own and keeps one
session's threads from disturbing another's; torch is never imported here.
"""
from __future__ import annotations

import json
import statistics
import sys
import time

import onnxruntime as ort

from ..runtime import Runtime
from ..runtime.profile import synthetic_feeds
from ..runtime.providers import session_options
from .measure import peak_rss_mb

SESSIONS = ("runtime", "arena", "onnxruntime")


def options_for(session: str, threads: int) -> ort.SessionOptions | None:
    if session == "runtime":
        return None
    if session == "arena":
        options = session_options(threads)
        options.enable_cpu_mem_arena = True
        return options
    if session == "onnxruntime":
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        return options
    raise SystemExit(f"unknown session {session!r}; choose from {SESSIONS}")


def main(model: str, n: int, threads: int, runs: int | None = None, session: str = "runtime") -> None:
    runtime = Runtime(model, "cpu", threads=threads, session_options=options_for(session, threads))
    feeds = synthetic_feeds(runtime, 1, n)
    if n <= 131072:  # beyond, the chunked path reuses one chunk's buffers: its first chunk is the warm-up
        runtime.run(**feeds)
    times = []
    for _ in range(runs or (3 if n <= 16384 else 1)):
        start = time.perf_counter()
        runtime.run(**feeds)
        times.append(time.perf_counter() - start)
    print(json.dumps({"seconds": statistics.median(times), "peak_rss_mb": peak_rss_mb(),
                      "torch_loaded": "torch" in sys.modules}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *(int(a) for a in sys.argv[4:5]), *sys.argv[5:6])
