"""The linear family must never hold an N x N tensor; softmax unfused must (control).

Walks every intermediate tensor of the exported graph: each value is exposed as
a graph output (types from onnx shape inference) and the graph runs once, with
optimisations off, at a prime sequence length no other dimension shares.
"""
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from ortformer.config import preset
from ortformer.exporter import export

N = 37  # prime, and unlike hidden 32, head size 8, ffn 64, vocab 100, batch 2


def intermediate_shapes(path):
    model = onnx.shape_inference.infer_shapes(onnx.load(str(path)))
    typed = {v.name: v for v in model.graph.value_info}
    outputs = {o.name for o in model.graph.output}
    for node in model.graph.node:
        for name in node.output:
            if name and name not in outputs and name in typed:
                model.graph.output.append(typed[name])
                outputs.add(name)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feed = {"input_ids": np.ones((2, N), np.int64), "attention_mask": np.ones((2, N), np.int64),
            "token_type_ids": np.zeros((2, N), np.int64)}
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, (np.shape(v) for v in session.run(names, feed))))


def quadratic(shapes):
    return {name: s for name, s in shapes.items() if list(s).count(N) >= 2}


@pytest.mark.parametrize("attention", ["linear", "efficient", "cosine"])
def test_linear_family_never_materialises_n_by_n(attention, tmp_path):
    path = tmp_path / "m.onnx"
    export(preset("tiny", attention=attention), path, parity=False)
    shapes = intermediate_shapes(path)
    assert len(shapes) > 50  # the walk really saw the graph
    assert quadratic(shapes) == {}


def test_the_walk_detects_unfused_softmax_scores(tmp_path):
    path = tmp_path / "m.onnx"
    export(preset("tiny"), path, parity=False, fused_ops=False)
    assert any(s[-2:] == (N, N) for s in quadratic(intermediate_shapes(path)).values())


def test_fused_softmax_keeps_scores_inside_the_kernel(tokens_model):
    path = tokens_model  # the session's tiny model: exported with fused ops, as here
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert "MultiHeadAttention" in ops and "Softmax" not in ops
    assert quadratic(intermediate_shapes(path)) == {}
