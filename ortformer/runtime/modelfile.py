"""Read an ortformer ONNX file and check it before onnxruntime ever opens it.

What is checked, in order, each failure a ModelFileError that names the file and the cause:
1. the file parses as ONNX (not other bytes, not truncated) and has a graph and opsets;
2. it carries ortformer metadata of a format this runtime reads, a valid config,
   a JSON parity report, a version and a source;
3. the graph's inputs and outputs are the contract's for that config (ortformer.contract);
4. every external-data location stays inside the model's folder and its file holds
   the bytes the tensor claims (offset + length <= file size).

Step 4 matters because onnxruntime follows `location` wherever it points: a model
downloaded from elsewhere could otherwise make the runtime read /etc/... or
../../secret as weights. Symlinks are resolved before the containment check.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Iterator

import onnx

from .. import contract
from ..config import EncoderConfig
from ..errors import ConfigError, ModelFileError

# graph element types the contract allows per input; inputs_embeds may be float16 in a
# half-precision export, so the runtime casts to whatever the graph declares
_ALLOWED_INPUT_TYPES = {
    contract.INPUT_IDS: ("int64",),
    contract.ATTENTION_MASK: ("int64",),
    contract.TOKEN_TYPE_IDS: ("int64",),
    contract.INPUTS_EMBEDS: ("float32", "float16"),
}


@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output: element type name and shape, symbolic axes as str."""

    name: str
    dtype: str
    shape: tuple

    def to_dict(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


@dataclass(frozen=True)
class ModelFile:
    """Everything the runtime needs from an ortformer ONNX file, validated."""

    path: Path
    config: EncoderConfig
    metadata: dict[str, str]
    parity: dict
    source: str
    version: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    external_files: tuple[Path, ...]  # resolved side files holding weights (may be empty)


def read_model_file(path: str | os.PathLike) -> ModelFile:
    """Parse and validate `path`; raise ModelFileError saying what is wrong."""
    path = Path(path)
    model = _load_proto(path)
    metadata = {p.key: p.value for p in model.metadata_props}
    config, parity = _check_metadata(path, metadata)
    inputs, outputs = _check_graph_io(path, model.graph, config)
    external = _check_external_data(path, model)
    return ModelFile(
        path=path, config=config, metadata=metadata, parity=parity,
        source=metadata[contract.META_SOURCE], version=metadata[contract.META_VERSION],
        inputs=inputs, outputs=outputs, external_files=external,
    )


def _load_proto(path: Path) -> onnx.ModelProto:
    if not path.is_file():
        raise ModelFileError(f"{path}: no such model file" + (" (it is a folder)" if path.is_dir() else ""))
    try:
        # weights stay on disk: we only need metadata, graph signature and data locations
        model = onnx.load(str(path), load_external_data=False)
    except OSError as exc:
        raise ModelFileError(f"{path}: cannot read the file: {exc.strerror or exc}") from None
    except Exception as exc:  # protobuf raises DecodeError, RuntimeError, ... depending on the damage
        raise ModelFileError(f"{path}: not a readable ONNX file (corrupt, truncated or another format): {exc}") from None
    # a protobuf parse succeeds on many byte strings (b"" is a valid empty ModelProto), and a
    # file cut between fields parses too; a real model always has a graph and an opset
    if not model.opset_import or not model.graph.node or not model.graph.output:
        raise ModelFileError(
            f"{path}: not a complete ONNX model (no graph or no opset_import): "
            "the file is truncated or not ONNX"
        )
    return model


def _check_metadata(path: Path, metadata: dict[str, str]) -> tuple[EncoderConfig, dict]:
    if contract.META_FORMAT not in metadata:
        raise ModelFileError(
            f"{path}: not an ortformer model: the ONNX file has no '{contract.META_FORMAT}' metadata "
            "(a foreign ONNX file, or one cut short; write models with `ortformer export`)"
        )
    found = metadata[contract.META_FORMAT]
    if found != contract.FORMAT:
        raise ModelFileError(
            f"{path}: ortformer model format {found!r} is not supported; this ortformer reads "
            f"format {contract.FORMAT!r} (re-export the model or upgrade ortformer)"
        )
    missing = [key for key in contract.REQUIRED_META if key not in metadata]
    if missing:
        raise ModelFileError(f"{path}: ortformer metadata key(s) {missing} are missing; required: {list(contract.REQUIRED_META)}")
    try:
        config = EncoderConfig.from_json(metadata[contract.META_CONFIG])
    except ConfigError as exc:
        raise ModelFileError(f"{path}: bad '{contract.META_CONFIG}' metadata: {exc}") from None
    try:
        parity = json.loads(metadata[contract.META_PARITY])
    except ValueError as exc:
        raise ModelFileError(f"{path}: '{contract.META_PARITY}' metadata is not valid JSON: {exc}") from None
    if not isinstance(parity, dict):
        raise ModelFileError(f"{path}: '{contract.META_PARITY}' metadata must be a JSON object, got {type(parity).__name__}")
    return config, parity


def _spec(value: onnx.ValueInfoProto) -> TensorSpec:
    tensor = value.type.tensor_type
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name if tensor.elem_type else "undefined"
    shape = tuple(d.dim_param if d.HasField("dim_param") else (d.dim_value if d.HasField("dim_value") else "?") for d in tensor.shape.dim)
    return TensorSpec(value.name, dtype, shape)


def _check_graph_io(path: Path, graph: onnx.GraphProto, cfg: EncoderConfig):
    # IR < 4 lists initializers among the inputs; they are weights, not inputs
    weights = {t.name for t in graph.initializer}
    inputs = tuple(_spec(v) for v in graph.input if v.name not in weights)
    outputs = tuple(_spec(v) for v in graph.output)
    for kind, got, want in (("inputs", inputs, contract.input_names(cfg)), ("outputs", outputs, contract.output_names(cfg))):
        names = [s.name for s in got]
        if sorted(names) != sorted(want):
            raise ModelFileError(f"{path}: graph {kind} {names} do not match the ortformer contract for its config: expected {want}")
    for spec in inputs:
        if spec.dtype not in _ALLOWED_INPUT_TYPES[spec.name]:
            raise ModelFileError(f"{path}: graph input {spec.name} has type {spec.dtype}; the contract allows {list(_ALLOWED_INPUT_TYPES[spec.name])}")
    return inputs, outputs


def _tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
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


def _check_external_data(path: Path, model: onnx.ModelProto) -> tuple[Path, ...]:
    folder = path.absolute().parent
    files: dict[Path, None] = {}  # ordered set
    for tensor in _tensors(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {entry.key: entry.value for entry in tensor.external_data}
        what = f"external data of tensor {tensor.name!r}"
        if not info.get("location"):
            raise ModelFileError(f"{path}: {what} has no 'location'")
        target = resolve_inside(folder, info["location"], f"{path}: {what}")
        try:
            offset, length = int(info.get("offset", 0)), int(info.get("length", -1))
        except ValueError:
            raise ModelFileError(f"{path}: {what} has a non-integer offset or length: {info}") from None
        size = target.stat().st_size
        if offset < 0 or offset > size or (length >= 0 and offset + length > size):
            raise ModelFileError(
                f"{path}: {what} wants bytes [{offset}, {offset + max(length, 0)}) of {info['location']!r}, "
                f"which holds {size} bytes: the data file is truncated or belongs to another model"
            )
        files[target] = None
    return tuple(files)


def resolve_inside(folder: Path, name: str, what: str) -> Path:
    """The existing file `name` relative to `folder`, refusing anything that leaves it.

    Refused: absolute paths (POSIX or Windows spelling), any `..` component, and names
    whose resolved path (symlinks followed) is outside the resolved folder.
    """
    valid = "a plain file name or relative path inside the model's folder"
    if PurePosixPath(name).is_absolute() or PureWindowsPath(name).is_absolute() or PureWindowsPath(name).drive:
        raise ModelFileError(f"{what}: location {name!r} is an absolute path; only {valid} is allowed")
    if ".." in PureWindowsPath(name).parts:  # Windows parsing splits on both / and \
        raise ModelFileError(f"{what}: location {name!r} contains '..'; only {valid} is allowed")
    root = folder.resolve()
    target = (folder / name).resolve()
    if not target.is_relative_to(root):
        raise ModelFileError(f"{what}: location {name!r} resolves to {target}, outside the model's folder {root} (symlink?)")
    if not target.is_file():
        raise ModelFileError(f"{what}: file {name!r} is missing from the model's folder {root}")
    return target


def tokenizer_path(model: ModelFile) -> Path | None:
    """The tokenizer file named by the optional `ortformer.tokenizer` metadata, checked
    to lie inside the model's folder like external data; None when the key is absent."""
    name = model.metadata.get(contract.META_TOKENIZER)
    if not name:
        return None
    return resolve_inside(model.path.absolute().parent, name, f"{model.path}: '{contract.META_TOKENIZER}' metadata")
