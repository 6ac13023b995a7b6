"""Gemma 1 (Llama's layer with Gemma's (1 + w) norms, scaled token table, GeGLU and head size; causal)
against transformers."""
from __future__ import annotations

import pytest
import torch
from support.hf import assert_matches_transformers, hf_reference, load_and_export, transformers, with_config

from ortformer.core.errors import CheckpointError
from ortformer.models import load_any

# heads of 24 on a width of 32 (not hidden / heads), one K / V head for two query heads, biased attention
# Linears, an LM head of its own (so that it is saved, and set aside)
SIZES = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
             head_dim=24, intermediate_size=48, max_position_embeddings=64, attention_bias=True,
             tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 300.0})


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    config = transformers.GemmaConfig(**SIZES)
    torch.manual_seed(3)
    model = transformers.GemmaForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):  # away from their zero init, so a slip shows
                p.add_(torch.randn_like(p) * 0.3)
    folder = tmp_path_factory.mktemp("gemma") / "m"
    model.save_pretrained(str(folder))
    # the official releases' legacy "gelu", which GemmaConfig reads as the tanh approximation (save_pretrained
    # writes the value it read, so the file is patched by hand)
    return with_config(folder, folder.parent / "legacy", {"hidden_act": "gelu"})


def test_eager_and_onnx_equal_transformers(saved, tmp_path):
    loaded, path = load_and_export(saved, tmp_path / "m.onnx")
    cfg = loaded.config
    assert loaded.family == "gemma" and loaded.dropped == ("lm_head.weight",)
    assert (cfg.causal, cfg.qk_norm, cfg.sandwich_norm, cfg.attention_softcap, cfg.num_kv_heads) == (True, False, False, 0.0, 1)
    assert (cfg.attention_head_size, cfg.rotary_theta, cfg.activation, cfg.max_positions) == (24, 300.0, "gelu_tanh", 64)
    assert transformers.AutoConfig.from_pretrained(str(saved)).hidden_act == "gelu_pytorch_tanh"
    assert assert_matches_transformers(loaded, hf_reference(transformers.GemmaModel, saved), path, pad_id=0) >= 12


@pytest.mark.parametrize("change, message", [
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention=True is not supported"),
    ({"hidden_act": "quick_gelu"}, "hidden_act='quick_gelu' is not supported"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling"),
    ({"num_key_value_heads": 3}, "num_key_value_heads=3 is not supported"),
])
def test_unsupported_configs_are_refused(saved, tmp_path, change, message):
    with pytest.raises(CheckpointError, match=message):
        load_any(with_config(saved, tmp_path / "m", change))
