"""``load_any``: one entry point for every source a model can come from."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from ..core.errors import CheckpointError
from .checkpoint import CONFIG_NAME, TOKENIZER_NAME, load_checkpoint
from .hf.family import elsewhere_hint, family_for, model_types
from .hf.folder_files import FolderFiles
from .hf.folder_layout import HF_WEIGHT_NAMES, is_hf_folder, read_json, transformer_dir
from .hf.vocab_tokenizers import as_transformers_reads, built_tokenizer
from .hub import resolve_folder
from .loaded import Loaded
from .weights import find_weights, weights_source


def unsupported_model_type(model_type) -> CheckpointError:
    """The error for a config.json whose model_type no family module imports (hf/family.py's registry)."""
    hint = elsewhere_hint(model_type)
    return CheckpointError(f"model_type {model_type!r} is not supported; ortformer imports "
                           f"{', '.join(sorted(model_types()))}{'; ' + hint if hint else ''}")


def load_hf(folder, **options) -> Loaded:
    """Import a Hugging Face / sentence-transformers folder of any supported family.

    folder: a path, or the FolderFiles already read from it (its config.json is parsed once,
    here or by the caller, and handed to the family's loader); options (pooling, normalize,
    name) go to the family's loader."""
    files = FolderFiles.of(folder)
    family = family_for(files.config)
    if family is None:
        raise unsupported_model_type(files.model_type)
    loaded = family.load(files, **options)
    if loaded.tokenizer is None:  # an older save: a tokenizer.json built from its vocabulary, if it has one
        built = built_tokenizer(files.model_dir, files.root, files.model_type)
        loaded = dataclasses.replace(loaded, tokenizer=built) if built else loaded
    if loaded.tokenizer is not None:
        loaded = dataclasses.replace(loaded, tokenizer=as_transformers_reads(loaded.tokenizer, files.model_dir,
                                                                             files.root))
    return loaded


def _around_transformer_module(folder: Path) -> Path:
    """The sentence-transformers folder whose Transformer module is ``folder`` (its
    0_Transformer/), so a file named inside it keeps the pooling, Dense, Normalize, text
    length and prompts the outer folder defines; else ``folder``."""
    outer = folder.parent
    try:
        if (outer / "modules.json").is_file() and transformer_dir(outer).resolve() == folder.resolve():
            return outer
    except (CheckpointError, OSError):  # an unreadable modules.json: the module alone, as named
        pass
    return folder


# keys every transformers config.json writes, and no ortformer config has
_HF_ONLY_KEYS = ("architectures", "transformers_version", "num_hidden_layers", "num_attention_heads")


def _refuse_untyped_hf_config(folder: Path) -> None:
    """A transformers config.json without model_type names no family: say so, rather than
    reading it as an ortformer config and listing its keys as unknown."""
    config = transformer_dir(folder) / CONFIG_NAME
    if not config.is_file():
        return
    data = read_json(config)
    if "model_type" not in data and any(key in data for key in _HF_ONLY_KEYS):
        raise CheckpointError(f"{config} is a Hugging Face config without model_type, so its family is unknown; "
                              f"add \"model_type\" (one of {', '.join(sorted(model_types()))})")


def load_any(path, *, pooling: str | None = None, normalize: bool | None = None, revision: str | None = None,
             cache_dir=None, truncate_dim: int | None = None) -> Loaded:
    """The model, its source digest, tokenizer and text length from an ortformer
    checkpoint folder or weight file, or a Hugging Face / sentence-transformers folder, local or
    named by its hub id ("org/name", fetched into the hub cache at ``revision``, models/hub.py).

    A folder dispatches on its config.json: ``model_type`` means Hugging Face (one
    module per family in models/hf/, hf/family.py's registry); otherwise an ortformer config. pooling / normalize
    override a Hugging Face folder's (its sentence-transformers modules', or none); an
    ortformer checkpoint's config sets its own.
    ``source`` is ``"sha256:<hex>"`` of the weight file, after ``"hf:org/name@<commit>,"`` for a hub id.
    truncate_dim: keep the first truncate_dim values of the sentence embedding (Matryoshka), over
    what the folder says; ConfigError where the config cannot take it.
    """
    path, snapshot = resolve_folder(path, revision=revision, cache_dir=cache_dir)
    loaded = _load_local(path, pooling, normalize)
    if truncate_dim is not None:
        # the slice after the pooling holds no weights: the model just built takes the new config as is
        loaded.model.config = loaded.config.replace(truncate_dim=truncate_dim)
    if snapshot is None:
        return loaded
    return dataclasses.replace(loaded, source=f"{snapshot.source},{loaded.source}", fetched=snapshot.folder)


def _load_local(path: Path, pooling: str | None, normalize: bool | None) -> Loaded:
    if path.is_file() and path.name == CONFIG_NAME:
        path = _around_transformer_module(path.parent)
    if path.is_file() and is_hf_folder(path.parent):  # its config.json is Hugging Face's, not ortformer's
        if path.name not in HF_WEIGHT_NAMES:
            raise CheckpointError(f"{path} lies in a Hugging Face folder whose weights are read by name "
                                  f"({', '.join(HF_WEIGHT_NAMES)} or their shards); pass the folder {path.parent}")
        path = _around_transformer_module(path.parent)
    files = FolderFiles.hugging_face(path) if path.is_dir() else None
    if files is not None:
        return load_hf(files, **{k: v for k, v in (("pooling", pooling), ("normalize", normalize)) if v is not None})
    if path.is_dir():
        _refuse_untyped_hf_config(path)
    if pooling is not None or normalize is not None:
        raise CheckpointError(f"{path} is an ortformer checkpoint, whose config.json sets its pooling and "
                              "normalisation; a pooling or normalize override applies to Hugging Face folders only")
    if path.is_dir():
        weights = find_weights(path)
    else:
        weights = path
    model = load_checkpoint(weights)
    tokenizer = weights.parent / TOKENIZER_NAME
    return Loaded(model, weights_source(weights), tokenizer if tokenizer.is_file() else None,
                  weights=weights)
