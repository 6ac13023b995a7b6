"""Walking an ONNX model's tensors (onnx only: no onnxruntime, no torch)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:  # imported where used: the runtime imports this module before it needs onnx
    import onnx


def external_locations(model: onnx.ModelProto) -> set[str]:
    """The `location` of every external-data entry in the model, as written (unchecked)."""
    import onnx

    return {entry.value for tensor in all_tensors(model) if tensor.data_location == onnx.TensorProto.EXTERNAL
            for entry in tensor.external_data if entry.key == "location"}


def all_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every TensorProto that may hold data: initializers and tensor attributes, subgraphs and functions included."""

    def graph_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
        yield from graph.initializer
        for sparse in graph.sparse_initializer:
            yield sparse.values
            yield sparse.indices
        yield from node_tensors(graph.node)

    def node_tensors(nodes) -> Iterator[onnx.TensorProto]:
        for node in nodes:
            for attr in node.attribute:
                if attr.HasField("t"):
                    yield attr.t
                yield from attr.tensors
                if attr.HasField("g"):
                    yield from graph_tensors(attr.g)
                for sub in attr.graphs:
                    yield from graph_tensors(sub)

    yield from graph_tensors(model.graph)
    for function in model.functions:
        yield from node_tensors(function.node)
