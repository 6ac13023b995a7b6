"""Three ways to quantize each row of X with its own scale, as the int8 export does.

  divide:   Div(X, s) then QuantizeLinear(scale 1, zero point z)      (the export until 2026-12)
  per-axis: QuantizeLinear(X, scale s (M,), zero point z (M,), axis=0)
  blocked:  QuantizeLinear(X, scale s (M, 1), zero point z (M, 1), axis=-1, block_size=K),
            opset 21                                                  (what exporter/int8.py emits)

All give the same uint8 codes (checked); this prints their median times, alternating, same
threads, at all-MiniLM-L6-v2's (2,048 x 384 and x 1,536) and bert-base's (128 x 768 and x 3,072)
activation shapes.

    PYTHONPATH=. python benchmarks/row_quantize.py [--threads 2] [--runs 200]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from ortformer.bench.measure import graph_session

ZERO_POINT = 128


def session(m: int, k: int, form: str, threads: int) -> ort.InferenceSession:
    if form == "blocked":
        nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zps"], ["q"], axis=-1, block_size=k)]
        inits = [numpy_helper.from_array(np.full((m, 1), ZERO_POINT, np.uint8), "zps")]
    elif form == "per-axis":
        nodes = [helper.make_node("Reshape", ["s", "flat"], ["s1"]),
                 helper.make_node("QuantizeLinear", ["x", "s1", "zps"], ["q"], axis=0)]
        inits = [numpy_helper.from_array(np.array([-1], np.int64), "flat"),
                 numpy_helper.from_array(np.full((m,), ZERO_POINT, np.uint8), "zps")]
    else:
        nodes = [helper.make_node("Div", ["x", "s"], ["xn"]),
                 helper.make_node("QuantizeLinear", ["xn", "one", "zp"], ["q"])]
        inits = [numpy_helper.from_array(np.array(1.0, np.float32), "one"),
                 numpy_helper.from_array(np.array(ZERO_POINT, np.uint8), "zp")]
    graph = helper.make_graph(nodes, "rows", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k]),
                                              helper.make_tensor_value_info("s", TensorProto.FLOAT, [m, 1])],
                              [helper.make_tensor_value_info("q", TensorProto.UINT8, [m, k])], inits)
    return graph_session(graph, threads, {"": 21})  # blocked QuantizeLinear needs opset 21


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    for m, k in ((2048, 384), (2048, 1536), (128, 768), (128, 3072)):
        x = np.random.default_rng(0).standard_normal((m, k)).astype(np.float32)
        feeds = {"x": x, "s": (np.abs(x).max(axis=1, keepdims=True) / 127).astype(np.float32)}
        sessions = {form: session(m, k, form, args.threads) for form in ("divide", "per-axis", "blocked")}
        codes = [s.run(None, feeds)[0] for s in sessions.values()]
        assert all(np.array_equal(codes[0], c) for c in codes[1:]), "the forms disagree"
        times = {name: [] for name in sessions}
        for _ in range(args.runs):
            for name, s in sessions.items():
                start = time.perf_counter()
                s.run(None, feeds)
                times[name].append(time.perf_counter() - start)
        print(f"{m} x {k}: " + ", ".join(f"{name} {np.median(t) * 1e6:.0f} us" for name, t in times.items())
              + " (same codes)", flush=True)


if __name__ == "__main__":
    main()
