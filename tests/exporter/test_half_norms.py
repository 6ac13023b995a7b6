"""float16 exports write each LayerNorm as one float16 LayerNormalization with float32 statistics
(stash_type=1), not Cast -> float32 LayerNormalization -> Cast (models/layers.half_layer_norm), and each
RMSNorm as one float16 SimplifiedLayerNormalization (models/layers.half_rms_norm)."""
from __future__ import annotations

import onnx
import pytest
import torch

from ortformer.config import preset
from ortformer.exporter import GraphOptions, export
from ortformer.models import build_encoder
from ortformer.models.layers import LayerNorm32, RMSNorm, half_layer_norm, half_rms_norm

CFG = preset("tiny")
# Qwen3-like: RMSNorms before each sublayer, per-head q / k RMSNorms, no biases
RMS_CFG = preset("tiny", attention="softmax", positions="rotary", ffn_gated=True, activation="silu", bias=False,
                 norm="rmsnorm", norm_position="pre", qk_norm=True, num_kv_heads=2)


def norms(proto: onnx.ModelProto, op_type: str = "LayerNormalization") -> tuple[list, dict, dict]:
    inferred = onnx.shape_inference.infer_shapes(proto)
    types = {v.name: v.type.tensor_type.elem_type for v in [*inferred.graph.value_info, *inferred.graph.input]}
    producers = {out: node for node in proto.graph.node for out in node.output}
    return [n for n in proto.graph.node if n.op_type == op_type], types, producers


def rms_model() -> torch.nn.Module:
    """RMS_CFG with scales away from 1 (Gemma's stored 1 + w among them), so the gate sees the weight."""
    model = build_encoder(RMS_CFG, seed=1)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, RMSNorm):
                m.weight.copy_(1 + 0.5 * torch.randn(m.weight.shape, generator=gen))
    return model


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


@pytest.fixture(scope="module")
def half_rms(tmp_path_factory):
    path = tmp_path_factory.mktemp("half_rms") / "model.onnx"
    result = export(rms_model(), path, graph=GraphOptions(dtype="float16"))
    return onnx.load(str(path)), result.report


def test_every_rms_norm_is_one_float16_node_without_casts(half_rms):
    """The float16 gate against eager PyTorch passed on the CPU provider (onnxruntime's CPU kernel
    takes float16), and onnx.checker accepts the ONNX-domain node."""
    proto, report = half_rms
    assert report["passed"] and report["dtype"] == "float16"
    onnx.checker.check_model(proto, full_check=True)
    nodes, types, producers = norms(proto, "SimplifiedLayerNormalization")
    model_norms = sum(isinstance(m, RMSNorm) for m in build_encoder(RMS_CFG).modules())
    assert model_norms > 3 and len(nodes) == model_norms  # the q / k norms too
    assert not norms(proto)[0]
    for node in nodes:
        assert node.domain == ""  # where onnxruntime registers its kernels
        assert types[node.input[0]] == types[node.output[0]] == onnx.TensorProto.FLOAT16
        assert producers[node.input[0]].op_type != "Cast"
        assert {a.name: a.i for a in node.attribute}["stash_type"] == 1
    outputs = {o.name for o in proto.graph.output}
    casts = [n for n in proto.graph.node if n.op_type == "Cast" and producers.get(n.input[0]) in nodes]
    assert all(set(n.output) <= outputs for n in casts), [n.output for n in casts]


@pytest.mark.parametrize("graph", [GraphOptions(dtype="float16", fused_ops=False), GraphOptions()],
                         ids=["float16-standard-ops", "float32"])
def test_other_exports_keep_their_rms_norms(graph, tmp_path):
    """float32 graphs and standard-op float16 graphs write no SimplifiedLayerNormalization."""
    path = tmp_path / "m.onnx"
    export(rms_model(), path, graph=graph, parity=False)
    proto = onnx.load(str(path))
    assert not norms(proto, "SimplifiedLayerNormalization")[0]
    assert any(n.op_type == "ReduceMean" for n in proto.graph.node)  # the norm as plain ops
    assert not any(getattr(m, "fused", False) for m in rms_model().modules() if isinstance(m, RMSNorm))


def test_half_rms_norm_is_the_eager_float16_rms_norm():
    x = (torch.randn(2, 5, 32) * 30).half()
    norm = RMSNorm(32, 1e-6).half()
    with torch.no_grad():
        norm.weight.copy_(1 + torch.randn(32))
    want = norm(x)  # unfused: float32 between casts
    assert want.dtype == torch.float16
    assert torch.equal(half_rms_norm(x, norm.weight, 1e-6), want)
