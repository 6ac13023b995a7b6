"""int8 files store int8 weights (u8 x s8 GEMMs, exact on VNNI CPUs); where the CPU's kernel would
saturate, sessions get the same integers as uint8 + 128, so every CPU gives the same numbers."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortformer.modelfile import int8_kernels
from ortformer.modelfile.int8_kernels import open_session, signed_int8_exact, unsigned_weights
from ortformer.runtime import Runtime

CPU = ["CPUExecutionProvider"]


def integer_matmul(weights: np.ndarray, zero_point=None, op="MatMulIntegerToFloat") -> onnx.ModelProto:
    """y = (x - 128) @ (W - zero_point) as one MatMulIntegerToFloat (scales 1) or MatMulInteger."""
    k, f = weights.shape
    inits = [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(np.array(128, np.uint8), "xz")]
    if op == "MatMulIntegerToFloat":
        inits += [numpy_helper.from_array(np.array(1.0, np.float32), "one"),
                  numpy_helper.from_array(np.ones(f, np.float32), "c")]
        inputs = ["x", "w", "one", "c", "xz"] + (["wz"] if zero_point is not None else [])
        node = helper.make_node(op, inputs, ["y"], domain="com.microsoft")
        out = TensorProto.FLOAT
    else:
        node = helper.make_node(op, ["x", "w", "xz"] + (["wz"] if zero_point is not None else []), ["y"])
        out = TensorProto.INT32
    if zero_point is not None:
        inits.append(numpy_helper.from_array(np.array(zero_point, weights.dtype), "wz"))
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, ["M", k])],
                              [helper.make_tensor_value_info("y", out, ["M", f])], inits)
    return helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 17),
                                                                  helper.make_opsetid("com.microsoft", 1)])


def saturating_case(k=64, f=24):
    """Rows and weights at the extremes, where VPMADDUBSW's int16 pair sums (255 * 127 * 2) overflow."""
    rng = np.random.default_rng(0)
    w = rng.choice(np.array([-127, 127, -128, 0, 5], np.int8), size=(k, f))
    w[:, 0] = 127
    x = rng.choice(np.array([0, 255, 254, 128], np.uint8), size=(9, k))
    x[0], x[1] = 255, 0
    return x, w


@pytest.mark.parametrize("op", ["MatMulIntegerToFloat", "MatMulInteger"])
@pytest.mark.parametrize("zero_point", [None, 0, -3])
def test_unsigned_rewrite_is_exact_on_any_cpu(op, zero_point):
    x, w = saturating_case()
    want = (x.astype(np.int64) - 128) @ (w.astype(np.int64) - (zero_point or 0))
    model = integer_matmul(w, zero_point, op)
    got = open_session(model, ort.SessionOptions(), CPU, exact=False).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, want)
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    assert unsigned_weights(rewritten) == 1
    weights = {t.name: numpy_helper.to_array(t) for t in rewritten.graph.initializer}
    assert weights["w"].dtype == np.uint8
    np.testing.assert_array_equal(weights["w"].astype(np.int16) - 128, w)
    assert unsigned_weights(rewritten) == 0  # nothing signed is left


def test_this_cpu_claim_is_true():
    """Where the check says u8 x s8 is exact, the signed file as written must give exact results."""
    x, w = saturating_case()
    want = (x.astype(np.int64) - 128) @ w.astype(np.int64)
    got = open_session(integer_matmul(w), ort.SessionOptions(), CPU, exact=True).run(None, {"x": x})[0]
    if signed_int8_exact():
        np.testing.assert_array_equal(got, want)
    elif _flags() & {"avx2"}:  # the reason for the rewrite: VPMADDUBSW reads a saturated, wrong value
        assert not np.array_equal(got, want)
    else:
        pytest.skip("no AVX2 on this CPU (or its flags are unreadable): its u8 x s8 kernel is not VPMADDUBSW")


def _flags() -> set[str]:
    try:
        text = open("/proc/cpuinfo", errors="replace").read()
    except OSError:
        return set()
    return next((set(line.partition(":")[2].split()) for line in text.splitlines()
                 if line.partition(":")[0].strip() == "flags"), set())


@pytest.mark.parametrize("machine, flags, exact", [
    ("x86_64", "fpu sse avx2 fma avx512f avx512bw", False),  # AVX-512 without VNNI: VPMADDUBSW
    ("x86_64", "fpu avx2 avx512f avx512_vnni", True),
    ("x86_64", "fpu avx2 avx_vnni", True),
    ("x86_64", "fpu avx2 avx512bw avx_vnni", False),  # MLAS prefers its AVX512BW kernel to AVX-VNNI's
    ("AMD64", "fpu avx2 avx512bw avx512_vnni amx_int8 amx_tile", True),
    ("x86_64", None, False),  # flags unknown: the exact rewrite
    ("aarch64", None, True),
    ("arm64", "fp asimd asimddp", True),
])
def test_which_cpus_run_signed_weights(machine, flags, exact):
    cpuinfo = None if flags is None else f"processor\t: 0\nflags\t\t: {flags}\nbogomips\t: 1\n"
    assert signed_int8_exact(machine, cpuinfo) is exact


def test_a_weight_read_elsewhere_is_left_alone():
    x, w = saturating_case()
    model = integer_matmul(w)
    model.graph.node.append(helper.make_node("Cast", ["w"], ["w_float"], to=TensorProto.FLOAT))
    model.graph.output.append(helper.make_tensor_value_info("w_float", TensorProto.FLOAT, list(w.shape)))
    assert unsigned_weights(model) == 0
    assert {t.name: t.data_type for t in model.graph.initializer}["w"] == TensorProto.INT8


@pytest.mark.skipif(not signed_int8_exact(), reason="this CPU runs every int8 file rewritten: nothing to compare")
def test_an_int8_export_gives_the_same_numbers_with_either_kernel(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from ortformer.cli import cli

    path = tmp_path / "tiny8.onnx"
    result = CliRunner().invoke(cli, ["export", "--preset", "tiny", "--quantize", "int8", "-o", str(path)])
    assert result.exit_code == 0, result.output
    stored = {t.name: t.data_type for t in onnx.load(str(path)).graph.initializer if t.name.endswith(".i8.w")}
    assert stored and set(stored.values()) == {TensorProto.INT8}
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 100, size=(5, 23))  # the tiny preset's vocabulary
    mask = (np.arange(23) < rng.integers(1, 24, size=(5, 1))).astype(np.int64)
    as_written = Runtime(path, "cpu").run(input_ids=ids, attention_mask=mask)
    monkeypatch.setattr(int8_kernels, "signed_int8_exact", lambda: False)
    rewritten = Runtime(path, "cpu").run(input_ids=ids, attention_mask=mask)
    for name, value in as_written.items():  # the same integers in both GEMMs
        np.testing.assert_array_equal(rewritten[name], value)


def _two_matmuls(w: np.ndarray, zero_points: tuple) -> onnx.ModelProto:
    """Two MatMulInteger nodes reading the same weight, each with its own zero point (None: no input)."""
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(128, np.uint8), "xz")]
    nodes = []
    for i, zero in enumerate(zero_points):
        inputs = ["x", "w", "xz"]
        if zero is not None:
            inits.append(numpy_helper.from_array(np.array(zero, np.int8), f"wz{i}"))
            inputs.append(f"wz{i}")
        nodes.append(helper.make_node("MatMulInteger", inputs, [f"y{i}"]))
    k, f = w.shape
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, ["M", k])],
                              [helper.make_tensor_value_info(f"y{i}", TensorProto.INT32, ["M", f])
                               for i in range(len(zero_points))], inits)
    return helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("zero_points", [(None, 0), (2, -5), (None, None)])
def test_a_shared_weight_changes_once_for_all_its_readers(zero_points):
    x, w = saturating_case()
    model = _two_matmuls(w, zero_points)
    assert unsigned_weights(model) == 1
    outputs = open_session(model, ort.SessionOptions(), CPU, exact=True).run(None, {"x": x})  # already unsigned
    for zero, got in zip(zero_points, outputs):
        np.testing.assert_array_equal(got, (x.astype(np.int64) - 128) @ (w.astype(np.int64) - (zero or 0)))


def test_weights_others_can_see_or_read_are_left_alone():
    x, w = saturating_case()
    # a weight that is also a graph input (a caller may feed int8 over it)
    model = integer_matmul(w)
    model.graph.input.append(helper.make_tensor_value_info("w", TensorProto.INT8, list(w.shape)))
    # a zero point shared with a node whose weight is computed in the graph: that group stays signed
    shared = _two_matmuls(w, (0, 0))
    shared.graph.node[1].input[3] = "wz0"
    shared.graph.node.insert(0, helper.make_node("Identity", ["w"], ["w_copy"]))
    shared.graph.node[2].input[1] = "w_copy"
    # a weight an If branch reads
    branch = integer_matmul(w)
    then = helper.make_graph([helper.make_node("Cast", ["w"], ["t"], to=TensorProto.FLOAT)], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, list(w.shape))])
    branch.graph.initializer.append(numpy_helper.from_array(np.array(True), "cond"))
    branch.graph.node.append(helper.make_node("If", ["cond"], ["picked"], then_branch=then, else_branch=then))
    branch.graph.output.append(helper.make_tensor_value_info("picked", TensorProto.FLOAT, list(w.shape)))
    for model in (model, shared, branch):
        before = model.SerializeToString()
        assert unsigned_weights(model) == 0
        assert model.SerializeToString() == before
        open_session(model, ort.SessionOptions(), CPU, exact=False)  # still loads
