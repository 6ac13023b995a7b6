"""Sessions for int8 files whose results do not depend on the CPU that runs them.

ortformer's int8 files store their weights as int8 (symmetric, zero point 0), so that
onnxruntime's MatMulIntegerToFloat runs its uint8 x int8 kernel. On x86 CPUs with
VNNI (AVX512-VNNI; AVX-VNNI without AVX512BW) that kernel accumulates each product in int32
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

# (domain, op) -> the input index of B's zero point; B, the quantized weight, is input 1
_INTEGER_MATMULS = {("", "MatMulInteger"): 3, ("ai.onnx", "MatMulInteger"): 3,
                    ("com.microsoft", "MatMulIntegerToFloat"): 5}
X86 = frozenset({"x86_64", "amd64", "i386", "i686", "x86"})
# why an int8 file runs on the CPU only: Runtime refuses provider "cuda" for it, triton-repo GPU instances
NO_CUDA_KERNELS = "onnxruntime has no CUDA kernel for its MatMulIntegerToFloat or per-row QuantizeLinear"


def signed_int8_exact(machine: str | None = None, cpuinfo: str | None = None) -> bool:
    """True when onnxruntime's uint8 x int8 GEMM is exact on this CPU: not x86 (ARM's kernels
    widen or use SDOT/UDOT), or x86 whose kernel is VNNI's: AVX512-VNNI, or AVX-VNNI on a CPU
    without AVX512BW (MLAS prefers its AVX512BW kernel, VPMADDUBSW, over AVX-VNNI's). An x86
    CPU whose flags cannot be read (no /proc/cpuinfo) counts as without: the rewrite is exact
    anyway. machine / cpuinfo: for tests; default platform.machine() and /proc/cpuinfo."""
    if machine is None and cpuinfo is None:
        return _this_cpu_exact()
    return _exact(machine if machine is not None else platform.machine(), cpu_flags(cpuinfo or ""))


def _exact(machine: str, flags: frozenset[str]) -> bool:
    if machine.lower() not in X86:
        return True
    return "avx512_vnni" in flags or ("avx_vnni" in flags and "avx512bw" not in flags)


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The x86 feature flags /proc/cpuinfo lists (or ``cpuinfo``'s text); empty where unreadable."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            return frozenset()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


@functools.lru_cache(maxsize=1)
def _this_cpu_exact() -> bool:
    return _exact(platform.machine(), cpu_flags())


def _subgraph_reads(node) -> set[str]:
    """Every tensor name read by the nodes of node's subgraphs (If / Loop / Scan bodies), nested too."""
    found: set[str] = set()
    for attribute in node.attribute:
        for graph in [attribute.g] if attribute.HasField("g") else list(attribute.graphs):
            for inner in graph.node:
                found.update(i for i in inner.input if i)
                found |= _subgraph_reads(inner)
    return found


def unsigned_weights(model) -> int:
    """Rewrite in place the int8 weights of the model's MatMulInteger / MatMulIntegerToFloat
    nodes as uint8 + 128, their zero points + 128 (a missing one, 0, becomes 128): the same
    integers (B - zero point) in every product. Returns how many weights changed.

    Only constants that nothing else can see change: B and its zero point must be int8
    initializers, not graph inputs (a caller could feed int8 over them) or outputs, and read
    only as B / zero point by such nodes of the top-level graph (not inside a subgraph).
    Nodes that share a weight or a zero point change together or not at all.
    """
    from collections import defaultdict

    import numpy as np
    from onnx import TensorProto, numpy_helper

    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    nodes = list(graph.node)
    zero_at = {i: _INTEGER_MATMULS[(n.domain, n.op_type)] for i, n in enumerate(nodes)
               if (n.domain, n.op_type) in _INTEGER_MATMULS and len(n.input) > 1}

    def zero_of(i: int) -> str:
        return nodes[i].input[zero_at[i]] if len(nodes[i].input) > zero_at[i] else ""

    readers: dict[str, set[tuple[int, str]]] = defaultdict(set)  # tensor -> {(node, "b" / "zero" / "other")}
    for i, node in enumerate(nodes):
        for at, name in enumerate(node.input):
            if name:
                role = "b" if i in zero_at and at == 1 else "zero" if i in zero_at and at == zero_at[i] else "other"
                readers[name].add((i, role))
        for name in _subgraph_reads(node):
            readers[name].add((i, "other"))
    visible = {v.name for v in graph.input} | {v.name for v in graph.output}

    def int8_constant(name: str) -> bool:
        return name in inits and inits[name].data_type == TensorProto.INT8 and name not in visible

    # group the nodes linked through shared weights or zero points (union-find)
    parent = {i: i for i in zero_at}

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for name in {t for i in zero_at for t in (nodes[i].input[1], zero_of(i)) if t}:
        linked = [i for i, _ in readers[name] if i in zero_at]
        for i in linked[1:]:
            parent[root(i)] = root(linked[0])
    groups: dict[int, list[int]] = defaultdict(list)
    for i in zero_at:
        groups[root(i)].append(i)

    def rewritable(group: list[int]) -> bool:
        members = set(group)
        for i in group:
            weight, zero = nodes[i].input[1], zero_of(i)
            for name, role in ((weight, "b"), (zero, "zero")) if zero else ((weight, "b"),):
                if not int8_constant(name) or any(j not in members or r != role for j, r in readers[name]):
                    return False
        return True

    taken = set(inits) | {o for n in nodes for o in n.output} | set(readers) | visible
    shifted: set[str] = set()
    weights = 0
    for group in groups.values():
        if not rewritable(group):
            continue
        for i in group:
            node = nodes[i]
            for name in (node.input[1], zero_of(i)):
                if name and name not in shifted:
                    tensor = inits[name]
                    values = (numpy_helper.to_array(tensor).astype(np.int16) + 128).astype(np.uint8)
                    tensor.CopyFrom(numpy_helper.from_array(values, name))
                    shifted.add(name)
                    weights += name == node.input[1]
            if not zero_of(i):  # no zero point means 0; unsigned, that is 128
                name, n = f"{node.input[1]}.zero_point_u8", 0
                while name in taken and name not in shifted:
                    n += 1
                    name = f"{node.input[1]}.zero_point_u8_{n}"
                if name not in shifted:
                    graph.initializer.append(numpy_helper.from_array(np.array(128, np.uint8), name))
                    taken.add(name)
                    shifted.add(name)
                node.input.extend([""] * (zero_at[i] + 1 - len(node.input)))
                node.input[zero_at[i]] = name
    if shifted:  # recorded types of the changed tensors would now be wrong: onnxruntime infers them again
        kept = [v for v in graph.value_info if v.name not in shifted]
        del graph.value_info[:]
        graph.value_info.extend(kept)
    return weights


def kernel_here(model) -> str | None:
    """Which integer GEMM this CPU runs for the model's integer MatMuls, in words; None without any."""
    from onnx import TensorProto

    inits = {t.name: t.data_type for t in model.graph.initializer}
    types = {inits.get(n.input[1]) for n in model.graph.node
             if (n.domain, n.op_type) in _INTEGER_MATMULS and len(n.input) > 1}
    if not types:
        return None
    if TensorProto.INT8 not in types:
        return "uint8 x uint8 (the file stores uint8 weights)"
    if signed_int8_exact():
        return "uint8 x int8 (this CPU has VNNI: exact int32 sums)"
    return ("uint8 x uint8: the int8 weights become uint8 + 128 at load, the same integers (this CPU has "
            "no VNNI, where uint8 x int8 saturates)")


# onnxruntime graph rewrites every CPU session opened here leaves out (the Runtime's, the export
# gate's, check's: they all judge and run one graph). Skip-
# LayerNormFusion turns each residual Add + LayerNormalization into one SkipLayerNormalization;
# onnxruntime's CPU kernel for it ran slower than the two ops it replaces. all-MiniLM-L6-v2 on
# 256 real sentences, each session interleaved with the others over 5 rounds, Intel Xeon (AVX-512,
# AMX), load average about 1 (benchmarks/cpu_float32_gap.py's skip_ln_fusion variant): without
# the fusion 1.13x / 1.10x (1 / 2 threads) the sessions with it in float32, 1.27x / 1.11x in int8,
# 1.12x / 1.09x on the standard-ops export; a bert-base shape 1.08x / 1.05x-1.08x. BiasGeluFusion,
# the other rewrite that applies to these graphs, measured within 3% either way and stays.
CPU_DISABLED_FUSIONS = ("SkipLayerNormFusion",)


def open_session(path, options, providers: list, *, int8: bool = True, exact: bool | None = None):
    """onnxruntime.InferenceSession for the model file at ``path`` (or a ModelProto), with int8
    weights made unsigned first where this CPU's uint8 x int8 GEMM saturates.
    int8: False when the file is known to hold no int8 weights (skips reading it);
    exact: override the CPU check (tests; None = signed_int8_exact()).
    A CPU-only session leaves out the rewrites named in CPU_DISABLED_FUSIONS."""
    import onnxruntime as ort

    cpu_only = list(providers) == ["CPUExecutionProvider"]
    extra = {"disabled_optimizers": list(CPU_DISABLED_FUSIONS)} if cpu_only and CPU_DISABLED_FUSIONS else {}

    def session(model):
        return ort.InferenceSession(model, options, providers=providers, **extra)

    in_memory = not isinstance(path, (str, Path))
    if in_memory:  # a proto says itself whether it has integer MatMuls: no copy of a float model
        int8 = any((n.domain, n.op_type) in _INTEGER_MATMULS for n in path.graph.node)
    if not int8 or (signed_int8_exact() if exact is None else exact):
        return session(path.SerializeToString() if in_memory else str(path))
    import onnx

    model = onnx.ModelProto()
    if in_memory:
        model.CopyFrom(path)
    else:  # read_model_file has checked that its external data stays in its folder
        model = onnx.load(str(path))
    if not unsigned_weights(model) and not in_memory:
        return session(str(path))
    return session(model.SerializeToString())

