"""Safe weight reading: safetensors and weights_only pickles, and tensor checks.

Loading is safe by construction: safetensors headers are parsed and bounded by us
before the library touches the file, and PyTorch pickles (``.pt``/``.bin``) are
read with ``torch.load(weights_only=True)`` only. Every tensor is checked against
what the config expects (names, shapes, dtypes, finiteness) and all problems are
reported at once in one ``CheckpointError``.
"""
from __future__ import annotations

import hashlib
import json
import re
import struct
import warnings
from pathlib import Path
from typing import Iterable, Mapping

import torch
from safetensors import safe_open

from ..config import EncoderConfig
from ..contract.cost import parameter_count
from ..core.errors import CheckpointError
from .encoder import Encoder, build_encoder

WEIGHTS_NAME = "model.safetensors"
# looked up in this order; safetensors first because it cannot carry code
WEIGHT_NAMES = (WEIGHTS_NAME, "model.pt", "model.bin", "pytorch_model.bin")
PICKLE_SUFFIXES = (".pt", ".bin", ".pth")
# a sharded checkpoint: NAME.index.json maps each tensor to its shard file (Hugging Face's layout)
INDEX_SUFFIX = ".index.json"
# the safetensors library's own bound; a larger header is corrupt or hostile
MAX_HEADER_BYTES = 100_000_000

Tensors = dict[str, torch.Tensor]



def read_safetensors_header(path: Path) -> tuple[dict, list[str]]:
    """Parse and bound-check a safetensors header without trusting it.

    Layout: u64 little-endian N, then N bytes of JSON
    ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``,
    then the data; offsets are relative to byte 8 + N.
    Returns (header, duplicate tensor names).
    """
    size = path.stat().st_size
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path} is truncated: {size} bytes, too short for a safetensors header")
        (length,) = struct.unpack("<Q", head)
        if length > MAX_HEADER_BYTES:
            raise CheckpointError(
                f"{path} declares a {length}-byte safetensors header; the limit is {MAX_HEADER_BYTES} "
                "(the file is corrupt or not safetensors)"
            )
        if 8 + length > size:
            raise CheckpointError(f"{path} is truncated: its header needs {8 + length} bytes, the file has {size}")
        raw = handle.read(length)
    duplicates: list[str] = []

    def no_duplicates(pairs):
        seen = {}
        for key, value in pairs:
            if key in seen:
                duplicates.append(key)
            seen[key] = value
        return seen

    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=no_duplicates)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # RecursionError: "[[[[..." nested deep
        raise CheckpointError(f"{path} has a corrupt safetensors header (not JSON): {exc}") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path} has a corrupt safetensors header: expected a JSON object")
    data_size = size - 8 - length
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)
                and 0 <= offsets[0] <= offsets[1]):
            raise CheckpointError(f"{path} has a corrupt safetensors header: bad data_offsets for {name!r}")
        if offsets[1] > data_size:
            raise CheckpointError(
                f"{path} is truncated: tensor {name!r} ends at data byte {offsets[1]}, the data has {data_size}"
            )
    return header, duplicates


def read_safetensors(path: Path) -> tuple[Tensors, dict[str, str], list[str]]:
    """(tensors, metadata, duplicate names) of a safetensors file, or CheckpointError."""
    header, duplicates = read_safetensors_header(path)
    metadata = header.get("__metadata__") or {}
    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    except Exception as exc:  # the library's own checks: dtype, shape/offset agreement
        raise CheckpointError(f"{path} is not a valid safetensors file: {exc}") from None
    return tensors, metadata, duplicates


def read_pickle(path: Path) -> Tensors:
    """A state dict from a PyTorch file, loaded with weights_only=True and nothing else.

    A pickle that needs any global beyond tensors and plain containers (i.e. one
    that could run code when loaded) is refused, never loaded another way.
    """
    try:
        with warnings.catch_warnings():  # torch's notes on pickle protocols: the error below says what matters
            warnings.simplefilter("ignore", UserWarning)
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(
            f"{path} cannot be read with torch.load(weights_only=True): {_pickle_reason(exc).rstrip('.')}. "
            "Only plain state dicts of tensors are accepted; convert the file to safetensors."
        ) from None
    if not isinstance(state, Mapping):
        raise CheckpointError(f"{path} holds a {type(state).__name__}, not a state dict (a mapping name -> tensor)")
    bad = [str(k) for k, v in state.items() if not (isinstance(k, str) and isinstance(v, torch.Tensor))]
    if bad:
        raise CheckpointError(f"{path} is not a plain state dict: entries that are not str -> tensor: {', '.join(bad)}")
    return dict(state)


def _pickle_reason(exc: Exception) -> str:
    """The useful part of torch.load's error, without its advice to load unsafely."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    found = re.search(r"Unsupported global: GLOBAL (\S+)", text)
    if found:
        return f"it refers to {found.group(1)}, which unpickling would import and could call"
    found = re.search(r"WeightsUnpickler error:\s*(.+)", text)
    if found:
        return f"not a plain tensor pickle ({found.group(1).strip()})"
    first = text.strip().splitlines()[0] if text.strip() else ""
    return f"{type(exc).__name__}: {first}"


def read_weights(path: Path) -> tuple[Tensors, dict[str, str], list[str]]:
    """(tensors, safetensors metadata, duplicate names) by file suffix; a sharded
    checkpoint's ``*.index.json`` reads every shard it names."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"weight file {path} does not exist")
    if path.name.endswith(INDEX_SUFFIX):
        return read_sharded(path)
    if path.suffix == ".safetensors":
        return read_safetensors(path)
    if path.suffix in PICKLE_SUFFIXES:
        return read_pickle(path), {}, []
    raise CheckpointError(
        f"{path.name}: unknown weight file type {path.suffix!r}; use .safetensors or a PyTorch {'/'.join(PICKLE_SUFFIXES)} state dict"
    )


def find_weights(folder: Path, names: Iterable[str] = WEIGHT_NAMES, *, sharded: bool = False) -> Path:
    """The first of ``names`` in ``folder``; with ``sharded``, else the first ``NAME.index.json``."""
    names = tuple(names)
    # name by name, the whole file before its shards: safetensors (sharded or not) before pickles
    for name in names:
        if (folder / name).is_file():
            return folder / name
        index = folder / f"{name}{INDEX_SUFFIX}"
        if index.is_file():
            if sharded:
                return index
            raise CheckpointError(f"{folder} holds a sharded checkpoint ({index.name}); an ortformer checkpoint "
                                  "is a single weight file")
    raise CheckpointError(f"{folder} has no weight file; looked for {', '.join(names)}")


def shard_names(index: Path) -> dict[str, list[str]]:
    """A sharded checkpoint's index (``{"weight_map": {tensor: shard file}}``) as shard -> tensor
    names, shards sorted by name.

    Shards are plain file names beside the index: a path (``../x``, ``/x``, ``a/b``) is refused,
    so an index never makes ortformer read outside the model's folder."""
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"cannot read {index}: {type(exc).__name__}: {exc}") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
        raise CheckpointError(f"{index} must hold a non-empty weight_map of tensor name -> shard file name")
    shards: dict[str, list[str]] = {}
    for name, shard in weight_map.items():
        if shard in ("", ".", "..") or Path(shard).name != shard or "\\" in shard:
            raise CheckpointError(f"{index}: shard {shard!r} (of {name}) is not a file name in {index.parent}; "
                                  "shards must lie beside the index")
        if Path(shard).suffix not in (".safetensors", *PICKLE_SUFFIXES):
            raise CheckpointError(f"{index}: shard {shard!r} (of {name}) is not a weight file; shards are "
                                  f".safetensors or {'/'.join(PICKLE_SUFFIXES)} files")
        shards.setdefault(shard, []).append(name)
    return dict(sorted(shards.items()))  # by file name: the source digests do not depend on the map's order


def read_sharded(index: Path) -> tuple[Tensors, dict[str, str], list[str]]:
    """(tensors of every shard, {}, duplicate names) of a sharded checkpoint, each shard
    read as a single file is (safetensors, or a weights_only pickle)."""
    tensors: Tensors = {}
    duplicates: list[str] = []
    for shard, names in shard_names(index).items():
        found, _, repeated = read_weights(index.parent / shard)
        duplicates += repeated + [name for name in found if name in tensors]
        missing = sorted(set(names) - set(found))
        if missing:
            raise CheckpointError(f"{index.parent / shard} lacks {len(missing)} tensor(s) the index places there: "
                                  f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
        tensors.update(found)
    return tensors, {}, duplicates


def weight_files(path: Path) -> list[Path]:
    """The files a weight path stands for: its shards for an index, else itself."""
    path = Path(path)
    if path.name.endswith(INDEX_SUFFIX):
        return [path.parent / shard for shard in shard_names(path)]
    return [path]


def weights_source(*paths: Path) -> str:
    """``ortformer.source`` of the weights: "sha256:<hex>" per file, comma-separated, in order."""
    return ",".join(f"sha256:{checkpoint_digest(f)}" for path in paths for f in weight_files(path))


def checkpoint_digest(path) -> str:
    """SHA-256 hex digest of the weight file's bytes (a folder: its weight file).

    Exports record it as ``ortformer.source = "sha256:<hex>"``.
    """
    path = Path(path)
    weights = find_weights(path) if path.is_dir() else path
    digest = hashlib.sha256()
    try:
        with open(weights, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError as exc:
        raise CheckpointError(f"cannot read {weights}: {exc.strerror or exc}") from None
    return digest.hexdigest()


# ---------------------------------------------------------------- checking

def check_tensors(found: Mapping[str, torch.Tensor], expected: Mapping[str, tuple[int, ...]], *,
                  dtypes: tuple[torch.dtype, ...], what: str, duplicates: Iterable[str] = ()) -> None:
    """Raise one CheckpointError listing every duplicate, missing, unexpected,
    mis-shaped, wrongly typed and non-finite tensor of ``found`` against ``expected``."""
    problems = []
    duplicates = sorted(set(duplicates))
    if duplicates:
        problems.append(f"duplicate names ({len(duplicates)}): {_first(duplicates, ', ')}")
    missing = sorted(set(expected) - set(found))
    if missing:
        problems.append(f"missing ({len(missing)}): {_first(missing, ', ')}")
    unexpected = sorted(set(found) - set(expected))
    if unexpected:
        problems.append(f"unexpected ({len(unexpected)}): {_first(unexpected, ', ')}")
    shapes, kinds, non_finite = [], [], []
    for name in sorted(set(found) & set(expected)):
        tensor = found[name]
        if tuple(tensor.shape) != tuple(expected[name]):
            shapes.append(f"{name} is {tuple(tensor.shape)}, expected {tuple(expected[name])}")
        if tensor.dtype not in dtypes:
            kinds.append(f"{name} is {str(tensor.dtype).replace('torch.', '')}")
        elif tensor.is_floating_point():
            bad = int((~torch.isfinite(tensor)).sum())
            if bad:
                non_finite.append(f"{name} has {bad} NaN/inf value(s)")
    if shapes:
        problems.append(f"wrong shape ({len(shapes)}): {_first(shapes, '; ')}")
    if kinds:
        valid = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        problems.append(f"wrong dtype ({len(kinds)}, valid: {valid}): {_first(kinds, '; ')}")
    if non_finite:
        problems.append(f"non-finite ({len(non_finite)}): {_first(non_finite, '; ')}")
    if problems:  # one line, like every error: the CLI prints it as `error: ...`
        raise CheckpointError(f"{what} fails the checks against its config: " + " | ".join(problems))


def _first(items: list[str], sep: str, shown: int = 12) -> str:
    """The first ``shown`` items joined; the rest counted (a wrong config can mismatch hundreds)."""
    more = f"{sep}... and {len(items) - shown} more" if len(items) > shown else ""
    return sep.join(items[:shown]) + more


def shapes_of(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    """Parameter name -> shape of a model's state dict."""
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def encoder_from_tensors(cfg: EncoderConfig, tensors: Tensors, *, what: str, duplicates=(),
                         dtypes: tuple[torch.dtype, ...] = (torch.float32,)) -> Encoder:
    """Check ``tensors`` against ``cfg`` and load them into a fresh Encoder (eval mode, float32)."""
    # a config is text: one claiming hidden_size=65536 and 500 layers would have build_encoder
    # allocate terabytes before any tensor is checked. Build only what the file could fill.
    want, have = parameter_count(cfg), sum(t.numel() for t in tensors.values())
    if want > 4 * have + 1_000_000:
        raise CheckpointError(
            f"{what}: its config describes a model of {want:,} parameters but the file holds {have:,} values; "
            "the config does not belong to these weights"
        )
    # the real model is the reference for names and shapes: one build, reused for loading
    # (a meta-device build looks free but costs seconds on its first use in a process)
    model = build_encoder(cfg, seed=0)
    check_tensors(tensors, shapes_of(model), dtypes=dtypes, what=what, duplicates=duplicates)
    model.load_state_dict({k: v.to(torch.float32) for k, v in tensors.items()}, strict=True)
    return model.eval()
