"""Batch-invariant int8: weight MatMuls rewritten with per-row activation scales.

onnxruntime's dynamic quantization (``DynamicQuantizeLinear``) computes one scale for
the whole activation tensor, so a row's result depends on the other rows of its
batch. Here every MatMul ``Y = X W`` with a constant weight W (K, F) becomes

    x'  = x / m                   m (K,): SmoothQuant, sqrt(max|X_k| / max|W_k|)  # (..., K)
    s_r = max(max(x'_r) / (255 - z), -min(x'_r) / z)   per row r                 # (..., 1)
    q_r = clip(round(x'_r / s_r) + z, 0, 255)  as uint8                          # (..., K)
    W_q = round(m W / c), c = max|m W[:, f]| / 127  as int8, per column          # (K, F)
    Y   = MatMulIntegerToFloat(q, W_q, 1, c, z, 0) * s                           # (..., F)

so each row's scale is its own and a row's result never depends on its batch.
z (one per MatMul) and m are constants calibrated at export on the float model's own
activations (real text when a tokenizer is given, else random ids). q is one
QuantizeLinear in its blocked form (opset 21: one block of K per row, so s_r and z are
(..., 1) tensors), and onnxruntime's MatMulIntegerToFloat (scalar activation scale only,
here 1) does the GEMM, the int32 -> float cast and the column scales in one kernel with
prepacked weights; only s_r is applied outside it. Int8 files are therefore opset 21 or
later (the exporter traces them there; a float graph below it is converted first).
Dividing by s_r and quantizing with scale 1 gave the same codes at one more pass over X
(2.1-2.6x the blocked op's time at MiniLM's shapes, benchmarks/row_quantize.py); the
earlier MatMulInteger, Cast, two Muls form ran 1.1-1.2x float32 against 1.3x
(benchmarks/int8_schemes.py).
- m moves outlier input channels (LayerNorm outputs have a few) into the weights;
  without it all-MiniLM-L6-v2's sentence cosine on real text was 0.987 (min).
- int8 weights make the GEMM uint8 x int8: VPDPBUSD on VNNI CPUs, 2.7-6x float32's
  MatMul against 1.2-1.4x for uint8 x uint8. Without VNNI that kernel's int16 pair sums
  saturate, so sessions there get the same integers as uint8 + 128
  (ortformer/modelfile/int8_kernels.py): same numbers on every CPU, u8 x u8 speed.
- static activation scales (constants, calibrated) fail the gate: per-token cosine
  0.76 on the parity grid, sentence min 0.958-0.976. See benchmarks/int8_schemes.py
  and the README's int8 section for the measured table.
"""
from __future__ import annotations

import ast
from collections import Counter

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MS = "com.microsoft"
ROW_QUANTIZE_OPSET = 21  # QuantizeLinear with block_size: one scale and zero point per row
WEIGHT_LEVELS = 127  # symmetric 8-bit weights, stored as int8 with zero point 0
SMOOTHING = 0.5  # SmoothQuant alpha: m_k = max|X_k|^a / max|W_k|^(1-a)


def weight_matmuls(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """MatMul nodes whose second input is a constant 2-D float32 initializer, in graph order."""
    weights = {t.name: t for t in model.graph.initializer}
    return [n for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in weights
            and len(weights[n.input[1]].dims) == 2 and weights[n.input[1]].data_type == TensorProto.FLOAT]


def quantize_weight(w: np.ndarray, levels: int = WEIGHT_LEVELS) -> tuple[np.ndarray, np.ndarray]:
    """(K, F) float -> integers in [-levels, levels] (K, F) and per-column scale (F,); a zero column gets scale 1."""
    scale = np.abs(w).max(axis=0) / levels
    scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
    return np.clip(np.round(w / scale), -levels, levels).astype(np.int8), scale


def rewrite_weight_matmuls(model: onnx.ModelProto, names, rewrite, consts: dict[str, np.ndarray],
                           skip: set[str] | None = None) -> onnx.ModelProto:
    """A copy of ``model`` with every weight MatMul named in ``names`` replaced by the nodes
    ``rewrite(node, w)`` returns, w its (K, F) weight.

    rewrite adds the initializers its nodes need to ``consts`` (name -> array; those given at
    the start come first, and a name the model already holds is not added twice), and may add
    names of later nodes to ``skip`` (e.g. a bias Add it folded in): those are dropped. A weight
    no node reads any more is removed.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    weights = {t.name: t for t in graph.initializer}
    targets = {n.name for n in weight_matmuls(out)} & set(names)
    skip = set() if skip is None else skip
    nodes: list[onnx.NodeProto] = []
    used: set[str] = set()
    for node in graph.node:
        if node.name in skip:
            continue
        if node.name not in targets:
            nodes.append(node)
            continue
        used.add(node.input[1])
        nodes += rewrite(node, numpy_helper.to_array(weights[node.input[1]]))
    still_used = {i for n in nodes for i in n.input}
    kept = [t for t in graph.initializer if t.name not in used or t.name in still_used]
    held = {t.name for t in kept}
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.initializer[:]
    graph.initializer.extend(kept + [numpy_helper.from_array(v, k) for k, v in consts.items() if k not in held])
    if targets and not any(o.domain == MS for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid(MS, 1))
    return out


def stored_weight(w: np.ndarray, prefix: str, weights_u8: bool = False,
                  levels: int = WEIGHT_LEVELS) -> dict[str, np.ndarray]:
    """The initializers of a quantized (K, F) weight: ``prefix.w`` (int8 with zero point 0, or
    the same integers as uint8 with zero point 128), ``prefix.wz`` its zero point and ``prefix.c``
    the per-column scales (F,). levels: the largest magnitude."""
    wq, col = quantize_weight(w, levels)
    return {f"{prefix}.w": (wq.astype(np.int16) + 128).astype(np.uint8) if weights_u8 else wq,
            f"{prefix}.wz": np.array(128 if weights_u8 else 0, np.uint8 if weights_u8 else np.int8),
            f"{prefix}.c": col}


def quantize_rows(model: onnx.ModelProto, zero_points: dict[str, int],
                  keep_float: set[str] = frozenset(), weights_u8: bool = False,
                  smooth: dict[str, np.ndarray | None] | None = None,
                  act_levels: int = 255, weight_levels: int = WEIGHT_LEVELS) -> onnx.ModelProto:
    """A copy of ``model`` with every weight MatMul in zero_points, not in keep_float, rewritten.

    zero_points: MatMul node name -> the activation zero point (0..act_levels) its rows share.
    act_levels: the largest activation code (the export uses 255; benchmarks/int8_schemes.py
    measures 7-bit activations with 127). weight_levels: see stored_weight.
    """
    model = with_row_quantize_opset(model)
    consts = {"i8.eps": np.array(1e-12, np.float32), "i8.last": np.array([-1], np.int64),
              "i8.one": np.array(1.0, np.float32)}

    def rewrite(node: onnx.NodeProto, w: np.ndarray) -> list[onnx.NodeProto]:
        x = node.input[0]
        sm = (smooth or {}).get(node.name)
        if sm is not None:  # X W = (X / sm) (sm W): outlier input channels move into the weights
            w = w * sm[:, None]
        zp = int(zero_points[node.name])
        p = f"{node.name}.i8"
        consts.update(stored_weight(w, p, weights_u8, weight_levels))
        consts.update({
            f"{p}.zp": np.array(zp, np.uint8),
            # the largest row value maps to act_levels, the smallest to 0; a side with no levels is ignored
            f"{p}.hi": np.array(1 / (act_levels - zp) if zp < act_levels else 0.0, np.float32),
            f"{p}.lo": np.array(-1 / zp if zp > 0 else 0.0, np.float32),
        })
        nodes = []
        if sm is not None:
            consts[f"{p}.inv"] = (1 / sm).astype(np.float32)
            nodes.append(helper.make_node("Mul", [x, f"{p}.inv"], [f"{p}.xs"]))
            x = f"{p}.xs"
        return nodes + [
            helper.make_node("ReduceMax", [x, "i8.last"], [f"{p}.max"], keepdims=1),  # (..., 1)
            helper.make_node("ReduceMin", [x, "i8.last"], [f"{p}.min"], keepdims=1),
            helper.make_node("Mul", [f"{p}.max", f"{p}.hi"], [f"{p}.s_hi"]),
            helper.make_node("Mul", [f"{p}.min", f"{p}.lo"], [f"{p}.s_lo"]),
            helper.make_node("Max", [f"{p}.s_hi", f"{p}.s_lo", "i8.eps"], [f"{p}.s"]),  # (..., 1)
            # each row quantized with its own scale (one block of K per row), so the GEMM's
            # activation scale is the constant 1; the blocked form wants a zero point per row too
            helper.make_node("Shape", [f"{p}.s"], [f"{p}.rows"]),
            helper.make_node("Expand", [f"{p}.zp", f"{p}.rows"], [f"{p}.zr"]),  # (..., 1)
            helper.make_node("QuantizeLinear", [x, f"{p}.s", f"{p}.zr"], [f"{p}.q"], axis=-1, block_size=w.shape[0]),
            helper.make_node("MatMulIntegerToFloat", [f"{p}.q", f"{p}.w", "i8.one", f"{p}.c", f"{p}.zp", f"{p}.wz"],
                             [f"{p}.y"], domain=MS),  # (..., F) = (q - z)(W_q - wz) * c
            helper.make_node("Mul", [f"{p}.y", f"{p}.s"], list(node.output)),
        ]

    return rewrite_weight_matmuls(model, set(zero_points) - set(keep_float), rewrite, consts)


def with_row_quantize_opset(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` when its ONNX opset is at least ROW_QUANTIZE_OPSET, else a copy converted to it
    by onnx's version converter (which adapts any op whose form changed; the exporter's
    default traces int8 files at 21 instead). The converter drops nodes' metadata (the name
    scopes module_of reads), so each converted node gets back that of the one node of its name,
    and local functions, which are copied across."""
    from onnx import version_converter

    version = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if version >= ROW_QUANTIZE_OPSET:
        return model
    converted = version_converter.convert_version(model, ROW_QUANTIZE_OPSET)
    names = Counter(n.name for n in model.graph.node)
    metadata = {n.name: n.metadata_props for n in model.graph.node if n.name and names[n.name] == 1}
    for node in converted.graph.node:
        if node.name in metadata and not node.metadata_props:
            node.metadata_props.extend(metadata[node.name])
    if model.functions and not converted.functions:  # the converter leaves local functions behind
        converted.functions.extend(model.functions)
    return converted


def capture(model: onnx.ModelProto, names: list[str], feeds: list[dict]) -> dict[str, list[np.ndarray]]:
    """Run the float model on each feed and return the named intermediate tensors, as (M, K) rows."""
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    for name in names:
        probe.graph.output.add(name=name)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep the tensors named
    session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    found: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for feed in feeds:
        mask = feed["attention_mask"].astype(bool).reshape(-1)
        for name, value in zip(names, session.run(names, feed)):
            found[name].append(value.reshape(-1, value.shape[-1])[mask])  # kept tokens only
    return found


def zero_point(rows: np.ndarray) -> int:
    """The zero point that fits the median row: 255 * -min / (max - min), with min <= 0 <= max."""
    lo, hi = np.minimum(rows.min(axis=1), 0), np.maximum(rows.max(axis=1), 0)
    width = np.where(hi > lo, hi - lo, 1.0)
    return int(np.clip(np.round(255 * np.median(-lo / width)), 0, 255))


def smoothing(rows: np.ndarray, w: np.ndarray, alpha: float = SMOOTHING) -> np.ndarray:
    """(K,) per-input-channel divisor m_k = max|X_k|^a / max|W_k|^(1-a), clipped to [1e-4, 1e4]."""
    ax, aw = np.abs(rows).max(axis=0), np.abs(w).max(axis=1)
    m = np.power(np.maximum(ax, 1e-8), alpha) / np.power(np.maximum(aw, 1e-8), 1 - alpha)
    return np.clip(m, 1e-4, 1e4).astype(np.float32)


def simulated_error(rows: np.ndarray, w: np.ndarray, zp: int, m: np.ndarray) -> float:
    """||Y_int8 - Y|| / ||Y|| of one MatMul on calibration rows, computed as the graph computes it."""
    x = rows / m
    hi, lo = x.max(axis=1, keepdims=True), x.min(axis=1, keepdims=True)
    s = np.maximum(np.maximum(hi / (255 - zp) if zp < 255 else 0, lo * (-1 / zp) if zp else 0), 1e-12)
    q = np.clip(np.round(x / s) + zp, 0, 255)
    wq, c = quantize_weight(w * m[:, None])
    y, yq = rows @ w, ((q - zp) @ wq.astype(np.float64)) * s * c
    norm = np.linalg.norm(y)
    return float(np.linalg.norm(yq - y) / norm) if norm else 0.0


def _min_cosines(session, reference, feeds: list[dict]) -> float:
    """Smallest per-token (kept tokens) and per-sentence cosine of session against reference."""
    from ..contract.parity import compare

    worst = 1.0
    for feed in feeds:
        names = [o.name for o in session.get_outputs()]
        got, want = session.run(names, feed), reference.run(names, feed)
        for name, g, w in zip(names, got, want):
            worst = min(worst, compare(name, g, w, feed["attention_mask"])["min_cosine"])
    return worst


def module_of(node: onnx.NodeProto) -> dict:
    """{"module": the model's module a MatMul computes, e.g. "blocks.3.ffn.down"}, read from the
    name scopes torch.onnx records on each node; {} when the node carries none."""
    scopes = next((p.value for p in node.metadata_props if p.key == "pkg.torch.onnx.name_scopes"), None)
    try:
        names = ast.literal_eval(scopes) if scopes else None  # a list of strings, never code
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return {}
    ok = isinstance(names, list) and len(names) >= 2 and isinstance(names[-2], str) and names[-2]
    return {"module": names[-2]} if ok else {}  # the last scope is the op itself ("linear_3")


def _session(model: onnx.ModelProto):
    import onnxruntime as ort

    from ..modelfile.int8_kernels import open_session

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return open_session(model, options, ["CPUExecutionProvider"])


def quantize_int8_rows(source, target, feeds: list[dict], calibration: str,
                       floor: float = 0.995, max_float_share: float = 0.25) -> dict:
    """Write the batch-invariant int8 model of ``source`` to ``target``; return the record for the metadata.

    All weight MatMuls are quantized first. While the calibration inputs' smallest cosine
    (per token and per sentence, against the float model) stays below ``floor``, the
    MatMul with the largest simulated int8 error is kept in float, up to max_float_share
    of them: a rule that holds for any family, measured on the model's own activations.
    """
    model = with_row_quantize_opset(onnx.load(str(source)))  # once, not in each quantize_rows
    matmuls = weight_matmuls(model)
    weights = {t.name: t for t in model.graph.initializer}
    acts = capture(model, [n.input[0] for n in matmuls], feeds)
    smooth, zps, errors = {}, {}, {}
    for node in matmuls:
        rows = np.concatenate(acts[node.input[0]]).astype(np.float64)
        w = numpy_helper.to_array(weights[node.input[1]]).astype(np.float64)
        smooth[node.name] = smoothing(rows, w)
        zps[node.name] = zero_point(rows / smooth[node.name])
        errors[node.name] = simulated_error(rows, w, zps[node.name], smooth[node.name].astype(np.float64))
    del acts
    reference = _session(model)
    by_name = {node.name: node for node in matmuls}
    worst_first = sorted(errors, key=errors.get, reverse=True)
    kept: list[dict] = []
    while True:
        quantized = quantize_rows(model, zps, {k["node"] for k in kept}, smooth=smooth)
        cosine = _min_cosines(_session(quantized), reference, feeds)
        if cosine >= floor or len(kept) >= int(max_float_share * len(matmuls)):
            break
        name = worst_first[len(kept)]
        kept.append({"node": name, **module_of(by_name[name]), "simulated_error": round(errors[name], 5),
                     "reason": f"calibration min cosine {cosine:.5f} < {floor} with it in int8, and its "
                               f"simulated int8 error {errors[name]:.4f} was the largest left"})
    onnx.save_model(quantized, str(target))
    return {"scheme": "per-row dynamic uint8 activations, SmoothQuant a=0.5, per-column int8 weights, "
                      "MatMulIntegerToFloat",
            "calibration": calibration, "floor": floor, "calibration_min_cosine": round(cosine, 6),
            "int8_matmuls": len(matmuls) - len(kept), "float_matmuls": kept}
