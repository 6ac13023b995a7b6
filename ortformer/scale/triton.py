"""Write an ortformer ONNX model into a Triton Inference Server model repository.

Torch-free and onnxruntime-free: reads the model with ``onnx`` only, so a repository
can be prepared on a machine that neither exports nor serves. Layout written::

    REPO/NAME/config.pbtxt        platform "onnxruntime_onnx", I/O from the graph
    REPO/NAME/1/model.onnx        the model (plus its external-data file(s), if any)
    REPO/NAME/tokenizer.json      only when the model's metadata names a tokenizer: for
    REPO/NAME/1/tokenizer.json    clients, and where the metadata points from model.onnx

Every file is written under a temporary name and moved into place with
``os.replace``; ``model.onnx`` is the commit point of the model itself, so a Triton
server polling the repository sees the old model or the complete new one.
"""
from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import onnx

from .. import __version__, contract
from ..config import EncoderConfig
from ..fsutil import replace_synced, temp_beside
from ..onnxfile import external_locations, resolve_inside
from ..errors import ConfigError, ExportError, ModelFileError

PLATFORM = "onnxruntime_onnx"
VERSION = "1"  # Triton serves the highest numeric version folder; we write one
MODEL_FILENAME = "model.onnx"  # Triton's default_model_filename for onnxruntime_onnx
DEVICES = {"cpu": "KIND_CPU", "gpu": "KIND_GPU"}
# ONNX element type -> Triton DataType. float16 appears only in half-precision exports.
TRITON_DTYPES = {
    onnx.TensorProto.INT64: "TYPE_INT64",
    onnx.TensorProto.FLOAT: "TYPE_FP32",
    onnx.TensorProto.FLOAT16: "TYPE_FP16",
}
# How long the dynamic batcher may hold a request to fill a batch. 1 ms is small next
# to an encoder forward pass and enough for concurrent clients to share one.
DEFAULT_QUEUE_DELAY_US = 1000

_NAME_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}")
_NAME_RULE = ("letters, digits, '_', '-' and '.', 1-128 characters, not starting with '.' "
              "and without '..' (it becomes a folder name in the repository)")


@dataclass(frozen=True)
class TensorConfig:
    """One Triton input or output: dims exclude the batch axis; -1 is the sequence axis."""

    name: str
    data_type: str
    dims: tuple[int, ...]

    def to_pbtxt(self) -> str:
        dims = ", ".join(str(d) for d in self.dims)
        return f'  {{\n    name: "{self.name}"\n    data_type: {self.data_type}\n    dims: [ {dims} ]\n  }}'


def check_name(name: str) -> str:
    """``name`` if it is a safe model (and folder) name, else ExportError saying what is valid."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or ".." in name:
        raise ExportError(f"Triton model name {name!r} is not valid: use {_NAME_RULE}")
    return name


def triton_config(onnx_path: str | os.PathLike, name: str, max_batch_size: int = 64, device: str = "cpu",
                  max_queue_delay_us: int = DEFAULT_QUEUE_DELAY_US) -> str:
    """The config.pbtxt text for an ortformer model (validated like write_triton_repo)."""
    path = Path(onnx_path)
    model = _load(path)
    return _render(path, model, check_name(name), _check_batch(max_batch_size), _check_device(device),
                   _check_delay(max_queue_delay_us))


def write_triton_repo(onnx_path: str | os.PathLike, repo_dir: str | os.PathLike, name: str | None = None,
                      max_batch_size: int = 64, device: str = "cpu", force: bool = False, *,
                      max_queue_delay_us: int = DEFAULT_QUEUE_DELAY_US) -> Path:
    """Write ``repo_dir/NAME/{config.pbtxt, 1/model.onnx}``; return ``repo_dir/NAME``.

    name: the Triton model name, default the file's stem (``tiny.onnx`` -> ``tiny``).
    max_batch_size: largest batch the dynamic batcher forms (>= 1); every dims entry in
    config.pbtxt then leaves out the batch axis. device: "cpu" or "gpu" (instance kind).
    force: replace an existing ``repo_dir/NAME`` entry (files are swapped one by one,
    atomically, so a running server never sees a half-written model).

    Raises ModelFileError when the file is not a readable ortformer model, ExportError
    for a bad name, device, batch size or an existing entry without ``force``.
    """
    src = Path(onnx_path)
    name = check_name(src.stem if name is None else name)
    max_batch_size, device = _check_batch(max_batch_size), _check_device(device)
    max_queue_delay_us = _check_delay(max_queue_delay_us)
    model = _load(src)
    text = _render(src, model, name, max_batch_size, device, max_queue_delay_us)
    data_files = _external_data(src, model)
    tokenizer = _tokenizer(src, model)

    repo = Path(repo_dir)
    entry = repo / name
    if repo.exists() and not repo.is_dir():
        raise ExportError(f"repository {repo} exists and is not a folder; give a folder path")
    for inside in (entry, entry / VERSION):  # a link would carry the writes out of the repository
        if inside.is_symlink():
            raise ExportError(f"{inside} is a symbolic link; the repository entry must be a real folder "
                              "(remove the link)")
    if entry.exists() and not force:
        raise ExportError(f"{entry} already exists; pass force=True (--force) to replace it")
    if entry.exists() and not entry.is_dir():
        raise ExportError(f"{entry} exists and is not a folder; remove it or choose another --name")
    version_dir = entry / VERSION
    try:
        version_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ExportError(f"cannot create {version_dir}: {exc.strerror or exc}") from None

    old_data = _old_data_files(version_dir / MODEL_FILENAME)
    # side files first: the old model.onnx keeps pointing at its own data until it is replaced
    for rel, path in data_files.items():
        _atomic_copy(path, version_dir / rel)
    if tokenizer is not None:
        # inside the version folder too, where the model's metadata says it is, so that
        # 1/model.onnx stays a complete ortformer model (Runtime, `ortformer info`)
        _atomic_copy(tokenizer[1], version_dir / tokenizer[0])
    _atomic_copy(src, version_dir / MODEL_FILENAME)
    for rel in old_data - set(data_files):
        stale = version_dir / rel
        # only ever delete inside the version folder
        if stale.resolve().is_relative_to(version_dir.resolve()) and stale.is_file():
            stale.unlink()
    written = {version_dir / rel for rel in data_files} | {version_dir / MODEL_FILENAME, entry / "config.pbtxt"}
    if tokenizer is not None:
        _atomic_copy(tokenizer[1], entry / PurePosixPath(tokenizer[0]).name)
        written |= {version_dir / tokenizer[0], entry / PurePosixPath(tokenizer[0]).name}
    _atomic_write(entry / "config.pbtxt", text)
    _remove_all_but(entry, written)
    return entry


def _remove_all_but(entry: Path, keep: set[Path]) -> None:
    """Replace the entry whole: remove what an earlier model left (its tokenizer, other
    version folders Triton would serve instead). Links are removed, never followed."""
    keep_dirs = {p.parent for p in keep} | {parent for p in keep for parent in p.parents}
    for root, dirs, files in os.walk(entry, topdown=False, followlinks=False):
        folder = Path(root)
        for name in files:
            if folder / name not in keep:
                (folder / name).unlink(missing_ok=True)
        for name in dirs:
            sub = folder / name
            if sub.is_symlink():
                sub.unlink()
            elif sub not in keep_dirs:
                shutil.rmtree(sub, ignore_errors=True)


# ----------------------------------------------------------------------- checks


def _check_batch(max_batch_size) -> int:
    # 0 would mean "no batching" to Triton, and then dims must include the batch axis
    if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1:
        raise ExportError(f"max_batch_size={max_batch_size!r} is not valid: use an integer >= 1")
    return max_batch_size


def _check_device(device) -> str:
    if device not in DEVICES:
        raise ExportError(f"device={device!r} is not valid: choose one of {', '.join(DEVICES)}")
    return device


def _check_delay(delay) -> int:
    if isinstance(delay, bool) or not isinstance(delay, int) or delay < 0:
        raise ExportError(f"max_queue_delay_us={delay!r} is not valid: use an integer >= 0")
    return delay


def _load(path: Path) -> onnx.ModelProto:
    if not path.is_file():
        raise ModelFileError(f"{path}: no such model file")
    try:
        # weights stay on disk: only metadata, signature and data locations are needed
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf raises several types depending on the damage
        raise ModelFileError(f"{path}: not a readable ONNX file: {exc}") from None
    if not model.HasField("graph"):
        raise ModelFileError(f"{path}: not an ONNX model (no graph)")
    return model


def _config(path: Path, model: onnx.ModelProto) -> EncoderConfig:
    meta = {p.key: p.value for p in model.metadata_props}
    if contract.META_CONFIG not in meta:
        raise ModelFileError(
            f"{path}: not an ortformer model: metadata key {contract.META_CONFIG!r} is missing "
            "(export it with `ortformer export`)"
        )
    try:
        return EncoderConfig.from_json(meta[contract.META_CONFIG])
    except ConfigError as exc:
        raise ModelFileError(f"{path}: bad {contract.META_CONFIG!r} metadata: {exc}") from None


def _tensor_config(path: Path, value: onnx.ValueInfoProto, declared: list) -> TensorConfig:
    """Triton dims from the graph, checked against the contract's declared shape."""
    tensor = value.type.tensor_type
    if tensor.elem_type not in TRITON_DTYPES:
        valid = ", ".join(onnx.TensorProto.DataType.Name(t) for t in TRITON_DTYPES)
        raise ModelFileError(f"{path}: {value.name} has element type "
                             f"{onnx.TensorProto.DataType.Name(tensor.elem_type)}; Triton configs are written for {valid}")
    dims = [d.dim_param if d.HasField("dim_param") else d.dim_value for d in tensor.shape.dim]
    if dims != declared:
        raise ModelFileError(f"{path}: {value.name} has shape {dims}; the ortformer contract declares {declared}")
    # axis 0 is the batch axis Triton adds itself (max_batch_size > 0); symbolic -> -1
    return TensorConfig(value.name, TRITON_DTYPES[tensor.elem_type],
                        tuple(-1 if isinstance(d, str) else d for d in dims[1:]))


def _tensors(path: Path, model: onnx.ModelProto, cfg: EncoderConfig) -> tuple[list, list]:
    weights = {t.name for t in model.graph.initializer}  # IR < 4 lists weights as inputs
    graph_inputs = {v.name: v for v in model.graph.input if v.name not in weights}
    graph_outputs = {v.name: v for v in model.graph.output}
    result = []
    for kind, got, want, shapes in (
        ("inputs", graph_inputs, contract.input_names(cfg), contract.input_shapes(cfg)),
        ("outputs", graph_outputs, contract.output_names(cfg), contract.output_shapes(cfg)),
    ):
        if sorted(got) != sorted(want):
            raise ModelFileError(f"{path}: graph {kind} {list(got)} do not match the ortformer contract "
                                 f"for its config: expected {want}")
        result.append([_tensor_config(path, got[n], shapes[n]) for n in want])
    return result[0], result[1]


def _render(path: Path, model: onnx.ModelProto, name: str, max_batch_size: int, device: str,
            delay_us: int) -> str:
    cfg = _config(path, model)
    inputs, outputs = _tensors(path, model, cfg)
    opsets = ", ".join(f"{o.domain or 'ai.onnx'} {o.version}" for o in model.opset_import)
    lines = [
        f"# written by ortformer {__version__}; model {cfg.name!r}, ONNX IR {model.ir_version}, opsets {opsets}.",
        "# The Triton release's onnxruntime must read that IR version and those opsets.",
        f'name: "{name}"',
        f'platform: "{PLATFORM}"',
        f"max_batch_size: {max_batch_size}",
        "input [",
        ",\n".join(t.to_pbtxt() for t in inputs),
        "]",
        "output [",
        ",\n".join(t.to_pbtxt() for t in outputs),
        "]",
        "# requests are batched together only when their sequence lengths are equal:",
        "# clients that pad to a few fixed lengths get larger batches",
        "dynamic_batching {",
        f"  max_queue_delay_microseconds: {delay_us}",
        "}",
        "instance_group [",
        "  {",
        "    count: 1",
        f"    kind: {DEVICES[device]}",
        "  }",
        "]",
    ]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------- side files


def _external_data(path: Path, model: onnx.ModelProto) -> dict[str, Path]:
    """{location as written in the model: source file} for every external-data file."""
    folder = path.absolute().parent
    files = {}
    for location in sorted(external_locations(model)):
        # the Runtime's own check (links, NUL, '..', missing): a copy must not launder a file it refuses
        files[location] = resolve_inside(folder, location, f"{path}: external data")
    return files


def _old_data_files(path: Path) -> set[str]:
    try:
        return external_locations(onnx.load(str(path), load_external_data=False)) if path.is_file() else set()
    except Exception:  # an unreadable old model has no data files we can name
        return set()


def _tokenizer(path: Path, model: onnx.ModelProto) -> tuple[str, Path] | None:
    """(name as in the metadata, file) of the tokenizer the metadata names; a named tokenizer
    that is missing is an error (clients would get a model without its tokenizer)."""
    name = {p.key: p.value for p in model.metadata_props}.get(contract.META_TOKENIZER)
    if not name:
        return None
    return name, resolve_inside(path.absolute().parent, name, f"{path}: '{contract.META_TOKENIZER}' metadata")


# ----------------------------------------------------------------------- atomic writes


def _atomic_copy(source: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_beside(dest)
    try:
        try:
            shutil.copyfile(source, tmp)
        except OSError as exc:
            raise ExportError(f"cannot copy {source} to {dest}: {exc.strerror or exc}") from None
        _commit(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def _atomic_write(dest: Path, text: str) -> None:
    tmp = _temp_beside(dest)
    try:
        tmp.write_text(text)
        _commit(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def _temp_beside(dest: Path) -> Path:
    # Triton ignores files in a version folder other than model.onnx and its data
    try:
        return temp_beside(dest)
    except OSError as exc:
        raise ExportError(f"cannot write into {dest.parent}: {exc.strerror or exc}") from None


def _commit(tmp: Path, dest: Path) -> None:
    try:
        replace_synced(tmp, dest)
    except OSError as exc:
        raise ExportError(f"cannot write {dest}: {exc.strerror or exc}") from None
