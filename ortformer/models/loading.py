"""``load_any``: one entry point for every source a model can come from."""
from __future__ import annotations

from pathlib import Path

from ..errors import CheckpointError
from .checkpoint import CONFIG_NAME, TOKENIZER_NAME, load_checkpoint
from .hf import bert
from .hf.folder import is_hf_folder
from .loaded import Loaded
from .weights import checkpoint_digest, find_weights


def load_any(path) -> Loaded:
    """The model, its source digest, tokenizer and text length from an ortformer
    checkpoint folder or weight file, or a Hugging Face / sentence-transformers folder.

    A folder dispatches on its config.json: ``model_type`` means Hugging Face;
    otherwise an ortformer config. ``source`` is ``"sha256:<hex>"`` of the weight file.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path} does not exist; pass a checkpoint folder, a weight file or a Hugging Face folder")
    if path.is_file() and path.name == CONFIG_NAME:
        path = path.parent
    if path.is_dir():
        if is_hf_folder(path):
            return bert.load_bert(path)
        weights = find_weights(path)
    else:
        weights = path
    model = load_checkpoint(weights)
    tokenizer = weights.parent / TOKENIZER_NAME
    return Loaded(model, f"sha256:{checkpoint_digest(weights)}", tokenizer if tokenizer.is_file() else None,
                  weights=weights)
