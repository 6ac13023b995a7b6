"""Write an ortformer ONNX model into a Triton Inference Server model repository.

Torch-free and onnxruntime-free: reads the model with ortformer.modelfile (``onnx``
only; the runtime's own reader and checks), so a repository can be prepared on a
machine that neither exports nor serves. Layout written::

    REPO/NAME/config.pbtxt        platform "onnxruntime_onnx", I/O from the graph
    REPO/NAME/1/model.onnx        the model (plus its external-data file(s), if any)
    REPO/NAME/tokenizer.json      only when the model's metadata names a tokenizer: for
    REPO/NAME/1/tokenizer.json    clients, and where the metadata points from model.onnx

Every file is written under a temporary name and moved into place with
``os.replace``; ``model.onnx`` is the commit point of the model itself, so a Triton
server polling the repository sees the old model or the complete new one.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from .. import contract
from .._version import __version__
from ..core.checks import check_int
from ..core.fsutil import copy_atomic, write_atomic
from ..modelfile.int8_kernels import NO_CUDA_KERNELS
from ..modelfile import ModelFile, TensorSpec, read_model_file, tokenizer_path
from ..modelfile.onnxfile import external_locations
from ..core.errors import OutputError

PLATFORM = "onnxruntime_onnx"
VERSION = "1"  # Triton serves the highest numeric version folder; we write one
MODEL_FILENAME = "model.onnx"  # Triton's default_model_filename for onnxruntime_onnx
DEVICES = {"cpu": "KIND_CPU", "gpu": "KIND_GPU"}
# int8 files: "portable" writes the weights as uint8 + 128 (exact on every CPU), "vnni" as
# exported (int8: faster, but only exact where the server's CPU has VNNI; ortformer/modelfile/int8_kernels.py)
INT8_KERNELS = ("portable", "vnni")
# element type (as ortformer.modelfile names it) -> Triton DataType; every type the
# model-file reader accepts on an input or output has an entry
TRITON_DTYPES = {"int64": "TYPE_INT64", "float32": "TYPE_FP32", "float16": "TYPE_FP16"}
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
    """``name`` if it is a safe model (and folder) name, else OutputError saying what is valid."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or ".." in name:
        raise OutputError(f"Triton model name {name!r} is not valid: use {_NAME_RULE}")
    return name


def triton_config(onnx_path: str | os.PathLike, name: str, max_batch_size: int = 64, device: str = "cpu",
                  max_queue_delay_us: int = DEFAULT_QUEUE_DELAY_US) -> str:
    """The config.pbtxt text for an ortformer model (validated like write_triton_repo)."""
    model = read_model_file(onnx_path)
    return _render(model, check_name(name), _check_batch(max_batch_size), _check_device(device),
                   _check_delay(max_queue_delay_us))


def write_triton_repo(onnx_path: str | os.PathLike, repo_dir: str | os.PathLike, name: str | None = None,
                      max_batch_size: int = 64, device: str = "cpu", force: bool = False, *,
                      max_queue_delay_us: int = DEFAULT_QUEUE_DELAY_US, int8_kernel: str = "portable") -> Path:
    """Write ``repo_dir/NAME/{config.pbtxt, 1/model.onnx}``; return ``repo_dir/NAME``.

    name: the Triton model name, default the file's stem (``tiny.onnx`` -> ``tiny``).
    max_batch_size: largest batch the dynamic batcher forms (>= 1); every dims entry in
    config.pbtxt then leaves out the batch axis. device: "cpu" or "gpu" (instance kind).
    force: replace an existing ``repo_dir/NAME`` entry (files are swapped one by one,
    atomically, so a running server never sees a half-written model).
    int8_kernel: for an int8 file, "portable" (default) writes its weights as uint8 + 128:
    the same integers, exact on any server CPU; "vnni" copies them as exported (int8), which
    runs faster but saturates, giving wrong values, on x86 CPUs without VNNI. Triton's
    onnxruntime backend runs the file as written, so the choice is made here, not at load.

    Raises ModelFileError when the file is not a readable ortformer model, OutputError
    for a bad name, device, batch size or an existing entry without ``force``.
    """
    src = Path(onnx_path)
    name = check_name(src.stem if name is None else name)
    max_batch_size, device = _check_batch(max_batch_size), _check_device(device)
    max_queue_delay_us = _check_delay(max_queue_delay_us)
    if int8_kernel not in INT8_KERNELS:
        raise OutputError(f"int8_kernel={int8_kernel!r}; valid: {', '.join(map(repr, INT8_KERNELS))}")
    model = read_model_file(src)  # format, contract, and every side file inside the model's folder
    portable = _portable_int8(model) if int8_kernel == "portable" else None
    text = _render(model, name, max_batch_size, device, max_queue_delay_us)
    data_files = model.external_data
    tokenizer = _tokenizer(model)

    repo = Path(repo_dir)
    entry = repo / name
    if repo.exists() and not repo.is_dir():
        raise OutputError(f"repository {repo} exists and is not a folder; give a folder path")
    # replacing the entry removes what lies in it: never the files this call reads
    for source in (src, *data_files.values(), *([tokenizer[1]] if tokenizer else [])):
        if source.resolve().is_relative_to(entry.resolve()):
            raise OutputError(f"{source} lies inside the repository entry {entry} that would be replaced; "
                              "copy the model out of it first, or choose another --repo or --name")
    for inside in (entry, entry / VERSION):  # a link would carry the writes out of the repository
        if inside.is_symlink():
            raise OutputError(f"{inside} is a symbolic link; the repository entry must be a real folder "
                              "(remove the link)")
    if entry.exists() and not force:
        raise OutputError(f"{entry} already exists; pass force=True (--force) to replace it")
    if entry.exists() and not entry.is_dir():
        raise OutputError(f"{entry} exists and is not a folder; remove it or choose another --name")
    version_dir = entry / VERSION
    try:
        version_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create {version_dir}: {exc.strerror or exc}") from None

    old_data = _old_data_files(version_dir / MODEL_FILENAME)
    # side files first: the old model.onnx keeps pointing at its own data until it is replaced
    for rel, path in data_files.items():
        _atomic_copy(path, version_dir / rel)
    if tokenizer is not None:
        # inside the version folder too, where the model's metadata says it is, so that
        # 1/model.onnx stays a complete ortformer model (Runtime, `ortformer info`)
        _atomic_copy(tokenizer[1], version_dir / tokenizer[0])
    if portable is not None:
        _atomic_write(version_dir / MODEL_FILENAME, portable)
    else:
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
    return check_int("max_batch_size", max_batch_size, error=OutputError)


def _check_device(device) -> str:
    if device not in DEVICES:
        raise OutputError(f"device={device!r} is not valid: choose one of {', '.join(DEVICES)}")
    return device


def _check_delay(delay) -> int:
    return check_int("max_queue_delay_us", delay, low=0, error=OutputError)


def _tensor_config(spec: TensorSpec) -> TensorConfig:
    """Triton dims from a graph input or output the model-file reader checked against the contract."""
    # axis 0 is the batch axis Triton adds itself (max_batch_size > 0); symbolic -> -1
    return TensorConfig(spec.name, TRITON_DTYPES[spec.dtype],
                        tuple(-1 if isinstance(d, str) else d for d in spec.shape[1:]))


def _render(model: ModelFile, name: str, max_batch_size: int, device: str, delay_us: int) -> str:
    if device == "gpu" and contract.META_INT8 in model.metadata:
        raise OutputError(f"{model.path} is an int8 file, which runs on CPU instances only ({NO_CUDA_KERNELS}); "
                          "use device 'cpu' (--device cpu), or export --dtype float16 for GPU instances")
    if model.right_padding:  # Triton hands clients' rows to the graph as they come
        raise OutputError(f"{model.path} was exported with padding='right': its attention reads each row's mask as a "
                          "key length, true only of right-padded rows, and Triton runs the graph on whatever rows "
                          "clients send (ortformer's Runtime right-aligns them); export it with --padding any for Triton")
    cfg = model.config
    # in the contract's order, which is the order clients build their requests in
    inputs = [_tensor_config(s) for s in sorted(model.inputs, key=lambda s: contract.input_names(cfg).index(s.name))]
    outputs = [_tensor_config(s) for s in sorted(model.outputs, key=lambda s: contract.output_names(cfg).index(s.name))]
    opsets = ", ".join(f"{domain or 'ai.onnx'} {version}" for domain, version in model.opsets)
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


def _portable_int8(model: ModelFile) -> bytes | None:
    """The model's bytes with its int8 weights as uint8 + 128 and the weights digest it records
    redone; None when it holds no int8 weights (copied as it is)."""
    if contract.META_INT8 not in model.metadata:
        return None
    import onnx

    from ..modelfile.int8_kernels import unsigned_weights
    from ..modelfile import tensors_digest

    if model.external_data:
        raise OutputError(f"{model.path} keeps int8 weights in a side file; the portable copy handles inline "
                          "models (ortformer's int8 exports are inline: export it again), or pass "
                          "int8_kernel='vnni' (--int8-kernel vnni) if every server CPU has AVX512-VNNI")
    proto = onnx.load(str(model.path))
    if not unsigned_weights(proto):
        return None
    props = {p.key: p for p in proto.metadata_props}
    record = json.loads(props[contract.META_INT8].value)  # read_model_file checked it is a JSON object
    record["weights"] = "uint8 + 128, written by triton-repo --int8-kernel portable"
    props[contract.META_INT8].value = json.dumps(record)
    if contract.META_WEIGHTS in props:  # the copy's own bytes, so `ortformer check` still verifies it
        props[contract.META_WEIGHTS].value = tensors_digest(proto)
    return proto.SerializeToString()


def _old_data_files(path: Path) -> set[str]:
    """Data files the model already in the repository names (ours, written earlier)."""
    import onnx

    try:
        return external_locations(onnx.load(str(path), format="protobuf", load_external_data=False)) if path.is_file() else set()
    except Exception:  # an unreadable old model has no data files we can name
        return set()


def _tokenizer(model: ModelFile) -> tuple[str, Path] | None:
    """(name as in the metadata, file) of the tokenizer the model names, if any."""
    source = tokenizer_path(model, missing_ok=True)
    if source is None and model.metadata.get(contract.META_TOKENIZER):
        # the .onnx copied without its tokenizer still serves token ids, as Runtime does
        warnings.warn(f"{model.path}: its tokenizer {model.metadata[contract.META_TOKENIZER]!r} is missing; the "
                      "entry serves token ids and clients tokenize themselves", stacklevel=3)
    return None if source is None else (model.metadata[contract.META_TOKENIZER], source)


# ----------------------------------------------------------------------- atomic writes


def _atomic_copy(source: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        copy_atomic(source, dest)
    except OSError as exc:
        raise OutputError(f"cannot copy {source} to {dest}: {exc.strerror or exc}") from None


def _atomic_write(dest: Path, text: str | bytes) -> None:
    try:
        write_atomic(dest, text)
    except OSError as exc:
        raise OutputError(f"cannot write {dest}: {exc.strerror or exc}") from None
