"""The exporter's torch.onnx wrapper: the registry built once gives the very graph torch would."""
import pytest
import torch

from ortformer.config import preset
from ortformer.core.errors import ExportError
from ortformer.exporter import dynamo
from ortformer.exporter.export import DEFAULT_OPSET, _trace_to_onnx
from ortformer.models import build_encoder


def _tiny_model():
    torch.manual_seed(0)
    return build_encoder(preset("tiny")).eval()


def test_registry_cache_is_active_and_gives_the_graph_torch_builds(monkeypatch):
    assert dynamo._registry_class() is not None, "torch.onnx's registry moved: the cache is off"
    model = _tiny_model()
    cached = [_trace_to_onnx(model, DEFAULT_OPSET).SerializeToString() for _ in range(2)]
    assert dynamo._built, "no registry was cached"
    monkeypatch.setattr(dynamo, "_registry_class", lambda: None)  # torch's own path: one registry per call
    uncached = _trace_to_onnx(model, DEFAULT_OPSET).SerializeToString()
    assert cached[0] == cached[1] == uncached


def test_the_shared_registry_is_never_mutated_by_a_custom_table():
    _trace_to_onnx(_tiny_model(), DEFAULT_OPSET, fused_ops=True)  # registers the fused-attention translation
    cls = dynamo._registry_class()
    for base in dynamo._built.values():
        assert not any(d.is_custom for decomps in base.functions.values() for d in decomps)
    assert "from_torchlib" in cls.__dict__ and isinstance(cls.__dict__["from_torchlib"], classmethod)


def test_an_export_failure_is_typed_and_names_the_step():
    class Broken(torch.nn.Module):
        def forward(self, x):
            raise RuntimeError("no graph here")

    with pytest.raises(ExportError, match="(?s)stage one failed: .*no graph here"):
        dynamo.export_program(Broken(), (torch.ones(2, 3),), what="stage one")
