"""EuroBERT (Llama layers run bidirectionally) against transformers."""
from __future__ import annotations

import pytest
import torch
from support.hf import assert_matches_transformers, hf_reference, load_and_export, save_hf, transformers, with_config

from ortformer.core.errors import CheckpointError
from ortformer.models import load_any

SIZES = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
             max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2, mask_token_id=3)


def tiny_config(**changes):
    return transformers.EuroBertConfig(**{**SIZES, **changes})


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    # grouped-query attention: 4 query heads read 2 key / value heads
    folder = save_hf(transformers.EuroBertModel, tiny_config(num_key_value_heads=2), tmp_path_factory.mktemp("euro") / "m",
                     seed=1)
    return folder, hf_reference(transformers.EuroBertModel, folder)


def test_eager_and_onnx_equal_transformers(saved, tmp_path):
    loaded, path = load_and_export(saved[0], tmp_path / "m.onnx")
    cfg = loaded.config
    assert loaded.family == "eurobert"
    assert (cfg.norm, cfg.norm_position, cfg.ffn_gated, cfg.bias, cfg.positions) == ("rmsnorm", "pre", True, False, "rotary")
    assert assert_matches_transformers(loaded, saved[1], path, pad_id=0) >= 12


def test_grouped_heads_are_kept_then_shared_and_the_gate_goes_first(saved):
    """Mutation checks on the mapping: K / V keep their 2 heads (qkv rows [Q 32 | K 16 | V 16]), the
    graph gives query head h K / V head h // 2; gate_proj is the activated half."""
    from safetensors.torch import load_file

    raw = load_file(str(saved[0] / "model.safetensors"))
    model = load_any(saved[0]).model
    state = model.state_dict()
    qkv = state["blocks.0.attention.qkv.weight"]
    assert qkv.shape == (64, 32) and model.config.num_kv_heads == 2
    assert torch.equal(qkv[32:48], raw["layers.0.self_attn.k_proj.weight"])
    assert torch.equal(qkv[48:], raw["layers.0.self_attn.v_proj.weight"])
    projected = torch.randn(1, 3, 64)  # [Q | K | V] of three tokens
    shared = model.blocks[0].attention.shared_heads(projected)  # (1, 3, 96)
    for start, width in ((32, 16), (48, 16)):  # K, then V
        own = projected[..., start:start + width].reshape(1, 3, 2, 8)
        heads = shared[..., 32 + 2 * (start - 32):32 + 2 * (start - 32) + 32].reshape(1, 3, 4, 8)
        assert all(torch.equal(heads[:, :, h], own[:, :, h // 2]) for h in range(4))
    assert torch.equal(state["blocks.0.ffn.up.weight"][:48], raw["layers.0.mlp.gate_proj.weight"])


def test_biases_and_wide_heads_equal_transformers(tmp_path):
    config = tiny_config(attention_bias=True, mlp_bias=True, head_dim=16, hidden_act="gelu",
                         rope_parameters={"rope_type": "default", "rope_theta": 250000.0})
    folder = save_hf(transformers.EuroBertModel, config, tmp_path / "m", seed=2)
    loaded = load_any(folder)
    assert (loaded.config.attention_head_size, loaded.config.rotary_theta) == (16, 250000.0)
    assert_matches_transformers(loaded, hf_reference(transformers.EuroBertModel, folder), None, pad_id=0)


@pytest.mark.parametrize("pooling", ["bos", "mean"])
def test_sequence_classifier(pooling, tmp_path):
    config = tiny_config(num_labels=2, classifier_pooling=pooling)
    folder = save_hf(transformers.EuroBertForSequenceClassification, config, tmp_path / "m", seed=3)
    loaded = load_any(folder)
    assert loaded.config.classifier.pooling == {"bos": "cls", "mean": "mean"}[pooling] and not loaded.dropped
    model = transformers.EuroBertForSequenceClassification.from_pretrained(folder).eval()
    ids = torch.tensor([[1, 5, 7, 9, 2, 0], [1, 8, 2, 0, 0, 0]])
    mask = (ids != 0).long()
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(ids, mask)["logits"], model(input_ids=ids, attention_mask=mask).logits,
                                   atol=2e-5, rtol=0)


@pytest.mark.parametrize("change, message", [
    ({"architectures": ["EuroBertForSequenceClassification"], "classifier_pooling": "late"},
     "classifier_pooling='late' is not supported"),
    ({"num_key_value_heads": 3}, "num_key_value_heads=3 is not supported"),
    ({"attention_bias": "yes"}, "attention_bias=.yes., mlp_bias=False: each must be true or false"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 10.0, "factor": 8.0}}, "rope_type='llama3' is not supported"),
    ({"hidden_act": "quick_gelu"}, "hidden_act='quick_gelu' is not supported"),
])
def test_unsupported_configs_are_refused(saved, tmp_path, change, message):
    with pytest.raises(CheckpointError, match=message):
        load_any(with_config(saved[0], tmp_path / "m", change))
