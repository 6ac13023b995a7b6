"""Export the chunk stages of a linear-family model into the model file's metadata.

The stage graphs (models/chunk_stages.py) hold no weights: each weight is a graph input
that the runtime feeds from an initializer of the main graph, named in a map. The
exporter finds that initializer by its bytes (the main graph may store a Linear weight
transposed, so either orientation is matched) and refuses a map it cannot complete.
The payload is one JSON metadata entry (contract.META_CHUNKED):

  {"format": 1, "chunk_size": 8192, "mode": "two-pass" | "step",
   "graphs": {stage: base64 ONNX model bytes},
   "weights": {stage or "layer.<l>": {graph input: [initializer, transposed]}}}
"""
from __future__ import annotations

import base64
import hashlib
import json

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from .. import contract
from ..core.errors import ExportError
from ..models import chunk_stages
from .dynamo import export_program
from ..models.encoder import Encoder
from ..models.linear_forms import state_width

PAYLOAD_FORMAT = 1
DEFAULT_CHUNK_SIZE = 8192
EXAMPLE_CHUNK = 7  # the traced chunk length: >= 2 (0 and 1 specialise) and not a block multiple


def _example(cfg, n: int, rng: np.random.Generator):
    b = 2
    if cfg.takes_ids:
        inputs = torch.from_numpy(rng.integers(0, cfg.vocab_size, (b, n), dtype=np.int64))
    else:
        inputs = torch.from_numpy(rng.standard_normal((b, n, cfg.hidden_size)).astype(np.float32))
    mask = torch.ones(b, n, dtype=torch.int64)
    types = torch.zeros(b, n, dtype=torch.int64) if cfg.type_vocab_size else None
    return inputs, mask, types


def _stage_specs(model: Encoder):
    """(stage, template, tensors, input names, output names, dynamic dims) per stage graph."""
    cfg = model.config
    rng = np.random.default_rng(0)
    n = EXAMPLE_CHUNK
    inputs, mask, types = _example(cfg, n, rng)
    main = contract.input_names(cfg)[0]
    start = torch.tensor(3, dtype=torch.int64)
    batch, chunk = torch.export.Dim("batch", min=1), torch.export.Dim("chunk", min=1)
    bc = {0: batch, 1: chunk}
    front = [inputs] + ([types] if types is not None else [])
    front_names = [main] + ([contract.TOKEN_TYPE_IDS] if types is not None else [])
    x = torch.randn(2, n, cfg.hidden_size)
    dk, dv = state_width(cfg.attention, cfg.head_size)
    total = torch.randn(2, cfg.num_heads, dk, dv).abs()
    if cfg.causal:
        states = [torch.zeros(2, cfg.num_heads, dk, dv) for _ in range(cfg.num_layers)]
        state_in = [f"state_in.{i}" for i in range(cfg.num_layers)]
        state_out = [f"state_out.{i}" for i in range(cfg.num_layers)]
        tensors = [inputs, mask] + ([types] if types is not None else []) + [start] + states
        names = [main, contract.ATTENTION_MASK] + front_names[1:] + ["start"] + state_in
        dims = [bc, bc] + ([bc] if types is not None else []) + [None] + [{0: batch}] * len(states)
        return [("step", model, tensors, names, ["hidden"] + state_out, dims)]
    block = model.blocks[0]
    stats_out = ["max", "sums"] if cfg.attention == "efficient" else ["sums"]
    total_in = torch.randn(2, cfg.num_heads, cfg.head_size, cfg.head_size) if cfg.attention == "efficient" else total
    specs = [
        ("embed", model, front + [start], front_names + ["start"], ["hidden"], [bc] * len(front) + [None]),
        ("stats", block, [x, mask], ["hidden", contract.ATTENTION_MASK], stats_out, [bc, bc]),
        ("apply", block, [x, total_in], ["hidden", "total"], ["hidden_out"], [bc, {0: batch}]),
    ]
    if cfg.norm_position == "pre":
        specs.append(("final", model, [x], ["hidden"], ["hidden_out"], [bc]))
    return specs


def _export_stage(stage, template, tensors, names, outputs, dims, opset: int) -> onnx.ModelProto:
    weight_names = chunk_stages.stage_weights(stage, template)
    params = dict(template.named_parameters())
    module = chunk_stages.Stage(stage, template, weight_names, len(tensors))
    args = tuple(tensors) + tuple(params[n].detach() for n in weight_names)
    dynamic = (tuple(dims) + (None,) * len(weight_names),)  # one entry: forward takes *args
    proto = export_program(
        module, args, what=f"exporting the {stage!r} chunk stage", input_names=list(names) + weight_names,
        output_names=list(outputs), opset_version=opset, dynamic_shapes=dynamic, external_data=False,
    )
    if len(proto.graph.initializer) and any(t.dims and np.prod(t.dims) > 4096 for t in proto.graph.initializer):
        raise ExportError(f"the {stage!r} chunk stage captured a weight as a constant; every weight must be an input")
    proto.ir_version = min(proto.ir_version, 10)
    return proto


def _digest(array: np.ndarray) -> str:
    a = np.ascontiguousarray(array)
    return hashlib.sha256(f"{a.dtype}{a.shape}".encode() + a.tobytes()).hexdigest()


def _initializer_index(main: onnx.ModelProto) -> dict[str, str]:
    """digest of each float32 initializer's bytes -> its name (the first of equal ones)."""
    index: dict[str, str] = {}
    for tensor in main.graph.initializer:
        if tensor.data_type == onnx.TensorProto.FLOAT and tensor.dims:
            index.setdefault(_digest(numpy_helper.to_array(tensor)), tensor.name)
    return index


def _weight_map(template, names: list[str], prefix: str, index: dict[str, str], stage: str) -> dict:
    params = dict(template.named_parameters())
    found = {}
    for name in names:
        w = params[name].detach().float().numpy()
        for transposed, candidate in ((False, w), (True, w.T)):
            hit = index.get(_digest(candidate))
            if hit is not None:
                found[name] = [hit, transposed]
                break
        else:
            raise ExportError(f"chunk stage {stage!r}: the main graph holds no initializer equal to {prefix}{name}")
    return found


def chunked_payload(model: Encoder, main: onnx.ModelProto, opset: int) -> str | None:
    """The contract.META_CHUNKED JSON for `model`, or None when its config cannot run in chunks."""
    cfg = model.config
    if chunk_stages.chunkable(cfg) is not None:
        return None
    index = _initializer_index(main)
    graphs, weights = {}, {}
    for stage, template, tensors, names, outputs, dims in _stage_specs(model):
        proto = _export_stage(stage, template, tensors, names, outputs, dims, opset)
        graphs[stage] = base64.b64encode(proto.SerializeToString()).decode("ascii")
        used = {i.name for i in proto.graph.input}
        wanted = [n for n in chunk_stages.stage_weights(stage, template) if n in used]
        if stage in ("stats", "apply"):
            for layer, block in enumerate(model.blocks):
                per_layer = weights.setdefault(f"layer.{layer}", {})
                per_layer.update(_weight_map(block, wanted, f"blocks.{layer}.", index, stage))
        else:
            weights[stage] = _weight_map(template, wanted, "", index, stage)
    return json.dumps({
        "format": PAYLOAD_FORMAT, "chunk_size": DEFAULT_CHUNK_SIZE,
        "mode": "step" if cfg.causal else "two-pass", "graphs": graphs, "weights": weights,
    }, sort_keys=True)


# the gate's chunked cases run with chunks this small, so every case spans several chunks
GATE_CHUNK_SIZE = 16


def chunked_cases(cfg):
    """Grid cases longer than one chunk: right, left and random padding with an empty row."""
    from ..contract.parity import Case

    n = min(cfg.max_positions, 3 * GATE_CHUNK_SIZE + 5)
    if n <= GATE_CHUNK_SIZE:
        return []
    return [Case(1, n, "none"), Case(2, n, "right"), Case(2, n, "left"), Case(3, n, "random+empty")]


def chunked_gate(path, eager, cfg, dtype: str = "float32", seed: int = 0) -> dict:
    """The chunked path (runtime/chunked.py) against eager PyTorch on cases longer than a chunk."""
    from ..contract import parity
    from ..runtime import Runtime

    runtime = Runtime(path, provider="cpu", chunk_size=GATE_CHUNK_SIZE)
    rng = np.random.default_rng(seed + 1)
    gate = parity.GATES[dtype]
    cases, passed = [], True
    for case in chunked_cases(cfg):
        inputs = parity.make_inputs(cfg, case, rng)
        got = runtime.run(**inputs)
        want = eager(inputs)
        outputs = {}
        for name in contract.output_names(cfg):
            m = parity.compare(name, got[name], want[name], inputs[contract.ATTENTION_MASK])
            m["passed"] = parity.passes(m, gate)
            passed = passed and m["passed"]
            outputs[name] = m
        cases.append({"batch": case.batch, "sequence": case.sequence, "padding": case.padding, "outputs": outputs})
    return {"chunk_size": GATE_CHUNK_SIZE, "cases": cases, "passed": passed}
