"""Fused exports hand the QKV projection's bias to MultiHeadAttention's bias input (3A,) where nothing
sits between the projection and the attention (models/attention.projected_softmax_attention)."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from ortformer import contract
from ortformer.config import preset
from ortformer.contract.parity import Case, make_inputs
from ortformer.exporter import GraphOptions, export
from ortformer.models import build_encoder
from ortformer.models.attention import MultiHeadAttention

CFG = preset("tiny")  # BERT-like: biases, learned positions, softmax attention


def attention_nodes(proto: onnx.ModelProto) -> tuple[list, dict]:
    weights = {t.name: t for t in proto.graph.initializer}
    return [n for n in proto.graph.node if n.op_type == "MultiHeadAttention"], weights


def biased_model() -> torch.nn.Module:
    """CFG with distinct, non-zero q, k and v biases, so a bias on the wrong third shows."""
    model = build_encoder(CFG, seed=1)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, MultiHeadAttention):
                m.qkv.bias.copy_(torch.randn(m.qkv.bias.shape, generator=gen))
    return model


@pytest.mark.parametrize("padding", ["any", "right"])
def test_the_qkv_bias_is_the_attention_bias_input_and_equals_eager(padding, tmp_path):
    model = biased_model()
    path = tmp_path / "m.onnx"
    result = export(model, path, graph=GraphOptions(padding=padding))
    assert result.report["passed"]
    proto = onnx.load(str(path))
    nodes, weights = attention_nodes(proto)
    assert len(nodes) == CFG.num_layers
    for node in nodes:
        assert weights[node.input[3]].dims == [3 * CFG.hidden_size]  # [b_q | b_k | b_v]
    # no Add of a (3A,) bias left in the graph
    assert not [n for n in proto.graph.node if n.op_type == "Add" and any(
        i in weights and weights[i].dims == [3 * CFG.hidden_size] for i in n.input)]

    # against the unfused eager model (plain softmax, the bias inside nn.Linear), right-padded rows
    for m in model.modules():
        if isinstance(m, MultiHeadAttention):
            m.fused = False
    feeds = make_inputs(CFG, Case(3, 9, "right"), np.random.default_rng(4))
    with torch.no_grad():
        want = model(*(torch.from_numpy(feeds[name]) for name in contract.input_names(CFG)))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run([contract.LAST_HIDDEN_STATE], feeds)[0]
    kept = feeds[contract.ATTENTION_MASK].astype(bool)
    np.testing.assert_allclose(got[kept], want[contract.LAST_HIDDEN_STATE].numpy()[kept], atol=1e-4, rtol=0)


@pytest.mark.parametrize("overrides", [{"positions": "rotary"}, {"qk_norm": True}, {"num_kv_heads": 2}],
                         ids=["rotary", "qk-norm", "shared-kv"])
def test_the_bias_stays_an_add_where_something_sits_between(overrides, tmp_path):
    cfg = preset("tiny", **overrides)
    assert cfg.bias
    path = tmp_path / "m.onnx"
    assert export(build_encoder(cfg, seed=1), path).report["passed"]
    nodes, _ = attention_nodes(onnx.load(str(path)))
    assert nodes and all(len(n.input) < 4 or n.input[3] == "" for n in nodes)


def test_standard_op_exports_keep_the_linear_bias(tmp_path):
    path = tmp_path / "m.onnx"
    export(biased_model(), path, graph=GraphOptions(fused_ops=False), parity=False)
    proto = onnx.load(str(path))
    assert not attention_nodes(proto)[0]
    assert any(n.op_type == "Softmax" for n in proto.graph.node)
