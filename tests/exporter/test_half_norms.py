"""float16 exports write each LayerNorm as one float16 LayerNormalization with float32 statistics
(stash_type=1), not Cast -> float32 LayerNormalization -> Cast (models/layers.half_layer_norm)."""
from __future__ import annotations

import onnx
import pytest
import torch

from ortformer.config import preset
from ortformer.exporter import GraphOptions, export
from ortformer.models import build_encoder
from ortformer.models.layers import LayerNorm32, half_layer_norm

CFG = preset("tiny")


def norms(proto: onnx.ModelProto) -> tuple[list, dict, dict]:
    inferred = onnx.shape_inference.infer_shapes(proto)
    types = {v.name: v.type.tensor_type.elem_type for v in [*inferred.graph.value_info, *inferred.graph.input]}
    producers = {out: node for node in proto.graph.node for out in node.output}
    return [n for n in proto.graph.node if n.op_type == "LayerNormalization"], types, producers


@pytest.fixture(scope="module")
def half(tmp_path_factory):
    path = tmp_path_factory.mktemp("half") / "model.onnx"
    result = export(build_encoder(CFG, seed=1), path, graph=GraphOptions(dtype="float16"))
    return onnx.load(str(path)), result.report


def test_every_layer_norm_is_one_float16_node_without_casts(half):
    proto, report = half
    assert report["passed"] and report["dtype"] == "float16"
    nodes, types, producers = norms(proto)
    model_norms = sum(isinstance(m, LayerNorm32) for m in build_encoder(CFG).modules())
    assert len(nodes) == model_norms
    for node in nodes:
        assert types[node.input[0]] == onnx.TensorProto.FLOAT16
        assert producers[node.input[0]].op_type != "Cast"  # no Cast pair around the norm
        assert {a.name: a.i for a in node.attribute}.get("stash_type", 1) == 1  # float32 statistics
    # after a norm, a Cast only where the contract wants float32 (the last norm's last_hidden_state)
    outputs = {o.name for o in proto.graph.output}
    casts = [n for n in proto.graph.node if n.op_type == "Cast" and producers.get(n.input[0]) in nodes]
    assert all(set(n.output) <= outputs for n in casts), [n.output for n in casts]


def test_float32_and_standard_op_exports_keep_their_norms(tmp_path):
    """fused_ops=False (standard ONNX for other runtimes) keeps the float32 norm between Casts."""
    path = tmp_path / "plain.onnx"
    export(build_encoder(CFG, seed=1), path, graph=GraphOptions(dtype="float16", fused_ops=False), parity=False)
    nodes, types, producers = norms(onnx.load(str(path)))
    assert nodes and all(types[n.input[0]] == onnx.TensorProto.FLOAT for n in nodes)
    assert not any(getattr(m, "fused", False) for m in build_encoder(CFG).modules() if isinstance(m, LayerNorm32))


def test_half_layer_norm_is_float32_layer_norm_rounded_once():
    x = (torch.randn(2, 5, 32) * 30).half()
    w, b = torch.randn(32).half(), torch.randn(32).half()
    want = torch.nn.functional.layer_norm(x.float(), (32,), w.float(), b.float(), 1e-5).half()
    assert torch.equal(half_layer_norm(x, w, b, 1e-5), want)
