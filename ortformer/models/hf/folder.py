"""Reading a local Hugging Face / sentence-transformers folder: JSON configs, the
module layout, pooling and prompts. Family-specific weight mapping lives beside
this file (one module per family).

sentence-transformers configs, when present, set the pooling: ``modules.json``
lists the modules, ``1_Pooling/config.json`` picks the mode, and a ``Normalize``
module means l2-normalised embeddings.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ...errors import CheckpointError

TOKENIZER_NAME = "tokenizer.json"
HF_WEIGHT_NAMES = ("model.safetensors", "pytorch_model.bin")
ST_MODULE = "sentence_transformers.models."
ST_SUPPORTED = {"Transformer", "Pooling", "Normalize"}
# half-precision folders are common; upcasting them to float32 is exact
HF_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def read_json(path: Path, kind: type = dict):
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:  # RecursionError: nesting bombs
        raise CheckpointError(f"cannot read {path}: {type(exc).__name__}: {exc}") from None
    if not isinstance(data, kind):
        raise CheckpointError(f"{path} must hold a JSON {kind.__name__}, got {type(data).__name__}")
    return data


def _modules(folder: Path) -> list[dict]:
    """sentence-transformers' modules.json entries, [] when there is none."""
    path = folder / "modules.json"
    if not path.is_file():
        return []
    modules = read_json(path, list)
    if not all(isinstance(m, dict) for m in modules):
        raise CheckpointError(f"{path} must be a list of module objects")
    return modules


def _module_dir(folder: Path, module: dict) -> Path:
    """A module's folder; modules.json may only point inside the model folder."""
    rel = Path(str(module.get("path", "")))
    if rel.is_absolute() or ".." in rel.parts:
        raise CheckpointError(f"modules.json path {str(rel)!r} leaves the model folder {folder}")
    return folder / rel


def transformer_dir(folder: Path) -> Path:
    """The folder holding config.json: the root, or the Transformer module's path in modules.json."""
    if not (folder / "config.json").is_file():
        for module in _modules(folder):
            if module.get("type") == ST_MODULE + "Transformer":
                return _module_dir(folder, module)
    return folder


def is_hf_folder(path) -> bool:
    """True when ``path`` is a folder whose config.json is a Hugging Face config (has model_type)."""
    path = Path(path)
    try:
        config = transformer_dir(path) / "config.json"
        return config.is_file() and "model_type" in read_json(config)
    except CheckpointError:
        return False


def read_pooling(folder: Path) -> tuple[str | None, bool, int | None]:
    """(pooling or None, normalize, max_seq_length) from sentence-transformers configs.

    None means the folder has no sentence-transformers pooling module.
    """
    modules = _modules(folder)
    if not modules:
        return None, False, None
    kinds = [str(m.get("type", "")).removeprefix(ST_MODULE) for m in modules]
    unsupported = [k for k in kinds if k not in ST_SUPPORTED]
    if unsupported:
        raise CheckpointError(
            f"{folder / 'modules.json'} uses sentence-transformers modules ortformer does not implement: "
            f"{', '.join(unsupported)}; supported: {', '.join(sorted(ST_SUPPORTED))}"
        )
    pooling = None
    for module in modules:
        if module.get("type") == ST_MODULE + "Pooling":
            pooling = _pooling_mode(read_json(_module_dir(folder, module) / "config.json"))
    st_config = folder / "sentence_bert_config.json"
    max_len = read_json(st_config).get("max_seq_length") if st_config.is_file() else None
    return pooling, "Normalize" in kinds, max_len


def _pooling_mode(config: dict) -> str:
    modes = sorted(k.removeprefix("pooling_mode_") for k, v in config.items() if k.startswith("pooling_mode_") and v)
    mapping = {"mean_tokens": "mean", "cls_token": "cls"}
    if len(modes) != 1 or modes[0] not in mapping:
        raise CheckpointError(
            f"sentence-transformers pooling {modes or 'none'} is not supported; "
            "valid: exactly one of pooling_mode_mean_tokens, pooling_mode_cls_token"
        )
    return mapping[modes[0]]


def find_tokenizer(model_dir: Path, root: Path) -> Path | None:
    """tokenizer.json in the Transformer module's folder, else the root, else None."""
    return next((d / TOKENIZER_NAME for d in (model_dir, root) if (d / TOKENIZER_NAME).is_file()), None)
