"""ortformer checkpoints: a folder with ``config.json`` + ``model.safetensors``.

Loading is safe by construction: safetensors headers are parsed and bounded by us
before the library touches the file, and PyTorch pickles (``.pt``/``.bin``) are
read with ``torch.load(weights_only=True)`` only. Every tensor is checked against
the config (names, shapes, dtypes, finiteness) and all problems are reported at
once in one ``CheckpointError``.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
from pathlib import Path
from typing import Callable, Iterable, Mapping, NamedTuple

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..config import EncoderConfig
from ..cost import parameter_count
from ..fsutil import fsync_dir, fsync_file, temp_beside
from ..errors import CheckpointError, ConfigError
from .encoder import Encoder, build_encoder

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
TOKENIZER_NAME = "tokenizer.json"
# looked up in this order; safetensors first because it cannot carry code
WEIGHT_NAMES = (WEIGHTS_NAME, "model.pt", "model.bin", "pytorch_model.bin")
PICKLE_SUFFIXES = (".pt", ".bin", ".pth")
# the safetensors library's own bound; a larger header is corrupt or hostile
MAX_HEADER_BYTES = 100_000_000
META_FORMAT = "ortformer.format"
META_CONFIG = "ortformer.config"  # the weight file carries its config: mixed-up pairs are caught
CHECKPOINT_FORMAT = "1"

Tensors = dict[str, torch.Tensor]


# ---------------------------------------------------------------- reading files

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
    """(tensors, safetensors metadata, duplicate names) by file suffix."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"weight file {path} does not exist")
    if path.suffix == ".safetensors":
        return read_safetensors(path)
    if path.suffix in PICKLE_SUFFIXES:
        return read_pickle(path), {}, []
    raise CheckpointError(
        f"{path.name}: unknown weight file type {path.suffix!r}; use .safetensors or a PyTorch {'/'.join(PICKLE_SUFFIXES)} state dict"
    )


def find_weights(folder: Path, names: Iterable[str] = WEIGHT_NAMES) -> Path:
    names = tuple(names)
    for name in names:
        if (folder / name).is_file():
            return folder / name
    if (folder / f"{WEIGHTS_NAME}.index.json").exists():
        raise CheckpointError(f"{folder} holds a sharded checkpoint; ortformer reads a single weight file")
    raise CheckpointError(f"{folder} has no weight file; looked for {', '.join(names)}")


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
        problems.append(f"duplicate names ({len(duplicates)}): {', '.join(duplicates)}")
    missing = sorted(set(expected) - set(found))
    if missing:
        problems.append(f"missing ({len(missing)}): {', '.join(missing)}")
    unexpected = sorted(set(found) - set(expected))
    if unexpected:
        problems.append(f"unexpected ({len(unexpected)}): {', '.join(unexpected)}")
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
        problems.append(f"wrong shape ({len(shapes)}): {'; '.join(shapes)}")
    if kinds:
        valid = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        problems.append(f"wrong dtype ({len(kinds)}, valid: {valid}): {'; '.join(kinds)}")
    if non_finite:
        problems.append(f"non-finite ({len(non_finite)}): {'; '.join(non_finite)}")
    if problems:
        raise CheckpointError(f"{what} fails the checks against its config:\n  " + "\n  ".join(problems))


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


# ---------------------------------------------------------------- ortformer checkpoints

def _config_from(folder: Path, metadata: dict[str, str], explicit: EncoderConfig | None) -> EncoderConfig:
    """Explicit config > config.json > the weight file's metadata; config.json and metadata must agree."""
    try:
        from_meta = EncoderConfig.from_json(metadata[META_CONFIG]) if META_CONFIG in metadata else None
        config_file = folder / CONFIG_NAME
        from_file = EncoderConfig.from_json(config_file.read_text(encoding="utf-8")) if config_file.is_file() else None
    except (ConfigError, OSError, UnicodeDecodeError, RecursionError) as exc:  # unreadable, not UTF-8, nested deep
        raise CheckpointError(f"checkpoint in {folder} has an invalid config: {type(exc).__name__}: {exc}") from None
    if explicit is not None:
        return explicit
    if from_file is not None and from_meta is not None and from_file != from_meta:
        raise CheckpointError(
            f"{folder / CONFIG_NAME} and the config stored in the weight file disagree "
            "(a partly replaced checkpoint?); save the checkpoint again"
        )
    if from_file is None and from_meta is None:
        raise CheckpointError(f"no config for the checkpoint in {folder}: {CONFIG_NAME} is missing; pass config=")
    return from_file or from_meta


def load_checkpoint(path, config: EncoderConfig | None = None) -> Encoder:
    """Load an ortformer checkpoint folder, or one weight file (.safetensors/.pt/.bin).

    The config comes from ``config``, else ``config.json`` beside the weights, else
    the safetensors metadata. Tensors must be float32, finite, and exactly the
    Encoder's parameters.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    weights = find_weights(path) if path.is_dir() else path
    tensors, metadata, duplicates = read_weights(weights)
    cfg = _config_from(weights.parent, metadata, config)
    return encoder_from_tensors(cfg, tensors, what=str(weights), duplicates=duplicates)


def _stage(dest: Path, write: Callable[[Path], None]) -> Path:
    """Write via ``write(tmp)`` to a temp file beside ``dest`` and fsync it; returns the temp path."""
    tmp = temp_beside(dest)
    try:
        write(tmp)
        fsync_file(tmp)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _redundant_config(folder: Path) -> bool:
    """True when folder/config.json says exactly what the old weight file's own metadata says."""
    try:
        header, _ = read_safetensors_header(folder / WEIGHTS_NAME)
        embedded = (header.get("__metadata__") or {}).get(META_CONFIG)
        return embedded is not None and (
            EncoderConfig.from_json(embedded) == EncoderConfig.from_json((folder / CONFIG_NAME).read_text(encoding="utf-8")))
    except (CheckpointError, ConfigError, OSError, ValueError, RecursionError, AttributeError):
        return False


def save_checkpoint(model: Encoder, directory, *, force: bool = False, tokenizer=None) -> Path:
    """Write ``directory/model.safetensors`` then ``directory/config.json``, each atomically.

    Both files are staged and fsynced first; an old config.json that only repeats
    the old weight file's embedded config is removed, then the weights are replaced
    before the config. The weight file carries the config in its metadata, so a
    reader (or a process killed at any point) sees the old checkpoint or the new
    one, never a mismatched pair. ``tokenizer`` (a tokenizer.json) is
    copied beside them. An existing checkpoint is replaced only with force=True;
    other files in the folder are left alone. Returns the folder.
    """
    if not isinstance(model, Encoder):
        raise CheckpointError(f"save_checkpoint takes an ortformer Encoder, got {type(model).__name__}")
    folder = Path(directory)
    if folder.exists() and not folder.is_dir():
        raise CheckpointError(f"{folder} exists and is not a folder; a checkpoint is a folder")
    if tokenizer is not None and not Path(tokenizer).is_file():
        raise CheckpointError(f"tokenizer file {tokenizer} does not exist")
    existing = [n for n in (CONFIG_NAME, *WEIGHT_NAMES) if (folder / n).exists()]
    if existing and not force:
        raise CheckpointError(f"{folder} already holds a checkpoint ({', '.join(existing)}); pass force=True to replace it")
    cfg = model.config
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    # a model cannot lack its own parameters; this refuses half precision and NaN/inf,
    # which load_checkpoint would refuse too
    check_tensors(tensors, shapes_of(model), dtypes=(torch.float32,), what="the model to save")
    metadata = {META_FORMAT: CHECKPOINT_FORMAT, META_CONFIG: cfg.to_json()}
    writers = [(WEIGHTS_NAME, lambda tmp: save_file(tensors, str(tmp), metadata=metadata)),
               (CONFIG_NAME, lambda tmp: tmp.write_text(cfg.to_json() + "\n", encoding="utf-8"))]
    if tokenizer is not None:
        writers.append((TOKENIZER_NAME, lambda tmp: shutil.copyfile(tokenizer, tmp)))
    staged: list[tuple[Path, Path]] = []
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name, write in writers:
            staged.append((_stage(folder / name, write), folder / name))
        if _redundant_config(folder):
            # the old weights carry the old config: without config.json the folder still loads
            # as the old checkpoint, and a process killed between the two replaces below leaves
            # new weights alone (loading as the new one) instead of new weights + old config.json
            (folder / CONFIG_NAME).unlink()
            fsync_dir(folder)
        for tmp, dest in staged:  # weights first: see the docstring
            os.replace(tmp, dest)
        fsync_dir(folder)
    except OSError as exc:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise CheckpointError(f"cannot write a checkpoint into {folder}: {exc.strerror or exc}") from None
    return folder


# ---------------------------------------------------------------- any source

class Loaded(NamedTuple):
    model: Encoder
    source: str  # "sha256:<hex>" of the weight file
    tokenizer: Path | None  # tokenizer.json beside the weights
    text_max_length: int | None = None  # sentence-transformers' max_seq_length, when set


def load_any(path) -> Loaded:
    """(model, source, tokenizer.json or None, text_max_length) from an ortformer
    checkpoint folder or weight file, or a BERT-family Hugging Face / sentence-transformers folder.

    A folder dispatches on its config.json: ``model_type`` means Hugging Face;
    otherwise an ortformer config. ``source`` is ``"sha256:<hex>"`` of the weight file.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path} does not exist; pass a checkpoint folder, a weight file or a BERT folder")
    if path.is_file() and path.name == CONFIG_NAME:
        path = path.parent
    if path.is_dir():
        from . import bert  # bert imports this module; import lazily

        if bert.is_bert_folder(path):
            imported = bert.load_bert(path)
            return Loaded(imported.model, imported.source, imported.tokenizer, imported.max_seq_length)
        weights = find_weights(path)
    else:
        weights = path
    model = load_checkpoint(weights)
    tokenizer = weights.parent / TOKENIZER_NAME
    return Loaded(model, f"sha256:{checkpoint_digest(weights)}", tokenizer if tokenizer.is_file() else None)
