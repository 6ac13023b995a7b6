"""Check the optional chunk-stage payload of a model file (contract.META_CHUNKED).

The payload is JSON: {"format": 1, "chunk_size", "mode", "graphs": {stage: base64 ONNX},
"weights": {group: {graph input: [main-graph initializer, transposed]}}}. Checked before
anything runs, each failure a ModelFileError naming the file and the cause:
- the mode and the set of stages are the ones the config implies;
- every stage graph parses, uses standard ONNX ops only, and holds no weights nor external
  data (its weights are inputs, fed from the main graph);
- every weight input maps to a float32 initializer of the main graph whose shape, possibly
  transposed, is the input's declared shape; no weight input is left unmapped.
"""
from __future__ import annotations

import base64
import binascii
import json
import math
from pathlib import Path

from .. import contract
from ..config import EncoderConfig
from ..core.errors import ModelFileError
from .onnxfile import all_tensors

PAYLOAD_FORMAT = 1
MAX_CHUNK_SIZE = 65536
# a stage graph's own constants are index helpers and scalars; a weight would be far larger
MAX_STAGE_CONSTANT = 4096
DATA_INPUTS = {contract.INPUT_IDS, contract.INPUTS_EMBEDS, contract.TOKEN_TYPE_IDS, contract.ATTENTION_MASK,
               "start", "hidden", "total"}


def expected_stages(cfg: EncoderConfig) -> set[str]:
    if cfg.causal:
        return {"step"}
    return {"embed", "stats", "apply"} | ({"final"} if cfg.norm_position == "pre" else set())


def weight_groups(cfg: EncoderConfig) -> dict[str, str]:
    """group -> the stage graph whose inputs it feeds."""
    groups = {stage: stage for stage in expected_stages(cfg) - {"stats", "apply"}}
    if not cfg.causal:
        groups.update({f"layer.{l}": "apply" for l in range(cfg.num_layers)})
    return groups


def check_chunked(path: Path, text: str, graph, cfg: EncoderConfig) -> dict:
    """The parsed payload, checked against `cfg` and the main `graph`."""
    import onnx

    what = f"{path}: '{contract.META_CHUNKED}' metadata"
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ModelFileError(f"{what} is not valid JSON: {exc}") from None
    keys = {"format", "chunk_size", "mode", "graphs", "weights"}
    if not isinstance(data, dict) or set(data) != keys:
        raise ModelFileError(f"{what} must be a JSON object with keys {sorted(keys)}")
    if data["format"] != PAYLOAD_FORMAT:
        raise ModelFileError(f"{what}: format {data['format']!r} is not supported; this ortformer reads {PAYLOAD_FORMAT}")
    size = data["chunk_size"]
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_CHUNK_SIZE:
        raise ModelFileError(f"{what}: chunk_size={size!r} must be an int in [1, {MAX_CHUNK_SIZE}]")
    mode = "step" if cfg.causal else "two-pass"
    if data["mode"] != mode:
        raise ModelFileError(f"{what}: mode {data['mode']!r} does not fit the config (causal={cfg.causal}): expected {mode!r}")
    graphs = data["graphs"]
    if not isinstance(graphs, dict) or set(graphs) != expected_stages(cfg):
        raise ModelFileError(f"{what}: stages {sorted(graphs) if isinstance(graphs, dict) else graphs!r} "
                             f"are not the config's {sorted(expected_stages(cfg))}")
    inputs = {}
    for stage, blob in graphs.items():
        try:
            proto = onnx.load_from_string(base64.b64decode(blob, validate=True))
        except (binascii.Error, TypeError, ValueError, Exception) as exc:
            raise ModelFileError(f"{what}: stage {stage!r} is not a base64 ONNX model: {exc}") from None
        if not proto.graph.node or not proto.graph.output:
            raise ModelFileError(f"{what}: stage {stage!r} has no graph")
        foreign = sorted({n.domain for n in proto.graph.node if n.domain not in ("", "ai.onnx")})
        if foreign or proto.functions:
            raise ModelFileError(f"{what}: stage {stage!r} uses non-standard ops or functions ({foreign}); only ONNX ops are allowed")
        for tensor in all_tensors(proto):
            if tensor.data_location == onnx.TensorProto.EXTERNAL or math.prod(tensor.dims) > MAX_STAGE_CONSTANT:
                raise ModelFileError(f"{what}: stage {stage!r} holds tensor {tensor.name!r} {list(tensor.dims)}; "
                                     "stage graphs take their weights as inputs")
        inputs[stage] = {i.name: [d.dim_value if d.HasField("dim_value") else None for d in i.type.tensor_type.shape.dim]
                         for i in proto.graph.input}
    _check_weights(what, data["weights"], inputs, graph, cfg)
    return data


def _check_weights(what: str, weights, inputs: dict, graph, cfg: EncoderConfig) -> None:
    import onnx

    groups = weight_groups(cfg)
    if not isinstance(weights, dict) or set(weights) != set(groups):
        raise ModelFileError(f"{what}: weight groups {sorted(weights) if isinstance(weights, dict) else weights!r} "
                             f"are not the config's {sorted(groups)}")
    shapes = {t.name: list(t.dims) for t in graph.initializer if t.data_type == onnx.TensorProto.FLOAT}
    for group, entries in weights.items():
        stage_inputs = inputs[groups[group]]
        if not isinstance(entries, dict):
            raise ModelFileError(f"{what}: weight group {group!r} must be an object")
        needed = set(stage_inputs) - DATA_INPUTS - {n for n in stage_inputs if n.startswith("state_in.")}
        if group.startswith("layer."):
            needed |= set(inputs["stats"]) - DATA_INPUTS
        missing = sorted(needed - set(entries))
        if missing:
            raise ModelFileError(f"{what}: weight group {group!r} maps no initializer to {missing}")
        for name, target in entries.items():
            if (not isinstance(target, list) or len(target) != 2 or not isinstance(target[0], str)
                    or not isinstance(target[1], bool)):
                raise ModelFileError(f"{what}: weight {group}/{name} must be [initializer name, transposed]")
            if target[0] not in shapes:
                raise ModelFileError(f"{what}: weight {group}/{name} names {target[0]!r}, not a float32 initializer of the model")
            shape = shapes[target[0]][::-1] if target[1] else shapes[target[0]]
            declared = stage_inputs.get(name) or inputs["stats"].get(name)
            if declared is None or declared != shape:
                raise ModelFileError(f"{what}: weight {group}/{name} is {target[0]!r} of shape {shape}; "
                                     f"the stage declares {declared}")
