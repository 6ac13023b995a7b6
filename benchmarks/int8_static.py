"""The static and signed int8 variants benchmarks/int8_schemes.py measures (not shipped;
the per-row variants are ortformer.exporter.int8.quantize_rows with its options).

Static int8 products: activation scale and zero point are constants calibrated at export.

Every constant-weight MatMul ``Y = X W (+ b)`` in the plan becomes

    x' = x / m                      m (K,): SmoothQuant, sqrt(max|X_k| / max|W_k|)      # (..., K)
    q  = clip(round(x' / s) + z, 0, 255)  uint8, s and z scalars fixed at export       # (..., K)
    W_q = round(m W / c) + 128, c = max|m W[:, f]| / 127, uint8 per column            # (K, F)
    Y  = MatMulIntegerToFloat(q, W_q, s, c, z, 128, b) = s c ⊗ (q - z)(W_q - 128) + b  # (..., F)

Nothing depends on other rows, so a row's result never depends on its batch, and the
product is two nodes (three with the smoothing Mul) against the per-row scheme's
seventeen (exporter/int8.py): onnxruntime's MatMulIntegerToFloat prepacks W_q and
does the rescale and bias inside the GEMM.

s and z come from the range of x' on the calibration rows: [min(lo, 0), max(hi, 0)]
where lo/hi are the (100 - p)th/pth percentiles of all values (p = 100: min/max).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from ortformer.exporter.int8 import MS, quantize_weight, rewrite_weight_matmuls, stored_weight


@dataclass(frozen=True)
class Static:
    """One product's calibrated constants: smoothing divisor (K,) or None, activation scale and zero point."""
    smooth: np.ndarray | None
    scale: float
    zero_point: int


def activation_range(x: np.ndarray, percentile: float = 100.0) -> tuple[float, int]:
    """(scale, zero point) of uint8 codes covering [min(lo, 0), max(hi, 0)] of x's values."""
    flat = x.reshape(-1)
    if percentile >= 100:
        lo, hi = float(flat.min()), float(flat.max())
    else:
        lo, hi = (float(v) for v in np.percentile(flat, [100 - percentile, percentile]))
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = (hi - lo) / 255 if hi > lo else 1.0
    return scale, int(np.clip(np.round(-lo / scale), 0, 255))


def static_error(rows: np.ndarray, w: np.ndarray, p: Static) -> float:
    """||Y_int8 - Y|| / ||Y|| of one product on calibration rows (M, K), computed as the graph computes it."""
    m = p.smooth if p.smooth is not None else np.ones(w.shape[0])
    q = np.clip(np.round(rows / m / p.scale) + p.zero_point, 0, 255) - p.zero_point
    wq, c = quantize_weight(w * m[:, None])
    y, yq = rows @ w, (q @ wq.astype(np.float64)) * p.scale * c
    norm = np.linalg.norm(y)
    return float(np.linalg.norm(yq - y) / norm) if norm else 0.0


def _bias_adds(graph: onnx.GraphProto, weights: dict) -> dict[str, onnx.NodeProto]:
    """MatMul output -> the Add that adds a constant (F,) bias to it, where that Add is its only consumer."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    outputs = {o.name for o in graph.output}
    found = {}
    for name, nodes in consumers.items():
        if len(nodes) != 1 or name in outputs or nodes[0].op_type != "Add":
            continue
        other = [i for i in nodes[0].input if i != name]
        if len(other) == 1 and other[0] in weights and len(weights[other[0]].dims) == 1:
            found[name] = nodes[0]
    return found


def quantize_static(model: onnx.ModelProto, plan: dict[str, Static], signed: bool = False) -> onnx.ModelProto:
    """A copy of ``model`` with every weight MatMul named in ``plan`` rewritten as above.

    signed: int8 weights (u8 x s8 GEMM, exact on VNNI CPUs) instead of the same integers as uint8 + 128.
    """
    adds = _bias_adds(model.graph, {t.name: t for t in model.graph.initializer})
    fused: set[str] = set()  # names of the bias Adds folded into their product
    consts: dict[str, np.ndarray] = {}

    def rewrite(node: onnx.NodeProto, w: np.ndarray) -> list[onnx.NodeProto]:
        x = node.input[0]
        p = plan[node.name]
        if p.smooth is not None:  # X W = (X / m) (m W): outlier input channels move into the weights
            w = w * p.smooth[:, None]
        n = f"{node.name}.s8"
        consts.update(stored_weight(w, n, weights_u8=not signed))
        consts.update({f"{n}.s": np.array(p.scale, np.float32), f"{n}.z": np.array(p.zero_point, np.uint8)})
        nodes = []
        if p.smooth is not None:
            consts[f"{n}.inv"] = (1 / p.smooth).astype(np.float32)
            nodes.append(helper.make_node("Mul", [x, f"{n}.inv"], [f"{n}.xs"]))
            x = f"{n}.xs"
        inputs = [f"{n}.q", f"{n}.w", f"{n}.s", f"{n}.c", f"{n}.z", f"{n}.wz"]
        output = node.output[0]
        add = adds.get(output)
        if add is not None:
            inputs.append(next(i for i in add.input if i != output))
            output = add.output[0]
            fused.add(add.name)
        return nodes + [
            helper.make_node("QuantizeLinear", [x, f"{n}.s", f"{n}.z"], [f"{n}.q"]),
            helper.make_node("MatMulIntegerToFloat", inputs, [output], domain=MS),
        ]

    return rewrite_weight_matmuls(model, set(plan), rewrite, consts, skip=fused)
