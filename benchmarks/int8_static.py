"""The static and signed int8 variants benchmarks/int8_schemes.py measures (not shipped).

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
from onnx import helper, numpy_helper

from ortformer.exporter.int8 import WEIGHT_LEVELS, quantize_weight, weight_matmuls

MS = "com.microsoft"


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

    signed: int8 weights of 7 bits (+-63) instead of uint8 ones: AVX2 without VNNI runs
    u8 x s8 on VPMADDUBSW, whose int16 pair sums saturate with 8-bit weights.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    weights = {t.name: t for t in graph.initializer}
    targets = {n.name for n in weight_matmuls(out)} & set(plan)
    adds = _bias_adds(graph, weights)
    fused: set[str] = set()  # names of the bias Adds folded into their product
    consts: dict[str, np.ndarray] = {}
    nodes: list[onnx.NodeProto] = []
    used: set[str] = set()
    for node in graph.node:
        if node.name in fused:
            continue
        if node.name not in targets:
            nodes.append(node)
            continue
        x, w_name = node.input
        p = plan[node.name]
        w = numpy_helper.to_array(weights[w_name])
        if p.smooth is not None:  # X W = (X / m) (m W): outlier input channels move into the weights
            w = w * p.smooth[:, None]
        wq, col = quantize_weight(w, WEIGHT_LEVELS if not signed else 63)
        n = f"{node.name}.s8"
        used.add(w_name)
        consts.update({
            f"{n}.w": wq if signed else (wq.astype(np.int16) + 128).astype(np.uint8),
            f"{n}.wz": np.array(0, np.int8) if signed else np.array(128, np.uint8),
            f"{n}.c": col, f"{n}.s": np.array(p.scale, np.float32), f"{n}.z": np.array(p.zero_point, np.uint8),
        })
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
        nodes += [
            helper.make_node("QuantizeLinear", [x, f"{n}.s", f"{n}.z"], [f"{n}.q"]),
            helper.make_node("MatMulIntegerToFloat", inputs, [output], domain=MS),
        ]
    still_used = {i for nd in nodes for i in nd.input}
    kept = [t for t in graph.initializer if t.name not in used or t.name in still_used]
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.initializer[:]
    graph.initializer.extend(kept + [numpy_helper.from_array(v, k) for k, v in consts.items()])
    if not any(o.domain == MS for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid(MS, 1))
    return out


def quantize_rows_fused(model: onnx.ModelProto, plan: dict[str, tuple[np.ndarray | None, int]],
                        signed: bool = False, act_levels: int = 255) -> onnx.ModelProto:
    """Per-row dynamic scales around onnxruntime's MatMulIntegerToFloat (a_scale 1):

        x' = x / m;  s_r = max(max(x'_r) / (255 - z), -min(x'_r) / z)     # (..., 1)
        Y  = MatMulIntegerToFloat(QuantizeLinear(x' / s_r, 1, z), W_q, 1, c, z, wz) * s_r

    plan: MatMul name -> (smoothing divisor or None, zero point z). The bias Add stays
    (onnxruntime fuses it into BiasGelu / SkipLayerNormalization).
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    weights = {t.name: t for t in graph.initializer}
    targets = {n.name for n in weight_matmuls(out)} & set(plan)
    consts: dict[str, np.ndarray] = {"r8.one": np.array(1.0, np.float32), "r8.eps": np.array(1e-12, np.float32)}
    nodes: list[onnx.NodeProto] = []
    used: set[str] = set()
    for node in graph.node:
        if node.name not in targets:
            nodes.append(node)
            continue
        x, w_name = node.input
        smooth, zp = plan[node.name]
        w = numpy_helper.to_array(weights[w_name])
        if smooth is not None:
            w = w * smooth[:, None]
        wq, col = quantize_weight(w, WEIGHT_LEVELS if not signed or act_levels < 255 else 63)
        n = f"{node.name}.r8"
        used.add(w_name)
        consts.update({
            f"{n}.w": wq if signed else (wq.astype(np.int16) + 128).astype(np.uint8),
            f"{n}.wz": np.array(0, np.int8) if signed else np.array(128, np.uint8),
            f"{n}.c": col, f"{n}.z": np.array(zp, np.uint8),
            f"{n}.hi": np.array(1 / (act_levels - zp) if zp < act_levels else 0.0, np.float32),
            f"{n}.lo": np.array(-1 / zp if zp > 0 else 0.0, np.float32),
            f"{n}.ax": np.array([-1], np.int64),
        })
        if smooth is not None:
            consts[f"{n}.inv"] = (1 / smooth).astype(np.float32)
            nodes.append(helper.make_node("Mul", [x, f"{n}.inv"], [f"{n}.xs"]))
            x = f"{n}.xs"
        nodes += [
            helper.make_node("ReduceMax", [x, f"{n}.ax"], [f"{n}.max"], keepdims=1),
            helper.make_node("ReduceMin", [x, f"{n}.ax"], [f"{n}.min"], keepdims=1),
            helper.make_node("Mul", [f"{n}.max", f"{n}.hi"], [f"{n}.s_hi"]),
            helper.make_node("Mul", [f"{n}.min", f"{n}.lo"], [f"{n}.s_lo"]),
            helper.make_node("Max", [f"{n}.s_hi", f"{n}.s_lo", "r8.eps"], [f"{n}.s"]),  # (..., 1)
            helper.make_node("Div", [x, f"{n}.s"], [f"{n}.xn"]),
            helper.make_node("QuantizeLinear", [f"{n}.xn", "r8.one", f"{n}.z"], [f"{n}.q"]),
            helper.make_node("MatMulIntegerToFloat", [f"{n}.q", f"{n}.w", "r8.one", f"{n}.c", f"{n}.z", f"{n}.wz"],
                             [f"{n}.y"], domain=MS),
            helper.make_node("Mul", [f"{n}.y", f"{n}.s"], list(node.output)),
        ]
    still_used = {i for nd in nodes for i in nd.input}
    kept = [t for t in graph.initializer if t.name not in used or t.name in still_used]
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.initializer[:]
    graph.initializer.extend(kept + [numpy_helper.from_array(v, k) for k, v in consts.items()])
    if not any(o.domain == MS for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid(MS, 1))
    return out
