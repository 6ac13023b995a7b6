"""onnxruntime's MatMulNBits (8-bit weights, accuracy_level 4: activations quantized per block of
K) against the float32 MatMul, one GEMM at a time, at all-MiniLM-L6-v2's and bert-base's shapes.

MatMulNBits is batch-invariant (a row's blocks are quantized on their own), so it was a candidate
for `--quantize int8`; this measures whether its kernel beats float32 on this CPU. Prints, per
(M, K, N) and block size: relative error against x @ w, the largest difference between a row
computed alone and inside the batch, and float time / MatMulNBits time (medians of alternating
runs, same threads).

    PYTHONPATH=. python benchmarks/matmul_nbits.py [--threads 2] [--runs 20]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from ortformer.bench.measure import graph_session

SHAPES = [(128, 768, 768), (128, 768, 3072), (128, 3072, 768),  # bert-base, batch 1 x 128 tokens
          (2048, 384, 384), (2048, 384, 1536), (2048, 1536, 384)]  # MiniLM, 32 sentences x 64 tokens


def blockwise_uint8(w: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """(K, N) weights -> MatMulNBits' (N, K/block, block) uint8 (symmetric, zero point 128) and
    (N * K/block) float scales: scale = max |w| over the block / 127."""
    k, n = w.shape
    blocks = w.T.reshape(n, k // block, block)  # (N, K/block, block)
    scale = np.abs(blocks).max(-1) / 127.0
    scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
    q = np.clip(np.round(blocks / scale[..., None]), -127, 127) + 128
    return q.astype(np.uint8), scale.reshape(-1)


def session(w: np.ndarray, threads: int, block: int | None) -> ort.InferenceSession:
    """float32 MatMul when block is None, else MatMulNBits(bits=8, accuracy_level=4)."""
    k, n = w.shape
    if block is None:
        inits = [numpy_helper.from_array(w, "w")]
        node = helper.make_node("MatMul", ["x", "w"], ["y"])
    else:
        q, scale = blockwise_uint8(w, block)
        inits = [numpy_helper.from_array(q, "wq"), numpy_helper.from_array(scale, "scale")]
        node = helper.make_node("MatMulNBits", ["x", "wq", "scale"], ["y"], domain="com.microsoft",
                                K=k, N=n, bits=8, block_size=block, accuracy_level=4)
    graph = helper.make_graph([node], "gemm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", n])], inits)
    return graph_session(graph, threads, {"": 17, "com.microsoft": 1})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    for m, k, n in SHAPES:
        w = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
        x = rng.standard_normal((m, k)).astype(np.float32)
        sessions = {"float32": session(w, args.threads, None)}
        sessions.update({f"nbits{b}": session(w, args.threads, b) for b in (32, 128) if k % b == 0})
        reference = x @ w
        times = {name: [] for name in sessions}
        for _ in range(3):  # warm-up: prepacking, thread pools
            for s in sessions.values():
                s.run(None, {"x": x})
        for _ in range(args.runs):
            for name, s in sessions.items():
                start = time.perf_counter()
                s.run(None, {"x": x})
                times[name].append(time.perf_counter() - start)
        base = np.median(times["float32"])
        cells = [f"float32 {base * 1e3:.1f} ms"]
        for name, s in sessions.items():
            if name == "float32":
                continue
            out = s.run(None, {"x": x})[0]
            error = np.linalg.norm(out - reference) / np.linalg.norm(reference)
            alone = np.abs(s.run(None, {"x": x[:1]})[0][0] - out[0]).max()
            cells.append(f"{name}: {base / np.median(times[name]):.2f}x float, rel err {error:.4f}, "
                         f"row alone vs in batch {alone:.1e}")
        print(f"M={m} K={k} N={n}: " + "; ".join(cells), flush=True)


if __name__ == "__main__":
    main()
