"""One long-sequence measurement in a fresh process: `python -m ortformer.bench.point MODEL N THREADS`.

Prints {"seconds": median of 3 runs, "peak_rss_mb": peak RSS of this process}.
torch is never imported here, so the RSS is onnxruntime's alone.
"""
from __future__ import annotations

import json
import statistics
import sys
import time

import numpy as np

from ..runtime import Runtime
from .measure import peak_rss_mb


def main(model: str, n: int, threads: int) -> None:
    runtime = Runtime(model, "cpu", threads=threads)
    cfg = runtime.config
    rng = np.random.default_rng(0)
    feeds = ({"input_ids": rng.integers(0, cfg.vocab_size, (1, n))} if cfg.takes_ids
             else {"inputs_embeds": rng.standard_normal((1, n, cfg.hidden_size), dtype=np.float32)})
    runtime.run(**feeds)  # warm-up
    times = []
    for _ in range(3 if n <= 16384 else 1):
        start = time.perf_counter()
        runtime.run(**feeds)
        times.append(time.perf_counter() - start)
    print(json.dumps({"seconds": statistics.median(times), "peak_rss_mb": peak_rss_mb(),
                      "torch_loaded": "torch" in sys.modules}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
