"""RoFormer (interleaved rotary pairs, read as rotate-half by permuting q and k rows) against transformers."""
from __future__ import annotations

import pytest
import torch
from support.hf import assert_matches_transformers, hf_reference, save_hf, transformers, with_config

from ortformer.core.errors import CheckpointError
from ortformer.models import load_any

SIZES = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
             max_position_embeddings=64)


def test_eager_equals_transformers(tmp_path):
    config = transformers.RoFormerConfig(**SIZES, embedding_size=16, hidden_act="gelu_new")
    folder = save_hf(transformers.RoFormerModel, config, tmp_path / "m", seed=1)
    # eager only: the permuted rows leave the rotary softmax graph that other tests export
    loaded, path = load_any(folder), None
    cfg = loaded.config
    assert loaded.family == "roformer" and loaded.dropped == ("encoder.embed_positions.weight",)
    assert (cfg.positions, cfg.embedding_size, cfg.type_vocab_size) == ("rotary", 16, 2)
    assert assert_matches_transformers(loaded, hf_reference(transformers.RoFormerModel, folder), path, pad_id=0) >= 12


def test_query_and_key_rows_are_permuted_per_head(tmp_path):
    """A mutation check: head h's row k holds the file's row 2k (k < D/2) or 2(k - D/2) + 1; values stay."""
    folder = save_hf(transformers.RoFormerModel, transformers.RoFormerConfig(**SIZES), tmp_path / "m", seed=2)
    raw = transformers.RoFormerModel.from_pretrained(folder).state_dict()
    qkv = load_any(folder).model.state_dict()["blocks.0.attention.qkv.weight"]
    query = raw["encoder.layer.0.attention.self.query.weight"]
    assert torch.equal(qkv[8 + 1], query[8 + 2]) and torch.equal(qkv[8 + 4], query[8 + 1])  # head 1, D = 8
    assert torch.equal(qkv[64:], raw["encoder.layer.0.attention.self.value.weight"])


def test_sequence_classifier_uses_hidden_act(tmp_path):
    config = transformers.RoFormerConfig(**SIZES, num_labels=2, hidden_act="relu")
    folder = save_hf(transformers.RoFormerForSequenceClassification, config, tmp_path / "m", seed=3)
    loaded = load_any(folder)
    assert loaded.config.classifier.dense == "relu" and not loaded.dropped[1:]
    model = transformers.RoFormerForSequenceClassification.from_pretrained(folder).eval()
    ids = torch.tensor([[1, 5, 7, 9, 2, 0], [1, 8, 2, 0, 0, 0]])
    mask = (ids != 0).long()
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(ids, mask, torch.zeros_like(ids))["logits"],
                                   model(input_ids=ids, attention_mask=mask).logits, atol=2e-5, rtol=0)


def test_rotated_values_are_refused(tmp_path):
    folder = save_hf(transformers.RoFormerModel, transformers.RoFormerConfig(**SIZES), tmp_path / "m", seed=4)
    with pytest.raises(CheckpointError, match="rotary_value=True is not supported"):
        load_any(with_config(folder, tmp_path / "v", {"rotary_value": True}))
