"""ortformer checkpoints: a folder with ``config.json`` + ``model.safetensors``.

The weight file carries its config in the safetensors metadata, so a mixed-up
pair is caught; weights are read through ``weights`` (safe by construction).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import save_file

from ..config import EncoderConfig
from ..core.errors import CheckpointError, ConfigError
from ..core.fsutil import fsync_dir, fsync_file, temp_beside
from .encoder import Encoder
from .weights import (WEIGHT_NAMES, WEIGHTS_NAME, check_tensors, encoder_from_tensors, find_weights,
                      read_safetensors_header, read_weights, shapes_of)

CONFIG_NAME = "config.json"
TOKENIZER_NAME = "tokenizer.json"
META_FORMAT = "ortformer.format"
META_CONFIG = "ortformer.config"  # the weight file carries its config: mixed-up pairs are caught
CHECKPOINT_FORMAT = "1"


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
        raise CheckpointError(f"no config for the checkpoint in {folder}: {CONFIG_NAME} is missing; "
                              f"put the model's config there (or pass config= to load_checkpoint)")
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
    tensors, seen = {}, set()
    for k, v in model.state_dict().items():
        t = v.detach().to("cpu").contiguous()
        # a tied masked-LM decoder shares the token table's storage, which safetensors refuses to write twice
        tensors[k] = t.clone() if t.data_ptr() in seen else t
        seen.add(t.data_ptr())
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
