"""What a local Hugging Face / sentence-transformers folder holds and where: its JSON files,
the Transformer module's folder (modules.json), weight and tokenizer file names, the model's name."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ...core.errors import CheckpointError


TOKENIZER_NAME = "tokenizer.json"
HF_WEIGHT_NAMES = ("model.safetensors", "pytorch_model.bin")
# half-precision folders are common; upcasting them to float32 is exact
HF_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)  # float64: cast to float32


def read_json(path: Path, kind: type = dict):
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:  # RecursionError: nesting bombs
        raise CheckpointError(f"cannot read {path}: {type(exc).__name__}: {exc}") from None
    if not isinstance(data, kind):
        raise CheckpointError(f"{path} must hold a JSON {kind.__name__}, got {type(data).__name__}")
    return data


def st_modules(folder: Path) -> list[dict]:
    """sentence-transformers' modules.json entries, [] when there is none."""
    path = folder / "modules.json"
    if not path.is_file():
        return []
    modules = read_json(path, list)
    if not all(isinstance(m, dict) for m in modules):
        raise CheckpointError(f"{path} must be a list of module objects")
    return modules


def module_dir(folder: Path, module: dict) -> Path:
    """A module's folder; modules.json may only point inside the model folder."""
    rel = Path(str(module.get("path", "")))
    if rel.is_absolute() or ".." in rel.parts:
        raise CheckpointError(f"modules.json path {str(rel)!r} leaves the model folder {folder}")
    return folder / rel


def module_kind(module: dict) -> str:
    """'Pooling' from 'sentence_transformers.models.Pooling' or the newer module paths ('Dense' from
    PyLate's 'pylate.models.Dense.Dense', sentence-transformers' Dense applied to every token)."""
    kind = str(module.get("type", ""))
    return kind.rsplit(".", 1)[-1] if kind.startswith(("sentence_transformers.", "pylate.models.Dense.")) else kind


def remote_transformer(module: dict) -> bool:
    """Whether a modules.json entry is a model's own remote-code Transformer (jina's
    ``custom_st.Transformer``) rather than sentence-transformers' own: a family that implements the
    model itself decides what it stands for."""
    kind = str(module.get("type", ""))
    return kind.endswith(".Transformer") and not kind.startswith("sentence_transformers.")


def transformer_dir(folder: Path) -> Path:
    """The folder holding config.json: the root, or the Transformer module's path in modules.json
    when the root has no Hugging Face config (none, or sentence-transformers < 2's root config.json,
    which holds only {"__version__": ...} beside 0_Transformer/)."""
    root_config = folder / "config.json"
    if not root_config.is_file() or ((folder / "modules.json").is_file() and "model_type" not in read_json(root_config)):
        for module in st_modules(folder):
            if module_kind(module) in ("Transformer", "MLMTransformer"):
                return module_dir(folder, module)
    return folder


def is_hf_folder(path) -> bool:
    """True when ``path`` is a folder whose config.json is a Hugging Face config (has model_type)."""
    path = Path(path)
    try:
        config = transformer_dir(path) / "config.json"
        return config.is_file() and "model_type" in read_json(config)
    except CheckpointError:
        return False


# folder names that say nothing of the model: its name is then the folder above
GENERIC_FOLDER_NAMES = {"model", "models", "checkpoint", "checkpoints", "weights", "files", "hf", "transformer"}


def folder_name(root: Path) -> str:
    """The model's name from its folder (`ortformer info`, Triton's header): the folder's own
    name, the repository's for a Hugging Face cache snapshot (models--org--name/snapshots/<hash>),
    the folder above for a generic name ("model", as packages ship weights)."""
    root = root.resolve()
    if root.parent.name == "snapshots" and root.parent.parent.name.startswith("models--"):
        return root.parent.parent.name.rsplit("--", 1)[-1]
    if root.name.lower() in GENERIC_FOLDER_NAMES and root.parent.name:
        return root.parent.name
    return root.name


# tokenizer files of older saves (WordPiece / BPE vocabularies, sentencepiece models): the
# tokenizers library reads tokenizer.json only, which transformers writes beside them
LEGACY_TOKENIZER_FILES = ("vocab.txt", "vocab.json", "merges.txt", "spm.model", "spiece.model",
                          "sentencepiece.bpe.model", "tokenizer.model")


def missing_tokenizer_note(folder) -> str | None:
    """Why a folder without tokenizer.json exports for token ids only, when it holds a
    tokenizer in an older format; None when it has tokenizer.json or nothing of the kind.
    folder: a path, or the FolderFiles an import read (its Transformer module already found)."""
    root = Path(folder)
    if not root.is_dir():
        return None
    model_dir = getattr(folder, "model_dir", None) or transformer_dir(root)
    if find_tokenizer(model_dir, root) is not None:  # (callers also ask only when none was built from vocab.txt)
        return None
    found = sorted({name for d in (model_dir, root) for name in LEGACY_TOKENIZER_FILES if (d / name).is_file()})
    if not found:
        return None
    return (f"{root} holds {', '.join(found)} but no tokenizer.json, so the model takes token ids only; "
            f"write one with transformers (AutoTokenizer.from_pretrained(FOLDER).save_pretrained(FOLDER)) "
            f"and export again, or pass --tokenizer")


def find_tokenizer(model_dir: Path, root: Path) -> Path | None:
    """tokenizer.json in the Transformer module's folder, else the root, else None."""
    return next((d / TOKENIZER_NAME for d in (model_dir, root) if (d / TOKENIZER_NAME).is_file()), None)
