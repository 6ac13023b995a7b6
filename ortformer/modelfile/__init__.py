"""Read an ortformer ONNX file and check it before onnxruntime ever opens it.

The one reader of the file format (onnx only: no torch, no onnxruntime). The runtime,
the exporter's check step and the Triton writer all read models through it, so the
checks below, path containment included, hold on every path into a model file.

What is checked, in order, each failure a ModelFileError that names the file and the cause:
1. the file parses as ONNX (not other bytes, not truncated) and has a graph and opsets;
2. it carries ortformer metadata of a format this runtime reads, a valid config,
   a JSON parity report, a version and a source;
3. the graph's inputs and outputs are the contract's for that config (ortformer.contract; a file
   written before an optional output, contract.OPTIONAL_OUTPUTS, may lack it);
4. every tensor holds the bytes its dims and type declare (inline or external);
   every external-data location stays inside the model's folder and its file holds
   the bytes the tensor claims (offset + length <= file size);
5. the tokenizer named in the metadata, if any, is not spelt to leave the model's folder (one
   that is missing, or resolves outside the folder, takes text input away, not the model:
   Runtime serves ids and says why texts fail);
6. the chunk-stage payload, if any, fits the config and the graph (chunkfile.py).

Step 4 matters because onnxruntime follows `location` wherever it points: a model
downloaded from elsewhere could otherwise make the runtime read /etc/... or
../../secret as weights. Symlinks are resolved before the containment check (the folder
the model file itself resolves into counts as inside: a Hugging Face cache's blobs/), and a
weight file with more than one hard link is refused (see resolve_inside).
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .. import contract
from ..core.checks import json_object
from ..contract.late import LateInteraction
from ..contract.rerank_template import RerankTemplate
from .onnxfile import all_tensors, check_location_name, resolve_inside  # noqa: F401  (resolve_inside: this module's API)
from ..config import SPLADE_POOLINGS, EncoderConfig
from ..core.errors import ConfigError, ModelFileError
from .chunkfile import check_chunked

if TYPE_CHECKING:
    import onnx
# onnx itself is imported where a file is read: it takes about a third of the runtime's
# import time (protobuf and its helpers), and an app that imports ortformer.runtime
# should not pay for it before it opens a model

# graph element types the contract allows per input; inputs_embeds may be float16 in a
# half-precision export, so the runtime casts to whatever the graph declares
_ALLOWED_INPUT_TYPES = {
    contract.INPUT_IDS: ("int64",),
    contract.ATTENTION_MASK: ("int64",),
    contract.TOKEN_TYPE_IDS: ("int64",),
    contract.TASK_ID: ("int64",),
    contract.INPUTS_EMBEDS: ("float32", "float16"),
}
# outputs are float32 in every precision (float16 models cast back); float16 is read too,
# as a half-precision graph a caller may have edited by hand still serves
_ALLOWED_OUTPUT_TYPES = ("float32", "float16")


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
    # {location as written in the graph: resolved file}, for writers that copy the model
    external_data: dict[str, Path] = field(default_factory=dict)
    ir_version: int = 0
    opsets: tuple[tuple[str, int], ...] = ()  # (domain, version); "" is the ONNX domain
    chunked: dict | None = None  # the checked chunk-stage payload (contract.META_CHUNKED), if any

    @property
    def text_max_length(self) -> int:
        """Default truncation for text: the metadata's text_max_length, else max_sequence."""
        value = self.metadata.get(contract.META_TEXT_MAX_LENGTH)  # digits in range, checked on read
        return int(value) if value is not None else self.config.max_sequence

    @property
    def text_lowercase(self) -> bool:
        """True when texts are lowercased before tokenizing (sentence-transformers' do_lower_case)."""
        return self.metadata.get(contract.META_TEXT_LOWERCASE) == "true"  # "true" / "false", checked on read

    @property
    def right_padding(self) -> bool:
        """True when the attention takes key lengths, so rows must be right-padded (contract.META_PADDING)."""
        return self.metadata.get(contract.META_PADDING) == "right"  # "right" or absent, checked on read

    @property
    def labels(self) -> list[str]:
        """The classifier's label names by id (checked on read); LABEL_i when none are recorded, and none
        for a SPLADE model's masked-LM head, whose logits are the vocabulary (a token id, not a label)."""
        if contract.META_LABELS in self.metadata:
            return contract.parse_labels(self.metadata[contract.META_LABELS])
        if self.config.pooling in SPLADE_POOLINGS:
            return []
        return [f"LABEL_{i}" for i in range(self.config.num_labels)]

    @property
    def rerank(self) -> RerankTemplate | None:
        """An LLM reranker's prompt template (contract.META_RERANK, checked on read), or None."""
        text = self.metadata.get(contract.META_RERANK)
        return RerankTemplate.from_json(text) if text is not None else None

    @property
    def late(self) -> LateInteraction | None:
        """How texts become late-interaction vectors (contract.META_LATE, checked on read), or None."""
        text = self.metadata.get(contract.META_LATE)
        return LateInteraction.from_json(text) if text is not None else None


def read_model_file(path: str | os.PathLike) -> ModelFile:
    """Parse and validate `path`; raise ModelFileError saying what is wrong."""
    path = Path(path)
    model = _load_proto(path)
    try:
        metadata = {p.key: p.value for p in model.metadata_props}
        config, parity = _check_metadata(path, metadata)
        inputs, outputs = check_graph_io(path, model.graph, config)
        _check_text(path, model.graph)
        _check_tables(path, model.graph, config)
        external = _check_external_data(path, model)
        opsets = tuple((o.domain, o.version) for o in model.opset_import)
        if metadata.get(contract.META_TOKENIZER):  # refused here, before onnxruntime opens the model
            # a name spelt to leave the folder marks a hostile or broken file; a tokenizer that is not
            # there (the .onnx copied alone) or not readable where it is (a symlink out of the folder)
            # only takes text input away: Runtime says so (tokenizer_path)
            check_location_name(metadata[contract.META_TOKENIZER], f"{path}: '{contract.META_TOKENIZER}' metadata")
        chunked = (check_chunked(path, metadata[contract.META_CHUNKED], model.graph, config)
                   if contract.META_CHUNKED in metadata else None)
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, OverflowError, RecursionError) as exc:
        # damage that parses: e.g. a string field holding invalid UTF-8 comes back as bytes
        raise ModelFileError(f"{path}: malformed ONNX content ({type(exc).__name__}: {exc}); the file is corrupt") from None
    return ModelFile(
        path=path, config=config, metadata=metadata, parity=parity,
        source=metadata[contract.META_SOURCE], version=metadata[contract.META_VERSION],
        inputs=inputs, outputs=outputs, external_files=tuple(dict.fromkeys(external.values())),
        external_data=external, ir_version=model.ir_version, opsets=opsets, chunked=chunked,
    )


def _load_proto(path: Path) -> onnx.ModelProto:
    import onnx

    if not path.is_file():
        raise ModelFileError(f"{path}: no such model file" + (" (it is a folder)" if path.is_dir() else ""))
    try:
        # weights stay on disk: we only need metadata, graph signature and data locations; binary
        # protobuf always, as onnxruntime reads it (onnx.load would pick a text parser for *.json)
        model = onnx.load(str(path), format="protobuf", load_external_data=False)
    except OSError as exc:
        raise ModelFileError(f"{path}: cannot read the file: {exc.strerror or exc}") from None
    except Exception as exc:  # protobuf raises DecodeError, RuntimeError, ... depending on the damage
        reason = str(exc) if len(str(exc)) <= 200 else str(exc)[:200] + "..."  # a parser may quote the whole file
        raise ModelFileError(f"{path}: not a readable ONNX file (corrupt, truncated or another format): {reason}") from None
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
    except (ConfigError, RecursionError) as exc:  # RecursionError: JSON nested thousands deep
        raise ModelFileError(f"{path}: bad '{contract.META_CONFIG}' metadata: {exc}") from None
    parity = json_object(metadata[contract.META_PARITY], f"{path}: '{contract.META_PARITY}' metadata", ModelFileError)
    _check_text_max_length(path, metadata.get(contract.META_TEXT_MAX_LENGTH), config)
    if metadata.get(contract.META_TEXT_LOWERCASE, "false") not in ("true", "false"):
        raise ModelFileError(f"{path}: '{contract.META_TEXT_LOWERCASE}' metadata is "
                             f"{metadata[contract.META_TEXT_LOWERCASE]!r}; valid: 'true' or 'false'")
    if contract.META_LABELS in metadata:
        try:
            labels = contract.parse_labels(metadata[contract.META_LABELS])
        except ValueError as exc:
            raise ModelFileError(f"{path}: bad '{contract.META_LABELS}' metadata: {exc}") from None
        if len(labels) != config.num_labels:
            raise ModelFileError(f"{path}: '{contract.META_LABELS}' names {len(labels)} label(s) but the config "
                                 f"has classifier.labels={config.num_labels}")
    if contract.META_PROMPTS in metadata:
        try:
            contract.parse_prompts(metadata[contract.META_PROMPTS])
        except ValueError as exc:
            raise ModelFileError(f"{path}: bad '{contract.META_PROMPTS}' metadata: {exc}") from None
    if metadata.get(contract.META_PADDING, "right") != "right":
        raise ModelFileError(f"{path}: '{contract.META_PADDING}' metadata is {metadata[contract.META_PADDING]!r}; "
                             "valid: 'right' (or no key: any padding)")
    if contract.META_INT8 in metadata:
        _check_int8(path, metadata[contract.META_INT8])
    if contract.META_LATE in metadata:
        _check_late(path, metadata[contract.META_LATE], config)
    if contract.META_RERANK in metadata:
        try:
            RerankTemplate.from_json(metadata[contract.META_RERANK])
        except (TypeError, ValueError) as exc:
            raise ModelFileError(f"{path}: bad '{contract.META_RERANK}' metadata: {exc}") from None
        problem = contract.rerank_problem(config)
        if problem:
            raise ModelFileError(f"{path}: '{contract.META_RERANK}' metadata belongs to a model with {problem}")
    return config, parity


def _check_late(path: Path, text: str, config: EncoderConfig) -> None:
    """The late-interaction settings read back, name ids of the vocabulary and lengths the model takes,
    and belong to a model with a per-token head."""
    what = f"{path}: '{contract.META_LATE}' metadata"
    try:
        late = LateInteraction.from_json(text)
    except (TypeError, ValueError) as exc:
        raise ModelFileError(f"{what}: {exc}") from None
    if not (config.token_dense or config.token_weights):
        raise ModelFileError(f"{what} describes late interaction, but the config has no per-token head "
                             "(token_dense = null and token_weights = false)")
    beyond = [i for i in late.ids() if i >= config.vocab_size]
    if beyond:
        raise ModelFileError(f"{what} names token ids {beyond[:5]} outside the vocabulary "
                             f"(vocab_size={config.vocab_size})")
    for name in ("query_length", "document_length"):
        value = getattr(late, name)
        if value is not None and value > config.max_sequence:
            raise ModelFileError(f"{what}: {name}={value} is longer than the model takes "
                                 f"(max_sequence={config.max_sequence})")


def _check_text_max_length(path: Path, value: str | None, config: EncoderConfig) -> None:
    """Optional; when present, ASCII digits for an int in [1, max_sequence]. str.isdigit
    also takes '²' and other scripts' digits, and a bad value must not fall back silently:
    texts would then be cut at another length than at export."""
    if value is None:
        return
    if not re.fullmatch(r"[0-9]{1,20}", value) or not 1 <= int(value) <= config.max_sequence:
        raise ModelFileError(f"{path}: '{contract.META_TEXT_MAX_LENGTH}' metadata is {value!r}; valid: "
                             f"an integer in [1, {config.max_sequence}] (max_positions: the longest sequence the model takes)")


def _check_int8(path: Path, text: str) -> None:
    """The optional int8 record: {"scheme": str, "float_matmuls": [{"node": str, "module": str (optional),
    "reason": str}, ...], ...}."""
    what = f"{path}: '{contract.META_INT8}' metadata"
    record = json_object(text, what, ModelFileError)
    if not isinstance(record.get("scheme"), str):
        raise ModelFileError(f"{what} must be a JSON object with a 'scheme' string and a 'float_matmuls' list")
    kept = record.get("float_matmuls")
    if not isinstance(kept, list) or not all(
            isinstance(k, dict) and isinstance(k.get("node"), str) and isinstance(k.get("reason"), str)
            and isinstance(k.get("module", ""), str) for k in kept):
        raise ModelFileError(f"{what}: 'float_matmuls' must be a list of {{\"node\": str, \"reason\": str}} objects "
                             "(and an optional \"module\": str)")


def _spec(value: onnx.ValueInfoProto) -> TensorSpec:
    import onnx

    tensor = value.type.tensor_type
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name if tensor.elem_type else "undefined"
    shape = tuple(d.dim_param if d.HasField("dim_param") else (d.dim_value if d.HasField("dim_value") else "?") for d in tensor.shape.dim)
    return TensorSpec(value.name, dtype, shape)


def check_graph_io(path: Path, graph: onnx.GraphProto, cfg: EncoderConfig,
                   optional: bool = True) -> tuple[tuple[TensorSpec, ...], ...]:
    """(inputs, outputs) of `graph`, checked against the contract for `cfg`: names, element
    types and shapes (symbolic axes by name). ModelFileError names the first mismatch.
    `optional`: the outputs may lack contract.OPTIONAL_OUTPUTS (files written before them);
    False (the exporter's own check): every output of the contract."""
    # IR < 4 lists initializers among the inputs; they are weights, not inputs
    weights = {t.name for t in graph.initializer}
    inputs = tuple(_spec(v) for v in graph.input if v.name not in weights)
    outputs = tuple(_spec(v) for v in graph.output)
    full = contract.output_names(cfg)
    older = [name for name in full if name not in contract.OPTIONAL_OUTPUTS]
    for kind, got, wants in (("inputs", inputs, [contract.input_names(cfg)]),
                             ("outputs", outputs, [full, older] if optional and older != full else [full])):
        names = [s.name for s in got]
        if not any(sorted(names) == sorted(want) for want in wants):
            also = f" (or without {[n for n in full if n not in older]}, as older files are)" if len(wants) > 1 else ""
            raise ModelFileError(f"{path}: graph {kind} {names} do not match the ortformer contract for its config: "
                                 f"expected {wants[0]}{also}")
    for spec in inputs:
        if spec.dtype not in _ALLOWED_INPUT_TYPES[spec.name]:
            raise ModelFileError(f"{path}: graph input {spec.name} has type {spec.dtype}; the contract allows {list(_ALLOWED_INPUT_TYPES[spec.name])}")
    for spec in outputs:
        if spec.dtype not in _ALLOWED_OUTPUT_TYPES:
            raise ModelFileError(f"{path}: graph output {spec.name} has type {spec.dtype}; the contract allows {list(_ALLOWED_OUTPUT_TYPES)}")
    # shapes too: a config whose hidden_size differs from the graph's would pass input validation
    # and then fail (or silently mis-shape) inside onnxruntime
    declared = {**contract.input_shapes(cfg), **contract.output_shapes(cfg)}
    for spec in inputs + outputs:
        if list(spec.shape) != declared[spec.name]:
            raise ModelFileError(f"{path}: graph {spec.name} has shape {list(spec.shape)}; the contract for its config declares {declared[spec.name]}")
    return inputs, outputs


def _check_text(path: Path, graph: onnx.GraphProto) -> None:
    """Names and op types are valid UTF-8 (protobuf hands invalid ones back as bytes)."""
    texts = [t.name for t in graph.initializer] + [v.name for v in graph.value_info]
    for node in graph.node:
        texts += [node.op_type, node.domain, node.name, *node.input, *node.output]
    bad = [t for t in texts if not isinstance(t, str)]
    if bad:
        raise ModelFileError(f"{path}: the graph holds names that are not valid UTF-8, e.g. {bad[0]!r}; the file is corrupt")


def _check_tables(path: Path, graph: onnx.GraphProto, cfg: EncoderConfig) -> None:
    """A table gathered directly by input_ids / token_type_ids has the config's number of rows:
    the runtime checks ids against the config, and onnxruntime's CUDA Gather silently reads
    zeros past the table's end."""
    rows = {t.name: t.dims[0] for t in graph.initializer if len(t.dims) == 2}
    want = {contract.INPUT_IDS: ("vocab_size", cfg.vocab_size), contract.TOKEN_TYPE_IDS: ("type_vocab_size", cfg.type_vocab_size)}
    widths = {t.name: t.dims[1] for t in graph.initializer if len(t.dims) == 2}
    for node in graph.node:
        if node.op_type == "Gather" and len(node.input) == 2 and node.input[1] in want and node.input[0] in rows:
            field_name, size = want[node.input[1]]
            if rows[node.input[0]] != size:
                raise ModelFileError(
                    f"{path}: the table {node.input[0]!r} gathered by {node.input[1]} has {rows[node.input[0]]} rows, "
                    f"but the config says {field_name}={size}: the metadata does not describe this graph"
                )
        # a learned position table is a (P, hidden) constant sliced to the sequence length: one shorter
        # than max_positions would fail inside onnxruntime on valid lengths (sinusoids, rotary angles
        # and ALiBi distances are computed in the graph: no table)
        if (node.op_type == "Slice" and cfg.positions == "learned" and node.input and node.input[0] in rows
                and widths[node.input[0]] == cfg.hidden_size and rows[node.input[0]] < cfg.max_positions):
            raise ModelFileError(
                f"{path}: the position table {node.input[0]!r} has {rows[node.input[0]]} rows, but the config says "
                f"max_positions={cfg.max_positions}: the metadata does not describe this graph"
            )


# onnxruntime reads external data whose location is this marker from a raw memory address
_ORT_MEMORY_TAG = "_ORT_MEM_ADDR_"
_FOUR_BIT_TYPES = ("INT4", "UINT4", "FLOAT4E2M1")


def _declared_bytes(path: Path, tensor: onnx.TensorProto) -> int | None:
    """Bytes the tensor's dims and element type declare (None for strings: variable size)."""
    import onnx

    if any(d < 0 for d in tensor.dims):
        raise ModelFileError(f"{path}: tensor {tensor.name!r} has negative dims {list(tensor.dims)}")
    if tensor.data_type == onnx.TensorProto.STRING:
        return None
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except Exception:  # an element type this onnx does not know
        raise ModelFileError(f"{path}: tensor {tensor.name!r} has unknown element type {tensor.data_type}") from None
    count = math.prod(tensor.dims)  # a Python int: a huge product cannot overflow
    four_bit = {getattr(onnx.TensorProto, name, None) for name in _FOUR_BIT_TYPES}
    return (count + 1) // 2 if tensor.data_type in four_bit else count * itemsize


def _inline_capacity(tensor: onnx.TensorProto) -> int | None:
    """Upper bound on the bytes an inline tensor really holds; None if it cannot be told."""
    import onnx

    if tensor.HasField("raw_data"):
        return tensor.ByteSize()  # >= len(raw_data), without copying the bytes out
    try:
        field_name = onnx.helper.tensor_dtype_to_field(tensor.data_type)
    except Exception:
        return None
    # a typed entry holds at most 8 bytes of element data (int64/double/uint64; 2 int4 in an int32)
    return 8 * len(getattr(tensor, field_name))


def _check_external_data(path: Path, model: onnx.ModelProto) -> dict[str, Path]:
    """Every tensor's data is as large as its dims declare; external data stays inside the folder.

    A declared size beyond the data actually present (a dims product in the exabytes, an
    external length past the end of its file) is refused here, before onnxruntime tries to
    allocate or read it.
    """
    import onnx

    folder = path.absolute().parent
    files: dict[str, Path] = {}  # location as written -> resolved file
    for tensor in all_tensors(model):
        declared = _declared_bytes(path, tensor)
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            capacity = _inline_capacity(tensor)
            if declared is not None and capacity is not None and declared > capacity:
                raise ModelFileError(
                    f"{path}: tensor {tensor.name!r} declares dims {list(tensor.dims)} ({declared} bytes) "
                    f"but holds {capacity} bytes: the file is corrupt or hostile"
                )
            continue
        what = f"external data of tensor {tensor.name!r}"
        keys = [entry.key for entry in tensor.external_data]
        if len(keys) != len(set(keys)):  # readers disagree on which duplicate wins
            raise ModelFileError(f"{path}: {what} repeats a key: {keys}")
        info = {entry.key: entry.value for entry in tensor.external_data}
        if not info.get("location"):
            raise ModelFileError(f"{path}: {what} has no 'location'")
        if _ORT_MEMORY_TAG in info["location"]:
            raise ModelFileError(f"{path}: {what} has location {info['location']!r}, onnxruntime's in-memory marker")
        target = resolve_inside(folder, info["location"], f"{path}: {what}", model_path=path)
        # plain ASCII digits only: Python's int() also takes "1_000" and other scripts' digits,
        # which onnxruntime would read differently
        numbers = {key: info[key] for key in ("offset", "length") if key in info}
        if not all(re.fullmatch(r"[0-9]{1,20}", value) for value in numbers.values()):
            raise ModelFileError(f"{path}: {what} has a non-integer offset or length: {numbers}")
        offset, length = int(info.get("offset", 0)), int(info.get("length", -1))
        try:
            size = target.stat().st_size
        except OSError as exc:
            raise ModelFileError(f"{path}: {what}: cannot read {info['location']!r}: {exc.strerror or exc}") from None
        available = length if length >= 0 else size - offset
        if offset > size or (length >= 0 and offset + length > size):
            raise ModelFileError(
                f"{path}: {what} wants bytes [{offset}, {offset + max(length, 0)}) of {info['location']!r}, "
                f"which holds {size} bytes: the data file is truncated or belongs to another model"
            )
        if declared is not None and declared > available:
            raise ModelFileError(
                f"{path}: {what} declares dims {list(tensor.dims)} ({declared} bytes) but {info['location']!r} "
                f"provides {available} bytes from offset {offset}: the data file is truncated or the model is hostile"
            )
        files[info["location"]] = target
    return files


def file_weights_digest(path: str | os.PathLike) -> str:
    """tensors_digest of the model file at ``path``, its external data checked to stay inside the folder."""
    path = Path(path)
    model = _load_proto(path)
    return tensors_digest(model, _check_external_data(path, model))


def check_weights(model_file: ModelFile) -> str:
    """"ok" when the weights hash to the digest the export recorded (contract.META_WEIGHTS), "not
    recorded" for a file without one; ModelFileError when they differ: bytes changed after export."""
    recorded = model_file.metadata.get(contract.META_WEIGHTS)
    if recorded is None:
        return "not recorded"
    found = file_weights_digest(model_file.path)
    if found != recorded:
        raise ModelFileError(f"{model_file.path}: its weights differ from those recorded when it was written "
                             f"({contract.META_WEIGHTS} {recorded[:19]}..., the file now {found[:19]}...): "
                             "the file or its data file was changed or damaged since; export it again")
    return "ok"


def tensors_digest(model: onnx.ModelProto, external: dict[str, Path] | None = None) -> str:
    """"sha256:<hex>" over every tensor that holds data (initializers and constants, in graph order):
    its name, data type, dims and bytes, inline or read from the external file ``external`` maps its
    location to. Any changed weight byte changes it; metadata does not, nor where the bytes live."""
    import hashlib

    import onnx
    from onnx import numpy_helper

    digest = hashlib.sha256()
    for tensor in all_tensors(model):
        digest.update(f"{tensor.name}\0{tensor.data_type}\0{list(tensor.dims)}\0".encode())
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            if tensor.data_type == onnx.TensorProto.STRING:  # to_array gives objects: hash the strings
                digest.update(b"\0".join(tensor.string_data))
            else:
                digest.update(tensor.raw_data if tensor.HasField("raw_data") else numpy_helper.to_array(tensor).tobytes())
            continue
        info = {entry.key: entry.value for entry in tensor.external_data}
        remaining = int(info["length"]) if "length" in info else None
        with open((external or {})[info["location"]], "rb") as data:
            data.seek(int(info.get("offset", 0)))
            while remaining is None or remaining > 0:
                block = data.read(1 << 24 if remaining is None else min(1 << 24, remaining))
                if not block:
                    break
                digest.update(block)
                remaining = None if remaining is None else remaining - len(block)
    return "sha256:" + digest.hexdigest()


def tokenizer_path(model: ModelFile, missing_ok: bool = False) -> Path | None:
    """The tokenizer file named by the optional `ortformer.tokenizer` metadata, checked
    to lie inside the model's folder like external data (hard links allowed: its bytes never
    reach the outputs as numbers); None when the key is absent (and, with missing_ok, when
    the file is not there: the model then serves token ids only)."""
    name = model.metadata.get(contract.META_TOKENIZER)
    if not name:
        return None
    return resolve_inside(model.path.absolute().parent, name, f"{model.path}: '{contract.META_TOKENIZER}' metadata",
                          missing_ok=missing_ok, model_path=model.path, hard_links_ok=True)
