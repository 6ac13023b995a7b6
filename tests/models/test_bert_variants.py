"""BERT's relatives: XLM-RoBERTa-XL, Megatron-BERT and RoBERTa-PreLayerNorm (pre-norm), ERNIE (a
task-type table) and data2vec-text (RoBERTa under another name), against transformers."""
from __future__ import annotations

import pytest
import torch
from support.hf import (assert_matches_transformers, assert_only_the_import_matches, hf_reference, load_and_export,
                        save_hf, transformers, with_config)

from ortformer.core.errors import CheckpointError
from ortformer.models import load_any

SIZES = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
             max_position_embeddings=40)


def saved(kind: str, folder, seed: int = 0, task: str = "Model", **changes):
    config = getattr(transformers, kind + "Config")(**{**SIZES, **changes})
    return save_hf(getattr(transformers, kind + task), config, folder, seed=seed)


@pytest.mark.parametrize("kind, pad_id, family, onnx", [
    ("XLMRobertaXL", 1, "xlm-roberta-xl", False),  # pre-norm graphs are exported by the encoder grid
    ("MegatronBert", 0, "megatron-bert", False),
    ("Data2VecText", 1, "roberta", False),
    ("RobertaPreLayerNorm", 1, "roberta-prelayernorm", True),  # its embedding norm and layer 0's, both
])
def test_eager_and_onnx_equal_transformers(kind, pad_id, family, onnx, tmp_path):
    folder = saved(kind, tmp_path / "m", seed=1)
    loaded = load_any(folder)
    path = load_and_export(folder, tmp_path / "m.onnx")[1] if onnx else None
    assert loaded.family == family
    assert loaded.config.norm_position == ("post" if kind == "Data2VecText" else "pre")
    assert_matches_transformers(loaded, hf_reference(getattr(transformers, kind + "Model"), folder), path, pad_id=pad_id)


def test_ernie_task_table_row_zero_is_folded(tmp_path):
    # eager only: the folded table leaves BERT's graph, exported by test_bert.py
    folder = saved("Ernie", tmp_path / "m", seed=2, use_task_id=True, task_type_vocab_size=3)
    loaded, path = load_any(folder), None
    assert loaded.family == "ernie" and loaded.config.type_vocab_size == 2
    assert_matches_transformers(loaded, hf_reference(transformers.ErnieModel, folder), path, pad_id=0)


def test_ernie_task_table_must_match_the_config(tmp_path):
    folder = saved("Ernie", tmp_path / "m", seed=3, use_task_id=True, task_type_vocab_size=3)
    with pytest.raises(CheckpointError, match=r"task_type_embeddings.weight.*\(4, 32\)"):
        load_any(with_config(folder, tmp_path / "wider", {"task_type_vocab_size": 4}))
    with pytest.raises(CheckpointError, match="unexpected.*task_type_embeddings"):
        load_any(with_config(folder, tmp_path / "off", {"use_task_id": False}))


def test_prelayernorm_normalises_twice_ahead_of_layer_zero(tmp_path):
    # type_vocab_size 1 as the released models; wide weights, so that the first sublayer moves the output
    folder = saved("RobertaPreLayerNorm", tmp_path / "m", seed=5, type_vocab_size=1, initializer_range=0.5)
    loaded = load_any(folder)
    assert (loaded.config.embedding_norm, loaded.config.first_block_norm, loaded.config.type_vocab_size) == (True, True, 0)
    # ModernBERT's reading, layer 0's norm skipped
    assert_only_the_import_matches(loaded, hf_reference(transformers.RobertaPreLayerNormModel, folder),
                                   first_block_norm=False)


@pytest.mark.parametrize("kind", ["XLMRobertaXL", "MegatronBert", "Ernie", "Data2VecText", "RobertaPreLayerNorm"])
def test_sequence_classifiers_keep_their_heads(kind, tmp_path):
    folder = saved(kind, tmp_path / "m", seed=4, task="ForSequenceClassification", num_labels=3)
    loaded = load_any(folder)
    assert loaded.config.num_labels == 3 and not loaded.dropped
    model = getattr(transformers, kind + "ForSequenceClassification").from_pretrained(folder).eval()
    ids = torch.tensor([[5, 17, 9, 30, 2, 1], [5, 8, 2, 1, 1, 1]])
    mask = (ids != 1).long()
    types = [torch.zeros_like(ids)] if loaded.config.type_vocab_size else []
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(ids, mask, *types)["logits"],
                                   model(input_ids=ids, attention_mask=mask).logits, atol=2e-5, rtol=0)
