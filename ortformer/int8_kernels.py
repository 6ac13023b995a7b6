"""Sessions for int8 files whose results do not depend on the CPU that runs them.

ortformer's int8 files store their weights as int8 (symmetric, zero point 0), so that
onnxruntime's MatMulIntegerToFloat runs its uint8 x int8 kernel. On x86 CPUs with
VNNI (AVX512-VNNI, AVX-VNNI, AMX) that kernel accumulates each product in int32
(VPDPBUSD) and is exact: measured 2.7-6x float32's MatMul at MiniLM's and bert-base's
shapes, against 1.2-1.4x for uint8 x uint8. On AVX2 / AVX-512 CPUs without VNNI it
runs on VPMADDUBSW, whose int16 sums of two products saturate: 255 * 127 * 2 > 32767,
so a row of large activations against large weights reads a wrong, smaller value.

There the weights are rewritten at session start, before onnxruntime sees them:

    W_u8 = W_s8 + 128,  zero point 128      # (K, F): (W_u8 - 128) == W_s8, exactly

so the GEMM runs uint8 x uint8 (widened to int16 products, exact) on the same integers:
the file gives the same numbers on every CPU, only the speed differs.
"""
from __future__ import annotations

import functools
import platform
from pathlib import Path

# the MatMuls whose second input (B) and its zero point (input 3 of MatMulInteger,
# 5 of MatMulIntegerToFloat) are the quantized weight
_B_ZERO_POINT = {"MatMulInteger": 3, "MatMulIntegerToFloat": 5}
# cpuinfo flags of the x86 extensions whose uint8 x int8 products accumulate in int32
VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})
X86 = frozenset({"x86_64", "amd64", "i386", "i686", "x86"})


def signed_int8_exact(machine: str | None = None, cpuinfo: str | None = None) -> bool:
    """True when onnxruntime's uint8 x int8 GEMM is exact on this CPU: not x86 (ARM's
    kernels widen or use SDOT/UDOT), or x86 with a VNNI flag. An x86 CPU whose flags
    cannot be read (no /proc/cpuinfo) counts as without: the rewrite is exact anyway.
    machine / cpuinfo: for tests; default platform.machine() and /proc/cpuinfo."""
    if machine is None and cpuinfo is None:
        return _this_cpu_exact()
    machine = (machine if machine is not None else platform.machine()).lower()
    if machine not in X86:
        return True
    for line in (cpuinfo or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return not VNNI_FLAGS.isdisjoint(value.split())
    return False


@functools.lru_cache(maxsize=1)
def _this_cpu_exact() -> bool:
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        cpuinfo = ""
    return signed_int8_exact(platform.machine(), cpuinfo)


def unsigned_weights(model) -> int:
    """Rewrite in place every int8 weight of the model's MatMulInteger / MatMulIntegerToFloat
    nodes (a constant B with a constant int8 zero point, or none) as uint8 + 128 with zero
    point + 128. A tensor that anything else also reads is left as it is. Returns how many
    weights changed."""
    import numpy as np
    from onnx import TensorProto, numpy_helper

    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    roles: dict[str, set[str]] = {}  # tensor -> how nodes read it: "b", "b_zero" or "other"
    for node in graph.node:
        zp_at = _B_ZERO_POINT.get(node.op_type) if node.domain in ("", "com.microsoft") else None
        for at, name in enumerate(node.input):
            role = "b" if zp_at and at == 1 else "b_zero" if zp_at and at == zp_at else "other"
            roles.setdefault(name, set()).add(role)
    graph_outputs = {o.name for o in graph.output}

    def only(name: str, role: str) -> bool:
        return roles.get(name) == {role} and name not in graph_outputs

    shifted: set[str] = set()
    for node in graph.node:
        zp_at = _B_ZERO_POINT.get(node.op_type) if node.domain in ("", "com.microsoft") else None
        if zp_at is None or len(node.input) < 2 or node.input[1] not in inits:
            continue
        weight = inits[node.input[1]]
        zero_name = node.input[zp_at] if len(node.input) > zp_at else ""
        zero = inits.get(zero_name) if zero_name else None
        if weight.data_type != TensorProto.INT8 or not only(weight.name, "b") or (
                zero_name and (zero is None or zero.data_type != TensorProto.INT8 or not only(zero_name, "b_zero"))):
            continue  # unsigned already, shared with other readers, or a zero point computed in the graph
        for tensor in (weight, zero):
            if tensor is not None and tensor.name not in shifted:
                values = (numpy_helper.to_array(tensor).astype(np.int16) + 128).astype(np.uint8)
                tensor.CopyFrom(numpy_helper.from_array(values, tensor.name))
                shifted.add(tensor.name)
        if zero is None:  # no zero point means 0; unsigned, that is 128
            name = f"{weight.name}.zero_point_u8"
            if name not in inits:
                inits[name] = numpy_helper.from_array(np.array(128, np.uint8), name)
                graph.initializer.append(inits[name])
            node.input.extend([""] * (zp_at + 1 - len(node.input)))
            node.input[zp_at] = name
    return sum(1 for name in shifted if roles.get(name) == {"b"})


def open_session(path, options, providers: list, *, int8: bool = True, exact: bool | None = None):
    """onnxruntime.InferenceSession for the model file at ``path`` (or a ModelProto), with int8
    weights made unsigned first where this CPU's uint8 x int8 GEMM saturates.
    int8: False when the file is known to hold no int8 weights (skips reading it);
    exact: override the CPU check (tests; None = signed_int8_exact())."""
    import onnxruntime as ort

    if exact is None:
        exact = signed_int8_exact() or not int8
    in_memory = not isinstance(path, (str, Path))
    if exact:
        return ort.InferenceSession(path.SerializeToString() if in_memory else str(path), options, providers=providers)
    import onnx

    model = onnx.ModelProto()
    if in_memory:
        model.CopyFrom(path)
    else:  # read_model_file has checked that its external data stays in its folder
        model = onnx.load(str(path))
    if not unsigned_weights(model) and not in_memory:
        return ort.InferenceSession(str(path), options, providers=providers)
    return ort.InferenceSession(model.SerializeToString(), options, providers=providers)
