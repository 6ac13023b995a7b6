"""Longformer (RoBERTa's layers with sliding-window attention) against transformers' LongformerModel."""
from __future__ import annotations

import pytest
import torch
from support.hf import (assert_matches_transformers, assert_only_the_import_matches, cases, hf_reference,
                        load_and_export, save_hf, transformers, with_config)

from ortformer.config import LocalAttention
from ortformer.core.errors import CheckpointError
from ortformer.models import load_any

# a window of |i - j| <= 2, so the grid's rows of up to 64 tokens reach far past it
SIZES = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
             max_position_embeddings=66, attention_window=4, pad_token_id=1)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    config = transformers.LongformerConfig(**SIZES)
    return save_hf(transformers.LongformerModel, config, tmp_path_factory.mktemp("longformer") / "m", seed=1)


def test_eager_and_onnx_equal_transformers(saved, tmp_path):
    loaded, path = load_and_export(saved, tmp_path / "m.onnx")
    cfg = loaded.config
    assert loaded.family == "longformer"
    assert cfg.local_attention == LocalAttention(window=4, global_every=3, global_offset=2)
    assert cfg.max_sequence == 64 and max(c.sequence for c in cases(cfg)) > 4
    # the global projections only act on tokens given global attention: set aside
    assert {name.split(".")[-2] for name in loaded.dropped if "_global" in name} == {
        "query_global", "key_global", "value_global"}
    assert assert_matches_transformers(loaded, hf_reference(transformers.LongformerModel, saved), path, pad_id=1) >= 12


def test_without_the_window_the_model_differs(saved):
    """A mutation check: the same weights attending to every key are off."""
    loaded = load_any(saved)
    assert_only_the_import_matches(loaded, hf_reference(transformers.LongformerModel, saved),
                                   local_attention=None)


def test_token_classifier_keeps_its_head(tmp_path):
    config = transformers.LongformerConfig(**SIZES, num_labels=3)
    folder = save_hf(transformers.LongformerForTokenClassification, config, tmp_path / "m", seed=2, random_biases=True)
    loaded = load_any(folder)
    assert (loaded.config.num_labels, loaded.config.per_token_logits) == (3, True)
    model = transformers.LongformerForTokenClassification.from_pretrained(str(folder)).eval()
    ids = torch.randint(3, 120, (2, 11), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    ids[1, 7:], mask[1, 7:] = 1, 0
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).logits
        got = loaded.model(ids, mask)["logits"]
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], atol=2e-5, rtol=0)


@pytest.mark.parametrize("change, message", [
    ({"attention_window": [4, 8]}, "gives layers different windows"),
    ({"attention_window": 5}, "attention_window=5 is not supported"),
    ({"architectures": ["LongformerForSequenceClassification"], "num_labels": 2}, "global attention"),
    ({"architectures": ["LongformerForQuestionAnswering"]}, "LongformerForQuestionAnswering gives tokens global"),
    ({"architectures": ["LongformerForMultipleChoice"]}, "LongformerForMultipleChoice gives tokens global"),
])
def test_unsupported_configs_are_refused(saved, tmp_path, change, message):
    with pytest.raises(CheckpointError, match=message):
        load_any(with_config(saved, tmp_path / "m", change))
